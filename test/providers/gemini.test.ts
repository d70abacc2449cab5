// Golden tests of the Gemini (AI Studio) adapter, both directions: OpenAI requests → the
// GenerateContentRequest Google documents, and Google's responses, SSE streams (split anywhere,
// CRLF-framed as Google sends them) and error bodies → what an OpenAI client receives.
import { afterEach, describe, expect, test } from "bun:test";
import type { ChatRequest, Deployment, EmbeddingsRequest, EndpointAdapter, StreamPart, StreamTransform, WireJson } from "../../core/contract.ts";
import { geminiProvider } from "../../providers/gemini/index.ts";
import { PromptBlocked } from "../../providers/gemini/response.ts";
import { geminiSchema } from "../../providers/gemini/schema.ts";
import { cutAtCR, cutEvery, runStream } from "./run-stream.ts";

const chat = geminiProvider.endpoints.chat as EndpointAdapter<"chat", unknown>;
const embeddings = geminiProvider.endpoints.embeddings as EndpointAdapter<"embeddings", unknown>;
const stream = chat.stream as StreamTransform<"chat", unknown>;

function deployment(overrides: Partial<Deployment> = {}): Deployment {
  const base: Deployment = { id: "d1", modelName: "gem", provider: "gemini", upstreamModel: "gemini-2.5-flash", apiKey: "AIza-test-key", options: {}, info: {}, ...overrides };
  const resolved = geminiProvider.resolve!(base);
  if (typeof resolved === "string") throw new Error(resolved);
  return resolved;
}

const chatRequest = (body: Record<string, unknown>): ChatRequest => ({ model: "gem", messages: [{ role: "user", content: "Hi" }], ...body }) as ChatRequest;

/** The upstream body the adapter builds for `req`. */
function upstreamBody(req: ChatRequest, d = deployment()): WireJson {
  return JSON.parse(chat.request(req, d).body!) as WireJson;
}

const savedKey = process.env.GEMINI_API_KEY;
afterEach(() => {
  if (savedKey === undefined) delete process.env.GEMINI_API_KEY;
  else process.env.GEMINI_API_KEY = savedKey;
});

describe("request: URL and credentials", () => {
  test("generateContent on AI Studio's default host, the key in x-goog-api-key, nothing in the URL", () => {
    const call = chat.request(chatRequest({}), deployment());
    expect(call.url).toBe("https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent");
    expect(call.method).toBe("POST");
    expect(call.headers["x-goog-api-key"]).toBe("AIza-test-key");
    expect(call.headers["content-type"]).toBe("application/json");
    expect(call.url).not.toContain("key=");
  });

  test("a stream asks for SSE framing; api_base, api_version and a tuned model's resource name shape the URL", () => {
    expect(chat.request(chatRequest({ stream: true }), deployment()).url).toEndWith("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse");
    const d = deployment({ apiBase: "http://127.0.0.1:9/", apiVersion: "v1", upstreamModel: "tunedModels/my-model-7" });
    expect(chat.request(chatRequest({}), d).url).toBe("http://127.0.0.1:9/v1/tunedModels/my-model-7:generateContent");
  });

  test("the key defaults to GEMINI_API_KEY; svc_params.api_key wins over it", () => {
    process.env.GEMINI_API_KEY = "AIza-from-env";
    expect(chat.request(chatRequest({}), deployment({ apiKey: undefined })).headers["x-goog-api-key"]).toBe("AIza-from-env");
    expect(chat.request(chatRequest({}), deployment()).headers["x-goog-api-key"]).toBe("AIza-test-key");
  });
});

