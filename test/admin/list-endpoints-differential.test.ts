// Differential check of the management API's list endpoints. Randomized orgs, teams, users and keys
// (LIST_DIFF_SEED=<n> runs another set; every failure names the seed) are created through the API:
// aliases and ids with quotes, backslashes, unicode, "undefined", "null", "", LIKE metacharacters
// and 600-character strings, duplicate team aliases, many equal spends and budgets (ties in every
// sort key), keys without team or user, blocked keys, deleted keys (and live keys reusing their
// aliases), a deleted team and a deleted user. Randomized requests of `/key/list` (every filter,
// every sort key both ways, every page of a walk and the one past the end), `/key/aliases`,
// `/team/list`, `/v2/team/list` (status=deleted too), `/user/list` and `/organization/list`, asked
// by the master key, an admin viewer, a team admin, a team member, an org admin and a key without a
// user, must answer what is computed here from the identity tables: filters, scoping and ordering
// are re-derived in TypeScript (only text order is taken from the database, as its collation
// decides it). Pages must be exact slices of one total order: no overlap, no gap. Callers the
// implementation does not let list get a 403 in the error envelope.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, requestOk, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { queryString, Random } from "../harness/random.ts";
import { sha256, until } from "../harness/util.ts";

const CONFIG = { model_list: [{ model_name: "alpha-model", svc_params: { model: "mock/alpha" } }], general_settings: { master_key: MASTER_KEY } };
const SEED = Number(process.env.LIST_DIFF_SEED ?? 4_410_377);

type Json = Record<string, unknown>;
type Db = NonNullable<TestGateway["host"]>["store"]["db"];
type Params = Record<string, string | number | undefined>;

// Long, within the 256 characters an indexed id or name may have (with "@x.io" as an e-mail too).
const LONG = `long-${"ü".repeat(100)}-${"x".repeat(140)}`;
const AWKWARD = ['q "quoted" \\ back', "it's", "客户-ü-😀", "undefined", "null", "", LONG, "50%_off", "a\\b", "plain", "Plain", " spaced "] as const;
const USER_IDS = ["u-ann", 'u "q"', "u-ü-😀", "undefined", `u-${"y".repeat(250)}`, "u-bob", "u-carl", "u-dora"] as const;
/** Substrings searched for (ILIKE): metacharacters must match themselves. */
const SEARCHES = ["%", "_", "\\", '"', "'", "ü", "😀", "PLAIN", "plain", "undefined", "x", "zzz-none", "50%_", "-2"] as const;

// ---- the data

interface World {
  orgs: string[];
  teams: string[];
  users: string[];
  /** Plaintext of every key created, by token. */
  plain: Map<string, string>;
  callers: Record<CallerName, string>;
}

type CallerName = "master" | "viewer" | "teamAdmin" | "member" | "orgAdmin" | "lone" | "userViewer";

