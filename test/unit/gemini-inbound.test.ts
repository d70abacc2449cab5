// Gemini-style inbound translation, both ways: a GenerateContentRequest (as the Gemini API reference
// writes it, camelCase and snake_case) → the gateway's OpenAI chat request; an OpenAI chat
// completion → GenerateContentResponse; OpenAI chunks → Gemini stream chunks, SSE or JSON array,
// with the gateway's stream split mid-JSON and across \r\n.
import { describe, expect, test } from "bun:test";
import { GeminiChunks } from "../../core/gemini-inbound/chunks.ts";
import { billableCharacters, countTokensResponse } from "../../core/gemini-inbound/count.ts";
import { googleErrorBody, googleStatus } from "../../core/gemini-inbound/errors.ts";
import { geminiToChat, renderOptions } from "../../core/gemini-inbound/request.ts";
import { chatToGemini } from "../../core/gemini-inbound/response.ts";
import { toJsonSchema } from "../../core/gemini-inbound/schema.ts";
import { geminiStream } from "../../core/gemini-inbound/stream.ts";
import { GatewayError } from "../../core/errors.ts";

const PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

function refusal(fn: () => unknown): GatewayError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    return err as GatewayError;
  }
  throw new Error("expected a refusal");
}

describe("Gemini request → OpenAI chat request", () => {
  test("a full request: system, media, a function-calling round, tools, toolConfig, generationConfig", () => {
    const body = {
      systemInstruction: { parts: [{ text: "You are terse." }, { text: "Answer in French." }] },
      contents: [
        { role: "user", parts: [{ text: "What is in this picture, and what's the weather in Paris?" }, { inlineData: { mimeType: "image/png", data: PNG_B64 } }] },
        {
          role: "model",
          parts: [
            { text: "A dot. Checking the weather.", thoughtSignature: "c2ln" },
            { text: "(thinking about it)", thought: true },
            { functionCall: { name: "get_weather", args: { location: "Paris" } } },
          ],
        },
        { role: "user", parts: [{ functionResponse: { name: "get_weather", response: { temperature: 21, unit: "celsius" } } }, { text: "And tomorrow?" }] },
      ],
      tools: [
        {
          functionDeclarations: [
            {
              name: "get_weather",
              description: "Current weather for a place",
              parameters: {
                type: "OBJECT",
                properties: {
                  location: { type: "STRING", description: "City name" },
                  unit: { type: "STRING", enum: ["celsius", "fahrenheit"], nullable: true },
                  days: { type: "ARRAY", items: { type: "INTEGER" }, minItems: "1", maxItems: "7" },
                },
                required: ["location"],
                propertyOrdering: ["location", "unit", "days"],
              },
            },
          ],
        },
      ],
      toolConfig: { functionCallingConfig: { mode: "ANY", allowedFunctionNames: ["get_weather"] } },
      generationConfig: {
        temperature: 0.3,
        topP: 0.9,
        topK: 40,
        maxOutputTokens: 256,
        stopSequences: ["END"],
        candidateCount: 2,
        seed: 42,
        presencePenalty: 0.5,
        frequencyPenalty: 0.25,
        thinkingConfig: { thinkingBudget: 2048, includeThoughts: true },
      },
      safetySettings: [{ category: "HARM_CATEGORY_HATE_SPEECH", threshold: "BLOCK_NONE" }],
    };
    expect(geminiToChat(body, "gpt-public", false)).toEqual({
      model: "gpt-public",
      messages: [
        { role: "system", content: "You are terse.\nAnswer in French." },
        {
          role: "user",
          content: [
            { type: "text", text: "What is in this picture, and what's the weather in Paris?" },
            { type: "image_url", image_url: { url: `data:image/png;base64,${PNG_B64}` } },
          ],
        },
        {
          role: "assistant",
          content: "A dot. Checking the weather.",
          tool_calls: [{ id: "call_0_get_weather", type: "function", function: { name: "get_weather", arguments: '{"location":"Paris"}' } }],
        },
        { role: "tool", tool_call_id: "call_0_get_weather", content: '{"temperature":21,"unit":"celsius"}' },
        { role: "user", content: "And tomorrow?" },
      ],
      temperature: 0.3,
      top_p: 0.9,
      max_tokens: 256,
      n: 2,
      seed: 42,
      presence_penalty: 0.5,
      frequency_penalty: 0.25,
      stop: ["END"],
      reasoning_effort: "medium",
      tools: [
        {
          type: "function",
          function: {
            name: "get_weather",
            description: "Current weather for a place",
            parameters: {
              type: "object",
              properties: {
                location: { type: "string", description: "City name" },
                unit: { type: ["string", "null"], enum: ["celsius", "fahrenheit"] },
                days: { type: "array", items: { type: "integer" }, minItems: 1, maxItems: 7 },
              },
              required: ["location"],
            },
          },
        },
      ],
      tool_choice: { type: "function", function: { name: "get_weather" } },
    } as never);
    expect(renderOptions(body)).toEqual({ includeThoughts: true });
  });

  test("snake_case field names (valid proto JSON, used in Google's curl examples) read the same", () => {
    const body = {
      system_instruction: { parts: [{ text: "Be brief." }] },
      contents: [{ role: "user", parts: [{ text: "Describe" }, { inline_data: { mime_type: "image/jpeg", data: "AAAA" } }] }],
      tools: [{ function_declarations: [{ name: "noop", parameters_json_schema: { type: "object", properties: {} } }] }],
      tool_config: { function_calling_config: { mode: "NONE" } },
      generation_config: { max_output_tokens: 5, stop_sequences: ["x"], response_mime_type: "application/json" },
    };
    const req = geminiToChat(body, "m", false);
    expect(req.messages as unknown[]).toEqual([
      { role: "system", content: "Be brief." },
      { role: "user", content: [{ type: "text", text: "Describe" }, { type: "image_url", image_url: { url: "data:image/jpeg;base64,AAAA" } }] },
    ]);
    expect(req.tools).toEqual([{ type: "function", function: { name: "noop", parameters: { type: "object", properties: {} } } }]);
    expect(req.tool_choice).toBe("none");
    expect(req.max_tokens).toBe(5);
    expect(req.stop).toEqual(["x"]);
    expect(req.response_format).toEqual({ type: "json_object" });
  });

  test("ids given by the client are kept; responses without ids answer the oldest open call of that name", () => {
    const req = geminiToChat(
      {
        contents: [
          { role: "user", parts: [{ text: "weather in Paris and Rome, then the time" }] },
          {
            role: "model",
            parts: [
              { functionCall: { name: "get_weather", args: { location: "Paris" } } },
              { functionCall: { name: "get_weather", args: { location: "Rome" } } },
              { functionCall: { id: "call_time_1", name: "get_time", args: {} } },
            ],
          },
          {
            role: "user",
            parts: [
              { functionResponse: { id: "call_time_1", name: "get_time", response: { time: "12:00" } } },
              { functionResponse: { name: "get_weather", response: { temperature: 21 } } },
              { functionResponse: { name: "get_weather", response: { temperature: 25 } } },
            ],
          },
        ],
      },
      "m",
      false,
    );
    const assistant = req.messages[1]!;
    const ids = (assistant.tool_calls as { id: string }[]).map((c) => c.id);
    expect(ids).toEqual(["call_0_get_weather", "call_1_get_weather", "call_time_1"]);
    expect(req.messages.slice(2)).toEqual([
      { role: "tool", tool_call_id: "call_time_1", content: '{"time":"12:00"}' },
      { role: "tool", tool_call_id: "call_0_get_weather", content: '{"temperature":21}' },
      { role: "tool", tool_call_id: "call_1_get_weather", content: '{"temperature":25}' },
    ]);
  });

  test("responseSchema and responseJsonSchema become a json_schema response_format", () => {
    const withSchema = geminiToChat(
      { contents: [{ parts: [{ text: "x" }] }], generationConfig: { responseMimeType: "application/json", responseSchema: { type: "OBJECT", properties: { a: { type: "NUMBER" } } } } },
      "m",
      false,
    );
    expect(withSchema.response_format).toEqual({ type: "json_schema", json_schema: { name: "response", schema: { type: "object", properties: { a: { type: "number" } } } } });
    const jsonSchema = { type: "object", properties: { b: { type: "string" } }, additionalProperties: false };
    const withJsonSchema = geminiToChat({ contents: [{ parts: [{ text: "x" }] }], generationConfig: { responseMimeType: "application/json", responseJsonSchema: jsonSchema } }, "m", false);
    expect(withJsonSchema.response_format).toEqual({ type: "json_schema", json_schema: { name: "response", schema: jsonSchema } });
  });

  test("thinking: a level is passed as is, budgets map to none/low/medium/high, -1 leaves the default", () => {
    const effort = (thinkingConfig: object) => (geminiToChat({ contents: [{ parts: [{ text: "x" }] }], generationConfig: { thinkingConfig } }, "m", false) as { reasoning_effort?: string }).reasoning_effort;
    expect(effort({ thinkingLevel: "HIGH" })).toBe("high");
    expect(effort({ thinkingBudget: 512 })).toBe("low");
    expect(effort({ thinkingBudget: 1024 })).toBe("low");
    expect(effort({ thinkingBudget: 2048 })).toBe("medium");
    expect(effort({ thinkingBudget: 24576 })).toBe("high");
    expect(effort({ thinkingBudget: 0 })).toBe("none");
    expect(effort({ thinkingBudget: -1 })).toBeUndefined();
  });

  test("tool modes: AUTO → auto, ANY → required, offering only the allowed functions when several are named", () => {
    const chat = (functionCallingConfig: object) =>
      geminiToChat({ contents: [{ parts: [{ text: "x" }] }], tools: [{ functionDeclarations: [{ name: "a" }, { name: "b" }, { name: "c" }] }], toolConfig: { functionCallingConfig } }, "m", false);
    const offered = (functionCallingConfig: object) => chat(functionCallingConfig).tools?.map((t) => (t.function as { name: string }).name);
    expect(chat({ mode: "AUTO" }).tool_choice).toBe("auto");
    expect(chat({ mode: "ANY" }).tool_choice).toBe("required");
    expect(offered({ mode: "ANY" })).toEqual(["a", "b", "c"]);
    expect(chat({ mode: "ANY", allowedFunctionNames: ["c", "a"] }).tool_choice).toBe("required");
    expect(offered({ mode: "ANY", allowedFunctionNames: ["c", "a"] })).toEqual(["a", "c"]);
    expect(chat({ mode: "ANY", allowedFunctionNames: ["b"] }).tool_choice).toEqual({ type: "function", function: { name: "b" } });
    expect(offered({ mode: "ANY", allowedFunctionNames: ["b"] })).toEqual(["a", "b", "c"]);
    expect(refusal(() => chat({ mode: "ANY", allowedFunctionNames: ["a", "nope"] })).info).toMatchObject({
      status: 400,
      message: 'toolConfig.functionCallingConfig.allowedFunctionNames: "nope" is not among the declared functions.',
    });
  });

  test("audio and documents become input_audio and file parts; a file URI image stays a URL", () => {
    const req = geminiToChat(
      {
        contents: [
          {
            parts: [
              { inlineData: { mimeType: "audio/wav", data: "UklGRg==" } },
              { inlineData: { mimeType: "application/pdf", data: "JVBERi0=" } },
              { fileData: { mimeType: "image/png", fileUri: "https://example.com/cat.png" } },
            ],
          },
        ],
      },
      "m",
      false,
    );
    expect(req.messages[0]!.content as unknown[]).toEqual([
      { type: "input_audio", input_audio: { data: "UklGRg==", format: "wav" } },
      { type: "file", file: { file_data: "data:application/pdf;base64,JVBERi0=" } },
      { type: "image_url", image_url: { url: "https://example.com/cat.png" } },
    ]);
  });

  test("a stream asks for the usage chunk", () => {
    const req = geminiToChat({ contents: [{ role: "user", parts: [{ text: "hi" }] }] }, "m", true);
    expect(req.stream).toBe(true);
    expect(req.stream_options).toEqual({ include_usage: true });
  });

  test("refusals: no contents, an unknown role, a Google-hosted tool, a Google context cache, code execution", () => {
    expect(refusal(() => geminiToChat({ contents: [] }, "m", false)).info).toMatchObject({ status: 400, message: "* GenerateContentRequest.contents: contents is not specified" });
    expect(refusal(() => geminiToChat({ systemInstruction: { parts: [{ text: "s" }] } }, "m", false)).info.status).toBe(400);
    expect(refusal(() => geminiToChat({ contents: [{ role: "assistant", parts: [{ text: "x" }] }] }, "m", false)).info.message).toContain("contents[0].role");
    const hosted = refusal(() => geminiToChat({ contents: [{ parts: [{ text: "x" }] }], tools: [{ googleSearch: {} }] }, "m", false));
    expect(hosted.info.message).toContain("googleSearch is a Google-hosted tool");
    const cached = refusal(() => geminiToChat({ contents: [{ parts: [{ text: "x" }] }], cachedContent: "cachedContents/abc123" }, "m", false));
    expect(cached.info.message).toStartWith('cachedContent: "cachedContents/abc123" is a context cache kept by Google that this gateway cannot read');
    for (const part of [{ executableCode: { language: "PYTHON", code: "print(1)" } }, { codeExecutionResult: { outcome: "OUTCOME_OK", output: "1" } }]) {
      for (const role of ["user", "model"]) {
        const turns = [{ role: "user", parts: [{ text: "run it" }] }, { role, parts: [part] }, { role: "user", parts: [{ text: "and?" }] }];
        expect(refusal(() => geminiToChat({ contents: turns }, "m", false)).info.message).toBe("contents[1].parts[0]: code execution parts are not supported by this gateway.");
      }
    }
  });

  test("fields of the wrong type or out of range are refused, naming the field as Google does", () => {
    const refused = (body: object) => refusal(() => geminiToChat(body as Record<string, unknown>, "m", false)).info;
    const hi = [{ role: "user", parts: [{ text: "hi" }] }];
    expect(refused({ contents: [{ role: "user", parts: "hi" }] })).toMatchObject({ status: 400, message: "Invalid value at 'contents[0].parts' (type.googleapis.com/google.ai.generativelanguage.v1beta.Part), \"hi\"" });
    expect(refused({ contents: [{ role: 7, parts: [{ text: "hi" }] }] }).message).toBe("Invalid value at 'contents[0].role' (TYPE_STRING), 7");
    expect(refused({ contents: [{ role: "user", parts: [] }] }).message).toBe("* GenerateContentRequest.contents[0].parts: contents.parts must not be empty.");
    expect(refused({ contents: hi, generationConfig: { temperature: "hot" } }).message).toBe("Invalid value at 'generation_config.temperature' (TYPE_FLOAT), \"hot\"");
    expect(refused({ contents: hi, generation_config: { max_output_tokens: 1.5 } }).message).toBe("Invalid value at 'generation_config.max_output_tokens' (TYPE_INT32), 1.5");
    expect(refused({ contents: hi, generationConfig: { topP: 1.5 } }).message).toBe("* GenerateContentRequest.generation_config.top_p: must be between 0 and 1, got 1.5.");
    expect(refused({ contents: hi, generationConfig: { seed: 1e20 } }).message).toBe("Invalid value at 'generation_config.seed' (TYPE_INT32), 100000000000000000000");
    expect(refused({ contents: hi, generationConfig: { thinking_config: { thinking_level: "FOO" } } }).message).toBe(
      "Invalid value at 'generation_config.thinking_config.thinking_level' (type.googleapis.com/google.ai.generativelanguage.v1beta.ThinkingConfig.ThinkingLevel), \"FOO\"",
    );
    expect(refused({ contents: hi, tools: [{ functionDeclarations: [{ description: "no name" }] }] }).message).toBe("* GenerateContentRequest.tools[0].function_declarations[0].name: Name cannot be empty.");
    expect(refused({ contents: hi, tools: [{ functionDeclarations: [{ name: "f" }] }], toolConfig: { functionCallingConfig: { mode: "SOMETIMES" } } }).message).toContain("tool_config.function_calling_config.mode");
    expect(refused({ contents: [{ role: "model", parts: [{ functionCall: { name: "f", args: "x" } }] }, ...hi] }).message).toBe("Invalid value at 'contents[0].parts[0].function_call.args' (type.googleapis.com/google.protobuf.Struct), \"x\"");
    expect(refused({ contents: hi, systemInstruction: 5 }).message).toBe("Invalid value at 'system_instruction' (type.googleapis.com/google.ai.generativelanguage.v1beta.Content), 5");
    // Fields the gateway does not read are not looked at; null is "not set"; a string system instruction is its text.
    expect(geminiToChat({ contents: hi, labels: 5, generationConfig: { temperature: null }, systemInstruction: "be brief" }, "m", false).messages[0]).toEqual({ role: "system", content: "be brief" });
  });
});

