// Rate limits across instances: two gateways sharing PostgreSQL and a Redis of their own (spawned
// here, so the test can kill it). 500 requests at a key with rpm_limit 100, split between the two
// instances and fired at once: exactly 100 succeed. Redis killed mid-run and restarted: no request
// fails because of it (each instance counts alone meanwhile and says so), and the limits are back
// in Redis afterwards. A dynamic key's share counts the dynamic keys active on either instance. A
// budget object's limit holds its key across both, and a /budget/update through one reaches the other.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createServer } from "node:net";
import Redis from "ioredis";
import { freshDatabase, MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { sha256 } from "../harness/util.ts";

const CONFIG = {
  model_list: [
    { model_name: "m", svc_params: { model: "mock/m" } },
    { model_name: "d", svc_params: { model: "mock/d", rpm: 6 } },
  ],
  general_settings: { master_key: MASTER_KEY },
};

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** A throwaway redis-server that keeps nothing on disk. */
async function startRedis(port: number): Promise<ReturnType<typeof Bun.spawn>> {
  const proc = Bun.spawn(["redis-server", "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], { stdout: "ignore", stderr: "ignore" });
  const probe = new Redis({ port, host: "127.0.0.1", lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  probe.on("error", () => undefined);
  for (let i = 0; i < 100; i++) {
    try {
      await probe.connect();
      if ((await probe.ping()) === "PONG") break;
    } catch {
      await Bun.sleep(50);
    }
  }
  probe.disconnect();
  return proc;
}

async function call(gw: TestGateway, key: string, model: string): Promise<{ status: number; limit: string | null; message?: string }> {
  const res = await fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 5 }),
  });
  const body = (await res.json()) as { error?: { message: string } };
  return { status: res.status, limit: res.headers.get("x-ratelimit-limit-requests"), message: body.error?.message };
}

const chat = async (gw: TestGateway, key: string) => (await call(gw, key, "m")).status;

const hasRedisServer = Bun.which("redis-server") !== null;

describe.skipIf(!hasRedisServer)("rate limits across two instances on one Redis", () => {
  let a: TestGateway;
  let b: TestGateway;
  let redis: ReturnType<typeof Bun.spawn>;
  let port: number;
  let drop: () => Promise<void>;

  beforeAll(async () => {
    port = await freePort();
    redis = await startRedis(port);
    const db = await freshDatabase("gw_rl_multi");
    drop = db.drop;
    const redisUrl = `redis://127.0.0.1:${port}`;
    a = await startTestGateway(CONFIG, { store: { databaseUrl: db.url, redisUrl } });
    b = await startTestGateway(CONFIG, { store: { databaseUrl: db.url, redisUrl } });
    await Promise.all([a.host!.services.bus!.subscribed(), b.host!.services.bus!.subscribed()]);
  });
  afterAll(async () => {
    await a?.stop();
    await b?.stop();
    redis?.kill();
    await drop?.();
  });

  /** A key made through A, once B has heard of it. */
  async function newKey(body: Record<string, unknown>): Promise<string> {
    const r = await requestJson<{ key: string }>(a, "POST", "/key/generate", { body });
    expect(r.status).toBe(200);
    for (let i = 0; i < 100 && b.host!.services.identity!.lookupKey(sha256(r.body.key)) === undefined; i++) await Bun.sleep(20);
    return r.body.key;
  }

  test("500 requests at rpm_limit 100, split between two instances: exactly 100 succeed", async () => {
    const key = await newKey({ rpm_limit: 100 });
    const statuses = await Promise.all(Array.from({ length: 500 }, (_, i) => chat(i % 2 === 0 ? a : b, key)));
    expect(statuses.filter((s) => s === 200).length).toBe(100);
    expect(statuses.filter((s) => s === 429).length).toBe(400);
  });

  test("a budget object's rpm_limit holds its key across both instances; /budget/update through one instance moves it on the other", async () => {
    const budget = await requestJson<{ budget_id: string }>(a, "POST", "/budget/new", { body: { rpm_limit: 10 } });
    expect(budget.status).toBe(200);
    const id = budget.body.budget_id;
    const key = await newKey({ budget_id: id });
    const first = await Promise.all(Array.from({ length: 30 }, (_, i) => call(i % 2 === 0 ? a : b, key, "m")));
    expect(first.filter((r) => r.status === 200).length).toBe(10);
    const refused = first.filter((r) => r.status === 429);
    expect(refused.length).toBe(20);
    for (const r of refused) expect(r.message).toContain(`requests per minute limit 10 (from Budget=${id})`);
    expect((await requestJson(a, "POST", "/budget/update", { body: { budget_id: id, rpm_limit: 15 } })).status).toBe(200);
    for (let i = 0; i < 100 && b.host!.services.identity!.budgets.get(id)?.rpmLimit !== 15; i++) await Bun.sleep(20);
    const second = await Promise.all(Array.from({ length: 20 }, (_, i) => call(i % 2 === 0 ? a : b, key, "m")));
    expect(second.filter((r) => r.status === 200).length).toBe(5);
    expect(second.filter((r) => r.status === 429).every((r) => r.message?.includes("requests per minute limit 15 (from Budget="))).toBe(true);
  });

  test("a dynamic key's share of a model counts the dynamic keys active on the other instance", async () => {
    const d1 = await newKey({ rpm_limit_type: "dynamic" });
    const d2 = await newKey({ rpm_limit_type: "dynamic" });
    expect((await call(a, d1, "d")).status).toBe(200);
    // d2 calls only B, yet its share is 6 rpm / 2 keys: B sees d1 active through Redis.
    const onB = [];
    for (let i = 0; i < 4; i++) onB.push(await call(b, d2, "d"));
    expect(onB.map((r) => r.status)).toEqual([200, 200, 200, 429]);
    expect(onB[0]!.limit).toBe("3");
    expect(onB[3]!.message).toContain("dynamic share of model=d");
    expect(onB[3]!.message).toContain("requests per minute limit 3");
  });

  test("Redis killed mid-run and restarted: no request fails, and the counters are back in Redis", async () => {
    const key = await newKey({ rpm_limit: 100_000 });
    const statuses: number[] = [];
    let running = true;
    const load = (async () => {
      for (let i = 0; running; i++) statuses.push(await chat(i % 2 === 0 ? a : b, key));
    })();
    await Bun.sleep(300);
    const atKill = statuses.length;
    redis.kill(9);
    await redis.exited;
    await Bun.sleep(700);
    const during = statuses.length;
    redis = await startRedis(port);
    // ioredis reconnects within its retry delay (at most 2 s).
    await Bun.sleep(2500);
    const before = statuses.length;
    await Bun.sleep(300);
    running = false;
    await load;
    expect(statuses.length).toBeGreaterThan(before);
    // Requests kept being served while Redis was down.
    expect(during).toBeGreaterThan(atKill);
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    expect(a.log.lines.some((l) => l.msg.startsWith("redis unreachable: rate limits are counted on this instance alone"))).toBe(true);
    expect(a.log.lines.some((l) => l.msg.startsWith("redis reachable again: rate limits are shared"))).toBe(true);
    // Counted in the restarted Redis again (it started empty).
    const probe = new Redis({ port, host: "127.0.0.1" });
    const n = await probe.zcard(`svc:rl:{key:${sha256(key)}}:r`);
    probe.disconnect();
    expect(n).toBeGreaterThan(0);
  }, 20_000);
});