async function seedWorld(gw: TestGateway, rng: Random): Promise<World> {
  const orgs: string[] = [];
  for (const alias of ['acme "q"', "ü-org 😀", "50%_off org"]) {
    orgs.push((await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: alias })).organization_id);
  }
  const teams: string[] = [];
  for (let i = 0; i < 11; i++) {
    const body: Json = { team_alias: rng.chance(0.15) ? null : rng.pick(AWKWARD), spend: rng.pick([0, 0, 0, 3, 3.5]) };
    if (rng.chance(0.5)) body.organization_id = rng.pick(orgs);
    if (i === 0) body.team_member_permissions = ["/key/info", "/key/list"];
    teams.push((await requestOk<{ team_id: string }>(gw, "POST", "/team/new", body)).team_id);
  }
  const emails = ["ann@x.io", 'q"u@x.io', "ü😀@x.io", "undefined", "PLAIN@x.io", "plain2@x.io", `${LONG}@x.io`, "50%_off@x.io"];
  const users: string[] = [...USER_IDS, "u-adm", "u-plain", "u-view", "u-iview", "u-org"];
  for (const id of users) {
    const role = id === "u-view" ? "proxy_admin_viewer" : id === "u-iview" ? "internal_user_viewer" : "internal_user";
    const email = rng.chance(0.3) || emails.length === 0 ? undefined : emails.splice(rng.int(emails.length), 1)[0];
    await requestOk(gw, "POST", "/user/new", { user_id: id, user_role: role, user_email: email, spend: rng.pick([0, 0, 1.5, 2.25]), auto_create_key: false });
  }
  const member = (teamId: string, userId: string, role: "admin" | "user") => requestOk(gw, "POST", "/team/member_add", { team_id: teamId, member: { role, user_id: userId } });
  await member(teams[0]!, "u-adm", "admin");
  await member(teams[1]!, "u-adm", "admin");
  await member(teams[0]!, "u-plain", "user");
  await member(teams[2]!, "u-plain", "user");
  await member(teams[3]!, "u-iview", "admin");
  for (const u of USER_IDS) for (const t of rng.some(teams.slice(2), 3)) await member(t, u, rng.chance(0.3) ? "admin" : "user");
  await requestOk(gw, "POST", "/organization/member_add", { organization_id: orgs[0], member: { role: "org_admin", user_id: "u-org" } });

  const plain = new Map<string, string>();
  const generate = async (body: Json, key?: string) => {
    const r = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { key: key ?? MASTER_KEY, body });
    if (r.status !== 200) throw new Error(`seed ${SEED}: /key/generate ${JSON.stringify(body).slice(0, 200)} → ${r.status}: ${r.text}`);
    plain.set(r.body.token, r.body.key);
    return r.body;
  };
  const callers = {} as Record<CallerName, string>;
  callers.master = MASTER_KEY;
  callers.viewer = (await generate({ user_id: "u-view" })).key;
  callers.teamAdmin = (await generate({ user_id: "u-adm", team_id: teams[0] })).key;
  callers.member = (await generate({ user_id: "u-plain" })).key;
  callers.orgAdmin = (await generate({ user_id: "u-org" })).key;
  callers.userViewer = (await generate({ user_id: "u-iview" })).key;
  callers.lone = (await generate({ key_alias: "lone" })).key;
  // The team admin's own keys of no team are made with a key of no team: its team key makes none.
  const adminsPersonal = (await generate({ user_id: "u-adm", key_alias: "u-adm-personal" })).key;

  const aliases: string[] = [...AWKWARD, ...AWKWARD.map((a) => `${a}-2`)];
  const created: { token: string; alias: string | null }[] = [];
  for (let i = 0; i < 40; i++) {
    const body: Json = { spend: rng.pick([0, 0, 0, 1, 2.5]), max_budget: rng.pick([null, null, 10, 10, 20]) };
    const alias = rng.chance(0.25) || aliases.length === 0 ? null : aliases.splice(rng.int(aliases.length), 1)[0]!;
    if (alias !== null) body.key_alias = alias;
    const teamId = rng.chance(0.3) ? null : rng.pick(teams);
    const userId = rng.chance(0.3) ? null : rng.pick(users.filter((u) => u !== "u-view"));
    if (teamId) body.team_id = teamId;
    if (userId) body.user_id = userId;
    if (!teamId && rng.chance(0.3)) body.organization_id = rng.pick(orgs);
    if (rng.chance(0.3)) body.metadata = { project_id: rng.pick(["p-1", "p ü"]) };
    // Some keys are the team admin's own work (created_by u-adm), for its own team or itself.
    const byAdmin = rng.chance(0.12);
    if (byAdmin) {
      body.team_id = rng.chance(0.5) ? teams[0] : undefined;
      body.user_id = "u-adm";
      delete body.organization_id;
    }
    const by = byAdmin ? (body.team_id ? callers.teamAdmin : adminsPersonal) : undefined;
    created.push({ token: (await generate(body, by)).token, alias });
  }
  for (const c of rng.some(created, 4)) await requestOk(gw, "POST", "/key/block", { key: c.token });
  const doomed = rng.some(created, 5);
  await requestOk(gw, "POST", "/key/delete", { keys: doomed.map((c) => c.token) });
  // A live key may take the alias of a deleted one.
  for (const c of doomed.filter((d) => d.alias !== null).slice(0, 2)) await generate({ key_alias: c.alias });
  await requestOk(gw, "POST", "/team/delete", { team_ids: [teams[10]] });
  await requestOk(gw, "POST", "/user/delete", { user_ids: ["u-dora"] });
  return { orgs, teams, users, plain, callers };
}

// ---- the tables, read back

interface KeyRec {
  token: string;
  key_alias: string | null;
  key_name: string | null;
  user_id: string | null;
  team_id: string | null;
  organization_id: string | null;
  created_by: string | null;
  project_id: string | null;
  deleted: boolean;
  created_at: string | null;
  updated_at: string | null;
  expires: string | null;
  last_active: string | null;
  spend: string | null;
  max_budget: string | null;
  rotation_count: number | null;
}
interface TeamRec {
  team_id: string;
  team_alias: string | null;
  organization_id: string | null;
  deleted: boolean;
  created_at: string;
  spend: string;
  perms: string[] | null;
}
interface UserRec {
  user_id: string;
  user_email: string | null;
  user_role: string;
  created_at: string;
  spend: string;
}
interface OrgRec {
  organization_id: string;
  organization_alias: string | null;
  created_at: string;
}
interface Tables {
  keys: KeyRec[];
  teams: TeamRec[];
  users: UserRec[];
  orgs: OrgRec[];
  teamMembers: { team_id: string; user_id: string; role: string }[];
  orgMembers: { organization_id: string; user_id: string; user_role: string }[];
  /** Every text value's place in the database's collation order. */
  textRank: Map<string, number>;
}

const stamp = (col: string) => sql.raw(`to_char(${col} at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')`);

async function readTables(db: Db): Promise<Tables> {
  const keys = await rows<KeyRec>(
    db,
    sql`select token, key_alias, key_name, user_id, team_id, organization_id, created_by, metadata->>'project_id' as project_id,
      deleted_at is not null as deleted, ${stamp("created_at")} as created_at, ${stamp("updated_at")} as updated_at, ${stamp("expires")} as expires,
      ${stamp("last_active")} as last_active, spend::text as spend, max_budget::text as max_budget, rotation_count::int as rotation_count from virtual_keys`,
  );
  const teams = await rows<TeamRec>(
    db,
    sql`select team_id, team_alias, organization_id, deleted_at is not null as deleted, ${stamp("created_at")} as created_at, spend::text as spend,
      array_to_json(team_member_permissions) as perms from teams`,
  );
  const users = await rows<UserRec>(db, sql`select user_id, user_email, user_role, ${stamp("created_at")} as created_at, spend::text as spend from users`);
  const orgs = await rows<OrgRec>(db, sql`select organization_id, organization_alias, ${stamp("created_at")} as created_at from organizations`);
  const teamMembers = await rows<{ team_id: string; user_id: string; role: string }>(db, sql`select team_id, user_id, role from team_members`);
  const orgMembers = await rows<{ organization_id: string; user_id: string; user_role: string }>(db, sql`select organization_id, user_id, user_role from org_members`);
  const texts = new Set<string>();
  for (const k of keys) for (const v of [k.token, k.key_alias, k.key_name, k.user_id, k.team_id, k.organization_id]) if (v !== null) texts.add(v);
  for (const t of teams) for (const v of [t.team_id, t.team_alias]) if (v !== null) texts.add(v);
  for (const u of users) for (const v of [u.user_id, u.user_email]) if (v !== null) texts.add(v);
  for (const a of AWKWARD) texts.add(a);
  const values = sql.join(
    [...texts].map((t) => sql`(${t}::text)`),
    sql`, `,
  );
  const ordered = await rows<{ v: string }>(db, sql`select v from (values ${values}) as t(v) order by v`);
  return { keys, teams, users, orgs, teamMembers, orgMembers, textRank: new Map(ordered.map((r, i) => [r.v, i])) };
}

