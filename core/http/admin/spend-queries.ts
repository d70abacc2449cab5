/**
 * What the spend routes share: their query parameters (dates, keys, team scope; bad values are a
 * 422 naming the parameter, missing required ones a 400), and the reads of the daily aggregates
 * (`daily_spend`) the reports are built from. Reports never scan the spend log; only the log
 * endpoints (`/spend/logs`, `/spend/logs/v2`) read `spend_logs`, by its time index.
 *
 * Money is summed in SQL as exact `numeric`, carried as bigint pico-dollars, and turned into a
 * JSON number once, at the end.
 */
import { arrayOverlaps, inArray, or, type SQL, sql } from "drizzle-orm";
import type { PgColumn } from "drizzle-orm/pg-core";
import { badRequest, forbidden, missingQuery } from "../../authz.ts";
import { columnToPico, exactUsdJson, type Pico, picoToText } from "../../cost/money.ts";
import { GatewayError } from "../../errors.ts";
import { tokenOf } from "../../identity/keys.ts";
import { booleanParam, list, pageOf } from "../../identity/paging.ts";
import type { Logger } from "../../contract.ts";
import type { Db } from "../../store/db.ts";
import { organizations, teams, virtualKeys } from "../../store/schema.ts";
import { rows } from "../../store/sql.ts";
import type { AdminCtx } from "./context.ts";
import { dayOf } from "../../spend/flush.ts";
import { type Bytes, joinedParts, partsByDay, reuseDays } from "./day-cache.ts";
import { quote } from "./json-text.ts";

export function invalidParam(name: string, message: string): GatewayError {
  return GatewayError.of(422, `Invalid request: ${name}: ${message}`, "validation_error", name);
}

export const DAY_MS = 86_400_000;
/** Longest range a zero-filled day-by-day answer may cover. */
export const MAX_FILLED_DAYS = 3660;
const DATE = /^(\d{4})-(\d{2})-(\d{2})$/;
const INSTANT = /^(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2})(?::(\d{2})(\.\d{1,6})?)?(Z|[+-]00:?00)?)?$/;

/** The first day the stores know: PostgreSQL has no year 0 (JS has, as 1 BC). */
const FIRST_DAY = "0001-01-01";
const FIRST_DAY_MS = Date.parse(`${FIRST_DAY}T00:00:00Z`);

/**
 * A calendar date (UTC), or undefined when the text is not one (2024-02-30 is not). Set with
 * setUTCFullYear: Date.UTC takes years 0–99 for 1900–1999.
 */
function utcDay(y: string, m: string, d: string): number | undefined {
  const back = new Date(0);
  const ms = back.setUTCFullYear(Number(y), Number(m) - 1, Number(d));
  return back.getUTCFullYear() === Number(y) && back.getUTCMonth() === Number(m) - 1 && back.getUTCDate() === Number(d) ? ms : undefined;
}

/** A date the text names, refused with a 400 before the first day the stores know. */
function knownDay(name: string, y: string, m: string, d: string): number | undefined {
  const ms = utcDay(y, m, d);
  if (ms !== undefined && ms < FIRST_DAY_MS) throw badRequest(`${name} must be from ${FIRST_DAY} to 9999-12-31 (the year 0 is not one).`, name);
  return ms;
}

/** A `YYYY-MM-DD` query parameter. */
export function dateParam(ctx: AdminCtx, name: string): string | undefined {
  const v = ctx.query(name);
  if (v === undefined || v === "") return undefined;
  const m = DATE.exec(v);
  if (!m || knownDay(name, m[1]!, m[2]!, m[3]!) === undefined) throw invalidParam(name, `Expected a date as YYYY-MM-DD, got ${JSON.stringify(v)}`);
  return v;
}

export interface DateRange {
  start?: string;
  end?: string;
}