describe("request: messages", () => {
  test("system and developer messages become systemInstruction; user/assistant become user/model turns", () => {
    const body = upstreamBody(
      chatRequest({
        messages: [
          { role: "system", content: "You are terse." },
          { role: "developer", content: [{ type: "text", text: "Answer in French." }] },
          { role: "user", content: "Hello" },
          { role: "assistant", content: "Bonjour" },
          { role: "user", content: [{ type: "text", text: "How are you?" }, { type: "text", text: " Briefly." }] },
          { role: "user", content: "And the weather?" },
        ],
      }),
    );
    expect(body).toEqual({
      contents: [
        { role: "user", parts: [{ text: "Hello" }] },
        { role: "model", parts: [{ text: "Bonjour" }] },
        // Consecutive user messages are one turn, as Gemini expects.
        { role: "user", parts: [{ text: "How are you?" }, { text: " Briefly." }, { text: "And the weather?" }] },
      ],
      systemInstruction: { parts: [{ text: "You are terse." }, { text: "Answer in French." }] },
    });
  });

  test("instructions alone are sent as the user's turn: Gemini needs one", () => {
    expect(upstreamBody(chatRequest({ messages: [{ role: "system", content: "Write a haiku about rain." }] }))).toEqual({
      contents: [{ role: "user", parts: [{ text: "Write a haiku about rain." }] }],
    });
  });

  test("images: data URLs go inline, remote URLs by reference with their media type; audio and PDF files inline", () => {
    const body = upstreamBody(
      chatRequest({
        messages: [
          {
            role: "user",
            content: [
              { type: "text", text: "Compare these" },
              { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } },
              { type: "image_url", image_url: { url: "https://example.com/cat.JPG?size=large", detail: "high" } },
              { type: "image_url", image_url: { url: "gs://bucket/diagram.webp" } },
              { type: "input_audio", input_audio: { data: "UklGRg==", format: "wav" } },
              { type: "file", file: { file_data: "data:application/pdf;base64,JVBERi0x", filename: "a.pdf" } },
            ],
          },
        ],
      }),
    );
    expect(body.contents).toEqual([
      {
        role: "user",
        parts: [
          { text: "Compare these" },
          { inlineData: { mimeType: "image/png", data: "iVBORw0KGgo=" } },
          { fileData: { mimeType: "image/jpeg", fileUri: "https://example.com/cat.JPG?size=large" } },
          { fileData: { mimeType: "image/webp", fileUri: "gs://bucket/diagram.webp" } },
          { inlineData: { mimeType: "audio/wav", data: "UklGRg==" } },
          { inlineData: { mimeType: "application/pdf", data: "JVBERi0x" } },
        ],
      },
    ]);
  });

  test("tool calls become functionCall parts; results become functionResponse parts named after their call and with its id, in one turn", () => {
    const body = upstreamBody(
      chatRequest({
        messages: [
          { role: "user", content: "Weather in Paris and Rome?" },
          {
            role: "assistant",
            content: null,
            tool_calls: [
              { id: "call_a", type: "function", function: { name: "get_weather", arguments: '{"location":"Paris"}' } },
              { id: "call_b", type: "function", function: { name: "get_time", arguments: '{"city":"Rome"}' } },
            ],
          },
          { role: "tool", tool_call_id: "call_a", content: '{"temp_c":21}' },
          { role: "tool", tool_call_id: "call_b", content: "14:05" },
        ],
      }),
    );
    expect(body.contents).toEqual([
      { role: "user", parts: [{ text: "Weather in Paris and Rome?" }] },
      {
        role: "model",
        parts: [{ functionCall: { id: "call_a", name: "get_weather", args: { location: "Paris" } } }, { functionCall: { id: "call_b", name: "get_time", args: { city: "Rome" } } }],
      },
      {
        role: "user",
        parts: [
          { functionResponse: { id: "call_a", name: "get_weather", response: { temp_c: 21 } } },
          // Text results are wrapped: Gemini's response is an object.
          { functionResponse: { id: "call_b", name: "get_time", response: { content: "14:05" } } },
        ],
      },
    ]);
  });

  test("a call's thought signature, carried in the tool call id Gemini's answer produced, goes back with the call", () => {
    const answer = chat.response({
      candidates: [{ content: { role: "model", parts: [{ functionCall: { name: "lookup", args: { q: "x" } }, thoughtSignature: "CsQBAb4+9vt0" }] }, finishReason: "STOP", index: 0 }],
    });
    const call = ((answer.body.choices as WireJson[])[0]!.message as { tool_calls: { id: string; function: { name: string; arguments: string } }[] }).tool_calls[0]!;
    const body = upstreamBody(
      chatRequest({
        messages: [
          { role: "user", content: "Look up x" },
          { role: "assistant", content: null, tool_calls: [{ id: call.id, type: "function", function: call.function }] },
          { role: "tool", tool_call_id: call.id, content: "found" },
        ],
      }),
    );
    // The id Gemini is sent is the call's own, without the signature it carries.
    const id = call.id.slice(0, call.id.indexOf("__thought__"));
    expect(id).toMatch(/^call_[A-Za-z0-9]{24}$/);
    expect((body.contents as WireJson[])[1]).toEqual({ role: "model", parts: [{ functionCall: { id, name: "lookup", args: { q: "x" } }, thoughtSignature: "CsQBAb4+9vt0" }] });
    expect((body.contents as WireJson[])[2]).toEqual({ role: "user", parts: [{ functionResponse: { id, name: "lookup", response: { content: "found" } } }] });
  });

  test("parallel calls of one function: Gemini's functionCall ids are the tool call ids, and pair each result with its call when sent back", () => {
    const answer = chat.response({
      candidates: [
        {
          content: {
            role: "model",
            parts: [
              { functionCall: { id: "fc-paris", name: "get_weather", args: { location: "Paris" } }, thoughtSignature: "sig-1" },
              { functionCall: { id: "fc-rome", name: "get_weather", args: { location: "Rome" } } },
            ],
          },
          finishReason: "STOP",
          index: 0,
        },
      ],
    });
    const calls = ((answer.body.choices as WireJson[])[0]!.message as { tool_calls: { id: string; type: "function"; function: { name: string; arguments: string } }[] }).tool_calls;
    expect(calls.map((c) => c.id)).toEqual(["fc-paris__thought__sig-1", "fc-rome"]);
    const body = upstreamBody(
      chatRequest({
        messages: [
          { role: "user", content: "Weather in Paris and Rome?" },
          { role: "assistant", content: null, tool_calls: calls },
          // Answered in the other order: only the ids say which result is whose.
          { role: "tool", tool_call_id: "fc-rome", content: '{"temp_c":18}' },
          { role: "tool", tool_call_id: "fc-paris__thought__sig-1", content: '{"temp_c":21}' },
        ],
      }),
    );
    expect((body.contents as WireJson[]).slice(1)).toEqual([
      {
        role: "model",
        parts: [
          { functionCall: { id: "fc-paris", name: "get_weather", args: { location: "Paris" } }, thoughtSignature: "sig-1" },
          { functionCall: { id: "fc-rome", name: "get_weather", args: { location: "Rome" } } },
        ],
      },
      {
        role: "user",
        parts: [
          { functionResponse: { id: "fc-rome", name: "get_weather", response: { temp_c: 18 } } },
          { functionResponse: { id: "fc-paris", name: "get_weather", response: { temp_c: 21 } } },
        ],
      },
    ]);
  });

  test("a legacy function_call and its function result carry no id (OpenAI gives them none)", () => {
    const body = upstreamBody(
      chatRequest({
        messages: [
          { role: "user", content: "Weather?" },
          { role: "assistant", content: null, function_call: { name: "get_weather", arguments: '{"location":"Paris"}' } },
          { role: "function", name: "get_weather", content: '{"temp_c":21}' },
        ],
      }),
    );
    expect((body.contents as WireJson[]).slice(1)).toEqual([
      { role: "model", parts: [{ functionCall: { name: "get_weather", args: { location: "Paris" } } }] },
      { role: "user", parts: [{ functionResponse: { name: "get_weather", response: { temp_c: 21 } } }] },
    ]);
  });
});

