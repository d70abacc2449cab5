/**
 * A mock Google upstream that answers in Google's own wire format, on both of its hosts' paths:
 *
 *   AI Studio  POST /v1beta/models/{model}:{method}            key in `x-goog-api-key` (or `?key=`)
 *   Vertex AI  POST /v1/projects/{p}/locations/{l}/publishers/{google|anthropic}/models/{model}:{method}
 *              bearer token issued by the mock's OAuth endpoint, POST /token (a service account's
 *              signed JWT grant, verified against its public key)
 *
 * Methods: generateContent, streamGenerateContent (`?alt=sse`: `data: {…}\r\n\r\n` events, as
 * Google frames them; without it a JSON array), countTokens, batchEmbedContents, predict
 * (Vertex embeddings), and for the `anthropic` publisher rawPredict / streamRawPredict
 * (Anthropic's Messages format) and the `count-tokens` pseudo-model.
 *
 * Requests are checked as Google checks them: unknown fields (at any level, schemas included) are
 * a 400 naming the field, empty parts and text are refused, roles must be user/model. Errors use
 * Google's body `{"error": {"code", "message", "status", "details"?}}`; JSON answers are pretty
 * printed and SSE events use Google's `{"key": value,"next": …}` spacing.
 *
 * Deterministic replies: "Mock reply to: <first words of the last user text>", one SSE event per
 * word. A prompt containing BLOCKME is blocked (`promptFeedback.blockReason: SAFETY`), UNSAFE_OUTPUT
 * ends the answer with finishReason SAFETY; "weather" (or tool mode ANY) calls the first function;
 * a function response is answered with "Tool said: <its JSON>"; `thinkingConfig.includeThoughts`
 * adds a thought part (and a thoughtSignature on function calls); `cachedContent` reports half the
 * prompt as cached.
 */
import { createPublicKey, type KeyObject, verify } from "node:crypto";
import type { Server } from "bun";
import { renderedText, shapedStream, type WireShaper } from "./wire-shape.ts";

// ---------------------------------------------------------------------------------------------
// Public types

interface FaultTarget {
  /** Applies only to requests whose path contains this (":streamGenerateContent", "/token", "publishers/anthropic"). */
  path?: string;
}

export type Fault = FaultTarget &
  (
    | { /** Answer with this status; the body defaults to Google's error body for it. */ kind: "status"; status: number; body?: string | object; headers?: Record<string, string> }
    | { kind: "delay"; ms: number }
    | { /** Never answer: the request stays open until the client aborts. */ kind: "hang" }
    | { /** 200 whose JSON (or first SSE event) is cut in half. */ kind: "invalidJson" }
    | { /** Send this many SSE events, then reset the connection; a JSON answer is cut in half. */ kind: "cutStream"; afterEvents: number }
    | { /** Answer 200 with this JSON body (pretty printed, as Google does), whatever was asked (with `checked`: a generateContent request Google would refuse gets its 400 instead). */ kind: "canned"; body: unknown; checked?: boolean }
    | { /** Answer 200 with an SSE stream of exactly these byte chunks (each written separately); `checked` as for canned. */ kind: "cannedStream"; chunks: string[]; checked?: boolean }
    | { /** A stream's bytes cut, replaced or ended as the shaper says (wire-shape.ts); a JSON answer is sent as usual. */ kind: "wire"; shape: WireShaper }
    | { /** 200 with this JSON body instead of the planned answer, once the request passed the mock's checks (a test's own answer). */ kind: "answer"; body: unknown }
  );

export interface RecordedRequest {
  method: string;
  /** Path with query string. */
  path: string;
  /** Header names lower-cased. */
  headers: Record<string, string>;
  /** Parsed JSON body; the raw text when it is not JSON (the token endpoint's form). */
  body: unknown;
}

export interface TokenGrant {
  /** The service account (`iss` of the signed grant). */
  email: string;
  scope: string;
  accessToken: string;
}

export interface ServiceAccount {
  email: string;
  /** The key's public half (PEM, or a KeyObject), to verify its signed grants. */
  publicKey: string | KeyObject;
}

export interface MockGeminiOptions {
  port?: number;
  /** AI Studio: when set, every AI Studio call must carry this key. */
  apiKey?: string;
  /** Vertex AI: when set, Vertex calls need a token the mock issued to one of these accounts. */
  serviceAccounts?: ServiceAccount[];
  /** Lifetime of issued tokens (`expires_in`), default 3599 s as Google's. */
  tokenTtlSeconds?: number;
  /** Prompts over this many tokens (estimated at 4 characters each) are refused, default 1,048,576. */
  maxInputTokens?: number;
  /** Report `usageMetadata` on batchEmbedContents answers (newer API versions do). */
  embeddingUsage?: boolean;
  record?: boolean;
}

export interface MockGemini {
  /** The host base (`http://127.0.0.1:PORT`): `api_base` for both AI Studio and Vertex deployments. */
  readonly url: string;
  /** The OAuth token endpoint, for a service-account key's `token_uri`. */
  readonly tokenUrl: string;
  readonly port: number;
  readonly requests: RecordedRequest[];
  readonly grants: TokenGrant[];
  readonly streamsCancelled: number;
  fault(...faults: Fault[]): void;
  /** Clears requests, grants, faults and counters; issued tokens stay valid. */
  reset(): void;
  stop(): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Helpers

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);
const encoder = new TextEncoder();
const approxTokens = (text: string) => Math.ceil(text.length / 4);

function randomBase64Url(bytes: number): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(bytes))).toString("base64url");
}

