// Every call is priced and logged: the cost header matches the prices in config, the spend log row
// carries the spec's fields (request_id = the response id, metadata.key_alias), failures and
// streams are logged too, unpriced models cost 0 with a note, and key/team/org/user counters and
// the daily aggregates equal the sum of their log rows.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI, { APIError } from "openai";
import { promptSize } from "../../core/cost/estimate.ts";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import type { MockOpenAI } from "../mock-upstream/openai.ts";
import { randomLetters } from "../harness/random.ts";
import { waitFor } from "../harness/util.ts";
import type { WireShaper } from "../mock-upstream/wire-shape.ts";

// $1 per million input tokens, $2 per million output tokens (the mock counts one token per word).
const PRICED = { model_name: "priced", svc_params: { model: "mock/priced" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } };
const CONFIG = {
  model_list: [
    PRICED,
    { model_name: "free", svc_params: { model: "mock/not-in-any-price-table" } },
    // Nothing listens on port 9: the call fails with 503.
    { model_name: "broken", svc_params: { model: "openai/gpt-4o", api_base: "http://127.0.0.1:9/v1", api_key: "sk-upstream" } },
  ],
  general_settings: { master_key: MASTER_KEY },
};

interface LogRow {
  call_id: string;
  key_alias: string | null;
  request_id: string;
  api_key: string;
  spend: string;
  model: string;
  model_group: string;
  provider: string;
  model_id: string;
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  status: string;
  stream: boolean;
  team_id: string | null;
  organization_id: string | null;
  user_id: string | null;
  end_user: string | null;
  request_tags: string[];
  metadata: Record<string, unknown>;
}

const usd = (promptTokens: number, completionTokens: number) => (promptTokens * 1 + completionTokens * 2) / 1_000_000;

