// Bad input to every model-call route: each endpoint under its four path forms (`/X`, `/v1/X`,
// `/openai/deployments/:model/X`, `/engines/:model/X`) on the built-in mock provider, chat also
// through the OpenAI, Anthropic and Gemini translations (against their mock upstreams), the
// Gemini-style routes, /utils and model discovery. Bodies that are not JSON or not an object, each field the wire schema names (and the
// gateway-only ones the pipeline reads) set to every awkward value at once in a table (wrong types,
// NUL, lone surrogates, 100k characters, -1, 1e309, 10,000 levels of nesting, 50,000 items), odd path
// parameters and query strings, malformed multipart forms, and credentials in odd shapes. The rule
// checked: bad input gets a 4xx in the error envelope (Google's on the Gemini routes), never a 5xx,
// a crash, a hang or another body; a stream asked for with bad input is refused before it starts;
// and afterwards the gateway still answers and its store still works.
//
// Whether a value must be refused is read from the field's own schema: a value the schema does not
// admit must get a 4xx; one it admits may also be answered (a 2xx) or refused by the logic after it.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Kind, type TSchema } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import {
  ChatRequestSchema,
  CompletionRequestSchema,
  EmbeddingsRequestSchema,
  ImageRequestSchema,
  ModerationRequestSchema,
  SpeechRequestSchema,
} from "../../core/wire.ts";
import { inParallel, refusalError, snippet, withBad } from "../harness/bad-input.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockAnthropic, startMockAnthropic } from "../mock-upstream/anthropic.ts";
import { type MockGemini, startMockGemini } from "../mock-upstream/gemini.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const UPSTREAM_KEY = "sk-upstream-bad-input-0123456789";

/** Chat models whose requests are translated for (or passed as they are to) a real provider's wire format. */
const PROVIDER_CHATS = ["gpt", "claude", "gemini"] as const;

const config = (openai: string, anthropic: string, gemini: string) => ({
  model_list: [
    { model_name: "gpt", svc_params: { model: "openai/gpt-4o", api_base: openai, api_key: UPSTREAM_KEY } },
    { model_name: "claude", svc_params: { model: "anthropic/claude-sonnet-4-20250514", api_base: anthropic, api_key: UPSTREAM_KEY } },
    { model_name: "gemini", svc_params: { model: "gemini/gemini-2.5-flash", api_base: gemini, api_key: UPSTREAM_KEY } },
    { model_name: "chat", svc_params: { model: "mock/chat" } },
    { model_name: "embed", svc_params: { model: "mock/embed" }, model_info: { mode: "embedding" } },
    { model_name: "image", svc_params: { model: "mock/dall-e-3" }, model_info: { mode: "image_generation" } },
    { model_name: "whisper", svc_params: { model: "mock/whisper-1" }, model_info: { mode: "audio_transcription" } },
    { model_name: "tts", svc_params: { model: "mock/tts-1" }, model_info: { mode: "audio_speech" } },
    { model_name: "moderation", svc_params: { model: "mock/omni-moderation-latest" }, model_info: { mode: "moderation" } },
  ],
  general_settings: { master_key: MASTER_KEY },
});

/** Statuses a refusal of bad input may have (408: the request's own `timeout` ran out). */
const REFUSALS = new Set([400, 401, 403, 404, 405, 408, 413, 415, 422, 429]);
/** A request still unanswered after this is a hang. */
const HANG_MS = 15_000;

// ---------------------------------------------------------------------------------------------
// Requests and the rule

interface Req {
  method?: string;
  path: string;
  body?: string | FormData | Uint8Array<ArrayBuffer>;
  headers?: Record<string, string>;
  /** What the request is, for the failure message. */
  input: string;
  /** The input is one the route must refuse; otherwise a 2xx is fine too. */
  refuse: boolean;
  /** Errors come in Google's shape (`{"error": {"code", "message", "status"}}`). */
  google?: boolean;
}

interface Reply {
  status: number;
  type: string;
  text: string;
}

let gw: TestGateway;
let upstreams: { openai: MockOpenAI; anthropic: MockAnthropic; gemini: MockGemini };
let sent = 0;
const problems: string[] = [];
/** Replies by status, for the summary (a table that is all refusals, or all 200s, tests less than it seems). */
const statuses = new Map<number, number>();

async function send(r: Req): Promise<Reply> {
  sent++;
  const headers: Record<string, string> = { authorization: `Bearer ${MASTER_KEY}`, ...(typeof r.body === "string" ? { "content-type": "application/json" } : {}), ...r.headers };
  for (const [k, v] of Object.entries(headers)) if (v === "\u0000omit") delete headers[k];
  try {
    const res = await fetch(`${gw.url}${r.path}`, { method: r.method ?? "POST", headers, body: r.body, signal: AbortSignal.timeout(HANG_MS) });
    return { status: res.status, type: res.headers.get("content-type") ?? "", text: await res.text() };
  } catch (err) {
    return { status: 0, type: "", text: `no answer: ${err instanceof Error ? err.message : String(err)}` };
  }
}

