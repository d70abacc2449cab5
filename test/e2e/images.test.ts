// Image generation (`POST /v1/images/generations`) through the official `openai` SDK: forwarded to an
// OpenAI-shaped upstream (the mock speaks OpenAI's wire format) or answered by the built-in mock
// provider; priced per image at the asked size and quality from the price table (dall-e-3 hd
// 1024x1024: $7.629e-8 per pixel), the price reserved against budgets before the upstream is
// asked, every call logged with call_type "images".
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI, { BadRequestError, UnprocessableEntityError } from "openai";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { failure } from "../harness/util.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const UPSTREAM_KEY = "sk-upstream-images-0123456789";
/** dall-e-3, hd, 1024x1024: OpenAI's $0.08 per image, stated per pixel in the price file. */
const HD_1024_USD = 1024 * 1024 * 7.629e-8;

let mock: MockOpenAI;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "dalle", svc_params: { model: "openai/dall-e-3", api_base: mock.url, api_key: UPSTREAM_KEY } },
      { model_name: "mock-dalle", svc_params: { model: "mock/dall-e-3" } },
      { model_name: "claude", svc_params: { model: "anthropic/claude-3-5-sonnet", api_base: "http://127.0.0.1:9", api_key: "sk-ant-x" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await gw?.stop();
  await mock?.stop();
});

async function logRow(callId: string): Promise<Record<string, unknown> | undefined> {
  await gw.host!.spendWriter.flush();
  const [row] = await rows<Record<string, unknown>>(gw.host!.store.db, sql`select call_type, model, status, spend::text as spend from spend_logs where call_id = ${callId}`);
  return row;
}

describe("image generation", () => {
  test("the SDK gets the upstream's images; the upstream got the deployment's model and the prompt; the cost is n images at the asked size and quality", async () => {
    mock.reset();
    const { data: answer, response } = await client.images.generate({ model: "dalle", prompt: "a red fox in snow", n: 2, size: "1024x1024", quality: "hd" }).withResponse();
    expect(answer.data).toHaveLength(2);
    expect(answer.data?.[0]?.url).toMatch(/^https:\/\/images\.mock\.invalid\//);
    const sent = mock.requests.at(-1)!;
    expect(sent.path).toBe("/v1/images/generations");
    expect(sent.body).toMatchObject({ model: "dall-e-3", prompt: "a red fox in snow", n: 2, size: "1024x1024", quality: "hd" });
    expect(sent.headers.authorization).toBe(`Bearer ${UPSTREAM_KEY}`);
    const cost = Number(response.headers.get("x-svc-response-cost"));
    expect(cost).toBeCloseTo(2 * HD_1024_USD, 12);
    const row = await logRow(response.headers.get("x-svc-call-id")!);
    expect(row).toMatchObject({ call_type: "images", model: "dalle", status: "success" });
    expect(Number(row!.spend)).toBeCloseTo(2 * HD_1024_USD, 12);
  });

  test("the built-in mock provider answers with base64 images when asked", async () => {
    const answer = await client.images.generate({ model: "mock-dalle", prompt: "a lighthouse", response_format: "b64_json" });
    expect(answer.data).toHaveLength(1);
    const png = Buffer.from(answer.data![0]!.b64_json!, "base64");
    expect(png.subarray(1, 4).toString()).toBe("PNG");
  });

  test("a key's budget holds the images' price before the upstream is asked: two hd images over $0.10 are refused, one fits", async () => {
    const key = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { max_budget: 0.1 } });
    const keyed = new OpenAI({ apiKey: key.body.key, baseURL: gw.baseURL, maxRetries: 0 });
    mock.reset();
    const refused = await failure(keyed.images.generate({ model: "dalle", prompt: "two foxes", n: 2, size: "1024x1024", quality: "hd" }));
    expect(refused).toBeInstanceOf(BadRequestError);
    expect((refused as BadRequestError).type).toBe("budget_exceeded");
    expect(mock.requests).toHaveLength(0);
    const one = await keyed.images.generate({ model: "dalle", prompt: "one fox", size: "1024x1024", quality: "hd" });
    expect(one.data).toHaveLength(1);
  });

  test("bad requests: a missing prompt or n out of range is a 422 naming the field; a stream, or a provider without image generation, a 400", async () => {
    const noPrompt = await failure(client.images.generate({ model: "dalle" } as never));
    expect(noPrompt).toBeInstanceOf(UnprocessableEntityError);
    expect((noPrompt as UnprocessableEntityError).param).toBe("prompt");
    const tooMany = await failure(client.images.generate({ model: "dalle", prompt: "x", n: 11 }));
    expect((tooMany as UnprocessableEntityError).param).toBe("n");
    const res = await fetch(`${gw.url}/v1/images/generations`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "dalle", prompt: "x", stream: true }),
    });
    expect(res.status).toBe(400);
    const claude = await failure(client.images.generate({ model: "claude", prompt: "x" }));
    expect(claude).toBeInstanceOf(BadRequestError);
    expect((claude as BadRequestError).message).toContain("does not support images");
  });

  test("without a model, the first image model answers (the spec makes model optional)", async () => {
    const res = await fetch(`${gw.url}/v1/images/generations`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ prompt: "a kite" }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-svc-model-group")).toBe("dalle");
    expect(((await res.json()) as { data: unknown[] }).data).toHaveLength(1);
  });

  test("the path forms: without /v1 and Azure's /openai/deployments/{model}/…", async () => {
    for (const path of ["/images/generations", "/openai/deployments/mock-dalle/images/generations"]) {
      const r = await requestJson<{ data: unknown[] }>(gw, "POST", path, { body: { model: "mock-dalle", prompt: "x", n: 3 } });
      expect(r.status).toBe(200);
      expect(r.body.data).toHaveLength(3);
    }
  });
});
