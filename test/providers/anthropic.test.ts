// Golden fixtures for the Anthropic adapter, both directions: OpenAI requests → Messages API bodies
// (written from Anthropic's API reference), Messages API answers and SSE streams (fixtures under
// test/fixtures/providers/anthropic/, in Anthropic's framing) → OpenAI responses and chunks. Streams
// go through the core's own SSE parser, split at every kind of boundary.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { ChatRequest, Deployment, StreamPart, Usage, WireJson } from "../../core/contract.ts";
import type { GatewayError } from "../../core/errors.ts";
import {
  ANTHROPIC_CHAT_PARAMS,
  type AnthropicStreamState,
  anthropicChatResponse,
  anthropicChatStream,
  anthropicCountTokensBody,
  anthropicErrorKind,
  anthropicErrorMessage,
  anthropicMessagesBody,
  anthropicProvider,
} from "../../providers/anthropic/index.ts";
import { chunks as chunksOf, cutAtCR, cutEvery, runStream as runParts, usageOf } from "./run-stream.ts";

const FIXTURES = join(import.meta.dir, "../fixtures/providers/anthropic");
const fixture = (name: string) => readFileSync(join(FIXTURES, name), "utf8");
/** `created` is the clock's: fixed for comparisons. */
const unstamped = (c: WireJson): WireJson => ({ ...c, created: 0 });

/** A chat request from loose JSON, as a client would send it (content parts carry any members). */
const chat = (req: Record<string, unknown>): ChatRequest => ({ model: "claude", messages: [{ role: "user", content: "Hi" }], ...req }) as ChatRequest;
const body = (req: Record<string, unknown>) => anthropicMessagesBody(chat(req), "claude-3-5-sonnet-20241022");

function deployment(over: Partial<Deployment> = {}): Deployment {
  const base: Deployment = { id: "d1", modelName: "claude", provider: "anthropic", upstreamModel: "claude-3-5-sonnet-20241022", options: {}, info: {}, ...over };
  const resolved = anthropicProvider.resolve!(base);
  if (typeof resolved === "string") throw new Error(resolved);
  return resolved;
}

// ---------------------------------------------------------------------------------------------
// Requests

