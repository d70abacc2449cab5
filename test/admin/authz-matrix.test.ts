// The authorization matrix: every management endpoint × every kind of caller → the expected
// status, on the embedded store and on PostgreSQL. Callers: the master key, a proxy_admin user's
// key, a proxy_admin_viewer's key, a team admin's key on its own team (T1) and on another team
// (T2, and a team that does not exist, which must answer exactly the same), a `user` member's key
// (T1, default team_member_permissions), a plain internal user's key, and the keys that must be
// refused outright (blocked, deleted, expired, never issued, a key's hash sent as the key, none).
//
// Every cell fails when the status differs, when a refusal is anything but the error envelope,
// when any response names an object the caller did not name and may not see (ids, aliases,
// e-mails, key hashes; key plaintexts and upstream credentials never appear anywhere), when a
// refused write changed the store (the touched rows are read before and after) or wrote an audit
// row, and when an allowed write changed nothing. Writes act on disposable objects made for that
// cell, written straight to the store in bulk (test/fixtures/authz-world.ts).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { count, eq, type SQL } from "drizzle-orm";
import type { AdminDeps } from "../../core/http/admin/context.ts";
import { adminRoutes } from "../../core/http/admin/index.ts";
import type { Db } from "../../core/store/db.ts";
import { accessGroups, auditLog, budgets, organizations, orgMembers, proxyModels, teamMembers, teams, users, virtualKeys } from "../../core/store/schema.ts";
import { type FixtureGroup, type FixtureKey, type FixtureModel, Fixtures, type MarkerScope, sha256, uniq } from "../fixtures/authz-world.ts";
import { BACKENDS, MASTER_KEY, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

const ROLES = ["master", "proxyAdmin", "viewer", "teamAdminOwn", "teamAdminOther", "member", "plain"] as const;
const REFUSED = ["blocked", "deleted", "expired", "unknown", "hashed", "none"] as const;
type Role = (typeof ROLES)[number];
type Col = Role | (typeof REFUSED)[number] | "teamAdminGhost";
type Row = [number, number, number, number, number, number, number];

/**
 * Expected status per endpoint, in the order of ROLES. Every endpoint answers 401 to each REFUSED
 * caller. The team admin's "other" column also stands for a team (or key, user, org, model, group)
 * that does not exist: same status, no data. Derived from the spec's levels (Global Admin Only →
 * proxy admins; reads also the admin viewer), "Team Admin Allowed" → also a team admin on its own
 * team (key regenerate/reset_spend and key block/unblock are described for team keys too), team
 * `user` members view the team and get the default ["/key/info", "/key/health"], viewers never
 * write, and /model/info, /v1/models and /key/health answer any valid key about what it may use.
 */
const MATRIX: Record<string, Row> = {
  //                                          master admin viewer own other member plain
  "POST /key/generate":                          [200, 200, 403, 200, 403, 403, 403],
  "POST /key/service-account/generate":          [200, 200, 403, 403, 403, 403, 403],
  "GET /key/info":                               [200, 200, 200, 200, 403, 200, 403],
  "GET /key/list":                               [200, 200, 200, 200, 403, 403, 403],
  "GET /key/aliases":                            [200, 200, 200, 403, 403, 403, 403],
  "POST /key/update":                            [200, 200, 403, 200, 403, 403, 403],
  "POST /key/bulk_update":                       [200, 200, 403, 403, 403, 403, 403],
  "POST /key/delete":                            [200, 200, 403, 200, 403, 403, 403],
  "POST /key/block":                             [200, 200, 403, 200, 403, 403, 403],
  "POST /key/unblock":                           [200, 200, 403, 200, 403, 403, 403],
  "POST /key/regenerate":                        [200, 200, 403, 200, 403, 403, 403],
  "POST /key/{key}/regenerate":                  [200, 200, 403, 200, 403, 403, 403],
  "POST /key/{key}/reset_spend":                 [200, 200, 403, 200, 403, 403, 403],
  "POST /key/health":                            [200, 200, 200, 200, 200, 200, 200],
  "POST /user/new":                              [200, 200, 403, 403, 403, 403, 403],
  "GET /user/info":                              [200, 200, 200, 403, 403, 403, 403],
  "POST /user/update":                           [200, 200, 403, 403, 403, 403, 403],
  "POST /user/delete":                           [200, 200, 403, 403, 403, 403, 403],
  "GET /user/list":                              [200, 200, 200, 403, 403, 403, 403],
  "POST /team/new":                              [200, 200, 403, 403, 403, 403, 403],
  "POST /team/update":                           [200, 200, 403, 403, 403, 403, 403],
  "POST /team/delete":                           [200, 200, 403, 403, 403, 403, 403],
  "GET /team/info":                              [200, 200, 200, 200, 403, 200, 403],
  "GET /team/list":                              [200, 200, 200, 403, 403, 403, 403],
  "GET /v2/team/list":                           [200, 200, 200, 403, 403, 403, 403],
  "GET /team/available":                         [200, 200, 200, 403, 403, 403, 403],
  "POST /team/block":                            [200, 200, 403, 403, 403, 403, 403],
  "POST /team/unblock":                          [200, 200, 403, 403, 403, 403, 403],
  "POST /team/member_add":                       [200, 200, 403, 200, 403, 403, 403],
  "POST /team/member_delete":                    [200, 200, 403, 200, 403, 403, 403],
  "POST /team/member_update":                    [200, 200, 403, 200, 403, 403, 403],
  "POST /team/bulk_member_add":                  [200, 200, 403, 403, 403, 403, 403],
  "GET /team/permissions_list":                  [200, 200, 200, 403, 403, 403, 403],
  "POST /team/permissions_update":               [200, 200, 403, 403, 403, 403, 403],
  "POST /team/model/add":                        [200, 200, 403, 200, 403, 403, 403],
  "POST /team/{team_id}/callback":               [200, 200, 403, 200, 403, 403, 403],
  "GET /team/{team_id}/callback":                [200, 200, 200, 200, 403, 403, 403],
  "POST /team/{team_id}/disable_logging":        [200, 200, 403, 200, 403, 403, 403],
  "POST /team/model/delete":                     [200, 200, 403, 200, 403, 403, 403],
  "POST /organization/new":                      [200, 200, 403, 403, 403, 403, 403],
  "PATCH /organization/update":                  [200, 200, 403, 403, 403, 403, 403],
  "DELETE /organization/delete":                 [200, 200, 403, 403, 403, 403, 403],
  "GET /organization/info":                      [200, 200, 200, 403, 403, 403, 403],
  "POST /organization/info":                     [200, 200, 200, 403, 403, 403, 403],
  "GET /organization/list":                      [200, 200, 200, 403, 403, 403, 403],
  "POST /organization/member_add":               [200, 200, 403, 403, 403, 403, 403],
  "PATCH /organization/member_update":           [200, 200, 403, 403, 403, 403, 403],
  "DELETE /organization/member_delete":          [200, 200, 403, 403, 403, 403, 403],
  "POST /model/new":                             [200, 200, 403, 403, 403, 403, 403],
  "POST /model/update":                          [200, 200, 403, 403, 403, 403, 403],
  "POST /model/delete":                          [200, 200, 403, 403, 403, 403, 403],
  "PATCH /model/{model_id}/update":              [200, 200, 403, 403, 403, 403, 403],
  "GET /model/info":                             [200, 200, 200, 200, 200, 200, 200],
  "GET /v1/models":                              [200, 200, 200, 200, 403, 200, 403],
  "POST /access_group/new":                      [200, 200, 403, 403, 403, 403, 403],
  "GET /access_group/list":                      [200, 200, 200, 403, 403, 403, 403],
  "GET /access_group/{access_group}/info":       [200, 200, 200, 403, 403, 403, 403],
  "PUT /access_group/{access_group}/update":     [200, 200, 403, 403, 403, 403, 403],
  "DELETE /access_group/{access_group}/delete":  [200, 200, 403, 403, 403, 403, 403],
  "GET /v1/access_group/{access_group_id}":      [200, 200, 200, 403, 403, 403, 403],
  "PUT /v1/access_group/{access_group_id}":      [200, 200, 403, 403, 403, 403, 403],
  "DELETE /v1/access_group/{access_group_id}":   [200, 200, 403, 403, 403, 403, 403],
  "GET /audit/logs":                             [200, 200, 200, 403, 403, 403, 403],
  "GET /health":                                 [200, 200, 200, 403, 403, 403, 403],
  "POST /budget/new":                            [200, 200, 403, 403, 403, 403, 403],
  "POST /budget/update":                         [200, 200, 403, 403, 403, 403, 403],
  "POST /budget/info":                           [200, 200, 200, 403, 403, 403, 403],
  "GET /budget/list":                            [200, 200, 200, 403, 403, 403, 403],
  "GET /budget/settings":                        [200, 200, 200, 403, 403, 403, 403],
  "POST /budget/delete":                         [200, 200, 403, 403, 403, 403, 403],
  "GET /global/spend/report":                    [200, 200, 200, 403, 403, 403, 403],
  "GET /global/spend/tags":                      [200, 200, 200, 403, 403, 403, 403],
  "GET /config/pass_through_endpoint":           [200, 200, 200, 403, 403, 403, 403],
  "GET /config/pass_through_endpoint/team/{team_id}": [200, 200, 200, 403, 403, 403, 403],
  "GET /spend/tags":                             [200, 200, 200, 403, 403, 403, 403],
  "GET /provider/budgets":                       [200, 200, 200, 403, 403, 403, 403],
  "POST /spend/calculate":                       [200, 200, 200, 403, 403, 403, 403],
  "GET /spend/logs":                             [200, 200, 200, 200, 403, 403, 403],
  "GET /spend/logs/v2":                          [200, 200, 200, 200, 403, 403, 403],
  "GET /spend/keys":                             [200, 200, 200, 403, 403, 403, 403],
  "GET /spend/users":                            [200, 200, 200, 403, 403, 403, 403],
  "GET /team/daily/activity":                    [200, 200, 200, 200, 403, 403, 403],
  "GET /organization/daily/activity":            [200, 200, 200, 403, 403, 403, 403],
  "POST /global/spend/reset":                    [200, 200, 403, 403, 403, 403, 403],
};

/** Routes outside the admin module that the matrix covers too. */
const OTHER_ROUTES = ["GET /health", "GET /model/info", "GET /v1/models"];

function expectedStatus(endpoint: string, col: Col): number {
  const row = MATRIX[endpoint]!;
  if (col === "teamAdminGhost") return row[ROLES.indexOf("teamAdminOther")]!;
  const i = ROLES.indexOf(col as Role);
  return i < 0 ? 401 : row[i]!;
}

const UPSTREAM_SECRET = `sk-upstream-${randomBytes(8).toString("hex")}`;
const UPSTREAM_BASE = `http://upstream-${randomBytes(4).toString("hex")}.invalid/v1`;

const CONFIG = {
  model_list: [
    { model_name: "chat-a", svc_params: { model: "mock/chat-a", api_key: UPSTREAM_SECRET, api_base: UPSTREAM_BASE } },
    { model_name: "chat-b", svc_params: { model: "mock/chat-b" } },
    { model_name: "chat-c", svc_params: { model: "mock/chat-c" } },
  ],
  general_settings: { master_key: MASTER_KEY },
};

type Json = Record<string, unknown>;
type Method = "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
interface Reply {
  status: number;
  text: string;
  body: unknown;
}

/** One cell's request. */
interface Plan {
  method: Method;
  path: string;
  body?: unknown;
  /** The rows the call may change, read before and after (writes only). */
  state?: () => Promise<unknown>;
  /** Further problems with an allowed answer. */
  allowed?: (body: unknown) => string[];
}

interface Endpoint {
  /** The request names an object, so the team admin also names one that does not exist. */
  targeted: boolean;
  plan(s: Scope): Plan;
}

interface SeedUser {
  id: string;
  email: string;
}
interface SeedKey extends FixtureKey {
  alias: string;
}
type UserName = "admin" | "viewer" | "u1" | "u2" | "u3" | "u4" | "u5";
type KeyName = "admin" | "viewer" | "teamAdmin" | "member" | "plain" | "blocked" | "deleted" | "expired";
interface Seeds {
  t1: string;
  t2: string;
  o1: string;
  users: Record<UserName, SeedUser>;
  keys: Record<KeyName, SeedKey>;
  /** When the expired key expires (ms). */
  expiresAt: number;
}

const json = (v: unknown): unknown => JSON.parse(JSON.stringify(v));

/** Reads the rows a write may touch, as plain JSON (timestamps as strings). */
function stateReader(db: Db) {
  const keyRefs = (where: SQL) =>
    db.select({ token: virtualKeys.token, deletedAt: virtualKeys.deletedAt }).from(virtualKeys).where(where).orderBy(virtualKeys.token);
  return {
    key: async (token: string) => json(await db.select().from(virtualKeys).where(eq(virtualKeys.token, token))),
    keysWithAlias: async (alias: string) => json(await db.select().from(virtualKeys).where(eq(virtualKeys.keyAlias, alias))),
    team: async (teamId: string) =>
      json({
        team: await db.select().from(teams).where(eq(teams.teamId, teamId)),
        members: await db.select().from(teamMembers).where(eq(teamMembers.teamId, teamId)).orderBy(teamMembers.userId),
        keys: await keyRefs(eq(virtualKeys.teamId, teamId)),
      }),
    user: async (userId: string) =>
      json({
        user: await db.select().from(users).where(eq(users.userId, userId)),
        teams: await db.select().from(teamMembers).where(eq(teamMembers.userId, userId)).orderBy(teamMembers.teamId),
        orgs: await db.select().from(orgMembers).where(eq(orgMembers.userId, userId)).orderBy(orgMembers.organizationId),
        keys: await keyRefs(eq(virtualKeys.userId, userId)),
      }),
    org: async (orgId: string) =>
      json({
        org: await db.select().from(organizations).where(eq(organizations.organizationId, orgId)),
        members: await db.select().from(orgMembers).where(eq(orgMembers.organizationId, orgId)).orderBy(orgMembers.userId),
      }),
    groupById: async (id: string) => json(await db.select().from(accessGroups).where(eq(accessGroups.accessGroupId, id))),
    groupByName: async (name: string) => json(await db.select().from(accessGroups).where(eq(accessGroups.accessGroupName, name))),
    model: async (id: string) => json(await db.select().from(proxyModels).where(eq(proxyModels.modelId, id))),
    budget: async (id: string) => json(await db.select().from(budgets).where(eq(budgets.budgetId, id))),
    /** A key's row, its spend first set to `spend` on the first read (global resets need spend to undo). */
    keyWithSpend(token: string, spend: number): () => Promise<unknown> {
      let primed = false;
      return async () => {
        if (!primed) {
          primed = true;
          await db.update(virtualKeys).set({ spend: String(spend) }).where(eq(virtualKeys.token, token));
        }
        return json(await db.select().from(virtualKeys).where(eq(virtualKeys.token, token)));
      };
    },
  };
}
type StateReader = ReturnType<typeof stateReader>;

interface World {
  f: Fixtures;
  seeds: Seeds;
  rows: StateReader;
  /** The stored model that callers who may not change models aim at. */
  bystanderModel: FixtureModel;
}

/**
 * The objects one cell acts on. The master key and the proxy admin get fresh ones (their writes
 * succeed and must not disturb other cells); the team admin on another team gets T2's; the ghost
 * cell gets names that exist nowhere; everyone else aims at T1, the team admin's own team.
 */
class Scope {
  readonly kind: "fresh" | "t1" | "t2" | "ghost";
  private teamId: string | undefined;

  constructor(
    readonly col: Col,
    private readonly w: World,
  ) {
    this.kind =
      col === "master" || col === "proxyAdmin" ? "fresh" : col === "teamAdminOther" ? "t2" : col === "teamAdminGhost" ? "ghost" : "t1";
  }

  get rows(): StateReader {
    return this.w.rows;
  }
  get seeds(): Seeds {
    return this.w.seeds;
  }
  /** Marker scope of what is made for this cell inside its team. */
  private get inTeam(): MarkerScope {
    return this.kind === "t1" ? "T1" : this.kind === "t2" ? "T2" : "fresh";
  }
  /** Marker scope of what is made for this cell outside any team. */
  private get outside(): MarkerScope {
    return this.kind === "fresh" ? "fresh" : "other";
  }
  private ghost(what: string): string {
    return uniq(`mx-ghost-${what}`);
  }

  /** A new value the call itself creates (an id or alias). */
  newId(prefix: string): string {
    return this.kind === "ghost" ? this.ghost(prefix) : this.w.f.id(this.inTeam, prefix);
  }

  team(opts: { blocked?: boolean } = {}): string {
    if (this.kind === "t1") return this.w.seeds.t1;
    if (this.kind === "t2") return this.w.seeds.t2;
    this.teamId ??= this.kind === "ghost" ? this.ghost("team") : this.w.f.team("fresh", opts);
    return this.teamId;
  }

  /** The organization a new team of this cell would join (T2's for the other team). */
  teamOrg(): Json {
    if (this.kind === "t2") return { organization_id: this.w.seeds.o1 };
    if (this.kind === "ghost") return { organization_id: this.ghost("org") };
    return {};
  }

  /** A key of this cell's team, owned by another member of it (never by the caller). */
  key(opts: { blocked?: boolean; spend?: number } = {}): FixtureKey {
    if (this.kind === "ghost") {
      const plain = `sk-${randomBytes(24).toString("base64url")}`;
      return { plain, token: sha256(plain) };
    }
    const owner = this.kind === "t1" ? this.w.seeds.users.u4.id : this.kind === "t2" ? this.w.seeds.users.u5.id : null;
    return this.w.f.key(this.inTeam, this.team(), owner, opts);
  }

  /** A user who is a `user` member of this cell's team. */
  member(): string {
    return this.kind === "ghost" ? this.ghost("user") : this.w.f.user(this.inTeam, this.team());
  }

  org(): string {
    if (this.kind === "ghost") return this.ghost("org");
    if (this.kind === "t2") return this.w.seeds.o1;
    return this.w.f.org(this.outside);
  }

  orgMember(): { org: string; user: string } {
    if (this.kind === "ghost") return { org: this.ghost("org"), user: this.ghost("user") };
    const org = this.org();
    return { org, user: this.w.f.orgMember(this.kind === "t2" ? "T2" : this.outside, org) };
  }

  budget(): string {
    return this.kind === "ghost" ? this.ghost("budget") : this.w.f.budget(this.outside);
  }

  group(): FixtureGroup {
    return this.kind === "ghost" ? { id: this.ghost("group-id"), name: this.ghost("group") } : this.w.f.group(this.outside);
  }

  model(): FixtureModel {
    if (this.kind === "ghost") return { id: this.ghost("model-id"), name: this.ghost("model") };
    return this.kind === "fresh" ? this.w.f.model() : this.w.bystanderModel;
  }
}

const q = encodeURIComponent;
const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

const targeted = (plan: (s: Scope) => Plan): Endpoint => ({ targeted: true, plan });
const untargeted = (method: Method, path: string): Endpoint => ({ targeted: false, plan: () => ({ method, path }) });

/** The `keys` of an answer that fail `ok`; an empty list is itself a problem (these answers must list some). */
function badKeys(body: unknown, ok: (k: Json) => boolean, what: string): string[] {
  const keys = isObject(body) && Array.isArray(body.keys) ? body.keys : [];
  if (keys.length === 0) return ["lists no keys, though some are in reach"];
  return keys.filter((k) => !isObject(k) || !ok(k)).map((k) => `lists a key ${what}: ${JSON.stringify(k)}`);
}

/** An allowed answer to a plain member may only carry that member's own keys. */
const ownKeysOnly = (body: unknown, userId: string) => badKeys(body, (k) => k.user_id === userId, "that is not the member's own");
const keysOfTeamOnly = (body: unknown, teamId: string) => badKeys(body, (k) => k.team_id === teamId, `outside team ${teamId}`);

const ENDPOINTS: Record<string, Endpoint> = {
  // ---- virtual keys
  "POST /key/generate": targeted((s) => {
    const alias = s.newId("mx-new-key");
    return { method: "POST", path: "/key/generate", body: { team_id: s.team(), key_alias: alias }, state: () => s.rows.keysWithAlias(alias) };
  }),
  "POST /key/service-account/generate": targeted((s) => {
    const alias = s.newId("mx-new-sa");
    return { method: "POST", path: "/key/service-account/generate", body: { team_id: s.team(), key_alias: alias }, state: () => s.rows.keysWithAlias(alias) };
  }),
  "GET /key/info": targeted((s) => ({ method: "GET", path: `/key/info?key=${s.key().token}` })),
  "GET /key/list": targeted((s) => {
    const team = s.team();
    // A fresh team has no keys; T1 has many.
    return { method: "GET", path: `/key/list?team_id=${q(team)}&return_full_object=true`, allowed: (b) => (s.kind === "t1" ? keysOfTeamOnly(b, team) : []) };
  }),
  "GET /key/aliases": untargeted("GET", "/key/aliases"),
  "POST /key/update": targeted((s) => {
    const k = s.key();
    return { method: "POST", path: "/key/update", body: { key: k.plain, max_budget: 42 }, state: () => s.rows.key(k.token) };
  }),
  "POST /key/bulk_update": targeted((s) => {
    const k = s.key();
    return { method: "POST", path: "/key/bulk_update", body: { keys: [{ key: k.plain, max_budget: 42 }] }, state: () => s.rows.key(k.token) };
  }),
  "POST /key/delete": targeted((s) => {
    const k = s.key();
    return { method: "POST", path: "/key/delete", body: { keys: [k.plain] }, state: () => s.rows.key(k.token) };
  }),
  "POST /key/block": targeted((s) => {
    const k = s.key();
    return { method: "POST", path: "/key/block", body: { key: k.plain }, state: () => s.rows.key(k.token) };
  }),
  "POST /key/unblock": targeted((s) => {
    const k = s.key({ blocked: true });
    return { method: "POST", path: "/key/unblock", body: { key: k.plain }, state: () => s.rows.key(k.token) };
  }),
  "POST /key/regenerate": targeted((s) => {
    const k = s.key();
    return { method: "POST", path: "/key/regenerate", body: { key: k.plain }, state: () => s.rows.key(k.token) };
  }),
  "POST /key/{key}/regenerate": targeted((s) => {
    const k = s.key();
    return { method: "POST", path: `/key/${k.token}/regenerate`, body: {}, state: () => s.rows.key(k.token) };
  }),
  "POST /key/{key}/reset_spend": targeted((s) => {
    const k = s.key({ spend: 5 });
    return { method: "POST", path: `/key/${k.token}/reset_spend`, body: {}, state: () => s.rows.key(k.token) };
  }),
  "POST /key/health": untargeted("POST", "/key/health"),

  // ---- users
  "POST /user/new": targeted((s) => {
    const id = s.newId("mx-new-user");
    return { method: "POST", path: "/user/new", body: { user_id: id, user_email: `${id}@example.test`, auto_create_key: false, teams: [s.team()] }, state: () => s.rows.user(id) };
  }),
  "GET /user/info": targeted((s) => ({ method: "GET", path: `/user/info?user_id=${q(s.member())}` })),
  "POST /user/update": targeted((s) => {
    const u = s.member();
    return { method: "POST", path: "/user/update", body: { user_id: u, user_alias: s.newId("mx-user-alias") }, state: () => s.rows.user(u) };
  }),
  "POST /user/delete": targeted((s) => {
    const u = s.member();
    return { method: "POST", path: "/user/delete", body: { user_ids: [u] }, state: () => s.rows.user(u) };
  }),
  "GET /user/list": targeted((s) => ({ method: "GET", path: `/user/list?team_id=${q(s.team())}` })),

  // ---- teams
  "POST /team/new": targeted((s) => {
    const id = s.newId("mx-new-team");
    return { method: "POST", path: "/team/new", body: { team_id: id, team_alias: s.newId("mx-team-alias"), ...s.teamOrg() }, state: () => s.rows.team(id) };
  }),
  "POST /team/update": targeted((s) => {
    const team = s.team();
    return { method: "POST", path: "/team/update", body: { team_id: team, team_alias: s.newId("mx-team-alias") }, state: () => s.rows.team(team) };
  }),
  "POST /team/delete": targeted((s) => {
    const team = s.team();
    return { method: "POST", path: "/team/delete", body: { team_ids: [team] }, state: () => s.rows.team(team) };
  }),
  "GET /team/info": targeted((s) => ({
    method: "GET",
    path: `/team/info?team_id=${q(s.team())}`,
    allowed: (b) => (s.col === "member" ? ownKeysOnly(b, s.seeds.users.u2.id) : []),
  })),
  "GET /team/list": untargeted("GET", "/team/list"),
  "GET /v2/team/list": untargeted("GET", "/v2/team/list"),
  "GET /team/available": untargeted("GET", "/team/available"),
  "POST /team/block": targeted((s) => {
    const team = s.team();
    return { method: "POST", path: "/team/block", body: { team_id: team }, state: () => s.rows.team(team) };
  }),
  "POST /team/unblock": targeted((s) => {
    const team = s.team({ blocked: true });
    return { method: "POST", path: "/team/unblock", body: { team_id: team }, state: () => s.rows.team(team) };
  }),
  "POST /team/member_add": targeted((s) => {
    const user = s.newId("mx-new-member");
    return { method: "POST", path: "/team/member_add", body: { team_id: s.team(), member: { role: "user", user_id: user } }, state: () => s.rows.user(user) };
  }),
  "POST /team/member_delete": targeted((s) => {
    const team = s.team();
    const user = s.member();
    return { method: "POST", path: "/team/member_delete", body: { team_id: team, user_id: user }, state: () => s.rows.user(user) };
  }),
  "POST /team/member_update": targeted((s) => {
    const team = s.team();
    const user = s.member();
    return { method: "POST", path: "/team/member_update", body: { team_id: team, user_id: user, max_budget_in_team: 7 }, state: () => s.rows.user(user) };
  }),
  "POST /team/bulk_member_add": targeted((s) => {
    const user = s.newId("mx-new-member");
    return { method: "POST", path: "/team/bulk_member_add", body: { team_id: s.team(), members: [{ role: "user", user_id: user }] }, state: () => s.rows.user(user) };
  }),
  "GET /team/permissions_list": targeted((s) => ({ method: "GET", path: `/team/permissions_list?team_id=${q(s.team())}` })),
  "POST /team/permissions_update": targeted((s) => {
    const team = s.team();
    return { method: "POST", path: "/team/permissions_update", body: { team_id: team, team_member_permissions: ["/key/info", "/key/list"] }, state: () => s.rows.team(team) };
  }),
  "POST /team/{team_id}/callback": targeted((s) => {
    const team = s.team();
    const body = { callbacks: [{ callback_type: "webhook", url: "https://hooks.example.invalid/mx", headers: { authorization: "Bearer mx" } }] };
    return { method: "POST", path: `/team/${q(team)}/callback`, body, state: () => s.rows.team(team) };
  }),
  "GET /team/{team_id}/callback": targeted((s) => ({ method: "GET", path: `/team/${q(s.team())}/callback` })),
  "POST /team/{team_id}/disable_logging": targeted((s) => {
    const team = s.team();
    return { method: "POST", path: `/team/${q(team)}/disable_logging`, state: () => s.rows.team(team) };
  }),
  "POST /team/model/add": targeted((s) => {
    const team = s.team();
    return { method: "POST", path: "/team/model/add", body: { team_id: team, models: ["chat-b"] }, state: () => s.rows.team(team) };
  }),
  "POST /team/model/delete": targeted((s) => {
    const team = s.team();
    return { method: "POST", path: "/team/model/delete", body: { team_id: team, models: ["chat-c"] }, state: () => s.rows.team(team) };
  }),

  // ---- organizations
  "POST /organization/new": targeted((s) => {
    const id = s.newId("mx-new-org");
    return { method: "POST", path: "/organization/new", body: { organization_id: id, organization_alias: s.newId("mx-org-alias") }, state: () => s.rows.org(id) };
  }),
  "PATCH /organization/update": targeted((s) => {
    const org = s.org();
    return { method: "PATCH", path: "/organization/update", body: { organization_id: org, organization_alias: s.newId("mx-org-alias") }, state: () => s.rows.org(org) };
  }),
  "DELETE /organization/delete": targeted((s) => {
    const org = s.org();
    return { method: "DELETE", path: "/organization/delete", body: { organization_ids: [org] }, state: () => s.rows.org(org) };
  }),
  "GET /organization/info": targeted((s) => ({ method: "GET", path: `/organization/info?organization_id=${q(s.org())}` })),
  "POST /organization/info": targeted((s) => ({ method: "POST", path: "/organization/info", body: { organization_id: s.org() } })),
  "GET /organization/list": targeted((s) => ({ method: "GET", path: `/organization/list?org_id=${q(s.org())}` })),
  "POST /organization/member_add": targeted((s) => {
    const user = s.newId("mx-new-org-member");
    return {
      method: "POST",
      path: "/organization/member_add",
      body: { organization_id: s.org(), member: { role: "internal_user", user_id: user } },
      state: () => s.rows.user(user),
    };
  }),
  "PATCH /organization/member_update": targeted((s) => {
    const { org, user } = s.orgMember();
    return { method: "PATCH", path: "/organization/member_update", body: { organization_id: org, user_id: user, role: "internal_user_viewer" }, state: () => s.rows.user(user) };
  }),
  "DELETE /organization/member_delete": targeted((s) => {
    const { org, user } = s.orgMember();
    return { method: "DELETE", path: "/organization/member_delete", body: { organization_id: org, user_id: user }, state: () => s.rows.user(user) };
  }),

  // ---- models
  "POST /model/new": targeted((s) => {
    // Model ids and names are public (/model/info lists them), so they are not markers.
    const id = uniq("mx-new-model-id");
    return {
      method: "POST",
      path: "/model/new",
      body: { model_name: uniq("mx-model"), svc_params: { model: "mock/chat-a", api_key: UPSTREAM_SECRET }, model_info: { id } },
      state: () => s.rows.model(id),
    };
  }),
  "POST /model/update": targeted((s) => {
    const m = s.model();
    return {
      method: "POST",
      path: "/model/update",
      body: { model_name: m.name, svc_params: { model: "mock/chat-b", api_key: UPSTREAM_SECRET }, model_info: { id: m.id } },
      state: () => s.rows.model(m.id),
    };
  }),
  "POST /model/delete": targeted((s) => {
    const m = s.model();
    return { method: "POST", path: "/model/delete", body: { id: m.id }, state: () => s.rows.model(m.id) };
  }),
  "PATCH /model/{model_id}/update": targeted((s) => {
    const m = s.model();
    return { method: "PATCH", path: `/model/${q(m.id)}/update`, body: { svc_params: { model: "mock/chat-b" } }, state: () => s.rows.model(m.id) };
  }),
  "GET /model/info": untargeted("GET", "/model/info"),
  "GET /v1/models": targeted((s) => ({ method: "GET", path: `/v1/models?team_id=${q(s.team())}` })),

  // ---- access groups
  "POST /access_group/new": targeted((s) => {
    const name = s.newId("mx-new-group");
    return { method: "POST", path: "/access_group/new", body: { access_group: name, model_names: ["chat-a"] }, state: () => s.rows.groupByName(name) };
  }),
  "GET /access_group/list": untargeted("GET", "/access_group/list"),
  "GET /access_group/{access_group}/info": targeted((s) => ({ method: "GET", path: `/access_group/${q(s.group().name)}/info` })),
  "PUT /access_group/{access_group}/update": targeted((s) => {
    const g = s.group();
    return { method: "PUT", path: `/access_group/${q(g.name)}/update`, body: { model_names: ["chat-b"] }, state: () => s.rows.groupById(g.id) };
  }),
  "DELETE /access_group/{access_group}/delete": targeted((s) => {
    const g = s.group();
    return { method: "DELETE", path: `/access_group/${q(g.name)}/delete`, state: () => s.rows.groupById(g.id) };
  }),
  "GET /v1/access_group/{access_group_id}": targeted((s) => ({ method: "GET", path: `/v1/access_group/${q(s.group().id)}` })),
  "PUT /v1/access_group/{access_group_id}": targeted((s) => {
    const g = s.group();
    return { method: "PUT", path: `/v1/access_group/${q(g.id)}`, body: { model_names: ["chat-b"] }, state: () => s.rows.groupById(g.id) };
  }),
  "DELETE /v1/access_group/{access_group_id}": targeted((s) => {
    const g = s.group();
    return { method: "DELETE", path: `/v1/access_group/${q(g.id)}`, state: () => s.rows.groupById(g.id) };
  }),

  // ---- audit trail and health
  "GET /audit/logs": targeted((s) => ({ method: "GET", path: `/audit/logs?table_name=teams&object_id=${q(s.team())}` })),
  "GET /health": untargeted("GET", "/health"),

  // ---- budgets
  "POST /budget/new": targeted((s) => {
    const id = s.newId("mx-new-budget");
    return { method: "POST", path: "/budget/new", body: { budget_id: id, max_budget: 5 }, state: () => s.rows.budget(id) };
  }),
  "POST /budget/update": targeted((s) => {
    const id = s.budget();
    return { method: "POST", path: "/budget/update", body: { budget_id: id, max_budget: 42 }, state: () => s.rows.budget(id) };
  }),
  "POST /budget/info": targeted((s) => ({ method: "POST", path: "/budget/info", body: { budgets: [s.budget()] } })),
  "GET /budget/list": untargeted("GET", "/budget/list"),
  "GET /budget/settings": targeted((s) => ({ method: "GET", path: `/budget/settings?budget_id=${q(s.budget())}` })),
  "POST /budget/delete": targeted((s) => {
    const id = s.budget();
    return { method: "POST", path: "/budget/delete", body: { id }, state: () => s.rows.budget(id) };
  }),

  // ---- spend
  "GET /global/spend/report": targeted((s) => ({ method: "GET", path: `/global/spend/report?start_date=2020-01-01&end_date=2099-12-31&team_id=${q(s.team())}` })),
  "GET /global/spend/tags": untargeted("GET", "/global/spend/tags"),
  "GET /config/pass_through_endpoint": untargeted("GET", "/config/pass_through_endpoint"),
  "GET /config/pass_through_endpoint/team/{team_id}": targeted((s) => ({ method: "GET", path: `/config/pass_through_endpoint/team/${q(s.team())}` })),
  "GET /spend/tags": untargeted("GET", "/spend/tags"),
  "GET /provider/budgets": untargeted("GET", "/provider/budgets"),
  "POST /spend/calculate": { targeted: false, plan: () => ({ method: "POST", path: "/spend/calculate", body: { model: "chat-a", messages: [{ role: "user", content: "hi" }] } }) },
  "GET /spend/logs": targeted((s) => ({ method: "GET", path: `/spend/logs?team_id=${q(s.team())}` })),
  "GET /spend/logs/v2": targeted((s) => ({ method: "GET", path: `/spend/logs/v2?team_id=${q(s.team())}&start_date=2020-01-01&end_date=2099-12-31` })),
  "GET /spend/keys": untargeted("GET", "/spend/keys"),
  "GET /spend/users": untargeted("GET", "/spend/users"),
  "GET /team/daily/activity": targeted((s) => ({ method: "GET", path: `/team/daily/activity?team_id=${q(s.team())}` })),
  "GET /organization/daily/activity": targeted((s) => ({ method: "GET", path: `/organization/daily/activity?organization_ids=${q(s.org())}` })),
  // Resets every key: each cell's own key gets its spend back on its first read.
  "POST /global/spend/reset": {
    targeted: false,
    plan: (s) => {
      const k = s.key();
      return { method: "POST", path: "/global/spend/reset", body: {}, state: s.rows.keyWithSpend(k.token, 5) };
    },
  },
};

/**
 * Reaching past the matrix through the fields of a call the caller may make: another team, user
 * or organization named inside an allowed request, a caller raising its own rights, or a list that
 * must stop at the caller's reach. Each gets the status given; refusals change nothing. `own`
 * aims at the caller's team (T1), `other` at T2.
 */
interface Escalation {
  col: Col;
  expected: number;
  plan(w: World, own: Scope, other: Scope): Plan;
}

const updateKey = (w: World, k: FixtureKey, fields: Json): Plan => ({ method: "POST", path: "/key/update", body: { key: k.plain, ...fields }, state: () => w.rows.key(k.token) });
const generateKey = (w: World, fields: Json): Plan => {
  const alias = w.f.id("other", "mx-escalated-key");
  return { method: "POST", path: "/key/generate", body: { key_alias: alias, ...fields }, state: () => w.rows.keysWithAlias(alias) };
};

const ESCALATIONS: Record<string, Escalation> = {
  "team admin moves its team's key into another team": { col: "teamAdminOwn", expected: 403, plan: (w, own, other) => updateKey(w, own.key(), { team_id: other.team() }) },
  "team admin gives its team's key to another team's admin": { col: "teamAdminOwn", expected: 403, plan: (w, own) => updateKey(w, own.key(), { user_id: w.seeds.users.u5.id }) },
  "team admin attaches its team's key to another team's organization": { col: "teamAdminOwn", expected: 403, plan: (w, own) => updateKey(w, own.key(), { organization_id: w.seeds.o1 }) },
  "team admin regenerates its team's key into another team": {
    col: "teamAdminOwn",
    expected: 403,
    plan: (w, own, other) => {
      const k = own.key();
      return { method: "POST", path: "/key/regenerate", body: { key: k.plain, team_id: other.team() }, state: () => w.rows.key(k.token) };
    },
  },
  "team admin generates a key of its team for another team's admin": {
    col: "teamAdminOwn",
    expected: 403,
    plan: (w) => generateKey(w, { team_id: w.seeds.t1, user_id: w.seeds.users.u5.id }),
  },
  "team admin generates a key of its team inside another team's organization": {
    col: "teamAdminOwn",
    expected: 403,
    plan: (w) => generateKey(w, { team_id: w.seeds.t1, organization_id: w.seeds.o1 }),
  },
  "team admin deletes another team's key by alias": {
    col: "teamAdminOwn",
    expected: 403,
    plan: (w, _own, other) => {
      const k = other.key();
      return { method: "POST", path: "/key/delete", body: { key_aliases: [k.alias] }, state: () => w.rows.key(k.token) };
    },
  },
  "team admin deletes a key alias that does not exist": {
    col: "teamAdminOwn",
    expected: 403,
    plan: () => ({ method: "POST", path: "/key/delete", body: { key_aliases: [uniq("mx-ghost-alias")] } }),
  },
  "team admin lists its teams' keys, and only those": {
    col: "teamAdminOwn",
    expected: 200,
    plan: (w) => ({ method: "GET", path: "/key/list?include_team_keys=true&return_full_object=true&size=100", allowed: (b) => keysOfTeamOnly(b, w.seeds.t1) }),
  },
  "member lists its own keys, and only those": {
    col: "member",
    expected: 200,
    plan: (w) => ({ method: "GET", path: "/key/list?include_team_keys=true&return_full_object=true&size=100", allowed: (b) => ownKeysOnly(b, w.seeds.users.u2.id) }),
  },
  "team admin lists the keys of another team's admin": { col: "teamAdminOwn", expected: 403, plan: (w) => ({ method: "GET", path: `/key/list?user_id=${q(w.seeds.users.u5.id)}` }) },
  "member unblocks its own blocked key through /key/update": {
    col: "member",
    expected: 403,
    plan: (w) => updateKey(w, w.f.key("T1", w.seeds.t1, w.seeds.users.u2.id, { blocked: true }), { blocked: false }),
  },
  "member unblocks its own blocked key through /key/unblock": {
    col: "member",
    expected: 403,
    plan: (w) => {
      const k = w.f.key("T1", w.seeds.t1, w.seeds.users.u2.id, { blocked: true });
      return { method: "POST", path: "/key/unblock", body: { key: k.plain }, state: () => w.rows.key(k.token) };
    },
  },
  "member resets its own key's spend": {
    col: "member",
    expected: 403,
    plan: (w) => {
      const k = w.f.key("T1", w.seeds.t1, w.seeds.users.u2.id, { spend: 5 });
      // The spend is set again on the first read: /global/spend/reset has zeroed every key by now.
      return { ...updateKey(w, k, { spend: 0 }), state: w.rows.keyWithSpend(k.token, 5) };
    },
  },
  // A team key is the team's to change, even for the member it belongs to (default permissions).
  "member widens its own key beyond the team's models": {
    col: "member",
    expected: 403,
    plan: (w) => updateKey(w, w.f.key("T1", w.seeds.t1, w.seeds.users.u2.id), { models: ["chat-z"] }),
  },
  "member generates a key in its team": { col: "member", expected: 403, plan: (w) => generateKey(w, { team_id: w.seeds.t1 }) },
  "plain user gives its own key to another user": { col: "plain", expected: 403, plan: (w) => updateKey(w, w.f.key("seed", null, w.seeds.users.u3.id), { user_id: w.seeds.users.u4.id }) },
  "plain user moves its own key into a team": { col: "plain", expected: 403, plan: (w) => updateKey(w, w.f.key("seed", null, w.seeds.users.u3.id), { team_id: w.seeds.t1 }) },
  "plain user generates a key for another user": { col: "plain", expected: 403, plan: (w) => generateKey(w, { user_id: w.seeds.users.u4.id }) },
  "plain user makes itself a proxy admin": {
    col: "plain",
    expected: 403,
    plan: (w) => ({ method: "POST", path: "/user/update", body: { user_id: w.seeds.users.u3.id, user_role: "proxy_admin" }, state: () => w.rows.user(w.seeds.users.u3.id) }),
  },
  "viewer updates its own key": { col: "viewer", expected: 403, plan: (w) => updateKey(w, w.f.key("seed", null, w.seeds.users.viewer.id), { max_budget: 1 }) },
  "viewer generates a key for itself": { col: "viewer", expected: 403, plan: (w) => generateKey(w, {}) },
  "viewer renames itself": {
    col: "viewer",
    expected: 403,
    plan: (w) => ({ method: "POST", path: "/user/update", body: { user_id: w.seeds.users.viewer.id, user_alias: "renamed" }, state: () => w.rows.user(w.seeds.users.viewer.id) }),
  },
};

interface Cell {
  col: Col;
  expected: number;
  plan: Plan;
  /** What the cell tries, for escalations. */
  label?: string;
}

async function send(url: string, key: string | undefined, method: Method, path: string, body?: unknown): Promise<Reply> {
  const headers: Record<string, string> = {};
  if (key !== undefined) headers.authorization = `Bearer ${key}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const res = await fetch(`${url}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // not JSON: kept as text, which the envelope check reports
  }
  return { status: res.status, text, body: parsed };
}