/** `start_date` and `end_date` (YYYY-MM-DD, both inclusive); `required` makes a missing one a 400. */
export function dateRange(ctx: AdminCtx): DateRange {
  const start = dateParam(ctx, "start_date");
  const end = dateParam(ctx, "end_date");
  if (start && end && end < start) throw badRequest(`end_date (${end}) is before start_date (${start}).`, "end_date");
  return { start, end };
}

/**
 * A report's days, both dates optional (as the spec has them; LiteLLM requires both): a missing
 * end is today (UTC), a missing start `days - 1` days before the end.
 */
export function reportDays(ctx: AdminCtx, days: number): Required<DateRange> {
  const { start, end } = dateRange(ctx);
  const last = end ?? dayOf(Date.now());
  return { start: start ?? dayOf(Math.max(Date.parse(`${last}T00:00:00Z`) - (days - 1) * DAY_MS, FIRST_DAY_MS)), end: last };
}

/** Every day from `start` to `end`, inclusive (400 past MAX_FILLED_DAYS). */
export function daysBetween(start: string, end: string): string[] {
  const from = Date.parse(`${start}T00:00:00Z`);
  const to = Date.parse(`${end}T00:00:00Z`);
  const n = Math.round((to - from) / DAY_MS) + 1;
  if (n > MAX_FILLED_DAYS) throw badRequest(`The date range covers ${n} days; at most ${MAX_FILLED_DAYS} are answered day by day.`, "end_date");
  return Array.from({ length: n }, (_, i) => dayOf(from + i * DAY_MS));
}

/**
 * `column` is before the end of the UTC day that starts at `day`. The end, the next midnight, is
 * computed by the store: after 9999-12-31 it is in year 10000, which JS writes as `+010000-…` and
 * neither store reads.
 */
export function beforeEndOfDay(column: PgColumn, day: Date): SQL {
  return sql`${column} < ${day.toISOString()}::timestamptz + interval '24 hours'`;
}

/**
 * An instant given as `YYYY-MM-DD` or `YYYY-MM-DD HH:MM:SS` (UTC), `wholeDay` when it is a bare
 * date (`at` is then its midnight). As the end of a range, a bare date means the whole of that day.
 */
export function instantParam(ctx: AdminCtx, name: string, end: boolean): { at: Date; wholeDay: boolean } | undefined {
  const v = ctx.query(name);
  if (v === undefined || v === "") return undefined;
  const m = INSTANT.exec(v.trim());
  const day = m ? knownDay(name, m[1]!, m[2]!, m[3]!) : undefined;
  const [h, min, s] = [Number(m?.[4] ?? 0), Number(m?.[5] ?? 0), Number(m?.[6] ?? 0)];
  if (!m || day === undefined || h > 23 || min > 59 || s > 59) throw invalidParam(name, `Expected YYYY-MM-DD or YYYY-MM-DD HH:MM:SS (UTC), got ${JSON.stringify(v)}`);
  if (m[4] === undefined) return { at: new Date(day), wholeDay: true };
  // Times are kept to the millisecond: a finer start is rounded up and a finer end down, so the
  // range never takes in an instant outside the one asked for.
  const digits = (m[7] ?? ".").slice(1).padEnd(6, "0");
  const ms = Number(digits.slice(0, 3));
  const finer = Number(digits.slice(3)) > 0;
  const frac = finer && !end ? ms + 1 : ms;
  return { at: new Date(day + ((h * 60 + min) * 60 + s) * 1000 + frac), wholeDay: false };
}

/** A number parameter (min_spend, max_spend). */
export function numberParam(ctx: AdminCtx, name: string): number | undefined {
  const v = ctx.query(name);
  if (v === undefined || v === "") return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw invalidParam(name, `Expected a number, got ${JSON.stringify(v)}`);
  return n;
}

/** An integer parameter from 1 to `max` (limit). */
export function limitParam(ctx: AdminCtx, name: string, fallback: number | undefined, max: number): number | undefined {
  const v = ctx.query(name);
  if (v === undefined || v === "") return fallback;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > max) throw invalidParam(name, `Expected an integer from 1 to ${max}`);
  return n;
}

