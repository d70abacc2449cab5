// Budget alerts are owed until the alert webhook takes them: after the first three attempts fail
// they are tried again, backing off, by whichever instance looks next (also one started after a
// restart), always with the same webhook-id; after a day they are given up, logged, and kept with
// their last error. LiteLLM sends an alert once and forgets it.
import { afterEach, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { alertTiming } from "../../core/spend/alerts.ts";
import { rows } from "../../core/store/sql.ts";
import { DOLLAR_MODEL, dollarCall } from "../harness/traffic.ts";
import { freshDatabase, MASTER_KEY, requestJson, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";

const DEFAULTS = { ...alertTiming, pausesMs: [...alertTiming.pausesMs] };
afterEach(() => Object.assign(alertTiming, { ...DEFAULTS, pausesMs: [...DEFAULTS.pausesMs] }));

const config = (hook: string) => ({
  model_list: [DOLLAR_MODEL],
  general_settings: { master_key: MASTER_KEY, alert_webhook_url: hook, budget_alert_thresholds: [] },
});

/** A webhook receiver that answers 500 to the first `failing` requests (or while `down`), then 200. */
function receiver(failing: number) {
  const got: { id: string; body: Record<string, unknown>; status: number }[] = [];
  const state = { failing, down: false };
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const status = state.down || state.failing-- > 0 ? 500 : 200;
      got.push({ id: req.headers.get("webhook-id") ?? "", body: (await req.json()) as Record<string, unknown>, status });
      return new Response(status === 200 ? "ok" : "down", { status });
    },
  });
  return { url: `http://127.0.0.1:${server.port}/alerts`, got, state, stop: () => server.stop(true) };
}

async function crossBudget(gw: TestGateway, made?: { key: string; token: string }): Promise<{ key: string; token: string }> {
  const { key, token } = made ?? (await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { soft_budget: 0.5 } })).body;
  const { status, text } = await dollarCall(gw, key);
  expect(status, text).toBe(200);
  return { key, token };
}

async function alertRow(gw: TestGateway) {
  const [row] = await rows<{ attempts: number; owed: boolean; delivered: boolean; last_error: string | null }>(
    gw.host!.store.db,
    sql`select attempts, next_attempt_at is not null as owed, delivered_at is not null as delivered, last_error from budget_alerts`,
  );
  return row;
}

async function until(check: () => boolean | Promise<boolean>, ms = 10_000): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; await Bun.sleep(25)) if (await check()) return true;
  return false;
}

const fast = () => Object.assign(alertTiming, { pausesMs: [0, 20, 20], timeoutMs: 2000, sweepMs: 50, backoffMs: 100, maxBackoffMs: 200 });

test("an alert the webhook refused five times is delivered on the sixth attempt, every attempt with one webhook-id", async () => {
  fast();
  const hook = receiver(5);
  const gw = await startBackendGateway("pglite", config(hook.url));
  try {
    const { token } = await crossBudget(gw);
    expect(await until(() => hook.got.some((g) => g.status === 200))).toBe(true);
    expect(hook.got.map((g) => g.status)).toEqual([500, 500, 500, 500, 500, 200]);
    expect(new Set(hook.got.map((g) => g.id)).size).toBe(1);
    expect(hook.got[0]!.id).toStartWith("msg_");
    expect(hook.got.every((g) => g.body.token === token && g.body.event === "soft_budget_crossed")).toBe(true);
    // The webhook's 200 reaches it before the gateway has recorded the delivery.
    expect(await until(async () => (await alertRow(gw))?.delivered === true)).toBe(true);
    expect(await alertRow(gw)).toEqual({ attempts: 6, owed: false, delivered: true, last_error: null });
    // Taken: not sent again.
    await Bun.sleep(400);
    expect(hook.got).toHaveLength(6);
  } finally {
    await gw.stop();
    hook.stop();
  }
}, 30_000);

