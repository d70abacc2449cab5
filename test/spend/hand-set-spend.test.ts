// Spend set by hand (`spend` in /key/regenerate, /team/update, /user/update) is what the store
// keeps and what budgets count from: calls that had already ended are written before the new
// figure (not on top of it), and the budget's counter starts again from it.
// The spend writer here writes only when asked, so calls that ended are still queued at the write.
// With two instances on one database, calls that ended on B and are still in B's queue when the
// spend is set through A are not added on top of it either.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BACKENDS, freshDatabase, MASTER_KEY, requestJson, requestOk, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";
import { DOLLAR_MODEL, dollarCall } from "../harness/traffic.ts";

const CONFIG = { model_list: [DOLLAR_MODEL], general_settings: { master_key: MASTER_KEY } };
const WORLDS = [...BACKENDS.map((backend) => ({ name: backend, backend, redis: false })), { name: "postgres+redis", backend: "postgres" as const, redis: true }];

for (const world of WORLDS) {
  describe(`spend set by hand (${world.name})`, () => {
    let gw: TestGateway;

    beforeAll(async () => {
      gw = await startBackendGateway(world.backend, CONFIG, { spend: { intervalMs: 60_000 }, ...(world.redis ? { redisUrl: TEST_REDIS_URL } : {}) });
    }, 60_000);
    afterAll(() => gw?.stop());

    const post = <T = Record<string, unknown>>(path: string, body: Record<string, unknown>) => requestOk<T>(gw, "POST", path, body);
    const newKey = async (body: Record<string, unknown>) => post<{ key: string; token: string }>("/key/generate", body);
    const newTeam = async (body: Record<string, unknown>) => (await post<{ team_id: string }>("/team/new", body)).team_id;
    const newUser = async (body: Record<string, unknown>) => (await post<{ user_id: string }>("/user/new", body)).user_id;
    const statuses = async (key: string, n: number) => {
      const out: number[] = [];
      for (let i = 0; i < n; i++) out.push((await dollarCall(gw, key)).status);
      return out;
    };
    /** Stored spend once every call so far is written. */
    const stored = {
      key: async (token: string) => {
        await gw.host!.spendWriter.flush();
        return (await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${token}`)).body.info.spend;
      },
      team: async (teamId: string) => {
        await gw.host!.spendWriter.flush();
        return (await requestJson<{ team_info: { spend: number } }>(gw, "GET", `/team/info?team_id=${teamId}`)).body.team_info.spend;
      },
      user: async (userId: string) => {
        await gw.host!.spendWriter.flush();
        return (await requestJson<{ user_info: { spend: number } }>(gw, "GET", `/user/info?user_id=${userId}`)).body.user_info.spend;
      },
    };

    test("/key/regenerate {spend: 0} after calls that ended: the key's spend stays 0", async () => {
      const { key } = await newKey({});
      expect(await statuses(key, 3)).toEqual([200, 200, 200]);
      const rotated = await post<{ token: string; spend: number }>("/key/regenerate", { key, spend: 0 });
      expect(rotated.spend).toBe(0);
      expect(await stored.key(rotated.token)).toBe(0);
    });

    test("/team/update {spend: 0} and /user/update {spend: 0} after calls that ended: their spend stays 0", async () => {
      const teamId = await newTeam({});
      const userId = await newUser({});
      const { key } = await newKey({ team_id: teamId, user_id: userId });
      expect(await statuses(key, 3)).toEqual([200, 200, 200]);
      await post("/team/update", { team_id: teamId, spend: 0 });
      await post("/user/update", { user_id: userId, spend: 0 });
      expect(await stored.team(teamId)).toBe(0);
      expect(await stored.user(userId)).toBe(0);
    });

    for (const owner of ["team", "user"] as const) {
      test(`a ${owner}'s spend lowered by hand makes room at once; raised to its budget, the next call is refused`, async () => {
        const make = async (max_budget: number) => {
          if (owner === "team") {
            const teamId = await newTeam({ max_budget });
            return { id: teamId, key: (await newKey({ team_id: teamId })).key };
          }
          const userId = await newUser({ max_budget });
          return { id: userId, key: (await newKey({ user_id: userId })).key };
        };
        const setSpend = (id: string, spend: number) => post(`/${owner}/update`, { [`${owner}_id`]: id, spend });
        const lowered = await make(2);
        expect(await statuses(lowered.key, 3)).toEqual([200, 200, 400]);
        await setSpend(lowered.id, 0);
        expect(await statuses(lowered.key, 3)).toEqual([200, 200, 400]);
        expect(await stored[owner](lowered.id)).toBe(2);

        const raised = await make(3);
        expect(await statuses(raised.key, 1)).toEqual([200]);
        await setSpend(raised.id, 3);
        const refused = await dollarCall(gw, raised.key);
        expect(refused.status).toBe(400);
        expect(refused.text).toContain("Budget has been exceeded");
        expect(await stored[owner](raised.id)).toBe(3);
      });
    }
  });
}

