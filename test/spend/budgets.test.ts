// Budgets hold under concurrency: every call reserves its worst case (prompt estimate + max_tokens
// at the model's prices) on every budget that applies before going upstream, so 200 calls fired
// at once against a budget for 10 calls let exactly 10 through, on one instance or two sharing
// PostgreSQL and Redis. Also: period resets on time, the soft-budget alert fires once, a
// temporary increase expires, per-model and per-provider budgets, the 400 `budget_exceeded` shape.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, freshDatabase, MASTER_KEY, requestJson, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { jsonPostReceiver } from "../harness/util.ts";
import { TEST_REDIS_URL, testRedisUrlAt } from "../harness/redis.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

// Each call answers exactly max_tokens=1000 words (one token each) at $0.001 per output token:
// $1 per call, plus a prompt priced at a millionth of a micro-dollar per token.
const LONG_REPLY = "word ".repeat(1200);
const DOLLAR = {
  model_name: "dollar",
  svc_params: { model: "mock/dollar", mock_response: LONG_REPLY },
  model_info: { input_cost_per_token: 1e-12, output_cost_per_token: 0.001 },
};
const CHEAP = { model_name: "cheap", svc_params: { model: "mock/cheap" }, model_info: { input_cost_per_token: 1e-9, output_cost_per_token: 1e-9 } };
const CONFIG = { model_list: [DOLLAR, CHEAP], general_settings: { master_key: MASTER_KEY } };
/** Room for exactly n calls of $1 (and their sub-micro-dollar prompts). */
const budgetFor = (n: number) => n + 0.0000001;

interface ErrorBody {
  error: { message: string; type: string; code: string; param: string | null };
}

async function call(gw: { url: string }, key: string, model = "dollar"): Promise<{ status: number; body: ErrorBody & { usage?: { completion_tokens: number } } }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 1000 }),
  });
  return { status: res.status, body: (await res.json()) as ErrorBody };
}

async function burst(gw: { url: string }, keys: string[], n: number): Promise<{ ok: number; refused: number; other: number[] }> {
  const results = await Promise.all(Array.from({ length: n }, (_, i) => call(gw, keys[i % keys.length]!)));
  const other = results.filter((r) => r.status !== 200 && r.status !== 400).map((r) => r.status);
  for (const r of results) if (r.status === 400) expect(r.body.error.type).toBe("budget_exceeded");
  return { ok: results.filter((r) => r.status === 200).length, refused: results.filter((r) => r.status === 400).length, other };
}

async function newKey(gw: TestGateway | { url: string }, body: Record<string, unknown>): Promise<{ key: string; token: string }> {
  const r = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body });
  expect(r.status).toBe(200);
  return r.body;
}

async function spendOf(gw: TestGateway, table: "virtual_keys" | "teams" | "organizations", column: string, id: string): Promise<number> {
  await gw.host!.spendWriter.flush();
  const [row] = await rows<{ spend: string }>(gw.host!.store.db, sql`select spend::text as spend from ${sql.identifier(table)} where ${sql.identifier(column)} = ${id}`);
  return Number(row!.spend);
}

