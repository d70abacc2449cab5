// Differential check of the spend reports. Randomized data (ten days up to today; amounts of 0, of a
// few pico-dollars, below $1, and 16-digit ones of $1,000 and more; several model groups, upstream
// models and providers; end users such as "undefined", "null", "", unicode and quotes; failed and
// cancelled calls; keys and teams that have no row any more) and randomized requests
// (`/global/spend/report` by team, api_key and customer with its filters and dates;
// `/team/daily/activity` and `/organization/daily/activity` with include and exclude lists, model,
// api_key, dates and pages): every answer must equal what is computed here in SQL straight from
// `spend_logs`, money exact to the last digit. Asked when the day parts are built, again (reused from
// memory), after late writes to past days and today and renames of a team, key and org and a key
// moved to another team (day versions and the names' version), and on PostgreSQL by a second
// instance that reads the first one's stored parts. Failures name the seed; REPORT_DIFF_SEED=<n>
// runs another data set. Cases found by this test, now fixed, are checked on their own at the end.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { type SQL, sql } from "drizzle-orm";
import type { SpendEntry } from "../../core/spend/entry.ts";
import { writeBatch } from "../../core/spend/flush.ts";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, requestOk, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { Random, queryString } from "../harness/random.ts";
import { type Caller, spendEntry } from "../harness/spend.ts";
import { sha256, until } from "../harness/util.ts";

const CONFIG = { model_list: [{ model_name: "alpha-model", svc_params: { model: "mock/alpha" } }], general_settings: { master_key: MASTER_KEY } };
const SEED = Number(process.env.REPORT_DIFF_SEED ?? 7_301_955);
const DAY = 86_400_000;
const dayOf = (ms: number) => new Date(ms).toISOString().slice(0, 10);
const TODAY = dayOf(Date.now());
/** The data's days, oldest first (today last). */
const DAYS = Array.from({ length: 10 }, (_, i) => dayOf(Date.now() - (9 - i) * DAY));
/** Request ranges reach a little before the data. */
const RANGE_DAYS = [dayOf(Date.now() - 12 * DAY), ...DAYS];

// ---- exact money

/** The exact decimal text of a decimal number given as text (a JSON number, exponent form too, or a `numeric`), without trailing zeros. */
function decimal(text: string): string {
  const m = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(text);
  if (!m) throw new Error(`not a decimal number: ${text}`);
  const digits = BigInt(`${m[2]}${m[3] ?? ""}`);
  const exponent = Number(m[4] ?? 0) - (m[3]?.length ?? 0);
  let plain: string;
  if (exponent >= 0) plain = (digits * 10n ** BigInt(exponent)).toString();
  else {
    const padded = digits.toString().padStart(1 - exponent, "0");
    const frac = padded.slice(padded.length + exponent).replace(/0+$/, "");
    plain = `${padded.slice(0, padded.length + exponent)}${frac ? `.${frac}` : ""}`;
  }
  return m[1] === "-" && plain !== "0" ? `-${plain}` : plain;
}

const MONEY_FIELDS = new Set(["spend", "total_spend", "cost", "total_cost"]);
type Json = Record<string, unknown>;

/** An answer's JSON with money members as their exact decimal text, as written (not the nearest double); other numbers as numbers. */
function parseExact<T>(text: string): T {
  return JSON.parse(text, (key: string, value: unknown, context?: { source?: string }) =>
    typeof value === "number" && MONEY_FIELDS.has(key) ? decimal(context?.source ?? String(value)) : value,
  ) as T;
}

// ---- the data

interface World {
  orgs: string[];
  teams: string[];
  callers: Caller[];
}

const MODELS = [
  { modelGroup: "alpha-model", upstreamModel: "alpha", provider: "mock" },
  { modelGroup: "alpha-model", upstreamModel: "alpha-2024", provider: "openai" },
  { modelGroup: "beta-model", upstreamModel: "beta", provider: "mock" },
  { modelGroup: "gamma ü/model", upstreamModel: "gamma-up", provider: "anthropic" },
] as const;
const END_USERS = [null, null, null, "cust-1", "cust-2", "undefined", "null", "", "客户-ü-😀", 'q "quoted" \\ back'] as const;
const USERS = ["u-ann", "u-bob", "u-cid"] as const;
const GHOST_TEAM = "team-gone";
const GHOST_ORG = "org-gone";

