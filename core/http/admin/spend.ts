/**
 * Spend reports and logs. Levels: `/spend/logs`, `/spend/logs/v2` and `/team/daily/activity` are
 * Team Admin Allowed (a team admin names its own team and sees only that team's rows); everything
 * else is Global Admin Only (reads also for the admin viewer). Reports read the daily aggregates
 * (spend-queries.ts); the log endpoints read `spend_logs` by time.
 */
import { Type as T } from "@sinclair/typebox";
import { and, count, desc, eq, gte, inArray, isNull, lte, or, type SQL, sql } from "drizzle-orm";
import type { PgColumn, PgTable } from "drizzle-orm/pg-core";
import { Elysia } from "elysia";
import { badRequest } from "../../authz.ts";
import type { CounterTable, Deployment, Usage } from "../../contract.ts";
import { countableUsage } from "../../cost/countable-usage.ts";
import { estimatePromptTokens } from "../../cost/estimate.ts";
import { exactColumnJson, exactUsdJson, type Pico } from "../../cost/money.ts";
import { choice, list, pageOf } from "../../identity/paging.ts";
import { teamMemberId } from "../../identity/records.ts";
import { toApi } from "../../identity/serialize.ts";
import type { Snapshot } from "../../snapshot.ts";
import { StoreSpendHistory } from "../../spend/history.ts";
import { providerBudget } from "../../spend/history-budgets.ts";
import { LOCK_ORDER } from "../../spend/flush.ts";
import { counterId } from "../../spend/ledger.ts";
import { organizations, spendLogs, teamMembers, teams, users, virtualKeys } from "../../store/schema.ts";
import { rows, rowValues } from "../../store/sql.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";
import { spendReportJson } from "./spend-report.ts";
import {
  type AttributedRow,
  attributedRows,
  boolParam,
  type DailyFilter,
  dailyActivity,
  dateRange,
  daysBetween,
  beforeEndOfDay,
  DAY_MS,
  instantParam,
  keyParam,
  limitParam,
  num,
  numberParam,
  pico,
  reportDays,
  teamDayRows,
  teamScope,
} from "./spend-queries.ts";

const LOG_LIMIT = { fallback: 50, max: 100 };
const UNASSIGNED_TEAM = "Unassigned Team";

/** Adds `amount` to `map[k]` (pico-dollars). */
function bump(map: Map<string, Pico>, k: string, amount: Pico): void {
  map.set(k, (map.get(k) ?? 0n) + amount);
}
const usdMap = (map: Map<string, Pico>) => Object.fromEntries([...map].map(([k, v]) => [k, exactUsdJson(v)]));

function groupBy<R>(items: R[], keyOf: (r: R) => string): Map<string, R[]> {
  const out = new Map<string, R[]>();
  for (const r of items) {
    const k = keyOf(r);
    const list = out.get(k);
    if (list) list.push(r);
    else out.set(k, [r]);
  }
  return out;
}

const sumSpend = (rs: AttributedRow[]): Pico => rs.reduce((s, r) => s + pico(r.spend), 0n);
const bySpendDesc = <R extends { spend: Pico }>(a: R, b: R) => (a.spend === b.spend ? 0 : a.spend > b.spend ? -1 : 1);

// ---- /spend/logs and /spend/logs/v2

/** A spend-log row as the API returns it: its column names, spend a number, times ISO. */
function logApi(row: typeof spendLogs.$inferSelect): Record<string, unknown> {
  const { cacheReadTokens, cacheCreationTokens, audioSeconds, ...rest } = row;
  // The spec's metadata carries key_alias; the row keeps it (and status) in columns only. Stored
  // prompts are kept in the metadata column and shown as LiteLLM's `messages` and `response` ({} when not stored).
  const { messages = {}, response = {}, ...stored } = row.metadata ?? {};
  const metadata = { key_alias: row.keyAlias, status: row.status, ...stored };
  // Audio seconds are kept at the scale of money: written exactly, as spend is.
  const audio_seconds = audioSeconds === null ? null : exactColumnJson(audioSeconds);
  return { ...toApi(rest), metadata, messages, response, cache_read_input_tokens: cacheReadTokens, cache_creation_input_tokens: cacheCreationTokens, audio_seconds };
}

