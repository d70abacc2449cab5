// Access groups through the management API, on the embedded store and on PostgreSQL: create, list
// (with deployment counts), info, update and delete by name and by id with the spec's 400/404/500
// rules; keys that name a group (in `models` or `access_group_ids`) reach exactly its models on the
// gateway, and follow its updates and deletion at the next request.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { eq, sql } from "drizzle-orm";
import OpenAI, { AuthenticationError } from "openai";
import { accessGroups, auditLog, users, virtualKeys } from "../../core/store/schema.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

const CONFIG = {
  model_list: [
    { model_name: "chat-mock", svc_params: { model: "mock/chat" }, model_info: { id: "chat-a" } },
    { model_name: "chat-mock", svc_params: { model: "mock/chat" }, model_info: { id: "chat-b" } },
    { model_name: "fixed-mock", svc_params: { model: "mock/fixed", mock_response: "Fixed." }, model_info: { id: "fixed-a", access_groups: ["cfg-group"] } },
    { model_name: "other-mock", svc_params: { model: "mock/other", mock_response: "Other." }, model_info: { id: "other-a" } },
    { model_name: "wild/*", svc_params: { model: "mock/*" }, model_info: { id: "wild-a" } },
  ],
  router_settings: { model_group_alias: { "chat-alias": "chat-mock" } },
  general_settings: { master_key: MASTER_KEY },
};

type Json = Record<string, unknown> & { error?: { message: string; type: string; code: string; param: string | null } };
type Group = { access_group: string; access_group_id: string | null; model_names: string[]; deployment_count: number; source: string };