for (const backend of BACKENDS) {
  describe(`budgets under concurrency (${backend})`, () => {
    let gw: TestGateway;
    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_budget" });
    });
    afterAll(async () => gw?.stop());

    test("a key with a budget for 10 calls: 200 at once, exactly 10 succeed, spend stays within max_budget", async () => {
      const max = budgetFor(10);
      const { key, token } = await newKey(gw, { max_budget: max });
      const r = await burst(gw, [key], 200);
      expect(r).toEqual({ ok: 10, refused: 190, other: [] });
      const spend = await spendOf(gw, "virtual_keys", "token", token);
      expect(spend).toBeGreaterThanOrEqual(10);
      expect(spend).toBeLessThanOrEqual(max);
      // Spent out: the next call is refused with the spec's shape, naming the budget.
      const after = await call(gw, key);
      expect(after.status).toBe(400);
      expect(after.body.error).toMatchObject({ type: "budget_exceeded", code: "400", param: null });
      // $10.00000000004 spent of $10.0000001: not reached, but no room for another $1 call.
      expect(after.body.error.message).toContain("Budget would be exceeded");
      expect(after.body.error.message).toContain(`max budget $${max}`);
      expect(after.body.error.message).toMatch(/spend \$10\.0000000000\d/);
    });

    test("a team budget for 5 calls holds across the team's keys", async () => {
      const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { max_budget: budgetFor(5) } });
      const a = await newKey(gw, { team_id: team.body.team_id });
      const b = await newKey(gw, { team_id: team.body.team_id });
      const r = await burst(gw, [a.key, b.key], 100);
      expect(r).toEqual({ ok: 5, refused: 95, other: [] });
      expect(await spendOf(gw, "teams", "team_id", team.body.team_id)).toBeLessThanOrEqual(budgetFor(5));
      const refused = await call(gw, a.key);
      expect(refused.body.error.message).toContain(`Team=${team.body.team_id}`);
    });

    test("an organization budget for 3 calls holds across its teams", async () => {
      const org = await requestJson<{ organization_id: string }>(gw, "POST", "/organization/new", { body: { organization_alias: `org-${backend}`, max_budget: budgetFor(3) } });
      expect(org.status).toBe(200);
      const t1 = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { organization_id: org.body.organization_id } });
      const t2 = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { organization_id: org.body.organization_id } });
      const a = await newKey(gw, { team_id: t1.body.team_id });
      const b = await newKey(gw, { team_id: t2.body.team_id });
      const r = await burst(gw, [a.key, b.key], 60);
      expect(r).toEqual({ ok: 3, refused: 57, other: [] });
      expect(await spendOf(gw, "organizations", "organization_id", org.body.organization_id)).toBeLessThanOrEqual(budgetFor(3));
    });

    test("a member's max_budget_in_team for 2 calls holds across the member's keys; other members go on; raising it makes room", async () => {
      const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: {} });
      const teamId = team.body.team_id;
      const [ann, bob] = [`m-ann-${backend}`, `m-bob-${backend}`];
      const added = await requestJson(gw, "POST", "/team/member_add", { body: { team_id: teamId, member: { role: "user", user_id: ann }, max_budget_in_team: budgetFor(2) } });
      expect(added.status).toBe(200);
      expect((await requestJson(gw, "POST", "/team/member_add", { body: { team_id: teamId, member: { role: "user", user_id: bob } } })).status).toBe(200);
      const a1 = await newKey(gw, { team_id: teamId, user_id: ann });
      const a2 = await newKey(gw, { team_id: teamId, user_id: ann });
      const b = await newKey(gw, { team_id: teamId, user_id: bob });
      expect(await burst(gw, [a1.key, a2.key], 20)).toEqual({ ok: 2, refused: 18, other: [] });
      const refused = await call(gw, a2.key);
      expect(refused.body.error.type).toBe("budget_exceeded");
      expect(refused.body.error.message).toContain(`User=${ann} in Team=${teamId}`);
      expect((await call(gw, b.key)).status).toBe(200);

      const raised = await requestJson(gw, "POST", "/team/member_update", { body: { team_id: teamId, user_id: ann, max_budget_in_team: budgetFor(3) } });
      expect(raised.status).toBe(200);
      expect((await call(gw, a1.key)).status).toBe(200);
      expect((await call(gw, a1.key)).status).toBe(400);
      await gw.host!.spendWriter.flush();
      const [member] = await rows<{ spend: string }>(gw.host!.store.db, sql`select spend::text as spend from team_members where team_id = ${teamId} and user_id = ${ann}`);
      expect(Number(member!.spend)).toBeGreaterThanOrEqual(3);
      expect(Number(member!.spend)).toBeLessThanOrEqual(budgetFor(3));
    });

    test("a user's own budget applies to their keys without a team", async () => {
      await requestJson(gw, "POST", "/user/new", { body: { user_id: `u-budget-${backend}`, max_budget: budgetFor(2) } });
      const { key } = await newKey(gw, { user_id: `u-budget-${backend}` });
      expect(await burst(gw, [key], 20)).toEqual({ ok: 2, refused: 18, other: [] });
      expect((await call(gw, key)).body.error.message).toContain(`User=u-budget-${backend}`);
    });

    test("a user's own budget counts what their team keys spend (the user's spend), though it governs only their keys without a team", async () => {
      const userId = `u-both-${backend}`;
      await requestJson(gw, "POST", "/user/new", { body: { user_id: userId, max_budget: budgetFor(2) } });
      const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: {} });
      expect((await requestJson(gw, "POST", "/team/member_add", { body: { team_id: team.body.team_id, member: { role: "user", user_id: userId } } })).status).toBe(200);
      const own = await newKey(gw, { user_id: userId });
      const inTeam = await newKey(gw, { user_id: userId, team_id: team.body.team_id });
      expect((await call(gw, own.key)).status).toBe(200);
      // The team key is governed by its team: past the user's budget, it is still served.
      for (let i = 0; i < 2; i++) expect((await call(gw, inTeam.key)).status).toBe(200);
      // $3 spent by the user in all: the key without a team is refused, as /user/info shows why.
      const refused = await call(gw, own.key);
      expect(refused.status).toBe(400);
      expect(refused.body.error.message).toMatch(new RegExp(`^Budget has been exceeded! User=${userId}: spend \\$3\\.0000000000\\d+, max budget \\$2\\.0000001\\.$`));
      await gw.host!.spendWriter.flush();
      const info = await requestJson<{ user_info: { spend: number } }>(gw, "GET", `/user/info?user_id=${userId}`);
      expect(info.body.user_info.spend).toBeGreaterThanOrEqual(3);
    });

    test("a budget given to a key, or to its budget object, after the key has spent counts that spend, written or not", async () => {
      // Given right after the calls: they may not be written yet.
      const { key, token } = await newKey(gw, {});
      for (let i = 0; i < 3; i++) expect((await call(gw, key)).status).toBe(200);
      expect((await requestJson(gw, "POST", "/key/update", { body: { key: token, max_budget: budgetFor(3) } })).status).toBe(200);
      const refused = await call(gw, key);
      expect(refused.status).toBe(400);
      expect(refused.body.error.message).toMatch(/^Budget would be exceeded: Key .* \(spend \$3\.0000000000\d+, \$0 held by calls in flight\)/);
      // A budget object gaining a max_budget: the identity mirror's copy of the key is older than its spend.
      const budget = await requestJson<{ budget_id: string }>(gw, "POST", "/budget/new", { body: { rpm_limit: 1000 } });
      const onBudget = await newKey(gw, { budget_id: budget.body.budget_id });
      for (let i = 0; i < 2; i++) expect((await call(gw, onBudget.key)).status).toBe(200);
      await gw.host!.spendWriter.flush();
      expect((await requestJson(gw, "POST", "/budget/update", { body: { budget_id: budget.body.budget_id, max_budget: budgetFor(2) } })).status).toBe(200);
      expect((await call(gw, onBudget.key)).body.error.message).toMatch(/^Budget would be exceeded: Key .* \(spend \$2\.0000000000\d+, \$0 held by calls in flight\)/);
    });

    test("a budget removed and given again counts what was spent without it", async () => {
      const { key, token } = await newKey(gw, { max_budget: 0 });
      expect((await call(gw, key)).body.error.type).toBe("budget_exceeded");
      expect((await requestJson(gw, "POST", "/key/update", { body: { key: token, max_budget: null } })).status).toBe(200);
      for (let i = 0; i < 2; i++) expect((await call(gw, key)).status).toBe(200);
      expect((await requestJson(gw, "POST", "/key/update", { body: { key: token, max_budget: budgetFor(2) } })).status).toBe(200);
      expect((await call(gw, key)).body.error.message).toMatch(/^Budget would be exceeded: Key .* \(spend \$2\.0000000000\d+, \$0 held by calls in flight\)/);
    });

    test("a reservation larger than what is left is refused before spend reaches the budget, and says why", async () => {
      const { key } = await newKey(gw, { max_budget: 1.5 });
      expect((await call(gw, key)).status).toBe(200);
      const second = await call(gw, key);
      expect(second.status).toBe(400);
      expect(second.body.error.message).toContain("Budget would be exceeded");
      expect(second.body.error.message).toContain("max_tokens=1000");
      // A cheaper call still fits.
      expect((await call(gw, key, "cheap")).status).toBe(200);
    });

    test("model_max_budget limits one model and leaves the others", async () => {
      const { key } = await newKey(gw, { model_max_budget: { dollar: { budget_limit: budgetFor(2), time_period: "1d" } } });
      expect(await burst(gw, [key], 10)).toEqual({ ok: 2, refused: 8, other: [] });
      const refused = await call(gw, key);
      expect(refused.body.error.message).toContain("for model=dollar");
      expect((await call(gw, key, "cheap")).status).toBe(200);
    });

    test("an organization's model_max_budget limits that model across its keys (its teams' too) and leaves the others", async () => {
      const org = await requestJson<{ organization_id: string }>(gw, "POST", "/organization/new", {
        body: { organization_alias: `per-model-${backend}`, model_max_budget: { dollar: { max_budget: budgetFor(2), budget_duration: "1d" } } },
      });
      expect(org.status).toBe(200);
      const orgId = org.body.organization_id;
      const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { organization_id: orgId } });
      const a = await newKey(gw, { organization_id: orgId });
      const b = await newKey(gw, { team_id: team.body.team_id });
      expect(await burst(gw, [a.key, b.key], 20)).toEqual({ ok: 2, refused: 18, other: [] });
      const refused = (await call(gw, b.key)).body.error as ErrorBody["error"] & { budget: Record<string, unknown> };
      expect(refused.message).toContain(`Organization=${orgId} for model=dollar`);
      expect(refused.budget).toMatchObject({ entity: "organization", id: orgId, model: "dollar" });
      expect((await call(gw, a.key, "cheap")).status).toBe(200);
      // A value the ledger could not read is refused, as on a key or a budget object.
      const bad = await requestJson<ErrorBody>(gw, "PATCH", "/organization/update", {
        body: { organization_id: orgId, model_max_budget: { dollar: { max_budget: "lots", budget_duration: "forever" } } },
      });
      expect([bad.status, bad.body.error.param]).toEqual([422, "model_max_budget.dollar.max_budget"]);
    });

    test("a team's budget object's model_max_budget limits that model across the team's keys and leaves the others", async () => {
      const budget = await requestJson<{ budget_id: string }>(gw, "POST", "/budget/new", {
        body: { model_max_budget: { dollar: { max_budget: budgetFor(2), budget_duration: "1d" } } },
      });
      const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { budget_id: budget.body.budget_id } });
      expect(team.status).toBe(200);
      const teamId = team.body.team_id;
      const a = await newKey(gw, { team_id: teamId });
      const b = await newKey(gw, { team_id: teamId });
      expect(await burst(gw, [a.key, b.key], 20)).toEqual({ ok: 2, refused: 18, other: [] });
      const refused = (await call(gw, b.key)).body.error as ErrorBody["error"] & { budget: Record<string, unknown> };
      expect(refused.message).toContain(`Team=${teamId} for model=dollar`);
      expect(refused.message).toContain(`(from Budget=${budget.body.budget_id})`);
      expect(refused.budget).toMatchObject({ entity: "team", id: teamId, model: "dollar" });
      expect((await call(gw, a.key, "cheap")).status).toBe(200);
      // A key outside the team is not limited by it.
      const outside = await newKey(gw, {});
      expect((await call(gw, outside.key)).status).toBe(200);
    });

    test("a per-model budget whose period is no period (or 0, or past 100y) is a 422 naming it, on a key and on a budget object", async () => {
      for (const period of ["zz", "0d", "3000000d"]) {
        const key = await requestJson<{ error: { param: string } }>(gw, "POST", "/key/generate", { body: { model_max_budget: { dollar: { budget_limit: 1, time_period: period } } } });
        expect([key.status, key.body.error?.param]).toEqual([422, "model_max_budget.dollar.time_period"]);
        const budget = await requestJson<{ error: { param: string } }>(gw, "POST", "/budget/new", { body: { model_max_budget: { dollar: { max_budget: 1, budget_duration: period } } } });
        expect([budget.status, budget.body.error?.param]).toEqual([422, "model_max_budget.dollar.budget_duration"]);
      }
    });

    test("a budget object (budget_id) limits the keys attached to it", async () => {
      const budget = await requestJson<{ budget_id: string }>(gw, "POST", "/budget/new", { body: { max_budget: budgetFor(1) } });
      expect(budget.status).toBe(200);
      const { key } = await newKey(gw, { budget_id: budget.body.budget_id });
      expect(await burst(gw, [key], 10)).toEqual({ ok: 1, refused: 9, other: [] });
      // The refusal says where the key's limit comes from, as rate-limit refusals do.
      const refused = (await call(gw, key)).body.error as ErrorBody["error"] & { budget: Record<string, unknown> };
      expect(refused.message).toContain(`(from Budget=${budget.body.budget_id})`);
      expect(refused.budget).toMatchObject({ entity: "key", budget_id: budget.body.budget_id });
    });

    test("a budget object's model_max_budget limits that model for the keys on it", async () => {
      const budget = await requestJson<{ budget_id: string }>(gw, "POST", "/budget/new", {
        body: { model_max_budget: { dollar: { budget_limit: budgetFor(1), time_period: "1d" } } },
      });
      expect(budget.status).toBe(200);
      const { key } = await newKey(gw, { budget_id: budget.body.budget_id });
      expect(await burst(gw, [key], 5)).toEqual({ ok: 1, refused: 4, other: [] });
      const refused = (await call(gw, key)).body.error.message;
      expect(refused).toContain("for model=dollar");
      expect(refused).toContain(`(from Budget=${budget.body.budget_id})`);
      expect((await call(gw, key, "cheap")).status).toBe(200);
    });
  });
}