for (const backend of BACKENDS) {
  describe(`spend log (${backend})`, () => {
    let gw: TestGateway;
    let key: string;
    let token: string;
    let client: OpenAI;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_spendlog" });
      const org = await requestJson<{ organization_id: string }>(gw, "POST", "/organization/new", { body: { organization_alias: "acme" } });
      const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "search", organization_id: org.body.organization_id } });
      await requestJson(gw, "POST", "/user/new", { body: { user_id: "u-ana" } });
      const created = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", {
        body: { key_alias: "ana-search", team_id: team.body.team_id, user_id: "u-ana", tags: ["prod"] },
      });
      expect(created.status).toBe(200);
      key = created.body.key;
      token = created.body.token;
      client = new OpenAI({ baseURL: gw.baseURL, apiKey: key, maxRetries: 0 });
    });
    afterAll(async () => gw?.stop());

    const logs = async (where = sql`true`) => rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where ${where} order by start_time`);

    test("a call's cost is in the x-svc-response-cost header and in its log row", async () => {
      const { data, response } = await client.chat.completions
        .create({ model: "priced", messages: [{ role: "user", content: "price this call please" }], user: "customer-7", metadata: { tags: ["exp-a"] } } as never)
        .withResponse();
      const u = data.usage!;
      const header = Number(response.headers.get("x-svc-response-cost"));
      expect(header).toBeCloseTo(usd(u.prompt_tokens, u.completion_tokens), 12);
      await gw.host!.spendWriter.flush();
      const [row] = await logs(sql`request_id = ${data.id}`);
      expect(row).toBeDefined();
      expect(row!).toMatchObject({
        api_key: token,
        model: "priced",
        model_group: "priced",
        provider: "mock",
        model_id: response.headers.get("x-svc-model-id")!,
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.total_tokens,
        status: "success",
        stream: false,
        user_id: "u-ana",
        end_user: "customer-7",
      });
      expect(row!.call_id).toBe(response.headers.get("x-svc-call-id")!);
      expect(Number(row!.spend)).toBe(header);
      expect(row!.key_alias).toBe("ana-search");
      // Through the API the entry has the spec's shape: metadata.key_alias.
      const api = await requestJson<{ request_id: string; spend: number; metadata: { key_alias: string } }[]>(gw, "GET", `/spend/logs?request_id=${data.id}&summarize=false`);
      expect(api.body).toHaveLength(1);
      expect(api.body[0]).toMatchObject({ request_id: data.id, spend: header, metadata: { key_alias: "ana-search" } });
      expect(row!.team_id).not.toBeNull();
      expect(row!.organization_id).not.toBeNull();
      expect([...row!.request_tags].sort()).toEqual(["exp-a", "prod"]);
      // Request and response bodies are not stored.
      expect(JSON.stringify(row)).not.toContain("price this call please");
    });

    test("a call may carry up to 100 tags, each reported; more, or tags that are not a list of strings, is a 422 naming metadata.tags and logs nothing; a key holds at most 100 too", async () => {
      const hundred = Array.from({ length: 100 }, (_, i) => `t-${i}`);
      const ok = await client.chat.completions.create({ model: "priced", messages: [{ role: "user", content: "many tags" }], metadata: { tags: hundred } } as never);
      await gw.host!.spendWriter.flush();
      const [row] = await logs(sql`request_id = ${ok.id}`);
      expect([...row!.request_tags].sort()).toEqual([...hundred, "prod"].sort());
      const before = (await logs()).length;
      for (const tags of [[...hundred, "t-100"], Array.from({ length: 50_000 }, (_, i) => `x${i}`), "prod", ["ok", 7]]) {
        const r = await requestJson<{ error: { message: string; param: string } }>(gw, "POST", "/v1/chat/completions", {
          key,
          body: { model: "priced", messages: [{ role: "user", content: "hi" }], metadata: { tags } },
        });
        expect(r.status, r.text).toBe(422);
        expect(r.body.error.param).toStartWith("metadata.tags");
        if (Array.isArray(tags) && tags.length > 100) expect(r.body.error.message).toContain("100");
      }
      await gw.host!.spendWriter.flush();
      expect((await logs()).length).toBe(before);
      // A key's own tags go on every call it makes: the same bound.
      const tagged = await requestJson<{ error: { message: string } }>(gw, "POST", "/key/generate", { body: { tags: [...hundred, "t-100"] } });
      expect(tagged.status, tagged.text).toBe(422);
      expect(tagged.body.error.message).toContain("tags");
      const updated = await requestJson(gw, "POST", "/key/update", { body: { key, tags: [...hundred, "t-100"] } });
      expect(updated.status, updated.text).toBe(422);
      expect((await requestJson(gw, "POST", "/key/update", { body: { key, tags: hundred } })).status).toBe(200);
      await requestJson(gw, "POST", "/key/update", { body: { key, tags: ["prod"] } });
    });

    test("a streamed call is logged with the chunks' id and the usage of its last chunk", async () => {
      const stream = await client.chat.completions.create({ model: "priced", messages: [{ role: "user", content: "stream it" }], stream: true });
      let id = "";
      for await (const chunk of stream) id ||= chunk.id;
      await gw.host!.spendWriter.flush();
      const [row] = await logs(sql`request_id = ${id}`);
      expect(row).toMatchObject({ status: "success", stream: true });
      expect(row!.completion_tokens).toBeGreaterThan(0);
      expect(Number(row!.spend)).toBeCloseTo(usd(row!.prompt_tokens, row!.completion_tokens), 12);
    });

    test("a failed call is logged as a failure at no cost, under the x-svc-call-id the client got", async () => {
      const res = await fetch(`${gw.baseURL}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "broken", messages: [{ role: "user", content: "x" }] }),
      });
      expect(res.status).toBe(503);
      const callId = res.headers.get("x-svc-call-id")!;
      await gw.host!.spendWriter.flush();
      const [row] = await logs(sql`call_id = ${callId}`);
      expect(row).toMatchObject({ status: "failure", api_key: expect.any(String) });
      expect(Number(row!.spend), `spend ${row!.spend}`).toBe(0);
      expect((row!.metadata.error_information as { error_code: string }).error_code).toBe("503");
    });

    test("a model without a price costs 0 and its log row says why", async () => {
      const { data, response } = await client.chat.completions.create({ model: "free", messages: [{ role: "user", content: "x" }] }).withResponse();
      expect(response.headers.get("x-svc-response-cost")).toBe("0");
      await gw.host!.spendWriter.flush();
      const [row] = await logs(sql`request_id = ${data.id}`);
      expect(Number(row!.spend)).toBe(0);
      expect(String(row!.metadata.cost_note)).toContain("no price for mock/not-in-any-price-table");
    });

    test("key, team, org and user spend, and the daily aggregates, equal the sum of their log rows", async () => {
      for (let i = 0; i < 5; i++) await client.chat.completions.create({ model: "priced", messages: [{ role: "user", content: `call number ${i}` }] });
      await gw.host!.spendWriter.flush();
      const db = gw.host!.store.db;
      const [sums] = await rows<{ total: string; team_id: string; organization_id: string }>(
        db,
        sql`select sum(spend)::text as total, max(team_id) as team_id, max(organization_id) as organization_id from spend_logs where api_key = ${token}`,
      );
      const total = sums!.total;
      expect(Number(total)).toBeGreaterThan(0);
      const counters = await rows<{ what: string; spend: string }>(
        db,
        sql`select 'key' as what, spend::text from virtual_keys where token = ${token}
            union all select 'team', spend::text from teams where team_id = ${sums!.team_id}
            union all select 'org', spend::text from organizations where organization_id = ${sums!.organization_id}
            union all select 'user', spend::text from users where user_id = 'u-ana'`,
      );
      expect(counters.length).toBe(4);
      // Exact: numeric text, compared as text after normalizing trailing zeros.
      const norm = (s: string) => s.replace(/\.?0+$/, "");
      for (const c of counters) expect(`${c.what}=${norm(c.spend)}`).toBe(`${c.what}=${norm(total)}`);
      const daily = await rows<{ entity_type: string; spend: string; requests: string }>(
        db,
        sql`select entity_type, sum(spend)::text as spend, sum(api_requests)::text as requests from daily_spend
            where (entity_type = 'key' and entity_id = ${token}) or (entity_type = 'team' and entity_id = ${sums!.team_id}) group by entity_type`,
      );
      const [count] = await rows<{ n: string }>(db, sql`select count(*)::text as n from spend_logs where api_key = ${token}`);
      for (const d of daily) {
        expect(norm(d.spend)).toBe(norm(total));
        expect(d.requests).toBe(count!.n);
      }
      // /key/info shows the same figure.
      const info = await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${token}`);
      expect(info.body.info.spend).toBeCloseTo(Number(total), 12);
    });

    test("a call its budget or its rate limit refuses is logged as a failure at no cost, with no deployment, under its x-svc-call-id", async () => {
      const refusedBy = async (body: Record<string, unknown>) => {
        const made = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body });
        const send = () =>
          fetch(`${gw.baseURL}/chat/completions`, {
            method: "POST",
            headers: { authorization: `Bearer ${made.body.key}`, "content-type": "application/json" },
            body: JSON.stringify({ model: "priced", messages: [{ role: "user", content: "x" }] }),
          });
        // A key over its budget is refused at once; one with rpm_limit 1 on its second call.
        if (body.rpm_limit !== undefined) expect((await send()).status).toBe(200);
        const res = await send();
        return { res, token: made.body.token, error: ((await res.json()) as { error: { type: string } }).error };
      };
      const broke = await refusedBy({ max_budget: 1, spend: 5 });
      const limited = await refusedBy({ rpm_limit: 1 });
      expect([broke.res.status, broke.error.type]).toEqual([400, "budget_exceeded"]);
      expect([limited.res.status, limited.error.type]).toEqual([429, "rate_limit_error"]);
      await gw.host!.spendWriter.flush();
      for (const r of [broke, limited]) {
        const callId = r.res.headers.get("x-svc-call-id")!;
        const [row] = await logs(sql`call_id = ${callId}`);
        expect(row).toMatchObject({ status: "failure", api_key: r.token, model_group: "priced", model_id: "", prompt_tokens: 0 });
        expect(Number(row!.spend)).toBe(0);
        expect((row!.metadata.error_information as { error_code: string }).error_code).toBe(String(r.res.status));
      }
      const [daily] = await rows<{ failed: string }>(
        gw.host!.store.db,
        sql`select sum(failed_requests)::text as failed from daily_spend where entity_type = 'key' and entity_id in (${broke.token}, ${limited.token})`,
      );
      expect(daily!.failed).toBe("2");
    });

    test("an unknown key's refused call is not logged; a bad request never reaches the log", async () => {
      const before = (await logs()).length;
      const bad = new OpenAI({ baseURL: gw.baseURL, apiKey: "sk-not-a-key", maxRetries: 0 });
      const refused = await bad.chat.completions.create({ model: "priced", messages: [{ role: "user", content: "x" }] }).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(refused).toBeInstanceOf(APIError);
      expect((refused as APIError).status).toBe(401);
      await gw.host!.spendWriter.flush();
      expect((await logs()).length).toBe(before);
    });
  });
}

describe("cancelled and cut streams (pglite, OpenAI wire mock)", () => {
  test("a stream the client abandons is logged as cancelled and charged for what it used", async () => {
    const { startMockOpenAI } = await import("../mock-upstream/openai.ts");
    const mock = await startMockOpenAI({ apiKey: "sk-up" });
    const gw = await startBackendGateway("pglite", {
      model_list: [{ model_name: "gpt-4o", svc_params: { model: "openai/gpt-4o", api_base: mock.url, api_key: "sk-up" } }],
      general_settings: { master_key: MASTER_KEY },
    });
    try {
      mock.fault({ kind: "slowStream", chunkDelayMs: 50, chunks: 100 });
      const client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
      const stream = await client.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "tell me a long story" }], stream: true });
      let seen = 0;
      let id = "";
      for await (const chunk of stream) {
        id ||= chunk.id;
        if (++seen === 5) break; // leaves the stream: the SDK aborts the request
      }
      for (let i = 0; i < 50 && mock.streamsCancelled === 0; i++) await Bun.sleep(20);
      expect(mock.streamsCancelled).toBe(1);
      await gw.host!.spendWriter.flush();
      const [row] = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where request_id = ${id}`);
      expect(row).toMatchObject({ status: "cancelled", stream: true });
      expect(row!.completion_tokens).toBeGreaterThanOrEqual(4);
      expect(row!.completion_tokens).toBeLessThan(100);
      // gpt-4o from the bundled table: $2.50 / $10 per million tokens.
      expect(Number(row!.spend)).toBeCloseTo((row!.prompt_tokens * 2.5 + row!.completion_tokens * 10) / 1e6, 12);
    } finally {
      await gw.stop();
      await mock.stop();
    }
  });
});

