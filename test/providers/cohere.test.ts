// Cohere v2 golden fixtures, both directions: the OpenAI request the client sends → the body
// Cohere's API reference describes, and Cohere's answers and SSE streams (as its API writes them,
// cut mid-JSON and across CRLF) → what an OpenAI client receives.
import { afterEach, describe, expect, test } from "bun:test";
import type { ChatRequest, Deployment, EmbeddingsRequest, WireJson } from "../../core/contract.ts";
import { paramsFor, supportedBody } from "../../core/pipeline/params.ts";
import { cohereProvider } from "../../providers/cohere/index.ts";
import { assemble, chunks, cutAtCR, cutEvery, runStream, usageOf } from "./run-stream.ts";

const chat = cohereProvider.endpoints.chat!;
const embeddings = cohereProvider.endpoints.embeddings!;

function deployment(over: Partial<Deployment> = {}): Deployment {
  const base: Deployment = { id: "dep-co", modelName: "command", provider: "cohere", upstreamModel: "command-a-03-2025", options: {}, info: {}, ...over };
  const resolved = cohereProvider.resolve!(base);
  if (typeof resolved === "string") throw new Error(resolved);
  return resolved;
}

const savedEnv = { key: process.env.COHERE_API_KEY, base: process.env.COHERE_API_BASE };
afterEach(() => {
  process.env.COHERE_API_KEY = savedEnv.key;
  process.env.COHERE_API_BASE = savedEnv.base;
  if (savedEnv.key === undefined) delete process.env.COHERE_API_KEY;
  if (savedEnv.base === undefined) delete process.env.COHERE_API_BASE;
});

/** Content parts as a client sends them (the request schema types parts loosely). */
const parts = (...list: WireJson[]) => list as ChatRequest["messages"][number]["content"];

const weatherTool = {
  type: "function",
  function: { name: "get_weather", description: "Current weather for a place", parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] } },
};

describe("OpenAI request → Cohere /v2/chat", () => {
  test("a full conversation with tools, sampling and a JSON schema", () => {
    const req: ChatRequest = {
      model: "command",
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: parts({ type: "text", text: "What is in this picture, and the weather in Toronto?" }, { type: "image_url", image_url: { url: "https://example.com/cat.png" } }) },
        {
          role: "assistant",
          content: "I will look up the weather.",
          tool_calls: [{ id: "get_weather_1byjy32y4hvq", type: "function", function: { name: "get_weather", arguments: '{"location":"Toronto"}' } }],
        },
        { role: "tool", tool_call_id: "get_weather_1byjy32y4hvq", content: '{"temperature":"20C"}' },
      ],
      tools: [weatherTool],
      tool_choice: "required",
      temperature: 0.3,
      top_p: 0.9,
      max_tokens: 200,
      stop: "END",
      seed: 7,
      frequency_penalty: 0.1,
      presence_penalty: 0.2,
      response_format: { type: "json_schema", json_schema: { name: "answer", schema: { type: "object", properties: { answer: { type: "string" } } } } },
    };
    const call = chat.request(req, deployment({ apiKey: "co-key" }));
    expect(call.url).toBe("https://api.cohere.com/v2/chat");
    expect(call.headers.authorization).toBe("Bearer co-key");
    expect(call.headers["content-type"]).toBe("application/json");
    expect(JSON.parse(call.body!)).toEqual({
      model: "command-a-03-2025",
      messages: [
        { role: "system", content: "You are terse." },
        {
          role: "user",
          content: [
            { type: "text", text: "What is in this picture, and the weather in Toronto?" },
            { type: "image_url", image_url: { url: "https://example.com/cat.png" } },
          ],
        },
        {
          role: "assistant",
          tool_plan: "I will look up the weather.",
          tool_calls: [{ id: "get_weather_1byjy32y4hvq", type: "function", function: { name: "get_weather", arguments: '{"location":"Toronto"}' } }],
        },
        { role: "tool", tool_call_id: "get_weather_1byjy32y4hvq", content: '{"temperature":"20C"}' },
      ],
      tools: [weatherTool],
      tool_choice: "REQUIRED",
      temperature: 0.3,
      p: 0.9,
      max_tokens: 200,
      stop_sequences: ["END"],
      seed: 7,
      frequency_penalty: 0.1,
      presence_penalty: 0.2,
      response_format: { type: "json_object", json_schema: { type: "object", properties: { answer: { type: "string" } } } },
    });
  });

  test("a stream asks for SSE; a named tool becomes the only tool, required; none maps to NONE", () => {
    const other = { type: "function", function: { name: "get_time", parameters: { type: "object", properties: {} } } };
    const named = chat.request({ model: "command", messages: [{ role: "user", content: "hi" }], stream: true, tools: [weatherTool, other], tool_choice: { type: "function", function: { name: "get_time" } } }, deployment());
    expect(named.headers.accept).toBe("text/event-stream");
    const body = JSON.parse(named.body!) as WireJson;
    expect(body.stream).toBe(true);
    expect(body.tools).toEqual([other]);
    expect(body.tool_choice).toBe("REQUIRED");
    expect("stream_options" in body).toBe(false);
    const none = JSON.parse(chat.request({ model: "command", messages: [{ role: "user", content: "hi" }], tools: [weatherTool], tool_choice: "none" }, deployment()).body!) as WireJson;
    expect(none.tool_choice).toBe("NONE");
  });

  test("max_completion_tokens and json_object; the key and base come from the environment", () => {
    process.env.COHERE_API_KEY = "env-key";
    process.env.COHERE_API_BASE = "https://cohere.internal/";
    const call = chat.request({ model: "command", messages: [{ role: "developer", content: "Be brief." }, { role: "user", content: "hi" }], max_completion_tokens: 50, response_format: { type: "json_object" } }, deployment());
    expect(call.url).toBe("https://cohere.internal/v2/chat");
    expect(call.headers.authorization).toBe("Bearer env-key");
    expect(JSON.parse(call.body!)).toEqual({
      model: "command-a-03-2025",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "hi" },
      ],
      max_tokens: 50,
      response_format: { type: "json_object" },
    });
  });
});