/** Google's SSE JSON: `{"key": value,"next": value}` (a space after each colon, none after commas). */
export function googleCompact(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(googleCompact).join(",")}]`;
  if (isObject(v)) {
    const members = Object.entries(v).filter(([, x]) => x !== undefined);
    return `{${members.map(([k, x]) => `${JSON.stringify(k)}: ${googleCompact(x)}`).join(",")}}`;
  }
  return JSON.stringify(v);
}

const pretty = (v: unknown) => JSON.stringify(v, null, 2);

function googleHeaders(contentType: string, started: number): Record<string, string> {
  return {
    "content-type": contentType,
    vary: "Origin, X-Origin, Referer",
    server: "scaffolding on HTTPServer2",
    "x-xss-protection": "0",
    "x-frame-options": "SAMEORIGIN",
    "x-content-type-options": "nosniff",
    "server-timing": `gfet4t7; dur=${Math.round(performance.now() - started)}`,
  };
}

// ---------------------------------------------------------------------------------------------
// Errors

const STATUS_NAME: Record<number, string> = {
  400: "INVALID_ARGUMENT",
  401: "UNAUTHENTICATED",
  403: "PERMISSION_DENIED",
  404: "NOT_FOUND",
  429: "RESOURCE_EXHAUSTED",
  500: "INTERNAL",
  503: "UNAVAILABLE",
  504: "DEADLINE_EXCEEDED",
};

const DEFAULT_MESSAGE: Record<number, string> = {
  400: "Request contains an invalid argument.",
  401: "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.",
  403: "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
  404: "Requested entity was not found.",
  429: "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
  500: "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
  503: "The model is overloaded. Please try again later.",
  504: "The request timed out. Please try again.",
};

export function googleError(code: number, message = DEFAULT_MESSAGE[code] ?? "Unknown error.", details?: unknown[]): Json {
  const error: Json = { code, message, status: STATUS_NAME[code] ?? (code >= 500 ? "INTERNAL" : "FAILED_PRECONDITION") };
  if (details) error.details = details;
  return { error };
}

function errorResponse(started: number, code: number, message?: string, details?: unknown[]): Response {
  return new Response(pretty(googleError(code, message, details)), { status: code, headers: googleHeaders("application/json; charset=UTF-8", started) });
}

const invalid = (started: number, message: string) => errorResponse(started, 400, message);

// ---------------------------------------------------------------------------------------------
// Request checks: Google refuses what it does not know

const TOP_LEVEL = ["contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings", "cachedContent", "labels"];
const GENERATION_CONFIG = [
  "stopSequences",
  "responseMimeType",
  "responseSchema",
  "responseJsonSchema",
  "candidateCount",
  "maxOutputTokens",
  "temperature",
  "topP",
  "topK",
  "seed",
  "presencePenalty",
  "frequencyPenalty",
  "responseLogprobs",
  "logprobs",
  "thinkingConfig",
  "responseModalities",
  "mediaResolution",
];
const PART = ["text", "thought", "thoughtSignature", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode", "codeExecutionResult", "videoMetadata"];
const SCHEMA = ["type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems", "properties", "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern", "example", "anyOf", "propertyOrdering", "default", "items", "minimum", "maximum"];
const SCHEMA_TYPES = ["TYPE_UNSPECIFIED", "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL", "string", "number", "integer", "boolean", "array", "object", "null"];

const unknownName = (name: string, at: string) => `Invalid JSON payload received. Unknown name "${name}" at '${at}': Cannot find field.`;

function unknownKey(obj: Json, allowed: readonly string[], at: string): string | undefined {
  for (const k of Object.keys(obj)) if (!allowed.includes(k)) return unknownName(k, at);
  return undefined;
}

function checkSchema(schema: unknown, at: string): string | undefined {
  if (!isObject(schema)) return `Invalid value at '${at}': expected a Schema object`;
  const bad = unknownKey(schema, SCHEMA, at);
  if (bad) return bad;
  if (schema.type !== undefined && !SCHEMA_TYPES.includes(String(schema.type))) return `Invalid value at '${at}.type' (type.googleapis.com/google.ai.generativelanguage.v1beta.Type), "${String(schema.type)}"`;
  if (isObject(schema.properties)) {
    for (const [name, sub] of Object.entries(schema.properties)) {
      const e = checkSchema(sub, `${at}.properties[${name}].value`);
      if (e) return e;
    }
  }
  if (schema.items !== undefined) return checkSchema(schema.items, `${at}.items`);
  for (const [i, s] of (Array.isArray(schema.anyOf) ? schema.anyOf : []).entries()) {
    const e = checkSchema(s, `${at}.any_of[${i}]`);
    if (e) return e;
  }
  return undefined;
}

function checkParts(parts: unknown, at: string): string | undefined {
  if (!Array.isArray(parts) || parts.length === 0) return `* GenerateContentRequest.${at}.parts: contents.parts must not be empty.\n`;
  for (const [i, p] of parts.entries()) {
    if (!isObject(p)) return `Invalid value at '${at}.parts[${i}]'`;
    const bad = unknownKey(p, PART, `${at}.parts[${i}]`);
    if (bad) return bad;
    if (p.text === "") return "Unable to submit request because it has an empty text parameter. Add a value to the parameter and try again.";
    if (isObject(p.inlineData) && (typeof p.inlineData.mimeType !== "string" || typeof p.inlineData.data !== "string")) return `* GenerateContentRequest.${at}.parts[${i}].inline_data: mime_type and data are required\n`;
    if (isObject(p.functionResponse) && (typeof p.functionResponse.name !== "string" || p.functionResponse.name === "")) return `* GenerateContentRequest.${at}.parts[${i}].function_response.name: Name cannot be empty.\n`;
  }
  return undefined;
}

/** The most candidates Gemini gives for one request. */
const MAX_CANDIDATES = 8;

function checkGenerateRequest(body: Json): string | undefined {
  const bad = unknownKey(body, TOP_LEVEL, "");
  if (bad) return bad.replace(" at ''", "");
  if (!Array.isArray(body.contents) || body.contents.length === 0) return "* GenerateContentRequest.contents: contents is not specified\n";
  for (const [i, c] of body.contents.entries()) {
    if (!isObject(c)) return `Invalid value at 'contents[${i}]'`;
    const cBad = unknownKey(c, ["role", "parts"], `contents[${i}]`);
    if (cBad) return cBad;
    if (c.role !== undefined && c.role !== "user" && c.role !== "model") return "Please use a valid role: user, model.";
    const e = checkParts(c.parts, `contents[${i}]`);
    if (e) return e;
  }
  if (body.systemInstruction !== undefined) {
    if (!isObject(body.systemInstruction)) return "Invalid value at 'system_instruction'";
    const e = checkParts(body.systemInstruction.parts, "system_instruction");
    if (e) return e;
  }
  if (body.generationConfig !== undefined) {
    if (!isObject(body.generationConfig)) return "Invalid value at 'generation_config'";
    const gBad = unknownKey(body.generationConfig, GENERATION_CONFIG, "generation_config");
    if (gBad) return gBad;
    // Google's own bound; the mock would otherwise build that many candidates.
    const count = body.generationConfig.candidateCount;
    if (typeof count === "number" && count > MAX_CANDIDATES) return `Invalid value at 'generation_config.candidate_count' (${count}): must be at most ${MAX_CANDIDATES}.`;
    if (body.generationConfig.responseSchema !== undefined) {
      const e = checkSchema(body.generationConfig.responseSchema, "generation_config.response_schema");
      if (e) return e;
    }
  }
  if (body.tools !== undefined) {
    if (!Array.isArray(body.tools)) return "Invalid value at 'tools'";
    for (const [i, t] of body.tools.entries()) {
      if (!isObject(t)) return `Invalid value at 'tools[${i}]'`;
      const tBad = unknownKey(t, ["functionDeclarations", "googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext", "retrieval"], `tools[${i}]`);
      if (tBad) return tBad;
      for (const [j, fn] of (Array.isArray(t.functionDeclarations) ? t.functionDeclarations : []).entries()) {
        const at = `tools[${i}].function_declarations[${j}]`;
        if (!isObject(fn) || typeof fn.name !== "string" || fn.name === "") return `* GenerateContentRequest.${at}.name: Name cannot be empty.\n`;
        const fBad = unknownKey(fn, ["name", "description", "parameters", "parametersJsonSchema", "response", "behavior"], at);
        if (fBad) return fBad;
        const params = fn.parameters;
        if (params !== undefined) {
          const e = checkSchema(params, `${at}.parameters`);
          if (e) return e;
          if (isObject(params) && String(params.type).toUpperCase() === "OBJECT" && (!isObject(params.properties) || Object.keys(params.properties).length === 0)) {
            return `* GenerateContentRequest.${at}.parameters.properties: should be non-empty for OBJECT type\n`;
          }
        }
      }
    }
  }
  if (body.toolConfig !== undefined) {
    const fc = isObject(body.toolConfig) ? body.toolConfig.functionCallingConfig : undefined;
    if (!isObject(fc) || !["AUTO", "ANY", "NONE", "VALIDATED"].includes(String(fc.mode))) return "Invalid value at 'tool_config.function_calling_config.mode'";
  }
  return undefined;
}

// ---------------------------------------------------------------------------------------------
// Deterministic generation

interface Turn {
  role: string;
  parts: Json[];
}

const turns = (body: Json): Turn[] => (body.contents as Json[]).map((c) => ({ role: str(c.role) ?? "user", parts: c.parts as Json[] }));

function partsText(parts: Json[]): string {
  return parts.map((p) => (typeof p.text === "string" && p.thought !== true ? p.text : "")).join(" ");
}

function promptChars(body: Json): number {
  let chars = 0;
  const count = (parts: unknown) => {
    for (const p of Array.isArray(parts) ? parts : []) {
      if (!isObject(p)) continue;
      if (typeof p.text === "string") chars += p.text.length;
      if (isObject(p.functionCall) || isObject(p.functionResponse)) {
        // The id only pairs a call with its result: the model reads the name and the arguments or result.
        const { id: _, ...read } = (p.functionCall ?? p.functionResponse) as Json;
        chars += JSON.stringify(read).length;
      }
      if (p.inlineData || p.fileData) chars += 1032; // Google counts an image as 258 tokens
    }
  };
  for (const c of body.contents as Json[]) count(c.parts);
  if (isObject(body.systemInstruction)) count(body.systemInstruction.parts);
  if (body.tools !== undefined) chars += JSON.stringify(body.tools).length;
  return chars;
}

function lastUserText(body: Json): string {
  const list = turns(body);
  for (let i = list.length - 1; i >= 0; i--) if (list[i]!.role === "user") return partsText(list[i]!.parts);
  return "";
}

function mockValue(key: string, schema: unknown): unknown {
  if (!isObject(schema)) return "mock";
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum[0];
  switch (String(schema.type).toUpperCase()) {
    case "NUMBER":
    case "INTEGER":
      return 1;
    case "BOOLEAN":
      return true;
    case "ARRAY":
      return [mockValue(key, schema.items)];
    case "OBJECT":
      return mockObject(schema);
    default:
      return /location|city|place/i.test(key) ? "Paris" : "mock";
  }
}

function mockObject(schema: Json): Json {
  const out: Json = {};
  for (const [k, s] of Object.entries(isObject(schema.properties) ? schema.properties : {})) out[k] = mockValue(k, s);
  return out;
}

interface FunctionSpec {
  name: string;
  parameters: unknown;
}

function chosenFunction(body: Json, userText: string): FunctionSpec | undefined {
  const decls: FunctionSpec[] = [];
  for (const t of Array.isArray(body.tools) ? (body.tools as Json[]) : []) {
    for (const fn of Array.isArray(t.functionDeclarations) ? (t.functionDeclarations as Json[]) : []) decls.push({ name: String(fn.name), parameters: fn.parameters });
  }
  if (decls.length === 0) return undefined;
  const fc = isObject(body.toolConfig) && isObject(body.toolConfig.functionCallingConfig) ? body.toolConfig.functionCallingConfig : {};
  if (fc.mode === "NONE") return undefined;
  // A function's result was just given: the model answers with text.
  const last = turns(body).at(-1);
  if (last?.parts.some((p) => p.functionResponse)) return undefined;
  const allowed = Array.isArray(fc.allowedFunctionNames) ? (fc.allowedFunctionNames as string[]) : [];
  if (fc.mode === "ANY") return decls.find((d) => allowed.includes(d.name)) ?? decls[0];
  return /\bweather\b/i.test(userText) ? decls[0] : undefined;
}

const REPLY_WORDS = 12;

interface Plan {
  model: string;
  responseId: string;
  n: number;
  blocked: boolean;
  /** Text pieces (one per SSE event), or the function call. */
  pieces: string[];
  call?: { name: string; args: Json };
  thought?: string;
  signature?: string;
  finish: "STOP" | "MAX_TOKENS" | "SAFETY";
  promptTokens: number;
  cachedTokens: number;
}

function plan(model: string, body: Json): Plan {
  const userText = lastUserText(body);
  const config = isObject(body.generationConfig) ? body.generationConfig : {};
  const thinking = isObject(config.thinkingConfig) && config.thinkingConfig.includeThoughts === true;
  const promptTokens = approxTokens(" ".repeat(promptChars(body)));
  const p: Plan = {
    model,
    responseId: randomBase64Url(17).replace(/[-_]/g, "x"),
    n: typeof config.candidateCount === "number" ? config.candidateCount : 1,
    blocked: /BLOCKME/.test(JSON.stringify(body.contents)),
    pieces: [],
    finish: "STOP",
    promptTokens,
    cachedTokens: typeof body.cachedContent === "string" ? Math.floor(promptTokens / 2) : 0,
  };
  if (thinking) p.thought = `Thinking about: ${userText.split(/\s+/).slice(0, 4).join(" ")}`;
  const fn = chosenFunction(body, userText);
  if (fn) {
    p.call = { name: fn.name, args: mockObject(isObject(fn.parameters) ? fn.parameters : {}) };
    if (thinking) p.signature = `mock-sig-${randomBase64Url(12)}`;
    return p;
  }
  const last = turns(body).at(-1);
  const toolResult = last?.parts.find((part) => isObject(part.functionResponse));
  let words: string[];
  if (toolResult) words = `Tool said: ${JSON.stringify((toolResult.functionResponse as Json).response)}`.split(" ");
  else if (config.responseMimeType === "application/json") {
    const value = isObject(config.responseSchema) ? mockValue("reply", config.responseSchema) : { reply: `Mock reply to: ${userText}` };
    words = JSON.stringify(value).split(/(?<=,)/);
  } else words = ["Mock", "reply", "to:", ...userText.split(/\s+/).filter(Boolean).slice(0, REPLY_WORDS)];
  const max = typeof config.maxOutputTokens === "number" ? config.maxOutputTokens : undefined;
  if (max !== undefined && words.length > max) {
    words = words.slice(0, max);
    p.finish = "MAX_TOKENS";
  }
  if (/UNSAFE_OUTPUT/.test(userText)) {
    words = words.slice(0, 2);
    p.finish = "SAFETY";
  }
  const joiner = config.responseMimeType === "application/json" ? "" : " ";
  p.pieces = words.map((w, i) => (i === 0 ? w : `${joiner}${w}`));
  return p;
}

const thoughtTokens = (p: Plan) => (p.thought ? approxTokens(p.thought) : 0);
const outputTokens = (p: Plan) => (p.call ? approxTokens(JSON.stringify(p.call)) : p.pieces.length) * p.n;

function usage(p: Plan, final: boolean): Json {
  const u: Json = { promptTokenCount: p.promptTokens };
  if (final && !p.blocked) u.candidatesTokenCount = outputTokens(p);
  const thoughts = final ? thoughtTokens(p) * p.n : 0;
  u.totalTokenCount = p.promptTokens + (final && !p.blocked ? outputTokens(p) : 0) + thoughts;
  if (p.cachedTokens) u.cachedContentTokenCount = p.cachedTokens;
  u.promptTokensDetails = [{ modality: "TEXT", tokenCount: p.promptTokens }];
  if (p.cachedTokens) u.cacheTokensDetails = [{ modality: "TEXT", tokenCount: p.cachedTokens }];
  if (thoughts) u.thoughtsTokenCount = thoughts;
  return u;
}

const SAFETY_RATINGS = [
  { category: "HARM_CATEGORY_HATE_SPEECH", probability: "NEGLIGIBLE" },
  { category: "HARM_CATEGORY_DANGEROUS_CONTENT", probability: "HIGH", blocked: true },
  { category: "HARM_CATEGORY_HARASSMENT", probability: "NEGLIGIBLE" },
  { category: "HARM_CATEGORY_SEXUALLY_EXPLICIT", probability: "NEGLIGIBLE" },
];

function blockedResponse(p: Plan): Json {
  return { promptFeedback: { blockReason: "SAFETY", safetyRatings: SAFETY_RATINGS }, usageMetadata: usage(p, true), modelVersion: p.model, responseId: p.responseId };
}

function candidateParts(p: Plan, pieces: string[], withThought: boolean): Json[] {
  const parts: Json[] = [];
  if (withThought && p.thought) parts.push({ text: p.thought, thought: true });
  if (p.call) parts.push(p.signature ? { functionCall: p.call, thoughtSignature: p.signature } : { functionCall: p.call });
  else if (pieces.length > 0) parts.push({ text: pieces.join("") });
  return parts;
}

function candidate(p: Plan, index: number, parts: Json[], finished: boolean): Json {
  const c: Json = {};
  if (parts.length > 0) c.content = { parts, role: "model" };
  if (finished) {
    c.finishReason = p.finish;
    if (p.finish === "SAFETY") c.safetyRatings = SAFETY_RATINGS;
  }
  c.index = index;
  return c;
}

function generateResponse(p: Plan): Json {
  if (p.blocked) return blockedResponse(p);
  const candidates = Array.from({ length: p.n }, (_, i) => candidate(p, i, candidateParts(p, p.finish === "SAFETY" ? [] : p.pieces, true), true));
  return { candidates, usageMetadata: usage(p, true), modelVersion: p.model, responseId: p.responseId };
}

/** One event per piece (the thought first, a function call whole), the last with finishReason and the final usage. */
function streamEvents(p: Plan): Json[] {
  if (p.blocked) return [blockedResponse(p)];
  const steps: { pieces: string[]; thought: boolean }[] = [];
  if (p.thought) steps.push({ pieces: [], thought: true });
  if (p.call) steps.push({ pieces: [], thought: false });
  else for (const piece of p.finish === "SAFETY" ? [""] : p.pieces) steps.push({ pieces: piece ? [piece] : [], thought: false });
  return steps.map((step, i) => {
    const last = i === steps.length - 1;
    const parts = step.thought ? [{ text: p.thought, thought: true }] : candidateParts({ ...p, thought: undefined }, step.pieces, false);
    const candidates = Array.from({ length: p.n }, (_, index) => candidate(p, index, parts, last));
    return { candidates, usageMetadata: usage(p, last), modelVersion: p.model, responseId: p.responseId };
  });
}

// ---------------------------------------------------------------------------------------------
// Embeddings and token counts

const DIMENSIONS = 3072;

function fnv1a(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
}

/** A unit vector derived from the text (float32-exact, so JSON and base64 decode to the same numbers). */
export function mockGeminiEmbedding(text: string, dimensions = DIMENSIONS): number[] {
  let state = fnv1a(text) || 1;
  const next = () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return ((state >>> 0) % 100000) / 100000;
  };
  const raw = Array.from({ length: dimensions }, () => next() * 2 - 1);
  const norm = Math.hypot(...raw) || 1;
  return raw.map((x) => Math.fround(x / norm));
}

function embedText(content: unknown): string | undefined {
  if (!isObject(content) || !Array.isArray(content.parts) || content.parts.length === 0) return undefined;
  return (content.parts as Json[]).map((p) => str(p.text) ?? "").join("");
}

// ---------------------------------------------------------------------------------------------
// Claude on Vertex (the anthropic publisher): Anthropic's Messages format

function claudeUserText(body: Json): string {
  const messages = Array.isArray(body.messages) ? (body.messages as Json[]) : [];
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i]!;
    if (m.role !== "user") continue;
    if (typeof m.content === "string") return m.content;
    if (Array.isArray(m.content)) return (m.content as Json[]).map((b) => (b.type === "text" ? String(b.text) : "")).join(" ");
  }
  return "";
}

function claudeReply(model: string, body: Json): { message: Json; words: string[]; tool?: Json } {
  const text = claudeUserText(body);
  const tools = Array.isArray(body.tools) ? (body.tools as Json[]) : [];
  const id = `msg_vrtx_${randomBase64Url(18)}`;
  const input = approxTokens(JSON.stringify(body.messages ?? [])) + approxTokens(JSON.stringify(body.system ?? ""));
  if (tools.length > 0 && /\bweather\b/i.test(text)) {
    const tool = { type: "tool_use", id: `toolu_vrtx_${randomBase64Url(18)}`, name: String(tools[0]!.name), input: mockObject(isObject(tools[0]!.input_schema) ? tools[0]!.input_schema : {}) };
    return {
      message: { id, type: "message", role: "assistant", model, content: [tool], stop_reason: "tool_use", stop_sequence: null, usage: { input_tokens: input, output_tokens: 12 } },
      words: [],
      tool,
    };
  }
  const words = ["Mock", "reply", "to:", ...text.split(/\s+/).filter(Boolean).slice(0, REPLY_WORDS)].map((w, i) => (i === 0 ? w : ` ${w}`));
  return {
    message: { id, type: "message", role: "assistant", model, content: [{ type: "text", text: words.join("") }], stop_reason: "end_turn", stop_sequence: null, usage: { input_tokens: input, output_tokens: words.length } },
    words,
  };
}

const anthropicEvent = (type: string, data: Json) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

function claudeStream(reply: ReturnType<typeof claudeReply>): string[] {
  const m = reply.message;
  const usage = m.usage as Json;
  const events = [anthropicEvent("message_start", { message: { ...m, content: [], stop_reason: null, usage: { input_tokens: usage.input_tokens, output_tokens: 1 } } })];
  if (reply.tool) {
    events.push(anthropicEvent("content_block_start", { index: 0, content_block: { ...reply.tool, input: {} } }));
    events.push(anthropicEvent("content_block_delta", { index: 0, delta: { type: "input_json_delta", partial_json: JSON.stringify(reply.tool.input) } }));
  } else {
    events.push(anthropicEvent("content_block_start", { index: 0, content_block: { type: "text", text: "" } }));
    for (const w of reply.words) events.push(anthropicEvent("content_block_delta", { index: 0, delta: { type: "text_delta", text: w } }));
  }
  events.push(anthropicEvent("content_block_stop", { index: 0 }));
  events.push(anthropicEvent("message_delta", { delta: { stop_reason: m.stop_reason, stop_sequence: null }, usage: { output_tokens: usage.output_tokens } }));
  events.push(anthropicEvent("message_stop", {}));
  return events;
}

function anthropicError(status: number, type: string, message: string): Response {
  return new Response(JSON.stringify({ type: "error", error: { type, message } }), { status, headers: { "content-type": "application/json" } });
}

// ---------------------------------------------------------------------------------------------
// Delivery

interface MockState {
  requests: RecordedRequest[];
  grants: TokenGrant[];
  faults: Fault[];
  tokens: Set<string>;
  streamsCancelled: number;
}

const CUT_FLUSH_MS = 10;

/** One part per pull; `cutAfter` resets the connection after that many parts (no clean end). */
function partStream(parts: string[], state: MockState, cutAfter?: number): ReadableStream<Uint8Array> {
  let sent = 0;
  let over = false;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (cutAfter !== undefined && sent >= cutAfter) {
          over = true;
          await Bun.sleep(CUT_FLUSH_MS);
          controller.error(undefined);
          return;
        }
        controller.enqueue(encoder.encode(parts[sent] ?? ""));
        sent++;
        if (sent >= parts.length && !(cutAfter !== undefined && sent >= cutAfter)) {
          over = true;
          controller.close();
        }
      },
      cancel() {
        if (over) return;
        over = true;
        state.streamsCancelled++;
      },
    },
    { highWaterMark: 0 },
  );
}

const sseEvent = (payload: Json) => `data: ${googleCompact(payload)}\r\n\r\n`;

function deliverSse(started: number, parts: string[], fault: Fault | undefined, state: MockState): Response {
  const headers = googleHeaders("text/event-stream", started);
  if (fault?.kind === "invalidJson" && parts[0]) parts = [`${parts[0].slice(0, Math.floor(parts[0].length / 2))}\r\n\r\n`];
  if (fault?.kind === "wire") return new Response(shapedStream(renderedText(parts), fault.shape), { headers });
  return new Response(partStream(parts, state, fault?.kind === "cutStream" ? fault.afterEvents : undefined), { headers });
}

function deliverJson(started: number, body: unknown, fault: Fault | undefined, state: MockState): Response {
  let text = pretty(body);
  const headers = googleHeaders("application/json; charset=UTF-8", started);
  if (fault?.kind === "invalidJson") text = text.slice(0, Math.floor(text.length / 2));
  if (fault?.kind === "cutStream") return new Response(partStream([text.slice(0, Math.floor(text.length / 2))], state, 1), { headers });
  return new Response(text, { headers });
}

function faultResponse(started: number, f: Extract<Fault, { kind: "status" }>): Response {
  const text = f.body === undefined ? pretty(googleError(f.status)) : typeof f.body === "string" ? f.body : pretty(f.body);
  return new Response(text, { status: f.status, headers: { ...googleHeaders("application/json; charset=UTF-8", started), ...f.headers } });
}

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

// ---------------------------------------------------------------------------------------------
// OAuth token endpoint

function verifyGrant(form: URLSearchParams, accounts: ServiceAccount[]): { email: string; scope: string } | string {
  if (form.get("grant_type") !== "urn:ietf:params:oauth:grant-type:jwt-bearer") return "unsupported_grant_type";
  const [h, p, sig] = (form.get("assertion") ?? "").split(".");
  if (!h || !p || !sig) return "invalid_grant";
  let payload: Json;
  try {
    payload = JSON.parse(Buffer.from(p, "base64url").toString("utf8")) as Json;
  } catch {
    return "invalid_grant";
  }
  const account = accounts.find((a) => a.email === payload.iss);
  if (!account) return "invalid_grant";
  const key = typeof account.publicKey === "string" ? createPublicKey(account.publicKey) : account.publicKey;
  if (!verify("RSA-SHA256", Buffer.from(`${h}.${p}`), key, Buffer.from(sig, "base64url"))) return "invalid_grant";
  if (typeof payload.exp !== "number" || payload.exp * 1000 < Date.now()) return "invalid_grant";
  return { email: account.email, scope: str(payload.scope) ?? "" };
}

function tokenEndpoint(form: URLSearchParams, state: MockState, options: MockGeminiOptions): Response {
  const result = verifyGrant(form, options.serviceAccounts ?? []);
  const headers = { "content-type": "application/json; charset=utf-8", "cache-control": "no-cache, no-store, max-age=0, must-revalidate" };
  if (typeof result === "string") {
    const description = result === "invalid_grant" ? "Invalid JWT Signature." : "Invalid grant_type.";
    return new Response(pretty({ error: result, error_description: description }), { status: 400, headers });
  }
  const accessToken = `ya29.c.mock-${randomBase64Url(32)}`;
  state.tokens.add(accessToken);
  state.grants.push({ email: result.email, scope: result.scope, accessToken });
  return new Response(pretty({ access_token: accessToken, expires_in: options.tokenTtlSeconds ?? 3599, token_type: "Bearer" }), { headers });
}

// ---------------------------------------------------------------------------------------------
// Routing

const AI_STUDIO = /^\/(v1beta|v1)\/models\/([^/:]+):([A-Za-z]+)$/;
const VERTEX = /^\/(v1|v1beta1)\/projects\/([^/]+)\/locations\/([^/]+)\/publishers\/(google|anthropic)\/models\/([^/:]+):([A-Za-z]+)$/;

interface Target {
  api: "ai-studio" | "vertex";
  publisher: "google" | "anthropic";
  model: string;
  method: string;
}

function target(pathname: string): Target | undefined {
  const a = AI_STUDIO.exec(pathname);
  if (a) return { api: "ai-studio", publisher: "google", model: decodeURIComponent(a[2]!), method: a[3]! };
  const v = VERTEX.exec(pathname);
  if (v) return { api: "vertex", publisher: v[4] as "google" | "anthropic", model: decodeURIComponent(v[5]!), method: v[6]! };
  return undefined;
}

function checkAuth(started: number, req: Request, url: URL, t: Target, state: MockState, options: MockGeminiOptions): Response | undefined {
  if (t.api === "ai-studio") {
    if (options.apiKey === undefined) return undefined;
    const key = req.headers.get("x-goog-api-key") ?? url.searchParams.get("key");
    if (!key) return errorResponse(started, 403);
    if (key === options.apiKey) return undefined;
    return errorResponse(started, 400, "API key not valid. Please pass a valid API key.", [
      { "@type": "type.googleapis.com/google.rpc.ErrorInfo", reason: "API_KEY_INVALID", domain: "googleapis.com", metadata: { service: "generativelanguage.googleapis.com" } },
    ]);
  }
  if (!options.serviceAccounts) return undefined;
  const bearer = /^Bearer (.+)$/.exec(req.headers.get("authorization") ?? "")?.[1];
  if (bearer && state.tokens.has(bearer)) return undefined;
  return errorResponse(started, 401, undefined, [{ "@type": "type.googleapis.com/google.rpc.ErrorInfo", reason: "ACCESS_TOKEN_TYPE_UNSUPPORTED", domain: "googleapis.com" }]);
}

function countTokens(started: number, t: Target, body: Json): Response {
  let request: Json = body;
  if (t.api === "ai-studio") {
    if (body.generateContentRequest !== undefined && body.contents !== undefined) return invalid(started, "* CountTokensRequest: Either contents or generate_content_request must be set, not both.\n");
    if (isObject(body.generateContentRequest)) {
      const { model, ...rest } = body.generateContentRequest;
      if (model !== `models/${t.model}`) return invalid(started, `* CountTokensRequest.generate_content_request.model: model must be "models/${t.model}", got ${JSON.stringify(model)}\n`);
      request = rest;
    } else {
      const bad = unknownKey(body, ["contents"], "");
      if (bad) return invalid(started, bad.replace(" at ''", ""));
    }
  } else {
    const bad = unknownKey(body, ["contents", "systemInstruction", "tools", "generationConfig", "instances", "model"], "");
    if (bad) return invalid(started, bad.replace(" at ''", ""));
  }
  const e = checkGenerateRequest(request);
  if (e) return invalid(started, e);
  const tokens = approxTokens(" ".repeat(promptChars(request)));
  const answer: Json = { totalTokens: tokens };
  if (t.api === "vertex") answer.totalBillableCharacters = promptChars(request);
  answer.promptTokensDetails = [{ modality: "TEXT", tokenCount: tokens }];
  return new Response(pretty(answer), { headers: googleHeaders("application/json; charset=UTF-8", started) });
}

function batchEmbed(started: number, t: Target, body: Json, options: MockGeminiOptions): Response | Json {
  const bad = unknownKey(body, ["requests"], "");
  if (bad) return invalid(started, bad.replace(" at ''", ""));
  if (!Array.isArray(body.requests) || body.requests.length === 0) return invalid(started, "* BatchEmbedContentsRequest.requests: at least one request is required\n");
  if (body.requests.length > 100) return invalid(started, "* BatchEmbedContentsRequest.requests: at most 100 requests can be in one batch\n");
  const embeddings: Json[] = [];
  let tokens = 0;
  for (const [i, r] of (body.requests as unknown[]).entries()) {
    if (!isObject(r)) return invalid(started, `Invalid value at 'requests[${i}]'`);
    const rBad = unknownKey(r, ["model", "content", "taskType", "title", "outputDimensionality"], `requests[${i}]`);
    if (rBad) return invalid(started, rBad);
    if (r.model !== `models/${t.model}`) return invalid(started, `* BatchEmbedContentsRequest.model: Model names should match. Expected "models/${t.model}", got ${JSON.stringify(r.model)}.\n`);
    const text = embedText(r.content);
    if (text === undefined) return invalid(started, `* BatchEmbedContentsRequest.requests[${i}].content: contents is not specified\n`);
    tokens += approxTokens(text);
    embeddings.push({ values: mockGeminiEmbedding(text, typeof r.outputDimensionality === "number" ? r.outputDimensionality : DIMENSIONS) });
  }
  return options.embeddingUsage ? { embeddings, usageMetadata: { promptTokenCount: tokens, totalTokenCount: tokens } } : { embeddings };
}

function predictEmbed(started: number, t: Target, body: Json): Response | Json {
  if (!Array.isArray(body.instances) || body.instances.length === 0) return invalid(started, "instances must not be empty");
  if (body.instances.length > 250) return invalid(started, `Unable to submit request because it included too many instances. Reduce the number of instances and try again: at most 250 instances per request, got ${body.instances.length}.`);
  // Vertex's Gemini embedding models take one text per request.
  if (t.model.startsWith("gemini-embedding") && body.instances.length > 1) {
    return invalid(started, `Unable to submit request because it included too many instances. Reduce the number of instances and try again. Learn more: https://cloud.google.com/vertex-ai/generative-ai/docs/model-reference/text-embeddings: Unable to submit request because batchSize must be 1 but the entered value was ${body.instances.length}. Update the batchSize value and try again.`);
  }
  const params = isObject(body.parameters) ? body.parameters : {};
  const dims = typeof params.outputDimensionality === "number" ? params.outputDimensionality : 768;
  let chars = 0;
  const predictions = (body.instances as unknown[]).map((inst) => {
    const content = isObject(inst) ? str(inst.content) ?? "" : "";
    // Google bills code points, whitespace left out.
    chars += Array.from(content.replace(/\s/g, "")).length;
    return { embeddings: { statistics: { truncated: false, token_count: Math.max(1, approxTokens(content)) }, values: mockGeminiEmbedding(content, dims) } };
  });
  return { predictions, metadata: { billableCharacterCount: chars } };
}

