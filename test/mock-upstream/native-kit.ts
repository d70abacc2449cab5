/**
 * What the native-provider mocks (Azure, Cohere, Ollama) share: a Bun server that records
 * requests, applies one-shot faults (status, delay, hang, cut stream), delivers JSON or streamed
 * parts, and deterministic reply text, tool arguments and embeddings. Each mock supplies its
 * routes and its provider's error body.
 */
import type { Server } from "bun";
import { type RecordedPart, rawParts } from "./multipart.ts";
import { mockEmbedding } from "./openai.ts";
import { renderedText, shapedStream, type WireShaper } from "./wire-shape.ts";

export { mockEmbedding };

export type JsonObject = Record<string, unknown>;

export const isObject = (v: unknown): v is JsonObject => typeof v === "object" && v !== null && !Array.isArray(v);

/** One misbehaviour, applied to the next request on `path` (or any path), first in first out. */
export type Fault = { path?: string } & (
  | { kind: "status"; status: number; body?: string | object; headers?: Record<string, string> }
  | { kind: "delay"; ms: number }
  | { kind: "hang" }
  /** Send this many stream parts (a JSON body: half of it), then reset the connection. */
  | { kind: "cutStream"; afterParts: number }
  /** A stream's bytes cut, replaced or ended as the shaper says (wire-shape.ts); a JSON answer is sent as usual. */
  | { kind: "wire"; shape: WireShaper }
  /** 200 with this JSON body instead of the route's answer, once the request passed the mock's checks (a test's own answer). */
  | { kind: "answer"; body: unknown }
);

export interface RecordedRequest {
  method: string;
  /** Path with its query string. */
  path: string;
  /** Header names lower-cased. */
  headers: Record<string, string>;
  /** Parsed JSON; the raw text when not JSON (form bodies); undefined when empty. A multipart upload: its fields, each file as `{filename, size, type}`. */
  body: unknown;
  /** A multipart upload's parts as they came on the wire, in order. */
  parts?: RecordedPart[];
}

export type Reply =
  | { kind: "json"; body: unknown; status?: number; headers?: Record<string, string> }
  | { kind: "stream"; contentType: string; parts: string[]; headers?: Record<string, string> };

export interface MockServer {
  /** `http://127.0.0.1:<port>`: the provider's `api_base`. */
  readonly url: string;
  readonly port: number;
  readonly requests: RecordedRequest[];
  /** Streams whose client left before the last part. */
  readonly streamsCancelled: number;
  fault(...faults: Fault[]): void;
  /** Clears requests, faults and counters. */
  reset(): void;
  stop(): Promise<void>;
}

export interface MockSpec {
  /** The provider's error body for a status fault that gives none. */
  errorBody(status: number): unknown;
  /** Headers every answer carries (request ids). */
  headers?(): Record<string, string>;
  route(req: Request, url: URL, body: unknown): Reply | Response | Promise<Reply | Response>;
  /** Default true. */
  record?: boolean;
}

// Long enough for the client to read what was sent before the reset (a reset drops unread data).
const CUT_FLUSH_MS = 10;
const encoder = new TextEncoder();

