/**
 * Writes one batch of spend entries in one transaction: the log rows, the spend counters of keys,
 * users, teams, orgs and team members, and the daily aggregates. Counters and aggregates are
 * computed only from rows this transaction inserted, so a batch delivered twice (a commit whose
 * answer was lost, a replayed spill file) is counted once, and counters always equal their logs.
 */
import { sql } from "drizzle-orm";
import type { Store } from "../store/db.ts";
import { rows } from "../store/sql.ts";
import { picoToText } from "../cost/money.ts";
import type { CounterTable } from "../contract.ts";
import type { Charge, SpendEntry } from "./entry.ts";
import { durationMsSql } from "../identity/duration.ts";
import { WRITES_PERIOD_ENDS_WITHIN, wholePeriodsApart } from "./ledger.ts";
import { copyIds, copyRows, SPEND_LOG_COLUMNS, storableJson } from "./row-text.ts";

/** UTC calendar day of an instant. */
export function dayOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

/**
 * Whether the delta's period end and the row's are not a whole number of the delta's periods
 * apart: a write moved the end (a new budget_duration, which keeps the spend), not a rollover.
 */
const MOVED_BY_WRITE = `(d.ms is not null and mod(round(extract(epoch from (d.period_end - t.budget_reset_at)) * 1000), d.ms) <> 0)`;

/**
 * Whether the row is still in the period the write that moved its end made (its end within
 * WRITES_PERIOD_ENDS_WITHIN of its periods of its last definition: the write set it one period
 * ahead, the roller moves it on by whole periods), as the ledger tells it (laterThanDefinition). The row's
 * period and definition are read as the ledger reads them (plugins/budgets.ts rowCounter): its own
 * duration, else its budget object's; its last write, or its budget object's.
 */
const inWritesPeriod = (table: string) => {
  const budget = (column: string) => (table === "users" ? "null" : `(select b.${column} from budgets b where b.budget_id = t.budget_id)`);
  const ms = durationMsSql(`coalesce(t.budget_duration, ${budget("budget_duration")})`);
  return `extract(epoch from t.budget_reset_at - greatest(t.updated_at, ${budget("updated_at")})) * 1000 < ${WRITES_PERIOD_ENDS_WITHIN} * ${ms}`;
};

/**
 * Same period (or a flat budget): add. The store still in an older period: the new one starts
 * with this spend. The spend belongs to a period already closed: the log keeps it, the counter not.
 * A call whose period's end a write moved since started before that write: it belongs to the
 * period the write made, and counts while the row is still in it; once the roller has moved the
 * row past it, that period is closed. (Before, a row rolled on counted it in its next period.)
 */
const counterSet = (table: string, amount = "d.amount") => `
      spend = case
        when d.period_end is null or t.budget_reset_at is null or t.budget_reset_at = d.period_end then t.spend + ${amount}
        when ${MOVED_BY_WRITE} then case when coalesce(${inWritesPeriod(table)}, t.budget_reset_at > now()) then t.spend + ${amount} else t.spend end
        when t.budget_reset_at < d.period_end then ${amount}
        else t.spend end,
      budget_reset_at = case when d.period_end is not null and t.budget_reset_at < d.period_end and not ${MOVED_BY_WRITE} then d.period_end else t.budget_reset_at end`;

/**
 * The counters whose spend may be set by hand (their rows' `spend_set_at`, tables/identity.ts).
 * Their deltas carry each call's end and cost (`f`, the earliest end; `s`, [end ms, amount] per call).
 */
const HAND_SET: ReadonlySet<ChargeTable> = new Set(["key", "team", "user", "team_member"]);

/**
 * What delta `d` adds to row `row`: the calls that ended after its spend was last set by hand.
 * Those that ended before are in the hand-set figure already (the instance that set it wrote its
 * own first; another instance's queue is written later, and is left out here); their log rows are
 * written all the same. Ends are the ending instance's clock, the set time the setting instance's:
 * a call that ended within their clocks' skew of the write may count on the wrong side of it.
 */
