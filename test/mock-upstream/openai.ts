/**
 * A mock OpenAI upstream that answers in OpenAI's own wire format (field order, `object` values,
 * SSE framing, error bodies, headers), for end-to-end tests and benchmarks of the gateway.
 *
 *   const mock = await startMockOpenAI({ apiKey: "sk-test" });
 *   mock.fault({ kind: "status", status: 429 });   // the next request gets a 429
 *   ... point the gateway (or the openai SDK) at mock.url ...
 *   await mock.stop();
 *
 * CLI (benchmarks): `bun test/mock-upstream/openai.ts --port 9001 [--api-key KEY]` prints
 * `listening http://127.0.0.1:9001/v1` and records nothing.
 *
 * Replies are deterministic: chat answers "Mock reply to: <first words of the last user message>",
 * one SSE chunk per word (or what an `answer` fault scripts: text, reasoning, tool calls, finish
 * reason and usage); embeddings are derived from the input text.
 */
import type { Server } from "bun";
import { type RecordedPart, rawParts } from "./multipart.ts";
import { renderedText, shapedStream, type WireShaper } from "./wire-shape.ts";

export type { RecordedPart };

// ---------------------------------------------------------------------------------------------
// Public types

/** Fields every fault accepts: `path` restricts it to one endpoint ("/v1/chat/completions" or "/chat/completions"). */
interface FaultTarget {
  path?: string;
  /** Applies only to a request whose body text contains this (e.g. a marker in the prompt), so concurrent traffic cannot take it. */
  match?: string;
}

/** OpenAI's error bodies for a prompt over the context window and for a refusal by its safety system (sent with a 400). */
export const CONTEXT_ERROR = {
  error: {
    message: "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
    type: "invalid_request_error",
    param: "messages",
    code: "context_length_exceeded",
  },
};
export const POLICY_ERROR = { error: { message: "Your request was rejected as a result of our safety system.", type: "invalid_request_error", param: null, code: "content_policy_violation" } };

/** One misbehaviour, applied to exactly one matching request (FIFO). */
export type Fault = FaultTarget &
  (
    | {
        /** Answer with this status; the body defaults to OpenAI's error body for that status. */
        kind: "status";
        status: number;
        body?: string | object;
        headers?: Record<string, string>;
      }
    | { /** Wait, then answer normally. */ kind: "delay"; ms: number }
    | { /** Never answer: the request stays open until the client aborts or `stop()`. */ kind: "hang" }
    | { /** 200 whose JSON (or first SSE chunk) is cut in half. */ kind: "invalidJson" }
    | {
        /**
         * Send this many SSE chunks, then reset the connection (no `[DONE]`, no final chunk of the
         * chunked encoding). A non-stream request gets half its JSON body, then the reset.
         */
        kind: "cutStream";
        afterChunks: number;
      }
    | {
        /**
         * Stream `chunks` content deltas (default 50) with `chunkDelayMs` before every chunk after
         * the first. A non-stream request just waits chunks × chunkDelayMs.
         */
        kind: "slowStream";
        chunkDelayMs: number;
        chunks?: number;
      }
    | { /** A stream's bytes cut, replaced or ended as the shaper says (wire-shape.ts); a JSON answer is sent as usual. */ kind: "wire"; shape: WireShaper }
    | {
        /**
         * A chat request is answered with exactly this (in OpenAI's format: a chat.completion, or
         * chunks with the content a few characters at a time, each call's arguments in pieces,
         * choices interleaved, and the usage chunk when asked), whatever the prompt.
         */
        kind: "scripted";
        answer: ScriptedAnswer;
      }
    | { /** 200 with this JSON body instead of the planned answer, once the request passed the mock's checks (a test's own answer). */ kind: "answer"; body: unknown }
    | {
        /**
         * An answer of `bytes` bytes (a JSON object padded with spaces, never ending if `bytes`
         * is past what the client reads), with `status` (default 200); chunked unless `announce`
         * sends its content-length.
         */
        kind: "huge";
        bytes: number;
        status?: number;
        announce?: boolean;
      }
  );

/** What a scripted chat answer says: per choice its text and tool calls and finish reason, and the usage object as OpenAI writes it. */
export interface ScriptedAnswer {
  /** `reasoning`: the `reasoning_content` some OpenAI-compatible providers (DeepSeek) send beside the answer. */
  choices: { content: string | null; reasoning?: string; toolCalls?: { id: string; name: string; arguments: string }[]; finishReason: string }[];
  usage: Record<string, unknown>;
}

export type FaultKind = Fault["kind"];

export interface RecordedRequest {
  method: string;
  /** Path with query string, e.g. "/v1/chat/completions". */
  path: string;
  /** Header names lower-cased. */
  headers: Record<string, string>;
  /** Parsed JSON body; the raw text when it is not JSON; undefined when empty. */
  body: unknown;
  /** A multipart upload's parts as they came on the wire, in order (repeated names and declared types kept). */
  parts?: RecordedPart[];
}


export interface MockOpenAIOptions {
  /** Default 0: any free port. */
  port?: number;
  /** When set, every request must carry `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** Record requests in `requests` (default true; the CLI turns it off). */
  record?: boolean;
}

export interface MockOpenAI {
  /** Base URL including `/v1`, as the SDK's `baseURL` expects. */
  readonly url: string;
  readonly port: number;
  readonly requests: RecordedRequest[];
  /** Streams whose client went away before the last byte. */
  readonly streamsCancelled: number;
  /** Requests the server has not finished answering (a client that left is one until the server notices). */
  readonly pendingRequests: number;
  fault(...faults: Fault[]): void;
  clearFaults(): void;
  /** Clears requests, faults and `streamsCancelled`. */
  reset(): void;
  stop(): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Small helpers

type JsonObject = Record<string, unknown>;

const isObject = (v: unknown): v is JsonObject => typeof v === "object" && v !== null && !Array.isArray(v);

const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);

const positiveInt = (v: unknown): number | undefined =>
  typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : undefined;

const encoder = new TextEncoder();

const ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

function randomAlnum(length: number): string {
  const bytes = crypto.getRandomValues(new Uint8Array(length));
  let out = "";
  for (const b of bytes) out += ALNUM[b % ALNUM.length];
  return out;
}