describe("budget periods, alerts and temporary increases (pglite)", () => {
  let gw: TestGateway;
  let receiver: ReturnType<typeof jsonPostReceiver>;
  let hooks: Record<string, unknown>[];

  beforeAll(async () => {
    receiver = jsonPostReceiver();
    hooks = receiver.received;
    gw = await startBackendGateway("pglite", {
      ...CONFIG,
      general_settings: { master_key: MASTER_KEY, alert_webhook_url: receiver.url },
    });
  });
  afterAll(async () => {
    await gw?.stop();
    receiver?.stop();
  });

  test("budget_duration: spend returns to 0 at budget_reset_at, which moves forward", async () => {
    const { key, token } = await newKey(gw, { max_budget: budgetFor(1), budget_duration: "2s" });
    expect((await call(gw, key)).status).toBe(200);
    const refused = await call(gw, key);
    expect(refused.status).toBe(400);
    expect(refused.body.error.message).toContain("It resets at");
    const info = await requestJson<{ info: { budget_reset_at: string } }>(gw, "GET", `/key/info?key=${token}`);
    const resetAt = Date.parse(info.body.info.budget_reset_at);
    await Bun.sleep(Math.max(0, resetAt - Date.now()) + 20);
    // On time: the first call after the instant is served, without waiting for any sweep.
    expect((await call(gw, key)).status).toBe(200);
    await Bun.sleep(1100);
    const after = await requestJson<{ info: { spend: number; budget_reset_at: string } }>(gw, "GET", `/key/info?key=${token}`);
    expect(after.body.info.spend).toBeGreaterThanOrEqual(1);
    expect(after.body.info.spend).toBeLessThan(1.001);
    expect(Date.parse(after.body.info.budget_reset_at)).toBeGreaterThan(resetAt);
  }, 15_000);

  test("keys and teams on a budget object without a duration of their own reset on the budget's period", async () => {
    const made = await requestJson<{ budget_id: string; budget_reset_at: string }>(gw, "POST", "/budget/new", { body: { max_budget: budgetFor(1), budget_duration: "2s" } });
    expect(made.status).toBe(200);
    const budgetId = made.body.budget_id;
    const { key, token } = await newKey(gw, { budget_id: budgetId });
    const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { budget_id: budgetId } });
    const teamKey = await newKey(gw, { team_id: team.body.team_id });
    for (const k of [key, teamKey.key]) {
      expect((await call(gw, k)).status).toBe(200);
      expect((await call(gw, k)).body.error.message).toContain("It resets at");
    }
    const info = await requestJson<{ info: { budget_reset_at: string } }>(gw, "GET", `/key/info?key=${token}`);
    expect(Date.parse(info.body.info.budget_reset_at)).toBe(Date.parse(made.body.budget_reset_at));
    const org = await requestJson<{ budget_reset_at: string }>(gw, "POST", "/organization/new", { body: { organization_alias: "on-budget", budget_id: budgetId } });
    expect(org.status).toBe(200);
    expect(Date.parse(org.body.budget_reset_at)).toBe(Date.parse(made.body.budget_reset_at));
    await Bun.sleep(Math.max(0, Date.parse(made.body.budget_reset_at) - Date.now()) + 20);
    for (const k of [key, teamKey.key]) expect((await call(gw, k)).status).toBe(200);

    // A budget that gains a duration later takes the keys on it along.
    const flat = await requestJson<{ budget_id: string }>(gw, "POST", "/budget/new", { body: { max_budget: budgetFor(1) } });
    const onFlat = await newKey(gw, { budget_id: flat.body.budget_id });
    expect((await call(gw, onFlat.key)).status).toBe(200);
    expect((await call(gw, onFlat.key)).body.error.message).not.toContain("It resets at");
    const updated = await requestJson<{ budget_reset_at: string }>(gw, "POST", "/budget/update", { body: { budget_id: flat.body.budget_id, budget_duration: "1s" } });
    expect(updated.status).toBe(200);
    await Bun.sleep(Math.max(0, Date.parse(updated.body.budget_reset_at) - Date.now()) + 20);
    expect((await call(gw, onFlat.key)).status).toBe(200);
  }, 20_000);

  test("soft_budget: one alert per period, delivered to the webhook, and calls are not blocked", async () => {
    const { key, token } = await newKey(gw, { soft_budget: 1.5, max_budget: 100, key_alias: "soft-one" });
    for (let i = 0; i < 4; i++) expect((await call(gw, key)).status).toBe(200);
    await gw.host!.spendWriter.flush();
    for (let i = 0; i < 50 && hooks.filter((h) => h.token === token).length === 0; i++) await Bun.sleep(20);
    await Bun.sleep(100);
    const mine = hooks.filter((h) => h.token === token);
    expect(mine).toHaveLength(1);
    expect(mine[0]).toMatchObject({ event: "soft_budget_crossed", event_group: "key", soft_budget: 1.5, max_budget: 100 });
    expect(mine[0]!.spend as number).toBeGreaterThanOrEqual(1.5);
    const [stored] = await rows<{ n: string }>(gw.host!.store.db, sql`select count(*)::text as n from budget_alerts where counter_id = ${`key:${token}`}`);
    expect(stored!.n).toBe("1");

    // A soft budget without a max_budget alerts too (and never blocks).
    const softOnly = await newKey(gw, { soft_budget: 0.5 });
    for (let i = 0; i < 2; i++) expect((await call(gw, softOnly.key)).status).toBe(200);
    for (let i = 0; i < 50 && hooks.filter((h) => h.token === softOnly.token).length === 0; i++) await Bun.sleep(20);
    expect(hooks.filter((h) => h.token === softOnly.token)).toEqual([expect.objectContaining({ event: "soft_budget_crossed", max_budget: null, soft_budget: 0.5 })]);
  });

  test("temp_budget_increase raises the limit until temp_budget_expiry", async () => {
    const expiry = new Date(Date.now() + 1500).toISOString();
    const { key } = await newKey(gw, { max_budget: budgetFor(1), temp_budget_increase: 5, temp_budget_expiry: expiry });
    expect((await call(gw, key)).status).toBe(200);
    expect((await call(gw, key)).status).toBe(200);
    await Bun.sleep(Date.parse(expiry) - Date.now() + 20);
    expect((await call(gw, key)).status).toBe(400);
  });

  test("an admin spend reset makes room again at once", async () => {
    const { key, token } = await newKey(gw, { max_budget: budgetFor(1) });
    expect((await call(gw, key)).status).toBe(200);
    expect((await call(gw, key)).status).toBe(400);
    await gw.host!.spendWriter.flush();
    expect((await requestJson(gw, "POST", `/key/${token}/reset_spend`, { body: {} })).status).toBe(200);
    expect((await call(gw, key)).status).toBe(200);
  });
});

