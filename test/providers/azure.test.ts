// Azure OpenAI golden fixtures: where a call goes (deployment URL, api-version, v1), which
// credentials it carries (api-key, a fixed Entra token, client-credential tokens fetched once and
// renewed before expiry), Azure's stream with its content-filter chunks (cut mid-JSON), and its
// content-filter refusal recognised as a content-policy error.

import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import type { ChatRequest, Deployment, WireJson } from "../../core/contract.ts";
import { CredentialsRefused } from "../../core/errors.ts";
import { usdToPico } from "../../core/cost/money.ts";
import { PriceTable } from "../../core/cost/prices.ts";
import { Pricing } from "../../core/cost/pricing.ts";
import { EntraTokenCache } from "../../providers/azure/entra-token.ts";
import { AZURE_DEFAULT_API_VERSION, azureAdapter, azureProvider } from "../../providers/azure/index.ts";
import { type MockAzure, startMockAzure } from "../mock-upstream/azure.ts";
import { assemble, chunks, cutEvery, runStream, usageOf } from "./run-stream.ts";

const ENV = ["AZURE_API_KEY", "AZURE_API_BASE", "AZURE_API_VERSION", "AZURE_AD_TOKEN", "AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_AUTHORITY_HOST"] as const;
const saved = Object.fromEntries(ENV.map((k) => [k, process.env[k]]));
afterEach(() => {
  for (const k of ENV) {
    if (saved[k] === undefined) delete process.env[k];
    else process.env[k] = saved[k];
  }
});

const BASE = "https://my-resource.openai.azure.com";

function resolve(over: Partial<Deployment>, adapter = azureProvider): Deployment | string {
  return adapter.resolve!({ id: "dep-az", modelName: "gpt", provider: "azure", upstreamModel: "gpt-4o-prod", options: {}, info: {}, ...over });
}

function deployment(over: Partial<Deployment>, adapter = azureProvider): Deployment {
  const d = resolve(over, adapter);
  if (typeof d === "string") throw new Error(d);
  return d;
}

const chatReq: ChatRequest = { model: "gpt", messages: [{ role: "user", content: "Hello" }], temperature: 0.5 };

describe("audio on Azure", () => {
  test("a transcription goes to the deployment as a form with the key in api-key; speech to its audio/speech, priced per character", () => {
    const d = deployment({ apiBase: BASE, apiKey: "az-key", upstreamModel: "whisper-prod" });
    const file = new File([new Uint8Array(16)], "a.wav");
    const t = azureProvider.endpoints.transcriptions!.request({ model: "w", file }, d);
    expect(t.url).toBe(`${BASE}/openai/deployments/whisper-prod/audio/transcriptions?api-version=2024-10-21`);
    expect(t.headers["api-key"]).toBe("az-key");
    expect(t.form?.get("file")).toBeInstanceOf(Blob);
    expect(t.form?.get("model")).toBe("whisper-prod");
    const speech = azureProvider.endpoints.speech!;
    const s = speech.request({ model: "tts", input: "hello", voice: "alloy" }, { ...d, upstreamModel: "tts-prod" });
    expect(s.url).toBe(`${BASE}/openai/deployments/tts-prod/audio/speech?api-version=2024-10-21`);
    expect(speech.binaryUsage!({ model: "tts", input: "hello", voice: "alloy" }, { bytes: 10, contentType: "audio/mpeg" }).characters).toBe(5);
  });
});