// OpenAI's id shapes: chatcmpl-/cmpl- plus 29 characters, call_ plus 24, req_ plus 32 hex.
const chatId = () => `chatcmpl-${randomAlnum(29)}`;
const completionId = () => `cmpl-${randomAlnum(29)}`;
const callId = () => `call_${randomAlnum(24)}`;
const requestId = () => `req_${crypto.randomUUID().replaceAll("-", "")}`;

const SYSTEM_FINGERPRINT = "fp_0ba0d124f1";
const nowSeconds = () => Math.floor(Date.now() / 1000);
const approxTokens = (text: string) => Math.ceil(text.length / 4);

// ---------------------------------------------------------------------------------------------
// Headers and errors

interface RequestContext {
  started: number;
  requestId: string;
}

function baseHeaders(ctx: RequestContext, contentType: string): Record<string, string> {
  return {
    "content-type": contentType,
    "access-control-expose-headers": "X-Request-ID",
    "openai-processing-ms": String(Math.round(performance.now() - ctx.started)),
    "openai-version": "2020-10-01",
    "x-request-id": ctx.requestId,
  };
}

// Success responses carry the rate-limit picture, as OpenAI's do; clients and gateways read them.
function successHeaders(ctx: RequestContext, contentType: string): Record<string, string> {
  return {
    ...baseHeaders(ctx, contentType),
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-limit-tokens": "30000000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-remaining-tokens": "29999990",
    "x-ratelimit-reset-requests": "6ms",
    "x-ratelimit-reset-tokens": "0s",
  };
}

interface OpenAIErrorFields {
  message: string;
  type: string;
  param: string | null;
  code: string | number | null;
}

const errorBody = (e: OpenAIErrorFields) => ({
  error: { message: e.message, type: e.type, param: e.param, code: e.code },
});

function errorResponse(
  ctx: RequestContext,
  status: number,
  fields: OpenAIErrorFields,
  headers: Record<string, string> = {},
): Response {
  return new Response(JSON.stringify(errorBody(fields)), {
    status,
    headers: { ...baseHeaders(ctx, "application/json"), ...headers },
  });
}

const invalidRequest = (message: string, param: string | null = null, code: string | null = null) => ({
  message,
  type: "invalid_request_error",
  param,
  code,
});

/** OpenAI's error body for a status, used when a status fault gives none. */
function defaultErrorFields(status: number): OpenAIErrorFields {
  switch (status) {
    case 400:
      return invalidRequest("Invalid value for 'messages': the mock was told to reject this request.", "messages");
    case 401:
      return invalidRequest(
        "Incorrect API key provided: sk-mock***********************1234. You can find your API key at https://platform.openai.com/account/api-keys.",
        null,
        "invalid_api_key",
      );
    case 403:
      return invalidRequest("Project does not have access to this model.", null, "model_not_found");
    case 404:
      return invalidRequest(
        "The model `gpt-mock` does not exist or you do not have access to it.",
        null,
        "model_not_found",
      );
    case 429:
      return {
        message:
          "Rate limit reached for gpt-4o-mini in organization org-mock on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 1s. Visit https://platform.openai.com/account/rate-limits to learn more.",
        type: "requests",
        param: null,
        code: "rate_limit_exceeded",
      };
    // Cloudflare answers 502 in front of OpenAI with this exact shape (numeric code included).
    case 502:
      return { message: "Bad gateway.", type: "cf_bad_gateway", param: null, code: 502 };
    case 503:
      return { message: "The server is overloaded or not ready yet.", type: "server_error", param: null, code: null };
    default:
      return {
        message: "The server had an error while processing your request. Sorry about that!",
        type: "server_error",
        param: null,
        code: null,
      };
  }
}

function defaultFaultHeaders(status: number): Record<string, string> {
  if (status !== 429) return {};
  return {
    "retry-after": "1",
    "x-ratelimit-limit-requests": "3",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "1s",
  };
}

function statusFaultResponse(ctx: RequestContext, f: Extract<Fault, { kind: "status" }>): Response {
  const headers = { ...baseHeaders(ctx, "application/json"), ...defaultFaultHeaders(f.status) };
  let text: string;
  if (f.body === undefined) text = JSON.stringify(errorBody(defaultErrorFields(f.status)));
  else if (typeof f.body === "string") {
    text = f.body;
    if (!isJsonText(text)) headers["content-type"] = "text/plain; charset=utf-8";
  } else text = JSON.stringify(f.body);
  return new Response(text, { status: f.status, headers: { ...headers, ...f.headers } });
}

function isJsonText(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

// OpenAI shows the first and last characters of a wrong key and masks the rest.
function maskKey(key: string): string {
  if (key.length <= 8) return "*".repeat(key.length);
  return `${key.slice(0, 3)}${"*".repeat(key.length - 7)}${key.slice(-4)}`;
}

function checkAuth(ctx: RequestContext, req: Request, apiKey: string | undefined): Response | undefined {
  if (apiKey === undefined) return undefined;
  const header = req.headers.get("authorization") ?? "";
  if (header === `Bearer ${apiKey}`) return undefined;
  const given = header.replace(/^Bearer\s+/i, "").trim();
  if (given === "") {
    return errorResponse(
      ctx,
      401,
      invalidRequest(
        "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API from your browser and are prompted for a username and password. You can obtain an API key from https://platform.openai.com/account/api-keys.",
      ),
    );
  }
  return errorResponse(
    ctx,
    401,
    invalidRequest(
      `Incorrect API key provided: ${maskKey(given)}. You can find your API key at https://platform.openai.com/account/api-keys.`,
      null,
      "invalid_api_key",
    ),
  );
}

// ---------------------------------------------------------------------------------------------
// Replies: what a route wants to send, before faults decide how it travels

/** A JSON body, or the data payloads of an SSE stream (the last one is "[DONE]"). */
type Reply = { kind: "json"; body: unknown } | { kind: "sse"; payloads: string[] };

/** Route-level knobs a fault imposes on content generation. */
interface GenerationHints {
  /** slowStream: stretch the reply to this many words. */
  words?: number;
  /** answer: what to say instead. */
  answer?: ScriptedAnswer;
}

const DONE = "[DONE]";

// ---------------------------------------------------------------------------------------------
// Deterministic text

const REPLY_WORDS_FROM_PROMPT = 12;

function replyWords(prefix: string, prompt: string, hints: GenerationHints): string[] {
  const echoed = prompt.split(/\s+/).filter(Boolean).slice(0, REPLY_WORDS_FROM_PROMPT);
  const words = [...prefix.split(" "), ...echoed];
  if (hints.words === undefined) return words;
  return Array.from({ length: hints.words }, (_, i) => words[i % words.length] ?? "mock");
}

/** Words as token-like pieces: the first bare, the others with their leading space. */
const wordPieces = (words: string[]) => words.map((w, i) => (i === 0 ? w : ` ${w}`));

/** Applies max_tokens, one word per token. */
function truncate(words: string[], limit: number | undefined): { words: string[]; finish: "stop" | "length" } {
  if (limit === undefined || words.length <= limit) return { words, finish: "stop" };
  return { words: words.slice(0, limit), finish: "length" };
}

// ---------------------------------------------------------------------------------------------
// Chat completions

function messageText(message: unknown): string {
  if (!isObject(message)) return "";
  const content = message.content;
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.map((part) => (isObject(part) && typeof part.text === "string" ? part.text : "")).join("");
}

function lastUserText(messages: unknown[]): string {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i];
    if (isObject(m) && m.role === "user") return messageText(m);
  }
  return "";
}