describe("request: tools, tool choice, output format, generation settings", () => {
  const weather = {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather",
      parameters: {
        $schema: "http://json-schema.org/draft-07/schema#",
        type: "object",
        additionalProperties: false,
        properties: {
          location: { type: "string", description: "City" },
          unit: { type: ["string", "null"], enum: ["celsius", "fahrenheit", null] },
          when: { type: "string", format: "date-time" },
          site: { type: "string", format: "uri" },
        },
        required: ["location", "unit"],
      },
      strict: true,
    },
  };

  test("function tools become functionDeclarations with a Gemini schema; a tool without parameters declares none", () => {
    const body = upstreamBody(chatRequest({ tools: [weather, { type: "function", function: { name: "now", parameters: { type: "object", properties: {} } } }] }));
    expect(body.tools).toEqual([
      {
        functionDeclarations: [
          {
            name: "get_weather",
            description: "Current weather",
            parameters: {
              type: "OBJECT",
              properties: {
                location: { type: "STRING", description: "City" },
                unit: { type: "STRING", nullable: true, enum: ["celsius", "fahrenheit"] },
                when: { type: "STRING", format: "date-time" },
                site: { type: "STRING" },
              },
              required: ["location", "unit"],
            },
          },
          { name: "now" },
        ],
      },
    ]);
  });

  test("Gemini's own tools (googleSearch, codeExecution) pass as they are, next to the functions", () => {
    const body = upstreamBody(chatRequest({ tools: [weather, { googleSearch: {} }] as ChatRequest["tools"] }));
    expect((body.tools as WireJson[]).slice(1)).toEqual([{ googleSearch: {} }]);
  });

  test("tool_choice → functionCallingConfig", () => {
    const config = (choice: ChatRequest["tool_choice"]) => upstreamBody(chatRequest({ tools: [weather], tool_choice: choice })).toolConfig;
    expect(config("auto")).toEqual({ functionCallingConfig: { mode: "AUTO" } });
    expect(config("none")).toEqual({ functionCallingConfig: { mode: "NONE" } });
    expect(config("required")).toEqual({ functionCallingConfig: { mode: "ANY" } });
    expect(config({ type: "function", function: { name: "get_weather" } })).toEqual({ functionCallingConfig: { mode: "ANY", allowedFunctionNames: ["get_weather"] } });
    expect(upstreamBody(chatRequest({ tools: [weather] })).toolConfig).toBeUndefined();
  });

  test("response_format: json_object asks for JSON, json_schema adds the schema (references inlined, unknown keywords dropped)", () => {
    expect(upstreamBody(chatRequest({ response_format: { type: "json_object" } })).generationConfig).toEqual({ responseMimeType: "application/json" });
    const schema = {
      type: "object",
      properties: { people: { type: "array", items: { $ref: "#/$defs/person" } }, note: { anyOf: [{ type: "string" }, { type: "null" }] } },
      required: ["people", "note"],
      additionalProperties: false,
      $defs: { person: { type: "object", properties: { name: { type: "string" }, age: { type: "integer", minimum: 0 } }, required: ["name"], additionalProperties: false } },
    };
    const body = upstreamBody(chatRequest({ response_format: { type: "json_schema", json_schema: { name: "people", strict: true, schema } } }));
    expect(body.generationConfig).toEqual({
      responseMimeType: "application/json",
      responseSchema: {
        type: "OBJECT",
        properties: {
          people: { type: "ARRAY", items: { type: "OBJECT", properties: { name: { type: "STRING" }, age: { type: "INTEGER", minimum: 0 } }, required: ["name"] } },
          note: { type: "STRING", nullable: true },
        },
        required: ["people", "note"],
      },
    });
  });

  test("sampling and length settings map one to one; stop becomes a list; reasoning_effort sets a thinking budget", () => {
    const body = upstreamBody(
      chatRequest({ temperature: 0.2, top_p: 0.9, top_k: 20, max_completion_tokens: 300, max_tokens: 50, stop: "END", n: 2, seed: 7, presence_penalty: 0.5, frequency_penalty: -0.5, reasoning_effort: "low" } as never),
    );
    expect(body.generationConfig).toEqual({
      temperature: 0.2,
      topP: 0.9,
      topK: 20,
      maxOutputTokens: 300,
      stopSequences: ["END"],
      candidateCount: 2,
      seed: 7,
      presencePenalty: 0.5,
      frequencyPenalty: -0.5,
      thinkingConfig: { includeThoughts: true, thinkingBudget: 1024 },
    });
    expect((upstreamBody(chatRequest({ reasoning_effort: "none" })).generationConfig as WireJson).thinkingConfig).toEqual({ thinkingBudget: 0 });
  });

  test("a reasoning_effort OpenAI does not know is the client's 400 naming the levels, not an answer without thinking", () => {
    expect(() => upstreamBody(chatRequest({ reasoning_effort: "extreme" } as never))).toThrow(/gemini: reasoning_effort "extreme" is not one of none, minimal, low, medium, high/);
  });

  test("the parameters it translates are declared; OpenAI-only ones are not", () => {
    expect(chat.supportedParams).toContain("response_format");
    expect(chat.supportedParams).toContain("reasoning_effort");
    expect(chat.supportedParams).not.toContain("logit_bias");
    expect(chat.supportedParams).not.toContain("logprobs");
  });
});