describe("Gemini Schema → JSON Schema", () => {
  test("types lower-cased, nullable as a null type (or a null branch of anyOf), int64 bounds as numbers", () => {
    expect(
      toJsonSchema({
        type: "OBJECT",
        properties: { tags: { type: "ARRAY", items: { type: "STRING", format: "enum", enum: ["a"] }, max_items: "3" }, either: { anyOf: [{ type: "STRING" }, { type: "NUMBER" }], nullable: true } },
        property_ordering: ["tags"],
      }),
    ).toEqual({
      type: "object",
      properties: {
        tags: { type: "array", items: { type: "string", format: "enum", enum: ["a"] }, maxItems: 3 },
        either: { anyOf: [{ type: "string" }, { type: "number" }, { type: "null" }] },
      },
    });
  });
});

const completion = (message: object, finish: string, usage: object = { prompt_tokens: 12, completion_tokens: 7, total_tokens: 19 }) => ({
  id: "chatcmpl-Abc123",
  object: "chat.completion",
  created: 1_740_000_000,
  model: "gpt-4o-mini-2024-07-18",
  choices: [{ index: 0, message: { role: "assistant", refusal: null, annotations: [], ...message }, logprobs: null, finish_reason: finish }],
  usage,
  system_fingerprint: "fp_1",
});