const amountAfterSet = (row: string, d: string) => `case
        when ${row}.spend_set_at is null or ${d}.f > extract(epoch from ${row}.spend_set_at) * 1000 then ${d}.amount
        else (select coalesce(sum((c->>1)::numeric), 0) from jsonb_array_elements(${d}.s) c
          where (c->>0)::bigint > extract(epoch from ${row}.spend_set_at) * 1000) end`;

/**
 * What a write that sets a row's spend by hand (`fields` naming `spend`) sets with it, in the
 * same write: when, by this instance's clock, as the calls' ends are (amountAfterSet).
 */
export function handSetSpend(fields: object): { spendSetAt?: Date } {
  return "spend" in fields ? { spendSetAt: new Date() } : {};
}

const counterUpdate = (table: string, id: string, kind: string, source = "delta", handSet = true) => `
  ${kind}_spend as (
    update ${table} as t set${counterSet(table, handSet ? amountAfterSet("t", "d") : "d.amount")}
    from ${source} d where d.t = '${kind}' and t.${id} = d.id
    returning 1)`;

/**
 * The keys' deltas under the token each key has now: a key rotated since the call started (or
 * since its spend was queued) is charged under its new token (identity/rotation.ts keeps the old
 * one's successor, unless a key has the old value again), summed with the new token's own delta
 * (an UPDATE applies one joined row).
 */
const KEY_DELTA = `(select 'key' as t,
      coalesce((select r.active_token from rotated_keys r where r.token = k.id and not exists (select from virtual_keys v where v.token = k.id)), k.id) as id,
      max(k.period_end) as period_end, sum(k.amount) as amount, max(k.ms) as ms,
      min(k.f) as f, jsonb_path_query_array(jsonb_agg(k.s), '$[*][*]') as s
    from delta k where k.t = 'key' group by 2)`;

const COUNTER_TABLES: readonly CounterTable[] = ["key", "team", "org", "user", "team_member"];

type ChargeTable = Charge["table"];

/**
 * The period end a budget that never resets is recorded under: its record holds all its spend,
 * which the log sums only by token (a key's per-model budget, named by what a rotation keeps,
 * would otherwise lose what the tokens of its earlier rotations spent), and is never pruned.
 */
export const FLAT_PERIOD_END = "infinity";

/**
 * The spend of counters without a row (history-budgets.ts) in their period: added to the
 * period's record, made by its first call. Inserted in key order, so batches of instances sharing
 * one database lock the records they share in one order.
 */
const periodSpendUpsert = (after?: string) => `
  period_spend as (
    insert into budget_period_spend as b (counter, period_end, spend)
    select d.id, coalesce(d.period_end, '${FLAT_PERIOD_END}'::timestamptz), d.amount from delta d
    where d.t = 'period'${after ? ` and (select count(*) from ${after}_spend) >= 0` : ""}
    order by d.id, 2
    on conflict (counter, period_end) do update set spend = b.spend + excluded.spend
    returning 1)`;

/**
 * The counters in the order a management write locks them (identity/holds.ts holdWrite; a team's
 * or user's deletion, /global/spend/reset): teams, organizations, users, memberships, then keys,
 * each table's rows by id. The batch statement on PostgreSQL takes them in that order too
 * (lockedCounterUpdate). Taken in the executor's own order (the counters' CTEs run last first:
 * memberships, users, organizations, teams, keys) and rows as the join met them, a batch and a
 * /user/delete, /team/delete or /global/spend/reset each held a row the other waited for:
 * PostgreSQL failed one after a second's wait (the admin call a 500, or the batch retried with a
 * "spend writes failing" warning).
 */
export const LOCK_ORDER: readonly CounterTable[] = ["team", "org", "user", "team_member", "key"];

/**
 * `counterUpdate` for a store other writers share: the rows are locked in id order, and only
 * once the counters of table `after` (the one before in LOCK_ORDER) are written.
 */
