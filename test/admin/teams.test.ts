// Team management on the embedded store and on PostgreSQL: create/update/delete, info and the
// three lists, block/unblock, members (add in both body forms, delete, update, bulk), member
// permissions and team models. What a user would notice: the shapes LiteLLM clients read, the
// 400/403/404/422 rules, that blocking or deleting a team stops its keys on the very next request
// (openai SDK), that a Team Management Key runs its own team and nothing else (another team, real
// or not, is the same 403), that a `user` member gets only what the team's permissions grant, and
// that every write leaves an audit row naming the `svc-changed-by` actor.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import OpenAI, { APIError } from "openai";
import { and, eq } from "drizzle-orm";
import { organizations, teamMembers, teams, users } from "../../core/store/schema.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { sha256 } from "../harness/util.ts";

const CONFIG = {
  model_list: [
    { model_name: "chat-a", svc_params: { model: "mock/chat-a" } },
    { model_name: "chat-b", svc_params: { model: "mock/chat-b" } },
    { model_name: "chat-c", svc_params: { model: "mock/chat-c" } },
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
interface Member {
  user_id: string;
  user_email: string | null;
  role: string;
}
interface Team {
  team_id: string;
  team_alias: string | null;
  organization_id: string | null;
  models: string[];
  blocked: boolean;
  spend: number;
  max_budget: number | null;
  budget_duration: string | null;
  budget_reset_at: string | null;
  tpm_limit: number | null;
  rpm_limit: number | null;
  metadata: Json;
  tags: string[];
  model_aliases: Json;
  team_member_permissions: string[];
  team_member_budget: number | null;
  members_with_roles: Member[];
  deleted_at: string | null;
}
interface Membership {
  team_id: string;
  user_id: string;
  role: string;
  max_budget_in_team: number | null;
  tpm_limit: number | null;
  rpm_limit: number | null;
}
interface TeamInfo {
  team_id: string;
  team_info: Team;
  keys: Json[];
  team_memberships: Membership[];
}
interface MemberAddReply extends Team {
  updated_users: { user_id: string; user_email: string | null; user_role: string }[];
  updated_team_memberships: Membership[];
}
interface TeamPage {
  teams: Team[];
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
}

const uid = (p: string) => `${p}-${randomUUID().slice(0, 8)}`;

for (const backend of BACKENDS) {
  describe(`team management (${backend})`, () => {
    let gw: TestGateway;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG);
    }, 30_000);
    afterAll(() => gw.stop());

    const call = <T = Json>(method: string, path: string, opts: { key?: string; body?: unknown; headers?: Record<string, string> } = {}): Promise<Reply<T>> =>
      requestJson<T>(gw, method, path, opts);
    const post = <T = Json>(path: string, body: unknown, key?: string, headers?: Record<string, string>) => call<T>("POST", path, { body, key, headers });
    const get = <T = Json>(path: string, key?: string) => call<T>("GET", path, { key });

    async function newTeam(fields: Json = {}): Promise<Team> {
      const r = await post<Team>("/team/new", fields);
      expect(r.status).toBe(200);
      return r.body;
    }
    async function newUser(fields: Json = {}): Promise<string> {
      const r = await post<{ user_id: string }>("/user/new", { user_id: uid("u"), auto_create_key: false, ...fields });
      expect(r.status).toBe(200);
      return r.body.user_id;
    }
    async function keyFor(userId: string, teamId?: string): Promise<string> {
      const r = await post<{ key: string }>("/key/generate", { user_id: userId, team_id: teamId });
      expect(r.status).toBe(200);
      return r.body.key;
    }
    /** A user who is `role` in `teamId`, with a key of that team. */
    async function memberKey(teamId: string, role: "admin" | "user", fields: Json = {}): Promise<{ userId: string; key: string }> {
      const userId = await newUser(fields);
      expect((await post("/team/member_add", { team_id: teamId, member: { role, user_id: userId } })).status).toBe(200);
      return { userId, key: await keyFor(userId, teamId) };
    }
    async function org(fields: Partial<typeof organizations.$inferInsert>): Promise<string> {
      const organizationId = uid("org");
      await gw.host!.store.db.insert(organizations).values({ ...fields, organizationId });
      await gw.host!.services.bus!.publish({ kind: "org", orgId: organizationId });
      return organizationId;
    }
    async function info(teamId: string, key?: string): Promise<Reply<TeamInfo>> {
      return get<TeamInfo>(`/team/info?team_id=${encodeURIComponent(teamId)}`, key);
    }
    async function modelCall(apiKey: string, model = "chat-a"): Promise<{ status: number; type?: string; message?: string }> {
      try {
        await new OpenAI({ baseURL: gw.baseURL, apiKey, maxRetries: 0 }).chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] });
        return { status: 200 };
      } catch (err) {
        if (!(err instanceof APIError)) throw err;
        return { status: err.status ?? 0, type: err.type ?? undefined, message: err.message };
      }
    }

    describe("/team/new", () => {
      test("creates the team and its members (existing by id, new by e-mail); the row comes back at top level", async () => {
        const admin = await newUser();
        const email = `${uid("new")}@example.com`;
        const r = await post<Team>("/team/new", {
          team_alias: "Research",
          models: ["chat-a"],
          max_budget: 10,
          budget_duration: "7d",
          tpm_limit: 1000,
          rpm_limit: 20,
          metadata: { cost_center: 42 },
          tags: ["ml"],
          model_aliases: { fast: "chat-a" },
          team_member_permissions: ["/key/generate"],
          team_member_budget: 5,
          members_with_roles: [
            { role: "admin", user_id: admin },
            { role: "user", user_email: email },
          ],
        });
        expect(r.status).toBe(200);
        const t = r.body;
        expect(t.team_id).toMatch(/^[0-9a-f-]{36}$/);
        expect(t).toMatchObject({
          team_alias: "Research",
          models: ["chat-a"],
          max_budget: 10,
          spend: 0,
          blocked: false,
          tpm_limit: 1000,
          rpm_limit: 20,
          metadata: { cost_center: 42 },
          tags: ["ml"],
          model_aliases: { fast: "chat-a" },
          team_member_permissions: ["/key/generate"],
          team_member_budget: 5,
        });
        expect(Math.abs(Date.parse(t.budget_reset_at!) - (Date.now() + 7 * 86_400_000))).toBeLessThan(60_000);
        const created = t.members_with_roles.find((m) => m.user_email === email);
        expect(t.members_with_roles).toHaveLength(2);
        expect(t.members_with_roles.find((m) => m.user_id === admin)?.role).toBe("admin");
        expect(created?.role).toBe("user");
        // The spec's Team resource lists them as `members`, each with its role: the same list.
        expect((t as Team & { members?: Member[] }).members).toEqual(t.members_with_roles);
        // The e-mail member is a real user now, with the team's member budget.
        const user = await get<{ user_info: { user_email: string; user_role: string } }>(`/user/info?user_id=${created!.user_id}`);
        expect(user.body.user_info).toMatchObject({ user_email: email, user_role: "internal_user" });
        const ti = await info(t.team_id);
        expect(ti.body.team_memberships.find((m) => m.user_id === created!.user_id)?.max_budget_in_team).toBe(5);
      });

      test("a chosen team_id is kept; taking it again is 400", async () => {
        const id = uid("team");
        expect((await newTeam({ team_id: id })).team_id).toBe(id);
        const again = await post<ErrorBody>("/team/new", { team_id: id });
        expect(again.status).toBe(400);
        expect(again.body.error.message).toContain("already exists");
        expect(again.body.error.param).toBe("team_id");
      });

      test("budget_duration -1 on a team with a budget object: the team never resets (it does not take the budget's period)", async () => {
        const budgetId = uid("b30d");
        expect((await post("/budget/new", { budget_id: budgetId, budget_duration: "30d", max_budget: 5 })).status).toBe(200);
        const never = await newTeam({ budget_id: budgetId, budget_duration: "-1" });
        expect(never.budget_reset_at).toBeNull();
        const follows = await newTeam({ budget_id: budgetId });
        expect(Date.parse(String(follows.budget_reset_at))).toBeGreaterThan(Date.now() + 29 * 86_400_000);
      });

      test("bad input: member role → 422; unknown permission → 400; bad period → 400; a member twice → 400 and no team", async () => {
        expect((await post<ErrorBody>("/team/new", { members_with_roles: [{ role: "owner", user_id: "x" }] })).status).toBe(422);
        const perm = await post<ErrorBody>("/team/new", { team_member_permissions: ["/team/delete"] });
        expect(perm.status).toBe(400);
        expect(perm.body.error.param).toBe("team_member_permissions");
        expect((await post<ErrorBody>("/team/new", { budget_duration: "fortnight" })).status).toBe(400);
        const u = await newUser();
        const id = uid("dupmember");
        const twice = await post<ErrorBody>("/team/new", { team_id: id, members_with_roles: [{ role: "user", user_id: u }, { role: "admin", user_id: u }] });
        expect(twice.status).toBe(400);
        expect(twice.body.error.type).toBe("team_member_already_in_team");
        expect((await info(id)).status).toBe(404);
        expect((await post<ErrorBody>("/team/new", { members_with_roles: [{ role: "user" }] })).status).toBe(400);
      });

      test("team_member_budget_duration (a period members' team budgets never get) is a 400 naming it, nothing stored; null is taken", async () => {
        const id = uid("memberperiod");
        for (const body of [{ team_member_budget_duration: "2s" }, { member_settings: { team_member_budget: 1, team_member_budget_duration: "1d" } }]) {
          const made = await post<ErrorBody>("/team/new", { team_id: id, team_member_budget: 0.5, ...body });
          expect(made.status).toBe(400);
          expect(made.body.error.param).toBe("team_member_budget_duration");
          expect(made.body.error.message).toContain("not supported");
        }
        expect((await info(id)).status).toBe(404);
        const t = await newTeam({ team_member_budget: 0.5, team_member_budget_duration: null });
        const update = await post<ErrorBody>("/team/update", { team_id: t.team_id, team_member_budget_duration: "30d" });
        expect(update.status).toBe(400);
        expect(update.body.error.param).toBe("team_member_budget_duration");
        const after = (await info(t.team_id)).body.team_info as Team & Json;
        expect(after.team_member_budget_duration).toBeNull();
        expect(after.team_member_budget).toBe(0.5);
      });

      test("member defaults nested in member_settings are checked as the top-level fields are: a 422 naming the field, nothing stored, and members can still be added", async () => {
        const id = uid("badsettings");
        const bad: [Json, string, string][] = [
          [{ team_member_rpm_limit: 1.5 }, "member_settings.team_member_rpm_limit", "Expected integer"],
          [{ team_member_tpm_limit: -3 }, "member_settings.team_member_tpm_limit", "greater or equal to 0"],
          [{ team_member_budget: -5 }, "member_settings.team_member_budget", "greater or equal to 0"],
          [{ team_member_rpm_limit: "abc" }, "member_settings.team_member_rpm_limit", ""],
          [{ team_member_budget: "5" }, "member_settings.team_member_budget", ""],
          [{ team_member_key_duration: 3600 }, "member_settings.team_member_key_duration", ""],
        ];
        for (const [settings, field, text] of bad) {
          const made = await post<ErrorBody>("/team/new", { team_id: id, member_settings: settings });
          expect([made.status, made.body.error?.param]).toEqual([422, field]);
          expect(made.body.error.message).toContain(text);
        }
        expect((await info(id)).status).toBe(404);
        const top = await post<ErrorBody>("/team/new", { team_id: id, team_member_tpm_limit: 2.5 });
        expect([top.status, top.body.error?.param]).toEqual([422, "team_member_tpm_limit"]);
        const t = await newTeam({ member_settings: { team_member_rpm_limit: 2, team_member_budget: 4 } });
        for (const [settings, field] of bad) {
          const updated = await post<ErrorBody>("/team/update", { team_id: t.team_id, member_settings: settings });
          expect([updated.status, updated.body.error?.param]).toEqual([422, field]);
        }
        expect((await info(t.team_id)).body.team_info).toMatchObject({ team_member_rpm_limit: 2, team_member_budget: 4, team_member_tpm_limit: null });
        // Every way of adding a member still works, with the defaults as stored.
        const one = await post<MemberAddReply>("/team/member_add", { team_id: t.team_id, member: { role: "user", user_id: uid("m") } });
        expect(one.status).toBe(200);
        expect(one.body.updated_team_memberships).toMatchObject([{ rpm_limit: 2, max_budget_in_team: 4, tpm_limit: null }]);
        expect((await post("/team/member_add", { team_id: t.team_id, member_email: `${uid("m")}@example.com`, role: "user" })).status).toBe(200);
        expect((await post<{ successful_additions: number }>("/team/bulk_member_add", { team_id: t.team_id, members: [{ role: "user", user_id: uid("m") }] })).body.successful_additions).toBe(1);
        // A default stored before these checks is not applied, rather than failing every admission.
        await gw.host!.store.db.update(teams).set({ memberSettings: { team_member_rpm_limit: 1.5, team_member_budget: -5 } }).where(eq(teams.teamId, t.team_id));
        await gw.host!.services.bus!.publish({ kind: "team", teamId: t.team_id });
        const old = await post<MemberAddReply>("/team/member_add", { team_id: t.team_id, member: { role: "user", user_id: uid("m") } });
        expect(old.status).toBe(200);
        expect(old.body.updated_team_memberships).toMatchObject([{ rpm_limit: null, max_budget_in_team: null }]);
      });

      test("model_max_budget (which no call is checked against on a team) is a 400 naming it, by /team/new and /team/update, nothing stored; null is taken", async () => {
        const id = uid("permodel");
        for (const value of [{ "chat-a": { budget_limit: 1e-7, time_period: "1d" } }, { "chat-a": { max_budget: "lots", budget_duration: "forever" } }, "x"]) {
          const made = await post<ErrorBody>("/team/new", { team_id: id, model_max_budget: value });
          expect([made.status, made.body.error.param]).toEqual([400, "model_max_budget"]);
          expect(made.body.error.message).toContain("model_max_budget is not enforced on a team");
        }
        expect((await info(id)).status).toBe(404);
        const t = await newTeam({ model_max_budget: null });
        const update = await post<ErrorBody>("/team/update", { team_id: t.team_id, model_max_budget: { "chat-a": { budget_limit: 1 } } });
        expect([update.status, update.body.error.param]).toEqual([400, "model_max_budget"]);
        expect(((await info(t.team_id)).body.team_info as Team & Json).model_max_budget).toBeNull();
        expect((await post("/team/update", { team_id: t.team_id, model_max_budget: null })).status).toBe(200);
      });

      test("inside an organization: it must exist, models within the org's, max_budget at most the org's", async () => {
        const o = await org({ models: ["chat-a", "chat-b"], maxBudget: "100" });
        const missing = await post<ErrorBody>("/team/new", { organization_id: "no-such-org" });
        expect(missing.status).toBe(400);
        expect(missing.body.error.param).toBe("organization_id");
        const outside = await post<ErrorBody>("/team/new", { organization_id: o, models: ["chat-a", "chat-c"] });
        expect(outside.status).toBe(400);
        expect(outside.body.error.message).toContain("chat-c");
        const over = await post<ErrorBody>("/team/new", { organization_id: o, max_budget: 100.5 });
        expect(over.status).toBe(400);
        expect(over.body.error.message).toContain("exceeds");
        const ok = await newTeam({ organization_id: o, models: ["chat-b"], max_budget: 100 });
        expect(ok).toMatchObject({ organization_id: o, models: ["chat-b"], max_budget: 100 });
        const wild = await org({ models: ["chat-*"] });
        expect((await newTeam({ organization_id: wild, models: ["chat-c"] })).models).toEqual(["chat-c"]);
      });
      test('organization_id "" and budget_id "" are ids that do not exist (400, as on keys), not stored as dangling references', async () => {
        const id = uid("empty-refs");
        for (const [field, body] of [["organization_id", { organization_id: "" }], ["budget_id", { budget_id: "" }]] as const) {
          const made = await post<ErrorBody>("/team/new", { team_id: id, ...body });
          expect([made.status, made.body.error?.param]).toEqual([400, field]);
          expect(made.body.error.message).toContain("does not exist");
        }
        expect((await info(id)).status).toBe(404);
        const t = await newTeam();
        for (const [field, body] of [["organization_id", { organization_id: "" }], ["budget_id", { budget_id: "" }]] as const) {
          const updated = await post<ErrorBody>("/team/update", { team_id: t.team_id, ...body });
          expect([updated.status, updated.body.error?.param]).toEqual([400, field]);
        }
        expect((await info(t.team_id)).body.team_info).toMatchObject({ organization_id: null });
        const listed = await get<Team[]>("/team/list?organization_id=default_organization");
        expect(listed.body.map((x) => x.team_id)).toContain(t.team_id);
      });
    });

    describe("/team/update", () => {
      test("answers {data: team}; explicit null clears; the org rules apply", async () => {
        const t = await newTeam({ team_alias: "Before", models: ["chat-a"], max_budget: 3, tags: ["x"], metadata: { a: 1 } });
        const r = await post<{ data: Team }>("/team/update", { team_id: t.team_id, team_alias: "After", rpm_limit: 5, budget_duration: "1d", team_member_budget: 2 });
        expect(r.status).toBe(200);
        expect(r.body.data).toMatchObject({ team_id: t.team_id, team_alias: "After", rpm_limit: 5, max_budget: 3, models: ["chat-a"], team_member_budget: 2 });
        expect(r.body.data.budget_reset_at).not.toBeNull();
        const cleared = await post<{ data: Team }>("/team/update", { team_id: t.team_id, team_alias: null, max_budget: null, models: null, tags: null, metadata: null, budget_duration: null, team_member_budget: null });
        expect(cleared.body.data).toMatchObject({ team_alias: null, max_budget: null, models: [], tags: [], metadata: {}, budget_duration: null, budget_reset_at: null, team_member_budget: null, rpm_limit: 5 });
        const o = await org({ models: ["chat-a"], maxBudget: "10" });
        expect((await post<ErrorBody>("/team/update", { team_id: t.team_id, organization_id: o, models: ["chat-b"] })).status).toBe(400);
        expect((await post<ErrorBody>("/team/update", { team_id: t.team_id, organization_id: o, max_budget: 11 })).status).toBe(400);
        const moved = await post<{ data: Team }>("/team/update", { team_id: t.team_id, organization_id: o, models: ["chat-a"], max_budget: 10 });
        expect(moved.body.data).toMatchObject({ organization_id: o, models: ["chat-a"], max_budget: 10 });
        expect((await post<ErrorBody>("/team/update", { team_id: "no-such-team", team_alias: "x" })).status).toBe(404);
        expect((await post<ErrorBody>("/team/update", { team_alias: "x" })).status).toBe(422);
      });

      test("model_aliases alone are checked against the team's organization, as on /team/new: a 400, and the team's keys keep their model", async () => {
        const o = await org({ models: ["chat-a"] });
        const refusedNew = await post<ErrorBody>("/team/new", { organization_id: o, models: ["chat-a"], model_aliases: { "chat-a": "chat-b" } });
        expect(refusedNew.status).toBe(400);
        const t = await newTeam({ organization_id: o, models: ["chat-a"] });
        const key = await keyFor(await newUser(), t.team_id);
        const r = await post<ErrorBody>("/team/update", { team_id: t.team_id, model_aliases: { "chat-a": "chat-b" } });
        expect([r.status, r.body.error?.param]).toEqual([400, "model_aliases"]);
        expect(r.body.error.message).toContain(`organization ${o}`);
        expect((await info(t.team_id)).body.team_info.model_aliases).toEqual({});
        expect((await modelCall(key, "chat-a")).status).toBe(200);
        // Aliases to what the org allows are taken.
        expect((await post("/team/update", { team_id: t.team_id, model_aliases: { fast: "chat-a" } })).status).toBe(200);
        expect((await post("/team/update", { team_id: t.team_id, models: ["chat-a"] })).status).toBe(200);
      });

      test("a team's new model list applies to its keys on the next request", async () => {
        const t = await newTeam({ models: ["chat-a"] });
        const key = await keyFor(await newUser(), t.team_id);
        expect(await modelCall(key, "chat-b")).toMatchObject({ status: 401, type: "team_model_access_denied" });
        expect((await post("/team/update", { team_id: t.team_id, models: ["chat-a", "chat-b"] })).status).toBe(200);
        expect((await modelCall(key, "chat-b")).status).toBe(200);
      });
    });

    describe("/team/info and the lists", () => {
      test("/team/info: team_info with members, keys by hash (never plaintext), memberships; 404 for admins", async () => {
        const t = await newTeam({ team_alias: "Info" });
        const m = await memberKey(t.team_id, "user");
        const r = await info(t.team_id);
        expect(r.status).toBe(200);
        expect(r.body.team_id).toBe(t.team_id);
        expect(r.body.team_info).toMatchObject({
          team_id: t.team_id,
          team_alias: "Info",
          members_with_roles: [{ user_id: m.userId, role: "user" }],
          members: [{ user_id: m.userId, role: "user" }],
        });
        expect(r.body.keys.map((k) => k.token)).toEqual([sha256(m.key)]);
        expect(JSON.stringify(r.body)).not.toContain(m.key);
        expect(r.body.team_memberships).toMatchObject([{ team_id: t.team_id, user_id: m.userId, role: "user" }]);
        const missing = await info("no-such-team");
        expect(missing.status).toBe(404);
        // A required query parameter left out is a validation failure: 422 naming it (the spec's Conventions; LiteLLM's too).
        const unnamed = await get<ErrorBody>("/team/info");
        expect(unnamed.status).toBe(422);
        expect(unnamed.body.error).toMatchObject({ type: "validation_error", param: "team_id", code: "422" });
      });

      test("/team/list filters by user_id and organization_id (default_organization = none)", async () => {
        const o = await org({});
        const u = await newUser();
        const inOrg = await newTeam({ organization_id: o, members_with_roles: [{ role: "user", user_id: u }] });
        const noOrg = await newTeam({ members_with_roles: [{ role: "admin", user_id: u }] });
        const other = await newTeam({});
        const byUser = await get<(Team & { keys: unknown[]; team_memberships: Membership[] })[]>(`/team/list?user_id=${u}`);
        expect(byUser.status).toBe(200);
        expect(byUser.body.map((t) => t.team_id).sort()).toEqual([inOrg.team_id, noOrg.team_id].sort());
        expect(byUser.body[0]!.team_memberships.length).toBe(1);
        const byOrg = await get<Team[]>(`/team/list?organization_id=${o}`);
        expect(byOrg.body.map((t) => t.team_id)).toEqual([inOrg.team_id]);
        const none = await get<Team[]>("/team/list?organization_id=default_organization");
        const ids = none.body.map((t) => t.team_id);
        expect(ids).toContain(noOrg.team_id);
        expect(ids).toContain(other.team_id);
        expect(ids).not.toContain(inOrg.team_id);
      });

      test("/v2/team/list pages, filters, sorts and lists deleted teams with status=deleted", async () => {
        const tag = uid("v2");
        const made: Team[] = [];
        for (const suffix of ["b", "a", "c"]) made.push(await newTeam({ team_id: `${tag}-${suffix}`, team_alias: `${tag} Alias ${suffix.toUpperCase()}` }));
        const first = await get<TeamPage>(`/v2/team/list?team_alias=${tag}%20alias&page_size=2`);
        expect(first.status).toBe(200);
        expect(first.body).toMatchObject({ total: 3, page: 1, page_size: 2, total_pages: 2 });
        // Default order: created_at ascending.
        expect(first.body.teams.map((t) => t.team_id)).toEqual([`${tag}-b`, `${tag}-a`]);
        const second = await get<TeamPage>(`/v2/team/list?team_alias=${tag}&page_size=2&page=2`);
        expect(second.body.teams.map((t) => t.team_id)).toEqual([`${tag}-c`]);
        const sorted = await get<TeamPage>(`/v2/team/list?team_alias=${tag}&sort_by=team_id&sort_order=desc`);
        expect(sorted.body.teams.map((t) => t.team_id)).toEqual([`${tag}-c`, `${tag}-b`, `${tag}-a`]);
        const exact = await get<TeamPage>(`/v2/team/list?team_id=${tag}-a`);
        expect(exact.body.teams.map((t) => t.team_id)).toEqual([`${tag}-a`]);
        expect((await get<TeamPage>(`/v2/team/list?team_id=${tag}`)).body.total).toBe(0);
        const defaults = await get<TeamPage>("/v2/team/list");
        expect(defaults.body.page_size).toBe(10);
        expect(defaults.body.teams.length).toBeLessThanOrEqual(10);

        expect((await post("/team/delete", { team_ids: [`${tag}-a`] })).status).toBe(200);
        const live = await get<TeamPage>(`/v2/team/list?team_alias=${tag}`);
        expect(live.body.teams.map((t) => t.team_id).sort()).toEqual([`${tag}-b`, `${tag}-c`]);
        const deleted = await get<TeamPage>(`/v2/team/list?team_alias=${tag}&status=deleted`);
        expect(deleted.body.teams.map((t) => t.team_id)).toEqual([`${tag}-a`]);
        expect(deleted.body.teams[0]!.deleted_at).not.toBeNull();

        for (const bad of ["page_size=101", "page=0", "sort_by=secret", "sort_order=up", "status=gone"]) {
          expect((await get<ErrorBody>(`/v2/team/list?${bad}`)).status).toBe(422);
        }
      });

      test("/team/available lists the live teams", async () => {
        const t = await newTeam({});
        const gone = await newTeam({});
        await post("/team/delete", { team_ids: [gone.team_id] });
        const r = await get<Team[]>("/team/available");
        expect(r.status).toBe(200);
        const ids = r.body.map((x) => x.team_id);
        expect(ids).toContain(t.team_id);
        expect(ids).not.toContain(gone.team_id);
      });
    });

    describe("block, unblock, delete: the team's keys follow on the next request", () => {
      test("blocking stops every key of the team at once; unblocking restores them", async () => {
        const t = await newTeam({});
        const k1 = await keyFor(await newUser(), t.team_id);
        const k2 = await keyFor(await newUser(), t.team_id);
        const outsider = await keyFor(await newUser());
        expect((await modelCall(k1)).status).toBe(200);
        const blocked = await post<Team>("/team/block", { team_id: t.team_id });
        expect(blocked.status).toBe(200);
        expect(blocked.body).toMatchObject({ team_id: t.team_id, blocked: true });
        const refused = await modelCall(k1);
        expect(refused.status).toBe(401);
        expect(refused.message).toContain("blocked");
        expect((await modelCall(k2)).status).toBe(401);
        expect((await modelCall(outsider)).status).toBe(200);
        const unblocked = await post<Team>("/team/unblock", { team_id: t.team_id });
        expect(unblocked.body.blocked).toBe(false);
        expect((await modelCall(k1)).status).toBe(200);
        expect((await modelCall(k2)).status).toBe(200);
        expect((await post("/team/block", { team_id: "no-such-team" })).status).toBe(404);
        expect((await post("/team/block", {})).status).toBe(422);
      });

      test("deleting a team deletes its keys (401), its memberships, and lists it as deleted", async () => {
        const u = await newUser();
        const t = await newTeam({ members_with_roles: [{ role: "admin", user_id: u }] });
        const t2 = await newTeam({});
        const key = await keyFor(u, t.team_id);
        const other = await keyFor(u, t2.team_id);
        expect((await modelCall(key)).status).toBe(200);
        const r = await post<{ deleted_teams: string[]; deleted_keys: string[] }>("/team/delete", { team_ids: [t.team_id] });
        expect(r.status).toBe(200);
        expect(r.body).toEqual({ deleted_teams: [t.team_id], deleted_keys: [sha256(key)] });
        expect((await modelCall(key)).status).toBe(401);
        expect((await modelCall(other)).status).toBe(200);
        expect((await info(t.team_id)).status).toBe(404);
        // The admin membership ended with the team.
        const user = await get<{ user_info: { teams: string[] }; teams: unknown[] }>(`/user/info?user_id=${u}`);
        expect(user.body.teams).toEqual([]);
        expect(user.body.user_info.teams).toEqual([]);
        const again = await post<ErrorBody>("/team/delete", { team_ids: [t.team_id] });
        expect(again.status).toBe(404);
        const mixed = await post<ErrorBody>("/team/delete", { team_ids: [t2.team_id, "no-such-team"] });
        expect(mixed.status).toBe(404);
        expect((await info(t2.team_id)).status).toBe(200);
        expect((await post("/team/delete", { team_ids: [] })).status).toBe(422);
      });
    });

    describe("members", () => {
      test("/team/member_add: the member form (one or a list) and the member_email form; users created when missing", async () => {
        const t = await newTeam({ team_member_budget: 7 });
        const existing = await newUser();
        const email = `${uid("m")}@example.com`;
        const one = await post<MemberAddReply>("/team/member_add", { team_id: t.team_id, member: { role: "admin", user_id: existing }, max_budget_in_team: 3 });
        expect(one.status).toBe(200);
        expect(one.body.team_id).toBe(t.team_id);
        expect(one.body.members_with_roles).toMatchObject([{ user_id: existing, role: "admin" }]);
        expect(one.body.updated_users.map((u) => u.user_id)).toEqual([existing]);
        expect(one.body.updated_team_memberships).toMatchObject([{ user_id: existing, role: "admin", max_budget_in_team: 3 }]);
        const list = await post<MemberAddReply>("/team/member_add", { team_id: t.team_id, member: [{ role: "user", user_email: email }, { role: "user", user_id: uid("fresh") }] });
        expect(list.status).toBe(200);
        expect(list.body.members_with_roles).toHaveLength(3);
        expect(list.body.updated_users[0]).toMatchObject({ user_email: email, user_role: "internal_user" });
        // No max_budget_in_team given: the team's member budget applies.
        expect(list.body.updated_team_memberships.map((m) => m.max_budget_in_team)).toEqual([7, 7]);
        const email2 = `${uid("m2")}@example.com`;
        const teamKeyForm = await post<MemberAddReply>("/team/member_add", { team_id: t.team_id, member_email: email2, role: "admin" });
        expect(teamKeyForm.status).toBe(200);
        expect(teamKeyForm.body.members_with_roles.find((m) => m.user_email === email2)?.role).toBe("admin");
      });

      test("the same team, user or member created by five requests at once: one succeeds, the others get the duplicate's 400, none a 500", async () => {
        const statuses = async (calls: Promise<{ status: number; body: unknown }>[]) => (await Promise.all(calls)).map((r) => r.status).sort();
        const teamId = uid("race-team");
        expect(await statuses(Array.from({ length: 5 }, () => post("/team/new", { team_id: teamId })))).toEqual([200, 400, 400, 400, 400]);
        const userId = uid("race-user");
        expect(await statuses(Array.from({ length: 5 }, () => post("/user/new", { user_id: userId, auto_create_key: false })))).toEqual([200, 400, 400, 400, 400]);
        const member = uid("race-member");
        expect(await statuses(Array.from({ length: 5 }, () => post("/team/member_add", { team_id: teamId, member: { role: "user", user_id: member } })))).toEqual([200, 400, 400, 400, 400]);
        const t = await get<{ team_info: { members_with_roles: { user_id: string }[] } }>(`/team/info?team_id=${teamId}`);
        expect(t.body.team_info.members_with_roles.map((m) => m.user_id)).toEqual([member]);
        // By e-mail: one user for one address, however many requests name it at once.
        const email = `${uid("race")}@example.com`;
        expect(await statuses(Array.from({ length: 5 }, () => post("/team/member_add", { team_id: teamId, member: { role: "user", user_email: email } })))).toEqual([200, 400, 400, 400, 400]);
        expect(await statuses(Array.from({ length: 5 }, (_, i) => post("/user/new", { user_id: uid(`race-mail-${i}`), user_email: `new-${email}`, auto_create_key: false })))).toEqual([200, 400, 400, 400, 400]);
        for (const address of [email, `new-${email}`]) {
          expect(await gw.host!.store.db.select({ id: users.userId }).from(users).where(eq(users.userEmail, address))).toHaveLength(1);
        }
      });

      test("team_member_key_duration: a key generated in the team without a duration expires after it; an explicit duration wins", async () => {
        const t = await newTeam({ team_member_key_duration: "1h" });
        const before = Date.now();
        const k = await post<{ expires: string | null; duration: string | null }>("/key/generate", { team_id: t.team_id });
        expect(k.status).toBe(200);
        expect(k.body.duration).toBe("1h");
        const expires = Date.parse(k.body.expires!);
        expect(expires).toBeGreaterThanOrEqual(before + 3600_000 - 1000);
        expect(expires).toBeLessThanOrEqual(Date.now() + 3600_000 + 1000);
        // An explicit null is "not set" (clients that send every field): the team's duration still applies.
        const sentNull = await post<{ expires: string | null }>("/key/generate", { team_id: t.team_id, duration: null });
        expect(Date.parse(sentNull.body.expires!)).toBeGreaterThanOrEqual(before + 3600_000 - 1000);
        const own = await post<{ expires: string | null }>("/key/generate", { team_id: t.team_id, duration: "-1" });
        expect(own.body.expires).toBeNull();
        const elsewhere = await post<{ expires: string | null }>("/key/generate", {});
        expect(elsewhere.body.expires).toBeNull();
      });

      test("/team/member_add: an existing member is 400 team_member_already_in_team and nothing is added", async () => {
        const email = `${uid("d")}@example.com`;
        const u = await newUser({ user_email: email });
        const t = await newTeam({ members_with_roles: [{ role: "user", user_id: u }] });
        const fresh = uid("fresh");
        const r = await post<ErrorBody>("/team/member_add", { team_id: t.team_id, member: [{ role: "user", user_id: fresh }, { role: "admin", user_id: u }] });
        expect(r.status).toBe(400);
        expect(r.body.error.type).toBe("team_member_already_in_team");
        const ti = await info(t.team_id);
        expect(ti.body.team_info.members_with_roles.map((m) => m.user_id)).toEqual([u]);
        expect((await get(`/user/info?user_id=${fresh}`)).status).toBe(404);
        expect((await post<ErrorBody>("/team/member_add", { team_id: t.team_id })).status).toBe(400);
        // A new id with someone else's e-mail is a conflict, not a silent swap to that user.
        const clash = await post<ErrorBody>("/team/member_add", { team_id: t.team_id, member: { role: "user", user_id: uid("n"), user_email: email.toUpperCase() } });
        expect(clash.status).toBe(400);
        expect(clash.body.error.message).toContain(u);
        expect((await post<ErrorBody>("/team/member_add", { team_id: "no-such-team", member: { role: "user", user_id: u } })).status).toBe(404);
      });

      test("a member's budget with more than 12 decimals is a 400 naming it, as max_budget is; 12 are kept exactly", async () => {
        const t = await newTeam({});
        const u = await newUser();
        const tooFine: [string, Json, string][] = [
          ["/team/member_add", { team_id: t.team_id, member: { role: "user", user_id: u }, max_budget_in_team: 0.0000000000004 }, "max_budget_in_team"],
          ["/team/member_add", { team_id: t.team_id, member_email: `${uid("fine")}@x.io`, role: "user", max_budget_in_team: 2.1234567890123 }, "max_budget_in_team"],
          ["/team/bulk_member_add", { team_id: t.team_id, members: [{ role: "user", user_id: u }], max_budget_in_team: 1e-13 }, "max_budget_in_team"],
          ["/user/new", { user_id: uid("u"), auto_create_key: false, teams: [{ team_id: t.team_id, max_budget_in_team: 2.1234567890123 }] }, "max_budget_in_team"],
          ["/team/update", { team_id: t.team_id, team_member_budget: 0.0000000000004 }, "team_member_budget"],
          ["/team/new", { member_settings: { team_member_budget: 2.1234567890123 } }, "team_member_budget"],
        ];
        for (const [path, body, field] of tooFine) {
          const r = await post<ErrorBody>(path, body);
          expect([path, r.status, r.body.error?.param]).toEqual([path, 400, field]);
          expect(r.body.error.message).toContain("more than 12 decimals");
        }
        expect((await info(t.team_id)).body.team_info.members_with_roles).toEqual([]);
        expect((await post("/team/member_add", { team_id: t.team_id, member: { role: "user", user_id: u }, max_budget_in_team: 0.000000000001 })).status).toBe(200);
        const update = await post<ErrorBody>("/team/member_update", { team_id: t.team_id, user_id: u, max_budget_in_team: 2.1234567890123 });
        expect([update.status, update.body.error?.param]).toEqual([400, "max_budget_in_team"]);
        const exact = await post<Json>("/team/member_update", { team_id: t.team_id, user_id: u, max_budget_in_team: 2.123456789012 });
        expect(exact.body.max_budget_in_team).toBe(2.123456789012);
      });

      test("/team/member_update changes role and member limits; the role counts at once", async () => {
        const t = await newTeam({});
        const m = await memberKey(t.team_id, "user", { user_email: `${uid("up")}@example.com` });
        expect((await post("/team/member_add", { team_id: t.team_id, member: { role: "user", user_id: uid("x") } }, m.key)).status).toBe(403);
        const r = await post<Json>("/team/member_update", { team_id: t.team_id, user_id: m.userId, role: "admin", max_budget_in_team: 9, tpm_limit: 100, rpm_limit: 10 });
        expect(r.status).toBe(200);
        expect(r.body).toMatchObject({ team_id: t.team_id, user_id: m.userId, role: "admin", max_budget_in_team: 9, tpm_limit: 100, rpm_limit: 10 });
        expect(r.body.user_email).toContain("@example.com");
        // Promoted: the member's key now manages the team.
        expect((await post("/team/member_add", { team_id: t.team_id, member: { role: "user", user_id: uid("y") } }, m.key)).status).toBe(200);
        const cleared = await post<Json>("/team/member_update", { team_id: t.team_id, user_email: String(r.body.user_email), max_budget_in_team: null });
        expect(cleared.body).toMatchObject({ max_budget_in_team: null, role: "admin" });
        expect((await post("/team/member_update", { team_id: t.team_id, user_id: await newUser(), role: "admin" })).status).toBe(400);
        expect((await post("/team/member_update", { team_id: t.team_id, user_id: "no-such-user", role: "admin" })).status).toBe(400);
        expect((await post("/team/member_update", { team_id: t.team_id, user_id: m.userId, role: "owner" })).status).toBe(422);
      });

      test("/team/member_delete removes the member and its keys in the team; unknown or non-members are 400", async () => {
        const t = await newTeam({});
        const other = await newTeam({});
        const email = `${uid("del")}@example.com`;
        const m = await memberKey(t.team_id, "user", { user_email: email });
        const elsewhere = await keyFor(m.userId, other.team_id);
        expect((await modelCall(m.key)).status).toBe(200);
        const unknown = await post<ErrorBody>("/team/member_delete", { team_id: t.team_id, user_id: "no-such-user" });
        expect(unknown.status).toBe(400);
        expect(unknown.body.error.message).toContain("does not exist");
        const stranger = await post<ErrorBody>("/team/member_delete", { team_id: t.team_id, user_id: await newUser() });
        expect(stranger.status).toBe(400);
        expect(stranger.body.error.message).toContain("not a member");
        const r = await post<Team & { deleted_keys: string[] }>("/team/member_delete", { team_id: t.team_id, member_email: email });
        expect(r.status).toBe(200);
        expect(r.body.members_with_roles).toEqual([]);
        expect(r.body.deleted_keys).toEqual([sha256(m.key)]);
        expect((await modelCall(m.key)).status).toBe(401);
        expect((await modelCall(elsewhere)).status).toBe(200);
        expect((await post("/team/member_delete", { team_id: t.team_id, user_id: m.userId })).status).toBe(400);
        expect((await post("/team/member_delete", { team_id: t.team_id })).status).toBe(400);
      });

      test("/team/bulk_member_add reports per member; all_users adds everyone not yet in", async () => {
        const existing = await newUser();
        const t = await newTeam({ members_with_roles: [{ role: "user", user_id: existing }] });
        const email = `${uid("bulk")}@example.com`;
        const id = uid("bulk");
        const r = await post<{ team_id: string; results: { user_id: string | null; user_email: string | null; success: boolean; error: string | null }[]; total_requested: number; successful_additions: number; failed_additions: number; updated_team: Team }>(
          "/team/bulk_member_add",
          { team_id: t.team_id, members: [{ role: "user", user_id: existing }, { role: "user", user_email: email }, { role: "admin", user_id: id }], max_budget_in_team: 2 },
        );
        expect(r.status).toBe(200);
        expect(r.body).toMatchObject({ team_id: t.team_id, total_requested: 3, successful_additions: 2, failed_additions: 1 });
        expect(r.body.results[0]).toMatchObject({ user_id: existing, success: false });
        expect(r.body.results[0]!.error).toContain("already a member");
        expect(r.body.results[1]).toMatchObject({ user_email: email, success: true, error: null });
        expect(r.body.results[2]).toMatchObject({ user_id: id, success: true });
        expect(r.body.updated_team.members_with_roles).toHaveLength(3);
        const all = await post<{ successful_additions: number; failed_additions: number; updated_team: Team }>("/team/bulk_member_add", { team_id: t.team_id, all_users: true });
        expect(all.status).toBe(200);
        expect(all.body.failed_additions).toBe(0);
        const users = await get<{ total: number }>("/user/list");
        expect(all.body.updated_team.members_with_roles).toHaveLength(users.body.total);
        expect((await post("/team/bulk_member_add", { team_id: t.team_id })).status).toBe(400);
      });

      test("/team/bulk_member_add shows each added user as it now is, with its teams (this one included)", async () => {
        const first = await newTeam({});
        const u = await newUser();
        expect((await post("/team/member_add", { team_id: first.team_id, member: { role: "user", user_id: u } })).status).toBe(200);
        const t = await newTeam({});
        const fresh = uid("fresh");
        const r = await post<{ results: { user_id: string; success: boolean; updated_user: { user_id: string; teams: string[] } | null }[] }>("/team/bulk_member_add", {
          team_id: t.team_id,
          members: [{ role: "user", user_id: u }, { role: "user", user_id: fresh }, { role: "user", user_id: u }],
        });
        expect(r.status).toBe(200);
        expect(r.body.results.map((x) => x.success)).toEqual([true, true, false]);
        expect(r.body.results[0]!.updated_user!.teams.sort()).toEqual([first.team_id, t.team_id].sort());
        expect(r.body.results[1]!.updated_user).toMatchObject({ user_id: fresh, teams: [t.team_id] });
        expect(r.body.results[2]!.updated_user).toBeNull();
        const shown = await get<{ user_info: { teams: string[] } }>(`/user/info?user_id=${u}`);
        expect(r.body.results[0]!.updated_user!.teams.sort()).toEqual(shown.body.user_info.teams.sort());
      });
    });

    describe("permissions and models", () => {
      test("permissions_list defaults to /key/info and /key/health; permissions_update is checked against the choices", async () => {
        const t = await newTeam({});
        const r = await get<{ team_id: string; team_member_permissions: string[]; all_available_permissions: string[] }>(`/team/permissions_list?team_id=${t.team_id}`);
        expect(r.status).toBe(200);
        expect(r.body.team_member_permissions).toEqual(["/key/info", "/key/health"]);
        expect(r.body.all_available_permissions).toContain("/key/generate");
        expect(r.body.all_available_permissions).not.toContain("/team/delete");
        const bad = await post<ErrorBody>("/team/permissions_update", { team_id: t.team_id, team_member_permissions: ["/key/generate", "/user/new"] });
        expect(bad.status).toBe(400);
        expect(bad.body.error.message).toContain("/user/new");
        const ok = await post<Team>("/team/permissions_update", { team_id: t.team_id, team_member_permissions: ["/key/generate", "/key/info"] });
        expect(ok.status).toBe(200);
        expect(ok.body.team_member_permissions).toEqual(["/key/generate", "/key/info"]);
        const after = await get<{ team_member_permissions: string[] }>(`/team/permissions_list?team_id=${t.team_id}`);
        expect(after.body.team_member_permissions).toEqual(["/key/generate", "/key/info"]);
        expect((await get("/team/permissions_list?team_id=no-such-team")).status).toBe(404);
        const unnamed = await get<ErrorBody>("/team/permissions_list");
        expect(unnamed.status).toBe(422);
        expect(unnamed.body.error).toMatchObject({ type: "validation_error", param: "team_id", code: "422" });
      });

      test("a team `user` member's key gets only what the team's permissions grant", async () => {
        const t = await newTeam({});
        const m = await memberKey(t.team_id, "user");
        const other = await memberKey(t.team_id, "user");
        // Reads of its own team are fine; it sees its own keys and membership only.
        const seen = await info(t.team_id, m.key);
        expect(seen.status).toBe(200);
        expect(seen.body.keys.map((k) => k.token)).toEqual([sha256(m.key)]);
        expect(seen.body.team_memberships.map((x) => x.user_id)).toEqual([m.userId]);
        expect(seen.body.team_info.members_with_roles).toHaveLength(2);
        // Management of the team is not among the grantable permissions.
        expect((await post("/team/member_add", { team_id: t.team_id, member: { role: "user", user_id: uid("z") } }, m.key)).status).toBe(403);
        expect((await post("/team/member_delete", { team_id: t.team_id, user_id: other.userId }, m.key)).status).toBe(403);
        expect((await post("/team/model/add", { team_id: t.team_id, models: ["chat-b"] }, m.key)).status).toBe(403);
        expect((await get(`/team/permissions_list?team_id=${t.team_id}`, m.key)).status).toBe(403);
        // Key generation for the team only once the team grants it.
        expect((await post("/key/generate", { team_id: t.team_id }, m.key)).status).toBe(403);
        expect((await post("/team/permissions_update", { team_id: t.team_id, team_member_permissions: ["/key/generate"] })).status).toBe(200);
        const granted = await post<{ key: string; team_id: string; user_id: string }>("/key/generate", { team_id: t.team_id }, m.key);
        expect(granted.status).toBe(200);
        expect(granted.body).toMatchObject({ team_id: t.team_id, user_id: m.userId });
        expect((await post("/team/permissions_update", { team_id: t.team_id, team_member_permissions: ["/key/info"] })).status).toBe(200);
        expect((await post("/key/generate", { team_id: t.team_id }, m.key)).status).toBe(403);
      });

      test("/team/model/add and /team/model/delete change what the team's keys may call", async () => {
        const t = await newTeam({ models: ["chat-a"] });
        const key = await keyFor(await newUser(), t.team_id);
        expect((await modelCall(key, "chat-b")).status).toBe(401);
        const added = await post<Team>("/team/model/add", { team_id: t.team_id, models: ["chat-b", "chat-a"] });
        expect(added.status).toBe(200);
        expect(added.body.models).toEqual(["chat-a", "chat-b"]);
        expect((await modelCall(key, "chat-b")).status).toBe(200);
        const removed = await post<Team>("/team/model/delete", { team_id: t.team_id, models: ["chat-a"] });
        expect(removed.body.models).toEqual(["chat-b"]);
        expect(await modelCall(key, "chat-a")).toMatchObject({ status: 401, type: "team_model_access_denied" });
        // Emptying the list would mean "all models": refused.
        const last = await post<ErrorBody>("/team/model/delete", { team_id: t.team_id, models: ["chat-b"] });
        expect(last.status).toBe(400);
        expect((await modelCall(key, "chat-c")).status).toBe(401);
        expect((await post<ErrorBody>("/team/model/delete", { team_id: t.team_id, models: ["chat-c"] })).status).toBe(400);
        expect((await post<ErrorBody>("/team/model/add", { team_id: t.team_id, models: [] })).status).toBe(422);
        const o = await org({ models: ["chat-a", "chat-b"] });
        const inOrg = await newTeam({ organization_id: o, models: ["chat-a"] });
        const outside = await post<ErrorBody>("/team/model/add", { team_id: inOrg.team_id, models: ["chat-c"] });
        expect(outside.status).toBe(400);
        expect(outside.body.error.message).toContain("chat-c");
      });

      test("/team/model/delete of the last named model of a team that access_group_ids restrict is taken: the team keeps its groups' models only", async () => {
        const group = await post<{ access_group_id: string }>("/access_group/new", { access_group: uid("grp"), model_names: ["chat-b"] });
        const t = await newTeam({ models: ["chat-a"], access_group_ids: [group.body.access_group_id] });
        const admin = await memberKey(t.team_id, "admin");
        // A team admin's own call: before, a 400 saying the team would get every model.
        const removed = await post<Team>("/team/model/delete", { team_id: t.team_id, models: ["chat-a"] }, admin.key);
        expect(removed.status).toBe(200);
        expect(removed.body.models).toEqual([]);
        expect((await modelCall(admin.key, "chat-b")).status).toBe(200);
        expect(await modelCall(admin.key, "chat-a")).toMatchObject({ status: 401, type: "team_model_access_denied" });
        expect(await modelCall(admin.key, "chat-c")).toMatchObject({ status: 401, type: "team_model_access_denied" });
      });
    });

    describe("who may do what", () => {
      test("a team admin adding an existing user sees its membership of the team only, not its other teams, role or spend", async () => {
        const t = await newTeam();
        const elsewhere = await newTeam();
        const admin = await memberKey(t.team_id, "admin");
        const email = `${uid("known")}@example.com`;
        const known = await newUser({ user_email: email, user_role: "internal_user_viewer", spend: 12.5, max_budget: 100 });
        expect((await post("/team/member_add", { team_id: elsewhere.team_id, member: { role: "admin", user_id: known } })).status).toBe(200);
        const added = await call<MemberAddReply>("POST", "/team/member_add", { key: admin.key, body: { team_id: t.team_id, member: { role: "user", user_id: known } } });
        expect(added.status).toBe(200);
        expect(added.body.updated_users as unknown).toEqual([{ user_id: known, user_email: email, teams: [t.team_id] }]);
        expect(added.body.updated_team_memberships).toMatchObject([{ user_id: known, role: "user" }]);
        expect(JSON.stringify(added.body)).not.toContain(elsewhere.team_id);
        // A proxy admin sees the whole user.
        const third = await newTeam();
        const whole = await post<MemberAddReply>("/team/member_add", { team_id: third.team_id, member: { role: "user", user_id: known } });
        expect(whole.body.updated_users[0]).toMatchObject({ user_id: known, user_role: "internal_user_viewer", spend: 12.5, teams: [elsewhere.team_id, t.team_id, third.team_id] });
      });

      test("/key/list?expand=user shows a team admin the team's members as the team sees them, not their whole user rows", async () => {
        const t = await newTeam();
        const admin = await memberKey(t.team_id, "admin");
        const email = `${uid("victim")}@example.com`;
        const victim = await memberKey(t.team_id, "user", { user_email: email, max_budget: 999, spend: 123.45, metadata: { salary: "private" } });
        const listed = await get<{ keys: { user_id: string; user: Json | null }[] }>(`/key/list?team_id=${t.team_id}&expand=user`, admin.key);
        expect(listed.status).toBe(200);
        const users = Object.fromEntries(listed.body.keys.map((k) => [k.user_id, k.user]));
        expect(users[victim.userId]).toEqual({ user_id: victim.userId, user_email: email, teams: [t.team_id] });
        expect(JSON.stringify(listed.body)).not.toContain("private");
        // Its own user, and every user to a proxy admin, whole.
        expect(users[admin.userId]).toMatchObject({ user_id: admin.userId, user_role: "internal_user" });
        const whole = await get<{ keys: { user_id: string; user: Json | null }[] }>(`/key/list?team_id=${t.team_id}&expand=user`);
        expect(whole.body.keys.find((k) => k.user_id === victim.userId)?.user).toMatchObject({ spend: 123.45, max_budget: 999, metadata: { salary: "private" } });
      });

      test("a Team Management Key runs its own team's members, models and info, and nothing of another team", async () => {
        const t1 = await newTeam({ team_alias: "T1", models: ["chat-a"] });
        const t2 = await newTeam({ team_alias: "T2" });
        // The recipe: create user U, add U as admin of T1, generate a key for U in T1.
        const u = await newUser();
        expect((await post("/team/member_add", { team_id: t1.team_id, member: { role: "admin", user_id: u } })).status).toBe(200);
        const tmk = await keyFor(u, t1.team_id);

        const email = `${uid("tmk")}@example.com`;
        const added = await post<MemberAddReply>("/team/member_add", { team_id: t1.team_id, member_email: email, role: "user" }, tmk);
        expect(added.status).toBe(200);
        const newcomer = added.body.updated_users[0]!.user_id;
        expect((await post("/team/member_update", { team_id: t1.team_id, user_id: newcomer, max_budget_in_team: 4 }, tmk)).status).toBe(200);
        expect((await post("/team/model/add", { team_id: t1.team_id, models: ["chat-b"] }, tmk)).status).toBe(200);
        expect((await post("/team/model/delete", { team_id: t1.team_id, models: ["chat-a"] }, tmk)).status).toBe(200);
        const own = await info(t1.team_id, tmk);
        expect(own.status).toBe(200);
        expect(own.body.team_info.models).toEqual(["chat-b"]);
        expect(own.body.team_memberships).toHaveLength(2);
        expect((await post("/team/member_delete", { team_id: t1.team_id, user_id: newcomer }, tmk)).status).toBe(200);

        // Another team, existing or not: the same 403, so nothing leaks about which teams exist.
        const ghost = "no-such-team";
        const attempts: [string, string, (id: string) => unknown][] = [
          ["POST", "/team/member_add", (id) => ({ team_id: id, member: { role: "user", user_id: u } })],
          ["POST", "/team/member_delete", (id) => ({ team_id: id, user_id: u })],
          ["POST", "/team/member_update", (id) => ({ team_id: id, user_id: u, role: "admin" })],
          ["POST", "/team/model/add", (id) => ({ team_id: id, models: ["chat-c"] })],
          ["POST", "/team/model/delete", (id) => ({ team_id: id, models: ["chat-c"] })],
          ["GET", "/team/info", () => undefined],
        ];
        for (const [method, path, body] of attempts) {
          const replies: Reply<ErrorBody>[] = [];
          for (const id of [t2.team_id, ghost]) {
            const url = method === "GET" ? `${path}?team_id=${id}` : path;
            replies.push(await call<ErrorBody>(method, url, { key: tmk, body: body(id) }));
          }
          expect(replies.map((r) => r.status)).toEqual([403, 403]);
          expect(replies[0]!.body.error.message.replace(t2.team_id, "ID")).toBe(replies[1]!.body.error.message.replace(ghost, "ID"));
        }
        expect((await info(t2.team_id)).body.team_info.members_with_roles).toEqual([]);
        expect((await info(t2.team_id)).body.team_info.models).toEqual([]);

        // Global Admin Only routes, even on its own team.
        const globalOnly: [string, string, unknown][] = [
          ["POST", "/team/new", { team_alias: "mine" }],
          ["POST", "/team/delete", { team_ids: [t1.team_id] }],
          ["POST", "/team/delete", { team_ids: [t2.team_id] }],
          ["POST", "/team/update", { team_id: t1.team_id, max_budget: 1e9 }],
          ["POST", "/team/block", { team_id: t1.team_id }],
          ["POST", "/team/unblock", { team_id: t1.team_id }],
          ["POST", "/team/bulk_member_add", { team_id: t1.team_id, all_users: true }],
          ["POST", "/team/permissions_update", { team_id: t1.team_id, team_member_permissions: ["/key/generate"] }],
          ["GET", `/team/permissions_list?team_id=${t1.team_id}`, undefined],
          ["GET", "/team/list", undefined],
          ["GET", "/v2/team/list", undefined],
          ["GET", "/team/available", undefined],
        ];
        for (const [method, path, body] of globalOnly) {
          const r = await call<ErrorBody>(method, path, { key: tmk, body });
          expect({ path, status: r.status }).toEqual({ path, status: 403 });
        }
        expect((await info(t1.team_id)).status).toBe(200);
        expect((await modelCall(tmk, "chat-b")).status).toBe(200);

        // Demoted: the rights end with the very next request.
        expect((await post("/team/member_update", { team_id: t1.team_id, user_id: u, role: "user" })).status).toBe(200);
        expect((await post("/team/member_add", { team_id: t1.team_id, member: { role: "user", user_id: uid("late") } }, tmk)).status).toBe(403);
      });

      test("a team admin demoted or removed in the store while this instance's cache still says admin gets no further write", async () => {
        // What another instance's /team/member_update or /team/member_delete looks like here until
        // its change arrives (and, on one instance, the moment between its commit and the cache's
        // reload): the store says user (or nothing), the cache still says admin.
        const db = gw.host!.store.db;
        const cached = (teamId: string, userId: string) => gw.host!.services.identity!.teamMembers.get(teamId)?.get(userId);
        const https = { callbacks: [{ callback_type: "webhook", url: "https://hooks.example.com/in" }] };
        for (const change of ["demoted", "removed"] as const) {
          const t = await newTeam({ team_alias: `stale-${change}`, models: ["chat-a"] });
          const admin = await memberKey(t.team_id, "admin");
          const member = await memberKey(t.team_id, "user");
          const where = and(eq(teamMembers.teamId, t.team_id), eq(teamMembers.userId, admin.userId));
          if (change === "demoted") await db.update(teamMembers).set({ role: "user" }).where(where);
          else await db.delete(teamMembers).where(where);
          expect(cached(t.team_id, admin.userId)).toBe("admin");
          const writes: [string, unknown][] = [
            ["/key/generate", { team_id: t.team_id }],
            ["/key/generate", { team_id: t.team_id, user_id: member.userId }],
            ["/key/update", { key: member.key, max_budget: 100 }],
            ["/key/block", { key: member.key }],
            ["/key/delete", { keys: [member.key] }],
            ["/team/member_add", { team_id: t.team_id, member: { role: "admin", user_id: uid("late") } }],
            ["/team/member_update", { team_id: t.team_id, user_id: member.userId, role: "admin" }],
            ["/team/member_delete", { team_id: t.team_id, user_id: member.userId }],
            ["/team/model/add", { team_id: t.team_id, models: ["chat-b"] }],
            [`/team/${t.team_id}/callback`, https],
            [`/team/${t.team_id}/disable_logging`, {}],
          ];
          for (const [path, body] of writes) {
            const r = await post<ErrorBody>(path, body, admin.key);
            expect({ change, path, status: r.status, type: r.body.error?.type, code: r.body.error?.code }).toEqual({ change, path, status: 403, type: "permission_error", code: "403" });
            expect(r.body.error.message).toContain(`team ${t.team_id}`);
          }
          // Nothing was written: the member, its key and the team are as they were.
          const after = await info(t.team_id);
          expect(after.body.team_info.models).toEqual(["chat-a"]);
          expect(after.body.team_info.members_with_roles.map((m) => m.user_id).sort()).toEqual((change === "demoted" ? [admin.userId, member.userId] : [member.userId]).sort());
          expect(after.body.team_memberships.find((m) => m.user_id === admin.userId)?.role).toBe(change === "demoted" ? "user" : undefined);
          expect(after.body.keys.map((k) => k.user_id).sort()).toEqual([admin.userId, member.userId].sort());
          expect(after.body.keys.find((k) => k.user_id === member.userId)).toMatchObject({ blocked: false, max_budget: null });
          expect((await modelCall(member.key)).status).toBe(200);
        }
      });

      test("viewers read every team and write none; plain keys read none", async () => {
        const t = await newTeam({});
        const viewer = await keyFor(await newUser({ user_role: "proxy_admin_viewer" }));
        const plain = await keyFor(await newUser());
        expect((await info(t.team_id, viewer)).status).toBe(200);
        expect((await get("/team/list", viewer)).status).toBe(200);
        expect((await get("/v2/team/list", viewer)).status).toBe(200);
        expect((await get(`/team/permissions_list?team_id=${t.team_id}`, viewer)).status).toBe(200);
        for (const [path, body] of [
          ["/team/new", {}],
          ["/team/block", { team_id: t.team_id }],
          ["/team/member_add", { team_id: t.team_id, member: { role: "user", user_id: "v" } }],
          ["/team/model/add", { team_id: t.team_id, models: ["chat-a"] }],
        ] as const) {
          expect((await post(path, body, viewer)).status).toBe(403);
        }
        expect((await info(t.team_id, plain)).status).toBe(403);
        expect((await info("no-such-team", plain)).status).toBe(403);
        expect((await get("/team/list", plain)).status).toBe(403);
        expect((await post("/team/new", {}, plain)).status).toBe(403);
      });
    });

    test("every team write leaves an audit row naming the svc-changed-by actor", async () => {
      const h = { "svc-changed-by": "bob@ops" };
      const u = await newUser();
      const created = await post<Team>("/team/new", { team_alias: "audited" }, MASTER_KEY, h);
      const id = created.body.team_id;
      const calls: [string, unknown][] = [
        ["/team/update", { team_id: id, team_alias: "audited2" }],
        ["/team/block", { team_id: id }],
        ["/team/unblock", { team_id: id }],
        ["/team/member_add", { team_id: id, member: { role: "user", user_id: u } }],
        ["/team/member_update", { team_id: id, user_id: u, role: "admin" }],
        ["/team/permissions_update", { team_id: id, team_member_permissions: ["/key/info"] }],
        ["/team/model/add", { team_id: id, models: ["chat-a", "chat-b"] }],
        ["/team/model/delete", { team_id: id, models: ["chat-a"] }],
        ["/team/member_delete", { team_id: id, user_id: u }],
        ["/team/bulk_member_add", { team_id: id, members: [{ role: "user", user_id: u }] }],
        ["/team/delete", { team_ids: [id] }],
      ];
      for (const [path, body] of calls) expect({ path, status: (await post(path, body, MASTER_KEY, h)).status }).toEqual({ path, status: 200 });
      const teamRows = (await get<{ audit_logs: AuditRow[] }>(`/audit/logs?table_name=teams&object_id=${id}`)).body.audit_logs;
      expect(teamRows.map((r) => r.action).sort()).toEqual(["blocked", "created", "deleted", "unblocked", "updated", "updated", "updated", "updated"]);
      const memberRows = (await get<{ audit_logs: AuditRow[] }>(`/audit/logs?table_name=team_members&object_id=${id}:${u}`)).body.audit_logs;
      expect(memberRows.map((r) => r.action).sort()).toEqual(["created", "created", "deleted", "updated"]);
      for (const row of [...teamRows, ...memberRows]) expect(row.changed_by).toBe("bob@ops");
    });
  });
}