function routeGoogle(started: number, t: Target, url: URL, body: Json, fault: Fault | undefined, state: MockState, options: MockGeminiOptions): Response {
  if (t.model.includes("nonexistent")) {
    const prefix = t.api === "ai-studio" ? `models/${t.model}` : `Publisher Model \`projects/p/locations/l/publishers/google/models/${t.model}\``;
    return errorResponse(started, 404, `${prefix} is not found for API version ${t.api === "ai-studio" ? "v1beta" : "v1"}, or is not supported for ${t.method}. Call ListModels to see the list of available models and their supported methods.`);
  }
  switch (t.method) {
    case "countTokens":
      return countTokens(started, t, body);
    case "batchEmbedContents": {
      const r = batchEmbed(started, t, body, options);
      if (r instanceof Response) return r;
      return fault?.kind === "answer" ? deliverJson(started, fault.body, undefined, state) : deliverJson(started, r, fault, state);
    }
    case "predict": {
      const r = predictEmbed(started, t, body);
      if (r instanceof Response) return r;
      return fault?.kind === "answer" ? deliverJson(started, fault.body, undefined, state) : deliverJson(started, r, fault, state);
    }
    case "generateContent":
    case "streamGenerateContent": {
      const e = checkGenerateRequest(body);
      if (e) return invalid(started, e);
      const max = options.maxInputTokens ?? 1_048_576;
      const input = approxTokens(" ".repeat(promptChars(body)));
      if (input > max) return invalid(started, `The input token count (${input}) exceeds the maximum number of tokens allowed (${max}).`);
      if (fault?.kind === "answer") return deliverJson(started, fault.body, undefined, state);
      const p = plan(t.model, body);
      if (t.method === "generateContent") return deliverJson(started, generateResponse(p), fault, state);
      if (url.searchParams.get("alt") !== "sse") return deliverJson(started, streamEvents(p), fault, state);
      return deliverSse(started, streamEvents(p).map(sseEvent), fault, state);
    }
    default:
      return errorResponse(started, 404, `Method ${t.method} is not found for ${t.model}.`);
  }
}

