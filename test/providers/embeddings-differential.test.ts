// Embeddings through every provider's mock, seeded random (EMBEDDINGS_DIFF_SEED=<n> runs another
// set, EMBEDDINGS_DIFF_CASE=<i> only case i of it; every failure names both). Each case is a
// random OpenAI embeddings request as clients send them: a string, an array of strings (one to
// dozens, now and then around the providers' batch limits; whitespace-only, one glyph, long,
// multi-byte, emoji and lone-surrogate text), token ids
// (number[] and number[][]), `dimensions`, `user`, Cohere's `input_type`, now and then
// `drop_params` or gateway-only fields. It goes to a random deployment through the official
// `openai` SDK (which asks for base64 unless told otherwise and decodes it; or with
// `encoding_format` float or base64, which it hands back as they came), or as raw HTTP on one of
// the four paths with `encoding_format` float, base64 or absent, to see the answer on the wire.
// A model kept here, written from each provider's documented API and not from the gateway's
// transforms, predicts:
// - the refusals: a parameter the provider's adapter does not translate is the 400 naming it
//   (unless drop_params), token ids where the provider takes only text are a 400, and then the
//   upstream is never called;
// - the requests the mock receives, in order: path (model, API version), auth headers, body (the
//   texts under the provider's field names, batched as the API takes them: Titan and Vertex's
//   Gemini embedding models one text per call, Cohere 96, Gemini 100, Vertex 250, the others all
//   in one; dimensions, input_type / task_type, the model's own options);
// - for random vectors (full doubles, float32-exact values, subnormals) and random usage in the
//   provider's format: the OpenAI list the client gets, `data[i].index` in input order, each
//   `embedding` exactly the upstream floats (float), or their float32 bytes bit for bit (base64,
//   as sent or as the SDK decodes it), `model`, `usage` (the provider's count, summed over calls;
//   for a call it reports none for, the gateway's estimate of four characters per token), and
//   `x-svc-response-cost` = tokens × the price configured below, to the pico-dollar;
// - for an upstream error in the provider's own format (at any of a split request's calls): the
//   OpenAI envelope with the documented status (429 and 4xx kept, 502/503/504 → 503, other 5xx →
//   500; a context-window refusal → 400 `context_window_exceeded`), the provider's message and
//   `retry-after`, and no call after the failed one.
// The built-in `mock/` provider has no upstream to watch: its answers are checked for shape
// (one vector per input, in order, float and base64 alike), usage and cost.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import OpenAI, { APIError } from "openai";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { Random } from "../harness/random.ts";
import { type MockAzure, startMockAzure } from "../mock-upstream/azure.ts";
import { type MockBedrock, startMockBedrock } from "../mock-upstream/bedrock.ts";
import { type MockCohere, startMockCohere } from "../mock-upstream/cohere.ts";
import { type MockGemini, startMockGemini } from "../mock-upstream/gemini.ts";
import { type MockOllama, startMockOllama } from "../mock-upstream/ollama.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const SEED = Number(process.env.EMBEDDINGS_DIFF_SEED ?? 20_251_126);
const ONLY = process.env.EMBEDDINGS_DIFF_CASE === undefined ? undefined : Number(process.env.EMBEDDINGS_DIFF_CASE);
const CASES = Number(process.env.EMBEDDINGS_DIFF_CASES ?? 600);
const seedNote = `(EMBEDDINGS_DIFF_SEED=${SEED})`;

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const obj = (v: unknown): Json => (isObject(v) ? v : {});
const list = (v: unknown): Json[] => (Array.isArray(v) ? (v as Json[]) : []);

// ---------------------------------------------------------------------------------------------
// Random values

/** Pieces of words: multi-byte letters, combining marks, emoji, JSON's escapes. */
const GLYPHS = ["a", "k", "Z", "7", "é", "ß", "Ω", "ж", "中", "字", "€", "😀", "👩‍💻", "e\u0301", '"', "\\", "<", "&", "'", "/", "\t", "\n", "\u2028", "\u0000"];
const LETTERS = "abcdefghijklmnopqrstuvwxyz";

const word = (rng: Random) => `${rng.pick(["a", "b", "x", "Ω", "中"])}${Array.from({ length: rng.int(5) }, () => rng.pick(GLYPHS)).join("")}`;
const words = (rng: Random, max: number) => Array.from({ length: 1 + rng.int(max) }, () => word(rng)).join(" ");
const ascii = (rng: Random, n = 3 + rng.int(6)) => Array.from({ length: n }, () => LETTERS[rng.int(LETTERS.length)]).join("");

/** A text to embed: mostly words, sometimes only whitespace, one glyph, a lone surrogate, or long. */
function text(rng: Random): string {
  switch (rng.int(20)) {
    case 0:
      return rng.pick([" ", "\n", "\t", "  \n ", "\u00a0", "\u3000", "\r\n"]);
    case 1:
      return rng.pick(GLYPHS);
    case 2:
      return `${words(rng, 3)}${rng.pick(["\ud83d", "\udc00"])}${words(rng, 2)}`;
    case 3: {
      const length = 2000 + rng.int(18_000);
      let s = "";
      while (s.length < length) s += `${words(rng, 20)} `;
      return s;
    }
    default:
      return words(rng, 14);
  }
}

const tokenIds = (rng: Random) => Array.from({ length: 1 + rng.int(16) }, () => rng.int(100_256));

type InputKind = "string" | "strings" | "tokens" | "token-lists";

/** List lengths around the providers' batch limits (Cohere 96, Gemini 100, Vertex 250). */
const BIG_LISTS = [95, 96, 97, 100, 101, 193, 250, 251];

