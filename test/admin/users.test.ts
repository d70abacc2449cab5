// User management: /user/new, /user/info, /user/update, /user/delete, /user/list on the embedded
// store and on PostgreSQL. What a user would notice: the key /user/new hands out works with the
// openai SDK, duplicates and bad input are refused with the right status, only proxy admins create
// and delete users or change roles and limits (LiteLLM PR #19116: an internal user could mint a
// proxy_admin), a user sees only itself, deleted users' keys stop at once, and every write leaves
// an audit row naming the `svc-changed-by` actor.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { eq, sql } from "drizzle-orm";
import OpenAI, { APIError } from "openai";
import { teams } from "../../core/store/schema.ts";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { sha256 } from "../harness/util.ts";

const CONFIG = {
  model_list: [
    { model_name: "chat-a", svc_params: { model: "mock/chat-a" } },
    { model_name: "chat-b", svc_params: { model: "mock/chat-b" } },
  ],
  general_settings: { master_key: MASTER_KEY },
};

type Json = Record<string, unknown>;
interface Reply<T> {
  status: number;
  body: T;
}
interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string };
}
interface User {
  user_id: string;
  user_email: string | null;
  user_alias: string | null;
  user_role: string;
  max_budget: number | null;
  budget_duration: string | null;
  budget_reset_at: string | null;
  tpm_limit: number | null;
  rpm_limit: number | null;
  models: string[];
  metadata: Json;
  spend: number;
  teams: string[];
}
interface NewUserReply extends User {
  key: string | null;
  token: string | null;
  key_name: string | null;
  expires: string | null;
}
interface UserInfo {
  user_id: string;
  user_info: User;
  keys: Json[];
  teams: { team_id: string; members_with_roles: { user_id: string; role: string }[] }[];
}
interface UserList {
  users: User[];
  total: number;
  page: number;
  page_size: number;
  total_pages: number;
}
interface AuditRow {
  changed_by: string;
  action: string;
  table_name: string;
  object_id: string;
  before_value: Json | null;
  updated_values: Json | null;
}

const uid = (p: string) => `${p}-${randomUUID().slice(0, 8)}`;

