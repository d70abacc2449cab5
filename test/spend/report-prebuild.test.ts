// The unfiltered spend reports' finished days are built in the background (general_settings.
// spend_report_prebuild_days, default 30): after start the parts of those days are there before
// anyone asks, only days in the window and never today, and answers from them equal a fresh build.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { reuseDays } from "../../core/http/admin/day-cache.ts";
import { writeBatch } from "../../core/spend/flush.ts";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { spendEntry } from "../harness/spend.ts";
import { until } from "../harness/util.ts";

const ALPHA = { model_name: "alpha-model", svc_params: { model: "mock/alpha" } };
const DAY = 86_400_000;
const dayOf = (ms: number) => new Date(ms).toISOString().slice(0, 10);
const TODAY = dayOf(Date.now());
const daysAgo = (n: number) => dayOf(Date.now() - n * DAY);
/** Days with calls: three finished days in the default window, one outside it, and today. */
const WRITTEN = [1, 2, 5, 40, 0];
const IN_WINDOW = [1, 2, 5].map(daysAgo);
/** What a dashboard asks first: the last 30 days, each report unfiltered. */
const REPORTS = [
  `/global/spend/report?start_date=${daysAgo(29)}&end_date=${TODAY}&group_by=team`,
  `/global/spend/report?start_date=${daysAgo(29)}&end_date=${TODAY}&group_by=api_key`,
  `/global/spend/report?start_date=${daysAgo(29)}&end_date=${TODAY}&group_by=customer`,
  `/team/daily/activity?start_date=${daysAgo(29)}&end_date=${TODAY}`,
  `/organization/daily/activity?start_date=${daysAgo(29)}&end_date=${TODAY}`,
];

async function writeCalls(gw: TestGateway): Promise<void> {
  const { team_id: team } = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "prebuilt-team" } })).body;
  const { token } = (await requestJson<{ token: string }>(gw, "POST", "/key/generate", { body: { team_id: team, key_alias: "prebuilt-key" } })).body;
  await writeBatch(
    gw.host!.store,
    WRITTEN.map((n) =>
      spendEntry(Date.now() - n * DAY, { apiKey: token, teamId: team, organizationId: "org-prebuilt", endUser: "cust-prebuilt", spendPico: 1_000_000 * (n + 1), promptTokens: 10, completionTokens: 5 }),
    ),
  );
}

/** Stored parts by day: how many reports have one. */
async function storedByDay(gw: TestGateway): Promise<Map<string, number>> {
  const found = await rows<{ day: string; n: number }>(gw.host!.store.db, sql`select day::text as day, count(*)::int as n from report_parts group by day`);
  return new Map(found.map((r) => [r.day, Number(r.n)]));
}

const allInWindow = (stored: Map<string, number>) => IN_WINDOW.every((d) => stored.get(d) === REPORTS.length);

const answers = async (gw: TestGateway) => Promise.all(REPORTS.map(async (path) => (await requestJson(gw, "GET", path, { key: MASTER_KEY })).text));