// ---- ordering as PostgreSQL orders: ascending puts nulls last, descending first

type Value = string | number | null;

function compareValues(t: Tables, a: Value, b: Value, kind: "text" | "num" | "plain"): number {
  if (a === b) return 0;
  if (a === null) return 1;
  if (b === null) return -1;
  if (kind === "num") return Number(a) - Number(b);
  if (kind === "text") return t.textRank.get(String(a))! - t.textRank.get(String(b))!;
  return a < b ? -1 : 1;
}

function sortedBy<R>(t: Tables, items: R[], key: (r: R) => Value, kind: "text" | "num" | "plain", order: "asc" | "desc", tie: (r: R) => string): R[] {
  return [...items].sort((x, y) => {
    const a = key(x);
    const b = key(y);
    let c: number;
    if (a === null || b === null) c = a === b ? 0 : a === null ? (order === "asc" ? 1 : -1) : order === "asc" ? -1 : 1;
    else c = order === "asc" ? compareValues(t, a, b, kind) : compareValues(t, b, a, kind);
    return c !== 0 ? c : compareValues(t, tie(x), tie(y), "text");
  });
}

const KEY_SORT: Record<string, [keyof KeyRec, "text" | "num" | "plain"]> = {
  created_at: ["created_at", "plain"],
  updated_at: ["updated_at", "plain"],
  spend: ["spend", "num"],
  max_budget: ["max_budget", "num"],
  user_id: ["user_id", "text"],
  team_id: ["team_id", "text"],
  organization_id: ["organization_id", "text"],
  key_alias: ["key_alias", "text"],
  key_name: ["key_name", "text"],
  expires: ["expires", "plain"],
  last_active: ["last_active", "plain"],
  rotation_count: ["rotation_count", "num"],
  token: ["token", "text"],
};

// ---- the expected answers

/** A caller as the implementation sees it: its user (or none), role, key hash and the team its key was issued in. */
interface Who {
  name: CallerName;
  userId: string | null;
  role: string;
  keyHash: string;
  keyTeam: string | null;
}

function whoOf(t: Tables, w: World, name: CallerName): Who {
  if (name === "master") return { name, userId: null, role: "proxy_admin", keyHash: "", keyTeam: null };
  const plaintext = w.callers[name];
  const token = [...w.plain].find(([, v]) => v === plaintext)![0];
  const key = t.keys.find((k) => k.token === token)!;
  const role = key.user_id ? t.users.find((u) => u.user_id === key.user_id)!.user_role : "internal_user";
  return { name, userId: key.user_id, role, keyHash: token, keyTeam: key.team_id };
}

const readsAll = (who: Who) => who.role === "proxy_admin" || who.role === "proxy_admin_viewer";
const containsCi = (text: string | null, term: string): boolean => text?.toLowerCase().includes(term.toLowerCase()) ?? false;

/**
 * Teams whose keys `who` may list: admin of it, or a (non-viewer) member the team lets call
 * /key/list; a key issued in a team speaks for that team only.
 */
function keyListTeams(t: Tables, who: Who): string[] {
  if (!who.userId) return [];
  const out: string[] = [];
  for (const m of t.teamMembers.filter((x) => x.user_id === who.userId)) {
    const team = t.teams.find((x) => x.team_id === m.team_id);
    if (!team || team.deleted || (who.keyTeam !== null && who.keyTeam !== m.team_id)) continue;
    if (m.role === "admin") out.push(m.team_id);
    else if (m.role === "user" && who.role !== "internal_user_viewer" && (team.perms?.length ? team.perms : ["/key/info", "/key/health"]).includes("/key/list")) out.push(m.team_id);
  }
  return out;
}

const truthy = (v: string | number | undefined) => v !== undefined && ["true", "1"].includes(String(v).toLowerCase());

function expectedKeys(t: Tables, w: World, who: Who, q: Params): KeyRec[] | "403" {
  let keys = t.keys.filter((k) => (q.status === "deleted" ? k.deleted : !k.deleted));
  const str = (name: string) => (q[name] === undefined || q[name] === "" ? undefined : String(q[name]));
  for (const name of ["user_id", "team_id", "organization_id", "key_alias"] as const) {
    const v = str(name);
    if (v !== undefined) keys = keys.filter((k) => k[name] === v);
  }
  const hash = str("key_hash");
  if (hash !== undefined) {
    // Named by hash or by plaintext.
    const token = [...w.plain].find(([, v]) => v === hash)?.[0] ?? hash;
    keys = keys.filter((k) => k.token === token);
  }
  const project = str("project_id");
  if (project !== undefined) keys = keys.filter((k) => k.project_id === project);
  if (!readsAll(who)) {
    const listTeams = keyListTeams(t, who);
    const teamFilter = str("team_id");
    if (teamFilter && !listTeams.includes(teamFilter)) return "403";
    const teams = teamFilter ? [teamFilter] : truthy(q.include_team_keys) ? listTeams : [];
    const userFilter = str("user_id");
    if (userFilter && userFilter !== who.userId && teams.length === 0) return "403";
    // A key issued in a team speaks for its user in that team only.
    const inScope = (k: KeyRec) => who.keyTeam === null || k.team_id === who.keyTeam;
    keys = keys.filter(
      (k) =>
        (who.userId ? k.user_id === who.userId && inScope(k) : k.token === who.keyHash) ||
        (k.team_id !== null && teams.includes(k.team_id)) ||
        (truthy(q.include_created_by_keys) && who.userId !== null && k.created_by === who.userId && inScope(k)),
    );
  }
  const [col, kind] = KEY_SORT[String(q.sort_by ?? "created_at")]!;
  return sortedBy(t, keys, (k) => k[col] as Value, kind, String(q.sort_order ?? "desc").toLowerCase() as "asc" | "desc", (k) => k.token);
}

