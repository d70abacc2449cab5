// Differential check of the log endpoints. Randomized data (LOG_DIFF_SEED=<n> runs another set; every
// failure names the seed) written through the spend writer's batch path, counters charged as the
// gateway charges them: ten days up to today, calls exactly at midnight and at 23:59:59.999, calls
// sharing a start time, request ids shared by several calls (upstreams reuse ids), failed and
// cancelled calls, amounts of 0, 1 pico-dollar and 16-digit ones ($1,000–$8,000, sums past 2^53
// pico-dollars), end users and tags such as "undefined", "", unicode and quotes, a key deleted after
// it spent. Randomized requests of `/spend/logs` (rows, newest first; daily sums per user, model
// and key), `/spend/logs/v2` (pages, every filter, dates and instants), `/spend/keys`,
// `/spend/users`, `/spend/tags` and `/global/spend/tags`, asked by the master key, an admin viewer
// and (for its team) a team admin, must answer what is computed here in SQL from `spend_logs` and
// the identity tables. Money: these endpoints write amounts as plain JSON numbers (`picoToUsd`,
// `toApi`), none promises exact decimals as /global/spend/report does, so every amount is compared
// with the double nearest to the exact SQL sum. Callers without the right get a 403 envelope.
// Three bugs this test found, now fixed, are checked on their own at the end.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { type SQL, sql } from "drizzle-orm";
import { picoToText } from "../../core/cost/money.ts";
import type { Charge, SpendEntry } from "../../core/spend/entry.ts";
import { dayOf, writeBatch } from "../../core/spend/flush.ts";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, requestOk, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { queryString, Random } from "../harness/random.ts";
import { type Caller, spendEntry } from "../harness/spend.ts";
import { sha256 } from "../harness/util.ts";

const CONFIG = { model_list: [{ model_name: "alpha-model", svc_params: { model: "mock/alpha" } }], general_settings: { master_key: MASTER_KEY } };
const SEED = Number(process.env.LOG_DIFF_SEED ?? 5_120_883);
const DAY = 86_400_000;
/** The data's days, oldest first (today last). */
const DAYS = Array.from({ length: 10 }, (_, i) => dayOf(Date.now() - (9 - i) * DAY));
/** Request ranges reach a little before the data. */
const RANGE_DAYS = [dayOf(Date.now() - 12 * DAY), ...DAYS];
const nextDay = (day: string) => dayOf(Date.parse(`${day}T00:00:00Z`) + DAY);

type Json = Record<string, unknown>;
type Db = NonNullable<TestGateway["host"]>["store"]["db"];

// ---- the data

interface World {
  teamA: string;
  teamB: string;
  teamC: string;
  callers: Caller[];
  /** Admin of team A only. */
  adminKey: string;
  /** A proxy_admin_viewer's key. */
  viewerKey: string;
  /** A plain member of team A. */
  memberKey: string;
}

const MODELS = [
  { model: "alpha-model", modelGroup: "alpha-model", upstreamModel: "alpha", provider: "mock" },
  { model: "alpha-alias", modelGroup: "alpha-model", upstreamModel: "alpha-2024", provider: "openai" },
  { model: "beta-model", modelGroup: "beta-model", upstreamModel: "beta", provider: "mock" },
  { model: "gamma ü/model", modelGroup: "gamma ü/model", upstreamModel: "gamma-up", provider: "anthropic" },
] as const;
const END_USERS = [null, null, "cust-1", "cust-2", "undefined", "null", "", "客户-ü-😀", 'q "quoted" \\ back', "it's"] as const;
const TAGS = ["t-red", "t-blue", 't "q"', "ü-tag 😀", "undefined", "", "it's"] as const;
const USERS = ["u-ann", "u-bob", 'u "ü"'] as const;
const SHARED_REQUEST_IDS = ["chatcmpl-shared", "chatcmpl-reused-ü", "undefined"] as const;
const GHOST_TEAM = "team-gone";

async function seedWorld(gw: TestGateway): Promise<World> {
  const { organization_id: org } = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: "acme" });
  const team = async (alias: string, orgId?: string) => (await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: alias, organization_id: orgId })).team_id;
  const teamA = await team("alpha-team", org);
  const teamB = await team('beta "team"');
  const teamC = await team("gamma ü");
  for (const u of [...USERS, "u-adm", "u-plain"]) await requestOk(gw, "POST", "/user/new", { user_id: u, auto_create_key: false });
  await requestOk(gw, "POST", "/user/new", { user_id: "u-view", user_role: "proxy_admin_viewer", auto_create_key: false });
  await requestOk(gw, "POST", "/team/member_add", { team_id: teamA, member: { role: "admin", user_id: "u-adm" } });
  await requestOk(gw, "POST", "/team/member_add", { team_id: teamA, member: { role: "user", user_id: "u-plain" } });
  const key = (body: Json) => requestOk<{ key: string; token: string }>(gw, "POST", "/key/generate", body);
  const callers: Caller[] = [];
  const spec: [string, string | null, string | null][] = [
    ["k-a1", teamA, "u-ann"],
    ["k-a2", teamA, "u-bob"],
    ["k-b1", teamB, "u-bob"],
    ["k-b2", teamB, null],
    ["k-c1", teamC, 'u "ü"'],
    ["k-none", null, "u-ann"],
    ["k-doomed", teamA, "u-bob"],
  ];
  for (const [label, teamId, userId] of spec) {
    const k = await key({ key_alias: label, team_id: teamId ?? undefined, user_id: userId ?? undefined });
    callers.push({ label, token: k.token, key: k.key, teamId, orgId: teamId === teamA ? org : null, userId });
  }
  callers.push({ label: "master", token: sha256(MASTER_KEY), teamId: null, orgId: null, userId: null });
  callers.push({ label: "gone", token: sha256("sk-deleted-long-ago"), teamId: GHOST_TEAM, orgId: null, userId: "u-ghost" });
  const adminKey = (await key({ user_id: "u-adm", team_id: teamA })).key;
  const viewerKey = (await key({ user_id: "u-view" })).key;
  const memberKey = (await key({ user_id: "u-plain", team_id: teamA })).key;
  return { teamA, teamB, teamC, callers, adminKey, viewerKey, memberKey };
}