describe("reasoning_effort → thinking", () => {
  const ask = (effort: unknown): ChatRequest => ({ model: "command", messages: [{ role: "user", content: "why?" }], reasoning_effort: effort }) as ChatRequest;
  const reasoningModel = () => deployment({ upstreamModel: "command-a-reasoning-08-2025" });

  test("a reasoning model: none disables thinking, other levels enable it with a token budget", () => {
    const sent = (effort: string) => (JSON.parse(chat.request(ask(effort), reasoningModel()).body!) as WireJson).thinking;
    expect(sent("none")).toEqual({ type: "disabled" });
    expect(sent("minimal")).toEqual({ type: "enabled", token_budget: 1024 });
    expect(sent("low")).toEqual({ type: "enabled", token_budget: 1024 });
    expect(sent("medium")).toEqual({ type: "enabled", token_budget: 2048 });
    expect(sent("high")).toEqual({ type: "enabled", token_budget: 4096 });
    expect("thinking" in (JSON.parse(chat.request(ask(undefined), reasoningModel()).body!) as WireJson)).toBe(false);
    expect(() => chat.request(ask("max"), reasoningModel())).toThrow(/reasoning_effort "max" is not one of/);
  });

  test("accepted for a reasoning model; a model that cannot think refuses it by name, or drops it with drop_params", () => {
    const d = reasoningModel();
    expect(supportedBody(ask("low"), paramsFor(chat, d)!, d, false)).toMatchObject({ reasoning_effort: "low" });
    const plain = deployment();
    expect(() => supportedBody(ask("low"), paramsFor(chat, plain)!, plain, false)).toThrow("cohere does not support parameters: ['reasoning_effort'], for model=command-a-03-2025");
    expect("reasoning_effort" in supportedBody(ask("low"), paramsFor(chat, plain)!, plain, true)).toBe(false);
  });
});

