/**
 * Anthropic's stream (message_start, content_block_start/delta/stop, message_delta, message_stop,
 * ping, error) → OpenAI `chat.completion.chunk`s.
 *
 * This runs on every event of every stream, so the common events cost no JSON round trip: a
 * content delta's value is already a JSON string literal in the upstream text, and it is spliced
 * into a chunk whose fixed part (`id`, `created`, `model`) was serialized once per stream. Events
 * that do not have the exact expected shape take the general path (JSON.parse).
 */
import { nowSeconds } from "../../core/openai-ids.ts";
import type { ChatRequest, StreamPart, StreamTransform, Usage } from "../../core/contract.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";
import { openAIUsage } from "../../core/openai-usage.ts";
import { JSON_RESPONSE_TOOL, wantsJsonResponse } from "../shared/json-response-tool.ts";
import { streamErrorInfo } from "./errors.ts";
import { finishReason } from "./finish-reason.ts";
import { usageFromAnthropic } from "./usage.ts";
import type { AnthropicUsage } from "./wire.ts";

/** What a content block index is: text, thinking, the response_format tool, something else, or (≥ 0) an OpenAI tool-call index. */
const TEXT = -1;
const THINKING = -2;
const JSON_ANSWER = -3;
const OTHER = -4;

export interface AnthropicStreamState {
  req: ChatRequest;
  wantsUsage: boolean;
  id: string | undefined;
  /** `{"id":…,"object":"chat.completion.chunk","created":…,"model":…,` — every chunk starts with it. */
  head: string;
  /** Content block index → TEXT, THINKING, JSON_ANSWER, OTHER or the tool call's index. */
  blocks: number[];
  /** Tool calls seen so far (the next one's OpenAI index). */
  tools: number;
  /** Tool calls whose arguments have not received a character yet. */
  emptyArgs: Set<number> | undefined;
  /** The request's response_format is carried by the JSON tool. */
  jsonMode: boolean;
  /** The JSON tool was called: its input is the content. */
  jsonAnswer: boolean;
  /**
   * In JSON mode, the text written so far (JSON-escaped), held back: while thinking the JSON tool is
   * not forced, and a preamble before it ("Here is the JSON:") would make the content invalid JSON.
   * Dropped when the tool is called, sent at the end of the message when it is not.
   */
  heldText: string;
  /** The open thinking block's text, still JSON-escaped (spliced back into `thinking_blocks`). */
  thinking: string;
  inputTokens: number;
  cacheRead: number;
  cacheCreation: number;
  /** Of cacheCreation, the writes cached for an hour. */
  cacheCreation1h: number;
  /** Web searches run so far (message_delta's count is cumulative). */
  webSearches: number;
  outputTokens: number;
  /** Characters sent as content, reasoning or arguments: the completion estimate for a cut stream. */
  chars: number;
  /** Upstream reported usage (message_start's input side, or message_delta's final counts). */
  sawUsage: boolean;
  /** message_delta seen with its output count: the usage is final. */
  done: boolean;
  /** message_delta (the stop reason) or message_stop seen: the answer is whole. */
  stopped: boolean;
}

const CHOICE_OPEN = '"choices":[{"index":0,"delta":';
const CHOICE_CLOSE = ',"logprobs":null,"finish_reason":null}]}';
const NONE: StreamPart[] = [];

/** `opens`: the chunk only opens the message (StreamPart's `opens`). */
function chunk(s: AnthropicStreamState, delta: string, opens?: true): StreamPart[] {
  return [{ type: "data", data: s.head + CHOICE_OPEN + delta + CHOICE_CLOSE, opens }];
}

const usageOf = (s: AnthropicStreamState): Usage =>
  usageFromAnthropic({
    input_tokens: s.inputTokens,
    cache_read_input_tokens: s.cacheRead,
    cache_creation_input_tokens: s.cacheCreation,
    cache_creation: { ephemeral_1h_input_tokens: s.cacheCreation1h },
    server_tool_use: { web_search_requests: s.webSearches },
    output_tokens: s.outputTokens,
  });

