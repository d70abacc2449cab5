/**
 * A mock Anthropic upstream that answers in the Messages API's own wire format (field order, ids,
 * `event: <type>\ndata: {…}\n\n` SSE framing, error bodies, `request-id` and rate-limit headers),
 * and validates requests as strictly as Anthropic does, so translation mistakes fail loudly.
 *
 *   const mock = await startMockAnthropic({ apiKey: "sk-ant-test" });
 *   mock.fault({ kind: "status", status: 529 });   // the next request gets Anthropic's 529
 *   ... point the gateway at mock.url (no /v1: Anthropic's base URL convention) ...
 *   await mock.stop();
 *
 * CLI (benchmarks): `bun test/mock-upstream/anthropic.ts --port 9002 [--api-key KEY] [--reply-words N] [--delta-delay-ms MS]`
 * prints `listening http://127.0.0.1:9002` and records nothing.
 *
 * Deterministic replies:
 * - Text: "Mock reply to: <first 12 words of the last user turn's text>", one text_delta per word
 *   (or exactly `replyWords` words when set), cut at `max_tokens` (one word = one token) and at the
 *   first stop sequence it contains.
 * - Tool use (tools given, tool_choice not `none`):
 *   - `{"type":"tool","name":X}` → X; `{"type":"any"}` → the first tool named in the last user
 *     turn's text, else the first tool. Forced calls come without a text block, as with Claude.
 *   - `auto` (or no tool_choice) → every tool whose name appears in the last user turn's text
 *     (only the first with `disable_parallel_tool_use`), after a text block "Calling <names>.";
 *     none named → a text reply. Tool results in the last turn are not "text": after them the mock
 *     answers in text. Arguments are filled from the input_schema (strings "mock", a
 *     location-like key "Paris", numbers 1, enums their first value) and streamed in small pieces.
 * - Thinking (`thinking.type: "enabled"`): a thinking block "Considering: <words>" with a signature
 *   comes first. The last assistant turn, when it calls tools, must start with its thinking block
 *   (Anthropic's 400 otherwise).
 * - Prompt caching: the prompt up to the last `cache_control` breakpoint (tools, system, messages
 *   in that order) is written to the cache the first time and read from it after that.
 * - A prompt above `contextWindow` tokens (4 characters per token) gets Anthropic's
 *   "prompt is too long" 400.
 */
import type { Server } from "bun";
import { renderedText, shapedStream, type WireShaper } from "./wire-shape.ts";

// ---------------------------------------------------------------------------------------------
// Public types

interface FaultTarget {
  /** Restrict the fault to one path ("/v1/messages", "/v1/messages/count_tokens"). */
  path?: string;
}

/** One misbehaviour, applied to exactly one matching request (FIFO). */
export type Fault = FaultTarget &
  (
    | {
        /** Answer with this status; the body defaults to Anthropic's error body for it. */
        kind: "status";
        status: number;
        body?: string | object;
        headers?: Record<string, string>;
      }
    | { /** Wait, then answer normally. */ kind: "delay"; ms: number }
    | { /** Never answer: the request stays open until the client aborts or `stop()`. */ kind: "hang" }
    | { /** 200 whose JSON (or first SSE event's data) is cut in half. */ kind: "invalidJson" }
    | {
        /** Send this many SSE events, then reset the connection. A non-stream request gets half its JSON, then the reset. */
        kind: "cutStream";
        afterEvents: number;
      }
    | {
        /** Stream `words` text deltas (default 50), pausing `deltaDelayMs` before each (as a model's tokens arrive). */
        kind: "slowStream";
        deltaDelayMs: number;
        words?: number;
      }
    | {
        /** Send this many SSE events, then Anthropic's in-stream `error` event (default overloaded_error) and end. */
        kind: "streamError";
        afterEvents: number;
        errorType?: string;
        message?: string;
      }
    | { /** A stream's bytes cut, replaced or ended as the shaper says (wire-shape.ts); a JSON answer is sent as usual. */ kind: "wire"; shape: WireShaper }
    | { /** 200 with this JSON body instead of the planned answer, once the request passed the mock's checks (a test's own answer). */ kind: "answer"; body: unknown }
  );

export interface RecordedRequest {
  method: string;
  path: string;
  /** Header names lower-cased. */
  headers: Record<string, string>;
  /** Parsed JSON body; the raw text when it is not JSON; undefined when empty. */
  body: unknown;
}

export interface MockAnthropicOptions {
  /** Default 0: any free port. */
  port?: number;
  /** When set, every request must carry `x-api-key: <apiKey>`. */
  apiKey?: string;
  /** Record requests in `requests` (default true; the CLI turns it off). */
  record?: boolean;
  /** Prompt tokens above which a request is "too long" (default 200000). */
  contextWindow?: number;
  /** Every text reply has exactly this many words (benchmarks); default: echo the prompt. */
  replyWords?: number;
  /** Pause before every content delta of every stream (a model's pace); default 0. */
  deltaDelayMs?: number;
}

export interface MockAnthropic {
  /** Base URL without `/v1` (what `api_base` and the Anthropic SDK's `baseURL` take). */
  readonly url: string;
  readonly port: number;
  readonly requests: RecordedRequest[];
  /** Streams whose client went away before the last byte. */
  readonly streamsCancelled: number;
  fault(...faults: Fault[]): void;
  clearFaults(): void;
  /** Clears requests, faults, the prompt cache and `streamsCancelled`. */
  reset(): void;
  stop(): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Small helpers

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);
const encoder = new TextEncoder();

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
function randomBase62(length: number): string {
  const bytes = crypto.getRandomValues(new Uint8Array(length));
  let out = "";
  for (const b of bytes) out += BASE62[b % BASE62.length];
  return out;
}