/** Keys, teams and orgs through the management API, plus callers whose key, team or org has no row (deleted, or the master key). */
async function seedWorld(gw: TestGateway): Promise<World> {
  const org = async (alias: string) => (await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: alias })).organization_id;
  const acme = await org("acme");
  const globex = await org("globex ü");
  const team = async (alias: string | undefined, orgId: string | null) =>
    (await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: alias, organization_id: orgId ?? undefined })).team_id;
  const teamA = await team("alpha-team", acme);
  const teamB = await team('beta "team"', acme);
  const teamC = await team("gamma", globex);
  const teamD = await team(undefined, null);
  const orgOf = new Map<string | null, string | null>([
    [teamA, acme],
    [teamB, acme],
    [teamC, globex],
    [teamD, null],
    [null, null],
    [GHOST_TEAM, GHOST_ORG],
  ]);
  const callers: Caller[] = [];
  const spec: [string, string | undefined, string | null, string | null][] = [
    ["k-one", "k-one", teamA, "u-ann"],
    ["k-two", "k-two", teamA, "u-bob"],
    ["k-three", "k-three", teamB, "u-ann"],
    ["k-four", "k-four", teamC, "u-cid"],
    ["k-no-alias", undefined, teamD, null],
    ["k-solo", "k-solo", null, "u-bob"],
  ];
  for (const [label, alias, teamId, userId] of spec) {
    const k = await requestOk<{ key: string; token: string }>(gw, "POST", "/key/generate", { key_alias: alias, team_id: teamId ?? undefined });
    callers.push({ label, token: k.token, key: k.key, teamId, orgId: orgOf.get(teamId) ?? null, userId });
  }
  callers.push({ label: "master", token: sha256(MASTER_KEY), teamId: null, orgId: null, userId: null });
  callers.push({ label: "gone", token: sha256("sk-deleted-long-ago"), teamId: GHOST_TEAM, orgId: GHOST_ORG, userId: "u-cid" });
  return { orgs: [acme, globex, GHOST_ORG], teams: [teamA, teamB, teamC, teamD, GHOST_TEAM], callers };
}

/** A 16-digit amount of $1,000 to $1,400, in pico-dollars. */
const bigAmount = (rng: Random) => 1_000_000_000_000_000 + rng.int(40_000_000_000_000) * 10 + 1 + rng.int(9);

/**
 * Money of one call: mostly small; `big` allows a few 16-digit amounts of $1,000 and more (few, so
 * that every sum, totals of all days included, stays below $8,192: see the exactness test below).
 */
function amount(rng: Random, big: { left: number }): number {
  const r = rng.next();
  if (r < 0.12) return 0;
  if (r < 0.22) return 1 + rng.int(9);
  if (r < 0.3 && big.left > 0) {
    big.left--;
    return bigAmount(rng);
  }
  if (r < 0.6) return rng.int(1_000_000_000);
  return rng.int(1_000_000_000_000);
}

/** A random call of `caller` at a random time of `day` (not later than now). */
function randomEntry(rng: Random, day: string, caller: Caller, big: { left: number }): SpendEntry {
  const start = Date.parse(`${day}T00:00:00Z`);
  const at = start + rng.int(Math.min(DAY, Date.now() - start + 1));
  const model = rng.pick(MODELS);
  const status = rng.chance(0.8) ? "success" : rng.chance(0.6) ? "failure" : "cancelled";
  return spendEntry(at, {
    apiKey: caller.token,
    keyAlias: caller.label,
    userId: caller.userId,
    teamId: caller.teamId,
    organizationId: caller.orgId,
    endUser: rng.pick(END_USERS),
    model: model.modelGroup,
    ...model,
    spendPico: status === "failure" ? 0 : amount(rng, big),
    promptTokens: rng.int(5000),
    completionTokens: rng.int(2000),
    cacheReadTokens: rng.chance(0.3) ? rng.int(300) : 0,
    cacheCreationTokens: rng.chance(0.2) ? rng.int(200) : 0,
    status,
    tags: rng.some(["t-red", "t-blue", "t ü"], 2),
  });
}

// ---- the requests

interface ReportAsk {
  report: "spend";
  groupBy?: "team" | "api_key" | "customer";
  start: string;
  end: string;
  /** As sent: a key's hash, a plain key, or text that is neither. */
  apiKey?: string;
  teamId?: string;
  customerId?: string;
  userId?: string;
}

interface ActivityAsk {
  report: "team" | "org";
  /** `team_ids` / `organization_ids` */
  ids?: string[];
  /** `team_id` / `organization_id` */
  id?: string;
  exclude?: string[];
  model?: string;
  apiKey?: string;
  start?: string;
  end?: string;
  page?: number;
  pageSize?: number;
}

type Ask = ReportAsk | ActivityAsk;

