// Redis runs a rate-limit command whose answer never reaches the gateway (a reply lost on the way,
// Redis busy past the command timeout). The request then counts on this instance alone, but Redis
// had taken it too: in flight until its ttl (15 minutes), so a key with max_parallel_requests: 1
// was refused on every instance for that long, and an rpm window held a request no one made there.
// A settle that could not be sent left its request in flight as long. What Redis may have taken is
// now taken back once it answers again, and a settle is sent again.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import type { RateCounter, RateGrant } from "../../core/contract.ts";
import { LuaScript, nativeScriptRunner, type ScriptRunner } from "../../core/kv/scripts.ts";
import { RedisWindows } from "../../core/limits/redis-windows.ts";
import { memoryLogger } from "../harness/gateway.ts";
import { testRedisUrlAt } from "../harness/redis.ts";
import { TcpRelay } from "../harness/relay.ts";

let relay: TcpRelay;
let runner: ScriptRunner;

beforeAll(async () => {
  relay = await TcpRelay.start({ host: "127.0.0.1", port: 6379 });
  runner = nativeScriptRunner(testRedisUrlAt(relay.port));
  await runner.ready();
});
afterAll(async () => {
  runner?.close();
  await relay?.close();
});

const parallelOne = (): RateCounter => ({ id: `key:${randomUUID()}`, label: "Key test", parallel: 1 });

const PING = new LuaScript("return 1");

/** Until Redis answers again (the lost answer's timeout replaced the connection). */
async function untilRedisAnswers(): Promise<void> {
  const until = performance.now() + 10_000;
  for (;;) {
    const ok = await runner.run(PING, [], []).then(() => true, () => false);
    if (ok || performance.now() > until) break;
    await Bun.sleep(100);
  }
}

/** Until Redis answers again, then one request of its own brings `windows` back to it. */
async function untilBack(windows: RedisWindows): Promise<void> {
  await untilRedisAnswers();
  ((await windows.acquire([parallelOne()], 0)) as RateGrant).settle(0);
  await Bun.sleep(200);
}

/** Sends `call`'s settle while Redis is cut off, then lets Redis be reached again. */
async function settleDuringOutage(call: RateGrant): Promise<void> {
  relay.cut();
  call.settle(0);
  await Bun.sleep(300);
  relay.restore();
}

test("a request whose acquire answer was lost does not hold a parallel slot once Redis answers again", async () => {
  const windows = new RedisWindows(runner, memoryLogger());
  const counter = parallelOne();
  relay.dropReplies();
  const lost = (await windows.acquire([counter], 0)) as RateGrant;
  expect(lost.ok).toBe(true);
  relay.passReplies();
  lost.settle(0);
  await untilBack(windows);
  const next = await windows.acquire([counter], 0);
  expect(next.ok).toBe(true);
}, 30_000);

test("a request whose settle could not be sent does not hold a parallel slot once Redis is back", async () => {
  const windows = new RedisWindows(runner, memoryLogger());
  await untilBack(windows);
  const counter = parallelOne();
  const call = (await windows.acquire([counter], 0)) as RateGrant;
  expect(call.ok).toBe(true);
  await settleDuringOutage(call);
  await untilBack(windows);
  const next = await windows.acquire([counter], 0);
  expect(next.ok).toBe(true);
}, 30_000);

test("the first request once Redis is back is not refused for a request whose settle could not be sent", async () => {
  const windows = new RedisWindows(runner, memoryLogger());
  await untilBack(windows);
  const counter = parallelOne();
  const call = (await windows.acquire([counter], 0)) as RateGrant;
  await settleDuringOutage(call);
  await untilRedisAnswers();
  // No other request comes first: this one is Redis's first since the outage.
  const next = await windows.acquire([counter], 0);
  expect(next.ok).toBe(true);
}, 30_000);