const lockedCounterUpdate = (
  table: string,
  ids: readonly string[],
  kind: string,
  match: (d: string, x: string) => string,
  after?: string,
  source = "delta",
  target: (t: string, d: string) => string = (t, d) => ids.map((id, i) => `${t}.${id} = ${d}.id${i}`).join(" and "),
  handSet = true,
) => `
  ${kind}_spend as (
    update ${table} as t set${counterSet(table)}
    from (
      select d.id as delta_id, d.period_end, ${handSet ? amountAfterSet("x", "d") : "d.amount"} as amount, d.ms, ${ids.map((id, i) => `x.${id} as id${i}`).join(", ")}
      from ${source} d join ${table} x on ${match("d", "x")}
      where d.t = '${kind}'${after ? ` and (select count(*) from ${after}_spend) >= 0` : ""}
      order by ${ids.map((id) => `x.${id}`).join(", ")}
      for no key update of x) d
    where ${target("t", "d")}
    returning 1)`;

/**
 * A key's row by the token its delta names, or by a token it had before its latest rotations
 * (`rotated_from`): a batch whose statement began before a rotation committed read the old token
 * and no successor, waited for the row (or for another row before it), and then rechecks this on
 * the row as the rotations left it, where the token alone no longer matches (the key was not
 * charged; the log and the team were).
 */
const keyByToken = (row: string, token: string) => `(${row}.token = ${token} or ${row}.rotated_from @> array[${token}])`;

const LOCKED_COUNTER_UPDATES: Record<CounterTable, (after?: string) => string> = {
  key: (after) =>
    lockedCounterUpdate("virtual_keys", ["token"], "key", (d, x) => keyByToken(x, `${d}.id`), after, KEY_DELTA, (t, d) => keyByToken(t, `${d}.delta_id`)),
  team: (after) => lockedCounterUpdate("teams", ["team_id"], "team", (d, x) => `${x}.team_id = ${d}.id`, after),
  org: (after) => lockedCounterUpdate("organizations", ["organization_id"], "org", (d, x) => `${x}.organization_id = ${d}.id`, after, undefined, undefined, false),
  user: (after) => lockedCounterUpdate("users", ["user_id"], "user", (d, x) => `${x}.user_id = ${d}.id`, after),
  team_member: (after) => `
  team_member_spend as (
    update team_members as t set spend = t.spend + d.amount
    from (
      select ${amountAfterSet("x", "d")} as amount, x.team_id, x.user_id
      from delta d join team_members x on x.team_id = split_part(d.id, E'\\t', 1) and x.user_id = split_part(d.id, E'\\t', 2)
      where d.t = 'team_member'${after ? ` and (select count(*) from ${after}_spend) >= 0` : ""}
      order by x.team_id, x.user_id
      for no key update of x) d
    where t.team_id = d.team_id and t.user_id = d.user_id
    returning 1)`,
};

const COUNTER_UPDATES: Record<CounterTable, string> = {
  key: counterUpdate("virtual_keys", "token", "key", KEY_DELTA),
  team: counterUpdate("teams", "team_id", "team"),
  org: counterUpdate("organizations", "organization_id", "org", "delta", false),
  user: counterUpdate("users", "user_id", "user"),
  team_member: `
  team_member_spend as (
    update team_members as t set spend = t.spend + ${amountAfterSet("t", "d")}
    from delta d where d.t = 'team_member' and t.team_id = split_part(d.id, E'\\t', 1) and t.user_id = split_part(d.id, E'\\t', 2)
    returning 1)`,
};

/**
 * Adds `daily_rows` (type, id, day, key, model, grp, provider, team, pt, ct, cr, cc, spend, n, ok, failed, sec)
 * to the aggregates, in the conflict key's order: batches of instances sharing one database lock
 * the rows they share (a key's on each model, a model's, a provider's) in one order, never in a ring.
 */