describe("Cohere answer → chat.completion", () => {
  const req: ChatRequest = { model: "command", messages: [{ role: "user", content: "What is an LLM?" }] };

  test("text, finish reason and usage (billed units, which Cohere charges)", () => {
    const answer = {
      id: "c14c80c3-18eb-4519-9460-6c92edd8cfb4",
      finish_reason: "COMPLETE",
      message: { role: "assistant", content: parts({ type: "text", text: "LLMs stand for Large Language Models." }) },
      usage: { billed_units: { input_tokens: 5, output_tokens: 418 }, tokens: { input_tokens: 71, output_tokens: 418 } },
    };
    const { body, usage } = chat.response(answer, req);
    expect(body).toEqual({
      id: "c14c80c3-18eb-4519-9460-6c92edd8cfb4",
      object: "chat.completion",
      created: expect.any(Number),
      model: "command",
      choices: [{ index: 0, message: { role: "assistant", content: "LLMs stand for Large Language Models." }, logprobs: null, finish_reason: "stop" }],
      usage: { prompt_tokens: 5, completion_tokens: 418, total_tokens: 423, prompt_tokens_details: { cached_tokens: 0 }, completion_tokens_details: { reasoning_tokens: 0 } },
    });
    expect(usage).toEqual({ promptTokens: 5, completionTokens: 418 });
  });

  test("a tool call: the plan is the content, arguments stay JSON text", () => {
    const answer = {
      id: "7eaa0a8b-9d4c-4e6b-a8ab-8f3b9d9a7f53",
      message: {
        role: "assistant",
        tool_plan: "I will search for the weather in Toronto.",
        tool_calls: [{ id: "get_weather_1byjy32y4hvq", type: "function", function: { name: "get_weather", arguments: '{"location":"Toronto"}' } }],
      },
      finish_reason: "TOOL_CALL",
      usage: { billed_units: { input_tokens: 37, output_tokens: 28 }, tokens: { input_tokens: 913, output_tokens: 81 }, cached_tokens: 100 },
    };
    const { body, usage } = chat.response(answer, req);
    const choice = (body.choices as WireJson[])[0]!;
    expect(choice.finish_reason).toBe("tool_calls");
    expect(choice.message).toEqual({
      role: "assistant",
      content: "I will search for the weather in Toronto.",
      tool_calls: [{ id: "get_weather_1byjy32y4hvq", type: "function", function: { name: "get_weather", arguments: '{"location":"Toronto"}' } }],
    });
    // Cache hits are not in the billed input: the prompt total is both, the hits its cached part.
    expect(usage).toEqual({ promptTokens: 137, completionTokens: 28, cachedPromptTokens: 100 });
    expect(body.usage).toMatchObject({ prompt_tokens: 137, completion_tokens: 28, total_tokens: 165, prompt_tokens_details: { cached_tokens: 100 } });
  });

  test("finish reasons: MAX_TOKENS → length, ERROR_TOXIC → content_filter; thinking → reasoning_content; tokens when nothing is billed", () => {
    const answer = (finish: string) => ({
      id: "x",
      finish_reason: finish,
      message: { role: "assistant", content: [{ type: "thinking", thinking: "Hmm." }, { type: "text", text: "Hi" }] },
      usage: { tokens: { input_tokens: 9, output_tokens: 3 } },
    });
    const long = chat.response(answer("MAX_TOKENS"), req);
    expect((long.body.choices as WireJson[])[0]!.finish_reason).toBe("length");
    expect((long.body.choices as WireJson[])[0]!.message).toEqual({ role: "assistant", content: "Hi", reasoning_content: "Hmm." });
    expect(long.usage).toEqual({ promptTokens: 9, completionTokens: 3 });
    expect((chat.response(answer("ERROR_TOXIC"), req).body.choices as WireJson[])[0]!.finish_reason).toBe("content_filter");
    expect((chat.response(answer("STOP_SEQUENCE"), req).body.choices as WireJson[])[0]!.finish_reason).toBe("stop");
  });

  test("an answer without a message is an error, not an empty reply", () => {
    expect(() => chat.response({ id: "x", finish_reason: "COMPLETE" }, req)).toThrow(/no message/);
  });
});