function randomInput(rng: Random, kind: InputKind): unknown {
  const count = () => (rng.chance(0.85) ? 1 + rng.int(6) : 7 + rng.int(34));
  switch (kind) {
    case "string":
      return text(rng);
    case "strings":
      // Now and then as many as clients that embed documents in chunks send (short texts, to keep it quick).
      if (rng.chance(0.03)) return Array.from({ length: rng.pick(BIG_LISTS) }, () => words(rng, 3));
      return Array.from({ length: count() }, () => text(rng));
    case "tokens":
      return tokenIds(rng);
    default:
      return Array.from({ length: count() }, () => tokenIds(rng));
  }
}

/** How many vectors an input asks for: a token list is one text. */
function inputCount(input: unknown): number {
  if (typeof input === "string") return 1;
  const items = input as unknown[];
  return items.every((x) => typeof x === "number") ? 1 : items.length;
}

const textsOf = (input: unknown): string[] => (typeof input === "string" ? [input] : (input as string[]));
/** The texts in calls of at most `size`, in order. */
const batches = (texts: string[], size: number): string[][] => Array.from({ length: Math.ceil(texts.length / size) }, (_, i) => texts.slice(i * size, (i + 1) * size));
const isText = (input: unknown) => typeof input === "string" || (input as unknown[]).every((x) => typeof x === "string");

/** A full double: two draws, so values are rarely float32-exact. */
const double = (rng: Random) => (rng.next() + rng.next() / 4_294_967_296) * 2 - 1;

/** An embedding: full doubles, with now and then values float32 holds exactly, subnormals, extremes. */
function vector(rng: Random, length: number): number[] {
  return Array.from({ length }, () => {
    if (!rng.chance(0.12)) return double(rng);
    return rng.pick([() => 0, () => 1, () => -1, () => Math.fround(double(rng)), () => 1e-39 * double(rng), () => 5e-46, () => 123_456.789, () => -3.0e30 * rng.next(), () => 0.1])();
  });
}

/** Little-endian float32 bytes of a vector, as OpenAI's base64 encoding holds them. */
const float32Bytes = (v: readonly number[]) => Buffer.from(Float32Array.from(v).buffer);
const float32Base64 = (v: readonly number[]) => float32Bytes(v).toString("base64");
/** The float32 values of base64 text (undefined when its length is not a whole number of floats). */
function decodeBase64(s: string): number[] | undefined {
  const bytes = Buffer.from(s, "base64");
  if (bytes.length % 4 !== 0) return undefined;
  return Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4));
}

// ---------------------------------------------------------------------------------------------
// Money: the configured price per token, exact

/** A decimal text × a whole number, in pico-dollars rounded half up (prices are finer than a pico). */
function costPico(price: string, tokens: number): bigint {
  const [int, frac = ""] = price.split(".");
  const yocto = BigInt(`${int}${frac.padEnd(24, "0")}`);
  const total = yocto * BigInt(tokens);
  const unit = 10n ** 12n;
  return total / unit + ((total % unit) * 2n >= unit ? 1n : 0n);
}

function usdText(pico: bigint): string {
  const s = pico.toString().padStart(13, "0");
  const int = s.slice(0, -12).replace(/^0+(?=\d)/, "");
  const frac = s.slice(-12).replace(/0+$/, "");
  return frac ? `${int}.${frac}` : int;
}

// ---------------------------------------------------------------------------------------------
// Providers: the upstream requests, answers and errors, from each API's documentation

interface Answer {
  body: Json;
  headers?: Record<string, string>;
  /** One vector per input of this call, in order. */
  vectors: number[][];
  /** The call's tokens: the provider's count, or where it reports none the gateway's estimate. */
  tokens: number;
}

interface UpstreamError {
  status: number;
  /** What the mock is told (its fault). */
  fault: Json;
  /** The provider's message, which the client's error must carry. */
  message: string;
  /** A context-window refusal, as the provider words it. */
  contextWindow?: boolean;
  retryAfter?: string;
}

interface Family {
  /** Whether the API takes token ids as input. */
  tokens: boolean;
  /** The OpenAI fields the adapter translates (undefined: the body is passed on as it is). */
  accepts?: readonly string[];
  /** `dimensions` the model takes. */
  dims: readonly number[];
  /** Statuses the API documents for its errors. */
  statuses: readonly number[];
  /** The upstream bodies, one per call, in order. */
  calls(req: Json, d: Dep): Json[];
  /** A random answer to one call (`body`: the call's upstream body). */
  render(body: Json, req: Json, d: Dep, rng: Random): Answer;
  /** The answer's `model`. */
  model(req: Json, d: Dep, answers: Answer[]): string;
  error(status: number, message: string, contextWindow: boolean): UpstreamError;
  /** A context-window refusal in the provider's words, where it documents one. */
  contextMessage?: string;
  /** One form for encodings the API documents as equivalent (applied to both sides). */
  normalize?(body: Json): Json;
}

interface Dep {
  name: string;
  provider: string;
  upstreamModel: string;
  family: Family;
  /** `input_cost_per_token` in model_info, as decimal text. */
  price: string;
  path: string;
  /** Headers the upstream must get (a pattern, or undefined: absent). */
  auth: Record<string, string | RegExp | undefined>;
  /** svc_params besides the model and credentials. */
  options?: Json;
  mock?: { readonly requests: { method: string; path: string; headers: Record<string, string>; body: unknown }[]; reset(): void };
  answerNext?(a: Answer): void;
  failNext?(e: UpstreamError): void;
}

