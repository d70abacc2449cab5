// The gateway in front of the mock Cohere v2 API, seen through the official `openai` SDK: the mock
// refuses any field Cohere does not know, speaks SSE with `event:` lines, and records what the
// gateway actually sent.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI, { APIError, AuthenticationError, BadRequestError, RateLimitError } from "openai";
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { collect, failure } from "../harness/util.ts";
import { type MockCohere, startMockCohere } from "../mock-upstream/cohere.ts";
import { mockEmbedding } from "../mock-upstream/native-kit.ts";

const KEY = "co-test-0123456789abcdef";

let mock: MockCohere;
let crlfMock: MockCohere;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockCohere({ apiKey: KEY, contextChars: 2000 });
  crlfMock = await startMockCohere({ apiKey: KEY, lineEnd: "\r\n" });
  const cohere = (model: string, extra: Record<string, unknown> = {}) => ({ model: `cohere/${model}`, api_base: mock.url, api_key: KEY, ...extra });
  gw = await startTestGateway({
    model_list: [
      { model_name: "command", svc_params: cohere("command-a-03-2025"), model_info: { id: "dep-command" } },
      { model_name: "command-crlf", svc_params: cohere("command-a-03-2025", { api_base: crlfMock.url }) },
      { model_name: "command-chat", svc_params: { model: "cohere_chat/command-r", api_base: mock.url, api_key: KEY } },
      { model_name: "command-reasoning", svc_params: cohere("command-a-reasoning-08-2025") },
      { model_name: "command-wrong-key", svc_params: cohere("command-a-03-2025", { api_key: "co-wrong" }) },
      { model_name: "embed", svc_params: cohere("embed-v4.0"), model_info: { mode: "embedding" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
});

afterAll(async () => {
  await gw.stop();
  await mock.stop();
  await crlfMock.stop();
});

beforeEach(() => {
  mock.reset();
  crlfMock.reset();
});

const user = (content: string) => [{ role: "user" as const, content }];
const textOf = (chunks: ChatCompletionChunk[]) => chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");

const weatherTool: ChatCompletionTool = {
  type: "function",
  function: { name: "get_weather", description: "Current weather for a place", parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] } },
};

describe("chat", () => {
  test("an OpenAI request becomes a Cohere v2 chat; the answer an OpenAI chat.completion", async () => {
    const res = await client.chat.completions.create({
      model: "command",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "hello there gateway" },
      ],
      temperature: 0.2,
      top_p: 0.9,
      stop: ["END"],
      seed: 3,
    });
    expect(res.object).toBe("chat.completion");
    expect(res.model).toBe("command");
    expect(res.choices[0]!.message).toMatchObject({ role: "assistant", content: "Mock reply to: hello there gateway" });
    expect(res.choices[0]!.finish_reason).toBe("stop");
    expect(res.usage!.completion_tokens).toBe(6);
    expect(res.usage!.total_tokens).toBe(res.usage!.prompt_tokens + 6);
    const sent = mock.requests[0]!;
    expect(sent.path).toBe("/v2/chat");
    expect(sent.headers.authorization).toBe(`Bearer ${KEY}`);
    expect(sent.body).toEqual({
      model: "command-a-03-2025",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "hello there gateway" },
      ],
      temperature: 0.2,
      p: 0.9,
      stop_sequences: ["END"],
      seed: 3,
    });
  });

  test("max_tokens reached → finish_reason length; cohere_chat/ works alike", async () => {
    const res = await client.chat.completions.create({ model: "command-chat", messages: user("one two three four five"), max_tokens: 4 });
    expect(res.choices[0]!.finish_reason).toBe("length");
    expect(res.choices[0]!.message.content).toBe("Mock reply to: one");
    expect((mock.requests[0]!.body as { model: string }).model).toBe("command-r");
  });

  test("tools: a tool call, then its result sent back as Cohere's tool_plan and tool message", async () => {
    const first = await client.chat.completions.create({ model: "command", messages: user("what is the weather in Paris?"), tools: [weatherTool] });
    const msg = first.choices[0]!.message;
    expect(first.choices[0]!.finish_reason).toBe("tool_calls");
    expect(msg.content).toBe("I will look up the weather.");
    const call = msg.tool_calls![0]!;
    expect(call.type).toBe("function");
    if (call.type !== "function") throw new Error("not a function call");
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual({ location: "Paris" });
    const second = await client.chat.completions.create({
      model: "command",
      messages: [...user("what is the weather in Paris?"), msg, { role: "tool", tool_call_id: call.id, content: "22C and sunny" }],
      tools: [weatherTool],
      tool_choice: "none",
    });
    expect(second.choices[0]!.message.content).toStartWith("Mock reply to:");
    const sent = mock.requests[1]!.body as { messages: unknown[]; tool_choice: string };
    expect(sent.messages.slice(1)).toEqual([
      { role: "assistant", tool_plan: "I will look up the weather.", tool_calls: [{ id: call.id, type: "function", function: { name: "get_weather", arguments: call.function.arguments } }] },
      { role: "tool", tool_call_id: call.id, content: "22C and sunny" },
    ]);
    expect(sent.tool_choice).toBe("NONE");
  });

  test("a JSON schema becomes Cohere's json_object response format", async () => {
    await client.chat.completions.create({
      model: "command",
      messages: user("answer in JSON"),
      response_format: { type: "json_schema", json_schema: { name: "a", schema: { type: "object", properties: { a: { type: "string" } } } } },
    });
    expect((mock.requests[0]!.body as { response_format: unknown }).response_format).toEqual({ type: "json_object", json_schema: { type: "object", properties: { a: { type: "string" } } } });
  });
});

