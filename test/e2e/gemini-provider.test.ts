// Gemini and Vertex AI through the gateway, seen by the official `openai` SDK: the gateway
// (started in-process with `gemini/…` and `vertex_ai/…` deployments) in front of the mock Google
// upstream. `mock.requests` shows what went upstream; Vertex calls authenticate with a throwaway
// service-account key whose grant the mock's OAuth endpoint verifies.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import OpenAI, { APIError, AuthenticationError, BadRequestError, RateLimitError } from "openai";
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { collect, failure } from "../harness/util.ts";
import { type MockGemini, mockGeminiEmbedding, startMockGemini } from "../mock-upstream/gemini.ts";

const API_KEY = "AIzaSyMockKey-0123456789abcdefghijklmno";
const SA_EMAIL = "llm-gateway@acme-prod.iam.gserviceaccount.com";

let mock: MockGemini;
let gw: TestGateway;
let client: OpenAI;
let privateKeyPem: string;

beforeAll(async () => {
  const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  privateKeyPem = privateKey.export({ type: "pkcs8", format: "pem" }) as string;
  mock = await startMockGemini({
    apiKey: API_KEY,
    serviceAccounts: [{ email: SA_EMAIL, publicKey: publicKey.export({ type: "spki", format: "pem" }) as string }],
    maxInputTokens: 2000,
    embeddingUsage: true,
  });
  const serviceAccountKey = JSON.stringify({
    type: "service_account",
    project_id: "acme-prod",
    private_key_id: "5f1e0c2a9b",
    private_key: privateKeyPem,
    client_email: SA_EMAIL,
    token_uri: mock.tokenUrl,
  });
  const unknownAccountKey = JSON.stringify({
    type: "service_account",
    project_id: "acme-prod",
    private_key: generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey.export({ type: "pkcs8", format: "pem" }),
    client_email: "stranger@acme-prod.iam.gserviceaccount.com",
    token_uri: mock.tokenUrl,
  });
  const gemini = (model: string, extra: Record<string, unknown> = {}) => ({ model: `gemini/${model}`, api_base: mock.url, api_key: API_KEY, ...extra });
  const vertex = (model: string) => ({ model: `vertex_ai/${model}`, api_base: mock.url, vertex_credentials: serviceAccountKey, vertex_location: "us-east5" });
  gw = await startTestGateway({
    model_list: [
      { model_name: "gemini-flash", svc_params: gemini("gemini-2.5-flash"), model_info: { id: "dep-gemini" } },
      { model_name: "gemini-wrong-key", svc_params: gemini("gemini-2.5-flash", { api_key: "AIza-wrong" }) },
      { model_name: "gemini-missing", svc_params: gemini("gemini-nonexistent-model") },
      { model_name: "gemini-slow", svc_params: gemini("gemini-2.5-flash", { timeout: 0.5 }) },
      { model_name: "gemini-embed", svc_params: gemini("gemini-embedding-001"), model_info: { mode: "embedding" } },
      { model_name: "vertex-gemini", svc_params: vertex("gemini-2.5-pro"), model_info: { id: "dep-vertex" } },
      { model_name: "vertex-claude", svc_params: vertex("claude-sonnet-4@20250514") },
      { model_name: "vertex-embed", svc_params: vertex("text-embedding-005"), model_info: { mode: "embedding" } },
      // A key the token server does not know: every grant is refused.
      { model_name: "vertex-unknown-account", svc_params: { ...vertex("gemini-2.5-pro"), vertex_credentials: unknownAccountKey } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
});

afterAll(async () => {
  await gw.stop();
  await mock.stop();
});

beforeEach(() => mock.reset());

const user = (content: string) => [{ role: "user" as const, content }];

const weatherTool: ChatCompletionTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a place",
    parameters: {
      type: "object",
      properties: { location: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
      required: ["location"],
      additionalProperties: false,
    },
  },
};

/** The upstream request of a model call (the token grant, if any, is left out). */
function sent(i = 0): { path: string; headers: Record<string, string>; body: Record<string, unknown> } {
  const calls = mock.requests.filter((r) => r.path !== "/token");
  return calls[i] as { path: string; headers: Record<string, string>; body: Record<string, unknown> };
}

function text(chunks: ChatCompletionChunk[]): string {
  return chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
}

describe("gemini/… (AI Studio)", () => {
  test("chat: the answer, usage and ids; upstream got generateContent with the key header and a system instruction", async () => {
    const { data, response } = await client.chat.completions
      .create({ model: "gemini-flash", messages: [{ role: "system", content: "You are terse." }, ...user("Hello there Gemini")], temperature: 0.3 })
      .withResponse();
    expect(data.object).toBe("chat.completion");
    expect(data.choices[0]!.message.content).toBe("Mock reply to: Hello there Gemini");
    expect(data.choices[0]!.finish_reason).toBe("stop");
    expect(data.model).toBe("gemini-2.5-flash");
    expect(data.usage!.completion_tokens).toBe(6);
    expect(data.usage!.total_tokens).toBe(data.usage!.prompt_tokens + 6);
    expect(response.headers.get("x-svc-model-id")).toBe("dep-gemini");

    const up = sent();
    expect(up.path).toBe("/v1beta/models/gemini-2.5-flash:generateContent");
    expect(up.headers["x-goog-api-key"]).toBe(API_KEY);
    expect(up.headers.authorization).toBeUndefined();
    expect(up.body).toEqual({
      contents: [{ role: "user", parts: [{ text: "Hello there Gemini" }] }],
      systemInstruction: { parts: [{ text: "You are terse." }] },
      generationConfig: { temperature: 0.3 },
    });
  });

  test("stream: SSE from streamGenerateContent?alt=sse, role first, text in order, finish, then usage", async () => {
    const stream = await client.chat.completions.create({ model: "gemini-flash", messages: user("Stream me some words"), stream: true, stream_options: { include_usage: true } });
    const chunks = await collect(stream);
    expect(sent().path).toBe("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse");
    expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant");
    expect(text(chunks)).toBe("Mock reply to: Stream me some words");
    const finishes = chunks.filter((c) => c.choices[0]?.finish_reason);
    expect(finishes.map((c) => c.choices[0]!.finish_reason)).toEqual(["stop"]);
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toMatchObject({ completion_tokens: 7 });
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
  });

  test("tools: a function call comes back as a tool call; its result goes back as a functionResponse named after it, both with the call's id", async () => {
    const first = await client.chat.completions.create({ model: "gemini-flash", messages: user("What is the weather in Paris?"), tools: [weatherTool] });
    const choice = first.choices[0]!;
    expect(choice.finish_reason).toBe("tool_calls");
    const call = choice.message.tool_calls![0]!;
    expect(call.type).toBe("function");
    if (call.type !== "function") throw new Error("expected a function call");
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual({ location: "Paris", unit: "celsius" });
    // The schema Gemini got has no keyword it would refuse (the mock checks, as Google does).
    expect(JSON.stringify(sent().body.tools)).not.toContain("additionalProperties");

    const second = await client.chat.completions.create({
      model: "gemini-flash",
      tools: [weatherTool],
      messages: [...user("What is the weather in Paris?"), choice.message, { role: "tool", tool_call_id: call.id, content: '{"temp_c":21,"sky":"clear"}' }],
    });
    expect(second.choices[0]!.message.content).toBe('Tool said: {"temp_c":21,"sky":"clear"}');
    const contents = sent(1).body.contents as { role: string; parts: Record<string, unknown>[] }[];
    expect(contents.at(-2)).toEqual({ role: "model", parts: [{ functionCall: { id: call.id, name: "get_weather", args: { location: "Paris", unit: "celsius" } } }] });
    expect(contents.at(-1)).toEqual({ role: "user", parts: [{ functionResponse: { id: call.id, name: "get_weather", response: { temp_c: 21, sky: "clear" } } }] });
  });

  test("tools in a stream: the call arrives as one tool-call delta with its whole arguments", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "gemini-flash", messages: user("weather in Oslo?"), tools: [weatherTool], tool_choice: "required", stream: true }));
    const calls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({ index: 0, type: "function", function: { name: "get_weather", arguments: '{"location":"Paris","unit":"celsius"}' } });
    expect(chunks.find((c) => c.choices[0]?.finish_reason)?.choices[0]?.finish_reason).toBe("tool_calls");
    expect(sent().body.toolConfig).toEqual({ functionCallingConfig: { mode: "ANY" } });
  });

  test("reasoning_effort turns thinking on: thoughts come back as reasoning_content, counted as reasoning tokens", async () => {
    const res = await client.chat.completions.create({ model: "gemini-flash", messages: user("Think about cats"), reasoning_effort: "medium" });
    const message = res.choices[0]!.message as typeof res.choices[0]["message"] & { reasoning_content?: string };
    expect(message.reasoning_content).toBe("Thinking about: Think about cats");
    expect(message.content).toBe("Mock reply to: Think about cats");
    expect(res.usage!.completion_tokens_details!.reasoning_tokens).toBeGreaterThan(0);
    expect(res.usage!.completion_tokens).toBe(6 + res.usage!.completion_tokens_details!.reasoning_tokens!);
    expect((sent().body.generationConfig as Record<string, unknown>).thinkingConfig).toEqual({ includeThoughts: true, thinkingBudget: 2048 });
  });

  test("response_format json_schema: Gemini answers JSON matching the schema", async () => {
    const res = await client.chat.completions.create({
      model: "gemini-flash",
      messages: user("A city please"),
      response_format: {
        type: "json_schema",
        json_schema: { name: "city", strict: true, schema: { type: "object", properties: { city: { type: "string" }, population: { type: "integer" } }, required: ["city", "population"], additionalProperties: false } },
      },
    });
    expect(JSON.parse(res.choices[0]!.message.content!)).toEqual({ city: "Paris", population: 1 });
    expect((sent().body.generationConfig as Record<string, unknown>).responseMimeType).toBe("application/json");
  });

  test("a stream split mid-JSON and across \\r\\n reaches the client whole", async () => {
    const events = [
      'data: {"candidates": [{"content": {"parts": [{"text": "Split "}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 4,"totalTokenCount": 4},"modelVersion": "gemini-2.5-flash","responseId": "SplitResp01"}\r\n\r\n',
      'data: {"candidates": [{"content": {"parts": [{"text": "streams \\"work\\""}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 4,"candidatesTokenCount": 3,"totalTokenCount": 7},"modelVersion": "gemini-2.5-flash","responseId": "SplitResp01"}\r\n\r\n',
    ].join("");
    const cuts = [23, events.indexOf("\r\n\r\n") + 1, events.indexOf("\r\n\r\n") + 3, events.indexOf('\\"work') + 1, events.length - 2];
    const chunks = cuts.map((end, i) => events.slice(i === 0 ? 0 : cuts[i - 1], end));
    chunks.push(events.slice(cuts.at(-1)));
    mock.fault({ kind: "cannedStream", chunks });
    const out = await collect(await client.chat.completions.create({ model: "gemini-flash", messages: user("x"), stream: true, stream_options: { include_usage: true } }));
    expect(text(out)).toBe('Split streams "work"');
    expect(out.every((c) => c.id === "SplitResp01")).toBe(true);
    expect(out.at(-1)!.usage).toMatchObject({ prompt_tokens: 4, completion_tokens: 3, total_tokens: 7 });
  });

  test("embeddings: batchEmbedContents with dimensions → OpenAI's list with Google's vectors and usage", async () => {
    const res = await client.embeddings.create({ model: "gemini-embed", input: ["first document", "second"], dimensions: 8, encoding_format: "float" });
    expect(res.object).toBe("list");
    expect(res.data.map((d) => d.index)).toEqual([0, 1]);
    expect(res.data[0]!.embedding).toEqual(mockGeminiEmbedding("first document", 8));
    expect(res.data[1]!.embedding).toEqual(mockGeminiEmbedding("second", 8));
    expect(res.usage).toEqual({ prompt_tokens: 6, total_tokens: 6 });
    expect(res.model).toBe("gemini-embed");
    const up = sent();
    expect(up.path).toBe("/v1beta/models/gemini-embedding-001:batchEmbedContents");
    expect(up.body).toEqual({
      requests: [
        { model: "models/gemini-embedding-001", content: { parts: [{ text: "first document" }] }, outputDimensionality: 8 },
        { model: "models/gemini-embedding-001", content: { parts: [{ text: "second" }] }, outputDimensionality: 8 },
      ],
    });
  });

  test("embeddings in the SDK's default encoding (base64 float32) decode to the same vectors", async () => {
    const res = await client.embeddings.create({ model: "gemini-embed", input: "base64 please", dimensions: 16 });
    expect(sent().body).toMatchObject({ requests: [{ outputDimensionality: 16 }] });
    expect(Array.from(res.data[0]!.embedding)).toEqual(mockGeminiEmbedding("base64 please", 16));
  });
});

