/**
 * Spend-log retention (`general_settings.maximum_spend_logs_retention_period`): log rows that
 * started longer ago than the period are deleted in batches of 1,000, once soon after start and
 * then every `maximum_spend_logs_retention_interval` (default 24 h). The ids kept for calls
 * counted without a log row (`disable_spend_logs`) are pruned after 7 days, and the stored parts of spend
 * reports 35 days after they were stored (a 30-day report needs none older), period or not. Daily aggregates and spend
 * counters are kept, so reports and budgets over the deleted days do not change. Instances that
 * share a database may clean at the same time: each batch skips rows another one is deleting.
 * Settings are read at every check, so a reload changes them without a restart.
 */
import { type SQL, sql } from "drizzle-orm";
import type { Logger } from "../contract.ts";
import type { Db } from "../store/db.ts";
import { rows, storeErrorCause } from "../store/sql.ts";
import { parseDuration } from "../identity/duration.ts";

export interface RetentionSettings {
  /** Keep rows younger than this; undefined: keep everything. */
  periodMs: number | undefined;
  intervalMs: number;
}

export const DEFAULT_RETENTION_INTERVAL_MS = 24 * 3_600_000;
/** The settings from `general_settings` (validated durations; anything else means unset). */
export function retentionSettings(general: { maximum_spend_logs_retention_period?: string; maximum_spend_logs_retention_interval?: string } | undefined): RetentionSettings {
  const ms = (text: string | undefined) => (text === undefined ? undefined : (parseDuration(text) ?? undefined));
  return { periodMs: ms(general?.maximum_spend_logs_retention_period), intervalMs: ms(general?.maximum_spend_logs_retention_interval) ?? DEFAULT_RETENTION_INTERVAL_MS };
}

const BATCH = 1000;
/** The first clean-up waits this long after start, out of the way of start-up work. */
const FIRST_DELAY_MS = 5000;
const MAX_CHECK_MS = 60_000;

/** How long the ids of calls counted without a log row are kept: any retry or spill replay comes sooner. */
export const CALL_ID_RETENTION_MS = 7 * 86_400_000;

/** The text every UUIDv7 made at or after `ms` sorts at or after (its first 48 bits are the time). */
export function uuidV7Floor(ms: number): string {
  const hex = Math.floor(ms).toString(16).padStart(12, "0");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}`;
}

/**
 * Deletes the rows of `table` that `where` selects, `batch` per statement (rows another instance
 * is deleting are skipped); returns how many.
 */
async function deleteInBatches(db: Db, table: "spend_logs" | "spend_calls", where: SQL, batch: number): Promise<number> {
  let total = 0;
  for (;;) {
    const [r] = await rows<{ n: number | string }>(
      db,
      sql`with gone as (
        delete from ${sql.identifier(table)} where call_id in (select call_id from ${sql.identifier(table)} where ${where} limit ${batch} for update skip locked)
        returning 1)
      select count(*) as n from gone`,
    );
    const n = Number(r?.n ?? 0);
    total += n;
    if (n < batch) return total;
  }
}

/** Stored report parts are a cache: kept long enough for a 30-day report, rebuilt when asked after that. */
export const REPORT_PART_RETENTION_MS = 35 * 86_400_000;

/** Deletes the report parts stored before `cutoff` (ms); returns how many. */
export async function deleteReportPartsBefore(db: Db, cutoff: number): Promise<number> {
  const [r] = await rows<{ n: number | string }>(
    db,
    sql`with gone as (delete from report_parts where stored_at < ${new Date(cutoff).toISOString()}::timestamptz returning 1) select count(*) as n from gone`,
  );
  return Number(r?.n ?? 0);
}

/** Deletes the period records (budget_period_spend) of periods that ended before `cutoff` (ms): only a current period is read (a budget that never resets has one that never ends). */
export async function deletePeriodSpendBefore(db: Db, cutoff: number): Promise<number> {
  const [r] = await rows<{ n: number | string }>(
    db,
    sql`with gone as (delete from budget_period_spend where period_end < ${new Date(cutoff).toISOString()}::timestamptz returning 1) select count(*) as n from gone`,
  );
  return Number(r?.n ?? 0);
}

/** Deletes the ids of `spend_calls` made before `cutoff` (ms); returns how many. */
export function deleteCallIdsBefore(db: Db, cutoff: number, batch = BATCH): Promise<number> {
  return deleteInBatches(db, "spend_calls", sql`call_id < ${uuidV7Floor(cutoff)}`, batch);
}

/** Deletes log rows that started before `cutoff`; returns how many. */
export function deleteLogsBefore(db: Db, cutoff: Date, batch = BATCH): Promise<number> {
  return deleteInBatches(db, "spend_logs", sql`start_time < ${cutoff.toISOString()}::timestamptz`, batch);
}

export class SpendLogRetention {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private running: Promise<void> | undefined;
  private lastRun = 0;
  private stopped = false;

  constructor(
    private readonly db: Db,
    private readonly log: Logger,
    private readonly settings: () => RetentionSettings,
    private readonly clock: () => number = Date.now,
  ) {}

  start(): void {
    this.schedule(Math.min(FIRST_DELAY_MS, this.settings().intervalMs));
  }

  /** Cleans once the interval has passed since the last clean-up: log rows when a period is set, old call ids always. */
  async check(): Promise<void> {
    const s = this.settings();
    const now = this.clock();
    if (this.running || now - this.lastRun < s.intervalMs) return;
    this.lastRun = now;
    this.running = this.clean(now, s.periodMs);
    try {
      await this.running;
    } finally {
      this.running = undefined;
    }
  }

  private async clean(now: number, periodMs: number | undefined): Promise<void> {
    try {
      if (periodMs !== undefined) {
        const cutoff = new Date(now - periodMs);
        const n = await deleteLogsBefore(this.db, cutoff);
        if (n > 0) this.log.info("old spend log rows deleted", { rows: n, before: cutoff.toISOString() });
      }
      await deleteCallIdsBefore(this.db, now - CALL_ID_RETENTION_MS);
      await deleteReportPartsBefore(this.db, now - REPORT_PART_RETENTION_MS);
      // A day after its end: a call that started in the period may still be written then.
      await deletePeriodSpendBefore(this.db, now - 86_400_000);
    } catch (err) {
      // Tried again at the next check, not after a whole interval.
      this.lastRun = 0;
      this.log.warn("spend log retention clean-up failed; retrying", storeErrorCause(err));
    }
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(async () => {
      await this.check();
      this.schedule(Math.min(MAX_CHECK_MS, this.settings().intervalMs));
    }, ms);
    this.timer.unref?.();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.running;
  }
}
