/**
 * Budget periods. The rule, the same everywhere (ledger, spend writer, period roller):
 *
 * - `budget_reset_at` is set when a budget duration is given: creation (or update) time + duration.
 * - At that instant spend returns to 0, and `budget_reset_at` moves forward by whole durations to
 *   the first instant after now. Periods so stay on one fixed grid, whoever computes them.
 * - A call is charged to the period in which it started.
 * - A write that changes the duration moves `budget_reset_at` (now + the new duration) and keeps
 *   the spend: one period with a new end. Two ends not a whole number of periods apart are told
 *   apart from a rollover that way (ledger.ts wholePeriodsApart, flush.ts MOVED_BY_WRITE). Only
 *   the period the write was made in carries on: once its new end has passed, the next period
 *   starts at 0 whether or not a call was seen in between (ledger.ts laterThanDefinition, flush.ts
 *   inWritesPeriod).
 * - No `budget_reset_at` (or no parseable duration) means a flat budget that never resets.
 *
 * Enforcement does not wait for the store: the ledger computes the current period from these
 * values and starts it at 0 on the exact instant; the store's columns follow within a second.
 */
import { parseDuration } from "../identity/duration.ts";

/** A budget period's length in ms (BudgetCounter.periodMs, Charge.periodMs); null for none or one that does not parse. */
export function periodLength(duration: string | null | undefined): number | null {
  return duration ? (parseDuration(duration) ?? null) : null;
}

/** End of the period containing `at` (ms), or null for a flat budget. */
export function periodEnd(resetAt: Date | null | undefined, duration: string | null | undefined, at: number): number | null {
  if (!resetAt) return null;
  const end = resetAt.getTime();
  if (at < end) return end;
  const ms = duration ? parseDuration(duration) : undefined;
  if (!ms) return null;
  return end + (Math.floor((at - end) / ms) + 1) * ms;
}

/** The period containing `at` on a grid from the epoch (provider budgets, per-model key budgets): `1d` ends at UTC midnight. */
export function gridPeriod(duration: string, at: number): { start: number; end: number } | null {
  const ms = parseDuration(duration);
  if (!ms) return null;
  const start = Math.floor(at / ms) * ms;
  return { start, end: start + ms };
}