function pathOf(a: Ask): string {
  if (a.report === "spend") {
    return `/global/spend/report?${queryString({ start_date: a.start, end_date: a.end, group_by: a.groupBy, api_key: a.apiKey, team_id: a.teamId, customer_id: a.customerId, internal_user_id: a.userId })}`;
  }
  const [one, many, exclude] = a.report === "team" ? ["team_id", "team_ids", "exclude_team_ids"] : ["organization_id", "organization_ids", "exclude_organization_ids"];
  return `/${a.report === "team" ? "team" : "organization"}/daily/activity?${queryString({
    [one]: a.id,
    [many]: a.ids?.join(","),
    [exclude]: a.exclude?.join(","),
    model: a.model,
    api_key: a.apiKey,
    start_date: a.start,
    end_date: a.end,
    page: a.page,
    page_size: a.pageSize,
  })}`;
}

function randomAsks(rng: Random, w: World, count: number): Ask[] {
  const keyValues = [...w.callers.map((c) => c.token), ...w.callers.flatMap((c) => (c.key ? [c.key] : [])), "undefined"];
  const asks: Ask[] = [];
  for (let i = 0; i < count; i++) {
    if (i % 2 === 0) {
      const [start, end] = rng.range(RANGE_DAYS);
      const groupBy = rng.pick([undefined, "team", "api_key", "customer"] as const);
      const ask: ReportAsk = { report: "spend", groupBy, start, end };
      if (rng.chance(0.25)) ask.apiKey = rng.pick(keyValues);
      if (rng.chance(0.25)) ask.teamId = rng.pick([...w.teams, "undefined", ""]);
      // group_by=api_key with customer_id is left to its own test below (a known bug).
      if (groupBy !== "api_key" && rng.chance(0.3)) ask.customerId = rng.pick([...END_USERS.filter((u) => u !== null), "nobody"]);
      if (rng.chance(0.15)) ask.userId = rng.pick([...USERS, "undefined"]);
      asks.push(ask);
    } else {
      const report = rng.pick(["team", "org"] as const);
      const ids = report === "team" ? [...w.teams, "undefined"] : [...w.orgs, "undefined"];
      const ask: ActivityAsk = { report };
      if (rng.chance(0.3)) ask.ids = rng.some(ids, 3);
      if (rng.chance(0.15)) ask.id = rng.pick(ids);
      if (rng.chance(0.2)) ask.exclude = rng.some(ids, 2);
      if (rng.chance(0.25)) ask.model = rng.pick([...MODELS.flatMap((m) => [m.modelGroup, m.upstreamModel]), "no-such-model"]);
      if (rng.chance(0.2)) ask.apiKey = rng.pick(keyValues);
      if (rng.chance(0.6)) [ask.start, ask.end] = rng.range(RANGE_DAYS);
      else if (rng.chance(0.3)) ask.start = rng.pick(RANGE_DAYS);
      if (rng.chance(0.5)) {
        ask.pageSize = 1 + rng.int(4);
        ask.page = 1 + rng.int(4);
      }
      asks.push(ask);
    }
  }
  return asks;
}

// ---- what the log says

type Db = NonNullable<TestGateway["host"]>["store"]["db"];
type Row = Record<string, string | number | null>;
const LOG_DAY = sql`(l.start_time at time zone 'UTC')::date`;
/** The log's sums over the grouped rows `x`: money as exact text, tokens and counts as integers. */
const SUMS = sql`coalesce(sum(x.spend), 0)::text as spend, coalesce(sum(x.prompt_tokens), 0)::int as prompt, coalesce(sum(x.completion_tokens), 0)::int as completion,
  coalesce(sum(x.cache_read_input_tokens), 0)::int as cache_read, coalesce(sum(x.cache_creation_input_tokens), 0)::int as cache_creation,
  count(*)::int as requests, (count(*) filter (where x.status = 'success'))::int as ok, (count(*) filter (where x.status <> 'success'))::int as failed`;
/** The columns of the log that the sums read. */
const SUMMED = sql`l.spend, l.prompt_tokens, l.completion_tokens, l.cache_read_input_tokens, l.cache_creation_input_tokens, l.status`;

/** Current names of keys, teams and orgs (the reports show them as they are now). */
interface Names {
  teams: Map<string, string | null>;
  orgs: Map<string, string | null>;
  keys: Map<string, { key_alias: string | null; team_id: string | null }>;
}

async function currentNames(db: Db): Promise<Names> {
  const teams = await rows<{ id: string; alias: string | null }>(db, sql`select team_id as id, team_alias as alias from teams`);
  const orgs = await rows<{ id: string; alias: string | null }>(db, sql`select organization_id as id, organization_alias as alias from organizations`);
  const keys = await rows<{ token: string; key_alias: string | null; team_id: string | null }>(db, sql`select token, key_alias, team_id from virtual_keys`);
  return {
    teams: new Map(teams.map((t) => [t.id, t.alias])),
    orgs: new Map(orgs.map((o) => [o.id, o.alias])),
    keys: new Map(keys.map((k) => [k.token, { key_alias: k.key_alias, team_id: k.team_id }])),
  };
}

