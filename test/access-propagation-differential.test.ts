// Model access and revocation across two instances, against a model of the access rules kept in
// this file, seeded random (ACCESS_DIFF_SEED=<n> runs another sequence, ACCESS_DIFF_STEPS=<n>
// a longer one; every failure names the seed, the mode, the step, both decisions and the steps
// before it).
//
// Two gateways (A and B) share one PostgreSQL database, with one Redis (pub/sub carries the
// changes) and without Redis (LISTEN/NOTIFY). The mock upstream serves four model groups (gpt-c
// and gpt-d in the config access group `cfg-grp`) and a wildcard `openai/*`. A random sequence of
// steps: admin writes through A or B (/key/generate|update|block|unblock|delete|regenerate, with
// and without a grace period; /team/new|update|block|unblock|delete, /team/model/add|delete,
// /team/member_add|member_delete; /organization/new|update|delete; /access_group/new, update and
// delete by name and by id; /user/new (with its key or not)|update|delete; /model/new|delete of a
// stored model `gpt-e`, which may declare an access group), sometimes two back to back, one
// through each instance; and, between them, calls by random keys (revoked ones and old values of
// regenerated ones too) through A and B: chat by model name and alias, /v1/models (plain and with
// include_model_access_groups) and /v1/models/{id}.
//
// The model follows README "Model access on the gateway", "Who may do what" and "Hot path", and
// the spec: key `models` (empty = the team's; `all-team-models` too), team `models` (empty = all),
// a personal key's user `models`, the org's (the key's own and its team's), entries that are names,
// `openai/*`-style wildcards, access-group names (a stored group with the deployments declaring its
// name, or either alone) and `*`;
// `access_group_ids` (a deleted group grants nothing); aliases key over team over org, an alias
// trusted only by the level that set it and those below; a refusal is a 401 whose type names the
// first level that refuses (key, team or user, org); a model nobody serves is a 400 (a 404 by id);
// `allowed_routes` (403); a blocked key, team or org, an expired key (`duration`: "0s" expires at
// once, "2s" during the run), a deleted key (also by /team/delete, /team/member_delete of its user
// in its team and /user/delete, which delete those keys) and a regenerated key's old value past
// its grace get a 401; /v1/models lists exactly the served names (and aliases) the key may call.
// Writes are predicted too (200, or the 400/404 the README's rules give: a key's models within
// its team's, a team's within its org's, an org's covering its teams', no org deleted while it
// has teams or keys, references that must exist), and the model changes only on a 200.
//
// Checks: right after a write returns on instance X, every call through X whose decision the
// write changed (and a few others) matches the model exactly (status, error type, the group that
// served, the listing); through the other instance the same calls must match within 1 s (polled;
// the slowest propagation is printed). So a revoked key never gets a 200 through X once the
// revoking write has returned, nor anywhere a second later. A write sent through the other
// instance right after one through X must get the answer the model gives after both.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { freshDatabase, MASTER_KEY, startTestGateway, type TestGateway } from "./harness/gateway.ts";
import { Random } from "./harness/random.ts";
import { redisReachable } from "./harness/util.ts";
import { type MockOpenAI, startMockOpenAI } from "./mock-upstream/openai.ts";
import { TEST_REDIS_URL } from "./harness/redis.ts";

const SEED = Number(process.env.ACCESS_DIFF_SEED ?? 917_305);
const REDIS_URL = process.env.REDIS_URL ?? TEST_REDIS_URL;
const STEPS = Number(process.env.ACCESS_DIFF_STEPS ?? 600);
/** How long the other instance may take to serve what the write decided. */
const PROPAGATION_MS = 1000;
const MODES = [
  { mode: "redis", redis: true },
  { mode: "LISTEN/NOTIFY", redis: false },
] as const;

type Json = Record<string, unknown>;

// ---- what the gateway serves

/** Exact model groups (config); `cfg-grp` is declared on two of them. */
const SERVED = ["gpt-a", "gpt-b", "gpt-c", "gpt-d"];
const CONFIG_GROUPS: Record<string, string[]> = { "cfg-grp": ["gpt-c", "gpt-d"] };
const WILDCARD = "openai/*";

/** The mock's address, for stored models made during the run. */
const MOCK_URL = { value: "" };

function configOf(mock: MockOpenAI): Json {
  const up = { api_base: mock.url, api_key: "sk-up" };
  return {
    model_list: [
      ...SERVED.map((g) => ({
        model_name: g,
        svc_params: { model: `openai/${g}-up`, ...up },
        model_info: { id: `dep-${g}`, access_groups: Object.keys(CONFIG_GROUPS).filter((n) => CONFIG_GROUPS[n]!.includes(g)) },
      })),
      { model_name: WILDCARD, svc_params: { model: WILDCARD, ...up }, model_info: { id: "dep-wild" } },
    ],
    router_settings: { disable_cooldowns: true },
    general_settings: { master_key: MASTER_KEY },
  };
}

// ---- pools the generators draw from

/** The name stored models (/model/new) serve under, while one of them lives. */
const STORED_NAME = "gpt-e";
const CALL_MODELS = ["gpt-a", "gpt-b", "gpt-c", "gpt-d", STORED_NAME, "openai/o1", "openai/o2", "fast", "cheap", "smart", "nope"];
const GROUP_NAMES = ["grp-x", "grp-y", "grp-z"];
/** Entries of a `models` list: names, a wildcard, a concrete wildcard model, access groups (config and stored), aliases, everything. */
const MODEL_ENTRIES = ["gpt-a", "gpt-b", "gpt-c", STORED_NAME, "openai/*", "openai/o1", "cfg-grp", "grp-x", "grp-y", "grp-z", "fast", "cheap", "*"];
const KEY_MODEL_ENTRIES = [...MODEL_ENTRIES, "all-team-models"];
const ALIAS_NAMES = { key: ["fast", "smart", "gpt-a"], team: ["fast", "cheap"], org: ["cheap", "smart"] };
const ALIAS_TARGETS = ["gpt-a", "gpt-b", "gpt-c", "gpt-d", STORED_NAME, "openai/o2", "nope"];
/** What an access group may hold: served groups and the wildcard route (a name nothing serves now is refused: 400). */
const GROUP_MEMBERS = ["gpt-a", "gpt-b", "gpt-d", STORED_NAME, "openai/*"];
const USERS = ["u0", "u1", "u2", "u3"];
/** `duration` values: expired at once, expires during the run, outlives it, never. */
const DURATIONS: (string | number)[] = ["0s", "2s", "1h", -1];
const DURATION_MS: Record<string, number | null> = { "0s": 0, "2s": 2000, "1h": 3_600_000, "-1": null };
/** The models an old value of a regenerated key is tried with. */
const OLD_VALUE_MODELS = ["gpt-a", "fast", STORED_NAME];

/** A chat call, the /v1/models listing (plain, or with `include_model_access_groups`), one model by id. */
type Route = "chat" | "models" | "groups" | "one";
/** Which of the probed routes an `allowed_routes` entry lets through (a model-call route is served with and without /v1). */
const ROUTE_PATTERNS: Record<string, Route[]> = {
  "/v1/chat/completions": ["chat"],
  "/chat/completions": ["chat"],
  "/v1/models": ["models", "groups"],
  "/v1/*": ["chat", "models", "groups", "one"],
  llm_api_routes: ["chat", "models", "groups", "one"],
  "/key/info": [],
  management_routes: [],
};
const PATHS: Record<Route, string[]> = {
  chat: ["/v1/chat/completions", "/chat/completions"],
  models: ["/v1/models", "/models"],
  groups: ["/v1/models?include_model_access_groups=true", "/models?include_model_access_groups=true"],
  one: ["/v1/models/", "/models/"],
};
/** Models asked for by id (`GET /v1/models/{id}`). */
const ONE_MODELS = ["gpt-a", "gpt-c", STORED_NAME, "openai/o1", "fast", "cheap"];

