// Deletions and a spend reset while the keys they touch serve calls, on PostgreSQL: the spend
// writer's batch statement adds every call's cost to its key's, user's, team's, organization's
// and membership's counters, while /user/delete, /team/delete and /global/spend/reset lock and
// write those rows. Each must answer (no 500 from PostgreSQL breaking a deadlock, no second's
// wait for it), the deleted keys must be refused at once, and every call must be written.
import { expect, test } from "bun:test";
import { requestJson, startBackendGateway } from "../harness/gateway.ts";
import { chatStatus, PRICED_CHAT } from "../harness/traffic.ts";

/** How long traffic and deletions run side by side. */
const RUN_MS = 6_000;

test("/user/delete, /team/delete and /global/spend/reset while the keys call: every one answers, no spend write fails", async () => {
  // Small, frequent spend batches, so batch statements and deletions overlap often.
  const gw = await startBackendGateway("postgres", PRICED_CHAT, { spend: { intervalMs: 2, batchSize: 16 } });
  try {
    const org = (await requestJson<{ organization_id: string }>(gw, "POST", "/organization/new", { body: { organization_alias: "busy" } })).body.organization_id;
    const failures: string[] = [];
    /** A team in the organization with two members, each with two of its keys. */
    const team = async (n: number) => {
      const teamId = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: `t${n}`, organization_id: org } })).body.team_id;
      const users = [`u${n}a`, `u${n}b`];
      const keys: string[] = [];
      for (const user_id of users) {
        await requestJson(gw, "POST", "/team/member_add", { body: { team_id: teamId, member: { user_id, role: "user" } } });
        for (let i = 0; i < 2; i++) keys.push((await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: teamId, user_id } })).body.key);
      }
      return { teamId, users, keys };
    };
    const end = Date.now() + RUN_MS;
    /** Keys calls go to; a key is taken out as its deletion starts (a call under way may then be refused). */
    const live = new Set<string>();
    const deleted = new Set<string>();
    let calls = 0;
    const traffic = async (worker: number) => {
      while (Date.now() < end) {
        const keys = [...live];
        if (keys.length === 0) {
          await Bun.sleep(2);
          continue;
        }
        const key = keys[Math.floor(Math.random() * keys.length)]!;
        const status = await chatStatus(gw, key, { stream: worker % 2 === 0 });
        if (status === 200) calls++;
        else if (!(status === 401 && !live.has(key))) failures.push(`call ${status}`);
        await Bun.sleep(1);
      }
    };
    let deletions = 0;
    const admin = async () => {
      for (let n = 0; Date.now() < end; n++) {
        const t = await team(n);
        for (const k of t.keys) live.add(k);
        await Bun.sleep(100);
        for (const k of t.keys) live.delete(k);
        const t0 = Date.now();
        const res =
          n % 3 === 0
            ? await requestJson(gw, "POST", "/user/delete", { body: { user_ids: t.users } })
            : n % 3 === 1
              ? await requestJson(gw, "POST", "/team/delete", { body: { team_ids: [t.teamId] } })
              : await requestJson(gw, "POST", "/global/spend/reset");
        if (res.status !== 200) failures.push(`${n % 3} ${res.status}: ${res.text}`);
        // PostgreSQL looks for a deadlock after a second's wait.
        else if (Date.now() - t0 > 900) failures.push(`${n % 3} took ${Date.now() - t0} ms`);
        else deletions++;
        if (n % 3 !== 2) for (const k of t.keys) deleted.add(k);
      }
    };
    await Promise.all([...Array.from({ length: 8 }, (_, w) => traffic(w)), admin()]);

    expect(failures.slice(0, 5)).toEqual([]);
    expect(deletions).toBeGreaterThan(6);
    // A deleted key is refused.
    const one = [...deleted][0]!;
    expect(await chatStatus(gw, one)).toBe(401);
    // Every call written, none of the writes failed on the way.
    await gw.host!.spendWriter.flush();
    expect(calls).toBeGreaterThan(100);
    expect(gw.host!.spendWriter.written).toBe(calls);
    expect(gw.log.lines.filter((l) => l.level !== "info").map((l) => l.msg)).toEqual([]);
  } finally {
    await gw.stop();
  }
}, 60_000);