const DAILY_UPSERT = `daily as (
  insert into daily_spend as d (entity_type, entity_id, date, api_key, model, model_group, provider, team_id, prompt_tokens,
    completion_tokens, cache_read_input_tokens, cache_creation_input_tokens, spend, api_requests, successful_requests, failed_requests,
    audio_seconds)
  select * from daily_rows order by type, id, day, key, model, grp, provider, team
  on conflict (entity_type, entity_id, date, api_key, model, model_group, provider, team_id) do update set
    prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
    completion_tokens = d.completion_tokens + excluded.completion_tokens,
    cache_read_input_tokens = d.cache_read_input_tokens + excluded.cache_read_input_tokens,
    cache_creation_input_tokens = d.cache_creation_input_tokens + excluded.cache_creation_input_tokens,
    spend = d.spend + excluded.spend,
    api_requests = d.api_requests + excluded.api_requests,
    successful_requests = d.successful_requests + excluded.successful_requests,
    failed_requests = d.failed_requests + excluded.failed_requests,
    -- Null stays null only while no call had audio seconds (see tables/spend.ts).
    audio_seconds = coalesce(d.audio_seconds + excluded.audio_seconds, d.audio_seconds, excluded.audio_seconds),
    updated_at = now()
  returning 1
)`;

const DELTA_COLUMNS = "x(t text, id text, p bigint, amount numeric, ms bigint, f bigint, s jsonb)";
const DAILY_COLUMNS = `y(type text, id text, day text, key text, model text, grp text, provider text, team text,
    pt bigint, ct bigint, cr bigint, cc bigint, spend numeric, n bigint, ok bigint, failed bigint, sec numeric)`;

const at = (ms: string) => `to_timestamp(${ms} / 1000.0)`;

/** The batch's counter deltas, summed in memory and passed as JSON in `param`. */
const deltaInput = (param: string) =>
  `select t, id, case when p is null then null else ${at("p")} end as period_end, amount, ms, f, s from jsonb_to_recordset(${param}::jsonb) as ${DELTA_COLUMNS}`;
/** The batch's daily aggregates, summed in memory and passed as JSON in `param`. */
const dailyInput = (param: string) =>
  `select type, id, day::date as day, key, model, grp, provider, team, pt, ct, cr, cc, spend, n, ok, failed, sec from jsonb_to_recordset(${param}::jsonb) as ${DAILY_COLUMNS}`;
const metrics = (f: string) =>
  `${f}.provider, (${at(`${f}."startTime"`)} at time zone 'UTC')::date as day, ${f}."promptTokens" as pt, ${f}."completionTokens" as ct,
   ${f}."cacheReadTokens" as cr, ${f}."cacheCreationTokens" as cc, ${f}."spendPico" / 1000000000000 as spend, ${f}.status,
   ${f}."audioSeconds" as sec`;

/** The rows go into the log, keyed by call id. */
const INSERT_LOG_ROWS = `ins as (
  insert into spend_logs (call_id, request_id, call_type, api_key, key_alias, user_id, team_id, organization_id, end_user,
    model, model_group, provider, model_id, upstream_model, spend, prompt_tokens, completion_tokens, total_tokens,
    cache_read_input_tokens, cache_creation_input_tokens, reasoning_tokens, start_time, end_time, completion_start_time,
    status, stream, cache_hit, request_tags, metadata, audio_seconds)
  select "callId", "requestId", "callType", "apiKey", "keyAlias", "userId", "teamId", "organizationId", "endUser",
    model, "modelGroup", provider, "modelId", "upstreamModel", "spendPico" / 1000000000000, "promptTokens", "completionTokens",
    "promptTokens" + "completionTokens", "cacheReadTokens", "cacheCreationTokens", "reasoningTokens",
    ${at('"startTime"')}, ${at('"endTime"')}, ${at('"completionStartTime"')}, status, stream, "cacheHit",
    tags, coalesce(metadata, '{}'), "audioSeconds"
  from input
  on conflict (call_id) do nothing
  returning call_id
)`;

/** With the log off (`disable_spend_logs`): only the call ids, so a batch written twice still counts once. */
const INSERT_CALL_IDS = `ins as (
  insert into spend_calls (call_id) select "callId" from input
  on conflict (call_id) do nothing
  returning call_id
)`;

/**
 * One statement per batch, atomic without a client-side transaction. Parameters: $1 the rows as
 * JSON, $2 their number, $3 the counter deltas and $4 the daily aggregates summed in memory for
 * the whole batch. When every row is new ($2 rows inserted, the normal case) those sums are
 * applied; when some rows had been written before (a replayed spill file, a retried batch), they
 * are ignored and the store derives counters and aggregates from exactly the rows it inserted.
 * A row's pico-dollars are read as numeric, never bigint: one call may cost more than 2^63 of them
 * (about $9.2 million; prices up to $1 a token times 2^30 - 1 tokens), and the store refused it.
 */
