/**
 * Writes one batch of spend entries in one transaction: the log rows, the spend counters of keys,
 * users, teams, orgs and team members, and the daily aggregates. Counters and aggregates are
 * computed only from rows this transaction inserted, so a batch delivered twice (a commit whose
 * answer was lost, a replayed spill file) is counted once, and counters always equal their logs.
 */
import { sql } from "drizzle-orm";
import type { Db } from "../store/db.ts";
import { rows } from "../store/sql.ts";
import { picoToText } from "../cost/money.ts";
import type { SpendEntry } from "./entry.ts";

/** UTC calendar day of an instant. */
export function dayOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

/** Same period (or a flat budget): add. The store still in an older period: the new one starts
 * with this spend. The spend belongs to a period already closed: the log keeps it, the counter not. */
const counterUpdate = (table: string, id: string, kind: string) => `
  ${kind}_spend as (
    update ${table} as t set
      spend = case
        when d.period_end is null or t.budget_reset_at is null or t.budget_reset_at = d.period_end then t.spend + d.amount
        when t.budget_reset_at < d.period_end then d.amount
        else t.spend end,
      budget_reset_at = case when d.period_end is not null and t.budget_reset_at < d.period_end then d.period_end else t.budget_reset_at end
    from delta d where d.t = '${kind}' and t.${id} = d.id
    returning 1)`;

const at = (ms: string) => `to_timestamp(${ms} / 1000.0)`;

/** Inserts the batch (one JSON parameter); returns how many rows were new. */
const INSERT = `
with ins as (insert into spend_logs (call_id, request_id, call_type, api_key, key_alias, user_id, team_id, organization_id, end_user,
  model, model_group, provider, model_id, upstream_model, spend, prompt_tokens, completion_tokens, total_tokens,
  cache_read_input_tokens, cache_creation_input_tokens, reasoning_tokens, start_time, end_time, completion_start_time,
  status, stream, cache_hit, request_tags, metadata)
select "callId", "requestId", "callType", "apiKey", "keyAlias", "userId", "teamId", "organizationId", "endUser",
  model, "modelGroup", provider, "modelId", "upstreamModel", "spendPico"::numeric / 1000000000000, "promptTokens", "completionTokens",
  "promptTokens" + "completionTokens", "cacheReadTokens", "cacheCreationTokens", "reasoningTokens",
  ${at('"startTime"')}, ${at('"endTime"')}, ${at('"completionStartTime"')}, status, stream, "cacheHit",
  coalesce(tags, '{}'), coalesce(metadata, '{}')
from jsonb_to_recordset($1::jsonb) as x(
  "callId" text, "requestId" text, "callType" text, "apiKey" text, "keyAlias" text, "userId" text, "teamId" text,
  "organizationId" text, "endUser" text, model text, "modelGroup" text, provider text, "modelId" text, "upstreamModel" text,
  "spendPico" bigint, "promptTokens" int, "completionTokens" int, "cacheReadTokens" int, "cacheCreationTokens" int,
  "reasoningTokens" int, "startTime" bigint, "endTime" bigint, "completionStartTime" bigint, status text, stream boolean,
  "cacheHit" boolean, tags text[], metadata jsonb)
on conflict (call_id) do nothing
returning 1)
select count(*)::int as inserted from ins`;

/** Which of the given rows this transaction inserted (its own rows carry its transaction id). */
const INSERTED_HERE = "select call_id from spend_logs where call_id in (select jsonb_array_elements_text($1::jsonb)) and xmin = pg_current_xact_id()::xid";