// ---- the model of the world

type Level = "key" | "team" | "user" | "org";

/** When a key expires: somewhere in [lo, hi] (the gateway read its clock while the write ran). */
interface Window {
  lo: number;
  hi: number;
}

interface KeyM {
  label: string;
  plain: string;
  models: string[];
  groupIds: string[];
  team: string | null;
  user: string | null;
  org: string | null;
  aliases: Record<string, string>;
  routes: string[];
  blocked: boolean;
  dead: boolean;
  expires: Window | null;
  /** Old values of a regenerated key that still work until their grace period ends. */
  olds: { plain: string; until: Window }[];
}
interface TeamM {
  id: string;
  models: string[];
  groupIds: string[];
  org: string | null;
  aliases: Record<string, string>;
  blocked: boolean;
}
interface OrgM {
  id: string;
  models: string[];
  aliases: Record<string, string>;
  blocked: boolean;
}
interface GroupM {
  id: string;
  name: string;
  models: string[];
}

class World {
  keys: KeyM[] = [];
  /** Live teams; `teamIds` every id ever taken (a deleted team's id is not reused). */
  teams = new Map<string, TeamM>();
  teamIds = new Set<string>();
  orgs = new Map<string, OrgM>();
  users = new Map<string, { models: string[] }>();
  /** Live stored access groups by id; `groupIds` every id ever made (deleted ones stay referenced). */
  groups = new Map<string, GroupM>();
  groupIds: string[] = [];
  /** Team memberships: team → users. */
  members = new Map<string, Set<string>>();
  /** Stored models (/model/new) by id: their group name and the access groups they declare. */
  stored = new Map<string, { name: string; groups: string[] }>();
  storedIds: string[] = [];
  next = { team: 0, org: 0, key: 0, model: 0 };
  /** What the last write made (`created`), and what the generators prefer to name (`fresh`: a write sent right after it, through the other instance). */
  created: { team?: string; org?: string; group?: string } = {};
  fresh: { team?: string; org?: string; group?: string } = {};
}

const EVERYTHING = new Set(["*", "all-proxy-models"]);
const INHERIT = "all-team-models";

/** `entry` names `model`: itself, everything, or a pattern with one `*`. */
function covers(entry: string, model: string): boolean {
  if (entry === model || EVERYTHING.has(entry)) return true;
  const star = entry.indexOf("*");
  if (star < 0) return false;
  const [head, tail] = [entry.slice(0, star), entry.slice(star + 1)];
  return model.length >= head.length + tail.length && model.startsWith(head) && model.endsWith(tail);
}

/** Model groups served now: the config's and the stored models' names. */
function servedNames(w: World): string[] {
  return [...new Set([...SERVED, ...[...w.stored.values()].map((m) => m.name)])];
}

/** Access groups declared on deployments (config and stored models), name → model names. */
function declaredGroup(w: World, name: string): string[] | undefined {
  const members = [...(CONFIG_GROUPS[name] ?? []), ...[...w.stored.values()].filter((m) => m.groups.includes(name)).map((m) => m.name)];
  return members.length > 0 ? [...new Set(members)] : undefined;
}

/** A stored group's models and those of the deployments that declare its name, together (either may be missing). */
function joined(stored: string[] | undefined, declared: string[] | undefined): string[] | undefined {
  return stored && declared ? [...new Set([...stored, ...declared])] : (stored ?? declared);
}

/** An access group by name: a stored one's models with those of the deployments declaring it. */
function groupByName(w: World, name: string): string[] | undefined {
  return joined([...w.groups.values()].find((g) => g.name === name)?.models, declaredGroup(w, name));
}

/** A stored access group by id, with the deployments declaring its name. */
function groupById(w: World, id: string): string[] | undefined {
  const g = w.groups.get(id);
  return g && joined(g.models, declaredGroup(w, g.name));
}

/** A level's list (and access group ids) allows `model`; an empty one (or `all-team-models`) restricts nothing. */
function allows(w: World, models: string[], ids: string[], model: string): boolean {
  if (models.includes(INHERIT) || (models.length === 0 && ids.length === 0)) return true;
  const inGroup = (members: string[] | undefined) => members?.some((m) => covers(m, model)) ?? false;
  return models.some((e) => covers(e, model) || inGroup(groupByName(w, e))) || ids.some((id) => inGroup(groupById(w, id)));
}

/** The model group that serves `target` (a wildcard route serves the name asked for), if any. */
function served(w: World, target: string): string | undefined {
  return servedNames(w).includes(target) || (covers(WILDCARD, target) && target !== WILDCARD) ? target : undefined;
}

function orgsOf(w: World, k: Pick<KeyM, "team" | "org">): OrgM[] {
  const team = k.team ? w.teams.get(k.team) : undefined;
  const ids = [...new Set([k.org, team?.org].filter((id): id is string => !!id))];
  return ids.map((id) => w.orgs.get(id)).filter((o): o is OrgM => o !== undefined);
}

interface LevelM {
  level: Level;
  models: string[];
  ids: string[];
}

function levelsOf(w: World, k: KeyM): LevelM[] {
  const out: LevelM[] = [{ level: "key", models: k.models, ids: k.groupIds }];
  const team = k.team ? w.teams.get(k.team) : undefined;
  const user = k.user ? w.users.get(k.user) : undefined;
  // A team key is bound by its team; a personal key by its user.
  if (team) out.push({ level: "team", models: team.models, ids: team.groupIds });
  else if (user) out.push({ level: "user", models: user.models, ids: [] });
  for (const org of orgsOf(w, k)) out.push({ level: "org", models: org.models, ids: [] });
  return out;
}

type AliasFrom = "key" | "team" | "org";
/** The levels an alias speaks for: the one that set it and those below it (a key alias cannot lift its team's list). */
const ALIAS_SPEAKS_FOR: Record<AliasFrom, Level[]> = { key: ["key"], team: ["key", "team", "user"], org: ["key", "team", "user", "org"] };

type Aliases = Map<string, { target: string; from: AliasFrom }>;

/** Alias maps of several levels, the later (more specific) winning. */
function levelAliases(sets: [AliasFrom, Record<string, string> | undefined][]): Aliases {
  const out: Aliases = new Map();
  for (const [from, map] of sets) for (const [name, target] of Object.entries(map ?? {})) out.set(name, { target, from });
  return out;
}

/** Aliases, key over team over org. */
function aliasesOf(w: World, k: Pick<KeyM, "team" | "org" | "aliases">): Aliases {
  const team = k.team ? w.teams.get(k.team) : undefined;
  return levelAliases([...orgsOf(w, k).map((o): [AliasFrom, Record<string, string>] => ["org", o.aliases]), ["team", team?.aliases], ["key", k.aliases]]);
}

/** The first of `levels` that refuses `requested` (after `aliases`), and the name it goes to. */
function refusal(w: World, levels: LevelM[], aliases: Aliases, requested: string): { denied?: Level; target: string } {
  const alias = aliases.get(requested);
  const target = alias?.target ?? requested;
  for (const l of levels) {
    if (allows(w, l.models, l.ids, target)) continue;
    if (alias && target !== requested && ALIAS_SPEAKS_FOR[alias.from].includes(l.level) && allows(w, l.models, l.ids, requested)) continue;
    return { denied: l.level, target };
  }
  return { target };
}

function access(w: World, k: KeyM, requested: string): { denied?: Level; target: string } {
  return refusal(w, levelsOf(w, k), aliasesOf(w, k), requested);
}

