// The spec's low-budget alert: "a low-budget alert when the team balance falls below a critical
// threshold" (its value "not shown"). As LiteLLM, `threshold_crossed` when 15 % and again when 5 %
// of a budget is left ("Team Budget: 15% Threshold Crossed"), set by
// `general_settings.budget_alert_thresholds`. Unlike LiteLLM, each threshold is told once per
// budget and period (its 5 % alert was swallowed by the 15 % one the same day), to the alert
// webhook and, for a team's budget, to the team's webhooks; a threshold crossed by the call that
// spends the budget is not told beside `budget_crossed`.
import { afterAll, expect, test } from "bun:test";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { DOLLAR_MODEL, dollarCall } from "../harness/traffic.ts";
import { jsonPostReceiver } from "../harness/util.ts";

const receiver = jsonPostReceiver();
const teamReceiver = jsonPostReceiver();
const started: TestGateway[] = [];
afterAll(async () => {
  for (const gw of started) await gw.stop();
  receiver.stop();
  teamReceiver.stop();
});

async function gateway(general: Record<string, unknown> = {}): Promise<TestGateway> {
  const gw = await startBackendGateway("pglite", {
    model_list: [DOLLAR_MODEL],
    general_settings: { master_key: MASTER_KEY, alert_webhook_url: receiver.url, ...general },
  });
  started.push(gw);
  return gw;
}

async function calls(gw: TestGateway, key: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    const { status, text } = await dollarCall(gw, key);
    expect(status, text).toBe(200);
  }
}

/** The event messages delivered so far that match, once deliveries caught up with `atLeast`. */
async function messages(gw: TestGateway, hooks: Record<string, unknown>[], match: (h: Record<string, unknown>) => boolean, atLeast: number): Promise<string[]> {
  await gw.host!.spendWriter.flush();
  const mine = () => hooks.filter(match).map((h) => String(h.event_message));
  for (let i = 0; i < 150 && mine().length < atLeast; i++) await Bun.sleep(20);
  await Bun.sleep(150);
  return mine();
}

test("by default: 15 % of a key's budget left is told once; the call that spends the rest tells budget_crossed only", async () => {
  const gw = await gateway();
  const { key, token } = (await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { max_budget: 10 } })).body;
  await calls(gw, key, 8);
  expect(await messages(gw, receiver.received, (h) => h.token === token, 0)).toEqual([]);
  await calls(gw, key, 1);
  expect(await messages(gw, receiver.received, (h) => h.token === token, 1)).toEqual(["Key Budget: 15% Threshold Crossed"]);
  expect(receiver.received.find((h) => h.token === token)).toMatchObject({ event: "threshold_crossed", event_group: "key", spend: 9, max_budget: 10 });
  // $9 to $10: past the 5 % threshold and onto the limit in one call.
  await calls(gw, key, 1);
  expect(await messages(gw, receiver.received, (h) => h.token === token, 2)).toEqual(["Key Budget: 15% Threshold Crossed", "Key Budget: Budget Crossed"]);
}, 30_000);

test("configured thresholds: a team's budget tells each one, in order, to the alert webhook and to the team's webhooks", async () => {
  const gw = await gateway({ budget_alert_thresholds: [0.5, 0.25] });
  const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "low", max_budget: 4 } })).body.team_id;
  expect((await requestJson(gw, "POST", `/team/${team}/callback`, { body: { callbacks: [{ callback_type: "webhook", url: teamReceiver.url }] } })).status).toBe(200);
  const key = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team } })).body.key;
  const teamAlert = (h: Record<string, unknown>) => h.team_id === team && typeof h.event_message === "string";
  await calls(gw, key, 1);
  expect(await messages(gw, receiver.received, teamAlert, 0)).toEqual([]);
  await calls(gw, key, 1);
  expect(await messages(gw, receiver.received, teamAlert, 1)).toEqual(["Team Budget: 50% Threshold Crossed"]);
  await calls(gw, key, 2);
  const told = ["Team Budget: 50% Threshold Crossed", "Team Budget: 25% Threshold Crossed", "Team Budget: Budget Crossed"];
  expect(await messages(gw, receiver.received, teamAlert, 3)).toEqual(told);
  expect(await messages(gw, teamReceiver.received, teamAlert, 3)).toEqual(told);
  // Spent: refused, and nothing told again.
  expect((await dollarCall(gw, key)).status).toBe(400);
  expect(await messages(gw, receiver.received, teamAlert, 0)).toEqual(told);
}, 30_000);

test("a threshold of 0 or 1, or not a number, is a config error naming its path", async () => {
  for (const bad of [[0], [1], ["15%"]]) {
    let error = "";
    try {
      await gateway({ budget_alert_thresholds: bad });
    } catch (err) {
      error = String(err);
    }
    expect(error).toContain("/general_settings/budget_alert_thresholds/0");
  }
});