/** Applies counter deltas ($1) and daily aggregates ($2), both already summed per target row. */
const APPLY = `
with delta as (
  select t, id, case when p is null then null else ${at("p")} end as period_end, amount
  from jsonb_to_recordset($1::jsonb) as x(t text, id text, p bigint, amount numeric)
),
${counterUpdate("virtual_keys", "token", "key")},
${counterUpdate("teams", "team_id", "team")},
${counterUpdate("organizations", "organization_id", "org")},
${counterUpdate("users", "user_id", "user")},
team_member_spend as (
  update team_members as t set spend = t.spend + d.amount
  from delta d where d.t = 'team_member' and t.team_id = split_part(d.id, E'\\t', 1) and t.user_id = split_part(d.id, E'\\t', 2)
  returning 1)
insert into daily_spend as d (entity_type, entity_id, date, api_key, model, model_group, provider, prompt_tokens,
  completion_tokens, cache_read_input_tokens, cache_creation_input_tokens, spend, api_requests, successful_requests, failed_requests)
select type, id, day::date, key, model, grp, provider, pt, ct, cr, cc, spend, n, ok, failed
from jsonb_to_recordset($2::jsonb) as y(type text, id text, day text, key text, model text, grp text, provider text,
  pt bigint, ct bigint, cr bigint, cc bigint, spend numeric, n bigint, ok bigint, failed bigint)
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

/** Rows that charge and aggregate alike (same key, team, model, day, tags, periods…), summed once. */
interface RowGroup {
  sample: SpendEntry;
  day: string;
  n: number;
  ok: number;
  failed: number;
  pt: number;
  ct: number;
  cr: number;
  cc: number;
  spend: bigint;
}

const DAY_MS = 86_400_000;

function groupRows(entries: SpendEntry[]): RowGroup[] {
  const groups = new Map<string, RowGroup>();
  for (const e of entries) {
    const dayNo = Math.floor(e.startTime / DAY_MS);
    let sig = `${e.apiKey}\u0000${e.teamId}\u0000${e.organizationId}\u0000${e.userId}\u0000${e.endUser}\u0000${e.upstreamModel}\u0000${e.modelGroup}\u0000${e.provider}\u0000${dayNo}\u0000${e.tags.join("\u0001")}`;
    for (const c of e.charges) sig += `\u0000${c.periodEnd}`;
    let g = groups.get(sig);
    if (!g) {
      g = { sample: e, day: dayOf(e.startTime), n: 0, ok: 0, failed: 0, pt: 0, ct: 0, cr: 0, cc: 0, spend: 0n };
      groups.set(sig, g);
    }
    g.n++;
    if (e.status === "success") g.ok++;
    else if (e.status === "failure") g.failed++;
    g.pt += e.promptTokens;
    g.ct += e.completionTokens;
    g.cr += e.cacheReadTokens;
    g.cc += e.cacheCreationTokens;
    g.spend += BigInt(e.spendPico);
  }
  return [...groups.values()];
}

/** Per counter, the spend of the latest period present (an older period's spend stays in the log only). */
function counterDeltas(groups: RowGroup[]): { t: string; id: string; p: number | null; amount: string }[] {
  const out = new Map<string, { t: string; id: string; p: number | null; amount: bigint }>();
  for (const g of groups) {
    for (const c of g.sample.charges) {
      const k = `${c.table}\u0000${c.id}`;
      const cur = out.get(k);
      if (!cur || (c.periodEnd ?? -1) > (cur.p ?? -1)) out.set(k, { t: c.table, id: c.id, p: c.periodEnd, amount: g.spend });
      else if ((c.periodEnd ?? -1) === (cur.p ?? -1)) cur.amount += g.spend;
    }
  }
  return [...out.values()].map((d) => ({ ...d, amount: picoToText(d.amount) }));
}

interface DailyRow {
  type: string;
  id: string;
  day: string;
  key: string;
  model: string;
  grp: string;
  provider: string;
  pt: number;
  ct: number;
  cr: number;
  cc: number;
  spend: bigint;
  n: number;
  ok: number;
  failed: number;
}

function dailyRows(groups: RowGroup[]) {
  const out = new Map<string, DailyRow>();
  const add = (g: RowGroup, type: string, id: string | null, key: string, model: string, grp: string) => {
    if (id === null) return;
    const e = g.sample;
    const k = `${type}\u0000${id}\u0000${g.day}\u0000${key}\u0000${model}\u0000${grp}\u0000${e.provider}`;
    const d = out.get(k);
    if (!d) {
      out.set(k, { type, id, day: g.day, key, model, grp, provider: e.provider, pt: g.pt, ct: g.ct, cr: g.cr, cc: g.cc, spend: g.spend, n: g.n, ok: g.ok, failed: g.failed });
      return;
    }
    d.pt += g.pt;
    d.ct += g.ct;
    d.cr += g.cr;
    d.cc += g.cc;
    d.spend += g.spend;
    d.n += g.n;
    d.ok += g.ok;
    d.failed += g.failed;
  };
  for (const g of groups) {
    const e = g.sample;
    for (const [type, id] of [
      ["key", e.apiKey],
      // Calls without a team get a team row too (id ''): the team report then reads one entity type.
      ["team", e.teamId ?? ""],
      ["org", e.organizationId],
      ["user", e.userId],
      ["end_user", e.endUser],
    ] as const) {
      add(g, type, id, e.apiKey, e.upstreamModel, e.modelGroup);
    }
    for (const tag of new Set(e.tags)) add(g, "tag", tag, e.apiKey, e.upstreamModel, e.modelGroup);
    add(g, "model", e.modelGroup, "", e.upstreamModel, e.modelGroup);
    add(g, "provider", e.provider, "", "", "");
  }
  return [...out.values()].map((d) => ({ ...d, spend: picoToText(d.spend) }));
}

const split = (statement: string) => statement.split(/\$\d/);
const [INSERT_A, INSERT_B] = split(INSERT) as [string, string];
const [APPLY_A, APPLY_B, APPLY_C] = split(APPLY) as [string, string, string];

/**
 * Writes a batch in one transaction: the rows (one JSON parameter, keyed by call id), then the
 * counters and daily aggregates of exactly the rows that were new, summed here first so the store
 * updates one row per key, team, day… rather than one per call. Returns how many rows were new.
 */
export async function writeBatch(db: Db, batch: SpendEntry[]): Promise<number> {
  if (batch.length === 0) return 0;
  return db.transaction(async (tx) => {
    const t = tx as unknown as Db;
    const [count] = await rows<{ inserted: number }>(t, sql`${sql.raw(INSERT_A)}${JSON.stringify(batch)}${sql.raw(INSERT_B)}`);
    const inserted = count?.inserted ?? 0;
    if (inserted === 0) return 0;
    let fresh = batch;
    // Only a replay (spill file, retried batch) meets rows already written: find which are new.
    if (inserted !== batch.length) {
      const ids = JSON.stringify(batch.map((e) => e.callId));
      const mine = await rows<{ call_id: string }>(t, sql`${sql.raw(INSERTED_HERE.split("$1")[0]!)}${ids}${sql.raw(INSERTED_HERE.split("$1")[1]!)}`);
      const set = new Set(mine.map((r) => r.call_id));
      fresh = batch.filter((e) => set.has(e.callId));
    }
    const groups = groupRows(fresh);
    await rows(t, sql`${sql.raw(APPLY_A)}${JSON.stringify(counterDeltas(groups))}${sql.raw(APPLY_B)}${JSON.stringify(dailyRows(groups))}${sql.raw(APPLY_C)}`);
    return fresh.length;
  });
}