/** A shaper that ends a stream's body `how` right after its first `count` events. */
function endAfterEvents(count: number, how: "close" | "stall"): WireShaper {
  return (bytes) => {
    const text = new TextDecoder().decode(bytes);
    let at = 0;
    for (let i = 0; i < count; i++) at = text.indexOf("\n\n", at) + 2;
    return { cuts: [], end: { at: new TextEncoder().encode(text.slice(0, at)).length, how } };
  };
}

describe("a stream that fails after its answer began (pglite, OpenAI wire mock)", () => {
  test("cut or stalled mid-answer: a failure charged for what it streamed, at most max_tokens; cut before its first chunk: retried, the failed attempt at $0", async () => {
    const { startMockOpenAI } = await import("../mock-upstream/openai.ts");
    const mock = await startMockOpenAI({ apiKey: "sk-up" });
    const gw = await startBackendGateway("pglite", {
      model_list: [{ model_name: "gpt-4o", svc_params: { model: "openai/gpt-4o", api_base: mock.url, api_key: "sk-up", stream_timeout: 0.3 } }],
      router_settings: { num_retries: 1, retry_initial_delay: 0.01 },
      general_settings: { master_key: MASTER_KEY },
    });
    /** A stream's text and the log rows of its call (its failed attempts first). */
    const streamed = async (maxTokens: number, attempts = 1) => {
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "gpt-4o", stream: true, max_tokens: maxTokens, messages: [{ role: "user", content: "one two three four five six seven" }] }),
      });
      const text = await res.text();
      // The header names the attempt that answered (`<call id>-<n>` for a retry).
      const callId = res.headers.get("x-svc-call-id")!.replace(/-\d{1,3}$/, "");
      const read = async () => {
        await gw.host!.spendWriter.flush();
        return rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where call_id like ${`${callId}%`} order by call_id desc`);
      };
      return { text, logged: await waitFor(read, (r) => r.length === attempts, "a log row per attempt") };
    };
    /** gpt-4o from the bundled table: $2.50 / $10 per million tokens. */
    const priced = (row: LogRow) => (row.prompt_tokens * 2.5 + row.completion_tokens * 10) / 1e6;
    try {
      mock.fault({ kind: "cutStream", afterChunks: 3 });
      const cut = await streamed(50);
      expect(cut.text).toContain('"code":"503"');
      expect(cut.logged).toHaveLength(1);
      expect(cut.logged[0]).toMatchObject({ status: "failure", stream: true });
      expect(cut.logged[0]!.completion_tokens).toBeGreaterThan(0);
      expect(Number(cut.logged[0]!.spend)).toBeCloseTo(priced(cut.logged[0]!), 12);

      // The estimate of a cut answer stays within what the request allowed (and budgets reserved).
      mock.reset();
      mock.fault({ kind: "cutStream", afterChunks: 4 });
      const bounded = await streamed(1);
      expect(bounded.logged[0]).toMatchObject({ status: "failure", completion_tokens: 1 });
      expect(Number(bounded.logged[0]!.spend)).toBeCloseTo(priced(bounded.logged[0]!), 12);

      mock.reset();
      mock.fault({ kind: "wire", shape: endAfterEvents(3, "stall") });
      const stalled = await streamed(50);
      expect(stalled.text).toContain('"code":"408"');
      expect(stalled.logged[0]).toMatchObject({ status: "failure" });
      expect(Number(stalled.logged[0]!.spend)).toBeGreaterThan(0);

      mock.reset();
      mock.fault({ kind: "cutStream", afterChunks: 0 });
      const retried = await streamed(50, 2);
      expect(retried.text).toContain("data: [DONE]");
      expect(retried.logged.map((r) => r.status)).toEqual(["success", "failure"]);
      expect(Number(retried.logged[1]!.spend)).toBe(0);
    } finally {
      await gw.stop();
      await mock.stop();
    }
  });
});

/** A gateway on the embedded store whose model "self-hosted" is a mock OpenAI-compatible server, priced; both stopped after `run`. */
async function withSelfHosted(run: (gw: TestGateway, mock: MockOpenAI) => Promise<void>): Promise<void> {
  const { startMockOpenAI } = await import("../mock-upstream/openai.ts");
  const mock = await startMockOpenAI({ apiKey: "sk-up" });
  const gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "self-hosted", svc_params: { model: "openai/llama", api_base: mock.url, api_key: "sk-up" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  try {
    await run(gw, mock);
  } finally {
    await gw.stop();
    await mock.stop();
  }
}

describe("a client that leaves a stream before the model's first token (pglite, OpenAI wire mock)", () => {
  test("is charged its prompt alone, as budgets estimate it, whether it left before the ': waiting' comment or after it", async () => {
    await withSelfHosted(async (gw, mock) => {
      const messages = [{ role: "user" as const, content: "a prompt of some forty characters or so." }];
      for (const leaveAfterMs of [400, 1500]) {
        // The opening role chunk at once, the first word 3 s later.
        mock.fault({ kind: "slowStream", chunkDelayMs: 3000, chunks: 2 });
        const leaving = new AbortController();
        const timer = setTimeout(() => leaving.abort(), leaveAfterMs);
        const cancelledBefore = mock.streamsCancelled;
        try {
          const res = await fetch(`${gw.url}/v1/chat/completions`, {
            method: "POST",
            signal: leaving.signal,
            headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
            body: JSON.stringify({ model: "self-hosted", stream: true, messages }),
          });
          await res.text();
        } catch {
          // The client left.
        }
        clearTimeout(timer);
        for (let i = 0; i < 100 && mock.streamsCancelled === cancelledBefore; i++) await Bun.sleep(20);
      }
      await gw.host!.spendWriter.flush();
      const logged = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where model_group = 'self-hosted'`);
      const prompt = promptSize("chat", { model: "self-hosted", messages }).estimate;
      expect(logged.map((r) => [r.status, r.prompt_tokens, r.completion_tokens])).toEqual([
        ["cancelled", prompt, 0],
        ["cancelled", prompt, 0],
      ]);
    });
  });
});

