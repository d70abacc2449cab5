// Spend-log retention and error logs, on both stores. With maximum_spend_logs_retention_period,
// log rows older than the period are deleted in the background while newer rows and the daily
// aggregates stay; a reload changes the period without a restart. With
// disable_error_logs, a failed call that cost nothing leaves no log row. With disable_spend_logs,
// no call leaves a row, yet counters and daily aggregates count every call, and the ids that keep
// them exact are pruned after 7 days.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { stringify } from "yaml";
import { parseConfig } from "../../core/config/load.ts";
import { uuidV7Floor } from "../../core/spend/retention.ts";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { until } from "../harness/util.ts";

const DAY = 86_400_000;
const MODELS = [
  { model_name: "m", svc_params: { model: "mock/m" } },
  // Nothing listens on port 9: the call fails with 503, at no cost.
  { model_name: "broken", svc_params: { model: "openai/gpt-4o", api_base: "http://127.0.0.1:9/v1", api_key: "sk-upstream" } },
];
const config = (general: Record<string, unknown>) => ({ model_list: MODELS, general_settings: { master_key: MASTER_KEY, ...general } });

async function chat(gw: TestGateway, model: string): Promise<{ status: number; callId: string }> {
  const res = await fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] }),
  });
  await res.arrayBuffer();
  return { status: res.status, callId: res.headers.get("x-svc-call-id")! };
}

/** A log row that started `ageMs` ago, as an earlier run would have left it. */
async function oldRow(gw: TestGateway, callId: string, ageMs: number): Promise<void> {
  const at = new Date(Date.now() - ageMs).toISOString();
  await gw.host!.store.db.execute(sql`insert into spend_logs (call_id, request_id, call_type, api_key, model, model_group, provider, model_id, upstream_model, spend, start_time, end_time, status)
    values (${callId}, ${callId}, 'chat', 'k', 'm', 'm', 'mock', 'd', 'm', 0.5, ${at}::timestamptz, ${at}::timestamptz, 'success')`);
}

const logIds = async (gw: TestGateway) => (await rows<{ call_id: string }>(gw.host!.store.db, sql`select call_id from spend_logs order by call_id`)).map((r) => r.call_id);

for (const backend of BACKENDS) {
  describe(`spend log retention (${backend})`, () => {
    let gw: TestGateway;
    beforeAll(async () => {
      gw = await startBackendGateway(backend, config({ maximum_spend_logs_retention_period: "2d", maximum_spend_logs_retention_interval: "1s", disable_error_logs: true }), { dbPrefix: "gw_retention" });
    });
    afterAll(async () => gw?.stop());

    test("rows older than the period are deleted; newer rows and the daily aggregates stay", async () => {
      const now = await chat(gw, "m");
      expect(now.status).toBe(200);
      await gw.host!.spendWriter.flush();
      for (const id of ["old-1", "old-2", "old-3"]) await oldRow(gw, id, 3 * DAY);
      await oldRow(gw, "yesterday", DAY);
      const day = new Date(Date.now() - 3 * DAY).toISOString().slice(0, 10);
      await gw.host!.store.db.execute(sql`insert into daily_spend (entity_type, entity_id, date, spend, api_requests) values ('key', 'k', ${day}::date, 1.5, 3)`);
      expect(await until(async () => !(await logIds(gw)).includes("old-1"))).toBe(true);
      expect(await logIds(gw)).toEqual([now.callId, "yesterday"].sort());
      const [aggregate] = await rows<{ spend: string; n: string | number }>(gw.host!.store.db, sql`select spend::text as spend, api_requests as n from daily_spend where entity_id = 'k' and date = ${day}::date`);
      expect(aggregate).toEqual({ spend: "1.500000000000", n: backend === "postgres" ? "3" : 3 });
      expect(gw.log.lines.some((l) => l.msg === "old spend log rows deleted" && (l.fields as { rows: number }).rows === 3)).toBe(true);
    });

    test("a reloaded period applies without a restart", async () => {
      await oldRow(gw, "twelve-hours", 12 * 3_600_000);
      await Bun.sleep(1500);
      expect(await logIds(gw)).toContain("twelve-hours");
      gw.writeConfig(config({ maximum_spend_logs_retention_period: "6h", maximum_spend_logs_retention_interval: "1s", disable_error_logs: true }));
      expect((await gw.live.reload("test")).ok).toBe(true);
      expect(await until(async () => !(await logIds(gw)).includes("twelve-hours"))).toBe(true);
      // One day old is beyond 6 h now too.
      expect(await logIds(gw)).not.toContain("yesterday");
    });

    test("disable_error_logs: a failed call that cost nothing leaves no log row; a successful one does", async () => {
      const failed = await chat(gw, "broken");
      expect(failed.status).toBe(503);
      const ok = await chat(gw, "m");
      expect(ok.status).toBe(200);
      await gw.host!.spendWriter.flush();
      const ids = await logIds(gw);
      expect(ids).toContain(ok.callId);
      expect(ids).not.toContain(failed.callId);
    });
  });
}