describe("request: OpenAI chat → Messages API body", () => {
  test("system and developer messages become the top-level system string; max_tokens defaults to 4096", () => {
    expect(
      body({
        messages: [
          { role: "system", content: "You are terse." },
          { role: "developer", content: [{ type: "text", text: "Answer in French." }] },
          { role: "user", content: "Hello" },
        ],
      }),
    ).toEqual({ model: "claude-3-5-sonnet-20241022", max_tokens: 4096, system: "You are terse.\n\nAnswer in French.", messages: [{ role: "user", content: "Hello" }] });
  });

  test("cache_control on system and user parts is kept, so the system becomes blocks", () => {
    const b = body({
      messages: [
        { role: "system", content: [{ type: "text", text: "Long manual…", cache_control: { type: "ephemeral" } }] },
        { role: "user", content: [{ type: "text", text: "Question", cache_control: { type: "ephemeral", ttl: "1h" } }] },
      ],
    });
    expect(b.system).toEqual([{ type: "text", text: "Long manual…", cache_control: { type: "ephemeral" } }]);
    expect(b.messages).toEqual([{ role: "user", content: [{ type: "text", text: "Question", cache_control: { type: "ephemeral", ttl: "1h" } }] }]);
  });

  test("a message-level cache_control marks the turn's last block without touching the client's objects", () => {
    const part = { type: "image_url", image_url: { url: "https://example.com/a.png" } };
    const req = chat({ messages: [{ role: "user", content: [{ type: "text", text: "look" }, part], cache_control: { type: "ephemeral" } } as never] });
    const b = anthropicMessagesBody(req, "m");
    expect(b.messages).toEqual([
      {
        role: "user",
        content: [
          { type: "text", text: "look" },
          { type: "image", source: { type: "url", url: "https://example.com/a.png" }, cache_control: { type: "ephemeral" } },
        ],
      },
    ]);
    expect(part).toEqual({ type: "image_url", image_url: { url: "https://example.com/a.png" } });
  });

  test("images: data URLs become base64 sources, http URLs url sources; PDFs become documents", () => {
    const b = body({
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "What is in these?" },
            { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=", detail: "high" } },
            { type: "image_url", image_url: { url: "https://upload.wikimedia.org/cat.jpg" } },
            { type: "file", file: { file_data: "data:application/pdf;base64,JVBERi0x", filename: "report.pdf" } },
          ],
        },
      ],
    });
    expect(b.messages).toEqual([
      {
        role: "user",
        content: [
          { type: "text", text: "What is in these?" },
          { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } },
          { type: "image", source: { type: "url", url: "https://upload.wikimedia.org/cat.jpg" } },
          { type: "document", source: { type: "base64", media_type: "application/pdf", data: "JVBERi0x" }, title: "report.pdf" },
        ],
      },
    ]);
  });

  test("what Claude cannot take is the client's 400 naming it: audio, a file by id, a document other than a PDF", () => {
    const refusal = (part: object) => {
      try {
        body({ messages: [{ role: "user", content: [{ type: "text", text: "and this?" }, part] }] });
      } catch (err) {
        return err as GatewayError;
      }
      throw new Error("not refused");
    };
    for (const [part, message] of [
      [{ type: "input_audio", input_audio: { data: "UklGRg==", format: "wav" } }, "anthropic: Claude takes no audio (an input_audio part); send text, images or PDF documents."],
      [{ type: "file", file: { file_id: "file-abc" } }, 'anthropic: a file part by file_id ("file-abc") cannot be sent to Claude; send the file\'s content as file_data (a base64 data URL of a PDF).'],
      [{ type: "file", file: { file_data: "data:video/mp4;base64,AAAA" } }, "anthropic: Claude takes PDF documents, not video/mp4 (a file part)."],
    ] as const) {
      expect(refusal(part).info).toMatchObject({ status: 400, type: "invalid_request_error", message });
    }
  });

  test("assistant tool calls → tool_use blocks; tool results → tool_result blocks merged with the next user text into one user turn", () => {
    const b = body({
      messages: [
        { role: "user", content: "Weather in Paris and London?" },
        {
          role: "assistant",
          content: "Checking both.",
          tool_calls: [
            { id: "toolu_01A", type: "function", function: { name: "get_weather", arguments: '{"location":"Paris"}' } },
            { id: "toolu_01B", type: "function", function: { name: "get_weather", arguments: "" } },
          ],
        },
        { role: "tool", tool_call_id: "toolu_01A", content: "18°C" },
        { role: "tool", tool_call_id: "toolu_01B", content: [{ type: "text", text: "12°C" }] },
        { role: "user", content: "And tomorrow?" },
      ],
    });
    expect(b.messages).toEqual([
      { role: "user", content: "Weather in Paris and London?" },
      {
        role: "assistant",
        content: [
          { type: "text", text: "Checking both." },
          { type: "tool_use", id: "toolu_01A", name: "get_weather", input: { location: "Paris" } },
          { type: "tool_use", id: "toolu_01B", name: "get_weather", input: {} },
        ],
      },
      {
        role: "user",
        content: [
          { type: "tool_result", tool_use_id: "toolu_01A", content: "18°C" },
          { type: "tool_result", tool_use_id: "toolu_01B", content: [{ type: "text", text: "12°C" }] },
          { type: "text", text: "And tomorrow?" },
        ],
      },
    ]);
  });

  test("consecutive user turns merge; an assistant with only tool calls (content null or \"\") has no empty text block", () => {
    const b = body({
      messages: [
        { role: "user", content: "one" },
        { role: "user", content: "two" },
        { role: "assistant", content: null, tool_calls: [{ id: "t1", type: "function", function: { name: "f", arguments: "{}" } }] },
        { role: "tool", tool_call_id: "t1", content: "ok" },
      ],
    });
    expect(b.messages).toEqual([
      { role: "user", content: [{ type: "text", text: "one" }, { type: "text", text: "two" }] },
      { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "f", input: {} }] },
      { role: "user", content: [{ type: "tool_result", tool_use_id: "t1", content: "ok" }] },
    ]);
    // Content "" (as some clients send it back) is no text either: the call is the turn.
    const empty = body({
      messages: [
        { role: "user", content: "one" },
        { role: "assistant", content: "", tool_calls: [{ id: "t1", type: "function", function: { name: "f", arguments: "{}" } }] },
        { role: "tool", tool_call_id: "t1", content: "ok" },
      ],
    });
    expect((empty.messages as WireJson[])[1]).toEqual({ role: "assistant", content: [{ type: "tool_use", id: "t1", name: "f", input: {} }] });
  });

  test("thinking blocks echoed on an assistant turn go back first, signature intact", () => {
    const thinking = { type: "thinking", thinking: "Need the weather.", signature: "EqQBCgIYAh" };
    const b = body({
      messages: [
        { role: "user", content: "Weather?" },
        { role: "assistant", content: null, thinking_blocks: [thinking], tool_calls: [{ id: "t1", type: "function", function: { name: "w", arguments: "{}" } }] } as never,
        { role: "tool", tool_call_id: "t1", content: "sunny" },
      ],
    });
    expect((b.messages as WireJson[])[1]).toEqual({ role: "assistant", content: [thinking, { type: "tool_use", id: "t1", name: "w", input: {} }] });
  });

  test("tools → {name, description, input_schema}; native Anthropic tools pass as they are", () => {
    const b = body({
      tools: [
        {
          type: "function",
          function: { name: "get_weather", description: "Weather for a place", parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] } },
          cache_control: { type: "ephemeral" },
        },
        { type: "function", function: { name: "now" } },
        { type: "web_search_20250305", name: "web_search", max_uses: 2 },
      ],
    });
    expect(b.tools).toEqual([
      {
        name: "get_weather",
        input_schema: { type: "object", properties: { location: { type: "string" } }, required: ["location"] },
        description: "Weather for a place",
        cache_control: { type: "ephemeral" },
      },
      { name: "now", input_schema: { type: "object", properties: {} } },
      { type: "web_search_20250305", name: "web_search", max_uses: 2 },
    ]);
    expect(b.tool_choice).toBeUndefined();
  });

  const tool = { type: "function", function: { name: "f", parameters: { type: "object" } } };
  test.each([
    ["auto", undefined, { type: "auto" }],
    ["none", undefined, { type: "none" }],
    ["required", undefined, { type: "any" }],
    [{ type: "function", function: { name: "f" } }, undefined, { type: "tool", name: "f" }],
    ["required", false, { type: "any", disable_parallel_tool_use: true }],
    [undefined, false, { type: "auto", disable_parallel_tool_use: true }],
  ] as const)("tool_choice %j with parallel_tool_calls %j → %j", (choice, parallel, expected) => {
    expect(body({ tools: [tool], tool_choice: choice as never, parallel_tool_calls: parallel }).tool_choice).toEqual(expected);
  });

  test("sampling and limits: max_completion_tokens wins, stop → stop_sequences (whitespace-only dropped), user → metadata.user_id", () => {
    expect(body({ max_tokens: 100, max_completion_tokens: 200, temperature: 0.3, top_p: 0.9, top_k: 40, stop: ["\n\n", "END", " "], user: "user-42", stream: true })).toEqual({
      model: "claude-3-5-sonnet-20241022",
      max_tokens: 200,
      messages: [{ role: "user", content: "Hi" }],
      temperature: 0.3,
      top_p: 0.9,
      top_k: 40,
      stop_sequences: ["END"],
      metadata: { user_id: "user-42" },
      stream: true,
    });
    expect(body({ stop: "###" }).stop_sequences).toEqual(["###"]);
  });

  test("reasoning_effort → thinking budget, and the default max_tokens leaves room for the answer", () => {
    expect(body({ reasoning_effort: "low" })).toMatchObject({ thinking: { type: "enabled", budget_tokens: 1024 }, max_tokens: 4096 + 1024 });
    expect(body({ reasoning_effort: "high", max_tokens: 10000 })).toMatchObject({ thinking: { type: "enabled", budget_tokens: 4096 }, max_tokens: 10000 });
    expect(body({ thinking: { type: "enabled", budget_tokens: 3000 } })).toMatchObject({ thinking: { type: "enabled", budget_tokens: 3000 }, max_tokens: 7096 });
    expect(body({ reasoning_effort: "none" }).thinking).toBeUndefined();
  });

  test("a reasoning_effort OpenAI does not know is the client's 400 naming the levels, not an answer without thinking", () => {
    expect(() => body({ reasoning_effort: "extreme" })).toThrow(/anthropic: reasoning_effort "extreme" is not one of none, minimal, low, medium, high/);
    expect(() => body({ reasoning_effort: "extreme", thinking: { type: "enabled", budget_tokens: 3000 } })).toThrow(/reasoning_effort "extreme"/);
  });

  test("response_format json_schema → a forced tool carrying the schema", () => {
    const schema = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
    const b = body({ response_format: { type: "json_schema", json_schema: { name: "city", schema } } });
    expect(b.tools).toEqual([{ name: "json_tool_call", description: "Respond with a JSON object matching the schema.", input_schema: schema }]);
    expect(b.tool_choice).toEqual({ type: "tool", name: "json_tool_call" });
    expect(body({ response_format: { type: "json_object" } }).tools).toEqual([{ name: "json_tool_call", description: "Respond with a JSON object.", input_schema: { type: "object" } }]);
    expect(body({ response_format: { type: "text" } }).tools).toBeUndefined();
  });

  test("response_format is not forced while thinking (Anthropic refuses that); with the client's own tools a tool call is required, theirs or the JSON one", () => {
    expect(body({ reasoning_effort: "medium", response_format: { type: "json_object" } }).tool_choice).toBeUndefined();
    const withTools = body({ tools: [tool], tool_choice: "auto", response_format: { type: "json_object" } });
    expect(withTools.tool_choice).toEqual({ type: "any" });
    expect((withTools.tools as WireJson[]).map((t) => t.name)).toEqual(["f", "json_tool_call"]);
    expect(body({ tools: [tool], response_format: { type: "json_object" }, parallel_tool_calls: false }).tool_choice).toEqual({ type: "any", disable_parallel_tool_use: true });
    // A function the client names stays the one called.
    expect(body({ tools: [tool], tool_choice: { type: "function", function: { name: "f" } }, response_format: { type: "json_object" } }).tool_choice).toEqual({ type: "tool", name: "f" });
    // "none" forbids the client's tools, not the JSON answer.
    expect(body({ tools: [tool], tool_choice: "none", response_format: { type: "json_object" } }).tool_choice).toEqual({ type: "tool", name: "json_tool_call" });
  });

  test("the HttpCall: /v1/messages on the base URL, x-api-key, anthropic-version, operator headers last", () => {
    const d = deployment({ apiBase: "https://proxy.example.com/v1/", apiKey: "sk-ant-1", headers: { "anthropic-beta": "prompt-caching-2024-07-31" } });
    const call = anthropicProvider.endpoints.chat!.request(chat({}), d);
    expect(call.url).toBe("https://proxy.example.com/v1/messages");
    expect(call.method).toBe("POST");
    expect(call.headers).toEqual({ "content-type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "sk-ant-1", "anthropic-beta": "prompt-caching-2024-07-31" });
    expect(JSON.parse(call.body!)).toEqual({ model: "claude-3-5-sonnet-20241022", max_tokens: 4096, messages: [{ role: "user", content: "Hi" }] });
  });

  test("resolve: default base URL, ANTHROPIC_API_KEY from the environment, api_version overrides anthropic-version", () => {
    const saved = process.env.ANTHROPIC_API_KEY;
    process.env.ANTHROPIC_API_KEY = "sk-ant-env";
    try {
      const d = deployment({ apiVersion: "2024-01-01" });
      expect(d.apiBase).toBe("https://api.anthropic.com");
      expect(d.apiKey).toBe("sk-ant-env");
      const call = anthropicProvider.endpoints.chat!.request(chat({}), d);
      expect(call.url).toBe("https://api.anthropic.com/v1/messages");
      expect(call.headers["anthropic-version"]).toBe("2024-01-01");
      expect(deployment({ apiBase: "https://api.anthropic.com/v1/messages" }).apiBase).toBe("https://api.anthropic.com");
    } finally {
      if (saved === undefined) delete process.env.ANTHROPIC_API_KEY;
      else process.env.ANTHROPIC_API_KEY = saved;
    }
  });

  test("supported params: n, seed, logprobs and penalties are not translated (the core refuses or drops them)", () => {
    for (const p of ["n", "seed", "logprobs", "top_logprobs", "frequency_penalty", "presence_penalty", "logit_bias"]) expect(ANTHROPIC_CHAT_PARAMS as readonly string[]).not.toContain(p);
    expect(anthropicProvider.endpoints.chat!.supportedParams).toEqual(ANTHROPIC_CHAT_PARAMS);
  });

  test("count_tokens: POST /v1/messages/count_tokens with only the prompt fields", () => {
    const req = chat({ messages: [{ role: "system", content: "S" }, { role: "user", content: "Hi" }], max_tokens: 50, temperature: 0.2, tools: [tool], stream: true });
    expect(anthropicCountTokensBody(req, "claude-x")).toEqual({
      model: "claude-x",
      system: "S",
      messages: [{ role: "user", content: "Hi" }],
      tools: [{ name: "f", input_schema: { type: "object" } }],
    });
    const call = anthropicProvider.countTokens!.request(req, deployment({ apiKey: "k" }));
    expect(call.url).toBe("https://api.anthropic.com/v1/messages/count_tokens");
    expect(anthropicProvider.countTokens!.response({ input_tokens: 2095 })).toBe(2095);
    expect(() => anthropicProvider.countTokens!.response({ type: "error" })).toThrow();
  });
});