/** The counters a call of `c` charges (no budget periods): the key's, user's, team's, org's and team member's. */
function chargesOf(c: Caller): Charge[] {
  const charges: Charge[] = [{ table: "key", id: c.token, periodEnd: null }];
  if (c.userId) charges.push({ table: "user", id: c.userId, periodEnd: null });
  if (c.teamId) charges.push({ table: "team", id: c.teamId, periodEnd: null });
  if (c.orgId) charges.push({ table: "org", id: c.orgId, periodEnd: null });
  if (c.teamId && c.userId) charges.push({ table: "team_member", id: `${c.teamId}\t${c.userId}`, periodEnd: null });
  return charges;
}

/** A 16-digit amount of $1,000 to $8,000, in pico-dollars (below 2^53: one call's amount is a plain number). */
const bigAmount = (rng: Random) => 1_000_000_000_000_000 + rng.int(7_000_000_000) * 1_000_000 + rng.int(1_000_000);

function amount(rng: Random): number {
  const r = rng.next();
  if (r < 0.12) return 0;
  if (r < 0.2) return 1;
  if (r < 0.27) return 2 + rng.int(9);
  if (r < 0.35) return bigAmount(rng);
  if (r < 0.65) return rng.int(1_000_000_000);
  return rng.int(1_000_000_000_000);
}

let callNo = 0;

/** A call of `caller` at `at` (ms); call ids come from the seed, so ties of start time order the same way again. */
function randomEntry(rng: Random, at: number, caller: Caller, fields: Partial<SpendEntry> = {}): SpendEntry {
  const status = fields.status ?? (rng.chance(0.75) ? "success" : rng.chance(0.6) ? "failure" : "cancelled");
  const callId = `call-${rng.int(36 ** 6).toString(36)}-${callNo++}`;
  const metadata: Json = {};
  if (status === "failure") metadata.error_information = { error_code: "503", error_class: "ServiceUnavailable", error_message: 'upstream said "no" ü' };
  if (rng.chance(0.15)) {
    metadata.messages = [{ role: "user", content: "hi ü" }];
    metadata.response = { id: "r", choices: [] };
  }
  const tags = rng.chance(0.25) ? [] : rng.some(TAGS, 3);
  // A tag repeated in one call counts that call once.
  if (tags.length && rng.chance(0.1)) tags.push(tags[0]!);
  // Tags [""] and no tags in one batch are checked on their own below.
  if (tags.length === 1 && tags[0] === "") tags.push("t-blue");
  return spendEntry(at, {
    callId,
    requestId: rng.chance(0.2) ? rng.pick(SHARED_REQUEST_IDS) : `chatcmpl-${callId}`,
    apiKey: caller.token,
    keyAlias: caller.label === "master" ? null : caller.label,
    userId: caller.userId,
    teamId: caller.teamId,
    organizationId: caller.orgId,
    endUser: rng.pick(END_USERS),
    ...rng.pick(MODELS),
    spendPico: status === "failure" ? 0 : amount(rng),
    status,
    promptTokens: rng.int(5000),
    completionTokens: rng.int(2000),
    cacheReadTokens: rng.chance(0.3) ? rng.int(300) : 0,
    cacheCreationTokens: rng.chance(0.2) ? rng.int(200) : 0,
    reasoningTokens: rng.chance(0.2) ? rng.int(100) : 0,
    endTime: at + 1 + rng.int(5000),
    completionStartTime: rng.chance(0.5) ? at + 1 : null,
    stream: rng.chance(0.3),
    cacheHit: rng.chance(0.1),
    tags,
    metadata,
    charges: chargesOf(caller),
    ...fields,
  });
}

/** The data set: random calls on most days, plus calls on the edges of days and calls sharing a start time and request id. */
function randomEntries(rng: Random, callers: Caller[]): SpendEntry[] {
  const entries: SpendEntry[] = [];
  for (const [i, day] of DAYS.entries()) {
    if (i === 4) continue; // one day without calls
    const start = Date.parse(`${day}T00:00:00Z`);
    for (let n = 2 + rng.int(10); n > 0; n--) entries.push(randomEntry(rng, start + rng.int(Math.min(DAY, Date.now() - start + 1)), rng.pick(callers)));
  }
  const edgeDay = Date.parse(`${DAYS[3]}T00:00:00Z`);
  for (const at of [edgeDay, edgeDay, edgeDay + DAY - 1, edgeDay + DAY]) entries.push(randomEntry(rng, at, rng.pick(callers)));
  const tie = Date.parse(`${DAYS[5]}T12:00:00.500Z`);
  for (let n = 0; n < 4; n++) entries.push(randomEntry(rng, tie, rng.pick(callers), { requestId: "chatcmpl-shared" }));
  // $5,000.000000000001 twice on one key and day: its sums are past 2^53 pico-dollars.
  for (let n = 0; n < 2; n++) entries.push(randomEntry(rng, tie + 1000, callers[0]!, { status: "success", spendPico: 5_000_000_000_000_001 }));
  return entries;
}

// ---- the requests