for (const backend of BACKENDS) {
  describe(`access groups (${backend})`, () => {
    let gw: TestGateway;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_groups" });
    });
    afterAll(() => gw.stop());

    const db = () => gw.host!.store.db;

    const call = (method: string, path: string, body?: unknown, key = MASTER_KEY) => requestJson<Json>(gw, method, path, { body, key });

    async function makeKey(fields: { models?: string[]; accessGroupIds?: string[]; userId?: string }): Promise<string> {
      const key = `sk-test-${crypto.randomUUID()}`;
      const token = createHash("sha256").update(key).digest("hex");
      await db()
        .insert(virtualKeys)
        .values({ token, keyName: `sk-...${key.slice(-4)}`, ...fields });
      await gw.host!.services.bus!.publish({ kind: "key", token });
      return key;
    }

    const chat = (key: string, model: string) =>
      new OpenAI({ baseURL: gw.baseURL, apiKey: key, maxRetries: 0 }).chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] });

    async function denied(key: string, model: string): Promise<AuthenticationError> {
      const err = await chat(key, model).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(AuthenticationError);
      return err as AuthenticationError;
    }

    test("/access_group/new stores the group; list and info show models and deployment counts", async () => {
      const res = await call("POST", "/access_group/new", { access_group: "beta", model_names: ["chat-mock"], description: "beta testers" });
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ access_group: "beta", model_names: ["chat-mock"], deployment_count: 2, models_updated: 2, description: "beta testers" });
      const id = res.body.access_group_id as string;
      expect(id).toMatch(/^[0-9a-f-]{36}$/);
      const [row] = await db().select().from(accessGroups).where(eq(accessGroups.accessGroupId, id));
      expect(row).toMatchObject({ accessGroupName: "beta", modelNames: ["chat-mock"] });

      const list = await call("GET", "/access_group/list");
      expect(list.status).toBe(200);
      const groups = list.body.access_groups as Group[];
      expect(groups.find((g) => g.access_group === "beta")).toMatchObject({ access_group_id: id, model_names: ["chat-mock"], deployment_count: 2, source: "db" });
      // Groups declared on config deployments are listed too (read-only).
      expect(groups.find((g) => g.access_group === "cfg-group")).toMatchObject({ access_group_id: null, model_names: ["fixed-mock"], deployment_count: 1, source: "deployments" });

      const info = await call("GET", "/access_group/beta/info");
      expect(info.status).toBe(200);
      expect(info.body).toMatchObject({ access_group: "beta", access_group_id: id, model_names: ["chat-mock"], deployment_count: 2 });
      const byId = await call("GET", `/v1/access_group/${id}`);
      expect(byId.status).toBe(200);
      expect(byId.body).toEqual(info.body);
      expect((await call("GET", "/access_group/cfg-group/info")).body).toMatchObject({ model_names: ["fixed-mock"], source: "deployments" });

      const [audit] = await db().select().from(auditLog).where(eq(auditLog.objectId, id));
      expect(audit).toMatchObject({ action: "created", tableName: "access_groups" });
    });

    test("/access_group/new errors: unknown or no models → 400, duplicate name → 400, bad body → 422", async () => {
      const unknown = await call("POST", "/access_group/new", { access_group: "g1", model_names: ["chat-mock", "gpt-9"] });
      expect(unknown.status).toBe(400);
      expect(unknown.body.error?.message).toContain("gpt-9");
      expect(unknown.body.error?.message).not.toContain("chat-mock,");
      expect((await call("POST", "/access_group/new", { access_group: "g1", model_names: [] })).status).toBe(400);
      const dup = await call("POST", "/access_group/new", { access_group: "beta", model_names: ["fixed-mock"] });
      expect(dup.status).toBe(400);
      expect(dup.body.error?.message).toContain("already exists");
      expect((await call("POST", "/access_group/new", { access_group: "cfg-group", model_names: ["chat-mock"] })).status).toBe(400);
      const noName = await call("POST", "/access_group/new", { model_names: ["chat-mock"] });
      expect(noName.status).toBe(422);
      expect(noName.body.error?.param).toBe("access_group");
      expect((await call("POST", "/access_group/new", { access_group: "g1", model_names: "chat-mock" })).status).toBe(422);
      expect(await db().select().from(accessGroups).where(eq(accessGroups.accessGroupName, "g1"))).toEqual([]);
    });

    test("info/update/delete of a missing group → 404; a config group cannot be changed here (400)", async () => {
      expect((await call("GET", "/access_group/nope/info")).status).toBe(404);
      expect((await call("PUT", "/access_group/nope/update", { model_names: ["chat-mock"] })).status).toBe(404);
      expect((await call("DELETE", "/access_group/nope/delete")).status).toBe(404);
      const missingId = crypto.randomUUID();
      expect((await call("GET", `/v1/access_group/${missingId}`)).status).toBe(404);
      expect((await call("PUT", `/v1/access_group/${missingId}`, { model_names: ["chat-mock"] })).status).toBe(404);
      expect((await call("DELETE", `/v1/access_group/${missingId}`)).status).toBe(404);
      expect((await call("PUT", "/access_group/cfg-group/update", { model_names: ["chat-mock"] })).status).toBe(400);
      expect((await call("DELETE", "/access_group/cfg-group/delete")).status).toBe(400);
    });

    test("a key naming a group reaches exactly its models, and follows updates and deletion at the next request", async () => {
      const created = await call("POST", "/access_group/new", { access_group: "team-models", model_names: ["chat-mock"] });
      const id = created.body.access_group_id as string;
      const byName = await makeKey({ models: ["team-models"] });
      const byId = await makeKey({ accessGroupIds: [id] });
      for (const key of [byName, byId]) {
        expect((await chat(key, "chat-mock")).choices[0]?.message.content).toContain("mock response");
        const err = await denied(key, "fixed-mock");
        expect(err.status).toBe(401);
        expect((err.error as { type?: string }).type).toBe("key_model_access_denied");
      }

      const upd = await call("PUT", "/access_group/team-models/update", { model_names: ["fixed-mock", "other-mock"] });
      expect(upd.status).toBe(200);
      expect(upd.body).toMatchObject({ access_group: "team-models", access_group_id: id, model_names: ["fixed-mock", "other-mock"], deployment_count: 2 });
      for (const key of [byName, byId]) {
        expect((await chat(key, "fixed-mock")).choices[0]?.message.content).toBe("Fixed.");
        expect((await chat(key, "other-mock")).choices[0]?.message.content).toBe("Other.");
        await denied(key, "chat-mock");
      }

      const badUpd = await call("PUT", "/access_group/team-models/update", { model_names: ["gpt-9"] });
      expect(badUpd.status).toBe(400);
      expect((await call("PUT", "/access_group/team-models/update", { model_names: [] })).status).toBe(400);
      expect((await call("PUT", "/access_group/team-models/update", {})).status).toBe(422);
      expect((await call("GET", "/access_group/team-models/info")).body.model_names).toEqual(["fixed-mock", "other-mock"]);

      const byIdUpd = await call("PUT", `/v1/access_group/${id}`, { model_names: ["other-mock"] });
      expect(byIdUpd.status).toBe(200);
      await denied(byName, "fixed-mock");
      expect((await chat(byName, "other-mock")).choices).toHaveLength(1);

      const del = await call("DELETE", "/access_group/team-models/delete");
      expect(del.status).toBe(200);
      expect(del.body).toMatchObject({ access_group: "team-models", access_group_id: id });
      // References left behind grant nothing.
      for (const key of [byName, byId]) {
        await denied(key, "other-mock");
        await denied(key, "chat-mock");
      }
      expect((await call("GET", "/access_group/team-models/info")).status).toBe(404);
      expect((await call("DELETE", "/access_group/team-models/delete")).status).toBe(404);
      const trail = await db().select().from(auditLog).where(eq(auditLog.objectId, id));
      expect(trail.map((r) => r.action).sort()).toEqual(["created", "deleted", "updated", "updated"]);
    });

    test("a team whose models name a group (config or stored) may have keys listing the group's models", async () => {
      const stored = await call("POST", "/access_group/new", { access_group: "team-listed", model_names: ["other-mock"] });
      expect(stored.status).toBe(200);
      const team = await call("POST", "/team/new", { models: ["cfg-group", "team-listed"] });
      expect(team.status).toBe(200);
      const team_id = team.body.team_id as string;
      for (const model of ["fixed-mock", "other-mock"]) {
        const made = await call("POST", "/key/generate", { team_id, models: [model] });
        expect(made.status).toBe(200);
        expect((await chat(made.body.key as string, model)).choices).toHaveLength(1);
      }
      const outside = await call("POST", "/key/generate", { team_id, models: ["chat-mock"] });
      expect(outside.status).toBe(400);
      expect(outside.body.error?.param).toBe("models");
    });

    test("what a key may list in its team, and a team in its org, is what its calls may use: group names and aliases that fit are taken, access_group_ids that do not are a 400", async () => {
      const outsideGroup = (await call("POST", "/access_group/new", { access_group: "other-only", model_names: ["other-mock"] })).body.access_group_id as string;
      const chatGroup = (await call("POST", "/access_group/new", { access_group: "chat-only", model_names: ["chat-mock"] })).body.access_group_id as string;
      const team = await call("POST", "/team/new", { models: ["chat-mock", "fixed-mock"], model_aliases: { "team-fast": "chat-mock" } });
      const team_id = team.body.team_id as string;
      // An access group whose every model the team allows, the config's alias of a team model, the team's own alias.
      for (const [models, model] of [[["cfg-group"], "fixed-mock"], [["chat-alias"], "chat-alias"], [["team-fast"], "team-fast"]] as const) {
        const made = await call("POST", "/key/generate", { team_id, models });
        expect(made.status).toBe(200);
        expect((await chat(made.body.key as string, model)).choices).toHaveLength(1);
      }
      // A group holding a model the team does not allow: refused by name, and now by id too (its key could call none of it).
      const byName = await call("POST", "/key/generate", { team_id, models: ["other-only"] });
      expect(byName.status).toBe(400);
      expect(byName.body.error?.param).toBe("models");
      const byId = await call("POST", "/key/generate", { team_id, access_group_ids: [outsideGroup] });
      expect(byId.status).toBe(400);
      expect(byId.body.error?.param).toBe("access_group_ids");
      expect(byId.body.error?.message).toContain("other-only");
      const fits = await call("POST", "/key/generate", { team_id, access_group_ids: [chatGroup] });
      expect(fits.status).toBe(200);
      expect((await call("POST", "/key/update", { key: fits.body.key, access_group_ids: [outsideGroup] })).body.error?.param).toBe("access_group_ids");

      const org = await call("POST", "/organization/new", { organization_alias: `org-${backend}`, models: ["chat-mock"] });
      const organization_id = org.body.organization_id as string;
      const aliased = await call("POST", "/team/new", { organization_id, models: ["chat-alias"] });
      expect(aliased.status).toBe(200);
      const teamKey = await call("POST", "/key/generate", { team_id: aliased.body.team_id });
      expect((await chat(teamKey.body.key as string, "chat-alias")).choices).toHaveLength(1);
      const outsideOrg = await call("POST", "/team/new", { organization_id, access_group_ids: [outsideGroup] });
      expect(outsideOrg.status).toBe(400);
      expect(outsideOrg.body.error?.param).toBe("access_group_ids");
      const grouped = await call("POST", "/team/new", { organization_id, access_group_ids: [chatGroup] });
      expect(grouped.status).toBe(200);
      expect((await call("POST", "/team/update", { team_id: grouped.body.team_id, access_group_ids: [outsideGroup] })).body.error?.param).toBe("access_group_ids");
      // The org may not narrow past what its teams' groups hold.
      const narrowed = await call("PATCH", "/organization/update", { organization_id, models: ["fixed-mock"] });
      expect(narrowed.status).toBe(400);
      expect(narrowed.body.error?.message).toContain(`access_group_ids ${chatGroup}`);
    });

    test("a stored model declaring a stored group's name joins the group: by name and by id alike, and info, list and update say so", async () => {
      const made = await call("POST", "/access_group/new", { access_group: "joined", model_names: ["chat-mock"] });
      expect(made.status).toBe(200);
      const id = made.body.access_group_id as string;
      const byName = await makeKey({ models: ["joined"] });
      const byId = await makeKey({ accessGroupIds: [id] });
      const declared = await call("POST", "/model/new", {
        model_name: "joiner-mock",
        svc_params: { model: "mock/joiner", mock_response: "Joined." },
        model_info: { id: `joiner-${backend}`, access_groups: ["joined"] },
      });
      expect(declared.status).toBe(200);
      // Before, the declaration shadowed the stored group for keys naming it: chat-mock was a 401 by name.
      for (const key of [byName, byId]) {
        expect((await chat(key, "chat-mock")).choices).toHaveLength(1);
        expect((await chat(key, "joiner-mock")).choices[0]?.message.content).toBe("Joined.");
        await denied(key, "other-mock");
      }
      const info = await call("GET", "/access_group/joined/info");
      expect(info.body).toMatchObject({ access_group_id: id, model_names: ["chat-mock", "joiner-mock"], declared_by_deployments: ["joiner-mock"], deployment_count: 3, source: "db" });
      expect((await call("GET", `/v1/access_group/${id}`)).body).toEqual(info.body);
      const listed = ((await call("GET", "/access_group/list")).body.access_groups as Group[]).filter((g) => g.access_group === "joined");
      expect(listed).toEqual([info.body as unknown as Group]);

      // An update changes the stored models; the declaring deployment stays in the group.
      const upd = await call("PUT", "/access_group/joined/update", { model_names: ["other-mock"] });
      expect(upd.status).toBe(200);
      expect(upd.body.model_names).toEqual(["other-mock", "joiner-mock"]);
      for (const key of [byName, byId]) {
        expect((await chat(key, "other-mock")).choices).toHaveLength(1);
        expect((await chat(key, "joiner-mock")).choices).toHaveLength(1);
        await denied(key, "chat-mock");
      }
      // Deleted, the stored part is gone; the name keeps what the deployment declares.
      const del = await call("DELETE", "/access_group/joined/delete");
      expect(del.status).toBe(200);
      expect(del.body.message).toContain("joiner-mock");
      await denied(byName, "other-mock");
      expect((await chat(byName, "joiner-mock")).choices).toHaveLength(1);
      await denied(byId, "joiner-mock");
      expect((await call("GET", "/access_group/joined/info")).body).toMatchObject({ access_group_id: null, model_names: ["joiner-mock"], source: "deployments" });
      expect((await call("POST", "/model/delete", { id: `joiner-${backend}` })).status).toBe(200);
    });

    test("a name is a model or an access group, never both: group and model writes refuse a clash with a 400 naming it; config.yaml's is a warning", async () => {
      const clashes: [string, string][] = [
        ["chat-mock", "the model group 'chat-mock'"],
        ["chat-alias", "the model_group_alias 'chat-alias'"],
        ["wild/*", "the wildcard route 'wild/*'"],
      ];
      for (const [name, what] of clashes) {
        const res = await call("POST", "/access_group/new", { access_group: name, model_names: ["other-mock"] });
        expect(res.status).toBe(400);
        expect(res.body.error?.param).toBe("access_group");
        expect(res.body.error?.message).toContain(what);
      }
      // Before, the group was made, and a key listing the model reached the group's models too.
      await denied(await makeKey({ models: ["chat-mock"] }), "other-mock");

      expect((await call("POST", "/access_group/new", { access_group: "named-group", model_names: ["other-mock"] })).status).toBe(200);
      for (const [name, what] of [["named-group", "a stored access group"], ["cfg-group", "an access group declared by deployments"]]) {
        const res = await call("POST", "/model/new", { model_name: name, svc_params: { model: "mock/clash" }, model_info: { id: `clash-${backend}` } });
        expect(res.status).toBe(400);
        expect(res.body.error?.param).toBe("model_name");
        expect(res.body.error?.message).toContain(what);
      }
      const declaring = await call("POST", "/model/new", { model_name: "declaring", svc_params: { model: "mock/d" }, model_info: { id: `clash-${backend}`, access_groups: ["chat-alias"] } });
      expect(declaring.status).toBe(400);
      expect(declaring.body.error?.param).toBe("model_info.access_groups");
      expect(declaring.body.error?.message).toContain("the model_group_alias 'chat-alias'");

      // A stored model may not take a group's name, nor declare a model's; joining a group is fine.
      const id = `renamed-${backend}`;
      expect((await call("POST", "/model/new", { model_name: "renamed-mock", svc_params: { model: "mock/r" }, model_info: { id } })).status).toBe(200);
      expect((await call("PATCH", `/model/${id}/update`, { model_name: "named-group" })).status).toBe(400);
      expect((await call("POST", "/model/update", { model_name: "named-group", svc_params: { model: "mock/r" }, model_info: { id } })).status).toBe(400);
      expect((await call("PATCH", `/model/${id}/update`, { model_info: { access_groups: ["chat-mock"] } })).status).toBe(400);
      expect((await call("PATCH", `/model/${id}/update`, { model_info: { access_groups: ["named-group"] } })).status).toBe(200);
      expect((await call("PATCH", `/model/${id}/update`, { svc_params: { mock_response: "Renamed." } })).status).toBe(200);
      expect((await call("POST", "/model/delete", { id })).status).toBe(200);

      // config.yaml is the operator's: a clash there (with the stored group, or a model's name
      // declared as a group) loads, with a warning naming it.
      const before = gw.log.lines.length;
      const clashing = [
        { model_name: "named-group", svc_params: { model: "mock/named" }, model_info: { id: "named-a" } },
        { model_name: "declares-mock", svc_params: { model: "mock/dm" }, model_info: { id: "declares-a", access_groups: ["other-mock"] } },
      ];
      gw.writeConfig({ ...CONFIG, model_list: [...CONFIG.model_list, ...clashing] });
      try {
        expect((await gw.live.reload("test")).ok).toBe(true);
        const warned = gw.log.lines.slice(before).filter((l) => l.level === "warn" && l.msg.startsWith("access group")).map((l) => l.msg);
        expect(warned.some((m) => m.includes("'named-group' has the name of the model group 'named-group'"))).toBe(true);
        expect(warned.some((m) => m.includes("'other-mock' has the name of the model group 'other-mock'"))).toBe(true);
      } finally {
        gw.writeConfig(CONFIG);
        expect((await gw.live.reload("test")).ok).toBe(true);
      }
      expect((await call("DELETE", "/access_group/named-group/delete")).status).toBe(200);
    });

    test("a key naming an access group id that does not exist is a 400, as a team's is", async () => {
      const made = await call("POST", "/access_group/new", { access_group: "known-for-keys", model_names: ["chat-mock"] });
      const id = made.body.access_group_id as string;
      const bad = await call("POST", "/key/generate", { access_group_ids: [id, "no-such-group"] });
      expect(bad.status).toBe(400);
      expect(bad.body.error).toMatchObject({ param: "access_group_ids" });
      expect(bad.body.error!.message).toContain("no-such-group");
      const good = await call("POST", "/key/generate", { access_group_ids: [id] });
      expect(good.status).toBe(200);
      const update = await call("POST", "/key/update", { key: good.body.key, access_group_ids: [id, "no-such-group"] });
      expect(update.status).toBe(400);
      expect(update.body.error).toMatchObject({ param: "access_group_ids" });
      // A group deleted since it was given does not stop other updates of the key.
      expect((await call("DELETE", `/access_group/known-for-keys/delete`)).status).toBe(200);
      expect((await call("POST", "/key/update", { key: good.body.key, access_group_ids: [id], key_alias: "keeps-deleted-group" })).status).toBe(200);
    });

    test("DELETE /v1/access_group/{id} deletes by id", async () => {
      const created = await call("POST", "/access_group/new", { access_group: "by-id", model_names: ["other-mock"] });
      const id = created.body.access_group_id as string;
      const del = await call("DELETE", `/v1/access_group/${id}`);
      expect(del.status).toBe(200);
      expect(del.body.access_group).toBe("by-id");
      expect((await call("GET", `/v1/access_group/${id}`)).status).toBe(404);
      expect(gw.host!.services.identity!.accessGroups.has(id)).toBe(false);
    });

    test("writes are proxy-admin only; a viewer may read; a plain key may not", async () => {
      await db().insert(users).values({ userId: `viewer-${backend}`, userRole: "proxy_admin_viewer" });
      await gw.host!.services.bus!.publish({ kind: "user", userId: `viewer-${backend}` });
      const viewer = await makeKey({ userId: `viewer-${backend}` });
      const plain = await makeKey({});
      for (const key of [viewer, plain]) {
        expect((await call("POST", "/access_group/new", { access_group: "evil", model_names: ["chat-mock"] }, key)).status).toBe(403);
        expect((await call("PUT", "/access_group/beta/update", { model_names: ["fixed-mock"] }, key)).status).toBe(403);
        expect((await call("DELETE", "/access_group/beta/delete", undefined, key)).status).toBe(403);
      }
      expect((await call("GET", "/access_group/list", undefined, viewer)).status).toBe(200);
      expect((await call("GET", "/access_group/beta/info", undefined, viewer)).status).toBe(200);
      expect((await call("GET", "/access_group/list", undefined, plain)).status).toBe(403);
      expect((await call("GET", "/access_group/beta/info", undefined, plain)).status).toBe(403);
      expect((await call("GET", "/access_group/list", undefined, "sk-nope")).status).toBe(401);
      expect((await call("GET", "/access_group/beta/info")).body.model_names).toEqual(["chat-mock"]);
    });

    test("a database failure on create is a 500 that says so", async () => {
      await db().execute(sql`alter table access_groups rename to access_groups_away`);
      try {
        const res = await call("POST", "/access_group/new", { access_group: "doomed", model_names: ["chat-mock"] });
        expect(res.status).toBe(500);
        expect(res.body.error?.message).toContain("Database error");
      } finally {
        await db().execute(sql`alter table access_groups_away rename to access_groups`);
      }
      expect((await call("POST", "/access_group/new", { access_group: "doomed", model_names: ["chat-mock"] })).status).toBe(200);
    });
  });
}
