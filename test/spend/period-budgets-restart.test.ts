// Budgets without a row of their own (a provider's, a key's per model) on a period shorter than a
// day, with `disable_spend_logs`: their stored spend was summed from the log, which holds nothing
// then, so each restart handed the period's budget back ($4.1 spent in one hour against $3). Their
// spend per period is now recorded with the other counters, and `/provider/budgets` reads it there.
import { afterAll, describe, expect, test } from "bun:test";
import { gridPeriod } from "../../core/spend/period.ts";
import { BACKENDS, freshDatabase, MASTER_KEY, requestJson, type SpawnedGateway, spawnGateway, tempDir } from "../harness/gateway.ts";
import { DOLLAR_MODEL, dollarCall } from "../harness/traffic.ts";

const CONFIG = {
  model_list: [DOLLAR_MODEL],
  router_settings: { provider_budget_config: { mock: { budget_limit: 3, time_period: "1h" } } },
  general_settings: { master_key: MASTER_KEY, disable_spend_logs: true },
};

/** Calls until one is refused (at most `most`): how many passed. */
async function callsUntilRefused(gw: SpawnedGateway, key: string, most: number): Promise<number> {
  for (let n = 0; n < most; n++) {
    const r = await dollarCall(gw, key);
    if (r.status === 400) return n;
    expect(r.status).toBe(200);
  }
  return most;
}

/** The provider budget's spend this period, as `/provider/budgets` shows it. */
async function providerSpend(gw: SpawnedGateway): Promise<number> {
  const r = await requestJson<{ providers: Record<string, { spend: number }> }>(gw, "GET", "/provider/budgets");
  expect(r.status).toBe(200);
  return r.body.providers.mock!.spend;
}

for (const backend of BACKENDS) {
  describe(`budgets without a row, on a one-hour period, across a restart (${backend}, disable_spend_logs)`, () => {
    const dir = tempDir();
    let db: { url: string; drop(): Promise<void> } | undefined;
    const start = async () => {
      if (backend === "postgres") db ??= await freshDatabase("gw_period_budgets");
      return spawnGateway(CONFIG, { dir, env: { DATABASE_URL: db?.url ?? "" } });
    };
    afterAll(async () => {
      await db?.drop();
    });

    test("the provider's and a key's per-model spend this hour are still counted after a restart", async () => {
      // Not across the hour's end: a new period would start at 0 anyway.
      const period = gridPeriod("1h", Date.now())!;
      if (period.end - Date.now() < 60_000) await Bun.sleep(period.end - Date.now() + 1000);

      let gw = await start();
      const key = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { model_max_budget: { dollar: { budget_limit: 2, time_period: "1h" } } } })).body.key;
      // The key's per-model budget stops it at $2; the master key then reaches the provider's $3.
      expect(await callsUntilRefused(gw, key, 3)).toBe(2);
      expect(await callsUntilRefused(gw, MASTER_KEY, 3)).toBe(1);
      expect(await providerSpend(gw)).toBe(3);
      expect(await gw.stop()).toBe(0);

      gw = await start();
      try {
        expect(await callsUntilRefused(gw, MASTER_KEY, 1)).toBe(0);
        // What /provider/budgets shows is the spend that refused the call.
        expect(await providerSpend(gw)).toBe(3);
        const refused = await dollarCall(gw, key);
        expect(refused.status).toBe(400);
        // Refused by its own per-model budget ($2 spent of $2), not only by the provider's.
        expect(refused.text).toContain("for model=dollar");
      } finally {
        expect(await gw.stop()).toBe(0);
      }
    }, 60_000);
  });
}
