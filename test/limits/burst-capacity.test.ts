// A burst at a model group whose every deployment is at its own rpm is refused naming the
// deployments, not the caller's limit: calls the deployments refuse count against the key's
// limits only until they give them back (a round trip later with the windows in Redis), so a
// refusal by the key's limit meanwhile would blame requests the key never made.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

let gw: TestGateway;
// Redis is shared by every run on this machine: names of this run's own.
const run = Math.random().toString(36).slice(2, 8);

beforeAll(async () => {
  gw = await startBackendGateway(
    "postgres",
    {
      model_list: [
        { model_name: "capped", svc_params: { model: "mock/c1", rpm: 1 }, model_info: { id: `burst-c1-${run}` } },
        { model_name: "capped", svc_params: { model: "mock/c2", rpm: 1 }, model_info: { id: `burst-c2-${run}` } },
        { model_name: "open", svc_params: { model: "mock/open" }, model_info: { id: `burst-open-${run}` } },
      ],
      general_settings: { master_key: MASTER_KEY },
    },
    { redisUrl: "redis://127.0.0.1:6379" },
  );
}, 120_000);
afterAll(async () => {
  await gw?.stop();
}, 30_000);

async function call(key: string, model: string): Promise<{ status: number; headers: Headers; message?: string }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] }),
  });
  const body = (await res.json()) as { error?: { message: string } };
  return { status: res.status, headers: res.headers, message: body.error?.message };
}

test("a burst past the deployments' rpm is refused naming them, and the key keeps what it did not use", async () => {
  const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { rpm_limit: 6 } });
  const key = made.body.key;
  const replies = await Promise.all(Array.from({ length: 12 }, () => call(key, "capped")));
  expect(replies.filter((r) => r.status === 200).length).toBe(2);
  const refused = replies.filter((r) => r.status !== 200);
  expect(new Set(refused.map((r) => r.status))).toEqual(new Set([429]));
  for (const r of refused) {
    expect(r.message).toContain("No deployments available for model capped: every deployment is at its rpm/tpm limit");
    expect(Number(r.headers.get("retry-after"))).toBeGreaterThan(50);
  }
  // Two of the key's six requests were used; this is the third.
  const next = await call(key, "open");
  expect(next.status).toBe(200);
  expect(next.headers.get("x-ratelimit-remaining-requests")).toBe("3");
});
