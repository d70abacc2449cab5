// The Vertex AI adapter: deployment resolution (project, location, credentials), URLs for Gemini
// and Claude models, service-account OAuth through a mock token endpoint (one client per key,
// tokens reused until near expiry), and the transforms routed by model (Gemini's JSON, or
// Anthropic's Messages body with Vertex's `anthropic_version`).
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ChatRequest, Deployment, EmbeddingsRequest, EndpointAdapter, HttpCall, StreamTransform, WireJson } from "../../core/contract.ts";
import { vertexProvider } from "../../providers/vertex/index.ts";
import { tempDir } from "../harness/gateway.ts";
import { type MockGemini, startMockGemini } from "../mock-upstream/gemini.ts";
import { chunks, runStream } from "./run-stream.ts";

const chat = vertexProvider.endpoints.chat as EndpointAdapter<"chat", unknown>;
const embeddings = vertexProvider.endpoints.embeddings as EndpointAdapter<"embeddings", unknown>;

function serviceAccount(email: string, tokenUri: string, project = "acme-prod") {
  const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const key = {
    type: "service_account",
    project_id: project,
    private_key_id: "0123456789abcdef",
    private_key: privateKey.export({ type: "pkcs8", format: "pem" }) as string,
    client_email: email,
    client_id: "1234567890",
    auth_uri: "https://accounts.google.com/o/oauth2/auth",
    token_uri: tokenUri,
  };
  return { key, publicKey: publicKey.export({ type: "spki", format: "pem" }) as string };
}

let mock: MockGemini;
let sa: ReturnType<typeof serviceAccount>;
let other: ReturnType<typeof serviceAccount>;
let dir: string;

beforeAll(async () => {
  // The token endpoint's URL is known once the mock listens; the keys are made for it after.
  const accounts: { email: string; publicKey: string }[] = [];
  mock = await startMockGemini({ serviceAccounts: accounts });
  sa = serviceAccount("gateway@acme-prod.iam.gserviceaccount.com", mock.tokenUrl);
  other = serviceAccount("other@acme-dev.iam.gserviceaccount.com", mock.tokenUrl, "acme-dev");
  accounts.push({ email: sa.key.client_email, publicKey: sa.publicKey }, { email: other.key.client_email, publicKey: other.publicKey });
  dir = tempDir("vertex-test-");
});

afterAll(async () => {
  await mock.stop();
  rmSync(dir, { recursive: true, force: true });
});

beforeEach(() => mock.reset());

function resolve(overrides: Partial<Deployment> = {}, options: Record<string, unknown> = {}): Deployment | string {
  const base: Deployment = { id: "v1", modelName: "vx", provider: "vertex_ai", upstreamModel: "gemini-2.5-pro", options: { vertex_credentials: JSON.stringify(sa.key), ...options }, info: {}, ...overrides };
  return vertexProvider.resolve!(base);
}

function deployment(overrides: Partial<Deployment> = {}, options: Record<string, unknown> = {}): Deployment {
  const d = resolve(overrides, options);
  if (typeof d === "string") throw new Error(d);
  return d;
}

const chatRequest = (body: Partial<ChatRequest> & Record<string, unknown> = {}): ChatRequest => ({ model: "vx", messages: [{ role: "user", content: "Hello" }], ...body }) as ChatRequest;

describe("resolve", () => {
  test("project from the key, location us-central1 by default, the regional host", () => {
    const d = deployment();
    expect(d.options.vertex_project).toBe("acme-prod");
    expect(d.options.vertex_location).toBe("us-central1");
    expect(d.apiBase).toBe("https://us-central1-aiplatform.googleapis.com");
  });

  test("vertex_project and vertex_location win; `global` uses the global host; api_base replaces the host", () => {
    const d = deployment({}, { vertex_project: "other-proj", vertex_location: "europe-west4" });
    expect([d.options.vertex_project, d.options.vertex_location, d.apiBase]).toEqual(["other-proj", "europe-west4", "https://europe-west4-aiplatform.googleapis.com"]);
    expect(deployment({}, { vertex_location: "global" }).apiBase).toBe("https://aiplatform.googleapis.com");
    expect(deployment({ apiBase: "http://127.0.0.1:1234/" }).apiBase).toBe("http://127.0.0.1:1234");
  });

  test("the key may be a file path or a mapping", () => {
    const path = join(dir, "key.json");
    writeFileSync(path, JSON.stringify(other.key));
    expect(deployment({}, { vertex_credentials: path }).options.vertex_project).toBe("acme-dev");
    expect(deployment({}, { vertex_credentials: other.key }).options.vertex_project).toBe("acme-dev");
  });

  test("unreadable credentials and a missing project refuse the deployment, without quoting the key", () => {
    const broken = JSON.stringify(sa.key).slice(0, -5);
    const bad = resolve({}, { vertex_credentials: broken });
    expect(bad).toBe("provider vertex_ai: svc_params.vertex_credentials is not valid JSON");
    expect(resolve({}, { vertex_credentials: join(dir, "missing.json") })).toMatch(/cannot be read .*ENOENT/);
    const saved = { p: process.env.VERTEXAI_PROJECT, g: process.env.GOOGLE_CLOUD_PROJECT };
    delete process.env.VERTEXAI_PROJECT;
    delete process.env.GOOGLE_CLOUD_PROJECT;
    try {
      const { project_id: _p, ...noProject } = sa.key;
      expect(resolve({}, { vertex_credentials: noProject })).toMatch(/needs svc_params.vertex_project/);
    } finally {
      if (saved.p !== undefined) process.env.VERTEXAI_PROJECT = saved.p;
      if (saved.g !== undefined) process.env.GOOGLE_CLOUD_PROJECT = saved.g;
    }
  });
});