describe("gemini/… errors", () => {
  test("a wrong key: Google's 400 and its message", async () => {
    const err = await failure(client.chat.completions.create({ model: "gemini-wrong-key", messages: user("hi") }));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as APIError).message).toContain("API key not valid. Please pass a valid API key.");
  });

  test("an unknown model: 404 with Google's message", async () => {
    const err = (await failure(client.chat.completions.create({ model: "gemini-missing", messages: user("hi") }))) as APIError;
    expect(err.status).toBe(404);
    expect(err.message).toContain("is not found for API version v1beta");
  });

  test("quota exhausted: 429", async () => {
    mock.fault({ kind: "status", status: 429 });
    const err = await failure(client.chat.completions.create({ model: "gemini-flash", messages: user("hi") }));
    expect(err).toBeInstanceOf(RateLimitError);
    expect((err as APIError).message).toContain("You exceeded your current quota");
  });

  test("a prompt over the context window: 400 of type context_window_exceeded", async () => {
    const err = (await failure(client.chat.completions.create({ model: "gemini-flash", messages: user("long ".repeat(2000)) }))) as APIError;
    expect(err).toBeInstanceOf(BadRequestError);
    expect(err.type).toBe("context_window_exceeded");
    expect(err.message).toMatch(/The input token count \(\d+\) exceeds the maximum number of tokens allowed \(2000\)/);
  });

  test("a parameter Gemini cannot take is refused, naming it", async () => {
    const err = (await failure(client.chat.completions.create({ model: "gemini-flash", messages: user("hi"), logit_bias: { "50256": -100 } }))) as APIError;
    expect(err.status).toBe(400);
    expect(err.message).toContain("logit_bias");
    expect(mock.requests).toHaveLength(0);
  });

  test("a prompt blocked in a stream (Gemini's first event) is a 400 content-policy error before the stream begins", async () => {
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "gemini-flash", messages: user("BLOCKME please"), stream: true }),
    });
    expect(res.status).toBe(400);
    const { error } = (await res.json()) as { error: { type: string; message: string; code: string } };
    expect(error).toMatchObject({ type: "content_policy_violation", code: "400" });
    expect(error.message).toContain("blockReason SAFETY");
  });

  test("an upstream that does not answer in time: 408", async () => {
    mock.fault({ kind: "hang" });
    const err = (await failure(client.chat.completions.create({ model: "gemini-slow", messages: user("hi") }))) as APIError;
    expect(err.status).toBe(408);
  });

  test("a stream cut by the upstream ends with an error event after what was received", async () => {
    mock.fault({ kind: "cutStream", afterEvents: 2 });
    const err = await failure(collect(await client.chat.completions.create({ model: "gemini-flash", messages: user("one two three four five"), stream: true })));
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toMatch(/ended unexpectedly/);
  });
});