for (const backend of BACKENDS) {
  describe(`spend report prebuild (${backend})`, () => {
    let gw: TestGateway;
    beforeAll(async () => {
      gw = await startBackendGateway(backend, { model_list: [ALPHA], general_settings: { master_key: MASTER_KEY } }, { dbPrefix: "gw_prebuild" });
      await writeCalls(gw);
    }, 60_000);
    afterAll(async () => gw?.stop());

    test("after start, the finished days of the window are built and stored for every unfiltered report, before any request", async () => {
      // The pass scheduled at start (it logs when done); one more pass makes sure the calls written after start are in.
      expect(await until(async () => gw.log.lines.some((l) => l.msg === "spend reports prebuilt"), 15_000)).toBe(true);
      await gw.host!.reportPrebuild.run();
      // Parts are stored after they are built, not awaited by the pass.
      expect(await until(async () => allInWindow(await storedByDay(gw)), 8000)).toBe(true);
      const last = await storedByDay(gw);
      // Today changes with every call; a day past the window is not built.
      expect(last.has(TODAY)).toBe(false);
      expect(last.has(daysAgo(40))).toBe(false);
      expect(gw.log.lines.filter((l) => l.level === "warn" && l.msg.includes("prebuilt"))).toEqual([]);
    }, 40_000);

    test("the first request reads the prebuilt parts from the store (not rebuilt, not held in memory before)", async () => {
      const day = IN_WINDOW[0]!;
      const db = gw.host!.store.db;
      const marker = `{"group-by-day":"${day}","group_by_day":"${day}","customers":[]}`;
      await db.execute(sql`update report_parts set body = ${marker} where day = ${day}::date and body like '{"group-by-day":%,"customers":%'`);
      const path = REPORTS[2]!;
      const served = (await requestJson<{ "group-by-day"?: string; group_by_day: string; customers: unknown[] }[]>(gw, "GET", path, { key: MASTER_KEY })).body;
      expect(served.find((d) => d.group_by_day === day)).toEqual({ "group-by-day": day, group_by_day: day, customers: [] });
      // A write to that day makes the altered part stale: it is built again from the rows.
      await db.execute(sql`update daily_spend set api_requests = api_requests where date = ${day}::date`);
      const rebuilt = (await requestJson<{ group_by_day: string; customers: { customer: string }[] }[]>(gw, "GET", path, { key: MASTER_KEY })).body;
      expect(rebuilt.find((d) => d.group_by_day === day)!.customers.map((c) => c.customer)).toEqual(["cust-prebuilt"]);
    });

    test("answers from the prebuilt parts equal answers built afresh from the aggregates", async () => {
      const prebuilt = await answers(gw);
      for (const text of prebuilt) expect(text).toContain(IN_WINDOW[0]!);
      // A write to every day's aggregates changes their stamps: each part is built again from the rows.
      await gw.host!.store.db.execute(sql`update daily_spend set api_requests = api_requests`);
      expect(await answers(gw)).toEqual(prebuilt);
    });
  });
}

describe("spend_report_prebuild_days: 0", () => {
  test("builds nothing until asked", async () => {
    const gw = await startBackendGateway("pglite", { model_list: [ALPHA], general_settings: { master_key: MASTER_KEY, spend_report_prebuild_days: 0 } });
    try {
      await writeCalls(gw);
      await gw.host!.reportPrebuild.run();
      // Parts are stored after an answer, not awaited by it: give a pass that would store them time to.
      await Bun.sleep(500);
      expect((await storedByDay(gw)).size).toBe(0);
      // Asked, the finished days are built and stored as ever.
      await answers(gw);
      expect(await until(async () => allInWindow(await storedByDay(gw)))).toBe(true);
    } finally {
      await gw.stop();
    }
  }, 40_000);
});

describe("stopping while a prebuild runs", () => {
  test("the gateway stops promptly and logs no failure", async () => {
    const gw = await startBackendGateway("pglite", { model_list: [ALPHA], general_settings: { master_key: MASTER_KEY } });
    await writeCalls(gw);
    const pass = gw.host!.reportPrebuild.run();
    const started = Date.now();
    await gw.stop();
    await pass;
    expect(Date.now() - started).toBeLessThan(5000);
    expect(gw.log.lines.filter((l) => l.level === "warn" || l.level === "error")).toEqual([]);
  }, 40_000);
});

describe("a report asked while the same days are being built", () => {
  test("waits for that build instead of building them again, and gets the same parts", async () => {
    const gw = await startBackendGateway("pglite", { model_list: [ALPHA], general_settings: { master_key: MASTER_KEY, spend_report_prebuild_days: 0 } });
    try {
      await writeCalls(gw);
      const built: string[][] = [];
      let release = () => {};
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      // A report of its own (its parts are no other report's), built slowly: the second ask comes while the first builds.
      const ask = () =>
        reuseDays({
          db: gw.host!.store.db,
          log: gw.log,
          entityType: "key",
          span: { start: daysAgo(29), end: TODAY },
          report: "test/concurrent-asks",
          holdsNames: false,
          build: async (days) => {
            built.push(days);
            await gate;
            return new Map(days.map((d) => [d, new TextEncoder().encode(`{"day":"${d}"}`)]));
          },
        });
      const first = ask();
      await Bun.sleep(50);
      const second = ask();
      await Bun.sleep(50);
      release();
      const [a, b] = await Promise.all([first, second]);
      expect(built.flat().sort()).toEqual([...IN_WINDOW, TODAY].sort());
      expect([...b.keys()]).toEqual([...a.keys()]);
      expect([...b.values()].map((x) => new TextDecoder().decode(x))).toEqual([...a.values()].map((x) => new TextDecoder().decode(x)));
      expect(a.size).toBe(IN_WINDOW.length + 1);
    } finally {
      await gw.stop();
    }
  }, 40_000);
});
