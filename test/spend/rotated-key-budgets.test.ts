// A rotated key (/key/regenerate, /key/{key}/regenerate, auto_rotate) keeps its spend and its
// budgets: its counters are named by the token it had first, which a rotation keeps. Named by
// the current token, the new token began new counters: the calls still in flight held nothing on
// them (max_budget 0.2: five $0.11 calls each started before a regenerate all passed, 0.55 spent),
// and its per-model budget (model_max_budget) started again after each rotation.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { rotateDueKeys } from "../../core/identity/rotation.ts";
import { BACKENDS, MASTER_KEY, requestJson, requestOk, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";
import { jsonPostReceiver } from "../harness/util.ts";
import { DOLLAR_MODEL, dollarCall } from "../harness/traffic.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

/** An upstream that answers when told (a `delay` fault matched by the prompt): calls held in flight. */
let upstream: MockOpenAI;
/** Priced like DOLLAR_MODEL: `max_tokens: 1000` reserves $1; its short answer costs under a cent. */
const SLOW = (url: string) => ({
  model_name: "slow",
  svc_params: { model: "openai/gpt-4o-mini", api_base: url, api_key: "sk-up" },
  model_info: { input_cost_per_token: 0, output_cost_per_token: 0.001 },
});
const config = () => ({ model_list: [DOLLAR_MODEL, SLOW(upstream.url)], general_settings: { master_key: MASTER_KEY } });
const WORLDS = [...BACKENDS.map((backend) => ({ name: backend, backend, redis: false })), { name: "postgres+redis", backend: "postgres" as const, redis: true }];

beforeAll(async () => {
  upstream = await startMockOpenAI({ apiKey: "sk-up" });
});
afterAll(() => upstream?.stop());

interface Refusal {
  error?: { type: string; message: string; budget?: { entity: string; id: string } };
}

/** A `slow` call that the upstream answers after `holdMs`: its status and body. */
async function slowCall(gw: { url: string }, key: string, holdMs: number): Promise<{ status: number; body: Refusal }> {
  const marker = randomUUID();
  upstream.fault({ kind: "delay", ms: holdMs, match: marker });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "slow", messages: [{ role: "user", content: marker }], max_tokens: 1000 }),
  });
  return { status: res.status, body: (await res.json()) as Refusal };
}