export function boolParam(ctx: AdminCtx, name: string, fallback: boolean): boolean {
  return booleanParam(ctx.query(name), name, fallback);
}

/** The `api_key` parameter as a hash: a plain `sk-…` key is hashed, anything else is the hash. */
export function keyParam(ctx: AdminCtx, name = "api_key"): string | undefined {
  const v = ctx.query(name);
  return v ? tokenOf(v) : undefined;
}

/**
 * The teams a Team Admin Allowed report may cover. Proxy admins and viewers: what they ask for
 * (undefined = everything). A team admin must name teams (`team_id` or the list parameter), all
 * of them its own; the same 403 answers a team it does not run and one that does not exist.
 */
export function teamScope(ctx: AdminCtx, listParam?: string): string[] | undefined {
  const single = ctx.query("team_id");
  const named = [...(single ? [single] : []), ...((listParam ? list(ctx.query, listParam) : undefined) ?? [])];
  const teams = named.length > 0 ? [...new Set(named)] : undefined;
  if (ctx.caller.canReadAll) return teams;
  if (ctx.caller.adminTeams().length === 0) throw forbidden("Only a proxy admin or a team admin may read spend.");
  if (!teams) throw missingQuery("team_id", ": name the team whose spend to read.");
  for (const t of teams) if (!ctx.caller.isTeamAdmin(t)) throw forbidden(`You are not an admin of team '${t}'.`);
  return teams;
}

/** A row value that is a number or its text (postgres.js and PGlite differ) → number. */
export const num = (v: unknown): number => (v === null || v === undefined ? 0 : Number(v));
export const pico = (v: unknown): Pico => columnToPico(v as string | null | undefined);

// ---- daily aggregates

/** Filters on `daily_spend` rows (alias `d`). */
export interface DailyFilter extends DateRange {
  entityType: string;
  entityIds?: string[];
  excludeIds?: string[];
  apiKey?: string;
  /** Matches the public model name or the upstream model. */
  model?: string;
}

const inList = (values: string[]): SQL => sql.join(
  values.map((v) => sql`${v}`),
  sql`, `,
);

export function dailyWhere(f: DailyFilter): SQL {
  const where: SQL[] = [sql`d.entity_type = ${f.entityType}`];
  // Team rows with id '' hold the calls of keys without a team (for the spend report), not a team.
  if (f.entityType === "team") where.push(sql`d.entity_id <> ''`);
  if (f.entityIds) where.push(f.entityIds.length ? sql`d.entity_id in (${inList(f.entityIds)})` : sql`false`);
  if (f.excludeIds?.length) where.push(sql`d.entity_id not in (${inList(f.excludeIds)})`);
  if (f.start) where.push(sql`d.date >= ${f.start}::date`);
  if (f.end) where.push(sql`d.date <= ${f.end}::date`);
  if (f.apiKey) where.push(sql`d.api_key = ${f.apiKey}`);
  if (f.model) where.push(sql`(d.model_group = ${f.model} or d.model = ${f.model})`);
  return sql.join(where, sql` and `);
}

/** Sums of the daily columns, as text (exact). */
const SUMS = sql`sum(d.spend)::text as spend, sum(d.prompt_tokens)::text as prompt_tokens, sum(d.completion_tokens)::text as completion_tokens,
  sum(d.cache_read_input_tokens)::text as cache_read, sum(d.cache_creation_input_tokens)::text as cache_creation,
  sum(d.api_requests)::text as api_requests, sum(d.successful_requests)::text as successful_requests, sum(d.failed_requests)::text as failed_requests`;

export interface SumRow {
  spend: string | null;
  prompt_tokens: string | number | null;
  completion_tokens: string | number | null;
  cache_read: string | number | null;
  cache_creation: string | number | null;
  api_requests: string | number | null;
  successful_requests: string | number | null;
  failed_requests: string | number | null;
}