describe("an upstream answering with an id too long for the log's index (pglite, OpenAI wire mock)", () => {
  test("the call is logged and charged, its request_id cut to 512 characters", async () => {
    await withSelfHosted(async (gw, mock) => {
      const id = randomLetters(10_000);
      const usage = { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 };
      mock.fault({ kind: "answer", body: { id, object: "chat.completion", created: 1, model: "llama", choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }], usage } });
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "self-hosted", messages: [{ role: "user", content: "hi" }] }),
      });
      expect(res.status).toBe(200);
      const callId = res.headers.get("x-svc-call-id")!;
      await gw.host!.spendWriter.flush();
      const [row] = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where call_id = ${callId}`);
      expect(row!.request_id).toBe(id.slice(0, 512));
      expect(Number(row!.spend)).toBeCloseTo(usd(7, 3), 12);
    });
  });
});

describe("an answer without usage (pglite, OpenAI wire mock)", () => {
  test("is not free: its tokens are estimated from the prompt and the answer, priced and logged", async () => {
    await withSelfHosted(async (gw, mock) => {
      // 40 characters of answer: 10 tokens at four characters a token.
      const content = "0123456789".repeat(4);
      mock.fault({ kind: "answer", body: { id: "chatcmpl-nousage", object: "chat.completion", created: 1, model: "llama", choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }] } });
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "self-hosted", messages: [{ role: "user", content: "a prompt of some forty characters or so." }] }),
      });
      expect(res.status).toBe(200);
      expect(((await res.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content).toBe(content);
      const cost = Number(res.headers.get("x-svc-response-cost"));
      expect(cost).toBeGreaterThan(0);
      await gw.host!.spendWriter.flush();
      const [row] = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where request_id = 'chatcmpl-nousage'`);
      expect(row!.completion_tokens).toBe(10);
      expect(row!.prompt_tokens).toBeGreaterThanOrEqual(10);
      expect(Number(row!.spend)).toBeCloseTo(usd(row!.prompt_tokens, row!.completion_tokens), 12);
      expect(Number(row!.spend)).toBeCloseTo(cost, 12);
    });
  });

  test("chat, completions and embeddings answer the counts they are charged as usage, as OpenAI's answers carry it", async () => {
    await withSelfHosted(async (gw, mock) => {
      const content = "0123456789".repeat(4);
      const asked = [
        {
          path: "/v1/completions",
          request: { prompt: "a prompt of some forty characters or so." },
          answer: { id: "cmpl-nousage", object: "text_completion", created: 1, model: "llama", choices: [{ index: 0, text: content, finish_reason: "stop", logprobs: null }] },
        },
        {
          path: "/v1/embeddings",
          request: { input: "a prompt of some forty characters or so.", encoding_format: "float" },
          answer: { object: "list", data: [{ object: "embedding", index: 0, embedding: [0.5, 0.25] }], model: "llama" },
        },
        {
          path: "/v1/chat/completions",
          request: { messages: [{ role: "user", content: "a prompt of some forty characters or so." }] },
          // `usage: null`, as some servers write it, is no usage either.
          answer: { id: "chatcmpl-nulled", object: "chat.completion", created: 1, model: "llama", choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }], usage: null },
        },
      ];
      for (const { path, request, answer } of asked) {
        mock.fault({ kind: "answer", body: answer });
        const res = await fetch(`${gw.url}${path}`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "self-hosted", ...request }),
        });
        expect(res.status).toBe(200);
        const usage = ((await res.json()) as { usage?: { prompt_tokens: number; completion_tokens?: number; total_tokens: number } }).usage;
        await gw.host!.spendWriter.flush();
        const [row] = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where call_id = ${res.headers.get("x-svc-call-id")}`);
        expect(row!.prompt_tokens).toBeGreaterThan(0);
        expect(usage, path).toMatchObject({ prompt_tokens: row!.prompt_tokens, total_tokens: row!.prompt_tokens + row!.completion_tokens });
        // OpenAI's embeddings usage has no completion tokens.
        if (path === "/v1/embeddings") expect(usage).toEqual({ prompt_tokens: row!.prompt_tokens, total_tokens: row!.prompt_tokens });
        else expect(usage!.completion_tokens).toBe(10);
      }
    });
  });
});

describe("an answer without usage to a request with max_tokens (pglite, OpenAI wire mock)", () => {
  test("is never charged more answer tokens than max_tokens allowed, so spend stays within what budgets reserved", async () => {
    await withSelfHosted(async (gw, mock) => {
      // Two choices of one long "token" each (a server that sends no usage): 2 x 40 characters would estimate 20 tokens.
      const content = "x".repeat(40);
      const choice = (index: number) => ({ index, message: { role: "assistant", content }, finish_reason: "length" });
      mock.fault({ kind: "answer", body: { id: "chatcmpl-capped", object: "chat.completion", created: 1, model: "llama", choices: [choice(0), choice(1)] } });
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "self-hosted", max_tokens: 3, n: 2, messages: [{ role: "user", content: "a prompt" }] }),
      });
      expect(res.status).toBe(200);
      await gw.host!.spendWriter.flush();
      const [row] = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where request_id = 'chatcmpl-capped'`);
      // max_tokens for each of the n choices.
      expect(row!.completion_tokens).toBe(6);
      expect(Number(row!.spend)).toBeCloseTo(usd(row!.prompt_tokens, 6), 12);
    });
  });
});