function expectedTeamsV2(t: Tables, q: Params): TeamRec[] {
  let teams = t.teams.filter((x) => (q.status === "deleted" ? x.deleted : !x.deleted));
  if (q.team_id) teams = teams.filter((x) => x.team_id === q.team_id);
  if (q.team_alias) teams = teams.filter((x) => containsCi(x.team_alias, String(q.team_alias)));
  return sortTeams(t, filterTeamsByOrgAndUser(t, teams, q), String(q.sort_by ?? "created_at"), (q.sort_order ?? "asc") as "asc" | "desc");
}

function filterTeamsByOrgAndUser(t: Tables, teams: TeamRec[], q: Params): TeamRec[] {
  let out = teams;
  if (q.organization_id) out = out.filter((x) => (q.organization_id === "default_organization" ? x.organization_id === null : x.organization_id === q.organization_id));
  if (q.user_id) out = out.filter((x) => t.teamMembers.some((m) => m.team_id === x.team_id && m.user_id === q.user_id));
  return out;
}

function sortTeams(t: Tables, teams: TeamRec[], by: string, order: "asc" | "desc"): TeamRec[] {
  const spec: Record<string, [keyof TeamRec, "text" | "num" | "plain"]> = {
    team_id: ["team_id", "text"],
    team_alias: ["team_alias", "text"],
    created_at: ["created_at", "plain"],
    spend: ["spend", "num"],
  };
  const [col, kind] = spec[by]!;
  return sortedBy(t, teams, (x) => x[col] as Value, kind, order, (x) => x.team_id);
}

function expectedUsers(t: Tables, q: Params): UserRec[] {
  let users = t.users;
  const ids = q.user_ids === undefined ? [] : String(q.user_ids).split(",").map((s) => s.trim()).filter(Boolean);
  if (ids.length) users = users.filter((u) => ids.includes(u.user_id));
  const role = q.role ?? q.user_role;
  if (role) users = users.filter((u) => u.user_role === role);
  if (q.user_email) users = users.filter((u) => containsCi(u.user_email, String(q.user_email)));
  const team = q.team ?? q.team_id;
  if (team) users = users.filter((u) => t.teamMembers.some((m) => m.team_id === team && m.user_id === u.user_id));
  const spec: Record<string, [keyof UserRec, "text" | "num" | "plain"]> = {
    user_id: ["user_id", "text"],
    user_email: ["user_email", "text"],
    created_at: ["created_at", "plain"],
    spend: ["spend", "num"],
  };
  const [col, kind] = spec[String(q.sort_by ?? "created_at")]!;
  return sortedBy(t, users, (u) => u[col] as Value, kind, (q.sort_order ?? "asc") as "asc" | "desc", (u) => u.user_id);
}

// ---- the checks

/** Pages to ask of a list of `pages` pages: all of a short walk (and the one past the end), else a sample. */
function pagesToAsk(rng: Random, pages: number): number[] {
  if (pages <= 10) return Array.from({ length: pages + 1 }, (_, i) => i + 1);
  return [...new Set([1, 2, 1 + rng.int(pages), pages - 1, pages, pages + 1, pages + 7])].sort((a, b) => a - b);
}

const path = (route: string, q: Params) => {
  const qs = queryString(q);
  return qs ? `${route}?${qs}` : route;
};

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

async function refusedWith403(gw: TestGateway, key: string, p: string, failures: string[], label: string): Promise<void> {
  const r = await requestJson<{ error?: Json }>(gw, "GET", p, { key });
  const e = r.body?.error;
  if (r.status !== 403 || !e || e.type !== "permission_error" || String(e.code) !== "403" || typeof e.message !== "string") {
    failures.push(`seed ${SEED}: ${label} GET ${p} → ${r.status} ${r.text.slice(0, 200)}, not a 403 permission_error envelope`);
  }
}