for (const world of WORLDS.filter((w) => w.backend === "postgres")) {
  describe(`spend set by hand through one instance, calls ended on another (${world.name})`, () => {
    let a: TestGateway;
    let b: TestGateway;
    let drop: (() => Promise<void>) | undefined;

    beforeAll(async () => {
      const db = await freshDatabase("gw_handset");
      drop = db.drop;
      const store = { databaseUrl: db.url, spend: { intervalMs: 60_000 }, ...(world.redis ? { redisUrl: TEST_REDIS_URL } : {}) };
      a = await startTestGateway(CONFIG, { store });
      b = await startTestGateway(CONFIG, { store });
      await Promise.all([a.host!.services.bus!.subscribed(), b.host!.services.bus!.subscribed()]);
    }, 60_000);
    afterAll(async () => {
      await a?.stop();
      await b?.stop();
      await drop?.();
    });

    const post = <T = Record<string, unknown>>(path: string, body: Record<string, unknown>) => requestOk<T>(a, "POST", path, body);
    /** A key made through A, once B knows it: it reaches B's cache over the change channel, milliseconds later. */
    const keyKnownOnB = async (body: Record<string, unknown>) => {
      const made = await post<{ key: string; token: string }>("/key/generate", body);
      for (const end = performance.now() + 2000; !b.host!.services.identity!.keys.has(made.token) && performance.now() < end; ) await Bun.sleep(10);
      return made;
    };
    const keyInfo = async (token: string) => (await requestJson<{ info: { spend: number } }>(a, "GET", `/key/info?key=${token}`)).body.info.spend;
    /** What the key's logged calls cost. */
    const logged = async (token: string) => (await requestJson<{ spend: number }[]>(a, "GET", `/spend/logs?api_key=${token}`)).body.reduce((sum, r) => sum + r.spend, 0);
    /** B's calls until one is refused (at most `n`), after it has heard of the reset (within a second). */
    const callsOnB = async (key: string, n: number) => {
      const t0 = performance.now();
      while ((await dollarCall(b, key)).status !== 200) {
        expect(performance.now() - t0, "B never admitted a call after the reset").toBeLessThan(1000);
        await Bun.sleep(50);
      }
      const out = [200];
      while (out.length < n) out.push((await dollarCall(b, key)).status);
      return out;
    };

    /**
     * Two $1 calls through B spend `owner`'s $2 budget; its spend set to 0 through A; B's queue
     * written after that. The stored spend stays 0, the calls are logged, and B admits two calls
     * again (its budget counter, and Redis's, agree with the stored 0).
     */
    const setThroughA = async (made: { key: string; token: string }, set: () => Promise<unknown>, spend: () => Promise<number>) => {
      expect([(await dollarCall(b, made.key)).status, (await dollarCall(b, made.key)).status, (await dollarCall(b, made.key)).status]).toEqual([200, 200, 400]);
      await set();
      await b.host!.spendWriter.flush();
      expect(await spend()).toBe(0);
      expect(await logged(made.token)).toBe(2);
    };

    test("/key/{key}/reset_spend, /key/update {spend: 0} and /global/spend/reset through A: B's queued calls are not added", async () => {
      for (const [route, reset] of [
        ["reset_spend", (key: string) => post(`/key/${key}/reset_spend`, { reset_to: 0 })],
        ["key/update", (key: string) => post("/key/update", { key, spend: 0 })],
        ["global reset", () => post("/global/spend/reset", {})],
      ] as const) {
        const made = await keyKnownOnB({ max_budget: 2 });
        await setThroughA(made, () => reset(made.key), () => keyInfo(made.token));
        expect(await callsOnB(made.key, 3), route).toEqual([200, 200, 400]);
        await b.host!.spendWriter.flush();
        expect(await keyInfo(made.token), route).toBe(2);
      }
    });

    test("a call that ends on B after the reset through A is added, though B writes it with the calls before it", async () => {
      const made = await keyKnownOnB({});
      expect([(await dollarCall(b, made.key)).status, (await dollarCall(b, made.key)).status]).toEqual([200, 200]);
      await post(`/key/${made.key}/reset_spend`, { reset_to: 0 });
      expect((await dollarCall(b, made.key)).status).toBe(200);
      await b.host!.spendWriter.flush();
      expect(await keyInfo(made.token)).toBe(1);
      expect(await logged(made.token)).toBe(3);
    });

    test("/key/regenerate {spend: 0} through A: B's queued calls are not added to the rotated key", async () => {
      const made = await keyKnownOnB({ max_budget: 2 });
      let rotated = { key: "", token: "" };
      await setThroughA(
        made,
        async () => {
          rotated = await post<{ key: string; token: string }>("/key/regenerate", { key: made.key, spend: 0 });
        },
        () => keyInfo(rotated.token),
      );
    });

    for (const owner of ["team", "user"] as const) {
      test(`/${owner}/update {spend: 0} through A: B's queued calls are not added`, async () => {
        const id = owner === "team" ? (await post<{ team_id: string }>("/team/new", { max_budget: 2 })).team_id : (await post<{ user_id: string }>("/user/new", { max_budget: 2 })).user_id;
        const made = await keyKnownOnB({ [`${owner}_id`]: id });
        const info = async () => {
          const res = await requestJson<{ team_info?: { spend: number }; user_info?: { spend: number } }>(a, "GET", `/${owner}/info?${owner}_id=${id}`);
          return (res.body.team_info ?? res.body.user_info)!.spend;
        };
        await setThroughA(made, () => post(`/${owner}/update`, { [`${owner}_id`]: id, spend: 0 }), info);
        expect(await callsOnB(made.key, 3)).toEqual([200, 200, 400]);
        await b.host!.spendWriter.flush();
        expect(await info()).toBe(2);
      });
    }
  });
}
