// Streams through every provider that has a streaming mock, seeded random (STREAM_DIFF_SEED=<n>
// runs another set; every failure names the seed), on the embedded store. Each mock renders its
// answer to random prompts (unicode: multi-byte letters, combining marks, emoji and ZWJ sequences,
// quotes and backslashes; tool calls with random argument names; several choices where the
// provider has them), then sends the bytes cut into separate writes at random offsets, aimed at
// the hard places: inside a multi-byte UTF-8 character, inside an SSE line, between CR and LF, inside
// an event-stream frame's prelude and headers (test/mock-upstream/wire-shape.ts). Empty deltas are
// spliced in where the wire format allows one. Checked, against a small reference decoding of the
// exact bytes the mock sent (not the gateway's code):
// - the client's reassembled answer (through the openai SDK, or as raw SSE text) equals the
//   upstream's text and tool calls exactly, per choice, and a text answer is the mock's echo of the
//   prompt ("Mock reply to: <words>");
// - raw SSE is well formed: only `data: <json>\n\n` events, ending with `data: [DONE]`;
// - with stream_options.include_usage the last chunk carries the upstream's usage;
// - the same request without `stream` gives the same content, tool calls and usage;
// - the spend log row (call_id = x-svc-call-id) has the usage's tokens, success, and the exact cost
//   at the deployment's prices (a stream has no x-svc-response-cost header: its cost is in the log).
// Faults, one per provider and seed (README, Errors and Spend log): the upstream resets the
// connection at a random byte, ends its body cleanly at a random byte before the event that
// completes the answer, sends its own error event after a random event, or stalls past the
// deployment's timeout at a random byte: the client gets the chunks so far and then one
// `data: {"error": {message, type, param, code}}` event (code "503", the provider's status, or
// "408") and no [DONE] (when the upstream had said nothing yet, the call fails before the stream
// begins: that status, and the envelope as its body), the call is logged as a failure, charged for
// what it streamed when the answer had begun (else at cost 0), and the gateway keeps serving.
// SSE line ends are rewritten at random to CRLF or CR (NDJSON: CRLF), with comment lines between
// events and `data:` without its space, all of which the SSE spec allows. A client that
// leaves at a random point: the upstream request is aborted (the mock sees its client go) and the
// call is logged as cancelled, charged for the tokens its row shows at the deployment's prices.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { providerDeployments, type ProviderMocks, type StartedProviderMocks, startProviderMocks } from "../harness/provider-mocks.ts";
import { Random } from "../harness/random.ts";
import { until } from "../harness/util.ts";
import { eventFrame, exceptionFrame } from "../mock-upstream/bedrock.ts";
import type { WireShape, WireShaper } from "../mock-upstream/wire-shape.ts";

const SEED = Number(process.env.STREAM_DIFF_SEED ?? 5_170_443);
/** Clean rounds per provider (each: one stream, the same request without stream); then one fault and one client that leaves. */
const ROUNDS = 3;
/** The deployments' timeout (s): a stall past it is the stream's 408. */
const TIMEOUT_S = 1;
/** Prices in pico-dollars per token (integers, so the exact cost is known). */
const IN_PICO = 123_457n;
const OUT_PICO = 987_653n;
/** How long a client that means to leave waits for more before it goes (well under TIMEOUT_S). */
const QUIET_MS = 150;
const PRICES = { input_cost_per_token: Number(IN_PICO) / 1e12, output_cost_per_token: Number(OUT_PICO) / 1e12 };

const seedNote = `(STREAM_DIFF_SEED=${SEED})`;
type Json = Record<string, unknown>;
const enc = new TextEncoder();
const dec = new TextDecoder();

// ---------------------------------------------------------------------------------------------
// Random prompts

/** Pieces of words: 1- to 4-byte UTF-8, combining marks, ZWJ emoji, flags, JSON's escapes. */
const GLYPHS = ["a", "Z", "7", "é", "ß", "ü", "Ω", "ж", "中", "文", "字", "€", "ℵ", "😀", "🚀", "👩‍💻", "🇫🇷", "e\u0301", "𝔘", "𐍈", '"', "\\", "<", "&", "'", "/", "ﬁ", "ㄱ", "\u00ad"];

function word(rng: Random): string {
  return Array.from({ length: 1 + rng.int(5) }, () => rng.pick(GLYPHS)).join("");
}

/** 1–12 words (the mocks echo up to 12), none of them "weather" or a space. */
const words = (rng: Random) => Array.from({ length: 1 + rng.int(12) }, () => word(rng));

/** A tool whose parameters have random (unicode) names, all strings: the mocks fill each with "mock". */
function randomTool(rng: Random, i: number) {
  const properties: Json = {};
  for (let k = 0; k < 1 + rng.int(4); k++) properties[`${word(rng)}_${k}`] = { type: "string", description: word(rng) };
  return { type: "function" as const, function: { name: `tool_${i}_${rng.int(1000)}`, description: "random tool", parameters: { type: "object", properties, required: Object.keys(properties) } } };
}

// ---------------------------------------------------------------------------------------------
// The upstream's wire: events with their byte ranges, and a reference decoding

interface WireEvent {
  start: number;
  end: number;
  /** SSE: the data lines joined; NDJSON: the line; event stream: the payload text. */
  data: string;
}

type Framing = "sse" | "ndjson" | "eventstream";