// As Cohere's API writes a text stream (event lines name the type).
const TEXT_STREAM = [
  "event: message-start",
  'data: {"id":"5c1f8b2a-5d5e-4a56-9f67-1f3b0f0f8e11","type":"message-start","delta":{"message":{"role":"assistant","content":[],"tool_plan":"","tool_calls":[],"citations":[]}}}',
  "",
  "event: content-start",
  'data: {"type":"content-start","index":0,"delta":{"message":{"content":{"type":"text","text":""}}}}',
  "",
  "event: content-delta",
  'data: {"type":"content-delta","index":0,"delta":{"message":{"content":{"text":"Hola"}}}}',
  "",
  "event: content-delta",
  'data: {"type":"content-delta","index":0,"delta":{"message":{"content":{"text":" Juan, \\"amigo\\""}}}}',
  "",
  "event: content-end",
  'data: {"type":"content-end","index":0}',
  "",
  "event: message-end",
  'data: {"type":"message-end","delta":{"finish_reason":"COMPLETE","usage":{"billed_units":{"input_tokens":5,"output_tokens":4},"tokens":{"input_tokens":70,"output_tokens":4}}}}',
  "",
  "",
].join("\n");

const TOOL_STREAM = [
  "event: message-start",
  'data: {"id":"93b3f521-090e-4ebc-bac4-f7c557e63c00","type":"message-start","delta":{"message":{"role":"assistant","content":[],"tool_plan":"","tool_calls":[],"citations":[]}}}',
  "",
  "event: tool-plan-delta",
  'data: {"type":"tool-plan-delta","delta":{"message":{"tool_plan":"I will"}}}',
  "",
  "event: tool-plan-delta",
  'data: {"type":"tool-plan-delta","delta":{"message":{"tool_plan":" check."}}}',
  "",
  "event: tool-call-start",
  'data: {"type":"tool-call-start","index":0,"delta":{"message":{"tool_calls":{"id":"get_weather_3v76fs3zjrgq","type":"function","function":{"name":"get_weather","arguments":""}}}}}',
  "",
  "event: tool-call-delta",
  'data: {"type":"tool-call-delta","index":0,"delta":{"message":{"tool_calls":{"function":{"arguments":"{\\n    \\""}}}}}',
  "",
  "event: tool-call-delta",
  'data: {"type":"tool-call-delta","index":0,"delta":{"message":{"tool_calls":{"function":{"arguments":"location"}}}}}',
  "",
  "event: tool-call-delta",
  'data: {"type":"tool-call-delta","index":0,"delta":{"message":{"tool_calls":{"function":{"arguments":"\\": \\"Toronto\\"\\n}"}}}}}',
  "",
  "event: tool-call-end",
  'data: {"type":"tool-call-end","index":0}',
  "",
  "event: tool-call-start",
  'data: {"type":"tool-call-start","index":1,"delta":{"message":{"tool_calls":{"id":"get_time_8mq1","type":"function","function":{"name":"get_time","arguments":""}}}}}',
  "",
  "event: tool-call-delta",
  'data: {"type":"tool-call-delta","index":1,"delta":{"message":{"tool_calls":{"function":{"arguments":"{}"}}}}}',
  "",
  "event: tool-call-end",
  'data: {"type":"tool-call-end","index":1}',
  "",
  "event: message-end",
  'data: {"type":"message-end","delta":{"finish_reason":"TOOL_CALL","usage":{"billed_units":{"input_tokens":50,"output_tokens":26},"tokens":{"input_tokens":793,"output_tokens":61},"cached_tokens":176}}}',
  "",
  "",
].join("\n");