/** What is wrong with a reply, if anything. */
function problem(req: Req, r: Reply): string | undefined {
  if (r.status === 0) return "no answer (crash or hang)";
  if (r.status >= 500) return `answered ${r.status}`;
  if (r.status < 400) {
    if (req.refuse) return `accepted with ${r.status}${r.type.includes("event-stream") ? " (a stream)" : ""}`;
    // An accepted stream must not carry the refusal inside it.
    if (r.type.includes("event-stream") && /^data: \{"error"/m.test(r.text)) return "a 200 stream with an error inside";
    return undefined;
  }
  if (!REFUSALS.has(r.status)) return `refused with ${r.status}`;
  if (!r.type.includes("application/json")) return `refused with ${r.status} as ${r.type || "no content type"}`;
  const refusal = refusalError(r.status, r.text);
  if ("wrong" in refusal) return refusal.wrong;
  const { error } = refusal;
  if (req.google) {
    if (error.code !== r.status || typeof error.status !== "string") return `refused with ${r.status} but not in Google's error envelope`;
  } else if (typeof error.type !== "string" || error.code !== String(r.status) || !("param" in error)) {
    return `refused with ${r.status} but not in the error envelope`;
  }
  return undefined;
}

async function check(req: Req): Promise<Reply> {
  const r = await send(req);
  statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
  // BAD_INPUT_TRACE=<part of an input's label> prints those replies: what a table really got, when it passes.
  if (process.env.BAD_INPUT_TRACE && req.input.includes(process.env.BAD_INPUT_TRACE)) console.log(req.input, r.status, snippet(r.text, 300));
  const wrong = problem(req, r);
  if (wrong) problems.push(`${req.method ?? "POST"} ${snippet(req.path, 100)} ← ${req.input}: ${wrong}: ${snippet(r.text)}`);
  return r;
}

/** Runs the requests and expects no problem among them. */
async function expectRefusedWell(reqs: Req[]): Promise<void> {
  const before = problems.length;
  await inParallel(reqs, check);
  expect(problems.slice(before)).toEqual([]);
}

// ---------------------------------------------------------------------------------------------
// Values

const LONG = "x".repeat(100_000);
const DEPTH = 10_000;
const DEEP_OBJECT = `${'{"a":'.repeat(DEPTH)}1${"}".repeat(DEPTH)}`;
const DEEP_ARRAY = `${"[".repeat(DEPTH)}${"]".repeat(DEPTH)}`;
const MANY_STRINGS = `[${Array.from({ length: 50_000 }, (_, i) => `"x${i}"`).join(",")}]`;

interface Bad {
  /** JSON text of the value. */
  json: string;
  label: string;
}
const bad = (json: string, label = json): Bad => ({ json, label });

/** Every value each field gets: its type's edges and every other type's. */
const VALUES: Bad[] = [
  bad("null"),
  bad("true"),
  bad("0"),
  bad("-1"),
  bad("1.5"),
  bad("1e20"),
  bad("9007199254740993"),
  bad("5e-324"),
  bad("1e309"),
  bad("-1e309"),
  bad('""'),
  bad('"NaN"'),
  bad('"1"'),
  bad('"a\\u0000b"', "a string with NUL"),
  bad('"\\ud800"', "a lone surrogate"),
  bad('"x/../%2F y ✓"', "a string with /, .., %2F, a space and unicode"),
  bad(JSON.stringify(LONG), "a 100k-character string"),
  bad("{}"),
  bad("[]"),
  bad("[null]"),
  bad("[1]"),
  bad('["x"]'),
  bad("[{}]"),
  bad('{"a\\u0000":"b\\u0000"}', "an object with NUL in a key and a value"),
  bad('{"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}', "__proto__ and constructor"),
  bad(DEEP_OBJECT, `an object nested ${DEPTH} deep`),
  bad(DEEP_ARRAY, `an array nested ${DEPTH} deep`),
  bad(MANY_STRINGS, "an array of 50,000 strings"),
];

/** Model names no configured model has. */
const ODD_MODELS = ["chat/", "/chat", "..", "../chat", "chat%2F..", "chat x", " chat", "chät✓", "mock/chat", "openai/*", "*", "chat\u0000", "x".repeat(10_000)];

/** Parses JSON text as the gateway would, or undefined when it cannot (10,000 levels may be too deep). */
function parsed(json: string): { value: unknown } | undefined {
  try {
    return { value: JSON.parse(json) };
  } catch {
    return undefined;
  }
}

// ---------------------------------------------------------------------------------------------
// Bodies

interface Field {
  path: string[];
  /** The field's schema; none for a field the gateway reads past the schema. */
  schema?: TSchema;
}

/**
 * Every field a wire schema names, and one level into its objects and arrays of objects (a
 * message's role and content, a content part's type).
 */
function schemaFields(schema: TSchema, prefix: string[] = [], depth = 0): Field[] {
  const out: Field[] = [];
  const props = (schema.properties ?? {}) as Record<string, TSchema>;
  for (const [name, sub] of Object.entries(props)) {
    const path = [...prefix, name];
    out.push({ path, schema: sub });
    if (depth >= 2) continue;
    const branches: TSchema[] = sub.anyOf ?? [sub];
    for (const b of branches) {
      if (b[Kind] === "Object") out.push(...schemaFields(b, path, depth + 1));
      if (b[Kind] === "Array" && (b.items as TSchema)[Kind] === "Object") out.push(...schemaFields(b.items as TSchema, [...path, "0"], depth + 1));
    }
  }
  const seen = new Set<string>();
  return out.filter((f) => !seen.has(f.path.join(".")) && seen.add(f.path.join(".")));
}

/** Fields the pipeline reads from any call body without the schema naming them. */
const GATEWAY_FIELDS = [
  "tags",
  "timeout",
  "num_retries",
  "max_retries",
  "retry_policy",
  "model_group_retry_policy",
  "fallbacks",
  "context_window_fallback_dict",
  "caching",
  "cache",
  "cache.ttl",
  "cache.s-maxage",
  "cache.namespace",
  "cache.no-cache",
  "metadata",
  "metadata.tags",
  "user",
  "mock_response",
  "drop_params",
  "api_base",
  "api_key",
  "stream",
  "stream_options",
  "stream_options.include_usage",
].map((f): Field => ({ path: f.split(".") }));

/**
 * The cases for one field: every value, refused when the field's schema does not admit it (or
 * its schema does not admit a whole body with it: a nested field's parent).
 */
function fieldCases(route: Omit<Req, "input" | "refuse" | "body">, endpointSchema: TSchema | undefined, base: Record<string, unknown>, f: Field, name = f.path.join(".")): Req[] {
  return VALUES.map((v) => {
    const body = withBad(base, f.path, v.json);
    const value = parsed(body);
    const admitted = value !== undefined && (endpointSchema ? Value.Check(endpointSchema, value.value) : true);
    return { ...route, body, input: `${name} = ${v.label}`, refuse: !admitted };
  });
}

interface CallEndpoint {
  suffix: string;
  schema: TSchema;
  base: Record<string, unknown>;
  model: string;
  streams: boolean;
}

const ENDPOINTS: CallEndpoint[] = [
  { suffix: "chat/completions", schema: ChatRequestSchema, base: { model: "chat", messages: [{ role: "user", content: "hi" }] }, model: "chat", streams: true },
  { suffix: "completions", schema: CompletionRequestSchema, base: { model: "chat", prompt: "hi" }, model: "chat", streams: true },
  { suffix: "embeddings", schema: EmbeddingsRequestSchema, base: { model: "embed", input: "hi" }, model: "embed", streams: false },
  { suffix: "images/generations", schema: ImageRequestSchema, base: { model: "image", prompt: "a red fox" }, model: "image", streams: false },
  { suffix: "audio/speech", schema: SpeechRequestSchema, base: { model: "tts", input: "hello", voice: "alloy" }, model: "tts", streams: false },
  { suffix: "moderations", schema: ModerationRequestSchema, base: { model: "moderation", input: "hello" }, model: "moderation", streams: false },
];

const ALL_SUFFIXES = [...ENDPOINTS.map((e) => e.suffix), "audio/transcriptions"];
const pathForms = (suffix: string, model: string) => [`/${suffix}`, `/v1/${suffix}`, `/openai/deployments/${model}/${suffix}`, `/engines/${model}/${suffix}`];

/** Bodies that are not a JSON object, and content types that are not JSON; `object`: it is an object all the same (with no known field). */
const NOT_OBJECTS: { body: string | Uint8Array<ArrayBuffer>; label: string; headers?: Record<string, string>; object?: boolean }[] = [
  { body: "", label: "an empty body" },
  { body: "   \n", label: "only whitespace" },
  { body: "{", label: "{ (not JSON)" },
  { body: '{"model":', label: "truncated JSON" },
  { body: '{"model":"chat",}', label: "a trailing comma" },
  { body: "{'model':'chat'}", label: "single quotes" },
  { body: "[]", label: "a JSON array" },
  { body: '[{"model":"chat"}]', label: "an array of an object" },
  { body: '"x"', label: "a JSON string" },
  { body: "null", label: "null" },
  { body: "42", label: "a number" },
  { body: "1e309", label: "1e309" },
  { body: "true", label: "true" },
  { body: "\u0000", label: "a NUL byte" },
  { body: new Uint8Array([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d]), label: "an object whose key is invalid UTF-8" },
  { body: DEEP_ARRAY, label: `an array nested ${DEPTH} deep` },
  { body: DEEP_OBJECT, label: `an object nested ${DEPTH} deep`, object: true },
  { body: new Uint8Array([0x22, 0xc3, 0x28, 0x22]), label: "a string of invalid UTF-8" },
  { body: "model=chat&prompt=hi", label: "a urlencoded form", headers: { "content-type": "application/x-www-form-urlencoded" } },
  { body: "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nchat\r\n--b--\r\n", label: "a multipart form", headers: { "content-type": "multipart/form-data; boundary=b" } },
];

/** Message contents in the shapes the providers' translations read: parts of every type, with odd and missing members. */
const CONTENT_SHAPES: unknown[] = [
  [{ type: "text" }],
  [{ type: "text", text: 1 }],
  [{ type: "image_url" }],
  [{ type: "image_url", image_url: "https://example.com/a.png" }],
  [{ type: "image_url", image_url: { url: 1 } }],
  [{ type: "image_url", image_url: { url: "data:image/png;base64,%%%" } }],
  [{ type: "image_url", image_url: { url: "data:text/plain,%ZZ" } }],
  [{ type: "image_url", image_url: { url: "data:;base64," } }],
  [{ type: "image_url", image_url: { url: "data:" } }],
  [{ type: "image_url", image_url: { url: `data:image/png;base64,${"A".repeat(100_000)}` } }],
  [{ type: "image_url", image_url: { url: "file:///etc/passwd", detail: 5 } }],
  [{ type: "input_audio" }],
  [{ type: "input_audio", input_audio: { data: "%%%", format: "x" } }],
  [{ type: "file" }],
  [{ type: "file", file: { file_data: "data:application/pdf;base64,%%%", file_id: 1 } }],
  [{ type: "file", file: { file_id: "gs://x/%ZZ", format: 1 } }],
  [{ type: "document", source: null }],
  [{ type: "tool_use" }],
  [{ type: "unknown-type", x: 1 }],
  [{ type: "" }],
  Array.from({ length: 5000 }, () => ({ type: "text", text: "a" })),
];

/** Whole messages with the members a translation pairs up (tool calls and their results) in odd shapes. */
const MESSAGE_SHAPES: unknown[] = [
  { role: "assistant", content: null },
  { role: "assistant", content: null, tool_calls: [] },
  { role: "assistant", content: null, tool_calls: [{}] },
  { role: "assistant", content: null, tool_calls: [{ id: 1, type: "function", function: "x" }] },
  { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{not json" } }] },
  { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: { a: 1 } } }] },
  { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "", arguments: `{"a":${"[".repeat(5000)}${"]".repeat(5000)}}` } }] },
  { role: "tool", content: "r" },
  { role: "tool", content: "r", tool_call_id: "" },
  { role: "tool", content: [{ type: "image_url", image_url: { url: "data:image/png;base64,AA" } }], tool_call_id: "nope" },
  { role: "function", content: "r" },
  { role: "function", content: "r", name: "" },
  { role: "system", content: [] },
  { role: "system", content: null },
  { role: "user", content: null },
  { role: "user", content: [] },
  { role: "developer", content: [{ type: "image_url", image_url: { url: "x" } }] },
  { role: "assistant", content: "x", reasoning_content: 1, thinking_blocks: "x" },
  { role: "assistant", content: [{ type: "thinking", thinking: 1, signature: {} }] },
  { role: "user", content: "hi", cache_control: "x" },
  { role: "user", content: [{ type: "text", text: "hi", cache_control: { type: 1 } }] },
];