describe("an answer whose usage counts nothing, counts as text, or only a total (pglite, OpenAI wire mock)", () => {
  test("is not free: no count is no usage (estimated as a missing one), text counts are counts, a total alone is the prompt as estimated and the rest", async () => {
    await withSelfHosted(async (gw, mock) => {
      const messages = [{ role: "user" as const, content: "a prompt of some forty characters or so." }];
      const prompt = promptSize("chat", { model: "self-hosted", messages }).estimate;
      // 40 characters of answer: 10 tokens at four characters a token.
      const content = "0123456789".repeat(4);
      const cases: { usage?: Record<string, unknown>; logged: [number, number] }[] = [
        { logged: [prompt, 10] },
        { usage: {}, logged: [prompt, 10] },
        { usage: { prompt_tokens: null, completion_tokens: null, total_tokens: null }, logged: [prompt, 10] },
        { usage: { prompt_tokens: "100", completion_tokens: "10", total_tokens: "110" }, logged: [100, 10] },
        { usage: { total_tokens: 110 }, logged: [prompt, 110 - prompt] },
        { usage: { prompt_tokens: 100, total_tokens: 110 }, logged: [100, 10] },
      ];
      const costs: number[] = [];
      const answered: Record<string, unknown>[] = [];
      for (const [i, c] of cases.entries()) {
        const answer = { id: `chatcmpl-uncounted-${i}`, object: "chat.completion", created: 1, model: "llama", choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }] };
        mock.fault({ kind: "answer", body: c.usage ? { ...answer, usage: c.usage } : answer });
        const res = await fetch(`${gw.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "self-hosted", messages }),
        });
        expect(res.status).toBe(200);
        costs.push(Number(res.headers.get("x-svc-response-cost")));
        answered.push(((await res.json()) as { usage: Record<string, unknown> }).usage);
      }
      await gw.host!.spendWriter.flush();
      for (const [i, c] of cases.entries()) {
        const [row] = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where request_id = ${`chatcmpl-uncounted-${i}`}`);
        expect([row!.prompt_tokens, row!.completion_tokens], JSON.stringify(c.usage)).toEqual(c.logged);
        expect(Number(row!.spend)).toBeCloseTo(usd(...c.logged), 12);
        expect(costs[i]).toBeCloseTo(usd(...c.logged), 12);
        // An answer that counted nothing tells the client the counts it was charged; one that counted something is passed on as sent.
        if (!c.usage || Object.values(c.usage).every((v) => v === null)) expect(answered[i]).toMatchObject({ prompt_tokens: c.logged[0], completion_tokens: c.logged[1], total_tokens: c.logged[0] + c.logged[1] });
        else expect(answered[i]).toEqual(c.usage);
      }
    });
  });
});

