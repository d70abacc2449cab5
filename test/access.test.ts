// Model and route access on the gateway path, seen through the openai SDK with virtual keys: every
// level (key, team, org, user), wildcards, access groups, special names, aliases and their
// precedence, allowed_routes, blocked/expired/deleted keys; `/v1/models`, `/v1/models/{id}` and
// `/model/info` cut to what the caller may use; and no database round trip per request.
// Identity rows are written straight to the store and announced on the change bus, as the
// management API does.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { eq } from "drizzle-orm";
import OpenAI, { APIError, AuthenticationError, PermissionDeniedError } from "openai";
import type { IdentityChange } from "../core/identity/records.ts";
import type { Db } from "../core/store/db.ts";
import { accessGroups, organizations, orgMembers, teamMembers, teams, users, virtualKeys } from "../core/store/schema.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "./harness/gateway.ts";
import { sha256 } from "./harness/util.ts";

const UPSTREAM_SECRET = "sk-upstream-very-secret-42";
const UPSTREAM_BASE = "https://secret-upstream.example.com/v1";

const CONFIG = {
  model_list: [
    { model_name: "gpt-a", svc_params: { model: "mock/gpt-a" }, model_info: { id: "dep-a" } },
    { model_name: "gpt-b", svc_params: { model: "mock/gpt-b" }, model_info: { id: "dep-b" } },
    { model_name: "gpt-c", svc_params: { model: "mock/gpt-c" }, model_info: { id: "dep-c", access_groups: ["cfg-group"] } },
    { model_name: "gpt-d", svc_params: { model: "mock/gpt-d" }, model_info: { id: "dep-d", access_groups: ["cfg-group"] } },
    { model_name: "mock/*", svc_params: { model: "mock/*" }, model_info: { id: "dep-wild" } },
    {
      model_name: "guarded",
      svc_params: {
        model: "mock/guarded",
        api_key: UPSTREAM_SECRET,
        api_base: UPSTREAM_BASE,
        headers: { "x-upstream-auth": UPSTREAM_SECRET },
        aws_secret_access_key: UPSTREAM_SECRET,
        vertex_credentials: UPSTREAM_SECRET,
        custom_token: UPSTREAM_SECRET,
        input_cost_per_token: 0.000001,
        rpm: 100,
      },
      model_info: { id: "dep-guarded" },
    },
  ],
  router_settings: {
    fallbacks: [{ "gpt-a": ["gpt-b"] }],
    context_window_fallbacks: [{ "gpt-a": ["gpt-c", "gpt-d"] }],
    model_group_alias: { "quick-hidden": { model: "gpt-d", hidden: true } },
  },
  // No spend-report prebuild: its queries (2 s after start) are not the request path the last test watches.
  general_settings: { master_key: MASTER_KEY, spend_report_prebuild_days: 0 },
};

const uid = (p: string) => `${p}-${randomUUID().slice(0, 8)}`;

type KeyInsert = Partial<typeof virtualKeys.$inferInsert>;

/** Writes identity rows the way the management API does: store first, then the change bus. */
function fixtures(gw: TestGateway) {
  const db: Db = gw.host!.store.db;
  const publish = (...c: IdentityChange[]) => gw.host!.services.bus!.publish(...c);
  return {
    db,
    publish,
    async key(fields: KeyInsert = {}): Promise<string> {
      const plain = `sk-${randomUUID().replaceAll("-", "")}`;
      const token = sha256(plain);
      await db.insert(virtualKeys).values({ token, keyName: `sk-...${plain.slice(-4)}`, ...fields });
      await publish({ kind: "key", token });
      return plain;
    },
    async team(fields: Partial<typeof teams.$inferInsert> = {}): Promise<string> {
      const teamId = fields.teamId ?? uid("team");
      await db.insert(teams).values({ ...fields, teamId });
      await publish({ kind: "team", teamId });
      return teamId;
    },
    async org(fields: Partial<typeof organizations.$inferInsert> = {}): Promise<string> {
      const orgId = fields.organizationId ?? uid("org");
      await db.insert(organizations).values({ ...fields, organizationId: orgId });
      await publish({ kind: "org", orgId });
      return orgId;
    },
    async user(fields: Partial<typeof users.$inferInsert> = {}): Promise<string> {
      const userId = fields.userId ?? uid("user");
      await db.insert(users).values({ ...fields, userId });
      await publish({ kind: "user", userId });
      return userId;
    },
    async member(teamId: string, userId: string, role: "admin" | "user"): Promise<void> {
      await db.insert(teamMembers).values({ teamId, userId, role });
      await publish({ kind: "team_members", teamId });
    },
    async orgMember(orgId: string, userId: string, role: string): Promise<void> {
      await db.insert(orgMembers).values({ organizationId: orgId, userId, userRole: role });
      await publish({ kind: "org_members", orgId });
    },
    async group(name: string, modelNames: string[]): Promise<string> {
      const id = uid("ag");
      await db.insert(accessGroups).values({ accessGroupId: id, accessGroupName: name, modelNames });
      await publish({ kind: "access_group", accessGroupId: id });
      return id;
    },
  };
}

