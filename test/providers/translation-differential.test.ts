// Non-stream chat translation through every provider's mock, seeded random (TRANSLATION_DIFF_SEED=<n>
// runs another set, TRANSLATION_DIFF_CASE=<i> only case i of it; every failure names both). Each
// case is a random OpenAI chat request as clients send them (system and developer messages,
// multi-turn history with string or parts content, https and data: images, assistant tool calls
// sent back as received (content null or "") and answered by tool messages, function tools with
// hand-written or Pydantic JSON schemas, tool_choice, response_format, sampling settings under both
// max-token names, stop, user, seed, n, penalties, logprobs, reasoning_effort, fields sent as null,
// now and then drop_params), sent through the openai SDK to a random deployment (one per provider,
// and a Cohere reasoning model, the one kind of Cohere model that takes thinking). A model kept
// here, written from each provider's documented API and not from the gateway's transforms, predicts:
// - the refusals: a parameter the adapter does not translate is the 400 naming it (unless
//   drop_params), an image link where the provider only takes inline bytes is a 400, and then
//   the upstream is never called;
// - the one request the mock receives: path (the model name, the API version), auth headers, and
//   the body: where system text goes, roles, consecutive turns merged where the provider wants
//   alternation, images, tool definitions (Gemini's schema subset), tool calls and results linked
//   by id (or by function name), tool choice, JSON output, thinking, sampling settings under the
//   provider's names. Encodings the provider documents as equivalent (a string or one text block,
//   adjacent Gemini text parts) are compared in one form;
// - the OpenAI answer the SDK gets for a random provider-format answer (text, thinking, tool calls
//   with random JSON arguments, random finish reasons, usage with cached, cache-write, reasoning
//   and tool-prompt tokens where the provider reports them, a Gemini prompt blocked in a 200):
//   content, reasoning and signed thinking blocks, tool calls (the upstream's ids, or made-up
//   `call_…` ids where it has none; arguments as the JSON text of the upstream's), finish_reason,
//   usage, id and model, and an `x-svc-response-cost` header;
// - when the answer called tools, often the next turn too, as a client sends it (the assistant
//   message it got, then the results): the ids link calls and results upstream, and what the
//   provider wants back with a call comes back (Claude's signed thinking, Gemini's thought signature).
// The mocks refuse what their APIs refuse, so a translation they would not take fails here too.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI, { APIError } from "openai";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { providerDeployments, type ProviderMocks, type StartedProviderMocks, startProviderMocks, UPSTREAM } from "../harness/provider-mocks.ts";
import { Random } from "../harness/random.ts";

const SEED = Number(process.env.TRANSLATION_DIFF_SEED ?? 2_024_117);
const ONLY = process.env.TRANSLATION_DIFF_CASE === undefined ? undefined : Number(process.env.TRANSLATION_DIFF_CASE);
const CASES = Number(process.env.TRANSLATION_DIFF_CASES ?? 600);
const seedNote = `(TRANSLATION_DIFF_SEED=${SEED})`;

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const obj = (v: unknown): Json => (isObject(v) ? v : {});
const list = (v: unknown): Json[] => (Array.isArray(v) ? (v as Json[]) : []);

// ---------------------------------------------------------------------------------------------
// Random values

/** Pieces of words: multi-byte letters, combining marks, emoji, JSON's escapes. */
const GLYPHS = ["a", "k", "Z", "7", "é", "ß", "Ω", "ж", "中", "字", "€", "😀", "👩‍💻", "e\u0301", '"', "\\", "<", "&", "'", "/", "\t"];
const LETTERS = "abcdefghijklmnopqrstuvwxyz";

const word = (rng: Random) => `${rng.pick(["a", "b", "x", "Ω", "中"])}${Array.from({ length: rng.int(5) }, () => rng.pick(GLYPHS)).join("")}`;
const words = (rng: Random, max: number) => Array.from({ length: 1 + rng.int(max) }, () => word(rng)).join(" ");
const ascii = (rng: Random, n = 3 + rng.int(6)) => Array.from({ length: n }, () => LETTERS[rng.int(LETTERS.length)]).join("");
const alnum = (rng: Random, n: number) => Array.from({ length: n }, () => rng.pick([...`${LETTERS}ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789`])).join("");

/** A JSON value of any kind (integers and short decimals, so text and value round-trip exactly). */
function jsonValue(rng: Random, depth: number): unknown {
  switch (rng.int(depth > 0 ? 7 : 5)) {
    case 0:
      return words(rng, 3);
    case 1:
      return rng.chance(0.5) ? rng.int(100_000) - 50_000 : Math.round((rng.next() * 2000 - 1000) * 1000) / 1000 || 1.5;
    case 2:
      return rng.chance(0.5);
    case 3:
      return null;
    case 4:
      return ascii(rng);
    case 5:
      return Array.from({ length: rng.int(4) }, () => jsonValue(rng, depth - 1));
    default:
      return jsonObject(rng, depth - 1);
  }
}

function jsonObject(rng: Random, depth = 2): Json {
  const out: Json = {};
  for (let i = 0; i < rng.int(5); i++) out[rng.chance(0.8) ? ascii(rng) : word(rng)] = jsonValue(rng, depth);
  return out;
}

/** A text in one piece, or now and then two (answers may come in several text blocks or parts). */
const pieces = (rng: Random, text: string): string[] => {
  const at = 1 + rng.int(Math.max(1, text.length - 1));
  return rng.chance(0.2) && text.length > 1 ? [text.slice(0, at), text.slice(at)] : [text];
};

const base64 = (rng: Random) => Buffer.from(Array.from({ length: 3 + rng.int(40) }, () => rng.int(256))).toString("base64");

// ---------------------------------------------------------------------------------------------
// Random requests

const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
/** Link suffixes and the media type Gemini is told for them (none when the link does not say). */
const LINK_TYPES: [string, string | undefined][] = [
  [".png", "image/png"],
  [".jpg", "image/jpeg"],
  [".jpeg", "image/jpeg"],
  [".webp", "image/webp"],
  [".gif", "image/gif"],
  ["?format=raw", undefined],
];

function imagePart(rng: Random, links: number): Json {
  const url = !rng.chance(links) ? `data:${rng.pick(IMAGE_TYPES)};base64,${base64(rng)}` : `https://img.example.com/${ascii(rng)}${rng.pick(LINK_TYPES)[0]}`;
  return { type: "image_url", image_url: rng.chance(0.3) ? { url, detail: rng.pick(["auto", "low", "high"]) } : { url } };
}

const textPart = (rng: Random): Json => ({ type: "text", text: words(rng, 8) });
const textContent = (rng: Random): unknown => (rng.chance(0.6) ? words(rng, 10) : Array.from({ length: 1 + rng.int(3) }, () => textPart(rng)));

/** `links`: how often an image is a link rather than inline bytes. */
function userContent(rng: Random, links: number): unknown {
  if (rng.chance(0.5)) return words(rng, 12);
  return Array.from({ length: 1 + rng.int(3) }, () => (rng.chance(0.35) ? imagePart(rng, links) : textPart(rng)));
}

/**
 * Schemas as clients write them: by hand, or as Pydantic generates them (`defs` given: titles,
 * nested models under `$defs` by `$ref`, optional fields as `anyOf [..., {"type": "null"}]`).
 */
function propertySchema(rng: Random, depth: number, defs?: Json): Json {
  const kind = rng.pick(depth > 0 ? ["string", "enum", "number", "integer", "boolean", "array", "object"] : ["string", "enum", "number", "integer", "boolean"]);
  let s: Json = {};
  switch (kind) {
    case "enum":
      Object.assign(s, { type: "string", enum: [...new Set(Array.from({ length: 1 + rng.int(4) }, () => ascii(rng)))] });
      break;
    case "number":
      s.type = "number";
      if (rng.chance(0.4)) Object.assign(s, { minimum: 0, maximum: 100 });
      break;
    case "array":
      Object.assign(s, { type: "array", items: propertySchema(rng, depth - 1, defs) });
      break;
    case "object": {
      const nested = objectSchema(rng, depth - 1, false, defs);
      if (defs) {
        const name = `Model${ascii(rng, 4)}`;
        defs[name] = { ...nested, title: name };
        s = { $ref: `#/$defs/${name}` };
      } else Object.assign(s, nested);
      break;
    }
    default:
      s.type = kind;
  }
  if (rng.chance(0.4)) s.description = words(rng, 6);
  if (defs && rng.chance(0.25)) s = { anyOf: [s, { type: "null" }], default: null };
  return s;
}

function objectSchema(rng: Random, depth: number, mayBeEmpty: boolean, defs?: Json): Json {
  const properties: Json = {};
  for (let i = 0; i < (mayBeEmpty ? rng.int(4) : 1 + rng.int(3)); i++) {
    const name = rng.chance(0.85) ? ascii(rng) : `${ascii(rng)}_${word(rng)}`;
    properties[name] = propertySchema(rng, depth, defs);
    if (defs && rng.chance(0.7)) (properties[name] as Json).title = name.toUpperCase();
  }
  const s: Json = { type: "object", properties };
  const names = Object.keys(properties);
  if (names.length > 0 && rng.chance(0.6)) s.required = names.filter(() => rng.chance(0.6));
  if (rng.chance(0.3)) s.additionalProperties = false;
  return s;
}

