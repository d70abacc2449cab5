// Spend set by hand (`spend` in /key/regenerate, /team/update, /user/update) is what the store
// keeps and what budgets count from: calls that had already ended are written before the new
// figure (not on top of it), and the budget's counter starts again from it.
// The spend writer here writes only when asked, so calls that ended are still queued at the write.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BACKENDS, MASTER_KEY, requestJson, requestOk, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
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
