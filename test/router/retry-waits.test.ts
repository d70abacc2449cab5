// Waits asked for by an upstream's `retry-after` or by `retry_after` longer than a timer holds
// (2^31-1 ms, ~24.8 days) or than an attempt may take: a retry that would have to wait longer than
// the call's timeout is not made (the upstream's 429 and its retry-after come back at once, or a
// fallback answers); a longer wait within the timeout is really waited (not cut to nothing by the
// timer), until the client leaves; a deployment's cooldown is at most a day, whatever the
// upstream asked.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { resetDeploymentStates } from "../../core/router/deployment-state.ts";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const HUGE = "99999999";
let a: MockOpenAI;
let b: MockOpenAI;
let gw: TestGateway;
let patient: TestGateway;

const deployment = (group: string, id: string, m: MockOpenAI) => ({ model_name: group, svc_params: { model: "openai/gpt-4o-mini", api_base: m.url, api_key: "sk-up" }, model_info: { id } });

function post(g: TestGateway, body: Record<string, unknown>, signal?: AbortSignal): Promise<Response> {
  return fetch(`${g.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], ...body }),
    signal,
  });
}

const rateLimited = (retryAfter: string) => ({ kind: "status" as const, status: 429, headers: { "retry-after": retryAfter } });

beforeAll(async () => {
  [a, b] = await Promise.all([startMockOpenAI({ apiKey: "sk-up" }), startMockOpenAI({ apiKey: "sk-up" })]);
  gw = await startTestGateway({
    model_list: [deployment("solo", "solo-a", a), deployment("covered", "covered-a", a), deployment("spare", "spare-b", b), deployment("duo", "duo-1", a), deployment("duo", "duo-2", a)],
    router_settings: { retry_initial_delay: 0.01, fallbacks: [{ covered: ["spare"] }] },
    general_settings: { master_key: MASTER_KEY },
  });
  // A minimum wait between retries of 35 days: past what one timer holds.
  patient = await startTestGateway({
    model_list: [deployment("patient", "patient-a", a)],
    router_settings: { retry_after: 35 * 86_400, num_retries: 1 },
    general_settings: { master_key: MASTER_KEY },
  });
}, 30_000);
afterAll(async () => {
  await Promise.all([gw?.stop(), patient?.stop()]);
  await Promise.all([a?.stop(), b?.stop()]);
}, 30_000);
beforeEach(() => {
  a.reset();
  b.reset();
  resetDeploymentStates();
});

describe("an upstream's retry-after", () => {
  test("longer than the call's timeout: not retried, the 429 and its retry-after come back at once", async () => {
    a.fault(rateLimited(HUGE));
    const t0 = Date.now();
    const res = await post(gw, { model: "solo", num_retries: 1 });
    expect(res.status).toBe(429);
    expect(res.headers.get("retry-after")).toBe(HUGE);
    expect(res.headers.get("x-svc-attempted-retries")).toBe("0");
    expect(a.requests.length).toBe(1);
    expect(Date.now() - t0).toBeLessThan(2000);
  });

  test("an HTTP date years ahead is the same", async () => {
    a.fault(rateLimited("Fri, 31 Dec 9999 23:59:59 GMT"));
    const res = await post(gw, { model: "solo", num_retries: 1 });
    expect(res.status).toBe(429);
    expect(a.requests.length).toBe(1);
  });

  test("a wait the timeout allows is waited in full (past the 8 s backoff cap) before going back to the same deployment", async () => {
    a.fault(rateLimited("9"));
    const t0 = Date.now();
    const res = await post(gw, { model: "solo", num_retries: 1 });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-svc-attempted-retries")).toBe("1");
    expect(Date.now() - t0).toBeGreaterThanOrEqual(9000);
  });

  test("the group's fallback answers at once instead", async () => {
    a.fault(rateLimited(HUGE));
    const t0 = Date.now();
    const res = await post(gw, { model: "covered", num_retries: 1 });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-svc-model-id")).toBe("spare-b");
    expect(Date.now() - t0).toBeLessThan(2000);
  });

  test("another deployment of the group not yet tried is asked at once, whatever the first one's retry-after", async () => {
    a.fault(rateLimited("30"));
    const t0 = Date.now();
    const res = await post(gw, { model: "duo", num_retries: 1 });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-svc-attempted-retries")).toBe("1");
    expect(a.requests.length).toBe(2);
    // Before: the retry waited the backoff and up to 8 s of the upstream's retry-after.
    expect(Date.now() - t0).toBeLessThan(2000);
  });

  test("cools a deployment down for at most a day", async () => {
    a.fault(rateLimited(HUGE), rateLimited(HUGE));
    expect((await post(gw, { model: "duo" })).status).toBe(429);
    expect((await post(gw, { model: "duo" })).status).toBe(429);
    const res = await post(gw, { model: "duo" });
    expect(res.status).toBe(429);
    expect(((await res.json()) as { error: { message: string } }).error.message).toContain("all 2 are cooling down");
    // No deployment was asked, and the answer still names the group.
    expect(res.headers.get("x-svc-model-group")).toBe("duo");
    expect(Number(res.headers.get("retry-after"))).toBe(86_400);
    expect(a.requests.length).toBe(2);
  });
});

describe("retry_after longer than a timer holds", () => {
  test("past the call's timeout: the failure comes back at once, not retried", async () => {
    a.fault({ kind: "status", status: 500 });
    const res = await post(patient, { model: "patient" });
    expect(res.status).toBe(500);
    expect(res.headers.get("x-svc-attempted-retries")).toBe("0");
    expect(a.requests.length).toBe(1);
  });

  test("within a longer request timeout: really waited (not retried at once), until the client leaves", async () => {
    a.fault({ kind: "status", status: 500 });
    const client = new AbortController();
    const pending = post(patient, { model: "patient", timeout: 100 * 86_400 }, client.signal).catch((err: unknown) => err);
    await Bun.sleep(800);
    expect(a.requests.length).toBe(1);
    client.abort();
    expect(await pending).toBeInstanceOf(Error);
    await Bun.sleep(300);
    expect(a.requests.length).toBe(1);
  });
});