describe("address and static credentials", () => {
  test("deployment URL with the default GA api-version, the key in api-key, never as a bearer token", () => {
    const call = azureProvider.endpoints.chat!.request(chatReq, deployment({ apiBase: `${BASE}/`, apiKey: "az-key" }));
    expect(call.url).toBe(`${BASE}/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21`);
    expect(AZURE_DEFAULT_API_VERSION).toBe("2024-10-21");
    expect(call.headers["api-key"]).toBe("az-key");
    expect(call.headers.authorization).toBeUndefined();
    // The body is OpenAI's own (the transforms are the OpenAI adapter's).
    expect(JSON.parse(call.body!)).toEqual({ model: "gpt-4o-prod", messages: [{ role: "user", content: "Hello" }], temperature: 0.5 });
  });

  test("completions and embeddings; api_version from svc_params, then AZURE_API_VERSION; the v1 API", () => {
    process.env.AZURE_API_VERSION = "2024-06-01";
    const fromEnv = deployment({ apiBase: BASE, apiKey: "k" });
    expect(azureProvider.endpoints.embeddings!.request({ model: "e", input: "x" }, fromEnv).url).toBe(`${BASE}/openai/deployments/gpt-4o-prod/embeddings?api-version=2024-06-01`);
    const pinned = deployment({ apiBase: BASE, apiKey: "k", apiVersion: "2025-01-01-preview" });
    expect(azureProvider.endpoints.completions!.request({ model: "c", prompt: "x" }, pinned).url).toBe(`${BASE}/openai/deployments/gpt-4o-prod/completions?api-version=2025-01-01-preview`);
    const v1 = deployment({ apiBase: BASE, apiKey: "k", apiVersion: "v1" });
    const call = azureProvider.endpoints.chat!.request(chatReq, v1);
    expect(call.url).toBe(`${BASE}/openai/v1/chat/completions`);
    expect((JSON.parse(call.body!) as WireJson).model).toBe("gpt-4o-prod");
  });

  test("stream_options (the usage the gateway asks for) only where the api-version knows it", () => {
    const req: ChatRequest = { ...chatReq, stream: true };
    const body = (apiVersion: string) => JSON.parse(azureProvider.endpoints.chat!.request(req, deployment({ apiBase: BASE, apiKey: "k", apiVersion })).body!) as WireJson;
    expect(body("2024-10-21").stream_options).toEqual({ include_usage: true });
    expect(body("2024-09-01-preview").stream_options).toEqual({ include_usage: true });
    expect(body("v1").stream_options).toEqual({ include_usage: true });
    expect(body("2024-06-01")).toEqual({ model: "gpt-4o-prod", messages: [{ role: "user", content: "Hello" }], temperature: 0.5, stream: true });
  });

  test("a deployment name with spaces is escaped in the path", () => {
    expect(azureProvider.endpoints.chat!.request(chatReq, deployment({ apiBase: BASE, apiKey: "k", upstreamModel: "my gpt" })).url).toContain("/openai/deployments/my%20gpt/chat/completions?");
  });

  test("a fixed Entra token is a bearer token; the environment fills what svc_params leave out", () => {
    const ad = deployment({ apiBase: BASE, options: { azure_ad_token: "eyJ.static" } });
    const call = azureProvider.endpoints.chat!.request(chatReq, ad);
    expect(call.headers.authorization).toBe("Bearer eyJ.static");
    expect(call.headers["api-key"]).toBeUndefined();
    process.env.AZURE_API_BASE = "https://env-resource.openai.azure.com";
    process.env.AZURE_API_KEY = "env-key";
    const env = azureProvider.endpoints.chat!.request(chatReq, deployment({}));
    expect(env.url).toStartWith("https://env-resource.openai.azure.com/openai/deployments/");
    expect(env.headers["api-key"]).toBe("env-key");
    // The deployment's own Entra token wins over the environment's key.
    expect(azureProvider.endpoints.chat!.request(chatReq, deployment({ options: { azure_ad_token: "own" } })).headers).toMatchObject({ authorization: "Bearer own" });
  });

  test("a deployment without base or credentials does not load, and says what to set", () => {
    expect(resolve({ apiKey: "k" })).toMatch(/api_base/);
    expect(resolve({ apiBase: BASE })).toMatch(/api_key.*azure_ad_token.*tenant_id \+ client_id \+ client_secret/);
  });
});