// ---------------------------------------------------------------------------------------------
// Responses

describe("response: Messages API → chat.completion", () => {
  test("thinking, text and tool_use with prompt-cache usage", () => {
    const { body: out, usage } = anthropicChatResponse({
      id: "msg_01Aq9w938a90dw8q",
      type: "message",
      role: "assistant",
      model: "claude-sonnet-4-20250514",
      content: [
        { type: "thinking", thinking: "The user wants the weather.", signature: "EqQBCgIYAhIM1gbcDa9GJwZA2b3h" },
        { type: "text", text: "I'll check the weather." },
        { type: "tool_use", id: "toolu_01A09q90qw90lq917835lq9", name: "get_weather", input: { location: "San Francisco, CA", unit: "celsius" } },
      ],
      stop_reason: "tool_use",
      stop_sequence: null,
      usage: { input_tokens: 2095, cache_creation_input_tokens: 1000, cache_read_input_tokens: 3000, output_tokens: 503, service_tier: "standard" },
    });
    expect(typeof out.created).toBe("number");
    expect(unstamped(out)).toEqual({
      id: "msg_01Aq9w938a90dw8q",
      object: "chat.completion",
      created: 0,
      model: "claude-sonnet-4-20250514",
      choices: [
        {
          index: 0,
          message: {
            role: "assistant",
            content: "I'll check the weather.",
            tool_calls: [{ id: "toolu_01A09q90qw90lq917835lq9", type: "function", function: { name: "get_weather", arguments: '{"location":"San Francisco, CA","unit":"celsius"}' } }],
            reasoning_content: "The user wants the weather.",
            thinking_blocks: [{ type: "thinking", thinking: "The user wants the weather.", signature: "EqQBCgIYAhIM1gbcDa9GJwZA2b3h" }],
            refusal: null,
            annotations: [],
          },
          logprobs: null,
          finish_reason: "tool_calls",
        },
      ],
      usage: {
        prompt_tokens: 6095,
        completion_tokens: 503,
        total_tokens: 6598,
        // Without Anthropic's split the writes are 5-minute ones, as they are priced.
        prompt_tokens_details: { cached_tokens: 3000, cache_creation_token_details: { ephemeral_5m_input_tokens: 1000, ephemeral_1h_input_tokens: 0 } },
        completion_tokens_details: { reasoning_tokens: 0 },
        cache_creation_input_tokens: 1000,
        cache_read_input_tokens: 3000,
      },
    });
    expect(usage).toEqual({ promptTokens: 6095, completionTokens: 503, cachedPromptTokens: 3000, cacheCreationTokens: 1000 });
  });

  const message = (content: unknown[], stop_reason: string) => ({
    id: "msg_1",
    type: "message",
    role: "assistant",
    model: "claude-3-5-haiku-20241022",
    content,
    stop_reason,
    stop_sequence: null,
    usage: { input_tokens: 10, output_tokens: 5 },
  });
  const finish = (r: ReturnType<typeof anthropicChatResponse>) => (r.body.choices as WireJson[])[0]!.finish_reason;
  const msg = (r: ReturnType<typeof anthropicChatResponse>) => (r.body.choices as WireJson[])[0]!.message as WireJson;

  test.each([
    ["end_turn", "stop"],
    ["stop_sequence", "stop"],
    ["max_tokens", "length"],
    ["tool_use", "tool_calls"],
    ["refusal", "content_filter"],
    ["pause_turn", "stop"],
  ])("stop_reason %s → finish_reason %s", (stop, expected) => {
    expect(finish(anthropicChatResponse(message([{ type: "text", text: "x" }], stop)))).toBe(expected);
  });

  test("a tool-only answer has content null; the response_format tool's input becomes the content", () => {
    const tool = anthropicChatResponse(message([{ type: "tool_use", id: "t", name: "f", input: {} }], "tool_use"));
    expect(msg(tool).content).toBeNull();
    expect(msg(tool).tool_calls).toEqual([{ id: "t", type: "function", function: { name: "f", arguments: "{}" } }]);
    const json = anthropicChatResponse(message([{ type: "tool_use", id: "t", name: "json_tool_call", input: { city: "Paris" } }], "tool_use"));
    expect(msg(json).content).toBe('{"city":"Paris"}');
    expect(msg(json).tool_calls).toBeUndefined();
    expect(finish(json)).toBe("stop");
  });

  test("response_format while thinking (the JSON tool not forced): a preamble before the JSON tool is dropped, the content is the JSON alone", () => {
    const r = anthropicChatResponse(
      message(
        [
          { type: "thinking", thinking: "The user wants JSON.", signature: "sig" },
          { type: "text", text: "Here is the JSON:\n" },
          { type: "tool_use", id: "t", name: "json_tool_call", input: { city: "Paris" } },
        ],
        "tool_use",
      ),
    );
    expect(JSON.parse(msg(r).content as string)).toEqual({ city: "Paris" });
    expect(msg(r).reasoning_content).toBe("The user wants JSON.");
    expect(finish(r)).toBe("stop");
  });

  test("anything but a Messages API message is refused", () => {
    expect(() => anthropicChatResponse({ type: "error", error: { type: "api_error", message: "x" } })).toThrow(/type: message/);
    expect(() => anthropicChatResponse(null)).toThrow();
  });
});