function chatPromptTokens(messages: unknown[]): number {
  let chars = 0;
  for (const m of messages) chars += messageText(m).length;
  return Math.ceil(chars / 4) + 3 * messages.length;
}

interface ToolSpec {
  name: string;
  parameters: unknown;
}

function toolSpecs(tools: unknown): ToolSpec[] {
  if (!Array.isArray(tools)) return [];
  const specs: ToolSpec[] = [];
  for (const t of tools) {
    if (!isObject(t) || !isObject(t.function)) continue;
    const name = str(t.function.name);
    if (name) specs.push({ name, parameters: t.function.parameters });
  }
  return specs;
}

/** Which tool the model "decides" to call, honouring tool_choice like OpenAI does. */
function chooseTool(body: JsonObject, userText: string): ToolSpec | undefined {
  const tools = toolSpecs(body.tools);
  if (tools.length === 0) return undefined;
  const choice = body.tool_choice;
  if (choice === "none") return undefined;
  if (isObject(choice) && isObject(choice.function)) {
    const wanted = str(choice.function.name);
    return tools.find((t) => t.name === wanted) ?? tools[0];
  }
  if (choice === "required") return tools[0];
  return /\bweather\b/i.test(userText) ? tools[0] : undefined;
}

function mockValue(key: string, schema: unknown): unknown {
  if (!isObject(schema)) return "mock";
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum[0];
  switch (schema.type) {
    case "number":
    case "integer":
      return 1;
    case "boolean":
      return true;
    case "array":
      return [];
    case "object":
      return {};
    default:
      return /location|city|place/i.test(key) ? "Paris" : "mock";
  }
}

function mockArguments(parameters: unknown): string {
  const properties = isObject(parameters) && isObject(parameters.properties) ? parameters.properties : {};
  const args: JsonObject = {};
  for (const [key, schema] of Object.entries(properties)) args[key] = mockValue(key, schema);
  return JSON.stringify(args);
}

/** Splits JSON the way OpenAI's tokenizer tends to: runs of word characters vs. punctuation. */
const argumentPieces = (json: string) => json.match(/[A-Za-z0-9]+|[^A-Za-z0-9]+/g) ?? [json];

type ChatOutcome =
  | { kind: "text"; pieces: string[]; finish: "stop" | "length" }
  | { kind: "tool"; name: string; pieces: string[] };

interface ChatPlan {
  id: string;
  created: number;
  model: string;
  n: number;
  outcome: ChatOutcome;
  promptTokens: number;
}

function planChat(body: JsonObject, messages: unknown[], hints: GenerationHints): ChatPlan {
  const userText = lastUserText(messages);
  const tool = chooseTool(body, userText);
  let outcome: ChatOutcome;
  if (tool) {
    outcome = { kind: "tool", name: tool.name, pieces: argumentPieces(mockArguments(tool.parameters)) };
  } else {
    const limit = positiveInt(body.max_completion_tokens) ?? positiveInt(body.max_tokens);
    const { words, finish } = truncate(replyWords("Mock reply to:", userText, hints), limit);
    outcome = { kind: "text", pieces: wordPieces(words), finish };
  }
  return {
    id: chatId(),
    created: nowSeconds(),
    model: str(body.model) ?? "",
    n: Math.max(1, positiveInt(body.n) ?? 1),
    outcome,
    promptTokens: chatPromptTokens(messages),
  };
}

function chatUsage(promptTokens: number, completionTokens: number) {
  return {
    prompt_tokens: promptTokens,
    completion_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
    prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 },
    completion_tokens_details: {
      reasoning_tokens: 0,
      audio_tokens: 0,
      accepted_prediction_tokens: 0,
      rejected_prediction_tokens: 0,
    },
  };
}

const finishReason = (o: ChatOutcome) => (o.kind === "tool" ? "tool_calls" : o.finish);

function chatMessage(o: ChatOutcome) {
  if (o.kind === "text") {
    return { role: "assistant", content: o.pieces.join(""), refusal: null, annotations: [] };
  }
  const call = { id: callId(), type: "function", function: { name: o.name, arguments: o.pieces.join("") } };
  return { role: "assistant", content: null, tool_calls: [call], refusal: null, annotations: [] };
}

function chatJson(plan: ChatPlan) {
  const choices = Array.from({ length: plan.n }, (_, index) => ({
    index,
    message: chatMessage(plan.outcome),
    logprobs: null,
    finish_reason: finishReason(plan.outcome),
  }));
  return {
    id: plan.id,
    object: "chat.completion",
    created: plan.created,
    model: plan.model,
    choices,
    usage: chatUsage(plan.promptTokens, plan.outcome.pieces.length * plan.n),
    service_tier: "default",
    system_fingerprint: SYSTEM_FINGERPRINT,
  };
}

// OpenAI pads every chunk with a random `obfuscation` string (on by default since 2025) to
// hide token lengths; a fixed alphabet keeps ours deterministic yet variable in length.
const OBFUSCATION_SOURCE = "kSx18Gpkah38dLw0M5wAKbe8E2c6Xq1";