function sdk(gw: TestGateway, apiKey: string): OpenAI {
  return new OpenAI({ baseURL: gw.baseURL, apiKey, maxRetries: 0 });
}

/** Calls `model` and returns the model group that served it (the gateway's response header). */
async function call(gw: TestGateway, apiKey: string, model: string): Promise<string> {
  const { response } = await sdk(gw, apiKey)
    .chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 2 })
    .withResponse();
  return response.headers.get("x-svc-model-group") ?? "";
}

/** The SDK error a call raises (it must raise). */
async function refusal(gw: TestGateway, apiKey: string, model: string): Promise<APIError> {
  try {
    await call(gw, apiKey, model);
  } catch (err) {
    if (err instanceof APIError) return err;
    throw err;
  }
  throw new Error(`call to ${model} was not refused`);
}

function errorBody(err: APIError): { message: string; type: string } {
  return err.error as { message: string; type: string };
}

/** `tried`: what the refusal names as refused (a model reached through an alias: the model, then the alias). */
async function expectDenied(gw: TestGateway, apiKey: string, model: string, type: string, allowed: string[], tried = model): Promise<void> {
  const err = await refusal(gw, apiKey, model);
  expect(err).toBeInstanceOf(AuthenticationError);
  expect(err.status).toBe(401);
  expect(errorBody(err).type).toBe(type);
  expect(errorBody(err).message).toEndWith(`Tried to access ${tried}`);
  for (const m of allowed) expect(errorBody(err).message).toContain(m);
}

async function listIds(gw: TestGateway, apiKey: string, query = ""): Promise<string[]> {
  const res = await fetch(`${gw.baseURL}/models${query}`, { headers: { authorization: `Bearer ${apiKey}` } });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { object: string; data: { id: string; object: string }[] };
  expect(body.object).toBe("list");
  return body.data.map((m) => m.id).sort();
}

