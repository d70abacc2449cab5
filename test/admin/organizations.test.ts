// Organizations through the management API, on the embedded store and on PostgreSQL: creation
// with its budget, updates (explicit null clears), info/list filters, members, deletion rules,
// `blocked` stopping every key of the org on the gateway path, who may call what, and the audit trail.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { eq } from "drizzle-orm";
import OpenAI, { AuthenticationError } from "openai";
import { auditLog, budgets, orgMembers, organizations, teams, users, virtualKeys } from "../../core/store/schema.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

const CONFIG = {
  model_list: [
    { model_name: "chat-mock", svc_params: { model: "mock/chat" }, model_info: { id: "cfg-chat" } },
    { model_name: "fixed-mock", svc_params: { model: "mock/fixed", mock_response: "Fixed." }, model_info: { id: "cfg-fixed" } },
  ],
  general_settings: { master_key: MASTER_KEY },
};

type Json = Record<string, unknown> & { error?: { message: string; type: string; code: string; param: string | null } };

for (const backend of BACKENDS) {
  describe(`organizations (${backend})`, () => {
    let gw: TestGateway;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_orgs" });
    });
    afterAll(() => gw.stop());

    const db = () => gw.host!.store.db;

    const call = (method: string, path: string, body?: unknown, key = MASTER_KEY, headers: Record<string, string> = {}) => requestJson<Json>(gw, method, path, { body, key, headers });

    /** A virtual key row inserted directly (the keys API is another module's), live at once. */
    async function makeKey(fields: { teamId?: string; organizationId?: string; userId?: string }): Promise<string> {
      const key = `sk-test-${crypto.randomUUID()}`;
      const token = createHash("sha256").update(key).digest("hex");
      await db()
        .insert(virtualKeys)
        .values({ token, keyName: `sk-...${key.slice(-4)}`, ...fields });
      await gw.host!.services.bus!.publish({ kind: "key", token });
      return key;
    }

    async function makeUser(userId: string, userRole = "internal_user"): Promise<void> {
      await db().insert(users).values({ userId, userRole });
      await gw.host!.services.bus!.publish({ kind: "user", userId });
    }

    async function makeTeam(teamId: string, organizationId: string | null, models: string[] = []): Promise<void> {
      await db().insert(teams).values({ teamId, teamAlias: teamId, organizationId, models });
      await gw.host!.services.bus!.publish({ kind: "team", teamId });
    }

    const chat = (key: string, model = "chat-mock") =>
      new OpenAI({ baseURL: gw.baseURL, apiKey: key, maxRetries: 0 }).chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] });

    test("/organization/new creates the org and a budget row from its limit fields", async () => {
      const res = await call("POST", "/organization/new", {
        organization_alias: "Acme Corp",
        models: ["chat-mock"],
        max_budget: 12.5,
        soft_budget: 10,
        tpm_limit: 1000,
        rpm_limit: 50,
        max_parallel_requests: 3,
        budget_duration: "30d",
        model_max_budget: { "chat-mock": { max_budget: 1 } },
        metadata: { cost_center: "42" },
        tags: ["prod"],
        model_aliases: { fast: "chat-mock" },
      });
      expect(res.status).toBe(200);
      const org = res.body;
      expect(org.organization_id).toBeString();
      expect(org).toMatchObject({ organization_alias: "Acme Corp", models: ["chat-mock"], max_budget: 12.5, blocked: false, tags: ["prod"], metadata: { cost_center: "42" } });
      const budget = org.budget as Record<string, unknown>;
      expect(budget).toMatchObject({ budget_id: org.budget_id, max_budget: 12.5, soft_budget: 10, tpm_limit: 1000, rpm_limit: 50, max_parallel_requests: 3, budget_duration: "30d" });
      expect(new Date(budget.budget_reset_at as string).getTime()).toBeGreaterThan(Date.now() + 29 * 86_400_000);

      const [row] = await db().select().from(budgets).where(eq(budgets.budgetId, org.budget_id as string));
      expect(row?.maxBudget).toBe("12.500000000000");
      expect(row?.modelMaxBudget).toEqual({ "chat-mock": { max_budget: 1 } });
      const [stored] = await db().select().from(organizations).where(eq(organizations.organizationId, org.organization_id as string));
      expect(stored?.budgetId).toBe(org.budget_id as string);
    });

    test("/organization/new: own id, existing budget_id, and its 400/422 errors", async () => {
      const own = await call("POST", "/organization/new", { organization_alias: "own-id", organization_id: "org-own" });
      expect(own.status).toBe(200);
      expect(own.body.organization_id).toBe("org-own");

      const dup = await call("POST", "/organization/new", { organization_alias: "again", organization_id: "org-own" });
      expect(dup.status).toBe(400);
      expect(dup.body.error?.message).toContain("already exists");

      const budgetId = own.body.budget_id as string;
      const before = (await db().select().from(budgets)).length;
      const shared = await call("POST", "/organization/new", { organization_alias: "shares", budget_id: budgetId });
      expect(shared.status).toBe(200);
      expect(shared.body.budget_id).toBe(budgetId);
      expect((shared.body.budget as Record<string, unknown>).budget_id).toBe(budgetId);
      expect((await db().select().from(budgets)).length).toBe(before);

      const noBudget = await call("POST", "/organization/new", { organization_alias: "x", budget_id: "no-such-budget" });
      expect(noBudget.status).toBe(400);
      expect(noBudget.body.error?.message).toContain("no-such-budget");

      const noAlias = await call("POST", "/organization/new", { models: [] });
      expect(noAlias.status).toBe(422);
      expect(noAlias.body.error?.param).toBe("organization_alias");

      const badType = await call("POST", "/organization/new", { organization_alias: "x", max_budget: "lots" });
      expect(badType.status).toBe(422);
      expect(badType.body.error?.param).toBe("max_budget");

      const badDuration = await call("POST", "/organization/new", { organization_alias: "x", budget_duration: "fortnight" });
      expect(badDuration.status).toBe(400);
      expect(badDuration.body.error?.param).toBe("budget_duration");
    });

    test("PATCH /organization/update changes only the given fields; explicit null clears; the budget follows", async () => {
      const created = await call("POST", "/organization/new", { organization_alias: "upd", max_budget: 5, tags: ["a"], metadata: { k: 1 }, models: ["chat-mock"] });
      const id = created.body.organization_id as string;
      const res = await call("PATCH", "/organization/update", { organization_id: id, organization_alias: "upd-2", max_budget: 7, tags: null });
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ organization_id: id, organization_alias: "upd-2", max_budget: 7, tags: [], metadata: { k: 1 }, models: ["chat-mock"] });
      expect((res.body.budget as Record<string, unknown>).max_budget).toBe(7);

      const cleared = await call("PATCH", "/organization/update", { organization_id: id, max_budget: null, metadata: null });
      expect(cleared.status).toBe(200);
      expect(cleared.body.max_budget).toBeNull();
      expect(cleared.body.metadata).toEqual({});
      expect(cleared.body.organization_alias).toBe("upd-2");
      const [budget] = await db().select().from(budgets).where(eq(budgets.budgetId, created.body.budget_id as string));
      expect(budget?.maxBudget).toBeNull();

      expect((await call("PATCH", "/organization/update", { organization_id: "org-missing", max_budget: 1 })).status).toBe(404);
      expect((await call("PATCH", "/organization/update", { max_budget: 1 })).status).toBe(422);
      expect((await call("PATCH", "/organization/update", { organization_id: id, budget_id: "nope" })).status).toBe(400);
    });

    test("PATCH /organization/update on an org whose budget others share changes that org alone", async () => {
      expect((await call("POST", "/budget/new", { budget_id: "b-shared-orgs", max_budget: 10 })).status).toBe(200);
      const a = (await call("POST", "/organization/new", { organization_alias: "shares-a", budget_id: "b-shared-orgs" })).body.organization_id as string;
      const b = (await call("POST", "/organization/new", { organization_alias: "shares-b", budget_id: "b-shared-orgs" })).body.organization_id as string;
      const res = await call("PATCH", "/organization/update", { organization_id: a, max_budget: 0 });
      expect(res.status).toBe(200);
      expect(res.body.max_budget).toBe(0);
      // The shared budget, and so org b, keep their limit.
      expect((res.body.budget as Record<string, unknown>).max_budget).toBe(10);
      const [budget] = await db().select().from(budgets).where(eq(budgets.budgetId, "b-shared-orgs"));
      expect(Number(budget?.maxBudget)).toBe(10);
      const err = await chat(await makeKey({ organizationId: a })).catch((e: unknown) => e as { status?: number; error?: { type?: string } });
      expect(err).toMatchObject({ status: 400, error: { type: "budget_exceeded" } });
      expect((await chat(await makeKey({ organizationId: b }))).choices.length).toBe(1);
    });

    test("an org's models must keep covering its teams' models", async () => {
      const org = await call("POST", "/organization/new", { organization_alias: "narrow", models: ["chat-mock", "fixed-mock"] });
      const id = org.body.organization_id as string;
      await makeTeam(`team-narrow-${backend}`, id, ["fixed-mock"]);
      const res = await call("PATCH", "/organization/update", { organization_id: id, models: ["chat-mock"] });
      expect(res.status).toBe(400);
      expect(res.body.error?.message).toContain(`team-narrow-${backend}`);
      expect(res.body.error?.message).toContain("fixed-mock");
      const ok = await call("PATCH", "/organization/update", { organization_id: id, models: ["fixed-mock"] });
      expect(ok.status).toBe(200);
      expect(ok.body.models).toEqual(["fixed-mock"]);
    });

    test("an org's model_aliases alone must keep covering its teams' models too: a 400 naming the team, and its calls keep working", async () => {
      const org = await call("POST", "/organization/new", { organization_alias: "aliased", models: ["fixed-mock"], model_aliases: { cheap: "fixed-mock" } });
      const id = org.body.organization_id as string;
      const teamId = `team-aliased-${backend}`;
      await makeTeam(teamId, id, ["cheap"]);
      const key = await makeKey({ teamId });
      expect((await chat(key, "cheap")).choices[0]?.message.content).toBe("Fixed.");
      const res = await call("PATCH", "/organization/update", { organization_id: id, model_aliases: { cheap: "chat-mock" } });
      expect([res.status, res.body.error?.param]).toEqual([400, "model_aliases"]);
      expect(res.body.error?.message).toContain(teamId);
      expect(res.body.error?.message).toContain("cheap");
      expect((await call("GET", `/organization/info?organization_id=${id}`)).body.model_aliases).toEqual({ cheap: "fixed-mock" });
      expect((await chat(key, "cheap")).choices[0]?.message.content).toBe("Fixed.");
      // Aliases that leave the team's models covered are taken.
      const ok = await call("PATCH", "/organization/update", { organization_id: id, model_aliases: { cheap: "fixed-mock", other: "chat-mock" } });
      expect(ok.status).toBe(200);
    });

    test("/organization/info (GET and deprecated POST) returns the org with budget, members and teams", async () => {
      const org = await call("POST", "/organization/new", { organization_alias: "info-org", max_budget: 3 });
      const id = org.body.organization_id as string;
      await makeTeam(`team-info-${backend}`, id);
      await call("POST", "/organization/member_add", { organization_id: id, member: { role: "internal_user", user_email: `info-${backend}@example.com` } });

      const got = await call("GET", `/organization/info?organization_id=${encodeURIComponent(id)}`);
      expect(got.status).toBe(200);
      expect(got.body).toMatchObject({ organization_id: id, organization_alias: "info-org", budget: { max_budget: 3 } });
      expect((got.body.teams as { team_id: string }[]).map((t) => t.team_id)).toEqual([`team-info-${backend}`]);
      expect(got.body.members).toMatchObject([{ organization_id: id, user_role: "internal_user", user_email: `info-${backend}@example.com` }]);

      const posted = await call("POST", "/organization/info", { organization_id: id });
      expect(posted.status).toBe(200);
      expect(posted.body).toEqual(got.body);

      expect((await call("GET", "/organization/info?organization_id=nope")).status).toBe(404);
      expect((await call("POST", "/organization/info", { organization_id: "nope" })).status).toBe(404);
      expect((await call("GET", "/organization/info")).status).toBe(422);
      expect((await call("POST", "/organization/info", {})).status).toBe(422);
    });

    test("/organization/list filters: org_id exact, org_alias partial and case-insensitive", async () => {
      await call("POST", "/organization/new", { organization_alias: "Globex Research", organization_id: "org-globex" });
      await call("POST", "/organization/new", { organization_alias: "globex-sales" });
      await call("POST", "/organization/new", { organization_alias: "100%_real" });
      const all = await call("GET", "/organization/list");
      expect(all.status).toBe(200);
      expect(Array.isArray(all.body)).toBe(true);
      const aliases = (r: { body: unknown }) => (r.body as { organization_alias: string }[]).map((o) => o.organization_alias).sort();
      expect(aliases(all)).toContain("Globex Research");

      expect(aliases(await call("GET", "/organization/list?org_alias=GLOBEX"))).toEqual(["Globex Research", "globex-sales"]);
      expect(aliases(await call("GET", "/organization/list?org_id=org-globex"))).toEqual(["Globex Research"]);
      expect(aliases(await call("GET", "/organization/list?org_id=org-glob"))).toEqual([]);
      // `%` and `_` are matched literally, not as patterns.
      expect(aliases(await call("GET", `/organization/list?org_alias=${encodeURIComponent("0%_")}`))).toEqual(["100%_real"]);
      expect(aliases(await call("GET", `/organization/list?org_alias=${encodeURIComponent("%")}`))).toEqual(["100%_real"]);
      const listed = (all.body as unknown as Record<string, unknown>[]).find((o) => o.organization_id === "org-globex");
      expect(listed).toMatchObject({ budget: { budget_id: expect.any(String) }, members: [], teams: [] });
    });

    test("members: add (creating users, both body forms), update, delete, and their errors", async () => {
      const org = await call("POST", "/organization/new", { organization_alias: "members" });
      const id = org.body.organization_id as string;
      await makeUser(`existing-${backend}`);

      const add = await call("POST", "/organization/member_add", {
        organization_id: id,
        member: [
          { role: "org_admin", user_id: `existing-${backend}` },
          { role: "internal_user_viewer", user_email: `new-${backend}@example.com` },
        ],
      });
      expect(add.status).toBe(200);
      expect(add.body.organization_id).toBe(id);
      const memberships = add.body.updated_organization_memberships as Record<string, unknown>[];
      expect(memberships).toHaveLength(2);
      expect(memberships[0]).toMatchObject({ user_id: `existing-${backend}`, user_role: "org_admin", max_budget_in_organization: null });
      const created = (add.body.updated_users as Record<string, unknown>[]).find((u) => u.user_email === `new-${backend}@example.com`);
      expect(created).toMatchObject({ user_role: "internal_user_viewer", organization_id: id });
      const [userRow] = await db().select().from(users).where(eq(users.userEmail, `new-${backend}@example.com`));
      expect(userRow?.userId).toBe(created?.user_id as string);

      const single = await call("POST", "/organization/member_add", { organization_id: id, member: { role: "internal_user", user_id: `brand-new-${backend}` } });
      expect(single.status).toBe(200);
      expect((await db().select().from(users).where(eq(users.userId, `brand-new-${backend}`))).length).toBe(1);

      const again = await call("POST", "/organization/member_add", { organization_id: id, member: { role: "internal_user", user_id: `existing-${backend}` } });
      expect(again.status).toBe(400);
      expect(again.body.error?.message).toContain("Already a member");
      expect((await call("POST", "/organization/member_add", { organization_id: id, member: { role: "god", user_id: "x" } })).status).toBe(422);
      expect((await call("POST", "/organization/member_add", { organization_id: id, member: { role: "internal_user" } })).status).toBe(400);
      expect((await call("POST", "/organization/member_add", { organization_id: "org-nope", member: { role: "internal_user", user_id: "x" } })).status).toBe(404);

      const upd = await call("PATCH", "/organization/member_update", { organization_id: id, user_email: `new-${backend}@example.com`, role: "internal_user" });
      expect(upd.status).toBe(200);
      expect(upd.body).toMatchObject({ user_role: "internal_user", max_budget_in_organization: null });
      expect(gw.host!.services.identity!.orgMembers.get(id)?.get(created?.user_id as string)).toBe("internal_user");
      expect((await call("PATCH", "/organization/member_update", { organization_id: id, user_id: "not-a-user", role: "internal_user" })).status).toBe(404);

      const del = await call("DELETE", "/organization/member_delete", { organization_id: id, user_id: `existing-${backend}` });
      expect(del.status).toBe(200);
      const left = await db().select().from(orgMembers).where(eq(orgMembers.organizationId, id));
      expect(left.map((m) => m.userId).sort()).toEqual([created?.user_id as string, `brand-new-${backend}`].sort());
      expect((await call("DELETE", "/organization/member_delete", { organization_id: id, user_id: `existing-${backend}` })).status).toBe(404);
    });

    test("member_add audits the users it creates, as /team/member_add does (by id and by e-mail), and only those", async () => {
      const id = (await call("POST", "/organization/new", { organization_alias: "audited-users" })).body.organization_id as string;
      const existing = `audit-existing-${backend}`;
      await makeUser(existing);
      const email = `audit-new-${backend}@example.com`;
      const add = await call("POST", "/organization/member_add", {
        organization_id: id,
        member: [
          { role: "internal_user", user_id: `audit-new-${backend}` },
          { role: "internal_user_viewer", user_email: email },
          { role: "org_admin", user_id: existing },
        ],
      });
      expect(add.status).toBe(200);
      const byEmail = (add.body.updated_users as Record<string, unknown>[]).find((u) => u.user_email === email)!.user_id as string;
      const created = async (userId: string) => {
        const r = await call("GET", `/audit/logs?table_name=users&object_id=${encodeURIComponent(userId)}`);
        return (r.body.audit_logs as { action: string; changed_by: string; updated_values: Record<string, unknown> }[]).filter((a) => a.action === "created");
      };
      const [byId] = await created(`audit-new-${backend}`);
      expect(byId?.updated_values).toMatchObject({ user_id: `audit-new-${backend}`, user_role: "internal_user", organization_id: id, teams: [] });
      expect((await created(byEmail))[0]?.updated_values).toMatchObject({ user_email: email, user_role: "internal_user_viewer", organization_id: id });
      expect(await created(existing)).toEqual([]);
    });

    test("member_add with a new user_id and another user's address is a 400, as on a team: the address's owner gets no role", async () => {
      const org = await call("POST", "/organization/new", { organization_alias: "address-owner" });
      const id = org.body.organization_id as string;
      const owner = `addr-owner-${backend}`;
      await db().insert(users).values({ userId: owner, userRole: "internal_user", userEmail: `owner-${backend}@x.io` });
      for (const email of [`owner-${backend}@x.io`, `OWNER-${backend}@X.IO`]) {
        const res = await call("POST", "/organization/member_add", { organization_id: id, member: { role: "org_admin", user_id: `bob-${backend}`, user_email: email } });
        expect(res.status).toBe(400);
        expect(res.body.error).toMatchObject({ message: `user_email ${email} belongs to user ${owner}, not bob-${backend}.`, param: "user_email" });
      }
      expect(await db().select().from(orgMembers).where(eq(orgMembers.organizationId, id))).toEqual([]);
      expect(await db().select().from(users).where(eq(users.userId, `bob-${backend}`))).toEqual([]);
      // Naming the owner by id, or by its address alone, still adds it.
      const byId = await call("POST", "/organization/member_add", { organization_id: id, member: { role: "internal_user", user_id: owner, user_email: `owner-${backend}@x.io` } });
      expect(byId.status).toBe(200);
      expect(byId.body.updated_organization_memberships).toMatchObject([{ user_id: owner, user_role: "internal_user" }]);
    });

    test("max_budget_in_organization (which no call is counted against) is a 400 naming it, by member_add and member_update, nothing written; null is taken", async () => {
      const id = (await call("POST", "/organization/new", { organization_alias: "member-budgets" })).body.organization_id as string;
      const member = `budgeted-${backend}`;
      for (const value of [0, 20, 0.0000000000004, "lots"]) {
        const add = await call("POST", "/organization/member_add", { organization_id: id, member: { role: "internal_user", user_id: member }, max_budget_in_organization: value });
        expect([add.status, add.body.error?.param]).toEqual([400, "max_budget_in_organization"]);
        expect(add.body.error?.message).toContain("max_budget_in_organization is not enforced");
      }
      expect(await db().select().from(orgMembers).where(eq(orgMembers.organizationId, id))).toEqual([]);
      expect(await db().select().from(users).where(eq(users.userId, member))).toEqual([]);
      const added = await call("POST", "/organization/member_add", { organization_id: id, member: { role: "internal_user", user_id: member }, max_budget_in_organization: null });
      expect(added.status).toBe(200);
      const upd = await call("PATCH", "/organization/member_update", { organization_id: id, user_id: member, role: "org_admin", max_budget_in_organization: 5 });
      expect([upd.status, upd.body.error?.param]).toEqual([400, "max_budget_in_organization"]);
      const [row] = await db().select().from(orgMembers).where(eq(orgMembers.organizationId, id));
      expect(row).toMatchObject({ userRole: "internal_user", maxBudgetInOrganization: null });
      // A value stored before the refusal is cleared by a null.
      await db().update(orgMembers).set({ maxBudgetInOrganization: "3" }).where(eq(orgMembers.organizationId, id));
      const cleared = await call("PATCH", "/organization/member_update", { organization_id: id, user_id: member, max_budget_in_organization: null });
      expect(cleared.status).toBe(200);
      expect(cleared.body).toMatchObject({ max_budget_in_organization: null });
    });

    test("member_delete detaches the user from the org its organization_id names (another org it names stays)", async () => {
      const id = (await call("POST", "/organization/new", { organization_alias: "leaving" })).body.organization_id as string;
      const other = (await call("POST", "/organization/new", { organization_alias: "staying" })).body.organization_id as string;
      const leaver = `leaver-${backend}`;
      const elsewhere = `elsewhere-${backend}`;
      await db().insert(users).values({ userId: elsewhere, userRole: "internal_user", organizationId: other });
      const added = await call("POST", "/organization/member_add", { organization_id: id, member: [{ role: "internal_user", user_id: leaver }, { role: "internal_user", user_id: elsewhere }] });
      expect(added.status).toBe(200);
      expect((await call("GET", `/user/info?user_id=${leaver}`)).body.user_info).toMatchObject({ organization_id: id });
      for (const userId of [leaver, elsewhere]) expect((await call("DELETE", "/organization/member_delete", { organization_id: id, user_id: userId })).status).toBe(200);
      expect((await call("GET", `/user/info?user_id=${leaver}`)).body.user_info).toMatchObject({ organization_id: null });
      expect(gw.host!.services.identity!.users.get(leaver)?.organizationId).toBeNull();
      expect((await call("GET", `/user/info?user_id=${elsewhere}`)).body.user_info).toMatchObject({ organization_id: other });
    });

    test("blocked: true stops every key of the org at the next request; unblocking restores them", async () => {
      const org = await call("POST", "/organization/new", { organization_alias: "blockable" });
      const id = org.body.organization_id as string;
      await makeTeam(`team-block-${backend}`, id);
      const teamKey = await makeKey({ teamId: `team-block-${backend}` });
      const orgKey = await makeKey({ organizationId: id });
      const outsider = await makeKey({});
      expect((await chat(teamKey)).choices[0]?.message.content).toContain("mock response");
      expect((await chat(orgKey)).choices[0]?.message.content).toContain("mock response");

      expect((await call("PATCH", "/organization/update", { organization_id: id, blocked: true })).body.blocked).toBe(true);
      for (const key of [teamKey, orgKey]) {
        const err = await chat(key).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(AuthenticationError);
        expect((err as AuthenticationError).status).toBe(401);
        expect((err as AuthenticationError).message).toContain("blocked");
      }
      expect((await chat(outsider)).choices).toHaveLength(1);

      expect((await call("PATCH", "/organization/update", { organization_id: id, blocked: false })).body.blocked).toBe(false);
      expect((await chat(teamKey)).choices).toHaveLength(1);
      expect((await chat(orgKey)).choices).toHaveLength(1);

      const audit = await db().select().from(auditLog).where(eq(auditLog.objectId, id));
      expect(audit.map((a) => a.action).sort()).toEqual(["blocked", "created", "unblocked"]);
    });

    test("DELETE /organization/delete: refuses while teams belong to it, 404 for unknown ids, removes members", async () => {
      const busy = await call("POST", "/organization/new", { organization_alias: "busy" });
      const busyId = busy.body.organization_id as string;
      await makeTeam(`team-busy-${backend}`, busyId);
      const refused = await call("DELETE", "/organization/delete", { organization_ids: [busyId] });
      expect(refused.status).toBe(400);
      expect(refused.body.error?.message).toContain(`team-busy-${backend}`);

      const keyed = await call("POST", "/organization/new", { organization_alias: "keyed" });
      await makeKey({ organizationId: keyed.body.organization_id as string });
      expect((await call("DELETE", "/organization/delete", { organization_ids: [keyed.body.organization_id] })).status).toBe(400);

      const a = await call("POST", "/organization/new", { organization_alias: "gone-a" });
      const b = await call("POST", "/organization/new", { organization_alias: "gone-b" });
      const aId = a.body.organization_id as string;
      const bId = b.body.organization_id as string;
      await call("POST", "/organization/member_add", { organization_id: aId, member: { role: "internal_user", user_id: `member-gone-${backend}` } });

      const missing = await call("DELETE", "/organization/delete", { organization_ids: [aId, "org-never"] });
      expect(missing.status).toBe(404);
      expect(missing.body.error?.message).toContain("org-never");
      expect((await db().select().from(organizations).where(eq(organizations.organizationId, aId))).length).toBe(1);

      const del = await call("DELETE", "/organization/delete", { organization_ids: [aId, bId] }, MASTER_KEY, { "svc-changed-by": "alice" });
      expect(del.status).toBe(200);
      const deleted = del.body as unknown as Record<string, unknown>[];
      expect(deleted.map((o) => o.organization_alias).sort()).toEqual(["gone-a", "gone-b"]);
      expect((await call("GET", `/organization/info?organization_id=${aId}`)).status).toBe(404);
      expect(await db().select().from(orgMembers).where(eq(orgMembers.organizationId, aId))).toEqual([]);
      expect(gw.host!.services.identity!.orgs.has(aId)).toBe(false);
      expect((await call("DELETE", "/organization/delete", { organization_ids: [] })).status).toBe(422);

      const trail = await db().select().from(auditLog).where(eq(auditLog.objectId, bId));
      expect(trail.find((r) => r.action === "deleted")).toMatchObject({ changedBy: "alice", tableName: "organizations" });
    });

    test("writes are proxy-admin only; viewers read; an org_admin reads only its own org", async () => {
      const org = await call("POST", "/organization/new", { organization_alias: "authz" });
      const id = org.body.organization_id as string;
      await makeUser(`viewer-${backend}`, "proxy_admin_viewer");
      await makeUser(`orgadmin-${backend}`);
      await call("POST", "/organization/member_add", { organization_id: id, member: { role: "org_admin", user_id: `orgadmin-${backend}` } });
      const viewer = await makeKey({ userId: `viewer-${backend}` });
      const orgAdmin = await makeKey({ userId: `orgadmin-${backend}` });
      const plain = await makeKey({});

      for (const key of [viewer, orgAdmin, plain]) {
        expect((await call("POST", "/organization/new", { organization_alias: "nope" }, key)).status).toBe(403);
        expect((await call("PATCH", "/organization/update", { organization_id: id, blocked: true }, key)).status).toBe(403);
        expect((await call("DELETE", "/organization/delete", { organization_ids: [id] }, key)).status).toBe(403);
        expect((await call("POST", "/organization/member_add", { organization_id: id, member: { role: "org_admin", user_id: "x" } }, key)).status).toBe(403);
        expect((await call("PATCH", "/organization/member_update", { organization_id: id, user_id: `orgadmin-${backend}`, role: "internal_user" }, key)).status).toBe(403);
        expect((await call("DELETE", "/organization/member_delete", { organization_id: id, user_id: `orgadmin-${backend}` }, key)).status).toBe(403);
      }
      expect((await call("GET", `/organization/info?organization_id=${id}`, undefined, viewer)).status).toBe(200);
      expect((await call("GET", "/organization/list", undefined, viewer)).status).toBe(200);
      expect((await call("GET", `/organization/info?organization_id=${id}`, undefined, orgAdmin)).status).toBe(200);
      const own = await call("GET", "/organization/list", undefined, orgAdmin);
      expect((own.body as unknown as { organization_id: string }[]).map((o) => o.organization_id)).toEqual([id]);
      // Another org, existing or not, is a 403 alike: existence does not leak.
      expect((await call("GET", "/organization/info?organization_id=org-globex", undefined, orgAdmin)).status).toBe(403);
      expect((await call("GET", "/organization/info?organization_id=org-nonexistent", undefined, orgAdmin)).status).toBe(403);
      expect((await call("GET", `/organization/info?organization_id=${id}`, undefined, plain)).status).toBe(403);
      expect((await call("GET", "/organization/list", undefined, plain)).status).toBe(403);
      expect((await call("GET", "/organization/list", undefined, "sk-not-a-key")).status).toBe(401);
      const [stored] = await db().select().from(organizations).where(eq(organizations.organizationId, id));
      expect(stored?.blocked).toBe(false);
    });
  });
}