/** Checks every asked page; answers how many keys the listing has (-1 for a refusal). */
async function checkKeyList(gw: TestGateway, t: Tables, w: World, rng: Random, who: Who, q: Params, failures: string[]): Promise<number> {
  const expected = expectedKeys(t, w, who, q);
  const label = `${who.name} /key/list ${JSON.stringify(q)}`;
  if (expected === "403") {
    await refusedWith403(gw, w.callers[who.name], path("/key/list", q), failures, label);
    return -1;
  }
  const size = q.size === undefined ? 10 : Number(q.size);
  const pages = Math.ceil(expected.length / size);
  for (const page of pagesToAsk(rng, pages)) {
    const p = path("/key/list", { ...q, page });
    const r = await requestJson<{ keys: (string | Json)[]; total_count: number; current_page: number; total_pages: number }>(gw, "GET", p, { key: w.callers[who.name] });
    if (r.status !== 200) {
      failures.push(`seed ${SEED}: ${label} page ${page} → ${r.status} ${r.text.slice(0, 300)}`);
      return expected.length;
    }
    const want = expected.slice((page - 1) * size, page * size);
    const expand = q.expand === "user";
    const full = truthy(q.return_full_object) || expand;
    const userOf = (u: unknown) => (u && typeof u === "object" && "user_id" in u ? u.user_id : u);
    const got = r.body.keys.map((k) => {
      if (!full) return k;
      if (typeof k !== "object") return `not an object: ${k}`;
      return expand ? [k.token, k.key_alias, k.user_id, k.team_id, userOf(k.user)] : [k.token, k.key_alias, k.user_id, k.team_id];
    });
    // Expanded, a key names its user's row, or null when the key has no user or its user was deleted.
    const userRow = (k: KeyRec) => (k.user_id !== null && t.users.some((u) => u.user_id === k.user_id) ? k.user_id : null);
    const wanted = want.map((k) => (!full ? k.token : expand ? [k.token, k.key_alias, k.user_id, k.team_id, userRow(k)] : [k.token, k.key_alias, k.user_id, k.team_id]));
    if (!same(got, wanted)) failures.push(`seed ${SEED}: ${label} page ${page}: keys ${JSON.stringify(got).slice(0, 600)}\n  expected ${JSON.stringify(wanted).slice(0, 600)}`);
    const meta = { total_count: r.body.total_count, current_page: r.body.current_page, total_pages: r.body.total_pages };
    const wantMeta = { total_count: expected.length, current_page: page, total_pages: pages };
    if (!same(meta, wantMeta)) failures.push(`seed ${SEED}: ${label} page ${page}: ${JSON.stringify(meta)}, expected ${JSON.stringify(wantMeta)}`);
  }
  return expected.length;
}

function randomKeyAsk(rng: Random, t: Tables, w: World): Params {
  const q: Params = {};
  const aliases = [...new Set(t.keys.map((k) => k.key_alias).filter((a): a is string => a !== null))];
  q.user_id = rng.maybe(0.15, [...w.users, "u-dora", "no-such-user", "", "u-adm", "u-plain"]);
  q.team_id = rng.maybe(0.15, [...w.teams, "no-such-team", ""]);
  q.organization_id = rng.maybe(0.08, [...w.orgs, "no-such-org"]);
  q.key_alias = rng.maybe(0.08, [...aliases, "undefined", "", "no-such-alias"]);
  if (rng.chance(0.05)) {
    const k = rng.pick(t.keys);
    q.key_hash = rng.chance(0.5) ? k.token : (w.plain.get(k.token) ?? k.token);
  }
  q.project_id = rng.maybe(0.04, ["p-1", "p ü", "p-none"]);
  q.include_team_keys = rng.maybe(0.3, ["true", "false", "1", "TRUE"]);
  q.include_created_by_keys = rng.maybe(0.15, ["true", "false"]);
  q.return_full_object = rng.maybe(0.25, ["true", "false", "0"]);
  q.expand = rng.maybe(0.12, ["user"]);
  q.status = rng.maybe(0.15, ["deleted", "active"]);
  q.sort_by = rng.maybe(0.8, Object.keys(KEY_SORT));
  q.sort_order = rng.maybe(0.7, ["asc", "desc", "ASC", "Desc"]);
  q.size = rng.maybe(0.85, [1, 2, 3, 4, 7, 10, 25, 100]);
  return q;
}

const CALLER_WEIGHTS: CallerName[] = ["master", "master", "master", "viewer", "teamAdmin", "teamAdmin", "member", "member", "lone", "userViewer", "orgAdmin"];