/** A tool's parameters or a response schema: by hand, or Pydantic's (with its `$defs` at the root). */
function rootSchema(rng: Random, mayBeEmpty: boolean): Json {
  if (!rng.chance(0.3)) return objectSchema(rng, 2, mayBeEmpty);
  const defs: Json = {};
  const s = { ...objectSchema(rng, 2, mayBeEmpty, defs), title: `Args${ascii(rng, 3)}` };
  return Object.keys(defs).length > 0 ? { ...s, $defs: defs } : s;
}

interface Tool {
  type: "function";
  function: { name: string; description?: string; parameters?: Json; strict?: boolean };
}

function randomTool(rng: Random, i: number): Tool {
  const fn: Tool["function"] = { name: `${ascii(rng)}_${i}` };
  if (rng.chance(0.7)) fn.description = words(rng, 8);
  if (rng.chance(0.9)) fn.parameters = rootSchema(rng, true);
  if (rng.chance(0.15)) fn.strict = true;
  return { type: "function", function: fn };
}

/** A history: instructions, user turns, answers, tool calls answered by tool messages; it ends with the user's turn or tool results. */
function conversation(rng: Random, tools: Tool[], links: number): Json[] {
  const messages: Json[] = [];
  if (rng.chance(0.5)) messages.push({ role: "system", content: textContent(rng) });
  if (rng.chance(0.25)) messages.push({ role: "developer", content: textContent(rng) });
  const user = () => messages.push({ role: "user", content: userContent(rng, links) });
  for (let round = rng.int(3); round > 0; round--) {
    user();
    if (rng.chance(0.15)) user();
    if (rng.chance(0.08)) messages.push({ role: "system", content: words(rng, 6) });
    if (tools.length > 0 && rng.chance(0.55)) {
      const calls = Array.from({ length: 1 + rng.int(2) }, () => ({
        id: `${rng.pick(["call_", "toolu_", "tooluse_"])}${alnum(rng, 12 + rng.int(12))}`,
        type: "function",
        function: { name: rng.pick(tools).function.name, arguments: JSON.stringify(jsonObject(rng)) },
      }));
      // Clients that send back the message they got write `content: null` (some write "").
      const assistant: Json = { role: "assistant", content: rng.pick([undefined, null, null, "", textContent(rng)]), tool_calls: calls };
      if (assistant.content === undefined) delete assistant.content;
      else if (rng.chance(0.3)) Object.assign(assistant, { refusal: null, annotations: [] });
      messages.push(assistant);
      for (const c of calls) {
        const result = rng.pick([() => JSON.stringify(jsonObject(rng)), () => words(rng, 8), () => Array.from({ length: 1 + rng.int(2) }, () => textPart(rng))])();
        messages.push({ role: "tool", tool_call_id: c.id, content: result });
      }
      if (round === 1 && rng.chance(0.3)) return messages;
    } else messages.push({ role: "assistant", content: textContent(rng) });
  }
  user();
  return messages;
}

/** Optional fields some clients send as null when unset (null means unset). */
const NULLABLE = ["temperature", "top_p", "max_tokens", "stop", "user", "seed", "n", "presence_penalty", "response_format", "tool_choice"];

function randomRequest(rng: Random, model: string, links: number): Json {
  const tools = rng.chance(0.45) ? Array.from({ length: 1 + rng.int(3) }, (_, i) => randomTool(rng, i)) : [];
  const req: Json = { model, messages: conversation(rng, tools, links) };
  if (tools.length > 0) {
    req.tools = tools;
    if (rng.chance(0.6)) req.tool_choice = rng.pick(["auto", "none", "required", { type: "function", function: { name: rng.pick(tools).function.name } }]);
    if (rng.chance(0.12)) req.parallel_tool_calls = rng.chance(0.5);
  }
  if (rng.chance(0.2)) {
    req.response_format = rng.pick([
      () => ({ type: "json_object" }),
      () => ({ type: "json_schema", json_schema: { name: ascii(rng), schema: rootSchema(rng, false), ...(rng.chance(0.5) ? { strict: true } : {}) } }),
      () => ({ type: "text" }),
    ])();
  }
  if (rng.chance(0.5)) req.temperature = Math.round(rng.next() * 100) / 100;
  if (rng.chance(0.3)) req.top_p = Math.round(rng.next() * 100) / 100;
  const max = 1 + rng.int(4000);
  const maxKind = rng.int(6);
  if (maxKind === 0 || maxKind === 2) req.max_tokens = max;
  if (maxKind === 1 || maxKind === 2) req.max_completion_tokens = maxKind === 2 ? max + 1 + rng.int(100) : max;
  if (rng.chance(0.3)) req.stop = rng.chance(0.4) ? word(rng) : Array.from({ length: 1 + rng.int(4) }, () => word(rng));
  if (rng.chance(0.3)) req.user = `user-${ascii(rng)}`;
  if (rng.chance(0.15)) req.seed = rng.int(1_000_000);
  if (rng.chance(0.1)) req.n = 1 + rng.int(3);
  if (rng.chance(0.06)) req.presence_penalty = Math.round(rng.next() * 10) / 10;
  if (rng.chance(0.06)) req.frequency_penalty = Math.round(rng.next() * 10) / 10 - 1;
  if (rng.chance(0.04)) req.logprobs = true;
  if (rng.chance(0.12)) req.reasoning_effort = rng.pick(["none", "minimal", "low", "medium", "high"]);
  if (rng.chance(0.1)) req.stream = false;
  if (rng.chance(0.1)) for (const k of NULLABLE) if (req[k] === undefined && rng.chance(0.3)) req[k] = null;
  return req;
}

// ---------------------------------------------------------------------------------------------
// Reading OpenAI messages

type Part = Json & { type: string };
const partsOf = (content: unknown): Part[] => (typeof content === "string" ? (content === "" ? [] : [{ type: "text", text: content }]) : (list(content) as Part[]));
const textOf = (content: unknown): string =>
  partsOf(content)
    .filter((p) => p.type === "text")
    .map((p) => String(p.text))
    .join("");
const urlOf = (p: Part): string => String(obj(p.image_url).url);
const callsOf = (m: Json) => list(m.tool_calls).map((c) => ({ id: String(c.id), name: String(obj(c.function).name), args: JSON.parse(String(obj(c.function).arguments)) as Json }));
const instructions = (m: Json) => m.role === "system" || m.role === "developer";
/** Tool-call id → function name, from the assistant turns. */
const callNames = (messages: Json[]) => new Map(messages.flatMap((m) => callsOf(m).map((c) => [c.id, c.name] as const)));
const dataUrl = (url: string) => /^data:([^;,]+);base64,(.*)$/s.exec(url);
const clientTools = (req: Json) => list(req.tools).map((t) => obj(t.function));
const choiceOf = (req: Json): { kind: "auto" | "none" | "required" | "function" | "absent"; name?: string } => {
  const c = req.tool_choice;
  if (c === undefined) return { kind: "absent" };
  if (typeof c === "string") return { kind: c as "auto" | "none" | "required" };
  return { kind: "function", name: String(obj(obj(c).function).name) };
};
const stopList = (req: Json): string[] | undefined => (req.stop === undefined ? undefined : typeof req.stop === "string" ? [req.stop] : (req.stop as string[]));
const maxTokens = (req: Json) => (req.max_completion_tokens ?? req.max_tokens) as number | undefined;
const jsonFormat = (req: Json) => {
  const f = obj(req.response_format);
  return f.type === "json_object" || f.type === "json_schema" ? f : undefined;
};
const formatSchema = (req: Json) => obj(jsonFormat(req)?.json_schema).schema as Json | undefined;

/** Sets the entries whose value is defined. */
function defined(into: Json, entries: Json): Json {
  for (const [k, v] of Object.entries(entries)) if (v !== undefined) into[k] = v;
  return into;
}

// ---------------------------------------------------------------------------------------------
// Answers: what the upstream says, provider-neutral, and what the client must get

interface Call {
  id: string;
  name: string;
  args: Json;
  /** Gemini's thought signature on the call, which it wants back with it. */
  signature?: string;
}

/** Tool-call id the client got → the thought signature Gemini sent with that call. */
const signatures = new Map<string, string>();
/** Tool-call id the client got → the id Gemini must get with that call and its result: Gemini's own, else the one the gateway made up. */
const geminiIds = new Map<string, string>();
const geminiId = (id: string) => geminiIds.get(id) ?? id;

interface Plan {
  text: string;
  reasoning: string;
  calls: Call[];
  /** The provider's finish reason and the OpenAI one it means. */
  finish: [string, string];
  /** A forced response-format tool's input: the answer itself. */
  json?: Json;
}