// ---------------------------------------------------------------------------------------------
// Streams

interface StreamRun {
  chunks: WireJson[];
  usage?: Usage;
  errors: StreamPart[];
  state: AnthropicStreamState;
}

/** The SSE text in the given pieces through the core's own parser and the transform (test/providers/run-stream.ts). */
function runStream(pieces: readonly string[], req: ChatRequest): StreamRun {
  const { parts, state } = runParts(anthropicChatStream, req, pieces);
  return { chunks: chunksOf(parts), usage: usageOf(parts), errors: parts.filter((p) => p.type === "error"), state };
}

/** The ways a byte stream can arrive: whole, in 7- and 1-character pieces, CRLF line ends split between CR and LF. */
function splits(sse: string): Record<string, string[]> {
  const crlf = sse.replaceAll("\n", "\r\n");
  return { whole: [sse], every7: cutEvery(sse, 7), every1: cutEvery(sse, 1), crlfWhole: [crlf], crlfSplitCrLf: cutAtCR(crlf), crlfEvery5: cutEvery(crlf, 5) };
}

const deltas = (r: StreamRun) => r.chunks.filter((c) => (c.choices as unknown[]).length > 0).map((c) => (c.choices as WireJson[])[0]!.delta as WireJson);
const contentOf = (r: StreamRun) =>
  deltas(r)
    .map((d) => d.content ?? "")
    .join("");
