/**
 * Writes one batch of spend entries in one transaction: the log rows, the spend counters of keys,
 * users, teams, orgs and team members, and the daily aggregates. Counters and aggregates are
 * computed only from rows this transaction inserted, so a batch delivered twice (a commit whose
 * answer was lost, a replayed spill file) is counted once, and counters always equal their logs.
 */
import { type SQL, sql } from "drizzle-orm";
import type { Db } from "../store/db.ts";
import { spendLogs } from "../store/schema.ts";
import { picoToText as picoText, usdToPico as toPico } from "../cost/money.ts";
import type { CounterTable, SpendEntry } from "./entry.ts";

const COUNTER_TABLES: Record<Exclude<CounterTable, "team_member">, { table: string; id: string }> = {
  key: { table: "virtual_keys", id: "token" },
  team: { table: "teams", id: "team_id" },
  org: { table: "organizations", id: "organization_id" },
  user: { table: "users", id: "user_id" },
};

/** UTC calendar day of an instant. */
export function dayOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

interface CounterDelta {
  /** Pico-dollars. */
  delta: bigint;
  periodEnd: number | null;
}

/**
 * Per counter, the spend of the latest period present in the batch: an older period's spend stays
 * in the log but no longer counts against the budget.
 */
function counterDeltas(rows: SpendEntry[]): Map<CounterTable, Map<string, CounterDelta>> {
  const out = new Map<CounterTable, Map<string, CounterDelta>>();
  for (const row of rows) {
    const spend = toPico(row.spend);
    for (const c of row.charges) {
      let byId = out.get(c.table);
      if (!byId) {
        byId = new Map();
        out.set(c.table, byId);
      }
      const cur = byId.get(c.id);
      const p = c.periodEnd ?? -1;
      const curP = cur?.periodEnd ?? -1;
      if (!cur || p > curP) byId.set(c.id, { delta: spend, periodEnd: c.periodEnd });
      else if (p === curP) cur.delta += spend;
    }
  }
  return out;
}

function updateCounters(table: CounterTable, deltas: Map<string, CounterDelta>): SQL {
  if (table === "team_member") {
    const values = sql.join(
      [...deltas].map(([id, d]) => {
        const [teamId, userId] = id.split("\t");
        return sql`(${teamId}::text, ${userId}::text, ${picoText(d.delta)}::numeric)`;
      }),
      sql`, `,
    );
    return sql`update team_members as t set spend = t.spend + v.delta from (values ${values}) as v(team_id, user_id, delta) where t.team_id = v.team_id and t.user_id = v.user_id`;
  }
  const { table: name, id } = COUNTER_TABLES[table];
  const values = sql.join(
    [...deltas].map(([rowId, d]) => sql`(${rowId}::text, ${picoText(d.delta)}::numeric, ${d.periodEnd === null ? null : new Date(d.periodEnd).toISOString()}::timestamptz)`),
    sql`, `,
  );
  // Same period (or a flat budget): add. The store still in an older period: the new one starts
  // with this spend. The spend belongs to a period already closed: the log keeps it, the counter not.
  return sql`update ${sql.identifier(name)} as t set
      spend = case
        when v.period_end is null or t.budget_reset_at is null or t.budget_reset_at = v.period_end then t.spend + v.delta
        when t.budget_reset_at < v.period_end then v.delta
        else t.spend end,
      budget_reset_at = case when v.period_end is not null and t.budget_reset_at < v.period_end then v.period_end else t.budget_reset_at end
    from (values ${values}) as v(id, delta, period_end)
    where t.${sql.identifier(id)} = v.id`;
}

interface DailyRow {
  entityType: string;
  entityId: string;
  date: string;
  apiKey: string;
  model: string;
  modelGroup: string;
  provider: string;
  prompt: number;
  completion: number;
  cacheRead: number;
  cacheCreation: number;
  spend: bigint;
  requests: number;
  ok: number;
  failed: number;
}