async function getStatus(gw: TestGateway, path: string, apiKey: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${gw.url}${path}`, { headers: { authorization: `Bearer ${apiKey}` } });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

/** Every query the store runs (through drizzle), with its SQL, while `fn` runs. */
async function countQueries(db: Db, fn: () => Promise<void>): Promise<string[]> {
  const proto = Object.getPrototypeOf((db as unknown as { session: object }).session) as { prepareQuery: (...a: unknown[]) => unknown };
  const original = proto.prepareQuery;
  const seen: string[] = [];
  proto.prepareQuery = function (this: unknown, ...args: unknown[]) {
    seen.push((args[0] as { sql: string }).sql);
    return original.apply(this, args);
  };
  try {
    await fn();
  } finally {
    proto.prepareQuery = original;
  }
  return seen;
}

for (const backend of BACKENDS) {
  describe(`model access (${backend})`, () => {
    let gw: TestGateway;
    let f: ReturnType<typeof fixtures>;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_access" });
      f = fixtures(gw);
    });

    afterAll(async () => {
      await gw?.stop();
    });

    test("key models: listed models work, others are a 401 naming the key level and its models", async () => {
      const k = await f.key({ models: ["gpt-a"] });
      expect(await call(gw, k, "gpt-a")).toBe("gpt-a");
      await expectDenied(gw, k, "gpt-b", "key_model_access_denied", ["key not allowed to access model", "gpt-a"]);
    });

    test("a key without models inherits its team's; a team without models may use everything", async () => {
      const narrow = await f.team({ models: ["gpt-b"] });
      const k = await f.key({ teamId: narrow });
      expect(await call(gw, k, "gpt-b")).toBe("gpt-b");
      await expectDenied(gw, k, "gpt-a", "team_model_access_denied", ["team not allowed to access model", "gpt-b"]);

      const open = await f.team({ models: [] });
      const k2 = await f.key({ teamId: open });
      expect(await call(gw, k2, "gpt-a")).toBe("gpt-a");
      expect(await call(gw, k2, "gpt-d")).toBe("gpt-d");
    });

    test("the team still binds a key that lists more models than its team", async () => {
      const t = await f.team({ models: ["gpt-a"] });
      const k = await f.key({ teamId: t, models: ["gpt-a", "gpt-b"] });
      expect(await call(gw, k, "gpt-a")).toBe("gpt-a");
      await expectDenied(gw, k, "gpt-b", "team_model_access_denied", ["gpt-a"]);
    });

    test("org models bind the keys of its teams and keys of the org itself", async () => {
      const o = await f.org({ models: ["gpt-a", "gpt-c"] });
      const t = await f.team({ organizationId: o });
      const viaTeam = await f.key({ teamId: t });
      expect(await call(gw, viaTeam, "gpt-c")).toBe("gpt-c");
      await expectDenied(gw, viaTeam, "gpt-b", "org_model_access_denied", ["org not allowed to access model", "gpt-a", "gpt-c"]);
      const direct = await f.key({ organizationId: o });
      await expectDenied(gw, direct, "gpt-d", "org_model_access_denied", ["gpt-a"]);
    });

    test("a personal key is bound by its user's models; a team key of the same user by the team's", async () => {
      const u = await f.user({ models: ["gpt-c"] });
      const personal = await f.key({ userId: u });
      expect(await call(gw, personal, "gpt-c")).toBe("gpt-c");
      await expectDenied(gw, personal, "gpt-a", "user_model_access_denied", ["user not allowed to access model", "gpt-c"]);
      const t = await f.team({});
      const teamKey = await f.key({ userId: u, teamId: t });
      expect(await call(gw, teamKey, "gpt-a")).toBe("gpt-a");
    });

    test("wildcards: `mock/*` on a key or team reaches the wildcard deployment; a specific name only itself", async () => {
      const k = await f.key({ models: ["mock/*"] });
      expect(await call(gw, k, "mock/anything-new")).toBe("mock/anything-new");
      await expectDenied(gw, k, "gpt-a", "key_model_access_denied", ["mock/*"]);

      const t = await f.team({ models: ["mock/*"] });
      const tk = await f.key({ teamId: t });
      expect(await call(gw, tk, "mock/other")).toBe("mock/other");
      await expectDenied(gw, tk, "gpt-b", "team_model_access_denied", ["mock/*"]);

      const one = await f.key({ models: ["mock/special"] });
      expect(await call(gw, one, "mock/special")).toBe("mock/special");
      await expectDenied(gw, one, "mock/other", "key_model_access_denied", ["mock/special"]);
    });

    test("access groups: config group by name, stored group by name and by id, on keys and teams", async () => {
      const cfg = await f.key({ models: ["cfg-group"] });
      expect(await call(gw, cfg, "gpt-c")).toBe("gpt-c");
      expect(await call(gw, cfg, "gpt-d")).toBe("gpt-d");
      await expectDenied(gw, cfg, "gpt-a", "key_model_access_denied", ["cfg-group"]);

      const name = uid("stored-group");
      const id = await f.group(name, ["gpt-b"]);
      const byName = await f.key({ models: [name] });
      expect(await call(gw, byName, "gpt-b")).toBe("gpt-b");
      const byId = await f.key({ accessGroupIds: [id] });
      expect(await call(gw, byId, "gpt-b")).toBe("gpt-b");
      // The message names the models the group grants, not an opaque id.
      await expectDenied(gw, byId, "gpt-a", "key_model_access_denied", ['"gpt-b"']);

      const t = await f.team({ accessGroupIds: [id] });
      const tk = await f.key({ teamId: t });
      expect(await call(gw, tk, "gpt-b")).toBe("gpt-b");
      await expectDenied(gw, tk, "gpt-c", "team_model_access_denied", ["gpt-b"]);

      // Changing the group's models takes effect at once.
      await f.db.update(accessGroups).set({ modelNames: ["gpt-c"] }).where(eqId(id));
      await f.publish({ kind: "access_group", accessGroupId: id });
      expect(await call(gw, tk, "gpt-c")).toBe("gpt-c");
      await expectDenied(gw, tk, "gpt-b", "team_model_access_denied", ["gpt-c"]);
    });

    test("special names: `*` and `all-proxy-models` open the key level only; `all-team-models` inherits the team", async () => {
      const t = await f.team({ models: ["gpt-a"] });
      const star = await f.key({ teamId: t, models: ["*"] });
      expect(await call(gw, star, "gpt-a")).toBe("gpt-a");
      await expectDenied(gw, star, "gpt-b", "team_model_access_denied", ["gpt-a"]);

      const all = await f.key({ models: ["all-proxy-models"] });
      expect(await call(gw, all, "gpt-d")).toBe("gpt-d");
      expect(await call(gw, all, "mock/whatever")).toBe("mock/whatever");

      const t2 = await f.team({ models: ["gpt-b", "gpt-c"] });
      const inherit = await f.key({ teamId: t2, models: ["all-team-models"] });
      expect(await call(gw, inherit, "gpt-c")).toBe("gpt-c");
      await expectDenied(gw, inherit, "gpt-a", "team_model_access_denied", ["gpt-b", "gpt-c"]);
    });

    test("aliases on key, team and org: key over team over org", async () => {
      const o = await f.org({ modelAliases: { fast: "gpt-d", "org-only": "gpt-d", "team-wins": "gpt-d" } });
      const t = await f.team({ organizationId: o, modelAliases: { fast: "gpt-c", "team-only": "gpt-c", "team-wins": "gpt-c" } });
      const k = await f.key({ teamId: t, aliases: { fast: "gpt-a" } });
      expect(await call(gw, k, "fast")).toBe("gpt-a");
      expect(await call(gw, k, "team-wins")).toBe("gpt-c");
      expect(await call(gw, k, "team-only")).toBe("gpt-c");
      expect(await call(gw, k, "org-only")).toBe("gpt-d");
      // The real names work too, since nothing restricts them.
      expect(await call(gw, k, "gpt-b")).toBe("gpt-b");
    });

    test("an alias listed in the key's models works; it cannot reach a model the team or org forbids", async () => {
      const k = await f.key({ models: ["quick"], aliases: { quick: "gpt-b" } });
      expect(await call(gw, k, "quick")).toBe("gpt-b");
      await expectDenied(gw, k, "gpt-b", "key_model_access_denied", ["quick"]);

      // A key alias named like a model the team allows must not smuggle in another model.
      const t = await f.team({ models: ["gpt-a"] });
      const sneaky = await f.key({ teamId: t, aliases: { "gpt-a": "gpt-b", other: "gpt-b" } });
      // The refusal names the model refused, not the alias the team lists.
      await expectDenied(gw, sneaky, "gpt-a", "team_model_access_denied", ["gpt-a"], "gpt-b (alias gpt-a)");
      await expectDenied(gw, sneaky, "other", "team_model_access_denied", ["gpt-a"], "gpt-b (alias other)");

      // Likewise a team alias against its org.
      const o = await f.org({ models: ["gpt-a"] });
      const t2 = await f.team({ organizationId: o, modelAliases: { "gpt-a": "gpt-b" } });
      const k2 = await f.key({ teamId: t2 });
      await expectDenied(gw, k2, "gpt-a", "org_model_access_denied", ["gpt-a"], "gpt-b (alias gpt-a)");
      // An alias the team sets within its org's models is fine.
      const t2b = await f.team({ organizationId: o, models: ["mine"], modelAliases: { mine: "gpt-a" } });
      expect(await call(gw, await f.key({ teamId: t2b }), "mine")).toBe("gpt-a");

      // An org alias is the org's own decision: a team may list it by name.
      const o2 = await f.org({ models: ["cheap"], modelAliases: { cheap: "gpt-c" } });
      const t3 = await f.team({ organizationId: o2, models: ["cheap"] });
      const k3 = await f.key({ teamId: t3 });
      expect(await call(gw, k3, "cheap")).toBe("gpt-c");
      await expectDenied(gw, k3, "gpt-c", "team_model_access_denied", ["cheap"]);
    });

    test("allowed_routes: exact and `/*` patterns; anything else is a 403", async () => {
      const exact = await f.key({ allowedRoutes: ["/chat/completions"] });
      expect(await call(gw, exact, "gpt-a")).toBe("gpt-a");
      const denied = await sdk(gw, exact)
        .models.list()
        .then(
          () => undefined,
          (e: unknown) => e,
        );
      expect(denied).toBeInstanceOf(PermissionDeniedError);
      expect((denied as APIError).status).toBe(403);
      expect(errorBody(denied as APIError).message).toContain("/v1/models");

      // A key without allowed_routes may read its own info; these keys may not.
      expect((await getStatus(gw, "/key/info", await f.key({}))).status).toBe(200);
      const v1 = await f.key({ allowedRoutes: ["/v1/*"] });
      expect(await call(gw, v1, "gpt-b")).toBe("gpt-b");
      expect((await sdk(gw, v1).models.list()).data.length).toBeGreaterThan(0);
      const outside = await getStatus(gw, "/key/info", v1);
      expect(outside.status).toBe(403);
      expect(JSON.stringify(outside.body)).toContain("/v1/*");

      const named = await f.key({ allowedRoutes: ["llm_api_routes"] });
      expect(await call(gw, named, "gpt-a")).toBe("gpt-a");
      expect((await getStatus(gw, "/key/info", named)).status).toBe(403);

      const mixed = await f.key({ allowedRoutes: ["/key/*", "/chat/completions"] });
      expect((await getStatus(gw, "/key/info", mixed)).status).toBe(200);
      expect(await call(gw, mixed, "gpt-a")).toBe("gpt-a");
      expect((await getStatus(gw, "/v1/models", mixed)).status).toBe(403);
    });

    test("key_type (without allowed_routes): llm_api calls models only, management the management API only, read_only its reads only", async () => {
      const llm = await f.key({ keyType: "llm_api" });
      expect(await call(gw, llm, "gpt-a")).toBe("gpt-a");
      expect((await getStatus(gw, "/key/info", llm)).status).toBe(403);

      const management = await f.key({ keyType: "management" });
      expect((await getStatus(gw, "/key/info", management)).status).toBe(200);
      expect((await refusal(gw, management, "gpt-a")).status).toBe(403);

      const readOnly = await f.key({ keyType: "read_only" });
      expect((await getStatus(gw, "/key/info", readOnly)).status).toBe(200);
      expect((await getStatus(gw, "/v1/models", readOnly)).status).toBe(200);
      expect((await refusal(gw, readOnly, "gpt-a")).status).toBe(403);
      const write = await fetch(`${gw.url}/key/generate`, { method: "POST", headers: { authorization: `Bearer ${readOnly}`, "content-type": "application/json" }, body: "{}" });
      expect(write.status).toBe(403);
      expect(JSON.stringify(await write.json())).toContain("info_routes");

      // The key's own allowed_routes win over its type.
      const both = await f.key({ keyType: "read_only", allowedRoutes: ["/chat/completions"] });
      expect(await call(gw, both, "gpt-a")).toBe("gpt-a");
      expect((await getStatus(gw, "/key/info", both)).status).toBe(403);
    });

    test("read_only and info_routes keys read the model listings (GET) but make no Gemini-style call under /v1/models or /models", async () => {
      const body = JSON.stringify({ contents: [{ role: "user", parts: [{ text: "hi" }] }] });
      for (const k of [await f.key({ keyType: "read_only" }), await f.key({ allowedRoutes: ["info_routes"] })]) {
        expect((await getStatus(gw, "/v1/models/gpt-a", k)).status).toBe(200);
        // A wildcard route's model id holds a slash.
        expect((await getStatus(gw, "/models/mock/anything", k)).status).toBe(200);
        for (const path of [
          "/v1/models/gpt-a:generateContent",
          "/models/gpt-a:generateContent",
          "/v1/models/gpt-a:streamGenerateContent?alt=sse",
          "/v1/models/gpt-a%3AgenerateContent",
          "/models/mock/anything:generateContent",
          "/v1/models/gpt-a:countTokens",
          "/v1beta/models/gpt-a:generateContent",
        ]) {
          const res = await fetch(`${gw.url}${path}`, { method: "POST", headers: { "x-goog-api-key": k, "content-type": "application/json" }, body });
          const answer = (await res.json()) as { error?: { status?: string } };
          expect({ path, status: res.status, error: answer.error?.status }).toEqual({ path, status: 403, error: "PERMISSION_DENIED" });
        }
      }
    });

    test("a trailing slash is the same route: a management key makes no model call through it, an llm_api key is not refused", async () => {
      const post = (path: string, key: string) =>
        fetch(`${gw.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${key}`, "content-type": "application/json" }, body: JSON.stringify({ model: "gpt-a", messages: [{ role: "user", content: "hi" }] }) });
      const management = await f.key({ keyType: "management" });
      expect((await post("/v1/chat/completions/", management)).status).toBe(403);
      const llm = await f.key({ keyType: "llm_api" });
      expect((await post("/v1/chat/completions/", llm)).status).toBe(200);
      const exact = await f.key({ allowedRoutes: ["/v1/chat/completions"] });
      expect((await post("/v1/chat/completions/", exact)).status).toBe(200);
      const readOnly = await f.key({ keyType: "read_only" });
      expect((await getStatus(gw, "/key/info/", readOnly)).status).not.toBe(403);
    });

    test("read_only and info_routes keys read an access group by /v1/access_group/{id} but neither update nor delete it", async () => {
      const group = await requestJson<{ access_group_id: string }>(gw, "POST", "/access_group/new", { body: { access_group: `ro-${backend}`, model_names: ["gpt-a"] } });
      expect(group.status).toBe(200);
      const id = group.body.access_group_id;
      // Keys of a proxy admin: only the route check stands between them and a write.
      const admin = `ro-admin-${backend}`;
      await f.db.insert(users).values({ userId: admin, userRole: "proxy_admin" });
      await f.publish({ kind: "user", userId: admin });
      for (const k of [await f.key({ keyType: "read_only", userId: admin }), await f.key({ allowedRoutes: ["info_routes"], userId: admin })]) {
        expect((await getStatus(gw, `/v1/access_group/${id}`, k)).status).toBe(200);
        for (const method of ["PUT", "DELETE"]) {
          const res = await fetch(`${gw.url}/v1/access_group/${id}`, { method, headers: { authorization: `Bearer ${k}`, "content-type": "application/json" }, body: method === "PUT" ? JSON.stringify({ model_names: ["gpt-a"], description: "written" }) : undefined });
          expect([method, res.status]).toEqual([method, 403]);
          expect(JSON.stringify(await res.json())).toContain("info_routes");
        }
      }
      expect((await requestJson(gw, "GET", `/v1/access_group/${id}`)).status).toBe(200);
    });

    test("blocked key, team or org, expired key and deleted key: 401; unblocking works at once", async () => {
      const blockedKey = await f.key({ blocked: true });
      const e1 = await refusal(gw, blockedKey, "gpt-a");
      expect(e1.status).toBe(401);
      expect(errorBody(e1).message).toContain("blocked");
      await f.db.update(virtualKeys).set({ blocked: false }).where(eqToken(sha256(blockedKey)));
      await f.publish({ kind: "key", token: sha256(blockedKey) });
      expect(await call(gw, blockedKey, "gpt-a")).toBe("gpt-a");

      const t = await f.team({ blocked: true });
      const teamKey = await f.key({ teamId: t });
      const e2 = await refusal(gw, teamKey, "gpt-a");
      expect(e2.status).toBe(401);
      expect(errorBody(e2).message).toContain(t);

      const o = await f.org({ blocked: true });
      const orgTeam = await f.team({ organizationId: o });
      for (const k of [await f.key({ organizationId: o }), await f.key({ teamId: orgTeam })]) {
        const e = await refusal(gw, k, "gpt-a");
        expect(e.status).toBe(401);
        expect(errorBody(e).message).toContain(o);
      }

      const expired = await f.key({ expires: new Date(Date.now() - 1000) });
      const e3 = await refusal(gw, expired, "gpt-a");
      expect(e3.status).toBe(401);
      expect(errorBody(e3).type).toBe("expired_key");

      const future = await f.key({ expires: new Date(Date.now() + 3_600_000) });
      expect(await call(gw, future, "gpt-a")).toBe("gpt-a");

      const deleted = await f.key({});
      expect(await call(gw, deleted, "gpt-a")).toBe("gpt-a");
      await f.db.update(virtualKeys).set({ deletedAt: new Date() }).where(eqToken(sha256(deleted)));
      await f.publish({ kind: "key", token: sha256(deleted) });
      const e4 = await refusal(gw, deleted, "gpt-a");
      expect(e4.status).toBe(401);
    });

    test("/v1/models lists exactly what the key may use, aliases included", async () => {
      const k = await f.key({ models: ["gpt-a", "cfg-group", "fast"], aliases: { fast: "gpt-b" } });
      expect(await listIds(gw, k)).toEqual(["fast", "gpt-a", "gpt-c", "gpt-d"]);
      // Each listed id can actually be called.
      for (const id of await listIds(gw, k)) expect(await call(gw, k, id)).toBeTruthy();

      const t = await f.team({ models: ["gpt-b", "gpt-c"] });
      expect(await listIds(gw, await f.key({ teamId: t }))).toEqual(["gpt-b", "gpt-c"]);
      expect(await listIds(gw, await f.key({ teamId: t, models: ["gpt-c", "gpt-d"] }))).toEqual(["gpt-c"]);
      expect(await listIds(gw, await f.key({ models: ["mock/special"] }))).toEqual(["mock/special"]);

      const master = await listIds(gw, MASTER_KEY);
      expect(master).toEqual(["gpt-a", "gpt-b", "gpt-c", "gpt-d", "guarded"]);
      expect(await listIds(gw, MASTER_KEY, "?return_wildcard_routes=true")).toContain("mock/*");
    });

    test("/v1/models options: wildcard routes, access groups, team_id, scope=expand", async () => {
      const wild = await f.key({ models: ["mock/*"] });
      expect(await listIds(gw, wild)).toEqual([]);
      expect(await listIds(gw, wild, "?return_wildcard_routes=true")).toEqual(["mock/*"]);
      // A key limited to named models never sees the wildcard route.
      expect(await listIds(gw, await f.key({ models: ["gpt-a"] }), "?return_wildcard_routes=true")).toEqual(["gpt-a"]);

      const grp = await f.key({ models: ["cfg-group"] });
      expect(await listIds(gw, grp, "?include_model_access_groups=true")).toEqual(["cfg-group", "gpt-c", "gpt-d"]);
      expect(await listIds(gw, grp, "?only_model_access_groups=true")).toEqual(["cfg-group"]);
      expect(await listIds(gw, await f.key({ models: ["gpt-c"] }), "?only_model_access_groups=true")).toEqual([]);
      const storedName = uid("listed-group");
      const storedId = await f.group(storedName, ["gpt-a", "gpt-b"]);
      expect(await listIds(gw, await f.key({ accessGroupIds: [storedId] }), "?include_model_access_groups=true")).toEqual(["gpt-a", "gpt-b", storedName]);
      // Held, but the team allows only part of it: the group is not offered as a whole.
      const partial = await f.key({ accessGroupIds: [storedId], teamId: await f.team({ models: ["gpt-a"] }) });
      expect(await listIds(gw, partial, "?include_model_access_groups=true")).toEqual(["gpt-a"]);
      const adminGroups = await listIds(gw, MASTER_KEY, "?only_model_access_groups=true");
      expect(adminGroups).toContain("cfg-group");
      expect(adminGroups).toContain(storedName);

      const t = await f.team({ models: ["gpt-b", "gpt-d"], modelAliases: { speedy: "gpt-b" } });
      const u = await f.user({});
      await f.member(t, u, "user");
      const memberKey = await f.key({ userId: u, models: ["gpt-a"] });
      expect(await listIds(gw, memberKey, `?team_id=${t}`)).toEqual(["gpt-b", "gpt-d", "speedy"]);
      expect(await listIds(gw, MASTER_KEY, `?team_id=${t}`)).toEqual(["gpt-b", "gpt-d", "speedy"]);
      const outsider = await f.key({ models: ["gpt-a"] });
      expect((await getStatus(gw, `/v1/models?team_id=${t}`, outsider)).status).toBe(403);
      // Outside the team a missing team is the same 403 (no existence leak); admins get a 404.
      expect((await getStatus(gw, "/v1/models?team_id=no-such-team", outsider)).status).toBe(403);
      expect((await getStatus(gw, "/v1/models?team_id=no-such-team", MASTER_KEY)).status).toBe(404);

      const all = ["gpt-a", "gpt-b", "gpt-c", "gpt-d", "guarded"];
      const admin = await f.user({});
      const other = await f.team({});
      await f.member(other, admin, "admin");
      const teamAdminKey = await f.key({ userId: admin, models: ["gpt-a"] });
      expect(await listIds(gw, teamAdminKey)).toEqual(["gpt-a"]);
      expect(await listIds(gw, teamAdminKey, "?scope=expand")).toEqual(all);
      const orgAdmin = await f.user({});
      await f.orgMember(await f.org({}), orgAdmin, "org_admin");
      expect(await listIds(gw, await f.key({ userId: orgAdmin, models: ["gpt-b"] }), "?scope=expand")).toEqual(all);
      const proxyAdmin = await f.user({ userRole: "proxy_admin" });
      expect(await listIds(gw, await f.key({ userId: proxyAdmin, models: ["gpt-b"] }), "?scope=expand")).toEqual(all);
      // Anyone else keeps their own list.
      expect(await listIds(gw, outsider, "?scope=expand")).toEqual(["gpt-a"]);
      const bad = await getStatus(gw, "/v1/models?scope=everything", outsider);
      expect(bad.status).toBe(400);
      expect(JSON.stringify(bad.body)).toContain("expand");
    });

    test("/v1/models include_metadata: fallbacks per fallback_type, those the key may use; an unknown type is a 400", async () => {
      const k = await f.key({ models: ["gpt-a", "gpt-b", "gpt-c"] });
      const get = async (q: string) => (await getStatus(gw, `/v1/models${q}`, k)).body as { data: { id: string; metadata?: { fallbacks: string[] } }[] };
      const general = await get("?include_metadata=true");
      expect(general.data.find((m) => m.id === "gpt-a")?.metadata).toEqual({ fallbacks: ["gpt-b"] });
      expect(general.data.find((m) => m.id === "gpt-b")?.metadata).toEqual({ fallbacks: [] });
      const ctx = await get("?include_metadata=true&fallback_type=context_window");
      // gpt-d, which the key may not use, routing would skip: not listed.
      expect(ctx.data.find((m) => m.id === "gpt-a")?.metadata).toEqual({ fallbacks: ["gpt-c"] });
      // No content-policy list: such a failure goes to the general fallbacks, and metadata says so.
      const policy = await get("?include_metadata=true&fallback_type=content_policy");
      expect(policy.data.find((m) => m.id === "gpt-a")?.metadata).toEqual({ fallbacks: ["gpt-b"] });
      expect((await get("")).data.every((m) => m.metadata === undefined)).toBe(true);
      expect((await getStatus(gw, "/v1/models?include_metadata=true&fallback_type=sideways", k)).status).toBe(400);
    });

    test("/v1/models/{id}: 404 for a model the key may not use", async () => {
      const k = await f.key({ models: ["gpt-a", "nick"], aliases: { nick: "gpt-c" } });
      const ok = await sdk(gw, k).models.retrieve("gpt-a");
      expect(ok.id).toBe("gpt-a");
      expect((await sdk(gw, k).models.retrieve("nick")).id).toBe("nick");
      for (const id of ["gpt-b", "gpt-c", "no-such-model"]) {
        const r = await getStatus(gw, `/v1/models/${id}`, k);
        expect(r.status).toBe(404);
      }
      expect((await getStatus(gw, "/v1/models/gpt-b", MASTER_KEY)).status).toBe(200);
    });

    test("/model/info never shows credentials or the upstream address; non-admins see only their models", async () => {
      const all = await getStatus(gw, "/model/info", MASTER_KEY);
      expect(all.status).toBe(200);
      const text = JSON.stringify(all.body);
      expect(text).not.toContain(UPSTREAM_SECRET);
      expect(text).not.toContain("secret-upstream.example.com");
      const guarded = (all.body.data as { model_name: string; svc_params: Record<string, unknown>; model_info: { id: string } }[]).find((m) => m.model_name === "guarded");
      expect(guarded?.svc_params).toEqual({ model: "mock/guarded", input_cost_per_token: 0.000001, rpm: 100 });
      expect(guarded?.model_info.id).toBe("dep-guarded");

      const k = await f.key({ models: ["gpt-a"] });
      const mine = await getStatus(gw, "/v1/model/info", k);
      expect((mine.body.data as { model_name: string }[]).map((m) => m.model_name)).toEqual(["gpt-a"]);
      expect((await getStatus(gw, "/model/info?svc_model_id=dep-a", k)).status).toBe(200);
      expect((await getStatus(gw, "/model/info?svc_model_id=dep-guarded", k)).status).toBe(404);
      const one = await getStatus(gw, "/model/info?svc_model_id=dep-guarded", MASTER_KEY);
      expect(JSON.stringify(one.body)).not.toContain(UPSTREAM_SECRET);
    });

    test("/model/info?svc_model_id= of the deployment a call used: also one reached through a wildcard entry, a key alias or model_group_alias", async () => {
      const k = await f.key({ models: ["mock/x", "nick", "quick-hidden"], aliases: { nick: "gpt-c" } });
      for (const [model, id] of [["mock/x", "dep-wild"], ["nick", "dep-c"], ["quick-hidden", "dep-d"]] as const) {
        const res = await fetch(`${gw.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${k}`, "content-type": "application/json" },
          body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 2 }),
        });
        expect([model, res.status, res.headers.get("x-svc-model-id")]).toEqual([model, 200, id]);
        expect([model, (await getStatus(gw, `/model/info?svc_model_id=${id}`, k)).status]).toEqual([model, 200]);
      }
      const mine = await getStatus(gw, "/model/info", k);
      expect((mine.body.data as { model_info: { id: string } }[]).map((m) => m.model_info.id).sort()).toEqual(["dep-c", "dep-d", "dep-wild"]);
      for (const id of ["dep-a", "dep-b", "dep-guarded"]) expect((await getStatus(gw, `/model/info?svc_model_id=${id}`, k)).status).toBe(404);
    });

    test("the request path runs no database query: 100 virtual-key calls, only the batched last_active write", async () => {
      const t = await f.team({ models: ["gpt-a", "cfg-group"] });
      const keys = [await f.key({ teamId: t }), await f.key({ teamId: t, models: ["gpt-c"] })];
      await call(gw, keys[0]!, "gpt-a");
      const queries = await countQueries(f.db, async () => {
        for (let i = 0; i < 100; i++) await call(gw, keys[i % 2]!, i % 2 ? "gpt-c" : "gpt-a");
        await sdk(gw, keys[0]!).models.list();
      });
      // Timer jobs may tick meanwhile (the batched last_active write; the key-rotation check every
      // 10 s; the spend log's batch and the budget-period roller, once a second; the retention
      // clean-up of call ids, report parts and period records a few seconds after start): a few runs in all, never
      // one per request.
      const background = [
        /^update "virtual_keys" set "last_active"/,
        /"virtual_keys"\."auto_rotate" = /,
        /^delete from "rotated_keys"/,
        /^\s*with input as \(/,
        /budget_reset_at <= now\(\)/,
        /^\s*with gone as \(\s*delete from "?(spend_calls|report_parts|budget_period_spend)"?/,
      ];
      const other = queries.filter((q) => !background.some((b) => b.test(q)));
      expect(other).toEqual([]);
      // Timer jobs only: far fewer queries than the 101 requests made.
      expect(queries.length).toBeLessThan(50);
      // The spy does see store queries: a cache reload of one key is one select.
      const reload = await countQueries(f.db, () => f.publish({ kind: "key", token: sha256(keys[0]!) }));
      expect(reload.filter((q) => q.includes('from "virtual_keys"'))).toHaveLength(1);
      // The used keys are written in one batch, off the request path.
      const written = await waitFor(async () => {
        const [row] = await f.db.select().from(virtualKeys).where(eqToken(sha256(keys[1]!)));
        return row?.lastActive ? row : undefined;
      }, 8000);
      expect(written.lastActive!.getTime()).toBeGreaterThan(Date.now() - 60_000);
    }, 20_000);
  });
}

async function waitFor<T>(probe: () => Promise<T | undefined>, timeoutMs: number): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > until) throw new Error("condition not met in time");
    await Bun.sleep(100);
  }
}

function eqToken(token: string) {
  return eq(virtualKeys.token, token);
}

function eqId(id: string) {
  return eq(accessGroups.accessGroupId, id);
}