export interface DailyRow extends SumRow {
  day: string;
  entity_id: string;
  api_key: string;
  model: string;
  model_group: string;
  provider: string;
}

/** The days with rows, newest first. */
export async function dailyDays(db: Db, f: DailyFilter): Promise<string[]> {
  const found = await rows<{ day: string }>(db, sql`select d.date::text as day from daily_spend d where ${dailyWhere(f)} group by d.date order by d.date desc`);
  return found.map((r) => r.day);
}

export async function dailyTotals(db: Db, f: DailyFilter): Promise<SumRow> {
  const [row] = await rows<SumRow>(db, sql`select ${SUMS} from daily_spend d where ${dailyWhere(f)}`);
  return row!;
}

/** The aggregate rows of `days` (one per entity, key, model and provider). */
export async function dailyRows(db: Db, f: DailyFilter, days: string[]): Promise<DailyRow[]> {
  if (days.length === 0) return [];
  return rows<DailyRow>(
    db,
    sql`select d.date::text as day, d.entity_id, d.api_key, d.model, d.model_group, d.provider, ${SUMS}
      from daily_spend d where ${dailyWhere(f)} and d.date in (${sql.join(
        days.map((x) => sql`${x}::date`),
        sql`, `,
      )})
      group by d.date, d.entity_id, d.api_key, d.model, d.model_group, d.provider`,
  );
}

/** A team's spend of a day per key and model group, with the key's user that day (null: none, or more than one). */
export interface TeamDayRow {
  day: string;
  api_key: string;
  model_group: string;
  spend: string;
  user_id: string | null;
}

/**
 * The spend of `teamIds` per day, key and model group, read from the team aggregates (so a key
 * that changed teams during a day counts for each team what it spent while in it), each with the
 * key's user that day when it had exactly one. `userId` keeps only that user's keys.
 */
export async function teamDayRows(db: Db, teamIds: string[], range: { start: string; end: string }, opts: { apiKey?: string; userId?: string } = {}): Promise<TeamDayRow[]> {
  if (teamIds.length === 0) return [];
  const where: SQL[] = [sql`t.entity_type = 'team'`, sql`t.entity_id in (${inList(teamIds)})`, sql`t.date >= ${range.start}::date`, sql`t.date <= ${range.end}::date`];
  if (opts.apiKey) where.push(sql`t.api_key = ${opts.apiKey}`);
  return rows<TeamDayRow>(
    db,
    sql`with team_rows as (
        select t.date, t.api_key, t.model_group, sum(t.spend) as spend from daily_spend t where ${sql.join(where, sql` and `)}
        group by t.date, t.api_key, t.model_group
      ), key_user as (
        select u.date, u.api_key, min(u.entity_id) as user_id from daily_spend u
        where u.entity_type = 'user' and u.date >= ${range.start}::date and u.date <= ${range.end}::date
        group by u.date, u.api_key having count(distinct u.entity_id) = 1
      )
      select r.date::text as day, r.api_key, r.model_group, r.spend::text as spend, ku.user_id
      from team_rows r left join key_user ku on ku.date = r.date and ku.api_key = r.api_key
      ${opts.userId ? sql`where ku.user_id = ${opts.userId}` : sql``}
      order by r.date`,
  );
}

/**
 * Rows for `/global/spend/report` and `/spend/logs?summarize=true`: the amounts of `base` per
 * (day, entity, key, model group, team), the team being the one the calls were made in (null: the
 * key had none). `teamIds` keeps those teams' calls; `userId` keeps only the keys that user spent with.
 */
export interface AttributedRow extends SumRow {
  /** Seconds of audio (exact text); null while none of the calls had any. */
  audio_seconds: string | null;
  day: string;
  entity_id: string;
  api_key: string;
  model_group: string;
  team_id: string | null;
  team_alias: string | null;
}