/** What /v1/models lists: served names, names its levels (and their groups) name, and aliases, that the key may call. */
function listing(w: World, k: KeyM): string[] {
  const aliases = aliasesOf(w, k);
  const named = new Set<string>(servedNames(w));
  for (const l of levelsOf(w, k)) {
    for (const e of l.models) for (const m of [e, ...(groupByName(w, e) ?? [])]) named.add(m);
    for (const id of l.ids) for (const m of groupById(w, id) ?? []) named.add(m);
  }
  const candidates = new Set([...named].filter((n) => !n.includes("*") && served(w, n)));
  for (const name of aliases.keys()) candidates.add(name);
  return [...candidates].filter((n) => !access(w, k, n).denied && served(w, aliases.get(n)?.target ?? n)).sort();
}

/**
 * With `include_model_access_groups`: also the access groups the key holds (those its restricting
 * levels name, by name or id; every group when no level restricts it) whose every model it may call.
 */
function heldGroups(w: World, k: KeyM, listed: string[]): string[] {
  const restricting = levelsOf(w, k).filter((l) => !l.models.includes(INHERIT) && (l.models.length > 0 || l.ids.length > 0));
  const names = new Set<string>();
  if (restricting.length === 0) {
    const declared = [...Object.keys(CONFIG_GROUPS), ...[...w.stored.values()].flatMap((m) => m.groups)];
    for (const n of [...declared, ...[...w.groups.values()].map((g) => g.name)]) names.add(n);
  }
  for (const l of restricting) {
    for (const e of l.models) if (groupByName(w, e)) names.add(e);
    for (const id of l.ids) if (w.groups.has(id)) names.add(w.groups.get(id)!.name);
  }
  return [...names].filter((n) => !listed.includes(n) && (groupByName(w, n) ?? []).every((m) => !access(w, k, m).denied));
}

interface Probe {
  key: KeyM;
  route: Route;
  model?: string;
  /** An old value of a regenerated key, used while its grace period lasts. */
  old?: { plain: string; until: Window };
}

interface Outcome {
  status: number;
  type?: string;
  /** x-svc-model-group of an answered call. */
  group?: string;
  list?: string[];
}

const UNKNOWN: Outcome = { status: 401, type: "authentication_error" };
const EXPIRED: Outcome = { status: 401, type: "expired_key" };

function decideLive(w: World, p: Probe): Outcome {
  const k = p.key;
  if (k.blocked) return UNKNOWN;
  const team = k.team ? w.teams.get(k.team) : undefined;
  if (k.team && !team) return UNKNOWN;
  if (team?.blocked) return UNKNOWN;
  if (orgsOf(w, k).some((o) => o.blocked)) return UNKNOWN;
  if (k.routes.length > 0 && !k.routes.some((r) => ROUTE_PATTERNS[r]!.includes(p.route))) return { status: 403, type: "permission_error" };
  if (p.route === "models") return { status: 200, list: listing(w, k) };
  if (p.route === "groups") {
    const list = listing(w, k);
    return { status: 200, list: [...list, ...heldGroups(w, k, list)].sort() };
  }
  const { denied, target } = access(w, k, p.model!);
  // By id: what the key may call and something serves, else a 404 (whichever level refuses).
  if (p.route === "one") return denied || !served(w, target) ? { status: 404, type: "not_found_error" } : { status: 200, group: p.model };
  if (denied) return { status: 401, type: `${denied}_model_access_denied` };
  const group = served(w, target);
  if (!group) return { status: 400, type: "invalid_request_error" };
  return { status: 200, group };
}

/** Every outcome the model accepts for a call that started at t0 and ended at t1 (two while the key expires meanwhile). */
function decide(w: World, p: Probe, t0: number, t1: number): Outcome[] {
  if (p.key.dead) return [UNKNOWN];
  // An old value after its grace period is no key at all.
  const grace = p.old?.until;
  if (grace && grace.hi <= t0) return [UNKNOWN];
  const exp = p.key.expires;
  const out = exp && exp.hi <= t0 ? [EXPIRED] : exp && exp.lo <= t1 ? [EXPIRED, decideLive(w, p)] : [decideLive(w, p)];
  return grace && grace.lo <= t1 ? [UNKNOWN, ...out] : out;
}

function same(a: Outcome, b: Outcome): boolean {
  return a.status === b.status && a.type === b.type && a.group === b.group && JSON.stringify(a.list) === JSON.stringify(b.list);
}

// ---- the write rules the model predicts (README "Model access", "Who may do what"; the spec's 400s and 404s)

/**
 * A list (`models`, access group ids) names only what a call through the levels above it may use:
 * each entry's models (every model of an access group, named or by id; `*` only where no level
 * above restricts; `all-team-models` always), judged as a call is, aliases included.
 */
function listOutside(w: World, above: LevelM[], aliases: Aliases, models: string[], ids: string[]): boolean {
  const may = (m: string) => !refusal(w, above, aliases, m).denied;
  const open = above.every((l) => l.models.includes(INHERIT) || (l.models.length === 0 && l.ids.length === 0) || l.models.some((m) => EVERYTHING.has(m)));
  const fits = (e: string) => {
    if (e === INHERIT) return true;
    if (EVERYTHING.has(e)) return open;
    const members = groupByName(w, e);
    return members && members.length > 0 ? members.every(may) : may(e);
  };
  return models.some((e) => !fits(e)) || ids.some((id) => !(groupById(w, id) ?? []).every(may));
}

/** A key's list within its team's (with the aliases of the key, its team and its orgs). */
function outsideTeam(w: World, k: Pick<KeyM, "models" | "groupIds" | "team" | "org" | "aliases">): boolean {
  const team = k.team ? w.teams.get(k.team) : undefined;
  return team !== undefined && listOutside(w, [{ level: "team", models: team.models, ids: team.groupIds }], aliasesOf(w, k), k.models, k.groupIds);
}

/** A team's list within its org's (with the org's and the team's aliases). */
function outsideOrg(w: World, t: Pick<TeamM, "models" | "groupIds" | "aliases">, org: Pick<OrgM, "models" | "aliases">): boolean {
  return listOutside(w, [{ level: "org", models: org.models, ids: [] }], levelAliases([["org", org.aliases], ["team", t.aliases]]), t.models, t.groupIds);
}

// ---- writes: generator, predicted status, what a 200 changes

interface Write {
  what: string;
  method: "POST" | "PUT" | "PATCH" | "DELETE";
  path: string;
  body?: Json;
  expect: number;
  /** Applied to the model on a 200 (the write ran between `window.lo` and `window.hi`). */
  apply?(reply: Json, window: Window): void;
}

const someOf = (rng: Random, pool: readonly string[], empty = 0.3): string[] => (rng.chance(empty) ? [] : rng.some(pool, 3));
const aliasMap = (rng: Random, names: readonly string[]): Record<string, string> => Object.fromEntries(rng.some(names, 2).map((n) => [n, rng.pick(ALIAS_TARGETS)]));
const liveKeys = (w: World) => w.keys.filter((k) => !k.dead);
function expiresOf(duration: unknown, at: Window): Window | null {
  const ms = DURATION_MS[String(duration)];
  return ms === null || ms === undefined ? null : { lo: at.lo + ms, hi: at.hi + ms };
}
/** A live team mostly; now and then a deleted or unknown one. */
function teamRef(w: World, rng: Random): string {
  if (w.fresh.team && rng.chance(0.8)) return w.fresh.team;
  const live = [...w.teams.keys()];
  if (live.length > 0 && rng.chance(0.9)) return rng.pick(live);
  return rng.chance(0.5) && w.teamIds.size > 0 ? rng.pick([...w.teamIds]) : "t-none";
}
function orgRef(w: World, rng: Random): string {
  if (w.fresh.org && rng.chance(0.8)) return w.fresh.org;
  const live = [...w.orgs.keys()];
  return live.length > 0 && rng.chance(0.92) ? rng.pick(live) : "o-none";
}
/** A key to act on: live mostly, sometimes a revoked one (404). */
function keyRef(w: World, rng: Random): KeyM | undefined {
  const live = liveKeys(w);
  if (live.length > 0 && rng.chance(0.92)) return rng.pick(live);
  return w.keys.length > 0 ? rng.pick(w.keys) : undefined;
}
function groupIdsRef(w: World, rng: Random): string[] {
  if (w.fresh.group && rng.chance(0.8)) return [w.fresh.group];
  return w.groupIds.length > 0 ? rng.some(w.groupIds, 2) : [];
}
/** How a write names a key: its value or its hash, now and then an old value still in its grace period. */
function keyOf(k: KeyM, rng: Random): string {
  const olds = k.olds.filter((o) => o.until.lo > Date.now() + 60_000);
  if (olds.length > 0 && rng.chance(0.2)) return rng.pick(olds).plain;
  return rng.chance(0.5) ? k.plain : sha256(k.plain);
}
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

