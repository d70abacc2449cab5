// The budget ledger (in memory and in Redis) when a counter is read again from the store while a
// call that reserved on it is still running (an admin spend reset, a budget given again): the
// call's cost counts in the new reading, as it does in the stored spend, and its reservation,
// which the new reading never held, is not taken off it.
import { afterAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import Redis from "ioredis";
import type { BudgetCounter, BudgetLedger, LedgerGrant } from "../../core/contract.ts";
import { type BudgetEvent, crossings, LocalLedger } from "../../core/spend/ledger.ts";
import { RedisLedger } from "../../core/spend/redis-ledger.ts";
import { memoryLogger } from "../harness/gateway.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

const redis = new Redis(TEST_REDIS_URL, { maxRetriesPerRequest: 1 });
afterAll(() => redis.disconnect());

const LEDGERS: [string, () => BudgetLedger][] = [
  ["in memory", () => new LocalLedger()],
  ["in Redis", () => new RedisLedger(redis, memoryLogger())],
];

for (const [name, make] of LEDGERS) {
  describe(`budget ledger ${name}`, () => {
    test("a call in flight across a spend reset counts its cost after the reset, not its reservation", async () => {
      const ledger = make();
      let stored = 0n;
      const counter: BudgetCounter = { id: `key:${randomUUID()}`, label: "Key test", limit: 10n, periodEnd: null, storedSpend: () => stored };
      const first = (await ledger.reserve([counter], 4n)) as LedgerGrant;
      expect(first.ok).toBe(true);
      // The reset: the counter is dropped, its stored spend is 0, the next call reads it again.
      await ledger.forget([counter.id]);
      stored = 0n;
      const second = (await ledger.reserve([counter], 4n)) as LedgerGrant;
      expect(second.ok).toBe(true);
      first.settle(3n);
      second.settle(2n);
      await Bun.sleep(50); // Redis settles asynchronously
      // Spend 5 and nothing reserved: 6 more would pass the limit of 10, 5 would not.
      const over = await ledger.reserve([counter], 6n);
      expect(over.ok).toBe(false);
      if (!over.ok) expect([over.spend, over.reserved]).toEqual([5n, 0n]);
      expect((await ledger.reserve([counter], 5n)).ok).toBe(true);
    });

    test("a call in flight across a new period is not counted in the new one", async () => {
      const ledger = make();
      const id = `key:${randomUUID()}`;
      const old: BudgetCounter = { id, label: "Key test", limit: 10n, periodEnd: 1_000, storedSpend: () => 0n };
      const call = (await ledger.reserve([old], 4n)) as LedgerGrant;
      const next: BudgetCounter = { ...old, periodEnd: 2_000 };
      const fresh = (await ledger.reserve([next], 10n)) as LedgerGrant;
      expect(fresh.ok).toBe(true);
      call.settle(3n);
      fresh.settle(0n);
      await Bun.sleep(50);
      expect((await ledger.reserve([next], 10n)).ok).toBe(true);
    });

    test("an end a write moved (not whole periods away) is the same period: spend and reservations carry on, an older definition does not move it back", async () => {
      const ledger = make();
      const id = `key:${randomUUID()}`;
      // A 1000 ms period ending at 10_000, defined at t=9_000; a write at t=9_500 moves its end to 10_500.
      const before: BudgetCounter = { id, label: "Key test", limit: 10n, periodEnd: 10_000, periodMs: 1_000, definedAt: 9_000, storedSpend: () => 0n };
      const moved: BudgetCounter = { ...before, periodEnd: 10_500, periodMs: 1_000, definedAt: 9_500, storedSpend: () => 0n };
      const inFlight = (await ledger.reserve([before], 4n)) as LedgerGrant;
      expect(inFlight.ok).toBe(true);
      // 4 reserved in the period, also after the move: 7 more would pass 10.
      expect((await ledger.reserve([moved], 7n)).ok).toBe(false);
      inFlight.settle(4n);
      await Bun.sleep(50);
      // A caller that still had the older definition charges the period as it is now.
      const stale = (await ledger.reserve([before], 1n)) as LedgerGrant;
      expect(stale.ok).toBe(true);
      stale.settle(1n);
      await Bun.sleep(50);
      const refused = await ledger.reserve([moved], 6n);
      expect(refused.ok).toBe(false);
      if (!refused.ok) expect(refused.spend).toBe(5n);
      // The next period on the moved end's grid starts at 0.
      expect((await ledger.reserve([{ ...moved, periodEnd: 11_500 }], 10n)).ok).toBe(true);
    });

    test("a write moved the end, and the first call it sees is after that end: a new period, read from the store", async () => {
      const ledger = make();
      const id = `key:${randomUUID()}`;
      const before: BudgetCounter = { id, label: "Key test", limit: 10n, periodEnd: 10_000, periodMs: 1_000, definedAt: 9_000, storedSpend: () => 0n };
      (await ledger.reserve([before], 10n) as LedgerGrant).settle(10n);
      await Bun.sleep(50);
      expect((await ledger.reserve([before], 1n)).ok).toBe(false);
      // A write at t=9_500 moved the end to 10_500; the next call comes at 10_700, in the period ending 11_500.
      let read = 0;
      const later: BudgetCounter = { ...before, periodEnd: 11_500, definedAt: 9_500, storedSpend: () => {
          read++;
          return 2n;
        } };
      const refused = await ledger.reserve([later], 9n);
      expect(read).toBe(1);
      expect(refused.ok).toBe(false);
      if (!refused.ok) expect(refused.spend).toBe(2n);
      expect((await ledger.reserve([later], 8n)).ok).toBe(true);
    });
  });
}

test("a level spend was already past (a budget written below it) is told at the next settlement, marked as such; one crossed now is told as crossed", () => {
  const told: { event: BudgetEvent; left?: number; wasPast?: boolean }[] = [];
  const listener = { thresholds: () => [0.5], crossed: (_c: BudgetCounter, event: BudgetEvent, _s: bigint, left?: number, wasPast?: boolean) => void told.push({ event, left, wasPast }) };
  const counter: BudgetCounter = { id: "key:t", label: "Key t", limit: 100n, soft: 10n, periodEnd: null, storedSpend: () => 0n };
  // Spend 60 (past the soft budget and the 50 % threshold, at 50) goes to 70.
  crossings(counter, 60n, 70n, listener);
  expect(told).toEqual([
    { event: "soft_budget_crossed", left: undefined, wasPast: true },
    { event: "threshold_crossed", left: 0.5, wasPast: true },
  ]);
  told.length = 0;
  crossings(counter, 90n, 100n, listener);
  expect(told).toEqual([
    { event: "soft_budget_crossed", left: undefined, wasPast: true },
    { event: "budget_crossed", left: undefined, wasPast: false },
  ]);
  told.length = 0;
  crossings(counter, 5n, 20n, listener);
  expect(told).toEqual([{ event: "soft_budget_crossed", left: undefined, wasPast: false }]);
});