// ---------------------------------------------------------------------------------------------
// Transcriptions: multipart

const audio = () => new Blob([new Uint8Array(3200)], { type: "audio/wav" });

function form(fields: Record<string, string | Blob | undefined>): FormData {
  const f = new FormData();
  for (const [k, v] of Object.entries(fields)) if (v !== undefined) (v instanceof Blob ? f.append(k, v, "a.wav") : f.append(k, v));
  return f;
}

const FORM_VALUES = ["", "a\u0000b", "\ud800", LONG, "abc", "-1", "1e309", "NaN", "Infinity", "true", "[1]", "{}", "x/../%2F ✓"];
const FORM_FIELDS = ["model", "language", "prompt", "response_format", "temperature", "timestamp_granularities[]", "stream", "user", "file", "timeout", "metadata"];

/** Multipart bodies that are malformed: bytes and the content type they come with. */
const BAD_MULTIPART: { body: string; type: string; label: string }[] = [
  { body: "", type: "multipart/form-data; boundary=b", label: "an empty multipart body" },
  { body: '{"model":"whisper"}', type: "application/json", label: "JSON instead of a form" },
  { body: "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--b--\r\n", type: "multipart/form-data", label: "no boundary parameter" },
  { body: "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--b--\r\n", type: "multipart/form-data; boundary=other", label: "the wrong boundary" },
  { body: "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhis", type: "multipart/form-data; boundary=b", label: "a truncated form" },
  { body: "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF", type: "multipart/form-data; boundary=b", label: "a truncated file" },
  { body: "--b\r\n\r\nwhisper\r\n--b--\r\n", type: "multipart/form-data; boundary=b", label: "a part with no headers" },
  { body: "--b\r\nContent-Disposition: form-data\r\n\r\nwhisper\r\n--b--\r\n", type: "multipart/form-data; boundary=b", label: "a part with no name" },
  { body: "not a form at all", type: "multipart/form-data; boundary=b", label: "text with a multipart type" },
  { body: `--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--b\r\nContent-Disposition: form-data; name="file"; filename="${"n".repeat(5000)}"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--b--\r\n`, type: "multipart/form-data; boundary=b", label: "a file with a 5000-character name" },
  { body: `--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n\r\n--b--\r\n`, type: "multipart/form-data; boundary=b", label: "an empty file" },
  { body: `--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--b\r\nContent-Disposition: form-data; name="file"\r\n\r\nnot a file\r\n--b--\r\n`, type: "multipart/form-data; boundary=b", label: "file as a text field" },
];