describe("reasoning_effort", () => {
  const reasoningOf = (m: unknown) => (m as { reasoning_content?: string }).reasoning_content;
  const thinkingSent = (i: number) => (mock.requests[i]!.body as { thinking?: unknown }).thinking;

  test("a reasoning model thinks within the effort's token budget, answered as reasoning_content; none turns thinking off", async () => {
    const res = await client.chat.completions.create({ model: "command-reasoning", messages: user("why is the sky blue"), reasoning_effort: "low" });
    expect(thinkingSent(0)).toEqual({ type: "enabled", token_budget: 1024 });
    expect(reasoningOf(res.choices[0]!.message)).toBe("The user wants a reply; I will give one.");
    expect(res.choices[0]!.message.content).toBe("Mock reply to: why is the sky blue");
    const off = await client.chat.completions.create({ model: "command-reasoning", messages: user("just answer"), reasoning_effort: "none" });
    expect(thinkingSent(1)).toEqual({ type: "disabled" });
    expect(reasoningOf(off.choices[0]!.message)).toBeUndefined();
    expect(off.choices[0]!.message.content).toBe("Mock reply to: just answer");
  });

  test("streamed: thinking deltas arrive as reasoning_content, then the text", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "command-reasoning", messages: user("stream it"), reasoning_effort: "high", stream: true }));
    expect(thinkingSent(0)).toEqual({ type: "enabled", token_budget: 4096 });
    expect(chunks.map((c) => reasoningOf(c.choices[0]?.delta) ?? "").join("")).toBe("The user wants a reply; I will give one.");
    expect(textOf(chunks)).toBe("Mock reply to: stream it");
  });

  test("a model that cannot think: 400 naming reasoning_effort before any call to Cohere; dropped with drop_params", async () => {
    const err = await failure(client.chat.completions.create({ model: "command", messages: user("hi"), reasoning_effort: "low" }));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as BadRequestError).message).toContain("cohere does not support parameters: ['reasoning_effort']");
    expect(mock.requests).toHaveLength(0);
    const dropped = await client.chat.completions.create({ model: "command", messages: user("hi"), reasoning_effort: "low", drop_params: true } as never);
    expect(dropped.choices[0]!.message.content).toBe("Mock reply to: hi");
    expect(thinkingSent(0)).toBeUndefined();
  });
});

