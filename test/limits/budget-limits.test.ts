// Rate limits that come from a budget object (`/budget/new`, linked by `budget_id` from keys, teams,
// organizations and team memberships) and from users, through the gateway: the call past a
// budget's rpm / tpm / parallel / per-model limit is refused with a 429 that names the limit and
// the budget it comes from, every key on a budget has the budget's limit for itself, a
// /budget/update reaches the next call, and a user's limits hold all of the user's keys together.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { chatCall, type LimitReply } from "./chat-call.ts";

type Reply = LimitReply;

let gw: TestGateway;
let slow: MockOpenAI;

const call = (key: string, model = "fast", extra: Record<string, unknown> = {}): Promise<Reply> => chatCall(gw, key, model, extra);

async function post<T = Record<string, unknown>>(path: string, body: Record<string, unknown>): Promise<T> {
  const r = await requestJson<T>(gw, "POST", path, { body });
  expect(r.status, `${path}: ${r.text}`).toBe(200);
  return r.body;
}

const newKey = async (body: Record<string, unknown>) => (await post<{ key: string }>("/key/generate", body)).key;
const newBudget = async (body: Record<string, unknown>) => (await post<{ budget_id: string }>("/budget/new", body)).budget_id;
const nameOf = (key: string) => `Key sk-...${key.slice(-4)}`;
const requestHeaders = (r: Reply) => [r.headers.get("x-ratelimit-limit-requests"), r.headers.get("x-ratelimit-remaining-requests")];

