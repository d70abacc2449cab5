// Bun's fetch has its own socket idle timer (BUN_CONFIG_HTTP_IDLE_TIMEOUT, 5 minutes unless set):
// an upstream quieter than that must still be waited for up to the gateway's own `timeout` (a 408
// after it, not a 503 "could not connect" before it), and a stream's parts may be as far apart as
// its `stream_timeout`. Here the gateway is a process whose idle timer is a second (Bun fires it
// on a 4 s sweep: within ~8 s), so timeouts a few seconds past that show which one ends the call.
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI from "openai";
import { MASTER_KEY, type SpawnedGateway, spawnGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

/** Past the moment Bun's idle timer of one second fires (at most ~8 s). */
const TIMEOUT_S = 12;
const GAP_MS = 12_000;

let mock: MockOpenAI;
let gw: SpawnedGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: "sk-up" });
  const upstream = { api_base: mock.url, api_key: "sk-up" };
  gw = await spawnGateway(
    {
      model_list: [
        { model_name: "slow-json", svc_params: { model: "openai/gpt-4o", ...upstream, timeout: TIMEOUT_S } },
        { model_name: "slow-stream", svc_params: { model: "openai/gpt-4o", ...upstream, stream_timeout: TIMEOUT_S * 2 } },
      ],
      router_settings: { num_retries: 0 },
      general_settings: {
        pass_through_endpoints: [{ path: "/slow-target", target: `${mock.url}/chat/completions`, headers: { Authorization: "Bearer sk-up" }, timeout: TIMEOUT_S }],
      },
    },
    { env: { BUN_CONFIG_HTTP_IDLE_TIMEOUT: "1", DATABASE_URL: undefined, REDIS_URL: undefined } },
  );
  client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL, maxRetries: 0, timeout: 60_000 });
}, 90_000);

afterAll(async () => {
  await gw?.stop();
  mock?.stop();
});

test.concurrent(
  "an upstream that does not answer is a 408 at the deployment's timeout, past Bun's idle time",
  async () => {
    mock.fault({ kind: "hang", match: "hang-json" });
    const started = performance.now();
    const err = await client.chat.completions.create({ model: "slow-json", messages: [{ role: "user", content: "hang-json" }] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    const seconds = (performance.now() - started) / 1000;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const { status, error } = err as InstanceType<typeof OpenAI.APIError>;
    expect({ status, type: (error as { type?: string }).type }).toEqual({ status: 408, type: "timeout_error" });
    expect(seconds).toBeGreaterThanOrEqual(TIMEOUT_S - 0.5);
  },
  60_000,
);

test.concurrent(
  "a stream whose parts are further apart than Bun's idle time but within stream_timeout is not cut",
  async () => {
    const firstEvent = (bytes: Uint8Array) => new TextDecoder().decode(bytes).indexOf("\n\n") + 2;
    mock.fault({ kind: "wire", match: "gap-stream", shape: (bytes) => ({ cuts: [firstEvent(bytes)], gapMs: GAP_MS }) });
    const started = performance.now();
    const stream = await client.chat.completions.create({ model: "slow-stream", stream: true, messages: [{ role: "user", content: "gap-stream" }] });
    let text = "";
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(performance.now() - started).toBeGreaterThanOrEqual(GAP_MS - 500);
    expect(finish).toBe("stop");
    expect(text.length).toBeGreaterThan(0);
  },
  60_000,
);

test.concurrent(
  "a pass-through target that does not answer is a 408 at the endpoint's timeout, past Bun's idle time",
  async () => {
    mock.fault({ kind: "hang", match: "hang-pass" });
    const started = performance.now();
    const res = await fetch(`${gw.url}/slow-target`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "gpt-4o", messages: [{ role: "user", content: "hang-pass" }] }),
    });
    const seconds = (performance.now() - started) / 1000;
    expect(res.status).toBe(408);
    expect(((await res.json()) as { error: { type: string } }).error.type).toBe("timeout_error");
    expect(seconds).toBeGreaterThanOrEqual(TIMEOUT_S - 0.5);
  },
  60_000,
);
