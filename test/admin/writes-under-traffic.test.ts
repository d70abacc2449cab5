// A team admin's management writes while the team's keys serve traffic, on PostgreSQL (where
// writes and the spend writer run side by side): the spend writer adds every call's cost to the
// key's, user's, team's and membership's counters in its batch statement, while the admin updates
// and creates the team's keys. A write must neither fail (PostgreSQL breaks a deadlock by failing
// one of the two: a 500) nor be lost; the spend of every call is kept.
import { expect, test } from "bun:test";
import { requestJson, startBackendGateway } from "../harness/gateway.ts";
import { chatStatus, PRICED_CHAT } from "../harness/traffic.ts";

/** How long traffic and writes run side by side. */
const RUN_MS = 6_000;

test("a team admin's key writes while the team's keys serve calls: no 5xx, every write kept, every call charged", async () => {
  // Small, frequent spend batches, so batch statements and writes overlap often.
  const gw = await startBackendGateway("postgres", PRICED_CHAT, { spend: { intervalMs: 2, batchSize: 16 } });
  try {
    const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "busy" } })).body.team_id;
    await requestJson(gw, "POST", "/user/new", { body: { user_id: "lead" } });
    expect((await requestJson(gw, "POST", "/team/member_add", { body: { team_id: team, member: { user_id: "lead", role: "admin" } } })).status).toBe(200);
    const adminKey = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { user_id: "lead" } })).body.key;
    const keys: string[] = [];
    for (let i = 0; i < 4; i++) keys.push((await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team, user_id: "lead" } })).body.key);

    const end = Date.now() + RUN_MS;
    let calls = 0;
    const failures: string[] = [];
    const traffic = async (key: string) => {
      while (Date.now() < end) {
        const status = await chatStatus(gw, key);
        if (status === 200) calls++;
        else failures.push(`call ${status}`);
        // Paced, so the spend writer keeps up: what is measured is the overlap, not a backlog.
        await Bun.sleep(2);
      }
    };
    const written = new Map<string, number>();
    const generated: string[] = [];
    const admin = async (worker: number) => {
      for (let n = 0; Date.now() < end; n++) {
        const key = keys[(worker + n) % keys.length]!;
        const update = await requestJson(gw, "POST", "/key/update", { key: adminKey, body: { key, user_id: "lead", metadata: { worker, n } } });
        if (update.status === 200) written.set(key, Math.max(written.get(key) ?? 0, 1));
        else failures.push(`/key/update ${update.status}: ${update.text}`);
        const created = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { key: adminKey, body: { team_id: team, user_id: "lead" } });
        if (created.status === 200) generated.push(created.body.key);
        else failures.push(`/key/generate ${created.status}: ${created.text}`);
      }
    };
    await Promise.all([...keys.flatMap((k) => [traffic(k), traffic(k)]), admin(0), admin(1), admin(2)]);

    expect(failures.slice(0, 5)).toEqual([]);
    expect(written.size).toBe(keys.length);
    expect(generated.length).toBeGreaterThan(0);
    // Every call charged: the team's spend is the sum of its calls' (each the same price).
    await gw.host!.spendWriter.flush();
    const info = await requestJson<{ team_info: { spend: number } }>(gw, "GET", `/team/info?team_id=${team}`);
    const one = await requestJson<{ spend: number }[]>(gw, "GET", `/spend/logs?api_key=${keys[0]}&summarize=false&limit=1`);
    expect(calls).toBeGreaterThan(100);
    expect(info.body.team_info.spend).toBeCloseTo(calls * one.body[0]!.spend, 9);
  } finally {
    await gw.stop();
  }
}, 60_000);
