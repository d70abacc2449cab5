// The Gemini-style routes against a model kept in this test, seeded random
// (GEMINI_INBOUND_DIFF_SEED=<n> runs another set; GEMINI_INBOUND_DIFF_CASES=<n> more or fewer cases;
// every failure names the seed and the case). The client is Google's own SDK (@google/genai) with a
// virtual key. Each case is a random request of the kind users send (system instruction, turns of
// user and model with text, images, audio, thoughts, function calls and their responses with or
// without ids, function declarations with random schemas, tool modes, generation settings, JSON
// answers with a schema, thinking settings, safety settings), sent as generateContent,
// generateContentStream or countTokens to a random deployment: OpenAI-compatible ones (openai,
// groq, deepseek on the OpenAI mock) and a native Gemini one (the Gemini mock). The model, written
// from Google's Gemini API reference and OpenAI's chat API (not from the gateway's code), predicts:
// - the request the OpenAI mock receives (messages and roles, tool ids paired as Gemini pairs them,
//   tools and their JSON schemas, tool_choice, sampling fields, response_format, stream options);
//   for the Gemini mock, that the request means the same as the client's (turns, parts, tools,
//   tool mode, generation settings);
// - after the mock answers a random answer (text, reasoning, tool calls with random JSON arguments,
//   several candidates, a random finish reason, random usage with cached and reasoning tokens), the
//   response the SDK returns: parts, functionCall args, finishReason (stop→STOP, length→MAX_TOKENS,
//   tool_calls→STOP, content_filter→SAFETY), usageMetadata; for a stream, the text and calls
//   across chunks per candidate, one finishReason each, usage on the last chunk only;
// - countTokens: the count /utils/token_counter gives for the predicted OpenAI messages and tools;
// - what the gateway cannot do (Google-hosted tools, code execution parts, a context cache kept by
//   Google) and random bad input (wrong types, unknown roles, empty contents, missing names,
//   out-of-range settings): a 400 in Google's error shape `{error: {code: 400, message, status:
//   "INVALID_ARGUMENT"}}` (the SDK raises it as ApiError 400), nothing sent upstream, never a 5xx;
// - every call that reached an upstream is in the spend log with its model, deployment, provider,
//   tokens (cached and reasoning included) and stream flag.
// A quarter of the calls are sent by hand instead of through the SDK: field names in snake_case
// (proto JSON takes both), and streams without alt=sse (one JSON array).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ApiError, type GenerateContentResponse, GoogleGenAI } from "@google/genai";
import { sql } from "drizzle-orm";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { Random } from "../harness/random.ts";
import { type MockGemini, startMockGemini } from "../mock-upstream/gemini.ts";
import { type MockOpenAI, type ScriptedAnswer, startMockOpenAI } from "../mock-upstream/openai.ts";

const SEED = Number(process.env.GEMINI_INBOUND_DIFF_SEED ?? 4_021_977);
const CASES = Number(process.env.GEMINI_INBOUND_DIFF_CASES ?? 400);
const seedNote = `(GEMINI_INBOUND_DIFF_SEED=${SEED})`;
const OPENAI_KEY = "sk-upstream-openai-diff";
const GEMINI_KEY = "gemini-upstream-diff";

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const clone = <T>(v: T): T => JSON.parse(JSON.stringify(v)) as T;

// ---------------------------------------------------------------------------------------------
// Deployments

interface Deployment {
  name: string;
  model: string;
  upstream: string;
  provider: string;
  kind: "openai" | "gemini";
  /** The provider sends `reasoning_content` beside its answers (DeepSeek). */
  reasoning?: boolean;
}

const DEPLOYMENTS: Deployment[] = [
  { name: "oa-gpt", model: "openai/gpt-4o-mini", upstream: "gpt-4o-mini", provider: "openai", kind: "openai" },
  { name: "oa-groq", model: "groq/llama-3.3-70b-versatile", upstream: "llama-3.3-70b-versatile", provider: "groq", kind: "openai" },
  { name: "oa-deepseek", model: "deepseek/deepseek-reasoner", upstream: "deepseek-reasoner", provider: "deepseek", kind: "openai", reasoning: true },
  { name: "gm-flash", model: "gemini/gemini-2.5-flash", upstream: "gemini-2.5-flash", provider: "gemini", kind: "gemini" },
];

// ---------------------------------------------------------------------------------------------
// Random values

const LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const GLYPHS = ["é", "ß", "ж", "中", "文", "😀", "👩‍💻", "🇫🇷", "e\u0301", '"', "\\", "<", "&", "'", "\t", "{", "}"];

function ascii(rng: Random, n = 1 + rng.int(7)): string {
  return Array.from({ length: n }, () => LETTERS[rng.int(LETTERS.length)]).join("");
}

function word(rng: Random): string {
  return rng.chance(0.8) ? ascii(rng) : ascii(rng, 1) + Array.from({ length: 1 + rng.int(3) }, () => rng.pick(GLYPHS)).join("");
}

/** Non-empty text that is not only whitespace (Google refuses empty text parts). */
function text(rng: Random): string {
  const words = Array.from({ length: 1 + rng.int(8) }, () => word(rng));
  return `${words.join(rng.chance(0.1) ? "\n" : " ")}${rng.chance(0.2) ? "\n" : ""}`;
}

function jsonValue(rng: Random, depth: number): unknown {
  const kinds = depth >= 2 ? ["string", "int", "float", "bool", "null"] : ["string", "int", "float", "bool", "null", "array", "object"];
  switch (rng.pick(kinds)) {
    case "string":
      return rng.chance(0.2) ? "" : text(rng);
    case "int":
      return rng.int(2_000_001) - 1_000_000;
    case "float":
      return Math.round((rng.next() - 0.5) * 1e6) / 1e3 + 0.5;
    case "bool":
      return rng.chance(0.5);
    case "null":
      return null;
    case "array":
      return Array.from({ length: rng.int(4) }, () => jsonValue(rng, depth + 1));
    default:
      return jsonObject(rng, depth + 1);
  }
}

function jsonObject(rng: Random, depth = 0): Json {
  const out: Json = {};
  for (let i = 0; i < rng.int(4); i++) out[rng.chance(0.85) ? ascii(rng) : word(rng)] = jsonValue(rng, depth);
  return out;
}

const base64 = (rng: Random) => Buffer.from(Array.from({ length: 1 + rng.int(40) }, () => rng.int(256))).toString("base64");

// ---------------------------------------------------------------------------------------------
// Gemini schemas (OpenAPI 3.0 subset) and the JSON Schema they mean

const SCALARS = ["STRING", "NUMBER", "INTEGER", "BOOLEAN"];

