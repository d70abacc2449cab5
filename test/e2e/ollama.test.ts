// The gateway in front of a mock Ollama server, seen through the official `openai` SDK: the mock
// streams NDJSON unless asked not to (as Ollama does), knows only the models "pulled", and records
// what the gateway actually sent.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI, { APIError, BadRequestError, NotFoundError } from "openai";
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { collect, failure } from "../harness/util.ts";
import { mockEmbedding } from "../mock-upstream/native-kit.ts";
import { type MockOllama, startMockOllama } from "../mock-upstream/ollama.ts";

const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

let mock: MockOllama;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockOllama({ models: ["llama3.2:latest", "qwen3", "gpt-oss:20b", "all-minilm"], contextChars: 2000 });
  const ollama = (model: string, extra: Record<string, unknown> = {}) => ({ model, api_base: mock.url, ...extra });
  gw = await startTestGateway({
    model_list: [
      { model_name: "llama", svc_params: ollama("ollama/llama3.2"), model_info: { id: "dep-llama" } },
      { model_name: "llama-chat", svc_params: ollama("ollama_chat/llama3.2", { num_ctx: 8192 }) },
      { model_name: "qwen-think", svc_params: ollama("ollama_chat/qwen3", { think: true }) },
      { model_name: "qwen", svc_params: ollama("ollama_chat/qwen3") },
      { model_name: "gpt-oss", svc_params: ollama("ollama_chat/gpt-oss:20b") },
      { model_name: "missing", svc_params: ollama("ollama/mistral") },
      { model_name: "minilm", svc_params: ollama("ollama/all-minilm"), model_info: { mode: "embedding" } },
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
const textOf = (chunks: ChatCompletionChunk[]) => chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");

const weatherTool: ChatCompletionTool = {
  type: "function",
  function: { name: "get_weather", description: "Current weather for a place", parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] } },
};

describe("chat", () => {
  test("a non-streamed chat asks Ollama not to stream; counts become usage", async () => {
    const res = await client.chat.completions.create({ model: "llama", messages: user("hello there gateway"), temperature: 0.1, max_tokens: 50, seed: 1 });
    expect(res.object).toBe("chat.completion");
    expect(res.model).toBe("llama3.2");
    expect(res.choices[0]!.message).toMatchObject({ role: "assistant", content: "Mock reply to: hello there gateway" });
    expect(res.choices[0]!.finish_reason).toBe("stop");
    expect(res.usage).toMatchObject({ completion_tokens: 6, total_tokens: res.usage!.prompt_tokens + 6 });
    expect(res.usage!.prompt_tokens).toBeGreaterThan(0);
    expect(mock.requests[0]!.path).toBe("/api/chat");
    expect(mock.requests[0]!.body).toEqual({
      model: "llama3.2",
      messages: [{ role: "user", content: "hello there gateway" }],
      stream: false,
      options: { temperature: 0.1, num_predict: 50, seed: 1 },
    });
  });

  test("num_predict reached → length; num_ctx from svc_params; an image goes as base64", async () => {
    const res = await client.chat.completions.create({
      model: "llama-chat",
      messages: [{ role: "user", content: [{ type: "text", text: "one two three four five" }, { type: "image_url", image_url: { url: `data:image/png;base64,${PNG}` } }] }],
      max_tokens: 3,
    });
    expect(res.choices[0]!.finish_reason).toBe("length");
    expect(res.choices[0]!.message.content).toBe("Mock reply to:");
    const sent = mock.requests[0]!.body as { messages: { images?: string[] }[]; options: Record<string, unknown> };
    expect(sent.messages[0]!.images).toEqual([PNG]);
    expect(sent.options).toEqual({ num_predict: 3, num_ctx: 8192 });
  });

  test("tools: a call with JSON arguments and an id, then the result sent back by function name", async () => {
    const first = await client.chat.completions.create({ model: "llama", messages: user("what is the weather in Paris?"), tools: [weatherTool] });
    expect(first.choices[0]!.finish_reason).toBe("tool_calls");
    const msg = first.choices[0]!.message;
    expect(msg.content).toBeNull();
    const call = msg.tool_calls![0]!;
    if (call.type !== "function") throw new Error("not a function call");
    expect(call.id).toStartWith("call_");
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual({ location: "Paris" });
    await client.chat.completions.create({ model: "llama", messages: [...user("what is the weather in Paris?"), msg, { role: "tool", tool_call_id: call.id, content: "22C" }], tools: [weatherTool] });
    const sent = mock.requests[1]!.body as { messages: unknown[] };
    expect(sent.messages.slice(1)).toEqual([
      { role: "assistant", content: "", tool_calls: [{ function: { name: "get_weather", arguments: { location: "Paris" } } }] },
      { role: "tool", content: "22C", tool_name: "get_weather" },
    ]);
  });

  test("json mode → format json", async () => {
    const res = await client.chat.completions.create({ model: "llama", messages: user("answer as JSON"), response_format: { type: "json_object" } });
    expect(JSON.parse(res.choices[0]!.message.content!)).toEqual({ reply: "Mock reply to: answer as JSON" });
    expect((mock.requests[0]!.body as { format: unknown }).format).toBe("json");
  });

  test("a thinking model's thoughts come back as reasoning_content", async () => {
    const res = await client.chat.completions.create({ model: "qwen-think", messages: user("think first") });
    expect((res.choices[0]!.message as unknown as { reasoning_content: string }).reasoning_content).toBe("Let me think.");
    expect(res.choices[0]!.message.content).toBe("Mock reply to: think first");
  });
});

describe("reasoning_effort", () => {
  const reasoningOf = (m: unknown) => (m as { reasoning_content?: string }).reasoning_content;
  const reasoningDeltas = (chunks: ChatCompletionChunk[]) => chunks.map((c) => reasoningOf(c.choices[0]?.delta) ?? "").join("");

  test("turns thinking on (or off, over the deployment's think) and the thoughts come back as reasoning_content", async () => {
    const on = await client.chat.completions.create({ model: "qwen", messages: user("think first"), reasoning_effort: "high" });
    expect((mock.requests[0]!.body as { think: unknown }).think).toBe(true);
    expect(reasoningOf(on.choices[0]!.message)).toBe("Let me think.");
    expect(on.choices[0]!.message.content).toBe("Mock reply to: think first");
    const off = await client.chat.completions.create({ model: "qwen-think", messages: user("no thinking"), reasoning_effort: "none" });
    expect((mock.requests[1]!.body as { think: unknown }).think).toBe(false);
    expect(reasoningOf(off.choices[0]!.message)).toBeUndefined();
  });

  test("gpt-oss gets the level; streamed, its thoughts arrive as reasoning_content deltas before the text", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "gpt-oss", messages: user("quick one"), reasoning_effort: "low", stream: true }));
    expect((mock.requests[0]!.body as { think: unknown }).think).toBe("low");
    expect(reasoningDeltas(chunks)).toBe("Quick check.");
    expect(textOf(chunks)).toBe("Mock reply to: quick one");
    const firstText = chunks.findIndex((c) => (c.choices[0]?.delta.content ?? "") !== "");
    expect(chunks.findLastIndex((c) => reasoningOf(c.choices[0]?.delta) !== undefined)).toBeLessThan(firstText);
  });
});