describe("Gemini on Vertex", () => {
  test("URLs: the google publisher's model methods; no API key in the call", () => {
    const d = deployment({}, { vertex_location: "europe-west4" });
    const base = "https://europe-west4-aiplatform.googleapis.com/v1/projects/acme-prod/locations/europe-west4/publishers/google/models/gemini-2.5-pro";
    const call = chat.request(chatRequest(), d);
    expect(call.url).toBe(`${base}:generateContent`);
    expect(call.headers["x-goog-api-key"]).toBeUndefined();
    expect(call.headers.authorization).toBeUndefined();
    expect(chat.request(chatRequest({ stream: true }), d).url).toBe(`${base}:streamGenerateContent?alt=sse`);
    expect(vertexProvider.countTokens!.request(chatRequest(), d).url).toBe(`${base}:countTokens`);
  });

  test("the body is the same GenerateContentRequest as AI Studio's", () => {
    const body = JSON.parse(chat.request(chatRequest({ messages: [{ role: "system", content: "S" }, { role: "user", content: "U" }], temperature: 0.1 }), deployment()).body!);
    expect(body).toEqual({ contents: [{ role: "user", parts: [{ text: "U" }] }], systemInstruction: { parts: [{ text: "S" }] }, generationConfig: { temperature: 0.1 } });
  });

  test("countTokens takes the prompt at the top level (no generateContentRequest wrapper)", () => {
    const body = JSON.parse(vertexProvider.countTokens!.request(chatRequest({ messages: [{ role: "system", content: "S" }, { role: "user", content: "U" }] }), deployment()).body!);
    expect(body).toEqual({ contents: [{ role: "user", parts: [{ text: "U" }] }], systemInstruction: { parts: [{ text: "S" }] } });
    expect(vertexProvider.countTokens!.response({ totalTokens: 12, totalBillableCharacters: 40 })).toBe(12);
  });

  test("embeddings: predict with one instance per input; token counts from each prediction's statistics", () => {
    const d = deployment({ upstreamModel: "text-embedding-005" });
    const req = { model: "emb", input: ["alpha", "beta gamma"], dimensions: 64 } as EmbeddingsRequest;
    const call = embeddings.request(req, d);
    expect(call.url).toEndWith("/publishers/google/models/text-embedding-005:predict");
    expect(JSON.parse(call.body!)).toEqual({ instances: [{ content: "alpha" }, { content: "beta gamma" }], parameters: { outputDimensionality: 64 } });
    const answer = embeddings.response({
      predictions: [{ embeddings: { statistics: { truncated: false, token_count: 2 }, values: [0.5, 0.5] } }, { embeddings: { statistics: { truncated: false, token_count: 3 }, values: [0, 1] } }],
      metadata: { billableCharacterCount: 14 },
    });
    // The characters Google bills are what the model is priced on.
    expect(answer.usage).toEqual({ promptTokens: 5, completionTokens: 0, characters: 14 });
    expect((answer.body.data as WireJson[]).map((e) => e.embedding)).toEqual([
      [0.5, 0.5],
      [0, 1],
    ]);
    expect(embeddings.split!(req, d)).toBeUndefined();
    // At most 250 instances per call.
    const texts = Array.from({ length: 260 }, (_, i) => `t${i}`);
    expect(embeddings.split!({ model: "emb", input: texts }, d)!.map((p) => p.input)).toEqual([texts.slice(0, 250), texts.slice(250)]);
  });

  test("embeddings: Gemini embedding models take one instance per predict call, so a list goes one text per call", () => {
    const d = deployment({ upstreamModel: "gemini-embedding-001" });
    const req = { model: "emb", input: ["alpha", "beta gamma"], dimensions: 64 } as EmbeddingsRequest;
    const parts = embeddings.split!(req, d)!;
    expect(parts).toEqual([
      { model: "emb", input: "alpha", dimensions: 64 },
      { model: "emb", input: "beta gamma", dimensions: 64 },
    ]);
    expect(JSON.parse(embeddings.request(parts[1]!, d).body!)).toEqual({ instances: [{ content: "beta gamma" }], parameters: { outputDimensionality: 64 } });
    expect(embeddings.split!({ model: "emb", input: "alpha" }, d)).toBeUndefined();
    const joined = embeddings.join!(
      [
        embeddings.response({ predictions: [{ embeddings: { statistics: { token_count: 2 }, values: [0.5] } }] }, parts[0]),
        embeddings.response({ predictions: [{ embeddings: { statistics: { token_count: 3 }, values: [-1] } }] }, parts[1]),
      ],
      req,
    );
    expect((joined.body.data as WireJson[]).map((e) => [e.index, e.embedding])).toEqual([
      [0, [0.5]],
      [1, [-1]],
    ]);
    expect(joined.usage).toEqual({ promptTokens: 5, completionTokens: 0 });
  });
});

