// Mistral and Codestral end to end: the official `openai` SDK → the gateway → the mock Mistral
// upstream (test/mock-upstream/mistral.ts), which refuses every field outside Mistral's documented
// schema with a 422 as api.mistral.ai does. `mock.requests` shows what went upstream; the spend log
// shows what the call was charged.
import { afterAll, beforeAll, beforeEach, expect, test } from "bun:test";
import OpenAI, { APIError } from "openai";
import { MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { collect, failure, until } from "../harness/util.ts";
import { type MockMistral, startMockMistral } from "../mock-upstream/mistral.ts";

const KEY = "mi-test-0123456789";

let mock: MockMistral;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockMistral({ apiKey: KEY });
  gw = await startTestGateway(
    {
      model_list: [
        { model_name: "mistral", svc_params: { model: "mistral/mistral-large-latest", api_base: `${mock.url}/v1`, api_key: KEY } },
        { model_name: "codestral", svc_params: { model: "codestral/codestral-latest", api_base: `${mock.url}/v1`, api_key: KEY } },
      ],
      general_settings: { master_key: MASTER_KEY },
    },
    { store: {} },
  );
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
}, 60_000);

afterAll(async () => {
  await gw.stop();
  await mock.stop();
});

beforeEach(() => mock.reset());

const user = (content: string) => [{ role: "user" as const, content }];
const upstreamBody = () => mock.requests.at(-1)!.body as Record<string, unknown>;

interface LogRow {
  call_id: string;
  prompt_tokens: number;
  completion_tokens: number;
}

async function loggedTokens(callId: string): Promise<{ prompt: number; completion: number } | undefined> {
  let row: LogRow | undefined;
  await until(async () => {
    await gw.host!.spendWriter.flush();
    const r = await requestJson<LogRow[]>(gw, "GET", "/spend/logs?summarize=false&limit=100");
    row = r.body.find((x) => x.call_id === callId);
    return row !== undefined;
  });
  return row && { prompt: row.prompt_tokens, completion: row.completion_tokens };
}

for (const model of ["mistral", "codestral"]) {
  test(`${model}: a stream is answered without stream_options upstream, and charged the usage of Mistral's last chunk`, async () => {
    const { data, response } = await client.chat.completions.create({ model, messages: user("stream this please"), stream: true }).withResponse();
    const chunks = await collect(data);
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe("Mock reply to: stream this please");
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("stop");
    // The client did not ask for usage: none reaches it.
    expect(chunks.filter((c) => c.usage)).toEqual([]);
    expect(upstreamBody()).not.toHaveProperty("stream_options");
    // Mistral's counts (its chat template's tokens in the prompt), not the gateway's estimate (5 and 6).
    expect(await loggedTokens(response.headers.get("x-svc-call-id")!)).toEqual({ prompt: 8, completion: 6 });
  });
}

test("a client's own stream_options is not sent to Mistral; the usage it asked for still comes, from Mistral's last chunk", async () => {
  const chunks = await collect(await client.chat.completions.create({ model: "mistral", messages: user("count me"), stream: true, stream_options: { include_usage: true } }));
  expect(chunks.at(-1)!.usage).toMatchObject({ prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 });
  expect(upstreamBody()).not.toHaveProperty("stream_options");
});

test("max_completion_tokens goes to Mistral as max_tokens, seed as random_seed", async () => {
  const res = await client.chat.completions.create({ model: "mistral", messages: user("a long answer please"), max_completion_tokens: 3, seed: 7 });
  expect(res.choices[0]!).toMatchObject({ message: { content: "Mock reply to:" }, finish_reason: "length" });
  expect(upstreamBody()).toMatchObject({ max_tokens: 3, random_seed: 7 });
  expect(upstreamBody()).not.toHaveProperty("max_completion_tokens");
  expect(upstreamBody()).not.toHaveProperty("seed");
});

test("a request in Mistral's own names passes as it is", async () => {
  const body = { model: "mistral", messages: user("hello"), max_tokens: 4, random_seed: 3, safe_prompt: true };
  const r = await requestJson(gw, "POST", "/v1/chat/completions", { body });
  expect(r.status).toBe(200);
  expect(upstreamBody()).toEqual({ ...body, model: "mistral-large-latest" });
});

test("`user` (the end user, which the gateway records) is not sent to Mistral, which refuses it", async () => {
  const data = await client.chat.completions.create({ model: "mistral", messages: user("hi"), user: "end-user-7" });
  expect(data.choices[0]!.message.content).toBe("Mock reply to: hi");
  expect(upstreamBody()).not.toHaveProperty("user");
  await gw.host!.spendWriter.flush();
  const logs = await requestJson<{ end_user: string }[]>(gw, "GET", `/spend/logs?request_id=${data.id}&summarize=false`);
  expect(logs.body.map((r) => r.end_user)).toEqual(["end-user-7"]);
});

test("an OpenAI field Mistral does not take is the client's 400 naming it, nothing sent; dropped with drop_params", async () => {
  const err = (await failure(client.chat.completions.create({ model: "mistral", messages: user("hi"), logit_bias: { "50256": -100 }, service_tier: "auto" }))) as APIError;
  expect(err.status).toBe(400);
  expect(err.message).toContain("mistral does not support parameters: ['logit_bias', 'service_tier']");
  expect(mock.requests).toEqual([]);
  const dropped = await requestJson(gw, "POST", "/v1/chat/completions", { body: { model: "mistral", messages: user("hi"), logit_bias: { "1": 1 }, drop_params: true } });
  expect(dropped.status).toBe(200);
  expect(upstreamBody()).not.toHaveProperty("logit_bias");
});

test("a field Mistral refuses inside a message is named in the client's error, not pasted as Mistral's JSON", async () => {
  const err = (await failure(client.chat.completions.create({ model: "mistral", messages: [{ role: "user", content: "hi", name: "bob" }] }))) as APIError;
  expect(err).toBeInstanceOf(APIError);
  expect(err.status).toBe(422);
  expect(err.message).toBe("422 mistral returned 422 for model mistral: body.messages.0.user.name: Extra inputs are not permitted");
});