export async function attributedRows(db: Db, base: DailyFilter, opts: { teamIds?: string[]; userId?: string } = {}): Promise<AttributedRow[]> {
  const where: SQL[] = [dailyWhere(base)];
  if (opts.userId && base.entityType !== "user") {
    where.push(sql`exists (select 1 from daily_spend u where u.entity_type = 'user' and u.entity_id = ${opts.userId} and u.date = d.date and u.api_key = d.api_key)`);
  }
  if (opts.teamIds) where.push(opts.teamIds.length ? sql`d.team_id in (${inList(opts.teamIds)})` : sql`false`);
  return rows<AttributedRow>(
    db,
    sql`with base as (
        select d.date, d.entity_id, d.api_key, d.model_group, d.team_id, ${SUMS}, sum(d.audio_seconds)::text as audio_seconds
        from daily_spend d where ${sql.join(where, sql` and `)}
        group by d.date, d.entity_id, d.api_key, d.model_group, d.team_id
      )
      select b.date::text as day, b.entity_id, b.api_key, b.model_group, b.spend, b.prompt_tokens, b.completion_tokens, b.cache_read, b.cache_creation,
        b.api_requests, b.successful_requests, b.failed_requests, b.audio_seconds, nullif(b.team_id, '') as team_id, tm.team_alias
      from base b
      left join teams tm on tm.team_id = b.team_id
      order by b.date`,
  );
}

// ---- metrics

/** Running sums of one slice of activity. */
export interface Metrics {
  spend: Pico;
  prompt: number;
  completion: number;
  cacheRead: number;
  cacheCreation: number;
  requests: number;
  ok: number;
  failed: number;
}

export const emptyMetrics = (): Metrics => ({ spend: 0n, prompt: 0, completion: 0, cacheRead: 0, cacheCreation: 0, requests: 0, ok: 0, failed: 0 });

/** One row's sums, parsed once (a row is added to several slices). */
export function rowMetrics(r: SumRow): Metrics {
  return {
    spend: pico(r.spend),
    prompt: num(r.prompt_tokens),
    completion: num(r.completion_tokens),
    cacheRead: num(r.cache_read),
    cacheCreation: num(r.cache_creation),
    requests: num(r.api_requests),
    ok: num(r.successful_requests),
    failed: num(r.failed_requests),
  };
}

function sameMetrics(a: Metrics, b: Metrics): boolean {
  return (
    a.spend === b.spend &&
    a.prompt === b.prompt &&
    a.completion === b.completion &&
    a.cacheRead === b.cacheRead &&
    a.cacheCreation === b.cacheCreation &&
    a.requests === b.requests &&
    a.ok === b.ok &&
    a.failed === b.failed
  );
}

function addInto(m: Metrics, x: Metrics): Metrics {
  m.spend += x.spend;
  m.prompt += x.prompt;
  m.completion += x.completion;
  m.cacheRead += x.cacheRead;
  m.cacheCreation += x.cacheCreation;
  m.requests += x.requests;
  m.ok += x.ok;
  m.failed += x.failed;
  return m;
}

export function addMetrics(m: Metrics, r: SumRow): Metrics {
  return addInto(m, rowMetrics(r));
}

/** The spec's daily-activity metrics object. */
export function metricsApi(m: Metrics) {
  return {
    spend: exactUsdJson(m.spend),
    prompt_tokens: m.prompt,
    completion_tokens: m.completion,
    cache_read_input_tokens: m.cacheRead,
    cache_creation_input_tokens: m.cacheCreation,
    total_tokens: m.prompt + m.completion,
    successful_requests: m.ok,
    failed_requests: m.failed,
    api_requests: m.requests,
  };
}

