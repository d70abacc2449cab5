// Rate limits through the gateway: rpm, tpm, parallel and per-model limits on keys, teams and
// organizations. The (N+1)th request in the window gets a 429 in the spec's envelope naming the
// limit, `retry-after` says when the oldest request leaves the 60 s window, the x-ratelimit-*
// headers count down on every call, and refused requests consume nothing.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { chatCall, type LimitReply } from "./chat-call.ts";
import { rateRefusal } from "../../plugins/rate-limits.ts";

type Reply = LimitReply;

let gw: TestGateway;
let slow: MockOpenAI;

const call = (key: string, model = "fast", extra: Record<string, unknown> = {}): Promise<Reply> => chatCall(gw, key, model, extra);

async function newKey(body: Record<string, unknown>): Promise<string> {
  const r = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body });
  expect(r.status).toBe(200);
  return r.body.key;
}

beforeAll(async () => {
  slow = await startMockOpenAI({ apiKey: "sk-up" });
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "fast", svc_params: { model: "mock/fast" } },
      { model_name: "other", svc_params: { model: "mock/other" } },
      { model_name: "capped", svc_params: { model: "mock/capped", rpm: 1 } },
      { model_name: "small-tpm", svc_params: { model: "mock/small-tpm", tpm: 1000 } },
      { model_name: "small-both", svc_params: { model: "mock/small-both", rpm: 1, tpm: 1000 } },
      { model_name: "slow", svc_params: { model: "openai/gpt-4o-mini", api_base: slow.url, api_key: "sk-up" } },
    ],
    router_settings: { model_group_alias: { "fast-alias": "fast" } },
    general_settings: { master_key: MASTER_KEY },
  });
});
afterAll(async () => {
  await gw?.stop();
  await slow?.stop();
});