interface Counts {
  prompt: number;
  completion: number;
  cached: number;
  cacheWrite: number;
  reasoning: number;
  toolPrompt: number;
}

interface Rendered {
  body: Json;
  /** The error the client must get for this answer (a refusal inside a 200). */
  error?: { type: string; message: string };
  /** The response id the client must see (undefined: any id). */
  id?: string;
  model: string;
}

interface Family {
  /** Makes a random request one the provider takes (its documented rules on combinations of fields). */
  valid?(req: Json): void;
  /** The OpenAI fields the gateway says it translates for this provider (undefined: all of them). */
  accepts?: readonly string[];
  /** The 400 for image links, where the provider takes only inline bytes. */
  linkRefusal?: (d: Dep) => string;
  /** The upstream body the provider must get for the (sent) request. */
  request(req: Json, d: Dep): Json;
  /** One form for encodings the provider documents as equivalent (applied to both sides). */
  normalize?(body: Json): Json;
  /** Provider finish reasons for text answers and for tool calls, with their OpenAI meaning; `empty`: those that may come with no content at all. */
  finishes: { text: [string, string][]; tools: [string, string][]; json?: [string, string]; empty?: string[] };
  /** Usage details the provider reports; whether it answers thinking; how many choices. */
  reports: Partial<Record<"cached" | "cacheWrite" | "reasoning" | "toolPrompt" | "thinking", boolean>>;
  choices: (req: Json) => number;
  /** Whether the upstream request turns thinking on (then the answer starts with it). */
  thinks?: (upstream: Json) => boolean;
  /** The signed thinking blocks the client must get to send back (from the upstream answer). */
  thinkingBlocks?: (body: Json) => Json[];
  /** Whether calls may carry a thought signature the client must send back. */
  signs?: boolean;
  /** Whether the upstream request forces the response-format tool. */
  forcesJson?: (upstream: Json) => boolean;
  /** The provider's id for a call ("": none, the gateway makes one up); absent: the provider gives calls no ids. */
  newId?: (rng: Random) => string;
  render(plans: Plan[], counts: Counts, req: Json, d: Dep, rng: Random): Rendered;
}

interface Dep {
  name: string;
  provider: string;
  upstreamModel: string;
  family: Family;
  path: string;
  /** Headers the upstream must get (a pattern, or undefined: absent). */
  auth: Record<string, string | RegExp | undefined>;
  vertex?: boolean;
  /** The mock it calls: what it received (header names lower-cased), and a reset. */
  mock: { readonly requests: { method: string; path: string; headers: Record<string, string>; body: unknown }[]; reset(): void };
  /** Queues the mock's answer to the next request. */
  answerNext(body: Json): void;
}

// ---------------------------------------------------------------------------------------------
// OpenAI and Azure: the same wire format, the request passed on with the deployment's model

const GATEWAY_ONLY = ["drop_params"];

const OPENAI: Family = {
  request(req, d) {
    const body: Json = { ...req, model: d.upstreamModel };
    for (const k of GATEWAY_ONLY) delete body[k];
    return body;
  },
  finishes: { text: [["stop", "stop"], ["length", "length"], ["content_filter", "content_filter"]], tools: [["tool_calls", "tool_calls"]] },
  reports: { cached: true, reasoning: true },
  choices: (req) => (typeof req.n === "number" ? req.n : 1),
  newId: (rng) => `call_${alnum(rng, 24)}`,
  render(plans, u, _req, d, rng) {
    const id = `chatcmpl-${alnum(rng, 29)}`;
    const model = `${d.upstreamModel}-2024-08-06`;
    const choices = plans.map((p, index) => {
      const message: Json = { role: "assistant", content: p.text === "" && p.calls.length > 0 ? null : p.text, refusal: null, annotations: [] };
      if (p.calls.length > 0) message.tool_calls = p.calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: JSON.stringify(c.args) } }));
      return { index, message, logprobs: null, finish_reason: p.finish[0] };
    });
    const usage = {
      prompt_tokens: u.prompt,
      completion_tokens: u.completion,
      total_tokens: u.prompt + u.completion,
      prompt_tokens_details: { cached_tokens: u.cached, audio_tokens: 0 },
      completion_tokens_details: { reasoning_tokens: u.reasoning, audio_tokens: 0, accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 },
    };
    return { body: { id, object: "chat.completion", created: 1_750_000_000, model, choices, usage, service_tier: "default", system_fingerprint: "fp_0ba0d124f1" }, id, model };
  },
};

// ---------------------------------------------------------------------------------------------
// Anthropic's Messages API (api.anthropic.com and Claude on Vertex AI)

const JSON_TOOL = "json_tool_call";
/** The tool Bedrock is offered in a turn that offers none while the conversation holds tool calls. */
const NO_TOOLS = "no_tools_available";
const CLAUDE_DEFAULT_MAX_TOKENS = 4096;
/** reasoning_effort → Claude's thinking budget (Anthropic's least is 1024 tokens). */
const CLAUDE_THINKING: Record<string, number> = { minimal: 1024, low: 1024, medium: 2048, high: 4096 };
const claudeBudget = (req: Json) => CLAUDE_THINKING[String(req.reasoning_effort)];

/**
 * With thinking on, Claude takes no temperature or top_p, no forced tool, max_tokens above the
 * budget, and a tool loop in progress only with the thinking that led to it (a random history has none).
 */
function claudeThinkingRules(req: Json): void {
  const budget = claudeBudget(req);
  if (budget === undefined) return;
  if (callsOf((req.messages as Json[]).findLast((m) => m.role === "assistant") ?? {}).length > 0) {
    delete req.reasoning_effort;
    return;
  }
  delete req.temperature;
  delete req.top_p;
  if (req.tool_choice === "required" || isObject(req.tool_choice)) req.tool_choice = "auto";
  for (const k of ["max_tokens", "max_completion_tokens"]) if (typeof req[k] === "number" && (req[k] as number) <= budget) req[k] = budget + (req[k] as number);
}

function claudeBlock(p: Part): Json {
  if (p.type === "text") return { type: "text", text: p.text };
  const url = urlOf(p);
  const m = dataUrl(url);
  return { type: "image", source: m ? { type: "base64", media_type: m[1], data: m[2] } : { type: "url", url } };
}

const textBlocks = (content: unknown): Json[] => partsOf(content).map((p) => ({ type: "text", text: p.text }));

/** Turns merged by role (the API wants user and assistant to alternate). */
function alternating(turns: { role: string; content: Json[] }[], key = "content"): Json[] {
  const out: Json[] = [];
  for (const t of turns) {
    if (t.content.length === 0) continue;
    const last = out.at(-1);
    if (last?.role === t.role) (last[key] as Json[]).push(...t.content);
    else out.push({ role: t.role, [key]: [...t.content] });
  }
  return out;
}