describe("provider budgets (pglite)", () => {
  test("router_settings.provider_budget_config caps a provider's spend per period", async () => {
    const gw = await startBackendGateway("pglite", { ...CONFIG, router_settings: { provider_budget_config: { mock: { budget_limit: budgetFor(3), time_period: "1d" } } } });
    try {
      const { key } = await newKey(gw, {});
      expect(await burst(gw, [key], 20)).toEqual({ ok: 3, refused: 17, other: [] });
      // The master key is capped too: the budget is the provider's, not a key's.
      const master = await call(gw, MASTER_KEY);
      expect(master.status).toBe(400);
      expect(master.body.error.message).toContain("Provider=mock");
    } finally {
      await gw.stop();
    }
  });

  test("a deployment whose provider budget cannot take the call is passed over for another of its group; refused only when none can", async () => {
    // Never reached: its provider's budget holds less than a call's $1 worst case.
    const overBudget = { svc_params: { model: "openai/dollar", api_base: "http://127.0.0.1:9/v1", api_key: "sk-x" }, model_info: DOLLAR.model_info };
    const gw = await startBackendGateway("pglite", {
      model_list: [
        { ...overBudget, model_name: "mixed" },
        { ...DOLLAR, model_name: "mixed" },
        { ...overBudget, model_name: "openai-only" },
      ],
      router_settings: { provider_budget_config: { openai: { budget_limit: 0.5, time_period: "1d" } } },
      general_settings: { master_key: MASTER_KEY },
    });
    try {
      const { key } = await newKey(gw, {});
      const calls = await Promise.all(Array.from({ length: 10 }, () => call(gw, key, "mixed")));
      expect(calls.map((c) => c.status)).toEqual(Array(10).fill(200));
      const refused = await call(gw, key, "openai-only");
      expect(refused.status).toBe(400);
      expect(refused.body.error.type).toBe("budget_exceeded");
      expect(refused.body.error.message).toContain("Provider=openai");
    } finally {
      await gw.stop();
    }
  });
});