// Anthropic's id shapes: msg_01 / toolu_01 + 22 base62 characters, req_011C + 20.
const messageId = () => `msg_01${randomBase62(22)}`;
const toolUseId = () => `toolu_01${randomBase62(22)}`;
const requestId = () => `req_011C${randomBase62(20)}`;
const signature = () => btoa(randomBase62(96));
const ORGANIZATION_ID = "5b9e4c0e-2f6a-4b8e-9a41-0c7d8e3f1a22";

const approxTokens = (chars: number) => Math.ceil(chars / 4);

// ---------------------------------------------------------------------------------------------
// Headers and errors

interface RequestContext {
  requestId: string;
}

function baseHeaders(ctx: RequestContext, contentType: string): Record<string, string> {
  return { "content-type": contentType, "request-id": ctx.requestId, "anthropic-organization-id": ORGANIZATION_ID, via: "1.1 google" };
}

function successHeaders(ctx: RequestContext, contentType: string): Record<string, string> {
  const reset = new Date(Date.now() + 1000).toISOString().replace(/\.\d+Z$/, "Z");
  return {
    ...baseHeaders(ctx, contentType),
    "anthropic-ratelimit-requests-limit": "4000",
    "anthropic-ratelimit-requests-remaining": "3999",
    "anthropic-ratelimit-requests-reset": reset,
    "anthropic-ratelimit-input-tokens-limit": "400000",
    "anthropic-ratelimit-input-tokens-remaining": "400000",
    "anthropic-ratelimit-input-tokens-reset": reset,
    "anthropic-ratelimit-output-tokens-limit": "80000",
    "anthropic-ratelimit-output-tokens-remaining": "80000",
    "anthropic-ratelimit-output-tokens-reset": reset,
    "anthropic-ratelimit-tokens-limit": "480000",
    "anthropic-ratelimit-tokens-remaining": "480000",
    "anthropic-ratelimit-tokens-reset": reset,
  };
}

/** Anthropic's error body: `{"type":"error","error":{"type","message"},"request_id"}`. */
const errorBody = (ctx: RequestContext, type: string, message: string) => ({ type: "error", error: { type, message }, request_id: ctx.requestId });

function errorResponse(ctx: RequestContext, status: number, type: string, message: string, headers: Record<string, string> = {}): Response {
  const retry = status === 429 || status >= 500 ? "true" : "false";
  return new Response(JSON.stringify(errorBody(ctx, type, message)), {
    status,
    headers: { ...baseHeaders(ctx, "application/json"), "x-should-retry": retry, ...headers },
  });
}

const invalid = (ctx: RequestContext, message: string) => errorResponse(ctx, 400, "invalid_request_error", message);

/** Anthropic's error type and message for a status, when a status fault gives no body. */
const DEFAULT_ERRORS: Record<number, { type: string; message: string }> = {
  400: { type: "invalid_request_error", message: "messages: the mock was told to reject this request" },
  401: { type: "authentication_error", message: "invalid x-api-key" },
  402: { type: "billing_error", message: "Your credit balance is too low to access the Anthropic API." },
  403: { type: "permission_error", message: "Your API key does not have permission to use the specified resource." },
  404: { type: "not_found_error", message: "Not found" },
  413: { type: "request_too_large", message: "Request exceeds the maximum allowed number of bytes." },
  429: {
    type: "rate_limit_error",
    message:
      "This request would exceed the rate limit for your organization (5b9e4c0e-2f6a-4b8e-9a41-0c7d8e3f1a22) of 50 requests per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later.",
  },
  500: { type: "api_error", message: "Internal server error" },
  504: { type: "timeout_error", message: "Request timeout" },
  529: { type: "overloaded_error", message: "Overloaded" },
};

