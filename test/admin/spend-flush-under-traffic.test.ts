// Writes that first wait for the calls already ended to be stored (/key/{key}/reset_spend,
// /global/spend/reset, and a budget's first read, on a model call's path) while other keys keep
// calling: they must wait for what was queued when they asked, not until traffic stops.
import { expect, test } from "bun:test";
import { requestJson, startBackendGateway } from "../harness/gateway.ts";
import { chatStatus, PRICED_CHAT } from "../harness/traffic.ts";

/** How long the other keys' traffic runs. */
const RUN_MS = 4_000;

test("reset_spend, /global/spend/reset and a budgeted key's first call answer at once while other keys call", async () => {
  const gw = await startBackendGateway("postgres", PRICED_CHAT, { spend: { intervalMs: 2 } });
  try {
    const busy: string[] = [];
    for (let i = 0; i < 4; i++) busy.push((await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: {} })).body.key);
    const call = (key: string) => chatStatus(gw, key);
    const quiet = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: {} })).body.key;
    expect(await call(quiet)).toBe(200);

    const end = Date.now() + RUN_MS;
    let calls = 0;
    const traffic = async (key: string) => {
      while (Date.now() < end) {
        if ((await call(key)) === 200) calls++;
        // Paced, so the spend writer keeps up: what is measured is the overlap, not a backlog.
        await Bun.sleep(2);
      }
    };
    const timed = async <T>(f: () => Promise<T>): Promise<[T, number]> => {
      const t0 = Date.now();
      const out = await f();
      return [out, Date.now() - t0];
    };
    const measured = (async () => {
      await Bun.sleep(500);
      const reset = await timed(() => requestJson(gw, "POST", `/key/${quiet}/reset_spend`, { body: {} }));
      const budgeted = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { max_budget: 100 } })).body.key;
      const first = await timed(() => call(budgeted));
      const global = await timed(() => requestJson(gw, "POST", "/global/spend/reset"));
      return { reset, first, global, endedBefore: end - Date.now() };
    })();
    await Promise.all([...busy.flatMap((k) => [traffic(k), traffic(k)]), measured]);
    const m = await measured;

    expect([m.reset[0].status, m.first[0], m.global[0].status]).toEqual([200, 200, 200]);
    // Each waited for a few batches, not for the traffic to end (it stopped ~3 s later).
    expect({ reset_ms: m.reset[1] < 500, first_call_ms: m.first[1] < 500, global_reset_ms: m.global[1] < 500 }).toEqual({ reset_ms: true, first_call_ms: true, global_reset_ms: true });
    expect(m.endedBefore).toBeGreaterThan(1000);
    expect(calls).toBeGreaterThan(100);
  } finally {
    await gw.stop();
  }
}, 60_000);