/** One day of `/spend/logs` summarized: its spend, and per model group and key, from `amounts`; per user, `people`. */
function summaryOfDay(day: string, amounts: readonly { model_group: string; api_key: string; spend: string | null }[], people: Map<string, Pico>) {
  const models = new Map<string, Pico>();
  const keys = new Map<string, Pico>();
  let total = 0n;
  for (const r of amounts) {
    const spend = pico(r.spend);
    total += spend;
    bump(models, r.model_group, spend);
    bump(keys, r.api_key, spend);
  }
  return { startTime: day, spend: exactUsdJson(total), users: usdMap(people), models: usdMap(models), api_keys: usdMap(keys) };
}

/**
 * `GET /spend/logs` (deprecated). With both dates and `summarize` (default true), one entry per
 * day from start_date to end_date, zero-filled:
 * `[{startTime: "YYYY-MM-DD", spend, users: {<user_id>: spend}, models: {<model group>: spend}, api_keys: {<key hash>: spend}}]`,
 * from the daily aggregates. Otherwise the log rows themselves, newest first, at most `limit`.
 */
async function spendLogsV1(ctx: AdminCtx) {
  const teamIds = teamScope(ctx);
  const range = dateRange(ctx);
  const summarize = boolParam(ctx, "summarize", true);
  const limit = limitParam(ctx, "limit", LOG_LIMIT.fallback, LOG_LIMIT.max)!;
  const requestId = ctx.query("request_id");
  const apiKey = keyParam(ctx);
  const userId = ctx.query("user_id");
  if (summarize && range.start && range.end && !requestId && teamIds) {
    // A team's view: from its own aggregates, exact for a key that changed teams during a day.
    const found = await teamDayRows(ctx.db, teamIds, { start: range.start, end: range.end }, { apiKey, userId });
    const byDay = groupBy(found, (r) => r.day);
    return daysBetween(range.start, range.end).map((day) => {
      const amounts = byDay.get(day) ?? [];
      const people = new Map<string, Pico>();
      for (const r of amounts) if (r.user_id !== null) bump(people, r.user_id, pico(r.spend));
      return summaryOfDay(day, amounts, people);
    });
  }
  if (summarize && range.start && range.end && !requestId) {
    const days = daysBetween(range.start, range.end);
    const base: DailyFilter = { entityType: userId ? "user" : "key", entityIds: userId ? [userId] : undefined, apiKey, ...range };
    const amounts = await attributedRows(ctx.db, base);
    const perUser = userId ? amounts : await attributedRows(ctx.db, { ...base, entityType: "user", entityIds: undefined });
    const byDay = groupBy(amounts, (r) => r.day);
    const usersByDay = groupBy(perUser, (r) => r.day);
    return days.map((day) => {
      const people = new Map<string, Pico>();
      for (const r of usersByDay.get(day) ?? []) bump(people, r.entity_id, pico(r.spend));
      return summaryOfDay(day, byDay.get(day) ?? [], people);
    });
  }
  const where: SQL[] = [];
  if (teamIds) where.push(inArray(spendLogs.teamId, teamIds));
  if (requestId) where.push(eq(spendLogs.requestId, requestId));
  if (apiKey) where.push(eq(spendLogs.apiKey, apiKey));
  if (userId) where.push(eq(spendLogs.userId, userId));
  if (range.start) where.push(gte(spendLogs.startTime, new Date(`${range.start}T00:00:00Z`)));
  if (range.end) where.push(beforeEndOfDay(spendLogs.startTime, new Date(`${range.end}T00:00:00Z`)));
  const found = await ctx.db
    .select()
    .from(spendLogs)
    .where(where.length ? and(...where) : undefined)
    .orderBy(desc(spendLogs.startTime), desc(spendLogs.callId))
    .limit(limit);
  return found.map(logApi);
}