const CLAUDE: Family = {
  valid: claudeThinkingRules,
  accepts: ["temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "tools", "tool_choice", "parallel_tool_calls", "response_format", "user", "reasoning_effort"],
  request(req, d) {
    const messages = req.messages as Json[];
    const body: Json = d.vertex ? { anthropic_version: "vertex-2023-10-16" } : { model: d.upstreamModel };
    const budget = claudeBudget(req);
    // max_tokens covers thinking and answer.
    body.max_tokens = maxTokens(req) ?? CLAUDE_DEFAULT_MAX_TOKENS + (budget ?? 0);
    const system = messages.filter(instructions).flatMap((m) => partsOf(m.content).map((p) => String(p.text)));
    if (system.length > 0) body.system = [{ type: "text", text: system.join("\n\n") }];
    if (budget !== undefined) body.thinking = { type: "enabled", budget_tokens: budget };
    body.messages = alternating(
      messages
        .filter((m) => !instructions(m))
        .map((m) => {
          if (m.role === "tool") return { role: "user", content: [{ type: "tool_result", tool_use_id: m.tool_call_id, content: textBlocks(m.content) }] };
          const calls = callsOf(m).map((c) => ({ type: "tool_use", id: c.id, name: c.name, input: c.args }));
          // Thinking comes back first, signature intact, before the tool use it led to.
          return { role: String(m.role), content: [...list(m.thinking_blocks), ...partsOf(m.content).map(claudeBlock), ...calls] };
        }),
    );
    defined(body, { temperature: req.temperature, top_p: req.top_p, stop_sequences: stopList(req) });
    const tools: Json[] = clientTools(req).map((fn) => defined({ name: fn.name, input_schema: fn.parameters ?? { type: "object", properties: {} } }, { description: fn.description }));
    const choice = choiceOf(req);
    let toolChoice: Json | undefined;
    if (tools.length > 0) {
      toolChoice = { auto: { type: "auto" }, none: { type: "none" }, required: { type: "any" }, function: { type: "tool", name: choice.name }, absent: undefined }[choice.kind];
      if (req.parallel_tool_calls === false && choice.kind !== "none") toolChoice = { ...(toolChoice ?? { type: "auto" }), disable_parallel_tool_use: true };
    }
    if (jsonFormat(req)) {
      // JSON output is a tool the model is made to call; with the client's own tools callable, any
      // tool call (theirs or the JSON one). Anthropic refuses a forced tool while thinking.
      if (budget === undefined) {
        if (tools.length === 0 || choice.kind === "none") toolChoice = { type: "tool", name: JSON_TOOL };
        else if (choice.kind === "auto" || choice.kind === "absent") toolChoice = { ...toolChoice, type: "any" };
      }
      tools.push({ name: JSON_TOOL, input_schema: formatSchema(req) ?? { type: "object" } });
    }
    defined(body, { tools: tools.length > 0 ? tools : undefined, tool_choice: toolChoice, metadata: req.user === undefined ? undefined : { user_id: req.user } });
    return body;
  },
  normalize(body) {
    const blocks = (c: unknown) => (typeof c === "string" ? [{ type: "text", text: c }] : c);
    const out: Json = { ...body, messages: list(body.messages).map((m) => ({ ...m, content: list(blocks(m.content)).map((b) => (b.type === "tool_result" ? { ...b, content: blocks(b.content) } : b)) })) };
    if (body.system !== undefined) out.system = blocks(body.system);
    // The response-format tool's description is the gateway's own words.
    if (body.tools !== undefined) out.tools = list(body.tools).map(({ description, ...t }) => (t.name === JSON_TOOL ? t : defined(t, { description })));
    return out;
  },
  finishes: {
    text: [["end_turn", "stop"], ["stop_sequence", "stop"], ["max_tokens", "length"], ["refusal", "content_filter"], ["pause_turn", "stop"]],
    tools: [["tool_use", "tool_calls"]],
    json: ["tool_use", "stop"],
  },
  reports: { cached: true, cacheWrite: true, thinking: true },
  choices: () => 1,
  forcesJson: (up) => obj(up.tool_choice).name === JSON_TOOL,
  thinks: (up) => up.thinking !== undefined,
  thinkingBlocks: (body) => list(body.content).filter((b) => b.type === "thinking" || b.type === "redacted_thinking"),
  newId: (rng) => `toolu_01${alnum(rng, 22)}`,
  render([p], u, req, d, rng) {
    const content: Json[] = [];
    if (p!.reasoning) content.push({ type: "thinking", thinking: p!.reasoning, signature: base64(rng) });
    if (p!.reasoning && rng.chance(0.2)) content.push({ type: "redacted_thinking", data: base64(rng) });
    if (p!.text) for (const text of pieces(rng, p!.text)) content.push({ type: "text", text });
    for (const c of p!.calls) content.push({ type: "tool_use", id: c.id, name: c.name, input: c.args });
    if (p!.json) content.push({ type: "tool_use", id: `toolu_01${alnum(rng, 22)}`, name: JSON_TOOL, input: p!.json });
    const id = `msg_01${alnum(rng, 22)}`;
    const model = d.vertex ? d.upstreamModel.replace("@", "-") : d.upstreamModel;
    const stopSequence = p!.finish[0] === "stop_sequence" ? (stopList(req)?.[0] ?? "###") : null;
    const usage = { input_tokens: u.prompt - u.cached - u.cacheWrite, cache_creation_input_tokens: u.cacheWrite, cache_read_input_tokens: u.cached, output_tokens: u.completion, service_tier: "standard" };
    return { body: { id, type: "message", role: "assistant", model, content, stop_reason: p!.finish[0], stop_sequence: stopSequence, usage }, id, model };
  },
};

// ---------------------------------------------------------------------------------------------
// Gemini (AI Studio and Vertex AI): generateContent

const GEMINI_LINK_TYPES = new Map(LINK_TYPES);

function geminiPart(p: Part): Json {
  if (p.type === "text") return { text: p.text };
  const url = urlOf(p);
  const m = dataUrl(url);
  if (m) return { inlineData: { mimeType: m[1], data: m[2] } };
  const type = GEMINI_LINK_TYPES.get(LINK_TYPES.find(([suffix]) => url.endsWith(suffix))?.[0] ?? "");
  return { fileData: defined({ fileUri: url }, { mimeType: type }) };
}

/**
 * JSON Schema → Gemini's Schema, an OpenAPI 3.0 subset: upper-case types, no references (inlined),
 * `nullable` for a union with null, no additionalProperties or $defs.
 */
function geminiSchema(s: Json, defs: Json = obj(s.$defs)): Json {
  if (typeof s.$ref === "string") {
    const { $ref, ...siblings } = s;
    return geminiSchema({ ...obj(defs[$ref.replace("#/$defs/", "")]), ...siblings }, defs);
  }
  if (Array.isArray(s.anyOf)) {
    const { anyOf, ...rest } = s;
    const [member] = (anyOf as Json[]).filter((m) => m.type !== "null");
    return { ...geminiSchema({ ...rest, ...member }, defs), nullable: true };
  }
  const out: Json = {};
  if (typeof s.type === "string") out.type = s.type.toUpperCase();
  defined(out, { title: s.title, description: s.description, default: s.default, minimum: s.minimum, maximum: s.maximum, enum: s.enum });
  if (isObject(s.properties)) out.properties = Object.fromEntries(Object.entries(s.properties).map(([k, v]) => [k, geminiSchema(obj(v), defs)]));
  if (Array.isArray(s.required)) out.required = s.required;
  if (isObject(s.items)) out.items = geminiSchema(s.items, defs);
  return out;
}

/** A tool result as the object Gemini wants: a JSON object as it is, other text under `content`. */
function functionResponse(text: string): Json {
  try {
    const v: unknown = JSON.parse(text);
    if (isObject(v)) return v;
  } catch {
    // text
  }
  return { content: text };
}

/** Adjacent text parts read as one text (Gemini concatenates a turn's parts). */
function mergedText(parts: Json[]): Json[] {
  const out: Json[] = [];
  for (const p of parts) {
    const last = out.at(-1);
    if (Object.keys(p).length === 1 && typeof p.text === "string" && last && Object.keys(last).length === 1 && typeof last.text === "string") out[out.length - 1] = { text: `${last.text}${p.text}` };
    else out.push(p);
  }
  return out;
}

/** reasoning_effort → Gemini's thinking budget (tokens); "none" turns thinking off. */
const GEMINI_THINKING: Record<string, number> = { minimal: 128, low: 1024, medium: 2048, high: 4096 };
function thinkingConfig(effort: unknown): Json | undefined {
  if (effort === "none") return { thinkingBudget: 0 };
  const budget = GEMINI_THINKING[String(effort)];
  return budget === undefined ? undefined : { includeThoughts: true, thinkingBudget: budget };
}

const GEMINI: Family = {
  accepts: ["temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "n", "seed", "presence_penalty", "frequency_penalty", "response_format", "tools", "tool_choice", "parallel_tool_calls", "user", "reasoning_effort"],
  request(req) {
    const messages = req.messages as Json[];
    const names = callNames(messages);
    const contents = alternating(
      messages
        .filter((m) => !instructions(m))
        .map((m) => {
          if (m.role === "tool") return { role: "user", content: [{ functionResponse: { id: geminiId(String(m.tool_call_id)), name: names.get(String(m.tool_call_id)), response: functionResponse(textOf(m.content)) } }] };
          const calls = callsOf(m).map((c) => defined({ functionCall: { id: geminiId(c.id), name: c.name, args: c.args } }, { thoughtSignature: signatures.get(c.id) }));
          return { role: m.role === "assistant" ? "model" : "user", content: [...partsOf(m.content).map(geminiPart), ...calls] };
        }),
      "parts",
    );
    const body: Json = { contents };
    const system = messages.filter(instructions).map((m) => ({ text: textOf(m.content) }));
    if (system.length > 0) body.systemInstruction = { parts: system };
    const declarations = clientTools(req).map((fn) => {
      const params = obj(fn.parameters);
      const empty = Object.keys(obj(params.properties)).length === 0;
      return defined({ name: fn.name }, { description: fn.description, parameters: empty ? undefined : geminiSchema(params) });
    });
    if (declarations.length > 0) body.tools = [{ functionDeclarations: declarations }];
    const choice = choiceOf(req);
    if (choice.kind !== "absent") {
      const mode = { auto: "AUTO", none: "NONE", required: "ANY", function: "ANY" }[choice.kind];
      body.toolConfig = { functionCallingConfig: defined({ mode }, { allowedFunctionNames: choice.name === undefined ? undefined : [choice.name] }) };
    }
    const format = jsonFormat(req);
    const schema = formatSchema(req);
    const config = defined(
      {},
      {
        temperature: req.temperature,
        topP: req.top_p,
        maxOutputTokens: maxTokens(req),
        stopSequences: stopList(req),
        seed: req.seed,
        presencePenalty: req.presence_penalty,
        frequencyPenalty: req.frequency_penalty,
        candidateCount: req.n,
        responseMimeType: format ? "application/json" : undefined,
        responseSchema: schema ? geminiSchema(schema) : undefined,
        thinkingConfig: thinkingConfig(req.reasoning_effort),
      },
    );
    if (Object.keys(config).length > 0) body.generationConfig = config;
    return body;
  },
  normalize(body) {
    const content = (c: Json) => ({ ...c, parts: mergedText(list(c.parts)) });
    const out: Json = { ...body, contents: list(body.contents).map(content) };
    if (body.systemInstruction !== undefined) out.systemInstruction = content(obj(body.systemInstruction));
    return out;
  },
  finishes: {
    text: [["STOP", "stop"], ["MAX_TOKENS", "length"], ["SAFETY", "content_filter"], ["RECITATION", "content_filter"], ["BLOCKLIST", "content_filter"], ["PROHIBITED_CONTENT", "content_filter"], ["SPII", "content_filter"], ["OTHER", "stop"]],
    tools: [["STOP", "tool_calls"]],
    empty: ["SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII"],
  },
  reports: { cached: true, reasoning: true, toolPrompt: true, thinking: true },
  // Gemini gives a call an id only sometimes.
  newId: (rng) => (rng.chance(0.5) ? alnum(rng, 12) : ""),
  signs: true,
  choices: (req) => (typeof req.n === "number" ? req.n : 1),
  render(plans, u, _req, d, rng) {
    const candidates = plans.map((p, index) => {
      const parts: Json[] = [];
      if (p.reasoning) parts.push({ text: p.reasoning, thought: true });
      if (p.text) for (const text of pieces(rng, p.text)) parts.push({ text });
      for (const c of p.calls) parts.push(defined({ functionCall: defined({ name: c.name, args: c.args }, { id: c.id || undefined }) }, { thoughtSignature: c.signature }));
      // A candidate its filters stopped before any output has no content at all.
      return parts.length > 0 ? { content: { parts, role: "model" }, finishReason: p.finish[0], index } : { finishReason: p.finish[0], index };
    });
    const usageMetadata = defined(
      { promptTokenCount: u.prompt - u.toolPrompt, candidatesTokenCount: u.completion - u.reasoning, totalTokenCount: u.prompt + u.completion },
      { cachedContentTokenCount: u.cached || undefined, thoughtsTokenCount: u.reasoning || undefined, toolUsePromptTokenCount: u.toolPrompt || undefined },
    );
    const id = alnum(rng, 22);
    const model = `${d.upstreamModel}-001`;
    if (rng.chance(0.03)) {
      // The prompt itself blocked: no candidates, a 200 that is a refusal.
      const reason = rng.pick(["SAFETY", "BLOCKLIST", "PROHIBITED_CONTENT", "OTHER"]);
      const body = { promptFeedback: { blockReason: reason }, usageMetadata: { promptTokenCount: u.prompt, totalTokenCount: u.prompt }, modelVersion: model, responseId: id };
      return { body, id, model, error: { type: "content_policy_violation", message: `blockReason ${reason}` } };
    }
    return { body: { candidates, usageMetadata, modelVersion: model, responseId: id }, id, model };
  },
};

// ---------------------------------------------------------------------------------------------
// Amazon Bedrock: Converse

const CONVERSE_IMAGE_FORMATS: Record<string, string> = { "image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp" };

function converseBlock(p: Part): Json {
  if (p.type === "text") return { text: p.text };
  const m = dataUrl(urlOf(p))!;
  return { image: { format: CONVERSE_IMAGE_FORMATS[m[1]!], source: { bytes: m[2] } } };
}

const BEDROCK: Family = {
  valid: claudeThinkingRules,
  accepts: ["temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "tools", "tool_choice", "response_format", "user", "reasoning_effort"],
  linkRefusal: () => "bedrock: images must be sent inline as data: URLs (base64); Bedrock cannot fetch image links",
  request(req) {
    const messages = req.messages as Json[];
    const turns = alternating(
      messages
        .filter((m) => !instructions(m))
        .map((m) => {
          if (m.role === "tool") return { role: "user", content: [{ toolResult: { toolUseId: m.tool_call_id, content: partsOf(m.content).map(converseBlock) } }] };
          const calls = callsOf(m).map((c) => ({ toolUse: { toolUseId: c.id, name: c.name, input: c.args } }));
          // Claude's thinking comes back first, signature intact, before the tool use it led to.
          const thinking = list(m.thinking_blocks).map((b) => ({ reasoningContent: b.type === "thinking" ? { reasoningText: { text: b.thinking, signature: b.signature } } : { redactedContent: b.data } }));
          return { role: String(m.role), content: [...thinking, ...partsOf(m.content).map(converseBlock), ...calls] };
        }),
    );
    const body: Json = { messages: turns };
    const system = messages.filter(instructions).flatMap((m) => partsOf(m.content).map((p) => ({ text: p.text })));
    if (system.length > 0) body.system = system;
    // The model is a Claude: reasoning_effort is its extended thinking, in the model's own fields.
    const budget = claudeBudget(req);
    if (budget !== undefined) body.additionalModelRequestFields = { thinking: { type: "enabled", budget_tokens: budget } };
    const inference = defined({}, { maxTokens: maxTokens(req) ?? (budget === undefined ? undefined : budget + 4096), temperature: req.temperature, topP: req.top_p, stopSequences: stopList(req) });
    if (Object.keys(inference).length > 0) body.inferenceConfig = inference;
    // Converse has no "none": the client's tools are left out.
    const choice = choiceOf(req);
    const hasToolBlocks = messages.some((m) => m.role === "tool" || (m.role === "assistant" && list(m.tool_calls).length > 0));
    const tools: Json[] =
      choice.kind === "none"
        ? []
        : clientTools(req).map((fn) => ({ toolSpec: defined({ name: fn.name }, { description: fn.description, inputSchema: { json: fn.parameters ?? { type: "object", properties: {} } } }) }));
    let toolChoice: Json | undefined = tools.length === 0 ? undefined : { auto: { auto: {} }, required: { any: {} }, function: { tool: { name: choice.name } }, none: undefined, absent: undefined }[choice.kind];
    if (jsonFormat(req)) {
      // JSON output is a tool the model must call: that one, or one of the client's own where it lets
      // the model call them (Claude refuses a forced tool while thinking: then it is only offered).
      if (budget === undefined) toolChoice = tools.length === 0 || choice.kind === "none" ? { tool: { name: JSON_TOOL } } : choice.kind === "auto" || choice.kind === "absent" ? { any: {} } : toolChoice;
      tools.push({ toolSpec: { name: JSON_TOOL, inputSchema: { json: formatSchema(req) ?? { type: "object" } } } });
    }
    // A conversation holding tool blocks needs a tool list all the same (README): the placeholder tool is one.
    if (tools.length === 0 && hasToolBlocks) tools.push({ toolSpec: { name: NO_TOOLS, inputSchema: { json: { type: "object", properties: {} } } } });
    if (tools.length > 0) body.toolConfig = defined({ tools }, { toolChoice });
    return body;
  },
  normalize(body) {
    const config = body.toolConfig;
    if (!isObject(config)) return body;
    const tools = list(config.tools).map((t) => {
      const spec = obj(t.toolSpec);
      if (spec.name !== JSON_TOOL && spec.name !== NO_TOOLS) return t;
      const { description: _d, ...rest } = spec;
      return { toolSpec: rest };
    });
    return { ...body, toolConfig: { ...config, tools } };
  },
  finishes: {
    text: [["end_turn", "stop"], ["stop_sequence", "stop"], ["max_tokens", "length"], ["guardrail_intervened", "content_filter"], ["content_filtered", "content_filter"]],
    tools: [["tool_use", "tool_calls"]],
    json: ["tool_use", "stop"],
  },
  reports: { cached: true, cacheWrite: true, thinking: true },
  choices: () => 1,
  forcesJson: (up) => obj(obj(obj(up.toolConfig).toolChoice).tool).name === JSON_TOOL,
  thinks: (up) => obj(up.additionalModelRequestFields).thinking !== undefined,
  // Claude's thinking, as the Anthropic API writes it: what the client sends back on its next turn.
  thinkingBlocks: (body) =>
    list(obj(obj(body.output).message).content).flatMap((b): Json[] => {
      const r = obj(b.reasoningContent);
      if (isObject(r.reasoningText)) return [{ type: "thinking", thinking: r.reasoningText.text, signature: r.reasoningText.signature }];
      return typeof r.redactedContent === "string" ? [{ type: "redacted_thinking", data: r.redactedContent }] : [];
    }),
  newId: (rng) => `tooluse_${alnum(rng, 22)}`,
  render([p], u, req, _d, rng) {
    const content: Json[] = [];
    if (p!.reasoning) content.push({ reasoningContent: { reasoningText: { text: p!.reasoning, signature: base64(rng) } } });
    if (p!.reasoning && rng.chance(0.2)) content.push({ reasoningContent: { redactedContent: base64(rng) } });
    if (p!.text) for (const text of pieces(rng, p!.text)) content.push({ text });
    for (const c of p!.calls) content.push({ toolUse: { toolUseId: c.id, name: c.name, input: c.args } });
    if (p!.json) content.push({ toolUse: { toolUseId: `tooluse_${alnum(rng, 22)}`, name: JSON_TOOL, input: p!.json } });
    const usage = defined(
      { inputTokens: u.prompt - u.cached - u.cacheWrite, outputTokens: u.completion, totalTokens: u.prompt + u.completion },
      { cacheReadInputTokens: u.cached || undefined, cacheWriteInputTokens: u.cacheWrite || undefined },
    );
    return { body: { metrics: { latencyMs: 100 + rng.int(900) }, output: { message: { role: "assistant", content } }, stopReason: p!.finish[0], usage }, model: String(req.model) };
  },
};

// ---------------------------------------------------------------------------------------------
// Cohere v2 chat and Ollama's /api/chat: one message per message, tools in OpenAI's shape

const SAMPLING_AND_TOOLS = ["temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "frequency_penalty", "presence_penalty", "tools", "tool_choice", "response_format", "user"];

/** The client's tools as the provider takes them: a named choice leaves only that tool where the API cannot name one. */
function offeredTools(req: Json, dropOnNone: boolean): Json[] {
  const choice = choiceOf(req);
  if (dropOnNone && choice.kind === "none") return [];
  return clientTools(req)
    .filter((fn) => choice.kind !== "function" || fn.name === choice.name)
    .map((fn) => ({ type: "function", function: defined({ name: fn.name }, { description: fn.description, parameters: fn.parameters }) }));
}

const COHERE: Family = {
  accepts: SAMPLING_AND_TOOLS,
  request(req, d) {
    const messages = (req.messages as Json[]).map((m): Json => {
      if (instructions(m)) return { role: "system", content: textOf(m.content) };
      if (m.role === "tool") return { role: "tool", tool_call_id: m.tool_call_id, content: textOf(m.content) };
      if (m.role === "user") return { role: "user", content: typeof m.content === "string" ? m.content : partsOf(m.content).map((p) => (p.type === "text" ? { type: "text", text: p.text } : { type: "image_url", image_url: { url: urlOf(p) } })) };
      const calls = callsOf(m);
      if (calls.length === 0) return { role: "assistant", content: textOf(m.content) };
      const text = textOf(m.content);
      return defined({ role: "assistant", tool_calls: list(m.tool_calls) }, { tool_plan: text || undefined });
    });
    const body: Json = { model: d.upstreamModel, messages };
    const tools = offeredTools(req, false);
    const choice = choiceOf(req);
    if (tools.length > 0) defined(body, { tools, tool_choice: { required: "REQUIRED", function: "REQUIRED", none: "NONE", auto: undefined, absent: undefined }[choice.kind] });
    defined(body, { temperature: req.temperature, p: req.top_p, max_tokens: maxTokens(req), stop_sequences: stopList(req), seed: req.seed, frequency_penalty: req.frequency_penalty, presence_penalty: req.presence_penalty });
    const format = jsonFormat(req);
    if (format) body.response_format = defined({ type: "json_object" }, { json_schema: formatSchema(req) });
    else if (obj(req.response_format).type === "text") body.response_format = { type: "text" };
    return body;
  },
  finishes: { text: [["COMPLETE", "stop"], ["STOP_SEQUENCE", "stop"], ["MAX_TOKENS", "length"]], tools: [["TOOL_CALL", "tool_calls"]] },
  reports: { thinking: true },
  choices: () => 1,
  newId: (rng) => `${ascii(rng)}_${alnum(rng, 12)}`,
  render([p], u, req) {
    const message: Json = { role: "assistant" };
    const thinking = p!.reasoning ? [{ type: "thinking", thinking: p!.reasoning }] : [];
    if (p!.calls.length > 0) {
      // Cohere says what it is about to do in `tool_plan`, not in content.
      if (p!.text) message.tool_plan = p!.text;
      message.tool_calls = p!.calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: JSON.stringify(c.args) } }));
      if (thinking.length > 0) message.content = thinking;
    } else message.content = [...thinking, { type: "text", text: p!.text }];
    const id = crypto.randomUUID();
    const usage = { billed_units: { input_tokens: u.prompt, output_tokens: u.completion }, tokens: { input_tokens: u.prompt + 66, output_tokens: u.completion } };
    return { body: { id, finish_reason: p!.finish[0], message, usage }, id, model: String(req.model) };
  },
};