describe("Entra ID client credentials", () => {
  let mock: MockAzure;
  const client = { tenantId: "tenant-1", clientId: "app-1", clientSecret: "s3cret-value~xyz" };
  beforeAll(async () => {
    mock = await startMockAzure({ clients: [client], tokenLifetime: 3600 });
  });
  afterAll(() => mock.stop());

  const options = (secret = client.clientSecret) => ({ tenant_id: client.tenantId, client_id: client.clientId, client_secret: secret, azure_authority_host: mock.url });

  test("the token is fetched once, in authorize, and reused; the secret never reaches the data-plane call", async () => {
    const adapter = azureAdapter(new EntraTokenCache());
    const d = deployment({ apiBase: BASE, options: options() }, adapter);
    const built = adapter.endpoints.chat!.request(chatReq, d);
    expect(built.headers.authorization).toBeUndefined();
    const before = mock.tokenRequests;
    const calls = await Promise.all([1, 2, 3].map(() => adapter.authorize!(built, d)));
    const again = await adapter.authorize!(built, d);
    expect(mock.tokenRequests - before).toBe(1);
    const bearer = calls[0]!.headers.authorization!;
    expect(bearer).toStartWith("Bearer eyJ");
    for (const c of [...calls, again]) expect(c.headers.authorization).toBe(bearer);
    expect(JSON.stringify(again)).not.toContain(client.clientSecret);
    const tokenCall = mock.requests.find((r) => r.path === "/tenant-1/oauth2/v2.0/token")!;
    expect(new URLSearchParams(tokenCall.body as string).get("scope")).toBe("https://cognitiveservices.azure.com/.default");
    expect(tokenCall.headers["content-type"]).toBe("application/x-www-form-urlencoded");
  });

  test("renewed in the background five minutes before expiry; a new token only after the old one expired", async () => {
    let now = 1_000_000;
    const cache = new EntraTokenCache(() => now);
    const creds = { kind: "client-credentials" as const, authority: mock.url, ...client, scope: "https://cognitiveservices.azure.com/.default" };
    const first = await cache.token(creds);
    now += 54 * 60_000;
    expect(await cache.token(creds)).toBe(first);
    expect(cache.requests).toBe(1);
    now += 2 * 60_000; // 56 min: inside the renewal window, the old token still answers at once
    expect(await cache.token(creds)).toBe(first);
    expect(cache.requests).toBe(2);
    await Bun.sleep(50);
    const renewed = await cache.token(creds);
    expect(renewed).not.toBe(first);
    expect(cache.requests).toBe(2);
  });

  test("a wrong secret fails with Entra's reason and without the secret", async () => {
    const adapter = azureAdapter(new EntraTokenCache());
    const d = deployment({ apiBase: BASE, options: options("wrong-secret-123") }, adapter);
    const err = await adapter.authorize!(adapter.endpoints.chat!.request(chatReq, d), d).catch((e: unknown) => e as Error);
    // A refusal (the gateway answers 401), not an outage of the token service (503).
    expect(err).toBeInstanceOf(CredentialsRefused);
    expect((err as Error).message).toContain("invalid_client: AADSTS7000215: Invalid client secret provided");
    expect((err as Error).message).not.toContain("wrong-secret-123");
    expect((err as Error).message).not.toContain("Trace ID");
  });

  test("a token service answering 5xx is an outage, not a refusal of the credentials", async () => {
    const down = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => Response.json({ error: "temporarily_unavailable" }, { status: 503 }) });
    try {
      const adapter = azureAdapter(new EntraTokenCache());
      const d = deployment({ apiBase: BASE, options: { ...options(), azure_authority_host: `http://127.0.0.1:${down.port}` } }, adapter);
      const err = await adapter.authorize!(adapter.endpoints.chat!.request(chatReq, d), d).catch((e: unknown) => e as Error);
      expect(err).toBeInstanceOf(Error);
      expect(err).not.toBeInstanceOf(CredentialsRefused);
      expect((err as Error).message).toContain("temporarily_unavailable");
    } finally {
      down.stop(true);
    }
  });

  test("credentials from AZURE_TENANT_ID / AZURE_CLIENT_ID / AZURE_CLIENT_SECRET", async () => {
    process.env.AZURE_TENANT_ID = client.tenantId;
    process.env.AZURE_CLIENT_ID = client.clientId;
    process.env.AZURE_CLIENT_SECRET = client.clientSecret;
    process.env.AZURE_AUTHORITY_HOST = mock.url;
    const adapter = azureAdapter(new EntraTokenCache());
    const d = deployment({ apiBase: BASE }, adapter);
    const signed = await adapter.authorize!(adapter.endpoints.chat!.request(chatReq, d), d);
    expect(signed.headers.authorization).toStartWith("Bearer eyJ");
  });
});