/** A filter value as the endpoints read it: empty is absent; a plain key stands for its hash. */
const given = (v: string | undefined) => (v === undefined || v === "" ? undefined : v);
const tokenOf = (v: string) => (v.startsWith("sk-") ? sha256(v) : v);

/** `/global/spend/report` from the log: one entry per day with calls, oldest first. */
async function expectedReport(db: Db, names: Names, a: ReportAsk): Promise<Json[]> {
  const where: SQL[] = [sql`${LOG_DAY} between ${a.start}::date and ${a.end}::date`];
  const apiKey = given(a.apiKey);
  if (apiKey) where.push(sql`l.api_key = ${tokenOf(apiKey)}`);
  if (given(a.teamId)) where.push(sql`l.team_id = ${a.teamId}`);
  if (given(a.customerId)) where.push(sql`l.end_user = ${a.customerId}`);
  if (given(a.userId)) where.push(sql`l.user_id = ${a.userId}`);
  const groupBy = a.groupBy ?? "team";
  if (groupBy === "customer") where.push(sql`l.end_user is not null`);
  const id = groupBy === "team" ? sql`coalesce(l.team_id, '')` : groupBy === "api_key" ? sql`l.api_key` : sql`l.end_user`;
  // Per day and group, per key (team report only) and per model group; `level` tells which a row is: 2 group, 1 key, 0 model group.
  const sets = groupBy === "team" ? sql`(x.day, x.id), (x.day, x.id, x.k), (x.day, x.id, x.k, x.mg)` : sql`(x.day, x.id), (x.day, x.id, x.mg)`;
  const level = groupBy === "team" ? sql`grouping(x.k) + grouping(x.mg)` : sql`2 * grouping(x.mg)`;
  const found = await rows<Row>(
    db,
    sql`select x.day::text as day, x.id, ${groupBy === "team" ? sql`x.k` : sql`null`} as k, x.mg, (${level})::int as level, ${SUMS}
      from (select ${LOG_DAY} as day, ${id} as id, l.api_key as k, l.model_group as mg, ${SUMMED} from spend_logs l where ${sql.join(where, sql` and `)}) x
      group by grouping sets (${sets})`,
  );
  const days = new Map<string, Json>();
  const out = (day: string) => days.get(day) ?? days.set(day, {}).get(day)!;
  const sorted = [...found].sort((x, y) => Number(y.level) - Number(x.level));
  for (const r of sorted) {
    const groups = out(String(r.day));
    const gid = String(r.id);
    if (groupBy === "team") {
      if (r.level === 2) {
        groups[gid] = {
          team_name: gid === "" ? "Unassigned Team" : (names.teams.get(gid) ?? gid),
          team_id: gid === "" ? null : gid,
          spend: decimal(String(r.spend)),
          keys: {},
        };
      } else {
        const keys = (groups[gid] as { keys: Record<string, { key: string; spend: string; usage: Json }> }).keys;
        if (r.level === 1) keys[String(r.k)] = { key: String(r.k), spend: decimal(String(r.spend)), usage: {} };
        else keys[String(r.k)]!.usage[String(r.mg)] = { cost: decimal(String(r.spend)), input_tokens: r.prompt, output_tokens: r.completion, requests: r.requests };
      }
    } else if (r.level === 2) {
      groups[gid] = {
        [groupBy]: gid,
        total_cost: decimal(String(r.spend)),
        total_input_tokens: r.prompt,
        total_output_tokens: r.completion,
        total_requests: r.requests,
        model_details: {},
      };
    } else {
      (groups[gid] as { model_details: Json }).model_details[String(r.mg)] = {
        model: String(r.mg),
        total_cost: decimal(String(r.spend)),
        total_input_tokens: r.prompt,
        total_output_tokens: r.completion,
        requests: r.requests,
      };
    }
  }
  return [...days].sort(([x], [y]) => (x < y ? -1 : 1)).map(([day, groups]) => ({ group_by_day: day, groups }));
}