describe("Cohere stream → chat.completion.chunk", () => {
  const req = (includeUsage: boolean): ChatRequest => ({ model: "command", messages: [{ role: "user", content: "hola" }], stream: true, ...(includeUsage ? { stream_options: { include_usage: true } } : {}) });

  test("text: same result whole, cut every 7 characters, and with CRLF line ends cut between CR and LF", () => {
    const crlf = TEXT_STREAM.replaceAll("\n", "\r\n");
    for (const pieces of [[TEXT_STREAM], cutEvery(TEXT_STREAM, 7), cutAtCR(crlf), cutEvery(crlf, 5)]) {
      const { parts, state } = runStream(chat.stream!, req(true), pieces);
      const list = chunks(parts);
      expect(list[0]).toEqual({
        id: "5c1f8b2a-5d5e-4a56-9f67-1f3b0f0f8e11",
        object: "chat.completion.chunk",
        created: expect.any(Number),
        model: "command",
        choices: [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }],
      });
      for (const c of list) expect(c.id).toBe("5c1f8b2a-5d5e-4a56-9f67-1f3b0f0f8e11");
      const out = assemble(list);
      expect(out).toMatchObject({ role: "assistant", content: 'Hola Juan, "amigo"', finish: "stop", toolCalls: [] });
      // The usage chunk comes last, with no choices.
      expect(list.at(-1)).toMatchObject({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 4, total_tokens: 9 } });
      expect(usageOf(parts)).toEqual({ promptTokens: 5, completionTokens: 4 });
      expect(chat.stream!.responseId!(state)).toBe("5c1f8b2a-5d5e-4a56-9f67-1f3b0f0f8e11");
    }
  });

  test("without include_usage the client gets no usage chunk, the gateway still records the usage", () => {
    const { parts } = runStream(chat.stream!, req(false), cutEvery(TEXT_STREAM, 11));
    const list = chunks(parts);
    expect(list.every((c) => (c.choices as unknown[]).length === 1 && !("usage" in c))).toBe(true);
    expect(usageOf(parts)).toEqual({ promptTokens: 5, completionTokens: 4 });
  });

  test("two tool calls arriving in pieces, the plan as content", () => {
    const { parts } = runStream(chat.stream!, req(true), cutEvery(TOOL_STREAM, 13));
    const list = chunks(parts);
    const out = assemble(list);
    expect(out.content).toBe("I will check.");
    expect(out.toolCalls).toEqual([
      { id: "get_weather_3v76fs3zjrgq", name: "get_weather", arguments: '{\n    "location": "Toronto"\n}' },
      { id: "get_time_8mq1", name: "get_time", arguments: "{}" },
    ]);
    expect(JSON.parse(out.toolCalls[0]!.arguments)).toEqual({ location: "Toronto" });
    expect(out.finish).toBe("tool_calls");
    // The first piece of each call names it; later pieces carry only arguments, by index.
    const toolDeltas = list.flatMap((c) => ((c.choices as WireJson[])[0]?.delta as WireJson | undefined)?.tool_calls ?? []) as WireJson[];
    expect(toolDeltas[0]).toEqual({ index: 0, id: "get_weather_3v76fs3zjrgq", type: "function", function: { name: "get_weather", arguments: "" } });
    expect(toolDeltas[1]).toEqual({ index: 0, function: { arguments: '{\n    "' } });
    expect(usageOf(parts)).toEqual({ promptTokens: 226, completionTokens: 26, cachedPromptTokens: 176 });
  });

  test("thinking deltas become reasoning_content; a failed generation ends the stream with an error", () => {
    const events = [
      'data: {"id":"r1","type":"message-start","delta":{"message":{"role":"assistant"}}}',
      'data: {"type":"content-start","index":0,"delta":{"message":{"content":{"type":"thinking","thinking":""}}}}',
      'data: {"type":"content-delta","index":0,"delta":{"message":{"content":{"thinking":"Let me see."}}}}',
      'data: {"type":"content-delta","index":1,"delta":{"message":{"content":{"text":"Yes."}}}}',
      'data: {"type":"message-end","delta":{"finish_reason":"ERROR","error":"internal model failure"}}',
    ].join("\n\n");
    const { parts } = runStream(chat.stream!, req(false), [`${events}\n\n`]);
    const out = assemble(chunks(parts));
    expect(out.reasoning).toBe("Let me see.");
    expect(out.content).toBe("Yes.");
    expect(parts.at(-1)).toEqual({ type: "error", error: { status: 500, type: "api_error", message: "Cohere stream failed: internal model failure" } });
  });

  test("a stream cut before message-end is estimated from what was sent", () => {
    const cut = TEXT_STREAM.slice(0, TEXT_STREAM.indexOf("event: content-end"));
    const { parts, state } = runStream(chat.stream!, req(false), [cut]);
    expect(usageOf(parts)).toBeUndefined();
    const estimate = chat.stream!.estimate(state);
    expect(estimate.completionTokens).toBeGreaterThan(0);
    expect(estimate.promptTokens).toBeGreaterThan(0);
  });
});