type As = "master" | "viewer" | "admin";

interface LogsAsk {
  kind: "logs";
  as: As;
  summarize?: string;
  start?: string;
  end?: string;
  apiKey?: string;
  userId?: string;
  requestId?: string;
  teamId?: string;
  limit?: number;
}

interface V2Ask {
  kind: "v2";
  as: As;
  start: string;
  end: string;
  page?: number;
  pageSize?: number;
  apiKey?: string;
  teamId?: string;
  userId?: string;
  requestId?: string;
  keyAlias?: string;
  endUser?: string;
  model?: string;
  status?: "success" | "failure" | "cancelled";
  minSpend?: string;
  maxSpend?: string;
}

interface KeysAsk {
  kind: "keys";
  as: As;
  limit?: number;
}

interface UsersAsk {
  kind: "users";
  as: As;
  limit?: number;
  userId?: string;
}

interface TagsAsk {
  kind: "tags" | "global-tags";
  as: As;
  start?: string;
  end?: string;
  tags?: string[];
}

type Ask = LogsAsk | V2Ask | KeysAsk | UsersAsk | TagsAsk;

function pathOf(a: Ask): string {
  switch (a.kind) {
    case "logs":
      return `/spend/logs?${queryString({ summarize: a.summarize, start_date: a.start, end_date: a.end, api_key: a.apiKey, user_id: a.userId, request_id: a.requestId, team_id: a.teamId, limit: a.limit })}`;
    case "v2":
      return `/spend/logs/v2?${queryString({
        start_date: a.start,
        end_date: a.end,
        page: a.page,
        page_size: a.pageSize,
        api_key: a.apiKey,
        team_id: a.teamId,
        user_id: a.userId,
        request_id: a.requestId,
        key_alias: a.keyAlias,
        end_user: a.endUser,
        model: a.model,
        status_filter: a.status,
        min_spend: a.minSpend,
        max_spend: a.maxSpend,
      })}`;
    case "keys":
      return `/spend/keys?${queryString({ limit: a.limit })}`;
    case "users":
      return `/spend/users?${queryString({ limit: a.limit, user_id: a.userId })}`;
    default:
      return `/${a.kind === "tags" ? "spend/tags" : "global/spend/tags"}?${queryString({ start_date: a.start, end_date: a.end, tags: a.tags?.join(",") })}`;
  }
}

/** An instant of a row's start time as `YYYY-MM-DD HH:MM:SS.mmm` (or ISO with T and Z), ms exact. */
function instantText(rng: Random, ms: number): string {
  const iso = new Date(ms).toISOString();
  return rng.chance(0.5) ? iso : `${iso.slice(0, 10)} ${iso.slice(11, 23)}`;
}

function randomAsks(rng: Random, w: World, entries: SpendEntry[], count: number): Ask[] {
  const keyValues = [...w.callers.map((c) => c.token), ...w.callers.flatMap((c) => (c.key ? [c.key] : [])), "undefined", ""];
  const teams = [w.teamA, w.teamB, w.teamC, GHOST_TEAM, "undefined", ""];
  const requestIds = [...SHARED_REQUEST_IDS, ...entries.slice(0, 5).map((e) => e.requestId), "chatcmpl-none"];
  const userIds = [...USERS, "u-ghost", "undefined", ""];
  const amounts = entries.map((e) => picoToText(BigInt(e.spendPico)));
  const asks: Ask[] = [];
  for (let i = 0; i < count; i++) {
    const kind = rng.pick(["logs", "logs", "logs", "v2", "v2", "v2", "v2", "keys", "users", "tags", "global-tags"] as const);
    // A third of the team-scoped log requests are the team admin's; a tenth of all, the viewer's.
    const as: As = rng.chance(0.1) ? "viewer" : "master";
    if (kind === "logs") {
      const a: LogsAsk = { kind, as };
      const summed = rng.chance(0.5);
      if (summed) [a.start, a.end] = rng.range(RANGE_DAYS);
      else if (rng.chance(0.5)) {
        if (rng.chance(0.6)) a.start = rng.pick(RANGE_DAYS);
        if (rng.chance(0.6)) a.end = rng.pick(RANGE_DAYS.filter((d) => !a.start || d >= a.start));
      }
      a.summarize = summed ? rng.pick([undefined, "true", "1"]) : a.start && a.end ? rng.pick(["false", "0"]) : rng.pick([undefined, "false", "true"]);
      if (rng.chance(0.25)) a.apiKey = rng.pick(keyValues);
      if (rng.chance(0.25)) a.userId = rng.pick(userIds);
      if (rng.chance(summed ? 0.05 : 0.25)) a.requestId = rng.pick(requestIds);
      if (rng.chance(0.35)) a.teamId = rng.pick(teams);
      if (rng.chance(0.4)) a.limit = 1 + rng.int(rng.chance(0.5) ? 10 : 100);
      if (a.teamId === w.teamA && rng.chance(0.5)) a.as = "admin";
      asks.push(a);
    } else if (kind === "v2") {
      let [start, end]: [string, string] = rng.range(RANGE_DAYS);
      if (rng.chance(0.3)) {
        // Instants: a row's own start time as either bound (both inclusive).
        const [x, y] = [rng.pick(entries).startTime, rng.pick(entries).startTime].sort((p, q) => p - q) as [number, number];
        [start, end] = [instantText(rng, x), instantText(rng, y)];
      }
      const a: V2Ask = { kind, as, start, end };
      if (rng.chance(0.5)) a.pageSize = 1 + rng.int(rng.chance(0.5) ? 6 : 100);
      if (rng.chance(0.4)) a.page = 1 + rng.int(5);
      if (rng.chance(0.15)) a.apiKey = rng.pick(keyValues);
      if (rng.chance(0.25)) a.teamId = rng.pick(teams);
      if (rng.chance(0.15)) a.userId = rng.pick(userIds);
      if (rng.chance(0.1)) a.requestId = rng.pick(requestIds);
      if (rng.chance(0.1)) a.keyAlias = rng.pick([...w.callers.map((c) => c.label), "nope", ""]);
      if (rng.chance(0.15)) a.endUser = rng.pick([...END_USERS.filter((u) => u !== null), "nobody"]);
      if (rng.chance(0.2)) a.model = rng.pick([...MODELS.flatMap((m) => [m.model, m.modelGroup, m.upstreamModel]), "no-such-model"]);
      if (rng.chance(0.25)) a.status = rng.pick(["success", "failure"] as const);
      if (rng.chance(0.2)) a.minSpend = rng.pick([...amounts, "0", "1e-12", "0.5"]);
      if (rng.chance(0.2)) a.maxSpend = rng.pick([...amounts, "0", "0.000000000001", "1000"]);
      if (a.teamId === w.teamA && rng.chance(0.5)) a.as = "admin";
      asks.push(a);
    } else if (kind === "keys") {
      asks.push({ kind, as, limit: rng.chance(0.5) ? 1 + rng.int(12) : undefined });
    } else if (kind === "users") {
      asks.push({ kind, as, limit: rng.chance(0.4) ? 1 + rng.int(8) : undefined, userId: rng.chance(0.3) ? rng.pick(userIds) : undefined });
    } else {
      const a: TagsAsk = { kind, as };
      if (rng.chance(0.6)) [a.start, a.end] = rng.range(RANGE_DAYS);
      else if (rng.chance(0.3)) a.start = rng.pick(RANGE_DAYS);
      // `tags` is a comma-separated list whose entries are trimmed, empty ones dropped: no "" tag here.
      if (rng.chance(0.4)) a.tags = rng.some([...TAGS.filter((t) => t !== ""), "t-none"], 3);
      asks.push(a);
    }
  }
  return asks;
}