function takeUsage(s: AnthropicStreamState, u: AnthropicUsage | undefined): void {
  if (!u) return;
  s.sawUsage = true;
  // message_delta repeats the counts cumulatively (and, in recent API versions, the input side too).
  if (typeof u.input_tokens === "number") s.inputTokens = u.input_tokens;
  if (typeof u.cache_read_input_tokens === "number") s.cacheRead = u.cache_read_input_tokens;
  if (typeof u.cache_creation_input_tokens === "number") s.cacheCreation = u.cache_creation_input_tokens;
  if (typeof u.cache_creation?.ephemeral_1h_input_tokens === "number") s.cacheCreation1h = u.cache_creation.ephemeral_1h_input_tokens;
  if (typeof u.server_tool_use?.web_search_requests === "number") s.webSearches = u.server_tool_use.web_search_requests;
  if (typeof u.output_tokens === "number") s.outputTokens = u.output_tokens;
}

// ---------------------------------------------------------------------------------------------
// Deltas: the hot path

/** Whether `s[start, end)` is exactly one JSON string literal (no unescaped quote inside). */
function isStringLiteral(s: string, start: number, end: number): boolean {
  if (end - start < 2 || s.charCodeAt(start) !== 34 || s.charCodeAt(end - 1) !== 34) return false;
  let i = start + 1;
  for (; i < end - 1; i++) {
    const c = s.charCodeAt(i);
    if (c === 92 /* \ */) i++;
    else if (c === 34 /* " */) return false;
  }
  // An escape just before the closing quote would have carried `i` past it.
  return i === end - 1;
}

const DELTA_HEAD = '{"type":"content_block_delta","index":';
/** Delta kinds and the member holding their text, as Anthropic writes them. */
const DELTA_KINDS = [
  { kind: "text_delta", prefix: ',"delta":{"type":"text_delta","text":' },
  { kind: "input_json_delta", prefix: ',"delta":{"type":"input_json_delta","partial_json":' },
  { kind: "thinking_delta", prefix: ',"delta":{"type":"thinking_delta","thinking":' },
] as const;
type DeltaKind = (typeof DELTA_KINDS)[number]["kind"];

/** A delta's block index, kind and text as a JSON literal, read without parsing; undefined if the shape differs. */
function readDelta(data: string): { index: number; kind: DeltaKind; literal: string } | undefined {
  let p = DELTA_HEAD.length;
  let index = 0;
  const digits = p;
  for (let c = data.charCodeAt(p); c >= 48 && c <= 57; c = data.charCodeAt(++p)) index = index * 10 + (c - 48);
  if (p === digits) return undefined;
  const end = data.length - 2;
  if (data.charCodeAt(end) !== 125 || data.charCodeAt(end + 1) !== 125 /* }} */) return undefined;
  for (const k of DELTA_KINDS) {
    if (!data.startsWith(k.prefix, p)) continue;
    const start = p + k.prefix.length;
    return isStringLiteral(data, start, end) ? { index, kind: k.kind, literal: data.slice(start, end) } : undefined;
  }
  return undefined;
}

function holdText(s: AnthropicStreamState, literal: string): StreamPart[] {
  // Text after the JSON tool's call is no more part of the answer than text before it.
  if (!s.jsonAnswer) s.heldText += literal.slice(1, -1);
  return NONE;
}

