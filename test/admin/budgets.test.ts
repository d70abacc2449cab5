// Budget objects through the management API, on the embedded store and on PostgreSQL: create
// (generated or given id, reset time from the duration, duplicates refused), update, info, list,
// settings, delete (refused while a key, team, org or team membership still uses the budget), validation errors as
// 400/404/422 envelopes, the audit trail, who may call, and a budget's limits reaching the keys
// that use it at once.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { eq, sql } from "drizzle-orm";
import { auditLog, budgets } from "../../core/store/schema.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

const CONFIG = {
  model_list: [{ model_name: "priced", svc_params: { model: "mock/priced" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } }],
  general_settings: { master_key: MASTER_KEY },
};

type Json = Record<string, unknown> & { error?: { message: string; type: string; code: string; param: string | null } };
const HOUR = 3_600_000;

for (const backend of BACKENDS) {
  describe(`budgets API (${backend})`, () => {
    let gw: TestGateway;
    let teamAdminKey: string;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_budgets" });
      const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "t" } });
      await requestJson(gw, "POST", "/team/member_add", { body: { team_id: team.body.team_id, member: { role: "admin", user_id: "u-team-admin" } } });
      const key = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team.body.team_id, user_id: "u-team-admin" } });
      teamAdminKey = key.body.key;
    });
    afterAll(() => gw?.stop());

    const call = <T = Json>(method: string, path: string, body?: unknown, key = MASTER_KEY) => requestJson<T>(gw, method, path, { body, key });

    test("/budget/new with a given id stores the fields and starts the period now", async () => {
      const before = Date.now();
      const r = await call("POST", "/budget/new", {
        budget_id: "b-monthly",
        max_budget: 12.5,
        soft_budget: 10,
        budget_duration: "30d",
        tpm_limit: 1000,
        rpm_limit: 10,
        max_parallel_requests: 2,
        model_max_budget: { priced: { max_budget: 1, budget_duration: "1d", tpm_limit: 5, rpm_limit: 1 } },
      });
      expect(r.status).toBe(200);
      expect(r.body).toMatchObject({
        budget_id: "b-monthly",
        max_budget: 12.5,
        soft_budget: 10,
        budget_duration: "30d",
        tpm_limit: 1000,
        rpm_limit: 10,
        max_parallel_requests: 2,
        model_max_budget: { priced: { max_budget: 1, budget_duration: "1d", tpm_limit: 5, rpm_limit: 1 } },
        created_by: expect.any(String),
      });
      const resetAt = Date.parse(String(r.body.budget_reset_at));
      expect(resetAt).toBeGreaterThanOrEqual(before + 30 * 24 * HOUR);
      expect(resetAt).toBeLessThanOrEqual(Date.now() + 30 * 24 * HOUR);
      const [row] = await gw.host!.store.db.select().from(budgets).where(eq(budgets.budgetId, "b-monthly"));
      expect(row!.maxBudget).toBe("12.500000000000");
      const audit = await gw.host!.store.db.select().from(auditLog).where(eq(auditLog.objectId, "b-monthly"));
      expect(audit.map((a) => a.action)).toEqual(["created"]);
    });

    test("/budget/new without an id generates one; no duration means no reset", async () => {
      const r = await call("POST", "/budget/new", { max_budget: 3 });
      expect(r.status).toBe(200);
      expect(r.body.budget_id).toMatch(/^[0-9a-f-]{36}$/);
      expect(r.body.budget_reset_at).toBeNull();
    });

    test("a duplicate id is a 400; bad fields are 422 (or 400 for a duration that is not one)", async () => {
      const dup = await call("POST", "/budget/new", { budget_id: "b-monthly" });
      expect(dup.status).toBe(400);
      expect(dup.body.error).toMatchObject({ param: "budget_id", code: "400" });
      const negative = await call("POST", "/budget/new", { max_budget: -1 });
      expect(negative.status).toBe(422);
      expect(negative.body.error).toMatchObject({ param: "max_budget", code: "422" });
      expect((await call("POST", "/budget/new", { tpm_limit: 1.5 })).status).toBe(422);
      const duration = await call("POST", "/budget/new", { budget_duration: "soon" });
      expect(duration.status).toBe(400);
      expect(duration.body.error!.param).toBe("budget_duration");
      expect((await call("POST", "/budget/update", { max_budget: 1 })).status).toBe(422);
    });

    test("/budget/update changes only the fields named and restarts the period with a new duration", async () => {
      const r = await call("POST", "/budget/update", { budget_id: "b-monthly", max_budget: 20, budget_duration: "1h" });
      expect(r.status).toBe(200);
      expect(r.body).toMatchObject({ budget_id: "b-monthly", max_budget: 20, soft_budget: 10, budget_duration: "1h", tpm_limit: 1000 });
      expect(Math.abs(Date.parse(String(r.body.budget_reset_at)) - (Date.now() + HOUR))).toBeLessThan(60_000);
      const cleared = await call("POST", "/budget/update", { budget_id: "b-monthly", soft_budget: null });
      expect(cleared.body.soft_budget).toBeNull();
      const missing = await call("POST", "/budget/update", { budget_id: "b-nope", max_budget: 1 });
      expect(missing.status).toBe(404);
      expect(missing.body.error).toMatchObject({ type: "not_found_error", code: "404" });
    });

    test("a new period on an organization's budget is the organization's too (its own duration mirrors its budget)", async () => {
      const org = await call<Json>("POST", "/organization/new", { organization_alias: "org-own-period", max_budget: 50, budget_duration: "30d" });
      expect(org.status).toBe(200);
      const budgetId = String(org.body.budget_id);
      const r = await call("POST", "/budget/update", { budget_id: budgetId, budget_duration: "1h" });
      expect(r.status).toBe(200);
      const info = await call<Json>("GET", `/organization/info?organization_id=${org.body.organization_id}`);
      expect(info.status).toBe(200);
      expect(info.body.budget_duration).toBe("1h");
      expect(Math.abs(Date.parse(String(info.body.budget_reset_at)) - (Date.now() + HOUR))).toBeLessThan(60_000);
      // The org's spend resets on the budget's new period, not the old 30 days.
      expect(Date.parse(String(info.body.budget_reset_at))).toBe(Date.parse(String(r.body.budget_reset_at)));
    });

    test("/budget/info, /budget/list and /budget/settings", async () => {
      const info = await call<Json[]>("POST", "/budget/info", { budgets: ["b-monthly"] });
      expect(info.status).toBe(200);
      expect(info.body.map((b) => b.budget_id)).toEqual(["b-monthly"]);
      expect((await call("POST", "/budget/info", { budgets: ["b-monthly", "b-nope"] })).status).toBe(404);
      expect((await call("POST", "/budget/info", { budgets: [] })).status).toBe(400);
      expect((await call("POST", "/budget/info", {})).status).toBe(422);
      const list = await call<Json[]>("GET", "/budget/list");
      expect(list.body.map((b) => b.budget_id)).toContain("b-monthly");
      const settings = await call<Json[]>("GET", "/budget/settings?budget_id=b-monthly");
      expect(settings.status).toBe(200);
      const byName = Object.fromEntries(settings.body.map((s) => [s.field_name, s]));
      expect(byName.max_budget).toEqual({ field_name: "max_budget", field_type: "Float", field_description: expect.any(String), field_value: 20, field_default_value: null, stored_in_db: true });
      expect(byName.budget_duration!.field_value).toBe("1h");
      expect(byName.tpm_limit!.field_type).toBe("Integer");
      expect((await call("GET", "/budget/settings")).status).toBe(422);
      expect((await call("GET", "/budget/settings?budget_id=b-nope")).status).toBe(404);
    });

    test("a key using a budget gets its limits at once, and follows its updates", async () => {
      await call("POST", "/budget/new", { budget_id: "b-zero", max_budget: 0 });
      const key = await call<{ key: string }>("POST", "/key/generate", { budget_id: "b-zero" });
      expect(key.status).toBe(200);
      const chat = () =>
        fetch(`${gw.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key.body.key}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "priced", messages: [{ role: "user", content: "hi" }], max_tokens: 5 }),
        }).then(async (r) => ({ status: r.status, body: (await r.json()) as Json }));
      const refused = await chat();
      expect(refused.status).toBe(400);
      expect(refused.body.error!.type).toBe("budget_exceeded");
      expect((await call("POST", "/budget/update", { budget_id: "b-zero", max_budget: 100 })).status).toBe(200);
      expect((await chat()).status).toBe(200);
    });

    test("a key or team joining a periodic budget mid-period keeps its spend; the budget shows its current period's end", async () => {
      // Stored end 50 minutes ago on a 1h grid: the budget's current period ends in 10 minutes.
      const currentEnd = Date.now() - 50 * 60_000 + HOUR;
      const budget = await call("POST", "/budget/new", {
        budget_id: "b-rolled",
        max_budget: 0.2,
        budget_duration: "1h",
        budget_reset_at: new Date(currentEnd - HOUR).toISOString(),
      });
      expect(budget.status).toBe(200);
      const key = await call<{ key: string }>("POST", "/key/generate", {});
      const team = await call<{ team_id: string }>("POST", "/team/new", { team_alias: "joins-rolled" });
      expect((await call("POST", "/key/update", { key: key.body.key, spend: 0.25 })).status).toBe(200);
      expect((await call("POST", "/team/update", { team_id: team.body.team_id, spend: 0.5 })).status).toBe(200);
      const joinedKey = await call<Json>("POST", "/key/update", { key: key.body.key, budget_id: "b-rolled" });
      expect(joinedKey.status).toBe(200);
      expect(Date.parse(String(joinedKey.body.budget_reset_at))).toBe(currentEnd);
      const joinedTeam = await call<{ data: Json }>("POST", "/team/update", { team_id: team.body.team_id, budget_id: "b-rolled" });
      expect(joinedTeam.status).toBe(200);
      expect(Date.parse(String(joinedTeam.body.data.budget_reset_at))).toBe(currentEnd);
      // The period roller would have zeroed a row given a past end; wait past its next tick.
      await Bun.sleep(2_500);
      const keyInfo = await call<{ info: Json }>("GET", `/key/info?key=${key.body.key}`);
      expect(keyInfo.body.info.spend).toBe(0.25);
      expect(Date.parse(String(keyInfo.body.info.budget_reset_at))).toBe(currentEnd);
      const teamInfo = await call<{ team_info: Json }>("GET", `/team/info?team_id=${team.body.team_id}`);
      expect(teamInfo.body.team_info.spend).toBe(0.5);
      const info = await call<Json[]>("POST", "/budget/info", { budgets: ["b-rolled"] });
      expect(Date.parse(String(info.body[0]!.budget_reset_at))).toBe(currentEnd);
      // And enforcement still counts it: $0.25 spent of the budget's $0.2.
      const refused = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key.body.key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "priced", messages: [{ role: "user", content: "hi" }], max_tokens: 5 }),
      });
      expect(refused.status).toBe(400);
    });

    test("/budget/delete returns the row, and refuses a budget still in use", async () => {
      const inUse = await call("POST", "/budget/delete", { id: "b-zero" });
      expect(inUse.status).toBe(400);
      expect(inUse.body.error!.message).toContain("keys:");
      await call("POST", "/organization/new", { organization_alias: "org-with-budget", budget_id: "b-monthly" });
      const orgUse = await call("POST", "/budget/delete", { id: "b-monthly" });
      expect(orgUse.status).toBe(400);
      expect(orgUse.body.error!.message).toContain("organizations:");
      await call("POST", "/budget/new", { budget_id: "b-free", max_budget: 1 });
      const deleted = await call("POST", "/budget/delete", { id: "b-free" });
      expect(deleted.status).toBe(200);
      expect(deleted.body).toMatchObject({ budget_id: "b-free", max_budget: 1 });
      expect((await call("POST", "/budget/delete", { id: "b-free" })).status).toBe(404);
      expect((await call("POST", "/budget/delete", {})).status).toBe(422);
      const audit = await gw.host!.store.db.select().from(auditLog).where(eq(auditLog.objectId, "b-free"));
      expect(audit.map((a) => a.action).sort()).toEqual(["created", "deleted"]);
    });

    test("/budget/delete refuses a budget a team membership uses, as one a key uses, until the member leaves", async () => {
      // No route sets a membership's budget_id (LiteLLM keeps a member's limits there): the store is written directly.
      await call("POST", "/budget/new", { budget_id: "b-member", max_budget: 1 });
      const team = await call<{ team_id: string }>("POST", "/team/new", { team_alias: "member-budget", members_with_roles: [{ role: "user", user_id: "u-member-budget" }] });
      await gw.host!.store.db.execute(sql`update team_members set budget_id = 'b-member' where team_id = ${team.body.team_id}`);
      const inUse = await call("POST", "/budget/delete", { id: "b-member" });
      expect(inUse.status).toBe(400);
      expect(inUse.body.error).toMatchObject({ param: "id", code: "400" });
      expect(inUse.body.error!.message).toContain(`team members: ${team.body.team_id}/u-member-budget`);
      expect((await call("POST", "/team/member_delete", { team_id: team.body.team_id, user_id: "u-member-budget" })).status).toBe(200);
      expect((await call("POST", "/budget/delete", { id: "b-member" })).status).toBe(200);
    });

    test("only proxy admins may call; a team admin gets 403 and changes nothing", async () => {
      const attempts: [string, string, unknown?][] = [
        ["POST", "/budget/new", { budget_id: "b-team" }],
        ["POST", "/budget/update", { budget_id: "b-monthly", max_budget: 1 }],
        ["POST", "/budget/info", { budgets: ["b-monthly"] }],
        ["GET", "/budget/list"],
        ["GET", "/budget/settings?budget_id=b-monthly"],
        ["POST", "/budget/delete", { id: "b-monthly" }],
      ];
      for (const [method, path, body] of attempts) {
        const r = await call(method, path, body, teamAdminKey);
        expect(r.status, path).toBe(403);
        expect(r.body.error!.code).toBe("403");
      }
      const [row] = await gw.host!.store.db.select().from(budgets).where(eq(budgets.budgetId, "b-monthly"));
      expect(row!.maxBudget).toBe("20.000000000000");
      expect(await gw.host!.store.db.select().from(budgets).where(eq(budgets.budgetId, "b-team"))).toEqual([]);
    });
  });
}