for (const world of WORLDS) {
  describe(`a rotated key keeps its budgets (${world.name})`, () => {
    let gw: TestGateway;

    beforeAll(async () => {
      gw = await startBackendGateway(world.backend, config(), world.redis ? { redisUrl: TEST_REDIS_URL } : {});
    }, 60_000);
    afterAll(() => gw?.stop());

    const post = <T = Record<string, unknown>>(path: string, body: Record<string, unknown>) => requestOk<T>(gw, "POST", path, body);
    const newKey = (body: Record<string, unknown>) => post<{ key: string; token: string }>("/key/generate", body);
    const regenerate = (key: string, body: Record<string, unknown> = {}) => post<{ key: string; token: string }>(`/key/${key}/regenerate`, body);
    const statuses = async (key: string, n: number) => {
      const out: number[] = [];
      for (let i = 0; i < n; i++) out.push((await dollarCall(gw, key)).status);
      return out;
    };

    test("a call in flight still holds its reservation after a regenerate: the new value's call past max_budget is refused, naming the new token", async () => {
      const { key } = await newKey({ max_budget: 1.5 });
      const first = slowCall(gw, key, 1500);
      await Bun.sleep(300);
      expect((await slowCall(gw, key, 0)).status).toBe(400);
      const rotated = await regenerate(key);
      const second = await slowCall(gw, rotated.key, 0);
      expect(second.status).toBe(400);
      expect(second.body.error?.message).toContain("held by calls in flight");
      expect(second.body.error?.budget).toMatchObject({ entity: "key", id: rotated.token });
      expect((await first).status).toBe(200);
      // Settled under a cent: room for the next call again.
      expect((await slowCall(gw, rotated.key, 0)).status).toBe(200);
      await gw.host!.spendWriter.flush();
      const info = await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${rotated.token}`);
      expect(info.body.info.spend).toBeLessThan(0.1);
    });

    test("a regenerate with spend: 0 makes room at once on the counters it carries on", async () => {
      const { key } = await newKey({ max_budget: 2 });
      expect(await statuses(key, 3)).toEqual([200, 200, 400]);
      const rotated = await regenerate(key, { spend: 0 });
      expect(await statuses(rotated.key, 3)).toEqual([200, 200, 400]);
    });

    test("model_max_budget: a regenerate does not give the model's budget back", async () => {
      const { key } = await newKey({ model_max_budget: { dollar: { budget_limit: 2 } } });
      expect(await statuses(key, 3)).toEqual([200, 200, 400]);
      const once = await regenerate(key);
      expect(await statuses(once.key, 2)).toEqual([400, 400]);
      const twice = await regenerate(once.key);
      const refused = await dollarCall(gw, twice.key);
      expect(refused.status).toBe(400);
      expect(refused.text).toContain("for model=dollar");
      expect((JSON.parse(refused.text) as Refusal).error?.budget).toMatchObject({ entity: "key", id: twice.token });
    });

    test("model_max_budget on a period: a regenerate does not give the period's budget back", async () => {
      const { key } = await newKey({ model_max_budget: { dollar: { budget_limit: 2, time_period: "1d" } } });
      expect(await statuses(key, 3)).toEqual([200, 200, 400]);
      const rotated = await regenerate(key);
      expect(await statuses(rotated.key, 1)).toEqual([400]);
    });

    test("a per-model budget given to a rotated key counts what the key spent on the model before its rotations", async () => {
      const { key } = await newKey({});
      expect(await statuses(key, 2)).toEqual([200, 200]);
      const rotated = await regenerate(key);
      expect(await statuses(rotated.key, 1)).toEqual([200]);
      await post("/key/update", { key: rotated.key, model_max_budget: { dollar: { budget_limit: 3.5 } } });
      // $3 spent on the model under two tokens: no room for another $1.
      expect(await statuses(rotated.key, 1)).toEqual([400]);
    });

    test("auto_rotate: the value kept through its grace period goes on against the same per-model budget", async () => {
      const { key } = await newKey({ auto_rotate: true, rotation_interval: "1s", model_max_budget: { dollar: { budget_limit: 2 } } });
      expect(await statuses(key, 3)).toEqual([200, 200, 400]);
      await Bun.sleep(1100);
      expect(await rotateDueKeys(gw.host!.store.db, gw.host!.services.bus!, gw.log, Date.now(), 60_000)).toBeGreaterThanOrEqual(1);
      const info = await requestJson<{ info: { token: string; rotation_count: number } }>(gw, "GET", `/key/info?key=${key}`);
      expect(info.body.info.rotation_count).toBe(1);
      expect(await statuses(key, 2)).toEqual([400, 400]);
    });

    test("a new key given a value an earlier key was created with (revoked since) has a budget of its own", async () => {
      const value = `sk-reused-${randomUUID()}`;
      const earlier = await newKey({ key: value, max_budget: 2 });
      expect(await statuses(earlier.key, 3)).toEqual([200, 200, 400]);
      // Written first: spend still queued under the value when another key has it is charged to that key.
      await gw.host!.spendWriter.flush();
      const rotated = await regenerate(value);
      const again = await newKey({ key: value, max_budget: 1 });
      expect(again.token).toBe(earlier.token);
      expect(await statuses(value, 2)).toEqual([200, 400]);
      expect(await statuses(rotated.key, 1)).toEqual([400]);
    });
  });
}

describe("a rotated key's per-model budget read from the store (postgres, two instances)", () => {
  test("rotated more often than the key keeps its earlier tokens, its spend on the model still counts on an instance that never met it", async () => {
    const a = await startBackendGateway("postgres", config(), { dbPrefix: "gw_rotated_budget" });
    let b: TestGateway | undefined;
    try {
      let { key } = (await requestJson<{ key: string }>(a, "POST", "/key/generate", { body: { model_max_budget: { dollar: { budget_limit: 2 } } } })).body;
      for (let i = 0; i < 2; i++) expect((await dollarCall(a, key)).status).toBe(200);
      for (let i = 0; i < 10; i++) key = (await requestJson<{ key: string }>(a, "POST", `/key/${key}/regenerate`, { body: {} })).body.key;
      await a.host!.spendWriter.flush();
      b = await startTestGateway(config(), { store: { databaseUrl: a.databaseUrl } });
      const refused = await dollarCall(b, key);
      expect(refused.status).toBe(400);
      expect(refused.text).toContain("for model=dollar");
    } finally {
      await b?.stop();
      await a.stop();
    }
  }, 60_000);
});

describe("a rotated key's budget alert (pglite)", () => {
  test("is sent once, naming the token the key has when it crosses", async () => {
    const receiver = jsonPostReceiver();
    const gw = await startBackendGateway("pglite", { ...config(), general_settings: { master_key: MASTER_KEY, alert_webhook_url: receiver.url } });
    try {
      const made = (await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { soft_budget: 1.5 } })).body;
      expect((await dollarCall(gw, made.key)).status).toBe(200);
      const rotated = (await requestJson<{ key: string; token: string }>(gw, "POST", `/key/${made.key}/regenerate`, { body: {} })).body;
      expect((await dollarCall(gw, rotated.key)).status).toBe(200);
      const mine = () => receiver.received.filter((h) => h.token === made.token || h.token === rotated.token);
      for (let i = 0; i < 50 && mine().length === 0; i++) await Bun.sleep(20);
      const again = (await requestJson<{ key: string }>(gw, "POST", `/key/${rotated.key}/regenerate`, { body: {} })).body;
      expect((await dollarCall(gw, again.key)).status).toBe(200);
      await Bun.sleep(200);
      expect(mine()).toEqual([expect.objectContaining({ event: "soft_budget_crossed", token: rotated.token, soft_budget: 1.5 })]);
    } finally {
      await gw.stop();
      receiver.stop();
    }
  });
});