describe("schema conversion", () => {
  test("type lists, const, recursive references and unsupported keywords", () => {
    expect(
      geminiSchema({
        type: "object",
        properties: {
          kind: { const: "node" },
          child: { $ref: "#/definitions/node" },
          tags: { type: "array", items: { type: "string" }, uniqueItems: true },
          score: { type: ["number", "string"] },
        },
        definitions: { node: { type: "object", properties: { child: { $ref: "#/definitions/node" } } } },
      }),
    ).toEqual({
      type: "OBJECT",
      properties: {
        kind: { type: "STRING", enum: ["node"] },
        // The recursion is cut at a fixed depth: Gemini's schema has no references.
        child: expect.objectContaining({ type: "OBJECT" }),
        tags: { type: "ARRAY", items: { type: "STRING" } },
        score: { anyOf: [{ type: "NUMBER" }, { type: "STRING" }] },
      },
    });
  });
});

// ---------------------------------------------------------------------------------------------
// Responses

describe("response → chat.completion", () => {
  test("text answer: id from responseId, model version, usage with cached and thinking tokens inside the totals", () => {
    const { body, usage } = chat.response({
      candidates: [
        {
          content: { parts: [{ text: "I should greet.", thought: true }, { text: "Hello! " }, { text: "How can I help?" }], role: "model" },
          finishReason: "STOP",
          avgLogprobs: -0.21,
          index: 0,
        },
      ],
      usageMetadata: {
        promptTokenCount: 120,
        candidatesTokenCount: 8,
        totalTokenCount: 153,
        cachedContentTokenCount: 100,
        thoughtsTokenCount: 25,
        promptTokensDetails: [{ modality: "TEXT", tokenCount: 120 }],
      },
      modelVersion: "gemini-2.5-flash",
      responseId: "mAitaLmkHPPlz7IPvtfUqQ4",
    });
    expect(body).toEqual({
      id: "mAitaLmkHPPlz7IPvtfUqQ4",
      object: "chat.completion",
      created: expect.any(Number),
      model: "gemini-2.5-flash",
      choices: [
        {
          index: 0,
          message: { role: "assistant", content: "Hello! How can I help?", reasoning_content: "I should greet.", refusal: null },
          logprobs: null,
          finish_reason: "stop",
        },
      ],
      usage: {
        prompt_tokens: 120,
        completion_tokens: 33,
        total_tokens: 153,
        prompt_tokens_details: { cached_tokens: 100 },
        completion_tokens_details: { reasoning_tokens: 25 },
        cache_read_input_tokens: 100,
      },
    });
    expect(usage).toEqual({ promptTokens: 120, completionTokens: 33, cachedPromptTokens: 100, reasoningTokens: 25 });
  });

  test("function calls → tool_calls with fresh ids and JSON arguments, finish tool_calls", () => {
    const { body } = chat.response({
      candidates: [
        {
          content: {
            parts: [{ functionCall: { name: "get_weather", args: { location: "Paris", unit: "celsius" } } }, { functionCall: { name: "get_time", args: {} } }],
            role: "model",
          },
          finishReason: "STOP",
          index: 0,
        },
      ],
      usageMetadata: { promptTokenCount: 40, candidatesTokenCount: 12, totalTokenCount: 52 },
      modelVersion: "gemini-2.5-pro",
    });
    const choice = (body.choices as WireJson[])[0]!;
    expect(choice.finish_reason).toBe("tool_calls");
    const message = choice.message as { content: unknown; tool_calls: { id: string; type: string; function: { name: string; arguments: string } }[] };
    expect(message.content).toBeNull();
    expect(message.tool_calls.map((c) => c.function)).toEqual([
      { name: "get_weather", arguments: '{"location":"Paris","unit":"celsius"}' },
      { name: "get_time", arguments: "{}" },
    ]);
    for (const c of message.tool_calls) {
      expect(c.type).toBe("function");
      expect(c.id).toMatch(/^call_[A-Za-z0-9]{24}$/);
    }
    expect(message.tool_calls[0]!.id).not.toBe(message.tool_calls[1]!.id);
    // Without a responseId Gemini's answer still gets an OpenAI-style id.
    expect(body.id).toMatch(/^chatcmpl-/);
  });

  test("finish reasons: MAX_TOKENS → length, Google's filters → content_filter; several candidates → several choices", () => {
    const finish = (reason: string) =>
      ((chat.response({ candidates: [{ content: { parts: [{ text: "x" }], role: "model" }, finishReason: reason, index: 0 }] }).body.choices as WireJson[])[0]!.finish_reason);
    expect(finish("STOP")).toBe("stop");
    expect(finish("MAX_TOKENS")).toBe("length");
    for (const r of ["SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII"]) expect(finish(r)).toBe("content_filter");
    expect(finish("OTHER")).toBe("stop");

    const { body } = chat.response({
      candidates: [
        { content: { parts: [{ text: "second" }], role: "model" }, finishReason: "STOP", index: 1 },
        { content: { parts: [{ text: "first" }], role: "model" }, finishReason: "MAX_TOKENS", index: 0 },
      ],
    });
    expect((body.choices as WireJson[]).map((c) => [c.index, (c.message as WireJson).content, c.finish_reason])).toEqual([
      [0, "first", "length"],
      [1, "second", "stop"],
    ]);
  });

  test("an answer stopped by the safety filter before any text has null content", () => {
    const { body } = chat.response({ candidates: [{ finishReason: "SAFETY", index: 0, safetyRatings: [{ category: "HARM_CATEGORY_HARASSMENT", probability: "HIGH", blocked: true }] }] });
    expect((body.choices as WireJson[])[0]).toEqual({ index: 0, message: { role: "assistant", content: null, refusal: null }, logprobs: null, finish_reason: "content_filter" });
  });

  test("a prompt Gemini blocked is a content-policy refusal, not an empty answer", () => {
    const blocked = {
      promptFeedback: { blockReason: "PROHIBITED_CONTENT", blockReasonMessage: "The prompt was blocked." },
      usageMetadata: { promptTokenCount: 9, totalTokenCount: 9 },
      modelVersion: "gemini-2.5-flash",
    };
    let error: unknown;
    try {
      chat.response(blocked);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(PromptBlocked);
    expect((error as PromptBlocked).kind).toBe("content_policy_violation");
    expect((error as Error).message).toContain("PROHIBITED_CONTENT");
  });

  test("an answer with no candidates and no block reason is an error, not an empty choices list", () => {
    expect(() => chat.response({ usageMetadata: { promptTokenCount: 9, totalTokenCount: 9 }, modelVersion: "gemini-2.5-flash" })).toThrow(/no candidates/);
    expect(() => chat.response({ candidates: [], modelVersion: "gemini-2.5-flash" })).toThrow(/no candidates/);
  });
});

// ---------------------------------------------------------------------------------------------
// Streams

/** Upstream bytes, cut into `pieces`, through the core's SSE parser and the adapter. */
const run = (req: ChatRequest, pieces: string[]) => runStream(stream, req, pieces);

const chunks = (parts: StreamPart[]) => parts.filter((p): p is Extract<StreamPart, { type: "chunk" }> => p.type === "chunk").map((p) => p.chunk as { id: string; model: string; choices: WireJson[]; usage?: WireJson });

/** Google's SSE: one compact JSON per event, CRLF framing (as captured from streamGenerateContent?alt=sse). */
const TEXT_STREAM = [
  'data: {"candidates": [{"content": {"parts": [{"text": "The"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 11,"totalTokenCount": 11,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 11}]},"modelVersion": "gemini-2.0-flash","responseId": "b0P5aPvLM8WZ1dkP2bC4gQM"}\r\n\r\n',
  'data: {"candidates": [{"content": {"parts": [{"text": " sky is blue \\"because\\" of"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 11,"totalTokenCount": 11,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 11}]},"modelVersion": "gemini-2.0-flash","responseId": "b0P5aPvLM8WZ1dkP2bC4gQM"}\r\n\r\n',
  'data: {"candidates": [{"content": {"parts": [{"text": " Rayleigh scattering."}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 11,"candidatesTokenCount": 9,"totalTokenCount": 20,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 11}],"candidatesTokensDetails": [{"modality": "TEXT","tokenCount": 9}]},"modelVersion": "gemini-2.0-flash","responseId": "b0P5aPvLM8WZ1dkP2bC4gQM"}\r\n\r\n',
].join("");

describe("stream → chat.completion.chunk", () => {
  const req = chatRequest({ stream: true, stream_options: { include_usage: true } });

  test("text: role on the first chunk, deltas in order, a finish chunk, then the usage chunk; id is the responseId", () => {
    const { parts } = run(req, [TEXT_STREAM]);
    const out = chunks(parts);
    expect(out.map((c) => c.choices[0]?.delta)).toEqual([{ role: "assistant", content: "The" }, { content: ' sky is blue "because" of' }, { content: " Rayleigh scattering." }, {}, undefined]);
    expect(out.map((c) => c.choices[0]?.finish_reason ?? null)).toEqual([null, null, null, "stop", null]);
    const last = out.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toMatchObject({ prompt_tokens: 11, completion_tokens: 9, total_tokens: 20 });
    for (const c of out) {
      expect(c.id).toBe("b0P5aPvLM8WZ1dkP2bC4gQM");
      expect(c.model).toBe("gemini-2.0-flash");
      expect((c as unknown as WireJson).object).toBe("chat.completion.chunk");
    }
    expect(parts.filter((p) => p.type === "usage")).toEqual([{ type: "usage", usage: { promptTokens: 11, completionTokens: 9 } }]);
  });

  test("the same bytes split anywhere — mid-JSON, between \\r and \\n, inside an escape — give the same chunks", () => {
    const whole = chunks(run(req, [TEXT_STREAM]).parts).map((c) => c.choices);
    const crlf = TEXT_STREAM.indexOf("\r\n\r\n");
    const splits = [
      [TEXT_STREAM.slice(0, 37), TEXT_STREAM.slice(37)],
      [TEXT_STREAM.slice(0, crlf + 1), TEXT_STREAM.slice(crlf + 1)],
      [TEXT_STREAM.slice(0, crlf + 3), TEXT_STREAM.slice(crlf + 3)],
      [TEXT_STREAM.slice(0, TEXT_STREAM.indexOf('\\"because') + 1), TEXT_STREAM.slice(TEXT_STREAM.indexOf('\\"because') + 1)],
      cutEvery(TEXT_STREAM, 7),
      cutAtCR(TEXT_STREAM),
    ];
    for (const pieces of splits) expect(chunks(run(req, pieces).parts).map((c) => c.choices)).toEqual(whole);
  });

  test("function calls arrive whole: one tool-call delta each, numbered per choice, finish tool_calls", () => {
    const events = [
      { candidates: [{ content: { parts: [{ functionCall: { name: "get_weather", args: { location: "Paris" } } }], role: "model" }, index: 0 }], modelVersion: "gemini-2.5-flash", responseId: "r1" },
      {
        candidates: [{ content: { parts: [{ functionCall: { name: "get_weather", args: { location: "Rome" } } }], role: "model" }, finishReason: "STOP", index: 0 }],
        usageMetadata: { promptTokenCount: 30, candidatesTokenCount: 16, totalTokenCount: 46 },
        modelVersion: "gemini-2.5-flash",
        responseId: "r1",
      },
    ];
    const out = chunks(run(req, events.map((e) => `data: ${JSON.stringify(e)}\r\n\r\n`)).parts);
    const deltas = out.map((c) => c.choices[0]?.delta as WireJson | undefined);
    const calls = deltas.slice(0, 2).map((d) => (d!.tool_calls as WireJson[])[0] as { index: number; id: string; type: string; function: WireJson });
    expect(deltas[0]).toMatchObject({ role: "assistant", content: null });
    expect(calls.map((c) => [c.index, c.type, c.function])).toEqual([
      [0, "function", { name: "get_weather", arguments: '{"location":"Paris"}' }],
      [1, "function", { name: "get_weather", arguments: '{"location":"Rome"}' }],
    ]);
    expect(calls[0]!.id).toMatch(/^call_/);
    expect(calls[0]!.id).not.toBe(calls[1]!.id);
    expect(out[2]!.choices[0]).toEqual({ index: 0, delta: {}, logprobs: null, finish_reason: "tool_calls" });
  });

  test("a streamed function call's Gemini id is its tool call id", () => {
    const event = {
      candidates: [{ content: { parts: [{ functionCall: { id: "fc-1", name: "get_weather", args: { location: "Paris" } } }], role: "model" }, finishReason: "STOP", index: 0 }],
      usageMetadata: { promptTokenCount: 30, candidatesTokenCount: 8, totalTokenCount: 38 },
    };
    const out = chunks(run(req, [`data: ${JSON.stringify(event)}\r\n\r\n`]).parts);
    expect((out[0]!.choices[0]!.delta as { tool_calls: WireJson[] }).tool_calls[0]).toMatchObject({ index: 0, id: "fc-1", type: "function" });
  });

  test("thought parts stream as reasoning_content; thinking tokens count as reasoning inside completion", () => {
    const events = [
      { candidates: [{ content: { parts: [{ text: "**Planning** the answer", thought: true }], role: "model" }, index: 0 }], responseId: "r2" },
      {
        candidates: [{ content: { parts: [{ text: "42" }], role: "model" }, finishReason: "STOP", index: 0 }],
        usageMetadata: { promptTokenCount: 5, candidatesTokenCount: 1, thoughtsTokenCount: 50, totalTokenCount: 56 },
        responseId: "r2",
      },
    ];
    const { parts } = run(req, events.map((e) => `data: ${JSON.stringify(e)}\r\n\r\n`));
    expect(chunks(parts).map((c) => c.choices[0]?.delta)).toEqual([{ role: "assistant", reasoning_content: "**Planning** the answer" }, { content: "42" }, {}, undefined]);
    expect(parts.find((p) => p.type === "usage")).toEqual({ type: "usage", usage: { promptTokens: 5, completionTokens: 51, reasoningTokens: 50 } });
    expect(chunks(parts).at(-1)!.usage).toMatchObject({ completion_tokens: 51, completion_tokens_details: { reasoning_tokens: 50 } });
  });

  test("several candidates (n): each choice its own role chunk, tool numbering and finish; one usage chunk after both", () => {
    const events = [
      { candidates: [{ content: { parts: [{ text: "A1" }], role: "model" }, index: 0 }, { content: { parts: [{ text: "B1" }], role: "model" }, index: 1 }], responseId: "rn" },
      {
        candidates: [
          { content: { parts: [{ text: "A2" }], role: "model" }, finishReason: "STOP", index: 0 },
          { content: { parts: [{ text: "B2" }], role: "model" }, finishReason: "MAX_TOKENS", index: 1 },
        ],
        usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 4, totalTokenCount: 7 },
        responseId: "rn",
      },
    ];
    const out = chunks(run(chatRequest({ stream: true, n: 2, stream_options: { include_usage: true } }), events.map((e) => `data: ${JSON.stringify(e)}\r\n\r\n`)).parts);
    expect(out.map((c) => (c.choices[0] ? [c.choices[0].index, c.choices[0].delta, c.choices[0].finish_reason] : "usage"))).toEqual([
      [0, { role: "assistant", content: "A1" }, null],
      [1, { role: "assistant", content: "B1" }, null],
      [0, { content: "A2" }, null],
      [0, {}, "stop"],
      [1, { content: "B2" }, null],
      [1, {}, "length"],
      "usage",
    ]);
  });

  test("several candidates, the first finished before the second starts: no usage and no complete answer until the second finishes", () => {
    const nReq = chatRequest({ stream: true, n: 2, stream_options: { include_usage: true } });
    const first = { candidates: [{ content: { parts: [{ text: "A" }], role: "model" }, finishReason: "STOP", index: 0 }], usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 1, totalTokenCount: 4 }, responseId: "rn" };
    const second = { candidates: [{ content: { parts: [{ text: "B" }], role: "model" }, finishReason: "STOP", index: 1 }], usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 2, totalTokenCount: 5 }, responseId: "rn" };
    const sse = (e: unknown) => `data: ${JSON.stringify(e)}\r\n\r\n`;
    const cut = run(nReq, [sse(first)]);
    expect(cut.parts.some((p) => p.type === "usage")).toBe(false);
    expect(stream.complete!(cut.state)).toBe(false);
    const whole = run(nReq, [sse(first), sse(second)]);
    expect(stream.complete!(whole.state)).toBe(true);
    expect(whole.parts.filter((p) => p.type === "usage")).toEqual([{ type: "usage", usage: { promptTokens: 3, completionTokens: 2 } }]);
    const usageChunks = chunks(whole.parts).filter((c) => c.usage);
    expect(usageChunks).toHaveLength(1);
    expect(usageChunks[0]!.usage).toMatchObject({ prompt_tokens: 3, completion_tokens: 2 });
    expect(chunks(whole.parts).at(-1)).toBe(usageChunks[0]!);
  });

  test("without include_usage there is no usage chunk, but the gateway still records Gemini's usage", () => {
    const { parts } = run(chatRequest({ stream: true }), [TEXT_STREAM]);
    expect(chunks(parts).every((c) => c.choices.length === 1)).toBe(true);
    expect(parts.some((p) => p.type === "usage")).toBe(true);
  });

  test("a stream cut before the final event: prompt as reported, output estimated from what was streamed", () => {
    const cut = TEXT_STREAM.slice(0, TEXT_STREAM.lastIndexOf("data:"));
    const { parts, state } = run(req, [cut]);
    expect(parts.some((p) => p.type === "usage")).toBe(false);
    expect(stream.estimate(state)).toEqual({ promptTokens: 11, completionTokens: Math.ceil("The sky is blue \"because\" of".length / 4) });
    expect(stream.responseId?.(state)).toBe("b0P5aPvLM8WZ1dkP2bC4gQM");
  });

  test("a prompt blocked at the start of a stream ends it with a content-policy error", () => {
    const blocked = 'data: {"promptFeedback": {"blockReason": "SAFETY","safetyRatings": [{"category": "HARM_CATEGORY_DANGEROUS_CONTENT","probability": "HIGH"}]},"usageMetadata": {"promptTokenCount": 8,"totalTokenCount": 8},"modelVersion": "gemini-2.5-flash"}\r\n\r\n';
    const { parts } = run(req, [blocked]);
    expect(parts).toEqual([{ type: "error", error: { status: 400, type: "content_policy_violation", message: expect.stringContaining("blockReason SAFETY") } }]);
  });

  test("an error event mid-stream ends it with Google's message", () => {
    const { parts } = run(req, [TEXT_STREAM.slice(0, TEXT_STREAM.indexOf("\r\n\r\n") + 4), 'data: {"error": {"code": 503,"message": "The model is overloaded. Please try again later.","status": "UNAVAILABLE"}}\r\n\r\n']);
    expect(parts.at(-1)).toEqual({ type: "error", error: { status: 503, type: "api_error", message: "Gemini stream error (UNAVAILABLE): The model is overloaded. Please try again later." } });
  });
});