function newKey(w: World, fields: Partial<KeyM> & { plain: string }): KeyM {
  const k: KeyM = { label: `k${w.next.key++}`, models: [], groupIds: [], team: null, user: null, org: null, aliases: {}, routes: [], blocked: false, dead: false, expires: null, olds: [], ...fields };
  w.keys.push(k);
  return k;
}

const WRITES: { name: string; weight: (w: World) => number; make: (w: World, rng: Random) => Write | undefined }[] = [
  {
    name: "key/generate",
    weight: (w) => (liveKeys(w).length < 3 ? 30 : liveKeys(w).length < 9 ? 10 : 0),
    make: (w, rng) => {
      const body: Json = {};
      if (rng.chance(0.55)) body.team_id = teamRef(w, rng);
      if (rng.chance(0.4)) body.user_id = rng.pick(USERS);
      if (!body.team_id && rng.chance(0.3)) body.organization_id = orgRef(w, rng);
      if (rng.chance(0.6)) body.models = someOf(rng, KEY_MODEL_ENTRIES, 0);
      if (rng.chance(0.2)) body.access_group_ids = groupIdsRef(w, rng);
      if (rng.chance(0.3)) body.aliases = aliasMap(rng, ALIAS_NAMES.key);
      if (rng.chance(0.2)) body.allowed_routes = rng.some(Object.keys(ROUTE_PATTERNS), 2);
      if (rng.chance(0.2)) body.duration = rng.pick(DURATIONS);
      if (rng.chance(0.08)) body.blocked = true;
      const team = (body.team_id as string | undefined) ?? null;
      const models = (body.models as string[] | undefined) ?? [];
      const unknownGroup = ((body.access_group_ids as string[] | undefined) ?? []).some((g) => !w.groups.has(g));
      const listed = { models, groupIds: (body.access_group_ids as string[] | undefined) ?? [], team, org: (body.organization_id as string | undefined) ?? null, aliases: (body.aliases as Record<string, string> | undefined) ?? {} };
      const refused = (team && !w.teams.has(team)) || (body.organization_id && !w.orgs.has(body.organization_id as string)) || outsideTeam(w, listed) || unknownGroup;
      return {
        what: `key/generate ${JSON.stringify(body)}`,
        method: "POST",
        path: "/key/generate",
        body,
        expect: refused ? 400 : 200,
        apply(reply, at) {
          const user = (body.user_id as string | undefined) ?? null;
          if (user && !w.users.has(user)) w.users.set(user, { models: [] });
          newKey(w, {
            plain: reply.key as string,
            models,
            groupIds: (body.access_group_ids as string[] | undefined) ?? [],
            team,
            user,
            org: (body.organization_id as string | undefined) ?? null,
            aliases: (body.aliases as Record<string, string> | undefined) ?? {},
            routes: (body.allowed_routes as string[] | undefined) ?? [],
            blocked: body.blocked === true,
            expires: expiresOf(body.duration, at),
          });
        },
      };
    },
  },
  {
    name: "key/update",
    weight: () => 14,
    make: (w, rng) => {
      const k = keyRef(w, rng);
      if (!k) return undefined;
      const body: Json = { key: keyOf(k, rng) };
      const fields = rng.some(["models", "team_id", "user_id", "organization_id", "aliases", "allowed_routes", "duration", "access_group_ids", "blocked"], 2);
      for (const f of fields) {
        if (f === "models") body.models = someOf(rng, KEY_MODEL_ENTRIES);
        if (f === "team_id") body.team_id = rng.chance(0.25) ? null : teamRef(w, rng);
        if (f === "user_id") body.user_id = rng.chance(0.25) ? null : rng.pick(USERS);
        if (f === "organization_id") body.organization_id = rng.chance(0.4) ? null : orgRef(w, rng);
        if (f === "aliases") body.aliases = rng.chance(0.25) ? {} : aliasMap(rng, ALIAS_NAMES.key);
        if (f === "allowed_routes") body.allowed_routes = rng.chance(0.4) ? [] : rng.some(Object.keys(ROUTE_PATTERNS), 2);
        if (f === "duration") body.duration = rng.pick(DURATIONS);
        if (f === "access_group_ids") body.access_group_ids = rng.chance(0.4) ? [] : groupIdsRef(w, rng);
        if (f === "blocked") body.blocked = rng.chance(0.5);
      }
      const team = "team_id" in body ? (body.team_id as string | null) : k.team;
      const teamChanged = team !== k.team;
      const org = body.organization_id as string | null | undefined;
      const models = (body.models as string[] | undefined) ?? k.models;
      let expect = 200;
      if (k.dead) expect = 404;
      else if (teamChanged && team && !w.teams.has(team)) expect = 400;
      else if (org && org !== k.org && !w.orgs.has(org)) expect = 400;
      else if (
        (teamChanged || "models" in body || "access_group_ids" in body) &&
        outsideTeam(w, {
          models,
          groupIds: (body.access_group_ids as string[] | undefined) ?? k.groupIds,
          team,
          org: "organization_id" in body ? (org ?? null) : k.org,
          aliases: (body.aliases as Record<string, string> | undefined) ?? k.aliases,
        })
      )
        expect = 400;
      // Ids the key already has may name groups deleted since; a new one must exist.
      else if (((body.access_group_ids as string[] | undefined) ?? []).some((g) => !k.groupIds.includes(g) && !w.groups.has(g))) expect = 400;
      return {
        what: `key/update ${k.label} ${JSON.stringify({ ...body, key: undefined })}`,
        method: "POST",
        path: "/key/update",
        body,
        expect,
        apply(_reply, at) {
          k.team = team;
          k.models = models;
          if ("user_id" in body) {
            k.user = body.user_id as string | null;
            if (k.user && !w.users.has(k.user)) w.users.set(k.user, { models: [] });
          }
          if ("organization_id" in body) k.org = org ?? null;
          if ("aliases" in body) k.aliases = body.aliases as Record<string, string>;
          if ("allowed_routes" in body) k.routes = body.allowed_routes as string[];
          if ("duration" in body) k.expires = expiresOf(body.duration, at);
          if ("access_group_ids" in body) k.groupIds = body.access_group_ids as string[];
          if ("blocked" in body) k.blocked = body.blocked as boolean;
        },
      };
    },
  },
  ...(["block", "unblock"] as const).map((action) => ({
    name: `key/${action}`,
    weight: () => (action === "block" ? 4 : 3),
    make: (w: World, rng: Random): Write | undefined => {
      const k = keyRef(w, rng);
      if (!k) return undefined;
      return {
        what: `key/${action} ${k.label}`,
        method: "POST",
        path: `/key/${action}`,
        body: { key: keyOf(k, rng) },
        expect: k.dead ? 404 : 200,
        apply: () => {
          k.blocked = action === "block";
        },
      };
    },
  })),
  {
    name: "key/delete",
    weight: (w) => (liveKeys(w).length > 3 ? 4 : 1),
    make: (w, rng) => {
      const k = keyRef(w, rng);
      if (!k) return undefined;
      return {
        what: `key/delete ${k.label}`,
        method: "POST",
        path: "/key/delete",
        body: { keys: [keyOf(k, rng)] },
        expect: k.dead ? 404 : 200,
        apply: () => {
          k.dead = true;
        },
      };
    },
  },
  {
    name: "team/new",
    weight: (w) => (w.teams.size < 2 ? 20 : w.teams.size < 5 ? 4 : 0),
    make: (w, rng) => {
      const id = w.teamIds.size > 0 && rng.chance(0.05) ? rng.pick([...w.teamIds]) : `t${w.next.team++}`;
      const body: Json = { team_id: id };
      if (rng.chance(0.6)) body.models = someOf(rng, MODEL_ENTRIES);
      if (rng.chance(0.5)) body.organization_id = orgRef(w, rng);
      if (rng.chance(0.35)) body.model_aliases = aliasMap(rng, ALIAS_NAMES.team);
      if (rng.chance(0.2)) body.access_group_ids = groupIdsRef(w, rng);
      if (rng.chance(0.05)) body.blocked = true;
      const models = (body.models as string[] | undefined) ?? [];
      const groupIds = (body.access_group_ids as string[] | undefined) ?? [];
      const org = (body.organization_id as string | undefined) ?? null;
      const aliases = (body.model_aliases as Record<string, string> | undefined) ?? {};
      const refused = w.teamIds.has(id) || groupIds.some((g) => !w.groups.has(g)) || (org !== null && (!w.orgs.has(org) || outsideOrg(w, { models, groupIds, aliases }, w.orgs.get(org)!)));
      return {
        what: `team/new ${JSON.stringify(body)}`,
        method: "POST",
        path: "/team/new",
        body,
        expect: refused ? 400 : 200,
        apply: () => {
          w.teamIds.add(id);
          w.created.team = id;
          w.teams.set(id, { id, models, groupIds, org, aliases, blocked: body.blocked === true });
        },
      };
    },
  },
  {
    name: "team/update",
    weight: () => 8,
    make: (w, rng) => {
      if (w.teamIds.size === 0) return undefined;
      const id = teamRef(w, rng);
      const t = w.teams.get(id);
      const body: Json = { team_id: id };
      for (const f of rng.some(["models", "organization_id", "model_aliases", "access_group_ids", "blocked"], 2)) {
        if (f === "models") body.models = someOf(rng, MODEL_ENTRIES);
        if (f === "organization_id") body.organization_id = rng.chance(0.3) ? null : orgRef(w, rng);
        if (f === "model_aliases") body.model_aliases = rng.chance(0.25) ? {} : aliasMap(rng, ALIAS_NAMES.team);
        if (f === "access_group_ids") body.access_group_ids = rng.chance(0.3) ? [] : groupIdsRef(w, rng);
        if (f === "blocked") body.blocked = rng.chance(0.5);
      }
      const models = (body.models as string[] | undefined) ?? t?.models ?? [];
      const org = "organization_id" in body ? (body.organization_id as string | null) : (t?.org ?? null);
      const groupIds = (body.access_group_ids as string[] | undefined) ?? t?.groupIds ?? [];
      let expect = 200;
      if (!t) expect = 404;
      else if (((body.access_group_ids as string[] | undefined) ?? []).some((g) => !w.groups.has(g))) expect = 400;
      else if (
        ("organization_id" in body || "models" in body || "access_group_ids" in body) &&
        org !== null &&
        (!w.orgs.has(org) || outsideOrg(w, { models, groupIds, aliases: (body.model_aliases as Record<string, string> | undefined) ?? t.aliases }, w.orgs.get(org)!))
      )
        expect = 400;
      return {
        what: `team/update ${JSON.stringify(body)}`,
        method: "POST",
        path: "/team/update",
        body,
        expect,
        apply: () => {
          Object.assign(t!, { models, org, groupIds });
          if ("model_aliases" in body) t!.aliases = body.model_aliases as Record<string, string>;
          if ("blocked" in body) t!.blocked = body.blocked as boolean;
        },
      };
    },
  },
  ...(["block", "unblock"] as const).map((action) => ({
    name: `team/${action}`,
    weight: () => 3,
    make: (w: World, rng: Random): Write | undefined => {
      if (w.teamIds.size === 0) return undefined;
      const id = teamRef(w, rng);
      const t = w.teams.get(id);
      return {
        what: `team/${action} ${id}`,
        method: "POST",
        path: `/team/${action}`,
        body: { team_id: id },
        expect: t ? 200 : 404,
        apply: () => {
          t!.blocked = action === "block";
        },
      };
    },
  })),
  ...(["add", "delete"] as const).map((action) => ({
    name: `team/model/${action}`,
    weight: () => 3,
    make: (w: World, rng: Random): Write | undefined => {
      if (w.teamIds.size === 0) return undefined;
      const id = teamRef(w, rng);
      const t = w.teams.get(id);
      const models = action === "delete" && t && t.models.length > 0 && rng.chance(0.8) ? rng.some(t.models, 2) : rng.some(MODEL_ENTRIES, 2);
      const after = action === "add" ? [...new Set([...(t?.models ?? []), ...models])] : (t?.models ?? []).filter((m) => !models.includes(m));
      let expect = 200;
      if (!t) expect = 404;
      else if (action === "add" && t.org && outsideOrg(w, { ...t, models: after }, w.orgs.get(t.org)!)) expect = 400;
      // Nothing to remove, or removing the last model of a team no access_group_ids restrict (an empty list would allow everything): refused.
      else if (action === "delete" && (!models.some((m) => t.models.includes(m)) || (after.length === 0 && t.groupIds.length === 0))) expect = 400;
      return {
        what: `team/model/${action} ${id} ${JSON.stringify(models)}`,
        method: "POST",
        path: `/team/model/${action}`,
        body: { team_id: id, models },
        expect,
        apply: () => {
          t!.models = after;
        },
      };
    },
  })),
  {
    name: "team/delete",
    weight: (w) => (w.teams.size > 2 ? 1.5 : 0),
    make: (w, rng) => {
      const id = teamRef(w, rng);
      return {
        what: `team/delete ${id}`,
        method: "POST",
        path: "/team/delete",
        body: { team_ids: [id] },
        expect: w.teams.has(id) ? 200 : 404,
        apply: () => {
          w.teams.delete(id);
          w.members.delete(id);
          // The team's keys are deleted with it.
          for (const k of w.keys) if (k.team === id) k.dead = true;
        },
      };
    },
  },
  {
    name: "organization/new",
    weight: (w) => (w.orgs.size < 1 ? 15 : w.orgs.size < 3 ? 3 : 0),
    make: (w, rng) => {
      const id = w.orgs.size > 0 && rng.chance(0.05) ? rng.pick([...w.orgs.keys()]) : `o${w.next.org++}`;
      const body: Json = { organization_id: id, organization_alias: id };
      if (rng.chance(0.6)) body.models = someOf(rng, MODEL_ENTRIES);
      if (rng.chance(0.35)) body.model_aliases = aliasMap(rng, ALIAS_NAMES.org);
      if (rng.chance(0.05)) body.blocked = true;
      return {
        what: `organization/new ${JSON.stringify(body)}`,
        method: "POST",
        path: "/organization/new",
        body,
        expect: w.orgs.has(id) ? 400 : 200,
        apply: () => {
          w.created.org = id;
          w.orgs.set(id, { id, models: (body.models as string[] | undefined) ?? [], aliases: (body.model_aliases as Record<string, string> | undefined) ?? {}, blocked: body.blocked === true });
        },
      };
    },
  },
  {
    name: "organization/update",
    weight: (w) => (w.orgs.size > 0 ? 6 : 0),
    make: (w, rng) => {
      const id = orgRef(w, rng);
      const o = w.orgs.get(id);
      const body: Json = { organization_id: id };
      for (const f of rng.some(["models", "blocked", "model_aliases"], 2)) {
        if (f === "models") body.models = someOf(rng, MODEL_ENTRIES);
        if (f === "blocked") body.blocked = rng.chance(0.45);
        if (f === "model_aliases") body.model_aliases = rng.chance(0.25) ? {} : aliasMap(rng, ALIAS_NAMES.org);
      }
      let expect = 200;
      if (!o) expect = 404;
      // The org's models must keep covering its teams' models.
      else if (body.models) {
        const after = { models: body.models as string[], aliases: (body.model_aliases as Record<string, string> | undefined) ?? o.aliases };
        if ([...w.teams.values()].some((t) => t.org === id && outsideOrg(w, t, after))) expect = 400;
      }
      return {
        what: `organization/update ${JSON.stringify(body)}`,
        method: "PATCH",
        path: "/organization/update",
        body,
        expect,
        apply: () => {
          if ("models" in body) o!.models = body.models as string[];
          if ("blocked" in body) o!.blocked = body.blocked as boolean;
          if ("model_aliases" in body) o!.aliases = body.model_aliases as Record<string, string>;
        },
      };
    },
  },
  {
    name: "access_group/new",
    weight: (w) => (w.groups.size < 2 ? 5 : 2),
    make: (w, rng) => {
      const name = rng.chance(0.08) ? "cfg-grp" : rng.pick(GROUP_NAMES);
      const models = rng.some(rng.chance(0.06) ? [...GROUP_MEMBERS, "nope"] : GROUP_MEMBERS, 2);
      const refused = models.some((m) => !servedNames(w).includes(m) && m !== WILDCARD) || groupByName(w, name) !== undefined;
      return {
        what: `access_group/new ${name} ${JSON.stringify(models)}`,
        method: "POST",
        path: "/access_group/new",
        body: { access_group: name, model_names: models },
        expect: refused ? 400 : 200,
        apply: (reply) => {
          const id = reply.access_group_id as string;
          w.groups.set(id, { id, name, models });
          w.groupIds.push(id);
          w.created.group = id;
        },
      };
    },
  },
  ...(["update", "delete"] as const).map((action) => ({
    name: `access_group/${action}`,
    weight: (w: World) => (w.groupIds.length === 0 ? 0 : action === "update" ? 3 : 1.5),
    make: (w: World, rng: Random): Write | undefined => {
      // By id or by name: a live group mostly, else a deleted one or the config's (changed only through its deployments).
      const live = [...w.groups.values()];
      const g = live.length > 0 && rng.chance(0.85) ? rng.pick(live) : undefined;
      const byId = rng.chance(0.5);
      const id = g?.id ?? rng.pick(w.groupIds);
      const name = g?.name ?? (rng.chance(0.5) ? "cfg-grp" : rng.pick(GROUP_NAMES));
      const path = byId ? `/v1/access_group/${id}` : action === "update" ? `/access_group/${name}/update` : `/access_group/${name}/delete`;
      const target = byId ? w.groups.get(id) : [...w.groups.values()].find((x) => x.name === name);
      const models = rng.some(GROUP_MEMBERS, 2);
      let expect = 200;
      if (!target) expect = !byId && declaredGroup(w, name) ? 400 : 404;
      else if (action === "update" && models.some((m) => !servedNames(w).includes(m) && m !== WILDCARD)) expect = 400;
      return {
        what: `access_group/${action} ${path}${action === "update" ? ` ${JSON.stringify(models)}` : ""}`,
        method: action === "update" ? "PUT" : "DELETE",
        path,
        body: action === "update" ? { model_names: models } : undefined,
        expect,
        apply: () => {
          if (action === "update") target!.models = models;
          else w.groups.delete(target!.id);
        },
      };
    },
  })),
  {
    name: "user/new",
    weight: () => 2,
    make: (w, rng) => {
      const id = rng.pick(USERS);
      const body: Json = { user_id: id, auto_create_key: rng.chance(0.4) };
      if (rng.chance(0.6)) body.models = someOf(rng, MODEL_ENTRIES);
      return {
        what: `user/new ${JSON.stringify(body)}`,
        method: "POST",
        path: "/user/new",
        body,
        expect: w.users.has(id) ? 400 : 200,
        apply: (reply) => {
          w.users.set(id, { models: (body.models as string[] | undefined) ?? [] });
          // The user's own key, made with it.
          if (body.auto_create_key) newKey(w, { plain: reply.key as string, user: id });
        },
      };
    },
  },
  {
    name: "user/update",
    weight: () => 3,
    make: (w, rng) => {
      const id = rng.pick(USERS);
      const models = someOf(rng, MODEL_ENTRIES);
      return {
        what: `user/update ${id} ${JSON.stringify(models)}`,
        method: "POST",
        path: "/user/update",
        body: { user_id: id, models },
        expect: w.users.has(id) ? 200 : 404,
        apply: () => {
          w.users.get(id)!.models = models;
        },
      };
    },
  },
  {
    name: "user/delete",
    weight: () => 1,
    make: (w, rng) => {
      const id = rng.pick(USERS);
      return {
        what: `user/delete ${id}`,
        method: "POST",
        path: "/user/delete",
        body: { user_ids: [id] },
        expect: w.users.has(id) ? 200 : 404,
        apply: () => {
          w.users.delete(id);
          for (const m of w.members.values()) m.delete(id);
          // A deleted user's keys, personal and in teams, are deleted with it.
          for (const k of w.keys) if (k.user === id) k.dead = true;
        },
      };
    },
  },
  {
    name: "key/regenerate",
    weight: () => 2,
    make: (w, rng) => {
      const k = keyRef(w, rng);
      if (!k) return undefined;
      const grace = rng.pick([undefined, undefined, "1h", "2s"]);
      return {
        what: `key/regenerate ${k.label}${grace ? ` grace ${grace}` : ""}`,
        method: "POST",
        path: "/key/regenerate",
        body: { key: keyOf(k, rng), ...(grace ? { grace_period: grace } : {}) },
        expect: k.dead ? 404 : 200,
        apply: (reply, at) => {
          // The key lives on under its new value; the old one works for the grace period (earlier
          // old values too, now leading to the new one), else it dies at once.
          if (grace) k.olds.push({ plain: k.plain, until: expiresOf(grace, at)! });
          else newKey(w, { ...k, dead: true, olds: [], label: `${k.label}-old${w.next.key}` });
          k.plain = reply.key as string;
        },
      };
    },
  },
  {
    name: "team/member_add",
    weight: (w) => (w.teams.size > 0 ? 2 : 0),
    make: (w, rng) => {
      const id = teamRef(w, rng);
      const user = rng.pick(USERS);
      let expect = 200;
      if (!w.teams.has(id)) expect = 404;
      else if (w.members.get(id)?.has(user)) expect = 400;
      return {
        what: `team/member_add ${id} ${user}`,
        method: "POST",
        path: "/team/member_add",
        body: { team_id: id, member: { role: "user", user_id: user } },
        expect,
        apply: () => {
          if (!w.users.has(user)) w.users.set(user, { models: [] });
          w.members.set(id, new Set([...(w.members.get(id) ?? []), user]));
        },
      };
    },
  },
  {
    name: "team/member_delete",
    weight: (w) => (w.members.size > 0 ? 2 : 0),
    make: (w, rng) => {
      const id = teamRef(w, rng);
      const user = w.members.get(id)?.size && rng.chance(0.8) ? rng.pick([...w.members.get(id)!]) : rng.pick(USERS);
      let expect = 200;
      if (!w.teams.has(id)) expect = 404;
      else if (!w.users.has(user) || !w.members.get(id)?.has(user)) expect = 400;
      return {
        what: `team/member_delete ${id} ${user}`,
        method: "POST",
        path: "/team/member_delete",
        body: { team_id: id, user_id: user },
        expect,
        apply: () => {
          w.members.get(id)!.delete(user);
          // The member's keys in the team go with it.
          for (const k of w.keys) if (k.team === id && k.user === user) k.dead = true;
        },
      };
    },
  },
  {
    name: "organization/delete",
    weight: (w) => (w.orgs.size > 1 ? 1 : 0),
    make: (w, rng) => {
      const id = orgRef(w, rng);
      let expect = 200;
      if (!w.orgs.has(id)) expect = 404;
      // Refused while a team or a key still belongs to it.
      else if ([...w.teams.values()].some((t) => t.org === id) || liveKeys(w).some((k) => k.org === id)) expect = 400;
      return {
        what: `organization/delete ${id}`,
        method: "DELETE",
        path: "/organization/delete",
        body: { organization_ids: [id] },
        expect,
        apply: () => {
          w.orgs.delete(id);
        },
      };
    },
  },
  {
    name: "model/new",
    weight: (w) => (w.stored.size < 2 ? 2 : 0.5),
    make: (w, rng) => {
      const id = `m${w.next.model++}`;
      const groups = rng.chance(0.5) ? [rng.pick(["cfg-grp", "grp-z"])] : [];
      return {
        what: `model/new ${id} ${STORED_NAME} ${JSON.stringify(groups)}`,
        method: "POST",
        path: "/model/new",
        body: { model_name: STORED_NAME, svc_params: { model: `openai/${STORED_NAME}-up`, api_base: MOCK_URL.value, api_key: "sk-up" }, model_info: { id, ...(groups.length ? { access_groups: groups } : {}) } },
        expect: 200,
        apply: () => {
          w.stored.set(id, { name: STORED_NAME, groups });
          w.storedIds.push(id);
        },
      };
    },
  },
  {
    name: "model/delete",
    weight: (w) => (w.storedIds.length > 0 ? 1.5 : 0),
    make: (w, rng) => {
      const id = rng.chance(0.1) ? "dep-gpt-a" : rng.pick(w.storedIds);
      return {
        what: `model/delete ${id}`,
        method: "POST",
        path: "/model/delete",
        body: { id },
        // A config model is changed only in config.yaml (400); a deleted one is a 404.
        expect: w.stored.has(id) ? 200 : id.startsWith("dep-") ? 400 : 404,
        apply: () => {
          w.stored.delete(id);
        },
      };
    },
  },
];