describe("streaming", () => {
  test("NDJSON lines → chunks: role first, content, finish, then the usage chunk", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "llama", messages: user("stream this please"), stream: true, stream_options: { include_usage: true } }));
    expect(chunks[0]!.choices[0]!.delta).toEqual({ role: "assistant", content: "Mock" });
    expect(chunks.every((c) => c.object === "chat.completion.chunk" && c.id === chunks[0]!.id && c.model === "llama3.2")).toBe(true);
    expect(textOf(chunks)).toBe("Mock reply to: stream this please");
    expect(chunks.at(-2)!.choices[0]!.finish_reason).toBe("stop");
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage!.completion_tokens).toBe(6);
    expect((mock.requests[0]!.body as { stream: boolean }).stream).toBe(true);
  });

  test("a streamed tool call arrives whole, with index, id and name", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "llama", messages: user("weather in Paris?"), tools: [weatherTool], stream: true }));
    const calls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({ index: 0, type: "function", function: { name: "get_weather", arguments: '{"location":"Paris"}' } });
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("tool_calls");
  });

  test("a connection cut mid-stream ends the stream with an error", async () => {
    mock.fault({ kind: "cutStream", afterParts: 2 });
    const stream = await client.chat.completions.create({ model: "llama", messages: user("cut me off now"), stream: true });
    const seen: ChatCompletionChunk[] = [];
    const err = await failure(
      (async () => {
        for await (const c of stream) seen.push(c);
      })(),
    );
    expect(textOf(seen)).toBe("Mock reply");
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toContain("ended unexpectedly");
  });
});