// ---- what the log says

/** A filter value as the endpoints read it: empty is absent; a plain key stands for its hash. */
const given = (v: string | undefined) => (v === undefined || v === "" ? undefined : v);
const tokenOf = (v: string) => (v.startsWith("sk-") ? sha256(v) : v);
const and = (where: SQL[]) => (where.length ? sql.join(where, sql` and `) : sql`true`);
const LOG_DAY = sql`(l.start_time at time zone 'UTC')::date`;
const iso = (ms: string | null) => (ms === null ? null : new Date(Number(ms)).toISOString());
const epochMs = (column: SQL) => sql`floor(extract(epoch from ${column}) * 1000)::text`;

interface LogRow {
  call_id: string;
  request_id: string;
  call_type: string;
  api_key: string;
  key_alias: string | null;
  user_id: string | null;
  team_id: string | null;
  organization_id: string | null;
  end_user: string | null;
  model: string;
  model_group: string;
  provider: string;
  model_id: string;
  upstream_model: string;
  spend: string;
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  cache_read_input_tokens: number;
  cache_creation_input_tokens: number;
  reasoning_tokens: number;
  audio_seconds: string | null;
  start_ms: string;
  end_ms: string;
  completion_ms: string | null;
  status: string;
  stream: string;
  cache_hit: string;
  tags: string;
  metadata: string;
}

/** Log rows matching `where`, newest first (ties: call id, highest first), as the API shows them. */
async function logRows(db: Db, where: SQL[], limit: number, offset = 0): Promise<Json[]> {
  const found = await rows<LogRow>(
    db,
    sql`select l.call_id, l.request_id, l.call_type, l.api_key, l.key_alias, l.user_id, l.team_id, l.organization_id, l.end_user, l.model,
        l.model_group, l.provider, l.model_id, l.upstream_model, l.spend::text as spend, l.prompt_tokens, l.completion_tokens, l.total_tokens,
        l.cache_read_input_tokens, l.cache_creation_input_tokens, l.reasoning_tokens, l.audio_seconds::text as audio_seconds, ${epochMs(sql`l.start_time`)} as start_ms,
        ${epochMs(sql`l.end_time`)} as end_ms, ${epochMs(sql`l.completion_start_time`)} as completion_ms, l.status, l.stream::text as stream,
        l.cache_hit::text as cache_hit, to_json(l.request_tags)::text as tags, l.metadata::text as metadata
      from spend_logs l where ${and(where)} order by l.start_time desc, l.call_id desc limit ${limit} offset ${offset}`,
  );
  return found.map(({ start_ms, end_ms, completion_ms, tags, metadata, spend, stream, cache_hit, audio_seconds, ...r }) => {
    // Stored prompts ride in the metadata column and are shown as `messages` and `response` ({} when not stored).
    const { messages = {}, response = {}, ...stored } = JSON.parse(metadata) as Json;
    return {
      ...r,
      spend: Number(spend),
      audio_seconds: audio_seconds === null ? null : Number(audio_seconds),
      start_time: iso(start_ms),
      end_time: iso(end_ms),
      completion_start_time: iso(completion_ms),
      stream: stream === "true",
      cache_hit: cache_hit === "true",
      request_tags: JSON.parse(tags) as string[],
      metadata: { key_alias: r.key_alias, status: r.status, ...stored },
      messages,
      response,
    };
  });
}