function pickWrite(w: World, rng: Random): Write {
  for (;;) {
    const weights = WRITES.map((x) => x.weight(w));
    let roll = rng.next() * weights.reduce((a, b) => a + b, 0);
    let i = 0;
    while (i < WRITES.length - 1 && roll >= weights[i]!) roll -= weights[i++]!;
    const write = WRITES[i]!.make(w, rng);
    if (write) return write;
  }
}

// ---- talking to the gateways

async function send(gw: TestGateway, write: Write): Promise<{ status: number; body: Json; text: string }> {
  const res = await fetch(`${gw.url}${write.path}`, {
    method: write.method,
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: write.body === undefined ? undefined : JSON.stringify(write.body),
  });
  const text = await res.text();
  let body: Json = {};
  try {
    body = JSON.parse(text) as Json;
  } catch {}
  return { status: res.status, body, text };
}

interface Observed extends Outcome {
  message?: string;
  t0: number;
  t1: number;
}

async function observe(gw: TestGateway, p: Probe, rng: Random): Promise<Observed> {
  const path = rng.pick(PATHS[p.route]) + (p.route === "one" ? p.model : "");
  const t0 = Date.now();
  const res =
    p.route === "chat"
      ? await fetch(`${gw.url}${path}`, {
          method: "POST",
          headers: { authorization: `Bearer ${p.old?.plain ?? p.key.plain}`, "content-type": "application/json" },
          body: JSON.stringify({ model: p.model, messages: [{ role: "user", content: "hi" }], max_tokens: 1 }),
        })
      : await fetch(`${gw.url}${path}`, { headers: { authorization: `Bearer ${p.old?.plain ?? p.key.plain}` } });
  const text = await res.text();
  const t1 = Date.now();
  const out: Observed = { status: res.status, t0, t1 };
  let body: Json = {};
  try {
    body = JSON.parse(text) as Json;
  } catch {}
  if (res.status === 200) {
    if (p.route === "chat") out.group = res.headers.get("x-svc-model-group") ?? undefined;
    else if (p.route === "one") out.group = body.id as string;
    else out.list = ((body.data as { id: string }[] | undefined) ?? []).map((m) => m.id).sort();
  } else {
    const error = body.error as { type?: string; message?: string } | undefined;
    out.type = error?.type;
    out.message = error?.message;
  }
  return out;
}

