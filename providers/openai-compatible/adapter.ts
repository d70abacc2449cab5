/**
 * One adapter for every OpenAI-shaped provider: the request is the client's body minus the
 * gateway's own fields, the response and chunks are already in the client's format.
 */
import type {
  ChatRequest,
  CompletionRequest,
  Deployment,
  EndpointAdapter,
  HttpCall,
  ProviderAdapter,
  StreamPart,
  Usage,
  WireJson,
  WireRequest,
} from "../../core/contract.ts";
import { promptSize } from "../../core/cost/estimate.ts";
import { ErrorInAnswer, errorInfo } from "../../core/errors.ts";
import { mapUpstreamStatus } from "../../core/pipeline/upstream.ts";
import { answerTokenBound, choicesAnswered } from "../../core/cost/worst-case.ts";
import { imagesAsked, NotForwardedFields, speechUsage } from "../../core/wire.ts";
import type { Dialect, OpenAICompatibleProvider } from "./table.ts";
import { usageFromImages, usageFromOpenAI } from "./usage.ts";
import { countsTokens } from "../../core/openai-usage.ts";
import { upstreamErrorKind } from "../shared/error-kind.ts";
import { openAITranscriptions } from "./transcriptions.ts";

/** Whether the client's body holds a field the provider's dialect renames or leaves out. */
function inOpenAINames(req: WireJson, dialect: Dialect | undefined): boolean {
  if (dialect === undefined) return false;
  if (dialect.usageUnasked && "stream_options" in req) return true;
  for (const k in dialect.renamed) if (k in req) return true;
  for (const k of dialect.unused ?? []) if (k in req) return true;
  return false;
}

/** The body rewritten into the provider's dialect, in place. */
function toDialect(body: WireJson, dialect: Dialect): void {
  if (dialect.usageUnasked) delete body.stream_options;
  for (const k of dialect.unused ?? []) delete body[k];
  for (const [from, to] of Object.entries(dialect.renamed ?? {})) {
    if (!(from in body)) continue;
    // A null leaves the native field as the client set it (`max_completion_tokens: null` beside `max_tokens`).
    if (body[from] !== null) body[to] = body[from];
    delete body[from];
  }
}

/**
 * The client's own bytes, when the upstream body would be the same: same model name, no
 * gateway-only fields, nothing the provider's dialect rewrites. A stream must ask upstream for its
 * usage (unless the provider sends it unasked): when the client sent no `stream_options`,
 * `include_usage` is spliced in front (no parse and serialize of the body).
 * Undefined: the body has to be rebuilt.
 */
function forwardedBody(req: WireJson, d: Deployment, raw: string | undefined, dialect?: Dialect): string | undefined {
  if (raw === undefined || req.model !== d.upstreamModel || inOpenAINames(req, dialect)) return undefined;
  for (const k of NotForwardedFields) if (k in req) return undefined;
  if (req.stream !== true || dialect?.usageUnasked) return raw;
  const options = req.stream_options;
  if ((options as WireJson | undefined)?.include_usage === true) return raw;
  if (options !== undefined) return undefined;
  // The body is an object holding at least `stream`, so a member follows its opening brace.
  return `{"stream_options":{"include_usage":true},${raw.slice(raw.indexOf("{") + 1)}`;
}

/** The upstream body: the client's bytes where they do, else rebuilt. */
function bodyFor(req: WireJson, d: Deployment, raw: string | undefined, dialect?: Dialect): string {
  const askUsage = req.stream === true && !dialect?.usageUnasked;
  return forwardedBody(req, d, raw, dialect) ?? upstreamBody(req, d, askUsage ? { stream_options: { ...(req.stream_options as WireJson | undefined), include_usage: true } } : undefined, dialect);
}

function upstreamBody(req: object, d: Deployment, extra?: WireJson, dialect?: Dialect): string {
  const body: WireJson = { ...req, model: d.upstreamModel, ...extra };
  // Most requests carry none of these; deleting only what is present keeps the object fast.
  for (const k of NotForwardedFields) if (k in body) delete body[k];
  if (dialect) toDialect(body, dialect);
  return JSON.stringify(body);
}