type ChunkWriter = (choices: unknown[], usage?: unknown) => string;

function chatChunkWriter(plan: ChatPlan, streamOptions: unknown): ChunkWriter {
  const includeUsage = isObject(streamOptions) && streamOptions.include_usage === true;
  const obfuscate = !(isObject(streamOptions) && streamOptions.include_obfuscation === false);
  let seq = 0;
  return (choices, usage) => {
    const chunk: JsonObject = {
      id: plan.id,
      object: "chat.completion.chunk",
      created: plan.created,
      model: plan.model,
      service_tier: "default",
      system_fingerprint: SYSTEM_FINGERPRINT,
      choices,
    };
    // Only with include_usage does OpenAI send the key at all; null until the final chunk.
    if (includeUsage) chunk.usage = usage ?? null;
    if (obfuscate) chunk.obfuscation = OBFUSCATION_SOURCE.slice(0, 1 + ((seq * 7) % 15));
    seq++;
    return JSON.stringify(chunk);
  };
}

const deltaChoice = (index: number, delta: unknown, finish: string | null = null) => ({
  index,
  delta,
  logprobs: null,
  finish_reason: finish,
});

function firstDelta(o: ChatOutcome, callIds: string[], index: number) {
  if (o.kind === "text") return { role: "assistant", content: "", refusal: null };
  const call = { index: 0, id: callIds[index], type: "function", function: { name: o.name, arguments: "" } };
  return { role: "assistant", content: null, tool_calls: [call], refusal: null };
}

const pieceDelta = (o: ChatOutcome, piece: string) =>
  o.kind === "text" ? { content: piece } : { tool_calls: [{ index: 0, function: { arguments: piece } }] };

/** Chunks interleave choices step by step, one choice per chunk, as OpenAI does for n > 1. */
function chatPayloads(plan: ChatPlan, streamOptions: unknown): string[] {
  const write = chatChunkWriter(plan, streamOptions);
  const { outcome, n } = plan;
  const indexes = Array.from({ length: n }, (_, i) => i);
  const callIds = indexes.map(() => callId());
  const payloads: string[] = indexes.map((i) => write([deltaChoice(i, firstDelta(outcome, callIds, i))]));
  for (const piece of outcome.pieces) {
    for (const i of indexes) payloads.push(write([deltaChoice(i, pieceDelta(outcome, piece))]));
  }
  for (const i of indexes) payloads.push(write([deltaChoice(i, {}, finishReason(outcome))]));
  if (isObject(streamOptions) && streamOptions.include_usage === true) {
    payloads.push(write([], chatUsage(plan.promptTokens, outcome.pieces.length * n)));
  }
  payloads.push(DONE);
  return payloads;
}

/** Text in pieces of up to 5 characters (a piece never splits a UTF-16 surrogate pair). */
function textPieces(text: string): string[] {
  const chars = [...text];
  const out: string[] = [];
  for (let i = 0; i < chars.length; i += 5) out.push(chars.slice(i, i + 5).join(""));
  return out;
}

/** A scripted answer as OpenAI sends it: one chat.completion, or chunks (choices interleaved step by step). */
function scriptedReply(plan: ChatPlan, answer: ScriptedAnswer, body: JsonObject): Reply {
  if (body.stream !== true) {
    const choices = answer.choices.map((c, index) => {
      const message: JsonObject = { role: "assistant", content: c.content };
      if (c.reasoning !== undefined) message.reasoning_content = c.reasoning;
      if (c.toolCalls?.length) message.tool_calls = c.toolCalls.map((t) => ({ id: t.id, type: "function", function: { name: t.name, arguments: t.arguments } }));
      Object.assign(message, { refusal: null, annotations: [] });
      return { index, message, logprobs: null, finish_reason: c.finishReason };
    });
    return {
      kind: "json",
      body: { id: plan.id, object: "chat.completion", created: plan.created, model: plan.model, choices, usage: answer.usage, service_tier: "default", system_fingerprint: SYSTEM_FINGERPRINT },
    };
  }
  const write = chatChunkWriter(plan, body.stream_options);
  const steps = answer.choices.map((c, index) => {
    const deltas: unknown[] = [deltaChoice(index, { role: "assistant", content: "", refusal: null })];
    for (const piece of textPieces(c.reasoning ?? "")) deltas.push(deltaChoice(index, { reasoning_content: piece }));
    for (const piece of textPieces(c.content ?? "")) deltas.push(deltaChoice(index, { content: piece }));
    for (const [i, t] of (c.toolCalls ?? []).entries()) {
      deltas.push(deltaChoice(index, { tool_calls: [{ index: i, id: t.id, type: "function", function: { name: t.name, arguments: "" } }] }));
      for (const piece of argumentPieces(t.arguments)) deltas.push(deltaChoice(index, { tool_calls: [{ index: i, function: { arguments: piece } }] }));
    }
    deltas.push(deltaChoice(index, {}, c.finishReason));
    return deltas;
  });
  const payloads: string[] = [];
  for (let step = 0; steps.some((d) => step < d.length); step++) for (const d of steps) if (step < d.length) payloads.push(write([d[step]]));
  if (isObject(body.stream_options) && body.stream_options.include_usage === true) payloads.push(write([], answer.usage));
  payloads.push(DONE);
  return { kind: "sse", payloads };
}

/** The most choices (`n`) OpenAI gives for one chat request. */
const MAX_CHOICES = 128;

function chatCompletions(ctx: RequestContext, body: JsonObject, hints: GenerationHints): Reply | Response {
  if (typeof body.model !== "string") {
    return errorResponse(ctx, 400, invalidRequest("you must provide a model parameter"));
  }
  if (!Array.isArray(body.messages)) {
    return errorResponse(
      ctx,
      400,
      invalidRequest("Missing required parameter: 'messages'.", "messages", "missing_required_parameter"),
    );
  }
  const streamError = checkStreamOptions(ctx, body);
  if (streamError) return streamError;
  // OpenAI's own bound; the mock would otherwise build that many choices.
  if (typeof body.n === "number" && body.n > MAX_CHOICES) {
    return errorResponse(ctx, 400, invalidRequest(`Invalid 'n': integer above maximum value. Expected a value <= ${MAX_CHOICES}, but got ${body.n} instead.`, "n", "integer_above_max_value"));
  }
  const plan = planChat(body, body.messages, hints);
  if (hints.answer) return scriptedReply(plan, hints.answer, body);
  if (body.stream === true) return { kind: "sse", payloads: chatPayloads(plan, body.stream_options) };
  return { kind: "json", body: chatJson(plan) };
}