describe("vertex_ai/… with a service account", () => {
  test("chat: the key's grant reached the token endpoint, the bearer token reached Vertex, and it is reused", async () => {
    const first = await client.chat.completions.create({ model: "vertex-gemini", messages: user("Hello Vertex") });
    const second = await client.chat.completions.create({ model: "vertex-gemini", messages: user("Again") });
    expect(first.choices[0]!.message.content).toBe("Mock reply to: Hello Vertex");
    expect(second.choices[0]!.message.content).toBe("Mock reply to: Again");
    const calls = mock.requests.filter((r) => r.path !== "/token");
    expect(calls.map((r) => r.path)).toEqual([
      "/v1/projects/acme-prod/locations/us-east5/publishers/google/models/gemini-2.5-pro:generateContent",
      "/v1/projects/acme-prod/locations/us-east5/publishers/google/models/gemini-2.5-pro:generateContent",
    ]);
    // One signed grant for both calls, made before the first: the token is cached, not fetched per call.
    expect(mock.grants).toHaveLength(1);
    expect(mock.grants[0]!.email).toBe(SA_EMAIL);
    expect(mock.requests[0]!.path).toBe("/token");
    const bearer = calls[0]!.headers.authorization;
    expect(bearer).toBe(`Bearer ${mock.grants[0]!.accessToken}`);
    expect(calls[1]!.headers.authorization).toBe(bearer);
    expect(calls[0]!.headers["x-goog-api-key"]).toBeUndefined();
  });

  test("stream through Vertex", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "vertex-gemini", messages: user("Stream from Vertex"), stream: true }));
    expect(text(chunks)).toBe("Mock reply to: Stream from Vertex");
    expect(sent().path).toEndWith("/publishers/google/models/gemini-2.5-pro:streamGenerateContent?alt=sse");
  });

  test("Claude on Vertex: chat, stream and a tool call through rawPredict / streamRawPredict", async () => {
    const res = await client.chat.completions.create({ model: "vertex-claude", messages: [{ role: "system", content: "Be brief." }, ...user("Hello Claude")] });
    expect(res.choices[0]!.message.content).toBe("Mock reply to: Hello Claude");
    const up = sent();
    expect(up.path).toBe("/v1/projects/acme-prod/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict");
    expect(up.body.anthropic_version).toBe("vertex-2023-10-16");
    expect(up.body).not.toHaveProperty("model");
    expect(up.headers.authorization).toMatch(/^Bearer ya29\./);

    const chunks = await collect(await client.chat.completions.create({ model: "vertex-claude", messages: user("Stream Claude"), stream: true }));
    expect(text(chunks)).toBe("Mock reply to: Stream Claude");
    expect(sent(1).path).toEndWith(":streamRawPredict");

    const tool = await client.chat.completions.create({ model: "vertex-claude", messages: user("weather in Paris?"), tools: [weatherTool] });
    expect(tool.choices[0]!.finish_reason).toBe("tool_calls");
    const call = tool.choices[0]!.message.tool_calls![0]!;
    if (call.type !== "function") throw new Error("expected a function call");
    expect(call.function.name).toBe("get_weather");
  });

  test("embeddings through Vertex predict, with the token counts Vertex reports", async () => {
    const res = await client.embeddings.create({ model: "vertex-embed", input: ["vertex text"], encoding_format: "float" });
    expect(res.data[0]!.embedding).toEqual(mockGeminiEmbedding("vertex text", 768));
    expect(res.usage.prompt_tokens).toBe(3);
    expect(sent().path).toEndWith("/publishers/google/models/text-embedding-005:predict");
  });

  test("a refused token grant: 401 naming the token server's reason, and no call reaches Vertex", async () => {
    const err = (await failure(client.chat.completions.create({ model: "vertex-unknown-account", messages: user("hi") }))) as APIError;
    // The token server refused the key: an authentication failure, raised by the SDK as such.
    expect(err).toBeInstanceOf(AuthenticationError);
    expect(err.status).toBe(401);
    expect(err.message).toContain("could not get a Google access token");
    expect(err.message).toContain("invalid_grant");
    expect(mock.requests.map((r) => r.path)).toEqual(["/token"]);
  });

  test("the service account's private key never appears in an answer, an error or the gateway's log", async () => {
    const answers: string[] = [];
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "vertex-gemini", messages: user("hi") }),
    });
    answers.push(await res.text());
    mock.fault({ kind: "status", status: 500, path: "/publishers/" });
    const failed = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "vertex-gemini", messages: user("hi") }),
    });
    expect(failed.status).toBe(500);
    answers.push(await failed.text());
    const models = await fetch(`${gw.baseURL}/model/info`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
    answers.push(await models.text());
    const keyBody = privateKeyPem.split("\n").slice(1, -2).join("");
    const logged = JSON.stringify(gw.log.lines);
    for (const text of [...answers, logged]) {
      expect(text).not.toContain("PRIVATE KEY");
      expect(text).not.toContain(keyBody.slice(0, 64));
    }
  });
});
