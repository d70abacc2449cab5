// Proves the mock speaks OpenAI's wire format by pointing the official `openai` SDK straight at it:
// anything the SDK parses, assembles or raises here, it will parse the same way from api.openai.com.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI, {
  APIConnectionError,
  APIConnectionTimeoutError,
  APIError,
  AuthenticationError,
  BadRequestError,
  InternalServerError,
  NotFoundError,
  RateLimitError,
} from "openai";
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions";
import { closedPort, type MockOpenAI, mockEmbedding, startMockOpenAI } from "./openai.ts";
import { collect, failure } from "../harness/util.ts";

const API_KEY = "sk-mock-test-key-0123456789";

let mock: MockOpenAI;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: API_KEY });
  client = new OpenAI({ apiKey: API_KEY, baseURL: mock.url, maxRetries: 0 });
});

afterAll(async () => {
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
      properties: {
        location: { type: "string" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
      },
      required: ["location"],
    },
  },
};

/** Raw POST, for what the SDK hides: headers, key order, bytes. */
function post(path: string, body: unknown, key = API_KEY): Promise<Response> {
  return fetch(`${mock.url}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

describe("chat completions", () => {
  test("non-stream response has OpenAI's shape, ids and usage", async () => {
    const messages = [
      { role: "system" as const, content: "You are terse." },
      { role: "user" as const, content: "Hello there, how are you today?" },
    ];
    const res = await client.chat.completions.create({ model: "gpt-4o-mini", messages });

    expect(res.id).toMatch(/^chatcmpl-[A-Za-z0-9]{29}$/);
    expect(res.object).toBe("chat.completion");
    expect(res.model).toBe("gpt-4o-mini");
    expect(res.system_fingerprint).toMatch(/^fp_[0-9a-f]{10}$/);
    expect(Math.abs(res.created - Date.now() / 1000)).toBeLessThan(5);
    expect(res.choices).toHaveLength(1);
    const choice = res.choices[0]!;
    expect(choice.finish_reason).toBe("stop");
    expect(choice.message).toEqual({
      role: "assistant",
      content: "Mock reply to: Hello there, how are you today?",
      refusal: null,
      annotations: [],
    });
    const chars = "You are terse.".length + "Hello there, how are you today?".length;
    expect(res.usage).toEqual({
      prompt_tokens: Math.ceil(chars / 4) + 3 * 2,
      completion_tokens: 9,
      total_tokens: Math.ceil(chars / 4) + 6 + 9,
      prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 },
      completion_tokens_details: {
        reasoning_tokens: 0,
        audio_tokens: 0,
        accepted_prediction_tokens: 0,
        rejected_prediction_tokens: 0,
      },
    });
  });

  test("keys come in OpenAI's order and success headers are present", async () => {
    const res = await post("/chat/completions", { model: "gpt-4o-mini", messages: user("hi") });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("application/json");
    expect(res.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
    expect(Number(res.headers.get("openai-processing-ms"))).toBeGreaterThanOrEqual(0);
    expect(res.headers.get("x-ratelimit-remaining-requests")).toBe("9999");
    const body = (await res.json()) as Record<string, unknown>;
    expect(Object.keys(body)).toEqual([
      "id",
      "object",
      "created",
      "model",
      "choices",
      "usage",
      "service_tier",
      "system_fingerprint",
    ]);
  });

  test("max_tokens truncates with finish_reason length; n gives n choices", async () => {
    const res = await client.chat.completions.create({
      model: "gpt-4o-mini",
      messages: user("one two three four"),
      max_tokens: 2,
      n: 3,
    });
    expect(res.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    for (const c of res.choices) {
      expect(c.message.content).toBe("Mock reply");
      expect(c.finish_reason).toBe("length");
    }
    expect(res.usage?.completion_tokens).toBe(6);
  });

  test("long prompts are truncated in the reply", async () => {
    const words = Array.from({ length: 40 }, (_, i) => `w${i}`);
    const res = await client.chat.completions.create({ model: "m", messages: user(words.join(" ")) });
    expect(res.choices[0]!.message.content).toBe(`Mock reply to: ${words.slice(0, 12).join(" ")}`);
  });

  test("streaming: chunks in order, content concatenates, usage chunk last", async () => {
    const stream = await client.chat.completions.create({
      model: "gpt-4o-mini",
      messages: user("stream me please"),
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = await collect(stream);

    const ids = new Set(chunks.map((c) => c.id));
    expect(ids.size).toBe(1);
    for (const c of chunks) expect(c.object).toBe("chat.completion.chunk");

    expect(chunks[0]!.choices[0]!.delta).toEqual({ role: "assistant", content: "", refusal: null });
    const contentChunks = chunks.filter((c) => c.choices[0]?.delta.content);
    expect(contentChunks.length).toBe(6);
    expect(contentChunks.map((c) => c.choices[0]!.delta.content).join("")).toBe("Mock reply to: stream me please");

    const finish = chunks[chunks.length - 2]!;
    expect(finish.choices[0]!.finish_reason).toBe("stop");
    expect(finish.choices[0]!.delta).toEqual({});

    const last = chunks[chunks.length - 1]!;
    expect(last.choices).toEqual([]);
    expect(last.usage?.completion_tokens).toBe(6);
    expect(last.usage?.prompt_tokens).toBe(Math.ceil("stream me please".length / 4) + 3);
    for (const c of chunks.slice(0, -1)) expect(c.usage).toBeNull();
  });

  test("streaming without include_usage sends no usage key at all", async () => {
    const chunks = await collect(
      await client.chat.completions.create({ model: "m", messages: user("hi"), stream: true }),
    );
    for (const c of chunks) expect("usage" in c).toBe(false);
    expect(chunks[chunks.length - 1]!.choices[0]!.finish_reason).toBe("stop");
  });

  test("streaming with n = 2 interleaves choices", async () => {
    const chunks = await collect(
      await client.chat.completions.create({ model: "m", messages: user("hi"), stream: true, n: 2 }),
    );
    const text = (i: number) =>
      chunks
        .flatMap((c) => c.choices)
        .filter((c) => c.index === i)
        .map((c) => c.delta.content ?? "")
        .join("");
    expect(text(0)).toBe("Mock reply to: hi");
    expect(text(1)).toBe("Mock reply to: hi");
    expect(chunks[0]!.choices[0]!.index).toBe(0);
    expect(chunks[1]!.choices[0]!.index).toBe(1);
  });

  test("stream_options without stream is rejected like OpenAI does", async () => {
    const err = await client.chat.completions
      .create({ model: "m", messages: user("hi"), stream_options: { include_usage: true } })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as BadRequestError).param).toBe("stream_options");
  });

  test("tool call (non-stream) when the user asks about the weather", async () => {
    const res = await client.chat.completions.create({
      model: "gpt-4o-mini",
      messages: user("What's the weather in Paris?"),
      tools: [weatherTool],
    });
    const choice = res.choices[0]!;
    expect(choice.finish_reason).toBe("tool_calls");
    expect(choice.message.content).toBeNull();
    const call = choice.message.tool_calls?.[0];
    expect(call?.id).toMatch(/^call_[A-Za-z0-9]{24}$/);
    expect(call?.type).toBe("function");
    if (call?.type !== "function") throw new Error("expected a function call");
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual({ location: "Paris", unit: "celsius" });
  });

  test("tools present but no weather question: plain answer", async () => {
    const res = await client.chat.completions.create({ model: "m", messages: user("hello"), tools: [weatherTool] });
    expect(res.choices[0]!.finish_reason).toBe("stop");
    expect(res.choices[0]!.message.tool_calls).toBeUndefined();
  });

  test("tool-call streaming is assembled by the SDK's stream helper", async () => {
    const stream = client.chat.completions.stream({
      model: "gpt-4o-mini",
      messages: user("Tell me the weather in Paris"),
      tools: [weatherTool],
      stream_options: { include_usage: true },
    });
    const argumentDeltas: string[] = [];
    stream.on("tool_calls.function.arguments.delta", (e) => {
      // The opening chunk carries arguments: "", which the helper reports as an empty delta.
      if (e.arguments_delta !== "") argumentDeltas.push(e.arguments_delta);
    });
    const done = await stream.finalChatCompletion();

    expect(argumentDeltas.length).toBeGreaterThan(3);
    const message = done.choices[0]!.message;
    expect(done.choices[0]!.finish_reason).toBe("tool_calls");
    const call = message.tool_calls?.[0];
    if (call?.type !== "function") throw new Error("expected a function call");
    expect(call.function.name).toBe("get_weather");
    expect(argumentDeltas.join("")).toBe(call.function.arguments);
    expect(JSON.parse(call.function.arguments)).toEqual({ location: "Paris", unit: "celsius" });
    expect(done.usage?.completion_tokens).toBe(argumentDeltas.length);
  });

  test("text streaming through the SDK's stream helper", async () => {
    const stream = client.chat.completions.stream({ model: "m", messages: user("helper path") });
    const deltas: string[] = [];
    stream.on("content.delta", (e) => deltas.push(e.delta));
    const done = await stream.finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe("Mock reply to: helper path");
    expect(deltas).toEqual(["Mock", " reply", " to:", " helper", " path"]);
  });
});

describe("legacy completions", () => {
  test("non-stream text_completion", async () => {
    const res = await client.completions.create({ model: "gpt-3.5-turbo-instruct", prompt: "Say this is a test" });
    expect(res.id).toMatch(/^cmpl-[A-Za-z0-9]{29}$/);
    expect(res.object).toBe("text_completion");
    expect(res.choices[0]).toEqual({
      text: "Mock completion of: Say this is a test",
      index: 0,
      logprobs: null,
      finish_reason: "stop",
    });
    expect(res.usage).toEqual({
      prompt_tokens: Math.ceil("Say this is a test".length / 4),
      completion_tokens: 8,
      total_tokens: Math.ceil("Say this is a test".length / 4) + 8,
    });
  });

  test("legacy default max_tokens is 16, and multiple prompts get one choice each", async () => {
    const long = Array.from({ length: 30 }, (_, i) => `w${i}`).join(" ");
    const res = await client.completions.create({ model: "m", prompt: [long, "short"] });
    expect(res.choices).toHaveLength(2);
    expect(res.choices[0]!.finish_reason).toBe("stop"); // 3 + 12 words < 16
    const cut = await client.completions.create({ model: "m", prompt: long, max_tokens: 4 });
    expect(cut.choices[0]!.text).toBe("Mock completion of: w0");
    expect(cut.choices[0]!.finish_reason).toBe("length");
  });

  test("legacy stream with include_usage", async () => {
    const stream = await client.completions.create({
      model: "gpt-3.5-turbo-instruct",
      prompt: "Count",
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = await collect(stream);
    for (const c of chunks) expect(c.object).toBe("text_completion");
    expect(chunks.flatMap((c) => c.choices.map((x) => x.text)).join("")).toBe("Mock completion of: Count");
    const finish = chunks[chunks.length - 2]!;
    expect(finish.choices[0]!.finish_reason).toBe("stop");
    const last = chunks[chunks.length - 1]!;
    expect(last.choices).toEqual([]);
    expect(last.usage?.completion_tokens).toBe(4);
  });
});

describe("embeddings", () => {
  test("float encoding returns the deterministic vectors", async () => {
    const res = await client.embeddings.create({
      model: "text-embedding-3-small",
      input: ["alpha", "beta"],
      encoding_format: "float",
    });
    expect(res.object).toBe("list");
    expect(res.model).toBe("text-embedding-3-small");
    expect(res.data.map((d) => [d.object, d.index])).toEqual([
      ["embedding", 0],
      ["embedding", 1],
    ]);
    expect(res.data[0]!.embedding).toEqual(mockEmbedding("alpha"));
    expect(res.data[1]!.embedding).toEqual(mockEmbedding("beta"));
    expect(res.data[0]!.embedding).toHaveLength(8);
    const norm = Math.hypot(...res.data[0]!.embedding);
    expect(norm).toBeCloseTo(1, 5);
    // ceil(5 / 4) + ceil(4 / 4)
    expect(res.usage).toEqual({ prompt_tokens: 3, total_tokens: 3 });
  });

  test("the SDK's default base64 path decodes to exactly the float vectors", async () => {
    const floats = await client.embeddings.create({ model: "m", input: "gamma", encoding_format: "float" });
    const decoded = await client.embeddings.create({ model: "m", input: "gamma" });
    // The SDK asked for base64 on the wire, then decoded little-endian float32s for us.
    expect((mock.requests[1]!.body as { encoding_format?: string }).encoding_format).toBe("base64");
    expect(Array.isArray(decoded.data[0]!.embedding)).toBe(true);
    expect(decoded.data[0]!.embedding).toEqual(floats.data[0]!.embedding);
  });

  test("explicit base64 returns base64 of little-endian float32", async () => {
    const res = await post("/embeddings", { model: "m", input: "delta", encoding_format: "base64", dimensions: 5 });
    const body = (await res.json()) as { data: { embedding: string }[] };
    const bytes = Buffer.from(body.data[0]!.embedding, "base64");
    expect(bytes.length).toBe(5 * 4);
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const floats = Array.from({ length: 5 }, (_, i) => view.getFloat32(i * 4, true));
    expect(floats).toEqual(mockEmbedding("delta", 5));
  });

  test("dimensions is honoured", async () => {
    const res = await client.embeddings.create({ model: "m", input: "x", dimensions: 32 });
    expect(res.data[0]!.embedding).toHaveLength(32);
  });
});

describe("models", () => {
  test("list and retrieve", async () => {
    const ids: string[] = [];
    for await (const model of client.models.list()) {
      expect(model.object).toBe("model");
      expect(model.owned_by).toBe("system");
      ids.push(model.id);
    }
    expect(ids).toContain("gpt-4o-mini");
    const one = await client.models.retrieve("gpt-4o-mini");
    expect(one.id).toBe("gpt-4o-mini");
    const missing = await client.models.retrieve("nope").catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(NotFoundError);
    expect((missing as NotFoundError).code).toBe("model_not_found");
  });
});

describe("auth and request errors", () => {
  test("wrong key: 401 invalid_api_key with a masked key", async () => {
    const bad = new OpenAI({ apiKey: "sk-wrong-key-abcdef", baseURL: mock.url, maxRetries: 0 });
    const err = await bad.models.list().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AuthenticationError);
    const e = err as AuthenticationError;
    expect(e.code).toBe("invalid_api_key");
    expect(e.type).toBe("invalid_request_error");
    expect(e.message).toContain("Incorrect API key provided: sk-************cdef.");
  });

  test("missing key: 401 with OpenAI's no-key message", async () => {
    const res = await fetch(`${mock.url}/models`);
    expect(res.status).toBe(401);
    const body = (await res.json()) as { error: { message: string; code: unknown } };
    expect(body.error.message).toStartWith("You didn't provide an API key.");
    expect(body.error.code).toBeNull();
  });

  test("bad JSON body: 400", async () => {
    const res = await post("/chat/completions", "{not json");
    expect(res.status).toBe(400);
    const body = (await res.json()) as { error: { message: string; type: string } };
    expect(body.error.type).toBe("invalid_request_error");
    expect(body.error.message).toStartWith("We could not parse the JSON body of your request.");
  });

  test("unknown path: OpenAI's Invalid URL 404", async () => {
    const res = await post("/does/not/exist", {});
    expect(res.status).toBe(404);
    expect(await res.json()).toEqual({
      error: { message: "Invalid URL (POST /v1/does/not/exist)", type: "invalid_request_error", param: null, code: null },
    });
  });

  test("missing messages: 400 missing_required_parameter", async () => {
    const res = await post("/chat/completions", { model: "m" });
    expect(res.status).toBe(400);
    const body = (await res.json()) as { error: { code: string; param: string } };
    expect(body.error).toMatchObject({ code: "missing_required_parameter", param: "messages" });
  });
});

describe("faults", () => {
  const statusCases: [number, new (...args: never[]) => Error][] = [
    [400, BadRequestError],
    [401, AuthenticationError],
    [404, NotFoundError],
    [429, RateLimitError],
    [500, InternalServerError],
    [502, InternalServerError],
    [503, InternalServerError],
  ];
  for (const [status, ErrorClass] of statusCases) {
    test(`status ${status} raises ${ErrorClass.name}`, async () => {
      mock.fault({ kind: "status", status });
      const err = await client.chat.completions.create({ model: "m", messages: user("hi") }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ErrorClass);
      if (!(err instanceof APIError)) throw err;
      const apiErr = err;
      expect(apiErr.status).toBe(status);
      expect(apiErr.requestID).toMatch(/^req_/);
      expect(typeof apiErr.type).toBe("string");
    });
  }

  test("429 carries retry-after and rate_limit_exceeded", async () => {
    mock.fault({ kind: "status", status: 429 });
    const err = (await client.models.list().catch((e: unknown) => e)) as RateLimitError;
    expect(err).toBeInstanceOf(RateLimitError);
    expect(err.code).toBe("rate_limit_exceeded");
    expect(err.headers.get("retry-after")).toBe("1");
  });

  test("custom status body and headers", async () => {
    mock.fault({
      kind: "status",
      status: 400,
      body: { error: { message: "custom", type: "invalid_request_error", param: "x", code: "c" } },
      headers: { "x-custom": "yes" },
    });
    const err = (await client.models.list().catch((e: unknown) => e)) as BadRequestError;
    expect(err.message).toBe("400 custom");
    expect(err.param).toBe("x");
    expect(err.headers.get("x-custom")).toBe("yes");
  });

  test("faults are FIFO, one request each, and can target a path", async () => {
    mock.fault(
      { kind: "status", status: 500, path: "/embeddings" },
      { kind: "status", status: 404 },
      { kind: "status", status: 429 },
    );
    expect(await failure(client.models.list())).toBeInstanceOf(NotFoundError);
    expect(await failure(client.embeddings.create({ model: "m", input: "x" }))).toBeInstanceOf(InternalServerError);
    expect(await failure(client.models.list())).toBeInstanceOf(RateLimitError);
    expect(await failure(client.models.list())).toBeUndefined();
    expect(mock.requests.map((r) => r.path)).toEqual(["/v1/models", "/v1/embeddings", "/v1/models", "/v1/models"]);
  });

  test("clearFaults drops queued faults", async () => {
    mock.fault({ kind: "status", status: 500 });
    mock.clearFaults();
    expect(await failure(client.models.list())).toBeUndefined();
  });

  test("delay postpones a normal answer", async () => {
    mock.fault({ kind: "delay", ms: 150 });
    const started = performance.now();
    const res = await client.chat.completions.create({ model: "m", messages: user("hi") });
    expect(performance.now() - started).toBeGreaterThanOrEqual(140);
    expect(res.choices[0]!.message.content).toBe("Mock reply to: hi");
  });

  test("hang never answers; the SDK times out", async () => {
    mock.fault({ kind: "hang" });
    const err = await client.chat.completions
      .create({ model: "m", messages: user("hi") }, { timeout: 200 })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(APIConnectionTimeoutError);
  });

  test("invalidJson: 200 with a body the SDK cannot parse", async () => {
    mock.fault({ kind: "invalidJson" });
    const res = await post("/chat/completions", { model: "m", messages: user("hi") });
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(text.startsWith('{"id":"chatcmpl-')).toBe(true);
    expect(() => JSON.parse(text)).toThrow();

    mock.fault({ kind: "invalidJson" });
    expect(await failure(client.chat.completions.create({ model: "m", messages: user("hi") }))).toBeInstanceOf(Error);
  });

  test("invalidJson on a stream: the SDK rejects the malformed event", async () => {
    mock.fault({ kind: "invalidJson" });
    const stream = await client.chat.completions.create({ model: "m", messages: user("hi"), stream: true });
    const err = await failure(collect(stream));
    expect(err).toBeInstanceOf(SyntaxError);
    expect(String(err)).toContain("malformed server-sent event JSON");
  });

  test("cutStream: N chunks arrive, then the SDK's iteration throws", async () => {
    mock.fault({ kind: "cutStream", afterChunks: 3 });
    const stream = await client.chat.completions.create({
      model: "m",
      messages: user("a fairly long message to stream"),
      stream: true,
    });
    const seen: ChatCompletionChunk[] = [];
    let error: unknown;
    try {
      for await (const chunk of stream) seen.push(chunk);
    } catch (e) {
      error = e;
    }
    // A reset mid-body surfaces as fetch's own error, not as an APIError.
    expect(error).toBeInstanceOf(TypeError);
    expect((error as { code?: string }).code).toBe("ECONNRESET");
    expect(seen).toHaveLength(3);
    expect(mock.streamsCancelled).toBe(0); // our own cut is not a client going away
  });

  test("cutStream on a JSON request: half the body, then a reset", async () => {
    mock.fault({ kind: "cutStream", afterChunks: 1 });
    const err = await failure(client.chat.completions.create({ model: "m", messages: user("hi") }));
    expect(err).toBeInstanceOf(TypeError);
    expect((err as { code?: string }).code).toBe("ECONNRESET");
  });

  test("slowStream + client abort increments streamsCancelled", async () => {
    mock.fault({ kind: "slowStream", chunkDelayMs: 30, chunks: 100 });
    const stream = await client.chat.completions.create({ model: "m", messages: user("slow"), stream: true });
    let received = 0;
    for await (const _ of stream) {
      if (++received === 3) break; // breaking aborts the request
    }
    for (let i = 0; i < 50 && mock.streamsCancelled === 0; i++) await Bun.sleep(10);
    expect(mock.streamsCancelled).toBe(1);
  });

  test("slowStream paces chunks and completes when left alone", async () => {
    mock.fault({ kind: "slowStream", chunkDelayMs: 10, chunks: 8 });
    const started = performance.now();
    const chunks = await collect(
      await client.chat.completions.create({ model: "m", messages: user("slow"), stream: true }),
    );
    // role + 8 content + finish = 10 chunks, 9 pauses before them and 1 before [DONE].
    expect(chunks).toHaveLength(10);
    expect(performance.now() - started).toBeGreaterThanOrEqual(90);
    expect(mock.streamsCancelled).toBe(0);
  });

  test("connection refused on closedPort()", async () => {
    const port = await closedPort();
    const dead = new OpenAI({ apiKey: "x", baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
    const err = await dead.models.list().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(APIConnectionError);
  });
});

describe("wire bytes", () => {
  test("SSE framing is exactly `data: <json>\\n\\n` ending with `data: [DONE]\\n\\n`", async () => {
    const res = await post("/chat/completions", { model: "m", messages: user("bytes"), stream: true });
    expect(res.headers.get("content-type")).toBe("text/event-stream; charset=utf-8");
    expect(res.headers.get("x-request-id")).toMatch(/^req_/);
    const raw = await res.text();
    expect(raw.endsWith("\n\ndata: [DONE]\n\n")).toBe(true);
    expect(raw.includes("\r")).toBe(false);
    const events = raw.split("\n\n");
    expect(events.pop()).toBe(""); // trailing separator
    expect(events.pop()).toBe("data: [DONE]");
    for (const event of events) {
      expect(event.startsWith("data: {")).toBe(true);
      expect(event.includes("\n")).toBe(false);
      const chunk = JSON.parse(event.slice("data: ".length)) as Record<string, unknown>;
      expect(Object.keys(chunk)).toEqual([
        "id",
        "object",
        "created",
        "model",
        "service_tier",
        "system_fingerprint",
        "choices",
        "obfuscation",
      ]);
    }
    expect(events).toHaveLength(1 + 3 + 1 + 1); // role, "Mock reply to: bytes" (4 words), finish
  });

  test("requests are recorded with headers and parsed bodies", async () => {
    await client.chat.completions.create({ model: "m", messages: user("record me") });
    const [req] = mock.requests;
    expect(req?.method).toBe("POST");
    expect(req?.path).toBe("/v1/chat/completions");
    expect(req?.headers.authorization).toBe(`Bearer ${API_KEY}`);
    expect(req?.body).toEqual({ model: "m", messages: user("record me") });
  });
});

describe("options", () => {
  test("record: false keeps requests empty; no apiKey means no auth", async () => {
    const quiet = await startMockOpenAI({ record: false });
    try {
      const res = await fetch(`${quiet.url}/models`);
      expect(res.status).toBe(200);
      expect(quiet.requests).toHaveLength(0);
    } finally {
      await quiet.stop();
    }
  });

  test("the CLI prints its URL and serves", async () => {
    const port = await closedPort();
    const proc = Bun.spawn([process.execPath, `${import.meta.dir}/openai.ts`, "--port", String(port)], {
      stdout: "pipe",
    });
    try {
      const reader = proc.stdout.getReader();
      const { value } = await reader.read();
      expect(new TextDecoder().decode(value)).toBe(`listening http://127.0.0.1:${port}/v1\n`);
      const res = await fetch(`http://127.0.0.1:${port}/v1/models`);
      expect(res.status).toBe(200);
    } finally {
      proc.kill();
      await proc.exited;
    }
  });
});