/** Creates the named objects through the management API with the master key, as an operator would. */
async function seed(url: string, f: Fixtures): Promise<Seeds> {
  const must = async (method: Method, path: string, body: unknown): Promise<Json> => {
    const r = await send(url, MASTER_KEY, method, path, body);
    if (r.status !== 200 || !isObject(r.body)) throw new Error(`seeding ${method} ${path} → ${r.status}: ${r.text}`);
    return r.body;
  };
  const o1 = f.id("T2", "mx-org-o1");
  await must("POST", "/organization/new", { organization_id: o1, organization_alias: f.id("T2", "mx-org-o1-alias"), models: ["chat-a", "chat-b", "chat-c"] });
  const t1 = f.id("T1", "mx-t1");
  const t2 = f.id("T2", "mx-t2");
  await must("POST", "/team/new", { team_id: t1, team_alias: f.id("T1", "mx-t1-alias"), models: ["chat-a", "chat-c"] });
  await must("POST", "/team/new", { team_id: t2, team_alias: f.id("T2", "mx-t2-alias"), organization_id: o1, models: ["chat-a", "chat-c"] });

  const userScope: Record<UserName, MarkerScope> = { admin: "seed", viewer: "seed", u1: "T1", u2: "T1", u3: "seed", u4: "T1", u5: "T2" };
  const roles: Partial<Record<UserName, string>> = { admin: "proxy_admin", viewer: "proxy_admin_viewer" };
  const seededUsers = {} as Record<UserName, SeedUser>;
  for (const [name, scope] of Object.entries(userScope) as [UserName, MarkerScope][]) {
    const id = f.id(scope, `mx-${name}`);
    const email = `${f.id(scope, `mx-${name}-mail`)}@example.test`;
    f.mark(scope, email);
    await must("POST", "/user/new", { user_id: id, user_email: email, user_role: roles[name] ?? "internal_user", auto_create_key: false });
    seededUsers[name] = { id, email };
  }
  const u = seededUsers;
  await must("POST", "/team/member_add", {
    team_id: t1,
    member: [
      { role: "admin", user_id: u.u1.id },
      { role: "user", user_id: u.u2.id },
      { role: "user", user_id: u.u4.id },
    ],
  });
  await must("POST", "/team/member_add", { team_id: t2, member: { role: "admin", user_id: u.u5.id } });

  const keyOwners: Record<KeyName, [UserName, string | undefined, MarkerScope]> = {
    admin: ["admin", undefined, "seed"],
    viewer: ["viewer", undefined, "seed"],
    teamAdmin: ["u1", t1, "T1"],
    member: ["u2", t1, "T1"],
    plain: ["u3", undefined, "seed"],
    blocked: ["admin", undefined, "seed"],
    deleted: ["admin", undefined, "seed"],
    expired: ["admin", undefined, "seed"],
  };
  const seededKeys = {} as Record<KeyName, SeedKey>;
  let expiresAt = 0;
  for (const [name, [owner, team, scope]] of Object.entries(keyOwners) as [KeyName, [UserName, string | undefined, MarkerScope]][]) {
    const alias = f.id(scope, `mx-key-${name}`);
    const r = await must("POST", "/key/generate", { user_id: u[owner].id, team_id: team, key_alias: alias, ...(name === "expired" ? { duration: "1s" } : {}) });
    const plain = String(r.key);
    f.mark("secret", plain);
    f.mark(scope, sha256(plain));
    seededKeys[name] = { plain, token: sha256(plain), alias };
    if (name === "expired") expiresAt = Date.parse(String(r.expires));
    if (name === "expired" && !Number.isFinite(expiresAt)) throw new Error(`the 1s key came back without an expiry: ${JSON.stringify(r)}`);
  }
  await must("POST", "/key/block", { key: seededKeys.blocked.plain });
  await must("POST", "/key/delete", { keys: [seededKeys.deleted.plain] });
  return { t1, t2, o1, users: seededUsers, keys: seededKeys, expiresAt };
}