const statement = (INSERT: string) => `
with input as (
  select r->>0 as "callId", r->>1 as "requestId", r->>2 as "callType", r->>3 as "apiKey", r->>4 as "keyAlias", r->>5 as "userId",
    r->>6 as "teamId", r->>7 as "organizationId", r->>8 as "endUser", r->>9 as model, r->>10 as "modelGroup", r->>11 as provider,
    r->>12 as "modelId", r->>13 as "upstreamModel", (r->>14)::numeric as "spendPico", (r->>15)::int as "promptTokens",
    (r->>16)::int as "completionTokens", (r->>17)::int as "cacheReadTokens", (r->>18)::int as "cacheCreationTokens",
    (r->>19)::int as "reasoningTokens", (r->>20)::bigint as "startTime", (r->>21)::bigint as "endTime",
    (r->>22)::bigint as "completionStartTime", r->>23 as status, (r->>24)::boolean as stream, (r->>25)::boolean as "cacheHit",
    array(select jsonb_array_elements_text(r->26)) as tags, nullif(r->27, 'null'::jsonb) as metadata, r->28 as charges,
    (r->>29)::numeric / 1000000000000 as "audioSeconds"
  from jsonb_array_elements($1::jsonb) as r
),
${INSERT},
fast as (select count(*) = $2::int as ok from ins),
fresh as (select i.* from input i join ins on ins.call_id = i."callId" where not (select ok from fast)),
charge as (
  select c->>0 as t, c->>1 as id, coalesce((c->>2)::bigint, -1) as p, f."spendPico" as pico, f."endTime" as ended
  from fresh f cross join lateral jsonb_array_elements(f.charges) as c
),
latest as (select t, id, max(p) as p from charge group by t, id),
delta as (
  ${deltaInput("$3")} where (select ok from fast)
  union all
  select c.t, c.id, case when l.p = -1 then null else ${at("l.p")} end, sum(c.pico) / 1000000000000, null::bigint,
    min(c.ended), jsonb_agg(jsonb_build_array(c.ended, c.pico / 1000000000000))
  from charge c join latest l on l.t = c.t and l.id = c.id and c.p = l.p
  group by c.t, c.id, l.p
),
${LOCK_ORDER.map((t, i) => LOCKED_COUNTER_UPDATES[t](LOCK_ORDER[i - 1])).join(",\n")},
${periodSpendUpsert(LOCK_ORDER.at(-1))},
entity as (
  select e.type, e.id, e.key, e.model, e.grp, ${metrics("f")}, e.team
  from fresh f cross join lateral (values
    ('key', f."apiKey", f."apiKey", f."upstreamModel", f."modelGroup", coalesce(f."teamId", '')),
    ('team', coalesce(f."teamId", ''), f."apiKey", f."upstreamModel", f."modelGroup", ''),
    ('org', f."organizationId", f."apiKey", f."upstreamModel", f."modelGroup", ''),
    ('user', f."userId", f."apiKey", f."upstreamModel", f."modelGroup", coalesce(f."teamId", '')),
    ('end_user', f."endUser", f."apiKey", f."upstreamModel", f."modelGroup", coalesce(f."teamId", '')),
    ('model', f."modelGroup", '', f."upstreamModel", f."modelGroup", ''),
    ('provider', f.provider, '', '', '', '')) as e(type, id, key, model, grp, team)
  where e.id is not null
  union all
  select 'tag', tg.tag, f."apiKey", f."upstreamModel", f."modelGroup", ${metrics("f")}, ''
  from fresh f cross join lateral (select distinct unnest(f.tags) as tag) tg
),
daily_rows as (
  ${dailyInput("$4")} where (select ok from fast)
  union all
  select type, id, day, key, model, grp, provider, team, sum(pt), sum(ct), sum(cr), sum(cc), sum(spend), count(*),
    count(*) filter (where status = 'success'), count(*) filter (where status <> 'success'), sum(sec)
  from entity group by type, id, day, key, model, grp, provider, team
),
${DAILY_UPSERT}
select (select count(*) from ins)::int as inserted`;

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
  /** Picoseconds of audio; null while no call had any (SpendEntry.audioPicoseconds). */
  sec: bigint | null;
  /** Each call's end (ms) and cost, for counters set by hand since some of them ended (HAND_SET). */
  calls: [number, bigint][];
}