function routeAnthropic(started: number, t: Target, body: Json, fault: Fault | undefined, state: MockState): Response {
  if (t.model === "count-tokens" && t.method === "rawPredict") {
    if (typeof body.model !== "string") return anthropicError(400, "invalid_request_error", "model: Field required");
    return new Response(JSON.stringify({ input_tokens: approxTokens(JSON.stringify(body.messages ?? [])) + approxTokens(JSON.stringify(body.system ?? "")) }), { headers: { "content-type": "application/json" } });
  }
  if (t.method !== "rawPredict" && t.method !== "streamRawPredict") return errorResponse(started, 404, `Method ${t.method} is not found for ${t.model}.`);
  if (body.anthropic_version !== "vertex-2023-10-16") return anthropicError(400, "invalid_request_error", "anthropic_version: vertex-2023-10-16 is the only version Vertex AI accepts");
  if (body.model !== undefined) return anthropicError(400, "invalid_request_error", "model: Extra inputs are not permitted");
  if (!Array.isArray(body.messages) || typeof body.max_tokens !== "number") return anthropicError(400, "invalid_request_error", "messages and max_tokens are required");
  if (fault?.kind === "answer") return deliverJson(started, fault.body, undefined, state);
  const reply = claudeReply(t.model, body);
  if (t.method === "rawPredict" || body.stream !== true) return deliverJson(started, reply.message, fault, state);
  const events = claudeStream(reply);
  if (fault?.kind === "wire") return new Response(shapedStream(renderedText(events), fault.shape), { headers: { "content-type": "text/event-stream; charset=utf-8" } });
  return new Response(partStream(events, state, fault?.kind === "cutStream" ? fault.afterEvents : undefined), { headers: { "content-type": "text/event-stream; charset=utf-8" } });
}