/** Where two JSON values differ, as `path: before → after` lines. */
function differences(a: unknown, b: unknown, path = ""): string[] {
  if (Bun.deepEquals(a, b)) return [];
  if (typeof a === "object" && a !== null && typeof b === "object" && b !== null && Array.isArray(a) === Array.isArray(b)) {
    const ka = Object.keys(a);
    const kb = Object.keys(b);
    if (!Array.isArray(a) || ka.length === kb.length) {
      const ra = a as Record<string, unknown>;
      const rb = b as Record<string, unknown>;
      return [...new Set([...ka, ...kb])].flatMap((k) => differences(ra[k], rb[k], `${path}.${k}`));
    }
  }
  return [`${path || "."}: ${JSON.stringify(a)} → ${JSON.stringify(b)}`];
}

/** A refused caller must be told why: these keys fail for exactly this reason, not another. */
const REFUSAL_REASON: Partial<Record<Col, RegExp>> = { blocked: /blocked/i, expired: /expired/i };

/** Problems with a refusal's body: the error envelope and nothing else. */
function envelopeProblems(status: number, body: unknown): string[] {
  if (!isObject(body) || Object.keys(body).join(",") !== "error" || !isObject(body.error)) return [`a refusal must be just {error: …}, got ${JSON.stringify(body)}`];
  const e = body.error;
  const out: string[] = [];
  const extra = Object.keys(e).filter((k) => !["message", "type", "param", "code"].includes(k));
  if (extra.length > 0) out.push(`error envelope has extra fields ${extra.join(", ")}`);
  if (typeof e.message !== "string" || typeof e.type !== "string") out.push("error envelope lacks message/type");
  if (e.code !== String(status)) out.push(`error code ${String(e.code)} is not the status ${status}`);
  return out;
}

