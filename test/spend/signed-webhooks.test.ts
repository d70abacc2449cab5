// Webhooks a receiver can trust: budget alerts and team webhooks are signed the Standard Webhooks
// way (standardwebhooks.com) when a secret is set, and every delivery carries an id that stays
// the same on a retry, so a receiver can drop the duplicate. LiteLLM posts its alerts unsigned
// and without an id. The receiver here checks signatures as that scheme's documentation says
// a receiver does: HMAC-SHA256 over "<webhook-id>.<webhook-timestamp>.<body>" with the secret's
// bytes (base64-decoded after `whsec_`), base64, after "v1,".
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHmac } from "node:crypto";
import { sql } from "drizzle-orm";
import { alertTiming } from "../../core/spend/alerts.ts";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, requestJson, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { chatStatus } from "../harness/traffic.ts";

interface Delivery {
  path: string;
  headers: Record<string, string>;
  body: string;
}

const ALERT_SECRET_BYTES = Buffer.from("0123456789abcdef01234567", "utf8");
const ALERT_SECRET = `whsec_${ALERT_SECRET_BYTES.toString("base64")}`;
const TEAM_SECRET = "a team's own signing secret";

let gw: TestGateway;
let receiver: ReturnType<typeof Bun.serve>;
const deliveries: Delivery[] = [];
/** Paths whose next answers are a 500, as many as the count says. */
const failNext = new Map<string, number>();

function verified(d: Delivery, key: Buffer): boolean {
  const id = d.headers["webhook-id"];
  const ts = d.headers["webhook-timestamp"];
  const sig = d.headers["webhook-signature"];
  if (!id || !ts || !sig) return false;
  const expected = createHmac("sha256", key).update(`${id}.${ts}.${d.body}`).digest("base64");
  return sig.split(" ").some((s) => s === `v1,${expected}`);
}

async function until(check: () => boolean, ms = 8000): Promise<void> {
  for (const end = Date.now() + ms; !check() && Date.now() < end; ) await Bun.sleep(20);
}

async function chat(key: string): Promise<void> {
  expect(await chatStatus(gw, key)).toBe(200);
}

beforeAll(async () => {
  receiver = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const path = new URL(req.url).pathname;
      deliveries.push({ path, headers: Object.fromEntries(req.headers), body: await req.text() });
      const n = failNext.get(path) ?? 0;
      if (n > 0) {
        failNext.set(path, n - 1);
        return new Response("try later", { status: 500 });
      }
      return new Response("ok");
    },
  });
  alertTiming.pausesMs = [0, 50, 50];
  gw = await startBackendGateway("pglite", {
    model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } }],
    general_settings: { master_key: MASTER_KEY, alert_webhook_url: `http://127.0.0.1:${receiver.port}/alerts`, alert_webhook_secret: ALERT_SECRET },
  });
});
afterAll(async () => {
  await gw?.stop();
  receiver?.stop(true);
  alertTiming.pausesMs = [0, 1000, 5000];
});

test("a budget alert is signed with the configured secret; its retry carries the same id, signed again", async () => {
  failNext.set("/alerts", 1);
  const key = (await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { soft_budget: 0.0000001 } })).body;
  await chat(key.key);
  await gw.host!.spendWriter.flush();
  const mine = () => deliveries.filter((d) => d.path === "/alerts" && d.body.includes(key.token));
  await until(() => mine().length >= 2);
  const [first, retry] = mine();
  expect(first && retry).toBeTruthy();
  expect(JSON.parse(retry!.body).event).toBe("soft_budget_crossed");
  for (const d of [first!, retry!]) expect(verified(d, ALERT_SECRET_BYTES)).toBe(true);
  expect(retry!.headers["webhook-id"]).toBe(first!.headers["webhook-id"]);
  // Timestamps are the attempt's, in seconds, near now (a receiver refuses old ones: replays).
  expect(Math.abs(Number(retry!.headers["webhook-timestamp"]) - Date.now() / 1000)).toBeLessThan(30);
  // Signed with anything else, it does not verify: the signature covers the body and the secret.
  expect(verified(retry!, Buffer.from("another secret, not the gateway's"))).toBe(false);
  expect(verified({ ...retry!, body: retry!.body.replace("soft_budget_crossed", "budget_crossed") }, ALERT_SECRET_BYTES)).toBe(false);
});