function takeFault(faults: Fault[], path: string): Fault | undefined {
  const i = faults.findIndex((f) => f.path === undefined || path.includes(f.path));
  return i < 0 ? undefined : faults.splice(i, 1)[0];
}

async function handle(req: Request, state: MockState, options: MockGeminiOptions): Promise<Response> {
  const started = performance.now();
  const url = new URL(req.url);
  const raw = req.method === "POST" ? await req.text() : "";
  let parsed: unknown = raw;
  try {
    parsed = raw === "" ? undefined : JSON.parse(raw);
  } catch {
    // a form (token endpoint) or broken JSON: recorded as text
  }
  if (options.record !== false) state.requests.push({ method: req.method, path: url.pathname + url.search, headers: Object.fromEntries(req.headers), body: parsed });

  const fault = takeFault(state.faults, url.pathname + url.search);
  if (fault?.kind === "status") return faultResponse(started, fault);
  if (fault?.kind === "delay") await Bun.sleep(fault.ms);
  if (fault?.kind === "hang") {
    await untilAborted(req.signal);
    return new Response(null, { status: 499 });
  }

  if (req.method === "POST" && url.pathname === "/token") return tokenEndpoint(new URLSearchParams(raw), state, options);
  const t = target(url.pathname);
  if (!t || req.method !== "POST") return errorResponse(started, 404, `The requested URL ${url.pathname} was not found on this server.`);
  const denied = checkAuth(started, req, url, t, state, options);
  if (denied) return denied;

  if ((fault?.kind === "canned" || fault?.kind === "cannedStream") && fault.checked) {
    const e = isObject(parsed) ? checkGenerateRequest(parsed) : "Invalid JSON payload received.";
    if (e) return invalid(started, e);
  }
  if (fault?.kind === "canned") return new Response(typeof fault.body === "string" ? fault.body : pretty(fault.body), { headers: googleHeaders("application/json; charset=UTF-8", started) });
  if (fault?.kind === "cannedStream") return new Response(partStream(fault.chunks, state), { headers: googleHeaders("text/event-stream", started) });
  if (!isObject(parsed)) return invalid(started, `Invalid JSON payload received. Unexpected token.\n${raw.slice(0, 40)}\n^`);
  if (t.publisher === "anthropic") return routeAnthropic(started, t, parsed, fault, state);
  return routeGoogle(started, t, url, parsed, fault, state, options);
}