class Matrix {
  readonly cells = new Map<string, Cell[]>();
  escalations: Cell[] = [];
  private readonly keys: Record<Col, string | undefined>;
  /** Markers each caller may meet in any answer: its own user and key. */
  private readonly own: Record<Col, Set<string>>;
  private readonly db: Db;

  private constructor(
    private readonly gw: TestGateway,
    private readonly w: World,
  ) {
    this.db = gw.host!.store.db;
    const k = w.seeds.keys;
    const u = w.seeds.users;
    // A key knows its own team: naming it is no leak.
    const teamAdmin = new Set([u.u1.id, u.u1.email, k.teamAdmin.token, k.teamAdmin.alias, w.seeds.t1]);
    this.keys = {
      master: MASTER_KEY,
      proxyAdmin: k.admin.plain,
      viewer: k.viewer.plain,
      teamAdminOwn: k.teamAdmin.plain,
      teamAdminOther: k.teamAdmin.plain,
      teamAdminGhost: k.teamAdmin.plain,
      member: k.member.plain,
      plain: k.plain.plain,
      blocked: k.blocked.plain,
      deleted: k.deleted.plain,
      expired: k.expired.plain,
      unknown: `sk-${randomBytes(24).toString("base64url")}`,
      hashed: k.admin.token,
      none: undefined,
    };
    const none = new Set<string>();
    this.own = {
      master: none,
      proxyAdmin: new Set([u.admin.id, u.admin.email, k.admin.token, k.admin.alias]),
      viewer: new Set([u.viewer.id, u.viewer.email, k.viewer.token, k.viewer.alias]),
      teamAdminOwn: teamAdmin,
      teamAdminOther: teamAdmin,
      teamAdminGhost: teamAdmin,
      member: new Set([u.u2.id, u.u2.email, k.member.token, k.member.alias, w.seeds.t1]),
      plain: new Set([u.u3.id, u.u3.email, k.plain.token, k.plain.alias]),
      blocked: none,
      deleted: none,
      expired: none,
      unknown: none,
      hashed: none,
      none,
    };
  }

