/**
 * Stored spend of a counter row (keys, teams, orgs, users, team members), and stored spend since
 * an instant, for budgets kept on no row (per-model key and organization budgets, provider budgets). Whole UTC days come from the daily aggregates; a period starting inside a day reads
 * that day's log rows (indexed by time), so the cost stays small whatever the period.
 */
import { type SQL, sql } from "drizzle-orm";
import { type CounterTable, type SpendHistory, teamMemberOf } from "../contract.ts";
import { columnToPico } from "../cost/money.ts";
import type { Db } from "../store/db.ts";
import { rows } from "../store/sql.ts";
import { dayOf, FLAT_PERIOD_END } from "./flush.ts";

const DAY_MS = 86_400_000;

/** A counter row's table and id columns (a team member's id is `team_id\tuser_id`). */
const COUNTER_ROWS: Record<CounterTable, (id: string) => SQL> = {
  // By what its counters go by (records.ts keyCounterToken: first_token, else token).
  key: (id) => sql`select spend::text as spend, budget_reset_at as reset from virtual_keys where first_token = ${id} or (first_token is null and token = ${id})`,
  team: (id) => sql`select spend::text as spend, budget_reset_at as reset from teams where team_id = ${id}`,
  org: (id) => sql`select spend::text as spend, budget_reset_at as reset from organizations where organization_id = ${id}`,
  user: (id) => sql`select spend::text as spend, budget_reset_at as reset from users where user_id = ${id}`,
  team_member: (id) => {
    const { teamId, userId } = teamMemberOf(id);
    return sql`select spend::text as spend, null as reset from team_members where team_id = ${teamId} and user_id = ${userId}`;
  },
};

/**
 * Reads stored spend for the budget ledger, which reads a counter once and then counts on its
 * own: `flushPending` first writes the calls that already ended (the spend writer's queue), so
 * the reading includes them.
 */
export class StoreSpendHistory implements SpendHistory {
  constructor(
    private readonly db: Db,
    private readonly flushPending: () => Promise<void> = async () => undefined,
  ) {}

  async counter(table: CounterTable, id: string): Promise<{ spend: string; budgetResetAt: Date | null } | undefined> {
    await this.flushPending();
    const [row] = await rows<{ spend: string; reset: Date | string | null }>(this.db, COUNTER_ROWS[table](id));
    if (!row) return undefined;
    return { spend: row.spend, budgetResetAt: row.reset === null ? null : new Date(row.reset) };
  }

  async periodSpend(counter: string, periodEnd: number | null): Promise<bigint> {
    await this.flushPending();
    const end = periodEnd === null ? sql`${FLAT_PERIOD_END}::timestamptz` : sql`${new Date(periodEnd).toISOString()}::timestamptz`;
    const [row] = await rows<{ spend: string }>(this.db, sql`select spend::text as spend from budget_period_spend where counter = ${counter} and period_end = ${end}`);
    return columnToPico(row?.spend);
  }

  async sum(filter: { apiKeys?: readonly string[]; teamId?: string; orgId?: string; modelGroup?: string; provider?: string; since: number }): Promise<bigint> {
    await this.flushPending();
    const firstWholeDay = Math.ceil(filter.since / DAY_MS) * DAY_MS;
    const apiKeys = filter.apiKeys?.length ? sql.join(filter.apiKeys.map((k) => sql`${k}`), sql`, `) : undefined;
    let total = 0n;
    if (firstWholeDay > filter.since) {
      const logWhere: SQL[] = [sql`start_time >= ${new Date(filter.since).toISOString()}::timestamptz`, sql`start_time < ${new Date(firstWholeDay).toISOString()}::timestamptz`];
      if (apiKeys) logWhere.push(sql`api_key in (${apiKeys})`);
      if (filter.teamId !== undefined) logWhere.push(sql`team_id = ${filter.teamId}`);
      if (filter.orgId !== undefined) logWhere.push(sql`organization_id = ${filter.orgId}`);
      if (filter.modelGroup) logWhere.push(sql`model_group = ${filter.modelGroup}`);
      if (filter.provider) logWhere.push(sql`provider = ${filter.provider}`);
      const [row] = await rows<{ total: string | null }>(this.db, sql`select sum(spend)::text as total from spend_logs where ${sql.join(logWhere, sql` and `)}`);
      total += columnToPico(row?.total);
    }
    const entity = apiKeys
      ? sql`entity_type = 'key' and entity_id in (${apiKeys})`
      : filter.teamId !== undefined
        ? sql`entity_type = 'team' and entity_id = ${filter.teamId}`
        : filter.orgId !== undefined
        ? sql`entity_type = 'org' and entity_id = ${filter.orgId}`
        : sql`entity_type = 'provider' and entity_id = ${filter.provider ?? ""}`;
    const where: SQL[] = [entity, sql`date >= ${dayOf(firstWholeDay)}::date`];
    if (filter.modelGroup) where.push(sql`model_group = ${filter.modelGroup}`);
    if ((apiKeys || filter.teamId !== undefined || filter.orgId !== undefined) && filter.provider) where.push(sql`provider = ${filter.provider}`);
    const [row] = await rows<{ total: string | null }>(this.db, sql`select sum(spend)::text as total from daily_spend where ${sql.join(where, sql` and `)}`);
    return total + columnToPico(row?.total);
  }
}
