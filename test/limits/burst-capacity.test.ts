// A burst at a model group whose every deployment is at its own rpm is refused naming the
// deployments, not the caller's limit: calls the deployments refuse count against the key's
// limits only until they give them back (a round trip later with the windows in Redis), so a
// refusal by the key's limit meanwhile would blame requests the key never made. A key with a budget
// reserves it (a Redis round trip) between its rate-limit slot and the deployment's: the burst's
// refused calls ask whether a deployment has room before the first calls are counted there, and
// must wait for them; with Redis a few milliseconds away, all the more.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { TcpRelay } from "../harness/relay.ts";
import { TEST_REDIS_URL, testRedisUrlAt } from "../harness/redis.ts";

// Redis is shared by every run on this machine: names of this run's own.
const run = Math.random().toString(36).slice(2, 8);

async function call(gw: TestGateway, key: string, model: string, extra: Record<string, unknown> = {}): Promise<{ status: number; headers: Headers; message?: string }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], ...extra }),
  });
  const body = (await res.json()) as { error?: { message: string } };
  return { status: res.status, headers: res.headers, message: body.error?.message };
}

for (const redisDelayMs of [0, 15]) {
  describe(redisDelayMs ? `Redis ${redisDelayMs} ms away` : "Redis on this machine", () => {
    let gw: TestGateway;
    let relay: TcpRelay | undefined;
    const id = (name: string) => `burst-${name}-${redisDelayMs}-${run}`;

    beforeAll(async () => {
      let redisUrl = TEST_REDIS_URL;
      if (redisDelayMs) {
        relay = await TcpRelay.start({ host: "127.0.0.1", port: 6379 });
        relay.delayMs = redisDelayMs;
        redisUrl = testRedisUrlAt(relay.port);
      }
      gw = await startBackendGateway(
        "postgres",
        {
          model_list: [
            // One group per test: each burst finds its deployments' minute unused.
            ...["plain", "budget"].flatMap((g) => [
              { model_name: `capped-${g}`, svc_params: { model: "mock/c1", rpm: 1 }, model_info: { id: id(`${g}-c1`) } },
              { model_name: `capped-${g}`, svc_params: { model: "mock/c2", rpm: 1 }, model_info: { id: id(`${g}-c2`) } },
            ]),
            { model_name: "open", svc_params: { model: "mock/open" }, model_info: { id: id("open") } },
            { model_name: "small-both", svc_params: { model: "mock/small", rpm: 1, tpm: 1000 }, model_info: { id: id("small-both") } },
          ],
          general_settings: { master_key: MASTER_KEY },
        },
        { redisUrl },
      );
    }, 120_000);
    afterAll(async () => {
      await gw?.stop();
      await relay?.close();
    }, 30_000);

    test.each([false, true])("a burst past the deployments' rpm is refused naming them, and the key keeps what it did not use (key with a budget: %p)", async (withBudget) => {
      const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { rpm_limit: 6, ...(withBudget ? { max_budget: 1000 } : {}) } });
      const key = made.body.key;
      const group = `capped-${withBudget ? "budget" : "plain"}`;
      const replies = await Promise.all(Array.from({ length: 12 }, () => call(gw, key, group)));
      expect(replies.filter((r) => r.status === 200).length).toBe(2);
      const refused = replies.filter((r) => r.status !== 200);
      expect(new Set(refused.map((r) => r.status))).toEqual(new Set([429]));
      for (const r of refused) {
        expect(r.message).toContain(`No deployments available for model ${group}: every deployment is at its rpm/tpm limit`);
        expect(Number(r.headers.get("retry-after"))).toBeGreaterThan(50);
      }
      // Two of the key's six requests were used; this is the third.
      const next = await call(gw, key, "open");
      expect(next.status).toBe(200);
      expect(next.headers.get("x-ratelimit-remaining-requests")).toBe("3");
    });

    test("a request larger than every deployment's whole tpm is told it never fits also while their rpm is used up", async () => {
      expect((await call(gw, MASTER_KEY, "small-both")).status).toBe(200);
      const tooLarge = await call(gw, MASTER_KEY, "small-both", { max_tokens: 5000 });
      expect([tooLarge.status, tooLarge.message]).toEqual([429, expect.stringContaining("this request alone may use")]);
      expect(tooLarge.message).toContain("largest tpm 1000); lower max_tokens");
      expect(tooLarge.headers.get("retry-after")).toBeNull();
    });
  });
}