describe("usage a server reports that cannot be counted as given (pglite, OpenAI wire mock)", () => {
  test("fractions, negatives, billions and a part over its total are rounded and bounded: priced as logged, and the log goes on", async () => {
    await withSelfHosted(async (gw, mock) => {
      const cases: { usage: Record<string, unknown>; logged: [number, number, number] }[] = [
        { usage: { prompt_tokens: 1.5, completion_tokens: 2.5 }, logged: [2, 3, 0] },
        { usage: { prompt_tokens: -5, completion_tokens: 3 }, logged: [0, 3, 0] },
        { usage: { prompt_tokens: 5e9, completion_tokens: 1 }, logged: [2 ** 30 - 1, 1, 0] },
        { usage: { prompt_tokens: 5, completion_tokens: 5, prompt_tokens_details: { cached_tokens: 50 } }, logged: [5, 5, 5] },
        { usage: { prompt_tokens: 7, completion_tokens: 4 }, logged: [7, 4, 0] },
      ];
      const costs: number[] = [];
      for (const [i, c] of cases.entries()) {
        mock.fault({ kind: "answer", body: { id: `chatcmpl-odd-${i}`, object: "chat.completion", created: 1, model: "llama", choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }], usage: c.usage } });
        const res = await fetch(`${gw.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "self-hosted", messages: [{ role: "user", content: "hi" }] }),
        });
        expect(res.status).toBe(200);
        costs.push(Number(res.headers.get("x-svc-response-cost")));
      }
      // One row the store refused held its whole batch, and every call after it, out of the log.
      await gw.host!.spendWriter.flush();
      for (const [i, c] of cases.entries()) {
        const [row] = await rows<LogRow & { cache_read_input_tokens: number }>(gw.host!.store.db, sql`select * from spend_logs where request_id = ${`chatcmpl-odd-${i}`}`);
        expect([row!.prompt_tokens, row!.completion_tokens, row!.cache_read_input_tokens]).toEqual(c.logged);
        expect(Number(row!.spend)).toBeCloseTo(usd(c.logged[0], c.logged[1]), 12);
        expect(Number(row!.spend)).toBeCloseTo(costs[i]!, 12);
      }
      expect(gw.log.lines.filter((l) => l.msg.includes("cannot be counted as reported"))).toHaveLength(1);
    });
  });
});

describe("an Anthropic answer with 1-hour cache writes and web searches (pglite, Anthropic wire mock)", () => {
  test("carries them in its usage: /spend/calculate on the answer gives what the call was charged and logged", async () => {
    const { startMockAnthropic } = await import("../mock-upstream/anthropic.ts");
    const anthropic = await startMockAnthropic({ apiKey: "sk-ant-up" });
    const gw = await startBackendGateway("pglite", {
      model_list: [{ model_name: "claude", svc_params: { model: "anthropic/claude-3-5-sonnet-20241022", api_base: anthropic.url, api_key: "sk-ant-up" } }],
      general_settings: { master_key: MASTER_KEY },
    });
    try {
      const usage = {
        input_tokens: 100,
        cache_read_input_tokens: 1000,
        cache_creation_input_tokens: 500,
        cache_creation: { ephemeral_5m_input_tokens: 200, ephemeral_1h_input_tokens: 300 },
        output_tokens: 50,
        server_tool_use: { web_search_requests: 2 },
      };
      const message = { id: "msg_cache_search", type: "message", role: "assistant", model: "claude-3-5-sonnet-20241022", content: [{ type: "text", text: "Found it." }], stop_reason: "end_turn", stop_sequence: null, usage };
      anthropic.fault({ kind: "answer", body: message });
      const client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
      const { data, response } = await client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "Search the web" }], max_tokens: 100 }).withResponse();
      // The file's prices: 100 in at $3, 1,000 read at $0.30, 200 written for 5 minutes at $3.75 and 300 for an
      // hour at $6, 50 out at $15 per million, and 2 searches at $0.01.
      expect(response.headers.get("x-svc-response-cost")).toBe("0.0239");
      expect(data.usage).toMatchObject({
        prompt_tokens: 1600,
        prompt_tokens_details: { cached_tokens: 1000, cache_creation_token_details: { ephemeral_5m_input_tokens: 200, ephemeral_1h_input_tokens: 300 } },
        cache_creation_input_tokens: 500,
        server_tool_use: { web_search_requests: 2 },
      });
      const calculated = await requestJson<{ cost: number }>(gw, "POST", "/spend/calculate", { body: { completion_response: data, model: "claude" } });
      expect(calculated.body).toEqual({ cost: 0.0239 });
      await gw.host!.spendWriter.flush();
      const [row] = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where request_id = ${data.id}`);
      expect(row!.spend).toBe("0.023900000000");
    } finally {
      await gw.stop();
      await anthropic.stop();
    }
  });
});