// ---------------------------------------------------------------------------------------------
// Paths, queries, credentials

/** Odd path segments where a model name goes. */
const ODD_SEGMENTS = ["%00", "a%00b", "x".repeat(5000), "..%2F..%2Fetc%2Fpasswd", "..", "%2E%2E", "%ZZ", "%E0%A4%A", "%F0%28%8C%28", "%ED%A0%80", "%C0%AF", "%20", "chat%20", "-1", "%2F", "chat%2Fx", "null", "%E2%9C%93", "chat;x", "%25"];

/** Credentials in odd shapes: each must be refused with a 401 (the master key in odd casing may be accepted). */
const BAD_AUTH: { headers: Record<string, string>; label: string; refuse: boolean }[] = [
  { headers: { authorization: "\u0000omit" }, label: "no credential", refuse: true },
  { headers: { authorization: "Bearer " }, label: "Bearer and nothing", refuse: true },
  { headers: { authorization: "Bearer      " }, label: "Bearer and spaces", refuse: true },
  { headers: { authorization: "Bearer" }, label: "Bearer alone", refuse: true },
  { headers: { authorization: "" }, label: "an empty authorization header", refuse: true },
  { headers: { authorization: MASTER_KEY }, label: "the key without Bearer", refuse: true },
  { headers: { authorization: `Basic ${btoa(`x:${MASTER_KEY}`)}` }, label: "Basic", refuse: true },
  { headers: { authorization: "Bearer sk-\u00e9\u00e8\u00ff" }, label: "Latin-1 characters", refuse: true },
  { headers: { authorization: "Bearer sk-\u00e2\u009c\u0093" }, label: "UTF-8 bytes read as Latin-1", refuse: true },
  { headers: { authorization: `Bearer sk-${"k".repeat(10_000)}` }, label: "a 10 KB key", refuse: true },
  { headers: { authorization: `Bearer ${MASTER_KEY}x` }, label: "the master key and a character", refuse: true },
  { headers: { authorization: `bearer ${MASTER_KEY}` }, label: "the master key with lower-case bearer", refuse: false },
  { headers: { authorization: "\u0000omit", "x-svc-api-key": "" }, label: "an empty x-svc-api-key", refuse: true },
  { headers: { authorization: "\u0000omit", "x-svc-api-key": "Bearer " }, label: "x-svc-api-key: Bearer and nothing", refuse: true },
  { headers: { authorization: "\u0000omit", "x-svc-api-key": `sk-${"k".repeat(10_000)}` }, label: "a 10 KB x-svc-api-key", refuse: true },
  { headers: { authorization: "Bearer sk-not-a-key", "x-svc-api-key": "\u00ff" }, label: "x-svc-api-key Latin-1", refuse: true },
];

// ---------------------------------------------------------------------------------------------

beforeAll(async () => {
  upstreams = {
    openai: await startMockOpenAI({ apiKey: UPSTREAM_KEY, record: false }),
    anthropic: await startMockAnthropic({ apiKey: UPSTREAM_KEY, record: false }),
    gemini: await startMockGemini({ apiKey: UPSTREAM_KEY, record: false }),
  };
  gw = await startBackendGateway("pglite", config(upstreams.openai.url, upstreams.anthropic.url, upstreams.gemini.url));
  // Every valid base body is answered: a refusal below is the bad value's doing.
  for (const e of ENDPOINTS) {
    const r = await send({ path: `/v1/${e.suffix}`, body: JSON.stringify(e.base), input: "base", refuse: false });
    expect(r.status, `${e.suffix}: ${r.text}`).toBe(200);
  }
  const t = await send({ path: "/v1/audio/transcriptions", body: form({ model: "whisper", file: audio() }), input: "base", refuse: false });
  expect(t.status, t.text).toBe(200);
  for (const model of PROVIDER_CHATS) {
    const r = await send({ path: "/v1/chat/completions", body: JSON.stringify({ ...ENDPOINTS[0]!.base, model }), input: "base", refuse: false });
    expect(r.status, `${model}: ${r.text}`).toBe(200);
  }
}, 60_000);