describe("rate limits", () => {
  test("rpm on a key: headers count down, the 4th call is refused with retry-after up to the window, refusals consume nothing", async () => {
    const key = await newKey({ rpm_limit: 3 });
    const started = Date.now();
    const remaining: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await call(key);
      expect(r.status).toBe(200);
      expect(r.headers.get("x-ratelimit-limit-requests")).toBe("3");
      remaining.push(r.headers.get("x-ratelimit-remaining-requests")!);
    }
    expect(remaining).toEqual(["2", "1", "0"]);
    const refused = await call(key);
    expect(refused.status).toBe(429);
    expect(refused.body.error).toMatchObject({ type: "rate_limit_error", code: "429" });
    expect(refused.body.error!.message).toContain("requests per minute limit 3");
    const retryAfter = Number(refused.headers.get("retry-after"));
    // The first call leaves the window 60 s after it started.
    const expected = 60 - (Date.now() - started) / 1000;
    expect(Math.abs(retryAfter - expected)).toBeLessThanOrEqual(1);
    expect(refused.headers.get("x-ratelimit-remaining-requests")).toBe("0");
    // Refused calls did not count: the same answer again, and another key is unaffected.
    const again = await call(key);
    expect(again.status).toBe(429);
    expect(Number(again.headers.get("retry-after"))).toBeLessThanOrEqual(retryAfter);
    expect((await call(await newKey({ rpm_limit: 3 }))).status).toBe(200);
  });

  test("tpm on a key: the estimate is reserved, the real usage settled; a call that cannot fit is refused naming tokens", async () => {
    const key = await newKey({ tpm_limit: 200 });
    const first = await call(key, "fast", { max_tokens: 50 });
    expect(first.status).toBe(200);
    expect(first.headers.get("x-ratelimit-limit-tokens")).toBe("200");
    const afterFirst = Number(first.headers.get("x-ratelimit-remaining-tokens"));
    // Reserved: the prompt estimate plus max_tokens.
    expect(afterFirst).toBeLessThanOrEqual(150);
    // A call needing more than is left is refused and consumes nothing.
    const big = await call(key, "fast", { max_tokens: 190 });
    expect(big.status).toBe(429);
    expect(big.body.error!.message).toContain("tokens per minute limit 200");
    // After settling, the first call holds only what it used, so a 50-token call still fits.
    const second = await call(key, "fast", { max_tokens: 50 });
    expect(second.status).toBe(200);
    expect(Number(second.headers.get("x-ratelimit-remaining-tokens"))).toBeGreaterThan(afterFirst - 80);
    // A request larger than the whole limit is told so.
    const huge = await call(key, "fast", { max_tokens: 500 });
    expect(huge.status).toBe(429);
    expect(huge.body.error!.message).toContain("this request alone may use");
    expect(huge.body.error!.message).toContain("(lower max_tokens)");
  });

  test("tpm reserves max_tokens for each of the n answers a call asks for", async () => {
    const key = await newKey({ tpm_limit: 200 });
    // 5 answers of up to 50 tokens: more than the whole limit, though one of 50 fits.
    const five = await call(key, "fast", { max_tokens: 50, n: 5 });
    expect(five.status).toBe(429);
    expect(five.body.error!.message).toContain("this request alone may use");
    const one = await call(key, "fast", { max_tokens: 50 });
    expect(one.status).toBe(200);
  });

  test("a request too large for a tpm limit on an endpoint without max_tokens is not told to lower it", () => {
    const refusal = { ok: false as const, counter: { id: "key:k", label: "Key k", tpm: 10 }, kind: "tokens" as const, limit: 10, current: 0, retryAfterMs: 0 };
    const denied = rateRefusal(refusal, 50, "embeddings");
    expect(denied.error.message).toContain("this request alone may use 50 tokens (send less input)");
    expect(rateRefusal(refusal, 50, "chat").error.message).toContain("(lower max_tokens)");
  });

  test("max_parallel_requests: a second call while one is in flight is refused; the slot frees when it ends", async () => {
    const key = await newKey({ max_parallel_requests: 1 });
    slow.fault({ kind: "delay", ms: 600 });
    const first = call(key, "slow");
    await Bun.sleep(150);
    const second = await call(key, "slow");
    expect(second.status).toBe(429);
    expect(second.body.error!.message).toContain("parallel requests limit 1");
    expect((await first).status).toBe(200);
    expect((await call(key, "slow")).status).toBe(200);
  });

  test("model_rpm_limit on a key limits one model group only", async () => {
    const key = await newKey({ model_rpm_limit: { fast: 1 } });
    expect((await call(key, "fast")).status).toBe(200);
    const refused = await call(key, "fast");
    expect(refused.status).toBe(429);
    expect(refused.body.error!.message).toContain("for model=fast");
    expect((await call(key, "other")).status).toBe(200);
  });

  test("model_rpm_limit named by a model_group_alias limits the group it calls, by either name", async () => {
    const key = await newKey({ model_rpm_limit: { "fast-alias": 1 } });
    const first = await call(key, "fast-alias");
    expect([first.status, first.headers.get("x-ratelimit-limit-requests")]).toEqual([200, "1"]);
    for (const model of ["fast-alias", "fast"]) {
      const refused = await call(key, model);
      expect([model, refused.status]).toEqual([model, 429]);
      expect(refused.body.error!.message).toContain("for model=fast");
    }
    expect((await call(key, "other")).status).toBe(200);
  });

  test("a team's rpm is shared by its keys; an org's by its teams", async () => {
    const org = await requestJson<{ organization_id: string }>(gw, "POST", "/organization/new", { body: { organization_alias: "rl-org", rpm_limit: 3 } });
    expect(org.status).toBe(200);
    const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "rl-team", rpm_limit: 2, organization_id: org.body.organization_id } });
    expect(team.status).toBe(200);
    const other = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "rl-team-2", organization_id: org.body.organization_id } });
    const [a, b] = [await newKey({ team_id: team.body.team_id }), await newKey({ team_id: team.body.team_id })];
    const c = await newKey({ team_id: other.body.team_id });
    expect((await call(a)).status).toBe(200);
    expect((await call(b)).status).toBe(200);
    const refused = await call(a);
    expect(refused.status).toBe(429);
    expect(refused.body.error!.message).toContain(`Team=${team.body.team_id}`);
    // The org has one request left, taken by the other team's key; then the org refuses.
    expect((await call(c)).status).toBe(200);
    const orgRefused = await call(c);
    expect(orgRefused.status).toBe(429);
    expect(orgRefused.body.error!.message).toContain(`Organization=${org.body.organization_id}`);
  });

  test("a team member's rpm_limit holds across the member's keys in that team, not for other members", async () => {
    const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "rl-members" } });
    const teamId = team.body.team_id;
    for (const user_id of ["rl-ann", "rl-bob"]) {
      const added = await requestJson(gw, "POST", "/team/member_add", { body: { team_id: teamId, member: { role: "user", user_id } } });
      expect(added.status).toBe(200);
    }
    const limited = await requestJson(gw, "POST", "/team/member_update", { body: { team_id: teamId, user_id: "rl-ann", rpm_limit: 2 } });
    expect(limited.status).toBe(200);
    const [ann1, ann2, bob] = [await newKey({ team_id: teamId, user_id: "rl-ann" }), await newKey({ team_id: teamId, user_id: "rl-ann" }), await newKey({ team_id: teamId, user_id: "rl-bob" })];
    expect((await call(ann1)).status).toBe(200);
    expect((await call(ann2)).status).toBe(200);
    const refused = await call(ann1);
    expect(refused.status).toBe(429);
    expect(refused.body.error!.message).toContain(`User=rl-ann in Team=${teamId}`);
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThan(0);
    for (let i = 0; i < 3; i++) expect((await call(bob)).status).toBe(200);
  });

  describe("every limit kind on teams, organizations and users: the next call past it is refused, naming it", () => {
    let n = 0;
    /** A key governed by an entity of `level` that carries `limits`; returns the key and the entity's label. */
    async function keyUnder(level: "team" | "org" | "user", limits: Record<string, unknown>): Promise<{ key: string; label: string }> {
      const id = `grid-${level}-${++n}`;
      if (level === "team") {
        const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_id: id, ...limits } });
        expect(team.status).toBe(200);
        return { key: await newKey({ team_id: id }), label: `Team=${id}` };
      }
      if (level === "org") {
        const org = await requestJson(gw, "POST", "/organization/new", { body: { organization_id: id, organization_alias: id, ...limits } });
        expect(org.status).toBe(200);
        const team = await requestJson(gw, "POST", "/team/new", { body: { team_id: `${id}-team`, organization_id: id } });
        expect(team.status).toBe(200);
        return { key: await newKey({ team_id: `${id}-team` }), label: `Organization=${id}` };
      }
      const user = await requestJson(gw, "POST", "/user/new", { body: { user_id: id, ...limits } });
      expect(user.status).toBe(200);
      return { key: await newKey({ user_id: id }), label: `User=${id}` };
    }

    for (const level of ["team", "org", "user"] as const) {
      test(`${level}: rpm_limit, tpm_limit, max_parallel_requests`, async () => {
        const rpm = await keyUnder(level, { rpm_limit: 1 });
        expect((await call(rpm.key)).status).toBe(200);
        const r1 = await call(rpm.key);
        expect([r1.status, r1.body.error?.message]).toEqual([429, expect.stringContaining(`${rpm.label}: requests per minute limit 1`)]);

        // "hello there" plus max_tokens 60 fits 100 tokens once; the real usage (a few tokens) is settled, so a second fits too, a third not.
        const tpm = await keyUnder(level, { tpm_limit: 100 });
        const results = [];
        for (let i = 0; i < 3; i++) results.push(await call(tpm.key, "fast", { max_tokens: 60 }));
        expect(results.map((r) => r.status)).toEqual([200, 200, 429]);
        expect(results[2]!.body.error!.message).toContain(`${tpm.label}: tokens per minute limit 100`);

        const parallel = await keyUnder(level, { max_parallel_requests: 1 });
        slow.fault({ kind: "delay", ms: 500 });
        const first = call(parallel.key, "slow");
        await Bun.sleep(150);
        const second = await call(parallel.key, "slow");
        expect([second.status, second.body.error?.message]).toEqual([429, expect.stringContaining(`${parallel.label}: parallel requests limit 1`)]);
        expect((await first).status).toBe(200);
        expect((await call(parallel.key, "slow")).status).toBe(200);
      });
    }

    for (const level of ["team", "org"] as const) {
      test(`${level}: model_rpm_limit and model_tpm_limit hold one model group only`, async () => {
        const rpm = await keyUnder(level, { model_rpm_limit: { fast: 1 } });
        expect((await call(rpm.key)).status).toBe(200);
        const refused = await call(rpm.key);
        expect([refused.status, refused.body.error?.message]).toEqual([429, expect.stringContaining(`${rpm.label} for model=fast: requests per minute limit 1`)]);
        expect((await call(rpm.key, "other")).status).toBe(200);

        const tpm = await keyUnder(level, { model_tpm_limit: { fast: 50 } });
        const big = await call(tpm.key, "fast", { max_tokens: 60 });
        expect([big.status, big.body.error?.message]).toEqual([429, expect.stringContaining(`${tpm.label} for model=fast: tokens per minute limit 50`)]);
        expect((await call(tpm.key, "other", { max_tokens: 60 })).status).toBe(200);
      });
    }
  });

  test("a call refused after its limits were counted (a budget, every deployment at its rpm) consumes nothing of them", async () => {
    const key = await newKey({ rpm_limit: 2 });
    expect((await call(key, "capped")).status).toBe(200);
    const atCapacity = await call(key, "capped");
    expect(atCapacity.status).toBe(429);
    expect(atCapacity.body.error!.message).toContain("every deployment is at its rpm/tpm limit");
    // The refused call took nothing: the key still has one request of its two.
    const next = await call(key);
    expect(next.status).toBe(200);
    expect(next.headers.get("x-ratelimit-remaining-requests")).toBe("0");

    const broke = await newKey({ rpm_limit: 1, max_budget: 1, spend: 5 });
    for (let i = 0; i < 3; i++) expect((await call(broke)).body.error?.type).toBe("budget_exceeded");
    expect((await requestJson(gw, "POST", "/key/update", { body: { key: broke, max_budget: 100 } })).status).toBe(200);
    const paid = await call(broke);
    expect(paid.status).toBe(200);
    expect(paid.headers.get("x-ratelimit-remaining-requests")).toBe("0");
  });

  test("a request larger than the key's tpm_limit and than every deployment's tpm keeps the key's refusal, which says how to make it fit", async () => {
    const key = await newKey({ tpm_limit: 1000 });
    const tooLarge = await call(key, "small-tpm", { max_tokens: 5000 });
    expect(tooLarge.status).toBe(429);
    expect(tooLarge.body.error!.message).toContain("tokens per minute limit 1000, and this request alone may use");
    expect(tooLarge.body.error!.message).toContain("lower max_tokens");
  });

  test("a request larger than every deployment's whole tpm, from a caller without a tpm limit, is told it never fits: no retry-after, how to make it smaller", async () => {
    const tooLarge = await call(MASTER_KEY, "small-tpm", { max_tokens: 5000 });
    expect(tooLarge.status).toBe(429);
    expect(tooLarge.body.error!.message).toContain("this request alone may use");
    expect(tooLarge.body.error!.message).toContain("largest tpm 1000); lower max_tokens");
    expect(tooLarge.body.error!.message).not.toContain("Try again");
    expect(tooLarge.headers.get("retry-after")).toBeNull();
    // One that fits is served.
    expect((await call(MASTER_KEY, "small-tpm", { max_tokens: 10 })).status).toBe(200);
  });

  test("a request larger than every deployment's whole tpm is told it never fits also while their rpm is used up", async () => {
    expect((await call(MASTER_KEY, "small-both", { max_tokens: 10 })).status).toBe(200);
    const tooLarge = await call(MASTER_KEY, "small-both", { max_tokens: 5000 });
    expect([tooLarge.status, tooLarge.body.error?.message]).toEqual([429, expect.stringContaining("this request alone may use")]);
    expect(tooLarge.body.error!.message).toContain("largest tpm 1000); lower max_tokens");
    expect(tooLarge.headers.get("retry-after")).toBeNull();
    // A caller's own limits likewise: its rpm used up, a request larger than its tpm_limit is told so.
    const key = await newKey({ rpm_limit: 1, tpm_limit: 1000 });
    expect((await call(key, "fast", { max_tokens: 10 })).status).toBe(200);
    const own = await call(key, "fast", { max_tokens: 5000 });
    expect([own.status, own.body.error?.message]).toEqual([429, expect.stringContaining("tokens per minute limit 1000, and this request alone may use")]);
  });

  test("the master key and keys without limits carry no rate-limit headers of the gateway and are never refused", async () => {
    const r = await call(MASTER_KEY);
    expect(r.status).toBe(200);
    expect(r.headers.get("x-ratelimit-limit-requests")).toBeNull();
  });

  test("an OpenAI upstream's own rate-limit headers are passed on for the kinds no gateway limit covers", async () => {
    const open = await call(MASTER_KEY, "slow");
    expect(["limit-requests", "remaining-requests", "limit-tokens", "remaining-tokens"].map((h) => open.headers.get(`x-ratelimit-${h}`))).toEqual([
      "10000",
      "9999",
      "30000000",
      "29999990",
    ]);
    const limited = await call(await newKey({ rpm_limit: 5 }), "slow");
    expect([limited.headers.get("x-ratelimit-limit-requests"), limited.headers.get("x-ratelimit-remaining-requests")]).toEqual(["5", "4"]);
    expect(limited.headers.get("x-ratelimit-limit-tokens")).toBe("30000000");
  });

  test("an error answer of a call that was counted says what is left too", async () => {
    const key = await newKey({ rpm_limit: 5, tpm_limit: 1000 });
    const counted = (r: Reply) => ["limit-requests", "remaining-requests", "limit-tokens"].map((h) => r.headers.get(`x-ratelimit-${h}`));
    expect(counted(await call(key, "slow"))).toEqual(["5", "4", "1000"]);
    slow.fault({ kind: "status", status: 500 });
    const failed = await call(key, "slow");
    expect(failed.status).toBe(500);
    expect(counted(failed)).toEqual(["5", "3", "1000"]);
    slow.fault({ kind: "status", status: 400 });
    const refused = await call(key, "slow");
    expect(refused.status).toBe(400);
    expect(counted(refused)).toEqual(["5", "2", "1000"]);
  });
});