// Azure's stream as its API writes it: sorted keys, the prompt's filter results first (no id,
// `"object":""`), an asynchronous-filter annotation, content chunks with their filter results.
const filters = '{"hate":{"filtered":false,"severity":"safe"},"self_harm":{"filtered":false,"severity":"safe"},"sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":false,"severity":"safe"}}';
const STREAM = [
  `data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":${filters}}]}`,
  'data: {"choices":[{"content_filter_results":{},"delta":{"content":"","refusal":null,"role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"created":1724000000,"id":"chatcmpl-A1b2C3","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0","usage":null}',
  `data: {"choices":[{"content_filter_results":${filters},"delta":{"content":"Hello"},"finish_reason":null,"index":0,"logprobs":null}],"created":1724000000,"id":"chatcmpl-A1b2C3","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0","usage":null}`,
  `data: {"choices":[{"content_filter_offsets":{"check_offset":0,"start_offset":0,"end_offset":5},"content_filter_results":${filters},"finish_reason":null,"index":0}],"created":0,"id":"","model":"","object":""}`,
  `data: {"choices":[{"content_filter_results":${filters},"delta":{"content":" there"},"finish_reason":null,"index":0,"logprobs":null}],"created":1724000000,"id":"chatcmpl-A1b2C3","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0","usage":null}`,
  'data: {"choices":[{"content_filter_results":{},"delta":{},"finish_reason":"content_filter","index":0,"logprobs":null}],"created":1724000000,"id":"chatcmpl-A1b2C3","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0","usage":null}',
  'data: {"choices":[],"created":1724000000,"id":"chatcmpl-A1b2C3","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0","usage":{"completion_tokens":2,"prompt_tokens":9,"total_tokens":11}}',
  "data: [DONE]",
  "",
].join("\n\n");

describe("Azure stream → chat.completion.chunk", () => {
  const d = deployment({ apiBase: BASE, apiKey: "k" });
  const req: ChatRequest = { ...chatReq, stream: true, stream_options: { include_usage: true } };

  test("the prompt's filter results ride on the first real chunk; filter annotations are dropped; cut mid-JSON changes nothing", () => {
    expect(JSON.parse(azureProvider.endpoints.chat!.request(req, d).body!).stream_options).toEqual({ include_usage: true });
    for (const pieces of [[STREAM], cutEvery(STREAM, 23)]) {
      const { parts, state } = runStream(azureProvider.endpoints.chat!.stream!, req, pieces);
      const list = chunks(parts);
      expect(list.every((c) => c.object === "chat.completion.chunk" && c.id === "chatcmpl-A1b2C3")).toBe(true);
      expect(list[0]!.prompt_filter_results).toEqual([{ prompt_index: 0, content_filter_results: JSON.parse(filters) }]);
      expect(list.filter((c) => "prompt_filter_results" in c)).toHaveLength(1);
      expect(assemble(list)).toMatchObject({ role: "assistant", content: "Hello there", finish: "content_filter" });
      expect(usageOf(parts)).toEqual({ promptTokens: 9, completionTokens: 2, answerModel: "gpt-4o-2024-08-06" });
      expect(azureProvider.endpoints.chat!.stream!.responseId!(state)).toBe("chatcmpl-A1b2C3");
    }
  });

  test("a whole answer passes through with its filter results", () => {
    const answer = {
      choices: [{ content_filter_results: JSON.parse(filters), finish_reason: "stop", index: 0, logprobs: null, message: { content: "Hi", refusal: null, role: "assistant" } }],
      created: 1724000000,
      id: "chatcmpl-X",
      model: "gpt-4o-2024-08-06",
      object: "chat.completion",
      prompt_filter_results: [{ prompt_index: 0, content_filter_results: JSON.parse(filters) }],
      usage: { completion_tokens: 1, prompt_tokens: 8, prompt_tokens_details: { cached_tokens: 4 }, total_tokens: 9 },
    };
    const { body, usage } = azureProvider.endpoints.chat!.response(answer, chatReq);
    expect(body).toBe(answer);
    expect(usage).toEqual({ promptTokens: 8, completionTokens: 1, cachedPromptTokens: 4, answerModel: "gpt-4o-2024-08-06" });
  });
});