const streamReq = (over: Partial<ChatRequest> = {}) => chat({ stream: true, ...over });

describe("stream: Anthropic SSE → chat.completion.chunk", () => {
  test("text: role first, one content chunk per delta, escapes and unicode intact, finish and usage", () => {
    const r = runStream([fixture("text.sse")], streamReq());
    expect(r.chunks.map(unstamped)).toEqual([
      { id: "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", object: "chat.completion.chunk", created: 0, model: "claude-3-5-sonnet-20241022", choices: [{ index: 0, delta: { role: "assistant", content: "", refusal: null }, logprobs: null, finish_reason: null }] },
      ...["Hello", ', "quoted"}}', " back\\slash\\", "\nnew line, café, 😀 and ünïcödé!"].map((content) => ({
        id: "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
        object: "chat.completion.chunk",
        created: 0,
        model: "claude-3-5-sonnet-20241022",
        choices: [{ index: 0, delta: { content }, logprobs: null, finish_reason: null }],
      })),
      { id: "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", object: "chat.completion.chunk", created: 0, model: "claude-3-5-sonnet-20241022", choices: [{ index: 0, delta: {}, logprobs: null, finish_reason: "stop" }] },
    ]);
    expect(r.usage).toEqual({ promptTokens: 25, completionTokens: 15 });
    expect(anthropicChatStream.responseId!(r.state)).toBe("msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY");
    expect(r.errors).toEqual([]);
  });

  for (const name of ["text.sse", "tool-use.sse", "thinking.sse"]) {
    test(`${name}: the same chunks however the bytes are split (mid-JSON, CRLF, CR|LF)`, () => {
      const variants = splits(fixture(name));
      const norm = (r: StreamRun) => JSON.stringify({ chunks: r.chunks.map(unstamped), usage: r.usage });
      const reference = norm(runStream(variants.whole!, streamReq({ stream_options: { include_usage: true } })));
      for (const [how, pieces] of Object.entries(variants)) {
        expect({ how, out: norm(runStream(pieces, streamReq({ stream_options: { include_usage: true } }))) }).toEqual({ how, out: reference });
      }
    });
  }

  test("tool use in pieces: ids and names first, arguments by OpenAI index, parallel calls numbered 0, 1, 2", () => {
    const r = runStream(cutEvery(fixture("tool-use.sse"), 11), streamReq());
    expect(contentOf(r)).toBe("Okay, let's check the weather for San Francisco, CA:");
    const calls = deltas(r).flatMap((d) => (d.tool_calls as WireJson[] | undefined) ?? []);
    expect(calls[0]).toEqual({ index: 0, id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6", type: "function", function: { name: "get_weather", arguments: "" } });
    const args = new Map<number, string>();
    for (const c of calls) args.set(c.index as number, (args.get(c.index as number) ?? "") + String((c.function as WireJson).arguments));
    expect(JSON.parse(args.get(0)!)).toEqual({ location: "San Francisco, CA", unit: "fahrenheit" });
    expect(JSON.parse(args.get(1)!)).toEqual({ timezone: "America/Los_Angeles" });
    // A tool without parameters still gets arguments a client can parse.
    expect(args.get(2)).toBe("{}");
    expect(calls.filter((c) => c.id !== undefined).map((c) => [c.index, c.id, (c.function as WireJson).name])).toEqual([
      [0, "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather"],
      [1, "toolu_01VwTmLcFzFBbHYQqKtYEM5D", "get_time"],
      [2, "toolu_01NoArgsNoArgsNoArgsNoAr", "list_cities"],
    ]);
    // Anthropic opens every tool input with an empty delta: no empty chunk goes out for it.
    expect(calls.filter((c) => c.id === undefined && (c.function as WireJson).arguments === "")).toEqual([]);
    expect((r.chunks.at(-1)!.choices as WireJson[])[0]!.finish_reason).toBe("tool_calls");
    expect(r.usage).toEqual({ promptTokens: 2272, completionTokens: 89, cachedPromptTokens: 1800 });
  });

  test("include_usage: a last chunk with choices [] and the usage, cache figures included; none without it", () => {
    const withUsage = runStream([fixture("tool-use.sse")], streamReq({ stream_options: { include_usage: true } }));
    const last = withUsage.chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toEqual({
      prompt_tokens: 2272,
      completion_tokens: 89,
      total_tokens: 2361,
      prompt_tokens_details: { cached_tokens: 1800 },
      completion_tokens_details: { reasoning_tokens: 0 },
      cache_read_input_tokens: 1800,
    });
    expect(last.id).toBe("msg_014p7gG3wDgGV9EUtLvnow3U");
    const without = runStream([fixture("tool-use.sse")], streamReq());
    expect(without.chunks.every((c) => (c.choices as unknown[]).length === 1 && c.usage === undefined)).toBe(true);
  });

  test("thinking → reasoning_content deltas, then the whole signed block in thinking_blocks, then the answer", () => {
    const r = runStream([fixture("thinking.sse")], streamReq());
    const ds = deltas(r);
    expect(ds.map((d) => d.reasoning_content ?? "").join("")).toBe("Let me solve this step by step:\n\n1. First break down 27 * 453\n2. 453 = 400 + 50 + 3");
    expect(ds.find((d) => d.thinking_blocks)!.thinking_blocks).toEqual([
      { type: "thinking", thinking: "Let me solve this step by step:\n\n1. First break down 27 * 453\n2. 453 = 400 + 50 + 3", signature: "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds" },
    ]);
    expect(contentOf(r)).toBe("27 * 453 = 12,231");
    expect(r.usage).toEqual({ promptTokens: 1248, completionTokens: 112, cacheCreationTokens: 1200 });
  });

  test("events in another member order (no fast path) give the same chunks as Anthropic's own order", () => {
    const sse = fixture("tool-use.sse");
    // Re-serialize every event with `type` last: the spliced fast path cannot apply.
    const reordered = sse.replace(/^data: (.*)$/gm, (_, json: string) => {
      const { type, ...rest } = JSON.parse(json) as WireJson;
      return `data: ${JSON.stringify({ ...rest, type })}`;
    });
    expect(reordered).not.toContain('data: {"type":"content_block_delta"');
    const norm = (r: StreamRun) => r.chunks.map(unstamped);
    expect(norm(runStream([reordered], streamReq()))).toEqual(norm(runStream([sse], streamReq())));
  });

  test("a delta with members after its text (a later API version) still yields exactly its text", () => {
    const text = fixture("text.sse");
    const start = text.slice(0, text.indexOf("event: content_block_delta"));
    const r = runStream(
      [
        start,
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a","citations":"b"}}\n\n',
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"c\\\\"},"extra":{"k":"d\\""}}\n\n',
      ],
      streamReq(),
    );
    expect(deltas(r).slice(1)).toEqual([{ content: "a" }, { content: "c\\" }]);
  });

  test("response_format in a stream: the JSON tool's input arrives as content, finish_reason stop", () => {
    const sse = [
      'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_j","type":"message","role":"assistant","model":"claude-3-5-haiku-20241022","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":30,"output_tokens":1}}}\n\n',
      'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_j","name":"json_tool_call","input":{}}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\\"city\\": "}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\\"Paris\\"}"}}\n\n',
      'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
      'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}\n\n',
      'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ];
    const r = runStream(sse, streamReq({ response_format: { type: "json_object" } }));
    expect(JSON.parse(contentOf(r))).toEqual({ city: "Paris" });
    expect(deltas(r).some((d) => d.tool_calls)).toBe(false);
    expect((r.chunks.at(-1)!.choices as WireJson[])[0]!.finish_reason).toBe("stop");
  });

  describe("response_format while thinking (the JSON tool not forced)", () => {
    const start =
      'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_t","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":30,"output_tokens":1}}}\n\n';
    const thinking = [
      'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"JSON wanted."}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}\n\n',
      'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
    ];
    const text = (index: number, ...pieces: string[]) => [
      `event: content_block_start\ndata: {"type":"content_block_start","index":${index},"content_block":{"type":"text","text":""}}\n\n`,
      ...pieces.map((t) => `event: content_block_delta\ndata: {"type":"content_block_delta","index":${index},"delta":{"type":"text_delta","text":${JSON.stringify(t)}}}\n\n`),
      `event: content_block_stop\ndata: {"type":"content_block_stop","index":${index}}\n\n`,
    ];
    const end = (stop: string) => [
      `event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"${stop}","stop_sequence":null},"usage":{"output_tokens":40}}\n\n`,
      'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ];
    const json = [
      'event: content_block_start\ndata: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_j","name":"json_tool_call","input":{}}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\\"city\\": \\"Paris\\"}"}}\n\n',
      'event: content_block_stop\ndata: {"type":"content_block_stop","index":2}\n\n',
    ];
    const jsonReq = chat({ stream: true, reasoning_effort: "low", response_format: { type: "json_object" } });

    test("a preamble before the JSON tool never reaches the client: the content is the JSON alone", () => {
      const r = runStream([start, ...thinking, ...text(1, "Here is ", "the \"JSON\":\n"), ...json, ...end("tool_use")], jsonReq);
      expect(JSON.parse(contentOf(r))).toEqual({ city: "Paris" });
      expect(deltas(r).some((d) => d.reasoning_content === "JSON wanted.")).toBe(true);
      expect((r.chunks.at(-1)!.choices as WireJson[])[0]!.finish_reason).toBe("stop");
    });

    test("text answered without the JSON tool is sent whole before the finish", () => {
      const r = runStream([start, ...thinking, ...text(1, "Paris, ", "\"obviously\""), ...end("end_turn")], jsonReq);
      expect(contentOf(r)).toBe('Paris, "obviously"');
      expect(deltas(r).at(-1)).toEqual({});
      expect((r.chunks.at(-1)!.choices as WireJson[])[0]!.finish_reason).toBe("stop");
    });
  });

  test("an error event (overloaded) ends the stream with a 503 error part; ping and unknown events are ignored", () => {
    const text = fixture("text.sse");
    const cut = text.slice(0, text.indexOf("event: content_block_stop"));
    const r = runStream([cut, 'event: ping\ndata: {"type": "ping"}\n\n', 'event: brand_new\ndata: {"type":"brand_new"}\n\n', 'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'], streamReq());
    // As an HTTP 529 is: 503 api_connection_error, the gateway's type for an upstream's 503.
    expect(r.errors).toEqual([{ type: "error", error: { status: 503, type: "api_connection_error", message: "anthropic stream error: overloaded_error: Overloaded", param: null } }]);
    expect(contentOf(r)).toContain("Hello");
  });

  test("a cut stream is estimated: Anthropic's prompt count, output from the characters sent", () => {
    const text = fixture("text.sse");
    const r = runStream([text.slice(0, text.indexOf("event: content_block_stop"))], streamReq());
    expect(r.usage).toBeUndefined();
    const estimate = anthropicChatStream.estimate(r.state);
    expect(estimate.promptTokens).toBe(25);
    expect(estimate.completionTokens).toBeGreaterThanOrEqual(10);
    // Cut before message_start: the prompt is estimated from the request.
    const early = anthropicChatStream.init(streamReq({ messages: [{ role: "user", content: "x".repeat(400) }] }));
    expect(anthropicChatStream.estimate(early)).toEqual({ promptTokens: 100, completionTokens: 0 });
  });

  test("a truncated event is a parse failure (the core turns it into a stream error)", () => {
    const state = anthropicChatStream.init(streamReq());
    expect(() => anthropicChatStream.event('{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel', state)).toThrow();
  });
});

// ---------------------------------------------------------------------------------------------
// Errors

describe("errors: Anthropic error bodies", () => {
  const err = (type: string, message: string) => JSON.stringify({ type: "error", error: { type, message }, request_id: "req_011CSHoEeqs5C35K2UUqR7Fy" });

  test("the message shown to the client names Anthropic's error type", () => {
    expect(anthropicErrorMessage(529, err("overloaded_error", "Overloaded"))).toBe("overloaded_error: Overloaded");
    expect(anthropicErrorMessage(401, err("authentication_error", "invalid x-api-key"))).toBe("authentication_error: invalid x-api-key");
    expect(anthropicErrorMessage(502, "<html>Bad Gateway</html>")).toBe("<html>Bad Gateway</html>");
  });

  test("prompt too long and context-limit errors are context_window_exceeded; others are not", () => {
    expect(anthropicErrorKind(400, err("invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"))).toBe("context_window_exceeded");
    expect(anthropicErrorKind(400, err("invalid_request_error", "input length and `max_tokens` exceed context limit: 187254 + 20000 > 200000, decrease input length or `max_tokens` and try again"))).toBe(
      "context_window_exceeded",
    );
    expect(anthropicErrorKind(400, err("invalid_request_error", "Output blocked by content filtering policy"))).toBe("content_policy_violation");
    expect(anthropicErrorKind(400, err("invalid_request_error", "max_tokens: 8193 > 8192, which is the maximum allowed number of output tokens for claude-3-5-sonnet-20241022"))).toBeUndefined();
    expect(anthropicErrorKind(529, err("overloaded_error", "Overloaded"))).toBeUndefined();
  });
});