/**
 * reasoning_effort → a Cohere reasoning model's `thinking` (README: LiteLLM's mapping): "none"
 * switches it off, the other levels cap it at a budget in tokens.
 */
const COHERE_THINKING: Record<string, number> = { minimal: 1024, low: 1024, medium: 2048, high: 4096 };

/** Cohere's reasoning models (`command-a-reasoning-…`): the same API, and `thinking`, which they alone take. */
const COHERE_REASONING: Family = {
  ...COHERE,
  accepts: [...SAMPLING_AND_TOOLS, "reasoning_effort"],
  request(req, d) {
    const body = COHERE.request(req, d);
    const effort = req.reasoning_effort;
    if (effort === "none") body.thinking = { type: "disabled" };
    else if (effort != null) body.thinking = { type: "enabled", token_budget: COHERE_THINKING[String(effort)] };
    return body;
  },
  // A reasoning model thinks unless told not to.
  thinks: (up) => obj(up.thinking).type !== "disabled",
};

/** reasoning_effort → Ollama's think for a model other than gpt-oss: on from "low" up. */
const OLLAMA_THINKS = new Set(["low", "medium", "high"]);

const OLLAMA: Family = {
  accepts: [...SAMPLING_AND_TOOLS, "reasoning_effort"],
  linkRefusal: (d) => `${d.provider} cannot take this request for model ${d.name}: Ollama takes images as base64 data URLs (data:image/png;base64,...), not links`,
  request(req, d) {
    const names = callNames(req.messages as Json[]);
    const messages = (req.messages as Json[]).map((m): Json => {
      if (instructions(m)) return { role: "system", content: textOf(m.content) };
      if (m.role === "tool") return defined({ role: "tool", content: textOf(m.content) }, { tool_name: names.get(String(m.tool_call_id)) });
      const out: Json = { role: m.role, content: textOf(m.content) };
      const images = partsOf(m.content).filter((p) => p.type === "image_url");
      if (images.length > 0) out.images = images.map((p) => dataUrl(urlOf(p))![2]);
      const calls = callsOf(m);
      if (calls.length > 0) out.tool_calls = calls.map((c) => ({ function: { name: c.name, arguments: c.args } }));
      return out;
    });
    const body: Json = { model: d.upstreamModel, messages, stream: false };
    const tools = offeredTools(req, true);
    if (tools.length > 0) body.tools = tools;
    const format = jsonFormat(req);
    if (format) body.format = formatSchema(req) ?? "json";
    const options = defined({}, { temperature: req.temperature, top_p: req.top_p, num_predict: maxTokens(req), stop: stopList(req), seed: req.seed, frequency_penalty: req.frequency_penalty, presence_penalty: req.presence_penalty });
    if (Object.keys(options).length > 0) body.options = options;
    if (req.reasoning_effort != null) body.think = OLLAMA_THINKS.has(String(req.reasoning_effort));
    return body;
  },
  finishes: { text: [["stop", "stop"], ["length", "length"]], tools: [["stop", "tool_calls"]] },
  reports: { thinking: true },
  thinks: (up) => up.think === true,
  choices: () => 1,
  render([p], u, _req, d) {
    const message = defined({ role: "assistant", content: p!.text }, { thinking: p!.reasoning || undefined });
    if (p!.calls.length > 0) message.tool_calls = p!.calls.map((c) => ({ function: { name: c.name, arguments: c.args } }));
    const body = {
      model: d.upstreamModel,
      created_at: "2025-06-01T12:00:00.123456Z",
      message,
      done_reason: p!.finish[0],
      done: true,
      total_duration: 5_191_566_416,
      load_duration: 2_154_458,
      prompt_eval_count: u.prompt,
      prompt_eval_duration: 383_809_000,
      eval_count: u.completion,
      eval_duration: 4_799_921_000,
    };
    return { body, model: d.upstreamModel };
  },
};

