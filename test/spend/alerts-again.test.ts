// LiteLLM #16185: budget alerts stop after the first one. A budget without a period (no
// budget_duration) is crossed once per "period" for good, so before, once its alert had been sent,
// an admin spend reset or a raised budget crossed again in silence. Now a spend reset (the key's,
// or the global one) and a new threshold each make the next crossing alert again; a crossing of the
// same threshold without a reset still alerts once. A soft budget or max_budget written at or below
// the spend already made alerts once too, at the next call (before, only a call that went from below
// the line to past it did).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { DOLLAR_MODEL, dollarCall } from "../harness/traffic.ts";
import { jsonPostReceiver } from "../harness/util.ts";

let gw: TestGateway;
let receiver: ReturnType<typeof jsonPostReceiver>;
let hooks: Record<string, unknown>[];

beforeAll(async () => {
  receiver = jsonPostReceiver();
  hooks = receiver.received;
  gw = await startBackendGateway("pglite", {
    model_list: [DOLLAR_MODEL],
    general_settings: { master_key: MASTER_KEY, alert_webhook_url: receiver.url },
  });
});
afterAll(async () => {
  await gw?.stop();
  receiver?.stop();
});

async function calls(key: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) expect((await dollarCall(gw, key)).status).toBe(200);
}

/** The events delivered for the key so far, once the writer and the deliveries have caught up. */
async function events(token: string, atLeast: number): Promise<string[]> {
  await gw.host!.spendWriter.flush();
  const mine = () => hooks.filter((h) => h.token === token).map((h) => String(h.event));
  for (let i = 0; i < 100 && mine().length < atLeast; i++) await Bun.sleep(20);
  await Bun.sleep(100);
  return mine();
}

test("a budget without a period alerts again after a spend reset, and when a new threshold is crossed", async () => {
  const made = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { soft_budget: 1.5, max_budget: 100 } });
  const { key, token } = made.body;
  await calls(key, 2);
  expect(await events(token, 1)).toEqual(["soft_budget_crossed"]);
  await calls(key, 1);
  expect(await events(token, 2)).toEqual(["soft_budget_crossed"]);
  // The key's spend reset: crossing again is news again.
  expect((await requestJson(gw, "POST", `/key/${token}/reset_spend`, { body: {} })).status).toBe(200);
  await calls(key, 2);
  expect(await events(token, 2)).toEqual(["soft_budget_crossed", "soft_budget_crossed"]);
  // A raised soft budget is a new threshold.
  expect((await requestJson(gw, "POST", "/key/update", { body: { key: token, soft_budget: 3.5 } })).status).toBe(200);
  await calls(key, 2);
  expect(await events(token, 3)).toEqual(["soft_budget_crossed", "soft_budget_crossed", "soft_budget_crossed"]);
  // The global spend reset too.
  expect((await requestJson(gw, "POST", "/global/spend/reset")).status).toBe(200);
  await calls(key, 4);
  expect(await events(token, 4)).toEqual(["soft_budget_crossed", "soft_budget_crossed", "soft_budget_crossed", "soft_budget_crossed"]);
});

test("a soft budget or max_budget set at or below the spend already made alerts once, at the next call", async () => {
  const { key, token } = (await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: {} })).body;
  await calls(key, 3);
  expect((await requestJson(gw, "POST", "/key/update", { body: { key: token, soft_budget: 1 } })).status).toBe(200);
  await calls(key, 3);
  expect(await events(token, 1)).toEqual(["soft_budget_crossed"]);
  // Calls are refused from now on, none settles: the refusal tells it.
  expect((await requestJson(gw, "POST", "/key/update", { body: { key: token, max_budget: 2 } })).status).toBe(200);
  for (let i = 0; i < 3; i++) expect((await dollarCall(gw, key)).status).toBe(400);
  expect(await events(token, 2)).toEqual(["soft_budget_crossed", "budget_crossed"]);
  const crossed = hooks.find((h) => h.token === token && h.event === "budget_crossed")!;
  expect(crossed).toMatchObject({ max_budget: 2, spend: 6 });
});