/** `GET /spend/logs/v2`: `{data: [log rows], total, page, page_size, total_pages}`, newest first. */
async function spendLogsV2(ctx: AdminCtx) {
  const teamIds = teamScope(ctx);
  const start = instantParam(ctx, "start_date", false);
  const end = instantParam(ctx, "end_date", true);
  if (!start || !end) throw badRequest("Start date and end date are required (YYYY-MM-DD or YYYY-MM-DD HH:MM:SS, UTC).", start ? "end_date" : "start_date");
  // As /spend/logs and the reports answer it: a range that ends before it starts is a mistake, not
  // an empty page. (Bounds finer than a millisecond are rounded inward, which may cross them by 1 ms.)
  const endMs = end.wholeDay ? end.at.getTime() + DAY_MS : end.at.getTime();
  if (endMs < start.at.getTime() - 1) throw badRequest(`end_date (${ctx.query("end_date")}) is before start_date (${ctx.query("start_date")}).`, "end_date");
  const p = pageOf(ctx.query, 50, 100);
  const status = ctx.query("status_filter") ? choice(ctx.query, "status_filter", ["success", "failure", "cancelled"] as const, "success") : undefined;
  const minSpend = numberParam(ctx, "min_spend");
  const maxSpend = numberParam(ctx, "max_spend");
  const where: SQL[] = [gte(spendLogs.startTime, start.at), end.wholeDay ? beforeEndOfDay(spendLogs.startTime, end.at) : lte(spendLogs.startTime, end.at)];
  if (teamIds) where.push(inArray(spendLogs.teamId, teamIds));
  const apiKey = keyParam(ctx);
  if (apiKey) where.push(eq(spendLogs.apiKey, apiKey));
  const eqParams = [
    ["user_id", spendLogs.userId],
    ["request_id", spendLogs.requestId],
    ["key_alias", spendLogs.keyAlias],
    ["end_user", spendLogs.endUser],
  ] as const;
  for (const [name, column] of eqParams) {
    const v = ctx.query(name);
    if (v) where.push(eq(column, v));
  }
  const model = ctx.query("model");
  // The public model name, the name the client asked for, or the provider's model (as daily activity matches).
  if (model) where.push(or(eq(spendLogs.modelGroup, model), eq(spendLogs.model, model), eq(spendLogs.upstreamModel, model))!);
  if (status) where.push(eq(spendLogs.status, status));
  if (minSpend !== undefined) where.push(sql`${spendLogs.spend} >= ${String(minSpend)}::numeric`);
  if (maxSpend !== undefined) where.push(sql`${spendLogs.spend} <= ${String(maxSpend)}::numeric`);
  const filter = and(...where);
  const [[total], data] = await Promise.all([
    ctx.db.select({ n: count() }).from(spendLogs).where(filter),
    ctx.db.select().from(spendLogs).where(filter).orderBy(desc(spendLogs.startTime), desc(spendLogs.callId)).limit(p.pageSize).offset(p.offset),
  ]);
  const n = Number(total?.n ?? 0);
  return { data: data.map(logApi), total: n, page: p.page, page_size: p.pageSize, total_pages: Math.ceil(n / p.pageSize) };
}

// ---- /global/spend/report

interface Usage4 {
  cost: Pico;
  input: number;
  output: number;
  requests: number;
  /** Audio seconds in picoseconds (the columns' scale, read as money is); null: not an audio model. */
  seconds: bigint | null;
}

function usageOfRows(rs: AttributedRow[]): Map<string, Usage4> {
  const out = new Map<string, Usage4>();
  for (const r of rs) {
    const u = out.get(r.model_group) ?? { cost: 0n, input: 0, output: 0, requests: 0, seconds: null };
    u.cost += pico(r.spend);
    u.input += num(r.prompt_tokens);
    u.output += num(r.completion_tokens);
    u.requests += num(r.api_requests);
    if (r.audio_seconds !== null) u.seconds = (u.seconds ?? 0n) + pico(r.audio_seconds);
    out.set(r.model_group, u);
  }
  return out;
}

/** A model's entry in a key's `usage`, as the report's day parts write it (spend-report.ts modelUsageText). */
function modelUsage(u: Usage4): Record<string, unknown> {
  if (u.seconds !== null) return { cost: exactUsdJson(u.cost), seconds: exactUsdJson(u.seconds), requests: u.requests };
  return { cost: exactUsdJson(u.cost), input_tokens: u.input, output_tokens: u.output, requests: u.requests };
}

/**
 * One `group_by` dimension's entries of a day: `{<dim>, total_cost, total_input_tokens,
 * total_output_tokens, total_requests, model_details: [{model, total_cost, total_input_tokens,
 * total_output_tokens, requests}]}`, highest cost first.
 */