function geminiSchema(rng: Random, depth: number): Json {
  const type = depth >= 2 ? rng.pick(SCALARS) : rng.pick([...SCALARS, "ARRAY", "OBJECT", "ANY_OF"]);
  if (type === "OBJECT") return objectSchema(rng, depth + 1);
  if (type === "ANY_OF") return { anyOf: rng.some(SCALARS, 3).map((t) => ({ type: t })), ...(rng.chance(0.3) ? { nullable: true } : {}) };
  const s: Json = { type };
  // int64 bounds: proto JSON writes them as strings, and either spelling is valid.
  if (type === "STRING" && rng.chance(0.2)) s.maxLength = rng.chance(0.5) ? "40" : 40;
  if (rng.chance(0.4)) s.description = text(rng);
  if (type === "STRING" && rng.chance(0.3)) s.enum = [ascii(rng), `${ascii(rng)}_2`];
  else if (rng.chance(0.2)) s.nullable = true;
  if ((type === "INTEGER" || type === "NUMBER") && rng.chance(0.3)) Object.assign(s, { minimum: 0, maximum: 10 + rng.int(100) });
  if (type === "ARRAY") {
    s.items = geminiSchema(rng, depth + 1);
    if (rng.chance(0.3)) s.minItems = rng.chance(0.5) ? String(rng.int(3)) : rng.int(3);
  }
  return s;
}

function objectSchema(rng: Random, depth = 0): Json {
  const properties: Json = {};
  for (let i = 0; i < 1 + rng.int(3); i++) properties[`${ascii(rng)}_${i}`] = geminiSchema(rng, depth);
  const keys = Object.keys(properties);
  const s: Json = { type: "OBJECT", properties };
  if (rng.chance(0.6)) s.required = keys.filter(() => rng.chance(0.5));
  if (rng.chance(0.2)) s.propertyOrdering = [...keys].reverse();
  if (rng.chance(0.2)) s.description = text(rng);
  return s;
}

/**
 * A Gemini Schema → JSON Schema, by OpenAPI 3.0's rules: type names lower-case, `nullable` as a
 * `null` type, int64 bounds as numbers; `propertyOrdering` has no JSON Schema meaning.
 */
const SCHEMA_RULES: Record<string, (v: unknown) => [string, unknown] | undefined> = {
  type: (v) => ["type", String(v).toLowerCase()],
  nullable: () => undefined,
  propertyOrdering: () => undefined,
  properties: (v) => ["properties", Object.fromEntries(Object.entries(v as Json).map(([k, s]) => [k, jsonSchemaOf(s as Json)]))],
  items: (v) => ["items", jsonSchemaOf(v as Json)],
  anyOf: (v) => ["anyOf", (v as Json[]).map(jsonSchemaOf)],
  minItems: (v) => ["minItems", Number(v)],
  maxLength: (v) => ["maxLength", Number(v)],
};

