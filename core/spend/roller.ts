/**
 * Moves ended budget periods forward in the store: spend to 0 and `budget_reset_at` to the next
 * instant on the period grid (see period.ts), every second. Enforcement never waits for this (the
 * ledger starts the new period on the instant); it keeps what `/key/info` and reports show true
 * for entities that make no calls. Each update is conditional on the value it read, so several
 * instances rolling at once, or a spend flush in between, cannot reset a period twice.
 */
import { sql } from "drizzle-orm";
import type { Logger } from "../contract.ts";
import type { ChangeBus } from "../identity/bus.ts";
import type { IdentityChange } from "../identity/records.ts";
import type { Db } from "../store/db.ts";
import { rows, storeErrorCause } from "../store/sql.ts";
import { periodEnd } from "./period.ts";

interface DueRow {
  id: string;
  reset_at: Date | string;
  duration: string | null;
}

const TABLES = [
  {
    name: "virtual_keys",
    id: "token",
    // A key (team, org) on a budget object without its own duration follows the budget's.
    due: sql`select k.token as id, k.budget_reset_at as reset_at, coalesce(k.budget_duration, b.budget_duration) as duration
      from virtual_keys k left join budgets b on b.budget_id = k.budget_id
      where k.budget_reset_at <= now() and k.deleted_at is null`,
    change: (id: string): IdentityChange => ({ kind: "key", token: id }),
  },
  {
    name: "teams",
    id: "team_id",
    due: sql`select t.team_id as id, t.budget_reset_at as reset_at, coalesce(t.budget_duration, b.budget_duration) as duration
      from teams t left join budgets b on b.budget_id = t.budget_id
      where t.budget_reset_at <= now() and t.deleted_at is null`,
    change: (id: string): IdentityChange => ({ kind: "team", teamId: id }),
  },
  {
    name: "organizations",
    id: "organization_id",
    due: sql`select o.organization_id as id, o.budget_reset_at as reset_at, coalesce(o.budget_duration, b.budget_duration) as duration
      from organizations o left join budgets b on b.budget_id = o.budget_id where o.budget_reset_at <= now()`,
    change: (id: string): IdentityChange => ({ kind: "org", orgId: id }),
  },
  {
    name: "users",
    id: "user_id",
    due: sql`select user_id as id, budget_reset_at as reset_at, budget_duration as duration from users where budget_reset_at <= now()`,
    change: (id: string): IdentityChange => ({ kind: "user", userId: id }),
  },
  {
    // A budget object's own period: the end its followers take when they join it (budget-period.ts).
    name: "budgets",
    id: "budget_id",
    due: sql`select budget_id as id, budget_reset_at as reset_at, budget_duration as duration from budgets where budget_reset_at <= now()`,
    change: (id: string): IdentityChange => ({ kind: "budget", budgetId: id }),
  },
] as const;

export async function rollDuePeriods(db: Db, now = Date.now()): Promise<IdentityChange[]> {
  const changes: IdentityChange[] = [];
  for (const t of TABLES) {
    for (const row of await rows<DueRow>(db, t.due)) {
      const resetAt = new Date(row.reset_at);
      const next = periodEnd(resetAt, row.duration, now);
      if (next === null) continue;
      const updated = await rows<{ id: string }>(
        db,
        sql`update ${sql.identifier(t.name)} set spend = 0, budget_reset_at = ${new Date(next).toISOString()}::timestamptz
          where ${sql.identifier(t.id)} = ${row.id} and budget_reset_at = ${resetAt.toISOString()}::timestamptz
          returning ${sql.identifier(t.id)} as id`,
      );
      if (updated.length > 0) changes.push(t.change(row.id));
    }
  }
  return changes;
}

export class PeriodRoller {
  private timer: ReturnType<typeof setInterval> | undefined;
  private running = false;

  constructor(
    private readonly db: Db,
    private readonly bus: ChangeBus,
    private readonly log: Logger,
    private readonly intervalMs = 1000,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.tick(), this.intervalMs);
    this.timer.unref?.();
  }

  async tick(): Promise<void> {
    if (this.running) return;
    this.running = true;
    try {
      const changes = await rollDuePeriods(this.db);
      if (changes.length > 0) await this.bus.publish(...changes);
    } catch (err) {
      this.log.warn("budget period roll failed; retrying", storeErrorCause(err));
    } finally {
      this.running = false;
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    while (this.running) await new Promise((r) => setTimeout(r, 10));
  }
}
