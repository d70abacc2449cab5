/**
 * A key, team or organization on a budget object (`budget_id`) without a `budget_duration` of its
 * own follows the budget object's period: its `budget_reset_at` is the budget's, and from there
 * the period roller moves both forward on one grid (see spend/period.ts).
 */
import type { BudgetRow } from "../contract.ts";
import { periodEnd } from "../spend/period.ts";

/**
 * The `budget_reset_at` such a row takes: the end of the budget's current period when it has a
 * duration, else none (a flat budget). The budget's stored end may lag behind the roller, and a
 * past end copied onto the row would make its spend so far look like a finished period.
 */
export function followedReset(budget: Pick<BudgetRow, "budgetDuration" | "budgetResetAt"> | undefined, now = Date.now()): Date | null {
  const end = budget?.budgetDuration ? periodEnd(budget.budgetResetAt, budget.budgetDuration, now) : null;
  return end === null ? null : new Date(end);
}

/**
 * The body of an update without a `budget_duration` equal to the one stored: a value sent as it is
 * stored is no change, so the period goes on. (A client that sends the whole row at every edit,
 * say to rename it, pushed the reset out each time, and the spend was not given back when promised.)
 */
export function withoutUnchangedDuration<T extends { budget_duration?: string | null }>(body: T, stored: string | null): T {
  if (body.budget_duration === undefined || body.budget_duration !== stored) return body;
  const { budget_duration: _unchanged, ...rest } = body;
  return rest as T;
}

/**
 * Whether a write decides the row's period by its budget object: it has no duration of its own
 * and the write names a budget or clears its own duration.
 */
export function periodFromBudget(written: Record<string, unknown>, ownDuration: string | null | undefined): boolean {
  return ownDuration == null && ("budget_id" in written || "budget_duration" in written);
}