describe("OpenAI chat completion → GenerateContentResponse", () => {
  test("text, STOP, usage, modelVersion and responseId", () => {
    expect(chatToGemini(completion({ content: "Bonjour." }, "stop"), { includeThoughts: false })).toEqual({
      candidates: [{ content: { parts: [{ text: "Bonjour." }], role: "model" }, finishReason: "STOP", index: 0 }],
      usageMetadata: { promptTokenCount: 12, candidatesTokenCount: 7, totalTokenCount: 19 },
      modelVersion: "gpt-4o-mini-2024-07-18",
      responseId: "chatcmpl-Abc123",
    });
  });

  test("tool calls become functionCall parts with parsed args; the finish is STOP", () => {
    const body = completion(
      {
        content: null,
        tool_calls: [
          { id: "call_a", type: "function", function: { name: "get_weather", arguments: '{"location":"Paris"}' } },
          { id: "call_b", type: "function", function: { name: "get_time", arguments: "" } },
        ],
      },
      "tool_calls",
    );
    expect(chatToGemini(body, { includeThoughts: false }).candidates[0]).toEqual({
      content: {
        parts: [{ functionCall: { id: "call_a", name: "get_weather", args: { location: "Paris" } } }, { functionCall: { id: "call_b", name: "get_time", args: {} } }],
        role: "model",
      },
      finishReason: "STOP",
      index: 0,
    });
  });

  test("finish reasons: length → MAX_TOKENS, content_filter → SAFETY", () => {
    expect(chatToGemini(completion({ content: "cut" }, "length"), { includeThoughts: false }).candidates[0]!.finishReason).toBe("MAX_TOKENS");
    expect(chatToGemini(completion({ content: "" }, "content_filter"), { includeThoughts: false }).candidates[0]).toEqual({
      content: { parts: [{ text: "" }], role: "model" },
      finishReason: "SAFETY",
      index: 0,
    });
  });

  test("reasoning and cache details: thoughts counted apart from the candidates; thought parts only when asked", () => {
    const body = completion({ content: "42", reasoning_content: "Let me think." }, "stop", {
      prompt_tokens: 100,
      completion_tokens: 60,
      total_tokens: 160,
      prompt_tokens_details: { cached_tokens: 80 },
      completion_tokens_details: { reasoning_tokens: 50 },
    });
    const plain = chatToGemini(body, { includeThoughts: false });
    expect(plain.usageMetadata).toEqual({ promptTokenCount: 100, candidatesTokenCount: 10, totalTokenCount: 160, cachedContentTokenCount: 80, thoughtsTokenCount: 50 });
    expect(plain.candidates[0]!.content.parts).toEqual([{ text: "42" }]);
    expect(chatToGemini(body, { includeThoughts: true }).candidates[0]!.content.parts).toEqual([{ text: "Let me think.", thought: true }, { text: "42" }]);
  });

  test("n = 2 gives two candidates", () => {
    const body = { ...completion({ content: "a" }, "stop"), choices: [0, 1].map((index) => ({ index, message: { role: "assistant", content: `answer ${index}` }, finish_reason: "stop" })) };
    expect(chatToGemini(body, { includeThoughts: false }).candidates.map((c) => [c.index, c.content.parts[0]!.text])).toEqual([
      [0, "answer 0"],
      [1, "answer 1"],
    ]);
  });
});