  static async start(gw: TestGateway): Promise<Matrix> {
    const f = new Fixtures();
    f.mark("secret", UPSTREAM_SECRET, UPSTREAM_BASE, MASTER_KEY);
    const seeds = await seed(gw.url, f);
    const w: World = { f, seeds, rows: stateReader(gw.host!.store.db), bystanderModel: f.model() };
    const m = new Matrix(gw, w);
    for (const [name, ep] of Object.entries(ENDPOINTS)) {
      const cols: Col[] = [...ROLES, ...REFUSED, ...(ep.targeted ? (["teamAdminGhost"] as const) : [])];
      m.cells.set(
        name,
        cols.map((col) => ({ col, expected: expectedStatus(name, col), plan: ep.plan(new Scope(col, w)) })),
      );
    }
    m.escalations = Object.entries(ESCALATIONS).map(([label, e]) => ({
      label,
      col: e.col,
      expected: e.expected,
      plan: e.plan(w, new Scope("teamAdminOwn", w), new Scope("teamAdminOther", w)),
    }));
    await f.flush(gw.host!.store.db, (...c) => gw.host!.services.bus!.publish(...c), async (model) => {
      const r = await send(gw.url, MASTER_KEY, "POST", "/model/new", {
        model_name: model.name,
        svc_params: { model: "mock/chat-a", api_key: UPSTREAM_SECRET },
        model_info: { id: model.id },
      });
      if (r.status !== 200) throw new Error(`creating model ${model.id} → ${r.status}: ${r.text}`);
    });
    // The expired key was issued with duration 1s; make sure that second is over.
    const wait = seeds.expiresAt + 50 - Date.now();
    if (wait > 0) await Bun.sleep(wait);
    return m;
  }

