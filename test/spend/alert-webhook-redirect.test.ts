// The alert webhook (general_settings.alert_webhook_url) does not follow a redirect: a 302 or 307
// answer is a failed attempt, retried and logged like an error answer, and the address it points
// to never hears from the gateway (it could be this machine or a private network the operator never
// chose). The alert itself is still logged and kept.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { alertTiming } from "../../core/spend/alerts.ts";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

let gw: TestGateway;
let target: ReturnType<typeof Bun.serve>;
let redirector: ReturnType<typeof Bun.serve>;
const targetHits: string[] = [];
const attempts: { status: number; token: unknown }[] = [];
let redirectStatus = 302;
const savedTiming = { ...alertTiming };

beforeAll(async () => {
  alertTiming.pausesMs = [0, 50, 50];
  target = Bun.serve({
    port: 0,
    fetch(req) {
      targetHits.push(`${req.method} ${new URL(req.url).pathname}`);
      return new Response("ok");
    },
  });
  redirector = Bun.serve({
    port: 0,
    async fetch(req) {
      const body = (await req.json()) as { token?: unknown };
      attempts.push({ status: redirectStatus, token: body.token });
      return new Response(null, { status: redirectStatus, headers: { location: `http://127.0.0.1:${target.port}/landed` } });
    },
  });
  gw = await startBackendGateway("pglite", {
    model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } }],
    general_settings: { master_key: MASTER_KEY, alert_webhook_url: `http://127.0.0.1:${redirector.port}/alerts` },
  });
});
afterAll(async () => {
  Object.assign(alertTiming, savedTiming);
  await gw?.stop();
  target?.stop(true);
  redirector?.stop(true);
});

async function crossSoftBudget(): Promise<string> {
  const made = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { soft_budget: 0.0000001 } });
  expect(made.status).toBe(200);
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${made.body.key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "chat", messages: [{ role: "user", content: "hello" }] }),
  });
  expect(res.status).toBe(200);
  await res.text();
  await gw.host!.spendWriter.flush();
  return made.body.token;
}

describe("alert webhook and redirects", () => {
  for (const status of [302, 307]) {
    test(`a ${status} is a failed attempt: retried, logged, and its target never reached`, async () => {
      redirectStatus = status;
      const token = await crossSoftBudget();
      const mine = () => attempts.filter((a) => a.token === token);
      for (let i = 0; i < 250 && mine().length < alertTiming.pausesMs.length; i++) await Bun.sleep(20);
      // Give a follow-up (if any) time to land.
      await Bun.sleep(200);
      expect(mine()).toEqual(alertTiming.pausesMs.map(() => ({ status, token })));
      expect(targetHits).toEqual([]);
      const failures = gw.log.lines.filter((l) => l.msg === "budget alert webhook answered an error" && l.fields?.status === status);
      expect(failures.map((l) => l.fields?.attempt)).toEqual(alertTiming.pausesMs.map((_, i) => i + 1));
      // The alert itself is still kept, once.
      const [stored] = await rows<{ n: string }>(gw.host!.store.db, sql`select count(*)::text as n from budget_alerts where counter_id = ${`key:${token}`}`);
      expect(stored!.n).toBe("1");
    });
  }
});