describe("a deployment priced per second of the call (pglite)", () => {
  test("reserves its timeout at its rate: the request's timeout, else the deployment's, else the gateway's", async () => {
    // $0.001 a second of the call, no per-token price; budgets of $0.05 = 50 s.
    const perSecond = (name: string, options: Record<string, unknown> = {}) => ({ model_name: name, svc_params: { model: `mock/${name}`, ...options }, model_info: { input_cost_per_second: 0.001 } });
    const gw = await startBackendGateway("pglite", {
      model_list: [perSecond("timed", { timeout: 10 }), perSecond("untimed")],
      router_settings: { timeout: 100 },
      general_settings: { master_key: MASTER_KEY },
    });
    const ask = async (key: string, model: string, timeout?: number) => {
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 10, ...(timeout ? { timeout } : {}) }),
      });
      return { status: res.status, body: (await res.json()) as ErrorBody };
    };
    try {
      const { key, token } = await newKey(gw, { max_budget: 0.05 });
      // The deployment's 10 s: $0.01 reserved, within the budget.
      expect((await ask(key, "timed")).status).toBe(200);
      // The request's 60 s: $0.06, more than the budget holds.
      const long = await ask(key, "timed", 60);
      expect(long.status).toBe(400);
      expect(long.body.error.type).toBe("budget_exceeded");
      expect(long.body.error.message).toContain("may cost up to $0.06");
      // The request's 20 s: $0.02.
      expect((await ask(key, "untimed", 20)).status).toBe(200);
      // The gateway's 100 s: $0.1.
      const untimed = await ask(key, "untimed");
      expect(untimed.status).toBe(400);
      expect(untimed.body.error.message).toContain("may cost up to $0.1");
      expect(await spendOf(gw, "virtual_keys", "token", token)).toBeLessThan(0.001);
    } finally {
      await gw.stop();
    }
  }, 20_000);
});

