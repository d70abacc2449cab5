/**
 * Stored spend since an instant, for budgets kept on no row (per-model key budgets, provider
 * budgets). Whole UTC days come from the daily aggregates; a period starting inside a day reads
 * that day's log rows (indexed by time), so the cost stays small whatever the period.
 */
import { type SQL, sql } from "drizzle-orm";
import type { SpendHistory } from "../contract.ts";
import { columnToPico } from "../cost/money.ts";
import type { Db } from "../store/db.ts";
import { rows } from "../store/sql.ts";
import { dayOf } from "./flush.ts";

const DAY_MS = 86_400_000;

export class StoreSpendHistory implements SpendHistory {
  constructor(private readonly db: Db) {}

  async sum(filter: { apiKey?: string; modelGroup?: string; provider?: string; since: number }): Promise<bigint> {
    const firstWholeDay = Math.ceil(filter.since / DAY_MS) * DAY_MS;
    let total = 0n;
    if (firstWholeDay > filter.since) {
      const logWhere: SQL[] = [sql`start_time >= ${new Date(filter.since).toISOString()}::timestamptz`, sql`start_time < ${new Date(firstWholeDay).toISOString()}::timestamptz`];
      if (filter.apiKey) logWhere.push(sql`api_key = ${filter.apiKey}`);
      if (filter.modelGroup) logWhere.push(sql`model_group = ${filter.modelGroup}`);
      if (filter.provider) logWhere.push(sql`provider = ${filter.provider}`);
      const [row] = await rows<{ total: string | null }>(this.db, sql`select sum(spend)::text as total from spend_logs where ${sql.join(logWhere, sql` and `)}`);
      total += columnToPico(row?.total);
    }
    const entity = filter.apiKey ? sql`entity_type = 'key' and entity_id = ${filter.apiKey}` : sql`entity_type = 'provider' and entity_id = ${filter.provider ?? ""}`;
    const where: SQL[] = [entity, sql`date >= ${dayOf(firstWholeDay)}::date`];
    if (filter.modelGroup) where.push(sql`model_group = ${filter.modelGroup}`);
    if (filter.apiKey && filter.provider) where.push(sql`provider = ${filter.provider}`);
    const [row] = await rows<{ total: string | null }>(this.db, sql`select sum(spend)::text as total from daily_spend where ${sql.join(where, sql` and `)}`);
    return total + columnToPico(row?.total);
  }
}
