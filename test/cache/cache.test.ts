// The response cache: a repeated request is answered from the cache with no upstream call and no
// spend (logged as a hit, header says so), for chat, streamed chat (replayed byte for byte),
// completions and embeddings; `caching: true` opts in when the config does not; the cache controls
// (no-cache, no-store, ttl, s-maxage, namespace) work and are limited by the key's
// allowed_cache_controls; entries expire after their ttl; in Redis, two instances share it.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import Redis from "ioredis";
import OpenAI from "openai";
import { rows } from "../../core/store/sql.ts";
import { freshDatabase, MASTER_KEY, requestJson, requestOk, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

let up: MockOpenAI;
let gw: TestGateway;
const uniq = () => Math.random().toString(36).slice(2, 10);

const models = (url: string) => [
  { model_name: "gpt", svc_params: { model: "openai/gpt-4o-mini", api_base: url, api_key: "sk-up" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } },
  { model_name: "emb", svc_params: { model: "openai/text-embedding-3-small", api_base: url, api_key: "sk-up" }, model_info: { input_cost_per_token: 0.000001 } },
  { model_name: "inst", svc_params: { model: "openai/gpt-3.5-turbo-instruct", api_base: url, api_key: "sk-up" } },
];

async function chat(g: TestGateway, body: Record<string, unknown>, key = MASTER_KEY): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(`${g.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "gpt", ...body }),
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

beforeAll(async () => {
  up = await startMockOpenAI({ apiKey: "sk-up" });
  gw = await startBackendGateway("pglite", { model_list: models(up.url), svc_settings: { cache: true, cache_params: { ttl: 60 } }, general_settings: { master_key: MASTER_KEY } });
});
afterAll(async () => {
  await gw?.stop();
  await up?.stop();
});
beforeEach(() => up.reset());

describe("response cache (config on, in memory)", () => {
  test("a repeated chat request is served from the cache: no upstream call, no spend, logged as a hit", async () => {
    const messages = [{ role: "user", content: `what is ${uniq()}?` }];
    const first = await chat(gw, { messages });
    expect(first.status).toBe(200);
    expect(first.headers.get("x-svc-cache-hit")).toBeNull();
    expect(Number(first.headers.get("x-svc-response-cost"))).toBeGreaterThan(0);
    const second = await chat(gw, { messages, user: "someone-else", metadata: { tags: ["x"] } });
    expect(second.status).toBe(200);
    expect(second.headers.get("x-svc-cache-hit")).toBe("true");
    expect(second.headers.get("x-svc-response-cost")).toBe("0");
    // Every answer says what the router did: a hit made no attempt.
    expect([second.headers.get("x-svc-attempted-retries"), second.headers.get("x-svc-attempted-fallbacks")]).toEqual(["0", "0"]);
    expect(second.text).toBe(first.text);
    expect(up.requests.length).toBe(1);
    await gw.host!.spendWriter.flush();
    const logged = await rows<{ cache_hit: boolean; spend: string }>(
      gw.host!.store.db,
      sql`select cache_hit, spend::text as spend from spend_logs where call_id = ${second.headers.get("x-svc-call-id")}`,
    );
    expect(logged.map((l) => ({ hit: l.cache_hit, spend: Number(l.spend) }))).toEqual([{ hit: true, spend: 0 }]);
  });

  test("a hit is logged as <the response id the client got>_cache_hit<ms> (as LiteLLM does), JSON and stream: a lookup by the id finds the priced call", async () => {
    const messages = [{ role: "user", content: `which id ${uniq()}?` }];
    const ids: string[] = [];
    for (const stream of [false, true]) {
      await chat(gw, { messages, stream });
      const hit = await chat(gw, { messages, stream });
      expect(hit.headers.get("x-svc-cache-hit")).toBe("true");
      const id = stream ? (JSON.parse(hit.text.split("\n\n")[0]!.slice("data: ".length)) as { id: string }).id : (JSON.parse(hit.text) as { id: string }).id;
      expect(id).toStartWith("chatcmpl-");
      ids.push(hit.headers.get("x-svc-call-id")!, id);
    }
    await gw.host!.spendWriter.flush();
    const logged = await rows<{ call_id: string; request_id: string }>(gw.host!.store.db, sql`select call_id, request_id from spend_logs where call_id in (${ids[0]!}, ${ids[2]!})`);
    const byCall = new Map(logged.map((l) => [l.call_id, l.request_id]));
    expect(byCall.get(ids[0]!)).toMatch(new RegExp(`^${ids[1]!}_cache_hit\\d+$`));
    expect(byCall.get(ids[2]!)).toMatch(new RegExp(`^${ids[3]!}_cache_hit\\d+$`));
    for (const id of [ids[1]!, ids[3]!]) {
      const found = await requestJson<{ cache_hit: unknown; spend: number }[]>(gw, "GET", `/spend/logs?request_id=${id}&summarize=false`);
      expect(found.body.map((r) => [String(r.cache_hit), r.spend > 0])).toEqual([["false", true]]);
    }
  });

  test("a different parameter is a different answer", async () => {
    const messages = [{ role: "user", content: `hello ${uniq()}` }];
    await chat(gw, { messages, temperature: 0.1 });
    const other = await chat(gw, { messages, temperature: 0.9 });
    expect(other.headers.get("x-svc-cache-hit")).toBeNull();
    expect(up.requests.length).toBe(2);
  });

  test("a streamed answer is replayed as the same stream (openai SDK)", async () => {
    const client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL });
    const messages = [{ role: "user" as const, content: `stream ${uniq()} please` }];
    const collect = async () => {
      const stream = await client.chat.completions.create({ model: "gpt", messages, stream: true });
      let text = "";
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
      return text;
    };
    const a = await collect();
    const b = await collect();
    expect(b).toBe(a);
    expect(a).toContain("Mock reply");
    expect(up.requests.length).toBe(1);
    // A non-stream request for the same prompt is a different entry.
    const plain = await chat(gw, { messages });
    expect(plain.headers.get("x-svc-cache-hit")).toBeNull();
  });

  test("embeddings and completions are cached", async () => {
    const client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL });
    const input = `embed ${uniq()}`;
    const e1 = await client.embeddings.create({ model: "emb", input });
    const e2 = await client.embeddings.create({ model: "emb", input });
    expect(e2.data[0]!.embedding).toEqual(e1.data[0]!.embedding);
    const prompt = `complete ${uniq()}`;
    await client.completions.create({ model: "inst", prompt });
    const raw = await client.completions.create({ model: "inst", prompt }).asResponse();
    expect(raw.headers.get("x-svc-cache-hit")).toBe("true");
    expect(up.requests.length).toBe(2);
  });

  test("cache controls: no-cache skips the read, no-store skips the write, s-maxage rejects old entries, caching:false opts out", async () => {
    const messages = [{ role: "user", content: `controls ${uniq()}` }];
    await chat(gw, { messages });
    expect((await chat(gw, { messages, cache: { "no-cache": true } })).headers.get("x-svc-cache-hit")).toBeNull();
    expect((await chat(gw, { messages, caching: false })).headers.get("x-svc-cache-hit")).toBeNull();
    expect(up.requests.length).toBe(3);
    await Bun.sleep(1100);
    expect((await chat(gw, { messages, cache: { "s-maxage": 1 } })).headers.get("x-svc-cache-hit")).toBeNull();
    const fresh = [{ role: "user", content: `nostore ${uniq()}` }];
    await chat(gw, { messages: fresh, cache: { "no-store": true } });
    expect((await chat(gw, { messages: fresh })).headers.get("x-svc-cache-hit")).toBeNull();
    // Namespaces keep entries apart.
    expect((await chat(gw, { messages, cache: { namespace: "tenant-b" } })).headers.get("x-svc-cache-hit")).toBeNull();
    expect((await chat(gw, { messages, cache: { namespace: "tenant-b" } })).headers.get("x-svc-cache-hit")).toBe("true");
  });

  test("a per-request ttl expires the entry", async () => {
    const messages = [{ role: "user", content: `ttl ${uniq()}` }];
    await chat(gw, { messages, cache: { ttl: 0.3 } });
    expect((await chat(gw, { messages })).headers.get("x-svc-cache-hit")).toBe("true");
    await Bun.sleep(400);
    expect((await chat(gw, { messages })).headers.get("x-svc-cache-hit")).toBeNull();
  });

  test("allowed_cache_controls limits what a key may ask; unknown controls are a 400", async () => {
    const r = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { allowed_cache_controls: ["no-cache"] } });
    const key = r.body.key;
    const messages = [{ role: "user", content: `acl ${uniq()}` }];
    expect((await chat(gw, { messages, cache: { "no-cache": true } }, key)).status).toBe(200);
    const denied = await chat(gw, { messages, cache: { ttl: 5 } }, key);
    expect(denied.status).toBe(403);
    expect(JSON.parse(denied.text).error.message).toContain("allowed_cache_controls");
    expect((await chat(gw, { messages, cache: { "max-age": 5 } })).status).toBe(400);
    // The same forbidden control whether or not this call uses the cache, and on any route.
    expect((await chat(gw, { messages, cache: { ttl: 5 }, caching: false }, key)).status).toBe(403);
    const image = await requestJson(gw, "POST", "/v1/images/generations", { body: { model: "gpt", prompt: "x", cache: { "no-store": true } }, key });
    expect(image.status).toBe(403);
  });
});

describe("malformed cache controls are a 400 naming the field", () => {
  const MALFORMED: { cache: unknown; field: string }[] = [
    { cache: { ttl: "abc" }, field: "cache.ttl" },
    { cache: { ttl: -5 }, field: "cache.ttl" },
    { cache: { "s-maxage": "1" }, field: "cache.s-maxage" },
    { cache: { "s-maxage": -1 }, field: "cache.s-maxage" },
    { cache: { "no-cache": "yes" }, field: "cache.no-cache" },
    { cache: { "no-store": 1 }, field: "cache.no-store" },
    { cache: { namespace: 5 }, field: "cache.namespace" },
    { cache: "no-cache", field: "cache" },
    { cache: ["ttl"], field: "cache" },
    { cache: 60, field: "cache" },
  ];

  test("with the cache on, and off (nothing is called upstream); unset controls (null) are fine", async () => {
    const off = await startTestGateway({ model_list: models(up.url), general_settings: { master_key: MASTER_KEY } });
    try {
      for (const [where, g] of [["on", gw], ["off", off]] as const) {
        for (const { cache, field } of MALFORMED) {
          const r = await chat(g, { messages: [{ role: "user", content: `bad ${uniq()}` }], cache });
          const what = `cache ${where}: ${JSON.stringify(cache)}`;
          expect({ what, status: r.status }).toEqual({ what, status: 400 });
          const error = JSON.parse(r.text).error;
          expect({ what, type: error.type, param: error.param, code: error.code }).toEqual({ what, type: "invalid_request_error", param: field, code: "400" });
          expect(error.message).toContain(field);
        }
        expect(up.requests.length).toBe(0);
        // On every cacheable endpoint.
        const emb = await requestJson<{ error: { param: string } }>(g, "POST", "/v1/embeddings", { body: { model: "emb", input: "x", cache: { "no-store": "yes" } } });
        expect({ status: emb.status, param: emb.body.error.param }).toEqual({ status: 400, param: "cache.no-store" });
        const inst = await requestJson<{ error: { param: string } }>(g, "POST", "/v1/completions", { body: { model: "inst", prompt: "x", cache: { ttl: "1h" } } });
        expect({ status: inst.status, param: inst.body.error.param }).toEqual({ status: 400, param: "cache.ttl" });
        // `caching` is checked as chat's is on every cacheable endpoint.
        const caching = await requestJson<{ error: { param: string } }>(g, "POST", "/v1/completions", { body: { model: "inst", prompt: "x", caching: "yes" } });
        expect({ status: caching.status, param: caching.body.error.param }).toEqual({ status: 422, param: "caching" });
        expect(up.requests.length).toBe(0);
        for (const cache of [null, { ttl: null, "no-cache": null }, {}]) {
          expect((await chat(g, { messages: [{ role: "user", content: `fine ${uniq()}` }], cache })).status).toBe(200);
        }
        up.reset();
      }
    } finally {
      await off.stop();
    }
  });
});

describe("a hit is refused as a miss would be", () => {
  type Owner = { label: string; key: string; lower: () => Promise<unknown> };
  const TINY = 0.000000001;
  /** A key whose budget (its own, or its budget object's, team's, user's or org's) starts roomy and is lowered below its spend later. */
  const owners: Record<string, () => Promise<Owner>> = {
    key: async () => {
      const { key } = await requestOk<{ key: string }>(gw, "POST", "/key/generate", { max_budget: 10 });
      return { label: "key", key, lower: () => requestOk(gw, "POST", "/key/update", { key, max_budget: TINY }) };
    },
    "budget object": async () => {
      const { budget_id } = await requestOk<{ budget_id: string }>(gw, "POST", "/budget/new", { max_budget: 10 });
      const { key } = await requestOk<{ key: string }>(gw, "POST", "/key/generate", { budget_id });
      return { label: "budget object", key, lower: () => requestOk(gw, "POST", "/budget/update", { budget_id, max_budget: TINY }) };
    },
    team: async () => {
      const { team_id } = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { max_budget: 10 });
      const { key } = await requestOk<{ key: string }>(gw, "POST", "/key/generate", { team_id });
      return { label: "team", key, lower: () => requestOk(gw, "POST", "/team/update", { team_id, max_budget: TINY }) };
    },
    user: async () => {
      const user_id = `cache-user-${uniq()}`;
      await requestOk(gw, "POST", "/user/new", { user_id, max_budget: 10 });
      const { key } = await requestOk<{ key: string }>(gw, "POST", "/key/generate", { user_id });
      return { label: "user", key, lower: () => requestOk(gw, "POST", "/user/update", { user_id, max_budget: TINY }) };
    },
    organization: async () => {
      const { organization_id } = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: `cache-org-${uniq()}`, max_budget: 10 });
      const { team_id } = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { organization_id });
      const { key } = await requestOk<{ key: string }>(gw, "POST", "/key/generate", { team_id });
      return { label: "organization", key, lower: () => requestOk(gw, "PATCH", "/organization/update", { organization_id, max_budget: TINY }) };
    },
  };

  for (const [name, make] of Object.entries(owners)) {
    test(`a caller over its ${name}'s budget gets the 400 budget_exceeded a miss gets, not the cached answer`, async () => {
      const owner = await make();
      const messages = [{ role: "user", content: `budget ${name} ${uniq()}` }];
      // Spent by the owner itself, then its budget lowered below what it spent.
      expect((await chat(gw, { messages }, owner.key)).status).toBe(200);
      await owner.lower();
      // The entry is there: another caller gets it.
      expect((await chat(gw, { messages })).headers.get("x-svc-cache-hit")).toBe("true");
      const calls = up.requests.length;
      const hit = await chat(gw, { messages }, owner.key);
      const miss = await chat(gw, { messages: [{ role: "user", content: `another ${uniq()}` }] }, owner.key);
      expect(miss.status).toBe(400);
      const missError = JSON.parse(miss.text).error;
      expect(missError).toMatchObject({ type: "budget_exceeded", code: "400" });
      expect(missError.message).toStartWith("Budget has been exceeded!");
      expect({ status: hit.status, hit: hit.headers.get("x-svc-cache-hit"), error: JSON.parse(hit.text).error }).toEqual({ status: 400, hit: null, error: missError });
      expect(up.requests.length).toBe(calls);
      // Logged as a refused call, as the miss is.
      await gw.host!.spendWriter.flush();
      const logged = await rows<{ status: string; cache_hit: boolean }>(gw.host!.store.db, sql`select status, cache_hit from spend_logs where call_id = ${hit.headers.get("x-svc-call-id")}`);
      expect(logged).toEqual([{ status: "failure", cache_hit: false }]);
    });
  }

  test("a caller with budget left gets the hit, even when a miss's worst case would not fit", async () => {
    const { key } = await requestOk<{ key: string }>(gw, "POST", "/key/generate", { max_budget: 10 });
    const messages = [{ role: "user", content: `room ${uniq()}` }];
    expect((await chat(gw, { messages, max_tokens: 5 }, key)).status).toBe(200);
    // Spent less than this, but a call may cost far more at max_tokens=1000000.
    await requestOk(gw, "POST", "/key/update", { key, max_budget: 0.001 });
    await chat(gw, { messages, max_tokens: 5 });
    expect((await chat(gw, { messages: [{ role: "user", content: `big ${uniq()}` }], max_tokens: 1_000_000 }, key)).status).toBe(400);
    const hit = await chat(gw, { messages, max_tokens: 5 }, key);
    expect(hit.status).toBe(200);
    expect(hit.headers.get("x-svc-cache-hit")).toBe("true");
  });

  test("a blocked key and a model the key may not use are refused before the cache", async () => {
    const messages = [{ role: "user", content: `access ${uniq()}` }];
    expect((await chat(gw, { messages })).status).toBe(200);
    expect((await chat(gw, { messages })).headers.get("x-svc-cache-hit")).toBe("true");
    const { key: blocked } = await requestOk<{ key: string }>(gw, "POST", "/key/generate", {});
    await requestOk(gw, "POST", "/key/block", { key: blocked });
    const refusedBlocked = await chat(gw, { messages }, blocked);
    expect(refusedBlocked.status).toBe(401);
    expect(JSON.parse(refusedBlocked.text).error.message).toContain("blocked");
    const { key: other } = await requestOk<{ key: string }>(gw, "POST", "/key/generate", { models: ["emb"] });
    const refusedModel = await chat(gw, { messages }, other);
    expect(refusedModel.status).toBe(401);
    expect(JSON.parse(refusedModel.text).error.type).toBe("key_model_access_denied");
    expect(refusedModel.headers.get("x-svc-cache-hit")).toBeNull();
  });
});

