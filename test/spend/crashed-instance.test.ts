// An instance that dies (SIGKILL, OOM, a lost node) with calls in flight must not hold what they
// held in Redis for good: their budget reservations (before: every later call of the key refused,
// "spend $0, $1 held by calls in flight", LiteLLM's false budget-exceeded class, #36926, PR #38647)
// and their places under max_parallel_requests (before: the key refused for 15 minutes). Both are
// released once the dead instance's liveness key lapses (30 s; here deleted at once, found through
// the counters, so that no other test's instance is touched).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import Redis from "ioredis";
import { freshDatabase, MASTER_KEY, requestJson, spawnGateway, startTestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

const REDIS_URL = TEST_REDIS_URL;

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

describe("an instance killed with calls in flight (PostgreSQL + Redis)", () => {
  test("its budget reservations and its places under max_parallel_requests do not hold for good", async () => {
    const a = await spawnGateway(config(), { env: { DATABASE_URL: db.url, REDIS_URL } });
    const made: { key: string; token: string }[] = [];
    try {
      // Room for one call's worst case ($1) and not two; one call at a time.
      for (const body of [{ max_budget: 1.5 }, { max_parallel_requests: 1 }]) {
        const r = await requestJson<{ key: string; token: string }>(a, "POST", "/key/generate", { body });
        expect(r.status).toBe(200);
        made.push(r.body);
      }
      upstream.fault({ kind: "hang" }, { kind: "hang" });
      const abort = new AbortController();
      const inFlight = made.map((k) => call(a.url, k.key, abort.signal).catch(() => undefined));
      const end = Date.now() + 5000;
      while (upstream.pendingRequests < 2 && Date.now() < end) await Bun.sleep(10);
      expect(upstream.pendingRequests).toBe(2);
      a.proc.kill("SIGKILL");
      await a.exited;
      abort.abort();
      await Promise.all(inFlight);
    } finally {
      await a.stop();
    }
    upstream.reset();
    const [budgeted, parallel] = made as [{ key: string; token: string }, { key: string; token: string }];
    const b = await startTestGateway(config(), { store: { databaseUrl: db.url, redisUrl: REDIS_URL } });
    const redis = new Redis(REDIS_URL, { lazyConnect: true });
    try {
      // Within its liveness period the dead instance might still be alive: what it holds holds.
      const held = await call(b.url, budgeted.key);
      expect([held.status, await held.text()]).toEqual([400, expect.stringContaining("held by calls in flight")]);
      expect((await call(b.url, parallel.key)).status).toBe(429);
      // Its liveness keys lapse (here at once instead of 30 s later; only that instance's, named in the counters).
      await redis.connect();
      const reservedBy = Object.keys(await redis.hgetall(`svc:budget:key:${budgeted.token}`)).filter((f) => f.startsWith("r:"));
      expect(reservedBy.length).toBe(1);
      expect(await redis.del(`svc:budget-live:${reservedBy[0]!.slice(2)}`)).toBe(1);
      const inFlightIds = await redis.zrange(`svc:rl:{key:${parallel.token}}:p`, "0", "-1");
      expect(inFlightIds.length).toBe(1);
      expect(await redis.del(`svc:rl-live:${inFlightIds[0]!.split(":")[0]}`)).toBe(1);
      for (const k of [budgeted, parallel]) {
        const res = await call(b.url, k.key);
        expect([res.status, await res.text()]).toEqual([200, expect.any(String)]);
      }
      // The released reservation is gone from the counter, and B's own call settled its own.
      await Bun.sleep(100);
      const counter = await redis.hgetall(`svc:budget:key:${budgeted.token}`);
      expect(counter.r).toBe("0");
      expect(Object.keys(counter).filter((f) => f.startsWith("r:"))).toEqual([]);
      expect(await redis.zcard(`svc:rl:{key:${parallel.token}}:p`)).toBe(0);
    } finally {
      redis.disconnect();
      await b.stop();
    }
  }, 60_000);
});