let startedAt = 0;
beforeAll(() => {
  startedAt = performance.now();
});
afterAll(async () => {
  const by = [...statuses].sort(([a], [b]) => a - b).map(([status, n]) => `${status}: ${n}`);
  console.log(`bad-input-model-calls: ${sent} requests in ${((performance.now() - startedAt) / 1000).toFixed(1)} s (${by.join(", ")})`);
  await gw?.stop();
  await Promise.all([upstreams?.openai.stop(), upstreams?.anthropic.stop(), upstreams?.gemini.stop()]);
});

describe("bad input to the model-call routes: a 4xx in the error envelope, never a 5xx", () => {
  test("bodies that are not a JSON object, on every path form of every endpoint", async () => {
    const reqs: Req[] = [];
    for (const suffix of ALL_SUFFIXES) {
      const model = ENDPOINTS.find((e) => e.suffix === suffix)?.model ?? "whisper";
      for (const path of pathForms(suffix, model)) {
        // Embeddings with the model in the path need nothing else (no input is an empty list).
        const emptyOk = suffix === "embeddings" && path.includes(`/${model}/`);
        for (const b of NOT_OBJECTS) reqs.push({ path, body: b.body, headers: b.headers, input: b.label, refuse: !(b.object && emptyOk) });
        reqs.push({ path, input: "no body", refuse: true });
        reqs.push({ path, body: "{}", input: "{}", refuse: !emptyOk });
        // The wrong method: GET where only POST is served.
        reqs.push({ method: "GET", path, input: "GET", refuse: true });
      }
    }
    await expectRefusedWell(reqs);
  }, 60_000);

  for (const e of ENDPOINTS) {
    test(`each field of ${e.suffix} with every awkward value${e.streams ? ", also as a stream" : ""}`, async () => {
      const route = { path: `/v1/${e.suffix}` };
      const fields = [...schemaFields(e.schema), ...GATEWAY_FIELDS.filter((g) => !(e.schema.properties as Record<string, unknown>)[g.path[0]!] || g.path.length > 1)];
      const reqs = fields.flatMap((f) => fieldCases(route, e.schema, e.base, f));
      for (const m of ODD_MODELS) reqs.push({ ...route, body: JSON.stringify({ ...e.base, model: m }), input: `model = ${snippet(m, 40)}`, refuse: true });
      // Very large arrays where the endpoint takes one.
      if (e.suffix === "chat/completions") {
        const many = Array.from({ length: 20_000 }, () => ({ role: "user", content: "hi" }));
        reqs.push({ ...route, body: JSON.stringify({ ...e.base, messages: many }), input: "20,000 messages", refuse: false });
        reqs.push({ ...route, body: JSON.stringify({ ...e.base, messages: [{ role: "user", content: Array.from({ length: 20_000 }, () => ({ type: "text", text: "a" })) }] }), input: "20,000 content parts", refuse: false });
      }
      // A stream asked for with a bad value is refused before it starts; with an accepted one it ends cleanly.
      if (e.streams) {
        const base = { ...e.base, stream: true, stream_options: { include_usage: true } };
        for (const f of fields.filter((x) => x.path[0] !== "stream" && x.path[0] !== "stream_options")) reqs.push(...fieldCases(route, e.schema, base, f, `${f.path.join(".")} (stream)`));
      }
      await expectRefusedWell(reqs);
    }, 60_000);
  }

  test("each field of chat/completions through each provider's translation (OpenAI, Anthropic, Gemini upstreams), also as a stream", async () => {
    const route = { path: "/v1/chat/completions" };
    const fields = [...schemaFields(ChatRequestSchema), ...GATEWAY_FIELDS.filter((g) => g.path.length > 1 || !(ChatRequestSchema.properties as Record<string, unknown>)[g.path[0]!])];
    const reqs: Req[] = [];
    for (const model of PROVIDER_CHATS) {
      const base = { ...ENDPOINTS[0]!.base, model };
      for (const f of fields.filter((x) => x.path[0] !== "model")) {
        reqs.push(...fieldCases(route, ChatRequestSchema, base, f, `${model}: ${f.path.join(".")}`));
        if (f.path[0] !== "stream" && f.path[0] !== "stream_options") reqs.push(...fieldCases(route, ChatRequestSchema, { ...base, stream: true }, f, `${model}: ${f.path.join(".")} (stream)`));
      }
      // Content parts and message shapes each translation reads.
      for (const [i, content] of CONTENT_SHAPES.entries()) {
        for (const role of ["user", "assistant", "system", "tool"]) {
          const body = JSON.stringify({ ...base, messages: [{ role, content, tool_call_id: "c1" }, ...(role === "user" ? [] : [{ role: "user", content: "hi" }])] });
          const value = parsed(body);
          reqs.push({ ...route, body, input: `${model}: ${role} content shape ${i}`, refuse: !Value.Check(ChatRequestSchema, value?.value) });
        }
      }
      for (const [i, msg] of MESSAGE_SHAPES.entries()) {
        const body = JSON.stringify({ ...base, messages: [msg, { role: "user", content: "hi" }] });
        reqs.push({ ...route, body, input: `${model}: message shape ${i} ${snippet(JSON.stringify(msg), 60)}`, refuse: !Value.Check(ChatRequestSchema, JSON.parse(body)) });
      }
    }
    await expectRefusedWell(reqs);
  }, 60_000);

  test("transcriptions: each form field with every awkward value, a missing file or model, malformed multipart", async () => {
    const path = "/v1/audio/transcriptions";
    const reqs: Req[] = [];
    const base = { model: "whisper", file: audio() as string | Blob | undefined };
    for (const name of FORM_FIELDS) {
      for (const v of FORM_VALUES) {
        const refuse = name === "file" || (name === "model" && v === "") || (name === "temperature" && !(Number(v) >= 0 && Number(v) <= 1));
        reqs.push({ path, body: form({ ...base, [name]: v }), input: `${name} = ${snippet(v, 30)}`, refuse });
      }
    }
    reqs.push({ path, body: form({ model: "whisper" }), input: "no file", refuse: true });
    reqs.push({ path, body: form({ file: audio() }), input: "no model", refuse: true });
    reqs.push({ path, body: form({}), input: "an empty form", refuse: true });
    for (const m of ODD_MODELS) reqs.push({ path, body: form({ ...base, model: m }), input: `model = ${snippet(m, 40)}`, refuse: true });
    for (const b of BAD_MULTIPART) {
      const acceptable = b.label === "an empty file" || b.label.startsWith("a file with");
      reqs.push({ path, body: b.body, headers: { "content-type": b.type }, input: b.label, refuse: !acceptable });
    }
    // Two files, and the model twice.
    const two = form(base);
    two.append("file", audio(), "b.wav");
    two.append("model", "chat");
    reqs.push({ path, body: two, input: "two files and two models", refuse: false });
    await expectRefusedWell(reqs);
  }, 60_000);

  test("odd model names in the path of the deployment and engine forms", async () => {
    const reqs: Req[] = [];
    for (const suffix of ALL_SUFFIXES) {
      const e = ENDPOINTS.find((x) => x.suffix === suffix);
      for (const seg of ODD_SEGMENTS) {
        for (const prefix of ["/openai/deployments", "/engines"]) {
          const path = `${prefix}/${seg}/${suffix}`;
          if (e) reqs.push({ path, body: JSON.stringify(e.base), input: `path model ${snippet(seg, 30)}`, refuse: false });
          else reqs.push({ path, body: form({ model: "whisper", file: audio() }), input: `path model ${snippet(seg, 30)}`, refuse: false });
          reqs.push({ path, body: "{", input: `path model ${snippet(seg, 30)} with body {`, refuse: true });
        }
      }
    }
    // The completions model may come in the query string.
    for (const seg of [...ODD_SEGMENTS, "chat"]) reqs.push({ path: `/v1/completions?model=${seg}`, body: '{"prompt":"hi"}', input: `?model=${snippet(seg, 30)}`, refuse: false });
    // A very long path, and paths that are near a route.
    reqs.push({ path: `/v1/chat/completions/${"x".repeat(8000)}`, body: "{}", input: "a very long path", refuse: true });
    reqs.push({ path: "/v1/chat/completions%2F", body: JSON.stringify(ENDPOINTS[0]!.base), input: "an encoded slash after the route", refuse: true });
    reqs.push({ path: "/v1//chat/completions", body: JSON.stringify(ENDPOINTS[0]!.base), input: "a double slash", refuse: false });
    reqs.push({ path: "/openai/deployments//chat/completions", body: JSON.stringify(ENDPOINTS[0]!.base), input: "an empty path model", refuse: false });
    await expectRefusedWell(reqs);
  }, 60_000);

  test("credentials in odd shapes on every kind of route", async () => {
    const reqs: Req[] = [];
    const routes: Omit<Req, "input" | "refuse">[] = [
      ...ENDPOINTS.map((e) => ({ path: `/v1/${e.suffix}`, body: JSON.stringify(e.base) })),
      { path: "/openai/deployments/chat/chat/completions", body: JSON.stringify(ENDPOINTS[0]!.base) },
      { path: "/v1/audio/transcriptions", body: form({ model: "whisper", file: audio() }) },
      { path: "/v1beta/models/chat:generateContent", body: JSON.stringify({ contents: [{ parts: [{ text: "hi" }] }] }), google: true },
      { path: "/v1beta/models/chat:countTokens", body: JSON.stringify({ contents: [{ parts: [{ text: "hi" }] }] }), google: true },
      { path: "/utils/token_counter", body: JSON.stringify({ model: "chat", prompt: "hi" }) },
      { path: "/utils/transform_request", body: JSON.stringify({ request_body: ENDPOINTS[0]!.base }) },
      { method: "GET", path: "/utils/supported_openai_params?model=chat" },
      { method: "GET", path: "/v1/models" },
      { method: "GET", path: "/v1/models/chat" },
      { method: "GET", path: "/model/info" },
    ];
    for (const route of routes) {
      for (const a of BAD_AUTH) {
        // A FormData body is consumed by a request: each gets its own.
        const body = route.body instanceof FormData ? form({ model: "whisper", file: audio() }) : route.body;
        reqs.push({ ...route, body, headers: a.headers, input: a.label, refuse: a.refuse });
      }
    }
    // Google's own key forms, wrong.
    for (const key of ["", "sk-not-a-key", "%ZZ", "\u00ff", "k".repeat(5000)]) {
      reqs.push({ path: "/v1beta/models/chat:generateContent", body: '{"contents":[{"parts":[{"text":"hi"}]}]}', headers: { authorization: "\u0000omit", "x-goog-api-key": key }, input: `x-goog-api-key ${snippet(key, 20)}`, refuse: true, google: true });
      reqs.push({ path: `/v1beta/models/chat:generateContent?key=${encodeURIComponent(key)}`, body: '{"contents":[{"parts":[{"text":"hi"}]}]}', headers: { authorization: "\u0000omit" }, input: `?key=${snippet(key, 20)}`, refuse: true, google: true });
    }
    const before = problems.length;
    await inParallel(reqs, async (req) => {
      const r = await check(req);
      // A refused credential is a 401, not some other refusal.
      if (req.refuse && r.status !== 401 && r.status > 0 && r.status < 500) problems.push(`${req.path} ← ${req.input}: refused with ${r.status}, not 401: ${snippet(r.text)}`);
    });
    expect(problems.slice(before)).toEqual([]);
  }, 60_000);

  test("Gemini-style routes: odd model and action, each field with every awkward value, as a stream too", async () => {
    const reqs: Req[] = [];
    const body = { contents: [{ role: "user", parts: [{ text: "hi" }] }] };
    for (const prefix of ["/v1beta/models", "/models", "/v1/models"]) {
      for (const tail of ["chat", "chat:", ":generateContent", "chat:unknown", "chat:generateContent:countTokens", "chat:GENERATECONTENT", ...ODD_SEGMENTS.map((s) => `${s}:generateContent`), "chat%3AgenerateContent", "%ZZ:countTokens", "%E0%A4%A:streamGenerateContent"]) {
        reqs.push({ path: `${prefix}/${tail}`, body: JSON.stringify(body), input: `model and action ${snippet(tail, 40)}`, refuse: tail !== "chat%3AgenerateContent", google: true });
      }
      for (const b of NOT_OBJECTS) reqs.push({ path: `${prefix}/chat:generateContent`, body: b.body, headers: b.headers, input: b.label, refuse: true, google: true });
      for (const b of NOT_OBJECTS) reqs.push({ path: `${prefix}/chat:countTokens`, body: b.body, headers: b.headers, input: b.label, refuse: !b.object, google: true });
    }
    // Every field the translation reads, with every value, on each action.
    const GEMINI_FIELDS = [
      "contents",
      "contents.0",
      "contents.0.role",
      "contents.0.parts",
      "contents.0.parts.0",
      "contents.0.parts.0.text",
      "contents.0.parts.0.thought",
      "contents.0.parts.0.inlineData",
      "contents.0.parts.0.inlineData.mimeType",
      "contents.0.parts.0.inlineData.data",
      "contents.0.parts.0.fileData",
      "contents.0.parts.0.fileData.fileUri",
      "contents.0.parts.0.functionCall",
      "contents.0.parts.0.functionResponse",
      "contents.0.parts.0.functionResponse.response",
      "systemInstruction",
      "systemInstruction.parts",
      "tools",
      "tools.0",
      "tools.0.functionDeclarations",
      "tools.0.functionDeclarations.0",
      "tools.0.functionDeclarations.0.name",
      "tools.0.functionDeclarations.0.parameters",
      "tools.0.functionDeclarations.0.parametersJsonSchema",
      "toolConfig",
      "toolConfig.functionCallingConfig",
      "toolConfig.functionCallingConfig.mode",
      "toolConfig.functionCallingConfig.allowedFunctionNames",
      "generationConfig",
      "generationConfig.temperature",
      "generationConfig.topP",
      "generationConfig.maxOutputTokens",
      "generationConfig.candidateCount",
      "generationConfig.seed",
      "generationConfig.stopSequences",
      "generationConfig.responseMimeType",
      "generationConfig.responseSchema",
      "generationConfig.responseJsonSchema",
      "generationConfig.thinkingConfig",
      "generationConfig.thinkingConfig.thinkingBudget",
      "generationConfig.thinkingConfig.thinkingLevel",
      "generateContentRequest",
      "safetySettings",
      "cachedContent",
    ];
    for (const action of ["generateContent", "streamGenerateContent", "countTokens"]) {
      const route = { path: `/v1beta/models/chat:${action}${action === "streamGenerateContent" ? "?alt=sse" : ""}`, google: true };
      for (const f of GEMINI_FIELDS) reqs.push(...fieldCases(route, undefined, body, { path: f.split(".") }));
    }
    for (const q of ["alt=sse", "alt=%ZZ", "alt=json&alt=sse", `alt=${"x".repeat(3000)}`, "call_endpoint=maybe", "key=%E0%A4%A"]) {
      reqs.push({ path: `/v1beta/models/chat:streamGenerateContent?${q}`, body: JSON.stringify(body), input: `?${snippet(q, 30)}`, refuse: false, google: true });
      // countTokens reads call_endpoint: a text that is neither true nor false is a 422 naming it.
      reqs.push({ path: `/v1beta/models/chat:countTokens?${q}`, body: JSON.stringify(body), input: `?${snippet(q, 30)}`, refuse: q === "call_endpoint=maybe", google: true });
    }
    await expectRefusedWell(reqs);
  }, 60_000);

  test("/utils: token_counter, transform_request (with each call body inside) and supported_openai_params", async () => {
    const reqs: Req[] = [];
    const counter = { path: "/utils/token_counter" };
    for (const f of ["model", "prompt", "messages", "messages.0", "messages.0.role", "messages.0.content", "contents", "contents.0", "contents.0.parts", "tools", "tools.0", "call_endpoint"]) {
      reqs.push(...fieldCases(counter, undefined, { model: "chat", prompt: "hi" }, { path: f.split(".") }));
      if (f.startsWith("messages") || f.startsWith("contents")) reqs.push(...fieldCases(counter, undefined, { model: "chat", [f.split(".")[0]!]: f.startsWith("messages") ? [{ role: "user", content: "hi" }] : [{ parts: [{ text: "hi" }] }] }, { path: f.split(".") }));
    }
    for (const q of ["call_endpoint=true", "call_endpoint=%ZZ", "call_endpoint=1e309", "call_endpoint=maybe"]) {
      reqs.push({ path: `/utils/token_counter?${q}`, body: '{"model":"chat","prompt":"hi"}', input: `?${q}`, refuse: q !== "call_endpoint=true" });
    }
    for (const q of ["include_metadata=2", "return_wildcard_routes=maybe", "include_model_access_groups=x", "only_model_access_groups=%ZZ"]) {
      reqs.push({ method: "GET", path: `/v1/models?${q}`, input: `?${q}`, refuse: true });
    }
    for (const b of NOT_OBJECTS) {
      reqs.push({ ...counter, body: b.body, headers: b.headers, input: b.label, refuse: !b.object });
      reqs.push({ path: "/utils/transform_request", body: b.body, headers: b.headers, input: b.label, refuse: true });
    }
    const transform = { path: "/utils/transform_request" };
    reqs.push(...fieldCases(transform, undefined, { call_type: "completion", request_body: ENDPOINTS[0]!.base }, { path: ["call_type"] }));
    reqs.push(...fieldCases(transform, undefined, { call_type: "completion", request_body: ENDPOINTS[0]!.base }, { path: ["request_body"] }));
    const callTypes: Record<string, CallEndpoint> = { completion: ENDPOINTS[0]!, text_completion: ENDPOINTS[1]!, embedding: ENDPOINTS[2]!, image_generation: ENDPOINTS[3]! };
    for (const [callType, e] of Object.entries(callTypes)) {
      for (const f of schemaFields(e.schema)) reqs.push(...fieldCases(transform, undefined, { call_type: callType, request_body: e.base }, { path: ["request_body", ...f.path] }));
    }
    for (const seg of [...ODD_SEGMENTS, "", "chat", "embed"]) reqs.push({ method: "GET", path: `/utils/supported_openai_params?model=${seg}`, input: `?model=${snippet(seg, 30)}`, refuse: seg === "" });
    reqs.push({ method: "GET", path: "/utils/supported_openai_params", input: "no model", refuse: true });
    await expectRefusedWell(reqs);
  }, 60_000);

  test("model discovery: odd ids, query strings of the wrong types", async () => {
    const reqs: Req[] = [];
    for (const prefix of ["/models", "/v1/models"]) {
      for (const seg of [...ODD_SEGMENTS, "chat", "chat/x", "mock/chat", "*"]) reqs.push({ method: "GET", path: `${prefix}/${seg}`, input: `id ${snippet(seg, 30)}`, refuse: !["chat"].includes(seg) });
    }
    const QUERY_NAMES = ["scope", "team_id", "fallback_type", "include_metadata", "return_wildcard_routes", "only_model_access_groups", "include_model_access_groups", "svc_model_id"];
    const QUERY_VALUES = ["abc", "-5", "0", "1e309", "true", "%00", "a%00b", "%ZZ", "%E0%A4%A", "%ED%A0%80", "x".repeat(2000), "'%3B--", "expand"];
    for (const path of ["/models", "/v1/models", "/model/info", "/v1/model/info"]) {
      for (const name of QUERY_NAMES) for (const v of QUERY_VALUES) reqs.push({ method: "GET", path: `${path}?${name}=${v}`, input: `?${name}=${snippet(v, 30)}`, refuse: false });
      reqs.push({ method: "GET", path: `${path}?${QUERY_NAMES.map((n) => `${n}=%ZZ`).join("&")}`, input: "every parameter %ZZ", refuse: false });
      reqs.push({ method: "GET", path: `${path}?scope=expand&scope=x&team_id=&team_id=a`, input: "repeated parameters", refuse: false });
      // These are GET routes: a POST is no route.
      reqs.push({ method: "POST", path, body: "{", input: "POST with a broken body", refuse: true });
    }
    await expectRefusedWell(reqs);
  }, 60_000);

  test("the refusals this file found once say what is wrong", async () => {
    const chat = JSON.stringify(ENDPOINTS[0]!.base);
    const error = async (path: string, body?: string, method = "POST") => {
      const r = await send({ method, path, body, input: "", refuse: true });
      return { status: r.status, error: (JSON.parse(r.text) as { error: { message: string; param?: string | null } }).error };
    };
    // A model in the path is decoded once: `%25` is `%`, `%2525` is `%25` (it was decoded twice: a 500, and the wrong name).
    expect(await error("/openai/deployments/%25/chat/completions", chat)).toMatchObject({ status: 400, error: { param: "model", message: expect.stringContaining("model=%.") } });
    expect(await error("/engines/%2525/chat/completions", chat)).toMatchObject({ status: 400, error: { param: "model", message: expect.stringContaining("model=%25.") } });
    // An invalid encoding is said to be one (the model called was "null" before).
    for (const path of ["/openai/deployments/%ZZ/chat/completions", "/engines/%E0%A4%A/chat/completions"]) {
      expect(await error(path, chat)).toMatchObject({ status: 400, error: { param: "model", message: expect.stringContaining("percent-encoding") } });
    }
    expect(await error("/v1/models/%E0%A4%A", undefined, "GET")).toMatchObject({ status: 400, error: { param: "model", message: expect.stringContaining("percent-encoding") } });
    expect(await error("/v1beta/models/%ZZ:generateContent", '{"contents":[{"parts":[{"text":"hi"}]}]}')).toMatchObject({ status: 400, error: { message: expect.stringContaining("percent-encoding") } });
    // A data: URL whose text does not decode, for a Gemini upstream.
    const media = JSON.stringify({ model: "gemini", messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "data:text/plain,%ZZ" } }] }] });
    expect(await error("/v1/chat/completions", media)).toMatchObject({ status: 400, error: { message: expect.stringContaining("percent-encoding") } });
    // Counting 200,000 letters without a break answers at once (it held the event loop for a minute).
    for (const [path, body] of [
      ["/utils/token_counter", JSON.stringify({ model: "chat", prompt: "q".repeat(200_000) })],
      ["/v1beta/models/chat:countTokens", JSON.stringify({ contents: [{ parts: [{ text: "z".repeat(200_000) }] }] })],
    ] as const) {
      const started = performance.now();
      const r = await send({ path, body, input: "", refuse: false });
      expect(r.status, r.text).toBe(200);
      expect(performance.now() - started).toBeLessThan(5000);
    }
    // Dimensions the built-in mock cannot build are refused as OpenAI refuses them (a 503 "could not connect" before).
    expect(await error("/v1/embeddings", JSON.stringify({ model: "embed", input: "hi", dimensions: 1e20 }))).toMatchObject({ status: 400, error: { message: expect.stringContaining("dimensions") } });
  });

  test("afterwards the gateway still answers and the store still works", async () => {
    const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["chat"] } });
    expect(made.status, made.text).toBe(200);
    const call = await requestJson<{ choices: unknown[] }>(gw, "POST", "/v1/chat/completions", { key: made.body.key, body: ENDPOINTS[0]!.base });
    expect(call.status, call.text).toBe(200);
    expect(call.body.choices.length).toBeGreaterThan(0);
    const info = await requestJson<{ key: string }>(gw, "GET", `/key/info?key=${encodeURIComponent(made.body.key)}`);
    expect(info.status, info.text).toBe(200);
    // Nothing on Object.prototype came from a body's `__proto__`.
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    await gw.host!.spendWriter.flush();
    const logs = await requestJson<unknown[]>(gw, "GET", "/spend/logs?limit=5");
    expect(logs.status, logs.text).toBe(200);
  }, 60_000);
});