function wireEvents(bytes: Uint8Array, framing: Framing): WireEvent[] {
  const out: WireEvent[] = [];
  if (framing === "eventstream") {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    for (let at = 0; at + 12 <= bytes.length; ) {
      const total = view.getUint32(at);
      const headers = view.getUint32(at + 4);
      out.push({ start: at, end: at + total, data: dec.decode(bytes.subarray(at + 12 + headers, at + total - 4)) });
      at += total;
    }
    return out;
  }
  // Lines end in CRLF, LF or CR (the SSE spec allows all three).
  let eventStart = 0;
  let lineStart = 0;
  let data: string[] = [];
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i];
    if (b !== 0x0a && b !== 0x0d) continue;
    const line = dec.decode(bytes.subarray(lineStart, i));
    if (b === 0x0d && bytes[i + 1] === 0x0a) i++;
    lineStart = i + 1;
    if (framing === "ndjson") {
      if (line.trim() !== "") out.push({ start: eventStart, end: i + 1, data: line });
      eventStart = i + 1;
      continue;
    }
    if (line === "") {
      if (data.length > 0) out.push({ start: eventStart, end: i + 1, data: data.join("\n") });
      data = [];
      eventStart = i + 1;
    } else if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
  }
  return out;
}

interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

interface Answer {
  /** Per choice index: the text, and the tool calls by their index. */
  choices: Map<number, { content: string; tools: ToolCall[] }>;
  usage?: { prompt: number; completion: number };
}

function choiceOf(a: Answer, index: number) {
  let c = a.choices.get(index);
  if (!c) {
    c = { content: "", tools: [] };
    a.choices.set(index, c);
  }
  return c;
}

const obj = (v: unknown): Json => (typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Json) : {});
const num = (v: unknown): number => (typeof v === "number" ? v : 0);
const str = (v: unknown): string => (typeof v === "string" ? v : "");

/** OpenAI's (and Azure's) chunks, as a client accumulates them. */
function decodeOpenAI(events: WireEvent[]): Answer {
  const a: Answer = { choices: new Map() };
  for (const e of events) {
    if (e.data === "[DONE]") continue;
    const chunk = JSON.parse(e.data) as Json;
    if (chunk.usage) a.usage = { prompt: num(obj(chunk.usage).prompt_tokens), completion: num(obj(chunk.usage).completion_tokens) };
    for (const ch of (chunk.choices as Json[] | undefined) ?? []) addDelta(choiceOf(a, num(ch.index)), obj(ch.delta));
  }
  return a;
}

/** An OpenAI chunk's delta (content, tool-call pieces) added to its choice. */
function addDelta(c: ReturnType<typeof choiceOf>, d: Json): void {
  c.content += str(d.content);
  for (const t of (d.tool_calls as Json[] | undefined) ?? []) {
    const call = c.tools[num(t.index)] ?? { id: "", name: "", arguments: "" };
    c.tools[num(t.index)] = call;
    if (t.id) call.id = str(t.id);
    const f = obj(t.function);
    if (f.name) call.name = str(f.name);
    call.arguments += str(f.arguments);
  }
}

function decodeAnthropic(events: WireEvent[]): Answer {
  const a: Answer = { choices: new Map() };
  const c = choiceOf(a, 0);
  const toolOfBlock = new Map<number, ToolCall>();
  let prompt = 0;
  for (const e of events) {
    const ev = JSON.parse(e.data) as Json;
    if (ev.type === "message_start") {
      const u = obj(obj(ev.message).usage);
      prompt = num(u.input_tokens) + num(u.cache_read_input_tokens) + num(u.cache_creation_input_tokens);
    } else if (ev.type === "content_block_start") {
      const b = obj(ev.content_block);
      if (b.type === "text") c.content += str(b.text);
      if (b.type === "tool_use") {
        const call = { id: str(b.id), name: str(b.name), arguments: "" };
        c.tools.push(call);
        toolOfBlock.set(num(ev.index), call);
      }
    } else if (ev.type === "content_block_delta") {
      const d = obj(ev.delta);
      if (d.type === "text_delta") c.content += str(d.text);
      if (d.type === "input_json_delta") toolOfBlock.get(num(ev.index))!.arguments += str(d.partial_json);
    } else if (ev.type === "message_delta") a.usage = { prompt, completion: num(obj(ev.usage).output_tokens) };
  }
  return a;
}

function decodeGemini(events: WireEvent[]): Answer {
  const a: Answer = { choices: new Map() };
  for (const e of events) {
    const res = JSON.parse(e.data) as Json;
    for (const [position, cand] of ((res.candidates as Json[] | undefined) ?? []).entries()) {
      const c = choiceOf(a, typeof cand.index === "number" ? cand.index : position);
      for (const p of (obj(cand.content).parts as Json[] | undefined) ?? []) {
        if (p.thought) continue;
        c.content += str(p.text);
        if (p.functionCall) c.tools.push({ id: "", name: str(obj(p.functionCall).name), arguments: JSON.stringify(obj(p.functionCall).args) });
      }
    }
    const u = obj(res.usageMetadata);
    if (res.usageMetadata) a.usage = { prompt: num(u.promptTokenCount) + num(u.toolUsePromptTokenCount), completion: num(u.candidatesTokenCount) + num(u.thoughtsTokenCount) };
  }
  return a;
}

function decodeBedrock(events: WireEvent[]): Answer {
  const a: Answer = { choices: new Map() };
  const c = choiceOf(a, 0);
  const toolOfBlock = new Map<number, ToolCall>();
  for (const e of events) {
    const p = JSON.parse(e.data) as Json;
    const start = obj(obj(p.start).toolUse);
    if (start.name) {
      const call = { id: str(start.toolUseId), name: str(start.name), arguments: "" };
      c.tools.push(call);
      toolOfBlock.set(num(p.contentBlockIndex), call);
    }
    const d = obj(p.delta);
    c.content += str(d.text);
    if (d.toolUse) toolOfBlock.get(num(p.contentBlockIndex))!.arguments += str(obj(d.toolUse).input);
    if (p.usage) {
      const u = obj(p.usage);
      a.usage = { prompt: num(u.inputTokens) + num(u.cacheReadInputTokens) + num(u.cacheWriteInputTokens), completion: num(u.outputTokens) };
    }
  }
  return a;
}