function dimensionEntries(rs: AttributedRow[], dim: "api_key" | "customer"): Record<string, unknown>[] {
  const groups = groupBy(rs, (r) => (dim === "api_key" ? r.api_key : r.entity_id));
  const entries = [...groups].map(([id, list]) => ({ id, spend: sumSpend(list), usage: usageOfRows(list) }));
  // Ties by id, and models by cost, as the report's day parts order them (spend-report.ts).
  return entries.sort((a, b) => bySpendDesc(a, b) || (a.id < b.id ? -1 : 1)).map((e) => {
    const ranked = [...e.usage].sort(([ma, a], [mb, b]) => bySpendDesc({ spend: a.cost }, { spend: b.cost }) || (ma < mb ? -1 : 1));
    const models = ranked.map(([model, u]) => ({ model, total_cost: exactUsdJson(u.cost), total_input_tokens: u.input, total_output_tokens: u.output, requests: u.requests }));
    return {
      [dim]: e.id,
      total_cost: exactUsdJson(e.spend),
      total_input_tokens: models.reduce((s, m) => s + m.total_input_tokens, 0),
      total_output_tokens: models.reduce((s, m) => s + m.total_output_tokens, 0),
      total_requests: models.reduce((s, m) => s + m.requests, 0),
      model_details: models,
    };
  });
}

/** `[{team_name, team_id, spend, keys: [{key, spend, usage: {<model group>: modelUsage}}]}]` */
function teamEntries(rs: AttributedRow[]): Record<string, unknown>[] {
  const groups = groupBy(rs, (r) => r.team_id ?? "");
  const entries = [...groups].map(([teamId, list]) => ({ teamId, alias: list[0]!.team_alias, spend: sumSpend(list), list }));
  return entries.sort(bySpendDesc).map((t) => {
    const keys = [...groupBy(t.list, (r) => r.api_key)].map(([key, kl]) => ({ key, spend: sumSpend(kl), usage: usageOfRows(kl) })).sort(bySpendDesc);
    return {
      team_name: t.teamId === "" ? UNASSIGNED_TEAM : (t.alias ?? t.teamId),
      team_id: t.teamId === "" ? null : t.teamId,
      spend: exactUsdJson(t.spend),
      keys: keys.map((k) => ({
        key: k.key,
        spend: exactUsdJson(k.spend),
        usage: Object.fromEntries([...k.usage].map(([m, u]) => [m, modelUsage(u)])),
      })),
    };
  });
}

/** The days `/global/spend/report` covers when the request names no start_date: 30, ending with end_date or today. */
const REPORT_DEFAULT_DAYS = 30;

/**
 * `GET /global/spend/report`: one entry per day with spend, oldest first (see reportDays).
 * - group_by=team (default): `[{group-by-day, group_by_day, teams: teamEntries}]` (the day under both names); calls of keys without a team are "Unassigned Team".
 * - group_by=api_key: `[{group_by_day, api_keys: [{api_key, total_cost, …, model_details}]}]`.
 * - group_by=customer: `[{group_by_day, customers: [{customer, total_cost, …, model_details}]}]`; only calls that named an end user.
 * A key that changed teams during a day is counted under each team for the calls made in it, with any filter.
 */
async function spendReport(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const range = reportDays(ctx, REPORT_DEFAULT_DAYS);
  const groupByDim = choice(ctx.query, "group_by", ["team", "customer", "api_key"] as const, "team");
  const customer = ctx.query("customer_id");
  const userId = ctx.query("internal_user_id");
  const teamId = ctx.query("team_id");
  if (!userId) {
    // The common reports are built from reusable day parts (see spend-report.ts).
    const body = await spendReportJson(ctx.db, ctx.log, { start: range.start, end: range.end, apiKey: keyParam(ctx), teamId, customerId: customer }, groupByDim);
    if (body !== undefined) return new Response(body, { headers: { "content-type": "application/json" } });
  }
  const entityType = groupByDim === "customer" || customer ? "end_user" : userId ? "user" : "key";
  const entityIds = entityType === "end_user" ? (customer ? [customer] : undefined) : entityType === "user" ? [userId!] : undefined;
  const found = await attributedRows(ctx.db, { entityType, entityIds, apiKey: keyParam(ctx), ...range }, { teamIds: teamId ? [teamId] : undefined, userId });
  return [...groupBy(found, (r) => r.day)].map(([day, rs]) => {
    // The day under the spec's name and under LiteLLM's (see dayFields).
    const d = { "group-by-day": day, group_by_day: day };
    if (groupByDim === "team") return { ...d, teams: teamEntries(rs) };
    if (groupByDim === "api_key") return { ...d, api_keys: dimensionEntries(rs, "api_key") };
    return { ...d, customers: dimensionEntries(rs, "customer") };
  });
}