/** The report's answer in the form `expectedReport` builds: lists as maps by id, after checking their order (highest spend first) and that no id repeats. */
function reportAsMaps(answer: Json[], groupBy: "team" | "api_key" | "customer", where: string): Json[] {
  const byId = <T extends Json>(list: T[], id: (x: T) => string, spend: (x: T) => string, what: string): Record<string, T> => {
    const spends = list.map((x) => Number(spend(x)));
    expect(spends, `${where}: ${what} by spend, highest first`).toEqual([...spends].sort((p, q) => q - p));
    const map = Object.fromEntries(list.map((x) => [id(x), x]));
    expect(Object.keys(map).length, `${where}: ${what} without repeats`).toBe(list.length);
    return map;
  };
  return answer.map((d) => {
    const { group_by_day, ...rest } = d as { group_by_day: string } & Json;
    let groups: Record<string, Json>;
    if (groupBy === "team") {
      type Team = { team_id: string | null; spend: string; keys: { key: string; spend: string; usage: Json }[] };
      const teams = byId(rest.teams as Team[], (t) => t.team_id ?? "", (t) => t.spend, "teams");
      groups = Object.fromEntries(
        Object.entries(teams).map(([id, t]) => [id, { ...t, keys: byId(t.keys, (k) => k.key, (k) => k.spend, `keys of team ${id}`) }]),
      );
    } else {
      type Entry = Json & { total_cost: string; model_details: { model: string }[] };
      const list = rest[groupBy === "api_key" ? "api_keys" : "customers"] as Entry[];
      const entries = byId(list, (e) => String(e[groupBy]), (e) => e.total_cost, groupBy);
      groups = Object.fromEntries(
        Object.entries(entries).map(([id, e]) => {
          const models = Object.fromEntries(e.model_details.map((m) => [m.model, m]));
          expect(Object.keys(models).length, `${where}: models of ${id} without repeats`).toBe(e.model_details.length);
          return [id, { ...e, model_details: models }];
        }),
      );
    }
    return { group_by_day, groups };
  });
}

type Activity = { results: Json[]; metadata: Json };

/** Daily activity from the log: `{results, metadata}` for the page asked. */
async function expectedActivity(db: Db, names: Names, a: ActivityAsk): Promise<Activity> {
  const entity = a.report === "team" ? sql`l.team_id` : sql`l.organization_id`;
  const where: SQL[] = [sql`${entity} is not null`, sql`${entity} <> ''`];
  const ids = [...(a.ids ?? []), ...(given(a.id) ? [a.id!] : [])];
  if (ids.length) where.push(sql`${entity} in (${sql.join(ids.map((i) => sql`${i}`), sql`, `)})`);
  if (a.exclude?.length) where.push(sql`${entity} not in (${sql.join(a.exclude.map((i) => sql`${i}`), sql`, `)})`);
  if (given(a.model)) where.push(sql`(l.model_group = ${a.model} or l.upstream_model = ${a.model})`);
  const apiKey = given(a.apiKey);
  if (apiKey) where.push(sql`l.api_key = ${tokenOf(apiKey)}`);
  if (a.start) where.push(sql`${LOG_DAY} >= ${a.start}::date`);
  if (a.end) where.push(sql`${LOG_DAY} <= ${a.end}::date`);
  const found = await rows<Row>(
    db,
    sql`select x.day::text as day, x.um, x.mg, x.pv, x.k, x.e, grouping(x.day, x.um, x.mg, x.pv, x.k, x.e)::int as g, ${SUMS}
      from (select ${LOG_DAY} as day, l.upstream_model as um, l.model_group as mg, l.provider as pv, l.api_key as k, ${entity} as e, ${SUMMED}
        from spend_logs l where ${sql.join(where, sql` and `)}) x
      group by grouping sets ((), (x.day), (x.day, x.um), (x.day, x.um, x.k), (x.day, x.mg), (x.day, x.mg, x.k), (x.day, x.pv), (x.day, x.pv, x.k),
        (x.day, x.k), (x.day, x.e), (x.day, x.e, x.k))`,
  );
  const metrics = (r: Row) => ({
    spend: decimal(String(r.spend)),
    prompt_tokens: r.prompt,
    completion_tokens: r.completion,
    cache_read_input_tokens: r.cache_read,
    cache_creation_input_tokens: r.cache_creation,
    total_tokens: Number(r.prompt) + Number(r.completion),
    successful_requests: r.ok,
    failed_requests: r.failed,
    api_requests: r.requests,
  });
  const keyMeta = (k: string) => names.keys.get(k) ?? {};
  const entityMeta = (id: string): Json => {
    if (a.report === "team") return names.teams.has(id) ? { team_alias: names.teams.get(id) } : {};
    return names.orgs.has(id) ? { organization_alias: names.orgs.get(id) } : {};
  };
  // grouping() bits, highest first: day, um, mg, pv, k, e (a set bit: summed over).
  const SLICES = [
    [16, "models", "um"],
    [8, "model_groups", "mg"],
    [4, "providers", "pv"],
    [1, "entities", "e"],
  ] as const;
  const days = new Map<string, { date: string; total_spend: string; total_tokens: number; total_requests: number; metrics: Json; breakdown: Record<string, Json> }>();
  let totals: Row | undefined;
  for (const r of [...found].sort((x, y) => Number(y.g) - Number(x.g))) {
    const g = Number(r.g);
    if (g === 63) {
      totals = r;
      continue;
    }
    const date = String(r.day);
    if (g === 31) {
      const m = metrics(r);
      days.set(date, {
        date,
        total_spend: m.spend,
        total_tokens: m.total_tokens,
        total_requests: Number(r.requests),
        metrics: m,
        breakdown: { models: {}, model_groups: {}, providers: {}, api_keys: {}, entities: {} },
      });
      continue;
    }
    const breakdown = days.get(date)!.breakdown;
    const slice = SLICES.find(([bit]) => (g & bit) === 0);
    const hasKey = (g & 2) === 0;
    if (!slice) {
      breakdown.api_keys![String(r.k)] = { metrics: metrics(r), metadata: keyMeta(String(r.k)) };
      continue;
    }
    const [, name, column] = slice;
    const entries = breakdown[name] as Record<string, { metrics: Json; metadata: Json; api_key_breakdown: Json }>;
    const id = String(r[column]);
    if (!hasKey) entries[id] = { metrics: metrics(r), metadata: name === "entities" ? entityMeta(id) : {}, api_key_breakdown: {} };
    else entries[id]!.api_key_breakdown[String(r.k)] = { metrics: metrics(r), metadata: keyMeta(String(r.k)) };
  }
  const all = [...days.values()].sort((x, y) => (x.date < y.date ? 1 : -1));
  const pageSize = a.pageSize ?? 50;
  const page = a.page ?? 1;
  const totalPages = Math.ceil(all.length / pageSize);
  const t = metrics(totals!);
  return {
    results: all.slice((page - 1) * pageSize, page * pageSize),
    metadata: {
      total_spend: t.spend,
      total_prompt_tokens: t.prompt_tokens,
      total_completion_tokens: t.completion_tokens,
      total_cache_read_input_tokens: t.cache_read_input_tokens,
      total_cache_creation_input_tokens: t.cache_creation_input_tokens,
      total_tokens: t.total_tokens,
      total_api_requests: t.api_requests,
      total_successful_requests: t.successful_requests,
      total_failed_requests: t.failed_requests,
      page,
      total_pages: totalPages,
      has_more: page < totalPages,
    },
  };
}