function checkStreamOptions(ctx: RequestContext, body: JsonObject): Response | undefined {
  if (body.stream === true || body.stream_options === undefined || body.stream_options === null) return undefined;
  return errorResponse(
    ctx,
    400,
    invalidRequest("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options"),
  );
}

// ---------------------------------------------------------------------------------------------
// Legacy completions

/** The legacy endpoint takes a string, strings, a token array or token arrays. */
function legacyPrompts(prompt: unknown): string[] {
  if (typeof prompt === "string") return [prompt];
  if (!Array.isArray(prompt) || prompt.length === 0) return [""];
  if (prompt.every((p) => typeof p === "number")) return [prompt.join(" ")];
  return prompt.map((p) => (typeof p === "string" ? p : Array.isArray(p) ? p.join(" ") : ""));
}

// The legacy endpoint's documented default.
const LEGACY_DEFAULT_MAX_TOKENS = 16;

interface LegacyChoicePlan {
  prompt: string;
  pieces: string[];
  finish: "stop" | "length";
}

interface LegacyPlan {
  id: string;
  created: number;
  model: string;
  echo: boolean;
  choices: LegacyChoicePlan[];
  promptTokens: number;
  completionTokens: number;
}

function planLegacy(body: JsonObject, hints: GenerationHints): LegacyPlan {
  const n = Math.max(1, positiveInt(body.n) ?? 1);
  const limit = positiveInt(body.max_tokens) ?? LEGACY_DEFAULT_MAX_TOKENS;
  const choices: LegacyChoicePlan[] = [];
  let promptTokens = 0;
  for (const prompt of legacyPrompts(body.prompt)) {
    promptTokens += approxTokens(prompt);
    // Each prompt gets n choices; choice index = promptIndex * n + i.
    for (let i = 0; i < n; i++) {
      const { words, finish } = truncate(replyWords("Mock completion of:", prompt, hints), limit);
      choices.push({ prompt, pieces: wordPieces(words), finish });
    }
  }
  return {
    id: completionId(),
    created: nowSeconds(),
    model: str(body.model) ?? "",
    echo: body.echo === true,
    choices,
    promptTokens,
    completionTokens: choices.reduce((sum, c) => sum + c.pieces.length, 0),
  };
}

const legacyUsage = (p: LegacyPlan) => ({
  prompt_tokens: p.promptTokens,
  completion_tokens: p.completionTokens,
  total_tokens: p.promptTokens + p.completionTokens,
});

function legacyJson(plan: LegacyPlan) {
  return {
    id: plan.id,
    object: "text_completion",
    created: plan.created,
    model: plan.model,
    choices: plan.choices.map((c, index) => ({
      text: (plan.echo ? c.prompt : "") + c.pieces.join(""),
      index,
      logprobs: null,
      finish_reason: c.finish,
    })),
    usage: legacyUsage(plan),
  };
}

/** Legacy chunks put `model` after `choices` — a quirk of OpenAI's legacy stream kept on purpose. */
function legacyPayloads(plan: LegacyPlan, streamOptions: unknown): string[] {
  const includeUsage = isObject(streamOptions) && streamOptions.include_usage === true;
  const write = (choices: unknown[], usage?: unknown) => {
    const chunk: JsonObject = {
      id: plan.id,
      object: "text_completion",
      created: plan.created,
      choices,
      model: plan.model,
    };
    if (includeUsage) chunk.usage = usage ?? null;
    return JSON.stringify(chunk);
  };
  const choice = (index: number, text: string, finish: string | null = null) => ({
    text,
    index,
    logprobs: null,
    finish_reason: finish,
  });
  const payloads: string[] = [];
  plan.choices.forEach((c, index) => {
    if (plan.echo) payloads.push(write([choice(index, c.prompt)]));
    for (const piece of c.pieces) payloads.push(write([choice(index, piece)]));
    payloads.push(write([choice(index, "", c.finish)]));
  });
  if (includeUsage) payloads.push(write([], legacyUsage(plan)));
  payloads.push(DONE);
  return payloads;
}

function completions(ctx: RequestContext, body: JsonObject, hints: GenerationHints): Reply | Response {
  if (typeof body.model !== "string") {
    return errorResponse(ctx, 400, invalidRequest("you must provide a model parameter"));
  }
  const streamError = checkStreamOptions(ctx, body);
  if (streamError) return streamError;
  const plan = planLegacy(body, hints);
  if (body.stream === true) return { kind: "sse", payloads: legacyPayloads(plan, body.stream_options) };
  return { kind: "json", body: legacyJson(plan) };
}

// ---------------------------------------------------------------------------------------------
// Embeddings

const DEFAULT_DIMENSIONS = 8;

function embeddingInputs(input: unknown): string[] | undefined {
  if (typeof input === "string") return [input];
  if (!Array.isArray(input) || input.length === 0) return undefined;
  if (input.every((t) => typeof t === "number")) return [input.join(" ")];
  return input.map((item) => (typeof item === "string" ? item : Array.isArray(item) ? item.join(" ") : ""));
}

function fnv1a(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193);
  }
  return hash >>> 0;
}