// ---------------------------------------------------------------------------------------------
// The model: refusals, and the answer the client must get

/** The parameters the gateway drops (drop_params) or refuses with its 400, and an image link it cannot send. */
function prepare(d: Dep, req: Json): { sent: Json; refusal?: { message: string; param?: string } } {
  const accepts = d.family.accepts;
  // A translating adapter reads null as unset; a passing one sends the body as it came.
  let sent = accepts ? Object.fromEntries(Object.entries(req).filter(([, v]) => v !== null)) : req;
  if (accepts) {
    const extra = Object.keys(req).filter((k) => !["model", "messages", "stream", "drop_params"].includes(k) && req[k] != null && !accepts.includes(k) && !(k === "n" && req.n === 1));
    if (extra.length > 0) {
      const message = `${d.provider} does not support parameters: [${extra.map((k) => `'${k}'`).join(", ")}], for model=${d.upstreamModel}. To drop these, set drop_params=true in the request body, or svc_settings.drop_params: true in config.yaml.`;
      if (req.drop_params !== true) return { sent, refusal: { message, param: extra.join(",") } };
      sent = Object.fromEntries(Object.entries(sent).filter(([k]) => !extra.includes(k)));
    }
  }
  const link = (sent.messages as Json[]).some((m) => partsOf(m.content).some((p) => p.type === "image_url" && !dataUrl(urlOf(p))));
  if (link && d.family.linkRefusal) return { sent, refusal: { message: d.family.linkRefusal(d) } };
  return { sent };
}