/** A content delta as a chunk; `literal` is the JSON string literal of its text. */
function deltaParts(s: AnthropicStreamState, index: number, kind: string, literal: string): StreamPart[] {
  if (literal.length === 2) return NONE; // "" (Anthropic opens every tool input with one)
  s.chars += literal.length - 2;
  switch (kind) {
    case "text_delta":
      if (s.jsonMode) return holdText(s, literal);
      return chunk(s, `{"content":${literal}}`);
    case "thinking_delta":
      s.thinking += literal.slice(1, -1);
      return chunk(s, `{"reasoning_content":${literal}}`);
    case "input_json_delta": {
      const block = s.blocks[index] ?? OTHER;
      if (block === JSON_ANSWER) return chunk(s, `{"content":${literal}}`);
      if (block < 0) return NONE;
      s.emptyArgs?.delete(block);
      return chunk(s, `{"tool_calls":[{"index":${block},"function":{"arguments":${literal}}}]}`);
    }
    default:
      return NONE;
  }
}

// ---------------------------------------------------------------------------------------------
// Every other event: parsed

interface Block {
  type?: string;
  id?: string;
  name?: string;
  text?: string;
  data?: string;
  input?: unknown;
}

interface StreamEvent {
  type?: string;
  index?: number;
  message?: { id?: string; model?: string; usage?: AnthropicUsage };
  content_block?: Block;
  delta?: { type?: string; text?: string; partial_json?: string; thinking?: string; signature?: string; stop_reason?: string | null };
  usage?: AnthropicUsage;
  error?: { type?: string; message?: string };
}

function messageStart(s: AnthropicStreamState, e: StreamEvent): StreamPart[] {
  const m = e.message ?? {};
  s.id = m.id;
  s.head = `{"id":${JSON.stringify(m.id ?? "")},"object":"chat.completion.chunk","created":${nowSeconds()},"model":${JSON.stringify(m.model ?? s.req.model)},`;
  takeUsage(s, m.usage);
  return chunk(s, '{"role":"assistant","content":"","refusal":null}', true);
}

function blockStart(s: AnthropicStreamState, index: number, b: Block): StreamPart[] {
  switch (b.type) {
    case "text":
      s.blocks[index] = TEXT;
      return b.text ? deltaParts(s, index, "text_delta", JSON.stringify(b.text)) : NONE;
    case "thinking":
      s.blocks[index] = THINKING;
      s.thinking = "";
      return NONE;
    case "redacted_thinking":
      s.blocks[index] = THINKING;
      return chunk(s, `{"thinking_blocks":[${JSON.stringify({ type: "redacted_thinking", data: b.data ?? "" })}]}`);
    case "tool_use": {
      if (b.name === JSON_RESPONSE_TOOL) {
        s.blocks[index] = JSON_ANSWER;
        s.jsonAnswer = true;
        s.heldText = "";
        return NONE;
      }
      const k = s.tools++;
      s.blocks[index] = k;
      // A complete input in the start event (no deltas will follow) goes out with the name.
      const input = b.input && typeof b.input === "object" && Object.keys(b.input).length > 0 ? JSON.stringify(b.input) : "";
      if (input === "") {
        s.emptyArgs ??= new Set();
        s.emptyArgs.add(k);
      }
      const call = { index: k, id: b.id ?? "", type: "function", function: { name: b.name ?? "", arguments: input } };
      return chunk(s, `{"tool_calls":[${JSON.stringify(call)}]}`);
    }
    default:
      // Server tools (web search) and their results have no OpenAI chunk.
      s.blocks[index] = OTHER;
      return NONE;
  }
}

function blockDelta(s: AnthropicStreamState, index: number, e: StreamEvent): StreamPart[] {
  const d = e.delta ?? {};
  switch (d.type) {
    case "text_delta":
      return deltaParts(s, index, d.type, JSON.stringify(d.text ?? ""));
    case "thinking_delta":
      return deltaParts(s, index, d.type, JSON.stringify(d.thinking ?? ""));
    case "input_json_delta":
      return deltaParts(s, index, d.type, JSON.stringify(d.partial_json ?? ""));
    case "signature_delta": {
      // The whole thinking block, signed: what the client must send back with its next turn.
      const signature = JSON.stringify(d.signature ?? "");
      return chunk(s, `{"thinking_blocks":[{"type":"thinking","thinking":"${s.thinking}","signature":${signature}}]}`);
    }
    default:
      return NONE;
  }
}