test("a team webhook registered with a signing secret gets signed deliveries, ids the calls' own; the secret is never shown or stored readable", async () => {
  const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "signed" } })).body.team_id;
  const url = `http://127.0.0.1:${receiver.port}/team`;
  const reg = await requestJson(gw, "POST", `/team/${team}/callback`, { body: { callbacks: [{ callback_type: "webhook", url, signing_secret: TEAM_SECRET }] } });
  expect(reg.status).toBe(200);
  const shown = await requestJson(gw, "GET", `/team/${team}/callback`);
  for (const text of [JSON.stringify(reg.body), JSON.stringify(shown.body)]) expect(text).not.toContain(TEAM_SECRET);
  expect(JSON.stringify(shown.body)).toContain('"signing_secret":"[redacted]"');
  const stored = await rows<{ s: string }>(gw.host!.store.db, sql`select callback_settings::text as s from teams where team_id = ${team}`);
  expect(stored[0]!.s).toContain("signing_secret");
  expect(stored[0]!.s).not.toContain(TEAM_SECRET);

  const key = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team } })).body.key;
  await chat(key);
  await until(() => deliveries.some((d) => d.path === "/team"));
  const d = deliveries.find((x) => x.path === "/team")!;
  expect(verified(d, Buffer.from(TEAM_SECRET, "utf8"))).toBe(true);
  expect(d.headers["webhook-id"]).toBe(JSON.parse(d.body).id);
});

test("a webhook without a secret gets an id and a timestamp but no signature", async () => {
  const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "unsigned" } })).body.team_id;
  const url = `http://127.0.0.1:${receiver.port}/plain`;
  expect((await requestJson(gw, "POST", `/team/${team}/callback`, { body: { callbacks: [{ callback_type: "webhook", url }] } })).status).toBe(200);
  const key = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team } })).body.key;
  await chat(key);
  await until(() => deliveries.some((x) => x.path === "/plain"));
  const d = deliveries.find((x) => x.path === "/plain")!;
  expect(d.headers["webhook-id"]).toBe(JSON.parse(d.body).id);
  expect(d.headers["webhook-timestamp"]).toMatch(/^\d+$/);
  expect(d.headers["webhook-signature"]).toBeUndefined();
});

test("a secret too short, bad base64 after whsec_, or the delivery headers given by hand are refused with a 400 naming why", async () => {
  const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "refused" } })).body.team_id;
  const url = `http://127.0.0.1:${receiver.port}/never`;
  const cases: [Record<string, unknown>, string][] = [
    [{ signing_secret: "short" }, "at least 16 bytes"],
    [{ signing_secret: "whsec_not base64!" }, "whsec_ secret must be base64"],
    [{ headers: { "Webhook-Signature": "v1,forged" } }, "set by the gateway"],
  ];
  for (const [extra, why] of cases) {
    const r = await requestJson<{ error: { message: string } }>(gw, "POST", `/team/${team}/callback`, { body: { callbacks: [{ callback_type: "webhook", url, ...extra }] } });
    expect(r.status).toBe(400);
    expect(r.body.error.message).toContain(why);
  }
  const shown = await requestJson<{ data: { callback_vars: { webhooks: unknown[] } } }>(gw, "GET", `/team/${team}/callback`);
  expect(shown.body.data.callback_vars.webhooks).toEqual([]);
});

test("config: an alert_webhook_secret too short is refused at start with its path", async () => {
  let error = "";
  try {
    const bad = await startTestGateway({ model_list: [], general_settings: { master_key: MASTER_KEY, alert_webhook_secret: "short" } });
    await bad.stop();
  } catch (err) {
    error = String(err);
  }
  expect(error).toContain("/general_settings/alert_webhook_secret");
});