/** What the upstream answers to each choice: tools the request lets it call, text, thinking, a finish reason. */
function randomPlans(rng: Random, f: Family, req: Json, upstream: Json): Plan[] {
  const choice = choiceOf(req);
  const callable = choice.kind === "none" ? [] : clientTools(req).map((fn) => String(fn.name)).filter((name) => choice.kind !== "function" || name === choice.name);
  const forced = choice.kind === "required" || choice.kind === "function";
  return Array.from({ length: f.choices(req) }, (): Plan => {
    if (f.forcesJson?.(upstream)) return { text: "", reasoning: "", calls: [], json: jsonObject(rng), finish: f.finishes.json! };
    const call = (): Call => defined({ id: f.newId?.(rng) ?? "", name: rng.pick(callable), args: jsonObject(rng) }, { signature: f.signs && rng.chance(0.4) ? base64(rng) : undefined }) as unknown as Call;
    const calls = callable.length > 0 && rng.chance(forced ? 0.9 : 0.5) ? Array.from({ length: 1 + rng.int(3) }, call) : [];
    const finish = rng.pick(calls.length > 0 ? f.finishes.tools : f.finishes.text);
    if (calls.length === 0 && f.finishes.empty?.includes(finish[0]) && rng.chance(0.3)) return { text: "", reasoning: "", calls, finish };
    const text = calls.length > 0 && rng.chance(0.6) ? "" : words(rng, 15);
    const reasoning = f.thinks?.(upstream) || (f.reports.thinking && rng.chance(0.2)) ? words(rng, 10) : "";
    return { text, reasoning, calls, finish };
  });
}

/** Token counts in OpenAI's convention (details are parts of the totals), only those the provider reports. */
function randomCounts(rng: Random, f: Family): Counts {
  const prompt = 1 + rng.int(8000);
  const completion = 1 + rng.int(3000);
  const toolPrompt = f.reports.toolPrompt && rng.chance(0.2) ? rng.int(prompt) : 0;
  const cached = f.reports.cached && rng.chance(0.35) ? rng.int(prompt - toolPrompt + 1) : 0;
  const cacheWrite = f.reports.cacheWrite && rng.chance(0.25) ? rng.int(prompt - cached + 1) : 0;
  const reasoning = f.reports.reasoning && rng.chance(0.3) ? rng.int(completion + 1) : 0;
  return { prompt, completion, cached, cacheWrite, reasoning, toolPrompt };
}

/** A call id the gateway makes up (what follows is its own business: Gemini's signature rides there). */
const MADE_UP_CALL_ID = /^call_[A-Za-z0-9]{24}/;

/** The tool call id the client must get: the provider's (a signature may ride after it), else one the gateway made up. */
function expectedCallId(c: Call): unknown {
  if (c.id === "") return expect.stringMatching(MADE_UP_CALL_ID);
  return c.signature ? expect.stringMatching(new RegExp(`^${c.id}`)) : c.id;
}

function expectedAnswer(f: Family, plans: Plan[], u: Counts, r: Rendered): Json {
  const thinking = (index: number) => {
    const blocks = index === 0 ? (f.thinkingBlocks?.(r.body) ?? []) : [];
    return blocks.length > 0 ? blocks : undefined;
  };
  return {
    id: r.id ?? expect.stringMatching(/^chatcmpl-./),
    object: "chat.completion",
    model: r.model,
    choices: plans.map((p, index) => ({
      index,
      finish_reason: p.finish[1],
      role: "assistant",
      content: p.json ? JSON.stringify(p.json) : p.text !== "" ? p.text : null,
      reasoning: p.reasoning || undefined,
      thinking_blocks: thinking(index),
      tool_calls: p.calls.map((c) => ({ id: expectedCallId(c), type: "function", name: c.name, arguments: JSON.stringify(c.args) })),
    })),
    usage: {
      prompt_tokens: u.prompt,
      completion_tokens: u.completion,
      total_tokens: u.prompt + u.completion,
      cached_tokens: u.cached,
      reasoning_tokens: u.reasoning,
      cache_creation_input_tokens: u.cacheWrite || undefined,
    },
  };
}