// ---------------------------------------------------------------------------------------------
// Embeddings, token counting, errors

describe("embeddings", () => {
  const req = (body: Partial<EmbeddingsRequest>): EmbeddingsRequest => ({ model: "emb", input: ["first text", "second"], ...body }) as EmbeddingsRequest;
  const d = deployment({ upstreamModel: "gemini-embedding-001", options: { task_type: "RETRIEVAL_DOCUMENT" } });

  test("request: batchEmbedContents, one request per input with the model's resource name, dimensions and task type", () => {
    const call = embeddings.request(req({ dimensions: 256 }), d);
    expect(call.url).toBe("https://generativelanguage.googleapis.com/v1beta/models/gemini-embedding-001:batchEmbedContents");
    expect(JSON.parse(call.body!)).toEqual({
      requests: [
        { model: "models/gemini-embedding-001", content: { parts: [{ text: "first text" }] }, taskType: "RETRIEVAL_DOCUMENT", outputDimensionality: 256 },
        { model: "models/gemini-embedding-001", content: { parts: [{ text: "second" }] }, taskType: "RETRIEVAL_DOCUMENT", outputDimensionality: 256 },
      ],
    });
  });

  test("more than 100 texts (one batchEmbedContents call's most) go in batches of 100, in order", () => {
    const texts = Array.from({ length: 230 }, (_, i) => `text ${i}`);
    const parts = embeddings.split!(req({ input: texts }), d)!;
    expect(parts.map((p) => p.input)).toEqual([texts.slice(0, 100), texts.slice(100, 200), texts.slice(200)]);
    expect(embeddings.split!(req({ input: texts.slice(0, 100) }), d)).toBeUndefined();
  });

  test("token-id input is refused: Gemini embeds text", () => {
    expect(() => embeddings.request(req({ input: [1, 2, 3] }), d)).toThrow(/text input/);
  });

  test("response: OpenAI's list; Google's token count when reported, else an estimate from the input", () => {
    const body = { embeddings: [{ values: [0.25, -0.5] }, { values: [1, 0] }] };
    // As the core calls it: with the client's request, for what Google's answer does not say.
    const r = embeddings.response(body, req({}));
    expect(r.body).toEqual({
      object: "list",
      data: [
        { object: "embedding", index: 0, embedding: [0.25, -0.5] },
        { object: "embedding", index: 1, embedding: [1, 0] },
      ],
      model: "emb",
      usage: { prompt_tokens: 4, total_tokens: 4 }, // 16 characters, at four per token
    });
    expect(embeddings.response({ ...body, usageMetadata: { promptTokenCount: 7, totalTokenCount: 7 } }, req({})).usage).toEqual({ promptTokens: 7, completionTokens: 0 });
    const b64 = embeddings.response(body, req({ encoding_format: "base64" })).body.data as { embedding: string }[];
    expect(Array.from(new Float32Array(Buffer.from(b64[0]!.embedding, "base64").buffer.slice(0)))).toEqual([0.25, -0.5]);
  });
});