/** `metricsApi(m)` as JSON text, same members in the same order. */
function metricsText(m: Metrics): string {
  return (
    `{"spend":${picoToText(m.spend)},"prompt_tokens":${m.prompt},"completion_tokens":${m.completion},` +
    `"cache_read_input_tokens":${m.cacheRead},"cache_creation_input_tokens":${m.cacheCreation},"total_tokens":${m.prompt + m.completion},` +
    `"successful_requests":${m.ok},"failed_requests":${m.failed},"api_requests":${m.requests}}`
  );
}

// ---- /team/daily/activity, /organization/daily/activity

/** The JSON of a day part: bump when it changes, so parts stored by an older version are not served. */
const ACTIVITY_PART_FORMAT = 2; // 2: amounts exact (1 wrote the nearest double)

/** One slice of a day's breakdown, with its per-key split. */
interface Slice {
  m: Metrics;
  keys: Map<string, Metrics>;
}

function slice(map: Map<string, Slice>, k: string, apiKey: string, x: Metrics): void {
  let s = map.get(k);
  if (!s) {
    s = { m: emptyMetrics(), keys: new Map() };
    map.set(k, s);
  }
  addInto(s.m, x);
  let km = s.keys.get(apiKey);
  if (!km) {
    km = emptyMetrics();
    s.keys.set(apiKey, km);
  }
  addInto(km, x);
}

interface Day {
  m: Metrics;
  models: Map<string, Slice>;
  groups: Map<string, Slice>;
  providers: Map<string, Slice>;
  keys: Map<string, Metrics>;
  entities: Map<string, Slice>;
}

/**
 * The spec's daily activity: `{results: [{date, total_spend, total_tokens, total_requests, metrics,
 * breakdown: {models, model_groups, providers, api_keys, entities}}], metadata: {total_*, page,
 * total_pages, has_more}}`. Pages are of days, newest first; the totals cover every page. Each
 * breakdown entry is `{metrics, metadata, api_key_breakdown: {<key hash>: {metrics, metadata}}}`
 * (api_keys entries have no split); key metadata is `{key_alias, team_id}`. In the spec's team-key
 * use (a team's key naming its team as `team_id`), the records alone, as an array.
 */
export async function dailyActivity(ctx: AdminCtx, kind: "team" | "org") {
  let include: string[] | undefined;
  let exclude: string[] | undefined;
  if (kind === "team") {
    include = teamScope(ctx, "team_ids");
    exclude = list(ctx.query, "exclude_team_ids");
  } else {
    ctx.caller.requireReadAll();
    const named = [...(list(ctx.query, "organization_ids") ?? []), ...(ctx.query("organization_id") ? [ctx.query("organization_id")!] : [])];
    include = named.length ? [...new Set(named)] : undefined;
    exclude = list(ctx.query, "exclude_organization_ids");
  }
  const range = dateRange(ctx);
  const p = pageOf(ctx.query, 50, 1000);
  const f: DailyFilter = { entityType: kind, entityIds: include, excludeIds: exclude, ...range, model: ctx.query("model") || undefined, apiKey: keyParam(ctx) };
  const days = await dailyDays(ctx.db, f);
  // The spec's team-key use (a team's key, not a proxy admin, naming its team as `team_id`): an
  // array of the daily activity records, every day of the range unless a page is asked for,
  // without the paginated answer's totals.
  if (kind === "team" && !ctx.caller.canReadAll && ctx.query("team_id") && !ctx.query("team_ids")) {
    const asked = ctx.query("page") !== undefined || ctx.query("page_size") !== undefined;
    const listed = asked ? days.slice(p.offset, p.offset + p.pageSize) : days;
    const parts = await activityParts(ctx.db, ctx.log, kind, f, listed);
    return new Response(joinedParts("[", listed.flatMap((day) => parts.get(day) ?? []), "]"), { headers: { "content-type": "application/json" } });
  }
  const pageDays = days.slice(p.offset, p.offset + p.pageSize);
  // The totals (every page) are summed by the store while the page's parts are found or built.
  const totalling = dailyTotals(ctx.db, f);
  const [parts, totals] = await Promise.all([activityParts(ctx.db, ctx.log, kind, f, pageDays), totalling]);
  const results = pageDays.flatMap((day) => parts.get(day) ?? []);
  const all = metricsApi(addMetrics(emptyMetrics(), totals));
  const totalPages = Math.ceil(days.length / p.pageSize);
  const metadata = {
    total_spend: all.spend,
    total_prompt_tokens: all.prompt_tokens,
    total_completion_tokens: all.completion_tokens,
    total_cache_read_input_tokens: all.cache_read_input_tokens,
    total_cache_creation_input_tokens: all.cache_creation_input_tokens,
    total_tokens: all.total_tokens,
    total_api_requests: all.api_requests,
    total_successful_requests: all.successful_requests,
    total_failed_requests: all.failed_requests,
    page: p.page,
    total_pages: totalPages,
    has_more: p.page < totalPages,
  };
  // Day parts are JSON already (reused across calls, kept as bytes); the answer is assembled from them.
  return new Response(joinedParts(`{"results":[`, results, `],"metadata":${JSON.stringify(metadata)}}`), { headers: { "content-type": "application/json" } });
}