// ---- tags, keys, users

/** `GET /global/spend/tags`, `/spend/tags`: `[{individual_request_tag, log_count, total_spend}]`, highest spend first. */
async function spendTags(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const range = dateRange(ctx);
  const tags = list(ctx.query, "tags");
  const where: SQL[] = [sql`d.entity_type = 'tag'`];
  if (range.start) where.push(sql`d.date >= ${range.start}::date`);
  if (range.end) where.push(sql`d.date <= ${range.end}::date`);
  if (tags?.length) where.push(sql`d.entity_id in (${sql.join(tags.map((t) => sql`${t}`), sql`, `)})`);
  const found = await rows<{ tag: string; log_count: string | number; total_spend: string }>(
    ctx.db,
    sql`select d.entity_id as tag, sum(d.api_requests)::text as log_count, sum(d.spend)::text as total_spend from daily_spend d
      where ${sql.join(where, sql` and `)} group by d.entity_id order by sum(d.spend) desc, d.entity_id`,
  );
  return found.map((r) => ({ individual_request_tag: r.tag, log_count: num(r.log_count), total_spend: exactUsdJson(pico(r.total_spend)) }));
}

/** `GET /spend/keys`: live keys by spend, highest first. */
async function spendKeys(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const limit = limitParam(ctx, "limit", undefined, 100_000);
  const q = ctx.db
    .select({
      token: virtualKeys.token,
      keyName: virtualKeys.keyName,
      keyAlias: virtualKeys.keyAlias,
      spend: virtualKeys.spend,
      maxBudget: virtualKeys.maxBudget,
      userId: virtualKeys.userId,
      teamId: virtualKeys.teamId,
      organizationId: virtualKeys.organizationId,
      createdAt: virtualKeys.createdAt,
    })
    .from(virtualKeys)
    .where(isNull(virtualKeys.deletedAt))
    .orderBy(desc(virtualKeys.spend), virtualKeys.token);
  return (await (limit ? q.limit(limit) : q)).map((r) => toApi(r));
}

/** `GET /spend/users`: users by spend, highest first (`user_id` narrows to one). */
async function spendUsers(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const limit = limitParam(ctx, "limit", undefined, 100_000);
  const userId = ctx.query("user_id");
  const q = ctx.db
    .select({ userId: users.userId, userEmail: users.userEmail, userAlias: users.userAlias, userRole: users.userRole, spend: users.spend, maxBudget: users.maxBudget })
    .from(users)
    .where(userId ? eq(users.userId, userId) : undefined)
    .orderBy(desc(users.spend), users.userId);
  return (await (limit ? q.limit(limit) : q)).map((r) => toApi(r));
}

// ---- reset, calculate, provider budgets

/** Each spend counter's table, the columns that name one (its counter id: teamMemberId for two), and its spend. */
const COUNTER_COLUMNS: Record<CounterTable, { table: PgTable; ids: readonly PgColumn[]; spend: PgColumn }> = {
  team: { table: teams, ids: [teams.teamId], spend: teams.spend },
  org: { table: organizations, ids: [organizations.organizationId], spend: organizations.spend },
  user: { table: users, ids: [users.userId], spend: users.spend },
  team_member: { table: teamMembers, ids: [teamMembers.teamId, teamMembers.userId], spend: teamMembers.spend },
  key: { table: virtualKeys, ids: [virtualKeys.token], spend: virtualKeys.spend },
};
/**
 * What `/global/spend/reset` sets to 0, as the spec says (all keys and all teams, and the team
 * memberships' spend, a team's own budgets for its members), and how its answer and audit row
 * name them. Users' and organizations' spend and budgets are left as they are.
 */