for (const backend of BACKENDS) {
  describe(`user management (${backend})`, () => {
    let gw: TestGateway;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG);
    }, 30_000);
    afterAll(() => gw.stop());

    const call = <T = Json>(method: string, path: string, opts: { key?: string; body?: unknown; headers?: Record<string, string> } = {}): Promise<Reply<T>> =>
      requestJson<T>(gw, method, path, opts);
    const post = <T = Json>(path: string, body: unknown, key?: string, headers?: Record<string, string>) => call<T>("POST", path, { body, key, headers });
    const get = <T = Json>(path: string, key?: string) => call<T>("GET", path, { key });

    /** A user with a key of its own (created by the master key). */
    async function userWithKey(fields: Json = {}): Promise<{ userId: string; key: string }> {
      const r = await post<NewUserReply>("/user/new", { user_id: uid("u"), ...fields });
      expect(r.status).toBe(200);
      return { userId: r.body.user_id, key: r.body.key! };
    }
    async function team(fields: Json = {}): Promise<string> {
      const r = await post<{ team_id: string }>("/team/new", fields);
      expect(r.status).toBe(200);
      return r.body.team_id;
    }
    async function audits(table: string, objectId: string): Promise<AuditRow[]> {
      const r = await get<{ audit_logs: AuditRow[] }>(`/audit/logs?table_name=${table}&object_id=${encodeURIComponent(objectId)}`);
      expect(r.status).toBe(200);
      return r.body.audit_logs;
    }
    const sdk = (apiKey: string) => new OpenAI({ baseURL: gw.baseURL, apiKey, maxRetries: 0 });
    const chat = (apiKey: string, model = "chat-a") => sdk(apiKey).chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] });
    /** The status a model call gets (200, or the SDK error's status and type). */
    async function callStatus(apiKey: string, model = "chat-a"): Promise<{ status: number; type?: string }> {
      try {
        await chat(apiKey, model);
        return { status: 200 };
      } catch (err) {
        if (!(err instanceof APIError)) throw err;
        return { status: err.status ?? 0, type: err.type ?? undefined };
      }
    }

    describe("/user/new", () => {
      test("defaults: a uuid user_id, role internal_user, and a working key whose token is its sha256", async () => {
        const r = await post<NewUserReply>("/user/new", { user_email: `${uid("a")}@example.com`, models: ["chat-a"] });
        expect(r.status).toBe(200);
        expect(r.body.user_id).toMatch(/^[0-9a-f-]{36}$/);
        expect(r.body.user_role).toBe("internal_user");
        expect(r.body.key).toMatch(/^sk-/);
        expect(r.body.token).toBe(sha256(r.body.key!));
        expect(r.body.key_name).toBe(`sk-...${r.body.key!.slice(-4)}`);
        expect(r.body.expires).toBeNull();
        expect(r.body.spend).toBe(0);
        expect(r.body.models).toEqual(["chat-a"]);
        // The key works, and the user's model list applies to it.
        const done = await chat(r.body.key!);
        expect(done.choices[0]?.message.content).toContain("hi");
        expect(await callStatus(r.body.key!, "chat-b")).toEqual({ status: 401, type: "user_model_access_denied" });
      });

      test("a team that does not exist is one 400, named by the field that named it, whether found before the write or deleted while it waited", async () => {
        const refused = async (body: Json): Promise<ErrorBody["error"]> => {
          const userId = uid("teamless");
          const r = await post<ErrorBody>("/user/new", { user_id: userId, ...body });
          expect(r.status).toBe(400);
          expect((await get(`/user/info?user_id=${userId}`)).status).toBe(404);
          return r.body.error;
        };
        const gone = (ids: string, param: string) => ({ message: ids.includes(",") ? `Teams ${ids} do not exist.` : `Team ${ids} does not exist.`, type: "invalid_request_error", param, code: "400" });
        const [a, b] = [uid("nope-a"), uid("nope-b")];
        expect(await refused({ teams: [a] })).toEqual(gone(a, "teams"));
        expect(await refused({ team_id: a })).toEqual(gone(a, "team_id"));
        expect(await refused({ team_id: a, auto_create_key: false })).toEqual(gone(a, "team_id"));
        expect(await refused({ teams: [{ team_id: b }, a] })).toEqual(gone(`${a}, ${b}`, "teams"));
        const deleted = await team({});
        expect((await post("/team/delete", { team_ids: [deleted] })).status).toBe(200);
        expect(await refused({ teams: [{ team_id: deleted, user_role: "admin" }] })).toEqual(gone(deleted, "teams"));
        expect(await refused({ team_id: deleted })).toEqual(gone(deleted, "team_id"));
        if (backend !== "postgres") return;
        // Deleted after /user/new found it and before its write held it: the same answer.
        const db = gw.host!.store.db;
        for (const field of ["teams", "team_id"] as const) {
          const t = await team({});
          let release!: () => void;
          const released = new Promise<void>((resolve) => {
            release = resolve;
          });
          let locked!: () => void;
          const held = new Promise<void>((resolve) => {
            locked = resolve;
          });
          const deletion = db.transaction(async (tx) => {
            await tx.select({ id: teams.teamId }).from(teams).where(eq(teams.teamId, t)).for("update");
            locked();
            await released;
            await tx.update(teams).set({ deletedAt: new Date(), deletedBy: "test" }).where(eq(teams.teamId, t));
          });
          await held;
          const answer = refused(field === "teams" ? { teams: [t] } : { team_id: t });
          // /user/new waits for the team's row (holdTeams), having found the team live before its transaction.
          let waiting = false;
          for (let i = 0; i < 500 && !waiting; i++) {
            const [w] = await rows<{ n: number }>(db, sql`select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`);
            waiting = w!.n > 0;
            if (!waiting) await Bun.sleep(10);
          }
          release();
          expect(waiting).toBe(true);
          await deletion;
          expect(await answer).toEqual(gone(t, field));
        }
      });

      test("every field is stored and returned; budget_duration sets budget_reset_at", async () => {
        const id = uid("full");
        const r = await post<NewUserReply>("/user/new", {
          user_id: id,
          user_alias: "Full User",
          user_role: "internal_user_viewer",
          max_budget: 12.5,
          budget_duration: "30d",
          tpm_limit: 1000,
          rpm_limit: 10,
          max_parallel_requests: 2,
          metadata: { dept: "r&d" },
          key_alias: `alias-${id}`,
          duration: "1h",
        });
        expect(r.status).toBe(200);
        expect(r.body).toMatchObject({ user_id: id, user_alias: "Full User", user_role: "internal_user_viewer", max_budget: 12.5, budget_duration: "30d", tpm_limit: 1000, rpm_limit: 10, metadata: { dept: "r&d" } });
        const reset = Date.parse(r.body.budget_reset_at!);
        expect(Math.abs(reset - (Date.now() + 30 * 86_400_000))).toBeLessThan(60_000);
        const expires = Date.parse(r.body.expires!);
        expect(Math.abs(expires - (Date.now() + 3_600_000))).toBeLessThan(60_000);
        const info = await get<UserInfo>(`/user/info?user_id=${id}`);
        expect(info.body.user_info).toMatchObject({ user_alias: "Full User", max_budget: 12.5, rpm_limit: 10 });
        expect(info.body.keys).toHaveLength(1);
        expect(info.body.keys[0]).toMatchObject({ key_alias: `alias-${id}`, user_id: id });
      });

      test("auto_create_key=false creates no key (key null)", async () => {
        const id = uid("nokey");
        const r = await post<NewUserReply>("/user/new", { user_id: id, auto_create_key: false });
        expect(r.status).toBe(200);
        expect(r.body.key).toBeNull();
        expect(r.body.token).toBeNull();
        const info = await get<UserInfo>(`/user/info?user_id=${id}`);
        expect(info.body.keys).toEqual([]);
      });

      test("teams (ids or {team_id, user_role}) become memberships", async () => {
        const t1 = await team({ team_alias: "t1" });
        const t2 = await team({ team_alias: "t2" });
        const id = uid("member");
        const r = await post<NewUserReply>("/user/new", { user_id: id, teams: [t1, { team_id: t2, user_role: "admin" }], auto_create_key: false });
        expect(r.status).toBe(200);
        expect(r.body.teams.sort()).toEqual([t1, t2].sort());
        const info = await get<UserInfo>(`/user/info?user_id=${id}`);
        const roles = Object.fromEntries(info.body.teams.map((t) => [t.team_id, t.members_with_roles.find((m) => m.user_id === id)?.role]));
        expect(roles).toEqual({ [t1]: "user", [t2]: "admin" });
      });

      test("teams and team_id admit the user as /team/member_add does: the team's member budget and rate limits apply, and its keys are held to them", async () => {
        const broke = await team({ team_member_budget: 0, team_member_tpm_limit: 5000 });
        const slow = await team({ team_member_budget: 3, team_member_rpm_limit: 1 });
        const id = uid("defaults");
        const r = await post<NewUserReply>("/user/new", { user_id: id, teams: [{ team_id: slow, max_budget_in_team: 1.5 }], team_id: broke });
        expect(r.status).toBe(200);
        const membership = async (teamId: string) =>
          (await get<{ team_memberships: { user_id: string; max_budget_in_team: number | null; rpm_limit: number | null; tpm_limit: number | null }[] }>(`/team/info?team_id=${teamId}`)).body.team_memberships.find(
            (m) => m.user_id === id,
          );
        expect(await membership(broke)).toMatchObject({ max_budget_in_team: 0, rpm_limit: null, tpm_limit: 5000 });
        // A max_budget_in_team given in the entry wins over the team's member budget, as on /team/member_add.
        expect(await membership(slow)).toMatchObject({ max_budget_in_team: 1.5, rpm_limit: 1, tpm_limit: null });
        // The key made with the user is in team `broke`: a member budget of 0 refuses its first call.
        expect(await callStatus(r.body.key!)).toMatchObject({ status: 400, type: "budget_exceeded" });
        const slowKey = await post<{ key: string }>("/key/generate", { user_id: id, team_id: slow });
        expect((await callStatus(slowKey.body.key)).status).toBe(200);
        expect((await callStatus(slowKey.body.key)).status).toBe(429);
      });

      test("duplicate user_email (any case) and duplicate user_id are 400; nothing is created", async () => {
        const email = `${uid("dup")}@example.com`;
        const first = await post<NewUserReply>("/user/new", { user_email: email, auto_create_key: false });
        expect(first.status).toBe(200);
        const again = await post<ErrorBody>("/user/new", { user_email: email.toUpperCase() });
        expect(again.status).toBe(400);
        expect(again.body.error).toMatchObject({ param: "user_email", code: "400" });
        const sameId = await post<ErrorBody>("/user/new", { user_id: first.body.user_id });
        expect(sameId.status).toBe(400);
        const list = await get<UserList>(`/user/list?user_email=${encodeURIComponent(email)}`);
        expect(list.body.total).toBe(1);
      });

      test("bad input: unknown role → 422 naming it; unknown team → 400; bad budget_duration → 400", async () => {
        const role = await post<ErrorBody>("/user/new", { user_role: "god" });
        expect(role.status).toBe(422);
        expect(role.body.error.param).toBe("user_role");
        const teamMissing = await post<ErrorBody>("/user/new", { teams: ["no-such-team"] });
        expect(teamMissing.status).toBe(400);
        expect(teamMissing.body.error.message).toContain("no-such-team");
        const period = await post<ErrorBody>("/user/new", { budget_duration: "soon" });
        expect(period.status).toBe(400);
        expect(period.body.error.param).toBe("budget_duration");
      });

      test("only proxy admins create users: internal users (even asking for proxy_admin), viewers and team admins get 403", async () => {
        const plain = await userWithKey();
        const viewer = await userWithKey({ user_role: "proxy_admin_viewer" });
        const t = await team();
        const tAdmin = await userWithKey({ teams: [{ team_id: t, user_role: "admin" }], team_id: t });
        const victim = uid("escalated");
        for (const key of [plain.key, viewer.key, tAdmin.key]) {
          const r = await post<ErrorBody>("/user/new", { user_id: victim, user_role: "proxy_admin" }, key);
          expect(r.status).toBe(403);
          expect(r.body.error.type).toBe("permission_error");
        }
        expect((await get(`/user/info?user_id=${victim}`)).status).toBe(404);
        // A proxy_admin user's key may.
        const admin = await userWithKey({ user_role: "proxy_admin" });
        const ok = await post<NewUserReply>("/user/new", { user_role: "proxy_admin_viewer", auto_create_key: false }, admin.key);
        expect(ok.status).toBe(200);
        expect(ok.body.user_role).toBe("proxy_admin_viewer");
      });
    });

    describe("/user/info", () => {
      test("defaults to the caller's user; shows keys (hash only) and teams", async () => {
        const t = await team({ team_alias: "info-team" });
        const u = await userWithKey({ teams: [t] });
        const r = await get<UserInfo>("/user/info", u.key);
        expect(r.status).toBe(200);
        expect(r.body.user_id).toBe(u.userId);
        expect(r.body.user_info.user_id).toBe(u.userId);
        expect(r.body.keys.map((k) => k.token)).toEqual([sha256(u.key)]);
        expect(JSON.stringify(r.body)).not.toContain(u.key);
        expect(r.body.teams.map((x) => x.team_id)).toEqual([t]);
      });

      test("a non-admin asking for another user gets 403, existing or not; admins and viewers may read anyone", async () => {
        const a = await userWithKey();
        const b = await userWithKey();
        const other = await get<ErrorBody>(`/user/info?user_id=${b.userId}`, a.key);
        const ghost = await get<ErrorBody>("/user/info?user_id=no-such-user", a.key);
        expect(other.status).toBe(403);
        expect(ghost.status).toBe(403);
        expect(other.body.error.message).toBe(ghost.body.error.message);
        const viewer = await userWithKey({ user_role: "proxy_admin_viewer" });
        expect((await get(`/user/info?user_id=${b.userId}`, viewer.key)).status).toBe(200);
        expect((await get(`/user/info?user_id=${b.userId}`)).status).toBe(200);
        const missing = await get<ErrorBody>("/user/info?user_id=no-such-user");
        expect(missing.status).toBe(404);
        expect(missing.body.error.type).toBe("not_found_error");
      });

      test("the master key without user_id gets every key and team, as LiteLLM answers a proxy admin (its default_user_id is no user)", async () => {
        const t = await team({ team_alias: "everything-team" });
        const u = await userWithKey({ teams: [t] });
        const r = await get<{ user_id: null; user_info: null; keys: Json[]; teams: UserInfo["teams"] }>("/user/info");
        expect([r.status, r.body.user_id, r.body.user_info]).toEqual([200, null, null]);
        expect(r.body.keys.map((k) => k.token)).toContain(sha256(u.key));
        expect(JSON.stringify(r.body)).not.toContain(u.key);
        expect(r.body.teams.find((x) => x.team_id === t)?.members_with_roles).toEqual([expect.objectContaining({ user_id: u.userId, role: "user" })]);
        // Named, it is still no user.
        expect((await get("/user/info?user_id=default_user_id")).status).toBe(404);
      });

      test("user_id given empty is a 422 naming it, not a key without a user", async () => {
        const u = await userWithKey();
        for (const key of [u.key, MASTER_KEY]) {
          const r = await get<ErrorBody>("/user/info?user_id=", key);
          expect([r.status, r.body.error.param, r.body.error.message]).toEqual([422, "user_id", "Invalid request: user_id is empty: name a user, or leave user_id out to read your own."]);
        }
      });
    });

    test("model_max_budget (which no call is checked against on a user) is a 400 naming it, by /user/new and /user/update, nothing stored; null is taken", async () => {
      const id = uid("permodel");
      for (const value of [{ "chat-a": { budget_limit: 1e-7, time_period: "1d" } }, { "chat-a": "x" }]) {
        const made = await post<ErrorBody>("/user/new", { user_id: id, model_max_budget: value });
        expect([made.status, made.body.error.param]).toEqual([400, "model_max_budget"]);
        expect(made.body.error.message).toContain("model_max_budget is not enforced on a user");
      }
      expect((await get(`/user/info?user_id=${id}`)).status).toBe(404);
      const u = await userWithKey({ model_max_budget: null });
      const update = await post<ErrorBody>("/user/update", { user_id: u.userId, model_max_budget: { "chat-a": { budget_limit: 1 } } });
      expect([update.status, update.body.error.param]).toEqual([400, "model_max_budget"]);
      expect((await get<UserInfo>(`/user/info?user_id=${u.userId}`)).body.user_info).toMatchObject({ model_max_budget: null });
    });

    describe("/user/update", () => {
      test("admins change fields; explicit null clears; user_email can name the user", async () => {
        const email = `${uid("upd")}@example.com`;
        const u = await userWithKey({ user_email: email, user_alias: "Old", max_budget: 5, models: ["chat-a"], metadata: { a: 1 } });
        const r = await post<{ user_id: string; data: User }>("/user/update", { user_id: u.userId, user_alias: "New", user_role: "proxy_admin_viewer", rpm_limit: 7, budget_duration: "1d" });
        expect(r.status).toBe(200);
        expect(r.body.user_id).toBe(u.userId);
        expect(r.body.data).toMatchObject({ user_alias: "New", user_role: "proxy_admin_viewer", rpm_limit: 7, max_budget: 5, budget_duration: "1d" });
        expect(r.body.data.budget_reset_at).not.toBeNull();
        const cleared = await post<{ data: User }>("/user/update", { user_email: email, user_alias: null, max_budget: null, models: null, metadata: null, budget_duration: null });
        expect(cleared.status).toBe(200);
        expect(cleared.body.data).toMatchObject({ user_alias: null, max_budget: null, models: [], metadata: {}, budget_duration: null, budget_reset_at: null, rpm_limit: 7 });
        // The new role takes effect on the user's key at once: a viewer may now read every user.
        expect((await get("/user/list", u.key)).status).toBe(200);
      });

      test("an internal user may rename itself but not change its role, limits or models, nor touch others", async () => {
        const u = await userWithKey();
        const other = await userWithKey();
        const alias = await post<{ data: User }>("/user/update", { user_id: u.userId, user_alias: "me" }, u.key);
        expect(alias.status).toBe(200);
        expect(alias.body.data.user_alias).toBe("me");
        for (const change of [{ user_role: "proxy_admin" }, { max_budget: 1000 }, { models: ["chat-b"] }, { rpm_limit: 100000 }]) {
          const r = await post<ErrorBody>("/user/update", { user_id: u.userId, ...change }, u.key);
          expect(r.status).toBe(403);
        }
        const info = await get<UserInfo>(`/user/info?user_id=${u.userId}`);
        expect(info.body.user_info.user_role).toBe("internal_user");
        expect(info.body.user_info.max_budget).toBeNull();
        // Still not an admin: a management call for admins is refused.
        expect((await get("/user/list", u.key)).status).toBe(403);
        expect((await post("/user/update", { user_id: other.userId, user_alias: "pwned" }, u.key)).status).toBe(403);
        expect((await post("/user/update", { user_id: "no-such-user", user_alias: "x" }, u.key)).status).toBe(403);
      });

      test("viewers are read-only; unknown users are 404 for admins; a taken e-mail is 400", async () => {
        const viewer = await userWithKey({ user_role: "proxy_admin_viewer" });
        const u = await userWithKey({ user_email: `${uid("taken")}@example.com` });
        expect((await post("/user/update", { user_id: u.userId, user_alias: "v" }, viewer.key)).status).toBe(403);
        expect((await post("/user/update", { user_id: viewer.userId, user_alias: "v" }, viewer.key)).status).toBe(403);
        expect((await post("/user/update", { user_id: "no-such-user", user_alias: "x" })).status).toBe(404);
        const info = await get<UserInfo>(`/user/info?user_id=${u.userId}`);
        const taken = await post<ErrorBody>("/user/update", { user_id: viewer.userId, user_email: info.body.user_info.user_email });
        expect(taken.status).toBe(400);
        expect((await post("/user/update", { user_alias: "nobody named" })).status).toBe(400);
      });

      test("an address another user has is refused without naming that user, but to a proxy admin", async () => {
        const email = `${uid("owner")}@example.com`;
        const owner = await userWithKey({ user_email: email });
        const u = await userWithKey();
        const own = await post<ErrorBody>("/user/update", { user_id: u.userId, user_email: email.toUpperCase() }, u.key);
        expect(own.status).toBe(400);
        expect(own.body.error.param).toBe("user_email");
        expect(JSON.stringify(own.body)).not.toContain(owner.userId);
        const admin = await post<ErrorBody>("/user/update", { user_id: u.userId, user_email: email });
        expect(admin.status).toBe(400);
        expect(admin.body.error.message).toContain(owner.userId);
      });
    });

    describe("/user/delete", () => {
      test("deletes users, their keys (refused at once with 401) and memberships", async () => {
        const t = await team();
        const u = await userWithKey({ teams: [t] });
        const v = await userWithKey();
        expect((await chat(u.key)).choices).toHaveLength(1);
        const r = await post<{ deleted_users: string[]; deleted_keys: string[] }>("/user/delete", { user_ids: [u.userId, v.userId] });
        expect(r.status).toBe(200);
        expect(r.body.deleted_users.sort()).toEqual([u.userId, v.userId].sort());
        expect(r.body.deleted_keys.sort()).toEqual([sha256(u.key), sha256(v.key)].sort());
        expect((await callStatus(u.key)).status).toBe(401);
        expect((await callStatus(v.key)).status).toBe(401);
        expect((await get(`/user/info?user_id=${u.userId}`)).status).toBe(404);
        const teamInfo = await get<{ team_info: { members_with_roles: unknown[] } }>(`/team/info?team_id=${t}`);
        expect(teamInfo.body.team_info.members_with_roles).toEqual([]);
      });

      test("unknown ids are 404 and nothing is deleted; non-admins get 403", async () => {
        const u = await userWithKey();
        const r = await post<ErrorBody>("/user/delete", { user_ids: [u.userId, "no-such-user"] });
        expect(r.status).toBe(404);
        expect(r.body.error.message).toContain("no-such-user");
        expect((await get(`/user/info?user_id=${u.userId}`)).status).toBe(200);
        const other = await userWithKey();
        const viewer = await userWithKey({ user_role: "proxy_admin_viewer" });
        expect((await post("/user/delete", { user_ids: [other.userId] }, u.key)).status).toBe(403);
        expect((await post("/user/delete", { user_ids: [u.userId] }, u.key)).status).toBe(403);
        expect((await post("/user/delete", { user_ids: [other.userId] }, viewer.key)).status).toBe(403);
        expect((await chat(other.key)).choices).toHaveLength(1);
        expect((await post("/user/delete", { user_ids: [] })).status).toBe(422);
      });
    });

    describe("/user/list", () => {
      test("pages (default 25, max 100), filters and counts", async () => {
        const tag = uid("list").toLowerCase();
        const t = await team();
        const ids: string[] = [];
        for (let i = 0; i < 3; i++) {
          const r = await post<NewUserReply>("/user/new", { user_id: `${tag}-${i}`, user_email: `${tag}-${i}@Example.com`, auto_create_key: false, teams: i === 0 ? [t] : [], user_role: i === 2 ? "proxy_admin_viewer" : "internal_user" });
          ids.push(r.body.user_id);
        }
        const all = await get<UserList>("/user/list");
        expect(all.status).toBe(200);
        expect(all.body.page).toBe(1);
        expect(all.body.page_size).toBe(25);
        expect(all.body.total).toBeGreaterThanOrEqual(3);
        expect(all.body.total_pages).toBe(Math.ceil(all.body.total / 25));

        const byEmail = await get<UserList>(`/user/list?user_email=${tag}-&page_size=2`);
        expect(byEmail.body).toMatchObject({ total: 3, page: 1, page_size: 2, total_pages: 2 });
        expect(byEmail.body.users.map((u) => u.user_id)).toEqual(ids.slice(0, 2));
        const page2 = await get<UserList>(`/user/list?user_email=${tag.toUpperCase()}&page_size=2&page=2`);
        expect(page2.body.users.map((u) => u.user_id)).toEqual([ids[2]!]);

        const byIds = await get<UserList>(`/user/list?user_ids=${ids[0]},${ids[2]}`);
        expect(byIds.body.users.map((u) => u.user_id).sort()).toEqual([ids[0]!, ids[2]!].sort());
        const byRole = await get<UserList>(`/user/list?user_email=${tag}&role=proxy_admin_viewer`);
        expect(byRole.body.users.map((u) => u.user_id)).toEqual([ids[2]!]);
        const byTeam = await get<UserList>(`/user/list?team=${t}`);
        expect(byTeam.body.users.map((u) => u.user_id)).toEqual([ids[0]!]);
        expect(byTeam.body.users[0]!.teams).toEqual([t]);
        const desc = await get<UserList>(`/user/list?user_email=${tag}&sort_by=user_id&sort_order=desc`);
        expect(desc.body.users.map((u) => u.user_id)).toEqual([...ids].reverse());
        // "%" is a literal character, not a wildcard.
        expect((await get<UserList>("/user/list?user_email=%25%25%25")).body.total).toBe(0);
      });

      test("bad paging is 422; only admins and viewers may list", async () => {
        expect((await get<ErrorBody>("/user/list?page_size=101")).status).toBe(422);
        expect((await get<ErrorBody>("/user/list?page=0")).status).toBe(422);
        expect((await get<ErrorBody>("/user/list?sort_by=password")).status).toBe(422);
        const u = await userWithKey();
        expect((await get("/user/list", u.key)).status).toBe(403);
        const viewer = await userWithKey({ user_role: "proxy_admin_viewer" });
        expect((await get("/user/list", viewer.key)).status).toBe(200);
      });
    });

    test("audit rows for create, update and delete name the svc-changed-by actor, never the plaintext key", async () => {
      const actor = { "svc-changed-by": "alice@ops" };
      const id = uid("audited");
      const created = await post<NewUserReply>("/user/new", { user_id: id, user_alias: "A" }, MASTER_KEY, actor);
      expect(created.status).toBe(200);
      expect((await post("/user/update", { user_id: id, user_alias: "B" }, MASTER_KEY, actor)).status).toBe(200);
      expect((await post("/user/delete", { user_ids: [id] }, MASTER_KEY, actor)).status).toBe(200);
      const rows = await audits("users", id);
      expect(rows.map((r) => r.action).sort()).toEqual(["created", "deleted", "updated"]);
      for (const row of rows) expect(row.changed_by).toBe("alice@ops");
      const update = rows.find((r) => r.action === "updated")!;
      expect(update.before_value).toMatchObject({ user_alias: "A" });
      expect(update.updated_values).toMatchObject({ user_alias: "B" });
      const keyRows = await audits("virtual_keys", created.body.token!);
      expect(keyRows.map((r) => r.action).sort()).toEqual(["created", "deleted"]);
      expect(JSON.stringify(await get("/audit/logs?page_size=100"))).not.toContain(created.body.key!);
    });

    test("an empty svc-changed-by names no one: the caller is recorded, on the row and in the audit trail", async () => {
      const id = uid("unnamed");
      const created = await post<NewUserReply & { created_by: string; updated_by: string }>("/user/new", { user_id: id, auto_create_key: false }, MASTER_KEY, { "svc-changed-by": "" });
      expect(created.status).toBe(200);
      expect([created.body.created_by, created.body.updated_by]).toEqual(["default_user_id", "default_user_id"]);
      expect((await audits("users", id)).map((r) => r.changed_by)).toEqual(["default_user_id"]);
    });

    test("/user/new's audit row shows the memberships it made as the API does (snake_case, money as numbers)", async () => {
      const t = await team();
      const id = uid("member-audited");
      const created = await post("/user/new", { user_id: id, auto_create_key: false, teams: [{ team_id: t, user_role: "admin", max_budget_in_team: 2.5 }] });
      expect(created.status).toBe(200);
      const [row] = await audits("users", id);
      const shown = await post<Json>("/team/member_update", { team_id: t, user_id: id });
      expect(row!.updated_values!.team_memberships).toEqual([expect.objectContaining({ team_id: t, user_id: id, role: "admin", max_budget_in_team: 2.5 })]);
      expect(shown.body).toMatchObject({ team_id: t, user_id: id, role: "admin", max_budget_in_team: 2.5 });
    });
  });
}
