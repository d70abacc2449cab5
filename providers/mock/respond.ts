/**
 * The built-in `mock/<model>` provider's answers: deterministic OpenAI-format responses with
 * realistic usage, produced in-process so the example config works with no network.
 */
import type { WireJson } from "../../core/contract.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";

const encoder = new TextEncoder();

function lastUserText(messages: unknown): string {
  if (!Array.isArray(messages)) return "";
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i] as WireJson;
    if (m.role !== "user") continue;
    if (typeof m.content === "string") return m.content;
    if (Array.isArray(m.content)) {
      return m.content.map((p) => (typeof (p as WireJson).text === "string" ? (p as WireJson).text : "")).join(" ");
    }
  }
  return "";
}

/** The reply's words: a fixed text, or an echo of the prompt, cut at max_tokens (one word per token). */
function replyWords(body: WireJson, prompt: string, fixed: string | undefined): { words: string[]; truncated: boolean } {
  const text = fixed ?? `This is a mock response to: ${prompt.slice(0, 200)}`;
  const all = text.split(/(?<= )/);
  const max = typeof body.max_tokens === "number" ? body.max_tokens : Number.POSITIVE_INFINITY;
  return { words: all.slice(0, max), truncated: all.length > max };
}

/** A 400 in OpenAI's error format. */
function invalid(message: string, param: string): Response {
  return new Response(JSON.stringify({ error: { message, type: "invalid_request_error", param, code: null } }), { status: 400, headers: { "content-type": "application/json" } });
}

function json(body: WireJson): Response {
  return new Response(JSON.stringify(body), { headers: { "content-type": "application/json" } });
}

function sse(events: WireJson[]): Response {
  const text = `${events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join("")}data: [DONE]\n\n`;
  return new Response(encoder.encode(text), { headers: { "content-type": "text/event-stream" } });
}