describe("a hit names the deployment that answered (x-svc-model-id)", () => {
  // Two deployments of one group, the second almost always picked; a group whose only deployment
  // is down and falls back to it.
  const pairModels = (url: string, tag: string) => [
    { model_name: `pair-${tag}`, svc_params: { model: "openai/gpt-4o-mini", api_base: url, api_key: "sk-up", weight: 0.000001 }, model_info: { id: `pair-a-${tag}` } },
    { model_name: `pair-${tag}`, svc_params: { model: "openai/gpt-4o-mini", api_base: url, api_key: "sk-up", weight: 1000 }, model_info: { id: `pair-b-${tag}` } },
    { model_name: `down-${tag}`, svc_params: { model: "openai/gpt-4o-mini", api_base: "http://127.0.0.1:9", api_key: "sk-up" }, model_info: { id: `down-${tag}` } },
  ];
  const REDIS_URL = TEST_REDIS_URL;

  for (const kind of ["memory", "redis"] as const) {
    test(`in ${kind}: the hit says the deployment (and group) the miss said, also when a fallback answered`, async () => {
      const tag = `${kind}-${uniq()}`;
      const config = { model_list: pairModels(up.url, tag), svc_settings: { cache: true, cache_params: { type: kind === "redis" ? "redis" : "local" } }, general_settings: { master_key: MASTER_KEY } };
      const g = kind === "redis" ? await startTestGateway(config, { store: { redisUrl: REDIS_URL } }) : await startTestGateway(config);
      try {
        const cases = [
          { model: `pair-${tag}`, extra: {}, id: `pair-b-${tag}`, group: `pair-${tag}` },
          { model: `down-${tag}`, extra: { fallbacks: [`pair-${tag}`], num_retries: 0 }, id: `pair-b-${tag}`, group: `pair-${tag}` },
        ];
        for (const c of cases) {
          for (const stream of [false, true]) {
            const messages = [{ role: "user", content: `which deployment ${uniq()}` }];
            const miss = await chat(g, { model: c.model, messages, stream, ...c.extra });
            expect(miss.status).toBe(200);
            const hit = await chat(g, { model: c.model, messages, stream, ...c.extra });
            expect(hit.headers.get("x-svc-cache-hit")).toBe("true");
            const seen = (r: { headers: Headers }) => ({ id: r.headers.get("x-svc-model-id"), group: r.headers.get("x-svc-model-group") });
            expect(seen(miss)).toEqual({ id: c.id, group: c.group });
            expect(seen(hit)).toEqual(seen(miss));
          }
        }
        if (kind === "redis") {
          // The fallback's answer is not served to a key that may not use the fallback: its miss would skip it.
          const messages = [{ role: "user", content: `fallback answer ${uniq()}` }];
          const filled = await chat(g, { model: `down-${tag}`, messages, fallbacks: [`pair-${tag}`], num_retries: 0 });
          expect(filled.headers.get("x-svc-model-group")).toBe(`pair-${tag}`);
          const made = await requestJson<{ key: string }>(g, "POST", "/key/generate", { body: { models: [`down-${tag}`] } });
          const narrow = await fetch(`${g.url}/v1/chat/completions`, {
            method: "POST",
            headers: { authorization: `Bearer ${made.body.key}`, "content-type": "application/json" },
            body: JSON.stringify({ model: `down-${tag}`, messages, fallbacks: [`pair-${tag}`], num_retries: 0 }),
          });
          expect(narrow.headers.get("x-svc-cache-hit")).toBeNull();
          expect(narrow.status).not.toBe(200);
        }
        if (kind === "redis") {
          // An entry stored before the deployment was kept with it is still served, as the group's first.
          const messages = [{ role: "user", content: `old entry ${uniq()}` }];
          await chat(g, { model: `pair-${tag}`, messages });
          const key = (await chat(g, { model: `pair-${tag}`, messages })).headers.get("x-svc-cache-key")!;
          const redis = new Redis(REDIS_URL);
          try {
            const { deploymentId: _d, modelGroup: _g, ...old } = JSON.parse((await redis.get(`svc:cache:${key}`))!);
            await redis.set(`svc:cache:${key}`, JSON.stringify(old), "PX", 60_000);
          } finally {
            redis.disconnect();
          }
          const hit = await chat(g, { model: `pair-${tag}`, messages });
          expect({ status: hit.status, hit: hit.headers.get("x-svc-cache-hit"), id: hit.headers.get("x-svc-model-id") }).toEqual({ status: 200, hit: "true", id: `pair-a-${tag}` });
        }
      } finally {
        await g.stop();
      }
    });
  }
});