test("retention settings are validated with the path of a bad one", () => {
  const result = parseConfig(stringify(config({ maximum_spend_logs_retention_period: "a week", disable_error_logs: "yes" })));
  expect(result.ok).toBe(false);
  const errors = result.ok ? "" : result.errors.join("\n");
  expect(errors).toContain("/general_settings/maximum_spend_logs_retention_period");
  expect(errors).toContain("/general_settings/disable_error_logs");
});

for (const backend of BACKENDS) {
  describe(`disable_spend_logs (${backend})`, () => {
    let gw: TestGateway;
    beforeAll(async () => {
      gw = await startBackendGateway(
        backend,
        {
          model_list: [{ model_name: "priced", svc_params: { model: "mock/priced" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } }],
          general_settings: { master_key: MASTER_KEY, disable_spend_logs: true, maximum_spend_logs_retention_interval: "1s" },
        },
        { dbPrefix: "gw_nolog" },
      );
    });
    afterAll(async () => gw?.stop());

    test("no log rows; the key's spend and the daily aggregates still count every call exactly", async () => {
      const created = await fetch(`${gw.url}/key/generate`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify({ max_budget: 10 }) });
      const { key, token } = (await created.json()) as { key: string; token: string };
      let charged = 0;
      for (let i = 0; i < 3; i++) {
        const res = await fetch(`${gw.baseURL}/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "priced", messages: [{ role: "user", content: `call number ${i}` }] }),
        });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        charged += Number(res.headers.get("x-svc-response-cost"));
      }
      await gw.host!.spendWriter.flush();
      const db = gw.host!.store.db;
      const [logs] = await rows<{ n: number }>(db, sql`select count(*)::int as n from spend_logs`);
      expect(logs!.n).toBe(0);
      const [k] = await rows<{ spend: string }>(db, sql`select spend::text as spend from virtual_keys where token = ${token}`);
      expect(Number(k!.spend)).toBeCloseTo(charged, 12);
      expect(charged).toBeGreaterThan(0);
      const [daily] = await rows<{ n: number }>(db, sql`select sum(api_requests)::int as n from daily_spend where entity_type = 'key' and entity_id = ${token}`);
      expect(daily!.n).toBe(3);
    });

    test("the ids that keep calls counted once are pruned after 7 days", async () => {
      const db = gw.host!.store.db;
      const old = `${uuidV7Floor(Date.now() - 8 * DAY)}-7000-8000-000000000000`;
      const recent = Bun.randomUUIDv7();
      await db.execute(sql`insert into spend_calls (call_id) values (${old}), (${recent})`);
      const has = async (id: string) => (await rows(db, sql`select 1 from spend_calls where call_id = ${id}`)).length > 0;
      expect(await until(async () => !(await has(old)))).toBe(true);
      expect(await has(recent)).toBe(true);
    });

    test("stored report parts are pruned 35 days after they were stored; younger ones stay", async () => {
      const db = gw.host!.store.db;
      const at = (daysAgo: number) => new Date(Date.now() - daysAgo * DAY).toISOString();
      await db.execute(sql`insert into report_parts (report, day, stamp, body, stored_at) values
        ('old', '2026-01-01', '1', '{}', ${at(36)}::timestamptz), ('young', '2026-01-01', '1', '{}', ${at(34)}::timestamptz)`);
      const has = async (report: string) => (await rows(db, sql`select 1 from report_parts where report = ${report}`)).length > 0;
      expect(await until(async () => !(await has("old")))).toBe(true);
      expect(await has("young")).toBe(true);
    });
  });
}