/** Chunks as OpenAI streams them (the mock upstream writes the same shapes). */
const chunk = (choices: object[], usage?: object) => ({
  id: "chatcmpl-S1",
  object: "chat.completion.chunk",
  created: 1_740_000_000,
  model: "gpt-4o-mini",
  choices,
  ...(usage ? { usage } : {}),
});
const delta = (d: object, finish: string | null = null, index = 0) => ({ index, delta: d, logprobs: null, finish_reason: finish });
const USAGE = { prompt_tokens: 9, completion_tokens: 3, total_tokens: 12 };

describe("OpenAI chunks → Gemini stream chunks", () => {
  test("text as it comes; the finishing chunk waits for the usage chunk and carries both", () => {
    const g = new GeminiChunks({ includeThoughts: false });
    const out = [
      ...g.push(chunk([delta({ role: "assistant", content: "", refusal: null })])),
      ...g.push(chunk([delta({ content: "Hello" })])),
      ...g.push(chunk([delta({ content: " there" })])),
      ...g.push(chunk([delta({}, "stop")])),
    ];
    expect(out.map((c) => c.candidates[0]!.content.parts[0]!.text)).toEqual(["Hello", " there"]);
    const last = g.push(chunk([], USAGE));
    expect(last).toEqual([
      {
        candidates: [{ content: { parts: [{ text: "" }], role: "model" }, finishReason: "STOP", index: 0 }],
        modelVersion: "gpt-4o-mini",
        responseId: "chatcmpl-S1",
        usageMetadata: { promptTokenCount: 9, candidatesTokenCount: 3, totalTokenCount: 12 },
      },
    ]);
    expect(g.end()).toEqual([]);
  });

  test("a tool call arriving in pieces goes out whole, once, when its choice finishes", () => {
    const g = new GeminiChunks({ includeThoughts: false });
    const pieces = ['{"loc', 'ation":', '"Par', 'is"}'];
    const out = [
      ...g.push(chunk([delta({ role: "assistant", content: null, tool_calls: [{ index: 0, id: "call_X", type: "function", function: { name: "get_weather", arguments: "" } }] })])),
      ...pieces.flatMap((p) => g.push(chunk([delta({ tool_calls: [{ index: 0, function: { arguments: p } }] })]))),
    ];
    expect(out).toEqual([]);
    expect(g.push(chunk([delta({}, "tool_calls")]))).toEqual([]);
    const [last] = g.push(chunk([], USAGE));
    expect(last!.candidates).toEqual([{ content: { parts: [{ functionCall: { id: "call_X", name: "get_weather", args: { location: "Paris" } } }], role: "model" }, finishReason: "STOP", index: 0 }]);
    expect(last!.usageMetadata?.totalTokenCount).toBe(12);
  });

  test("without a usage chunk the finishing chunk goes out at the end; unfinished calls too", () => {
    const g = new GeminiChunks({ includeThoughts: false });
    g.push(chunk([delta({ content: "x" })]));
    expect(g.push(chunk([delta({}, "length")]))).toEqual([]);
    expect(g.end().map((c) => c.candidates[0]!.finishReason)).toEqual(["MAX_TOKENS"]);

    const cut = new GeminiChunks({ includeThoughts: false });
    cut.push(chunk([delta({ tool_calls: [{ index: 0, id: "call_Y", function: { name: "f", arguments: '{"a":1}' } }] })]));
    expect(cut.end()).toEqual([{ candidates: [{ content: { parts: [{ functionCall: { id: "call_Y", name: "f", args: { a: 1 } } }], role: "model" }, index: 0 }], modelVersion: "gpt-4o-mini", responseId: "chatcmpl-S1" }]);
  });

  test("a stream the upstream sent no usage for ends with the recorded usage on its last chunk; reported usage is never replaced", () => {
    const recorded = { promptTokenCount: 5, candidatesTokenCount: 2, totalTokenCount: 7 };
    const g = new GeminiChunks({ includeThoughts: false });
    g.push(chunk([delta({ content: "x" })]));
    g.push(chunk([delta({}, "stop")]));
    expect(g.end(recorded)).toEqual([
      { candidates: [{ content: { parts: [{ text: "" }], role: "model" }, finishReason: "STOP", index: 0 }], modelVersion: "gpt-4o-mini", responseId: "chatcmpl-S1", usageMetadata: recorded },
    ]);

    // Two choices finishing in different chunks: the first finishing chunk went out already, so the usage goes alone.
    const two = new GeminiChunks({ includeThoughts: false });
    two.push(chunk([delta({}, "stop", 0)]));
    expect(two.push(chunk([delta({}, "stop", 1)]))).toHaveLength(1);
    expect(two.end(recorded)).toEqual([
      { candidates: [{ content: { parts: [{ text: "" }], role: "model" }, finishReason: "STOP", index: 1 }], modelVersion: "gpt-4o-mini", responseId: "chatcmpl-S1", usageMetadata: recorded },
    ]);

    const reported = new GeminiChunks({ includeThoughts: false });
    reported.push(chunk([delta({}, "stop")]));
    expect(reported.push(chunk([], USAGE))[0]!.usageMetadata?.totalTokenCount).toBe(12);
    expect(reported.end(recorded)).toEqual([]);
  });

  test("reasoning deltas become thought parts only when includeThoughts was asked", () => {
    const withThoughts = new GeminiChunks({ includeThoughts: true });
    expect(withThoughts.push(chunk([delta({ reasoning_content: "hmm" })]))[0]!.candidates[0]!.content.parts).toEqual([{ text: "hmm", thought: true }]);
    expect(new GeminiChunks({ includeThoughts: false }).push(chunk([delta({ reasoning_content: "hmm" })]))).toEqual([]);
  });
});