function partStream(parts: string[], cutAfter: number | undefined, counters: { streamsCancelled: number }): ReadableStream<Uint8Array> {
  let sent = 0;
  let over = false;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (cutAfter !== undefined && sent >= cutAfter) {
          over = true;
          await Bun.sleep(CUT_FLUSH_MS);
          // Erroring with undefined makes Bun reset the socket: no final chunk, like a dropped upstream.
          controller.error(undefined);
          return;
        }
        controller.enqueue(encoder.encode(parts[sent] ?? ""));
        sent++;
        if (sent >= parts.length && cutAfter === undefined) {
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

function deliver(reply: Reply, fault: Fault | undefined, counters: { streamsCancelled: number }): Response {
  const cut = fault?.kind === "cutStream" ? fault.afterParts : undefined;
  if (reply.kind === "stream") {
    if (fault?.kind === "wire") return new Response(shapedStream(renderedText(reply.parts), fault.shape), { headers: { "content-type": reply.contentType, ...reply.headers } });
    return new Response(partStream(reply.parts, cut, counters), { headers: { "content-type": reply.contentType, ...reply.headers } });
  }
  const text = JSON.stringify(reply.body);
  const headers = { "content-type": "application/json", ...reply.headers };
  if (cut !== undefined) return new Response(partStream([text.slice(0, Math.floor(text.length / 2))], 1, counters), { status: reply.status ?? 200, headers });
  return new Response(text, { status: reply.status ?? 200, headers });
}

function statusFault(spec: MockSpec, f: Extract<Fault, { kind: "status" }>): Response {
  const body = f.body ?? spec.errorBody(f.status);
  const text = typeof body === "string" ? body : JSON.stringify(body);
  const retry: Record<string, string> = f.status === 429 ? { "retry-after": "1" } : {};
  return new Response(text, { status: f.status, headers: { "content-type": "application/json", ...spec.headers?.(), ...retry, ...f.headers } });
}

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

/** A multipart upload as the routes read it: each field's text, each file as `{filename, size, type}`. */
function formFields(parts: RecordedPart[]): JsonObject {
  const fields: JsonObject = {};
  for (const p of parts) fields[p.name] = p.filename === undefined ? new TextDecoder().decode(p.bytes) : { filename: p.filename, size: p.bytes.length, type: p.contentType };
  return fields;
}

function parseBody(raw: string): unknown {
  if (raw === "") return undefined;
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

export async function startMockServer(spec: MockSpec): Promise<MockServer> {
  const state = { requests: [] as RecordedRequest[], faults: [] as Fault[], streamsCancelled: 0 };
  const server: Server<undefined> = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    idleTimeout: 0,
    async fetch(req) {
      const url = new URL(req.url);
      const contentType = req.headers.get("content-type") ?? "";
      const parts = contentType.startsWith("multipart/form-data") ? rawParts(await req.bytes(), contentType) : undefined;
      const body = parts ? formFields(parts) : parseBody(req.method === "GET" ? "" : await req.text());
      if (spec.record !== false) state.requests.push({ method: req.method, path: url.pathname + url.search, headers: Object.fromEntries(req.headers), body, ...(parts ? { parts } : {}) });
      const at = state.faults.findIndex((f) => f.path === undefined || f.path === url.pathname);
      const fault = at < 0 ? undefined : state.faults.splice(at, 1)[0];
      if (fault?.kind === "status") return statusFault(spec, fault);
      if (fault?.kind === "delay") await Bun.sleep(fault.ms);
      if (fault?.kind === "hang") {
        await untilAborted(req.signal);
        return new Response(null, { status: 499 });
      }
      const reply = await spec.route(req, url, body);
      if (reply instanceof Response) return reply;
      if (fault?.kind === "answer" && reply.kind === "json" && (reply.status ?? 200) === 200) return deliver({ kind: "json", body: fault.body, headers: spec.headers?.() }, undefined, state);
      return deliver({ ...reply, headers: { ...spec.headers?.(), ...reply.headers } }, fault, state);
    },
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
    reset: () => {
      state.requests.length = 0;
      state.faults.length = 0;
      state.streamsCancelled = 0;
    },
    stop: () => server.stop(true),
  };
}

// ---------------------------------------------------------------------------------------------
// Deterministic content

/** A message's text (string content, or its text parts). */
export function messageText(m: unknown): string {
  if (!isObject(m)) return "";
  if (typeof m.content === "string") return m.content;
  if (!Array.isArray(m.content)) return "";
  return m.content.map((p) => (isObject(p) && typeof p.text === "string" ? p.text : "")).join("");
}

export function lastUserText(messages: unknown): string {
  if (!Array.isArray(messages)) return "";
  for (let i = messages.length - 1; i >= 0; i--) if (isObject(messages[i]) && messages[i].role === "user") return messageText(messages[i]);
  return "";
}

/** "Mock reply to: <first words of the prompt>" as token-like pieces, cut at `limit` pieces. */
export function replyPieces(prompt: string, limit?: number): { pieces: string[]; truncated: boolean } {
  const words = ["Mock", "reply", "to:", ...prompt.split(/\s+/).filter(Boolean).slice(0, 12)];
  const pieces = words.map((w, i) => (i === 0 ? w : ` ${w}`));
  if (limit === undefined || pieces.length <= limit) return { pieces, truncated: false };
  return { pieces: pieces.slice(0, limit), truncated: true };
}

export interface MockTool {
  name: string;
  parameters: unknown;
}

/** The first offered tool is called when the prompt mentions the weather (or a call is required). */
export function chosenTool(tools: unknown, prompt: string, required: boolean): MockTool | undefined {
  if (!Array.isArray(tools) || tools.length === 0) return undefined;
  const first = tools[0];
  const fn = isObject(first) && isObject(first.function) ? first.function : undefined;
  if (!fn || typeof fn.name !== "string") return undefined;
  return required || /\bweather\b/i.test(prompt) ? { name: fn.name, parameters: fn.parameters } : undefined;
}

/** Arguments filling every declared property: locations get "Paris", numbers 1, the rest "mock". */
export function mockArguments(parameters: unknown): JsonObject {
  const props = isObject(parameters) && isObject(parameters.properties) ? parameters.properties : {};
  const args: JsonObject = {};
  for (const [key, schema] of Object.entries(props)) {
    const s = isObject(schema) ? schema : {};
    if (Array.isArray(s.enum) && s.enum.length > 0) args[key] = s.enum[0];
    else if (s.type === "number" || s.type === "integer") args[key] = 1;
    else if (s.type === "boolean") args[key] = true;
    else args[key] = /location|city|place/i.test(key) ? "Paris" : "mock";
  }
  return args;
}

/** JSON text in the pieces a tokenizer would stream it in (word runs and punctuation runs). */
export const jsonPieces = (json: string): string[] => json.match(/[A-Za-z0-9]+|[^A-Za-z0-9]+/g) ?? [json];

export const approxTokens = (text: string): number => Math.max(1, Math.ceil(text.length / 4));

export function promptText(messages: unknown): string {
  return Array.isArray(messages) ? messages.map(messageText).join("\n") : "";
}
