// Google's own SDK (@google/genai) against the gateway's Gemini-style routes, reaching an OpenAI mock
// and an Anthropic-format mock: generateContent, generateContentStream, countTokens and a
// function-calling round, with a virtual key (as x-goog-api-key, or ?key=), its model access, and
// the spend log row each call leaves. Errors come back in Google's shape.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { ApiError, type Content, FinishReason, FunctionCallingConfigMode, GoogleGenAI, Type } from "@google/genai";
import { spendLogRow } from "../harness/spend.ts";
import { MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { failure } from "../harness/util.ts";
import { type MockAnthropic, startMockAnthropic } from "../mock-upstream/anthropic.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const OPENAI_KEY = "sk-upstream-openai-0123456789";
const ANTHROPIC_KEY = "sk-ant-upstream-0123456789";
// $1 per million input tokens, $2 per million output tokens.
const PRICES = { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 };

let openai: MockOpenAI;
let anthropic: MockAnthropic;
let gw: TestGateway;
let key: string;
let token: string;
let ai: GoogleGenAI;

beforeAll(async () => {
  openai = await startMockOpenAI({ apiKey: OPENAI_KEY });
  anthropic = await startMockAnthropic({ apiKey: ANTHROPIC_KEY });
  const viaOpenAI = (model: string) => ({ model, api_base: openai.url, api_key: OPENAI_KEY });
  gw = await startTestGateway(
    {
      model_list: [
        { model_name: "gpt-public", svc_params: viaOpenAI("openai/gpt-4o-mini"), model_info: { id: "dep-gpt", ...PRICES } },
        { model_name: "gpt-other", svc_params: viaOpenAI("openai/gpt-4o"), model_info: { id: "dep-other" } },
        { model_name: "openai/*", svc_params: viaOpenAI("openai/*"), model_info: { id: "dep-wild" } },
        {
          model_name: "claude-public",
          svc_params: { model: "anthropic/claude-sonnet-4-20250514", api_base: anthropic.url, api_key: ANTHROPIC_KEY },
          model_info: { id: "dep-claude", ...PRICES },
        },
      ],
      general_settings: { master_key: MASTER_KEY },
    },
    { store: {} },
  );
  const created = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { key_alias: "gemini-user", models: ["gpt-public", "claude-public"] } });
  expect(created.status).toBe(200);
  key = created.body.key;
  token = created.body.token;
  ai = new GoogleGenAI({ apiKey: key, httpOptions: { baseUrl: gw.url } });
});

afterAll(async () => {
  await gw?.stop();
  await openai?.stop();
  await anthropic?.stop();
});

beforeEach(() => {
  openai.reset();
  anthropic.reset();
});

interface LogRow {
  request_id: string;
  api_key: string;
  model_group: string;
  provider: string;
  prompt_tokens: number;
  completion_tokens: number;
  spend: string;
  status: string;
  stream: boolean;
}

const logRow = (requestId: string) => spendLogRow<LogRow>(gw, requestId);

const usd = (prompt: number, completion: number) => (prompt * 1 + completion * 2) / 1_000_000;

function post(path: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${gw.url}${path}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
}

/** Google's error envelope, exactly: `{error: {code, message, status}}`. */
async function expectGoogleError(res: Response, code: number, status: string): Promise<string> {
  expect(res.status).toBe(code);
  expect(res.headers.get("content-type")).toStartWith("application/json");
  const body = (await res.json()) as { error: { code: number; message: string; status: string } };
  expect(Object.keys(body)).toEqual(["error"]);
  expect(Object.keys(body.error).sort()).toEqual(["code", "message", "status"]);
  expect(body.error.code).toBe(code);
  expect(body.error.status).toBe(status);
  return body.error.message;
}