function jsonSchemaOf(schema: Json): Json {
  const out: Json = {};
  for (const [k, v] of Object.entries(schema)) {
    const rule = SCHEMA_RULES[k];
    const entry: [string, unknown] | undefined = rule ? rule(v) : [k, v];
    if (entry) out[entry[0]] = entry[1];
  }
  if (schema.nullable === true) {
    if (Array.isArray(out.anyOf)) out.anyOf = [...out.anyOf, { type: "null" }];
    else out.type = [out.type, "null"];
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Random Gemini requests (the wire shape, camelCase)

/** A user part with media, and the OpenAI content part it is documented to be. */
const MEDIA: [string, (data: string) => Json][] = [
  ["image/png", (d) => ({ type: "image_url", image_url: { url: `data:image/png;base64,${d}` } })],
  ["image/jpeg", (d) => ({ type: "image_url", image_url: { url: `data:image/jpeg;base64,${d}` } })],
  ["image/webp", (d) => ({ type: "image_url", image_url: { url: `data:image/webp;base64,${d}` } })],
  ["audio/wav", (d) => ({ type: "input_audio", input_audio: { data: d, format: "wav" } })],
  ["audio/mp3", (d) => ({ type: "input_audio", input_audio: { data: d, format: "mp3" } })],
];

const HARM = ["HARM_CATEGORY_HARASSMENT", "HARM_CATEGORY_HATE_SPEECH", "HARM_CATEGORY_SEXUALLY_EXPLICIT", "HARM_CATEGORY_DANGEROUS_CONTENT"];
const THRESHOLDS = ["BLOCK_NONE", "BLOCK_ONLY_HIGH", "BLOCK_MEDIUM_AND_ABOVE", "BLOCK_LOW_AND_ABOVE", "OFF"];

function userParts(rng: Random): Json[] {
  return Array.from({ length: 1 + rng.int(3) }, () => {
    if (rng.chance(0.7)) return { text: text(rng) };
    const [mimeType] = rng.pick(MEDIA);
    return { inlineData: { mimeType, data: base64(rng) } };
  });
}

interface RequestPlan {
  body: Json;
  /** Function names declared. */
  functions: string[];
}

function randomRequest(rng: Random, nextId: () => string): RequestPlan {
  const body: Json = {};
  const functions: string[] = [];
  if (rng.chance(0.5)) {
    const decls = Array.from({ length: 1 + rng.int(3) }, (_, i) => {
      const name = `fn_${ascii(rng)}_${i}`;
      functions.push(name);
      const d: Json = { name };
      if (rng.chance(0.7)) d.description = text(rng);
      // Parameters as a Gemini Schema, or (newer SDKs, MCP tools) as JSON Schema.
      if (rng.chance(0.7)) d.parameters = objectSchema(rng);
      else if (rng.chance(0.5)) d.parametersJsonSchema = { ...jsonSchemaOf(objectSchema(rng)), ...(rng.chance(0.5) ? { additionalProperties: false } : {}) };
      return d;
    });
    // Declarations in one Tool or spread over several.
    body.tools = rng.chance(0.5) ? [{ functionDeclarations: decls }] : decls.map((d) => ({ functionDeclarations: [d] }));
    if (rng.chance(0.6)) {
      const mode = rng.pick(["AUTO", "ANY", "NONE"]);
      const fcc: Json = { mode };
      if (mode === "ANY" && rng.chance(0.6)) fcc.allowedFunctionNames = rng.some(functions, 3);
      body.toolConfig = { functionCallingConfig: fcc };
    }
  }
  if (rng.chance(0.5)) body.systemInstruction = { parts: Array.from({ length: 1 + rng.int(2) }, () => ({ text: text(rng) })) };

  const contents: Json[] = [];
  let open: { name: string; id?: string }[] = [];
  const turns = 1 + 2 * rng.int(3);
  for (let t = 0; t < turns; t++) {
    if (t % 2 === 0) {
      const parts: Json[] = open.map((c) => ({ functionResponse: { ...(c.id && rng.chance(0.8) ? { id: c.id } : {}), name: c.name, response: jsonObject(rng) } }));
      open = [];
      if (parts.length === 0 || rng.chance(0.3)) parts.push(...userParts(rng));
      // The role may be left out: a content without one is the user's.
      contents.push(rng.chance(0.15) ? { parts } : { role: "user", parts });
    } else {
      const parts: Json[] = [];
      if (rng.chance(0.2)) parts.push({ text: text(rng), thought: true });
      for (let k = rng.int(3); k > 0; k--) parts.push({ text: text(rng) });
      const names = functions.length > 0 ? functions : [`fn_${ascii(rng)}_old`];
      if (rng.chance(0.5)) {
        for (let k = 1 + rng.int(2); k > 0; k--) {
          const call = { name: rng.pick(names), ...(rng.chance(0.5) ? { id: nextId() } : {}) };
          open.push(call);
          const part: Json = { functionCall: { ...call, args: jsonObject(rng) } };
          if (rng.chance(0.2)) part.thoughtSignature = base64(rng);
          parts.push(part);
        }
      }
      if (parts.every((p) => p.thought === true)) parts.push({ text: text(rng) });
      contents.push({ role: "model", parts });
    }
  }
  body.contents = contents;

  const gen: Json = {};
  const maybe = (key: string, p: number, values: readonly unknown[]) => {
    if (rng.chance(p)) gen[key] = rng.pick(values);
  };
  maybe("temperature", 0.4, [0, 0.2, 0.7, 1, 1.5, 2]);
  maybe("topP", 0.3, [0.1, 0.5, 0.95, 1]);
  maybe("topK", 0.2, [1, 40]);
  maybe("maxOutputTokens", 0.4, [1, 64, 1024, 8192]);
  maybe("candidateCount", 0.25, [1, 2, 3]);
  maybe("presencePenalty", 0.15, [-1, 0, 0.5, 1.5]);
  maybe("frequencyPenalty", 0.15, [-1.5, 0, 1]);
  maybe("seed", 0.2, [0, 42, 123_456]);
  if (rng.chance(0.3)) gen.stopSequences = Array.from({ length: 1 + rng.int(4) }, () => word(rng));
  if (rng.chance(0.25)) {
    gen.responseMimeType = rng.pick(["application/json", "application/json", "text/plain"]);
    if (gen.responseMimeType === "application/json" && rng.chance(0.6)) gen.responseSchema = rng.chance(0.8) ? objectSchema(rng) : geminiSchema(rng, 1);
    else if (gen.responseMimeType === "application/json" && rng.chance(0.5)) gen.responseJsonSchema = jsonSchemaOf(objectSchema(rng));
  }
  if (rng.chance(0.2)) {
    gen.thinkingConfig = rng.chance(0.5) ? { thinkingBudget: rng.pick([-1, 0, 512, 1024, 1500, 2048, 6000]) } : { thinkingLevel: rng.pick(["LOW", "HIGH"]) };
    if (rng.chance(0.6)) (gen.thinkingConfig as Json).includeThoughts = true;
  }
  if (Object.keys(gen).length > 0) body.generationConfig = gen;
  if (rng.chance(0.2)) body.safetySettings = rng.some(HARM, 3).map((category) => ({ category, threshold: rng.pick(THRESHOLDS) }));
  return { body, functions };
}

/** Proto fields whose values are the client's own JSON (arguments, results, JSON Schemas): their keys stay as they are, as do property names. */
const OPAQUE = new Set(["args", "response", "parametersJsonSchema", "responseJsonSchema"]);

/** The request with every field name in snake_case, which proto JSON takes as well ("generation_config"). */
function snakeCased(v: unknown, opaque = false): unknown {
  if (Array.isArray(v)) return v.map((x) => snakeCased(x));
  if (!isObject(v)) return v;
  return Object.fromEntries(
    Object.entries(v).map(([k, x]) => [opaque ? k : k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`), OPAQUE.has(k) ? x : snakeCased(x, k === "properties")]),
  );
}

/** The SDK's parameters for a wire request: contents apart, everything else in `config`. */
function sdkParams(model: string, body: Json) {
  const { contents, generationConfig, ...rest } = body;
  return { model, contents: contents as never, config: { ...(generationConfig as Json | undefined), ...rest } as never };
}

// ---------------------------------------------------------------------------------------------
// The model: the OpenAI request a Gemini request means

const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);
const partsOf = (c: unknown): Json[] => (isObject(c) && Array.isArray(c.parts) ? (c.parts as Json[]) : []);
/** Text an OpenAI model reads: thoughts are the model's own and are not sent back. */
const plainTexts = (parts: Json[]) => parts.filter((p) => typeof p.text === "string" && p.thought !== true).map((p) => p.text as string);

/** Gemini's sampling settings and their OpenAI names. */
const GENERATION: [string, string][] = [
  ["temperature", "temperature"],
  ["topP", "top_p"],
  ["maxOutputTokens", "max_tokens"],
  ["candidateCount", "n"],
  ["presencePenalty", "presence_penalty"],
  ["frequencyPenalty", "frequency_penalty"],
  ["seed", "seed"],
  ["stopSequences", "stop"],
];

/** thinkingLevel as is; a budget in the README's steps (0 none, 1024 low, 2048 medium, more high); -1 (dynamic) leaves the default. */
function reasoningEffort(thinking: Json | undefined): string | undefined {
  if (!thinking) return undefined;
  if (typeof thinking.thinkingLevel === "string") return thinking.thinkingLevel.toLowerCase();
  const b = thinking.thinkingBudget;
  if (typeof b !== "number" || b < 0) return undefined;
  return b === 0 ? "none" : b <= 1024 ? "low" : b <= 2048 ? "medium" : "high";
}

/** The README's budgets for a Gemini upstream per reasoning effort. */
const GEMINI_BUDGET: Record<string, number> = { none: 0, minimal: 128, low: 1024, medium: 2048, high: 4096 };

/** The thinkingConfig a Gemini upstream gets: off at budget 0, else the effort's budget with the thoughts, or the thoughts alone at the model's budget. */
function geminiThinking(thinking: Json | undefined): Json | undefined {
  const effort = reasoningEffort(thinking);
  if (effort === "none") return { thinkingBudget: 0 };
  if (effort) return { includeThoughts: true, thinkingBudget: GEMINI_BUDGET[effort] };
  return thinking?.includeThoughts === true ? { includeThoughts: true } : undefined;
}

/** Client-given tool-call ids stay; the ids the gateway makes are written `#1`, `#2`… in order of appearance. */
function expectedChat(body: Json, upstream: string, stream: boolean): Json {
  const messages: Json[] = [];
  const system = plainTexts(partsOf(body.systemInstruction));
  if (system.length > 0) messages.push({ role: "system", content: system.join("\n") });
  const open = new Map<string, string[]>();
  let made = 0;
  for (const c of body.contents as Json[]) {
    const parts = partsOf(c);
    if (c.role === "model") {
      const content = plainTexts(parts).join("");
      const calls = parts.filter((p) => isObject(p.functionCall)).map((p) => {
        const fc = p.functionCall as Json;
        const id = str(fc.id) ?? `#${++made}`;
        open.set(fc.name as string, [...(open.get(fc.name as string) ?? []), id]);
        return { id, type: "function", function: { name: fc.name, arguments: fc.args ?? {} } };
      });
      if (content === "" && calls.length === 0) continue;
      messages.push({ role: "assistant", content: content === "" ? null : content, ...(calls.length > 0 ? { tool_calls: calls } : {}) });
      continue;
    }
    const user: Json[] = [];
    for (const p of parts) {
      if (isObject(p.functionResponse)) {
        const fr = p.functionResponse;
        const queue = open.get(fr.name as string) ?? [];
        const id = str(fr.id) ?? queue[0]!;
        queue.splice(queue.indexOf(id), 1);
        messages.push({ role: "tool", tool_call_id: id, content: JSON.stringify(fr.response) });
      } else if (typeof p.text === "string") user.push({ type: "text", text: p.text });
      else if (isObject(p.inlineData)) user.push(MEDIA.find(([m]) => m === (p.inlineData as Json).mimeType)![1]((p.inlineData as Json).data as string));
    }
    if (user.length > 0) messages.push({ role: "user", content: user.length === 1 && user[0]!.type === "text" ? user[0]!.text : user });
  }

  const req: Json = { model: upstream, messages };
  const gen = (body.generationConfig ?? {}) as Json;
  for (const [g, o] of GENERATION) if (gen[g] !== undefined) req[o] = gen[g];
  if (isObject(gen.responseJsonSchema)) req.response_format = { type: "json_schema", json_schema: { name: "<name>", schema: gen.responseJsonSchema } };
  else if (isObject(gen.responseSchema)) req.response_format = { type: "json_schema", json_schema: { name: "<name>", schema: jsonSchemaOf(gen.responseSchema) } };
  else if (gen.responseMimeType === "application/json") req.response_format = { type: "json_object" };
  const effort = reasoningEffort(gen.thinkingConfig as Json | undefined);
  if (effort) req.reasoning_effort = effort;

  const decls = ((body.tools ?? []) as Json[]).flatMap((t) => (t.functionDeclarations ?? []) as Json[]);
  if (decls.length > 0) {
    const fcc = ((body.toolConfig as Json | undefined)?.functionCallingConfig ?? {}) as Json;
    const allowed = fcc.allowedFunctionNames as string[] | undefined;
    // ANY with several allowed names: only those may be called, so only those are offered.
    const offered = fcc.mode === "ANY" && allowed && allowed.length > 1 ? decls.filter((d) => allowed.includes(d.name as string)) : decls;
    req.tools = offered.map((d) => ({
      type: "function",
      function: {
        name: d.name,
        ...(d.description !== undefined ? { description: d.description } : {}),
        ...(isObject(d.parametersJsonSchema) ? { parameters: d.parametersJsonSchema } : isObject(d.parameters) ? { parameters: jsonSchemaOf(d.parameters) } : {}),
      },
    }));
    const choice = { AUTO: "auto", NONE: "none", ANY: allowed?.length === 1 ? { type: "function", function: { name: allowed[0] } } : "required" }[fcc.mode as string];
    if (choice) req.tool_choice = choice;
  }
  if (stream) Object.assign(req, { stream: true, stream_options: { include_usage: true } });
  return req;
}

/** The upstream body as the model writes it: made ids as `#n`, arguments parsed, a schema's name and an empty parameter list left open. */
function comparableChat(sent: Json, clientIds: Set<string>): Json {
  const body = clone(sent);
  const made = new Map<string, string>();
  const idOf = (id: string) => {
    if (clientIds.has(id)) return id;
    if (!made.has(id)) made.set(id, `#${made.size + 1}`);
    return made.get(id)!;
  };
  for (const m of (body.messages ?? []) as Json[]) {
    for (const c of (m.tool_calls ?? []) as Json[]) {
      c.id = idOf(c.id as string);
      const fn = c.function as Json;
      try {
        fn.arguments = JSON.parse(fn.arguments as string);
      } catch {
        // left as the text it is: the comparison shows it
      }
    }
    if (typeof m.tool_call_id === "string") m.tool_call_id = idOf(m.tool_call_id);
  }
  const format = body.response_format as Json | undefined;
  const js = format?.json_schema as Json | undefined;
  if (js && typeof js.name === "string" && /^[A-Za-z0-9_-]{1,64}$/.test(js.name)) js.name = "<name>";
  for (const t of (body.tools ?? []) as Json[]) {
    const fn = t.function as Json;
    if (Bun.deepEquals(fn.parameters, { type: "object", properties: {} })) delete fn.parameters;
  }
  return body;
}

// ---------------------------------------------------------------------------------------------
// Random answers and the Gemini response they mean

/** OpenAI's finish reasons and Gemini's for them (a function call ends with STOP in Gemini). */
const FINISH: Record<string, string> = { stop: "STOP", length: "MAX_TOKENS", tool_calls: "STOP", content_filter: "SAFETY" };

interface Usage {
  prompt: number;
  completion: number;
  cached: number;
  reasoning: number;
}

function randomUsage(rng: Random): Usage {
  const prompt = 1 + rng.int(5000);
  const completion = 1 + rng.int(2000);
  return { prompt, completion, cached: rng.chance(0.4) ? rng.int(prompt + 1) : 0, reasoning: rng.chance(0.3) ? rng.int(completion + 1) : 0 };
}

function openAIUsage(u: Usage, rng: Random): Json {
  const usage: Json = { prompt_tokens: u.prompt, completion_tokens: u.completion, total_tokens: u.prompt + u.completion };
  if (u.cached || rng.chance(0.5)) usage.prompt_tokens_details = { cached_tokens: u.cached, audio_tokens: 0 };
  if (u.reasoning || rng.chance(0.5)) usage.completion_tokens_details = { reasoning_tokens: u.reasoning, audio_tokens: 0, accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 };
  return usage;
}

/** Gemini's usageMetadata: candidates without thoughts, cached and thoughts only when there are some. */
function geminiUsage(u: Usage): Json {
  const out: Json = { promptTokenCount: u.prompt, candidatesTokenCount: u.completion - u.reasoning, totalTokenCount: u.prompt + u.completion };
  if (u.cached) out.cachedContentTokenCount = u.cached;
  if (u.reasoning) out.thoughtsTokenCount = u.reasoning;
  return out;
}

interface AnswerChoice {
  text?: string;
  thought?: string;
  calls: { id: string; name: string; args: Json }[];
  finish: string;
}

function randomChoices(rng: Random, n: number, functions: string[], reasoning: boolean): AnswerChoice[] {
  return Array.from({ length: n }, () => {
    const calls = rng.chance(0.4) ? Array.from({ length: 1 + rng.int(2) }, () => ({ id: `call_${ascii(rng, 24)}`, name: functions.length ? rng.pick(functions) : `fn_${ascii(rng)}`, args: jsonObject(rng) })) : [];
    const finish = calls.length > 0 && rng.chance(0.8) ? "tool_calls" : rng.pick(["stop", "stop", "length", "content_filter"]);
    // A filtered answer may have no content at all.
    const content = (calls.length === 0 && !(finish === "content_filter" && rng.chance(0.5))) || rng.chance(0.3) ? text(rng) : undefined;
    return { text: content, calls, finish, ...(reasoning && rng.chance(0.6) ? { thought: text(rng) } : {}) };
  });
}

function scripted(choices: AnswerChoice[], usage: Json): ScriptedAnswer {
  return {
    choices: choices.map((c) => ({
      content: c.text ?? null,
      ...(c.thought !== undefined ? { reasoning: c.thought } : {}),
      toolCalls: c.calls.map((t) => ({ id: t.id, name: t.name, arguments: JSON.stringify(t.args) })),
      finishReason: c.finish,
    })),
    usage,
  };
}

/** A candidate's parts: the thought (when asked for), the text, then each call with its args. */
function expectedParts(c: AnswerChoice, includeThoughts: boolean): Json[] {
  const parts: Json[] = [];
  if (includeThoughts && c.thought) parts.push({ text: c.thought, thought: true });
  if (c.text) parts.push({ text: c.text });
  for (const t of c.calls) parts.push({ functionCall: { id: t.id, name: t.name, args: t.args } });
  return parts;
}

// ---------------------------------------------------------------------------------------------
// The native Gemini path: the same request meaning, Gemini answers coming back as they were

/**
 * A JSON Schema with the same meaning written one way: anyOf branches that only name a type are a
 * type list (one type: that type). additionalProperties is left out: Gemini's Schema (the subset
 * the gateway writes parameters in for a Gemini upstream) has no such field.
 */
function canonical(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(canonical);
  if (!isObject(schema)) return schema;
  const { additionalProperties: _, ...rest } = schema;
  const out = Object.fromEntries(Object.entries(rest).map(([k, v]) => [k, k === "properties" && isObject(v) ? Object.fromEntries(Object.entries(v).map(([p, x]) => [p, canonical(x)])) : canonical(v)]));
  const branches = out.anyOf;
  if (Array.isArray(branches) && out.type === undefined && branches.every((b) => isObject(b) && Object.keys(b).length === 1 && typeof b.type === "string")) {
    const { anyOf: __, ...others } = out;
    const types = branches.map((b) => (b as Json).type);
    return { ...others, type: types.length === 1 ? types[0] : types };
  }
  return out;
}

/** What a Gemini request says, in a form both the client's and the upstream's request can be read into. */
function meaning(body: Json): Json {
  const turns: Json[] = [];
  for (const c of (body.contents ?? []) as Json[]) {
    const role = c.role === "model" ? "model" : "user";
    const parts: Json[] = [];
    for (const p of partsOf(c)) {
      if (p.thought === true) continue;
      const last = parts.at(-1);
      if (typeof p.text === "string") {
        if (typeof last?.text === "string") last.text += p.text;
        else parts.push({ text: p.text });
      } else if (isObject(p.inlineData)) parts.push({ inlineData: { mimeType: p.inlineData.mimeType, data: p.inlineData.data } });
      // A thought signature on the client's part is not carried (only one inside a call id the gateway gave is).
      else if (isObject(p.functionCall)) parts.push({ functionCall: { name: p.functionCall.name, args: p.functionCall.args ?? {} } });
      else if (isObject(p.functionResponse)) parts.push({ functionResponse: { name: p.functionResponse.name, response: p.functionResponse.response } });
    }
    const prev = turns.at(-1);
    if (parts.length === 0) continue;
    // Consecutive turns of one role are one turn to the model.
    if (prev?.role === role) (prev.parts as Json[]).push(...parts);
    else turns.push({ role, parts });
  }
  const gen = (body.generationConfig ?? {}) as Json;
  const config: Json = {};
  for (const [g] of GENERATION) if (gen[g] !== undefined) config[g] = gen[g];
  if (gen.responseMimeType === "application/json") config.responseMimeType = "application/json";
  if (isObject(gen.responseSchema)) config.schema = canonical(jsonSchemaOf(gen.responseSchema));
  if (isObject(gen.responseJsonSchema)) config.schema = canonical(gen.responseJsonSchema);
  const fcc = ((body.toolConfig as Json | undefined)?.functionCallingConfig ?? {}) as Json;
  // In mode ANY only the allowed functions can be called: the others are as good as not declared.
  const allowed = fcc.mode === "ANY" && Array.isArray(fcc.allowedFunctionNames) && fcc.allowedFunctionNames.length > 0 ? (fcc.allowedFunctionNames as string[]) : undefined;
  const decls = ((body.tools ?? []) as Json[]).flatMap((t) => (t.functionDeclarations ?? []) as Json[]).filter((d) => !allowed || allowed.includes(d.name as string));
  return {
    system: plainTexts(partsOf(body.systemInstruction)).join("\n"),
    turns,
    tools: decls.map((d) => ({
      name: d.name,
      description: d.description,
      parameters: canonical(isObject(d.parametersJsonSchema) ? d.parametersJsonSchema : isObject(d.parameters) ? jsonSchemaOf(d.parameters) : undefined),
    })),
    mode: decls.length > 0 ? fcc.mode : undefined,
    // One allowed function is that function forced; several are all that is declared.
    forced: decls.length > 0 && allowed?.length === 1 ? allowed[0] : undefined,
    config,
  };
}

const GEMINI_FINISH = ["STOP", "STOP", "MAX_TOKENS", "SAFETY"];

function nativeAnswer(rng: Random, n: number, functions: string[], modelName: string, usage: Usage): { body: Json; choices: AnswerChoice[] } {
  const choices: AnswerChoice[] = Array.from({ length: n }, () => {
    const calls = rng.chance(0.4) ? Array.from({ length: 1 + rng.int(2) }, () => ({ id: "", name: functions.length ? rng.pick(functions) : `fn_${ascii(rng)}`, args: jsonObject(rng) })) : [];
    return { text: calls.length === 0 || rng.chance(0.3) ? text(rng) : undefined, calls, finish: calls.length > 0 ? "STOP" : rng.pick(GEMINI_FINISH), ...(rng.chance(0.3) ? { thought: text(rng) } : {}) };
  });
  const candidates = choices.map((c, index) => {
    const parts: Json[] = [];
    if (c.thought) parts.push({ text: c.thought, thought: true });
    if (c.text) parts.push({ text: c.text });
    for (const t of c.calls) parts.push({ functionCall: { name: t.name, args: t.args } });
    return { content: { parts, role: "model" }, finishReason: c.finish, index };
  });
  return { body: { candidates, usageMetadata: { ...geminiUsage(usage), totalTokenCount: usage.prompt + usage.completion }, modelVersion: modelName, responseId: ascii(rng, 22) }, choices };
}

/** A Gemini answer as Google streams it: text in pieces, a call whole, the last event with finishReason and the usage. */
function nativeStream(body: Json): string[] {
  const candidates = body.candidates as Json[];
  const events: Json[] = [];
  candidates.forEach((c, index) => {
    const parts = (c.content as Json).parts as Json[];
    for (const p of parts) {
      if (typeof p.text === "string") {
        const chars = [...(p.text as string)];
        for (let i = 0; i < chars.length; i += 7) events.push({ candidates: [{ content: { parts: [{ ...p, text: chars.slice(i, i + 7).join("") }], role: "model" }, index }] });
      } else events.push({ candidates: [{ content: { parts: [p], role: "model" }, index }] });
    }
    events.push({ candidates: [{ content: { parts: [{ text: "" }], role: "model" }, finishReason: c.finishReason, index }] });
  });
  for (const e of events) Object.assign(e, { modelVersion: body.modelVersion, responseId: body.responseId });
  Object.assign(events.at(-1)!, { usageMetadata: body.usageMetadata });
  return events.map((e) => `data: ${JSON.stringify(e)}\r\n\r\n`);
}

// ---------------------------------------------------------------------------------------------
// Refusals: what the gateway cannot do, and bad input

/** Requests the gateway cannot serve: Google-hosted tools it cannot run, code execution parts, a context cache kept by Google. */
const UNSUPPORTED: [string, (body: Json, rng: Random) => void][] = [
  ["a Google context cache", (b, rng) => (b.cachedContent = `cachedContents/${ascii(rng, 12)}`)],
  ["a Google-hosted tool", (b, rng) => (b.tools = [...((b.tools as Json[]) ?? []), { [rng.pick(["googleSearch", "codeExecution", "urlContext"])]: {} }])],
  ["a code execution part", (b) => (b.contents as Json[]).unshift({ role: "user", parts: [{ text: "run it" }] }, { role: "model", parts: [{ executableCode: { language: "PYTHON", code: "print(1)" } }] })],
];

const first = (b: Json) => (b.contents as Json[])[0]!;
function config(b: Json): Json {
  b.generationConfig ??= {};
  return b.generationConfig as Json;
}

/** Bad input, each a 400 from Google: wrong types, unknown roles, nothing to answer, missing names, settings out of range. */
const BAD: [string, (b: Json, rng: Random) => void][] = [
  ["empty contents", (b) => (b.contents = [])],
  ["no contents", (b) => delete b.contents],
  ["contents: contents not a list", (b, rng) => (b.contents = rng.pick([5, "hello", true]))],
  ["contents: a content not an object", (b, rng) => (b.contents = [rng.pick([5, "hello", null, ["x"]])])],
  ["contents: an unknown role", (b, rng) => (first(b).role = rng.pick(["assistant", "system", "bot", "USER"]))],
  ["contents: a role not a string", (b, rng) => (first(b).role = rng.pick([7, true, { role: "user" }]))],
  ["contents: parts not a list", (b, rng) => (first(b).parts = rng.pick(["hi", 5, { text: "hi" }]))],
  ["contents: no parts", (b, rng) => (first(b).parts = rng.pick([[], undefined]))],
  ["contents: a part not an object", (b, rng) => (first(b).parts = [rng.pick(["hi", 5, null])])],
  ["contents: text not a string", (b, rng) => (first(b).parts = [{ text: rng.pick([5, true, { t: 1 }, ["a"]]) }])],
  ["contents: inlineData without data", (b) => (first(b).parts = [{ inlineData: { mimeType: "image/png" } }])],
  ["contents: inlineData data not a string", (b, rng) => (first(b).parts = [{ inlineData: { mimeType: "image/png", data: rng.pick([5, ["x"], {}]) } }])],
  ["contents: a functionCall without a name", (b) => (b.contents as Json[]).unshift({ role: "user", parts: [{ text: "x" }] }, { role: "model", parts: [{ functionCall: { args: {} } }] })],
  ["contents: functionCall args not an object", (b, rng) => (b.contents as Json[]).unshift({ role: "user", parts: [{ text: "x" }] }, { role: "model", parts: [{ functionCall: { name: "f", args: rng.pick(["x", 5, [1]]) } }] })],
  ["contents: a functionResponse without a name", (b) => (first(b).parts = [{ functionResponse: { response: { ok: true } } }])],
  ["contents: functionResponse response not an object", (b, rng) => (first(b).parts = [{ functionResponse: { name: "f", response: rng.pick(["x", 5, [1]]) } }])],
  ["systemInstruction not a Content", (b, rng) => (b.systemInstruction = rng.pick([5, true, ["x"]]))],
  ["systemInstruction parts not a list", (b) => (b.systemInstruction = { parts: "be brief" })],
  ["generationConfig not an object", (b, rng) => (b.generationConfig = rng.pick([5, "x", [1]]))],
  ["temperature not a number", (b, rng) => (config(b).temperature = rng.pick(["hot", true, [1]]))],
  ["temperature out of range", (b, rng) => (config(b).temperature = rng.pick([-0.5, 2.5, 100]))],
  ["topP out of range", (b, rng) => (config(b).topP = rng.pick([-0.1, 1.5]))],
  ["maxOutputTokens not a positive integer", (b, rng) => (config(b).maxOutputTokens = rng.pick(["many", 1.5, -3]))],
  ["candidateCount not a positive integer", (b, rng) => (config(b).candidateCount = rng.pick(["two", 1.5, -1]))],
  ["an integer beyond 32 bits", (b, rng) => (config(b)[rng.pick(["maxOutputTokens", "seed", "candidateCount"])] = rng.pick([2 ** 31, 1e20, -(2 ** 40)]))],
  ["an unknown thinkingLevel", (b, rng) => (config(b).thinkingConfig = { thinkingLevel: rng.pick(["FOO", "ultra", 5]) })],
  ["an image or audio answer", (b, rng) => (config(b).responseModalities = rng.pick([["IMAGE"], ["TEXT", "AUDIO"]]))],
  ["stopSequences not a list of strings", (b, rng) => (config(b).stopSequences = rng.pick(["END", [1, 2], [null]]))],
  ["responseMimeType not a string", (b) => (config(b).responseMimeType = 5)],
  ["tools not a list", (b, rng) => (b.tools = rng.pick(["x", 5, {}]))],
  ["functionDeclarations not a list", (b, rng) => (b.tools = [{ functionDeclarations: rng.pick(["x", 5, { name: "f" }]) }])],
  ["a function declaration without a name", (b) => (b.tools = [{ functionDeclarations: [{ description: "no name" }] }])],
  ["function parameters not a Schema", (b, rng) => (b.tools = [{ functionDeclarations: [{ name: "f", parameters: rng.pick(["x", 5, [1]]) }] }])],
  ["an unknown tool mode", (b, rng) => {
    b.tools = [{ functionDeclarations: [{ name: "f" }] }];
    b.toolConfig = { functionCallingConfig: { mode: rng.pick(["SOMETIMES", 5, true]) } };
  }],
  ["allowedFunctionNames not a list of strings", (b, rng) => {
    b.tools = [{ functionDeclarations: [{ name: "f" }] }];
    b.toolConfig = { functionCallingConfig: { mode: "ANY", allowedFunctionNames: rng.pick(["f", [5]]) } };
  }],
  ["safetySettings not a list", (b, rng) => (b.safetySettings = rng.pick(["x", 5, { category: "HARM_CATEGORY_HARASSMENT" }]))],
];

// ---------------------------------------------------------------------------------------------
// Running it

let openai: MockOpenAI;
let gemini: MockGemini;
let gw: TestGateway;
let key: string;
let token: string;
let ai: GoogleGenAI;

beforeAll(async () => {
  openai = await startMockOpenAI({ apiKey: OPENAI_KEY });
  gemini = await startMockGemini({ apiKey: GEMINI_KEY });
  gw = await startTestGateway(
    {
      model_list: DEPLOYMENTS.map((d) => ({
        model_name: d.name,
        svc_params: { model: d.model, api_base: d.kind === "openai" ? openai.url : gemini.url, api_key: d.kind === "openai" ? OPENAI_KEY : GEMINI_KEY },
        model_info: { id: `dep-${d.name}` },
      })),
      general_settings: { master_key: MASTER_KEY },
    },
    { store: {} },
  );
  const created = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { key_alias: "gemini-diff", models: DEPLOYMENTS.map((d) => d.name) } });
  expect(created.status).toBe(200);
  key = created.body.key;
  token = created.body.token;
  ai = new GoogleGenAI({ apiKey: key, httpOptions: { baseUrl: gw.url } });
});

afterAll(async () => {
  await gw?.stop();
  await openai?.stop();
  await gemini?.stop();
});

interface LoggedCall {
  what: string;
  requestId: string;
  deployment: Deployment;
  stream: boolean;
  usage: Usage;
}

const failures: string[] = [];
const logged: LoggedCall[] = [];

function check(what: string, got: unknown, want: unknown): void {
  if (!Bun.deepEquals(got, want)) failures.push(`${what}\n  got:  ${JSON.stringify(got)}\n  want: ${JSON.stringify(want)}`);
}

/** The plain JSON of what the SDK returned (its class instances and helper fields left out). */
const plain = (r: GenerateContentResponse) => JSON.parse(JSON.stringify({ candidates: r.candidates, usageMetadata: r.usageMetadata, modelVersion: r.modelVersion })) as Json;

/** Google's error envelope, exactly. */
async function googleRefusal(what: string, res: Response): Promise<void> {
  const text = await res.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  const e = isObject(body) && isObject(body.error) ? body.error : {};
  check(`${what}: a 400 in Google's shape (${text.slice(0, 300)})`, { status: res.status, keys: isObject(body) ? Object.keys(body) : body, code: e.code, status_: e.status, message: typeof e.message === "string" && e.message !== "" }, {
    status: 400,
    keys: ["error"],
    code: 400,
    status_: "INVALID_ARGUMENT",
    message: true,
  });
}

const post = (path: string, body: string) => fetch(`${gw.url}${path}`, { method: "POST", headers: { "content-type": "application/json", "x-goog-api-key": key }, body });

type Action = "generate" | "stream" | "count" | "unsupported" | "bad";
const ACTIONS: [Action, number][] = [
  ["generate", 40],
  ["stream", 30],
  ["count", 10],
  ["unsupported", 5],
  ["bad", 15],
];

function pickAction(rng: Random): Action {
  let at = rng.int(100);
  for (const [a, w] of ACTIONS) {
    if (at < w) return a;
    at -= w;
  }
  return "generate";
}

async function runCase(i: number): Promise<void> {
  const rng = new Random((SEED ^ Math.imul(i + 1, 0x9e3779b1)) >>> 0);
  const d = rng.pick(DEPLOYMENTS);
  let ids = 0;
  const plan = randomRequest(rng, () => `fc-${i}-${ids++}-${ascii(rng, 6)}`);
  const { body } = plan;
  const action = pickAction(rng);
  const what = `case ${i} (${action} → ${d.name}) ${seedNote}`;
  openai.reset();
  gemini.reset();

  if (action === "bad" || action === "unsupported") {
    const [name, mutate] = rng.pick(action === "bad" ? BAD : UNSUPPORTED);
    mutate(body, rng);
    // countTokens reads only the contents (and a whole generateContentRequest, not sent here).
    const countable = action === "bad" && name.startsWith("contents:");
    if (action === "unsupported" && rng.chance(0.5)) {
      // The SDK raises Google's error as an ApiError with its status.
      const err = await ai.models.generateContent(sdkParams(d.name, body)).then(
        () => undefined,
        (e: unknown) => e,
      );
      check(`${what}: ${name} through the SDK`, err instanceof ApiError ? err.status : String(err), 400);
    } else {
      const method = rng.pick(["generateContent", "streamGenerateContent?alt=sse", "streamGenerateContent", ...(countable ? ["countTokens"] : [])]);
      await googleRefusal(`${what}: ${name} to ${method} ${JSON.stringify(body).slice(0, 400)}`, await post(`/v1beta/models/${d.name}:${method}`, JSON.stringify(body)));
    }
    check(`${what}: ${name}: nothing sent upstream`, openai.requests.length + gemini.requests.length, 0);
    return;
  }

  if (action === "count") {
    // The SDK sends only the contents (the Developer API counts a system instruction and tools
    // only inside a whole generateContentRequest, which is sent as it is here).
    const whole = rng.chance(0.4);
    let total: unknown;
    if (whole) {
      const res = await post(`/v1beta/models/${d.name}:countTokens`, JSON.stringify({ generateContentRequest: { model: `models/${d.name}`, ...body } }));
      const answer = (await res.json()) as Json;
      total = res.status === 200 ? answer.totalTokens : answer;
    } else total = (await ai.models.countTokens({ model: d.name, contents: body.contents as never })).totalTokens;
    // Google counts every declared function, whatever the tool mode.
    const { toolConfig: _, ...counted } = body;
    const predicted = expectedChat(whole ? counted : { contents: body.contents }, d.upstream, false);
    const counter = await requestJson<{ total_tokens: number }>(gw, "POST", `/utils/token_counter${d.kind === "gemini" ? "?call_endpoint=true" : ""}`, {
      key,
      body: { model: d.name, messages: restoreIds(predicted.messages as Json[]), ...(predicted.tools ? { tools: predicted.tools } : {}) },
    });
    check(`${what}: countTokens${whole ? " of a whole request" : ""} = token_counter of the predicted messages\n  client: ${JSON.stringify(body)}`, total, counter.body.total_tokens);
    return;
  }

  const stream = action === "stream";
  const gen = (body.generationConfig ?? {}) as Json;
  const n = typeof gen.candidateCount === "number" ? gen.candidateCount : 1;
  const includeThoughts = (gen.thinkingConfig as Json | undefined)?.includeThoughts === true;
  const usage = randomUsage(rng);
  let choices: AnswerChoice[];
  if (d.kind === "openai") {
    choices = randomChoices(rng, n, plan.functions, d.reasoning === true);
    openai.fault({ kind: "scripted", answer: scripted(choices, openAIUsage(usage, rng)) });
  } else {
    const native = nativeAnswer(rng, n, plan.functions, d.upstream, usage);
    choices = native.choices;
    gemini.fault(stream ? { kind: "cannedStream", chunks: nativeStream(native.body), checked: true } : { kind: "canned", body: native.body, checked: true });
  }

  // Mostly through the SDK; some by hand: field names in snake_case, a stream as one JSON array (no alt=sse).
  const raw = rng.chance(0.25);
  let got: { candidates: Json[]; usage: unknown; responseId?: string; modelVersion?: string };
  try {
    if (raw) {
      const res = await post(`/v1beta/models/${d.name}:${stream ? "streamGenerateContent" : "generateContent"}`, JSON.stringify(snakeCased(body)));
      const answer = (await res.json()) as Json | Json[];
      if (res.status !== 200) throw new Error(`${res.status}: ${JSON.stringify(answer)}`);
      const chunks = Array.isArray(answer) ? answer : [answer];
      got = stream ? joinStream(what, chunks, n) : { candidates: (answer as Json).candidates as Json[], usage: (answer as Json).usageMetadata, modelVersion: (answer as Json).modelVersion as string };
      got.responseId = chunks.at(-1)?.responseId as string | undefined;
    } else if (stream) {
      const chunks: GenerateContentResponse[] = [];
      for await (const c of await ai.models.generateContentStream(sdkParams(d.name, body))) chunks.push(c);
      got = joinStream(what, chunks.map(plain), n);
      got.responseId = chunks.at(-1)?.responseId;
    } else {
      const res = await ai.models.generateContent(sdkParams(d.name, body));
      const p = plain(res);
      got = { candidates: (p.candidates ?? []) as Json[], usage: p.usageMetadata, responseId: res.responseId, modelVersion: p.modelVersion as string };
    }
  } catch (err) {
    const upstream = openai.requests[0] ?? gemini.requests[0];
    failures.push(`${what}: the call failed: ${err instanceof Error ? err.message : String(err)}\n  request: ${JSON.stringify(body)}\n  upstream got: ${JSON.stringify(upstream?.body)}`);
    return;
  }

  // (a) the upstream request
  if (d.kind === "openai") {
    const sent = openai.requests[0]?.body as Json | undefined;
    const clientIds = new Set<string>();
    for (const c of body.contents as Json[]) for (const p of partsOf(c)) for (const x of [p.functionCall, p.functionResponse]) if (isObject(x) && typeof x.id === "string") clientIds.add(x.id);
    check(`${what}: the OpenAI request\n  client: ${JSON.stringify(body)}`, sent && comparableChat(sent, clientIds), expectedChat(body, d.upstream, stream));
  } else {
    const sent = gemini.requests[0]?.body as Json | undefined;
    check(`${what}: the Gemini request means the client's\n  client: ${JSON.stringify(body)}\n  sent: ${JSON.stringify(sent)}`, sent && meaning(sent), meaning(body));
    const thinkingSent = ((sent?.generationConfig ?? {}) as Json).thinkingConfig;
    check(`${what}: the Gemini request's thinkingConfig\n  client: ${JSON.stringify(body)}`, thinkingSent, geminiThinking(((body.generationConfig ?? {}) as Json).thinkingConfig as Json | undefined));
  }

  // (b) the answer
  const wantCandidates = choices.map((c, index) => ({ content: { parts: expectedParts(c, includeThoughts), role: "model" }, finishReason: d.kind === "openai" ? FINISH[c.finish] : c.finish, index }));
  const gotCandidates = d.kind === "gemini" ? withoutCallIds(what, got.candidates) : got.candidates;
  check(`${what}: candidates`, stream ? gotCandidates : gotCandidates.map(dropEmptyText), wantCandidates.map(dropEmptyText));
  check(`${what}: usageMetadata`, got.usage, geminiUsage(usage));
  if (!stream) check(`${what}: modelVersion`, got.modelVersion, d.upstream);
  if (typeof got.responseId !== "string" || got.responseId === "") failures.push(`${what}: no responseId`);
  else logged.push({ what, requestId: got.responseId, deployment: d, stream, usage });
}

/** Function calls from Gemini have no ids: the gateway gives each one (any string will do for the client to send back). */
function withoutCallIds(what: string, candidates: Json[]): Json[] {
  const out = clone(candidates);
  for (const c of out) {
    for (const p of ((c.content as Json | undefined)?.parts ?? []) as Json[]) {
      const fc = p.functionCall as Json | undefined;
      if (!fc) continue;
      if (typeof fc.id !== "string" || fc.id === "") failures.push(`${what}: a function call without an id: ${JSON.stringify(fc)}`);
      fc.id = "";
    }
  }
  return out;
}

const dropEmptyText = (c: Json): Json => {
  const content = c.content as Json;
  const parts = (content.parts as Json[]).filter((p) => p.text !== "");
  return { ...c, content: { ...content, parts } };
};

/**
 * A stream's chunks as one response per candidate: thoughts, text and calls joined in order, the one
 * finishReason each candidate gets; usage only on the last chunk, which also carries a finishReason.
 */
function joinStream(what: string, chunks: Json[], n: number): { candidates: Json[]; usage: unknown } {
  const byIndex = new Map<number, { parts: Json[]; finish: string[] }>();
  for (const [k, chunk] of chunks.entries()) {
    if (chunk.usageMetadata !== undefined && k !== chunks.length - 1) failures.push(`${what}: usageMetadata before the last chunk (chunk ${k} of ${chunks.length})`);
    for (const c of (chunk.candidates ?? []) as Json[]) {
      const index = (c.index as number | undefined) ?? 0;
      const acc = byIndex.get(index) ?? { parts: [], finish: [] };
      byIndex.set(index, acc);
      if (typeof c.finishReason === "string") acc.finish.push(c.finishReason);
      for (const p of ((c.content as Json | undefined)?.parts ?? []) as Json[]) {
        const last = acc.parts.at(-1);
        if (typeof p.text === "string" && p.text === "") continue;
        if (typeof p.text === "string" && typeof last?.text === "string" && (last.thought === true) === (p.thought === true)) last.text += p.text;
        else acc.parts.push(clone(p));
      }
    }
  }
  const lastChunk = chunks.at(-1);
  const lastFinish = ((lastChunk?.candidates ?? []) as Json[]).some((c) => typeof c.finishReason === "string");
  if (!lastFinish) failures.push(`${what}: the last chunk has no finishReason: ${JSON.stringify(lastChunk)}`);
  const candidates = Array.from({ length: n }, (_, index) => {
    const acc = byIndex.get(index) ?? { parts: [], finish: [] };
    if (acc.finish.length !== 1) failures.push(`${what}: candidate ${index} got ${acc.finish.length} finishReasons`);
    return { content: { parts: acc.parts, role: "model" }, finishReason: acc.finish[0], index };
  });
  if (byIndex.size !== n) failures.push(`${what}: the stream had candidates ${[...byIndex.keys()]}, not ${n}`);
  return { candidates, usage: lastChunk?.usageMetadata };
}

/** The predicted messages with the `#n` ids made real (token counting reads ids as text). */
function restoreIds(messages: Json[]): Json[] {
  const out = clone(messages);
  for (const m of out) {
    for (const c of (m.tool_calls ?? []) as Json[]) {
      c.id = String(c.id).replace("#", "call_made_");
      (c.function as Json).arguments = JSON.stringify((c.function as Json).arguments);
    }
    if (typeof m.tool_call_id === "string") m.tool_call_id = m.tool_call_id.replace("#", "call_made_");
  }
  return out;
}

async function checkSpendLog(): Promise<void> {
  await gw.host!.spendWriter.flush();
  const all = await rows<Json>(gw.host!.store.db, sql`select * from spend_logs`);
  const byRequest = new Map(all.map((r) => [r.request_id as string, r]));
  for (const c of logged) {
    const row = byRequest.get(c.requestId);
    if (!row) {
      failures.push(`${c.what}: no spend log row for ${c.requestId}`);
      continue;
    }
    check(
      `${c.what}: the spend log row`,
      {
        api_key: row.api_key,
        model: row.model,
        model_group: row.model_group,
        provider: row.provider,
        status: row.status,
        stream: row.stream,
        prompt: row.prompt_tokens,
        completion: row.completion_tokens,
        cached: row.cache_read_input_tokens,
        reasoning: row.reasoning_tokens,
      },
      {
        api_key: token,
        model: c.deployment.name,
        model_group: c.deployment.name,
        provider: c.deployment.provider,
        status: "success",
        stream: c.stream,
        prompt: c.usage.prompt,
        completion: c.usage.completion,
        cached: c.usage.cached,
        reasoning: c.usage.reasoning,
      },
    );
  }
}

describe(`Gemini routes against a model of the translation ${seedNote}`, () => {
  test(
    `${CASES} random requests through @google/genai: upstream requests, answers, refusals, spend log`,
    async () => {
      for (let i = 0; i < CASES; i++) {
        try {
          await runCase(i);
        } catch (err) {
          failures.push(`case ${i} ${seedNote}: threw ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
        }
      }
      await checkSpendLog();
      expect(failures.slice(0, 6).join("\n\n"), `${failures.length} mismatches ${seedNote}`).toBe("");
    },
    120_000,
  );
});