function statusFaultResponse(ctx: RequestContext, f: Extract<Fault, { kind: "status" }>): Response {
  const headers: Record<string, string> = { ...baseHeaders(ctx, "application/json"), "x-should-retry": f.status === 429 || f.status >= 500 ? "true" : "false" };
  if (f.status === 429) {
    Object.assign(headers, { "retry-after": "1", "anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "0" });
  }
  let text: string;
  if (f.body === undefined) {
    const e = DEFAULT_ERRORS[f.status] ?? { type: "api_error", message: "Internal server error" };
    text = JSON.stringify(errorBody(ctx, e.type, e.message));
  } else if (typeof f.body === "string") {
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

function checkAuth(ctx: RequestContext, req: Request, apiKey: string | undefined): Response | undefined {
  if (apiKey === undefined) return undefined;
  const given = req.headers.get("x-api-key");
  if (given === apiKey) return undefined;
  return errorResponse(ctx, 401, "authentication_error", given === null ? "x-api-key header is required" : "invalid x-api-key");
}

// ---------------------------------------------------------------------------------------------
// Request validation: what Anthropic refuses, with its messages

const MESSAGES_FIELDS = new Set([
  "model",
  "messages",
  "max_tokens",
  "system",
  "metadata",
  "stop_sequences",
  "stream",
  "temperature",
  "top_p",
  "top_k",
  "tools",
  "tool_choice",
  "thinking",
  "service_tier",
  "container",
  "mcp_servers",
  "context_management",
]);
const COUNT_FIELDS = new Set(["model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers"]);
const BLOCK_TYPES = ["text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"];
const IMAGE_TYPES = ["image/jpeg", "image/png", "image/gif", "image/webp"];

function validateSource(where: string, source: unknown, mediaTypes: readonly string[]): string | undefined {
  if (!isObject(source)) return `${where}.source: Field required`;
  if (source.type === "url") return typeof source.url === "string" && /^https?:\/\//.test(source.url) ? undefined : `${where}.source.url: Input should be a valid URL`;
  if (source.type !== "base64") return `${where}.source.type: Input should be 'base64' or 'url'`;
  if (typeof source.media_type !== "string" || !mediaTypes.includes(source.media_type)) {
    return `${where}.source.media_type: Input should be ${mediaTypes.map((t) => `'${t}'`).join(", ")}`;
  }
  return typeof source.data === "string" && source.data !== "" ? undefined : `${where}.source.data: Field required`;
}

function validateBlock(where: string, block: unknown, role: string): string | undefined {
  if (!isObject(block)) return `${where}: Input should be a valid dictionary`;
  const type = str(block.type) ?? "";
  if (!BLOCK_TYPES.includes(type)) {
    return `${where}: Input tag '${type}' found using 'type' does not match any of the expected tags: ${BLOCK_TYPES.map((t) => `'${t}'`).join(", ")}`;
  }
  switch (type) {
    case "text":
      if (typeof block.text !== "string") return `${where}.text: Field required`;
      return block.text === "" ? "messages: text content blocks must be non-empty" : undefined;
    case "image":
      return validateSource(where, block.source, IMAGE_TYPES);
    case "document":
      return validateSource(where, block.source, ["application/pdf", "text/plain"]);
    case "tool_use":
      if (role !== "assistant") return `${where}: tool_use blocks may only appear in assistant messages`;
      if (typeof block.id !== "string" || typeof block.name !== "string") return `${where}.id: Field required`;
      return isObject(block.input) ? undefined : `${where}.input: Input should be a valid dictionary`;
    case "tool_result":
      if (role !== "user") return `${where}: tool_result blocks may only appear in user messages`;
      return typeof block.tool_use_id === "string" ? undefined : `${where}.tool_use_id: Field required`;
    case "thinking":
      return typeof block.signature === "string" && block.signature !== "" ? undefined : `${where}.signature: Field required`;
    default:
      return undefined;
  }
}

function blocksOf(content: unknown): Json[] {
  return Array.isArray(content) ? content.filter(isObject) : [];
}

function validateMessages(messages: unknown): string | undefined {
  if (!Array.isArray(messages)) return "messages: Field required";
  if (messages.length === 0) return "messages: at least one message is required";
  for (const [i, m] of messages.entries()) {
    if (!isObject(m)) return `messages.${i}: Input should be a valid dictionary`;
    if (m.role === "system") {
      return 'messages: Unexpected role "system". The Messages API accepts a top-level `system` parameter, not "system" as an input message role.';
    }
    if (m.role !== "user" && m.role !== "assistant") return `messages.${i}.role: Input should be 'user' or 'assistant'`;
    if (typeof m.content === "string") {
      if (m.content === "" && i < messages.length - 1) return `messages.${i}: all messages must have non-empty content except for the optional final assistant message`;
      continue;
    }
    if (!Array.isArray(m.content)) return `messages.${i}.content: Field required`;
    for (const [j, b] of m.content.entries()) {
      const problem = validateBlock(`messages.${i}.content.${j}`, b, m.role);
      if (problem) return problem;
    }
    // Tool use and results must pair up across consecutive turns.
    const uses = blocksOf(m.content).filter((b) => b.type === "tool_use").map((b) => String(b.id));
    const next = messages[i + 1];
    if (uses.length > 0 && isObject(next)) {
      const answered = new Set(blocksOf(next.content).filter((b) => b.type === "tool_result").map((b) => String(b.tool_use_id)));
      const missing = uses.filter((id) => !answered.has(id));
      if (missing.length > 0) {
        return `messages.${i + 1}: \`tool_use\` ids were found without \`tool_result\` blocks immediately after: ${missing.join(", ")}. Each \`tool_use\` block must have a corresponding \`tool_result\` block in the next message.`;
      }
    }
    const results = blocksOf(m.content).filter((b) => b.type === "tool_result");
    if (results.length > 0) {
      const prev = messages[i - 1];
      const used = new Set(isObject(prev) && prev.role === "assistant" ? blocksOf(prev.content).filter((b) => b.type === "tool_use").map((b) => String(b.id)) : []);
      for (const [j, r] of results.entries()) {
        if (!used.has(String(r.tool_use_id))) {
          return `messages.${i}.content.${j}: unexpected \`tool_use_id\` found in \`tool_result\` blocks: ${String(r.tool_use_id)}. Each \`tool_result\` block must have a corresponding \`tool_use\` block in the previous message.`;
        }
      }
    }
  }
  return undefined;
}

function validateTools(body: Json): string | undefined {
  if (body.tools !== undefined) {
    if (!Array.isArray(body.tools)) return "tools: Input should be a valid list";
    for (const [i, t] of body.tools.entries()) {
      if (!isObject(t)) return `tools.${i}: Input should be a valid dictionary`;
      if (typeof t.type === "string" && t.type !== "custom") continue; // server tools (web_search_…)
      if (typeof t.name !== "string" || !/^[a-zA-Z0-9_-]{1,128}$/.test(t.name)) return `tools.${i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'`;
      if (!isObject(t.input_schema)) return `tools.${i}.custom.input_schema: Field required`;
      if (t.input_schema.type !== "object") return `tools.${i}.custom.input_schema.type: Input should be 'object'`;
    }
  }
  const choice = body.tool_choice;
  if (choice !== undefined) {
    if (!isObject(choice) || !["auto", "any", "tool", "none"].includes(String(choice.type))) return "tool_choice: Input tag does not match any of the expected tags: 'auto', 'any', 'tool', 'none'";
    if (choice.type === "tool" && typeof choice.name !== "string") return "tool_choice.tool.name: Field required";
  }
  return undefined;
}

function validateThinking(body: Json): string | undefined {
  const t = body.thinking;
  if (t === undefined) return undefined;
  if (!isObject(t) || (t.type !== "enabled" && t.type !== "disabled")) return "thinking: Input tag does not match any of the expected tags: 'enabled', 'disabled'";
  if (t.type === "disabled") return undefined;
  if (typeof t.budget_tokens !== "number" || t.budget_tokens < 1024) return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024";
  if (typeof body.max_tokens === "number" && body.max_tokens <= t.budget_tokens) {
    return "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size";
  }
  if (body.temperature !== undefined && body.temperature !== 1) return "`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#important-considerations-when-using-extended-thinking";
  const choice = body.tool_choice;
  if (isObject(choice) && (choice.type === "any" || choice.type === "tool")) return "Thinking may not be enabled when `tool_choice` forces tool use.";
  return thinkingFirst(Array.isArray(body.messages) ? body.messages : [], (m) => blocksOf(m.content).map((b) => String(b.type)));
}

/**
 * With thinking on, the tool loop in progress must carry the thinking that led to it: the last
 * assistant turn, when it calls tools, starts with its thinking block (Claude's rule, on Bedrock too).
 */
export function thinkingFirst(messages: unknown[], blockTypes: (m: Json) => string[]): string | undefined {
  const i = messages.findLastIndex((m) => isObject(m) && m.role === "assistant");
  const types = i < 0 ? [] : blockTypes(messages[i] as Json);
  if (!types.includes("tool_use") || types[0] === "thinking" || types[0] === "redacted_thinking") return undefined;
  return `messages.${i}.content.0.type: Expected \`thinking\` or \`redacted_thinking\`, but found \`${types[0]}\`. When \`thinking\` is enabled, a final \`assistant\` message must start with a thinking block (preceeding the lastmost set of \`tool_use\` and \`tool_result\` blocks). We recommend you include thinking blocks from previous turns. To avoid this requirement, disable \`thinking\`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking`;
}

function validateSystem(system: unknown): string | undefined {
  if (system === undefined || typeof system === "string") return undefined;
  if (!Array.isArray(system)) return "system: Input should be a valid string or list";
  for (const [i, b] of system.entries()) {
    if (!isObject(b) || b.type !== "text" || typeof b.text !== "string") return `system.${i}: Input should be a text block`;
    if (b.text === "") return "system: text content blocks must be non-empty";
  }
  return undefined;
}

function validateMessagesBody(body: Json, allowed: ReadonlySet<string>, needsMaxTokens: boolean): string | undefined {
  for (const k of Object.keys(body)) if (!allowed.has(k)) return `${k}: Extra inputs are not permitted`;
  if (typeof body.model !== "string") return "model: Field required";
  if (needsMaxTokens) {
    if (body.max_tokens === undefined) return "max_tokens: Field required";
    if (!Number.isInteger(body.max_tokens) || (body.max_tokens as number) < 1) return "max_tokens: Input should be greater than or equal to 1";
  }
  if (body.temperature !== undefined && (typeof body.temperature !== "number" || body.temperature < 0 || body.temperature > 1)) {
    return "temperature: Input should be less than or equal to 1";
  }
  if (body.top_p !== undefined && (typeof body.top_p !== "number" || body.top_p < 0 || body.top_p > 1)) return "top_p: Input should be less than or equal to 1";
  if (body.stop_sequences !== undefined) {
    if (!Array.isArray(body.stop_sequences)) return "stop_sequences: Input should be a valid list";
    if (body.stop_sequences.some((s) => typeof s !== "string" || s.trim() === "")) return "stop_sequences: each stop sequence must contain non-whitespace";
  }
  if (body.metadata !== undefined) {
    if (!isObject(body.metadata)) return "metadata: Input should be a valid dictionary";
    for (const k of Object.keys(body.metadata)) if (k !== "user_id") return `metadata.${k}: Extra inputs are not permitted`;
  }
  return validateSystem(body.system) ?? validateMessages(body.messages) ?? validateTools(body) ?? validateThinking(body);
}

// ---------------------------------------------------------------------------------------------
// Token counting and the prompt cache

function textChars(v: unknown): number {
  if (typeof v === "string") return v.length;
  if (Array.isArray(v)) return v.reduce((n: number, x) => n + textChars(x), 0);
  if (!isObject(v)) return 0;
  if (v.type === "image" || v.type === "document") return 1600 * 4;
  let n = 0;
  for (const [k, x] of Object.entries(v)) if (k !== "cache_control" && k !== "type") n += textChars(x);
  return n;
}

/** The prompt in Anthropic's caching order: tools, then system, then messages, each piece with its tokens. */
function promptPieces(body: Json): { tokens: number; cached: boolean; key: string }[] {
  const pieces: { tokens: number; cached: boolean; key: string }[] = [];
  const add = (v: unknown) => pieces.push({ tokens: approxTokens(textChars(v)), cached: isObject(v) && isObject(v.cache_control), key: JSON.stringify(v) });
  for (const t of Array.isArray(body.tools) ? body.tools : []) add(t);
  if (typeof body.system === "string") add(body.system);
  else for (const b of Array.isArray(body.system) ? body.system : []) add(b);
  for (const m of Array.isArray(body.messages) ? body.messages : []) {
    if (!isObject(m)) continue;
    pieces.push({ tokens: 3, cached: false, key: String(m.role) });
    if (typeof m.content === "string") add(m.content);
    else for (const b of Array.isArray(m.content) ? m.content : []) add(b);
  }
  return pieces;
}

interface PromptUsage {
  input_tokens: number;
  cache_creation_input_tokens: number;
  cache_read_input_tokens: number;
}

function promptUsage(body: Json, cache: Set<string>): PromptUsage {
  const pieces = promptPieces(body);
  const total = pieces.reduce((n, p) => n + p.tokens, 0);
  let breakpoint = -1;
  for (const [i, p] of pieces.entries()) if (p.cached) breakpoint = i;
  if (breakpoint < 0) return { input_tokens: total, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 };
  const prefix = pieces.slice(0, breakpoint + 1);
  const prefixTokens = prefix.reduce((n, p) => n + p.tokens, 0);
  const key = `${String(body.model)}\n${prefix.map((p) => p.key).join("\n")}`;
  const hit = cache.has(key);
  cache.add(key);
  return {
    input_tokens: total - prefixTokens,
    cache_creation_input_tokens: hit ? 0 : prefixTokens,
    cache_read_input_tokens: hit ? prefixTokens : 0,
  };
}

// ---------------------------------------------------------------------------------------------
// Replies

const REPLY_WORDS_FROM_PROMPT = 12;

/** The last user turn's own text (tool results are not text). */
function lastUserText(messages: unknown[]): string {
  const m = messages.at(-1);
  if (!isObject(m) || m.role !== "user") return "";
  if (typeof m.content === "string") return m.content;
  return blocksOf(m.content)
    .filter((b) => b.type === "text")
    .map((b) => String(b.text))
    .join(" ");
}

/** What the last user turn said, tool results included, for the reply to echo. */
function lastUserEcho(messages: unknown[]): string {
  const m = messages.at(-1);
  if (!isObject(m)) return "";
  if (typeof m.content === "string") return m.content;
  return blocksOf(m.content)
    .map((b) => (b.type === "text" ? String(b.text) : b.type === "tool_result" ? `Tool result: ${typeof b.content === "string" ? b.content : textOfBlocks(b.content)}` : ""))
    .join(" ");
}

function textOfBlocks(v: unknown): string {
  return blocksOf(v)
    .map((b) => (typeof b.text === "string" ? b.text : ""))
    .join(" ");
}

function words(prefix: string, prompt: string, count: number | undefined): string[] {
  const echoed = prompt.split(/\s+/).filter(Boolean).slice(0, REPLY_WORDS_FROM_PROMPT);
  const all = [...prefix.split(" "), ...echoed];
  if (count === undefined) return all;
  return Array.from({ length: count }, (_, i) => all[i % all.length] ?? "mock");
}

const pieces = (ws: string[]) => ws.map((w, i) => (i === 0 ? w : ` ${w}`));

interface ToolSpec {
  name: string;
  schema: unknown;
}

function toolSpecs(tools: unknown): ToolSpec[] {
  if (!Array.isArray(tools)) return [];
  const out: ToolSpec[] = [];
  for (const t of tools) if (isObject(t) && typeof t.name === "string" && t.input_schema !== undefined) out.push({ name: t.name, schema: t.input_schema });
  return out;
}

/** The tools the model "decides" to call, and whether the call was forced (then no text comes first). */
function chooseTools(body: Json, userText: string): { tools: ToolSpec[]; forced: boolean } {
  const tools = toolSpecs(body.tools);
  const choice = isObject(body.tool_choice) ? body.tool_choice : { type: "auto" };
  if (tools.length === 0 || choice.type === "none") return { tools: [], forced: false };
  const named = tools.filter((t) => userText.includes(t.name));
  if (choice.type === "tool") {
    const t = tools.find((x) => x.name === choice.name);
    return { tools: t ? [t] : [], forced: true };
  }
  if (choice.type === "any") return { tools: [named[0] ?? tools[0]!], forced: true };
  return { tools: choice.disable_parallel_tool_use === true ? named.slice(0, 1) : named, forced: false };
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
      return mockInput(schema);
    default:
      return /location|city|place/i.test(key) ? "Paris" : "mock";
  }
}

function mockInput(schema: unknown): Json {
  const properties = isObject(schema) && isObject(schema.properties) ? schema.properties : {};
  const input: Json = {};
  for (const [key, s] of Object.entries(properties)) input[key] = mockValue(key, s);
  return input;
}

/** Pieces of a tool input as Anthropic streams it: a few characters at a time, cutting through keys and values. */
function jsonPieces(json: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < json.length; i += 7) out.push(json.slice(i, i + 7));
  return out;
}

type PlannedBlock =
  | { type: "thinking"; pieces: string[]; signature: string }
  | { type: "text"; pieces: string[] }
  | { type: "tool_use"; id: string; name: string; input: Json };

interface Plan {
  id: string;
  model: string;
  blocks: PlannedBlock[];
  stopReason: "end_turn" | "max_tokens" | "stop_sequence" | "tool_use";
  stopSequence: string | null;
  prompt: PromptUsage;
  outputTokens: number;
}

/** Cuts text pieces at max_tokens and at the first stop sequence. */
function limitText(ps: string[], maxTokens: number, stops: string[]): { pieces: string[]; stop: Plan["stopReason"]; sequence: string | null } {
  const text = ps.join("");
  let cut = text.length;
  let sequence: string | null = null;
  for (const s of stops) {
    const at = text.indexOf(s);
    if (at >= 0 && at < cut) {
      cut = at;
      sequence = s;
    }
  }
  const kept: string[] = [];
  let used = 0;
  for (const p of ps) {
    if (kept.length >= maxTokens) return { pieces: kept, stop: "max_tokens", sequence: null };
    if (used + p.length > cut) {
      if (cut > used) kept.push(p.slice(0, cut - used));
      return { pieces: kept, stop: "stop_sequence", sequence };
    }
    kept.push(p);
    used += p.length;
  }
  return { pieces: kept, stop: sequence ? "stop_sequence" : "end_turn", sequence };
}

function planReply(body: Json, cache: Set<string>, replyWords: number | undefined): Plan {
  const messages = body.messages as unknown[];
  const maxTokens = body.max_tokens as number;
  const blocks: PlannedBlock[] = [];
  let output = 0;
  const thinking = isObject(body.thinking) && body.thinking.type === "enabled";
  if (thinking) {
    const ps = pieces(words("Considering:", lastUserEcho(messages), undefined));
    blocks.push({ type: "thinking", pieces: ps, signature: signature() });
    output += ps.length;
  }
  const { tools, forced } = chooseTools(body, lastUserText(messages));
  let stopReason: Plan["stopReason"] = "end_turn";
  let stopSequence: string | null = null;
  if (tools.length > 0) {
    if (!forced) {
      const ps = pieces(["Calling", `${tools.map((t) => t.name).join(" and ")}.`]);
      blocks.push({ type: "text", pieces: ps });
      output += ps.length;
    }
    for (const t of tools) {
      const input = mockInput(t.schema);
      blocks.push({ type: "tool_use", id: toolUseId(), name: t.name, input });
      output += jsonPieces(JSON.stringify(input)).length;
    }
    stopReason = "tool_use";
  } else {
    const stops = Array.isArray(body.stop_sequences) ? body.stop_sequences.filter((s): s is string => typeof s === "string") : [];
    const limited = limitText(pieces(words("Mock reply to:", lastUserEcho(messages), replyWords)), Math.max(0, maxTokens - output), stops);
    blocks.push({ type: "text", pieces: limited.pieces });
    output += limited.pieces.length;
    stopReason = limited.stop;
    stopSequence = limited.sequence;
  }
  return { id: messageId(), model: String(body.model), blocks, stopReason, stopSequence, prompt: promptUsage(body, cache), outputTokens: output };
}

function usageJson(prompt: PromptUsage, outputTokens: number) {
  return {
    input_tokens: prompt.input_tokens,
    cache_creation_input_tokens: prompt.cache_creation_input_tokens,
    cache_read_input_tokens: prompt.cache_read_input_tokens,
    cache_creation: { ephemeral_5m_input_tokens: prompt.cache_creation_input_tokens, ephemeral_1h_input_tokens: 0 },
    output_tokens: outputTokens,
    service_tier: "standard",
  };
}

function blockJson(b: PlannedBlock): Json {
  switch (b.type) {
    case "thinking":
      return { type: "thinking", thinking: b.pieces.join(""), signature: b.signature };
    case "text":
      return { type: "text", text: b.pieces.join("") };
    case "tool_use":
      return { type: "tool_use", id: b.id, name: b.name, input: b.input };
  }
}

function messageJson(plan: Plan): Json {
  return {
    id: plan.id,
    type: "message",
    role: "assistant",
    model: plan.model,
    content: plan.blocks.map(blockJson),
    stop_reason: plan.stopReason,
    stop_sequence: plan.stopSequence,
    usage: usageJson(plan.prompt, plan.outputTokens),
  };
}

/** An SSE event exactly as Anthropic frames it. */
const sseEvent = (type: string, data: unknown) => `event: ${type}\ndata: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`;
// Anthropic's pings are the one event written with a space after the colon.
const PING = sseEvent("ping", '{"type": "ping"}');

function blockStartJson(b: PlannedBlock): Json {
  switch (b.type) {
    case "thinking":
      return { type: "thinking", thinking: "", signature: "" };
    case "text":
      return { type: "text", text: "" };
    case "tool_use":
      return { type: "tool_use", id: b.id, name: b.name, input: {} };
  }
}

function blockDeltas(b: PlannedBlock): Json[] {
  switch (b.type) {
    case "thinking":
      return [...b.pieces.map((thinking) => ({ type: "thinking_delta", thinking })), { type: "signature_delta", signature: b.signature }];
    case "text":
      return b.pieces.map((text) => ({ type: "text_delta", text }));
    case "tool_use":
      return [{ type: "input_json_delta", partial_json: "" }, ...jsonPieces(JSON.stringify(b.input)).map((partial_json) => ({ type: "input_json_delta", partial_json }))];
  }
}

function streamEvents(plan: Plan): string[] {
  const start = { ...messageJson(plan), content: [], stop_reason: null, stop_sequence: null, usage: usageJson(plan.prompt, 1) };
  const events = [sseEvent("message_start", { type: "message_start", message: start })];
  for (const [index, b] of plan.blocks.entries()) {
    events.push(sseEvent("content_block_start", { type: "content_block_start", index, content_block: blockStartJson(b) }));
    if (index === 0) events.push(PING);
    for (const delta of blockDeltas(b)) events.push(sseEvent("content_block_delta", { type: "content_block_delta", index, delta }));
    events.push(sseEvent("content_block_stop", { type: "content_block_stop", index }));
  }
  events.push(
    sseEvent("message_delta", { type: "message_delta", delta: { stop_reason: plan.stopReason, stop_sequence: plan.stopSequence }, usage: { output_tokens: plan.outputTokens } }),
    sseEvent("message_stop", { type: "message_stop" }),
  );
  return events;
}

// ---------------------------------------------------------------------------------------------
// Delivery

interface Counters {
  streamsCancelled: number;
}

interface Pacing {
  delayMs: number;
  /** Which parts the pause comes before (default: every part but the first). */
  paced?: (part: string) => boolean;
  cutAfter?: number;
}

const CUT_FLUSH_MS = 10;

/** One part per pull: a client that leaves shows up as `cancel`; erroring with undefined resets the socket. */
function partStream(parts: string[], pacing: Pacing, counters: Counters): ReadableStream<Uint8Array> {
  let sent = 0;
  let over = false;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (pacing.cutAfter !== undefined && sent >= pacing.cutAfter) {
          over = true;
          await Bun.sleep(CUT_FLUSH_MS);
          controller.error(undefined);
          return;
        }
        if (sent > 0 && pacing.delayMs > 0 && (pacing.paced?.(parts[sent] ?? "") ?? true)) await Bun.sleep(pacing.delayMs);
        if (over) return;
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

const halfOf = (text: string) => text.slice(0, Math.max(1, Math.floor(text.length / 2)));

const isDelta = (event: string) => event.startsWith("event: content_block_delta");

function deliverStream(ctx: RequestContext, plan: Plan, fault: Fault | undefined, counters: Counters, deltaDelayMs: number): Response {
  let events = streamEvents(plan);
  // The preamble (message_start, content_block_start, ping) comes at once; tokens come at the model's pace.
  const pacing: Pacing = { delayMs: deltaDelayMs, paced: isDelta };
  if (fault?.kind === "invalidJson") {
    const data = JSON.stringify({ type: "message_start", message: messageJson(plan) });
    events = [`event: message_start\ndata: ${halfOf(data)}\n\n`, ...events.slice(1)];
  }
  if (fault?.kind === "cutStream") pacing.cutAfter = fault.afterEvents;
  if (fault?.kind === "slowStream") pacing.delayMs = fault.deltaDelayMs;
  if (fault?.kind === "streamError") {
    const error = { type: "error", error: { type: fault.errorType ?? "overloaded_error", message: fault.message ?? "Overloaded" } };
    events = [...events.slice(0, fault.afterEvents), sseEvent("error", error)];
  }
  const headers = { ...successHeaders(ctx, "text/event-stream; charset=utf-8"), "cache-control": "no-cache" };
  if (fault?.kind === "wire") return new Response(shapedStream(renderedText(events), fault.shape), { headers });
  return new Response(partStream(events, pacing, counters), { headers });
}

async function deliverJson(ctx: RequestContext, body: unknown, fault: Fault | undefined, counters: Counters): Promise<Response> {
  let text = JSON.stringify(body);
  if (fault?.kind === "slowStream") await Bun.sleep(fault.deltaDelayMs * (fault.words ?? 50));
  if (fault?.kind === "invalidJson") text = halfOf(text);
  const headers = successHeaders(ctx, "application/json");
  if (fault?.kind === "cutStream") return new Response(partStream([halfOf(text)], { delayMs: 0, cutAfter: 1 }, counters), { headers });
  return new Response(text, { headers });
}

// ---------------------------------------------------------------------------------------------
// Routes

interface MockState extends Counters {
  requests: RecordedRequest[];
  faults: Fault[];
  /** Prompt prefixes written to the "cache". */
  cache: Set<string>;
}

interface Route {
  state: MockState;
  options: MockAnthropicOptions;
  fault: Fault | undefined;
}

function contextCheck(ctx: RequestContext, body: Json, r: Route): Response | undefined {
  const window = r.options.contextWindow ?? 200_000;
  const tokens = promptPieces(body).reduce((n, p) => n + p.tokens, 0);
  if (tokens <= window) return undefined;
  return invalid(ctx, `prompt is too long: ${tokens} tokens > ${window} maximum`);
}

function messages(ctx: RequestContext, body: Json, r: Route): Response | Promise<Response> {
  const problem = validateMessagesBody(body, MESSAGES_FIELDS, true);
  if (problem) return invalid(ctx, problem);
  if (!String(body.model).startsWith("claude-")) return errorResponse(ctx, 404, "not_found_error", `model: ${String(body.model)}`);
  const tooLong = contextCheck(ctx, body, r);
  if (tooLong) return tooLong;
  if (r.fault?.kind === "answer") return deliverJson(ctx, r.fault.body, undefined, r.state);
  const words = r.fault?.kind === "slowStream" ? (r.fault.words ?? 50) : r.options.replyWords;
  const plan = planReply(body, r.state.cache, words);
  if (body.stream === true) return deliverStream(ctx, plan, r.fault, r.state, r.options.deltaDelayMs ?? 0);
  return deliverJson(ctx, messageJson(plan), r.fault, r.state);
}

function countTokens(ctx: RequestContext, body: Json, r: Route): Response | Promise<Response> {
  const problem = validateMessagesBody(body, COUNT_FIELDS, false);
  if (problem) return invalid(ctx, problem);
  const tokens = promptPieces(body).reduce((n, p) => n + p.tokens, 0);
  return deliverJson(ctx, { input_tokens: tokens }, r.fault, r.state);
}

const MODELS = [
  { type: "model", id: "claude-sonnet-4-20250514", display_name: "Claude Sonnet 4", created_at: "2025-05-22T00:00:00Z" },
  { type: "model", id: "claude-3-5-sonnet-20241022", display_name: "Claude Sonnet 3.5 (New)", created_at: "2024-10-22T00:00:00Z" },
  { type: "model", id: "claude-3-5-haiku-20241022", display_name: "Claude Haiku 3.5", created_at: "2024-10-22T00:00:00Z" },
];

const POST_ROUTES: Record<string, (ctx: RequestContext, body: Json, r: Route) => Response | Promise<Response>> = {
  "/v1/messages": messages,
  "/v1/messages/count_tokens": countTokens,
};

type ParsedBody = { ok: true; value: unknown } | { ok: false; raw: string };

function parseBody(raw: string): ParsedBody {
  if (raw === "") return { ok: true, value: undefined };
  try {
    return { ok: true, value: JSON.parse(raw) };
  } catch {
    return { ok: false, raw };
  }
}

function takeFault(faults: Fault[], pathname: string): Fault | undefined {
  const index = faults.findIndex((f) => f.path === undefined || f.path === pathname);
  return index === -1 ? undefined : faults.splice(index, 1)[0];
}

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

async function handle(req: Request, state: MockState, options: MockAnthropicOptions): Promise<Response> {
  const ctx: RequestContext = { requestId: requestId() };
  const url = new URL(req.url);
  const body = parseBody(req.method === "GET" || req.method === "HEAD" ? "" : await req.text());
  if (options.record !== false) {
    state.requests.push({ method: req.method, path: url.pathname + url.search, headers: Object.fromEntries(req.headers), body: body.ok ? body.value : body.raw });
  }
  const fault = takeFault(state.faults, url.pathname);
  if (fault?.kind === "status") return statusFaultResponse(ctx, fault);
  if (fault?.kind === "delay") await Bun.sleep(fault.ms);
  if (fault?.kind === "hang") {
    await untilAborted(req.signal);
    return new Response(null, { status: 499 });
  }
  const denied = checkAuth(ctx, req, options.apiKey);
  if (denied) return denied;
  if (!req.headers.get("anthropic-version")) return invalid(ctx, "anthropic-version: header is required");
  if (req.method === "GET" && url.pathname === "/v1/models") {
    return new Response(JSON.stringify({ data: MODELS, has_more: false, first_id: MODELS[0]!.id, last_id: MODELS.at(-1)!.id }), { headers: successHeaders(ctx, "application/json") });
  }
  const handler = POST_ROUTES[url.pathname];
  if (req.method !== "POST" || handler === undefined) return errorResponse(ctx, 404, "not_found_error", "Not found");
  if (!body.ok || !isObject(body.value)) return invalid(ctx, "There was an error parsing the body of your request. Please check that it is valid JSON.");
  return handler(ctx, body.value, { state, options, fault });
}

export async function startMockAnthropic(options: MockAnthropicOptions = {}): Promise<MockAnthropic> {
  const state: MockState = { requests: [], faults: [], streamsCancelled: 0, cache: new Set() };
  const server: Server<undefined> = Bun.serve({
    hostname: "127.0.0.1",
    port: options.port ?? 0,
    // Hanging and slow responses must outlive Bun's default 10 s idle timeout.
    idleTimeout: 0,
    fetch: (req) => handle(req, state, options),
  });
  const port = server.port ?? 0;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    get requests() {
      return state.requests;
    },
    get streamsCancelled() {
      return state.streamsCancelled;
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
      state.cache.clear();
    },
    stop: () => server.stop(true),
  };
}

// ---------------------------------------------------------------------------------------------
// CLI

function cliArg(args: string[], name: string): string | undefined {
  const i = args.indexOf(name);
  return i === -1 ? undefined : args[i + 1];
}

if (import.meta.main) {
  const args = Bun.argv.slice(2);
  const words = cliArg(args, "--reply-words");
  const mock = await startMockAnthropic({
    port: Number(cliArg(args, "--port") ?? "0"),
    apiKey: cliArg(args, "--api-key"),
    record: false,
    replyWords: words === undefined ? undefined : Number(words),
    deltaDelayMs: Number(cliArg(args, "--delta-delay-ms") ?? "0"),
  });
  console.log(`listening ${mock.url}`);
}
