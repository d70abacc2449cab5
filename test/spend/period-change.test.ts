// A write that changes a key's (or team's) budget_duration moves budget_reset_at to now + the new duration and
// keeps the spend: the period goes on with a new end. Calls made before the write whose spend is
// still queued (the writer here writes only when asked) belong to that period: a longer period
// must still count them (they were dropped from the stored spend, and the ledger re-read the lower
// figure: the key passed its budget), and a shorter one must end at its new end (the ledger kept
// the old end and refused calls until it).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";
import { DOLLAR_MODEL, dollarCall } from "../harness/traffic.ts";

const CONFIG = { model_list: [DOLLAR_MODEL], general_settings: { master_key: MASTER_KEY } };
const WORLDS = [...BACKENDS.map((backend) => ({ name: backend, backend, redis: false })), { name: "postgres+redis", backend: "postgres" as const, redis: true }];

for (const world of WORLDS) {
  describe(`budget_duration changed mid-period (${world.name})`, () => {
    let gw: TestGateway;

    beforeAll(async () => {
      gw = await startBackendGateway(world.backend, CONFIG, { spend: { intervalMs: 60_000 }, ...(world.redis ? { redisUrl: TEST_REDIS_URL } : {}) });
    }, 60_000);
    afterAll(() => gw?.stop());

    const newKey = async (body: Record<string, unknown>) => (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body })).body.key;
    const setDuration = async (key: string, budget_duration: string) =>
      expect((await requestJson(gw, "POST", "/key/update", { body: { key, budget_duration } })).status).toBe(200);
    /** Calls until one is refused (at most `most`): how many passed. */
    const callsUntilRefused = async (key: string, most: number) => {
      for (let n = 0; n < most; n++) {
        const r = await dollarCall(gw, key);
        if (r.status === 400) return n;
        expect(r.status).toBe(200);
      }
      return most;
    };
    const stored = async (key: string) => {
      await gw.host!.spendWriter.flush();
      const info = await requestJson<{ info: { spend: number; budget_reset_at: string; token: string } }>(gw, "GET", `/key/info?key=${key}`);
      const [logged] = await rows<{ sum: string }>(gw.host!.store.db, sql`select coalesce(sum(spend), 0)::text as sum from spend_logs where api_key = ${info.body.info.token}`);
      return { spend: info.body.info.spend, resetAt: Date.parse(info.body.info.budget_reset_at), logged: Number(logged!.sum) };
    };

    test("made longer right after calls: the calls still count, the key stops at its budget", async () => {
      const key = await newKey({ max_budget: 5, budget_duration: "1h" });
      expect(await callsUntilRefused(key, 3)).toBe(3);
      await setDuration(key, "2h");
      // $3 spent of $5: two more calls, not five.
      expect(await callsUntilRefused(key, 6)).toBe(2);
      expect(await stored(key)).toMatchObject({ spend: 5, logged: 5 });
    });

    test("a team's, made longer right after calls: the calls still count, the team stops at its budget", async () => {
      const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { max_budget: 5, budget_duration: "1h" } })).body.team_id;
      const key = await newKey({ team_id: team });
      expect(await callsUntilRefused(key, 3)).toBe(3);
      expect((await requestJson(gw, "POST", "/team/update", { body: { team_id: team, budget_duration: "2h" } })).status).toBe(200);
      expect(await callsUntilRefused(key, 6)).toBe(2);
      await gw.host!.spendWriter.flush();
      expect((await requestJson<{ team_info: { spend: number } }>(gw, "GET", `/team/info?team_id=${team}`)).body.team_info.spend).toBe(5);
    });

    test("the same duration sent again (a client that sends the whole row at each edit) leaves the period's end where it was", async () => {
      const resetOf = async (path: string, pick: (b: Record<string, unknown>) => unknown) => {
        const r = await requestJson<Record<string, unknown>>(gw, "GET", path);
        expect(r.status).toBe(200);
        return pick(r.body);
      };
      const key = await newKey({ max_budget: 5, budget_duration: "1h" });
      const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { max_budget: 5, budget_duration: "1h" } })).body.team_id;
      const org = (await requestJson<{ organization_id: string }>(gw, "POST", "/organization/new", { body: { organization_alias: `same-${world.name}`, max_budget: 5, budget_duration: "1h" } })).body.organization_id;
      const budget = (await requestJson<{ budget_id: string }>(gw, "POST", "/budget/new", { body: { max_budget: 5, budget_duration: "1h" } })).body.budget_id;
      const reads = {
        key: () => resetOf(`/key/info?key=${key}`, (b) => (b.info as Record<string, unknown>).budget_reset_at),
        team: () => resetOf(`/team/info?team_id=${team}`, (b) => (b.team_info as Record<string, unknown>).budget_reset_at),
        org: () => resetOf(`/organization/info?organization_id=${org}`, (b) => b.budget_reset_at),
        budget: () => requestJson<Record<string, unknown>[]>(gw, "POST", "/budget/info", { body: { budgets: [budget] } }).then((r) => r.body[0]!.budget_reset_at),
      };
      const before = { key: await reads.key(), team: await reads.team(), org: await reads.org(), budget: await reads.budget() };
      for (const v of Object.values(before)) expect(typeof v).toBe("string");
      await Bun.sleep(50);
      expect((await requestJson(gw, "POST", "/key/update", { body: { key, budget_duration: "1h", key_alias: `renamed-${world.name}` } })).status).toBe(200);
      expect((await requestJson(gw, "POST", "/team/update", { body: { team_id: team, budget_duration: "1h", team_alias: "renamed" } })).status).toBe(200);
      expect((await requestJson(gw, "PATCH", "/organization/update", { body: { organization_id: org, budget_duration: "1h", organization_alias: `renamed-${world.name}` } })).status).toBe(200);
      expect((await requestJson(gw, "POST", "/budget/update", { body: { budget_id: budget, budget_duration: "1h", max_budget: 6 } })).status).toBe(200);
      expect({ key: await reads.key(), team: await reads.team(), org: await reads.org(), budget: await reads.budget() }).toEqual(before);
    });

    test("made shorter: the spend so far stays, and the period ends at its new end", async () => {
      const key = await newKey({ max_budget: 3, budget_duration: "1h" });
      expect(await callsUntilRefused(key, 4)).toBe(3);
      const before = Date.now();
      await setDuration(key, "2s");
      expect(await callsUntilRefused(key, 1)).toBe(0);
      await Bun.sleep(Math.max(0, before + 2500 - Date.now()));
      // A new period: $3 again, not a refusal until the hour is over.
      expect(await callsUntilRefused(key, 4)).toBe(3);
      const after = await stored(key);
      expect(after.logged).toBe(6);
      expect(after.spend).toBe(3);
      // The period's end was not moved back to the old hour's end.
      expect(after.resetAt).toBeLessThan(Date.now() + 5000);
    }, 30_000);

    test("made shorter, and no call until its new end has passed: the next period starts at 0", async () => {
      const key = await newKey({ max_budget: 3, budget_duration: "1h" });
      expect(await callsUntilRefused(key, 4)).toBe(3);
      const before = Date.now();
      await setDuration(key, "2s");
      // The ledger last saw the hour-long period; the first call it sees is in the period after the new end.
      await Bun.sleep(Math.max(0, before + 2500 - Date.now()));
      expect(await callsUntilRefused(key, 4)).toBe(3);
      // The first period's calls, written after the period roller moved the row on, stay in the log, not in the new period.
      expect(await stored(key)).toMatchObject({ spend: 3, logged: 6 });
    }, 30_000);
  });
}