describe("Claude on Vertex", () => {
  const claude = () => deployment({ upstreamModel: "claude-sonnet-4@20250514" }, { vertex_location: "us-east5" });
  const base = "https://us-east5-aiplatform.googleapis.com/v1/projects/acme-prod/locations/us-east5/publishers/anthropic/models";

  test("rawPredict / streamRawPredict with an Anthropic Messages body: Vertex's anthropic_version, no model", () => {
    const call = chat.request(chatRequest({ messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }], max_tokens: 100 }), claude());
    expect(call.url).toBe(`${base}/claude-sonnet-4@20250514:rawPredict`);
    const body = JSON.parse(call.body!);
    expect(body.anthropic_version).toBe("vertex-2023-10-16");
    expect(body).not.toHaveProperty("model");
    expect(body).toMatchObject({ max_tokens: 100, system: expect.anything(), messages: [{ role: "user" }] });
    const streamCall = chat.request(chatRequest({ stream: true }), claude());
    expect(streamCall.url).toBe(`${base}/claude-sonnet-4@20250514:streamRawPredict`);
    expect(JSON.parse(streamCall.body!).stream).toBe(true);
  });

  test("an image/jpg data URL goes to Claude as image/jpeg, the type Anthropic's API takes", () => {
    const image = { type: "image_url", image_url: { url: "data:image/jpg;base64,/9j/4AAQ" } };
    const body = JSON.parse(chat.request(chatRequest({ messages: [{ role: "user", content: [image] }] }), claude()).body!);
    expect(body.messages[0].content[0].source).toEqual({ type: "base64", media_type: "image/jpeg", data: "/9j/4AAQ" });
  });

  test("each model is held to its own API's parameters: seed and n for Gemini, top_k for both", () => {
    const gemini = deployment();
    expect(chat.supportedParamsFor!(gemini)).toContain("seed");
    expect(chat.supportedParamsFor!(gemini)).toContain("n");
    expect(chat.supportedParamsFor!(gemini)).toContain("top_k");
    expect(chat.supportedParamsFor!(claude())).toContain("top_k");
    expect(chat.supportedParamsFor!(claude())).not.toContain("seed");
    expect(chat.supportedParamsFor!(claude())).not.toContain("n");
  });

  test("answers are read as Anthropic's, Gemini's as Gemini's", () => {
    const claudeAnswer = chat.response({
      id: "msg_vrtx_01",
      type: "message",
      role: "assistant",
      model: "claude-sonnet-4@20250514",
      content: [{ type: "text", text: "Hi there" }],
      stop_reason: "end_turn",
      stop_sequence: null,
      usage: { input_tokens: 10, output_tokens: 3 },
    });
    expect((claudeAnswer.body.choices as { message: { content: string } }[])[0]!.message.content).toBe("Hi there");
    expect(claudeAnswer.usage).toMatchObject({ promptTokens: 10, completionTokens: 3 });
    const geminiAnswer = chat.response({ candidates: [{ content: { parts: [{ text: "Hola" }], role: "model" }, finishReason: "STOP", index: 0 }] });
    expect((geminiAnswer.body.choices as { message: { content: string } }[])[0]!.message.content).toBe("Hola");
  });

  test("streams are read by their first event: Anthropic's typed events or Gemini's responses", () => {
    const transform = chat.stream as StreamTransform<"chat", unknown>;
    const run = (text: string) => chunks(runStream(transform, chatRequest({ stream: true }), [text]).parts) as { choices: { delta: WireJson }[] }[];
    const anthropic = [
      'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_vrtx_1","type":"message","role":"assistant","model":"claude-sonnet-4@20250514","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":1}}}\n\n',
      'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Bonjour"}}\n\n',
      'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}\n\n',
      'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ].join("");
    expect(run(anthropic).map((c) => c.choices[0]?.delta.content).join("")).toBe("Bonjour");
    const gemini = 'data: {"candidates": [{"content": {"parts": [{"text": "Hallo"}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 2,"candidatesTokenCount": 1,"totalTokenCount": 3}}\r\n\r\n';
    expect(run(gemini).map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe("Hallo");
  });

  test("token counting goes to the count-tokens pseudo-model, naming the model in the body", () => {
    const call = vertexProvider.countTokens!.request(chatRequest(), claude());
    expect(call.url).toBe(`${base}/count-tokens:rawPredict`);
    expect(JSON.parse(call.body!)).toMatchObject({ model: "claude-sonnet-4@20250514", messages: [{ role: "user" }] });
    expect(vertexProvider.countTokens!.response({ input_tokens: 14 })).toBe(14);
  });
});