  private async auditRows(): Promise<number> {
    const [row] = await this.db.select({ n: count() }).from(auditLog);
    return Number(row?.n ?? 0);
  }

  /** Markers (not sent by the caller) that an answer to `col` may not contain. */
  private leaks(text: string, sent: string, col: Col, allowed: boolean): string[] {
    const own = this.own[col];
    const visible: ReadonlySet<MarkerScope> = !allowed
      ? new Set()
      : col === "master" || col === "proxyAdmin" || col === "viewer"
        ? new Set(["T1", "T2", "fresh", "other", "seed"])
        : col === "plain"
          ? new Set()
          : new Set(["T1"]);
    const out: string[] = [];
    for (const [marker, scope] of this.w.f.markers) {
      if (!text.includes(marker)) continue;
      if (scope === "secret" || (!sent.includes(marker) && !own.has(marker) && !visible.has(scope))) out.push(`${marker} (${scope})`);
    }
    return out;
  }

  private async runCell(c: Cell, problems: string[]): Promise<void> {
    const { plan } = c;
    const before = plan.state ? await plan.state() : undefined;
    const reply = await send(this.gw.url, this.keys[c.col], plan.method, plan.path, plan.body);
    const after = plan.state ? await plan.state() : undefined;
    const report = (msg: string) => problems.push(`[${c.col}]${c.label ? ` ${c.label}:` : ""} ${plan.method} ${plan.path}: ${msg}`);
    const refused = c.expected >= 400;
    if (reply.status !== c.expected) report(`status ${reply.status}, expected ${c.expected}: ${reply.text.slice(0, 400)}`);
    const leaks = this.leaks(reply.text, `${plan.path} ${JSON.stringify(plan.body ?? null)}`, c.col, !refused);
    if (leaks.length > 0) report(`answer holds data it must not: ${leaks.join(", ")}`);
    if (refused) {
      for (const p of envelopeProblems(reply.status, reply.body)) report(p);
      const reason = REFUSAL_REASON[c.col];
      if (reason && !reason.test(reply.text)) report(`the refusal does not say why (${reason}): ${reply.text}`);
      const changed = differences(before, after);
      if (changed.length > 0) report(`a refused write changed the store: ${changed.join("; ")}`);
    } else if (reply.status === c.expected) {
      if (plan.state && Bun.deepEquals(before, after)) report("an allowed write changed nothing");
      for (const p of plan.allowed?.(reply.body) ?? []) report(p);
    }
  }