function usage(prompt: number, completion: number): WireJson {
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

/** The most choices (`n`) OpenAI answers in one call. */
const MAX_CHOICES = 128;

/** The choices asked for (`n`), each the same reply; past OpenAI's most, refused as OpenAI refuses it. */
function choiceIndexes(body: WireJson): number[] | Response {
  const n = typeof body.n === "number" ? body.n : 1;
  if (n > MAX_CHOICES) return invalid(`Invalid 'n': integer above maximum value. Expected a value <= ${MAX_CHOICES}, but got ${n} instead.`, "n");
  return Array.from({ length: n }, (_, i) => i);
}

let counter = 0;
const nextId = (prefix: string) => `${prefix}-mock${(++counter).toString(36).padStart(8, "0")}`;
const now = () => Math.floor(Date.now() / 1000);

function chat(body: WireJson, fixed: string | undefined): Response {
  const indexes = choiceIndexes(body);
  if (indexes instanceof Response) return indexes;
  const promptTokens = estimateTokens((body.messages as WireJson[]).map((m) => m.content)) + 3 * (body.messages as unknown[]).length;
  const { words, truncated } = replyWords(body, lastUserText(body.messages), fixed);
  const finish = truncated ? "length" : "stop";
  const id = nextId("chatcmpl");
  const created = now();
  // Every choice is the reply: the prompt is billed once, the answer tokens for each.
  const used = usage(promptTokens, words.length * indexes.length);
  if (!body.stream) {
    return json({
      id,
      object: "chat.completion",
      created,
      model: body.model,
      choices: indexes.map((index) => ({ index, message: { role: "assistant", content: words.join("") }, logprobs: null, finish_reason: finish })),
      usage: used,
    });
  }
  const base = { id, object: "chat.completion.chunk", created, model: body.model };
  // One chunk per choice at each step, as OpenAI interleaves them.
  const step = (delta: WireJson, finish_reason: string | null): WireJson[] => indexes.map((index) => ({ ...base, choices: [{ index, delta, logprobs: null, finish_reason }] }));
  const events = [...step({ role: "assistant", content: "" }, null), ...words.flatMap((w) => step({ content: w }, null)), ...step({}, finish)];
  const opts = body.stream_options as WireJson | undefined;
  if (opts?.include_usage) events.push({ ...base, choices: [], usage: used });
  return sse(events);
}

function completion(body: WireJson, fixed: string | undefined): Response {
  const indexes = choiceIndexes(body);
  if (indexes instanceof Response) return indexes;
  const prompt = Array.isArray(body.prompt) ? body.prompt.join(" ") : String(body.prompt ?? "");
  const promptTokens = estimateTokens(prompt);
  const { words, truncated } = replyWords(body, prompt, fixed);
  const finish = truncated ? "length" : "stop";
  const base = { id: nextId("cmpl"), object: "text_completion", created: now(), model: body.model };
  const used = usage(promptTokens, words.length * indexes.length);
  if (!body.stream) {
    return json({
      ...base,
      choices: indexes.map((index) => ({ text: words.join(""), index, logprobs: null, finish_reason: finish })),
      usage: used,
    });
  }
  const events: WireJson[] = words.flatMap((w, i) =>
    indexes.map((index) => ({ ...base, choices: [{ text: w, index, logprobs: null, finish_reason: i === words.length - 1 ? finish : null }] })),
  );
  const opts = body.stream_options as WireJson | undefined;
  if (opts?.include_usage) events.push({ ...base, choices: [], usage: used });
  return sse(events);
}

/** A unit vector derived from the text, so equal inputs embed equally. */
function vector(text: string, dims: number): number[] {
  const v = Array.from({ length: dims }, (_, i) => {
    let h = 2166136261 ^ i;
    for (let j = 0; j < text.length; j++) h = Math.imul(h ^ text.charCodeAt(j), 16777619);
    return ((h >>> 0) / 0xffffffff) * 2 - 1;
  });
  const norm = Math.hypot(...v) || 1;
  return v.map((x) => x / norm);
}

function base64(v: number[]): string {
  return Buffer.from(new Float32Array(v).buffer).toString("base64");
}

/** The most dimensions OpenAI's embedding models give (text-embedding-3-large). */
const MAX_DIMENSIONS = 3072;

/**
 * The inputs to embed, as OpenAI reads `input`: a string, a list of strings, one text as token
 * ids (number[]), or several (number[][]); with the tokens each counts (a token list, its length).
 */
function embeddingInputs(input: unknown): { text: string; tokens: number }[] {
  const one = (x: unknown) => (Array.isArray(x) ? { text: x.join(" "), tokens: x.length } : { text: String(x ?? ""), tokens: estimateTokens(String(x ?? "")) });
  if (!Array.isArray(input)) return [one(input)];
  if (input.length > 0 && input.every((x) => typeof x === "number")) return [one(input)];
  return input.map(one);
}

function embeddings(body: WireJson): Response {
  const inputs = embeddingInputs(body.input);
  const dims = typeof body.dimensions === "number" ? body.dimensions : 8;
  // Refused as OpenAI refuses it; building the vectors would otherwise take the memory they ask for.
  if (dims > MAX_DIMENSIONS) return invalid(`Invalid value for 'dimensions' = ${dims}. Must be less than or equal to ${MAX_DIMENSIONS}.`, "dimensions");
  const asBase64 = body.encoding_format === "base64";
  const data = inputs.map(({ text }, index) => {
    const v = vector(text, dims);
    return { object: "embedding", index, embedding: asBase64 ? base64(v) : v };
  });
  const tokens = inputs.reduce((n, t) => n + t.tokens, 0);
  return json({ object: "list", data, model: body.model, usage: { prompt_tokens: tokens, total_tokens: tokens } });
}

/** A 1×1 transparent PNG: what every mock image is. */
const PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";

function images(body: WireJson): Response {
  const n = typeof body.n === "number" ? body.n : 1;
  const id = nextId("img");
  const data = Array.from({ length: n }, (_, i) =>
    body.response_format === "b64_json" ? { b64_json: PIXEL_PNG, revised_prompt: body.prompt } : { url: `https://mock.invalid/images/${id}-${i}.png`, revised_prompt: body.prompt },
  );
  return json({ created: now(), data });
}

/**
 * A transcript of the uploaded file: its length as if it were 16 kHz 16-bit mono PCM (32,000
 * bytes a second), one segment, in the asked format.
 */
function transcription(body: WireJson, fixed: string | undefined): Response {
  const file = body.file instanceof Blob ? body.file : new Blob([]);
  const duration = Math.round((file.size / 32_000) * 100) / 100;
  const text = fixed ?? `This is a mock transcript of ${file instanceof File ? file.name : "audio"}.`;
  switch (body.response_format) {
    case "verbose_json":
      return json({ task: "transcribe", language: "english", duration, text, segments: [{ id: 0, seek: 0, start: 0, end: duration, text }] });
    case "text":
    case "srt":
    case "vtt":
      return new Response(text, { headers: { "content-type": "text/plain; charset=utf-8" } });
    default:
      return json({ text, usage: { type: "duration", seconds: Math.ceil(duration) } });
  }
}

const AUDIO_TYPES: Record<string, string> = { mp3: "audio/mpeg", opus: "audio/ogg", aac: "audio/aac", flac: "audio/flac", wav: "audio/wav", pcm: "audio/pcm" };

/** Silence: a RIFF/WAV header and 100 bytes of samples per character of input, in the asked format's content type. */
function speech(body: WireJson): Response {
  const samples = String(body.input ?? "").length * 100;
  const bytes = new Uint8Array(44 + samples);
  bytes.set(encoder.encode("RIFF"), 0);
  bytes.set(encoder.encode("WAVE"), 8);
  const format = typeof body.response_format === "string" ? body.response_format : "mp3";
  return new Response(bytes, { headers: { "content-type": AUDIO_TYPES[format] ?? "audio/mpeg" } });
}

const MODERATION_CATEGORIES = ["harassment", "hate", "self-harm", "sexual", "violence"];
/** Words the mock flags as violence, so a test can see both answers. */
const VIOLENT = /\b(kill|attack|hurt)\b/i;

function moderations(body: WireJson): Response {
  const inputs = Array.isArray(body.input) ? body.input.map((x) => (typeof x === "string" ? x : String((x as WireJson).text ?? ""))) : [String(body.input ?? "")];
  const results = inputs.map((text) => {
    const violent = VIOLENT.test(text);
    const categories = Object.fromEntries(MODERATION_CATEGORIES.map((c) => [c, c === "violence" && violent]));
    const scores = Object.fromEntries(MODERATION_CATEGORIES.map((c) => [c, c === "violence" && violent ? 0.97 : 0.0001]));
    return { flagged: violent, categories, category_scores: scores };
  });
  return json({ id: nextId("modr"), model: body.model, results });
}

export function respond(path: string, body: WireJson, fixedReply: string | undefined): Response {
  if (path.endsWith("/moderations")) return moderations(body);
  if (path.endsWith("/audio/speech")) return speech(body);
  if (path.endsWith("/images/generations")) return images(body);
  if (path.endsWith("/audio/transcriptions")) return transcription(body, fixedReply);
  if (path.endsWith("/chat/completions")) return chat(body, fixedReply);
  if (path.endsWith("/completions")) return completion(body, fixedReply);
  if (path.endsWith("/embeddings")) return embeddings(body);
  return new Response(JSON.stringify({ error: { message: `mock: unknown path ${path}`, type: "invalid_request_error" } }), {
    status: 404,
    headers: { "content-type": "application/json" },
  });
}