/** mulberry32: tiny, fast, good enough to make vectors look random. */
function prng(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A unit-length vector derived from the text. Every component is rounded to float32 so the JSON
 * floats and the base64 float32 bytes decode to identical numbers (OpenAI's JSON floats are
 * shortened decimals, so there the two encodings differ in the last digits).
 */
export function mockEmbedding(text: string, dimensions = DEFAULT_DIMENSIONS): number[] {
  const next = prng(fnv1a(text));
  const raw = Array.from({ length: dimensions }, () => next() * 2 - 1);
  const norm = Math.hypot(...raw) || 1;
  return raw.map((x) => Math.fround(x / norm));
}

function float32Base64(vector: number[]): string {
  const view = new DataView(new ArrayBuffer(vector.length * 4));
  for (const [i, x] of vector.entries()) view.setFloat32(i * 4, x, true);
  return Buffer.from(view.buffer).toString("base64");
}

function embeddings(ctx: RequestContext, body: JsonObject): Reply | Response {
  if (typeof body.model !== "string") {
    return errorResponse(ctx, 400, invalidRequest("you must provide a model parameter"));
  }
  const inputs = embeddingInputs(body.input);
  if (!inputs) {
    return errorResponse(
      ctx,
      400,
      invalidRequest("Missing required parameter: 'input'.", "input", "missing_required_parameter"),
    );
  }
  const dimensions = positiveInt(body.dimensions) || DEFAULT_DIMENSIONS;
  const base64 = body.encoding_format === "base64";
  const data = inputs.map((text, index) => {
    const vector = mockEmbedding(text, dimensions);
    return { object: "embedding", index, embedding: base64 ? float32Base64(vector) : vector };
  });
  const promptTokens = inputs.reduce((sum, text) => sum + Math.max(1, approxTokens(text)), 0);
  return {
    kind: "json",
    body: { object: "list", data, model: body.model, usage: { prompt_tokens: promptTokens, total_tokens: promptTokens } },
  };
}

/** A 1×1 PNG, base64: every generated image. */
const PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";

function imageGenerations(ctx: RequestContext, body: JsonObject): Reply | Response {
  if (typeof body.model !== "string") return errorResponse(ctx, 400, invalidRequest("you must provide a model parameter"));
  if (typeof body.prompt !== "string" || body.prompt === "") {
    return errorResponse(ctx, 400, invalidRequest("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter"));
  }
  const n = positiveInt(body.n) || 1;
  const data = Array.from({ length: n }, (_, i) =>
    body.response_format === "b64_json"
      ? { b64_json: PIXEL_PNG, revised_prompt: body.prompt }
      : { url: `https://images.mock.invalid/${ctx.requestId}-${i}.png`, revised_prompt: body.prompt },
  );
  return { kind: "json", body: { created: Math.floor(Date.now() / 1000), data } };
}

/**
 * OpenAI's transcription answers: whisper-1 reports the audio's length (`usage.seconds`, or
 * `duration` in verbose_json), gpt-4o-transcribe its tokens. The file is taken as 16 kHz 16-bit
 * mono PCM (32,000 bytes a second).
 */
function transcriptions(ctx: RequestContext, body: JsonObject): Reply | Response {
  if (typeof body.model !== "string") return errorResponse(ctx, 400, invalidRequest("you must provide a model parameter"));
  const file = isObject(body.file) ? body.file : undefined;
  if (!file) return errorResponse(ctx, 400, invalidRequest("Missing required parameter: 'file'.", "file", "missing_required_parameter"));
  const size = typeof file.size === "number" ? file.size : 0;
  const duration = Math.round((size / 32_000) * 100) / 100;
  const text = `Transcript of ${String(file.filename)} (${size} bytes).`;
  const format = body.response_format ?? "json";
  const tokens = body.model.startsWith("gpt-4o");
  if (format === "verbose_json") {
    if (tokens) return errorResponse(ctx, 400, invalidRequest(`response_format 'verbose_json' is not compatible with model '${body.model}'`, "response_format"));
    return { kind: "json", body: { task: "transcribe", language: "english", duration, text, segments: [{ id: 0, seek: 0, start: 0, end: duration, text: ` ${text}` }] } };
  }
  if (format === "text") return new Response(`${text}\n`, { headers: successHeaders(ctx, "text/plain; charset=utf-8") });
  const usage = tokens
    ? { type: "tokens", input_tokens: Math.ceil(duration * 10) + 5, input_token_details: { text_tokens: 5, audio_tokens: Math.ceil(duration * 10) }, output_tokens: approxTokens(text), total_tokens: 0 }
    : { type: "duration", seconds: Math.ceil(duration) };
  return { kind: "json", body: { text, usage } };
}

/** Speech: `ID3` and 10 bytes per character of input, as audio/mpeg (or the asked format's type). */
function speech(ctx: RequestContext, body: JsonObject): Reply | Response {
  if (typeof body.model !== "string") return errorResponse(ctx, 400, invalidRequest("you must provide a model parameter"));
  if (typeof body.input !== "string" || body.input === "") return errorResponse(ctx, 400, invalidRequest("Missing required parameter: 'input'.", "input", "missing_required_parameter"));
  if (body.voice === undefined) return errorResponse(ctx, 400, invalidRequest("Missing required parameter: 'voice'.", "voice", "missing_required_parameter"));
  // PCM: 24 kHz 16-bit mono, a tenth of a second per character; otherwise an `ID3` tag and 10 bytes per character.
  if (body.response_format === "pcm") return new Response(new Uint8Array(body.input.length * 4_800), { headers: successHeaders(ctx, "audio/pcm") });
  const bytes = new Uint8Array(3 + body.input.length * 10);
  bytes.set([0x49, 0x44, 0x33]);
  const type = body.response_format === "wav" ? "audio/wav" : "audio/mpeg";
  return new Response(bytes, { headers: successHeaders(ctx, type) });
}

/** Moderation: flags violence when the text says "kill" (one result per input). */
function moderations(ctx: RequestContext, body: JsonObject): Reply | Response {
  const inputs = typeof body.input === "string" ? [body.input] : Array.isArray(body.input) ? body.input.map(String) : undefined;
  if (!inputs) return errorResponse(ctx, 400, invalidRequest("Missing required parameter: 'input'.", "input", "missing_required_parameter"));
  const results = inputs.map((text) => {
    const violent = /kill/i.test(text);
    return { flagged: violent, categories: { violence: violent, hate: false }, category_scores: { violence: violent ? 0.98 : 0.001, hate: 0.001 } };
  });
  return { kind: "json", body: { id: `modr-${ctx.requestId}`, model: body.model ?? "omni-moderation-latest", results } };
}

// ---------------------------------------------------------------------------------------------
// Models

const MODELS = [
  { id: "gpt-4o-mini", object: "model", created: 1721172741, owned_by: "system" },
  { id: "gpt-4o", object: "model", created: 1715367049, owned_by: "system" },
  { id: "gpt-4.1", object: "model", created: 1744316542, owned_by: "system" },
  { id: "gpt-3.5-turbo-instruct", object: "model", created: 1692901427, owned_by: "system" },
  { id: "text-embedding-3-small", object: "model", created: 1705948997, owned_by: "system" },
];

function retrieveModel(ctx: RequestContext, id: string): Reply | Response {
  const model = MODELS.find((m) => m.id === id);
  if (model) return { kind: "json", body: model };
  return errorResponse(
    ctx,
    404,
    invalidRequest(`The model '${id}' does not exist`, "model", "model_not_found"),
  );
}

// ---------------------------------------------------------------------------------------------
// Delivery: turning a Reply into bytes, possibly misbehaving on purpose

interface Counters {
  streamsCancelled: number;
}

interface Pacing {
  /** Pause before every part but the first. */
  delayMs: number;
  /** Reset the connection after this many parts (the remaining parts are never sent). */
  cutAfter?: number;
}

const SLOW_STREAM_CHUNKS = 50;

// Long enough for the client to drain its socket before the reset, which would discard unread data.
const CUT_FLUSH_MS = 10;

/**
 * A pull-driven body: one part per pull, so a client that leaves mid-way shows up as `cancel`.
 * Erroring the controller with `undefined` makes Bun reset the socket without logging, which is
 * what a dropped upstream connection looks like to the client (no terminating chunk).
 */
function partStream(parts: string[], pacing: Pacing, counters: Counters): ReadableStream<Uint8Array> {
  let sent = 0;
  let over = false;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (pacing.cutAfter !== undefined && sent >= pacing.cutAfter) {
          over = true;
          // Resetting right behind the last write loses it: Bun corks writes, and a TCP reset
          // makes the peer drop data it has not read yet.
          await Bun.sleep(CUT_FLUSH_MS);
          controller.error(undefined);
          return;
        }
        if (sent > 0 && pacing.delayMs > 0) await Bun.sleep(pacing.delayMs);
        if (over) return; // the client left while we slept
        controller.enqueue(encoder.encode(parts[sent] ?? ""));
        sent++;
        const cutNext = pacing.cutAfter !== undefined && sent >= pacing.cutAfter;
        if (sent >= parts.length && !cutNext) {
          over = true;
          controller.close();
        }
      },
      cancel() {
        if (over) return;
        over = true;
        counters.streamsCancelled++;
      },
    },
    { highWaterMark: 0 },
  );
}