describe("retries and budgets (pglite)", () => {
  test("a retry on a pricier deployment reserves its worst case first: the budget still holds", async () => {
    const gw = await startBackendGateway("pglite", {
      model_list: [
        // Cheapest, so picked first, and unreachable: every call is retried on the $1 deployment.
        {
          model_name: "mixed",
          svc_params: { model: "openai/cheap", api_base: "http://127.0.0.1:9/v1", api_key: "sk-x" },
          model_info: { input_cost_per_token: 1e-12, output_cost_per_token: 1e-9 },
        },
        { ...DOLLAR, model_name: "mixed" },
      ],
      router_settings: { routing_strategy: "cost-based-routing", num_retries: 2 },
      general_settings: { master_key: MASTER_KEY },
    });
    try {
      const poor = await newKey(gw, { max_budget: 0.1 });
      const refused = await call(gw, poor.key, "mixed");
      expect(refused.status).toBe(400);
      expect(refused.body.error.type).toBe("budget_exceeded");
      expect(refused.body.error.message).toContain("may cost up to $1.");
      expect(await spendOf(gw, "virtual_keys", "token", poor.token)).toBeLessThanOrEqual(0.1);

      const rich = await newKey(gw, { max_budget: budgetFor(1) });
      expect((await call(gw, rich.key, "mixed")).status).toBe(200);
      expect((await call(gw, rich.key, "mixed")).body.error.type).toBe("budget_exceeded");
      expect(await spendOf(gw, "virtual_keys", "token", rich.token)).toBeLessThanOrEqual(budgetFor(1));
    } finally {
      await gw.stop();
    }
  }, 20_000);
});