test("postgres: an alert still owed when the gateway stops is delivered by the next one started on the database, with the same id", async () => {
  fast();
  const db = await freshDatabase("gw_alert_redelivery");
  const hook = receiver(0);
  hook.state.down = true;
  let gw: TestGateway | undefined;
  try {
    gw = await startTestGateway(config(hook.url), { store: { databaseUrl: db.url } });
    // Slow to retry here: the first instance stops with the alert owed.
    alertTiming.backoffMs = 60_000;
    alertTiming.maxBackoffMs = 60_000;
    await crossBudget(gw);
    expect(await until(async () => (await alertRow(gw!))?.attempts === 3)).toBe(true);
    await gw.stop();
    gw = undefined;
    const firstId = hook.got[0]!.id;
    expect(hook.got.map((g) => g.status)).toEqual([500, 500, 500]);
    // Due at once for the next instance, the receiver back.
    const side = await startTestGateway(config(hook.url), { store: { databaseUrl: db.url } });
    gw = side;
    await side.host!.store.db.execute(sql`update budget_alerts set next_attempt_at = now()`);
    hook.state.down = false;
    expect(await until(() => hook.got.some((g) => g.status === 200))).toBe(true);
    expect(hook.got.map((g) => g.id)).toEqual([firstId, firstId, firstId, firstId]);
    expect(await until(async () => (await alertRow(side))?.delivered === true)).toBe(true);
    expect(await alertRow(side)).toEqual({ attempts: 4, owed: false, delivered: true, last_error: null });
  } finally {
    await gw?.stop();
    hook.stop();
    await db.drop();
  }
}, 60_000);

test("an alert never taken is given up after its time, logged, and kept with its last error", async () => {
  fast();
  alertTiming.giveUpMs = 600;
  const hook = receiver(0);
  hook.state.down = true;
  const gw = await startBackendGateway("pglite", config(hook.url));
  try {
    await crossBudget(gw);
    expect(await until(async () => (await alertRow(gw))?.owed === false, 10_000)).toBe(true);
    const row = await alertRow(gw);
    expect(row).toMatchObject({ owed: false, delivered: false, last_error: "HTTP 500" });
    expect(row!.attempts).toBeGreaterThan(3);
    const tries = hook.got.length;
    expect(gw.log.lines.filter((l) => l.level === "error" && l.msg === "budget alert not delivered: given up")).toHaveLength(1);
    await Bun.sleep(400);
    expect(hook.got).toHaveLength(tries);
  } finally {
    await gw.stop();
    hook.stop();
  }
}, 30_000);

test("a spend reset while an alert is owed: the owed one is still delivered, and the crossing after the reset is a new alert", async () => {
  fast();
  const hook = receiver(0);
  hook.state.down = true;
  const gw = await startBackendGateway("pglite", config(hook.url));
  try {
    alertTiming.backoffMs = 60_000;
    alertTiming.maxBackoffMs = 60_000;
    const made = await crossBudget(gw);
    expect(await until(async () => (await alertRow(gw))?.attempts === 3)).toBe(true);
    expect((await requestJson(gw, "POST", `/key/${made.token}/reset_spend`, { body: {} })).status).toBe(200);
    // The same key crosses its soft budget again.
    await crossBudget(gw, made);
    await gw.host!.spendWriter.flush();
    // Both owed, each past its first three attempts.
    expect(await until(async () => (await rows(gw.host!.store.db, sql`select 1 from budget_alerts where attempts = 3`)).length === 2)).toBe(true);
    hook.state.down = false;
    alertTiming.backoffMs = 100;
    alertTiming.maxBackoffMs = 200;
    await gw.host!.store.db.execute(sql`update budget_alerts set next_attempt_at = now() where next_attempt_at is not null`);
    expect(await until(() => hook.got.filter((g) => g.status === 200).length === 2)).toBe(true);
    expect(new Set(hook.got.filter((g) => g.status === 200).map((g) => g.id)).size).toBe(2);
  } finally {
    await gw.stop();
    hook.stop();
  }
}, 30_000);