async function expectedLogs(db: Db, a: LogsAsk): Promise<unknown> {
  const where: SQL[] = [];
  if (given(a.teamId)) where.push(sql`l.team_id = ${a.teamId}`);
  if (given(a.apiKey)) where.push(sql`l.api_key = ${tokenOf(a.apiKey!)}`);
  if (given(a.userId)) where.push(sql`l.user_id = ${a.userId}`);
  const summarize = a.summarize === undefined || a.summarize === "true" || a.summarize === "1";
  if (summarize && a.start && a.end && !given(a.requestId)) {
    where.push(sql`${LOG_DAY} between ${a.start}::date and ${a.end}::date`);
    // grouping() bits: mg 4, k 2, u 1 (a set bit: summed over).
    const found = await rows<{ day: string; mg: string | null; k: string | null; u: string | null; g: number; spend: string }>(
      db,
      sql`select x.day::text as day, x.mg, x.k, x.u, grouping(x.mg, x.k, x.u)::int as g, sum(x.spend)::text as spend
        from (select ${LOG_DAY} as day, l.model_group as mg, l.api_key as k, l.user_id as u, l.spend from spend_logs l where ${and(where)}) x
        group by grouping sets ((x.day), (x.day, x.mg), (x.day, x.k), (x.day, x.u))`,
    );
    const out: { startTime: string; spend: number; users: Json; models: Json; api_keys: Json }[] = [];
    for (let day = a.start; day <= a.end; day = nextDay(day)) out.push({ startTime: day, spend: 0, users: {}, models: {}, api_keys: {} });
    for (const r of found) {
      const d = out.find((o) => o.startTime === r.day)!;
      const g = Number(r.g);
      if (g === 7) d.spend = Number(r.spend);
      else if (g === 3) d.models[r.mg!] = Number(r.spend);
      else if (g === 5) d.api_keys[r.k!] = Number(r.spend);
      else if (g === 6 && r.u !== null) d.users[r.u] = Number(r.spend);
    }
    return out;
  }
  if (given(a.requestId)) where.push(sql`l.request_id = ${a.requestId}`);
  if (a.start) where.push(sql`l.start_time >= ${`${a.start}T00:00:00Z`}::timestamptz`);
  if (a.end) where.push(sql`${LOG_DAY} <= ${a.end}::date`);
  return logRows(db, where, a.limit ?? 50);
}

/** A v2 bound: a bare date is the whole day; an instant is inclusive. */
function bound(text: string, end: boolean): SQL {
  if (text.length === 10) return end ? sql`${LOG_DAY} <= ${text}::date` : sql`l.start_time >= ${`${text}T00:00:00Z`}::timestamptz`;
  const at = `${text.replace(" ", "T").replace(/Z?$/, "Z")}`;
  return end ? sql`l.start_time <= ${at}::timestamptz` : sql`l.start_time >= ${at}::timestamptz`;
}

async function expectedV2(db: Db, a: V2Ask): Promise<Json> {
  const where: SQL[] = [bound(a.start, false), bound(a.end, true)];
  if (given(a.teamId)) where.push(sql`l.team_id = ${a.teamId}`);
  if (given(a.apiKey)) where.push(sql`l.api_key = ${tokenOf(a.apiKey!)}`);
  if (given(a.userId)) where.push(sql`l.user_id = ${a.userId}`);
  if (given(a.requestId)) where.push(sql`l.request_id = ${a.requestId}`);
  if (given(a.keyAlias)) where.push(sql`l.key_alias = ${a.keyAlias}`);
  if (given(a.endUser)) where.push(sql`l.end_user = ${a.endUser}`);
  // The public model name, the model the client asked for, or the upstream model.
  if (given(a.model)) where.push(sql`(l.model_group = ${a.model} or l.model = ${a.model} or l.upstream_model = ${a.model})`);
  if (a.status) where.push(sql`l.status = ${a.status}`);
  if (a.minSpend !== undefined) where.push(sql`l.spend >= ${a.minSpend}::numeric`);
  if (a.maxSpend !== undefined) where.push(sql`l.spend <= ${a.maxSpend}::numeric`);
  const [c] = await rows<{ n: number }>(db, sql`select count(*)::int as n from spend_logs l where ${and(where)}`);
  const total = Number(c!.n);
  const page = a.page ?? 1;
  const pageSize = a.pageSize ?? 50;
  return { data: await logRows(db, where, pageSize, (page - 1) * pageSize), total, page, page_size: pageSize, total_pages: Math.ceil(total / pageSize) };
}

/** Sums of the log per value of `column`, as a subquery `s(id, spend)`. */
const spentBy = (column: SQL) => sql`(select ${column} as id, sum(l.spend) as spend from spend_logs l group by ${column}) s`;

async function expectedKeys(db: Db, a: KeysAsk): Promise<Json[]> {
  const found = await rows<{ token: string; key_name: string; key_alias: string | null; spend: string; max_budget: string | null; user_id: string | null; team_id: string | null; organization_id: string | null; created_ms: string }>(
    db,
    sql`select k.token, k.key_name, k.key_alias, coalesce(s.spend, 0)::text as spend, k.max_budget::text as max_budget, k.user_id, k.team_id,
        k.organization_id, ${epochMs(sql`k.created_at`)} as created_ms
      from virtual_keys k left join ${spentBy(sql`l.api_key`)} on s.id = k.token
      where k.deleted_at is null order by coalesce(s.spend, 0) desc, k.token ${a.limit ? sql`limit ${a.limit}` : sql``}`,
  );
  return found.map(({ created_ms, spend, max_budget, ...k }) => ({ ...k, spend: Number(spend), max_budget: max_budget === null ? null : Number(max_budget), created_at: iso(created_ms) }));
}