const probeName = (p: Probe) => `${p.key.label}${p.old ? ` (an old value, grace until ${JSON.stringify(p.old.until)})` : ""} ${{ chat: `chat ${p.model}`, models: "/v1/models", groups: "/v1/models?include_model_access_groups=true", one: `/v1/models/${p.model}` }[p.route]}`;
const brief = ({ t0: _t0, t1: _t1, ...o }: Observed) => JSON.stringify(o);

// ---- a run

interface Run {
  seed: number;
  mode: string;
  gws: [TestGateway, TestGateway];
  w: World;
  /** The steps: what is written and called (the same sequence for the same seed). */
  rng: Random;
  /** Which probes are checked and by which path form: drawn a number of times that depends on timing (polls), so apart from `rng`. */
  side: Random;
  step: number;
  history: string[];
  slowest: { ms: number; what: string };
  propagated: number;
  /** Writes by status. */
  writes: Record<number, number>;
}

function fail(run: Run, what: string, p?: Probe): never {
  const k = p?.key;
  const team = k?.team ? run.w.teams.get(k.team) : undefined;
  const state = k
    ? `\nkey ${JSON.stringify({ ...k, plain: undefined, olds: k.olds.map((o) => o.until) })}\nteam ${JSON.stringify(team ?? null)}\norgs ${JSON.stringify(orgsOf(run.w, k))}\nuser ${JSON.stringify(k.user ? (run.w.users.get(k.user) ?? null) : null)}\ngroups ${JSON.stringify([...run.w.groups.values()])}`
    : "";
  throw new Error(`ACCESS_DIFF_SEED=${run.seed} mode=${run.mode} step ${run.step}: ${what}${state}\nsteps:\n${run.history.slice(-40).join("\n")}`);
}