const ssePart = (payload: string) => `data: ${payload}\n\n`;

/** Cuts a JSON text in half: valid prefix, invalid document. */
const halfOf = (text: string) => text.slice(0, Math.max(1, Math.floor(text.length / 2)));

function deliverSse(ctx: RequestContext, payloads: string[], fault: Fault | undefined, counters: Counters): Response {
  const headers = successHeaders(ctx, "text/event-stream; charset=utf-8");
  let parts = payloads.map(ssePart);
  const pacing: Pacing = { delayMs: 0 };
  if (fault?.kind === "invalidJson") parts = [ssePart(halfOf(payloads[0] ?? "{}")), ssePart(DONE)];
  if (fault?.kind === "cutStream") pacing.cutAfter = fault.afterChunks;
  if (fault?.kind === "slowStream") pacing.delayMs = fault.chunkDelayMs;
  if (fault?.kind === "wire") return new Response(shapedStream(renderedText(parts), fault.shape), { headers });
  return new Response(partStream(parts, pacing, counters), { headers });
}

async function deliverJson(
  ctx: RequestContext,
  body: unknown,
  fault: Fault | undefined,
  counters: Counters,
): Promise<Response> {
  let text = JSON.stringify(body);
  if (fault?.kind === "slowStream") await Bun.sleep(fault.chunkDelayMs * (fault.chunks ?? SLOW_STREAM_CHUNKS));
  if (fault?.kind === "invalidJson") text = halfOf(text);
  const headers = successHeaders(ctx, "application/json");
  if (fault?.kind === "cutStream") {
    return new Response(partStream([halfOf(text)], { delayMs: 0, cutAfter: 1 }, counters), { headers });
  }
  return new Response(text, { headers });
}

// ---------------------------------------------------------------------------------------------
// Server

interface MockState extends Counters {
  requests: RecordedRequest[];
  faults: Fault[];
}

type ParsedBody = { ok: true; value: unknown } | { ok: false; raw: string };

/** A multipart upload as an object: fields as strings, each file as `{filename, size, type}` (what the tests look at). */
async function parseForm(req: Request, bytes: Uint8Array<ArrayBuffer>): Promise<ParsedBody> {
  try {
    const value: JsonObject = {};
    const form = await new Response(bytes, { headers: { "content-type": req.headers.get("content-type") ?? "" } }).formData();
    for (const [name, v] of form) value[name] = typeof v === "string" ? v : { filename: v.name, size: v.size, type: v.type };
    return { ok: true, value };
  } catch {
    return { ok: false, raw: "" };
  }
}

function parseBody(raw: string): ParsedBody {
  if (raw === "") return { ok: true, value: undefined };
  try {
    return { ok: true, value: JSON.parse(raw) };
  } catch {
    return { ok: false, raw };
  }
}

function pathMatches(fault: Fault, pathname: string): boolean {
  return fault.path === undefined || fault.path === pathname || `/v1${fault.path}` === pathname;
}

function takeFault(faults: Fault[], pathname: string, body: ParsedBody): Fault | undefined {
  let text: string | undefined;
  const bodyText = () => (text ??= body.ok ? (JSON.stringify(body.value) ?? "") : body.raw);
  const index = faults.findIndex((f) => pathMatches(f, pathname) && (f.match === undefined || bodyText().includes(f.match)));
  return index === -1 ? undefined : faults.splice(index, 1)[0];
}

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

/** Faults that act before routing; returns a response to send instead, if any. */
async function applyEarlyFault(ctx: RequestContext, fault: Fault, signal: AbortSignal, counters: Counters): Promise<Response | undefined> {
  switch (fault.kind) {
    case "status":
      return statusFaultResponse(ctx, fault);
    case "delay":
      await Bun.sleep(fault.ms);
      return undefined;
    case "hang":
      await untilAborted(signal);
      // Nobody is listening any more; Bun needs a value all the same.
      return new Response(null, { status: 499 });
    case "huge":
      return hugeResponse(ctx, fault, counters);
    default:
      return undefined;
  }
}