function dailyRows(rows: SpendEntry[]): DailyRow[] {
  const out = new Map<string, DailyRow>();
  const add = (row: SpendEntry, entityType: string, entityId: string, apiKey: string, model: string, modelGroup: string, provider: string) => {
    const date = dayOf(row.startTime);
    const k = [entityType, entityId, date, apiKey, model, modelGroup, provider].join("\u0000");
    let d = out.get(k);
    if (!d) {
      d = { entityType, entityId, date, apiKey, model, modelGroup, provider, prompt: 0, completion: 0, cacheRead: 0, cacheCreation: 0, spend: 0n, requests: 0, ok: 0, failed: 0 };
      out.set(k, d);
    }
    d.prompt += row.promptTokens;
    d.completion += row.completionTokens;
    d.cacheRead += row.cacheReadTokens;
    d.cacheCreation += row.cacheCreationTokens;
    d.spend += toPico(row.spend);
    d.requests += 1;
    if (row.status === "success") d.ok += 1;
    else if (row.status === "failure") d.failed += 1;
  };
  for (const r of rows) {
    add(r, "key", r.apiKey, r.apiKey, r.upstreamModel, r.modelGroup, r.provider);
    if (r.teamId) add(r, "team", r.teamId, r.apiKey, r.upstreamModel, r.modelGroup, r.provider);
    if (r.organizationId) add(r, "org", r.organizationId, r.apiKey, r.upstreamModel, r.modelGroup, r.provider);
    if (r.userId) add(r, "user", r.userId, r.apiKey, r.upstreamModel, r.modelGroup, r.provider);
    if (r.endUser) add(r, "end_user", r.endUser, r.apiKey, r.upstreamModel, r.modelGroup, r.provider);
    for (const tag of new Set(r.tags)) add(r, "tag", tag, r.apiKey, r.upstreamModel, r.modelGroup, r.provider);
    add(r, "model", r.modelGroup, "", r.upstreamModel, r.modelGroup, r.provider);
    add(r, "provider", r.provider, "", "", "", r.provider);
  }
  return [...out.values()];
}

function upsertDaily(rows: DailyRow[]): SQL {
  const values = sql.join(
    rows.map(
      (d) =>
        sql`(${d.entityType}, ${d.entityId}, ${d.date}::date, ${d.apiKey}, ${d.model}, ${d.modelGroup}, ${d.provider}, ${d.prompt}::bigint, ${d.completion}::bigint, ${d.cacheRead}::bigint, ${d.cacheCreation}::bigint, ${picoText(d.spend)}::numeric, ${d.requests}::bigint, ${d.ok}::bigint, ${d.failed}::bigint)`,
    ),
    sql`, `,
  );
  return sql`insert into daily_spend as d (entity_type, entity_id, date, api_key, model, model_group, provider, prompt_tokens, completion_tokens,
      cache_read_input_tokens, cache_creation_input_tokens, spend, api_requests, successful_requests, failed_requests)
    values ${values}
    on conflict (entity_type, entity_id, date, api_key, model, model_group, provider) do update set
      prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
      completion_tokens = d.completion_tokens + excluded.completion_tokens,
      cache_read_input_tokens = d.cache_read_input_tokens + excluded.cache_read_input_tokens,
      cache_creation_input_tokens = d.cache_creation_input_tokens + excluded.cache_creation_input_tokens,
      spend = d.spend + excluded.spend,
      api_requests = d.api_requests + excluded.api_requests,
      successful_requests = d.successful_requests + excluded.successful_requests,
      failed_requests = d.failed_requests + excluded.failed_requests,
      updated_at = now()`;
}

/** Writes a batch; returns how many rows were new (the rest had been written before). */
export async function writeBatch(db: Db, batch: SpendEntry[]): Promise<number> {
  if (batch.length === 0) return 0;
  return db.transaction(async (tx) => {
    const inserted = await tx
      .insert(spendLogs)
      .values(
        batch.map((e) => ({
          callId: e.callId,
          requestId: e.requestId,
          callType: e.callType,
          apiKey: e.apiKey,
          keyAlias: e.keyAlias,
          userId: e.userId,
          teamId: e.teamId,
          organizationId: e.organizationId,
          endUser: e.endUser,
          model: e.model,
          modelGroup: e.modelGroup,
          provider: e.provider,
          modelId: e.modelId,
          upstreamModel: e.upstreamModel,
          spend: e.spend,
          promptTokens: e.promptTokens,
          completionTokens: e.completionTokens,
          totalTokens: e.promptTokens + e.completionTokens,
          cacheReadTokens: e.cacheReadTokens,
          cacheCreationTokens: e.cacheCreationTokens,
          reasoningTokens: e.reasoningTokens,
          startTime: new Date(e.startTime),
          endTime: new Date(e.endTime),
          completionStartTime: e.completionStartTime === null ? null : new Date(e.completionStartTime),
          status: e.status,
          stream: e.stream,
          cacheHit: e.cacheHit,
          requestTags: e.tags,
          metadata: e.metadata,
        })),
      )
      .onConflictDoNothing({ target: spendLogs.callId })
      .returning({ callId: spendLogs.callId });
    if (inserted.length === 0) return 0;
    const fresh = new Set(inserted.map((r) => r.callId));
    const rows = inserted.length === batch.length ? batch : batch.filter((e) => fresh.has(e.callId));
    for (const [table, deltas] of counterDeltas(rows)) await tx.execute(updateCounters(table, deltas));
    await tx.execute(upsertDaily(dailyRows(rows)));
    return rows.length;
  });
}
