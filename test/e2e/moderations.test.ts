// Moderation (`POST /v1/moderations`) through the official `openai` SDK: forwarded to an OpenAI-shaped
// upstream (the mock flags texts that say "kill") or answered by the mock provider; a request that
// names no model goes to the configured moderation model, and without one it is a clear 400.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI, { BadRequestError, UnprocessableEntityError } from "openai";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { failure } from "../harness/util.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const UPSTREAM_KEY = "sk-upstream-moderation-0123456789";

let mock: MockOpenAI;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "chat", svc_params: { model: "mock/chat" } },
      { model_name: "omni", svc_params: { model: "openai/omni-moderation-latest", api_base: mock.url, api_key: UPSTREAM_KEY } },
      { model_name: "mock-moderation", svc_params: { model: "mock/omni-moderation-latest" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await gw?.stop();
  await mock?.stop();
});

describe("moderations", () => {
  test("the upstream's verdict reaches the SDK; the upstream got the deployment's model; the call is logged, free", async () => {
    mock.reset();
    const { data, response } = await client.moderations.create({ model: "omni", input: "I will kill the process" }).withResponse();
    expect(data.results[0]!.flagged).toBe(true);
    expect(data.results[0]!.categories.violence).toBe(true);
    expect(mock.requests.at(-1)!.body).toEqual({ model: "omni-moderation-latest", input: "I will kill the process" });
    await gw.host!.spendWriter.flush();
    const [row] = await rows<{ call_type: string; model: string; spend: string }>(gw.host!.store.db, sql`select call_type, model, spend::text as spend from spend_logs where call_id = ${response.headers.get("x-svc-call-id")}`);
    expect(row).toEqual({ call_type: "moderations", model: "omni", spend: "0.000000000000" });
  });

  test("without a model the configured moderation model answers, one result per input", async () => {
    mock.reset();
    const r = await client.moderations.create({ input: ["good morning", "kill it"] });
    expect(r.results.map((x) => x.flagged)).toEqual([false, true]);
    expect(mock.requests).toHaveLength(1);
  });

  test("the mock provider moderates too", async () => {
    const r = await client.moderations.create({ model: "mock-moderation", input: "they attack at dawn" });
    expect(r.results[0]!.flagged).toBe(true);
  });

  test("a missing input is a 422 naming it; no model and no moderation model configured is a 400 naming model", async () => {
    const noInput = await failure(client.moderations.create({ model: "omni" } as never));
    expect(noInput).toBeInstanceOf(UnprocessableEntityError);
    expect((noInput as UnprocessableEntityError).param).toBe("input");
    const bare = await startTestGateway({ model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" } }], general_settings: { master_key: MASTER_KEY } });
    try {
      const other = new OpenAI({ apiKey: MASTER_KEY, baseURL: bare.baseURL, maxRetries: 0 });
      const err = await failure(other.moderations.create({ input: "x" }));
      expect(err).toBeInstanceOf(BadRequestError);
      expect((err as BadRequestError).param).toBe("model");
    } finally {
      await bare.stop();
    }
  });
});