describe("a stream the upstream ends before its answer is whole (pglite)", () => {
  test("an error event instead of [DONE], logged as a failure charged for what it streamed (OpenAI and Anthropic wire mocks)", async () => {
    const { startMockOpenAI } = await import("../mock-upstream/openai.ts");
    const { startMockAnthropic } = await import("../mock-upstream/anthropic.ts");
    const openai = await startMockOpenAI({ apiKey: "sk-up" });
    const anthropic = await startMockAnthropic({ apiKey: "sk-ant-up" });
    const gw = await startBackendGateway("pglite", {
      model_list: [
        { model_name: "gpt-4o", svc_params: { model: "openai/gpt-4o", api_base: openai.url, api_key: "sk-up" } },
        { model_name: "claude", svc_params: { model: "anthropic/claude-3-5-sonnet-20241022", api_base: anthropic.url, api_key: "sk-ant-up" } },
      ],
      general_settings: { master_key: MASTER_KEY },
    });
    try {
      // The body ends cleanly right after the fifth event, two deltas into the answer: no [DONE]
      // (OpenAI), no message_delta (Anthropic).
      openai.fault({ kind: "wire", shape: endAfterEvents(5, "close") });
      anthropic.fault({ kind: "wire", shape: endAfterEvents(5, "close") });
      for (const model of ["gpt-4o", "claude"]) {
        const res = await fetch(`${gw.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ model, stream: true, messages: [{ role: "user", content: "one two three four five six seven" }] }),
        });
        const text = await res.text();
        expect(text, model).not.toContain("data: [DONE]");
        const last = JSON.parse(text.trimEnd().split("\n\n").at(-1)!.slice("data: ".length)) as { error?: { code: string; message: string } };
        expect(last.error?.code, model).toBe("503");
        expect(last.error?.message, model).toContain("ended before the answer was complete");
        await gw.host!.spendWriter.flush();
        const callId = res.headers.get("x-svc-call-id");
        const [row] = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where call_id = ${callId}`);
        expect(row, model).toMatchObject({ status: "failure", stream: true });
        // The client got part of the answer, which the upstream bills.
        expect(row!.completion_tokens, model).toBeGreaterThan(0);
        expect(Number(row!.spend), model).toBeGreaterThan(0);
      }
    } finally {
      await gw.stop();
      await openai.stop();
      await anthropic.stop();
    }
  });
});