/** The probes of the world: every model and the listing for each live key and the last revoked ones. */
function probesOf(w: World): Probe[] {
  const dead = w.keys.filter((k) => k.dead).slice(-3);
  return [...liveKeys(w), ...dead].flatMap((key): Probe[] => [
    ...CALL_MODELS.map((model) => ({ key, route: "chat" as const, model })),
    { key, route: "models" },
    { key, route: "groups" },
    ...ONE_MODELS.map((model) => ({ key, route: "one" as const, model })),
    ...key.olds.slice(-2).flatMap((old): Probe[] => [...OLD_VALUE_MODELS.map((model) => ({ key, route: "chat" as const, model, old })), { key, route: "models", old }]),
  ]);
}

const probeId = (p: Probe) => `${p.key.label}|${p.route}|${p.model ?? ""}|${p.old?.plain.slice(-8) ?? ""}`;

function decisions(w: World, at: number): Map<string, string> {
  return new Map(probesOf(w).map((p) => [probeId(p), JSON.stringify(decide(w, p, at, at))]));
}

/** One call that must match the model now. */
async function checkNow(run: Run, gw: TestGateway, name: string, p: Probe): Promise<void> {
  const got = await observe(gw, p, run.side);
  const want = decide(run.w, p, got.t0, got.t1);
  if (!want.some((o) => same(o, got))) fail(run, `through ${name}, ${probeName(p)}: the model says ${JSON.stringify(want)}, the gateway answered ${brief(got)}`, p);
}