const GATEWAY_ONLY = ["drop_params", "metadata", "timeout", "caching"];
const lengthFor = (req: Json, rng: Random) => (typeof req.dimensions === "number" ? req.dimensions : 1 + rng.int(12));
const tokenCount = (rng: Random) => (rng.chance(0.05) ? 0 : 1 + rng.int(20_000));
const set = (into: Json, entries: Json): Json => {
  for (const [k, v] of Object.entries(entries)) if (v !== undefined && v !== null) into[k] = v;
  return into;
};
/** The gateway's estimate of a call's texts where the provider counts nothing (the README): four characters (UTF-16 units) per token. */
const estimate = (texts: string[]) => Math.ceil(texts.reduce((n, t) => n + t.length, 0) / 4);

const OPENAI_STATUS_TYPES: Record<number, string> = { 400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error", 404: "invalid_request_error", 429: "requests", 500: "server_error", 503: "server_error" };

/** OpenAI and Azure: the body passed on with the deployment's model; the answer is OpenAI's. */
function openAIFamily(azure: boolean): Family {
  return {
    tokens: true,
    dims: [1, 3, 8, 64, 256, 512],
    statuses: azure ? [400, 401, 404, 429, 500, 503] : [400, 401, 403, 404, 429, 500, 502, 503],
    calls(req, d) {
      const body: Json = { ...req, model: d.upstreamModel };
      for (const k of GATEWAY_ONLY) delete body[k];
      return [body];
    },
    render(body, req, d, rng) {
      const base64 = body.encoding_format === "base64";
      // Base64 carries float32: those are the upstream's floats then.
      const vectors = Array.from({ length: inputCount(req.input) }, () => vector(rng, lengthFor(req, rng)).map((x) => (base64 ? Math.fround(x) : x)));
      const tokens = tokenCount(rng);
      const data = vectors.map((v, index) => ({ object: "embedding", index, embedding: base64 ? float32Base64(v) : v }));
      return { body: { object: "list", data, model: azure ? "text-embedding-3-small" : `${d.upstreamModel}`, usage: { prompt_tokens: tokens, total_tokens: tokens } }, vectors, tokens };
    },
    model: (_req, _d, answers) => String(answers[0]!.body.model),
    error(status, message, contextWindow) {
      const e = azure && !contextWindow ? { code: String(status), message } : { message, type: OPENAI_STATUS_TYPES[status] ?? "server_error", param: null, code: contextWindow ? "context_length_exceeded" : null };
      return { status, fault: { kind: "status", status, body: { error: e } }, message, contextWindow, retryAfter: status === 429 ? "1" : undefined };
    },
    contextMessage: "This model's maximum context length is 8192 tokens, however you requested 9001 tokens (9001 in your prompt; 0 for the completion). Please reduce your prompt; or completion length.",
  };
}

const GOOGLE_STATUS: Record<number, string> = { 400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED" };
const googleError = (path: string) => (status: number, message: string, contextWindow: boolean): UpstreamError => ({
  status,
  fault: { kind: "status", status, path, body: { error: { code: status, message, status: GOOGLE_STATUS[status] } } },
  message,
  contextWindow,
});

/** AI Studio's batchEmbedContents: one request per text (at most 100 a call), each naming the model; usage only in newer versions. */
const GEMINI: Family = {
  tokens: false,
  accepts: ["dimensions", "encoding_format", "user"],
  dims: [128, 256, 768],
  statuses: [400, 403, 404, 429, 500, 503, 504],
  calls(req, d) {
    const task = d.options?.task_type;
    // At most 100 requests in one batch.
    return batches(textsOf(req.input), 100).map((texts) => ({
      requests: texts.map((t) => set({ model: `models/${d.upstreamModel}`, content: { parts: [{ text: t }] } }, { taskType: task, outputDimensionality: req.dimensions })),
    }));
  },
  render(body, req, _d, rng) {
    const vectors = list(body.requests).map(() => vector(rng, lengthFor(req, rng)));
    const answer: Json = { embeddings: vectors.map((values) => ({ values })) };
    if (!rng.chance(0.5)) return { body: answer, vectors, tokens: estimate(list(body.requests).map((r) => String(list(obj(r.content).parts)[0]?.text))) };
    const tokens = tokenCount(rng);
    answer.usageMetadata = { promptTokenCount: tokens, totalTokenCount: tokens };
    return { body: answer, vectors, tokens };
  },
  model: (req) => String(req.model),
  error: googleError(":batchEmbedContents"),
  contextMessage: "The input token count (9001) exceeds the maximum number of tokens allowed (2048).",
};

/**
 * Vertex AI's predict for text embedding models: one instance per text (at most 250 a call), a
 * token count per prediction; the Gemini embedding models take one instance per call ("batchSize
 * must be 1").
 */
const vertexFamily = (onePerCall: boolean): Family => ({
  tokens: false,
  accepts: ["dimensions", "encoding_format", "user"],
  dims: [64, 256, 768],
  statuses: [400, 403, 404, 429, 500, 503, 504],
  calls(req, d) {
    const task = d.options?.task_type;
    const body = (texts: string[]): Json => {
      const b: Json = { instances: texts.map((content) => set({ content }, { task_type: task })) };
      if (typeof req.dimensions === "number") b.parameters = { outputDimensionality: req.dimensions };
      return b;
    };
    return batches(textsOf(req.input), onePerCall ? 1 : 250).map(body);
  },
  render(body, req, _d, rng) {
    const vectors = list(body.instances).map(() => vector(rng, lengthFor(req, rng)));
    const counts = vectors.map(() => tokenCount(rng));
    const predictions = vectors.map((values, i) => ({ embeddings: { statistics: { truncated: rng.chance(0.1), token_count: counts[i] }, values } }));
    const chars = list(body.instances).reduce((n, x) => n + String(x.content).length, 0);
    return { body: { predictions, metadata: { billableCharacterCount: chars } }, vectors, tokens: counts.reduce((a, b) => a + b, 0) };
  },
  model: (req) => String(req.model),
  error: googleError(":predict"),
});

const BEDROCK_ERRORS: Record<number, string> = {
  400: "ValidationException",
  403: "AccessDeniedException",
  404: "ResourceNotFoundException",
  408: "ModelTimeoutException",
  429: "ThrottlingException",
  500: "InternalServerException",
  503: "ServiceUnavailableException",
};
const bedrockError = (status: number, message: string, contextWindow: boolean): UpstreamError => ({ status, fault: { kind: "status", status, errorType: BEDROCK_ERRORS[status], message, action: "invoke" }, message, contextWindow });
const invokeHeaders = (tokens: number) => ({ "x-amzn-bedrock-input-token-count": String(tokens), "x-amzn-bedrock-invocation-latency": "42" });

/** Titan Text Embeddings V2 through InvokeModel: one text per call, `inputTextTokenCount` in the body. */
const TITAN: Family = {
  tokens: false,
  accepts: ["dimensions", "encoding_format", "user"],
  dims: [256, 512, 1024],
  statuses: [400, 403, 404, 408, 429, 500, 503],
  calls: (req) => textsOf(req.input).map((t) => set({ inputText: t }, { dimensions: req.dimensions })),
  render(_body, req, _d, rng) {
    const v = vector(rng, lengthFor(req, rng));
    const tokens = tokenCount(rng);
    return { body: { embedding: v, embeddingsByType: { float: v }, inputTextTokenCount: tokens }, headers: invokeHeaders(tokens), vectors: [v], tokens };
  },
  model: (req) => String(req.model),
  error: bedrockError,
  contextMessage: "Too many input tokens. Max input tokens: 8192, request input token count: 9001 ",
};

const COHERE_INPUT_TYPES = ["search_document", "search_query", "classification", "clustering"];

/** Cohere Embed v4 through InvokeModel: the batch in `texts` (at most 96 a call); the token count only in Bedrock's header. */
const BEDROCK_COHERE: Family = {
  tokens: false,
  accepts: ["dimensions", "encoding_format", "user", "input_type"],
  dims: [256, 512, 1024, 1536],
  statuses: [400, 403, 404, 408, 429, 500, 503],
  calls: (req, d) => batches(textsOf(req.input), 96).map((texts) => set({ texts, input_type: req.input_type ?? d.options?.input_type ?? "search_document" }, { output_dimension: req.dimensions })),
  render(body, req, _d, rng) {
    const vectors = list(body.texts).map(() => vector(rng, lengthFor(req, rng)));
    const tokens = tokenCount(rng);
    return { body: { embeddings: vectors, id: crypto.randomUUID(), response_type: "embeddings_floats", texts: body.texts }, headers: invokeHeaders(tokens), vectors, tokens };
  },
  model: (req) => String(req.model),
  error: bedrockError,
};

/** Cohere's v2 embed: `texts` (at most 96 a call), `input_type` (required by v3+ models), float vectors by type, billed input tokens. */
const COHERE: Family = {
  tokens: false,
  accepts: ["dimensions", "encoding_format", "user", "input_type"],
  dims: [256, 512, 1024, 1536],
  statuses: [400, 401, 404, 429, 500, 503],
  calls: (req, d) =>
    batches(textsOf(req.input), 96).map((texts) => set({ model: d.upstreamModel, texts, input_type: req.input_type ?? d.options?.input_type ?? "search_document", embedding_types: ["float"] }, { output_dimension: req.dimensions })),
  render(body, req, _d, rng) {
    const vectors = list(body.texts).map(() => vector(rng, lengthFor(req, rng)));
    const tokens = tokenCount(rng);
    return {
      body: { id: crypto.randomUUID(), texts: body.texts, embeddings: { float: vectors }, meta: { api_version: { version: "2" }, billed_units: { input_tokens: tokens } }, response_type: "embeddings_by_type" },
      vectors,
      tokens,
    };
  },
  model: (req) => String(req.model),
  error: (status, message, contextWindow) => ({ status, fault: { kind: "status", status, body: { id: crypto.randomUUID(), message } }, message, contextWindow, retryAfter: status === 429 ? "1" : undefined }),
};

/** Ollama's /api/embed: `input` a string or a list, the model's own options; its model name and prompt_eval_count back. */
const OLLAMA: Family = {
  tokens: false,
  accepts: ["dimensions", "encoding_format", "user"],
  dims: [16, 64, 384],
  statuses: [400, 404, 500],
  calls: (req, d) => [set({ model: d.upstreamModel, input: req.input }, { dimensions: req.dimensions, truncate: d.options?.truncate, keep_alive: d.options?.keep_alive })],
  // A string and a list of one string are the same request.
  normalize: (body) => (typeof body.input === "string" ? { ...body, input: [body.input] } : body),
  render(body, req, d, rng) {
    const vectors = textsOf(body.input).map(() => vector(rng, lengthFor(req, rng)));
    const tokens = tokenCount(rng);
    return { body: { model: d.upstreamModel, embeddings: vectors, total_duration: 14_143_917, load_duration: 1_019_500, prompt_eval_count: tokens }, vectors, tokens };
  },
  model: (_req, d) => d.upstreamModel,
  error: (status, message, contextWindow) => ({ status, fault: { kind: "status", status, body: { error: message } }, message, contextWindow, retryAfter: status === 429 ? "1" : undefined }),
  contextMessage: "the input length exceeds the context length",
};

/** The built-in `mock/`: no upstream; checked for shape, usage and cost. */
const MOCK: Family = {
  tokens: true,
  dims: [1, 8, 64],
  statuses: [],
  calls: () => [],
  render: () => ({ body: {}, vectors: [], tokens: 0 }),
  model: (_req, d) => d.upstreamModel,
  error: () => {
    throw new Error("the mock provider has no upstream");
  },
};

// ---------------------------------------------------------------------------------------------
// Setup

let mocks: { openai: MockOpenAI; azure: MockAzure; gemini: MockGemini; bedrock: MockBedrock; cohere: MockCohere; ollama: MockOllama };
let gw: TestGateway;
let client: OpenAI;
let deps: Dep[] = [];

const VERTEX_PROJECT = "acme-embed";
const VERTEX_LOCATION = "europe-west4";
const AWS = { aws_region_name: "us-west-2", aws_access_key_id: "AKIAIOSFODNN7EXAMPLE", aws_secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY" };
const SIGV4 = /^AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE\/\d{8}\/us-west-2\/bedrock\/aws4_request, ?SignedHeaders=[a-z0-9;-]+, ?Signature=[0-9a-f]{64}$/;

function buildDeps(): Dep[] {
  const m = mocks;
  const openai = openAIFamily(false);
  const openaiHooks = { mock: m.openai, answerNext: (a: Answer) => m.openai.fault({ kind: "answer", body: a.body }), failNext: (e: UpstreamError) => m.openai.fault(e.fault as never) };
  const kit = (mock: MockAzure | MockCohere | MockOllama) => ({ mock, answerNext: (a: Answer) => mock.fault({ kind: "answer", body: a.body }), failNext: (e: UpstreamError) => mock.fault(e.fault as never) });
  const google = (path: string) => ({ mock: m.gemini, answerNext: (a: Answer) => m.gemini.fault({ kind: "answer", body: a.body, path }), failNext: (e: UpstreamError) => m.gemini.fault(e.fault as never) });
  const bedrock = { mock: m.bedrock, answerNext: (a: Answer) => m.bedrock.fault({ kind: "answer", body: a.body, headers: a.headers, action: "invoke" }), failNext: (e: UpstreamError) => m.bedrock.fault(e.fault as never) };
  return [
    { name: "openai-small", provider: "openai", upstreamModel: "text-embedding-3-small", family: openai, price: "0.00000002", path: "/v1/embeddings", auth: { authorization: "Bearer sk-up-openai" }, ...openaiHooks },
    // The client's model is the upstream's: its bytes can go as they came.
    { name: "text-embedding-3-large", provider: "openai", upstreamModel: "text-embedding-3-large", family: openai, price: "0.00000013", path: "/v1/embeddings", auth: { authorization: "Bearer sk-up-openai" }, ...openaiHooks },
    {
      name: "azure-embed",
      provider: "azure",
      upstreamModel: "embed-prod",
      family: openAIFamily(true),
      price: "0.0000001",
      path: "/openai/deployments/embed-prod/embeddings?api-version=2024-10-21",
      auth: { "api-key": "azure-key", authorization: undefined },
      ...kit(m.azure),
    },
    {
      name: "gemini-embed",
      provider: "gemini",
      upstreamModel: "gemini-embedding-001",
      family: GEMINI,
      price: "0.00000015",
      path: "/v1beta/models/gemini-embedding-001:batchEmbedContents",
      auth: { "x-goog-api-key": "AIza-up", authorization: undefined },
      ...google(":batchEmbedContents"),
    },
    {
      name: "gemini-query",
      provider: "gemini",
      upstreamModel: "text-embedding-004",
      family: GEMINI,
      price: "0.000000005",
      path: "/v1beta/models/text-embedding-004:batchEmbedContents",
      auth: { "x-goog-api-key": "AIza-up", authorization: undefined },
      options: { task_type: "RETRIEVAL_QUERY" },
      ...google(":batchEmbedContents"),
    },
    {
      name: "vertex-embed",
      provider: "vertex_ai",
      upstreamModel: "text-embedding-005",
      family: vertexFamily(false),
      price: "0.000000025",
      path: `/v1/projects/${VERTEX_PROJECT}/locations/${VERTEX_LOCATION}/publishers/google/models/text-embedding-005:predict`,
      auth: { authorization: /^Bearer ya29\.c\.mock-/ },
      options: { task_type: "RETRIEVAL_DOCUMENT" },
      ...google(":predict"),
    },
    {
      name: "vertex-gemini-embed",
      provider: "vertex_ai",
      upstreamModel: "gemini-embedding-001",
      family: vertexFamily(true),
      price: "0.00000015",
      path: `/v1/projects/${VERTEX_PROJECT}/locations/${VERTEX_LOCATION}/publishers/google/models/gemini-embedding-001:predict`,
      auth: { authorization: /^Bearer ya29\.c\.mock-/ },
      ...google(":predict"),
    },
    { name: "titan", provider: "bedrock", upstreamModel: "amazon.titan-embed-text-v2:0", family: TITAN, price: "0.00000002", path: "/model/amazon.titan-embed-text-v2%3A0/invoke", auth: { authorization: SIGV4 }, ...bedrock },
    {
      name: "bedrock-cohere",
      provider: "bedrock",
      upstreamModel: "cohere.embed-v4:0",
      family: BEDROCK_COHERE,
      price: "0.00000012",
      path: "/model/cohere.embed-v4%3A0/invoke",
      auth: { authorization: SIGV4 },
      options: { input_type: "search_query" },
      ...bedrock,
    },
    { name: "cohere-embed", provider: "cohere", upstreamModel: "embed-v4.0", family: COHERE, price: "0.00000012", path: "/v2/embed", auth: { authorization: "Bearer co-up" }, ...kit(m.cohere) },
    {
      name: "ollama-embed",
      provider: "ollama",
      upstreamModel: "nomic-embed-text",
      family: OLLAMA,
      price: "0.0000000001234567",
      path: "/api/embed",
      auth: { authorization: undefined },
      options: { keep_alive: "10m", truncate: false },
      ...kit(m.ollama),
    },
    { name: "mock-embed", provider: "mock", upstreamModel: "embedder-1", family: MOCK, price: "0.000000001", path: "", auth: {} },
  ];
}

function svcParams(d: Dep, vertexCredentials: string): Json {
  const base: Json = { model: `${d.provider}/${d.upstreamModel}`, ...d.options };
  switch (d.provider) {
    case "openai":
      return { ...base, api_base: mocks.openai.url, api_key: "sk-up-openai" };
    case "azure":
      return { ...base, api_base: mocks.azure.url, api_key: "azure-key" };
    case "gemini":
      return { ...base, api_base: mocks.gemini.url, api_key: "AIza-up" };
    case "vertex_ai":
      return { ...base, api_base: mocks.gemini.url, vertex_credentials: vertexCredentials, vertex_location: VERTEX_LOCATION };
    case "bedrock":
      return { ...base, api_base: mocks.bedrock.url, ...AWS };
    case "cohere":
      return { ...base, api_base: mocks.cohere.url, api_key: "co-up" };
    case "ollama":
      return { ...base, api_base: mocks.ollama.url };
    default:
      return base;
  }
}

beforeAll(async () => {
  const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const SA_EMAIL = "embeddings-diff@acme-embed.iam.gserviceaccount.com";
  mocks = {
    openai: await startMockOpenAI({ apiKey: "sk-up-openai" }),
    azure: await startMockAzure({ apiKey: "azure-key", deployments: { "embed-prod": "text-embedding-3-small" } }),
    gemini: await startMockGemini({ apiKey: "AIza-up", serviceAccounts: [{ email: SA_EMAIL, publicKey: publicKey.export({ type: "spki", format: "pem" }) as string }] }),
    bedrock: await startMockBedrock({ region: "us-west-2", credentials: { accessKeyId: AWS.aws_access_key_id, secretAccessKey: AWS.aws_secret_access_key } }),
    cohere: await startMockCohere({ apiKey: "co-up" }),
    ollama: await startMockOllama({ models: ["nomic-embed-text:latest"], contextChars: 10_000_000 }),
  };
  const vertexCredentials = JSON.stringify({
    type: "service_account",
    project_id: VERTEX_PROJECT,
    private_key_id: "1",
    private_key: privateKey.export({ type: "pkcs8", format: "pem" }),
    client_email: SA_EMAIL,
    token_uri: mocks.gemini.tokenUrl,
  });
  deps = buildDeps();
  gw = await startTestGateway({
    model_list: deps.map((d) => ({ model_name: d.name, svc_params: svcParams(d, vertexCredentials), model_info: { id: `dep-${d.name}`, mode: "embedding", input_cost_per_token: Number(d.price), output_cost_per_token: 0 } })),
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
}, 30_000);

afterAll(async () => {
  await gw?.stop();
  await Promise.all(Object.values(mocks ?? {}).map((m) => m.stop()));
});

// ---------------------------------------------------------------------------------------------
// Random requests

type ClientMode = "sdk" | "sdk-float" | "sdk-base64" | "raw-absent" | "raw-float" | "raw-base64";
const MODES: ClientMode[] = ["sdk", "sdk", "sdk-float", "sdk-base64", "raw-absent", "raw-float", "raw-base64"];

interface Case {
  d: Dep;
  mode: ClientMode;
  /** The body as the client writes it (the SDK adds `encoding_format: "base64"` in its default mode). */
  params: Json;
  /** The body on the wire. */
  wire: Json;
  /** The raw request's path. */
  path: string;
}

function randomCase(rng: Random): Case {
  const d = rng.pick(deps);
  const f = d.family;
  const kinds: InputKind[] = f.tokens || rng.chance(0.1) ? ["string", "strings", "strings", "tokens", "token-lists"] : ["string", "strings", "strings"];
  const params: Json = { model: d.name, input: randomInput(rng, rng.pick(kinds)) };
  if (rng.chance(0.35)) params.dimensions = rng.pick(f.dims);
  if (rng.chance(0.25)) params.user = `user-${ascii(rng)}`;
  const cohere = f.accepts?.includes("input_type");
  if ((cohere && rng.chance(0.4)) || rng.chance(0.05)) params.input_type = rng.pick(COHERE_INPUT_TYPES);
  if (rng.chance(0.05)) params[rng.pick(["user", "dimensions"])] = null;
  if (rng.chance(0.08)) params.metadata = { tags: [ascii(rng)] };
  const extra = f.accepts && Object.keys(params).some((k) => !["model", "input", "metadata"].includes(k) && params[k] !== null && !f.accepts!.includes(k));
  if ((extra && rng.chance(0.4)) || rng.chance(0.03)) params.drop_params = true;
  const mode = rng.pick(MODES);
  const wire: Json = { ...params };
  if (mode === "sdk" || mode.endsWith("base64")) wire.encoding_format = "base64";
  if (mode.endsWith("float")) wire.encoding_format = "float";
  const form = rng.int(4);
  const path = mode.startsWith("sdk") ? "/v1/embeddings" : ["/v1/embeddings", "/embeddings", `/openai/deployments/${d.name}/embeddings`, `/engines/${d.name}/embeddings`][form]!;
  // The model named in the path is the one that counts; the body may leave it out.
  if (form >= 2 && !mode.startsWith("sdk") && rng.chance(0.5)) delete wire.model;
  return { d, mode, params, wire, path };
}

// ---------------------------------------------------------------------------------------------
// The model: refusals, upstream calls, the answer

/** The parameters the adapter refuses (400 naming them) or drops, and token ids it cannot send. */
function refusal(d: Dep, wire: Json): { error: Json; sent: Json } | { sent: Json; error?: undefined } {
  const accepts = d.family.accepts;
  let sent: Json = { ...wire, model: d.name };
  if (accepts) {
    // A translating adapter reads null as unset.
    sent = Object.fromEntries(Object.entries(sent).filter(([, v]) => v !== null));
    const extra = Object.keys(wire).filter((k) => !["model", "input", ...GATEWAY_ONLY].includes(k) && wire[k] !== null && !accepts.includes(k));
    if (extra.length > 0) {
      if (wire.drop_params !== true) {
        const message = `${d.provider} does not support parameters: [${extra.map((k) => `'${k}'`).join(", ")}], for model=${d.upstreamModel}. To drop these, set drop_params=true in the request body, or svc_settings.drop_params: true in config.yaml.`;
        return { sent, error: { status: 400, type: "invalid_request_error", message, param: extra.join(",") } };
      }
      for (const k of extra) delete sent[k];
    }
  }
  if (!d.family.tokens && !isText(wire.input)) return { sent, error: { status: 400, type: "invalid_request_error", message: expect.stringMatching(/token/i) } };
  return { sent };
}

/** What the client gets for an upstream status (the README's Errors section). */
function mappedStatus(status: number): number {
  if ([502, 503, 504].includes(status)) return 503;
  if (status >= 500) return 500;
  return status;
}

const TYPES: Record<number, string> = { 400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error", 408: "timeout_error", 429: "rate_limit_error", 500: "internal_server_error", 503: "api_connection_error" };

/** A random upstream error: the provider's documented statuses, sometimes its context-window refusal. */
function randomError(rng: Random, f: Family): UpstreamError {
  if (f.contextMessage && rng.chance(0.25)) return f.error(400, f.contextMessage, true);
  return f.error(rng.pick(f.statuses), `${rng.pick(["Upstream says", "Provider refused", "Something broke"])}: ${words(rng, 6)} ${ascii(rng)}`, false);
}

/** How the client must see an embedding: the upstream floats, or their float32 values when base64 went on the wire. */
function embeddingView(e: unknown): unknown {
  if (typeof e === "string") return { base64: decodeBase64(e) ?? `not whole float32s: ${e}` };
  return e;
}

function expectedEmbedding(v: number[], mode: ClientMode): unknown {
  const f32 = Array.from(Float32Array.from(v));
  if (mode === "sdk") return f32;
  if (mode === "sdk-base64" || mode === "raw-base64") return { base64: f32 };
  return v;
}

interface Outcome {
  status: number;
  body: unknown;
  headers: Headers;
}

/** The call, through the SDK or as raw HTTP; an SDK error is read back into status and body. */
async function send(c: Case): Promise<Outcome> {
  if (c.mode.startsWith("sdk")) {
    const params = { ...c.params } as Json;
    if (c.mode === "sdk-float") params.encoding_format = "float";
    if (c.mode === "sdk-base64") params.encoding_format = "base64";
    try {
      const { data, response } = await client.embeddings.create(params as unknown as OpenAI.EmbeddingCreateParams).withResponse();
      return { status: response.status, body: data, headers: response.headers };
    } catch (e) {
      if (!(e instanceof APIError)) throw e;
      return { status: e.status ?? 0, body: { error: e.error }, headers: e.headers ?? new Headers() };
    }
  }
  const res = await fetch(`${gw.url}${c.path}`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify(c.wire) });
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // compared as text
  }
  return { status: res.status, body, headers: res.headers };
}

const J = (v: unknown) => JSON.stringify(v, (_k, x) => (x instanceof RegExp ? `/${x.source}/` : x)).slice(0, 3000);

/** The model calls the mock received (Vertex's token requests aside). */
const upstreamRequests = (d: Dep) => (d.mock?.requests ?? []).filter((r) => r.path !== "/token");

type Kind = "answered" | "refused" | "upstream error" | "split";

async function runCase(i: number): Promise<{ dep: string; kinds: Kind[]; problems: string[] }> {
  const rng = new Random((SEED ^ Math.imul(i + 1, 0x9e3779b1)) >>> 0);
  const c = randomCase(rng);
  const { d } = c;
  const f = d.family;
  const problems: string[] = [];
  const check = (what: string, actual: unknown, want: unknown) => {
    try {
      expect(actual).toEqual(want);
    } catch (e) {
      problems.push(
        `case ${i} → ${d.name} ${seedNote} (EMBEDDINGS_DIFF_CASE=${i}): ${what}\nclient:   ${c.mode} ${c.path}\nrequest:  ${J(c.wire)}\nexpected: ${J(want)}\nactual:   ${J(actual)}\n${(e as Error).message.slice(0, 1500)}`,
      );
    }
  };

  // The prediction: a refusal, or the calls, each answered or the last one failing.
  const { sent, error: refused } = refusal(d, c.wire);
  const bodies = refused ? [] : f.calls(sent, d);
  const failAt = bodies.length > 0 && rng.chance(0.1) ? rng.int(bodies.length) : -1;
  const answers: Answer[] = [];
  let failure: UpstreamError | undefined;
  for (const [j, body] of bodies.entries()) {
    if (j === failAt) {
      failure = randomError(rng, f);
      d.failNext!(failure);
      break;
    }
    const a = f.render(body, sent, d, rng);
    answers.push(a);
    d.answerNext!(a);
  }
  const called = failure ? failAt + 1 : bodies.length;
  const kinds: Kind[] = [refused ? "refused" : failure ? "upstream error" : "answered", ...(bodies.length > 1 ? (["split"] as const) : [])];

  try {
    const out = await send(c);
    // The upstream requests, in order.
    const recorded = upstreamRequests(d);
    check("upstream requests", recorded.length, called);
    const norm = f.normalize ?? ((b: Json) => b);
    for (const [j, r] of recorded.slice(0, called).entries()) {
      const headers = Object.fromEntries(Object.keys(d.auth).map((k) => [k, r.headers[k]]));
      const wantHeaders = Object.fromEntries(Object.entries(d.auth).map(([k, v]) => [k, v instanceof RegExp ? expect.stringMatching(v) : v]));
      check(`upstream request ${j + 1} of ${called}`, { method: r.method, path: r.path, headers, body: norm(obj(r.body)) }, { method: "POST", path: d.path, headers: wantHeaders, body: norm(bodies[j]!) });
    }

    const body = obj(out.body);
    if (refused || failure) {
      const want = refused ?? {
        status: mappedStatus(failure!.status),
        type: failure!.contextWindow ? "context_window_exceeded" : TYPES[mappedStatus(failure!.status)],
        message: expect.stringContaining(failure!.message),
      };
      const e = obj(body.error);
      check("the error", { status: out.status, type: e.type, message: e.message, ...("param" in want ? { param: e.param } : {}) }, want);
      if (failure?.retryAfter && !failure.contextWindow) check("retry-after", out.headers.get("retry-after"), failure.retryAfter);
      return { dep: d.name, kinds, problems };
    }
    if (out.status !== 200) {
      check("the status", { status: out.status, body }, { status: 200 });
      return { dep: d.name, kinds, problems };
    }

    const data = list(body.data);
    const usage = obj(body.usage);
    let tokens: number;
    if (f === MOCK) {
      // No upstream: one vector per input, in order, all of one length (the dimensions asked for).
      const count = inputCount(c.wire.input);
      const views = data.map((x) => embeddingView(x.embedding));
      const lengths = views.map((v) => (Array.isArray(v) ? v.length : list(obj(v).base64).length));
      check("the answer", { object: body.object, count: data.length, indexes: data.map((x) => x.index), model: body.model }, { object: "list", count, indexes: [...Array(count).keys()], model: d.upstreamModel });
      check("the vectors' lengths", new Set(lengths).size <= 1 && (typeof sent.dimensions !== "number" || lengths[0] === sent.dimensions), true);
      check("the encoding", views.every((v) => (c.mode === "sdk-base64" || c.mode === "raw-base64" ? isObject(v) && Array.isArray(v.base64) : Array.isArray(v))), true);
      tokens = Number(usage.prompt_tokens);
      check("the usage", { integer: Number.isInteger(tokens), total: usage.total_tokens }, { integer: true, total: tokens });
      // Token ids are counted as what they are: one token each.
      if (!isText(c.wire.input)) check("the usage of token ids", tokens, (c.wire.input as unknown[]).flat().length);
    } else {
      const vectors = answers.flatMap((a) => a.vectors);
      tokens = answers.reduce((n, a) => n + a.tokens, 0);
      const want = {
        object: "list",
        data: vectors.map((v, index) => ({ object: "embedding", index, embedding: expectedEmbedding(v, c.mode) })),
        model: f.model(sent, d, answers),
        usage: { prompt_tokens: tokens, total_tokens: tokens },
      };
      const actual = {
        object: body.object,
        data: data.map((x) => ({ object: x.object, index: x.index, embedding: embeddingView(x.embedding) })),
        model: body.model,
        usage: { prompt_tokens: usage.prompt_tokens, total_tokens: usage.total_tokens },
      };
      check("the answer", actual, want);
    }
    check("the headers", { model: out.headers.get("x-svc-model-id"), cost: out.headers.get("x-svc-response-cost") }, { model: `dep-${d.name}`, cost: usdText(costPico(d.price, tokens)) });
    return { dep: d.name, kinds, problems };
  } finally {
    d.mock?.reset();
  }
}

describe(`embeddings through every provider, random requests and answers ${seedNote}`, () => {
  test(`${ONLY === undefined ? CASES : 1} random cases`, async () => {
    const started = Date.now();
    const problems: string[] = [];
    const perDep = new Map<string, { cases: number; failed: number }>();
    const perKind = new Map<Kind, number>();
    for (let i = ONLY ?? 0; i < (ONLY === undefined ? CASES : ONLY + 1); i++) {
      const r = await runCase(i);
      const tally = perDep.get(r.dep) ?? { cases: 0, failed: 0 };
      tally.cases++;
      if (r.problems.length > 0) tally.failed++;
      perDep.set(r.dep, tally);
      for (const k of r.kinds) perKind.set(k, (perKind.get(k) ?? 0) + 1);
      problems.push(...r.problems);
    }
    const summary = [...perDep].map(([dep, t]) => `${dep}: ${t.cases} cases, ${t.failed} failed`).join("; ");
    console.log(`${[...perKind].map(([k, n]) => `${n} ${k}`).join(", ")} in ${Date.now() - started} ms ${seedNote}`);
    if (problems.length > 0) {
      const headlines = problems.map((p) => p.slice(0, p.indexOf("\n")));
      console.log(`${problems.length} mismatches ${seedNote}; ${summary}\n${headlines.join("\n")}\n\n${problems.slice(0, 5).join("\n\n")}`);
    }
    expect(problems.length, `mismatches ${seedNote}: ${summary}; the first: ${problems[0]?.slice(0, 4000)}`).toBe(0);
    expect(Date.now() - started).toBeLessThan(60_000);
  }, 120_000);
});
