// A virtual key's whole life, seen by a client using the official openai SDK: generate → call →
// block (401) → unblock → call → regenerate with a grace period (old key works until it ends, then
// 401) → regenerate without one (old key 401 at once) → delete (401); an expiring key gets 401
// `expired_key`. Afterwards no plaintext key may be found in the database (every table, every
// column), in any management response but the one that created it, or in the gateway's log.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI, { APIError, AuthenticationError } from "openai";
import { BACKENDS, MASTER_KEY, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { sha256 } from "../harness/util.ts";

const CONFIG = {
  model_list: [{ model_name: "chat-mock", svc_params: { model: "mock/chat" } }],
  general_settings: { master_key: MASTER_KEY },
};

interface KeyResponse {
  key: string;
  token: string;
  key_alias: string | null;
  spend: number;
  max_budget: number | null;
  rotation_count: number;
  blocked: boolean;
}

for (const backend of BACKENDS) {
  describe(`key lifecycle through the openai SDK (${backend})`, () => {
    let gw: TestGateway;
    /** Plaintext keys issued, and every management response (creation responses flagged). */
    const issued: string[] = [];
    const responses: { path: string; text: string; created?: string }[] = [];

    async function manage(path: string, body?: unknown, method = body === undefined ? "GET" : "POST"): Promise<{ status: number; json: KeyResponse }> {
      const res = await fetch(gw.url + path, {
        method,
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      const json = JSON.parse(text) as KeyResponse;
      const creates = res.status === 200 && /\/key\/(generate|regenerate|[^/]+\/regenerate)$/.test(path);
      if (creates) issued.push(json.key);
      responses.push({ path, text, created: creates ? json.key : undefined });
      return { status: res.status, json };
    }

    const client = (apiKey: string) => new OpenAI({ baseURL: gw.baseURL, apiKey, maxRetries: 0 });

    async function chat(apiKey: string): Promise<string | null | undefined> {
      const r = await client(apiKey).chat.completions.create({ model: "chat-mock", messages: [{ role: "user", content: "hello" }] });
      return r.choices[0]?.message.content;
    }

    /** The SDK error a refused call raises. */
    async function refusal(apiKey: string): Promise<APIError> {
      try {
        await chat(apiKey);
      } catch (err) {
        if (err instanceof APIError) return err;
        throw err;
      }
      throw new Error("the call was accepted");
    }

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_keylife" });
    }, 60_000);

    afterAll(async () => {
      await gw?.stop();
    });

    test("generate → call → block → unblock → regenerate (grace, then none) → delete", async () => {
      const created = await manage("/key/generate", { key_alias: "lifecycle", max_budget: 25, models: ["chat-mock"], spend: 1.5 });
      expect(created.status).toBe(200);
      const first = created.json.key;
      expect(await chat(first)).toBe("This is a mock response to: hello");

      expect((await manage("/key/block", { key: first })).json.blocked).toBe(true);
      const blocked = await refusal(first);
      expect(blocked).toBeInstanceOf(AuthenticationError);
      expect(blocked.message).toContain("blocked");

      expect((await manage("/key/unblock", { key: first })).json.blocked).toBe(false);
      expect(await chat(first)).toContain("mock response");

      // With a grace period the old value keeps working until it ends, then 401.
      const spendBefore = ((await manage(`/key/info?key=${created.json.token}`)).json as unknown as { info: KeyResponse }).info.spend;
      expect(spendBefore).toBeGreaterThanOrEqual(1.5);
      const graced = await manage(`/key/${first}/regenerate`, { grace_period: "2s" });
      expect(graced.status).toBe(200);
      const second = graced.json.key;
      expect(second).not.toBe(first);
      expect(graced.json.spend).toBe(spendBefore);
      expect(graced.json.max_budget).toBe(25);
      expect(graced.json.key_alias).toBe("lifecycle");
      expect(await chat(second)).toContain("mock response");
      expect(await chat(first)).toContain("mock response");
      await Bun.sleep(2100);
      expect(await refusal(first)).toBeInstanceOf(AuthenticationError);
      expect(await chat(second)).toContain("mock response");

      // Without one the old value is refused at once.
      const immediate = await manage("/key/regenerate", { key: graced.json.token });
      expect(immediate.status).toBe(200);
      const third = immediate.json.key;
      expect(immediate.json.rotation_count).toBe(2);
      expect(await refusal(second)).toBeInstanceOf(AuthenticationError);
      expect(await chat(third)).toContain("mock response");

      const deleted = await manage("/key/delete", { keys: [third] });
      expect(deleted.status).toBe(200);
      expect(await refusal(third)).toBeInstanceOf(AuthenticationError);
      expect(await refusal(first)).toBeInstanceOf(AuthenticationError);
      expect((await manage("/key/list?status=deleted&key_alias=lifecycle")).status).toBe(200);
      expect(JSON.parse(responses.at(-1)!.text).keys).toEqual([sha256(third)]);
    });

    test("an expired key is refused with 401 expired_key", async () => {
      const created = await manage("/key/generate", { duration: "1s" });
      const key = created.json.key;
      expect(await chat(key)).toContain("mock response");
      await Bun.sleep(1100);
      const err = await refusal(key);
      expect(err).toBeInstanceOf(AuthenticationError);
      expect(err.type).toBe("expired_key");
      // Management calls about it still work, by hash or by value, and never echo the value.
      expect((await manage(`/key/info?key=${key}`)).status).toBe(200);
    });

    test("no plaintext key in the database, in any other response, or in the log", async () => {
      expect(issued.length).toBe(4);
      const db = gw.host!.store.db;
      const tables = JSON.stringify(await db.execute(sql`select table_name from information_schema.tables where table_schema = 'public'`));
      const names = [...tables.matchAll(/"table_name":"([a-z_0-9]+)"/g)].map((m) => m[1]!);
      expect(names).toEqual(expect.arrayContaining(["virtual_keys", "rotated_keys", "audit_log"]));
      let dump = "";
      for (const name of names) dump += JSON.stringify(await db.execute(sql.raw(`select * from "${name}"`)));
      // The scan sees real data: every key's hash is there.
      for (const plain of issued) expect(dump).toContain(sha256(plain));
      for (const plain of issued) expect(dump).not.toContain(plain);
      expect(dump).not.toContain(MASTER_KEY);

      expect(responses.length).toBeGreaterThan(8);
      for (const r of responses) {
        for (const plain of issued) {
          if (plain === r.created) expect(r.text).toContain(plain);
          else expect([r.path, r.text.includes(plain)]).toEqual([r.path, false]);
        }
      }
      const log = JSON.stringify(gw.log.lines);
      for (const plain of issued) expect(log).not.toContain(plain);
    });
  });
}