const DAY_MS = 86_400_000;

/** Audio seconds summed as the store sums them: null only while neither side has any. */
const addSeconds = (a: bigint | null, b: bigint | null): bigint | null => (a === null ? b : b === null ? a : a + b);

/** A nullable value in a group's signature: null, and any text (prefixed), never look alike. */
const orNull = (v: string | null): string => (v === null ? "\u0001" : `\u0002${v}`);

/**
 * A batch's rows summed as they are queued: each call pays for its own share as it ends, so
 * writing a batch of a thousand rows does not hold the event loop for milliseconds grouping them.
 */
export class BatchSums {
  private readonly groups = new Map<string, RowGroup>();

  add(e: SpendEntry): void {
    const dayNo = Math.floor(e.startTime / DAY_MS);
    // Stored text holds no NUL, so NUL separates; null is marked apart from the text "null", and
    // the tag count keeps [] apart from [""].
    let sig = `${e.apiKey}\u0000${orNull(e.teamId)}\u0000${orNull(e.organizationId)}\u0000${orNull(e.userId)}\u0000${orNull(e.endUser)}\u0000${e.upstreamModel}\u0000${e.modelGroup}\u0000${e.provider}\u0000${dayNo}\u0000${e.tags.length}\u0000${e.tags.join("\u0000")}`;
    for (const c of e.charges) sig += `\u0000${c.periodEnd}`;
    let g = this.groups.get(sig);
    if (!g) {
      g = { sample: e, day: dayOf(e.startTime), n: 0, ok: 0, failed: 0, pt: 0, ct: 0, cr: 0, cc: 0, spend: 0n, sec: null, calls: [] };
      this.groups.set(sig, g);
    }
    g.n++;
    // A cancelled call (the client left) is not a success: every call is one or the other.
    if (e.status === "success") g.ok++;
    else g.failed++;
    g.pt += e.promptTokens;
    g.ct += e.completionTokens;
    g.cr += e.cacheReadTokens;
    g.cc += e.cacheCreationTokens;
    g.spend += BigInt(e.spendPico);
    g.sec = addSeconds(g.sec, e.audioPicoseconds == null ? null : BigInt(e.audioPicoseconds));
    g.calls.push([e.endTime, BigInt(e.spendPico)]);
  }

  get rowGroups(): RowGroup[] {
    return [...this.groups.values()];
  }

  static of(entries: readonly SpendEntry[]): BatchSums {
    const sums = new BatchSums();
    for (const e of entries) sums.add(e);
    return sums;
  }
}

/**
 * Per counter, the spend of the latest period present (an older period's spend stays in the log
 * only). Two ends a write moved apart (not whole periods apart) are one period: summed, under the
 * later end.
 */
function counterDeltas(groups: RowGroup[]): CounterDelta[] {
  const out = new Map<string, SummedDelta>();
  for (const g of groups) {
    for (const c of g.sample.charges) {
      const k = `${c.table}\u0000${c.id}`;
      const cur = out.get(k);
      const p = c.periodEnd ?? -1;
      const ms = c.periodMs ?? null;
      const fresh = (): SummedDelta => ({ t: c.table, id: c.id, p: c.periodEnd, ms, amount: g.spend, groups: [g] });
      if (!cur) out.set(k, fresh());
      else if (p === (cur.p ?? -1)) addGroup(cur, g);
      else if (cur.p !== null && c.periodEnd !== null && !wholePeriodsApart(c.periodEnd, cur.p, ms ?? cur.ms)) {
        addGroup(cur, g);
        if (c.periodEnd > cur.p) Object.assign(cur, { p: c.periodEnd, ms });
      } else if (p > (cur.p ?? -1)) out.set(k, fresh());
    }
  }
  return [...out.values()].map(({ groups: summed, ...d }) => ({ ...d, amount: picoToText(d.amount), ...(HAND_SET.has(d.t) ? callsOf(summed) : {}) }));
}