/**
 * The JSON part of each of `days` of a daily activity report under `f` (from memory, the store's
 * finished-day parts, or built; see day-cache.ts; `storeOnly`: see DayParts). Key aliases and
 * teams, team and org aliases are in the parts.
 */
export function activityParts(db: Db, log: Logger, kind: "team" | "org", f: DailyFilter, days: string[], storeOnly = false): Promise<Map<string, Bytes>> {
  // A day's part is the same whatever the date range around it: the range is not in its key.
  const partKey = JSON.stringify([`daily-activity/${ACTIVITY_PART_FORMAT}`, kind, f.entityIds, f.excludeIds, f.model, f.apiKey]);
  const build = async (missing: string[]): Promise<Map<string, Bytes>> => {
    const found = await dailyRows(db, f, missing);
    const byDay = new Map<string, Day>(missing.map((d) => [d, { m: emptyMetrics(), models: new Map(), groups: new Map(), providers: new Map(), keys: new Map(), entities: new Map() }]));
    for (const r of found) {
      const d = byDay.get(r.day);
      if (!d) continue;
      const x = rowMetrics(r);
      addInto(d.m, x);
      slice(d.models, r.model, r.api_key, x);
      slice(d.groups, r.model_group, r.api_key, x);
      slice(d.providers, r.provider, r.api_key, x);
      slice(d.entities, r.entity_id, r.api_key, x);
      addInto(d.keys.get(r.api_key) ?? d.keys.set(r.api_key, emptyMetrics()).get(r.api_key)!, x);
    }
    const keyMeta = await keyMetadata(db, [...new Set(found.map((r) => r.api_key))]);
    const entityMeta = await entityMetadata(db, kind, [...new Set(found.map((r) => r.entity_id))]);
    // Written as JSON text into one array per day, joined once: these parts reach tens of megabytes,
    // and building objects to stringify (or strings by `+=`, which stay ropes) costs several times more.
    const keyMetaText = new Map<string, string>();
    const keyMetaOf = (k: string) => {
      let text = keyMetaText.get(k);
      if (text === undefined) {
        text = JSON.stringify(keyMeta.get(k) ?? {});
        keyMetaText.set(k, text);
      }
      return text;
    };
    const keyEntry = (k: string, m: Metrics) => `${quote(k)}:{"metrics":${metricsText(m)},"metadata":${keyMetaOf(k)}}`;
    /** A key's entry in every breakdown of a day: most keys use one model, provider and entity a day, so the entry is the day's own. */
    let dayKeys = new Map<string, Metrics>();
    let dayEntries = new Map<string, string>();
    const entryOf = (k: string, m: Metrics) => {
      const whole = dayKeys.get(k);
      if (!whole || !sameMetrics(m, whole)) return keyEntry(k, m);
      let text = dayEntries.get(k);
      if (text === undefined) {
        text = keyEntry(k, whole);
        dayEntries.set(k, text);
      }
      return text;
    };
    const writeKeys = (w: string[], keys: Map<string, Metrics>) => {
      let sep = "{";
      for (const [k, m] of keys) {
        w.push(sep, entryOf(k, m));
        sep = ",";
      }
      w.push(sep === "{" ? "{}" : "}");
    };
    const writeSplits = (w: string[], map: Map<string, Slice>, meta?: Map<string, Record<string, unknown>>) => {
      let sep = "{";
      for (const [k, s] of map) {
        w.push(`${sep}${quote(k)}:{"metrics":${metricsText(s.m)},"metadata":${JSON.stringify(meta?.get(k) ?? {})},"api_key_breakdown":`);
        writeKeys(w, s.keys);
        w.push("}");
        sep = ",";
      }
      w.push(sep === "{" ? "{}" : "}");
    };
    return partsByDay([...byDay], (date, d) => {
      dayKeys = d.keys;
      dayEntries = new Map();
      const w: string[] = [
        `{"date":${quote(date)},"total_spend":${picoToText(d.m.spend)},"total_tokens":${d.m.prompt + d.m.completion},`,
        `"total_requests":${d.m.requests},"metrics":${metricsText(d.m)},"breakdown":{"models":`,
      ];
      writeSplits(w, d.models);
      w.push(`,"model_groups":`);
      writeSplits(w, d.groups);
      w.push(`,"providers":`);
      writeSplits(w, d.providers);
      w.push(`,"api_keys":`);
      writeKeys(w, d.keys);
      w.push(`,"entities":`);
      writeSplits(w, d.entities, entityMeta);
      w.push("}}");
      return w.join("");
    });
  };
  return reuseDays({ db, log, entityType: kind, span: days, report: partKey, holdsNames: true, build, storeOnly });
}