describe("pricing a deployment named by the operator", () => {
  const pricing = new Pricing(new PriceTable());
  const chat = azureProvider.endpoints.chat!;
  const answer = { choices: [{ finish_reason: "stop", index: 0, message: { content: "Hi", role: "assistant" } }], created: 1724000000, id: "chatcmpl-X", model: "gpt-4o-2024-08-06", object: "chat.completion", usage: { completion_tokens: 0, prompt_tokens: 1_000_000, total_tokens: 1_000_000 } };

  test("without a price of its own, the call is priced as the model Azure's answer names (gpt-4o-2024-08-06: $2.50 per million in), whole and streamed", () => {
    const d = deployment({ apiBase: BASE, apiKey: "k", upstreamModel: "prod-chat" });
    expect(pricing.costOf(d, chat.response(answer, chatReq).usage)).toMatchObject({ cost: usdToPico("2.5"), priced: true });
    const { parts } = runStream(chat.stream!, { ...chatReq, stream: true }, [STREAM]);
    // 9 prompt tokens at $2.50 per million, 2 answer tokens at $10.
    expect(pricing.costOf(d, usageOf(parts)!).cost).toBe(9n * usdToPico("2.5") / 1_000_000n + 2n * usdToPico("10") / 1_000_000n);
  });

  test("the deployment's own price (its name, base_model or an operator's) wins over the answer's model", () => {
    const usage = chat.response(answer, chatReq).usage;
    expect(pricing.costOf(deployment({ apiBase: BASE, apiKey: "k", upstreamModel: "gpt-4o-mini" }), usage).cost).toBe(usdToPico("0.165"));
    expect(pricing.costOf(deployment({ apiBase: BASE, apiKey: "k", upstreamModel: "prod-chat", info: { base_model: "azure/gpt-4o-mini" } }), usage).cost).toBe(usdToPico("0.165"));
    expect(pricing.costOf(deployment({ apiBase: BASE, apiKey: "k", upstreamModel: "prod-chat", info: { input_cost_per_token: 0.000001 } }), usage).cost).toBe(usdToPico("1"));
    // An answer naming an unknown model leaves the call unpriced, as before.
    expect(pricing.costOf(deployment({ apiBase: BASE, apiKey: "k", upstreamModel: "prod-chat" }), { ...usage, answerModel: "my-finetune" }).priced).toBe(false);
  });
});

describe("errors", () => {
  test("the content filter's refusal is a content-policy error with Azure's message", () => {
    const refusal = JSON.stringify({
      error: {
        message: "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry.",
        type: null,
        param: "prompt",
        code: "content_filter",
        status: 400,
        innererror: { code: "ResponsibleAIPolicyViolation", content_filter_result: { violence: { filtered: true, severity: "medium" } } },
      },
    });
    expect(azureProvider.errorKind!(400, refusal)).toBe("content_policy_violation");
    expect(azureProvider.errorMessage!(400, refusal)).toStartWith("The response was filtered due to the prompt triggering");
  });

  test("context_length_exceeded is a context-window error; quota and auth errors are neither", () => {
    const tooLong = '{"error":{"message":"This model\'s maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}';
    expect(azureProvider.errorKind!(400, tooLong)).toBe("context_window_exceeded");
    expect(azureProvider.errorKind!(429, '{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation have exceeded token rate limit."}}')).toBeUndefined();
    const denied = '{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint."}}';
    expect(azureProvider.errorMessage!(401, denied)).toBe("Access denied due to invalid subscription key or wrong API endpoint.");
    expect(azureProvider.errorKind!(401, denied)).toBeUndefined();
  });
});