/** A gateway-style SSE response whose body arrives in the given pieces. */
function sseResponse(pieces: string[], onCancel?: () => void): Response {
  const enc = new TextEncoder();
  let i = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(c) {
      if (i < pieces.length) c.enqueue(enc.encode(pieces[i++]!));
      else c.close();
    },
    cancel: () => onCancel?.(),
  });
  return new Response(body, { headers: { "content-type": "text/event-stream" } });
}

const GATEWAY_STREAM = [chunk([delta({ role: "assistant", content: "" })]), chunk([delta({ content: "Hel" })]), chunk([delta({ content: "lo" })]), chunk([delta({}, "stop")]), chunk([], USAGE)]
  .map((c) => `data: ${JSON.stringify(c)}\r\n\r\n`)
  .join("")
  .concat("data: [DONE]\r\n\r\n");

/** The stream text cut into pieces of `size` characters: mid-JSON, and between \r and \n. */
const splitEvery = (text: string, size: number) => Array.from({ length: Math.ceil(text.length / size) }, (_, i) => text.slice(i * size, (i + 1) * size));

describe("geminiStream", () => {
  test("SSE: one `data:` event per Gemini chunk, whatever the gateway's stream was cut into", async () => {
    for (const size of [7, 50, 100_000]) {
      const res = geminiStream(sseResponse(splitEvery(GATEWAY_STREAM, size)), "sse", { includeThoughts: false }, { "x-svc-call-id": "c1" });
      expect(res.headers.get("content-type")).toBe("text/event-stream");
      expect(res.headers.get("x-svc-call-id")).toBe("c1");
      const text = await res.text();
      const events = text.split("\r\n\r\n").filter(Boolean);
      expect(events.every((e) => e.startsWith("data: "))).toBe(true);
      const parsed = events.map((e) => JSON.parse(e.slice(6)));
      expect(parsed.map((p) => p.candidates[0]?.content.parts[0].text)).toEqual(["Hel", "lo", ""]);
      expect(parsed[2].candidates[0].finishReason).toBe("STOP");
      expect(parsed[2].usageMetadata).toEqual({ promptTokenCount: 9, candidatesTokenCount: 3, totalTokenCount: 12 });
    }
  });

  test("without alt=sse: one JSON array", async () => {
    const res = geminiStream(sseResponse(splitEvery(GATEWAY_STREAM, 13)), "json", { includeThoughts: false }, {});
    expect(res.headers.get("content-type")).toStartWith("application/json");
    const arr = (await res.json()) as { candidates: { content: { parts: { text: string }[] } }[] }[];
    expect(arr.map((c) => c.candidates[0]!.content.parts[0]!.text).join("")).toBe("Hello");
    expect(await geminiStream(sseResponse(["data: [DONE]\n\n"]), "json", { includeThoughts: false }, {}).json()).toEqual([]);
  });

  test("an error event of the gateway ends the stream with Google's error object", async () => {
    const pieces = [`data: ${JSON.stringify(chunk([delta({ content: "par" })]))}\n\n`, `data: {"error":{"message":"stream from openai stalled","type":"timeout_error","param":null,"code":"408"}}\n\n`, "data: [DONE]\n\n"];
    const sse = await geminiStream(sseResponse(pieces), "sse", { includeThoughts: false }, {}).text();
    const events = sse.split("\r\n\r\n").filter(Boolean).map((e) => JSON.parse(e.slice(6)));
    expect(events).toEqual([expect.objectContaining({ candidates: [expect.objectContaining({ content: { parts: [{ text: "par" }], role: "model" } })] }), { error: { code: 408, message: "stream from openai stalled", status: "DEADLINE_EXCEEDED" } }]);
    const arr = await geminiStream(sseResponse(pieces), "json", { includeThoughts: false }, {}).json();
    expect((arr as unknown[])[1]).toEqual({ error: { code: 408, message: "stream from openai stalled", status: "DEADLINE_EXCEEDED" } });
  });

  test("a client that leaves cancels the gateway stream underneath", async () => {
    let cancelled = false;
    const endless = Array.from({ length: 1000 }, () => `data: ${JSON.stringify(chunk([delta({ content: "x" })]))}\n\n`);
    const res = geminiStream(sseResponse(endless, () => (cancelled = true)), "sse", { includeThoughts: false }, {});
    const reader = res.body!.getReader();
    await reader.read();
    await reader.cancel();
    expect(cancelled).toBe(true);
  });
});

