// The gateway in front of the mock Bedrock runtime, seen through the official `openai` SDK: the
// mock checks every SigV4 signature against the secret it knows, speaks Converse and the binary
// event stream, and records what the gateway actually sent.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI, { APIError, BadRequestError, PermissionDeniedError, RateLimitError } from "openai";
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { collect, failure } from "../harness/util.ts";
import { type MockBedrock, startMockBedrock } from "../mock-upstream/bedrock.ts";
import { mockEmbedding } from "../mock-upstream/openai.ts";

const ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE";
const SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
const WRONG_SECRET = "wJalrXUtnFEMI/K7MDENG+WRONGWRONGWRONGKEY";
const BEDROCK_API_KEY = "ABSKQmVkcm9ja0FQSUtleS1leGFtcGxl";
const REGION = "us-west-2";
const CLAUDE = "anthropic.claude-3-haiku-20240307-v1:0";

let mock: MockBedrock;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockBedrock({ region: REGION, credentials: { accessKeyId: ACCESS_KEY_ID, secretAccessKey: SECRET }, apiKey: BEDROCK_API_KEY });
  const iam = (model: string, secret = SECRET) => ({
    model: `bedrock/${model}`,
    api_base: mock.url,
    aws_region_name: REGION,
    aws_access_key_id: ACCESS_KEY_ID,
    aws_secret_access_key: secret,
  });
  gw = await startTestGateway({
    model_list: [
      { model_name: "claude", svc_params: iam(CLAUDE), model_info: { id: "dep-claude" } },
      { model_name: "claude-wrong-secret", svc_params: iam(CLAUDE, WRONG_SECRET), model_info: { id: "dep-wrong" } },
      { model_name: "claude-api-key", svc_params: { model: `bedrock/${CLAUDE}`, api_base: mock.url, aws_region_name: REGION, api_key: BEDROCK_API_KEY } },
      { model_name: "titan", svc_params: iam("amazon.titan-embed-text-v2:0"), model_info: { mode: "embedding" } },
      { model_name: "cohere", svc_params: iam("cohere.embed-english-v3"), model_info: { mode: "embedding" } },
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
    parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] },
  },
};

const textOf = (chunks: ChatCompletionChunk[]) => chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");

