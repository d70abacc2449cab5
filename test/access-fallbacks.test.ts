// A client's own fallbacks (`fallbacks` in the body) cannot reach a model its key may not call
// (LiteLLM checks them too; its model-access escalations, #8029, came through other doors): the
// fallback is skipped and the call fails as its own model failed; one the key may call serves. A
// fallback the key may not use now (its per-model rate limit) is skipped the same way.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "./harness/gateway.ts";

let gw: TestGateway;
beforeAll(async () => {
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "broken", svc_params: { model: "openai/gpt-x", api_base: "http://127.0.0.1:9/v1", api_key: "sk-up" } },
      { model_name: "secret", svc_params: { model: "mock/secret", mock_response: "from secret" } },
      { model_name: "open", svc_params: { model: "mock/open", mock_response: "from open" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
});
afterAll(() => gw?.stop());

async function chat(key: string, fallbacks: string[]): Promise<{ status: number; text: string; model: string | null }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "broken", messages: [{ role: "user", content: "hi" }], fallbacks }),
  });
  return { status: res.status, text: await res.text(), model: res.headers.get("x-svc-model-group") };
}

test("a request's fallbacks are checked against the key's models", async () => {
  const { body } = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["broken", "open"] } });
  const denied = await chat(body.key, ["secret"]);
  expect(denied.status).not.toBe(200);
  expect(denied.text).not.toContain("from secret");
  const allowed = await chat(body.key, ["secret", "open"]);
  expect([allowed.status, allowed.text.includes("from open")]).toEqual([200, true]);
});

test("fallbacks the key may not use are one warning per call, however many the body names", async () => {
  const { body } = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["broken"] } });
  const names = ["secret", ...Array.from({ length: 5000 }, (_, i) => `not-mine-${i}`)];
  const before = gw.log.lines.length;
  const r = await chat(body.key, names);
  expect(r.status).not.toBe(200);
  const warnings = gw.log.lines.slice(before).filter((l) => l.msg.startsWith("fallback"));
  expect(warnings).toEqual([{ level: "warn", msg: "fallbacks skipped: the key may not use them", fields: { models: names.slice(0, 5), count: names.length } }]);
});

test("a fallback the key's per-model rate limit refuses now is passed over: the next one answers", async () => {
  const { body } = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["broken", "secret", "open"], model_rpm_limit: { secret: 1 } } });
  expect((await chat(body.key, ["secret"])).text).toContain("from secret");
  const passedOver = await chat(body.key, ["secret", "open"]);
  expect([passedOver.status, passedOver.text.includes("from open"), passedOver.model]).toEqual([200, true, "open"]);
  // With nothing after it, its refusal is the answer.
  const refused = await chat(body.key, ["secret"]);
  expect(refused.status).toBe(429);
  expect(refused.text).toContain("model=secret");
});
