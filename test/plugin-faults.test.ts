/**
 * A third-party plugin's faults stay its own: a rate limiter or budget checker that throws (or
 * rejects) fails that call with a 500 in the error envelope and takes back what the gateway's own
 * limits and budgets had granted it, so the key's next calls are not refused for a call that never
 * ran; a logging callback whose flush never ends, or a dispose that never ends, does not hold the
 * gateway's stop (it is logged).
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { relative, resolve } from "node:path";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gateTiming } from "../core/pipeline/call.ts";
import { MASTER_KEY, requestJson, spawnGateway, startTestGateway, type TestGateway } from "./harness/gateway.ts";

const FAULTY = resolve(import.meta.dir, "fixtures/plugins/faulty.ts");
/** Plugin paths are relative to the config file, which test gateways keep in a fresh folder under the OS temp dir. */
const fromTempConfig = (abs: string) => relative(join(tmpdir(), "gw-test-anything"), abs);

// Priced so that a call reserves its worst case on the key's budget: 1,000 answer tokens cost $0.01.
const priced = { input_cost_per_token: 0.000001, output_cost_per_token: 0.00001 };
const GROUPS = ["ok", "limiter-throws", "limiter-rejects", "limiter-hangs", "budget-throws", "budget-rejects"];
const config = {
  model_list: [
    ...GROUPS.map((g) => ({ model_name: g, svc_params: { model: "mock/chat" }, model_info: priced })),
    { model_name: "transport-hangs", svc_params: { model: "hang/chat", timeout: 1 }, model_info: priced },
  ],
  plugins: [{ path: fromTempConfig(FAULTY), config: {} }],
  general_settings: { master_key: MASTER_KEY },
};

describe("a plugin's faulty gate", () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway(config, { store: {} });
  });
  afterAll(() => gw.stop());

  const newKey = async (body: Record<string, unknown>) => (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body })).body.key;
  const chat = (key: string, model: string) =>
    requestJson<{ error?: { type: string; message: string } }>(gw, "POST", "/v1/chat/completions", { key, body: { model, max_tokens: 1000, messages: [{ role: "user", content: "hi" }] } });

  for (const model of ["limiter-throws", "limiter-rejects"]) {
    test(`${model}: a 500 in the envelope, and the key's parallel-request slot is given back`, async () => {
      const key = await newKey({ max_parallel_requests: 1 });
      for (let i = 0; i < 3; i++) {
        const failed = await chat(key, model);
        expect(failed.status).toBe(500);
        expect(failed.body.error?.type).toBe("internal_server_error");
        expect(failed.text).not.toContain("a bug in the");
        expect((await chat(key, "ok")).status).toBe(200);
      }
    });
  }

  test("a gate that never answers: a 503 once the gate time is up, and the key's parallel-request slot is given back", async () => {
    const saved = gateTiming.timeoutMs;
    gateTiming.timeoutMs = 500;
    try {
      const key = await newKey({ max_parallel_requests: 1 });
      const t0 = Date.now();
      const failed = await chat(key, "limiter-hangs");
      expect(failed.status).toBe(503);
      expect(failed.body.error?.message).toContain("did not answer");
      expect(Date.now() - t0).toBeLessThan(5_000);
      expect((await chat(key, "ok")).status).toBe(200);
    } finally {
      gateTiming.timeoutMs = saved;
    }
  });

  test("a provider whose transport never answers and ignores its signal: a 408 at the deployment's timeout, and the key's slot is given back", async () => {
    const key = await newKey({ max_parallel_requests: 1 });
    const t0 = Date.now();
    const failed = await chat(key, "transport-hangs");
    expect(failed.status).toBe(408);
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect((await chat(key, "ok")).status).toBe(200);
  });

  for (const model of ["budget-throws", "budget-rejects"]) {
    test(`${model}: a 500 in the envelope, and the key's budget reservation is given back`, async () => {
      // Room for one call's worst case ($0.01 and a little prompt), not two.
      const key = await newKey({ max_budget: 0.015 });
      for (let i = 0; i < 3; i++) {
        expect((await chat(key, model)).status).toBe(500);
        const ok = await chat(key, "ok");
        expect(ok.text).toContain("chat.completion");
        expect(ok.status).toBe(200);
      }
      expect(gw.log.lines.some((l) => l.level === "error" && JSON.stringify(l).includes("a bug in the budget plugin"))).toBe(true);
    });
  }
});

test("a logging callback whose flush never ends, or a plugin whose dispose never ends, does not hold the gateway's stop", async () => {
  const proc = await spawnGateway({ ...config, svc_settings: { callbacks: ["never-flushes"] } });
  let code: number | null = null;
  try {
    const res = await fetch(`${proc.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "ok", messages: [{ role: "user", content: "hi" }] }),
    });
    expect(res.status).toBe(200);
  } finally {
    code = await proc.stop();
  }
  expect(code).toBe(0);
  expect(proc.output()).toContain("did not finish flushing");
  expect(proc.output()).toContain("plugin dispose did not end in time");
  expect(proc.output()).toContain('"stopped"');
}, 20_000);

test("a logging callback's unhandled rejection, or a throw in its timer, is logged once per kind, redacted, and the gateway keeps serving", async () => {
  const proc = await spawnGateway({ ...config, svc_settings: { callbacks: ["fire-and-forget"] } });
  try {
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`${proc.baseURL}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "ok", messages: [{ role: "user", content: "hi" }] }),
      });
      expect(res.status).toBe(200);
      await Bun.sleep(200);
    }
    expect(proc.proc.exitCode).toBeNull();
    const unhandled = proc.output().split("\n").filter((l) => l.includes("unhandled error (a plugin's?)"));
    expect(unhandled.filter((l) => l.includes("logging backend down"))).toHaveLength(1);
    expect(unhandled.filter((l) => l.includes("a bug in the logger's timer"))).toHaveLength(1);
    expect(proc.output()).not.toContain("sk-logging-backend-secret");
  } finally {
    expect(await proc.stop()).toBe(0);
  }
}, 20_000);