function call(d: Deployment, path: string, body: string): HttpCall {
  const headers: Record<string, string> = { "content-type": "application/json", ...d.headers };
  if (d.apiKey) headers.authorization = `Bearer ${d.apiKey}`;
  return { url: `${d.apiBase}${path}`, method: "POST", headers, body };
}

function asObject(body: unknown): WireJson {
  if (body === null || typeof body !== "object" || Array.isArray(body)) throw new Error("expected a JSON object");
  return body as WireJson;
}

/** An error object's `code` (or `status`) when it is an HTTP error status. */
function httpStatusOf(e: WireJson): number | undefined {
  const code = Number(e.code ?? e.status);
  return Number.isInteger(code) && code >= 400 && code < 600 ? code : undefined;
}

/**
 * An answer's body. Some OpenAI-compatible servers and proxies (and Azure, at times) answer an
 * error with a 200: `{"error": {…}}` and no answer; it fails the call as the error it is.
 */
function answerObject(body: unknown): WireJson {
  const b = asObject(body);
  if (b.error == null || "choices" in b || "data" in b || "results" in b) return b;
  const status = typeof b.error === "object" ? httpStatusOf(b.error as WireJson) : undefined;
  throw new ErrorInAnswer(status ?? 500, JSON.stringify(b));
}

interface StreamState {
  /** Whether the client asked for the usage chunk; the gateway asks upstream for it (or the provider sends it unasked). */
  clientWantsUsage: boolean;
  /** Chunks that carry answer tokens (an opening role chunk or a finish-only one carries none). */
  chunks: number;
  promptEstimate: number;
  /** The chunks' `id` (the same on every chunk), read from the first one. */
  id?: string;
  /** `[DONE]`, the usage chunk (asked for, or sent unasked) or a finish reason on every choice came: the answer is whole. */
  ended: boolean;
  /** The choices the answer holds (`n`): one choice's finish is not the end of an answer of several. */
  choices: number;
  /** With several choices: the indexes of those that finished. */
  finished?: Set<number>;
  /** Chat: the request, and whether the answer cited the web (a search model's search, priced per call). */
  req?: ChatRequest;
  searched?: boolean;
}

// JSON allows whitespace around ':' (some servers pretty-print each chunk): every key test allows it.
const CHUNK_ID = /"id"\s*:\s*"([^"\\]+)"/;
/**
 * A chunk that may be the usage chunk (the usage object; `"usage":null` on every other chunk once
 * usage was asked for). A vendor's object may hold a `usage` of its own (Groq's first chunk:
 * `"x_groq":{"id":…,"usage":{"queue_time":…}}`), which this matches too: usageChunk decides.
 */
