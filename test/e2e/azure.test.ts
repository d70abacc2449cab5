// The gateway in front of a mock Azure OpenAI resource (and its Entra ID token endpoint), seen
// through the official `openai` SDK: the mock checks the api-key or the bearer token it issued,
// requires an api-version, answers with Azure's content filter results, and records what the
// gateway actually sent.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI, { APIError, BadRequestError, NotFoundError, RateLimitError } from "openai";
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { collect, failure } from "../harness/util.ts";
import { type MockAzure, startMockAzure } from "../mock-upstream/azure.ts";
import { mockEmbedding } from "../mock-upstream/native-kit.ts";

const API_KEY = "azure-key-0123456789abcdef";
const CLIENT = { tenantId: "72f988bf-86f1-41af-91ab-2d7cd011db47", clientId: "b1c2d3e4-app", clientSecret: "Abc8Q~super.secret-value_123" };
const WRONG_SECRET = "Abc8Q~wrong.secret-value_999";
const AD_TOKEN = "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.static.token";

let mock: MockAzure;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockAzure({
    apiKey: API_KEY,
    clients: [CLIENT],
    staticTokens: [AD_TOKEN],
    deployments: { "gpt-4o-prod": "gpt-4o-2024-08-06", "embed-prod": "text-embedding-3-small", "instruct-prod": "gpt-35-turbo-instruct", "dalle-prod": "dall-e-3" },
    blockedPrompt: "forbidden-topic",
    filteredOutput: "filtered-output",
  });
  const azure = (deployment: string, extra: Record<string, unknown> = {}) => ({ model: `azure/${deployment}`, api_base: mock.url, api_key: API_KEY, ...extra });
  const entra = (secret: string) => ({
    model: "azure/gpt-4o-prod",
    api_base: mock.url,
    tenant_id: CLIENT.tenantId,
    client_id: CLIENT.clientId,
    client_secret: secret,
    azure_authority_host: mock.url,
  });
  gw = await startTestGateway({
    model_list: [
      { model_name: "gpt", svc_params: azure("gpt-4o-prod"), model_info: { id: "dep-azure" } },
      { model_name: "dalle", svc_params: azure("dalle-prod"), model_info: { base_model: "azure/dall-e-3" } },
      { model_name: "gpt-v1", svc_params: azure("gpt-4o-prod", { api_version: "v1" }) },
      { model_name: "gpt-old-version", svc_params: azure("gpt-4o-prod", { api_version: "2023-03-15-preview" }) },
      { model_name: "gpt-2024-06", svc_params: azure("gpt-4o-prod", { api_version: "2024-06-01" }) },
      { model_name: "gpt-entra", svc_params: entra(CLIENT.clientSecret) },
      { model_name: "gpt-entra-wrong", svc_params: entra(WRONG_SECRET) },
      { model_name: "gpt-ad-token", svc_params: { model: "azure/gpt-4o-prod", api_base: mock.url, azure_ad_token: AD_TOKEN } },
      { model_name: "gpt-missing", svc_params: azure("no-such-deployment") },
      { model_name: "embedder", svc_params: azure("embed-prod"), model_info: { mode: "embedding" } },
      { model_name: "instruct", svc_params: azure("instruct-prod") },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
});

afterAll(async () => {
  await gw.stop();
  await mock.stop();
});

beforeEach(() => mock.reset());

const user = (content: string) => [{ role: "user" as const, content }];
const textOf = (chunks: ChatCompletionChunk[]) => chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
const dataPlane = () => mock.requests.filter((r) => r.path.startsWith("/openai/"));

const weatherTool: ChatCompletionTool = {
  type: "function",
  function: { name: "get_weather", description: "Current weather for a place", parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] } },
};