async function expectedUsers(db: Db, a: UsersAsk): Promise<Json[]> {
  const found = await rows<{ user_id: string; user_email: string | null; user_alias: string | null; user_role: string | null; spend: string; max_budget: string | null }>(
    db,
    sql`select u.user_id, u.user_email, u.user_alias, u.user_role, coalesce(s.spend, 0)::text as spend, u.max_budget::text as max_budget
      from users u left join ${spentBy(sql`l.user_id`)} on s.id = u.user_id
      where ${given(a.userId) ? sql`u.user_id = ${a.userId}` : sql`true`}
      order by coalesce(s.spend, 0) desc, u.user_id ${a.limit ? sql`limit ${a.limit}` : sql``}`,
  );
  return found.map(({ spend, max_budget, ...u }) => ({ ...u, spend: Number(spend), max_budget: max_budget === null ? null : Number(max_budget) }));
}

async function expectedTags(db: Db, a: TagsAsk): Promise<Json[]> {
  const where: SQL[] = [];
  if (a.start) where.push(sql`${LOG_DAY} >= ${a.start}::date`);
  if (a.end) where.push(sql`${LOG_DAY} <= ${a.end}::date`);
  if (a.tags?.length) where.push(sql`t.tag in (${sql.join(a.tags.map((x) => sql`${x}`), sql`, `)})`);
  const found = await rows<{ tag: string; n: number; spend: string }>(
    db,
    sql`select t.tag, count(*)::int as n, sum(l.spend)::text as spend
      from spend_logs l cross join lateral (select distinct unnest(l.request_tags) as tag) t
      where ${and(where)} group by t.tag order by sum(l.spend) desc, t.tag`,
  );
  return found.map((r) => ({ individual_request_tag: r.tag, log_count: Number(r.n), total_spend: Number(r.spend) }));
}

function expected(db: Db, a: Ask): Promise<unknown> {
  switch (a.kind) {
    case "logs":
      return expectedLogs(db, a);
    case "v2":
      return expectedV2(db, a);
    case "keys":
      return expectedKeys(db, a);
    case "users":
      return expectedUsers(db, a);
    default:
      return expectedTags(db, a);
  }
}

/** Asks every request and compares each answer with the log's; returns how many answers held data. */
async function checkAll(gw: TestGateway, db: Db, w: World, asks: Ask[], round: string): Promise<number> {
  const keys: Record<As, string> = { master: MASTER_KEY, viewer: w.viewerKey, admin: w.adminKey };
  let nonEmpty = 0;
  for (const a of asks) {
    const path = pathOf(a);
    const where = `seed ${SEED}, ${round}: GET ${path} as ${a.as}`;
    const r = await requestJson<unknown>(gw, "GET", path, { key: keys[a.as] });
    expect(r.status, `${where} → ${r.text}`).toBe(200);
    const want = await expected(db, a);
    expect(r.body, where).toEqual(want);
    const body = r.body as Json[] | { data: Json[] };
    if ((Array.isArray(body) ? body : body.data).length > 0) nonEmpty++;
  }
  return nonEmpty;
}

/** The failures of `asks`, each cut to its request and first differences (empty when all agree). */
async function failuresOf(gw: TestGateway, db: Db, w: World, asks: Ask[], round: string): Promise<string[]> {
  const failures: string[] = [];
  for (const a of asks) {
    try {
      await checkAll(gw, db, w, [a], round);
    } catch (err) {
      failures.push((err instanceof Error ? err.message : String(err)).split("\n").slice(0, 14).join("\n"));
    }
  }
  return failures;
}