const weatherTool = {
  functionDeclarations: [
    {
      name: "get_weather",
      description: "Current weather for a place",
      parameters: {
        type: Type.OBJECT,
        properties: { location: { type: Type.STRING, description: "City name" }, unit: { type: Type.STRING, enum: ["celsius", "fahrenheit"] } },
        required: ["location"],
      },
    },
  ],
};

describe("through an OpenAI upstream", () => {
  test("generateContent: the answer, usage and ids in Gemini's shape; the upstream got the translated request; spend is logged", async () => {
    const res = await ai.models.generateContent({
      model: "gpt-public",
      contents: "Tell me about the gateway please",
      config: { systemInstruction: "Be terse.", temperature: 0.2, maxOutputTokens: 50, stopSequences: ["END"] },
    });
    expect(res.text).toBe("Mock reply to: Tell me about the gateway please");
    expect(res.candidates?.[0]?.finishReason).toBe(FinishReason.STOP);
    expect(res.modelVersion).toBe("gpt-4o-mini");
    expect(res.responseId).toStartWith("chatcmpl-");

    const sent = openai.requests[0]!;
    expect(sent.path).toBe("/v1/chat/completions");
    expect(sent.headers.authorization).toBe(`Bearer ${OPENAI_KEY}`);
    expect(sent.body).toEqual({
      model: "gpt-4o-mini",
      messages: [
        { role: "system", content: "Be terse." },
        { role: "user", content: "Tell me about the gateway please" },
      ],
      temperature: 0.2,
      max_tokens: 50,
      stop: ["END"],
    });

    const usage = res.usageMetadata!;
    expect(usage.totalTokenCount).toBe(usage.promptTokenCount! + usage.candidatesTokenCount!);
    const row = await logRow(res.responseId!);
    expect(row).toMatchObject({ api_key: token, model_group: "gpt-public", provider: "openai", status: "success", stream: false });
    expect(row!.prompt_tokens).toBe(usage.promptTokenCount!);
    expect(row!.completion_tokens).toBe(usage.candidatesTokenCount!);
    expect(Number(row!.spend)).toBeCloseTo(usd(usage.promptTokenCount!, usage.candidatesTokenCount!), 12);
    expect(Number(row!.spend)).toBeGreaterThan(0);
  });

  test("generateContentStream: text piece by piece, the last chunk with finishReason and usageMetadata; logged as a stream", async () => {
    const chunks = [];
    for await (const c of await ai.models.generateContentStream({ model: "gpt-public", contents: "stream these five words" })) chunks.push(c);
    expect(chunks.length).toBeGreaterThan(3);
    expect(chunks.map((c) => c.text ?? "").join("")).toBe("Mock reply to: stream these five words");
    const last = chunks.at(-1)!;
    expect(last.candidates?.[0]?.finishReason).toBe(FinishReason.STOP);
    expect(last.usageMetadata?.candidatesTokenCount).toBe(7);
    expect(chunks.slice(0, -1).every((c) => c.usageMetadata === undefined && c.candidates?.[0]?.finishReason === undefined)).toBe(true);
    expect(openai.requests[0]!.body).toMatchObject({ stream: true, stream_options: { include_usage: true } });
    const row = await logRow(last.responseId!);
    expect(row).toMatchObject({ status: "success", stream: true, completion_tokens: 7, model_group: "gpt-public" });
  });

  test("countTokens: counted locally with the o200k tokenizer ('hello world' in one user turn is 3 + 1 + 2 + 3 = 9), nothing sent upstream", async () => {
    const res = await ai.models.countTokens({ model: "gpt-public", contents: "hello world" });
    expect(res.totalTokens).toBe(9);
    expect(openai.requests).toHaveLength(0);
    const raw = await post(`/v1beta/models/gpt-public:countTokens`, { contents: [{ role: "user", parts: [{ text: "hello world" }] }] }, { "x-goog-api-key": key });
    expect(await raw.json()).toEqual({ totalTokens: 9, totalBillableCharacters: 10, promptTokensDetails: [{ modality: "TEXT", tokenCount: 9 }] });
  });

  test("a function-calling round: functionCall out, functionResponse back as a tool message with the same id", async () => {
    const question = "What is the weather in Paris?";
    const first = await ai.models.generateContent({ model: "gpt-public", contents: question, config: { tools: [weatherTool] } });
    const calls = first.functionCalls!;
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({ name: "get_weather", args: { location: "Paris", unit: "celsius" } });
    expect(calls[0]!.id).toStartWith("call_");
    expect(openai.requests[0]!.body).toMatchObject({
      tools: [
        {
          type: "function",
          function: {
            name: "get_weather",
            description: "Current weather for a place",
            parameters: { type: "object", properties: { location: { type: "string", description: "City name" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["location"] },
          },
        },
      ],
    });

    const history: Content[] = [
      { role: "user", parts: [{ text: question }] },
      first.candidates![0]!.content!,
      { role: "user", parts: [{ functionResponse: { id: calls[0]!.id, name: "get_weather", response: { temperature: 21, unit: "celsius" } } }] },
    ];
    const second = await ai.models.generateContent({
      model: "gpt-public",
      contents: history,
      config: { tools: [weatherTool], toolConfig: { functionCallingConfig: { mode: FunctionCallingConfigMode.NONE } } },
    });
    expect(second.text).toBe(`Mock reply to: ${question}`);
    const messages = (openai.requests[1]!.body as { messages: unknown[] }).messages;
    expect(messages).toEqual([
      { role: "user", content: question },
      { role: "assistant", content: null, tool_calls: [{ id: calls[0]!.id, type: "function", function: { name: "get_weather", arguments: '{"location":"Paris","unit":"celsius"}' } }] },
      { role: "tool", tool_call_id: calls[0]!.id, content: '{"temperature":21,"unit":"celsius"}' },
    ]);
    expect(openai.requests[1]!.body).toMatchObject({ tool_choice: "none" });
  });

  test("without alt=sse the stream is one JSON array", async () => {
    const res = await post("/v1beta/models/gpt-public:streamGenerateContent", { contents: [{ role: "user", parts: [{ text: "array please" }] }] }, { "x-goog-api-key": key });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toStartWith("application/json");
    const items = (await res.json()) as { candidates: { content: { parts: { text: string }[] } }[]; usageMetadata?: object }[];
    expect(items.map((i) => i.candidates[0]?.content.parts[0]?.text ?? "").join("")).toBe("Mock reply to: array please");
    expect(items.at(-1)!.usageMetadata).toBeDefined();
  });

  test("the key as ?key=, on every path form: /v1beta/models, /models and /v1/models", async () => {
    for (const prefix of ["/v1beta/models", "/models", "/v1/models"]) {
      const res = await post(`${prefix}/gpt-public:generateContent?key=${key}`, { contents: [{ parts: [{ text: "via query key" }] }] });
      expect(res.status).toBe(200);
      const body = (await res.json()) as { candidates: { content: { parts: { text: string }[] } }[] };
      expect(body.candidates[0]!.content.parts[0]!.text).toBe("Mock reply to: via query key");
    }
  });

  test("a wildcard route serves a model with a slash in its name (models/openai/gpt-4.1)", async () => {
    const admin = new GoogleGenAI({ apiKey: MASTER_KEY, httpOptions: { baseUrl: gw.url } });
    const res = await admin.models.generateContent({ model: "openai/gpt-4.1", contents: "wildcard" });
    expect(res.text).toBe("Mock reply to: wildcard");
    expect(openai.requests[0]!.body).toMatchObject({ model: "gpt-4.1" });
  });
});

describe("through an Anthropic-format upstream", () => {
  test("generateContent and generateContentStream reach the Messages API and come back as Gemini", async () => {
    const res = await ai.models.generateContent({ model: "claude-public", contents: "Hello Claude", config: { maxOutputTokens: 100 } });
    expect(res.text).toBe("Mock reply to: Hello Claude");
    expect(res.candidates?.[0]?.finishReason).toBe(FinishReason.STOP);
    expect(res.responseId).toStartWith("msg_01");
    const sent = anthropic.requests[0]!;
    expect(sent.path).toBe("/v1/messages");
    expect(sent.headers["x-api-key"]).toBe(ANTHROPIC_KEY);
    expect(sent.body).toMatchObject({ model: "claude-sonnet-4-20250514", max_tokens: 100, messages: [{ role: "user", content: "Hello Claude" }] });
    const row = await logRow(res.responseId!);
    expect(row).toMatchObject({ api_key: token, model_group: "claude-public", provider: "anthropic", status: "success" });
    expect(Number(row!.spend)).toBeGreaterThan(0);

    const chunks = [];
    for await (const c of await ai.models.generateContentStream({ model: "claude-public", contents: "stream from Claude" })) chunks.push(c);
    expect(chunks.map((c) => c.text ?? "").join("")).toBe("Mock reply to: stream from Claude");
    expect(chunks.at(-1)!.usageMetadata?.promptTokenCount).toBeGreaterThan(0);
  });

  test("a function call from Claude, answered with a functionResponse (sent as a tool_result)", async () => {
    const question = "Use get_weather for Paris";
    const first = await ai.models.generateContent({ model: "claude-public", contents: question, config: { tools: [weatherTool] } });
    const call = first.functionCalls![0]!;
    expect(call).toMatchObject({ name: "get_weather", args: { location: "Paris", unit: "celsius" } });
    expect(call.id).toStartWith("toolu_01");
    const second = await ai.models.generateContent({
      model: "claude-public",
      contents: [{ role: "user", parts: [{ text: question }] }, first.candidates![0]!.content!, { role: "user", parts: [{ functionResponse: { id: call.id, name: "get_weather", response: { temperature: 21 } } }] }],
      config: { tools: [weatherTool] },
    });
    expect(second.functionCalls).toBeUndefined();
    expect(second.text).toStartWith("Mock reply to:");
    const messages = (anthropic.requests[1]!.body as { messages: { role: string; content: { type: string; tool_use_id?: string }[] }[] }).messages;
    expect(messages.at(-1)!.content[0]).toMatchObject({ type: "tool_result", tool_use_id: call.id });
  });

  test("countTokens goes to Anthropic's count_tokens endpoint and reports its count", async () => {
    const res = await ai.models.countTokens({ model: "claude-public", contents: "How many tokens is this sentence?" });
    const sent = anthropic.requests[0]!;
    expect(sent.path).toBe("/v1/messages/count_tokens");
    // Ask the mock directly with the same body: the gateway must report exactly its answer.
    const direct = await fetch(`${anthropic.url}/v1/messages/count_tokens`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01" },
      body: JSON.stringify(sent.body),
    });
    const { input_tokens } = (await direct.json()) as { input_tokens: number };
    expect(input_tokens).toBeGreaterThan(0);
    expect(res.totalTokens).toBe(input_tokens);
  });

  test("countTokens with call_endpoint=False (or 0, no, off: a boolean as FastAPI reads one) counts locally, nothing sent upstream", async () => {
    for (const flag of ["False", "0", "no", "off", "false"]) {
      const res = await post(`/v1beta/models/claude-public:countTokens?call_endpoint=${flag}`, { contents: [{ role: "user", parts: [{ text: "hello world" }] }] }, { "x-goog-api-key": key });
      expect(res.status).toBe(200);
      // o200k: 'hello world' in one user turn is 9 (see the local count above).
      expect(((await res.json()) as { totalTokens: number }).totalTokens, flag).toBe(9);
    }
    expect(anthropic.requests).toHaveLength(0);
  });

  test("an unsupported parameter is refused in Google's shape, naming it", async () => {
    const res = await post("/v1beta/models/claude-public:generateContent", { contents: [{ parts: [{ text: "x" }] }], generationConfig: { seed: 7, candidateCount: 2 } }, { "x-goog-api-key": key });
    const message = await expectGoogleError(res, 400, "INVALID_ARGUMENT");
    expect(message).toStartWith("anthropic does not support parameters: ['n', 'seed'], for model=claude-sonnet-4-20250514.");
    expect(anthropic.requests).toHaveLength(0);
  });

  test("what Claude cannot take (a video by its Files-API URI, a video's or audio's bytes) is a 400 naming it, nothing sent upstream", async () => {
    const video = { fileData: { mimeType: "video/mp4", fileUri: "https://generativelanguage.googleapis.com/v1beta/files/abc123" } };
    const clip = { inlineData: { mimeType: "video/mp4", data: "AAAAIGZ0eXBpc29t" } };
    const audio = { inlineData: { mimeType: "audio/wav", data: "UklGRiQAAABXQVZF" } };
    for (const [part, named] of [
      [video, "a file part by file_id (\"https://generativelanguage.googleapis.com/v1beta/files/abc123\") cannot be sent to Claude"],
      [clip, "Claude takes PDF documents, not video/mp4"],
      [audio, "Claude takes no audio"],
    ] as const) {
      const res = await post("/v1beta/models/claude-public:generateContent", { contents: [{ parts: [{ text: "what is this?" }, part] }] }, { "x-goog-api-key": key });
      expect(await expectGoogleError(res, 400, "INVALID_ARGUMENT")).toContain(named);
    }
    expect(anthropic.requests).toHaveLength(0);
  });
});

describe("settings the gateway cannot serve, or Google would refuse: 400 in Google's shape, nothing sent upstream", () => {
  test("an image or audio answer (responseModalities), an unknown thinkingLevel, integers beyond 32 bits, an enum answer", async () => {
    const cases: [object, string][] = [
      [{ responseModalities: ["TEXT", "IMAGE"] }, 'generationConfig.responseModalities: this gateway answers the Gemini routes with text only; "IMAGE" cannot be served.'],
      [{ thinkingConfig: { thinkingLevel: "FOO" } }, "Invalid value at 'generation_config.thinking_config.thinking_level' (type.googleapis.com/google.ai.generativelanguage.v1beta.ThinkingConfig.ThinkingLevel), \"FOO\""],
      [{ maxOutputTokens: 1e20 }, "Invalid value at 'generation_config.max_output_tokens' (TYPE_INT32), 100000000000000000000"],
      [{ seed: 2 ** 31 }, "Invalid value at 'generation_config.seed' (TYPE_INT32), 2147483648"],
      // Google's enum answer (the bare value as text): JSON mode would answer it quoted.
      [
        { responseMimeType: "text/x.enum", responseSchema: { type: "STRING", enum: ["red", "blue"] } },
        'generationConfig.responseMimeType: "text/x.enum" (the bare enum value as text) cannot be served by this gateway; ask for "application/json" with the schema instead.',
      ],
    ];
    for (const [generationConfig, message] of cases) {
      const res = await post("/v1beta/models/gpt-public:generateContent", { contents: [{ parts: [{ text: "hi" }] }], generationConfig }, { "x-goog-api-key": key });
      expect(await expectGoogleError(res, 400, "INVALID_ARGUMENT")).toBe(message);
    }
    expect(openai.requests).toHaveLength(0);
    // What Google takes still goes through: a level it knows, the largest 32-bit seed, a text answer.
    const ok = await post("/v1beta/models/gpt-public:generateContent", { contents: [{ parts: [{ text: "hi" }] }], generationConfig: { thinkingConfig: { thinkingLevel: "medium" }, seed: 2 ** 31 - 1, responseModalities: ["TEXT"] } }, { "x-goog-api-key": key });
    expect(ok.status).toBe(200);
    expect(openai.requests[0]!.body).toMatchObject({ reasoning_effort: "medium", seed: 2 ** 31 - 1 });
  });
});

describe("errors in Google's shape", () => {
  test("a model the key may not use: 401 UNAUTHENTICATED (the SDK raises ApiError 401)", async () => {
    const err = await failure(ai.models.generateContent({ model: "gpt-other", contents: "hi" }));
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).status).toBe(401);
    const message = await expectGoogleError(await post("/v1beta/models/gpt-other:generateContent", { contents: [{ parts: [{ text: "hi" }] }] }, { "x-goog-api-key": key }), 401, "UNAUTHENTICATED");
    expect(message).toContain("gpt-other");
    expect(openai.requests).toHaveLength(0);
    await expectGoogleError(await post("/v1beta/models/gpt-other:countTokens", { contents: [{ parts: [{ text: "hi" }] }] }, { "x-goog-api-key": key }), 401, "UNAUTHENTICATED");
  });

  test("no key, a wrong key: 401 UNAUTHENTICATED", async () => {
    await expectGoogleError(await post("/v1beta/models/gpt-public:generateContent", { contents: [{ parts: [{ text: "hi" }] }] }), 401, "UNAUTHENTICATED");
    await expectGoogleError(await post("/v1beta/models/gpt-public:generateContent?key=sk-wrong", { contents: [{ parts: [{ text: "hi" }] }] }), 401, "UNAUTHENTICATED");
  });

  test("a model the gateway does not serve, a bad body, an unknown method", async () => {
    const admin = { "x-goog-api-key": MASTER_KEY };
    expect(await expectGoogleError(await post("/v1beta/models/no-such-model:generateContent", { contents: [{ parts: [{ text: "hi" }] }] }, admin), 400, "INVALID_ARGUMENT")).toContain("no-such-model");
    await expectGoogleError(await post("/v1beta/models/gpt-public:generateContent", { contents: [] }, admin), 400, "INVALID_ARGUMENT");
    const range = await expectGoogleError(await post("/v1beta/models/gpt-public:generateContent", { contents: [{ parts: [{ text: "hi" }] }], generationConfig: { temperature: 5 } }, admin), 400, "INVALID_ARGUMENT");
    expect(range).toContain("generation_config.temperature");
    const type = await expectGoogleError(await post("/v1beta/models/gpt-public:generateContent", { contents: [{ parts: [{ text: 5 }] }] }, admin), 400, "INVALID_ARGUMENT");
    expect(type).toBe("Invalid value at 'contents[0].parts[0].text' (TYPE_STRING), 5");
    // The gateway's own range checks (an OpenAI field's) answer INVALID_ARGUMENT with Google's 400 as well.
    await expectGoogleError(await post("/v1beta/models/gpt-public:generateContent", { contents: [{ parts: [{ text: "hi" }] }], generationConfig: { presencePenalty: 9 } }, admin), 400, "INVALID_ARGUMENT");
    await expectGoogleError(await post("/v1beta/models/gpt-public:embedContent", { content: { parts: [{ text: "hi" }] } }, admin), 404, "NOT_FOUND");
  });

  test("an upstream 429 is RESOURCE_EXHAUSTED with its retry-after; the SDK raises ApiError 429", async () => {
    openai.fault({ kind: "status", status: 429 });
    const res = await post("/v1beta/models/gpt-public:generateContent", { contents: [{ parts: [{ text: "hi" }] }] }, { "x-goog-api-key": key });
    expect(res.headers.get("retry-after")).toBe("1");
    expect(await expectGoogleError(res, 429, "RESOURCE_EXHAUSTED")).toContain("Rate limit reached");
    openai.fault({ kind: "status", status: 429 });
    const err = await failure(ai.models.generateContent({ model: "gpt-public", contents: "hi" }));
    expect((err as ApiError).status).toBe(429);
  });
});