function decodeCohere(events: WireEvent[]): Answer {
  const a: Answer = { choices: new Map() };
  const c = choiceOf(a, 0);
  for (const e of events) {
    const ev = JSON.parse(e.data) as Json;
    const m = obj(obj(ev.delta).message);
    if (ev.type === "content-delta" || ev.type === "content-start") c.content += str(obj(m.content).text);
    if (ev.type === "tool-plan-delta") c.content += str(m.tool_plan);
    if (ev.type === "tool-call-start") {
      const t = obj(m.tool_calls);
      c.tools.push({ id: str(t.id), name: str(obj(t.function).name), arguments: str(obj(t.function).arguments) });
    }
    if (ev.type === "tool-call-delta") c.tools.at(-1)!.arguments += str(obj(obj(m.tool_calls).function).arguments);
    if (ev.type === "message-end") {
      const billed = obj(obj(obj(ev.delta).usage).billed_units);
      a.usage = { prompt: num(billed.input_tokens), completion: num(billed.output_tokens) };
    }
  }
  return a;
}

function decodeOllama(events: WireEvent[]): Answer {
  const a: Answer = { choices: new Map() };
  const c = choiceOf(a, 0);
  for (const e of events) {
    const line = JSON.parse(e.data) as Json;
    const m = obj(line.message);
    c.content += str(m.content);
    for (const t of (m.tool_calls as Json[] | undefined) ?? []) c.tools.push({ id: "", name: str(obj(t.function).name), arguments: JSON.stringify(obj(t.function).arguments) });
    if (line.done === true) a.usage = { prompt: num(line.prompt_eval_count), completion: num(line.eval_count) };
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// Providers

interface Provider {
  /** The model group. */
  model: string;
  framing: Framing;
  /** Tool calls in its mock and adapter; `forceTool`: tool_choice "required" is translated (else the prompt's "weather" asks for one). */
  tools: boolean;
  forceTool: boolean;
  /** The most `n` its mock and adapter give. */
  maxChoices: number;
  /** Whether a tool call's id comes from upstream (else the gateway makes one up). */
  upstreamToolIds: boolean;
  decode(events: WireEvent[]): Answer;
  /** Queues a wire fault for its next stream. */
  shape(shaper: WireShaper): void;
  /** The provider's own error event, sent mid-stream. */
  errorEvent: Uint8Array;
  /** Whether this event is the upstream's end of answer (or its usage, after which the answer is whole). */
  ends(data: string): boolean;
  /** An empty delta to splice in after `after` (undefined when none fits there). */
  emptyDelta(after: WireEvent, first: WireEvent): Uint8Array | undefined;
}

const sse = (data: string, event?: string, nl = "\n") => enc.encode(`${event ? `event: ${event}${nl}` : ""}data: ${data}${nl}${nl}`);

/** OpenAI's end of answer: `[DONE]`, the usage chunk, or a chunk with a finish reason (servers that send neither of the others). */
const openAIEnds = (data: string) => data === "[DONE]" || data.includes('"usage":{') || /"finish_reason":\s*"/.test(data);

function openAIEmptyDelta(after: WireEvent, first: WireEvent): Uint8Array | undefined {
  if (!after.data.includes('"delta":{"content":')) return undefined;
  const head = JSON.parse(first.data.includes('"object":""') ? after.data : first.data) as Json;
  const chunk = { id: head.id, object: "chat.completion.chunk", created: head.created, model: head.model, choices: [{ index: 0, delta: { content: "" }, logprobs: null, finish_reason: null }] };
  return sse(JSON.stringify(chunk));
}

let started: StartedProviderMocks;
let mocks: ProviderMocks;
let gw: TestGateway;
let client: OpenAI;
let providers: Provider[] = [];

function buildProviders(): Provider[] {
  const m = mocks;
  const geminiStream = (model: string): Provider => ({
    model,
    framing: "sse",
    tools: true,
    forceTool: true,
    maxChoices: 3,
    upstreamToolIds: false,
    decode: decodeGemini,
    ends: (data) => data.includes('"finishReason"'),
    shape: (shape) => m.gemini.fault({ kind: "wire", shape, path: ":streamGenerateContent" }),
    errorEvent: sse(JSON.stringify({ error: { code: 503, message: "The model is overloaded. Please try again later.", status: "UNAVAILABLE" } }), undefined, "\r\n"),
    emptyDelta: (after) =>
      after.data.includes('"text":') && !after.data.includes('"finishReason"') ? sse(JSON.stringify({ candidates: [{ content: { parts: [{ text: "" }], role: "model" }, index: 0 }] }), undefined, "\r\n") : undefined,
  });
  return [
    {
      model: "openai",
      framing: "sse",
      tools: true,
      forceTool: true,
      maxChoices: 3,
      upstreamToolIds: true,
      decode: decodeOpenAI,
      ends: openAIEnds,
      shape: (shape) => m.openai.fault({ kind: "wire", shape }),
      errorEvent: sse(JSON.stringify({ error: { message: "The server had an error while processing your request. Sorry about that!", type: "server_error", param: null, code: null } })),
      emptyDelta: openAIEmptyDelta,
    },
    {
      model: "azure",
      framing: "sse",
      tools: true,
      forceTool: true,
      maxChoices: 1,
      upstreamToolIds: true,
      decode: decodeOpenAI,
      ends: openAIEnds,
      shape: (shape) => m.azure.fault({ kind: "wire", shape }),
      errorEvent: sse(JSON.stringify({ error: { message: "The server had an error while processing your request.", type: "server_error", param: null, code: null } })),
      emptyDelta: openAIEmptyDelta,
    },
    {
      model: "anthropic",
      framing: "sse",
      tools: true,
      forceTool: true,
      maxChoices: 1,
      upstreamToolIds: true,
      decode: decodeAnthropic,
      ends: (data) => /^\{"type":"message_(delta|stop)"/.test(data),
      shape: (shape) => m.anthropic.fault({ kind: "wire", shape }),
      errorEvent: sse(JSON.stringify({ type: "error", error: { type: "overloaded_error", message: "Overloaded" } }), "error"),
      emptyDelta: (after) => {
        const ev = JSON.parse(after.data) as Json;
        if (ev.type !== "content_block_delta" || obj(ev.delta).type !== "text_delta") return undefined;
        return sse(JSON.stringify({ type: "content_block_delta", index: ev.index, delta: { type: "text_delta", text: "" } }), "content_block_delta");
      },
    },
    geminiStream("gemini"),
    geminiStream("vertex-gemini"),
    {
      model: "vertex-claude",
      framing: "sse",
      tools: true,
      forceTool: true,
      maxChoices: 1,
      upstreamToolIds: true,
      decode: decodeAnthropic,
      ends: (data) => /^\{"type":"message_(delta|stop)"/.test(data),
      shape: (shape) => m.gemini.fault({ kind: "wire", shape, path: ":streamRawPredict" }),
      errorEvent: sse(JSON.stringify({ type: "error", error: { type: "api_error", message: "Internal server error" } }), "error"),
      emptyDelta: () => undefined,
    },
    {
      model: "bedrock",
      framing: "eventstream",
      tools: true,
      forceTool: true,
      maxChoices: 1,
      upstreamToolIds: true,
      decode: decodeBedrock,
      ends: (data) => "stopReason" in (JSON.parse(data) as Json),
      shape: (shape) => m.bedrock.fault({ kind: "wire", shape, action: "converse-stream" }),
      errorEvent: exceptionFrame("modelStreamErrorException", "The model stream failed ✗"),
      emptyDelta: (after) => {
        const p = JSON.parse(after.data) as Json;
        return typeof obj(p.delta).text === "string" ? eventFrame("contentBlockDelta", { contentBlockIndex: p.contentBlockIndex, delta: { text: "" } }) : undefined;
      },
    },
    {
      model: "cohere",
      framing: "sse",
      tools: true,
      forceTool: true,
      maxChoices: 1,
      upstreamToolIds: true,
      decode: decodeCohere,
      ends: (data) => (JSON.parse(data) as Json).type === "message-end",
      shape: (shape) => m.cohere.fault({ kind: "wire", shape }),
      errorEvent: sse(JSON.stringify({ type: "message-end", delta: { error: "internal error while generating ✗" } }), "message-end"),
      emptyDelta: (after) =>
        after.data.includes('"type":"content-delta"') ? sse(JSON.stringify({ type: "content-delta", index: 0, delta: { message: { content: { text: "" } } } }), "content-delta") : undefined,
    },
    {
      model: "ollama",
      framing: "ndjson",
      tools: true,
      forceTool: false,
      maxChoices: 1,
      upstreamToolIds: false,
      decode: decodeOllama,
      ends: (data) => (JSON.parse(data) as Json).done === true,
      shape: (shape) => m.ollama.fault({ kind: "wire", shape }),
      errorEvent: enc.encode(`${JSON.stringify({ error: "model runner has unexpectedly stopped ✗" })}\n`),
      emptyDelta: (after) => {
        const line = JSON.parse(after.data) as Json;
        return line.done === false ? enc.encode(`${JSON.stringify({ model: line.model, created_at: line.created_at, message: { role: "assistant", content: "" }, done: false })}\n`) : undefined;
      },
    },
  ];
}

// ---------------------------------------------------------------------------------------------
// Cutting the wire

/** Offsets worth cutting at: inside multi-byte characters, after every CR, inside frame preludes and headers, anywhere. */
function cutPoints(rng: Random, bytes: Uint8Array, events: WireEvent[], framing: Framing): number[] {
  const inChar: number[] = [];
  const afterCR: number[] = [];
  for (let i = 1; i < bytes.length; i++) {
    if ((bytes[i]! & 0xc0) === 0x80) inChar.push(i);
    if (bytes[i - 1] === 0x0d) afterCR.push(i);
  }
  const inFrame = framing === "eventstream" ? events.flatMap((e) => [e.start + 1 + rng.int(11), e.start + 12 + rng.int(40)]) : [];
  const cuts: number[] = [];
  const budget = 10 + rng.int(40);
  for (let k = 0; k < budget; k++) {
    const pool = rng.pick([inChar, afterCR, inFrame, [], events.map((e) => e.end)]);
    cuts.push(pool.length > 0 && rng.chance(0.8) ? rng.pick(pool) : 1 + rng.int(Math.max(1, bytes.length - 1)));
  }
  // Now and then, one stretch a byte at a time.
  if (rng.chance(0.3)) {
    const from = rng.int(bytes.length);
    for (let i = from; i < Math.min(bytes.length, from + 24); i++) cuts.push(i);
  }
  return cuts;
}

/** Splices an empty delta after some events (where the provider has one that fits). */
function withEmptyDeltas(rng: Random, p: Provider, bytes: Uint8Array, events: WireEvent[]): Uint8Array {
  if (events.length === 0) return bytes;
  const pieces: Uint8Array[] = [];
  let at = 0;
  for (const e of events) {
    const extra = rng.chance(0.25) ? p.emptyDelta(e, events[0]!) : undefined;
    if (!extra) continue;
    pieces.push(bytes.subarray(at, e.end), extra);
    at = e.end;
  }
  pieces.push(bytes.subarray(at));
  const out = new Uint8Array(pieces.reduce((n, x) => n + x.length, 0));
  let o = 0;
  for (const x of pieces) {
    out.set(x, o);
    o += x.length;
  }
  return out;
}

/** The line end a text stream uses (its first one). */
function eol(bytes: Uint8Array): string {
  const i = bytes.findIndex((b) => b === 0x0a || b === 0x0d);
  return i < 0 ? "\n" : bytes[i] === 0x0a ? "\n" : bytes[i + 1] === 0x0a ? "\r\n" : "\r";
}

/**
 * Text framings with other, equally valid, line ends and extras: SSE with CRLF or CR line ends,
 * comment lines between events and `data:` without its space; NDJSON with CRLF. `keep` forces a
 * line end (the one the stream already uses).
 */
function relined(rng: Random, framing: Framing, bytes: Uint8Array, keep?: string): Uint8Array {
  if (framing === "eventstream") return bytes;
  const nl = keep ?? (framing === "ndjson" ? rng.pick(["\n", "\r\n"]) : rng.pick(["\n", "\r\n", "\r", eol(bytes)]));
  let text = dec.decode(bytes).replace(/\r\n|\r|\n/g, nl);
  if (framing === "sse" && keep === undefined) {
    if (rng.chance(0.3)) text = text.replaceAll(`${nl}data: `, `${nl}data:`).replace(/^data: /, "data:");
    if (rng.chance(0.3)) text = text.replaceAll(`${nl}${nl}`, `${nl}${nl}: keep-alive ${nl}${nl}`);
  }
  return enc.encode(text);
}

function concatBytes(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

type Fault = "reset" | "close" | "errorEvent" | "stall";

interface Wire {
  /** The bytes the mock sent (after splices), filled in when the mock renders. */
  sent?: Uint8Array;
  /** Whether the mock saw its client leave. */
  cancelled: boolean;
  /** Where a fault struck (byte offset), for messages. */
  faultAt?: number;
}

/** Queues the next stream's shape on `p`'s mock: random cuts, empty deltas, and the fault if any. */
function shapeNext(rng: Random, p: Provider, fault?: Fault | "leave"): Wire {
  const wire: Wire = { cancelled: false };
  // The decisions are drawn now, so a seed replays the same plan whatever the timing.
  const draws = Array.from({ length: 256 }, () => rng.next());
  p.shape((rendered): WireShape => {
    const local = new Random(Math.floor(draws[0]! * 2 ** 32));
    const events = wireEvents(rendered, p.framing);
    let bytes = relined(local, p.framing, withEmptyDeltas(local, p, rendered, events));
    let all = wireEvents(bytes, p.framing);
    let end: WireShape["end"];
    if (fault === "reset" || fault === "stall") {
      const at = 1 + local.int(bytes.length - 1);
      end = { at, how: fault };
      wire.faultAt = at;
    } else if (fault === "close") {
      // A clean end before the event that completes the answer (inside an event or between two).
      const last = all.find((e) => p.ends(e.data))!.start;
      const at = 1 + local.int(Math.max(1, last - 1));
      end = { at, how: "close" };
      wire.faultAt = at;
    } else if (fault === "errorEvent") {
      // After 1 to n-1 events (never the whole answer): the upstream's own error event, then its end.
      const k = 1 + local.int(Math.max(1, all.length - 2));
      bytes = relined(local, p.framing, concatBytes(bytes.slice(0, all[k - 1]!.end), p.errorEvent), eol(bytes));
      wire.faultAt = all[k - 1]!.end;
      all = wireEvents(bytes, p.framing);
    } else if (fault === "leave") {
      // The client leaves while the upstream still has more to say (it stalls at a random byte, and never ends on its own).
      end = { at: all[0]!.end + local.int(Math.max(1, bytes.length - all[0]!.end)), how: "stall" };
    }
    wire.sent = bytes;
    return { bytes, cuts: cutPoints(local, bytes, all, p.framing), end, onCancel: () => (wire.cancelled = true) };
  });
  return wire;
}

// ---------------------------------------------------------------------------------------------
// The client's side

interface ClientChunk {
  id?: string;
  choices?: { index: number; delta?: Json; finish_reason?: string | null }[];
  usage?: Json | null;
  error?: Json;
}

interface Received {
  chunks: ClientChunk[];
  answer: Answer;
  /** The usage of the last chunk, when it carries one. */
  finalUsage?: { prompt: number; completion: number; total: number };
  error?: Json;
  done: boolean;
  callId: string;
  /** The HTTP status, when it was not 200: the stream failed before it began (its error is the JSON body's). */
  status?: number;
}

function assembleClient(chunks: ClientChunk[]): Answer {
  const a: Answer = { choices: new Map() };
  for (const ch of chunks) for (const choice of ch.choices ?? []) addDelta(choiceOf(a, choice.index), obj(choice.delta));
  return a;
}

function finalUsageOf(chunks: ClientChunk[]): Received["finalUsage"] {
  const u = chunks.at(-1)?.usage;
  return u ? { prompt: num(u.prompt_tokens), completion: num(u.completion_tokens), total: num(u.total_tokens) } : undefined;
}

/**
 * Raw SSE text → its events; throws when it is not `data: <one line>\n\n` events (JSON, then
 * `[DONE]` or an error last), with at most one `: …\n\n` comment first (sent while the model is slow
 * to its first event).
 */
function parseSseText(text: string): { chunks: ClientChunk[]; error?: Json; done: boolean } {
  const chunks: ClientChunk[] = [];
  let error: Json | undefined;
  let done = false;
  let rest = text.replace(/^: [^\n]*\n\n/, "");
  while (rest.length > 0) {
    const m = /^data: ([^\n]*)\n\n/.exec(rest);
    if (!m) throw new Error(`malformed SSE at ${JSON.stringify(rest.slice(0, 80))}`);
    rest = rest.slice(m[0].length);
    if (done || error) throw new Error(`an event after ${done ? "[DONE]" : "the error"}: ${m[1]}`);
    if (m[1] === "[DONE]") {
      done = true;
      continue;
    }
    const parsed = JSON.parse(m[1]!) as ClientChunk;
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error(`an event that is not an object: ${m[1]}`);
    if (parsed.error) error = parsed.error;
    else chunks.push(parsed);
  }
  return { chunks, error, done };
}

async function rawStream(body: Json, leaveAfter?: { bytes: number }): Promise<Received & { text: string; left: boolean }> {
  const ac = new AbortController();
  const quiet = () => Bun.sleep(QUIET_MS).then(() => undefined);
  const asked = fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ ...body, stream: true }),
    signal: ac.signal,
  });
  // A client that means to leave does so after `bytes`, or once the stream has gone quiet (well
  // before the deployment's timeout would end it), headers received or not.
  const leave = (text: string) => {
    asked.catch(() => undefined);
    ac.abort();
    return { text, left: true, chunks: [], answer: { choices: new Map() }, done: false, callId: "" };
  };
  const res = leaveAfter ? await Promise.race([asked, quiet()]) : await asked;
  if (res === undefined) return leave("");
  const callId = res.headers.get("x-svc-call-id") ?? "";
  if (res.status !== 200) {
    const text = await res.text();
    const error = (JSON.parse(text) as { error?: Json }).error;
    return { chunks: [], answer: { choices: new Map() }, error, done: false, callId, status: res.status, text, left: false };
  }
  const reader = res.body!.getReader();
  const d = new TextDecoder();
  let text = "";
  for (;;) {
    const next = reader.read();
    const r = leaveAfter ? await Promise.race([next, quiet()]) : await next;
    if (r === undefined || (leaveAfter && !r.done && text.length + r.value.length >= leaveAfter.bytes)) {
      next.catch(() => undefined);
      return { ...leave(text), callId };
    }
    if (r.done) break;
    text += d.decode(r.value, { stream: true });
  }
  text += d.decode();
  const parsed = parseSseText(text);
  return { ...parsed, text, left: false, answer: assembleClient(parsed.chunks), finalUsage: finalUsageOf(parsed.chunks), callId };
}

async function sdkStream(body: Json): Promise<Received> {
  const params = { ...body, stream: true } as unknown as OpenAI.ChatCompletionCreateParamsStreaming;
  const { data, response } = await client.chat.completions.create(params).withResponse();
  const chunks: ClientChunk[] = [];
  for await (const chunk of data) chunks.push(chunk as unknown as ClientChunk);
  return { chunks, answer: assembleClient(chunks), finalUsage: finalUsageOf(chunks), done: true, callId: response.headers.get("x-svc-call-id") ?? "" };
}

// ---------------------------------------------------------------------------------------------
// Expectations

/** The answer without tool-call ids the gateway makes up, and with arguments as parsed JSON where the upstream sends objects. */
function comparable(a: Answer, p: Provider): unknown {
  return [...a.choices.entries()]
    .sort(([x], [y]) => x - y)
    .map(([index, c]) => ({
      index,
      content: c.content,
      tools: c.tools.map((t) => ({ id: p.upstreamToolIds ? t.id : "(made up)", name: t.name, arguments: p.upstreamToolIds ? t.arguments : JSON.parse(t.arguments) })),
    }));
}

function expectSameAnswer(got: Answer, want: Answer, p: Provider, what: string) {
  expect(comparable(got, p), `${p.model}: ${what} ${seedNote}`).toEqual(comparable(want, p));
  for (const c of got.choices.values()) for (const t of c.tools) expect(() => JSON.parse(t.arguments), `${p.model}: tool arguments are JSON ${seedNote}`).not.toThrow();
}

interface LogRow {
  call_id: string;
  status: string;
  stream: boolean;
  spend: number;
  prompt_tokens: number;
  completion_tokens: number;
  model_group: string;
}

const picoOf = (usd: number) => BigInt(Math.round(usd * 1e12));
const priced = (prompt: number, completion: number) => BigInt(prompt) * IN_PICO + BigInt(completion) * OUT_PICO;

interface Logged {
  callId: string;
  what: string;
  status: "success" | "failure" | "cancelled";
  usage?: { prompt: number; completion: number };
  /** False for the non-stream twin; its x-svc-response-cost (USD) must match the row. */
  stream?: false;
  costHeader?: string;
  /** A failure after the answer began: charged for what it streamed, as a cancelled stream is. */
  charged?: boolean;
}

/** Call ids of rows already checked (by earlier tests). */
const seenCallIds = new Set<string>();

async function expectLogged(p: Provider, calls: Logged[]) {
  let rowsById = new Map<string, LogRow>();
  const found = await until(async () => {
    await gw.host!.spendWriter.flush();
    const r = await requestJson<LogRow[]>(gw, "GET", "/spend/logs?summarize=false&limit=100");
    rowsById = new Map(r.body.map((row) => [row.call_id, row]));
    // A client that left before the headers never saw its call id: its row is the group's one row no other call claims.
    const known = new Set(calls.map((c) => c.callId));
    const unclaimed = r.body.filter((row) => row.model_group === p.model && !known.has(row.call_id) && !seenCallIds.has(row.call_id));
    const anonymous = calls.filter((c) => c.callId === "");
    if (anonymous.length > 0 && unclaimed.length === anonymous.length) for (const [i, c] of anonymous.entries()) c.callId = unclaimed[i]!.call_id;
    return calls.every((c) => rowsById.has(c.callId));
  }, 6000);
  for (const c of calls) seenCallIds.add(c.callId);
  const missing = found ? [] : calls.filter((c) => !rowsById.has(c.callId)).map((c) => c.what);
  const groupRows = [...rowsById.values()].filter((row) => row.model_group === p.model).map((row) => `${row.call_id} ${row.status}`);
  expect(missing, `${p.model}: calls missing from /spend/logs ${seedNote}; the group's rows:\n${groupRows.join("\n")}`).toEqual([]);
  for (const c of calls) {
    seenCallIds.add(c.callId);
    const row = rowsById.get(c.callId)!;
    const what = `${p.model}: log row of ${c.what} ${seedNote}`;
    expect({ status: row.status, stream: row.stream, model_group: row.model_group }, what).toEqual({ status: c.status, stream: c.stream ?? true, model_group: p.model });
    if (c.costHeader !== undefined) expect(picoOf(Number(row.spend)), `${what}: the cost header`).toBe(picoOf(Number(c.costHeader)));
    if (c.usage) expect({ prompt: row.prompt_tokens, completion: row.completion_tokens }, what).toEqual(c.usage);
    const want = c.status === "failure" && !c.charged ? 0n : priced(row.prompt_tokens, row.completion_tokens);
    expect(picoOf(Number(row.spend)), `${what}: spend ${row.spend}`).toBe(want);
    if (c.status === "cancelled") expect(row.prompt_tokens, `${what}: a cancelled stream is charged for its prompt`).toBeGreaterThan(0);
  }
}

// ---------------------------------------------------------------------------------------------
// Setup

beforeAll(async () => {
  started = await startProviderMocks({ serviceAccount: "stream-diff@acme.iam.gserviceaccount.com" });
  mocks = started.mocks;
  gw = await startTestGateway({ model_list: providerDeployments(started, PRICES, { timeout: TIMEOUT_S }), general_settings: { master_key: MASTER_KEY } }, { store: {} });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
  providers = buildProviders();
}, 30_000);

afterAll(async () => {
  await gw?.stop();
  await started?.stop();
});

// ---------------------------------------------------------------------------------------------
// The rounds

const PROVIDER_NAMES = ["openai", "azure", "anthropic", "gemini", "vertex-gemini", "vertex-claude", "bedrock", "cohere", "ollama"];

describe(`streams through every provider, random answers and wire cuts ${seedNote}`, () => {
  for (const [pi, name] of PROVIDER_NAMES.entries()) {
    test(name, async () => {
      const p = providers.find((x) => x.model === name)!;
      const rng = new Random(SEED * 31 + pi);
      const logged: Logged[] = [];

      for (let round = 0; round < ROUNDS; round++) {
        const prompt = words(rng);
        const useTool = p.tools && rng.chance(0.35);
        const n = p.maxChoices > 1 && rng.chance(0.4) ? 2 + rng.int(p.maxChoices - 1) : undefined;
        const includeUsage = rng.chance(0.75);
        const body: Json = { model: p.model, messages: [{ role: "user", content: useTool ? `${prompt.join(" ")} weather` : prompt.join(" ") }] };
        if (useTool) {
          body.tools = Array.from({ length: 1 + rng.int(2) }, (_, i) => randomTool(rng, i));
          if (p.forceTool) body.tool_choice = "required";
        }
        if (n) body.n = n;
        const streamBody = includeUsage ? { ...body, stream_options: { include_usage: true } } : body;
        const what = `round ${round} (${JSON.stringify(body).slice(0, 300)})`;

        const wire = shapeNext(rng, p);
        const viaSdk = rng.chance(0.5);
        const got = viaSdk ? await sdkStream(streamBody) : await rawStream(streamBody);
        expect(wire.sent, `${p.model}: the mock streamed ${seedNote}`).toBeDefined();
        const want = p.decode(wireEvents(wire.sent!, p.framing));
        expect(got.error, `${p.model}: ${what}: no error event ${seedNote}`).toBeUndefined();
        expect(got.done, `${p.model}: ${what}: ends with [DONE] ${seedNote}`).toBe(true);
        expectSameAnswer(got.answer, want, p, `${what} via ${viaSdk ? "the SDK" : "raw SSE"}: the answer the upstream sent`);
        if (!useTool) {
          for (const c of got.answer.choices.values()) expect(c.content, `${p.model}: ${what}: the mock's echo ${seedNote}`).toBe(`Mock reply to: ${prompt.join(" ")}`);
        }
        expect(want.usage, `${p.model}: the upstream sent its usage ${seedNote}`).toBeDefined();
        if (includeUsage) {
          expect(got.finalUsage, `${p.model}: ${what}: the last chunk's usage ${seedNote}`).toEqual({ prompt: want.usage!.prompt, completion: want.usage!.completion, total: want.usage!.prompt + want.usage!.completion });
        } else {
          expect(got.chunks.some((c) => c.usage), `${p.model}: ${what}: no usage unless asked ${seedNote}`).toBe(false);
        }
        logged.push({ callId: got.callId, what: `${what}, stream`, status: "success", usage: want.usage });

        // The same request without stream: same answer and usage.
        const { data: whole, response } = await client.chat.completions.create(body as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming).withResponse();
        const wholeAnswer: Answer = { choices: new Map() };
        for (const ch of whole.choices) {
          const tools = (ch.message.tool_calls ?? []).map((t) => ({ id: t.id, name: t.type === "function" ? t.function.name : "", arguments: t.type === "function" ? t.function.arguments : "" }));
          wholeAnswer.choices.set(ch.index, { content: ch.message.content ?? "", tools });
        }
        const sameShape = (a: Answer) =>
          [...a.choices.entries()].sort(([x], [y]) => x - y).map(([index, c]) => ({ index, content: c.content, tools: c.tools.map((t) => ({ name: t.name, arguments: JSON.parse(t.arguments) })) }));
        expect(sameShape(wholeAnswer), `${p.model}: ${what}: the same answer without stream ${seedNote}`).toEqual(sameShape(got.answer));
        expect({ prompt: whole.usage?.prompt_tokens, completion: whole.usage?.completion_tokens }, `${p.model}: ${what}: the same usage without stream ${seedNote}`).toEqual(want.usage!);
        const costHeader = response.headers.get("x-svc-response-cost") ?? "";
        expect(costHeader, `${p.model}: the non-stream cost header ${seedNote}`).toBeTruthy();
        logged.push({ callId: response.headers.get("x-svc-call-id") ?? "", what: `${what}, without stream`, status: "success", usage: want.usage, stream: false, costHeader });
      }

      // A fault mid-stream.
      const fault = rng.pick(["reset", "close", "errorEvent", "stall"] as const);
      const faultBody = { model: p.model, messages: [{ role: "user", content: words(rng).join(" ") }], stream_options: { include_usage: true } };
      const wire = shapeNext(rng, p, fault);
      const started = Date.now();
      const got = await rawStream(faultBody);
      const what = `fault ${fault} at byte ${wire.faultAt} of ${wire.sent?.length}`;
      const events = wireEvents(wire.sent!, p.framing);
      expect(got.done, `${p.model}: ${what}: no [DONE] after a failure ${seedNote}\n${got.text}`).toBe(false);
      expect(got.error, `${p.model}: ${what}: the stream ends with an error event ${seedNote}\n${got.text}`).toBeDefined();
      const e = got.error!;
      expect(Object.keys(e).sort(), `${p.model}: ${what}: the error envelope ${seedNote}`).toEqual(["code", "message", "param", "type"]);
      expect(typeof e.message === "string" && typeof e.type === "string" && /^[1-5]\d\d$/.test(String(e.code)), `${p.model}: ${what}: error fields ${JSON.stringify(e)} ${seedNote}`).toBe(true);
      if (fault === "stall") {
        expect(e.code, `${p.model}: ${what}: a stall is a 408 ${seedNote}`).toBe("408");
        expect(Date.now() - started, `${p.model}: ${what}: not before the timeout ${seedNote}`).toBeGreaterThanOrEqual(TIMEOUT_S * 1000 - 100);
        expect(await until(async () => wire.cancelled, 2000), `${p.model}: ${what}: the stalled upstream request is closed ${seedNote}`).toBe(true);
      }
      if (fault === "reset" || fault === "close") expect(e.code, `${p.model}: ${what}: an upstream that stops mid-answer is a 503 ${seedNote}`).toBe("503");
      // What the client got before the error is a prefix of the upstream's answer.
      const before = p.decode(events.filter((ev) => ev.end <= (wire.faultAt ?? 0)));
      const said = [...before.choices.values()].some((c) => c.content !== "" || c.tools.length > 0);
      if (got.status !== undefined) {
        // A fault before the upstream said anything (no event, or only those opening the message)
        // fails the call before the stream begins: the error's status, its body the envelope.
        expect(String(got.status), `${p.model}: ${what}: the status is the error's code ${seedNote}`).toBe(String(e.code));
        expect(said, `${p.model}: ${what}: answered ${got.status} though the upstream had answered before the fault ${seedNote}`).toBe(false);
      }
      for (const [index, c] of got.answer.choices) {
        const full = before.choices.get(index)?.content ?? "";
        expect(full.startsWith(c.content) || c.content.startsWith(full), `${p.model}: ${what}: choice ${index} is a prefix of the upstream's ${seedNote}`).toBe(true);
      }
      logged.push({ callId: got.callId, what, status: "failure", charged: said });

      // The client leaves at a random point; the upstream stalls after a random byte, so it is still open.
      const leaveWire = shapeNext(rng, p, "leave");
      const leaveBody = { model: p.model, messages: [{ role: "user", content: words(rng).join(" ") }], stream_options: { include_usage: true } };
      const left = await rawStream(leaveBody, { bytes: 1 + rng.int(400) });
      expect(left.left, `${p.model}: the client left mid-stream ${seedNote}\n${left.text}`).toBe(true);
      expect(await until(async () => leaveWire.cancelled, 3000), `${p.model}: the upstream request is aborted when the client leaves ${seedNote}`).toBe(true);
      logged.push({ callId: left.callId, what: "a client that left", status: "cancelled" });

      // Still serving, and every call logged with its cost.
      const after = await sdkStream({ model: p.model, messages: [{ role: "user", content: "still there?" }] });
      expect(after.answer.choices.get(0)?.content, `${p.model}: the gateway still serves ${seedNote}`).toBe("Mock reply to: still there?");
      logged.push({ callId: after.callId, what: "the call after the faults", status: "success" });
      await expectLogged(p, logged);
    }, 20_000);
  }
});