describe("calls billed for several answers (pglite, OpenAI wire mock)", () => {
  // gpt-4o from the bundled table: $2.50 / $10 per million tokens, at most 16,384 answer tokens.
  let mock: MockOpenAI;
  let gw: TestGateway;
  beforeAll(async () => {
    mock = await startMockOpenAI({ apiKey: "sk-up" });
    gw = await startBackendGateway("pglite", {
      model_list: [{ model_name: "gpt-4o", svc_params: { model: "openai/gpt-4o", api_base: mock.url, api_key: "sk-up" } }],
      general_settings: { master_key: MASTER_KEY },
    });
  }, 30_000);
  afterAll(async () => {
    await gw?.stop();
    await mock?.stop();
  });

  const post = async (key: string, path: string, body: Record<string, unknown>) => {
    const res = await fetch(`${gw.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${key}`, "content-type": "application/json" }, body: JSON.stringify({ model: "gpt-4o", ...body }) });
    return { status: res.status, body: (await res.json()) as ErrorBody };
  };

  test("n answers without max_tokens reserve the model's output limit for each: 3 at once against a budget for 2, 2 served, spend within it", async () => {
    const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { max_budget: 2 } });
    const { key } = await newKey(gw, { team_id: team.body.team_id });
    // Five answers of 16,000 tokens, each within the model's limit: $0.80005 a call, $0.8192875 reserved.
    const choices = Array.from({ length: 5 }, (_, index) => ({ index, message: { role: "assistant", content: "x" }, finish_reason: "length" }));
    const answer = { id: "chatcmpl-n5", object: "chat.completion", created: 1, model: "gpt-4o", choices, usage: { prompt_tokens: 20, completion_tokens: 80_000, total_tokens: 80_020 } };
    mock.fault(...Array.from({ length: 3 }, () => ({ kind: "answer" as const, body: answer })));
    const calls = await Promise.all(Array.from({ length: 3 }, () => post(key, "/v1/chat/completions", { n: 5, messages: [{ role: "user", content: "hi" }] })));
    mock.clearFaults();
    expect(calls.map((c) => c.status).sort()).toEqual([200, 200, 400]);
    const refused = calls.find((c) => c.status === 400)!;
    expect(refused.body.error.type).toBe("budget_exceeded");
    expect(refused.body.error.message).toContain("at the model's output limit for each of 5 answers (set max_tokens to reserve less)");
    expect(await spendOf(gw, "teams", "team_id", team.body.team_id)).toBeCloseTo(2 * 0.80005, 12);
  });

  test("completions reserve every best_of candidate, and every prompt of a batch: a call that may pass the budget is refused", async () => {
    const { key, token } = await newKey(gw, { max_budget: 0.01 });
    // 20 candidates of 100 tokens: $0.02. The upstream generates and bills them all.
    const bestOf = await post(key, "/v1/completions", { prompt: "hi", max_tokens: 100, best_of: 20 });
    expect(bestOf.status).toBe(400);
    expect(bestOf.body.error.message).toContain("at max_tokens=100 for each of 20 answers");
    // Three prompts of 400 tokens: $0.012.
    const batch = await post(key, "/v1/completions", { prompt: ["a", "b", "c"], max_tokens: 400 });
    expect(batch.status).toBe(400);
    expect(batch.body.error.message).toContain("at max_tokens=400 for each of 3 answers");
    // 5 candidates of 100 tokens fit ($0.005), and are charged as billed.
    mock.fault({ kind: "answer", body: { id: "cmpl-5", object: "text_completion", created: 1, model: "gpt-4o", choices: [{ index: 0, text: "x", finish_reason: "length", logprobs: null }], usage: { prompt_tokens: 5, completion_tokens: 500, total_tokens: 505 } } });
    expect((await post(key, "/v1/completions", { prompt: "hi", max_tokens: 100, best_of: 5 })).status).toBe(200);
    expect(await spendOf(gw, "virtual_keys", "token", token)).toBeCloseTo(5 * 2.5e-6 + 500 * 1e-5, 12);
    // best_of is a count: anything else is a 4xx naming it, not forwarded.
    const odd = await post(key, "/v1/completions", { prompt: "hi", max_tokens: 1, best_of: "20" });
    expect(odd.status).toBeGreaterThanOrEqual(400);
    expect(odd.status).toBeLessThan(500);
    expect(JSON.stringify(odd.body)).toContain("best_of");
  });
});

