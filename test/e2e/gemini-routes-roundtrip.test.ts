// Google's SDK (@google/genai) on the gateway's Gemini-style routes, for what a tool-using client
// and its bill depend on: parallel calls of one function keep their ids on the way to an OpenAI
// upstream and to a Gemini upstream (gemini/…) and back, and an upstream that reports no usage
// still gives the client a usageMetadata, the same counts as the spend log row, in a stream too;
// and the thinking settings (thinking off, thoughts asked for) reach the upstream.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { type Content, FinishReason, type GenerateContentResponse, GoogleGenAI, Type } from "@google/genai";
import { spendLogRow } from "../harness/spend.ts";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockGemini, startMockGemini } from "../mock-upstream/gemini.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const OPENAI_KEY = "sk-upstream-openai-0123456789";
const GEMINI_KEY = "AIza-upstream-gemini-0123456789";
// $1 per million input tokens, $2 per million output tokens.
const PRICES = { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 };
const usd = (prompt: number, completion: number) => (prompt * 1 + completion * 2) / 1_000_000;

let openai: MockOpenAI;
let gemini: MockGemini;
let gw: TestGateway;
let ai: GoogleGenAI;

beforeAll(async () => {
  openai = await startMockOpenAI({ apiKey: OPENAI_KEY });
  gemini = await startMockGemini({ apiKey: GEMINI_KEY });
  gw = await startTestGateway(
    {
      model_list: [
        { model_name: "gpt-public", svc_params: { model: "openai/gpt-4o-mini", api_base: openai.url, api_key: OPENAI_KEY }, model_info: PRICES },
        { model_name: "gemini-public", svc_params: { model: "gemini/gemini-2.5-flash", api_base: gemini.url, api_key: GEMINI_KEY }, model_info: PRICES },
      ],
      general_settings: { master_key: MASTER_KEY },
    },
    { store: {} },
  );
  ai = new GoogleGenAI({ apiKey: MASTER_KEY, httpOptions: { baseUrl: gw.url } });
}, 60_000);

afterAll(async () => {
  await gw?.stop();
  await openai?.stop();
  await gemini?.stop();
});

beforeEach(() => {
  openai.reset();
  gemini.reset();
});

const weatherTool = {
  functionDeclarations: [{ name: "get_weather", parameters: { type: Type.OBJECT, properties: { location: { type: Type.STRING } }, required: ["location"] } }],
};

async function collect(stream: AsyncGenerator<GenerateContentResponse>): Promise<GenerateContentResponse[]> {
  const out: GenerateContentResponse[] = [];
  for await (const c of stream) out.push(c);
  return out;
}