describe("what is not cached", () => {
  test("image generations and moderations are answered anew each time (README: chat, completions and embeddings)", async () => {
    const g = await startTestGateway({
      model_list: [
        { model_name: "painter", svc_params: { model: "mock/dall-e-3" }, model_info: { mode: "image_generation" } },
        { model_name: "moderator", svc_params: { model: "mock/omni-moderation-latest" }, model_info: { mode: "moderation" } },
      ],
      svc_settings: { cache: true },
      general_settings: { master_key: MASTER_KEY },
    });
    try {
      for (const [path, body] of [
        ["/v1/images/generations", { model: "painter", prompt: `a cat ${uniq()}` }],
        ["/v1/moderations", { model: "moderator", input: `some text ${uniq()}` }],
      ] as const) {
        for (let i = 0; i < 2; i++) {
          const res = await fetch(`${g.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify(body) });
          expect([path, i, res.status, res.headers.get("x-svc-cache-hit")]).toEqual([path, i, 200, null]);
        }
      }
    } finally {
      await g.stop();
    }
  });
});

describe("response cache opt-in and in Redis", () => {
  test("without config, caching: true on the request uses the cache", async () => {
    const g = await startTestGateway({ model_list: models(up.url), general_settings: { master_key: MASTER_KEY } });
    try {
      const messages = [{ role: "user", content: `optin ${uniq()}` }];
      await chat(g, { messages });
      expect((await chat(g, { messages })).headers.get("x-svc-cache-hit")).toBeNull();
      await chat(g, { messages, caching: true });
      expect((await chat(g, { messages, caching: true })).headers.get("x-svc-cache-hit")).toBe("true");
      expect(up.requests.length).toBe(3);
    } finally {
      await g.stop();
    }
  });

  test("two instances share a Redis cache", async () => {
    const config = { model_list: models(up.url), svc_settings: { cache: true, cache_params: { type: "redis" } }, general_settings: { master_key: MASTER_KEY } };
    const db = await freshDatabase("gw_cache");
    const store = { databaseUrl: db.url, redisUrl: TEST_REDIS_URL };
    const [a, b] = await Promise.all([startTestGateway(config, { store }), startTestGateway(config, { store })]);
    try {
      const messages = [{ role: "user", content: `shared ${uniq()}` }];
      await chat(a, { messages });
      const hit = await chat(b, { messages });
      expect(hit.headers.get("x-svc-cache-hit")).toBe("true");
      expect(up.requests.length).toBe(1);
    } finally {
      await Promise.all([a.stop(), b.stop()]);
      await db.drop();
    }
  });

  test("in Redis, a ttl beyond Redis's clock (1e20 s) still caches the answer", async () => {
    const config = { model_list: models(up.url), svc_settings: { cache: true, cache_params: { type: "redis" } }, general_settings: { master_key: MASTER_KEY } };
    const g = await startTestGateway(config, { store: { redisUrl: TEST_REDIS_URL } });
    try {
      const messages = [{ role: "user", content: `long ttl ${uniq()}` }];
      await chat(g, { messages, cache: { ttl: 1e20 } });
      // The write goes off the response path: the hit may take a moment to be there.
      let hit = "";
      for (let i = 0; i < 50 && hit !== "true"; i++) {
        if (i > 0) await Bun.sleep(20);
        hit = (await chat(g, { messages, cache: { "no-store": true } })).headers.get("x-svc-cache-hit") ?? "";
      }
      expect(hit).toBe("true");
    } finally {
      await g.stop();
    }
  });

  test("cache_params.type redis without Redis is a config error", async () => {
    await expect(startTestGateway({ model_list: models(up.url), svc_settings: { cache: true, cache_params: { type: "redis" } }, general_settings: { master_key: MASTER_KEY } })).rejects.toThrow(
      "needs REDIS_URL",
    );
  });
});