/** The fields of a chat.completion the model predicts. */
function answerView(c: Json): Json {
  const u = obj(c.usage);
  return {
    id: c.id,
    object: c.object,
    model: c.model,
    choices: list(c.choices).map((ch) => {
      const m = obj(ch.message);
      return {
        index: ch.index,
        finish_reason: ch.finish_reason,
        role: m.role,
        content: m.content,
        reasoning: m.reasoning_content,
        thinking_blocks: m.thinking_blocks,
        tool_calls: list(m.tool_calls).map((t) => ({ id: t.id, type: t.type, name: obj(t.function).name, arguments: obj(t.function).arguments })),
      };
    }),
    usage: {
      prompt_tokens: u.prompt_tokens,
      completion_tokens: u.completion_tokens,
      total_tokens: u.total_tokens,
      cached_tokens: obj(u.prompt_tokens_details).cached_tokens ?? 0,
      reasoning_tokens: obj(u.completion_tokens_details).reasoning_tokens ?? 0,
      cache_creation_input_tokens: u.cache_creation_input_tokens,
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Setup

let started: StartedProviderMocks;
let mocks: ProviderMocks;
let gw: TestGateway;
let client: OpenAI;
let deps: Dep[] = [];

const PRICES = { input_cost_per_token: 0.000_001_25, output_cost_per_token: 0.000_01 };
const COHERE_REASONING_MODEL = "command-a-reasoning-08-2025";
const VERTEX_PROJECT = UPSTREAM.vertexProject;
const VERTEX_LOCATION = UPSTREAM.vertexLocation;
const vertexPath = (publisher: string, model: string, method: string) => `/v1/projects/${VERTEX_PROJECT}/locations/${VERTEX_LOCATION}/publishers/${publisher}/models/${model}:${method}`;

function buildDeps(): Dep[] {
  const m = mocks;
  const vertexAuth = { authorization: /^Bearer ya29\.c\.mock-/ };
  return [
    { name: "openai", provider: "openai", upstreamModel: "gpt-4o", family: OPENAI, path: "/v1/chat/completions", auth: { authorization: "Bearer sk-up-openai" }, mock: m.openai, answerNext: (body) => m.openai.fault({ kind: "answer", body }) },
    {
      name: "azure",
      provider: "azure",
      upstreamModel: "gpt-4o-prod",
      family: OPENAI,
      path: "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21",
      auth: { "api-key": "azure-key", authorization: undefined },
      mock: m.azure,
      answerNext: (body) => m.azure.fault({ kind: "answer", body }),
    },
    {
      name: "anthropic",
      provider: "anthropic",
      upstreamModel: "claude-3-5-sonnet-20241022",
      family: CLAUDE,
      path: "/v1/messages",
      auth: { "x-api-key": "sk-ant-up", "anthropic-version": "2023-06-01" },
      mock: m.anthropic,
      answerNext: (body) => m.anthropic.fault({ kind: "answer", body }),
    },
    {
      name: "vertex-claude",
      provider: "vertex_ai",
      upstreamModel: "claude-sonnet-4@20250514",
      family: CLAUDE,
      vertex: true,
      path: vertexPath("anthropic", "claude-sonnet-4@20250514", "rawPredict"),
      auth: vertexAuth,
      mock: m.gemini,
      answerNext: (body) => m.gemini.fault({ kind: "answer", body, path: ":rawPredict" }),
    },
    {
      name: "gemini",
      provider: "gemini",
      upstreamModel: "gemini-2.5-flash",
      family: GEMINI,
      path: "/v1beta/models/gemini-2.5-flash:generateContent",
      auth: { "x-goog-api-key": "AIza-up", authorization: undefined },
      mock: m.gemini,
      answerNext: (body) => m.gemini.fault({ kind: "answer", body, path: ":generateContent" }),
    },
    {
      name: "vertex-gemini",
      provider: "vertex_ai",
      upstreamModel: "gemini-2.5-pro",
      family: GEMINI,
      vertex: true,
      path: vertexPath("google", "gemini-2.5-pro", "generateContent"),
      auth: vertexAuth,
      mock: m.gemini,
      answerNext: (body) => m.gemini.fault({ kind: "answer", body, path: ":generateContent" }),
    },
    {
      name: "bedrock",
      provider: "bedrock",
      upstreamModel: "anthropic.claude-3-haiku-20240307-v1:0",
      family: BEDROCK,
      path: "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse",
      auth: { authorization: /^AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE\/\d{8}\/us-west-2\/bedrock\/aws4_request, ?SignedHeaders=[a-z0-9;-]+, ?Signature=[0-9a-f]{64}$/ },
      mock: m.bedrock,
      answerNext: (body) => m.bedrock.fault({ kind: "answer", body, action: "converse" }),
    },
    { name: "cohere", provider: "cohere", upstreamModel: "command-a-03-2025", family: COHERE, path: "/v2/chat", auth: { authorization: "Bearer co-up" }, mock: m.cohere, answerNext: (body) => m.cohere.fault({ kind: "answer", body }) },
    {
      name: "cohere-reasoning",
      provider: "cohere",
      upstreamModel: COHERE_REASONING_MODEL,
      family: COHERE_REASONING,
      path: "/v2/chat",
      auth: { authorization: "Bearer co-up" },
      mock: m.cohere,
      answerNext: (body) => m.cohere.fault({ kind: "answer", body }),
    },
    { name: "ollama", provider: "ollama_chat", upstreamModel: "llama3.2", family: OLLAMA, path: "/api/chat", auth: { authorization: undefined }, mock: m.ollama, answerNext: (body) => m.ollama.fault({ kind: "answer", body }) },
  ];
}

beforeAll(async () => {
  started = await startProviderMocks({ serviceAccount: "translation-diff@acme.iam.gserviceaccount.com", contextChars: 1_000_000 });
  mocks = started.mocks;
  // Beside the deployment per provider, a Cohere reasoning model (the one kind of Cohere model that takes `thinking`).
  const cohereReasoning = {
    model_name: "cohere-reasoning",
    svc_params: { model: `cohere/${COHERE_REASONING_MODEL}`, api_base: mocks.cohere.url, api_key: UPSTREAM.cohereKey },
    model_info: { id: "dep-cohere-reasoning", ...PRICES },
  };
  gw = await startTestGateway({ model_list: [...providerDeployments(started, PRICES), cohereReasoning], general_settings: { master_key: MASTER_KEY } });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
  deps = buildDeps();
}, 30_000);

afterAll(async () => {
  await gw?.stop();
  await started?.stop();
});

// ---------------------------------------------------------------------------------------------
// The cases

const J = (v: unknown) => JSON.stringify(v, (_k, x) => (x instanceof RegExp ? `/${x.source}/` : x));

/** The model calls the mock received (Vertex's token requests aside). */
const upstreamRequests = (d: Dep) => d.mock.requests.filter((r) => r.path !== "/token");

/**
 * One call: the model's prediction (a refusal, or the upstream request and the answer to a random
 * upstream answer), the call through the SDK, and what differed. Returns the answer the client got.
 */
async function exchange(d: Dep, req: Json, rng: Random, problem: (text: string) => void): Promise<Json | undefined> {
  const { sent, refusal } = prepare(d, req);
  const upstream = refusal ? undefined : d.family.request(sent, d);
  let expected: Json | undefined;
  let plans: Plan[] = [];
  let wantError: Json | undefined = refusal && { status: 400, type: "invalid_request_error", message: refusal.message, ...(refusal.param === undefined ? {} : { param: refusal.param }) };
  if (upstream) {
    plans = randomPlans(rng, d.family, sent, upstream);
    const counts = randomCounts(rng, d.family);
    const rendered = d.family.render(plans, counts, sent, d, rng);
    d.answerNext(rendered.body);
    expected = expectedAnswer(d.family, plans, counts, rendered);
    if (rendered.error) wantError = { status: 400, type: rendered.error.type, message: expect.stringContaining(rendered.error.message) };
  }
  const check = (what: string, actual: unknown, want: unknown) => {
    try {
      expect(actual).toEqual(want);
    } catch (e) {
      problem(`${what}\nrequest:  ${J(req)}\nexpected: ${J(want)}\nactual:   ${J(actual)}\n${(e as Error).message}`);
    }
  };
  try {
    const { data, response } = await client.chat.completions.create(req as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming).withResponse();
    const recorded = upstreamRequests(d);
    check("one upstream request", recorded.length, upstream ? 1 : 0);
    if (upstream && recorded.length === 1) {
      const r = recorded[0]!;
      const headers = Object.fromEntries(Object.keys(d.auth).map((k) => [k, r.headers[k]]));
      const wantHeaders = Object.fromEntries(Object.entries(d.auth).map(([k, v]) => [k, v instanceof RegExp ? expect.stringMatching(v) : v]));
      const norm = d.family.normalize ?? ((b: Json) => b);
      check("the upstream request", { method: r.method, path: r.path, headers, body: norm(obj(r.body)) }, { method: "POST", path: d.path, headers: wantHeaders, body: norm(upstream) });
    }
    if (wantError) return void check("the error", "a 200", wantError);
    const answer = data as unknown as Json;
    check("the answer", answerView(answer), expected);
    check("the cost header", /^\d+(\.\d+)?$/.test(response.headers.get("x-svc-response-cost") ?? ""), true);
    // The thought signatures the client must hand back with these calls (it only sees their ids).
    for (const [i, t] of list(obj(list(answer.choices)[0]?.message).tool_calls).entries()) {
      const call = plans[0]?.calls[i];
      if (call?.signature) signatures.set(String(t.id), call.signature);
      const id = call?.id || MADE_UP_CALL_ID.exec(String(t.id))?.[0];
      if (id) geminiIds.set(String(t.id), id);
    }
    return answer;
  } catch (e) {
    if (!(e instanceof APIError)) throw e;
    const err = obj(e.error);
    const got = { status: e.status, type: err.type, message: err.message, ...(wantError && "param" in wantError ? { param: err.param } : {}) };
    check("the error", got, wantError ?? "a 200");
    check("upstream requests", upstreamRequests(d).length, upstream ? 1 : 0);
    return undefined;
  } finally {
    d.mock.reset();
  }
}

/**
 * Runs case `i` (its own random stream, so it replays alone): a random request, and when the
 * answer called tools, now and then the next turn as a client sends it: the assistant message it
 * got, as it got it, and a result for each call.
 */
async function runCase(i: number): Promise<{ dep: string; problems: string[] }> {
  const rng = new Random((SEED ^ Math.imul(i + 1, 0x9e3779b1)) >>> 0);
  const d = rng.pick(deps);
  const req = randomRequest(rng, d.name, d.family.linkRefusal ? 0.1 : 0.5);
  d.family.valid?.(req);
  if (d.family.accepts && rng.chance(0.35) && Object.keys(req).some((k) => !["model", "messages", "stream"].includes(k) && !d.family.accepts!.includes(k))) req.drop_params = true;
  const problems: string[] = [];
  const problem = (turn: string) => (text: string) => problems.push(`case ${i} → ${d.name} ${seedNote} (TRANSLATION_DIFF_CASE=${i}): ${turn}${text}`);
  const answer = await exchange(d, req, rng, problem(""));
  const message = obj(list(answer?.choices)[0]?.message);
  if (problems.length === 0 && list(message.tool_calls).length > 0 && rng.chance(0.6)) {
    const results = list(message.tool_calls).map((t) => ({ role: "tool", tool_call_id: t.id, content: rng.chance(0.5) ? JSON.stringify(jsonObject(rng)) : words(rng, 6) }));
    await exchange(d, { ...req, messages: [...(req.messages as Json[]), message, ...results] }, rng, problem("the next turn: "));
  }
  return { dep: d.name, problems };
}

describe(`non-stream chat translation through every provider, random requests and answers ${seedNote}`, () => {
  test(`${ONLY === undefined ? CASES : 1} random cases`, async () => {
    const started = Date.now();
    const problems: string[] = [];
    const perDep = new Map<string, { cases: number; failed: number }>();
    for (let i = ONLY ?? 0; i < (ONLY === undefined ? CASES : ONLY + 1); i++) {
      const r = await runCase(i);
      const tally = perDep.get(r.dep) ?? { cases: 0, failed: 0 };
      tally.cases++;
      if (r.problems.length > 0) tally.failed++;
      perDep.set(r.dep, tally);
      problems.push(...r.problems);
    }
    const summary = [...perDep].map(([dep, t]) => `${dep}: ${t.cases} cases, ${t.failed} failed`).join("; ");
    if (problems.length > 0) {
      const headlines = problems.map((p) => p.slice(0, p.indexOf("\n")));
      console.log(`${problems.length} mismatches ${seedNote}; ${summary}\n${headlines.join("\n")}\n\n${problems.slice(0, 5).join("\n\n")}`);
    }
    expect(problems.length, `mismatches ${seedNote}: ${summary}; the first: ${problems[0]?.slice(0, 4000)}`).toBe(0);
    expect(Date.now() - started).toBeLessThan(60_000);
  }, 120_000);
});