describe("parallel calls of one function, paired by their ids", () => {
  // The results come back in the other order than the calls: only the ids say whose is whose.
  const history: Content[] = [
    { role: "user", parts: [{ text: "Weather in Paris and Rome?" }] },
    {
      role: "model",
      parts: [
        { functionCall: { id: "fc-paris", name: "get_weather", args: { location: "Paris" } } },
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
  ];

  test("to an OpenAI upstream: the client's ids are the tool call ids and the tool results' tool_call_id", async () => {
    await ai.models.generateContent({ model: "gpt-public", contents: history, config: { tools: [weatherTool] } });
    const messages = (openai.requests[0]!.body as { messages: unknown[] }).messages;
    expect(messages.slice(1)).toEqual([
      {
        role: "assistant",
        content: null,
        tool_calls: [
          { id: "fc-paris", type: "function", function: { name: "get_weather", arguments: '{"location":"Paris"}' } },
          { id: "fc-rome", type: "function", function: { name: "get_weather", arguments: '{"location":"Rome"}' } },
        ],
      },
      { role: "tool", tool_call_id: "fc-rome", content: '{"temp_c":18}' },
      { role: "tool", tool_call_id: "fc-paris", content: '{"temp_c":21}' },
    ]);
  });

  test("to a Gemini upstream: the calls and results go with the client's functionCall.id and functionResponse.id", async () => {
    await ai.models.generateContent({ model: "gemini-public", contents: history, config: { tools: [weatherTool] } });
    const contents = (gemini.requests[0]!.body as { contents: unknown[] }).contents;
    expect(contents.slice(1)).toEqual(history.slice(1));
  });

  const geminiCalls = {
    content: {
      role: "model",
      parts: [
        { functionCall: { id: "g-paris", name: "get_weather", args: { location: "Paris" } } },
        { functionCall: { id: "g-rome", name: "get_weather", args: { location: "Rome" } } },
      ],
    },
    finishReason: "STOP",
    index: 0,
  };
  const usageMetadata = { promptTokenCount: 20, candidatesTokenCount: 10, totalTokenCount: 30 };

  test("from a Gemini upstream: its functionCall ids reach the client as they are, in an answer and in a stream", async () => {
    gemini.fault({ kind: "answer", body: { candidates: [geminiCalls], usageMetadata, modelVersion: "gemini-2.5-flash", responseId: "r-1" } });
    const res = await ai.models.generateContent({ model: "gemini-public", contents: "Weather in Paris and Rome?", config: { tools: [weatherTool] } });
    expect(res.functionCalls).toEqual([
      { id: "g-paris", name: "get_weather", args: { location: "Paris" } },
      { id: "g-rome", name: "get_weather", args: { location: "Rome" } },
    ]);

    const event = { candidates: [geminiCalls], usageMetadata, modelVersion: "gemini-2.5-flash", responseId: "r-2" };
    gemini.fault({ kind: "cannedStream", chunks: [`data: ${JSON.stringify(event)}\r\n\r\n`], checked: true });
    const chunks = await collect(await ai.models.generateContentStream({ model: "gemini-public", contents: "Weather in Paris and Rome?", config: { tools: [weatherTool] } }));
    expect(chunks.flatMap((c) => c.functionCalls ?? []).map((c) => c.id)).toEqual(["g-paris", "g-rome"]);
  });
});

interface LogRow {
  prompt_tokens: number;
  completion_tokens: number;
  spend: string;
  status: string;
  stream: boolean;
}

const logRow = (requestId: string) => spendLogRow<LogRow>(gw, requestId);

/** The usage the client got is the one logged and priced, and it is not nothing. */
async function expectLoggedAs(res: GenerateContentResponse, stream: boolean): Promise<void> {
  const usage = res.usageMetadata!;
  expect(usage.promptTokenCount).toBeGreaterThan(0);
  expect(usage.candidatesTokenCount).toBeGreaterThan(0);
  expect(usage.totalTokenCount).toBe(usage.promptTokenCount! + usage.candidatesTokenCount!);
  const row = await logRow(res.responseId!);
  expect(row).toMatchObject({ status: "success", stream, prompt_tokens: usage.promptTokenCount, completion_tokens: usage.candidatesTokenCount });
  expect(Number(row!.spend)).toBeCloseTo(usd(usage.promptTokenCount!, usage.candidatesTokenCount!), 12);
}

describe("an OpenAI-compatible upstream that reports no usage", () => {
  test("generateContent: usageMetadata carries the estimate the call was logged and priced with", async () => {
    // 40 characters of answer: 10 tokens at four characters a token.
    const text = "0123456789".repeat(4);
    openai.fault({ kind: "answer", body: { id: "chatcmpl-gem-nousage", object: "chat.completion", created: 1, model: "llama", choices: [{ index: 0, message: { role: "assistant", content: text }, finish_reason: "stop" }] } });
    const res = await ai.models.generateContent({ model: "gpt-public", contents: "a prompt of some forty characters or so." });
    expect(res.text).toBe(text);
    expect(res.usageMetadata?.candidatesTokenCount).toBe(10);
    await expectLoggedAs(res, false);
  });

  test("generateContentStream: the last chunk has finishReason and the estimated usageMetadata, the counts of the log row", async () => {
    // A server that ignores include_usage: no usage chunk, no usage key, then [DONE].
    openai.fault({
      kind: "wire",
      shape: (bytes) => {
        const events = new TextDecoder().decode(bytes).split("\n\n");
        const kept = events.filter((e) => !e.includes('"usage":{')).map((e) => e.replace(',"usage":null', ""));
        const body = new TextEncoder().encode(kept.join("\n\n"));
        return { bytes: body, cuts: [] };
      },
    });
    const chunks = await collect(await ai.models.generateContentStream({ model: "gpt-public", contents: "stream these five words" }));
    expect(chunks.map((c) => c.text ?? "").join("")).toBe("Mock reply to: stream these five words");
    expect(chunks.slice(0, -1).every((c) => c.usageMetadata === undefined)).toBe(true);
    const last = chunks.at(-1)!;
    expect(last.candidates?.[0]?.finishReason).toBe(FinishReason.STOP);
    await expectLoggedAs(last, true);
  });
});

describe("thinking settings", () => {
  const thinkingSent = () => (gemini.requests[0]!.body as { generationConfig?: { thinkingConfig?: unknown } }).generationConfig?.thinkingConfig;

  test("to a Gemini upstream: thinkingBudget 0 turns thinking off there; includeThoughts alone asks for the thoughts at the model's own budget", async () => {
    await ai.models.generateContent({ model: "gemini-public", contents: "Say hi.", config: { thinkingConfig: { thinkingBudget: 0 } } });
    expect(thinkingSent()).toEqual({ thinkingBudget: 0 });

    gemini.reset();
    const res = await ai.models.generateContent({ model: "gemini-public", contents: "Say hi.", config: { thinkingConfig: { includeThoughts: true } } });
    expect(thinkingSent()).toEqual({ includeThoughts: true });
    expect(res.candidates![0]!.content!.parts!.filter((p) => p.thought === true)).toHaveLength(1);

    gemini.reset();
    await ai.models.generateContent({ model: "gemini-public", contents: "Say hi.", config: { thinkingConfig: { thinkingBudget: -1, includeThoughts: true } } });
    expect(thinkingSent()).toEqual({ includeThoughts: true });
  });

  test("to an OpenAI upstream: thinkingBudget 0 is reasoning_effort none; includeThoughts alone sends nothing OpenAI does not take", async () => {
    await ai.models.generateContent({ model: "gpt-public", contents: "Say hi.", config: { thinkingConfig: { thinkingBudget: 0 } } });
    expect((openai.requests[0]!.body as { reasoning_effort?: string }).reasoning_effort).toBe("none");

    openai.reset();
    await ai.models.generateContent({ model: "gpt-public", contents: "Say hi.", config: { thinkingConfig: { includeThoughts: true } } });
    const sent = openai.requests[0]!.body as Record<string, unknown>;
    expect(Object.keys(sent).sort()).toEqual(["messages", "model"]);
  });
});
