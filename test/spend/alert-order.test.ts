// A budget alert names the spend of the call that crossed the line, even when the store answers a
// later call's "already past" question first (a busy pool: two inserts on two connections may
// commit in either order). Seen in CI as a soft-budget alert carrying the spend after two calls.
import { describe, expect, test } from "bun:test";
import type { BudgetCounter } from "../../core/contract.ts";
import { BudgetAlerts } from "../../core/spend/alerts.ts";
import { crossings } from "../../core/spend/ledger.ts";
import type { Db } from "../../core/store/db.ts";
import { memoryLogger } from "../harness/gateway.ts";

const USD = 1_000_000_000_000n;

/**
 * A budget_alerts table held in memory whose inserts answer in the order `release` is called,
 * with the table's one-row-per-key rule (ON CONFLICT DO NOTHING).
 */
function slowStore() {
  const rows = new Set<string>();
  const pending: (() => void)[] = [];
  const insert = () => ({
    values: (v: { counterId: string; event: string; period: string }) => ({
      onConflictDoNothing: () => ({
        returning: () =>
          new Promise<{ id: string }[]>((resolve) => {
            pending.push(() => {
              const key = `${v.counterId}|${v.event}|${v.period}`;
              if (rows.has(key)) return resolve([]);
              rows.add(key);
              resolve([{ id: v.counterId }]);
            });
          }),
      }),
    }),
  });
  return { db: { insert } as unknown as Db, pending };
}

describe("budget alerts when the store answers out of order", () => {
  test("the soft-budget alert carries the spend of the call that crossed it, not of the next one", async () => {
    const { db, pending } = slowStore();
    const alerts = new BudgetAlerts(db, memoryLogger(), () => undefined);
    const counter: BudgetCounter = { id: "key:abc", label: "Key sk-...abcd", limit: 10n * USD, soft: 1n * USD, periodEnd: null, storedSpend: () => 0n };
    crossings(counter, 0n, 2n * USD, alerts); // crosses the soft budget
    crossings(counter, 2n * USD, 3n * USD, alerts); // already past it
    // The store answers the later call first.
    for (const answer of pending.reverse()) answer();
    for (let i = 0; i < 50 && alerts.sent.length === 0; i++) await Bun.sleep(2);
    await Bun.sleep(10);
    expect(alerts.sent.map((a) => [a.event, a.spend])).toEqual([["soft_budget_crossed", 2]]);
  });

  test("a crossing whose alert could not be stored is asked again at the next call", async () => {
    const log = memoryLogger();
    let fail = true;
    const rows = new Set<string>();
    const db = {
      insert: () => ({
        values: (v: { counterId: string; event: string; period: string }) => ({
          onConflictDoNothing: () => ({
            returning: async () => {
              if (fail) throw new Error("connection refused");
              const key = `${v.counterId}|${v.event}|${v.period}`;
              if (rows.has(key)) return [];
              rows.add(key);
              return [{ id: v.counterId }];
            },
          }),
        }),
      }),
    } as unknown as Db;
    const alerts = new BudgetAlerts(db, log, () => undefined);
    const counter: BudgetCounter = { id: "key:def", label: "Key sk-...defg", limit: 10n * USD, soft: 1n * USD, periodEnd: null, storedSpend: () => 0n };
    crossings(counter, 0n, 2n * USD, alerts);
    for (let i = 0; i < 50 && !log.lines.some((l) => l.msg === "budget alert failed"); i++) await Bun.sleep(2);
    fail = false;
    crossings(counter, 2n * USD, 3n * USD, alerts);
    for (let i = 0; i < 50 && alerts.sent.length === 0; i++) await Bun.sleep(2);
    expect(alerts.sent.map((a) => [a.event, a.spend])).toEqual([["soft_budget_crossed", 3]]);
  });
});
