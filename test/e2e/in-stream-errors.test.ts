// A context-window or content-policy failure a provider reports inside its stream, after its 200 and
// before the answer began (Bedrock's exception frame, Anthropic's `error` event, Google's error
// event, Ollama's error line), is read as the same failure sent as an HTTP error: the attempt fails
// with that type, and the router's context-window / content-policy fallbacks take the call. Seen
// through the official openai SDK against every provider's wire mock.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI, { BadRequestError } from "openai";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { type ProviderMocks, providerDeployments, type StartedProviderMocks, startProviderMocks } from "../harness/provider-mocks.ts";
import { failure } from "../harness/util.ts";

const GROUPS = ["anthropic", "gemini", "vertex-gemini", "vertex-claude", "bedrock", "ollama"];

let started: StartedProviderMocks;
let mocks: ProviderMocks;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  started = await startProviderMocks({ serviceAccount: "in-stream-errors@acme.iam.gserviceaccount.com" });
  mocks = started.mocks;
  const deployments = providerDeployments(started, {});
  // The same deployment in a group with no fallbacks.
  const bedrock = deployments.find((d) => d.model_name === "bedrock")!;
  gw = await startTestGateway({
    model_list: [...deployments, { ...bedrock, model_name: "bedrock-alone", model_info: { id: "dep-bedrock-alone" } }],
    router_settings: {
      context_window_fallbacks: GROUPS.map((g) => ({ [g]: ["openai"] })),
      content_policy_fallbacks: GROUPS.map((g) => ({ [g]: ["openai"] })),
    },
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
}, 30_000);

afterAll(async () => {
  await gw?.stop();
  await started?.stop();
});

beforeEach(() => {
  for (const m of Object.values(mocks)) m.reset();
});

const messages = [{ role: "user" as const, content: "hi there" }];

/** A stream on `model`: the group that answered, the fallbacks tried, and the text. */
async function streamed(model: string): Promise<{ group: string | null; fallbacks: string | null; text: string }> {
  const { data, response } = await client.chat.completions.create({ model, messages, stream: true }).withResponse();
  let text = "";
  for await (const c of data) text += c.choices[0]?.delta.content ?? "";
  return { group: response.headers.get("x-svc-model-group"), fallbacks: response.headers.get("x-svc-attempted-fallbacks"), text };
}

/** Answered by the fallback (the OpenAI mock), after one fallback. */
function expectFellBack(r: { group: string | null; fallbacks: string | null; text: string }): void {
  expect(r).toMatchObject({ group: "openai", fallbacks: "1" });
  expect(r.text).toContain("hi there");
  expect(mocks.openai.requests.length).toBe(1);
}

const anthropicErrorEvent = (type: string, message: string) => `event: error\ndata: ${JSON.stringify({ type: "error", error: { type, message } })}\n\n`;
const googleErrorEvent = (message: string) => `data: ${JSON.stringify({ error: { code: 400, message, status: "INVALID_ARGUMENT" } })}\n\n`;
const GOOGLE_TOO_LONG = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).";

describe("context-window errors inside a stream fall back as an HTTP one does", () => {
  for (const afterFrames of [0, 1]) {
    test(`bedrock: a validationException frame "Input is too long" after ${afterFrames} frame(s)`, async () => {
      mocks.bedrock.fault({ kind: "exception", afterFrames, exceptionType: "validationException", message: "Input is too long for requested model." });
      expectFellBack(await streamed("bedrock"));
    });
  }

  test("anthropic: an error event invalid_request_error 'prompt is too long' after message_start", async () => {
    mocks.anthropic.fault({ kind: "streamError", afterEvents: 1, errorType: "invalid_request_error", message: "prompt is too long: 208310 tokens > 200000 maximum" });
    expectFellBack(await streamed("anthropic"));
  });

  test("vertex claude: the same error event", async () => {
    mocks.gemini.fault({ path: ":streamRawPredict", kind: "cannedStream", chunks: [anthropicErrorEvent("invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum")] });
    expectFellBack(await streamed("vertex-claude"));
  });

  test("gemini and vertex gemini: an error event 'The input token count … exceeds the maximum number of tokens allowed'", async () => {
    mocks.gemini.fault({ path: ":streamGenerateContent", kind: "cannedStream", chunks: [googleErrorEvent(GOOGLE_TOO_LONG)] });
    expectFellBack(await streamed("gemini"));
    mocks.openai.reset();
    mocks.gemini.fault({ path: ":streamGenerateContent", kind: "cannedStream", chunks: [googleErrorEvent(GOOGLE_TOO_LONG)] });
    expectFellBack(await streamed("vertex-gemini"));
  });

  test("ollama: an error line 'the input length exceeds the context length'", async () => {
    const line = new TextEncoder().encode(`${JSON.stringify({ error: "the input length exceeds the context length" })}\n`);
    mocks.ollama.fault({ kind: "wire", shape: () => ({ bytes: line, cuts: [] }) });
    expectFellBack(await streamed("ollama"));
  });
});

describe("content-policy errors inside a stream", () => {
  test("bedrock: a validationException frame saying the content filters blocked the request → content_policy_fallbacks", async () => {
    mocks.bedrock.fault({ kind: "exception", afterFrames: 1, exceptionType: "validationException", message: "This request has been blocked by our content filters." });
    expectFellBack(await streamed("bedrock"));
  });
});

describe("other errors inside a stream are unchanged", () => {
  test("an ordinary invalid_request_error event: a 400 invalid_request_error, no fallback", async () => {
    mocks.anthropic.fault({ kind: "streamError", afterEvents: 1, errorType: "invalid_request_error", message: "messages: roles must alternate" });
    const err = await failure(streamed("anthropic"));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as BadRequestError).type).toBe("invalid_request_error");
    expect(mocks.openai.requests.length).toBe(0);
  });

  test("without a fallback: the client gets a 400 context_window_exceeded with the provider's message", async () => {
    mocks.bedrock.fault({ kind: "exception", afterFrames: 0, exceptionType: "validationException", message: "Input is too long for requested model." });
    const err = await failure(streamed("bedrock-alone"));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as BadRequestError).type).toBe("context_window_exceeded");
    expect((err as BadRequestError).message).toContain("Input is too long for requested model.");
  });
});