const RESET_COUNTED: Partial<Record<CounterTable, string>> = { key: "keys", team: "teams", team_member: "team_members" };
const RESET_KINDS = LOCK_ORDER.filter((kind) => kind in RESET_COUNTED);

/** `POST /global/spend/reset`: every key, team and team membership back to 0; the log stays. */
async function resetAllSpend(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  await ctx.flushSpend();
  const counted: Record<string, number> = {};
  // When the spend was set by hand (handSetSpend: this instance's clock).
  const setAt = new Date().toISOString();
  await ctx.db.transaction(async (tx) => {
    // In the spend writer's order (spend/flush.ts LOCK_ORDER; each table's rows by id): in another
    // order a batch adding calls' cost and this reset each held a row the other waited for, and
    // PostgreSQL failed one (a 500 here).
    for (const kind of RESET_KINDS) {
      const { table, ids, spend } = COUNTER_COLUMNS[kind];
      const byId = sql.join([...ids], sql`, `);
      // Every row, spent or not: another instance may still have calls that ended before now
      // queued for a row whose stored spend is 0; spend_set_at keeps them off it (spend/flush.ts).
      const [spent] = await rows<{ n: number }>(
        tx,
        sql`select count(*)::int as n from (select ${spend} as spend from ${table} order by ${byId} for no key update) x where x.spend <> 0`,
      );
      await tx.execute(sql`update ${table} set ${sql.identifier(spend.name)} = 0, spend_set_at = ${setAt}::timestamptz`);
      counted[RESET_COUNTED[kind]!] = spent?.n ?? 0;
    }
  });
  // Their counters start again from the stored 0, here and on every instance.
  const everyCounter = await Promise.all(
    RESET_KINDS.map(async (kind) => {
      const { table, ids } = COUNTER_COLUMNS[kind];
      // A key's counters go by its first token (records.ts keyCounterToken).
      const names = kind === "key" ? [sql`coalesce(${virtualKeys.firstToken}, ${virtualKeys.token})`] : ids;
      const found = await rowValues(ctx.db, sql`select ${sql.join([...names], sql`, `)} from ${table}`);
      return found.map((v) => counterId(kind, kind === "team_member" ? teamMemberId(String(v[0]), String(v[1])) : String(v[0])));
    }),
  );
  await ctx.forgetBudgets(everyCounter.flat());
  await ctx.changed({ kind: "all" });
  await ctx.audit({ action: "spend_reset", table: "global", objectId: "all", after: { rows_reset: counted } });
  return { message: "Spend for all API Keys and Teams reset successfully", status: "success" };
}

const UsageBody = T.Object(
  { prompt_tokens: T.Optional(T.Integer({ minimum: 0 })), completion_tokens: T.Optional(T.Integer({ minimum: 0 })) },
  { additionalProperties: true },
);
const CalculateBody = T.Object(
  {
    model: T.Optional(T.String({ minLength: 1 })),
    messages: T.Optional(T.Array(T.Unknown())),
    completion_response: T.Optional(T.Object({ model: T.Optional(T.String()), usage: T.Optional(UsageBody) }, { additionalProperties: true })),
  },
  { additionalProperties: true },
);

const count0 = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) && v > 0 ? v : 0);
const record = (v: unknown): Record<string, unknown> => (v !== null && typeof v === "object" ? (v as Record<string, unknown>) : {});

/**
 * An OpenAI-style `usage` object → Usage: Anthropic-style cache fields too, the 1-hour part of the
 * cache writes and the web searches as the gateway's answers carry them (LiteLLM's names:
 * `prompt_tokens_details.cache_creation_token_details`, `server_tool_use`; Anthropic's
 * `cache_creation` too), so an answer prices as its call was charged.
 */
