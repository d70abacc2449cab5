// /key/regenerate while the key serves calls: the row keeps its spend under its new token, so the
// cost of calls that were under way, or whose spend was still queued, when it was rotated (they
// name the old token) must reach it too: its spend stays the sum of its calls'.
import { expect, test } from "bun:test";
import { BACKENDS, requestJson, startBackendGateway } from "../harness/gateway.ts";
import { chatStatus, PRICED_CHAT } from "../harness/traffic.ts";


for (const backend of BACKENDS) {
  test(`${backend}: a key regenerated (with and without a grace period) while it is called keeps the spend of every call`, async () => {
    // Spend written every 400 ms: at each rotation, calls of the last few hundred ms are still queued.
    const gw = await startBackendGateway(backend, PRICED_CHAT, { spend: { intervalMs: 400 } });
    try {
      const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "busy" } })).body.team_id;
      let key = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team, max_budget: 100 } })).body.key;
      let stop = false;
      let calls = 0;
      /** Values being rotated or rotated: refused once the rotation is stored (without grace). */
      const rotating = new Set<string>();
      const failures: string[] = [];
      const traffic = async (worker: number) => {
        while (!stop) {
          const used = key;
          const status = await chatStatus(gw, used, { stream: worker % 2 === 0 });
          if (status === 200) calls++;
          // A call with the old value once a rotation without grace is stored is refused.
          else if (!(status === 401 && rotating.has(used))) failures.push(`call ${status}`);
          await Bun.sleep(2);
        }
      };
      const running = Array.from({ length: 6 }, (_, w) => traffic(w));
      for (const body of [{}, { grace_period: "1h" }, {}]) {
        await Bun.sleep(500);
        rotating.add(key);
        const r = await requestJson<{ key: string }>(gw, "POST", `/key/${key}/regenerate`, { body });
        expect(r.status).toBe(200);
        key = r.body.key;
      }
      await Bun.sleep(300);
      stop = true;
      await Promise.all(running);
      await gw.host!.spendWriter.flush();

      expect(failures.slice(0, 5)).toEqual([]);
      expect(calls).toBeGreaterThan(100);
      // Every call is the team's too (its counter has no rotation): the key's spend is the same sum.
      const info = await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${key}`);
      const teamInfo = await requestJson<{ team_info: { spend: number } }>(gw, "GET", `/team/info?team_id=${team}`);
      expect(teamInfo.body.team_info.spend).toBeGreaterThan(0);
      expect(info.body.info.spend).toBeCloseTo(teamInfo.body.team_info.spend, 9);

      // A revoked value may be given to a new key: its calls are its own, not the rotated key's.
      const first = [...rotating][0]!;
      expect((await requestJson(gw, "POST", "/key/generate", { body: { key: first } })).status).toBe(200);
      expect(await chatStatus(gw, first)).toBe(200);
      await gw.host!.spendWriter.flush();
      const again = await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${first}`);
      expect(again.body.info.spend).toBeGreaterThan(0);
      const still = await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${key}`);
      expect(still.body.info.spend).toBe(info.body.info.spend);
    } finally {
      await gw.stop();
    }
  }, 60_000);
}