describe("chat", () => {
  test("a signed Converse call; the answer is an OpenAI chat.completion", async () => {
    const res = await client.chat.completions.create({
      model: "claude",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "hello there gateway" },
      ],
      max_tokens: 100,
    });
    expect(res.object).toBe("chat.completion");
    expect(res.choices[0]!.message.content).toBe("Mock reply to: hello there gateway");
    expect(res.choices[0]!.finish_reason).toBe("stop");
    expect(res.usage!.prompt_tokens).toBeGreaterThan(0);
    expect(res.usage!.total_tokens).toBe(res.usage!.prompt_tokens + res.usage!.completion_tokens);

    const sent = mock.requests[0]!;
    expect(sent.path).toBe("/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse");
    expect(sent.headers.authorization).toStartWith(`AWS4-HMAC-SHA256 Credential=${ACCESS_KEY_ID}/`);
    expect(sent.body).toEqual({
      messages: [{ role: "user", content: [{ text: "hello there gateway" }] }],
      system: [{ text: "Be brief." }],
      inferenceConfig: { maxTokens: 100 },
    });
  });

  test("max_tokens reached → finish_reason length", async () => {
    const res = await client.chat.completions.create({ model: "claude", messages: user("one two three four five"), max_tokens: 2 });
    expect(res.choices[0]!.message.content).toBe("Mock reply");
    expect(res.choices[0]!.finish_reason).toBe("length");
  });

  test("tools: a tool call, then the tool's result answered in text", async () => {
    const first = await client.chat.completions.create({ model: "claude", messages: user("What is the weather in Paris?"), tools: [weatherTool] });
    const message = first.choices[0]!.message;
    expect(first.choices[0]!.finish_reason).toBe("tool_calls");
    expect(message.content).toBe("Let me check that.");
    const call = message.tool_calls![0]!;
    expect(call.type).toBe("function");
    expect(call.id).toStartWith("tooluse_");
    if (call.type !== "function") throw new Error("expected a function call");
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual({ location: "Paris" });

    const second = await client.chat.completions.create({
      model: "claude",
      tools: [weatherTool],
      messages: [...user("What is the weather in Paris?"), message, { role: "tool", tool_call_id: call.id, content: "21 degrees and sunny" }],
    });
    expect(second.choices[0]!.message.content).toBe("Mock reply to: 21 degrees and sunny");
    const sent = mock.requests[1]!.body as { messages: { role: string; content: Record<string, unknown>[] }[] };
    expect(sent.messages.map((m) => m.role)).toEqual(["user", "assistant", "user"]);
    expect(sent.messages[2]!.content).toEqual([{ toolResult: { toolUseId: call.id, content: [{ text: "21 degrees and sunny" }] } }]);
  });

  test("a turn after a tool round that offers no tools (none given, or tool_choice none) is answered; Converse gets a placeholder tool, not the client's", async () => {
    const history = [
      ...user("What is the weather in Paris?"),
      { role: "assistant" as const, content: null, tool_calls: [{ id: "tooluse_1", type: "function" as const, function: { name: "get_weather", arguments: '{"location":"Paris"}' } }] },
      { role: "tool" as const, tool_call_id: "tooluse_1", content: "21 degrees and sunny" },
      ...user("Summarize."),
    ];
    const toolNames = () => ((mock.requests.at(-1)!.body as { toolConfig: { tools: { toolSpec: { name: string } }[] } }).toolConfig.tools ?? []).map((t) => t.toolSpec.name);
    for (const extra of [{}, { tools: [weatherTool], tool_choice: "none" as const }]) {
      const res = await client.chat.completions.create({ model: "claude", messages: history, ...extra });
      expect(res.choices[0]!.message.content).toBe("Mock reply to: 21 degrees and sunny Summarize.");
      expect(toolNames()).toEqual(["no_tools_available"]);
      expect(mock.requests.at(-1)!.body).not.toHaveProperty("toolConfig.toolChoice");
    }
  });

  test("empty text parts, empty assistant turns and an empty tool result (all of which OpenAI takes) are answered; Converse gets no blank block or empty turn", async () => {
    const image = { type: "image_url" as const, image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } };
    const call = { id: "tooluse_1", type: "function" as const, function: { name: "get_weather", arguments: "{}" } };
    const conversations: { messages: OpenAI.ChatCompletionMessageParam[]; sent: unknown[] }[] = [
      {
        messages: [{ role: "user", content: [{ type: "text", text: "" }, image, { type: "text", text: " \n" }, { type: "text", text: "What is this?" }] }],
        sent: [{ role: "user", content: [{ image: { format: "png", source: { bytes: "iVBORw0KGgo=" } } }, { text: "What is this?" }] }],
      },
      {
        messages: [...user("hi"), { role: "assistant", content: "" }, ...user("again")],
        sent: [{ role: "user", content: [{ text: "hi" }, { text: "again" }] }],
      },
      {
        messages: [...user("hi"), { role: "assistant", content: null }, { role: "assistant", content: [{ type: "text", text: "" }] }, ...user("again")],
        sent: [{ role: "user", content: [{ text: "hi" }, { text: "again" }] }],
      },
      {
        messages: [...user("hi"), { role: "assistant", content: null, tool_calls: [call] }, { role: "tool", tool_call_id: "tooluse_1", content: "" }],
        sent: [
          { role: "user", content: [{ text: "hi" }] },
          { role: "assistant", content: [{ toolUse: { toolUseId: "tooluse_1", name: "get_weather", input: {} } }] },
          { role: "user", content: [{ toolResult: { toolUseId: "tooluse_1", content: [{ text: "(empty)" }] } }] },
        ],
      },
    ];
    for (const { messages, sent } of conversations) {
      const res = await client.chat.completions.create({ model: "claude", messages, tools: [weatherTool] });
      expect(res.choices[0]!.message.content).toStartWith("Mock reply to:");
      expect((mock.requests.at(-1)!.body as { messages: unknown[] }).messages).toEqual(sent);
    }
  });

  test("a request of system messages only is answered: their text is the user's turn, as for Gemini", async () => {
    const res = await client.chat.completions.create({ model: "claude", messages: [{ role: "system", content: "Say hello." }, { role: "developer", content: "Briefly." }] });
    expect(res.choices[0]!.message.content).toBe("Mock reply to: Say hello. Briefly.");
    expect(mock.requests.at(-1)!.body).toEqual({ messages: [{ role: "user", content: [{ text: "Say hello." }, { text: "Briefly." }] }] });
  });

  test("a Bedrock API key is sent as a bearer token", async () => {
    const res = await client.chat.completions.create({ model: "claude-api-key", messages: user("hi") });
    expect(res.choices[0]!.message.content).toBe("Mock reply to: hi");
    expect(mock.requests[0]!.headers.authorization).toBe(`Bearer ${BEDROCK_API_KEY}`);
  });
});

