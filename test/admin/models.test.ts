// Model deployments stored through the management API, on the embedded store and on PostgreSQL:
// a new model serves through the openai SDK as soon as /model/new returns, updates (full and
// partial) change what it answers, deletion makes it unknown, credentials are encrypted at rest
// and never shown (responses, audit trail, logs), config models are read-only, only proxy admins
// write, and (PostgreSQL + Redis) a second instance picks the change up without a restart.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash, generateKeyPairSync } from "node:crypto";
import { and, eq } from "drizzle-orm";
import OpenAI, { BadRequestError } from "openai";
import { decrypt, secretKey } from "../../core/secrets.ts";
import { auditLog, proxyModels, users, virtualKeys } from "../../core/store/schema.ts";
import { freshDatabase, MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

const REDIS_URL = TEST_REDIS_URL;
const CONFIG = {
  model_list: [{ model_name: "chat-mock", svc_params: { model: "mock/chat" }, model_info: { id: "cfg-chat" } }],
  general_settings: { master_key: MASTER_KEY },
};
const SECRET = "sk-upstream-very-secret-0123456789";

const HEADER_SECRET = "hdr-secret-value-0123456789";
const PRIVATE_KEY_MARK = "PRIVATE KEY";

/** An OpenAI-compatible chat endpoint (recording the X-Api-Key it gets) and Vertex's: a token endpoint and Gemini's generateContent. */
function credentialsUpstream() {
  const apiKeyHeaders: (string | null)[] = [];
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch(req) {
      const path = new URL(req.url).pathname;
      if (path === "/google-token") return Response.json({ token_type: "Bearer", expires_in: 3600, access_token: "ya29.test-token" });
      if (path.endsWith(":generateContent")) {
        return Response.json({ candidates: [{ content: { role: "model", parts: [{ text: "gemini answer" }] }, finishReason: "STOP" }], usageMetadata: { promptTokenCount: 1, candidatesTokenCount: 2, totalTokenCount: 3 } });
      }
      apiKeyHeaders.push(req.headers.get("x-api-key"));
      return Response.json({ id: "chatcmpl-1", object: "chat.completion", created: 1, model: "gpt-4o", choices: [{ index: 0, message: { role: "assistant", content: "upstream answer" }, finish_reason: "stop" }], usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 } });
    },
  });
  const url = `http://127.0.0.1:${server.port}`;
  const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const serviceAccount = {
    type: "service_account",
    project_id: "acme",
    private_key: privateKey.export({ type: "pkcs8", format: "pem" }) as string,
    client_email: "stored-model@acme.iam.gserviceaccount.com",
    token_uri: `${url}/google-token`,
  };
  return { url, serviceAccount, apiKeyHeaders, stop: () => server.stop(true) };
}

type Json = Record<string, unknown> & { error?: { message: string; type: string; code: string; param: string | null } };

