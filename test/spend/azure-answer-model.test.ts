// An Azure deployment whose name the price file does not know (`azure/gpt-4o-prod`) is priced as the
// model Azure's answer names (`gpt-4o-2024-08-06`), whether its usage came from Azure or was
// estimated by the gateway: a stream on an api-version before stream_options (Azure sends no usage
// chunk), a stream cut mid-answer, a client that leaves, a JSON answer without usage. Seen through
// the official openai SDK against the Azure mock, with the spend log row each call leaves.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI, { APIError } from "openai";
import type { ChatCompletionChunk } from "openai/resources/chat/completions";
import bundled from "../../core/cost/data/model_prices_and_context_window.json" with { type: "json" };
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { failure, waitFor } from "../harness/util.ts";
import { type MockAzure, startMockAzure } from "../mock-upstream/azure.ts";

const API_KEY = "azure-key-0123456789abcdef";
const ANSWER_MODEL = "gpt-4o-2024-08-06";
const PRICE = bundled[`azure/${ANSWER_MODEL}`] as { input_cost_per_token: number; output_cost_per_token: number };

let mock: MockAzure;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockAzure({ apiKey: API_KEY, deployments: { "gpt-4o-prod": ANSWER_MODEL } });
  const azure = (extra: Record<string, unknown> = {}) => ({ model: "azure/gpt-4o-prod", api_base: mock.url, api_key: API_KEY, ...extra });
  gw = await startTestGateway(
    {
      model_list: [
        { model_name: "gpt", svc_params: azure() },
        { model_name: "gpt-2024-06", svc_params: azure({ api_version: "2024-06-01" }) },
      ],
      general_settings: { master_key: MASTER_KEY },
    },
    { store: {} },
  );
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
});

afterAll(async () => {
  await gw?.stop();
  await mock?.stop();
});

beforeEach(() => mock.reset());

interface LogRow {
  call_id: string;
  request_id: string;
  status: string;
  stream: boolean;
  prompt_tokens: number;
  completion_tokens: number;
  spend: string;
  metadata: Record<string, unknown>;
}

async function logRow(where: ReturnType<typeof sql>): Promise<LogRow> {
  return waitFor(
    async () => {
      await gw.host!.spendWriter.flush();
      return (await rows<LogRow>(gw.host!.store.db, sql`select * from spend_logs where ${where}`))[0];
    },
    (r) => r !== undefined,
    "the call's spend log row",
  ) as Promise<LogRow>;
}

const messages = [{ role: "user" as const, content: "hello there friend of mine, tell me a long story about dragons and knights" }];

/** The row is priced as the answer's model, at its tokens: not logged at 0 with "no price for azure/gpt-4o-prod". */
function expectPricedAsAnswerModel(row: LogRow): void {
  expect(row.prompt_tokens).toBeGreaterThan(0);
  expect(row.metadata.cost_note).toBeUndefined();
  expect(Number(row.spend)).toBeGreaterThan(0);
  expect(Number(row.spend)).toBeCloseTo(row.prompt_tokens * PRICE.input_cost_per_token + row.completion_tokens * PRICE.output_cost_per_token, 12);
}

/** The SSE events of an Azure stream's rendered bytes, and the offset just after event `n` (1-based). */
function afterEvent(rendered: Uint8Array, n: number): number {
  const text = new TextDecoder().decode(rendered);
  let at = 0;
  for (let i = 0; i < n; i++) at = text.indexOf("\n\n", at) + 2;
  return new TextEncoder().encode(text.slice(0, at)).length;
}

describe("Azure calls priced as the model the answer names", () => {
  test("a stream on an api-version before stream_options (no usage chunk): its estimated tokens at gpt-4o-2024-08-06's price", async () => {
    const stream = await client.chat.completions.create({ model: "gpt-2024-06", messages, stream: true, stream_options: { include_usage: true } });
    const chunks: ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    expect(mock.requests[0]!.body).not.toHaveProperty("stream_options");
    expect(chunks[0]!.model).toBe(ANSWER_MODEL);
    const row = await logRow(sql`request_id = ${chunks[0]!.id}`);
    expect(row).toMatchObject({ status: "success", stream: true });
    // The answer at a token a content chunk, the prompt at four characters a token.
    expect(row.completion_tokens).toBe(chunks.filter((c) => (c.choices[0]?.delta.content ?? "") !== "").length);
    expect(chunks.at(-1)!.usage).toMatchObject({ prompt_tokens: row.prompt_tokens, completion_tokens: row.completion_tokens });
    expectPricedAsAnswerModel(row);
  });

  test("a stream cut after its answer began: charged what it streamed, at the answer model's price", async () => {
    // Azure's prompt-filter chunk, the role chunk and two content chunks, then the connection drops.
    mock.fault({ kind: "cutStream", afterParts: 4 });
    const stream = await client.chat.completions.create({ model: "gpt", messages, stream: true });
    const chunks: ChatCompletionChunk[] = [];
    const err = await failure(
      (async () => {
        for await (const c of stream) chunks.push(c);
      })(),
    );
    expect(err).toBeInstanceOf(APIError);
    const row = await logRow(sql`request_id = ${chunks[0]!.id}`);
    expect(row).toMatchObject({ status: "failure", completion_tokens: 2 });
    expectPricedAsAnswerModel(row);
  });

  test("a client that leaves mid-answer: charged what it was sent, at the answer model's price", async () => {
    // Three events (prompt filter, role, first words), then Azure goes quiet until the client leaves.
    mock.fault({ kind: "wire", shape: (rendered) => ({ cuts: [], end: { at: afterEvent(rendered, 3), how: "stall" } }) });
    const { data: stream, response } = await client.chat.completions.create({ model: "gpt", messages, stream: true }).withResponse();
    for await (const c of stream) {
      if (c.choices[0]?.delta.content) break;
    }
    const row = await logRow(sql`call_id = ${response.headers.get("x-svc-call-id")}`);
    expect(row).toMatchObject({ status: "cancelled", completion_tokens: 1 });
    expectPricedAsAnswerModel(row);
  });

  test("a client that leaves before the answer began (only the role chunk came): its prompt at the answer model's price", async () => {
    mock.fault({ kind: "wire", shape: (rendered) => ({ cuts: [], end: { at: afterEvent(rendered, 2), how: "stall" } }) });
    // The gateway sends its response (with ': waiting for the model') after a second without an answer.
    const { data: stream, response } = await client.chat.completions.create({ model: "gpt", messages, stream: true }).withResponse();
    stream.controller.abort();
    const row = await logRow(sql`call_id = ${response.headers.get("x-svc-call-id")}`);
    expect(row).toMatchObject({ status: "cancelled", completion_tokens: 0 });
    expectPricedAsAnswerModel(row);
  });

  test("a JSON answer without usage: its estimated tokens at the answer model's price", async () => {
    const answer = {
      id: "chatcmpl-no-usage",
      object: "chat.completion",
      created: 1_700_000_000,
      model: ANSWER_MODEL,
      choices: [{ index: 0, finish_reason: "stop", message: { role: "assistant", content: "Once upon a time there was a dragon." } }],
    };
    mock.fault({ kind: "answer", body: answer });
    const { data, response } = await client.chat.completions.create({ model: "gpt-2024-06", messages }).withResponse();
    expect(data.id).toBe("chatcmpl-no-usage");
    const row = await logRow(sql`request_id = ${data.id}`);
    expectPricedAsAnswerModel(row);
    expect(Number(response.headers.get("x-svc-response-cost"))).toBeCloseTo(Number(row.spend), 12);
  });
});
