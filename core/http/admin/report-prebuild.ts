/**
 * Builds, in the background, the day parts of the reports a spend dashboard opens with: the
 * global spend report by team, api key and customer, and team and organization daily activity,
 * unfiltered. Only finished days of the last `days` days are built (today's part changes with
 * every call and is built when asked). It runs shortly after start and again after each UTC
 * midnight, so the first request of a day reads the finished days back from the store and builds
 * only today's: over 10 million log rows the first by-customer report took most of a second to
 * build; read back, it answers in about 150 ms.
 *
 * Parts are built as a request builds them (day-cache.ts), a turn of the event loop between days,
 * but kept in the store only: a gateway holds in memory only reports someone asked for. A day
 * already stored (by a request or another instance) is not built again, and a request that needs
 * a day the prebuild is building waits for it.
 */
import type { Logger } from "../../contract.ts";
import type { Db } from "../../store/db.ts";
import { dayOf } from "../../spend/flush.ts";
import { activityParts, type DailyFilter, dailyDays } from "./spend-queries.ts";
import { spendReportJson } from "./spend-report.ts";
import { storeErrorCause } from "../../store/sql.ts";

const DAY_MS = 86_400_000;
/** After start: the gateway serves its first requests before this work. */
const FIRST_RUN_DELAY_MS = 2_000;
/** After midnight: late calls of the day before are still being written. */
const AFTER_MIDNIGHT_MS = 5 * 60_000;

/** The finished days of the last `days` days (today not included), as the reports' date range. */
export function finishedSpan(days: number, now = Date.now()): { start: string; end: string } {
  return { start: dayOf(now - days * DAY_MS), end: dayOf(now - DAY_MS) };
}

/** Builds every prebuilt report's parts over `span`; stops early when `stopped()` turns true. */
export async function prebuildReports(db: Db, log: Logger, span: { start: string; end: string }, stopped: () => boolean): Promise<void> {
  for (const groupBy of ["team", "api_key", "customer"] as const) {
    if (stopped()) return;
    await spendReportJson(db, log, span, groupBy, true);
  }
  for (const kind of ["team", "org"] as const) {
    if (stopped()) return;
    // The filter an unfiltered request builds (its key names the same absent filters).
    const f: DailyFilter = { entityType: kind, ...span };
    await activityParts(db, log, kind, f, await dailyDays(db, f), true);
  }
}

export class ReportPrebuild {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;

  constructor(
    private readonly db: Db,
    private readonly log: Logger,
    /** How many days back to build (0: none), read at each run so a config reload applies. */
    private readonly days: () => number,
  ) {}

  start(): void {
    this.schedule(FIRST_RUN_DELAY_MS);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.running;
  }

  /** One pass now (or the one under way). */
  run(): Promise<void> {
    this.running ??= this.pass().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      void this.run().finally(() => this.schedule(DAY_MS - (Date.now() % DAY_MS) + AFTER_MIDNIGHT_MS));
    }, ms);
    this.timer.unref?.();
  }

  private async pass(): Promise<void> {
    const days = this.days();
    if (days <= 0 || this.stopped) return;
    const span = finishedSpan(days);
    const started = performance.now();
    try {
      await prebuildReports(this.db, this.log, span, () => this.stopped);
      if (!this.stopped) this.log.info("spend reports prebuilt", { start: span.start, end: span.end, ms: Math.round(performance.now() - started) });
    } catch (err) {
      // A store going away at shutdown is not worth a warning; otherwise the first request builds.
      if (!this.stopped) this.log.warn("spend reports not prebuilt", storeErrorCause(err));
    }
  }
}