beforeAll(async () => {
  slow = await startMockOpenAI({ apiKey: "sk-up" });
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "fast", svc_params: { model: "mock/fast" } },
      { model_name: "other", svc_params: { model: "mock/other" } },
      { model_name: "slow", svc_params: { model: "openai/gpt-4o-mini", api_base: slow.url, api_key: "sk-up" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
});
afterAll(async () => {
  await gw?.stop();
  await slow?.stop();
});

describe("limits of a budget object", () => {
  test("a key on a budget with rpm_limit 2: the 3rd call in a minute is refused naming the budget; /budget/update moves the limit for the next call", async () => {
    const budget = await newBudget({ rpm_limit: 2 });
    const key = await newKey({ budget_id: budget });
    const started = Date.now();
    const granted = [await call(key), await call(key)];
    expect(granted.map((r) => r.status)).toEqual([200, 200]);
    expect(granted.map(requestHeaders)).toEqual([
      ["2", "1"],
      ["2", "0"],
    ]);
    const refused = await call(key);
    expect(refused.status).toBe(429);
    expect(refused.body.error).toMatchObject({ type: "rate_limit_error", code: "429" });
    expect(refused.body.error!.message).toStartWith(`Rate limit exceeded for ${nameOf(key)}: requests per minute limit 2 (from Budget=${budget}), 2 used in the last 60 s. Try again in `);
    const retryAfter = Number(refused.headers.get("retry-after"));
    expect(Math.abs(retryAfter - (60 - (Date.now() - started) / 1000))).toBeLessThanOrEqual(1);
    expect(requestHeaders(refused)).toEqual(["2", "0"]);
    // The refusal took nothing: the same answer again.
    expect((await call(key)).status).toBe(429);

    // Raised: the two calls of the window count against the new limit.
    await post("/budget/update", { budget_id: budget, rpm_limit: 4 });
    const after = [await call(key), await call(key), await call(key)];
    expect(after.map((r) => r.status)).toEqual([200, 200, 429]);
    expect(after.slice(0, 2).map(requestHeaders)).toEqual([
      ["4", "1"],
      ["4", "0"],
    ]);
    expect(after[2]!.body.error!.message).toContain(`requests per minute limit 4 (from Budget=${budget}), 4 used`);
    // Lowered, and then cleared: the key has no limit left.
    await post("/budget/update", { budget_id: budget, rpm_limit: 1 });
    expect((await call(key)).body.error!.message).toContain("requests per minute limit 1 (from Budget=");
    await post("/budget/update", { budget_id: budget, rpm_limit: null });
    const free = await call(key);
    expect(free.status).toBe(200);
    expect(free.headers.get("x-ratelimit-limit-requests")).toBeNull();
  });

  test("every key on a budget has the budget's limit for itself; a key's own limit wins over the budget's and is named as the key's", async () => {
    const budget = await newBudget({ rpm_limit: 1 });
    const [a, b] = [await newKey({ budget_id: budget }), await newKey({ budget_id: budget })];
    expect((await call(a)).status).toBe(200);
    expect((await call(b)).status).toBe(200);
    expect((await call(a)).body.error!.message).toContain(`${nameOf(a)}: requests per minute limit 1 (from Budget=${budget})`);
    const own = await newKey({ budget_id: budget, rpm_limit: 2 });
    expect([(await call(own)).status, (await call(own)).status]).toEqual([200, 200]);
    const refused = await call(own);
    expect(refused.body.error!.message).toStartWith(`Rate limit exceeded for ${nameOf(own)}: requests per minute limit 2, 2 used`);
  });

  test("a budget's tpm_limit and max_parallel_requests hold the keys on it", async () => {
    // "hello there" plus max_tokens 60 fits 100 tokens once; the real usage (a few tokens) is settled, so a second fits too, a third not.
    const tpm = await newBudget({ tpm_limit: 100 });
    const key = await newKey({ budget_id: tpm });
    const results = [];
    for (let i = 0; i < 3; i++) results.push(await call(key, "fast", { max_tokens: 60 }));
    expect(results.map((r) => r.status)).toEqual([200, 200, 429]);
    expect(results[0]!.headers.get("x-ratelimit-limit-tokens")).toBe("100");
    expect(results[2]!.body.error!.message).toContain(`${nameOf(key)}: tokens per minute limit 100 (from Budget=${tpm}), `);
    expect(results[2]!.headers.get("x-ratelimit-limit-tokens")).toBe("100");

    const parallel = await newBudget({ max_parallel_requests: 1 });
    const pkey = await newKey({ budget_id: parallel });
    slow.fault({ kind: "delay", ms: 500 });
    const first = call(pkey, "slow");
    await Bun.sleep(150);
    const second = await call(pkey, "slow");
    expect([second.status, second.body.error?.message]).toEqual([429, `Rate limit exceeded for ${nameOf(pkey)}: parallel requests limit 1 (from Budget=${parallel}), 1 requests in flight.`]);
    expect(second.headers.get("retry-after")).toBe("1");
    expect((await first).status).toBe(200);
    expect((await call(pkey, "slow")).status).toBe(200);
  });

  test("a budget's model_max_budget entries carry per-model rpm_limit / tpm_limit: they hold its keys on that model group only", async () => {
    const budget = await newBudget({ model_max_budget: { fast: { max_budget: 100, budget_duration: "1d", rpm_limit: 1 }, other: { tpm_limit: 50 } } });
    const key = await newKey({ budget_id: budget });
    expect((await call(key)).status).toBe(200);
    const refused = await call(key);
    expect([refused.status, refused.body.error?.message]).toEqual([429, expect.stringContaining(`${nameOf(key)} for model=fast: requests per minute limit 1 (from Budget=${budget}), 1 used`)]);
    const big = await call(key, "other", { max_tokens: 60 });
    expect([big.status, big.body.error?.message]).toEqual([429, expect.stringContaining(`${nameOf(key)} for model=other: tokens per minute limit 50 (from Budget=${budget})`)]);
    expect((await call(key, "other", { max_tokens: 10 })).status).toBe(200);
    // The entry updated: the next call sees it.
    await post("/budget/update", { budget_id: budget, model_max_budget: { fast: { max_budget: 100, budget_duration: "1d", rpm_limit: 3 } } });
    expect((await call(key)).status).toBe(200);
    expect((await call(key, "other", { max_tokens: 60 })).status).toBe(200);
  });

  test("a team on a budget, and a team member on one, take their limits from it", async () => {
    const budget = await newBudget({ rpm_limit: 1 });
    const team = await post<{ team_id: string }>("/team/new", { team_alias: "on-budget", budget_id: budget });
    const key = await newKey({ team_id: team.team_id });
    expect((await call(key)).status).toBe(200);
    expect((await call(key)).body.error!.message).toContain(`Team=${team.team_id}: requests per minute limit 1 (from Budget=${budget})`);

    // A membership's budget object (LiteLLM keeps a member's limits there); no route sets it, so the store is written directly.
    const members = await post<{ team_id: string }>("/team/new", { team_alias: "member-budget" });
    await post("/team/member_add", { team_id: members.team_id, member: { role: "user", user_id: "bl-ann" } });
    const memberBudget = await newBudget({ rpm_limit: 1, tpm_limit: 100_000 });
    await gw.host!.store.db.execute(sql`update team_members set budget_id = ${memberBudget} where team_id = ${members.team_id} and user_id = 'bl-ann'`);
    await gw.host!.services.identity!.apply({ kind: "team_members", teamId: members.team_id });
    const annKey = await newKey({ team_id: members.team_id, user_id: "bl-ann" });
    const granted = await call(annKey);
    expect(granted.status).toBe(200);
    expect(granted.headers.get("x-ratelimit-limit-tokens")).toBe("100000");
    expect((await call(annKey)).body.error!.message).toContain(`User=bl-ann in Team=${members.team_id}: requests per minute limit 1 (from Budget=${memberBudget})`);
  });

  test("an organization's limits are its budget's: /budget/update on that budget changes what the org allows and shows", async () => {
    const org = await post<{ organization_id: string; budget_id: string }>("/organization/new", { organization_alias: "bl-org", rpm_limit: 1 });
    const team = await post<{ team_id: string }>("/team/new", { team_alias: "bl-org-team", organization_id: org.organization_id });
    const key = await newKey({ team_id: team.team_id });
    expect((await call(key)).status).toBe(200);
    expect((await call(key)).body.error!.message).toContain(`Organization=${org.organization_id}: requests per minute limit 1, 1 used`);
    await post("/budget/update", { budget_id: org.budget_id, rpm_limit: 2 });
    expect((await call(key)).status).toBe(200);
    expect((await call(key)).body.error!.message).toContain(`Organization=${org.organization_id}: requests per minute limit 2, 2 used`);
    const info = await requestJson<{ rpm_limit: number; budget: { rpm_limit: number } }>(gw, "GET", `/organization/info?organization_id=${org.organization_id}`);
    expect([info.body.rpm_limit, info.body.budget.rpm_limit]).toEqual([2, 2]);
  });
});

describe("limits of a user", () => {
  test("a user's tpm_limit is shared by all of the user's keys, personal and in a team", async () => {
    await post("/user/new", { user_id: "bl-tpm-user", tpm_limit: 100, auto_create_key: false });
    const team = await post<{ team_id: string }>("/team/new", { team_alias: "bl-user-team" });
    await post("/team/member_add", { team_id: team.team_id, member: { role: "user", user_id: "bl-tpm-user" } });
    const personal = await newKey({ user_id: "bl-tpm-user" });
    const inTeam = await newKey({ user_id: "bl-tpm-user", team_id: team.team_id });
    const results = [await call(personal, "fast", { max_tokens: 60 }), await call(inTeam, "fast", { max_tokens: 60 }), await call(personal, "fast", { max_tokens: 60 })];
    expect(results.map((r) => r.status)).toEqual([200, 200, 429]);
    expect(results[2]!.body.error!.message).toContain("User=bl-tpm-user: tokens per minute limit 100, ");
  });

  test("a user's model_rpm_limit holds the user's keys together on that model group only", async () => {
    await post("/user/new", { user_id: "bl-model-user", model_rpm_limit: { fast: 1 }, auto_create_key: false });
    const [a, b] = [await newKey({ user_id: "bl-model-user" }), await newKey({ user_id: "bl-model-user" })];
    expect((await call(a)).status).toBe(200);
    const refused = await call(b);
    expect([refused.status, refused.body.error?.message]).toEqual([429, expect.stringContaining("User=bl-model-user for model=fast: requests per minute limit 1, 1 used")]);
    expect((await call(b, "other")).status).toBe(200);
    // /user/update reaches the next call.
    await post("/user/update", { user_id: "bl-model-user", model_rpm_limit: { fast: 2 } });
    expect((await call(b)).status).toBe(200);
  });
});