describe("errors and countTokens in Google's shapes", () => {
  test("status names", () => {
    expect([400, 401, 403, 404, 408, 422, 429, 500, 503].map(googleStatus)).toEqual([
      "INVALID_ARGUMENT",
      "UNAUTHENTICATED",
      "PERMISSION_DENIED",
      "NOT_FOUND",
      "DEADLINE_EXCEEDED",
      "INVALID_ARGUMENT",
      "RESOURCE_EXHAUSTED",
      "INTERNAL",
      "UNAVAILABLE",
    ]);
    expect(googleErrorBody(429, "slow down")).toEqual({ error: { code: 429, message: "slow down", status: "RESOURCE_EXHAUSTED" } });
  });

  test("billable characters leave whitespace out; image tokens get their own modality", () => {
    const messages = [
      { role: "system" as const, content: "Be  brief." },
      { role: "user" as const, content: [{ type: "text", text: "hello world" }, { type: "image_url", image_url: { url: "x" } }] },
    ];
    expect(billableCharacters(messages)).toBe(8 + 10);
    expect(countTokensResponse({ total: 300, image: 255, tokenizerType: "openai_tokenizer" }, messages)).toEqual({
      totalTokens: 300,
      totalBillableCharacters: 18,
      promptTokensDetails: [
        { modality: "TEXT", tokenCount: 45 },
        { modality: "IMAGE", tokenCount: 255 },
      ],
    });
  });
});