for (const backend of BACKENDS) {
  describe(`management list endpoints against the identity tables, randomized (${backend}, seed ${SEED})`, () => {
    let gw: TestGateway;
    let db: Db;
    let w: World;
    let t: Tables;
    const rng = new Random(SEED);
    const who = (name: CallerName) => whoOf(t, w, name);

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_list_diff" });
      db = gw.host!.store.db;
      w = await seedWorld(gw, rng);
      // The callers' keys get their last_active written once, a few seconds after first use, then not
      // again for a minute: use them and wait, so that sorting by last_active meets the tables read here.
      const callerKeys = Object.values(w.callers).filter((k) => k !== MASTER_KEY);
      for (const key of callerKeys) await requestJson(gw, "GET", "/key/info", { key });
      const written = await until(async () => {
        const [c] = await rows<{ n: number }>(db, sql`select count(*)::int as n from virtual_keys where last_active is not null and token in (${sql.join(callerKeys.map((k) => sql`${sha256(k)}`), sql`, `)})`);
        return c!.n === callerKeys.length;
      }, 12_000);
      expect(written, "the callers' last_active is written").toBe(true);
      t = await readTables(db);
    }, 40_000);
    afterAll(async () => gw?.stop());

    test("the data set has ties, nulls, deleted and blocked keys, keys without team or user, awkward aliases", async () => {
      const [c] = await rows<Record<string, number>>(
        db,
        sql`select (count(*) filter (where deleted_at is not null))::int as deleted, (count(*) filter (where blocked))::int as blocked,
          (count(*) filter (where team_id is null and deleted_at is null))::int as no_team, (count(*) filter (where user_id is null and deleted_at is null))::int as no_user,
          (select count(*)::int from (select spend from virtual_keys group by spend having count(*) > 5) s) as spend_ties,
          (select count(*)::int from (select key_alias from virtual_keys where key_alias is not null group by key_alias having count(*) > 1) s) as reused_aliases,
          (select count(*)::int from teams where deleted_at is not null) as deleted_teams,
          (select count(*)::int from (select team_alias from teams group by team_alias having count(*) > 1) s) as team_alias_ties
          from virtual_keys`,
      );
      const label = `seed ${SEED}: ${JSON.stringify(c)}`;
      expect(c!.deleted, label).toBeGreaterThanOrEqual(5);
      expect(c!.blocked, label).toBeGreaterThanOrEqual(1);
      expect(c!.no_team, label).toBeGreaterThanOrEqual(3);
      expect(c!.no_user, label).toBeGreaterThanOrEqual(3);
      expect(c!.spend_ties, label).toBeGreaterThanOrEqual(1);
      expect(c!.reused_aliases, label).toBeGreaterThanOrEqual(1);
      expect(c!.deleted_teams, label).toBe(1);
      expect(c!.team_alias_ties, label).toBeGreaterThanOrEqual(1);
      expect(t.keys.some((k) => k.key_alias === LONG || k.key_alias === `${LONG}-2`) || t.teams.some((x) => x.team_alias === LONG), label).toBe(true);
    });

    test("/key/list: every filter, scope, sort and page equals the table's", async () => {
      const failures: string[] = [];
      const sizes: number[] = [];
      for (let i = 0; i < 80; i++) sizes.push(await checkKeyList(gw, t, w, rng, who(rng.pick(CALLER_WEIGHTS)), randomKeyAsk(rng, t, w), failures));
      // The random asks are not all empty or refused.
      expect(sizes.filter((n) => n > 3).length, `seed ${SEED}: ${sizes}`).toBeGreaterThanOrEqual(20);
      expect(sizes.filter((n) => n < 0).length, `seed ${SEED}: ${sizes}`).toBeGreaterThanOrEqual(3);
      // Every sort key both ways, one key a page: each boundary between two tied keys is crossed.
      for (const sortBy of Object.keys(KEY_SORT)) {
        for (const order of ["asc", "desc"]) await checkKeyList(gw, t, w, rng, who("master"), { sort_by: sortBy, sort_order: order, size: rng.pick([1, 3]) }, failures);
      }
      // Each non-admin caller's own reach, with and without its teams and the keys it created.
      for (const name of ["teamAdmin", "member", "lone", "userViewer", "orgAdmin"] as const) {
        for (const extra of [{}, { include_team_keys: "true" }, { include_team_keys: "true", include_created_by_keys: "true" }]) {
          await checkKeyList(gw, t, w, rng, who(name), { ...extra, sort_by: "spend", size: 2 }, failures);
        }
      }
      expect(failures).toEqual([]);
    }, 30_000);

    test("/key/aliases: the live aliases in collation order, searched literally, paged", async () => {
      const failures: string[] = [];
      const live = [...new Set(t.keys.filter((k) => !k.deleted && k.key_alias !== null).map((k) => k.key_alias!))];
      for (let i = 0; i < 16; i++) {
        const q: Params = { search: rng.chance(0.7) ? rng.pick(SEARCHES) : undefined, size: rng.chance(0.8) ? rng.pick([1, 2, 5, 50, 100]) : undefined };
        const all = sortedBy(t, live.filter((a) => q.search === undefined || containsCi(a, String(q.search))), (a) => a, "text", "asc", (a) => a);
        const size = Number(q.size ?? 50);
        const pages = Math.ceil(all.length / size);
        for (const page of pagesToAsk(rng, pages)) {
          const caller = rng.chance(0.7) ? "master" : "viewer";
          const r = await requestJson<Json>(gw, "GET", path("/key/aliases", { ...q, page }), { key: w.callers[caller] });
          const want = { aliases: all.slice((page - 1) * size, page * size), total_count: all.length, current_page: page, total_pages: pages };
          if (!same(r.body, want)) failures.push(`seed ${SEED}: ${caller} /key/aliases ${JSON.stringify({ ...q, page })} → ${r.status} ${r.text.slice(0, 400)}\n  expected ${JSON.stringify(want).slice(0, 400)}`);
        }
      }
      expect(failures).toEqual([]);
    }, 30_000);

    test("/team/list: live teams by creation, filtered by organization and member, with their live keys and memberships", async () => {
      const failures: string[] = [];
      const asks: Params[] = [{}, { organization_id: "default_organization" }, { organization_id: "no-such-org" }, { user_id: "u-dora" }];
      for (const o of w.orgs) asks.push({ organization_id: o });
      for (const u of w.users) asks.push({ user_id: u }, { user_id: u, organization_id: rng.pick([...w.orgs, "default_organization"]) });
      for (const q of asks) {
        const want = sortTeams(t, filterTeamsByOrgAndUser(t, t.teams.filter((x) => !x.deleted), q), "created_at", "asc").map((x) => ({
          team_id: x.team_id,
          keys: t.keys.filter((k) => k.team_id === x.team_id && !k.deleted).map((k) => k.token).sort(),
          members: t.teamMembers.filter((m) => m.team_id === x.team_id).map((m) => `${m.user_id}:${m.role}`).sort(),
        }));
        const r = await requestJson<Json[]>(gw, "GET", path("/team/list", q), { key: w.callers[rng.pick(["master", "viewer"] as const)] });
        const got = Array.isArray(r.body)
          ? r.body.map((x) => ({
              team_id: x.team_id,
              keys: (x.keys as Json[]).map((k) => String(k.token)).sort(),
              members: (x.team_memberships as Json[]).map((m) => `${m.user_id}:${m.role}`).sort(),
            }))
          : r.body;
        if (!same(got, want)) failures.push(`seed ${SEED}: /team/list ${JSON.stringify(q)} → ${r.status} ${JSON.stringify(got).slice(0, 500)}\n  expected ${JSON.stringify(want).slice(0, 500)}`);
      }
      expect(failures).toEqual([]);
    }, 30_000);

    test("/v2/team/list: filters, status=deleted, sorting with ties and pages equal the table's", async () => {
      const failures: string[] = [];
      const aliases = t.teams.map((x) => x.team_alias).filter((a): a is string => a !== null);
      // Every search term once (LIKE metacharacters literally), then random asks.
      const fixed: Params[] = SEARCHES.map((s) => ({ team_alias: s, page_size: 100 }));
      fixed.push({ status: "deleted" }, { status: "deleted", sort_by: "spend", sort_order: "desc" });
      for (let i = 0; i < 45 + fixed.length; i++) {
              const q: Params = fixed[i] ?? {
          status: rng.maybe(0.2, ["deleted", "active"]),
          team_id: rng.maybe(0.1, [...w.teams, "no-such-team"]),
          team_alias: rng.maybe(0.3, [...SEARCHES, ...aliases]),
          organization_id: rng.maybe(0.2, [...w.orgs, "default_organization", "no-such-org"]),
          user_id: rng.maybe(0.2, [...w.users, "u-dora"]),
          sort_by: rng.maybe(0.85, ["team_id", "team_alias", "created_at", "spend"]),
          sort_order: rng.maybe(0.7, ["asc", "desc"]),
          page_size: rng.maybe(0.85, [1, 2, 3, 5, 10, 100]),
        };
        const all = expectedTeamsV2(t, q);
        const size = Number(q.page_size ?? 10);
        const pages = Math.ceil(all.length / size);
        for (const page of pagesToAsk(rng, pages)) {
          const r = await requestJson<{ teams: Json[] } & Json>(gw, "GET", path("/v2/team/list", { ...q, page }), { key: w.callers[rng.pick(["master", "viewer"] as const)] });
          const got = r.status === 200 ? { ...r.body, teams: r.body.teams.map((x) => x.team_id) } : r.text;
          const want = { teams: all.slice((page - 1) * size, page * size).map((x) => x.team_id), total: all.length, page, page_size: size, total_pages: pages };
          if (!same(got, want)) failures.push(`seed ${SEED}: /v2/team/list ${JSON.stringify({ ...q, page })} → ${r.status} ${JSON.stringify(got).slice(0, 500)}\n  expected ${JSON.stringify(want).slice(0, 500)}`);
        }
      }
      expect(failures).toEqual([]);
    }, 30_000);

    test("/user/list: filters, sorting with ties and pages equal the table's, with each user's teams", async () => {
      const failures: string[] = [];
      for (let i = 0; i < 40; i++) {
              const ids = rng.some([...w.users, "no-such-user"], 4);
        const q: Params = {
          user_ids: rng.maybe(0.2, [ids.join(","), ` ${ids.join(" , ")},,`, ""]),
          [rng.chance(0.5) ? "role" : "user_role"]: rng.maybe(0.2, ["internal_user", "proxy_admin_viewer", "internal_user_viewer", "proxy_admin"]),
          user_email: rng.maybe(0.2, SEARCHES),
          [rng.chance(0.5) ? "team" : "team_id"]: rng.maybe(0.2, [...w.teams, "no-such-team"]),
          sort_by: rng.maybe(0.85, ["user_id", "user_email", "created_at", "spend"]),
          sort_order: rng.maybe(0.7, ["asc", "desc"]),
          page_size: rng.maybe(0.85, [1, 2, 3, 5, 25, 100]),
        };
        const all = expectedUsers(t, q);
        const size = Number(q.page_size ?? 25);
        const pages = Math.ceil(all.length / size);
        for (const page of pagesToAsk(rng, pages)) {
          const r = await requestJson<{ users: Json[] } & Json>(gw, "GET", path("/user/list", { ...q, page }), { key: w.callers[rng.pick(["master", "viewer"] as const)] });
          const got = r.status === 200 ? { ...r.body, users: r.body.users.map((u) => [u.user_id, [...(u.teams as string[])].sort()]) } : r.text;
          const want = {
            users: all.slice((page - 1) * size, page * size).map((u) => [u.user_id, t.teamMembers.filter((m) => m.user_id === u.user_id).map((m) => m.team_id).sort()]),
            total: all.length,
            page,
            page_size: size,
            total_pages: pages,
          };
          if (!same(got, want)) failures.push(`seed ${SEED}: /user/list ${JSON.stringify({ ...q, page })} → ${r.status} ${JSON.stringify(got).slice(0, 500)}\n  expected ${JSON.stringify(want).slice(0, 500)}`);
        }
      }
      expect(failures).toEqual([]);
    }, 30_000);

    test("/organization/list: by creation, filtered by id and alias (literally), an org admin sees its own", async () => {
      const failures: string[] = [];
      const asks: [CallerName, Params][] = [["master", {}], ["viewer", {}], ["orgAdmin", {}], ["orgAdmin", { org_id: w.orgs[1] }]];
      for (const s of SEARCHES) asks.push([rng.pick(["master", "viewer", "orgAdmin"] as const), { org_alias: s }]);
      for (const o of [...w.orgs, "no-such-org"]) asks.push([rng.pick(["master", "viewer"] as const), { org_id: o }]);
      for (const [name, q] of asks) {
        const caller = who(name);
        const own = readsAll(caller) ? undefined : t.orgMembers.filter((m) => m.user_id === caller.userId && m.user_role === "org_admin").map((m) => m.organization_id);
        const want = sortedBy(
          t,
          t.orgs.filter((o) => (!own || own.includes(o.organization_id)) && (!q.org_id || o.organization_id === q.org_id) && (!q.org_alias || containsCi(o.organization_alias, String(q.org_alias)))),
          (o) => o.created_at,
          "plain",
          "asc",
          (o) => o.organization_id,
        ).map((o) => ({
          id: o.organization_id,
          teams: t.teams.filter((x) => x.organization_id === o.organization_id && !x.deleted).map((x) => x.team_id).sort(),
          members: t.orgMembers.filter((m) => m.organization_id === o.organization_id).map((m) => m.user_id).sort(),
        }));
        const r = await requestJson<Json[]>(gw, "GET", path("/organization/list", q), { key: w.callers[name] });
        const got = Array.isArray(r.body)
          ? r.body.map((o) => ({
              id: o.organization_id,
              teams: (o.teams as Json[]).map((x) => String(x.team_id)).sort(),
              members: (o.members as Json[]).map((m) => String(m.user_id)).sort(),
            }))
          : r.text;
        if (!same(got, want)) failures.push(`seed ${SEED}: ${name} /organization/list ${JSON.stringify(q)} → ${r.status} ${JSON.stringify(got).slice(0, 500)}\n  expected ${JSON.stringify(want).slice(0, 500)}`);
      }
      expect(failures).toEqual([]);
    }, 30_000);

    test("callers without the right get 403 in the error envelope", async () => {
      const failures: string[] = [];
      for (const name of ["teamAdmin", "member", "lone", "userViewer", "orgAdmin"] as const) {
        const others = w.teams.filter((x) => !keyListTeams(t, who(name)).includes(x));
        for (const p of ["/team/list", "/v2/team/list", "/v2/team/list?status=deleted", "/user/list", "/user/list?page_size=1", "/key/aliases"]) {
          await refusedWith403(gw, w.callers[name], p, failures, name);
        }
        await refusedWith403(gw, w.callers[name], `/key/list?team_id=${encodeURIComponent(rng.pick(others))}`, failures, name);
        await refusedWith403(gw, w.callers[name], "/key/list?user_id=u-ann", failures, name);
      }
      for (const name of ["teamAdmin", "member", "lone", "userViewer"] as const) await refusedWith403(gw, w.callers[name], "/organization/list", failures, name);
      // A plain member lists its team's keys only where the team grants /key/list: team 0 does, team 2 does not;
      // the team admin's key, issued in team 0, does not speak for team 1 it also administers.
      await refusedWith403(gw, w.callers.teamAdmin, `/key/list?team_id=${w.teams[1]}`, failures, "teamAdmin");
      await refusedWith403(gw, w.callers.member, `/key/list?team_id=${w.teams[2]}`, failures, "member");
      await checkKeyList(gw, t, w, rng, who("member"), { team_id: w.teams[0]!, size: 3 }, failures);
      expect(failures).toEqual([]);
    });

    test("bad page, size, sort and flag parameters are 422 naming the parameter; an absurd page is empty", async () => {
      const failures: string[] = [];
      const bad: [string, number, string, string?][] = [
        ["/key/list?page=0", 422, "page"],
        ["/key/list?size=101", 422, "size"],
        ["/key/list?size=1.5", 422, "size"],
        ["/key/list?sort_by=secret", 422, "sort_by"],
        ["/key/list?sort_order=sideways", 422, "sort_order"],
        ["/key/list?status=gone", 422, "status"],
        ["/key/list?include_team_keys=maybe", 422, "include_team_keys"],
        ["/key/list?include_created_by_keys=2", 422, "include_created_by_keys"],
        ["/key/aliases?size=101", 422, "size"],
        ["/v2/team/list?page_size=101", 422, "page_size"],
        ["/v2/team/list?page=-1", 422, "page"],
        ["/v2/team/list?sort_by=team_secret", 422, "sort_by"],
        ["/v2/team/list?status=gone", 422, "status"],
        ["/user/list?page_size=0", 422, "page_size"],
        ["/user/list?sort_order=up", 422, "sort_order"],
      ];
      // Whoever sends it: a caller who does not read everything uses it, and must send a boolean too.
      bad.push(["/key/list?include_team_keys=maybe", 422, "include_team_keys", w.callers.teamAdmin]);
      for (const [p, status, param, key] of bad) {
        const r = await requestJson<{ error?: Json }>(gw, "GET", p, { key });
        if (r.status !== status || r.body?.error?.param !== param) failures.push(`seed ${SEED}: GET ${p} → ${r.status} ${r.text.slice(0, 200)}, expected ${status} naming ${param}`);
      }
      const far = await requestJson<Json>(gw, "GET", "/key/list?page=1000000&size=100");
      const total = t.keys.filter((k) => !k.deleted).length;
      if (!same(far.body, { keys: [], total_count: total, current_page: 1000000, total_pages: Math.ceil(total / 100) })) failures.push(`seed ${SEED}: /key/list page 1000000 → ${far.status} ${far.text.slice(0, 200)}`);
      expect(failures).toEqual([]);
    });

    test("a page number of Number.MAX_SAFE_INTEGER is an empty page, not a 500", async () => {
      const failures: string[] = [];
      const page = Number.MAX_SAFE_INTEGER;
      for (const p of [`/key/list?page=${page}&size=100`, `/key/aliases?page=${page}&size=100`, `/v2/team/list?page=${page}&page_size=100`, `/user/list?page=${page}&page_size=100`]) {
        const r = await requestJson<Json>(gw, "GET", p);
        if (r.status !== 200) failures.push(`seed ${SEED}: GET ${p} → ${r.status} ${r.text.slice(0, 300)}`);
      }
      expect(failures).toEqual([]);
    });
  });
}