  run(endpoint: string): Promise<string[]> {
    return this.runCells(this.cells.get(endpoint) ?? []);
  }

  runEscalations(): Promise<string[]> {
    return this.runCells(this.escalations);
  }

  /**
   * Refusals run first, all at once: they must change nothing, so the audit trail must not grow
   * meanwhile. The allowed calls follow one by one (some change shared rows such as T1's models).
   */
  private async runCells(cells: Cell[]): Promise<string[]> {
    const problems: string[] = [];
    const auditBefore = await this.auditRows();
    await Promise.all(cells.filter((c) => c.expected >= 400).map((c) => this.runCell(c, problems)));
    const audited = (await this.auditRows()) - auditBefore;
    if (audited !== 0) problems.push(`refused calls wrote ${audited} audit row(s)`);
    for (const c of cells.filter((c) => c.expected < 400)) await this.runCell(c, problems);
    return problems;
  }
}

test("the matrix names every management endpoint, and only those", () => {
  const routes = adminRoutes({} as AdminDeps).routes.map((r) => `${r.method} ${r.path.replace(/:(\w+)/g, "{$1}")}`);
  expect(Object.keys(MATRIX).sort()).toEqual([...routes, ...OTHER_ROUTES].sort());
  expect(Object.keys(ENDPOINTS).sort()).toEqual(Object.keys(MATRIX).sort());
});

for (const backend of BACKENDS) {
  describe(`authorization matrix (${backend})`, () => {
    let gw: TestGateway;
    let matrix: Matrix;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG);
      matrix = await Matrix.start(gw);
    }, 60_000);
    afterAll(() => gw?.stop());

    for (const endpoint of Object.keys(MATRIX)) {
      test(endpoint, async () => {
        expect(await matrix.run(endpoint)).toEqual([]);
      });
    }

    test("no caller reaches past its row through the fields of a call it may make, or sees past it in a list", async () => {
      expect(await matrix.runEscalations()).toEqual([]);
    });
  });
}