describe("OpenAI-compatible streams whose body ends at the end of the answer, not with it, or that nest a usage of their own (pglite)", () => {
  let openai: Awaited<ReturnType<typeof import("../mock-upstream/openai.ts")["startMockOpenAI"]>>;
  let gw: TestGateway;
  beforeAll(async () => {
    const { startMockOpenAI } = await import("../mock-upstream/openai.ts");
    openai = await startMockOpenAI({ apiKey: "sk-up" });
    gw = await startBackendGateway("pglite", {
      model_list: [{ model_name: "gpt-4o", svc_params: { model: "openai/gpt-4o", api_base: openai.url, api_key: "sk-up" } }],
      general_settings: { master_key: MASTER_KEY },
    });
  }, 30_000);
  afterAll(async () => {
    await gw?.stop();
    await openai?.stop();
  });

  /** A stream whose upstream body is `reshape` of the mock's (then a clean end): what the client got, and the call's log row. */
  async function streamed(reshape: (text: string) => string): Promise<{ text: string; row: LogRow | undefined }> {
    openai.fault({
      kind: "wire",
      shape: (bytes: Uint8Array) => {
        const body = new TextEncoder().encode(reshape(new TextDecoder().decode(bytes)));
        return { bytes: body, cuts: [], end: { at: body.length, how: "close" as const } };
      },
    });
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "gpt-4o", stream: true, stream_options: { include_usage: true }, messages: [{ role: "user", content: "one two three" }] }),
    });
    const text = await res.text();
    // Whatever the cut, the client gets whole events only: JSON, or [DONE].
    for (const event of text.trimEnd().split("\n\n")) {
      expect(event.startsWith("data: "), event).toBe(true);
      if (event !== "data: [DONE]") expect(() => JSON.parse(event.slice(6)), event).not.toThrow();
    }
    await gw.host!.spendWriter.flush();
    const [row] = await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where call_id = ${res.headers.get("x-svc-call-id")}`);
    return { text, row };
  }

  test("a body that stops right after the chunk with the finish reason (no usage, no [DONE]) is whole: [DONE], a success", async () => {
    const { text, row } = await streamed((t) => t.slice(0, t.indexOf("\n\n", t.indexOf('"finish_reason":"stop"')) + 2));
    expect(text).toContain('"finish_reason":"stop"');
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
    expect(row).toMatchObject({ status: "success", stream: true });
  });

  test("a half event after the last chunk (a body cut inside the next event) is dropped: [DONE], a success (it was passed on torn)", async () => {
    // Cut where a brace closes: the adapter's cheap check ({…}) passes it, only a parse sees it is torn.
    const { text, row } = await streamed((t) => `${t.slice(0, t.indexOf("data: [DONE]"))}data: {"id":"chatcmpl-torn","choices":[{"index":0,"delta":{}`);
    expect(text).not.toContain('"error"');
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
    expect(row).toMatchObject({ status: "success", stream: true });
  });

  /** The mock's usage chunk taken out: a server that sends no usage. */
  const withoutUsage = (t: string) => t.replace(/data: \{[^\n]*"choices":\[\],"usage":\{[^\n]*\n\n/, "");
  /** Groq's vendor member on the first chunk, whose `usage` is Groq's queue time, not the call's. */
  const groqFirst = (t: string) => t.replace('"choices":', '"x_groq":{"id":"req_1","usage":{"queue_time":0.01}},"choices":');
  const afterThirdEvent = (t: string) => `${t.split("\n\n").slice(0, 3).join("\n\n")}\n\n`;

  test("a chunk with a nested usage (Groq's x_groq) is not the usage: a stream without one is charged its estimate, not free", async () => {
    const plain = await streamed(withoutUsage);
    const groq = await streamed((t) => groqFirst(withoutUsage(t)));
    expect(groq.text).toContain('"x_groq"');
    expect(plain.row).toMatchObject({ status: "success", stream: true });
    expect(Number(plain.row!.spend)).toBeGreaterThan(0);
    expect(groq.row).toMatchObject({ status: "success", prompt_tokens: plain.row!.prompt_tokens, completion_tokens: plain.row!.completion_tokens, spend: plain.row!.spend });
  });

  test("a chunk with a nested usage does not end the answer: a body that stops after it is cut, a failure", async () => {
    const plain = await streamed(afterThirdEvent);
    const groq = await streamed((t) => afterThirdEvent(groqFirst(t)));
    expect(plain.row).toMatchObject({ status: "failure", stream: true });
    expect(groq.row).toMatchObject({ status: "failure", stream: true });
    expect(groq.text).toContain("ended before the answer was complete");
  });

  /** The mock's usage chunk with `usage` in place of its own. */
  const usageAs = (usage: object) => (t: string) =>
    t.replace(/data: (\{[^\n]*"choices":\[\],"usage":\{[^\n]*)\n\n/, (_, chunk: string) => `data: ${JSON.stringify({ ...JSON.parse(chunk), usage })}\n\n`);

  test("a usage chunk that counts nothing is none: charged the estimate, and a client that asked for usage gets one usage chunk, the counts charged", async () => {
    const plain = await streamed(withoutUsage);
    for (const usage of [{}, { prompt_tokens: null, completion_tokens: null }]) {
      const { text, row } = await streamed(usageAs(usage));
      expect(row, JSON.stringify(usage)).toMatchObject({ status: "success", prompt_tokens: plain.row!.prompt_tokens, completion_tokens: plain.row!.completion_tokens, spend: plain.row!.spend });
      const usages = text.split("\n\n").filter((event) => event.includes('"usage":{'));
      expect(usages).toHaveLength(1);
      expect(JSON.parse(usages[0]!.slice("data: ".length)).usage).toMatchObject({ prompt_tokens: row!.prompt_tokens, completion_tokens: row!.completion_tokens });
    }
    expect(Number(plain.row!.spend)).toBeGreaterThan(0);
  });

  test("a usage chunk with counts as text is charged them; one with only a total, the prompt as estimated and the rest", async () => {
    const text = await streamed(usageAs({ prompt_tokens: "100", completion_tokens: "10", total_tokens: "110" }));
    expect(text.row).toMatchObject({ status: "success", prompt_tokens: 100, completion_tokens: 10 });
    const plain = await streamed(withoutUsage);
    const total = await streamed(usageAs({ total_tokens: 110 }));
    expect(total.row).toMatchObject({ status: "success", prompt_tokens: plain.row!.prompt_tokens, completion_tokens: 110 - plain.row!.prompt_tokens });
  });

  test("a stream without usage is charged a token for each chunk that carries one, not for the opening role chunk nor the finish chunk", async () => {
    const { text, row } = await streamed(withoutUsage);
    const withTokens = text.split("\n\n").filter((event) => /"content":"[^"]/.test(event)).length;
    expect(withTokens).toBeGreaterThan(0);
    expect(row).toMatchObject({ status: "success", completion_tokens: withTokens });
  });

  test("a client that asked for usage gets a usage chunk before [DONE] when the upstream sent none: the counts the call was charged", async () => {
    const { text, row } = await streamed(withoutUsage);
    const events = text.trimEnd().split("\n\n");
    expect(events.at(-1)).toBe("data: [DONE]");
    const first = JSON.parse(events[0]!.slice("data: ".length)) as { id: string };
    const last = JSON.parse(events.at(-2)!.slice("data: ".length)) as Record<string, unknown>;
    const { prompt_tokens, completion_tokens } = row!;
    expect(last).toMatchObject({ id: first.id, object: "chat.completion.chunk", model: "gpt-4o", choices: [], usage: { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens } });
    expect(completion_tokens).toBeGreaterThan(0);
  });
});