for (const backend of ["pglite", "postgres"] as const) {
  describe(`stored models (${backend})`, () => {
    let gw: TestGateway;
    let databaseUrl: string | undefined;
    let drop: (() => Promise<void>) | undefined;
    let client: OpenAI;
    /** Distinct per backend: the postgres gateways share Redis with other test processes. */
    const name = (n: string) => `${n}-${backend}`;

    beforeAll(async () => {
      if (backend === "postgres") {
        const db = await freshDatabase("gw_models");
        databaseUrl = db.url;
        drop = db.drop;
      }
      gw = await startTestGateway(CONFIG, { store: { databaseUrl, redisUrl: backend === "postgres" ? REDIS_URL : undefined } });
      client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
    });
    afterAll(async () => {
      await gw.stop();
      await drop?.();
    });

    const db = () => gw.host!.store.db;

    async function call(method: string, path: string, body?: unknown, key = MASTER_KEY): Promise<{ status: number; body: Json; text: string }> {
      const res = await fetch(gw.url + path, {
        method,
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      return { status: res.status, body: JSON.parse(text) as Json, text };
    }

    const answer = async (model: string, c = client) => (await c.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] })).choices[0]?.message.content;

    async function storedRows(): Promise<string> {
      return JSON.stringify(await db().select().from(proxyModels));
    }

    test("/model/new: callable through the SDK at once, listed, shown as a db model, credentials never returned", async () => {
      const res = await call("POST", "/model/new", {
        model_name: name("db-mock"),
        svc_params: { model: "mock/fixed", mock_response: "first answer", api_key: SECRET, aws_secret_access_key: SECRET },
        model_info: { id: name("db-1"), mode: "chat" },
      });
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({
        model_id: name("db-1"),
        model_name: name("db-mock"),
        svc_params: { model: "mock/fixed", mock_response: "first answer" },
        model_info: { id: name("db-1"), db_model: true, mode: "chat" },
      });
      expect(res.text).not.toContain(SECRET);
      expect(res.text).not.toContain("enc:v1:");
      expect(res.body.svc_params).not.toHaveProperty("api_key");

      expect(await answer(name("db-mock"))).toBe("first answer");
      const listed = await client.models.list();
      expect(listed.data.map((m) => m.id)).toContain(name("db-mock"));
      const info = await call("GET", `/model/info?svc_model_id=${name("db-1")}`);
      expect(info.status).toBe(200);
      expect((info.body.data as { model_info: Record<string, unknown> }[])[0]?.model_info).toMatchObject({ id: name("db-1"), db_model: true });
      expect(info.text).not.toContain(SECRET);
      const cfg = await call("GET", "/model/info?svc_model_id=cfg-chat");
      expect((cfg.body.data as { model_info: Record<string, unknown> }[])[0]?.model_info.db_model).toBe(false);

      // At rest: encrypted, decryptable with the gateway's key, never in clear.
      const rows = await storedRows();
      expect(rows).not.toContain(SECRET);
      const [row] = await db().select().from(proxyModels).where(eq(proxyModels.modelId, name("db-1")));
      const params = row!.svcParams as Record<string, string>;
      expect(params.api_key).toStartWith("enc:v1:");
      expect(params.aws_secret_access_key).toStartWith("enc:v1:");
      expect(decrypt(params.api_key!, secretKey(process.env.SVC_SALT_KEY, MASTER_KEY)!)).toBe(SECRET);
      expect(row!.createdBy).toBeString();
    });

    test("header values and a vertex_credentials mapping are encrypted at rest too, never shown, and sent upstream; rows stored in clear before still serve", async () => {
      const up = credentialsUpstream();
      try {
        const openai = { model: "openai/gpt-4o", api_base: `${up.url}/v1`, api_key: SECRET, headers: { "X-Api-Key": HEADER_SECRET } };
        const vertex = { model: "vertex_ai/gemini-2.5-pro", api_base: up.url, vertex_credentials: up.serviceAccount };
        for (const [model, svc_params] of [
          ["hdr", openai],
          ["vx", vertex],
        ] as const) {
          const res = await call("POST", "/model/new", { model_name: name(model), svc_params, model_info: { id: name(`${model}-1`) } });
          expect(res.status).toBe(200);
          expect(res.body.svc_params).toEqual({ model: svc_params.model, api_base: svc_params.api_base });
        }
        expect(await answer(name("hdr"))).toBe("upstream answer");
        expect(up.apiKeyHeaders.at(-1)).toBe(HEADER_SECRET);
        expect(await answer(name("vx"))).toBe("gemini answer");

        const rows = await storedRows();
        for (const secret of [HEADER_SECRET, PRIVATE_KEY_MARK, up.serviceAccount.client_email]) expect(rows).not.toContain(secret);
        const info = await call("GET", `/model/info?svc_model_id=${name("vx-1")}`);
        expect((info.body.data as { svc_params: unknown }[])[0]?.svc_params).toEqual({ model: vertex.model });
        const hdrInfo = await call("GET", `/model/info?svc_model_id=${name("hdr-1")}`);
        expect((hdrInfo.body.data as { svc_params: unknown }[])[0]?.svc_params).toEqual({ model: openai.model });

        // A PATCH keeps them (decrypted, merged, encrypted again).
        expect((await call("PATCH", `/model/${name("vx-1")}/update`, { svc_params: { weight: 2 } })).status).toBe(200);
        expect(await answer(name("vx"))).toBe("gemini answer");
        expect(await storedRows()).not.toContain(PRIVATE_KEY_MARK);

        // Written before these were encrypted: in clear, read as they are.
        await db()
          .insert(proxyModels)
          .values([
            { modelId: name("old-hdr-1"), modelName: name("old-hdr"), svcParams: openai },
            { modelId: name("old-vx-1"), modelName: name("old-vx"), svcParams: vertex },
          ]);
        expect((await gw.live.reload("test", true)).ok).toBe(true);
        expect(await answer(name("old-hdr"))).toBe("upstream answer");
        expect(up.apiKeyHeaders.at(-1)).toBe(HEADER_SECRET);
        expect(await answer(name("old-vx"))).toBe("gemini answer");
        // Stored in clear, they would fail the other tests' checks of the rows.
        for (const id of ["old-hdr-1", "old-vx-1"]) expect((await call("POST", "/model/delete", { id: name(id) })).status).toBe(200);
      } finally {
        up.stop();
      }
    });

    test("an api_base carrying a password or a ?key= is encrypted at rest and never shown (answers, audit trail), and serves; one stored in clear before still serves", async () => {
      const up = credentialsUpstream();
      const apiBase = (n: number) => `http://user:url-pass-secret-${n}@${up.url.slice("http://".length)}/v1?key=url-key-secret-${n}`;
      const secrets = (n: number) => [`url-pass-secret-${n}`, `url-key-secret-${n}`];
      try {
        const id = name("urlcred-1");
        const created = await call("POST", "/model/new", { model_name: name("urlcred"), svc_params: { model: "openai/gpt-4o", api_base: apiBase(1), api_key: SECRET }, model_info: { id } });
        expect(created.status).toBe(200);
        expect(created.body.svc_params).toEqual({ model: "openai/gpt-4o" });
        expect(await answer(name("urlcred"))).toBe("upstream answer");
        const replaced = await call("POST", "/model/update", { model_name: name("urlcred"), svc_params: { model: "openai/gpt-4o", api_base: apiBase(2), api_key: SECRET }, model_info: { id } });
        expect(replaced.status).toBe(200);
        const patched = await call("PATCH", `/model/${id}/update`, { svc_params: { weight: 2 } });
        expect(patched.status).toBe(200);
        expect(await answer(name("urlcred"))).toBe("upstream answer");
        const [row] = await db().select().from(proxyModels).where(eq(proxyModels.modelId, id));
        expect((row!.svcParams as Record<string, string>).api_base).toStartWith("enc:v1:");
        const trail = JSON.stringify(await db().select().from(auditLog).where(eq(auditLog.objectId, id)));
        const audit = await call("GET", "/audit/logs");
        for (const shown of [created.text, replaced.text, patched.text, trail, audit.text, await storedRows()]) {
          for (const secret of [...secrets(1), ...secrets(2)]) expect(shown).not.toContain(secret);
        }

        // Written before api_base was encrypted: in clear, read as it is.
        await db()
          .insert(proxyModels)
          .values({ modelId: name("old-urlcred-1"), modelName: name("old-urlcred"), svcParams: { model: "openai/gpt-4o", api_base: apiBase(3), api_key: SECRET } });
        expect((await gw.live.reload("test", true)).ok).toBe(true);
        expect(await answer(name("old-urlcred"))).toBe("upstream answer");
        for (const old of ["urlcred-1", "old-urlcred-1"]) expect((await call("POST", "/model/delete", { id: name(old) })).status).toBe(200);
      } finally {
        up.stop();
      }
    });

    test("/model/new without an id gets a uuid; 400 for duplicate ids and unknown providers, 422 for bad bodies", async () => {
      const res = await call("POST", "/model/new", { model_name: name("no-id"), svc_params: { model: "mock/chat" } });
      expect(res.status).toBe(200);
      expect(res.body.model_id).toMatch(/^[0-9a-f-]{36}$/);
      expect(await answer(name("no-id"))).toContain("mock response");

      const dupConfig = await call("POST", "/model/new", { model_name: "x", svc_params: { model: "mock/chat" }, model_info: { id: "cfg-chat" } });
      expect(dupConfig.status).toBe(400);
      expect(dupConfig.body.error?.message).toContain("already exists");
      const dupDb = await call("POST", "/model/new", { model_name: "x", svc_params: { model: "mock/chat" }, model_info: { id: res.body.model_id } });
      expect(dupDb.status).toBe(400);

      const provider = await call("POST", "/model/new", { model_name: "x", svc_params: { model: "nosuchprovider/m" } });
      expect(provider.status).toBe(400);
      expect(provider.body.error?.message).toContain("nosuchprovider");

      const noParams = await call("POST", "/model/new", { model_name: "x" });
      expect(noParams.status).toBe(422);
      expect(noParams.body.error?.param).toBe("svc_params");
      const badModel = await call("POST", "/model/new", { model_name: "x", svc_params: { model: "no-slash" } });
      expect(badModel.status).toBe(422);
      expect(badModel.body.error?.param).toBe("svc_params.model");
      const badBase = await call("POST", "/model/new", { model_name: "x", svc_params: { model: "mock/chat", api_base: "ftp://x" } });
      expect(badBase.status).toBe(422);
      const nothingStored = await db().select().from(proxyModels).where(eq(proxyModels.modelName, "x"));
      expect(nothingStored).toEqual([]);
    });

    test("concurrent writes of one model: every accepted write answers 200 (a later one may overtake it), duplicates a 400; the registry serves what is stored", async () => {
      const id = name("race-1");
      const creates = await Promise.all(Array.from({ length: 4 }, () => call("POST", "/model/new", { model_name: name("race"), svc_params: { model: "mock/chat" }, model_info: { id } })));
      expect(creates.map((r) => r.status).sort()).toEqual([200, 400, 400, 400]);
      const updates = await Promise.all(
        [1, 2, 3, 4, 5].map((i) => call("POST", "/model/update", { model_name: name(`race-v${i}`), svc_params: { model: "mock/chat" }, model_info: { id } })),
      );
      expect(updates.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
      const [row] = await db().select().from(proxyModels).where(eq(proxyModels.modelId, id));
      expect(gw.live.current.models.findById(id)?.entry.model_name).toBe(row!.modelName);
    });

    test("/model/update replaces the whole deployment; PATCH changes only the given fields", async () => {
      await call("POST", "/model/new", {
        model_name: name("upd"),
        svc_params: { model: "mock/fixed", mock_response: "v1", api_key: SECRET, weight: 2 },
        model_info: { id: name("upd-1"), mode: "chat", base_model: "gpt-x" },
      });
      expect(await answer(name("upd"))).toBe("v1");

      // PATCH: only mock_response changes; the key, weight, name and model_info stay.
      const patched = await call("PATCH", `/model/${name("upd-1")}/update`, { svc_params: { mock_response: "v2" } });
      expect(patched.status).toBe(200);
      expect(patched.body).toMatchObject({ model_name: name("upd"), svc_params: { model: "mock/fixed", mock_response: "v2", weight: 2 }, model_info: { mode: "chat", base_model: "gpt-x" } });
      expect(patched.text).not.toContain(SECRET);
      expect(await answer(name("upd"))).toBe("v2");
      const [afterPatch] = await db().select().from(proxyModels).where(eq(proxyModels.modelId, name("upd-1")));
      const kept = (afterPatch!.svcParams as Record<string, string>).api_key!;
      expect(kept).toStartWith("enc:v1:");
      expect(decrypt(kept, secretKey(process.env.SVC_SALT_KEY, MASTER_KEY)!)).toBe(SECRET);

      // PATCH: a null removes a field; a new name moves the model.
      const renamed = await call("PATCH", `/model/${name("upd-1")}/update`, { model_name: name("upd-renamed"), svc_params: { weight: null }, model_info: { base_model: null } });
      expect(renamed.status).toBe(200);
      expect(renamed.body.svc_params).not.toHaveProperty("weight");
      expect(renamed.body.model_info).not.toHaveProperty("base_model");
      expect(await answer(name("upd-renamed"))).toBe("v2");
      const gone = await answer(name("upd")).catch((e: unknown) => e);
      expect(gone).toBeInstanceOf(BadRequestError);

      // Full replace: what is not given is gone (the api_key too).
      const replaced = await call("POST", "/model/update", { model_name: name("upd"), svc_params: { model: "mock/fixed", mock_response: "v3" }, model_info: { id: name("upd-1") } });
      expect(replaced.status).toBe(200);
      expect(replaced.body).toMatchObject({ model_name: name("upd"), svc_params: { model: "mock/fixed", mock_response: "v3" }, model_info: { id: name("upd-1"), db_model: true } });
      expect(replaced.body.model_info).not.toHaveProperty("mode");
      expect(await answer(name("upd"))).toBe("v3");
      const [afterReplace] = await db().select().from(proxyModels).where(eq(proxyModels.modelId, name("upd-1")));
      expect(afterReplace!.svcParams).not.toHaveProperty("api_key");

      // Errors.
      expect((await call("POST", "/model/update", { model_name: "m", svc_params: { model: "mock/chat" }, model_info: { id: "nope" } })).status).toBe(404);
      const cfg = await call("POST", "/model/update", { model_name: "m", svc_params: { model: "mock/chat" }, model_info: { id: "cfg-chat" } });
      expect(cfg.status).toBe(400);
      expect(cfg.body.error?.message).toContain("config.yaml");
      expect((await call("POST", "/model/update", { model_name: "m", svc_params: { model: "mock/chat" } })).status).toBe(422);
      expect((await call("PATCH", "/model/nope/update", { svc_params: { mock_response: "x" } })).status).toBe(404);
      expect((await call("PATCH", "/model/cfg-chat/update", { svc_params: { mock_response: "x" } })).status).toBe(400);
      const badPatch = await call("PATCH", `/model/${name("upd-1")}/update`, { svc_params: { model: "bad" } });
      expect(badPatch.status).toBe(422);
      expect(await answer(name("upd"))).toBe("v3");
      expect((await call("PATCH", `/model/${name("upd-1")}/update`, { model_info: { id: "other" } })).status).toBe(400);
    });

    test("/model/delete: the model becomes unknown (400 Invalid model name); config models and unknown ids refused", async () => {
      await call("POST", "/model/new", { model_name: name("del"), svc_params: { model: "mock/chat", api_key: SECRET }, model_info: { id: name("del-1") } });
      expect(await answer(name("del"))).toContain("mock response");
      const res = await call("POST", "/model/delete", { id: name("del-1") });
      expect(res.status).toBe(200);
      expect(res.body).toEqual({ message: `Model: ${name("del-1")} deleted successfully` });
      const err = await answer(name("del")).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(BadRequestError);
      expect((err as BadRequestError).message).toContain("Invalid model name");
      expect((await client.models.list()).data.map((m) => m.id)).not.toContain(name("del"));
      expect(await db().select().from(proxyModels).where(eq(proxyModels.modelId, name("del-1")))).toEqual([]);

      expect((await call("POST", "/model/delete", { id: name("del-1") })).status).toBe(404);
      const cfg = await call("POST", "/model/delete", { id: "cfg-chat" });
      expect(cfg.status).toBe(400);
      expect(cfg.body.error?.message).toBe("Model 'cfg-chat' is defined in config.yaml; edit the file to change it.");
      expect(await answer("chat-mock")).toContain("mock response");
      expect((await call("POST", "/model/delete", {})).status).toBe(422);
    });

    test("only proxy admins write models", async () => {
      const key = `sk-test-${crypto.randomUUID()}`;
      const token = createHash("sha256").update(key).digest("hex");
      await db().insert(users).values({ userId: name("viewer"), userRole: "proxy_admin_viewer" });
      await db().insert(virtualKeys).values({ token, keyName: "sk-...view", userId: name("viewer") });
      await gw.host!.services.bus!.publish({ kind: "user", userId: name("viewer") }, { kind: "key", token });
      const plainKey = `sk-test-${crypto.randomUUID()}`;
      const plainToken = createHash("sha256").update(plainKey).digest("hex");
      await db().insert(virtualKeys).values({ token: plainToken, keyName: "sk-...lain" });
      await gw.host!.services.bus!.publish({ kind: "key", token: plainToken });
      for (const k of [key, plainKey]) {
        expect((await call("POST", "/model/new", { model_name: "evil", svc_params: { model: "mock/chat" } }, k)).status).toBe(403);
        expect((await call("POST", "/model/update", { model_name: "evil", svc_params: { model: "mock/chat" }, model_info: { id: name("db-1") } }, k)).status).toBe(403);
        expect((await call("PATCH", `/model/${name("db-1")}/update`, { svc_params: { mock_response: "pwned" } }, k)).status).toBe(403);
        expect((await call("POST", "/model/delete", { id: name("db-1") }, k)).status).toBe(403);
      }
      expect((await call("POST", "/model/delete", { id: name("db-1") }, "sk-wrong")).status).toBe(401);
      expect(await answer(name("db-mock"))).toBe("first answer");
    });

    test("svc_params prices are shown in admin responses and the audit trail (they are no credential); the key is not", async () => {
      const prices = { input_cost_per_token: 0.000002, output_cost_per_token: 0.000004, output_cost_per_reasoning_token: 0.000003 };
      const created = await call("POST", "/model/new", { model_name: name("priced"), svc_params: { model: "mock/chat", api_key: SECRET, ...prices }, model_info: { id: name("priced-1") } });
      expect(created.status).toBe(200);
      expect(created.body.svc_params).toEqual({ model: "mock/chat", ...prices });
      const patched = await call("PATCH", `/model/${name("priced-1")}/update`, { svc_params: { input_cost_per_token: 0.5 } });
      expect(patched.body.svc_params).toEqual({ model: "mock/chat", ...prices, input_cost_per_token: 0.5 });
      expect(patched.text).not.toContain(SECRET);
      const [updated] = await db().select().from(auditLog).where(and(eq(auditLog.objectId, name("priced-1")), eq(auditLog.action, "updated")));
      const params = (v: unknown) => (v as { svc_params: Record<string, unknown> }).svc_params;
      expect([params(updated!.beforeValue).input_cost_per_token, params(updated!.updatedValues).input_cost_per_token]).toEqual([0.000002, 0.5]);
      expect(JSON.stringify(updated)).not.toContain(SECRET);
    });

    test("every model write is audited with credentials redacted; no secret in the logs", async () => {
      const trail = await db().select().from(auditLog).where(eq(auditLog.tableName, "proxy_models"));
      const byObject = (id: string) => trail.filter((r) => r.objectId === id).map((r) => r.action);
      expect(byObject(name("db-1"))).toEqual(["created"]);
      expect(byObject(name("upd-1")).sort()).toEqual(["created", "updated", "updated", "updated"]);
      expect(byObject(name("del-1")).sort()).toEqual(["created", "deleted"]);
      expect(JSON.stringify(trail)).not.toContain(SECRET);
      expect(JSON.stringify(gw.log.lines)).not.toContain(SECRET);
      expect(await storedRows()).not.toContain(SECRET);
    });

    if (backend === "postgres") {
      test("a model added on one instance serves on another (same PostgreSQL and Redis) within a second", async () => {
        const other = await startTestGateway(CONFIG, { store: { databaseUrl, redisUrl: REDIS_URL } });
        const otherClient = new OpenAI({ baseURL: other.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
        /** Polls instance B until `model` answers `want`; returns how long it took. */
        async function seenOnB(model: string, want: string, limitMs: number): Promise<number> {
          const started = Date.now();
          let got: string | null | undefined;
          while (Date.now() - started < limitMs) {
            got = await answer(model, otherClient).catch(() => undefined);
            if (got === want) return Date.now() - started;
            await Bun.sleep(20);
          }
          throw new Error(`instance B answered ${JSON.stringify(got)} for ${model} after ${limitMs} ms, expected ${JSON.stringify(want)}`);
        }
        try {
          // Stored before it started: loaded at start.
          expect(await answer(name("db-mock"), otherClient)).toBe("first answer");
          // B subscribes to the change bus in the background: a first change (generous limit) shows it listens.
          await call("POST", "/model/new", { model_name: name("warmup"), svc_params: { model: "mock/fixed", mock_response: "warm" }, model_info: { id: name("warmup-1") } });
          await seenOnB(name("warmup"), "warm", 10_000);

          const created = await call("POST", "/model/new", { model_name: name("multi"), svc_params: { model: "mock/fixed", mock_response: "from A" }, model_info: { id: name("multi-1") } });
          expect(created.status).toBe(200);
          expect(await seenOnB(name("multi"), "from A", 1000)).toBeLessThan(1000);
          await call("PATCH", `/model/${name("multi-1")}/update`, { svc_params: { mock_response: "changed on A" } });
          expect(await seenOnB(name("multi"), "changed on A", 1000)).toBeLessThan(1000);
          await call("POST", "/model/delete", { id: name("multi-1") });
          const deletedAt = Date.now();
          let err: unknown;
          while (Date.now() - deletedAt < 1000) {
            err = await answer(name("multi"), otherClient).catch((e: unknown) => e);
            if (err instanceof BadRequestError) break;
            await Bun.sleep(20);
          }
          expect(err).toBeInstanceOf(BadRequestError);
        } finally {
          await other.stop();
        }
      });
    }
  });
}

describe("a stored model written while config.yaml on disk is invalid", () => {
  test("serves at once on the last good config; the bad file is still refused and the good one accepted later", async () => {
    const gw = await startTestGateway(CONFIG, { store: {} });
    try {
      const post = async (path: string, body: unknown) => {
        const res = await fetch(gw.url + path, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify(body) });
        return { status: res.status, text: await res.text() };
      };
      const chat = async (model: string) => {
        const res = await fetch(`${gw.baseURL}/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] }),
        });
        return { status: res.status, body: (await res.json()) as Json };
      };
      // An operator is half-way through an edit: the file does not parse, nothing reloaded it yet.
      gw.writeConfig("model_list:\n  - model_name: [unclosed\n");
      const created = await post("/model/new", { model_name: "while-bad", svc_params: { model: "mock/fixed", mock_response: "stored" }, model_info: { id: "while-bad-1" } });
      expect(created.status, created.text).toBe(200);
      expect((await chat("while-bad")).status).toBe(200);
      expect((await chat("chat-mock")).status).toBe(200);
      const deleted = await post("/model/delete", { id: "while-bad-1" });
      expect(deleted.status, deleted.text).toBe(200);
      expect((await chat("while-bad")).status).toBe(400);
      // The bad file is still what a file reload sees: refused, the config keeps serving.
      expect((await gw.live.reload("file changed")).ok).toBe(false);
      expect((await chat("chat-mock")).status).toBe(200);
      gw.writeConfig({ ...CONFIG, model_list: [...CONFIG.model_list, { model_name: "fixed-later", svc_params: { model: "mock/later" } }] });
      expect((await gw.live.reload("file changed")).ok).toBe(true);
      expect((await chat("fixed-later")).status).toBe(200);
    } finally {
      await gw.stop();
    }
  });
});

describe("a stored model and a config.yaml model with the same id", () => {
  test("/model/new refuses a config model's id (given or derived) naming it; a reload that gives a stored model's id to a config model serves the config's, warns, and refuses changes to the stored one but lets it be deleted", async () => {
    const gw = await startTestGateway(CONFIG, { store: {} });
    try {
      const call = async (method: string, path: string, body?: unknown) => {
        const res = await fetch(gw.url + path, { method, headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
        return { status: res.status, body: (await res.json()) as Json };
      };
      const chat = async (model: string) => {
        const res = await call("POST", "/v1/chat/completions", { model, messages: [{ role: "user", content: "hi" }] });
        return res.status === 200 ? (res.body.choices as { message: { content: string } }[])[0]!.message.content : `${res.status}: ${res.body.error?.message}`;
      };

      const given = await call("POST", "/model/new", { model_name: "x", svc_params: { model: "mock/chat" }, model_info: { id: "cfg-chat" } });
      expect({ status: given.status, param: given.body.error?.param, message: given.body.error?.message }).toEqual({
        status: 400,
        param: "model_info.id",
        message: "A model with id 'cfg-chat' already exists in config.yaml: 'chat-mock' (/model_list/0). Give this model another model_info.id.",
      });
      // A config model without model_info.id has a derived id (a hash), shown by /model/info.
      gw.writeConfig({ ...CONFIG, model_list: [...CONFIG.model_list, { model_name: "hashed", svc_params: { model: "mock/hashed" } }] });
      expect((await gw.live.reload("file changed")).ok).toBe(true);
      const info = await call("GET", "/model/info");
      const hashed = (info.body.data as { model_name: string; model_info: { id: string } }[]).find((m) => m.model_name === "hashed")!.model_info.id;
      const derived = await call("POST", "/model/new", { model_name: "x", svc_params: { model: "mock/chat" }, model_info: { id: hashed } });
      expect({ status: derived.status, message: derived.body.error?.message }).toEqual({
        status: 400,
        message: `A model with id '${hashed}' already exists in config.yaml: 'hashed' (/model_list/1). Give this model another model_info.id.`,
      });
      expect(await gw.host!.store.db.select().from(proxyModels)).toEqual([]);

      // Stored first; then the file gains a model with its id.
      const stored = await call("POST", "/model/new", { model_name: "stored-later", svc_params: { model: "mock/s", mock_response: "from the store" }, model_info: { id: "later" } });
      expect(stored.status).toBe(200);
      expect(await chat("stored-later")).toBe("from the store");
      gw.writeConfig({ ...CONFIG, model_list: [...CONFIG.model_list, { model_name: "config-later", svc_params: { model: "mock/c", mock_response: "from the config" }, model_info: { id: "later" } }] });
      expect((await gw.live.reload("file changed")).ok).toBe(true);
      expect(await chat("config-later")).toBe("from the config");
      expect(await chat("stored-later")).toStartWith("400: Invalid model name");
      const warned = gw.log.lines.filter((l) => l.level === "warn" && l.fields?.model_id === "later");
      expect(warned.at(-1)).toEqual({
        level: "warn",
        msg: "stored model 'later' is not served: config.yaml's model at /model_list/1 has the same id, and config.yaml wins. Delete the stored model (/model/delete) or give the config model another model_info.id.",
        fields: { model_id: "later", stored_model_name: "stored-later", config_entry: "/model_list/1" },
      });
      for (const [method, path, body] of [
        ["POST", "/model/update", { model_name: "stored-later", svc_params: { model: "mock/s", mock_response: "changed" }, model_info: { id: "later" } }],
        ["PATCH", "/model/later/update", { svc_params: { mock_response: "changed" } }],
      ] as const) {
        const r = await call(method, path, body);
        expect({ status: r.status, message: r.body.error?.message }).toEqual({
          status: 400,
          message:
            "Model 'later' is stored, but config.yaml's model 'config-later' (/model_list/1) has the same id and serves instead (config.yaml wins): a change to the stored one would not take effect. Delete it with /model/delete, or give the config model another model_info.id.",
        });
      }
      const deleted = await call("POST", "/model/delete", { id: "later" });
      expect(deleted.status).toBe(200);
      expect(await gw.host!.store.db.select().from(proxyModels).where(eq(proxyModels.modelId, "later"))).toEqual([]);
      expect(await chat("config-later")).toBe("from the config");
    } finally {
      await gw.stop();
    }
  });
});

// Stored credentials are encrypted with a key from SVC_SALT_KEY or, without it, the master key. A
// gateway started with another master key cannot read them: it starts anyway, logs which model it
// does not serve and why, and the model is served again once its credentials are stored anew.
describe("stored models whose credentials the key cannot decrypt (postgres)", () => {
  test("a reload that would drop one is refused saying which and why; the gateway starts without them, says so, and takes other changes; storing the credentials again brings the model back", async () => {
    const saltKey = process.env.SVC_SALT_KEY;
    delete process.env.SVC_SALT_KEY;
    const db = await freshDatabase("gw_models_key");
    const withKey = (masterKey: string) => ({ ...CONFIG, general_settings: { master_key: masterKey } });
    try {
      const first = await startTestGateway(withKey(MASTER_KEY), { store: { databaseUrl: db.url } });
      const body = { model_name: "stored-secret", svc_params: { model: "openai/gpt-4o-mini", api_base: "http://127.0.0.1:9/v1", api_key: SECRET }, model_info: { id: "stored-secret-1" } };
      const created = await fetch(`${first.url}/model/new`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify(body) });
      expect(created.status).toBe(200);
      const rotated = "sk-rotated-master-key-0987654321";
      // A reload that would drop the model is refused, naming it and why; the serving config stays.
      first.writeConfig(withKey(rotated));
      const reload = await first.live.reload("test", true);
      expect(reload.ok).toBe(false);
      const errors = reload.ok ? [] : (reload as { errors: string[] }).errors;
      expect(errors.join("\n")).toContain("stored model 'stored-secret-1' (stored-secret): its credentials cannot be decrypted");
      expect((await fetch(`${first.url}/v1/models`, { headers: { authorization: `Bearer ${MASTER_KEY}` } })).status).toBe(200);
      await first.stop();

      const second = await startTestGateway(withKey(rotated), { store: { databaseUrl: db.url } });
      try {
        const models = async () => ((await (await fetch(`${second.url}/v1/models`, { headers: { authorization: `Bearer ${rotated}` } })).json()) as { data: { id: string }[] }).data.map((m) => m.id);
        expect(await models()).toEqual(["chat-mock"]);
        const said = second.log.lines.find((l) => l.level === "error" && l.msg.startsWith("stored model not served"));
        expect(said?.fields).toEqual({ model_id: "stored-secret-1", model_name: "stored-secret" });
        expect(said?.msg).toContain("SVC_SALT_KEY");
        // Not served, so no rebuild drops it: an unrelated model is stored and served, a config edit goes through.
        const fresh = { model_name: "fresh", svc_params: { model: "mock/fresh", mock_response: "fresh answer" }, model_info: { id: "fresh-1" } };
        const stored = await fetch(`${second.url}/model/new`, { method: "POST", headers: { authorization: `Bearer ${rotated}`, "content-type": "application/json" }, body: JSON.stringify(fresh) });
        expect(stored.status).toBe(200);
        expect((await models()).sort()).toEqual(["chat-mock", "fresh"]);
        second.writeConfig({ ...withKey(rotated), model_list: [...CONFIG.model_list, { model_name: "config-added", svc_params: { model: "mock/added" } }] });
        expect((await second.live.reload("test", true)).ok).toBe(true);
        expect((await models()).sort()).toEqual(["chat-mock", "config-added", "fresh"]);
        const again = await fetch(`${second.url}/model/update`, { method: "POST", headers: { authorization: `Bearer ${rotated}`, "content-type": "application/json" }, body: JSON.stringify(body) });
        expect(again.status).toBe(200);
        expect((await models()).sort()).toEqual(["chat-mock", "config-added", "fresh", "stored-secret"]);
      } finally {
        await second.stop();
      }
    } finally {
      if (saltKey !== undefined) process.env.SVC_SALT_KEY = saltKey;
      await db.drop();
    }
  }, 60_000);
});
