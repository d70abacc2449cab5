/**
 * A key, team or organization on a budget object (`budget_id`) without a `budget_duration` of its
 * own follows the budget object's period: its `budget_reset_at` is the budget's, and from there
 * the period roller moves both forward on one grid (see spend/period.ts).
 */
import type { BudgetRow } from "../contract.ts";

/** The `budget_reset_at` such a row takes: the budget's when it has a duration, else none (a flat budget). */
export function followedReset(budget: Pick<BudgetRow, "budgetDuration" | "budgetResetAt"> | undefined): Date | null {
  return budget?.budgetDuration ? (budget.budgetResetAt ?? null) : null;
}

/**
 * Whether a write decides the row's period by its budget object: it has no duration of its own
 * and the write names a budget or clears its own duration.
 */
export function periodFromBudget(written: Record<string, unknown>, ownDuration: string | null | undefined): boolean {
  return ownDuration == null && ("budget_id" in written || "budget_duration" in written);
}