describe("two instances sharing PostgreSQL and Redis", () => {
  test("a key's budget for 10 calls holds across both: 100 calls at each, 10 succeed in all", async () => {
    const db = await freshDatabase("gw_budget2");
    const redisUrl = TEST_REDIS_URL;
    const a = await startTestGateway(CONFIG, { store: { databaseUrl: db.url, redisUrl } });
    const b = await startTestGateway(CONFIG, { store: { databaseUrl: db.url, redisUrl } });
    try {
      const max = budgetFor(10);
      const team = await requestJson<{ team_id: string }>(a, "POST", "/team/new", { body: { max_budget: budgetFor(20) } });
      const { key, token } = await newKey(a, { max_budget: max, team_id: team.body.team_id });
      // b learns of the key through the change bus.
      for (let i = 0; i < 100 && (await call(b, key, "cheap")).status !== 200; i++) await Bun.sleep(20);
      const [ra, rb] = await Promise.all([burst(a, [key], 100), burst(b, [key], 100)]);
      expect(ra.other).toEqual([]);
      expect(rb.other).toEqual([]);
      expect(ra.ok + rb.ok).toBe(10);
      await a.host!.spendWriter.flush();
      await b.host!.spendWriter.flush();
      const [row] = await rows<{ spend: string }>(a.host!.store.db, sql`select spend::text as spend from virtual_keys where token = ${token}`);
      expect(Number(row!.spend)).toBeLessThanOrEqual(max);
      expect(Number(row!.spend)).toBeGreaterThanOrEqual(10);

      // Team and organization budgets likewise: one key per instance, 50 calls at each.
      const org = await requestJson<{ organization_id: string }>(a, "POST", "/organization/new", { body: { organization_alias: "two-instances", max_budget: budgetFor(4) } });
      const orgTeam = await requestJson<{ team_id: string }>(a, "POST", "/team/new", { body: { organization_id: org.body.organization_id } });
      const team2 = await requestJson<{ team_id: string }>(a, "POST", "/team/new", { body: { max_budget: budgetFor(3) } });
      for (const [teamId, expected] of [
        [team2.body.team_id, 3],
        [orgTeam.body.team_id, 4],
      ] as const) {
        const ka = await newKey(a, { team_id: teamId });
        const kb = await newKey(a, { team_id: teamId });
        for (let i = 0; i < 100 && (await call(b, kb.key, "cheap")).status !== 200; i++) await Bun.sleep(20);
        const [x, y] = await Promise.all([burst(a, [ka.key], 50), burst(b, [kb.key], 50)]);
        expect(x.ok + y.ok).toBe(expected);
      }
    } finally {
      await a.stop();
      await b.stop();
      await db.drop();
    }
  }, 60_000);

  test("a budget removed on an instance that never met the key, then given again, counts what was spent without it", async () => {
    const db = await freshDatabase("gw_budget_gone");
    const redisUrl = TEST_REDIS_URL;
    const a = await startTestGateway(CONFIG, { store: { databaseUrl: db.url, redisUrl } });
    let b: TestGateway | undefined;
    try {
      // a meets the key's counter (in Redis), then goes away.
      const { key, token } = await newKey(a, { max_budget: 0 });
      expect((await call(a, key)).body.error.type).toBe("budget_exceeded");
      await a.stop();
      // b never met it: the budget goes, $2 is spent, a budget of $2 comes back.
      b = await startTestGateway(CONFIG, { store: { databaseUrl: db.url, redisUrl } });
      expect((await requestJson(b, "POST", "/key/update", { body: { key: token, max_budget: null } })).status).toBe(200);
      for (let i = 0; i < 2; i++) expect((await call(b, key)).status).toBe(200);
      expect((await requestJson(b, "POST", "/key/update", { body: { key: token, max_budget: budgetFor(2) } })).status).toBe(200);
      // Redis's counter from before the removal said $0; the store says $2.
      const last = await call(b, key);
      expect(last.body.error?.message, JSON.stringify(last.body).slice(0, 300)).toMatch(/^Budget would be exceeded: Key .* \(spend \$2\.0000000000\d+/);
    } finally {
      await a.stop();
      await b?.stop();
      await db.drop();
    }
  }, 60_000);
});

describe("Redis outage", () => {
  test("budgets keep holding on the local ledger while Redis is away, and Redis learns that spend when it is back", async () => {
    const { TcpRelay } = await import("../harness/relay.ts");
    const relay = await TcpRelay.start({ host: "127.0.0.1", port: 6379 });
    const db = await freshDatabase("gw_budget_redis");
    const gw = await startTestGateway(CONFIG, { store: { databaseUrl: db.url, redisUrl: testRedisUrlAt(relay.port) } });
    try {
      const { key } = await newKey(gw, { max_budget: budgetFor(6) });
      expect((await call(gw, key)).status).toBe(200);
      expect((await call(gw, key)).status).toBe(200);
      await Bun.sleep(50);
      relay.cut();
      expect(await burst(gw, [key], 3)).toEqual({ ok: 3, refused: 0, other: [] });
      expect(gw.log.lines.some((l) => l.msg.includes("budgets are counted on this instance alone"))).toBe(true);
      relay.restore();
      for (let i = 0; i < 100 && !gw.log.lines.some((l) => l.msg.includes("budgets are shared across instances again")); i++) {
        await call(gw, key, "cheap");
        await Bun.sleep(50);
      }
      await Bun.sleep(100);
      // 5 spent: one more fits, then the shared counter (which now includes the outage's 3) refuses.
      expect(await burst(gw, [key], 5)).toEqual({ ok: 1, refused: 4, other: [] });
    } finally {
      await gw.stop();
      await relay.close();
      await db.drop();
    }
  }, 30_000);
});