/** Calls through `gw` until each matches the model; the time from `since` until the last matched. */
async function checkWithin(run: Run, gw: TestGateway, name: string, probes: Probe[], since: number): Promise<number> {
  let pending = probes;
  for (;;) {
    const next: Probe[] = [];
    const seen = new Map<Probe, Observed>();
    for (const p of pending) {
      const got = await observe(gw, p, run.side);
      if (!decide(run.w, p, got.t0, got.t1).some((o) => same(o, got))) {
        next.push(p);
        seen.set(p, got);
      }
    }
    const elapsed = Date.now() - since;
    if (next.length === 0) return elapsed;
    if (elapsed > PROPAGATION_MS) {
      const lines = next.map((p) => `  ${probeName(p)}: the model says ${JSON.stringify(decide(run.w, p, Date.now(), Date.now()))}, ${name} still answers ${brief(seen.get(p)!)}`);
      fail(run, `through ${name}, ${next.length} call(s) still disagree with the model ${elapsed} ms after the write returned:\n${lines.join("\n")}`, next[0]);
    }
    pending = next;
    await Bun.sleep(20);
  }
}

const NAMES = ["A", "B"];

/** Sends a write through instance `via`; its status must be the model's; on a 200 the model takes it. Whether it applied, and when it returned. */
async function write(run: Run, via: number): Promise<{ applied: boolean; what: string; hi: number }> {
  const write = pickWrite(run.w, run.rng);
  run.history.push(`${run.step} ${NAMES[via]} ${write.what} → expect ${write.expect}`);
  const lo = Date.now();
  const reply = await send(run.gws[via]!, write);
  const hi = Date.now();
  run.history[run.history.length - 1] += ` got ${reply.status}`;
  run.writes[reply.status] = (run.writes[reply.status] ?? 0) + 1;
  if (reply.status !== write.expect) fail(run, `${write.what} through ${NAMES[via]}: the model expects ${write.expect}, the gateway answered ${reply.status} ${reply.text.slice(0, 400)}`);
  if (reply.status === 200) write.apply?.(reply.body, { lo, hi });
  return { applied: reply.status === 200, what: write.what, hi };
}

function sample(rng: Random, ps: Probe[], n: number): Probe[] {
  const left = [...ps];
  return Array.from({ length: Math.min(n, left.length) }, () => left.splice(rng.int(left.length), 1)[0]!);
}

/**
 * One write through a random instance X: right after it returns, the calls it changed (and a few
 * others) answer through X exactly as the model says, and through the other instance within 1 s.
 * Back to back: a second write goes through the other instance as soon as the first returned (its
 * answer must not depend on whether that instance has heard of the first yet), then both
 * instances must agree with the model within 1 s.
 */
async function writeStep(run: Run, backToBack: boolean): Promise<void> {
  const { w, rng, side } = run;
  const via = rng.int(2);
  const before = decisions(w, Date.now());
  w.created = {};
  const first = await write(run, via);
  let second: Awaited<ReturnType<typeof write>> | undefined;
  if (backToBack) {
    // The second names what the first made, where it can: the other instance must already know it.
    w.fresh = w.created;
    second = await write(run, 1 - via);
    w.fresh = {};
  }
  if (!first.applied && !second?.applied) return;
  const hi = second?.hi ?? first.hi;
  const after = decisions(w, hi);
  const all = probesOf(w);
  const changed = all.filter((p) => before.get(probeId(p)) !== after.get(probeId(p)));
  const others = all.filter((p) => !changed.includes(p));
  let ms = 0;
  if (!second) {
    // Right after the write returned, the instance that took it answers as the model says.
    for (const p of [...sample(side, changed, 30), ...sample(side, others, 4)]) await checkNow(run, run.gws[via]!, NAMES[via]!, p);
    ms = await checkWithin(run, run.gws[1 - via]!, NAMES[1 - via]!, [...sample(side, changed, 30), ...sample(side, others, 2)], hi);
  } else {
    for (const i of [1 - via, via]) ms = Math.max(ms, await checkWithin(run, run.gws[i]!, NAMES[i]!, [...sample(side, changed, 30), ...sample(side, others, 2)], hi));
  }
  if (changed.length > 0) {
    run.propagated++;
    const what = second ? `${first.what}, then ${second.what}` : first.what;
    if (ms > run.slowest.ms) run.slowest = { ms, what: `${what} (${changed.length} calls changed)` };
  }
}

async function callStep(run: Run): Promise<void> {
  const probes = probesOf(run.w);
  if (probes.length === 0) return;
  for (let i = 0; i < 4; i++) {
    const p = run.rng.pick(probes);
    const via = run.rng.int(2);
    run.history.push(`${run.step} ${via === 0 ? "A" : "B"} call ${probeName(p)}`);
    await checkNow(run, run.gws[via]!, via === 0 ? "A" : "B", p);
  }
}

const hasRedis = await redisReachable(REDIS_URL);

for (const [m, { mode, redis }] of MODES.entries()) {
  describe.skipIf(redis && !hasRedis)(`access and revocation on two instances (${mode}) against the model, ACCESS_DIFF_SEED=${SEED}`, () => {
    let mock: MockOpenAI;
    const gws: TestGateway[] = [];
    let drop: (() => Promise<void>) | undefined;

    beforeAll(async () => {
      mock = await startMockOpenAI({ apiKey: "sk-up", record: false });
      MOCK_URL.value = mock.url;
      const db = await freshDatabase("gw_access_diff");
      drop = db.drop;
      for (let i = 0; i < 2; i++) gws.push(await startTestGateway(configOf(mock), { store: { databaseUrl: db.url, redisUrl: redis ? REDIS_URL : undefined } }));
      await Promise.all(gws.map((g) => g.host!.services.bus!.subscribed()));
    });
    afterAll(async () => {
      for (const g of gws) await g.stop();
      await drop?.();
      await mock?.stop();
    });

    test(`${STEPS} random steps`, async () => {
      const run: Run = { seed: SEED, mode, gws: [gws[0]!, gws[1]!], w: new World(), rng: new Random(SEED * 7 + m), side: new Random(SEED * 13 + m), step: 0, history: [], slowest: { ms: 0, what: "" }, propagated: 0, writes: {} };
      const started = Date.now();
      for (run.step = 1; run.step <= STEPS; run.step++) {
        const roll = run.rng.next();
        if (roll < 0.55) await writeStep(run, false);
        else if (roll < 0.72) await writeStep(run, true);
        else await callStep(run);
      }
      console.log(
        `access propagation (${mode}), ACCESS_DIFF_SEED=${SEED}: ${STEPS} steps in ${Date.now() - started} ms, writes by status ${JSON.stringify(run.writes)}; ${run.propagated} writes changed decisions, slowest reached the other instance in ${run.slowest.ms} ms (${run.slowest.what})`,
      );
      expect(true).toBe(true);
    }, 90_000);
  });
}
