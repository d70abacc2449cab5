// /key/regenerate while the key serves calls: the row keeps its spend under its new token, so the
// cost of calls that were under way, or whose spend was still queued, when it was rotated (they
// name the old token) must reach it too: its spend stays the sum of its calls'.
import { expect, test } from "bun:test";
import postgres from "postgres";
import { hashKey } from "../../core/identity/keys.ts";
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

/**
 * A gateway on PostgreSQL whose spend writer writes only when told, a team with a key that has
 * made one priced call (its spend still queued), and a side connection that plays another
 * session: `waitForLocks(n)` is true once n sessions wait on a lock.
 */
async function overlap(alias: string) {
  const gw = await startBackendGateway("postgres", PRICED_CHAT, { spend: { intervalMs: 60_000 } });
  const side = postgres(gw.databaseUrl!, { max: 2, onnotice: () => {} });
  const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: alias } })).body.team_id;
  const key = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team } })).body.key;
  expect(await chatStatus(gw, key)).toBe(200);
  const lockWaits = async () => (await side`select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`)[0]!.n as number;
  const waitForLocks = async (n: number) => {
    for (const end = Date.now() + 5000; Date.now() < end; await Bun.sleep(20)) if ((await lockWaits()) >= n) return true;
    return false;
  };
  /** After the writer wrote what it held: the team's spend is the call's, and the key (by its latest value) has it too. */
  const expectKeyCharged = async (latest: string) => {
    await gw.host!.spendWriter.flush();
    const teamSpend = (await requestJson<{ team_info: { spend: number } }>(gw, "GET", `/team/info?team_id=${team}`)).body.team_info.spend;
    const keySpend = (await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${latest}`)).body.info.spend;
    expect(teamSpend).toBeGreaterThan(0);
    expect(keySpend).toBe(teamSpend);
  };
  const stop = async () => {
    await side.end();
    await gw.stop();
  };
  return { gw, side, team, key, waitForLocks, expectKeyCharged, stop };
}

// The exact overlap, on PostgreSQL: a spend batch whose statement starts while a rotation has
// moved the key to its new token but not yet committed. The batch saw the old token and no
// successor, waited for the key's row, and then found it under another token: the call's cost
// was in the log and the team's spend but not the key's. A side connection holds the rotation
// there (an uncommitted row for the old token in rotated_keys, which its insert waits for).
test("postgres: a spend batch that starts while the key's rotation is being written charges the rotated key", async () => {
  const o = await overlap("busy");
  try {
    let regenerated: Promise<{ status: number; body: { key: string } }> | undefined;
    let flushed: Promise<void> | undefined;
    await o.side
      .begin(async (tx) => {
        await tx`insert into rotated_keys (token, active_token, revoke_at) values (${hashKey(o.key)}, 'held', now())`;
        regenerated = requestJson<{ key: string }>(o.gw, "POST", `/key/${o.key}/regenerate`, { body: {} });
        expect(await o.waitForLocks(1)).toBe(true);
        flushed = o.gw.host!.spendWriter.flush();
        expect(await o.waitForLocks(2)).toBe(true);
        throw new Error("let the rotation go on");
      })
      .catch((err: Error) => expect(err.message).toBe("let the rotation go on"));
    const r = await regenerated!;
    expect(r.status).toBe(200);
    await flushed;
    await o.expectKeyCharged(r.body.key);
  } finally {
    await o.stop();
  }
}, 30_000);

// Two rotations in one batch: the batch's statement reads the old token, waits for the team's row
// (a side connection holds it, as another instance's batch would), and meanwhile the key is
// regenerated twice. When it reaches the key's row, the row has moved twice: the batch must still
// find it by the first token, or the key loses the call's cost that the log and the team keep.
test("postgres: a spend batch that waits through two rotations of its key charges the rotated key", async () => {
  const o = await overlap("twice");
  try {
    let latest = o.key;
    let flushed: Promise<void> | undefined;
    await o.side.begin(async (tx) => {
      await tx`select 1 from teams where team_id = ${o.team} for update`;
      flushed = o.gw.host!.spendWriter.flush();
      expect(await o.waitForLocks(1)).toBe(true);
      for (let i = 0; i < 2; i++) {
        const r = await requestJson<{ key: string }>(o.gw, "POST", `/key/${latest}/regenerate`, { body: {} });
        expect(r.status).toBe(200);
        latest = r.body.key;
      }
    });
    await flushed;
    await o.expectKeyCharged(latest);
  } finally {
    await o.stop();
  }
}, 30_000);

// The rotated row keeps the tokens it had (`rotated_from`) for batches that read one before the
// rotations committed; once such a value is given to another key, the calls of that key are its own.
test("postgres: a value rotated away (twice) and given to a new key charges the new key only", async () => {
  const gw = await startBackendGateway("postgres", PRICED_CHAT, { spend: { intervalMs: 60_000 } });
  try {
    const old = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: {} })).body.key;
    const between = (await requestJson<{ key: string }>(gw, "POST", `/key/${old}/regenerate`, { body: {} })).body.key;
    const rotated = (await requestJson<{ key: string }>(gw, "POST", `/key/${between}/regenerate`, { body: {} })).body.key;
    expect(await chatStatus(gw, rotated)).toBe(200);
    await gw.host!.spendWriter.flush();
    const spendOf = async (key: string) => (await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${key}`)).body.info.spend;
    const before = await spendOf(rotated);
    expect(before).toBeGreaterThan(0);
    expect((await requestJson(gw, "POST", "/key/generate", { body: { key: old } })).status).toBe(200);
    for (let i = 0; i < 3; i++) expect(await chatStatus(gw, old)).toBe(200);
    await gw.host!.spendWriter.flush();
    expect(await spendOf(old)).toBeCloseTo(3 * before, 12);
    expect(await spendOf(rotated)).toBe(before);
  } finally {
    await gw.stop();
  }
}, 30_000);
