// The provider's terminal event (OpenAI's `data: [DONE]`, Anthropic's `message_stop`) ends the
// stream, not the end of the upstream's body: an upstream that holds its connection open after it
// still gives the client its `[DONE]` at once (a success, not a stall or a client that gave up), and
// whatever an upstream sends after it is neither passed on nor charged. Seen through the openai SDK
// against the OpenAI and Anthropic wire mocks, the spend log read from PostgreSQL. With `n` choices,
// one choice's finish is not the end of the answer: a body that ends before each has one is cut.
import { afterAll, beforeAll, beforeEach, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI from "openai";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { waitFor } from "../harness/util.ts";
import { type MockAnthropic, startMockAnthropic } from "../mock-upstream/anthropic.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

interface LogRow {
  status: string;
  prompt_tokens: number;
  completion_tokens: number;
}

let openai: MockOpenAI;
let anthropic: MockAnthropic;
let gw: TestGateway;
let client: OpenAI;
/** Whether the gateway hung up on the upstream's body. */
let upstreamCancelled = false;

beforeAll(async () => {
  openai = await startMockOpenAI({ apiKey: "sk-up" });
  anthropic = await startMockAnthropic({ apiKey: "sk-ant" });
  gw = await startBackendGateway("postgres", {
    model_list: [
      { model_name: "gpt", svc_params: { model: "openai/gpt-4o-mini", api_base: openai.url, api_key: "sk-up" } },
      // A stall after the terminal event is no stall: this one would end it with a 408 after 1 s.
      { model_name: "gpt-st", svc_params: { model: "openai/gpt-4o-mini", api_base: openai.url, api_key: "sk-up", stream_timeout: 1 } },
      { model_name: "claude", svc_params: { model: "anthropic/claude-3-5-sonnet-20241022", api_base: anthropic.url, api_key: "sk-ant" } },
    ],
    router_settings: { num_retries: 0 },
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
}, 30_000);

afterAll(async () => {
  await gw?.stop();
  await openai?.stop();
  await anthropic?.stop();
});

beforeEach(() => {
  openai.reset();
  anthropic.reset();
  upstreamCancelled = false;
});

/** The mock's whole answer, then `after`, then a clean end or a body held open. */
function fault(mock: MockOpenAI | MockAnthropic, after: string, how: "close" | "stall"): void {
  mock.fault({
    kind: "wire",
    shape: (rendered: Uint8Array) => {
      const bytes = new TextEncoder().encode(new TextDecoder().decode(rendered) + after);
      return { bytes, cuts: [rendered.length], end: { at: bytes.length, how }, onCancel: () => (upstreamCancelled = true) };
    },
  });
}

/** A stream read through the SDK: its text, usage chunks, how long it took and its log row. */
async function streamed(model: string): Promise<{ text: string; usages: OpenAI.CompletionUsage[]; ms: number; row: LogRow }> {
  const started = performance.now();
  const { data, response } = await client.chat.completions
    .create({ model, stream: true, stream_options: { include_usage: true }, messages: [{ role: "user", content: "one two three" }] }, { timeout: 8000 })
    .withResponse();
  let text = "";
  const usages: OpenAI.CompletionUsage[] = [];
  for await (const c of data) {
    text += c.choices[0]?.delta.content ?? "";
    if (c.usage) usages.push(c.usage);
  }
  const ms = performance.now() - started;
  const callId = response.headers.get("x-svc-call-id");
  const read = async () => {
    await gw.host!.spendWriter.flush();
    return rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where call_id = ${callId}`);
  };
  const [row] = await waitFor(read, (r) => r.length === 1, "the call's log row");
  return { text, usages, ms, row: row! };
}

const openAIChunk = (body: object) => `data: ${JSON.stringify({ id: "chatcmpl-after", object: "chat.completion.chunk", created: 1, model: "gpt-4o-mini", ...body })}\n\n`;

for (const model of ["gpt", "gpt-st"]) {
  test(`${model}: an upstream that holds its body open after [DONE]: the client gets [DONE] at once, a success; the upstream is hung up on`, async () => {
    fault(openai, "", "stall");
    const r = await streamed(model);
    expect(r.text).toContain("one two three");
    expect(r.ms).toBeLessThan(900);
    expect(r.row).toMatchObject({ status: "success" });
    expect(await waitFor(() => upstreamCancelled, Boolean, "the upstream cancelled")).toBe(true);
  }, 15_000);
}

test("events after [DONE] are not passed on nor charged", async () => {
  fault(openai, openAIChunk({ choices: [{ index: 0, delta: { content: "AFTER" }, finish_reason: null }] }) + openAIChunk({ choices: [], usage: { prompt_tokens: 100, completion_tokens: 100, total_tokens: 200 } }), "close");
  const r = await streamed("gpt");
  expect(r.text).not.toContain("AFTER");
  expect(r.usages).toHaveLength(1);
  expect(r.usages[0]!.completion_tokens).toBeLessThan(100);
  expect(r.row).toMatchObject({ status: "success", prompt_tokens: r.usages[0]!.prompt_tokens, completion_tokens: r.usages[0]!.completion_tokens });
});

const anthropicEvent = (type: string, body: object) => `event: ${type}\ndata: ${JSON.stringify({ type, ...body })}\n\n`;

test("anthropic: an upstream that holds its body open after message_stop: the client gets [DONE] at once, a success", async () => {
  fault(anthropic, "", "stall");
  const r = await streamed("claude");
  expect(r.text).toContain("one two three");
  expect(r.ms).toBeLessThan(900);
  expect(r.row).toMatchObject({ status: "success" });
  expect(await waitFor(() => upstreamCancelled, Boolean, "the upstream cancelled")).toBe(true);
}, 15_000);

test("anthropic: events after message_stop are not passed on nor charged", async () => {
  fault(
    anthropic,
    anthropicEvent("content_block_delta", { index: 0, delta: { type: "text_delta", text: "AFTER" } }) +
      anthropicEvent("message_delta", { delta: { stop_reason: "end_turn", stop_sequence: null }, usage: { output_tokens: 100 } }),
    "close",
  );
  const r = await streamed("claude");
  expect(r.text).not.toContain("AFTER");
  expect(r.usages).toHaveLength(1);
  expect(r.usages[0]!.completion_tokens).toBeLessThan(100);
  expect(r.row).toMatchObject({ status: "success", completion_tokens: r.usages[0]!.completion_tokens });
});

/** The bytes of an n=2 answer whose second choice never finishes, then a clean end. */
function n2CutAfterFirstFinish(): void {
  const body =
    openAIChunk({ choices: [0, 1].map((index) => ({ index, delta: { role: "assistant", content: "" }, finish_reason: null })) }) +
    openAIChunk({ choices: [{ index: 0, delta: { content: "A one" }, finish_reason: null }] }) +
    openAIChunk({ choices: [{ index: 1, delta: { content: "B one" }, finish_reason: null }] }) +
    openAIChunk({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] }) +
    openAIChunk({ choices: [{ index: 1, delta: { content: " B two" }, finish_reason: null }] });
  const bytes = new TextEncoder().encode(body);
  openai.fault({ kind: "wire", shape: () => ({ bytes, cuts: [], end: { at: bytes.length, how: "close" } }) });
}

test("n=2: a body that ends after only the first choice finished is cut: a 503 error event, a failure charged what it streamed", async () => {
  n2CutAfterFirstFinish();
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "gpt", stream: true, n: 2, messages: [{ role: "user", content: "one two three" }] }),
  });
  const text = await res.text();
  expect(text).toContain('"content":" B two"');
  expect(text).not.toContain("[DONE]");
  expect(text).toContain("ended before the answer was complete");
  expect(text).toContain(`"code":"503"`);
  const read = async () => {
    await gw.host!.spendWriter.flush();
    return rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where call_id = ${res.headers.get("x-svc-call-id")}`);
  };
  const [row] = await waitFor(read, (r) => r.length === 1, "the call's log row");
  expect(row!.status).toBe("failure");
  expect(row!.completion_tokens).toBeGreaterThan(0);
});

test("n=2 through the SDK: an answer whose choices both finish (no usage, no [DONE]) is whole", async () => {
  const body =
    openAIChunk({ choices: [0, 1].map((index) => ({ index, delta: { role: "assistant", content: "" }, finish_reason: null })) }) +
    openAIChunk({ choices: [{ index: 0, delta: { content: "A" }, finish_reason: "stop" }] }) +
    openAIChunk({ choices: [{ index: 1, delta: { content: "B" }, finish_reason: "length" }] });
  const bytes = new TextEncoder().encode(body);
  openai.fault({ kind: "wire", shape: () => ({ bytes, cuts: [], end: { at: bytes.length, how: "close" } }) });
  const stream = await client.chat.completions.create({ model: "gpt", stream: true, n: 2, messages: [{ role: "user", content: "one two three" }] });
  const finishes: (string | null)[] = [];
  for await (const c of stream) for (const choice of c.choices) if (choice.finish_reason) finishes[choice.index] = choice.finish_reason;
  expect(finishes).toEqual(["stop", "length"]);
});