describe("legacy completions → /api/generate", () => {
  test("a prompt, options and suffix go to /api/generate unstreamed; the answer is a text_completion with usage", async () => {
    const res = await client.completions.create({ model: "llama", prompt: "complete this sentence", max_tokens: 50, temperature: 0.2, stop: ["\n"], suffix: "END" });
    expect(res.object).toBe("text_completion");
    expect(res.id).toStartWith("cmpl-");
    expect(res.model).toBe("llama3.2");
    expect(res.choices).toEqual([{ text: "Mock reply to: complete this sentence [before END]", index: 0, logprobs: null, finish_reason: "stop" }]);
    expect(res.usage).toMatchObject({ completion_tokens: 7, total_tokens: res.usage!.prompt_tokens + 7 });
    expect(res.usage!.prompt_tokens).toBeGreaterThan(0);
    expect(mock.requests[0]!.path).toBe("/api/generate");
    expect(mock.requests[0]!.body).toEqual({ model: "llama3.2", prompt: "complete this sentence", stream: false, suffix: "END", options: { temperature: 0.2, num_predict: 50, stop: ["\n"] } });
  });

  test("streamed: text arrives in pieces, the last chunk says why it ended, usage when asked for", async () => {
    const chunks = await collect(await client.completions.create({ model: "llama", prompt: "one two three four", max_tokens: 3, stream: true, stream_options: { include_usage: true } }));
    const withChoice = chunks.filter((c) => c.choices.length > 0);
    expect(withChoice.length).toBeGreaterThan(2);
    expect(withChoice.map((c) => c.choices[0]!.text).join("")).toBe("Mock reply to:");
    expect(withChoice.at(-1)!.choices[0]!.finish_reason).toBe("length");
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage).toMatchObject({ completion_tokens: 3 });
    expect((mock.requests[0]!.body as { stream: boolean }).stream).toBe(true);
  });

  test("several prompts at once, or token ids, are refused with a 400 saying why", async () => {
    for (const prompt of [["first", "second"], [1, 2, 3]]) {
      const err = await failure(client.completions.create({ model: "llama", prompt: prompt as string[] }));
      expect(err).toBeInstanceOf(BadRequestError);
      expect((err as APIError).message).toMatch(/one prompt per request|not as token ids/);
    }
    expect(mock.requests).toHaveLength(0);
  });
});

describe("embeddings", () => {
  test("/api/embed with the inputs as given; vectors and prompt_eval_count back", async () => {
    const res = await client.embeddings.create({ model: "minilm", input: ["Why is the sky blue?", "Why is the grass green?"] });
    expect(res.model).toBe("all-minilm");
    expect(res.data.map((d) => d.index)).toEqual([0, 1]);
    expect(res.data[0]!.embedding).toEqual(mockEmbedding("Why is the sky blue?", 8));
    expect(res.usage.prompt_tokens).toBe(5 + 6); // the mock counts a token per 4 characters
    expect(mock.requests[0]!.path).toBe("/api/embed");
    expect(mock.requests[0]!.body).toEqual({ model: "all-minilm", input: ["Why is the sky blue?", "Why is the grass green?"] });
  });
});

describe("errors", () => {
  test("a model not pulled → 404 with Ollama's message", async () => {
    const err = await failure(client.chat.completions.create({ model: "missing", messages: user("hi") }));
    expect(err).toBeInstanceOf(NotFoundError);
    expect((err as APIError).message).toContain('model "mistral" not found, try pulling it first');
  });

  test("over the context length → 400 marked as a context-window error (also when Ollama says 500)", async () => {
    const err = await failure(client.chat.completions.create({ model: "llama", messages: user("long ".repeat(1000)) }));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as APIError).type).toBe("context_window_exceeded");
    expect((err as APIError).message).toContain("the input length exceeds the context length");
    mock.fault({ kind: "status", status: 500, body: { error: "the input length exceeds the context length" } });
    const err500 = await failure(client.embeddings.create({ model: "minilm", input: "x" }));
    expect((err500 as APIError).status).toBe(400);
    expect((err500 as APIError).type).toBe("context_window_exceeded");
  });

  test("a crashed runner (500) → 500 with Ollama's message", async () => {
    mock.fault({ kind: "status", status: 500 });
    const err = await failure(client.chat.completions.create({ model: "llama", messages: user("hi") }));
    expect((err as APIError).status).toBe(500);
    expect((err as APIError).message).toContain("llama runner process has terminated");
  });

  test("an image given as a link (Ollama cannot fetch one) is the client's 400, not a 500", async () => {
    const before = mock.requests.length;
    const err = await failure(
      client.chat.completions.create({
        model: "llama",
        messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "https://example.com/cat.png" } }] }],
      }),
    );
    expect((err as APIError).status).toBe(400);
    expect((err as APIError).message).toContain("ollama cannot take this request");
    expect(mock.requests.length).toBe(before);
  });
});