function blockStop(s: AnthropicStreamState, index: number): StreamPart[] {
  const k = s.blocks[index] ?? OTHER;
  // A tool called without arguments still needs parseable ones.
  if (k < 0 || !s.emptyArgs?.delete(k)) return NONE;
  return chunk(s, `{"tool_calls":[{"index":${k},"function":{"arguments":"{}"}}]}`);
}

function messageDelta(s: AnthropicStreamState, e: StreamEvent): StreamPart[] {
  s.stopped = true;
  takeUsage(s, e.usage);
  if (typeof e.usage?.output_tokens === "number") s.done = true;
  const reason = finishReason(e.delta?.stop_reason, s.jsonAnswer && s.tools === 0);
  // JSON mode without a call of the JSON tool: the text held back is the answer after all.
  const parts: StreamPart[] = s.heldText === "" ? [] : chunk(s, `{"content":"${s.heldText}"}`);
  s.heldText = "";
  parts.push({ type: "data", data: `${s.head}${CHOICE_OPEN}{},"logprobs":null,"finish_reason":"${reason}"}]}` });
  // Without final counts from upstream, the core falls back to `estimate` (and so does the usage chunk).
  const usage = s.done ? usageOf(s) : anthropicChatStream.estimate(s);
  if (s.done) parts.push({ type: "usage", usage });
  if (s.wantsUsage) parts.push({ type: "data", data: `${s.head}"choices":[],"usage":${JSON.stringify(openAIUsage(usage))}}` });
  return parts;
}

function parsedEvent(data: string, s: AnthropicStreamState): StreamPart[] {
  const e = JSON.parse(data) as StreamEvent;
  const index = e.index ?? 0;
  switch (e.type) {
    case "message_start":
      return messageStart(s, e);
    case "content_block_start":
      return blockStart(s, index, e.content_block ?? {});
    case "content_block_delta":
      return blockDelta(s, index, e);
    case "content_block_stop":
      return blockStop(s, index);
    case "message_delta":
      return messageDelta(s, e);
    case "error":
      return [{ type: "error", error: streamErrorInfo(e.error?.type, e.error?.message) }];
    case "message_stop":
      s.stopped = true;
      return [{ type: "end" }];
    default:
      // ping, and event types added after this was written.
      return NONE;
  }
}

export const anthropicChatStream: StreamTransform<"chat", AnthropicStreamState> = {
  framing: "sse",
  init: (req) => ({
    req,
    wantsUsage: req.stream_options?.include_usage === true,
    id: undefined,
    head: `{"id":"","object":"chat.completion.chunk","created":${nowSeconds()},"model":${JSON.stringify(req.model)},`,
    blocks: [],
    tools: 0,
    emptyArgs: undefined,
    jsonMode: wantsJsonResponse(req),
    jsonAnswer: false,
    heldText: "",
    thinking: "",
    inputTokens: 0,
    cacheRead: 0,
    cacheCreation: 0,
    cacheCreation1h: 0,
    webSearches: 0,
    outputTokens: 0,
    chars: 0,
    sawUsage: false,
    done: false,
    stopped: false,
  }),
  event(data, s) {
    if (data.startsWith(DELTA_HEAD)) {
      const d = readDelta(data);
      if (d) return deltaParts(s, d.index, d.kind, d.literal);
    }
    return parsedEvent(data, s);
  },
  estimate(s) {
    if (s.done) return usageOf(s);
    // Cut before message_delta: Anthropic's output count is still the placeholder from message_start.
    const usage = usageOf(s);
    if (!s.sawUsage) usage.promptTokens = estimateTokens(s.req.messages.map((m) => m.content));
    usage.completionTokens = Math.max(s.outputTokens, Math.ceil(s.chars / 4));
    return usage;
  },
  responseId: (s) => s.id,
  complete: (s) => s.stopped,
};