describe("streaming", () => {
  test("text in chunks: role first, content, finish, then the usage chunk the client asked for", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "command", messages: user("stream this please"), stream: true, stream_options: { include_usage: true } }));
    expect(chunks[0]!.choices[0]!.delta).toEqual({ role: "assistant", content: "" });
    expect(chunks.every((c) => c.object === "chat.completion.chunk" && c.id === chunks[0]!.id)).toBe(true);
    expect(textOf(chunks)).toBe("Mock reply to: stream this please");
    expect(chunks.at(-2)!.choices[0]!.finish_reason).toBe("stop");
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage!.completion_tokens).toBe(6);
    expect((mock.requests[0]!.body as { stream: boolean }).stream).toBe(true);
    expect(mock.requests[0]!.body).not.toHaveProperty("stream_options");
  });

  test("CRLF line ends from upstream make no difference", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "command-crlf", messages: user("crlf lines everywhere"), stream: true }));
    expect(textOf(chunks)).toBe("Mock reply to: crlf lines everywhere");
    expect(chunks.some((c) => c.choices.length === 0)).toBe(false);
  });

  test("a streamed tool call: id and name first, arguments in pieces that join to JSON", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "command", messages: user("weather in Paris?"), tools: [weatherTool], stream: true }));
    const calls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    expect(calls[0]).toMatchObject({ index: 0, type: "function", function: { name: "get_weather", arguments: "" } });
    expect(calls[0]!.id).toStartWith("get_weather_");
    expect(calls.length).toBeGreaterThan(2);
    expect(JSON.parse(calls.map((c) => c.function?.arguments ?? "").join(""))).toEqual({ location: "Paris" });
    expect(textOf(chunks)).toBe("I will look up the weather.");
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("tool_calls");
  });

  test("a stream cut right after message-start failed before it began: retried, not a 200 with an error event", async () => {
    mock.fault({ kind: "cutStream", afterParts: 1 });
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "command", messages: user("cut after the start"), stream: true, num_retries: 1 }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-svc-attempted-retries")).toBe("1");
    const text = await res.text();
    expect(text).not.toContain('"error"');
    expect(text.trimEnd()).toEndWith("data: [DONE]");
  });

  test("a connection cut mid-stream ends the stream with an error", async () => {
    mock.fault({ kind: "cutStream", afterParts: 3 });
    const stream = await client.chat.completions.create({ model: "command", messages: user("cut me off now"), stream: true });
    const seen: ChatCompletionChunk[] = [];
    const err = await failure(
      (async () => {
        for await (const c of stream) seen.push(c);
      })(),
    );
    expect(textOf(seen)).toBe("Mock");
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toContain("ended unexpectedly");
  });
});

describe("embeddings", () => {
  test("a batch in one /v2/embed call, document input type, vectors in order", async () => {
    const res = await client.embeddings.create({ model: "embed", input: ["first text", "second text"] });
    expect(res.object).toBe("list");
    expect(res.model).toBe("embed");
    expect(res.data.map((d) => d.index)).toEqual([0, 1]);
    // The SDK asked for base64 and decoded it: the floats survive exactly.
    expect(res.data[1]!.embedding).toEqual(mockEmbedding("second text", 8));
    expect(res.usage.prompt_tokens).toBe(6);
    expect(mock.requests[0]!.path).toBe("/v2/embed");
    expect(mock.requests[0]!.body).toEqual({ model: "embed-v4.0", texts: ["first text", "second text"], input_type: "search_document", embedding_types: ["float"] });
  });

  test("dimensions become output_dimension; float output when asked", async () => {
    const res = await client.embeddings.create({ model: "embed", input: "one", dimensions: 4, encoding_format: "float" });
    expect(res.data[0]!.embedding).toEqual(mockEmbedding("one", 4));
    expect((mock.requests[0]!.body as { output_dimension: number }).output_dimension).toBe(4);
  });
});

describe("errors", () => {
  test("Cohere's 429 → 429 with Cohere's message", async () => {
    mock.fault({ kind: "status", status: 429 });
    const err = await failure(client.chat.completions.create({ model: "command", messages: user("hi") }));
    expect(err).toBeInstanceOf(RateLimitError);
    expect((err as APIError).message).toContain("You are using a Trial key");
  });

  test("too many tokens → 400 marked as a context-window error", async () => {
    const err = await failure(client.chat.completions.create({ model: "command", messages: user("long ".repeat(1000)) }));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as APIError).message).toContain("too many tokens");
    expect((err as APIError).type).toBe("context_window_exceeded");
  });

  test("a wrong key → 401 with Cohere's message, the key shown nowhere", async () => {
    const err = await failure(client.chat.completions.create({ model: "command-wrong-key", messages: user("hi") }));
    expect(err).toBeInstanceOf(AuthenticationError);
    expect((err as APIError).message).toContain("invalid api token");
    expect((err as APIError).message).not.toContain("co-wrong");
  });
});
