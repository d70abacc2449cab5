// An instance that dies (SIGKILL, OOM, a lost node) with calls in flight must not leave their
// budget reservations in Redis for good: LiteLLM's false "Budget has been exceeded" class (#36926,
// PR #38647), where budgets refuse every call while real spend is about 0.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import Redis from "ioredis";
import { freshDatabase, MASTER_KEY, requestJson, spawnGateway, startTestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const REDIS_URL = process.env.TEST_REDIS_URL ?? "redis://127.0.0.1:6379";

let upstream: MockOpenAI;
let db: { url: string; drop(): Promise<void> };
beforeAll(async () => {
  upstream = await startMockOpenAI();
  db = await freshDatabase("gw_crashed");
});
afterAll(async () => {
  await upstream?.stop();
  await db?.drop();
});

const config = () => ({
  model_list: [{ model_name: "dollar", svc_params: { model: "openai/gpt-x", api_base: upstream.url, api_key: "sk-up" }, model_info: { input_cost_per_token: 1e-12, output_cost_per_token: 0.001 } }],
  general_settings: { master_key: MASTER_KEY },
});

const call = (url: string, key: string, signal?: AbortSignal) =>
  fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "dollar", messages: [{ role: "user", content: "hi" }], max_tokens: 1000 }),
    signal,
  });

describe("an instance killed with a call in flight (PostgreSQL + Redis)", () => {
  test("its reservation does not hold the budget for good", async () => {
    const a = await spawnGateway(config(), { env: { DATABASE_URL: db.url, REDIS_URL } });
    let key: string;
    let token: string;
    try {
      // Room for one call's worst case ($1) and not two.
      const made = await requestJson<{ key: string; token: string }>(a, "POST", "/key/generate", { body: { max_budget: 1.5 } });
      expect(made.status).toBe(200);
      key = made.body.key;
      token = made.body.token;
      upstream.fault({ kind: "hang" });
      const abort = new AbortController();
      const inFlight = call(a.url, key, abort.signal).catch(() => undefined);
      const end = Date.now() + 5000;
      while (upstream.pendingRequests === 0 && Date.now() < end) await Bun.sleep(10);
      expect(upstream.pendingRequests).toBe(1);
      a.proc.kill("SIGKILL");
      await a.exited;
      abort.abort();
      await inFlight;
    } finally {
      await a.stop();
    }
    upstream.reset();
    const b = await startTestGateway(config(), { store: { databaseUrl: db.url, redisUrl: REDIS_URL } });
    const redis = new Redis(REDIS_URL, { lazyConnect: true });
    try {
      // Within its liveness period (30 s) the dead instance might still be alive: its reservation holds.
      const held = await call(b.url, key);
      expect([held.status, await held.text()]).toEqual([400, expect.stringContaining("held by calls in flight")]);
      // Its liveness key lapses (here at once instead of 30 s later; only that instance's, found in the counter).
      await redis.connect();
      const fields = Object.keys(await redis.hgetall(`svc:budget:key:${token}`)).filter((f) => f.startsWith("r:"));
      expect(fields.length).toBe(1);
      expect(await redis.del(`svc:budget-live:${fields[0]!.slice(2)}`)).toBe(1);
      const res = await call(b.url, key);
      expect([res.status, await res.text()]).toEqual([200, expect.any(String)]);
      // The released reservation is gone from the counter, and B's own call settled its own.
      await Bun.sleep(100);
      const counter = await redis.hgetall(`svc:budget:key:${token}`);
      expect(counter.r).toBe("0");
      expect(Object.keys(counter).filter((f) => f.startsWith("r:"))).toEqual([]);
    } finally {
      redis.disconnect();
      await b.stop();
    }
  }, 60_000);
});