describe("authorize: service-account OAuth", () => {
  const local = () => deployment({ apiBase: mock.url });
  const authorize = (d: Deployment): Promise<HttpCall> => vertexProvider.authorize!(chat.request(chatRequest(), d), d);

  test("the key's signed grant goes to its token_uri; the token becomes the call's bearer and is reused", async () => {
    const d = local();
    const calls = await Promise.all([authorize(d), authorize(d), authorize(d)]);
    await authorize(deployment({ apiBase: mock.url, upstreamModel: "gemini-2.5-flash" }));
    expect(mock.grants).toHaveLength(1);
    expect(mock.grants[0]!.email).toBe("gateway@acme-prod.iam.gserviceaccount.com");
    expect(mock.grants[0]!.scope).toBe("https://www.googleapis.com/auth/cloud-platform");
    for (const c of calls) expect(c.headers.authorization).toBe(`Bearer ${mock.grants[0]!.accessToken}`);
    // The authorized call is still the built one.
    expect(calls[0]!.url).toBe(chat.request(chatRequest(), d).url);
    expect(calls[0]!.headers["content-type"]).toBe("application/json");
  });

  test("each key has its own client and token", async () => {
    const a = await authorize(local());
    const b = await authorize(deployment({ apiBase: mock.url }, { vertex_credentials: other.key }));
    // The first key's token may still be cached from an earlier test: only the second key asks now.
    expect(mock.grants.map((g) => g.email)).toContain("other@acme-dev.iam.gserviceaccount.com");
    expect(a.headers.authorization).toStartWith("Bearer ya29.");
    expect(a.headers.authorization).not.toBe(b.headers.authorization);
  });

  test("a refused grant fails the call with the token server's reason, never the key", async () => {
    const fresh = serviceAccount("unknown@acme-prod.iam.gserviceaccount.com", mock.tokenUrl);
    const d = deployment({ apiBase: mock.url }, { vertex_credentials: fresh.key });
    let error: unknown;
    try {
      await authorize(d);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(Error);
    const message = (error as Error).message;
    expect(message).toContain("could not get a Google access token");
    expect(message).toContain("invalid_grant");
    expect(message).not.toContain("PRIVATE KEY");
    expect(message).not.toContain(fresh.key.private_key.slice(40, 80));
  });
});

describe("authorize: token lifetime", () => {
  test("a token close to expiry is replaced before use", async () => {
    const accounts: { email: string; publicKey: string }[] = [];
    const server = await startMockGemini({ serviceAccounts: accounts, tokenTtlSeconds: 60 });
    try {
      const key = serviceAccount("short-lived@acme-prod.iam.gserviceaccount.com", server.tokenUrl);
      accounts.push({ email: key.key.client_email, publicKey: key.publicKey });
      const d = deployment({ apiBase: server.url }, { vertex_credentials: key.key });
      const first = await vertexProvider.authorize!(chat.request(chatRequest(), d), d);
      const second = await vertexProvider.authorize!(chat.request(chatRequest(), d), d);
      // Google's library refreshes a token within five minutes of its expiry: a 60 s token is never reused.
      expect(server.grants).toHaveLength(2);
      expect(first.headers.authorization).not.toBe(second.headers.authorization);
    } finally {
      await server.stop();
    }
  });
});