describe("countTokens", () => {
  test("AI Studio counts a whole generateContentRequest (system instruction and tools included) → totalTokens", () => {
    const counter = geminiProvider.countTokens!;
    const call = counter.request(chatRequest({ messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }], max_tokens: 10 }), deployment());
    expect(call.url).toBe("https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:countTokens");
    expect(JSON.parse(call.body!)).toEqual({
      generateContentRequest: {
        model: "models/gemini-2.5-flash",
        contents: [{ role: "user", parts: [{ text: "Hi" }] }],
        systemInstruction: { parts: [{ text: "Be brief." }] },
        generationConfig: { maxOutputTokens: 10 },
      },
    });
    expect(counter.response({ totalTokens: 31, promptTokensDetails: [{ modality: "TEXT", tokenCount: 31 }] })).toBe(31);
    // Google leaves zero-valued fields out.
    expect(counter.response({})).toBe(0);
  });
});

describe("errors", () => {
  const message = geminiProvider.errorMessage!;
  const kind = geminiProvider.errorKind!;
  const body = (code: number, msg: string, status: string) => JSON.stringify({ error: { code, message: msg, status } }, null, 2);

  test("Google's error body → its message (also when Vertex wraps it in an array); other text as it is", () => {
    expect(message(400, body(400, "API key not valid. Please pass a valid API key.", "INVALID_ARGUMENT"))).toBe("API key not valid. Please pass a valid API key.");
    expect(message(429, JSON.stringify([{ error: { code: 429, message: "Resource exhausted. Please try again later.", status: "RESOURCE_EXHAUSTED" } }]))).toBe("Resource exhausted. Please try again later.");
    expect(message(502, "<html>Bad Gateway</html>")).toBe("<html>Bad Gateway</html>");
  });

  test("an over-long prompt is a context-window error; a safety refusal a content-policy one; other 400s neither", () => {
    expect(kind(400, body(400, "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).", "INVALID_ARGUMENT"))).toBe("context_window_exceeded");
    expect(kind(400, body(400, "The prompt could not be submitted. This prompt contains sensitive words that violate Google's Responsible AI practices.", "INVALID_ARGUMENT"))).toBe("content_policy_violation");
    expect(kind(400, body(400, "Image generation was blocked due to safety reasons.", "INVALID_ARGUMENT"))).toBe("content_policy_violation");
    expect(kind(400, body(400, "API key not valid. Please pass a valid API key.", "INVALID_ARGUMENT"))).toBeUndefined();
    expect(kind(500, body(500, "The input token count (5) exceeds the maximum number of tokens allowed (1).", "INTERNAL"))).toBeUndefined();
  });
});