const USAGE = /"usage"\s*:\s*\{/;
const ERROR_EVENT = /^\s*\{\s*"error"\s*:/;
const PADDED_OBJECT = /^\s*\{[\s\S]*\}\s*$/;
/** `"usage":null` with the comma before it (or, first in its object, after it). */
const NULL_USAGE = /,\s*"usage"\s*:\s*null(?=\s*[,}])|"usage"\s*:\s*null\s*,?/;
/** A chunk that ends a choice: servers that send neither `[DONE]` nor usage still end with one. */
const FINISHED = /"finish_reason":\s*"/;
/** A chunk that carries answer tokens: non-empty text, reasoning or refusal, or a tool call's delta. */
const CARRIES_TOKENS = /"(?:content|text|refusal|reasoning_content|reasoning)"\s*:\s*"(?!")|"tool_calls"\s*:\s*\[/;

function wantsUsage(req: { stream_options?: Record<string, unknown> | null }): boolean {
  return req.stream_options?.include_usage === true;
}

/**
 * Streaming for chat and legacy completions: same framing, same usage chunk. Chunks pass through as
 * the upstream wrote them; only usage the client did not ask for (asked on its behalf, or sent
 * unasked) is removed.
 * Text surgery is safe here: inside JSON strings quotes are escaped, so `"usage":` can only be a key.
 */
function openAIStream<E extends "chat" | "completions">(
  endpoint: E,
  promptEstimate: (req: E extends "chat" ? ChatRequest : CompletionRequest) => number,
) {
  return {
    framing: "sse" as const,
    init: (req: E extends "chat" ? ChatRequest : CompletionRequest): StreamState => ({
      clientWantsUsage: wantsUsage(req),
      chunks: 0,
      promptEstimate: promptEstimate(req),
      ended: false,
      choices: choicesAnswered(endpoint, req),
    }),
    event(data: string, s: StreamState): StreamPart[] {
      if (data === "[DONE]") {
        s.ended = true;
        return [{ type: "end" }];
      }
      s.id ??= CHUNK_ID.exec(data)?.[1] ?? "";
      if (!s.ended && FINISHED.test(data)) s.ended = s.choices === 1 || allChoicesFinished(data, s);
      if (ERROR_EVENT.test(data)) return [streamError(data)];
      const parts: StreamPart[] = [];
      const chunk = usageChunk(data);
      if (chunk !== undefined) {
        s.ended = true;
        // A usage that counts nothing (`{}`) is none: the stream's end charges the estimate and
        // sends it as the usage chunk to a client that asked, in place of this one.
        const counted = countsTokens(chunk.usage);
        if (counted) parts.push({ type: "usage", usage: usageFromOpenAI(chunk.usage, () => s.promptEstimate) });
        if (!s.clientWantsUsage || !counted) {
          if (Array.isArray(chunk.choices) && chunk.choices.length === 0) return parts;
          delete chunk.usage;
          if (CARRIES_TOKENS.test(data)) s.chunks++;
          parts.push({ type: "chunk", chunk });
          return parts;
        }
      } else if ((data.charCodeAt(0) !== 123 /* { */ || data.charCodeAt(data.length - 1) !== 125 /* } */) && !PADDED_OBJECT.test(data)) {
        // A cheap guard instead of a full parse per chunk: truncated or non-object events stop the stream.
        throw new Error("stream event is not a JSON object");
      }
      const carriesTokens = CARRIES_TOKENS.test(data);
      // Before any token: a chunk with none may only open the message (one parse each, a few at most).
      const opens = s.chunks === 0 && !carriesTokens && opensOnly(data);
      if (carriesTokens) s.chunks++;
      const out = s.clientWantsUsage ? data : stripNullUsage(data);
      parts.push(opens ? { type: "data", data: out, opens } : { type: "data", data: out });
      return parts;
    },
    // OpenAI sends about one token per content chunk, so the chunk count is a fair estimate.
    estimate: (s: StreamState): Usage => ({ promptTokens: s.promptEstimate, completionTokens: s.chunks }),
    responseId: (s: StreamState) => s.id || undefined,
    complete: (s: StreamState) => s.ended,
  };
}

/** Records the choices a finish chunk ends (parsed: a few chunks a stream); whether every choice has ended. */
function allChoicesFinished(data: string, s: StreamState): boolean {
  const choices = asObject(JSON.parse(data)).choices;
  s.finished ??= new Set();
  if (Array.isArray(choices)) {
    for (const c of choices as { index?: unknown; finish_reason?: unknown }[]) {
      if (typeof c?.finish_reason === "string") s.finished.add(typeof c.index === "number" ? c.index : 0);
    }
  }
  return s.finished.size >= s.choices;
}

/**
 * The chunk, parsed, when it carries the call's usage: a `usage` object at its top level. Only that
 * one ends the answer and replaces the estimate; a nested one is a vendor's (Groq's queue time),
 * and reading it as the usage made the whole stream free.
 */
function usageChunk(data: string): WireJson | undefined {
  if (!USAGE.test(data)) return undefined;
  const chunk = asObject(JSON.parse(data));
  const usage = chunk.usage;
  return usage !== null && typeof usage === "object" && !Array.isArray(usage) ? chunk : undefined;
}

/**
 * An error event inside the stream (`{"error": {message, code}}`): a code that is an HTTP status
 * is mapped as that status of an HTTP answer would be (a 429 stays a 429, for the router and the
 * client), anything else is a 500.
 */
function streamError(data: string): StreamPart {
  const e = asObject(asObject(JSON.parse(data)).error);
  const status = mapUpstreamStatus(httpStatusOf(e) ?? 500);
  return { type: "error", error: errorInfo(status, String(e.message ?? "upstream error")) };
}

/**
 * Whether a chunk before the answer's first token only opens the message (every choice's delta a
 * role and empty content, no finish): OpenAI's first chunk (one per choice with `n`). Marked
 * (StreamPart `opens`), a cut, stall or error right after it still fails the attempt before the
 * client got anything, so it is retried or falls back. One parse per such chunk.
 */
function opensOnly(data: string): boolean {
  try {
    const choices = (JSON.parse(data) as { choices?: unknown }).choices;
    if (!Array.isArray(choices) || choices.length === 0) return false;
    return choices.every((c: { delta?: unknown; finish_reason?: unknown } | null) => {
      if (!c || c.finish_reason != null || typeof c.delta !== "object" || c.delta === null) return false;
      return Object.entries(c.delta).every(([k, v]) => k === "role" || v === "" || v === null);
    });
  } catch {
    return false;
  }
}

/** Removes the `"usage":null` member OpenAI adds to every chunk once usage was requested. */
function stripNullUsage(data: string): string {
  return data.includes('"usage"') ? data.replace(NULL_USAGE, "") : data;
}

function textLength(v: unknown): number {
  if (typeof v === "string") return v.length;
  if (Array.isArray(v)) return v.reduce((n: number, x) => n + textLength(x), 0);
  if (v !== null && typeof v === "object") return textLength((v as WireJson).text ?? (v as WireJson).content);
  return 0;
}

/** Rough prompt size (4 characters per token) for cut or cancelled streams that never reported usage. */
export function estimateTokens(v: unknown): number {
  return Math.ceil(textLength(v) / 4);
}

/** The text of an answer's choices: message content and tool-call arguments (chat), or `text` (completions). */
function answerText(b: WireJson): string[] {
  const out: string[] = [];
  for (const c of Array.isArray(b.choices) ? b.choices : []) {
    if (c === null || typeof c !== "object") continue;
    const choice = c as WireJson;
    if (typeof choice.text === "string") out.push(choice.text);
    const m = choice.message as WireJson | undefined;
    if (m === null || typeof m !== "object") continue;
    if (typeof m.content === "string") out.push(m.content);
    for (const t of Array.isArray(m.tool_calls) ? m.tool_calls : []) {
      const args = (t as { function?: { arguments?: unknown } } | null)?.function?.arguments;
      if (typeof args === "string") out.push(args);
    }
  }
  return out;
}

/**
 * An answer's usage. Some OpenAI-compatible servers (self-hosted ones) send none, or one that
 * counts nothing (`{}`): such a call is not free, its tokens are estimated as a cut stream's are
 * (the prompt as budgets estimate it, the answer at four characters a token, never more than the
 * request's max_tokens allowed: budgets reserve that much, and an estimate above it could take
 * spend past a budget).
 */
function answerUsage<E extends "chat" | "completions" | "embeddings">(endpoint: E, b: WireJson, req: WireRequest[E] | undefined): Usage {
  if (!req) return usageFromOpenAI(b.usage);
  const promptEstimate = () => promptSize(endpoint, req).estimate;
  // An embedding's tokens are all prompt: a total alone is the prompt's.
  if (countsTokens(b.usage)) return usageFromOpenAI(b.usage, endpoint === "embeddings" ? undefined : promptEstimate);
  const estimated = estimateTokens(answerText(b));
  const bound = answerTokenBound(endpoint, req);
  return { promptTokens: promptEstimate(), completionTokens: bound === undefined ? estimated : Math.min(estimated, bound) };
}

/** The search context size a request asked a search model for (`web_search_options.search_context_size`). */
function searchContextSize(req: ChatRequest | undefined): Usage["searchContextSize"] {
  const size = (req as { web_search_options?: { search_context_size?: unknown } | null } | undefined)?.web_search_options?.search_context_size;
  return size === "low" || size === "medium" || size === "high" ? size : undefined;
}

/**
 * A search model's answer that cites the web (`url_citation` annotations) ran a web search, priced
 * per call at the size asked (LiteLLM's StandardBuiltInToolCostTracking: one search per answer).
 */
function withSearch(usage: Usage, req: ChatRequest | undefined): Usage {
  // Searches the usage itself reports (Perplexity's), at the size it reports, stand.
  if (usage.webSearchRequests) return usage;
  usage.webSearchRequests = 1;
  const size = searchContextSize(req);
  if (size) usage.searchContextSize = size;
  return usage;
}

function citesWeb(b: WireJson): boolean {
  for (const c of Array.isArray(b.choices) ? b.choices : []) {
    const annotations = (c as { message?: { annotations?: unknown } } | null)?.message?.annotations;
    if (Array.isArray(annotations) && annotations.some((a) => (a as { type?: unknown } | null)?.type === "url_citation")) return true;
  }
  return false;
}

/** `dialectOf`: how a deployment's provider departs from OpenAI's request body (table rows' `dialect`). */
export function openAIChat(dialectOf?: (d: Deployment) => Dialect | undefined): EndpointAdapter<"chat", StreamState> {
  const stream = openAIStream("chat", (req: ChatRequest) => estimateTokens(req.messages.map((m) => m.content)));
  return {
    supportedParamsFor: (d) => dialectOf?.(d)?.accepted,
    request: (req, d, raw) =>
      call(d, "/chat/completions", bodyFor(req, d, raw, dialectOf?.(d))),
    response: (body, req) => {
      const b = answerObject(body);
      const usage = answerUsage("chat", b, req);
      return { body: b, usage: citesWeb(b) ? withSearch(usage, req) : usage };
    },
    stream: {
      ...stream,
      init: (req) => ({ ...stream.init(req), req }),
      event(data, s) {
        // Annotations come in the content deltas, before the usage chunk; a cheap text test first.
        if (!s.searched && data.includes('"url_citation"')) s.searched = true;
        const parts = stream.event(data, s);
        if (s.searched) for (const p of parts) if (p.type === "usage") withSearch(p.usage, s.req);
        return parts;
      },
      estimate: (s) => (s.searched ? withSearch(stream.estimate(s), s.req) : stream.estimate(s)),
    },
  };
}

export function openAICompletions(): EndpointAdapter<"completions", StreamState> {
  return {
    request: (req, d, raw) =>
      call(d, "/completions", bodyFor(req, d, raw)),
    response: (body, req) => {
      const b = answerObject(body);
      return { body: b, usage: answerUsage("completions", b, req) };
    },
    stream: openAIStream("completions", (req: CompletionRequest) => estimateTokens(req.prompt)),
  };
}

export function openAIEmbeddings(): EndpointAdapter<"embeddings"> {
  return {
    request: (req, d, raw) => call(d, "/embeddings", forwardedBody(req, d, raw) ?? upstreamBody(req, d)),
    response: (body, req) => {
      const b = answerObject(body);
      return { body: b, usage: answerUsage("embeddings", b, req) };
    },
  };
}

/** Image generation: the images returned, at the size and quality asked, are what is priced; a gpt-image model's tokens too. */
export function openAIImages(): EndpointAdapter<"images"> {
  return {
    request: (req, d, raw) => call(d, "/images/generations", forwardedBody(req, d, raw) ?? upstreamBody(req, d)),
    response: (body, req) => {
      const b = answerObject(body);
      const count = Array.isArray(b.data) ? b.data.length : 0;
      const asked = req ? imagesAsked(req) : { count };
      // gpt-image-1 says which size and quality it made (for `auto`); dall-e answers what was asked.
      const size = typeof b.size === "string" && b.size !== "auto" ? b.size : asked.size;
      const quality = typeof b.quality === "string" && b.quality !== "auto" ? b.quality.toLowerCase() : asked.quality;
      return { body: b, usage: { ...usageFromImages(b.usage), images: { count, size, quality } } };
    },
  };
}

/** Speech synthesis: the audio goes back as the upstream sent it; the input's characters are priced. */
export function openAISpeech(): EndpointAdapter<"speech"> {
  return {
    request: (req, d, raw) => call(d, "/audio/speech", forwardedBody(req, d, raw) ?? upstreamBody(req, d)),
    response: () => {
      throw new Error("a speech answer is audio, not JSON");
    },
    binaryUsage: speechUsage,
  };
}

/** Moderation: passed through; OpenAI does not charge for it or report usage. */
export function openAIModerations(): EndpointAdapter<"moderations"> {
  return {
    request: (req, d, raw) => call(d, "/moderations", forwardedBody(req, d, raw) ?? upstreamBody(req, d)),
    response: (body) => ({ body: answerObject(body), usage: { promptTokens: 0, completionTokens: 0 } }),
  };
}

/**
 * A request validation failure's `detail` list (FastAPI's, which Mistral sends as its `message` or
 * alone) → one line per problem, `body.seed: Extra inputs are not permitted`; else undefined.
 */
function validationDetail(v: unknown): string | undefined {
  const detail = v !== null && typeof v === "object" ? (v as { detail?: unknown }).detail : undefined;
  if (!Array.isArray(detail) || detail.length === 0) return undefined;
  return detail
    .map((d: { loc?: unknown; msg?: unknown } | null) => {
      const at = Array.isArray(d?.loc) ? d.loc.join(".") : "";
      const msg = typeof d?.msg === "string" ? d.msg : "invalid";
      return at ? `${at}: ${msg}` : msg;
    })
    .join("; ");
}

/** OpenAI's error body `{error: {message}}` → its message. */
export function openAIErrorMessage(_status: number, body: string): string {
  try {
    const parsed = JSON.parse(body) as { error?: { message?: unknown } | string; message?: unknown };
    if (typeof parsed.error === "string") return parsed.error;
    if (typeof parsed.error?.message === "string") return parsed.error.message;
    if (typeof parsed.message === "string") return parsed.message;
    const detail = validationDetail(parsed.message) ?? validationDetail(parsed);
    if (detail !== undefined) return detail;
  } catch {
    // not JSON: fall through to the raw text
  }
  return body.slice(0, 500);
}

/** The adapter for a set of table rows. */
export function openAICompatibleAdapter(rows: readonly OpenAICompatibleProvider[]): ProviderAdapter {
  const byId = new Map(rows.map((r) => [r.id, r]));
  return {
    ids: rows.map((r) => r.id),
    endpoints: {
      chat: openAIChat((d) => byId.get(d.provider)?.dialect),
      completions: openAICompletions(),
      embeddings: openAIEmbeddings(),
      images: openAIImages(),
      transcriptions: openAITranscriptions(),
      speech: openAISpeech(),
      moderations: openAIModerations(),
    },
    errorMessage: openAIErrorMessage,
    errorKind: upstreamErrorKind,
    resolve(d) {
      const row = byId.get(d.provider);
      const apiBase = (d.apiBase ?? row?.apiBase)?.replace(/\/+$/, "");
      if (!apiBase) return `provider ${d.provider} needs svc_params.api_base`;
      const apiKey = d.apiKey ?? (row?.apiKeyEnv ? process.env[row.apiKeyEnv] : undefined);
      // A key for another header is set once here; `apiKey` would send it as a bearer token.
      if (row?.authHeader && apiKey) return { ...d, apiBase, apiKey: undefined, headers: { [row.authHeader]: apiKey, ...d.headers } };
      return { ...d, apiBase, apiKey };
    },
  };
}