describe("stream", () => {
  test("text in chunks: role first, finish, then the usage chunk the client asked for", async () => {
    const stream = await client.chat.completions.create({ model: "claude", messages: user("stream this please"), stream: true, stream_options: { include_usage: true } });
    const chunks = await collect(stream);
    expect(mock.requests[0]!.path).toEndWith("/converse-stream");
    expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant");
    expect(textOf(chunks)).toBe("Mock reply to: stream this please");
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
    expect(chunks.every((c) => c.object === "chat.completion.chunk" && c.model === "claude")).toBe(true);
    const finish = chunks.find((c) => c.choices[0]?.finish_reason);
    expect(finish!.choices[0]!.finish_reason).toBe("stop");
    const last = chunks[chunks.length - 1]!;
    expect(last.choices).toEqual([]);
    expect(last.usage!.completion_tokens).toBe(6);
    expect(last.usage!.prompt_tokens).toBeGreaterThan(0);
  });

  test("without include_usage no chunk has empty choices", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "claude", messages: user("hi"), stream: true }));
    expect(chunks.every((c) => c.choices.length === 1)).toBe(true);
    expect(textOf(chunks)).toBe("Mock reply to: hi");
  });

  test("a streamed tool call: id and name first, arguments in pieces that join to JSON", async () => {
    const stream = await client.chat.completions.create({ model: "claude", messages: user("weather in Paris?"), tools: [weatherTool], tool_choice: "required", stream: true });
    const chunks = await collect(stream);
    const calls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    expect(calls[0]).toMatchObject({ index: 0, type: "function", function: { name: "get_weather", arguments: "" } });
    expect(calls[0]!.id).toStartWith("tooluse_");
    expect(calls.length).toBeGreaterThan(3);
    expect(JSON.parse(calls.map((c) => c.function?.arguments ?? "").join(""))).toEqual({ location: "Paris" });
    expect(chunks.find((c) => c.choices[0]?.finish_reason)!.choices[0]!.finish_reason).toBe("tool_calls");
    expect((mock.requests[0]!.body as { toolConfig: unknown }).toolConfig).toMatchObject({ toolChoice: { any: {} } });
  });

  test("frames split into 7-byte reads arrive whole", async () => {
    mock.fault({ kind: "fragment", bytes: 7 });
    const chunks = await collect(await client.chat.completions.create({ model: "claude", messages: user("split frames everywhere"), stream: true }));
    expect(textOf(chunks)).toBe("Mock reply to: split frames everywhere");
  });

  test("an exception frame mid-stream: the chunks so far, then the error", async () => {
    mock.fault({ kind: "exception", afterFrames: 3, exceptionType: "throttlingException", message: "Too many tokens, please wait before trying again." });
    const stream = await client.chat.completions.create({ model: "claude", messages: user("one two three four"), stream: true });
    const seen: ChatCompletionChunk[] = [];
    const err = await failure(
      (async () => {
        for await (const chunk of stream) seen.push(chunk);
      })(),
    );
    expect(textOf(seen)).toBe("Mock reply");
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toContain("throttlingException: Too many tokens");
  });

  test("a frame with a broken CRC ends the stream with an error event", async () => {
    mock.fault({ kind: "corruptFrame", frame: 2 });
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "claude", messages: user("hi there"), stream: true }),
    });
    const text = await res.text();
    expect(text).not.toContain("[DONE]");
    const events = text.split("\n\n").filter(Boolean);
    const error = JSON.parse(events[events.length - 1]!.slice("data: ".length)) as { error: { code: string; message: string } };
    expect(error.error.code).toBe("500");
    expect(error.error.message).toContain("corrupt event stream");
  });

  test("a connection cut mid-stream ends the stream with an error", async () => {
    mock.fault({ kind: "cutStream", afterFrames: 2 });
    const stream = await client.chat.completions.create({ model: "claude", messages: user("cut me off"), stream: true });
    const err = await failure(collect(stream));
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toContain("ended unexpectedly");
  });
});

