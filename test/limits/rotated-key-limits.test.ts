// A rotated key keeps its rate-limit windows and its calls in flight: its counters are named by the
// token it had first, which a rotation keeps. Named by the current token, a regenerate gave the new
// value empty windows: a second call passed max_parallel_requests 1 while the first was still in
// flight, and an rpm_limit of 2 let 3 calls through in a minute.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { MASTER_KEY, requestOk, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { chatCall, type LimitReply } from "./chat-call.ts";

/** In memory, and in Redis. */
const WORLDS = [
  { name: "pglite", backend: "pglite" as const, redis: false },
  { name: "postgres+redis", backend: "postgres" as const, redis: true },
];

let upstream: MockOpenAI;
beforeAll(async () => {
  upstream = await startMockOpenAI({ apiKey: "sk-up" });
});
afterAll(() => upstream?.stop());

for (const world of WORLDS) {
  describe(`a rotated key keeps its rate limits (${world.name})`, () => {
    let gw: TestGateway;

    beforeAll(async () => {
      gw = await startBackendGateway(
        world.backend,
        {
          model_list: [
            { model_name: "fast", svc_params: { model: "mock/fast" } },
            { model_name: "slow", svc_params: { model: "openai/gpt-4o-mini", api_base: upstream.url, api_key: "sk-up" } },
          ],
          general_settings: { master_key: MASTER_KEY },
        },
        world.redis ? { redisUrl: TEST_REDIS_URL } : {},
      );
    }, 60_000);
    afterAll(() => gw?.stop());

    const post = <T = Record<string, unknown>>(path: string, body: Record<string, unknown>) => requestOk<T>(gw, "POST", path, body);
    const newKey = async (body: Record<string, unknown>) => (await post<{ key: string }>("/key/generate", body)).key;
    const regenerate = async (key: string) => (await post<{ key: string }>(`/key/${key}/regenerate`, {})).key;
    /** A `slow` call the upstream answers after `holdMs`. */
    const slowCall = (key: string, holdMs: number): Promise<LimitReply> => {
      const marker = randomUUID();
      upstream.fault({ kind: "delay", ms: holdMs, match: marker });
      return chatCall(gw, key, "slow", { messages: [{ role: "user", content: marker }] });
    };

    test("max_parallel_requests 1: the call in flight still counts for the regenerated value", async () => {
      const key = await newKey({ max_parallel_requests: 1 });
      const first = slowCall(key, 1500);
      await Bun.sleep(300);
      expect((await slowCall(key, 0)).status).toBe(429);
      const rotated = await regenerate(key);
      const second = await slowCall(rotated, 0);
      expect([second.status, second.body.error?.message]).toEqual([429, expect.stringContaining("parallel requests limit 1, 1 requests in flight")]);
      expect((await first).status).toBe(200);
      expect((await slowCall(rotated, 0)).status).toBe(200);
    });

    test("rpm_limit 2: the minute's calls still count for the regenerated value", async () => {
      const key = await newKey({ rpm_limit: 2 });
      expect([(await chatCall(gw, key, "fast")).status, (await chatCall(gw, key, "fast")).status]).toEqual([200, 200]);
      const rotated = await regenerate(key);
      const third = await chatCall(gw, rotated, "fast");
      expect([third.status, third.body.error?.message]).toEqual([429, expect.stringContaining("requests per minute limit 2, 2 used in the last 60 s")]);
    });

    test("model_rpm_limit: the minute's calls on the model still count for the regenerated value", async () => {
      const key = await newKey({ model_rpm_limit: { fast: 1 } });
      expect((await chatCall(gw, key, "fast")).status).toBe(200);
      const rotated = await regenerate(key);
      const refused = await chatCall(gw, rotated, "fast");
      expect([refused.status, refused.body.error?.message]).toEqual([429, expect.stringContaining("for model=fast: requests per minute limit 1")]);
    });
  });
}