/** Asks every request of `asks` on `gw` and compares each answer with the log's; returns how many days' entries were compared. */
async function checkAll(gw: TestGateway, db: Db, asks: Ask[], round: string): Promise<number> {
  const names = await currentNames(db);
  let compared = 0;
  for (const a of asks) {
    const path = pathOf(a);
    const where = `seed ${SEED}, ${round}: GET ${path}`;
    const r = await requestJson<unknown>(gw, "GET", path, { key: MASTER_KEY });
    expect(r.status, `${where} → ${r.text}`).toBe(200);
    if (a.report === "spend") {
      const groupBy = a.groupBy ?? "team";
      const got = reportAsMaps(parseExact<Json[]>(r.text), groupBy, where);
      expect(got, where).toEqual(await expectedReport(db, names, a));
      compared += got.length;
    } else {
      const got = parseExact<Activity>(r.text);
      expect(got, where).toEqual(await expectedActivity(db, names, a));
      compared += got.results.length;
    }
  }
  return compared;
}

for (const backend of BACKENDS) {
  describe(`spend reports against the log, randomized (${backend}, seed ${SEED})`, () => {
    let gw: TestGateway & { databaseUrl?: string };
    let db: Db;
    let w: World;
    let asks: Ask[];
    const rng = new Random(SEED);
    /** 16-digit amounts of $1,000 and more still to hand out; with the one written for sure, five at most (their sum stays below $8,192). */
    const big = { left: 4 };

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_report_diff" });
      db = gw.host!.store.db;
      w = await seedWorld(gw);
      const entries: SpendEntry[] = [];
      // Calls on most days; one day (five ago) stays empty until the late writes.
      for (const [i, day] of DAYS.entries()) {
        if (i === 4) continue;
        for (let n = rng.int(9); n > 0; n--) entries.push(randomEntry(rng, day, rng.pick(w.callers), big));
      }
      entries.push({ ...randomEntry(rng, DAYS[2]!, rng.pick(w.callers), big), status: "success", spendPico: bigAmount(rng) });
      await writeBatch(gw.host!.store, entries);
      asks = randomAsks(rng, w, 120);
    }, 30_000);
    afterAll(async () => gw?.stop());

    test("the data set has calls on several days, 16-digit amounts of $1,000 and more, and several end users", async () => {
      const [c] = await rows<Row>(
        db,
        sql`select count(*)::int as n, count(distinct (start_time at time zone 'UTC')::date)::int as days, count(distinct api_key)::int as keys,
          count(*) filter (where spend >= 1000)::int as big, count(distinct end_user)::int as end_users from spend_logs`,
      );
      expect(c!.days as number, `seed ${SEED}`).toBeGreaterThanOrEqual(5);
      expect(c!.big as number, `seed ${SEED}`).toBeGreaterThanOrEqual(1);
      expect(c!.end_users as number, `seed ${SEED}`).toBeGreaterThanOrEqual(4);
    });

    test("answers built from the aggregates equal the log's", async () => {
      expect(await checkAll(gw, db, asks, "built")).toBeGreaterThan(20);
    }, 30_000);

    test("answers asked again (parts reused from memory) equal the log's", async () => {
      await checkAll(gw, db, asks, "reused");
    }, 30_000);

    test("after late writes to past days and today, renames and a key moved to another team, answers equal the log's", async () => {
      const pastDays = DAYS.slice(0, -1);
      const late = [DAYS[4]!, rng.pick(pastDays), rng.pick(pastDays), TODAY];
      // The moved key gets no more calls here: a key in two teams on one day is checked on its own below.
      const writers = w.callers.filter((c) => c.label !== "k-three");
      await writeBatch(
        gw.host!.store,
        late.flatMap((day) => Array.from({ length: 1 + rng.int(3) }, () => randomEntry(rng, day, rng.pick(writers), big))),
      );
      const [teamA, , teamC] = w.teams;
      const [acme] = w.orgs;
      const byLabel = (label: string) => w.callers.find((c) => c.label === label)!;
      await requestOk(gw, "POST", "/team/update", { team_id: teamA, team_alias: "alpha-team, renamed" });
      await requestOk(gw, "POST", "/key/update", { key: byLabel("k-one").token, key_alias: "k-one-renamed" });
      await requestOk(gw, "PATCH", "/organization/update", { organization_id: acme, organization_alias: "acme ü renamed" });
      await requestOk(gw, "POST", "/key/update", { key: byLabel("k-three").token, team_id: teamC });
      await checkAll(gw, db, asks, "after late writes and renames");
    }, 30_000);

    if (backend === "postgres") {
      test("a second instance on the same database, reading the stored parts, answers what the log says", async () => {
        const stored = async () => Number((await rows<Row>(db, sql`select count(*)::int as n from report_parts`))[0]!.n);
        // Parts are stored after the answers: wait until their number stops growing.
        let last = -1;
        const settled = async () => {
          const now = await stored();
          const same = now === last;
          last = now;
          return same;
        };
        expect(await until(settled, 8000)).toBe(true);
        expect(last).toBeGreaterThan(0);
        const other = await startTestGateway(CONFIG, { store: { databaseUrl: gw.databaseUrl } });
        try {
          await checkAll(other, other.host!.store.db, asks, "second instance");
          // A rename on the first instance: the other's parts (from the store and its own memory) follow.
          await requestOk(gw, "POST", "/team/update", { team_id: w.teams[1], team_alias: "beta, once more" });
          await checkAll(other, other.host!.store.db, asks, "second instance after a rename on the first");
        } finally {
          await other.stop();
        }
      }, 30_000);
    }

    // Cases this test found (both fixed), checked on their own: the randomized rounds above leave them out.

    /** The callers "k-two" and "k-four", and a call of `caller` at noon of `day` for `endUser`. */
    const twoCallers = () => [w.callers.find((c) => c.label === "k-two")!, w.callers.find((c) => c.label === "k-four")!] as const;
    const callAt = (day: string, endUser: string) => (c: Caller, spendPico: number) =>
      spendEntry(Date.parse(`${day}T12:00:00Z`), { apiKey: c.token, teamId: c.teamId, organizationId: c.orgId, userId: c.userId, endUser, spendPico });

    test("/global/spend/report?group_by=api_key&customer_id=C answers C's spend per key (it answered [])", async () => {
      const day = dayOf(Date.now() - 25 * DAY);
      const [k1, k2] = twoCallers();
      const call = callAt(day, "cust-by-key");
      await writeBatch(gw.host!.store, [call(k1, 1_500_000), call(k2, 2_500_000), call(k2, 7)]);
      // With internal_user_id the same filter takes the other path, which answers what the log says.
      await checkAll(gw, db, [{ report: "spend", groupBy: "api_key", start: day, end: day, customerId: "cust-by-key", userId: "u-cid" }], "the path with internal_user_id");
      await checkAll(gw, db, [{ report: "spend", groupBy: "api_key", start: day, end: day, customerId: "cust-by-key" }], "customer_id on the api_key report");
    });

    test("/global/spend/report writes amounts of $8,192 and more exactly on every path: internal_user_id, team with customer_id, a day summing over $9,007", async () => {
      const day = dayOf(Date.now() - 20 * DAY);
      const [k1, k2] = twoCallers();
      const call = callAt(day, "cust-big");
      // $8,847.415857622159: 16 digits, whose nearest double prints as 8847.41585762216.
      await writeBatch(gw.host!.store, [call(k1, 8_847_415_857_622_159)]);
      const exact: ReportAsk = { report: "spend", groupBy: "api_key", start: day, end: day };
      await checkAll(gw, db, [exact], "exact on the fast path"); // passes: 8847.415857622159
      const failures: string[] = [];
      const check = async (a: ReportAsk, what: string) => {
        try {
          await checkAll(gw, db, [a], what);
        } catch (err) {
          // The request, and the amounts that differ (- the log's exact sum, + the answer).
          const lines = (err instanceof Error ? err.message : String(err)).split("\n");
          failures.push([lines[0], ...lines.filter((l) => /^[-+] .*"(spend|cost|total_cost)"/.test(l))].join("\n"));
        }
      };
      await check({ ...exact, userId: "u-bob" }, "internal_user_id");
      await check({ report: "spend", start: day, end: day, customerId: "cust-big" }, "team with customer_id");
      // $5,000.000000000001 twice on one key and day: past 2^53 pico-dollars, so the whole report is summed as bigint.
      await writeBatch(gw.host!.store, [call(k2, 5_000_000_000_000_001), call(k2, 5_000_000_000_000_001)]);
      await check(exact, "a day over $9,007");
      expect(failures).toEqual([]);
    });

    test("/global/spend/report counts a key that changed teams during a day under the team each call was made in, with every filter and past $9,007", async () => {
      const day = dayOf(Date.now() - 27 * DAY);
      const [k1] = twoCallers();
      const [teamA, teamB] = w.teams.filter((t) => t !== k1.teamId) as [string, string];
      const call = (teamId: string, hour: number, spendPico: number) =>
        spendEntry(Date.parse(`${day}T${hour}:00:00Z`), { apiKey: k1.token, teamId, organizationId: k1.orgId, userId: k1.userId, endUser: "cust-mover", spendPico });
      await writeBatch(gw.host!.store, [call(teamA, 10, 25_000_000)]);
      await writeBatch(gw.host!.store, [call(teamB, 11, 35_000_000)]);
      const range = { report: "spend" as const, start: day, end: day };
      const filtered: ReportAsk[] = [
        { ...range, groupBy: "team" },
        { ...range, groupBy: "team", userId: k1.userId! },
        { ...range, groupBy: "team", customerId: "cust-mover" },
        { ...range, groupBy: "team", teamId: teamA, userId: k1.userId! },
        { ...range, groupBy: "api_key", teamId: teamA },
        { ...range, groupBy: "api_key", teamId: teamB, customerId: "cust-mover" },
        { ...range, groupBy: "customer", teamId: teamA },
      ];
      await checkAll(gw, db, filtered, "a key moved between teams");
      // $7,227 twice in team B: the day's sums pass 2^53 pico-dollars, so the report is summed as bigint.
      await writeBatch(gw.host!.store, [call(teamB, 12, 7_227_000_000_000_000), call(teamB, 13, 7_227_000_000_000_000)]);
      await checkAll(gw, db, [{ ...range, groupBy: "team" }, { ...range, groupBy: "api_key", teamId: teamA }], "a key moved between teams, past $9,007");
    });

    test("daily activity, /key/info and /team/info write amounts of $8,192 and more exactly (they wrote the nearest double)", async () => {
      const day = dayOf(Date.now() - 22 * DAY);
      const [k1] = twoCallers();
      // $8,847.415857622159 again: its nearest double prints as 8847.41585762216.
      await writeBatch(gw.host!.store, [callAt(day, "cust-activity")(k1, 8_847_415_857_622_159)]);
      const range = { start: day, end: day };
      await checkAll(gw, db, [{ report: "team", id: k1.teamId!, ...range }, { report: "org", id: k1.orgId!, ...range }, { report: "team", ...range }], "activity over $8,192");
      // The log's writer leaves the counters to the budget plugin: set them as it would.
      await db.execute(sql`update virtual_keys set spend = 8847.415857622159 where token = ${k1.token}`);
      await db.execute(sql`update teams set spend = 9007.199254740993 where team_id = ${k1.teamId}`);
      const [stored] = await rows<{ key: string; team: string }>(
        db,
        sql`select k.spend::text as key, t.spend::text as team from virtual_keys k join teams t on t.team_id = k.team_id where k.token = ${k1.token}`,
      );
      const keyInfo = await requestJson(gw, "GET", `/key/info?key=${k1.token}`);
      expect(parseExact<{ info: Json }>(keyInfo.text).info.spend, `seed ${SEED}: /key/info → ${keyInfo.text.slice(0, 300)}`).toBe(decimal(stored!.key));
      const teamInfo = await requestJson(gw, "GET", `/team/info?team_id=${k1.teamId}`);
      expect(parseExact<{ team_info: Json }>(teamInfo.text).team_info.spend, `seed ${SEED}: /team/info`).toBe(decimal(stored!.team));
    });
  });
}