describe("embeddings", () => {
  test("Titan: one input", async () => {
    const res = await client.embeddings.create({ model: "titan", input: "hello titan", dimensions: 256 });
    expect(res.data).toHaveLength(1);
    expect(res.data[0]!.embedding).toEqual(mockEmbedding("hello titan", 256));
    expect(res.usage.prompt_tokens).toBe(3);
    expect(mock.requests[0]!.path).toBe("/model/amazon.titan-embed-text-v2%3A0/invoke");
    expect(mock.requests[0]!.body).toEqual({ inputText: "hello titan", dimensions: 256 });
  });

  test("Titan: a list is sent as one call per text, in order, and answered as one list", async () => {
    const res = await client.embeddings.create({ model: "titan", input: ["first", "second text", "third"] });
    expect(res.data.map((d) => d.index)).toEqual([0, 1, 2]);
    expect(res.data[1]!.embedding).toEqual(mockEmbedding("second text", 1024));
    expect(res.usage.prompt_tokens).toBe(2 + 3 + 2);
    expect(mock.requests.map((r) => r.body)).toEqual([{ inputText: "first" }, { inputText: "second text" }, { inputText: "third" }]);
  });

  test("Titan: a list whose second call fails gets that failure, and no third call is made", async () => {
    mock.fault({ kind: "answer", body: { embedding: [0.5], inputTextTokenCount: 1 }, action: "invoke" }, { kind: "status", status: 429, action: "invoke" });
    const err = await failure(client.embeddings.create({ model: "titan", input: ["a", "b", "c"] }));
    expect(err).toBeInstanceOf(RateLimitError);
    expect(mock.requests).toHaveLength(2);
  });

  test("Cohere: a batch in one call, vectors in input order", async () => {
    const res = await client.embeddings.create({ model: "cohere", input: ["first text", "second text"] });
    expect(res.data.map((d) => d.index)).toEqual([0, 1]);
    expect(res.data[1]!.embedding).toEqual(mockEmbedding("second text", 1024));
    expect(mock.requests[0]!.body).toEqual({ texts: ["first text", "second text"], input_type: "search_document" });
  });
});

describe("errors", () => {
  test("Bedrock throttling (429) → 429 with Bedrock's message", async () => {
    mock.fault({ kind: "status", status: 429 });
    const err = await failure(client.chat.completions.create({ model: "claude", messages: user("hi") }));
    expect(err).toBeInstanceOf(RateLimitError);
    expect((err as APIError).status).toBe(429);
    expect((err as APIError).message).toContain("Too many requests, please wait before trying again.");
  });

  test("an input too long → 400 marked as a context-window error", async () => {
    mock.fault({ kind: "status", status: 400, message: "Input is too long for requested model." });
    const err = await failure(client.chat.completions.create({ model: "claude", messages: user("long") }));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as APIError).message).toContain("Input is too long");
    expect((err as APIError).type).toBe("context_window_exceeded");
  });

  test("a wrong secret: the mock rejects the signature, the client gets 403, and the secret shows nowhere", async () => {
    const err = await failure(client.chat.completions.create({ model: "claude-wrong-secret", messages: user("hi") }));
    expect(err).toBeInstanceOf(PermissionDeniedError);
    const e = err as APIError;
    expect(e.status).toBe(403);
    expect(e.message).toContain("The request signature we calculated does not match");
    const raw = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "claude-wrong-secret", messages: user("hi") }),
    });
    const text = await raw.text();
    expect(raw.status).toBe(403);
    for (const secret of [WRONG_SECRET, SECRET]) {
      expect(text).not.toContain(secret);
      expect(JSON.stringify([...raw.headers])).not.toContain(secret);
      expect(JSON.stringify(gw.log.lines)).not.toContain(secret);
    }
    // The mock saw a signature, never the secret itself.
    expect(JSON.stringify(mock.requests)).not.toContain(WRONG_SECRET);
  });
});
