// A Redis that stops answering without closing its connections (a link that drops packets, a
// stalled proxy): calls that read the response cache, a rate limit or a budget in Redis must not
// wait for it past a second. The first command to time out replaces the connection; until the new
// one answers, commands fail at once and the instance counts on its own (README: "If Redis becomes
// unreachable, each instance counts on its own"). When Redis answers again, it is used again.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { requestJson, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { testRedisUrlAt } from "../harness/redis.ts";
import { TcpRelay } from "../harness/relay.ts";

let relay: TcpRelay;
let gw: TestGateway;
let limitedKey: string;

beforeAll(async () => {
  relay = await TcpRelay.start({ host: "127.0.0.1", port: 6379 });
  gw = await startTestGateway(
    {
      model_list: [{ model_name: "m", svc_params: { model: "mock/m" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } }],
      svc_settings: { cache: true, cache_params: { type: "redis" } },
      general_settings: { master_key: "sk-test-master-key" },
    },
    { store: { redisUrl: testRedisUrlAt(relay.port) } },
  );
  const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { rpm_limit: 1000, max_budget: 100 } });
  expect(made.status).toBe(200);
  limitedKey = made.body.key;
}, 30_000);

afterAll(async () => {
  relay?.resume();
  await gw?.stop();
  await relay?.close();
});

/** A chat call with the cache on (a fresh prompt each time) by a key with a rate limit and a budget; its status and how long it took. */
async function timedCall(i: number): Promise<{ status: number; ms: number }> {
  const t0 = performance.now();
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${limitedKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: `stall ${i} ${Math.random()}` }] }),
    signal: AbortSignal.timeout(8_000),
  });
  await res.arrayBuffer();
  return { status: res.status, ms: performance.now() - t0 };
}

describe("Redis stops answering (connections open, no bytes)", () => {
  test("calls still answer, the first within about a second and the rest at once; Redis is used again once it answers", async () => {
    expect((await timedCall(0)).status).toBe(200);
    relay.stall();
    const during: { status: number; ms: number }[] = [];
    for (let i = 1; i <= 6; i++) during.push(await timedCall(i));
    expect(during.map((c) => c.status)).toEqual(Array(6).fill(200));
    // The first waits out the command timeout (1 s) of the cache read, the limiter and the budget ledger at most once each.
    expect(during[0]!.ms).toBeLessThan(4_000);
    // Later calls find the connections being replaced, and fail over at once.
    for (const c of during.slice(2)) expect(c.ms).toBeLessThan(500);
    relay.resume();
    // Back: the limiter and cache answer through Redis again (a repeated prompt is a hit from Redis).
    let hit = false;
    for (let attempt = 0; attempt < 40 && !hit; attempt++) {
      await Bun.sleep(250);
      const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "after the stall" }] });
      const headers = { authorization: `Bearer ${limitedKey}`, "content-type": "application/json" };
      await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers, body }).then((r) => r.arrayBuffer());
      const again = await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers, body });
      await again.arrayBuffer();
      hit = again.headers.get("x-svc-cache-hit") === "true";
    }
    expect(hit).toBe(true);
  }, 60_000);
});