function usageOf(raw: Record<string, unknown>): Usage {
  const prompt = record(raw.prompt_tokens_details);
  const completion = record(raw.completion_tokens_details);
  const usage: Usage = { promptTokens: count0(raw.prompt_tokens), completionTokens: count0(raw.completion_tokens) };
  const cached = count0(prompt.cached_tokens) || count0(raw.cache_read_input_tokens);
  const created = count0(raw.cache_creation_input_tokens) || count0(prompt.cache_creation_tokens);
  if (cached) usage.cachedPromptTokens = cached;
  if (created) usage.cacheCreationTokens = created;
  const hour = count0(record(prompt.cache_creation_token_details).ephemeral_1h_input_tokens) || count0(record(raw.cache_creation).ephemeral_1h_input_tokens);
  if (hour) usage.cacheCreation1hTokens = hour;
  const searches = count0(record(raw.server_tool_use).web_search_requests) || count0(prompt.web_search_requests);
  if (searches) usage.webSearchRequests = searches;
  if (count0(prompt.audio_tokens)) usage.audioPromptTokens = count0(prompt.audio_tokens);
  const cachedAudio = Math.min(cached, count0(prompt.audio_tokens), count0(record(prompt.cached_tokens_details).audio_tokens));
  if (cachedAudio) usage.cachedAudioPromptTokens = cachedAudio;
  if (count0(completion.reasoning_tokens)) usage.reasoningTokens = count0(completion.reasoning_tokens);
  if (count0(completion.audio_tokens)) usage.audioCompletionTokens = count0(completion.audio_tokens);
  return usage;
}

/** A model group's first deployment, else a deployment whose upstream model is `model` (`mock/x` or `x`). */
function deploymentFor(snapshot: Snapshot, model: string): Deployment | undefined {
  const group = snapshot.models.resolve(model);
  if (group?.length) return group[0];
  return snapshot.models.entries.map((e) => e.deployment).find((d) => d.upstreamModel === model || `${d.provider}/${d.upstreamModel}` === model);
}

/** `POST /spend/calculate` → `{cost}`; 0 when the model is unknown or has no price. */
async function calculateSpend(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const body = await ctx.body(CalculateBody);
  const response = body.completion_response;
  const model = body.model ?? response?.model;
  if (!model) throw badRequest("Send model and messages (an estimate), or completion_response with its model and usage.", "model");
  let usage: Usage;
  // Bounded as a call's usage is before it is priced (a cached part larger than its prompt counts as the prompt), so the answer is what a call with it is charged.
  if (response) usage = countableUsage(usageOf(record(response.usage))).usage;
  else if (body.messages) usage = { promptTokens: estimatePromptTokens("chat", { model, messages: body.messages } as never), completionTokens: 0 };
  else throw badRequest("Send messages with model (an estimate), or completion_response (the cost of a finished call).", "messages");
  const deployment = deploymentFor(ctx.snapshot, model);
  return { cost: deployment ? exactUsdJson(ctx.snapshot.pricing.costOf(deployment, usage).cost) : 0 };
}

/** `GET /provider/budgets`: each configured provider budget with the spend of its current period. */
async function providerBudgets(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const config = ctx.snapshot.config.router_settings?.provider_budget_config ?? {};
  await ctx.flushSpend();
  const history = new StoreSpendHistory(ctx.db);
  const now = Date.now();
  const providers: Record<string, unknown> = {};
  for (const [provider, b] of Object.entries(config)) {
    // The period's spend the ledger enforces on, kept whether or not spend logs are (or still are) stored.
    const { id, period } = providerBudget(provider, config, now)!;
    const spend = await history.periodSpend(id, period?.end ?? null);
    providers[provider] = { budget_limit: b.budget_limit, time_period: b.time_period, spend: exactUsdJson(spend), budget_reset_at: period ? new Date(period.end).toISOString() : null };
  }
  return { providers };
}

export function spendRoutes(deps: AdminDeps) {
  const route = <R>(h: (ctx: AdminCtx) => Promise<R>) => adminRoute(deps, h);
  const noParse = { parse: "none" } as const;
  return new Elysia()
    .get("/global/spend/report", route(spendReport))
    .post("/global/spend/reset", route(resetAllSpend), noParse)
    .get("/global/spend/tags", route(spendTags))
    .get("/spend/tags", route(spendTags))
    .get("/provider/budgets", route(providerBudgets))
    .post("/spend/calculate", route(calculateSpend), noParse)
    .get("/spend/logs", route(spendLogsV1))
    .get("/spend/logs/v2", route(spendLogsV2))
    .get("/spend/keys", route(spendKeys))
    .get("/spend/users", route(spendUsers))
    .get("/team/daily/activity", route((ctx) => dailyActivity(ctx, "team")))
    .get("/organization/daily/activity", route((ctx) => dailyActivity(ctx, "org")));
}