describe("embeddings ↔ /v2/embed", () => {
  test("texts, input type (default search_document), float type, dimensions", () => {
    const req: EmbeddingsRequest = { model: "embedder", input: ["hello", "world"], dimensions: 256 };
    const call = embeddings.request(req, deployment({ upstreamModel: "embed-v4.0", apiKey: "k" }));
    expect(call.url).toBe("https://api.cohere.com/v2/embed");
    expect(JSON.parse(call.body!)).toEqual({ model: "embed-v4.0", texts: ["hello", "world"], input_type: "search_document", embedding_types: ["float"], output_dimension: 256 });
    const query = embeddings.request({ model: "embedder", input: "q", input_type: "search_query" } as EmbeddingsRequest, deployment({ upstreamModel: "embed-v4.0" }));
    expect((JSON.parse(query.body!) as WireJson).input_type).toBe("search_query");
    const configured = embeddings.request({ model: "embedder", input: "q" }, deployment({ upstreamModel: "embed-v4.0", options: { input_type: "classification" } }));
    expect((JSON.parse(configured.body!) as WireJson).input_type).toBe("classification");
    expect(() => embeddings.request({ model: "embedder", input: [1, 2, 3] }, deployment())).toThrow(/text input/);
    // At most 96 texts per call: more go in batches of 96, in order.
    const texts = Array.from({ length: 200 }, (_, i) => `t${i}`);
    expect(embeddings.split!({ model: "embedder", input: texts }, deployment())!.map((p) => p.input)).toEqual([texts.slice(0, 96), texts.slice(96, 192), texts.slice(192)]);
    expect(embeddings.split!({ model: "embedder", input: texts.slice(0, 96) }, deployment())).toBeUndefined();
  });

  test("embeddings by type → OpenAI's list, usage from billed units; base64 when asked", () => {
    const answer = {
      id: "da6e531f-54c6-4a73-bf92-f60566d8d753",
      texts: ["hello", "world"],
      embeddings: { float: [[0.25, -0.5], [1, 0.125]] },
      meta: { api_version: { version: "2" }, billed_units: { input_tokens: 2 } },
      response_type: "embeddings_by_type",
    };
    const { body, usage } = embeddings.response(answer, { model: "embedder", input: ["hello", "world"] });
    expect(body).toEqual({
      object: "list",
      data: [
        { object: "embedding", index: 0, embedding: [0.25, -0.5] },
        { object: "embedding", index: 1, embedding: [1, 0.125] },
      ],
      model: "embedder",
      usage: { prompt_tokens: 2, total_tokens: 2 },
    });
    expect(usage).toEqual({ promptTokens: 2, completionTokens: 0 });
    const b64 = embeddings.response(answer, { model: "embedder", input: ["hello", "world"], encoding_format: "base64" }).body;
    const first = (b64.data as WireJson[])[0]!.embedding as string;
    expect(Array.from(new Float32Array(Buffer.from(first, "base64").buffer.slice(0)))).toEqual([0.25, -0.5]);
  });
});

describe("errors", () => {
  test("Cohere's {id, message} body gives the message; too many tokens is a context-window error", () => {
    const tooLong = '{"id":"0a3b7f5e-1c0e-4d1a-9b8e-2f4c6d8e0a1b","message":"too many tokens: total number of tokens in the prompt cannot exceed 128000 - received 131372. Try using a shorter prompt, or enabling prompt truncating."}';
    expect(cohereProvider.errorMessage!(400, tooLong)).toStartWith("too many tokens: total number of tokens");
    expect(cohereProvider.errorKind!(400, tooLong)).toBe("context_window_exceeded");
    const rate = '{"id":"1","message":"You are using a Trial key, which is limited to 20 API calls / minute."}';
    expect(cohereProvider.errorMessage!(429, rate)).toBe("You are using a Trial key, which is limited to 20 API calls / minute.");
    expect(cohereProvider.errorKind!(429, rate)).toBeUndefined();
    expect(cohereProvider.errorKind!(400, '{"id":"2","message":"invalid request: unknown field: parameter top_p is not a valid field"}')).toBeUndefined();
  });

  test("cohere_chat/ is served by the same adapter", () => {
    expect(cohereProvider.ids).toEqual(["cohere", "cohere_chat"]);
  });
});
