// Report parts reused from memory or the store answer what a fresh build would: filters whose value is the
// text "undefined" are not the absent filter, and a key re-created with an old value shows its new alias.
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import type { SpendEntry } from "../../core/spend/entry.ts";
import { writeBatch } from "../../core/spend/flush.ts";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { spendEntry } from "../harness/spend.ts";

const ALPHA = { model_name: "alpha-model", svc_params: { model: "mock/alpha" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } };
const CONFIG = { model_list: [ALPHA], general_settings: { master_key: MASTER_KEY } };
const DAY = 86_400_000;
const dayOf = (ms: number) => new Date(ms).toISOString().slice(0, 10);
const TODAY = dayOf(Date.now());
const START = dayOf(Date.now() - 6 * DAY);
type Json = Record<string, unknown>;

async function must<T = Json>(gw: TestGateway, method: string, path: string, body?: unknown): Promise<T> {
  const r = await requestJson<T>(gw, method, path, { body });
  if (r.status !== 200) throw new Error(`${method} ${path} → ${r.status}: ${r.text}`);
  return r.body;
}

/** A call of `daysAgo` days ago: $0.000001, 10 + 5 tokens. */
const past = (daysAgo: number, token: string, team: string | null, endUser: string | null): SpendEntry =>
  spendEntry(Date.now() - daysAgo * DAY, { apiKey: token, teamId: team, endUser, spendPico: 1_000_000, promptTokens: 10, completionTokens: 5 });

for (const backend of BACKENDS) {
  describe(`reused report parts (${backend})`, () => {
    let gw: TestGateway;
    let team: string;
    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_report_parts" });
      ({ team_id: team } = await must<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: "t-review" }));
    }, 60_000);
    afterAll(async () => gw?.stop());
    const get = <T = Json>(path: string) => requestJson<T>(gw, "GET", path, { key: MASTER_KEY });

    test("customer_id=undefined is not the unfiltered customer report", async () => {
      const k = await must<{ token: string }>(gw, "POST", "/key/generate", { team_id: team });
      // A client that sends `user: String(undefined)` makes a customer literally named "undefined".
      await writeBatch(gw.host!.store, [past(2, k.token, team, "undefined"), past(2, k.token, team, "cust-x")]);
      type R = { group_by_day: string; customers: { customer: string }[] }[];
      const all = await get<R>(`/global/spend/report?start_date=${START}&end_date=${TODAY}&group_by=customer`);
      expect(new Set(all.body.flatMap((d) => d.customers.map((c) => c.customer)))).toEqual(new Set(["undefined", "cust-x"]));
      const one = await get<R>(`/global/spend/report?start_date=${START}&end_date=${TODAY}&group_by=customer&customer_id=undefined`);
      expect(new Set(one.body.flatMap((d) => d.customers.map((c) => c.customer)))).toEqual(new Set(["undefined"]));
    });

    test("api_key=undefined is not the unfiltered team report", async () => {
      type R = { group_by_day: string; teams: { keys: unknown[] }[] }[];
      const all = await get<R>(`/global/spend/report?start_date=${START}&end_date=${TODAY}`);
      expect(all.body.length).toBeGreaterThan(0);
      const none = await get<R>(`/global/spend/report?start_date=${START}&end_date=${TODAY}&api_key=undefined`);
      // No key has the hash "undefined": a fresh build answers [].
      expect(none.body).toEqual([]);
    });

    test("creating a key, team or org with no spend leaves every part valid (the names' version stays)", async () => {
      const version = async () => (await rows<{ v: string }>(gw.host!.store.db, sql`select version::text as v from report_names`))[0]!.v;
      const before = await version();
      await must(gw, "POST", "/key/generate", { key_alias: "brand-new" });
      await must(gw, "POST", "/team/new", { team_alias: "brand-new-team" });
      await must(gw, "POST", "/organization/new", { organization_alias: "brand-new-org" });
      expect(await version()).toBe(before);
      await must(gw, "POST", "/team/update", { team_id: team, team_alias: "t-review-renamed" });
      expect(await version()).not.toBe(before);
      await must(gw, "POST", "/team/update", { team_id: team, team_alias: "t-review" });
    });

    test("a key re-created with the value of a rotated-away key shows its new alias on past days", async () => {
      const oldValue = `sk-review-${randomUUID()}`;
      const k = await must<{ token: string }>(gw, "POST", "/key/generate", { key: oldValue, key_alias: "first-life", team_id: team });
      await writeBatch(gw.host!.store, [past(3, k.token, team, null)]);
      const activity = `/team/daily/activity?start_date=${START}&end_date=${TODAY}&team_ids=${team}`;
      expect((await get(activity)).text).toContain('"key_alias":"first-life"');
      // Rotated (no grace): the old hash's past calls are still the rotated key's (found by the hashes it had).
      await must(gw, "POST", "/key/regenerate", { key: oldValue, new_key: `sk-review-${randomUUID()}` });
      const rotated = await get(activity);
      expect(rotated.text).toContain('"key_alias":"first-life"');
      // The old value is free again: a new key takes it.
      const again = await must<{ token: string }>(gw, "POST", "/key/generate", { key: oldValue, key_alias: "second-life", team_id: team });
      expect(again.token).toBe(k.token);
      // Its past calls (the same hash) now show the new alias, also in parts built before.
      const recreated = await get(activity);
      expect(recreated.text).toContain('"key_alias":"second-life"');
      expect(recreated.text).not.toContain('"key_alias":"first-life"');
    });
  });
}