for (const backend of BACKENDS) {
  describe(`log endpoints against the log, randomized (${backend}, seed ${SEED})`, () => {
    let gw: TestGateway;
    let db: Db;
    let w: World;
    let entries: SpendEntry[];
    let asks: Ask[];
    const rng = new Random(SEED);

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_log_diff" });
      db = gw.host!.store.db;
      w = await seedWorld(gw);
      entries = randomEntries(rng, w.callers);
      // Two batches: the writer's bulk path for the first, its statement for the rest on the embedded store alike.
      const half = Math.floor(entries.length / 2);
      await writeBatch(gw.host!.store, entries.slice(0, half));
      await writeBatch(gw.host!.store, entries.slice(half));
      // A key deleted after it spent: its rows stay in the log, it leaves /spend/keys.
      await requestOk(gw, "POST", "/key/delete", { keys: [w.callers.find((c) => c.label === "k-doomed")!.token] });
      asks = randomAsks(rng, w, entries, 400);
    }, 30_000);
    afterAll(async () => gw?.stop());

    test("the data set has several days, 16-digit amounts, 1 pico-dollar, shared request ids, failures and cancelled calls", async () => {
      const [c] = await rows<Record<string, number>>(
        db,
        sql`select count(distinct (start_time at time zone 'UTC')::date)::int as days, (count(*) filter (where spend >= 1000))::int as big,
          (count(*) filter (where spend = 0.000000000001))::int as one_pico, (count(*) filter (where status = 'failure'))::int as failed,
          (count(*) filter (where status = 'cancelled'))::int as cancelled,
          (select count(*)::int from (select request_id from spend_logs group by request_id having count(*) > 1) r) as shared_ids,
          (select coalesce(max(s), 0)::float8 from (select sum(spend) as s from spend_logs group by api_key) k) as max_key_spend
          from spend_logs`,
      );
      expect(c!.days, `seed ${SEED}`).toBeGreaterThanOrEqual(8);
      expect(c!.big, `seed ${SEED}`).toBeGreaterThanOrEqual(3);
      expect(c!.one_pico, `seed ${SEED}`).toBeGreaterThanOrEqual(1);
      expect(c!.failed, `seed ${SEED}`).toBeGreaterThanOrEqual(1);
      expect(c!.cancelled, `seed ${SEED}`).toBeGreaterThanOrEqual(1);
      expect(c!.shared_ids, `seed ${SEED}`).toBeGreaterThanOrEqual(1);
      // Some key's sum is past 2^53 pico-dollars ($9,007.2): summed and written as bigint.
      expect(c!.max_key_spend, `seed ${SEED}`).toBeGreaterThan(9007.2);
    });

    test("every answer equals the log's", async () => {
      expect(await checkAll(gw, db, w, asks, "randomized")).toBeGreaterThan(80);
    }, 30_000);

    test("callers without the right are refused with 403 in the error envelope; a team admin must name its team", async () => {
      const range = `start_date=${DAYS[0]}&end_date=${DAYS[9]}`;
      const refused = async (path: string, key: string) => {
        const r = await requestJson<{ error: Json }>(gw, "GET", path, { key });
        expect(r.status, `seed ${SEED}: GET ${path} → ${r.text.slice(0, 300)}`).toBe(403);
        expect(r.body.error, path).toMatchObject({ type: "permission_error", code: "403" });
        expect(typeof r.body.error.message, path).toBe("string");
      };
      for (const team of [w.teamB, w.teamC, GHOST_TEAM, "no-such-team"]) {
        await refused(`/spend/logs?team_id=${team}&summarize=false`, w.adminKey);
        await refused(`/spend/logs?team_id=${team}&${range}`, w.adminKey);
        await refused(`/spend/logs/v2?team_id=${team}&${range}`, w.adminKey);
      }
      for (const path of ["/spend/keys", "/spend/users", "/spend/tags", `/global/spend/tags?${range}`]) await refused(path, w.adminKey);
      const plainKey = w.callers.find((c) => c.label === "k-b2")!.key!;
      for (const key of [w.memberKey, plainKey]) {
        for (const path of [`/spend/logs?team_id=${w.teamA}`, `/spend/logs/v2?team_id=${w.teamA}&${range}`, "/spend/keys", "/spend/users", "/spend/tags", "/global/spend/tags"]) {
          await refused(path, key);
        }
      }
      const unnamed = await requestJson<{ error: Json }>(gw, "GET", `/spend/logs/v2?${range}`, { key: w.adminKey });
      expect(unnamed.status).toBe(422);
      expect(unnamed.body.error).toMatchObject({ param: "team_id", type: "validation_error", code: "422" });
      expect((await requestJson(gw, "GET", "/spend/logs", { key: w.adminKey })).status).toBe(422);
    });

    // Found by this test; checked on their own (the randomized data keeps each key in one team, and bounds in whole milliseconds).

    test("/spend/logs?summarize with team_id (a team admin's view) counts a key that changed teams that day for each team what it spent in it", async () => {
      const day = dayOf(Date.now() - 30 * DAY);
      const at = Date.parse(`${day}T08:00:00Z`);
      const k = await requestOk<{ key: string; token: string }>(gw, "POST", "/key/generate", { key_alias: "k-mover", team_id: w.teamA });
      const asA: Caller = { label: "k-mover", token: k.token, teamId: w.teamA, orgId: null, userId: null };
      await writeBatch(gw.host!.store, [randomEntry(rng, at, asA, { status: "success", spendPico: 1_000_000 })]);
      await requestOk(gw, "POST", "/key/update", { key: k.token, team_id: w.teamB });
      await writeBatch(gw.host!.store, [randomEntry(rng, at + 3_600_000, { ...asA, teamId: w.teamB }, { status: "success", spendPico: 2_000_000 })]);
      // Team A's admin sees its own call only, team B's read its own only (whichever team id sorts last gets both, the other none).
      const asks: LogsAsk[] = [
        { kind: "logs", as: "admin", teamId: w.teamA, start: day, end: day },
        { kind: "logs", as: "master", teamId: w.teamB, start: day, end: day },
      ];
      const failures = await failuresOf(gw, db, w, asks, "key moved between teams");
      expect(failures).toEqual([]);
    });

    test("the spend writer keeps calls with the tags [] and [\"\"] (and end users null and \"null\") of one batch apart", async () => {
      const day = dayOf(Date.now() - 35 * DAY);
      const at = Date.parse(`${day}T10:00:00Z`);
      const c = w.callers.find((x) => x.label === "k-b2")!;
      const call = (fields: Partial<SpendEntry>) => spendEntry(at, { apiKey: c.token, teamId: c.teamId, charges: chargesOf(c), ...fields });
      // The first call of a group stands for all of it: here the one without tags, so the "" tag gets nothing.
      await writeBatch(gw.host!.store, [call({ tags: [], spendPico: 1_000_000 }), call({ tags: [""], spendPico: 2_000_000 })]);
      const failures = await failuresOf(gw, db, w, [{ kind: "tags", as: "master", start: day, end: day }], "tags [] and [\"\"] in one batch");
      // The same for end users null and "null" (and user, team or org ids null and "null"), seen in the customer report.
      const other = dayOf(Date.now() - 36 * DAY);
      await writeBatch(gw.host!.store, [
        spendEntry(Date.parse(`${other}T10:00:00Z`), { apiKey: c.token, teamId: c.teamId, endUser: "null", spendPico: 3_000_000 }),
        spendEntry(Date.parse(`${other}T10:00:00Z`), { apiKey: c.token, teamId: c.teamId, endUser: null, spendPico: 4_000_000 }),
      ]);
      const report = await requestJson<{ customers: { customer: string; total_cost: number }[] }[]>(
        gw,
        "GET",
        `/global/spend/report?group_by=customer&start_date=${other}&end_date=${other}`,
      );
      const customers = report.body.flatMap((d) => d.customers.map((x) => [x.customer, x.total_cost]));
      if (JSON.stringify(customers) !== JSON.stringify([["null", 0.000003]])) failures.push(`seed ${SEED}: end users "null" and null in one batch: ${JSON.stringify(customers)}, not [["null",0.000003]]`);
      expect(failures).toEqual([]);
    });

    test("/spend/logs/v2 with end_date before start_date is a 400 naming end_date, as /spend/logs answers", async () => {
      for (const path of ["/spend/logs/v2", "/spend/logs"]) {
        const r = await requestJson<{ error: { param: string } }>(gw, "GET", `${path}?start_date=${DAYS[5]}&end_date=${DAYS[2]}`);
        expect([path, r.status, r.body.error?.param]).toEqual([path, 400, "end_date"]);
      }
      const timed = await requestJson(gw, "GET", `/spend/logs/v2?start_date=${DAYS[2]}%2010:00:00&end_date=${DAYS[2]}%2009:59:59`);
      expect(timed.status).toBe(400);
    });

    test("/spend/logs/v2 rounds a sub-millisecond start_date up and end_date down: no row outside the bounds is listed", async () => {
      const at = Date.parse(`${dayOf(Date.now() - 40 * DAY)}T09:30:00.007Z`);
      const c = w.callers[0]!;
      await writeBatch(gw.host!.store, [randomEntry(rng, at, c, { status: "success", spendPico: 5 })]);
      const ms = new Date(at).toISOString().slice(0, 23);
      const before = new Date(at - 1).toISOString().slice(0, 23);
      const asks: V2Ask[] = [
        // Ends 0.2 ms before the row (rounded up to the row's millisecond): the row is after the end.
        { kind: "v2", as: "master", start: `${before}1`, end: `${before}8`, apiKey: c.token },
        // Starts 0.4 ms after the row (rounded down to the row's millisecond): the row is before the start.
        { kind: "v2", as: "master", start: `${ms}4`, end: `${ms}9`, apiKey: c.token },
      ];
      expect(await failuresOf(gw, db, w, asks, "sub-millisecond bounds")).toEqual([]);
    });

    test("status_filter=cancelled lists the calls the client left (it was refused as not success or failure)", async () => {
      const range = { start: DAYS[0]!, end: DAYS[9]! };
      const [c] = await rows<{ n: number }>(db, sql`select count(*)::int as n from spend_logs where status = 'cancelled'`);
      expect(c!.n, `seed ${SEED}`).toBeGreaterThanOrEqual(1);
      const asks: Ask[] = [
        { kind: "v2", as: "master", ...range, status: "cancelled" },
        { kind: "v2", as: "master", ...range, status: "cancelled", pageSize: 1, page: 2 },
      ];
      expect(await failuresOf(gw, db, w, asks, "status_filter=cancelled")).toEqual([]);
    });

    test("dates before the year 100 (0050-01-01, 0099-12-31) are answered as any date (they were 422 \"not a date\"); the year 0 is a 400 naming the range", async () => {
      const asks: Ask[] = [
        { kind: "logs", as: "master", summarize: "false", start: "0050-01-01" },
        { kind: "logs", as: "master", summarize: "false", start: "0001-01-01", end: "0099-12-31" },
        { kind: "v2", as: "master", start: "0099-12-31", end: DAYS[9]! },
        { kind: "global-tags", as: "master", start: "0050-01-01", end: DAYS[9]! },
      ];
      expect(await failuresOf(gw, db, w, asks, "dates before the year 100")).toEqual([]);
      for (const path of ["/global/spend/report?start_date=0050-01-01&end_date=0050-01-03", "/global/spend/report?end_date=0001-01-05", "/team/daily/activity?start_date=0099-12-01&end_date=0099-12-31"]) {
        const r = await requestJson(gw, "GET", path);
        expect([path, r.status, r.text.slice(0, 200)]).toEqual([path, 200, r.text.slice(0, 200)]);
      }
      for (const path of ["/spend/logs?start_date=0000-06-01&summarize=false", "/spend/logs/v2?start_date=0000-01-01&end_date=0001-01-01", "/global/spend/report?start_date=0000-12-31&end_date=0001-01-01"]) {
        const r = await requestJson<{ error: { message: string; param: string } }>(gw, "GET", path);
        expect([path, r.status, r.body.error?.param]).toEqual([path, 400, "start_date"]);
        expect(r.body.error.message).toContain("from 0001-01-01 to 9999-12-31");
      }
    });

    test("end_date=9999-12-31, the last day a date can name, is answered by /spend/logs and /spend/logs/v2 with the rows of that day's last millisecond", async () => {
      const c = w.callers[1]!;
      // The call ends when it starts: a later end would be in year 10000.
      const lastMs = Date.parse("9999-12-31T23:59:59.999Z");
      await writeBatch(gw.host!.store, [randomEntry(rng, lastMs, c, { status: "success", spendPico: 7, endTime: lastMs, completionStartTime: null })]);
      const last = "9999-12-31";
      const asks: Ask[] = [
        { kind: "logs", as: "master", summarize: "false", end: last, apiKey: c.token },
        { kind: "logs", as: "master", summarize: "false", start: DAYS[0], end: last, apiKey: c.token },
        { kind: "v2", as: "master", start: DAYS[0]!, end: last, apiKey: c.token },
        { kind: "v2", as: "master", start: last, end: last },
      ];
      expect(await failuresOf(gw, db, w, asks, "end_date 9999-12-31")).toEqual([]);
    });
  });
}
