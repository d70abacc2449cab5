// Cooldowns across instances: two gateway processes on one Redis. Instance A cools a dead
// deployment down; instance B, which never called it, skips it from then on (it would otherwise
// pay its own failed calls, with retries, before cooling it down itself). Instance C, on another
// database of the same Redis server (another deployment of the gateway), does not hear it.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { MASTER_KEY, type SpawnedGateway, spawnGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { TEST_REDIS_DB, TEST_REDIS_URL } from "../harness/redis.ts";

const REDIS_URL = TEST_REDIS_URL;
const DEAD = "http://127.0.0.1:9/v1";
const suffix = crypto.randomUUID().slice(0, 8);

let live: MockOpenAI;
let a: SpawnedGateway;
let b: SpawnedGateway;
let c: SpawnedGateway;
/** The same server, another database: Redis delivers pub/sub messages across databases. */
const OTHER_DATABASE = Object.assign(new URL(REDIS_URL), { pathname: `/${TEST_REDIS_DB + 8}` }).href;

async function chat(gw: SpawnedGateway): Promise<{ status: number; model: string | null; retries: string | null }> {
  const res = await fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "pair", messages: [{ role: "user", content: "hi" }] }),
  });
  await res.arrayBuffer();
  return { status: res.status, model: res.headers.get("x-svc-model-id"), retries: res.headers.get("x-svc-attempted-retries") };
}

async function waitFor(gw: SpawnedGateway, text: string): Promise<void> {
  for (let i = 0; i < 200 && !gw.output().includes(text); i++) await Bun.sleep(25);
  expect(gw.output()).toContain(text);
}

beforeAll(async () => {
  live = await startMockOpenAI({ apiKey: "sk-up" });
  const config = {
    model_list: [
      { model_name: "pair", svc_params: { model: "openai/gpt-4o-mini", api_base: DEAD, api_key: "sk-up" }, model_info: { id: `dead-${suffix}` } },
      { model_name: "pair", svc_params: { model: "openai/gpt-4o-mini", api_base: live.url, api_key: "sk-up" }, model_info: { id: `live-${suffix}` } },
    ],
    router_settings: { allowed_fails: 1, cooldown_time: 60, num_retries: 1, retry_initial_delay: 0.01 },
    general_settings: { master_key: MASTER_KEY },
  };
  [a, b, c] = await Promise.all([spawnGateway(config, { env: { REDIS_URL } }), spawnGateway(config, { env: { REDIS_URL } }), spawnGateway(config, { env: { REDIS_URL: OTHER_DATABASE } })]);
  await Promise.all([waitFor(a, "deployment cooldowns are shared"), waitFor(b, "deployment cooldowns are shared"), waitFor(c, "deployment cooldowns are shared")]);
}, 60_000);
afterAll(async () => {
  await Promise.all([a?.stop(), b?.stop(), c?.stop()]);
  await live?.stop();
});

test("a deployment cooled down by one instance is skipped by the other", async () => {
  // A learns the hard way: calls until it has seen two failures of the dead deployment.
  for (let i = 0; i < 40 && !a.output().includes("deployment cooling down"); i++) expect((await chat(a)).status).toBe(200);
  expect(a.output()).toContain(`dead-${suffix}`);
  await Bun.sleep(200);
  // B never tries it: every call is answered by the live one at the first attempt.
  const calls = await Promise.all(Array.from({ length: 12 }, () => chat(b)));
  expect(calls.map((c) => [c.status, c.model, c.retries])).toEqual(calls.map(() => [200, `live-${suffix}`, "0"]));
  expect(b.output()).not.toContain("deployment cooling down");
});

test("an instance on another database of the same Redis server does not hear it: it meets the dead deployment itself", async () => {
  // Runs after the first test: A has cooled the dead deployment down. C picks it about every second call.
  const calls: Awaited<ReturnType<typeof chat>>[] = [];
  for (let i = 0; i < 12; i++) calls.push(await chat(c));
  expect(calls.every((x) => x.status === 200 && x.model === `live-${suffix}`)).toBe(true);
  // A retry: the first attempt went to the dead deployment (it logs a cooldown only at its second failure).
  expect(calls.some((x) => x.retries !== "0")).toBe(true);
});