/**
 * Each token's key, as `{key_alias, team_id}`. Spend made before a key was rotated stays under the
 * token it had then: that token finds the key by the first token or the earlier ones the row keeps
 * (identity/rotation.ts), a key's current token before any of them.
 */
async function keyMetadata(db: Db, tokens: string[]): Promise<Map<string, Record<string, unknown>>> {
  if (tokens.length === 0) return new Map();
  const found = await db
    .select({ token: virtualKeys.token, firstToken: virtualKeys.firstToken, rotatedFrom: virtualKeys.rotatedFrom, keyAlias: virtualKeys.keyAlias, teamId: virtualKeys.teamId })
    .from(virtualKeys)
    .where(or(inArray(virtualKeys.token, tokens), inArray(virtualKeys.firstToken, tokens), arrayOverlaps(virtualKeys.rotatedFrom, tokens)));
  const out = new Map<string, Record<string, unknown>>();
  for (const k of found) {
    for (const earlier of [...(k.rotatedFrom ?? []), k.firstToken]) if (earlier && !out.has(earlier)) out.set(earlier, { key_alias: k.keyAlias, team_id: k.teamId });
  }
  for (const k of found) out.set(k.token, { key_alias: k.keyAlias, team_id: k.teamId });
  return out;
}

async function entityMetadata(db: Db, kind: "team" | "org", ids: string[]): Promise<Map<string, Record<string, unknown>>> {
  if (ids.length === 0) return new Map();
  if (kind === "team") {
    const found = await db.select({ id: teams.teamId, alias: teams.teamAlias }).from(teams).where(inArray(teams.teamId, ids));
    return new Map(found.map((t) => [t.id, { team_alias: t.alias }]));
  }
  const found = await db
    .select({ id: organizations.organizationId, alias: organizations.organizationAlias })
    .from(organizations)
    .where(inArray(organizations.organizationId, ids));
  return new Map(found.map((o) => [o.id, { organization_alias: o.alias }]));
}