interface CounterDelta {
  t: ChargeTable;
  id: string;
  p: number | null;
  ms: number | null;
  amount: string;
  /** HAND_SET only: the earliest end of the calls summed, and each call's [end ms, amount]. */
  f?: number;
  s?: [number, string][];
}

type SummedDelta = Omit<CounterDelta, "amount" | "f" | "s"> & { amount: bigint; groups: RowGroup[] };

function addGroup(d: SummedDelta, g: RowGroup): void {
  d.amount += g.spend;
  d.groups.push(g);
}

/** The calls of `groups`, as amountAfterSet reads them. */
function callsOf(groups: RowGroup[]): { f: number; s: [number, string][] } {
  const s: [number, string][] = [];
  let f = Number.POSITIVE_INFINITY;
  for (const g of groups) {
    for (const [end, pico] of g.calls) {
      s.push([end, picoToText(pico)]);
      if (end < f) f = end;
    }
  }
  return { f, s };
}

interface DailyRow {
  type: string;
  id: string;
  day: string;
  key: string;
  model: string;
  grp: string;
  provider: string;
  team: string;
  pt: number;
  ct: number;
  cr: number;
  cc: number;
  spend: bigint;
  n: number;
  ok: number;
  failed: number;
  sec: bigint | null;
}

function dailyRows(groups: RowGroup[]) {
  const out = new Map<string, DailyRow>();
  const add = (g: RowGroup, type: string, id: string | null, key: string, model: string, grp: string, team = "") => {
    if (id === null) return;
    const e = g.sample;
    const k = `${type}\u0000${id}\u0000${g.day}\u0000${key}\u0000${model}\u0000${grp}\u0000${e.provider}\u0000${team}`;
    const d = out.get(k);
    if (!d) {
      out.set(k, { type, id, day: g.day, key, model, grp, provider: e.provider, team, pt: g.pt, ct: g.ct, cr: g.cr, cc: g.cc, spend: g.spend, n: g.n, ok: g.ok, failed: g.failed, sec: g.sec });
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
    d.sec = addSeconds(d.sec, g.sec);
  };
  for (const g of groups) {
    const e = g.sample;
    // Key, user and end-user rows carry the team the call was made in: reports filtered by one
    // of them tell a key's spend in one team from its spend in another.
    const team = e.teamId ?? "";
    for (const [type, id] of [
      ["key", e.apiKey],
      ["user", e.userId],
      ["end_user", e.endUser],
    ] as const) {
      add(g, type, id, e.apiKey, e.upstreamModel, e.modelGroup, team);
    }
    // Calls without a team get a team row too (id ''): the team report then reads one entity type.
    add(g, "team", team, e.apiKey, e.upstreamModel, e.modelGroup);
    add(g, "org", e.organizationId, e.apiKey, e.upstreamModel, e.modelGroup);
    for (const tag of new Set(e.tags)) add(g, "tag", tag, e.apiKey, e.upstreamModel, e.modelGroup);
    add(g, "model", e.modelGroup, "", e.upstreamModel, e.modelGroup);
    add(g, "provider", e.provider, "", "", "");
  }
  // Picoseconds are written as seconds the way pico-dollars are written as dollars.
  return [...out.values()].map((d) => ({ ...d, spend: picoToText(d.spend), sec: d.sec === null ? null : picoToText(d.sec) }));
}

type StatementParts = [string, string, string, string, string];
/** The statement around its parameters, for the log rows and for call ids only. */
const PARTS = {
  rows: statement(INSERT_LOG_ROWS).split(/\$\d/) as StatementParts,
  ids: statement(INSERT_CALL_IDS).split(/\$\d/) as StatementParts,
};

/** A row as the statement reads it: an array (half the JSON of an object with names). */
function rowArray(e: SpendEntry): unknown[] {
  return [
    e.callId, e.requestId, e.callType, e.apiKey, e.keyAlias, e.userId, e.teamId, e.organizationId, e.endUser, e.model, e.modelGroup,
    e.provider, e.modelId, e.upstreamModel, e.spendPico, e.promptTokens, e.completionTokens, e.cacheReadTokens, e.cacheCreationTokens,
    e.reasoningTokens, e.startTime, e.endTime, e.completionStartTime, e.status, e.stream, e.cacheHit, e.tags,
    Object.keys(e.metadata).length > 0 ? e.metadata : null, e.charges.map((c) => [c.table, c.id, c.periodEnd]), e.audioPicoseconds ?? null,
  ];
}

const sumsStatements = new Map<string, string>();

/**
 * Applies a batch's in-memory sums ($1 counter deltas, $2 daily aggregates) after its rows were
 * bulk loaded: only the counters the batch charges, so a batch without budgets touches none.
 * A statement with fewer parts plans in a fraction of the time; one text per set of tables.
 */
function sumsStatement(tables: ReadonlySet<ChargeTable>): string {
  const parts = COUNTER_TABLES.filter((t) => tables.has(t));
  const periods = tables.has("period");
  const cacheKey = `${parts.join(",")}${periods ? "+period" : ""}`;
  let text = sumsStatements.get(cacheKey);
  if (text === undefined) {
    text = `with
delta as (${deltaInput("$1")}),
daily_rows as (${dailyInput("$2")}),
${[...parts.map((t) => COUNTER_UPDATES[t]), ...(periods ? [periodSpendUpsert()] : []), DAILY_UPSERT].join(",\n")}
select 1`;
    sumsStatements.set(cacheKey, text);
  }
  return text;
}

/** What the writer already made of a batch while its calls were queued. */
export interface PreparedBatch {
  /** The rows in COPY text (`copyRows`). */
  copyText?: string;
  /** False (`disable_spend_logs`): no log rows, only the call ids that keep the batch exactly once. */
  logRows?: boolean;
  /** The rows' sums, exactly those of `batch`. */
  sums?: BatchSums;
}

/** What a batch is written to: the store's SQL, and its bulk load where it has one. */
export type SpendStore = Pick<Store, "db" | "copyIn">;

/**
 * Writes a batch: the rows (keyed by call id), then the counters and daily aggregates of exactly
 * the rows that were new, in one statement. Returns how many rows were new.
 *
 * Where the store has a bulk load (the embedded store) the rows are loaded with COPY and the
 * statement, given no rows, applies the batch's in-memory sums in the same transaction: about
 * half the store's work per row. COPY refuses a batch holding a row that is already stored (a
 * replayed spill file, a retry after a lost answer); that batch then takes the statement's path,
 * which keeps only the new rows.
 */
export async function writeBatch(store: SpendStore, batch: SpendEntry[], prepared: PreparedBatch = {}): Promise<number> {
  if (batch.length === 0) return 0;
  const { copyText, logRows = true } = prepared;
  const groups = (prepared.sums ?? BatchSums.of(batch)).rowGroups;
  const counterDelta = counterDeltas(groups);
  const deltas = storableJson(counterDelta);
  const daily = storableJson(dailyRows(groups));
  if (store.copyIn) {
    try {
      const sums = sumsStatement(new Set(counterDelta.map((d) => d.t)));
      const load = logRows
        ? { table: "spend_logs", columns: SPEND_LOG_COLUMNS, text: copyText ?? copyRows(batch) }
        : { table: "spend_calls", columns: ["call_id"], text: copyIds(batch) };
      await store.copyIn(load, { sql: sums, params: [deltas, daily] });
      return batch.length;
    } catch {
      // Rolled back as a whole; the statement below decides row by row.
    }
  }
  const [S1, S2, S3, S4, S5] = logRows ? PARTS.rows : PARTS.ids;
  const [row] = await rows<{ inserted: number }>(
    store.db,
    sql`${sql.raw(S1)}${storableJson(batch.map(rowArray))}${sql.raw(S2)}${batch.length}${sql.raw(S3)}${deltas}${sql.raw(S4)}${daily}${sql.raw(S5)}`,
  );
  return row?.inserted ?? 0;
}