export async function startMockGemini(options: MockGeminiOptions = {}): Promise<MockGemini> {
  const state: MockState = { requests: [], grants: [], faults: [], tokens: new Set(), streamsCancelled: 0 };
  const server: Server<undefined> = Bun.serve({ hostname: "127.0.0.1", port: options.port ?? 0, idleTimeout: 0, fetch: (req) => handle(req, state, options) });
  const port = server.port ?? 0;
  const url = `http://127.0.0.1:${port}`;
  return {
    url,
    tokenUrl: `${url}/token`,
    port,
    get requests() {
      return state.requests;
    },
    get grants() {
      return state.grants;
    },
    get streamsCancelled() {
      return state.streamsCancelled;
    },
    fault: (...faults) => {
      state.faults.push(...faults);
    },
    reset: () => {
      state.requests.length = 0;
      state.grants.length = 0;
      state.faults.length = 0;
      state.streamsCancelled = 0;
    },
    stop: () => server.stop(true),
  };
}

if (import.meta.main) {
  const args = Bun.argv.slice(2);
  const at = args.indexOf("--port");
  const key = args.indexOf("--api-key");
  const mock = await startMockGemini({ port: at < 0 ? 0 : Number(args[at + 1]), apiKey: key < 0 ? undefined : args[key + 1], record: false });
  console.log(`listening ${mock.url}`);
}
