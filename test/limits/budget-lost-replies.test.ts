// Redis runs a budget command whose answer never reaches the gateway (a reply lost on the way,
// Redis busy past the command timeout). A reservation that timed out was still taken in Redis, and
// nothing gave it back: while the instance had calls in flight (its liveness key renewed), the
// budget kept it "held by calls in flight" for good and refused calls it had room for. A settle
// whose answer was lost could not be sent again either (it would have counted twice).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import Redis from "ioredis";
import type { BudgetCounter, LedgerGrant } from "../../core/contract.ts";
import { connectRedis, type RedisHandle } from "../../core/kv/redis.ts";
import { RedisLedger } from "../../core/spend/redis-ledger.ts";
import { memoryLogger } from "../harness/gateway.ts";
import { TEST_REDIS_URL, testRedisUrlAt } from "../harness/redis.ts";
import { TcpRelay } from "../harness/relay.ts";

let relay: TcpRelay;
let handle: RedisHandle;
const direct = new Redis(TEST_REDIS_URL, { maxRetriesPerRequest: 1 });

beforeAll(async () => {
  relay = await TcpRelay.start({ host: "127.0.0.1", port: 6379 });
  handle = connectRedis(testRedisUrlAt(relay.port), memoryLogger());
  await handle.ping();
});
afterAll(async () => {
  await handle?.close();
  await relay?.close();
  direct.disconnect();
});

const counterOf = (limit: bigint): BudgetCounter => ({ id: `key:${randomUUID()}`, label: "Key test", limit, periodEnd: null, storedSpend: () => 0n });

/** Until the ledger talks to Redis again after the lost answers (a reserve that succeeds there). */
async function untilReconnected(): Promise<void> {
  const until = performance.now() + 10_000;
  // The lost answer's timeout replaces the connection a moment later.
  await Bun.sleep(300);
  while (!(await handle.ping()).ok && performance.now() < until) await Bun.sleep(50);
}

test("a reservation whose answer was lost is given back once Redis answers again", async () => {
  const log = memoryLogger();
  const ledger = new RedisLedger(handle.client, log);
  const counter = counterOf(3n);
  ((await ledger.reserve([counter], 0n)) as LedgerGrant).settle(0n);
  await Bun.sleep(50);
  relay.dropReplies();
  // Redis takes the reservation; the answer is lost; the call goes on counted locally.
  const lost = (await ledger.reserve([counter], 1n)) as LedgerGrant;
  expect(lost.ok).toBe(true);
  relay.passReplies();
  await untilReconnected();
  lost.settle(1n);
  // A call on another counter brings the ledger back to Redis (and sends what waited for it).
  expect((await ledger.reserve([counterOf(10n)], 1n)).ok).toBe(true);
  await Bun.sleep(200);
  // $1 spent of $3, nothing in flight: two calls of $1 fit at once.
  const a = await ledger.reserve([counter], 1n);
  const b = await ledger.reserve([counter], 1n);
  expect([a.ok, b.ok]).toEqual([true, true]);
  expect(await direct.hget(`svc:budget:${counter.id}`, "s")).toBe("1");
}, 30_000);

test("a settle whose answer was lost is counted once", async () => {
  await untilReconnected();
  const log = memoryLogger();
  const ledger = new RedisLedger(handle.client, log);
  const counter = counterOf(3n);
  const call = (await ledger.reserve([counter], 1n)) as LedgerGrant;
  expect(call.ok).toBe(true);
  relay.dropReplies();
  call.settle(1n);
  await Bun.sleep(1500);
  relay.passReplies();
  await untilReconnected();
  expect((await ledger.reserve([counterOf(10n)], 1n)).ok).toBe(true);
  await Bun.sleep(200);
  expect(await direct.hget(`svc:budget:${counter.id}`, "s")).toBe("1");
  expect(await direct.hget(`svc:budget:${counter.id}`, "r")).toBe("0");
}, 30_000);