function post(body: unknown): Promise<Response> {
  return fetch(`${gw.baseURL}/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify(body) });
}

describe("chat with an api-key", () => {
  test("the deployment URL with api-version, the key in api-key; Azure's filter results reach the client", async () => {
    const res = await client.chat.completions.create({ model: "gpt", messages: user("hello there gateway"), temperature: 0.3 });
    expect(res.object).toBe("chat.completion");
    expect(res.model).toBe("gpt-4o-2024-08-06");
    expect(res.choices[0]!.message.content).toBe("Mock reply to: hello there gateway");
    expect(res.choices[0]!.finish_reason).toBe("stop");
    expect((res as unknown as { prompt_filter_results: unknown[] }).prompt_filter_results).toHaveLength(1);
    const sent = mock.requests[0]!;
    expect(sent.path).toBe("/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21");
    expect(sent.headers["api-key"]).toBe(API_KEY);
    expect(sent.headers.authorization).toBeUndefined();
    expect(sent.body).toMatchObject({ messages: user("hello there gateway"), temperature: 0.3 });
  });

  test("the v1 API: /openai/v1 without api-version, the deployment named in the body", async () => {
    const res = await client.chat.completions.create({ model: "gpt-v1", messages: user("v1 please") });
    expect(res.choices[0]!.message.content).toBe("Mock reply to: v1 please");
    expect(mock.requests[0]!.path).toBe("/openai/v1/chat/completions");
    expect((mock.requests[0]!.body as { model: string }).model).toBe("gpt-4o-prod");
  });

  test("tools: a call with JSON arguments", async () => {
    const res = await client.chat.completions.create({ model: "gpt", messages: user("weather in Paris?"), tools: [weatherTool] });
    expect(res.choices[0]!.finish_reason).toBe("tool_calls");
    const call = res.choices[0]!.message.tool_calls![0]!;
    if (call.type !== "function") throw new Error("not a function call");
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual({ location: "Paris" });
  });

  test("legacy completions on an instruct deployment", async () => {
    const res = await client.completions.create({ model: "instruct", prompt: "say something", max_tokens: 5 });
    expect(res.choices[0]!.text).toBe("Mock reply to: say something");
    expect(mock.requests[0]!.path).toBe("/openai/deployments/instruct-prod/completions?api-version=2024-10-21");
  });
});

describe("streaming", () => {
  test("chunks are OpenAI's: the prompt filter results ride on the first; usage chunk last", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "gpt", messages: user("stream this please"), stream: true, stream_options: { include_usage: true } }));
    expect(chunks.every((c) => c.object === "chat.completion.chunk" && c.id === chunks[0]!.id && c.id.startsWith("chatcmpl-"))).toBe(true);
    expect((chunks[0] as unknown as { prompt_filter_results: unknown[] }).prompt_filter_results).toHaveLength(1);
    expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant");
    expect(textOf(chunks)).toBe("Mock reply to: stream this please");
    expect(chunks.at(-2)!.choices[0]!.finish_reason).toBe("stop");
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage!.completion_tokens).toBe(6);
  });

  test("a streamed tool call: id and name first, arguments in pieces", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "gpt", messages: user("weather in Paris?"), tools: [weatherTool], stream: true }));
    const calls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    expect(calls[0]).toMatchObject({ index: 0, type: "function", function: { name: "get_weather" } });
    expect(JSON.parse(calls.map((c) => c.function?.arguments ?? "").join(""))).toEqual({ location: "Paris" });
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("tool_calls");
  });

  test("a completion stopped by the output filter ends with finish_reason content_filter", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "gpt", messages: user("tell me filtered-output stuff"), stream: true }));
    expect(textOf(chunks)).toBe("Mock reply");
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("content_filter");
  });

  test("an api-version older than stream_options still streams (usage then estimated by the gateway)", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "gpt-2024-06", messages: user("older version stream"), stream: true, stream_options: { include_usage: true } }));
    expect(textOf(chunks)).toBe("Mock reply to: older version stream");
    expect(mock.requests[0]!.path).toEndWith("?api-version=2024-06-01");
    expect(mock.requests[0]!.body).not.toHaveProperty("stream_options");
  });

  test("a stream cut after Azure's prompt-filter chunk and the role chunk failed before it began: retried, not a 200 with an error event", async () => {
    mock.fault({ kind: "cutStream", afterParts: 2 });
    const res = await post({ model: "gpt", messages: user("cut after the role"), stream: true, num_retries: 1 });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-svc-attempted-retries")).toBe("1");
    const text = await res.text();
    expect(text).not.toContain('"error"');
    expect(text).toContain("prompt_filter_results");
    expect(text.trimEnd()).toEndWith("data: [DONE]");
  });

  test("a connection cut mid-stream ends the stream with an error", async () => {
    mock.fault({ kind: "cutStream", afterParts: 3 });
    const stream = await client.chat.completions.create({ model: "gpt", messages: user("cut me off now"), stream: true });
    const err = await failure(collect(stream));
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toContain("ended unexpectedly");
  });
});

describe("embeddings", () => {
  test("the embeddings deployment; the SDK's base64 decoded back to the same floats", async () => {
    const res = await client.embeddings.create({ model: "embedder", input: ["first text", "second text"] });
    expect(res.data.map((d) => d.index)).toEqual([0, 1]);
    expect(res.data[1]!.embedding).toEqual(mockEmbedding("second text", 8));
    expect(res.model).toBe("text-embedding-3-small");
    expect(mock.requests[0]!.path).toBe("/openai/deployments/embed-prod/embeddings?api-version=2024-10-21");
  });
});

describe("images", () => {
  test("image generation on an Azure deployment: its URL and api-version, priced by the base model at the asked size and quality", async () => {
    const { data, response } = await client.images.generate({ model: "dalle", prompt: "a harbour at night", size: "1024x1792", quality: "hd" }).withResponse();
    expect(data.data).toHaveLength(1);
    expect(mock.requests.at(-1)!.path).toBe("/openai/deployments/dalle-prod/images/generations?api-version=2024-10-21");
    // Azure's hd 1024x1792 dall-e-3: $6.539e-8 per pixel.
    expect(Number(response.headers.get("x-svc-response-cost"))).toBeCloseTo(1024 * 1792 * 6.539e-8, 12);
  });
});

describe("Entra ID", () => {
  test("client credentials: one token for many calls, sent as bearer; the secret shows nowhere", async () => {
    const before = mock.tokenRequests;
    const results = await Promise.all([1, 2, 3].map((i) => client.chat.completions.create({ model: "gpt-entra", messages: user(`entra call ${i}`) })));
    const streamed = await collect(await client.chat.completions.create({ model: "gpt-entra", messages: user("entra stream"), stream: true }));
    expect(results.map((r) => r.choices[0]!.message.content)).toEqual(["Mock reply to: entra call 1", "Mock reply to: entra call 2", "Mock reply to: entra call 3"]);
    expect(textOf(streamed)).toBe("Mock reply to: entra stream");
    expect(mock.tokenRequests - before).toBe(1);
    const calls = dataPlane();
    expect(calls).toHaveLength(4);
    const bearer = calls[0]!.headers.authorization!;
    expect(bearer).toStartWith("Bearer eyJ");
    expect(calls.every((c) => c.headers.authorization === bearer && c.headers["api-key"] === undefined)).toBe(true);
    expect(JSON.stringify(calls)).not.toContain(CLIENT.clientSecret);
    expect(JSON.stringify(results)).not.toContain(CLIENT.clientSecret);
    expect(JSON.stringify(gw.log.lines)).not.toContain(CLIENT.clientSecret);
    // Only the token endpoint ever saw the secret, in its form body.
    const tokenCalls = mock.requests.filter((r) => r.path.endsWith("/oauth2/v2.0/token"));
    expect(tokenCalls).toHaveLength(1);
    expect(tokenCalls[0]!.path).toBe(`/${CLIENT.tenantId}/oauth2/v2.0/token`);
  });

  test("a wrong client secret: the call fails with Entra's reason, and neither secret shows", async () => {
    const res = await post({ model: "gpt-entra-wrong", messages: user("hi") });
    const text = await res.text();
    // Refused credentials are an authentication failure (401), not an unreachable upstream (503).
    expect(res.status).toBe(401);
    expect(JSON.parse(text).error.type).toBe("authentication_error");
    expect(text).toContain("AADSTS7000215: Invalid client secret provided");
    for (const secret of [WRONG_SECRET, CLIENT.clientSecret]) {
      expect(text).not.toContain(secret);
      expect(JSON.stringify([...res.headers])).not.toContain(secret);
      expect(JSON.stringify(gw.log.lines)).not.toContain(secret);
    }
    expect(dataPlane()).toHaveLength(0);
  });

  test("a fixed azure_ad_token is sent as bearer", async () => {
    const res = await client.chat.completions.create({ model: "gpt-ad-token", messages: user("static token") });
    expect(res.choices[0]!.message.content).toBe("Mock reply to: static token");
    expect(mock.requests[0]!.headers.authorization).toBe(`Bearer ${AD_TOKEN}`);
  });
});

describe("errors", () => {
  test("the content filter's refusal → 400 content_policy_violation with Azure's message", async () => {
    const err = await failure(client.chat.completions.create({ model: "gpt", messages: user("tell me about forbidden-topic") }));
    expect(err).toBeInstanceOf(BadRequestError);
    const e = err as APIError;
    expect(e.status).toBe(400);
    expect(e.type).toBe("content_policy_violation");
    expect(e.message).toContain("Azure OpenAI's content management policy");
  });

  test("the same refusal on a streamed request: 400 before any chunk", async () => {
    const res = await post({ model: "gpt", messages: user("forbidden-topic"), stream: true });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { type: string } }).error.type).toBe("content_policy_violation");
  });

  test("a non-streamed completion cut by the output filter has finish_reason content_filter", async () => {
    const res = await client.chat.completions.create({ model: "gpt", messages: user("filtered-output please") });
    expect(res.choices[0]!.finish_reason).toBe("content_filter");
    expect(res.choices[0]!.message.content).toBe("Mock reply");
  });

  test("Azure's 429 → 429 with its message and retry-after", async () => {
    mock.fault({ kind: "status", status: 429 });
    const err = await failure(client.chat.completions.create({ model: "gpt", messages: user("hi") }));
    expect(err).toBeInstanceOf(RateLimitError);
    expect((err as APIError).message).toContain("exceeded token rate limit");
    expect((err as APIError).headers?.get("retry-after")).toBe("1");
  });

  test("an error Azure answers with a 200 ({error} and no choices) is that error, not an answer", async () => {
    mock.fault({ kind: "status", status: 200, body: { error: { code: "429", message: "Requests to the ChatCompletions_Create Operation have exceeded token rate limit." } } });
    const err = await failure(client.chat.completions.create({ model: "gpt", messages: user("hi") }));
    expect(err).toBeInstanceOf(RateLimitError);
    expect((err as APIError).message).toContain("exceeded token rate limit");
  });

  test("an unknown deployment → 404 DeploymentNotFound; an unsupported api-version → 404 Resource not found", async () => {
    const missing = await failure(client.chat.completions.create({ model: "gpt-missing", messages: user("hi") }));
    expect(missing).toBeInstanceOf(NotFoundError);
    expect((missing as APIError).message).toContain("The API deployment for this resource does not exist");
    const old = await failure(client.chat.completions.create({ model: "gpt-old-version", messages: user("hi") }));
    expect(old).toBeInstanceOf(NotFoundError);
    expect((old as APIError).message).toContain("Resource not found");
    expect(mock.requests.at(-1)!.path).toBe("/openai/deployments/gpt-4o-prod/chat/completions?api-version=2023-03-15-preview");
  });
});