const HUGE_CHUNK = new TextEncoder().encode(" ".repeat(1024 * 1024));

/** Counts in `streamsCancelled` when the client stops reading it. */
function hugeResponse(ctx: RequestContext, f: Extract<Fault, { kind: "huge" }>, counters: Counters): Response {
  const head = new TextEncoder().encode('{"error":{"message":"huge","type":"server_error"},"pad":"');
  let left = Math.max(0, f.bytes - head.length - 2);
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      controller.enqueue(head);
    },
    pull(controller) {
      if (left === 0) {
        controller.enqueue(new TextEncoder().encode('"}'));
        controller.close();
        return;
      }
      const n = Math.min(left, HUGE_CHUNK.length);
      left -= n;
      controller.enqueue(HUGE_CHUNK.subarray(0, n));
    },
    cancel() {
      counters.streamsCancelled++;
    },
  });
  const headers: Record<string, string> = { ...baseHeaders(ctx, "application/json") };
  if (f.announce) headers["content-length"] = String(f.bytes);
  return new Response(body, { status: f.status ?? 200, headers });
}

const BAD_JSON_MESSAGE =
  "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)";

function route(
  ctx: RequestContext,
  method: string,
  pathname: string,
  body: ParsedBody,
  hints: GenerationHints,
): Reply | Response {
  if (method === "GET" && pathname === "/v1/models") return { kind: "json", body: { object: "list", data: MODELS } };
  if (method === "GET" && pathname.startsWith("/v1/models/")) {
    return retrieveModel(ctx, decodeURIComponent(pathname.slice("/v1/models/".length)));
  }
  const handler = POST_ROUTES[pathname];
  if (method !== "POST" || handler === undefined) {
    return errorResponse(ctx, 404, invalidRequest(`Invalid URL (${method} ${pathname})`));
  }
  if (!body.ok || !isObject(body.value)) return errorResponse(ctx, 400, invalidRequest(BAD_JSON_MESSAGE));
  return handler(ctx, body.value, hints);
}

const POST_ROUTES: Record<string, (ctx: RequestContext, body: JsonObject, hints: GenerationHints) => Reply | Response> = {
  "/v1/chat/completions": chatCompletions,
  "/v1/completions": completions,
  "/v1/embeddings": (ctx, body) => embeddings(ctx, body),
  "/v1/images/generations": (ctx, body) => imageGenerations(ctx, body),
  "/v1/audio/transcriptions": (ctx, body) => transcriptions(ctx, body),
  "/v1/audio/speech": (ctx, body) => speech(ctx, body),
  "/v1/moderations": (ctx, body) => moderations(ctx, body),
};

function recordRequest(state: MockState, req: Request, url: URL, body: ParsedBody, parts?: RecordedPart[]): void {
  state.requests.push({
    method: req.method,
    path: url.pathname + url.search,
    headers: Object.fromEntries(req.headers),
    body: body.ok ? body.value : body.raw,
    ...(parts ? { parts } : {}),
  });
}

async function handle(req: Request, state: MockState, options: MockOpenAIOptions): Promise<Response> {
  const ctx: RequestContext = { started: performance.now(), requestId: requestId() };
  const url = new URL(req.url);
  const contentType = req.headers.get("content-type") ?? "";
  const multipart = contentType.startsWith("multipart/form-data") ? await req.bytes() : undefined;
  const body = multipart ? await parseForm(req, multipart) : parseBody(req.method === "GET" || req.method === "HEAD" ? "" : await req.text());
  if (options.record !== false) recordRequest(state, req, url, body, multipart && rawParts(multipart, contentType));

  const fault = takeFault(state.faults, url.pathname, body);
  if (fault) {
    const early = await applyEarlyFault(ctx, fault, req.signal, state);
    if (early) return early;
  }
  const denied = checkAuth(ctx, req, options.apiKey);
  if (denied) return denied;

  const hints: GenerationHints = fault?.kind === "slowStream" ? { words: fault.chunks ?? SLOW_STREAM_CHUNKS } : fault?.kind === "scripted" ? { answer: fault.answer } : {};
  const reply = route(ctx, req.method, url.pathname, body, hints);
  if (reply instanceof Response) return reply;
  if (fault?.kind === "answer") return deliverJson(ctx, fault.body, undefined, state);
  if (reply.kind === "sse") return deliverSse(ctx, reply.payloads, fault, state);
  return deliverJson(ctx, reply.body, fault, state);
}

export async function startMockOpenAI(options: MockOpenAIOptions = {}): Promise<MockOpenAI> {
  const state: MockState = { requests: [], faults: [], streamsCancelled: 0 };
  const server: Server<undefined> = Bun.serve({
    hostname: "127.0.0.1",
    port: options.port ?? 0,
    // Hanging and slow responses must outlive Bun's default 10 s idle timeout.
    idleTimeout: 0,
    fetch: (req) => handle(req, state, options),
  });
  const port = server.port ?? 0;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    port,
    get requests() {
      return state.requests;
    },
    get streamsCancelled() {
      return state.streamsCancelled;
    },
    get pendingRequests() {
      return server.pendingRequests;
    },
    fault: (...faults) => {
      state.faults.push(...faults);
    },
    clearFaults: () => {
      state.faults.length = 0;
    },
    reset: () => {
      state.requests.length = 0;
      state.faults.length = 0;
      state.streamsCancelled = 0;
    },
    stop: () => server.stop(true),
  };
}

/**
 * A port with nothing listening, for connection-refused tests: port 1, below the range the OS
 * hands out for port 0. A port bound and released (as before) could be handed to another test's
 * server during the run, which then answered instead of refusing (a gateway's 401, once in a
 * full run).
 */
export async function closedPort(): Promise<number> {
  return 1;
}

// ---------------------------------------------------------------------------------------------
// CLI

function cliArg(args: string[], name: string): string | undefined {
  const i = args.indexOf(name);
  return i === -1 ? undefined : args[i + 1];
}

if (import.meta.main) {
  const args = Bun.argv.slice(2);
  const port = Number(cliArg(args, "--port") ?? "0");
  const mock = await startMockOpenAI({ port, apiKey: cliArg(args, "--api-key"), record: false });
  console.log(`listening ${mock.url}`);
}
