// Every call priced, and money counted exactly: a differential test of the gateway's pricing
// against an independent reference, seeded random (PRICING_DIFF_SEED=<n> runs another set; every
// failure names the seed), end to end through the real gateway on the embedded store.
//
// Random calls go to deployments of real models from the price file (core/cost/data), across the
// provider families the mocks speak (OpenAI, Azure, Anthropic, Gemini, Vertex Gemini and Claude,
// Bedrock Converse, Cohere v2), non-stream and stream, plus embeddings (Cohere's in parts of 96
// texts, their usage summed; Vertex's per billed character, in parts of 250), transcriptions (per
// second, or per audio and text token), speech (per character: code points) and image generation (per pixel, several images a call; per text
// and image token). Perplexity's online models add a fee per request. Each mock answers with random usage in its provider's
// own wire format, including the parts priced apart: cached prompt tokens (read, and written for
// 5 minutes or 1 hour), reasoning tokens, audio tokens in and out, and prompts above the
// 200k-token tier. The reference below prices each call from the price file's entry with exact
// decimal arithmetic (bigint over a power of ten, not the gateway's pricing code), by the rules
// README states (Cost, spend and budgets) and LiteLLM's where README is silent (noted where used),
// and the test checks, call by call and in total:
// - `x-svc-response-cost` (non-stream answers) and the call's `/spend/logs` row equal it exactly,
//   and the row's tokens are those charged (totals, cache reads and writes);
// - the `usage` the client got reports what was charged (prompt and completion totals, cached,
//   reasoning and audio parts);
// - the key's and the team's spend equal the sum of every call's expected cost, to the pico-dollar.
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI, { toFile } from "openai";
import { MASTER_KEY, requestJson, requestOk, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { type StartedProviderMocks, UPSTREAM, startProviderMocks } from "../harness/provider-mocks.ts";
import { Random } from "../harness/random.ts";
import bundled from "../../core/cost/data/model_prices_and_context_window.json" with { type: "json" };
import { eventFrame } from "../mock-upstream/bedrock.ts";
import { renderedBytes } from "../mock-upstream/wire-shape.ts";

const SEED = Number(process.env.PRICING_DIFF_SEED ?? 20_261_127);
const CALLS = Number(process.env.PRICING_DIFF_CALLS ?? 160);
const seedNote = `(PRICING_DIFF_SEED=${SEED})`;

type Json = Record<string, unknown>;
const PRICE_FILE = bundled as unknown as Record<string, Json>;
const enc = new TextEncoder();

// ---------------------------------------------------------------------------------------------
// Exact decimals: value = n × 10^-s

interface Dec {
  n: bigint;
  s: number;
}

/** A price-file number (or a decimal text) as an exact decimal: the shortest text that reads back as the double, which is what the file wrote. */
function dec(v: number | string): Dec {
  const text = typeof v === "number" ? String(v) : v;
  const m = /^(\d+)(?:\.(\d+))?(?:e([+-]?\d+))?$/i.exec(text);
  if (!m) throw new Error(`not a decimal: ${text}`);
  const frac = m[2] ?? "";
  let n = BigInt(`${m[1]}${frac}`);
  let s = frac.length - Number(m[3] ?? 0);
  if (s < 0) {
    n *= 10n ** BigInt(-s);
    s = 0;
  }
  return { n, s };
}
const ZERO: Dec = { n: 0n, s: 0 };
const scaleTo = (a: Dec, s: number): bigint => a.n * 10n ** BigInt(s - a.s);
function add(a: Dec, b: Dec): Dec {
  const s = Math.max(a.s, b.s);
  return { n: scaleTo(a, s) + scaleTo(b, s), s };
}
const mul = (a: Dec, b: Dec): Dec => ({ n: a.n * b.n, s: a.s + b.s });
const times = (count: number, r: Dec): Dec => ({ n: BigInt(count) * r.n, s: r.s });
/** a ÷ b, which must be an exact decimal (the reference prices only with exact rates). */
function ratio(a: Dec, b: Dec): Dec {
  // a.n × 10^-a.s ÷ (b.n × 10^-b.s), with 24 more digits than a has.
  const n = a.n * 10n ** 24n;
  if (n % b.n !== 0n) throw new Error(`inexact ratio ${a.n}e-${a.s} / ${b.n}e-${b.s}`);
  return { n: n / b.n, s: a.s + 24 - b.s };
}
/** USD → pico-dollars, rounded half up once (README: amounts are integer pico-dollars; a cost is rounded once, after the sum). */
function toPico(a: Dec): bigint {
  if (a.s <= 12) return a.n * 10n ** BigInt(12 - a.s);
  const div = 10n ** BigInt(a.s - 12);
  return a.n / div + ((a.n % div) * 2n >= div ? 1n : 0n);
}
const picoText = (p: bigint): string => {
  const int = p / 10n ** 12n;
  const frac = (p % 10n ** 12n).toString().padStart(12, "0").replace(/0+$/, "");
  return frac ? `${int}.${frac}` : `${int}`;
};

// ---------------------------------------------------------------------------------------------
// The reference: a call's cost from its price-file entry

/** What the call used, as the reference reads the provider's native usage (details are parts of the totals). */
interface Used {
  prompt: number;
  completion: number;
  cacheRead?: number;
  /** Cache writes at the 5-minute rate (Anthropic's default, Bedrock's only one). */
  cacheWrite?: number;
  /** Cache writes for 1 hour (Anthropic's `ephemeral_1h_input_tokens`). */
  cacheWrite1h?: number;
  audioIn?: number;
  /**
   * Cached audio (OpenAI's realtime models), apart from cacheRead and audioIn here; the provider
   * counts it in both its cached_tokens and its audio_tokens.
   */
  cacheReadAudio?: number;
  reasoning?: number;
  audioOut?: number;
  /** Web searches run by the provider (Anthropic's web search tool; an OpenAI search model's answer citing the web). */
  webSearches?: number;
  /** The search context size asked (`web_search_options.search_context_size`). */
  searchSize?: "low" | "medium" | "high";
  /** Tokens of cited sources (Perplexity's Deep Research), part of the prompt here. */
  citation?: number;
}

function rateOf(entry: Json, field: string): Dec | undefined {
  const v = entry[field];
  return typeof v === "number" ? dec(v) : undefined;
}

/** The entry a deployment is priced from: `provider/model`, then `model` (README: Lookup). */
function entryOf(name: string): Json {
  const e = PRICE_FILE[name];
  if (!e) throw new Error(`no price entry ${name}`);
  return e;
}

/**
 * Token cost. Tiers: the highest `_above_<N>k_tokens` threshold the prompt total is strictly above
 * (LiteLLM compares `prompt_tokens > threshold`); its rates replace input, output, cache read and
 * cache write where the tier names them. A part without a price of its own is priced as the
 * tokens it is part of (cached as input, reasoning as output, audio as text), as README's "each
 * token priced once" and LiteLLM do. A 1-hour cache write is priced at
 * `cache_creation_input_token_cost_above_1hr` (LiteLLM's calculate_cache_writing_cost; README is
 * silent), else as a 5-minute one.
 */
function tokenCost(entry: Json, u: Used): Dec {
  let tier: number | undefined;
  for (const key of Object.keys(entry)) {
    const m = /^input_cost_per_token_above_(\d+)k_tokens$/.exec(key);
    if (m && u.prompt > Number(m[1]) * 1000 && (tier === undefined || Number(m[1]) * 1000 > tier)) tier = Number(m[1]) * 1000;
  }
  const field = (base: string) => (tier !== undefined ? rateOf(entry, `${base}_above_${tier / 1000}k_tokens`) : undefined) ?? rateOf(entry, base);
  const input = field("input_cost_per_token") ?? ZERO;
  const output = field("output_cost_per_token") ?? ZERO;
  // A cache read without cache_read_input_token_cost: DeepSeek's entries name it
  // input_cost_per_token_cache_hit; else it is priced as input (README: each token priced once).
  const cacheRead = field("cache_read_input_token_cost") ?? rateOf(entry, "input_cost_per_token_cache_hit") ?? input;
  const cacheWrite = field("cache_creation_input_token_cost") ?? input;
  // A 1-hour write above a tier: the tier's own field, else the 1-hour price raised as the tier
  // raises the input price (README: Anthropic's long-context multiplier applies to cache writes too).
  const hour = rateOf(entry, "cache_creation_input_token_cost_above_1hr");
  const baseInput = rateOf(entry, "input_cost_per_token");
  const tierInput = tier !== undefined ? rateOf(entry, `input_cost_per_token_above_${tier / 1000}k_tokens`) : undefined;
  const cacheWrite1h =
    (tier !== undefined ? rateOf(entry, `cache_creation_input_token_cost_above_1hr_above_${tier / 1000}k_tokens`) : undefined) ??
    (hour && tierInput && baseInput ? ratio(mul(hour, tierInput), baseInput) : hour) ??
    cacheWrite;
  const audioIn = rateOf(entry, "input_cost_per_audio_token") ?? input;
  // Cached audio: cache_read_input_audio_token_cost, else (OpenAI's realtime entries, OpenAI not
  // charging cache writes) cache_creation_input_audio_token_cost, else as a cached token (README).
  const cacheReadAudio = rateOf(entry, "cache_read_input_audio_token_cost") ?? rateOf(entry, "cache_creation_input_audio_token_cost") ?? cacheRead;
  const audioOut = rateOf(entry, "output_cost_per_audio_token") ?? output;
  const reasoning = rateOf(entry, "output_cost_per_reasoning_token") ?? output;
  const r = u.cacheRead ?? 0;
  const w = u.cacheWrite ?? 0;
  const w1 = u.cacheWrite1h ?? 0;
  const ai = u.audioIn ?? 0;
  const ra = u.cacheReadAudio ?? 0;
  const re = u.reasoning ?? 0;
  const ao = u.audioOut ?? 0;
  const ci = u.citation ?? 0;
  const textIn = u.prompt - r - w - w1 - ai - ra - ci;
  const textOut = u.completion - re - ao;
  if (textIn < 0 || textOut < 0) throw new Error(`inconsistent usage ${JSON.stringify(u)}`);
  // A web search at `search_context_cost_per_query`'s price for the size asked, else medium
  // (LiteLLM's get_cost_for_anthropic_web_search and StandardBuiltInToolCostTracking; README is
  // silent), wherever the entry names that price.
  const sizes = entry.search_context_cost_per_query as Json | undefined;
  const sizePrice = sizes?.[`search_context_size_${u.searchSize ?? "medium"}`];
  const search = typeof sizePrice === "number" ? dec(sizePrice) : ZERO;
  // A fee per call (input_cost_per_request, Perplexity's online models), for a call that used anything.
  const perRequest = u.prompt + u.completion > 0 ? (rateOf(entry, "input_cost_per_request") ?? ZERO) : ZERO;
  // Cited sources' tokens at citation_cost_per_token (LiteLLM's perplexity cost_per_token).
  const citation = rateOf(entry, "citation_cost_per_token") ?? input;
  return [perRequest, times(ci, citation), times(u.webSearches ?? 0, search), times(textIn, input), times(r, cacheRead), times(w, cacheWrite), times(w1, cacheWrite1h), times(ai, audioIn), times(ra, cacheReadAudio), times(textOut, output), times(re, reasoning), times(ao, audioOut)].reduce(add, ZERO);
}

// ---------------------------------------------------------------------------------------------
// Deployments: real models from the price file, and the parts of usage each one's upstream reports

type Family = "openai" | "deepseek" | "perplexity" | "azure" | "anthropic" | "gemini" | "vertex-claude" | "bedrock" | "cohere";

interface Target {
  /** Model group (and deployment id `dep-<name>`). */
  name: string;
  family: Family;
  /** The price-file entry the reference prices with. */
  entry: string;
  svc: (m: StartedProviderMocks) => Json;
  info?: Json;
  /** What this model's usage may carry. */
  parts: {
    cacheRead?: boolean;
    cacheWrite?: boolean;
    cacheWrite1h?: boolean;
    audio?: boolean;
    /** Cached audio: part of the cached tokens and of the audio tokens both (OpenAI's realtime models). */
    cachedAudio?: boolean;
    reasoning?: boolean;
    tier?: number;
    webSearch?: boolean;
    citesWeb?: boolean;
    /** Perplexity: a request fee at the reported search context size (Sonar), or a fee per search query (Deep Research). */
    perplexity?: "request" | "queries";
  };
}

const openai = (model: string) => (m: StartedProviderMocks) => ({ model: `openai/${model}`, api_base: m.mocks.openai.url, api_key: UPSTREAM.openaiKey });
const vertex = (model: string) => (m: StartedProviderMocks) => ({
  model: `vertex_ai/${model}`,
  api_base: m.mocks.gemini.url,
  vertex_credentials: m.vertexCredentials,
  vertex_location: UPSTREAM.vertexLocation,
});

const TARGETS: Target[] = [
  { name: "gpt-4o", family: "openai", entry: "gpt-4o", svc: openai("gpt-4o"), parts: { cacheRead: true } },
  { name: "gpt-4o-audio", family: "openai", entry: "gpt-4o-audio-preview-2024-12-17", svc: openai("gpt-4o-audio-preview-2024-12-17"), parts: { audio: true } },
  // Realtime models cache audio too: cached audio at $20 per million beside $2.50 for cached text and $100 for audio.
  {
    name: "gpt-4o-realtime",
    family: "openai",
    entry: "gpt-4o-realtime-preview-2024-10-01",
    svc: openai("gpt-4o-realtime-preview-2024-10-01"),
    parts: { cacheRead: true, audio: true, cachedAudio: true },
  },
  // A search model: an answer citing the web (url_citation annotations) is one search, at the size asked.
  { name: "gpt-4o-search", family: "openai", entry: "gpt-4o-search-preview", svc: openai("gpt-4o-search-preview"), parts: { citesWeb: true } },
  // Perplexity's Sonar: a request fee by the search context size its usage reports; Deep Research: a fee per search query.
  { name: "sonar-pro", family: "perplexity", entry: "perplexity/sonar-pro", svc: (m) => ({ model: "perplexity/sonar-pro", api_base: m.mocks.openai.url, api_key: UPSTREAM.openaiKey }), parts: { perplexity: "request" } },
  {
    name: "sonar-deep-research",
    family: "perplexity",
    entry: "perplexity/sonar-deep-research",
    svc: (m) => ({ model: "perplexity/sonar-deep-research", api_base: m.mocks.openai.url, api_key: UPSTREAM.openaiKey }),
    parts: { perplexity: "queries" },
  },
  // Perplexity's online models: a fee per request besides the tokens (input tokens free).
  { name: "pplx-7b-online", family: "openai", entry: "perplexity/pplx-7b-online", svc: (m) => ({ model: "perplexity/pplx-7b-online", api_base: m.mocks.openai.url, api_key: UPSTREAM.openaiKey }), parts: {} },
  { name: "o3-mini", family: "openai", entry: "o3-mini", svc: openai("o3-mini"), parts: { cacheRead: true, reasoning: true } },
  // DeepSeek: its own usage fields for cache hits; deepseek-reasoner prices them only as input_cost_per_token_cache_hit.
  { name: "deepseek-chat", family: "deepseek", entry: "deepseek/deepseek-chat", svc: (m) => ({ model: "deepseek/deepseek-chat", api_base: m.mocks.openai.url, api_key: UPSTREAM.openaiKey }), parts: { cacheRead: true } },
  {
    name: "deepseek-reasoner",
    family: "deepseek",
    entry: "deepseek/deepseek-reasoner",
    svc: (m) => ({ model: "deepseek/deepseek-reasoner", api_base: m.mocks.openai.url, api_key: UPSTREAM.openaiKey }),
    parts: { cacheRead: true, reasoning: true },
  },
  {
    name: "azure-gpt-4o",
    family: "azure",
    entry: "azure/gpt-4o-2024-08-06",
    svc: (m) => ({ model: `azure/${UPSTREAM.azureDeployment}`, api_base: m.mocks.azure.url, api_key: UPSTREAM.azureKey, api_version: "2024-10-21" }),
    info: { base_model: "azure/gpt-4o-2024-08-06" },
    parts: { cacheRead: true },
  },
  {
    name: "claude-sonnet-4",
    family: "anthropic",
    entry: "claude-sonnet-4-20250514",
    svc: (m) => ({ model: "anthropic/claude-sonnet-4-20250514", api_base: m.mocks.anthropic.url, api_key: UPSTREAM.anthropicKey }),
    parts: { cacheRead: true, cacheWrite: true, cacheWrite1h: true, tier: 200_000, webSearch: true },
  },
  {
    name: "gemini-2.5-pro",
    family: "gemini",
    entry: "gemini/gemini-2.5-pro",
    svc: (m) => ({ model: "gemini/gemini-2.5-pro", api_base: m.mocks.gemini.url, api_key: UPSTREAM.geminiKey }),
    parts: { cacheRead: true, reasoning: true, tier: 200_000 },
  },
  {
    name: "gemini-2.5-flash",
    family: "gemini",
    entry: "gemini/gemini-2.5-flash",
    svc: (m) => ({ model: "gemini/gemini-2.5-flash", api_base: m.mocks.gemini.url, api_key: UPSTREAM.geminiKey }),
    parts: { cacheRead: true, reasoning: true, audio: true },
  },
  { name: "vertex-gemini-2.5-pro", family: "gemini", entry: "gemini-2.5-pro", svc: vertex("gemini-2.5-pro"), parts: { cacheRead: true, reasoning: true, tier: 200_000 } },
  {
    name: "vertex-claude-sonnet-4",
    family: "vertex-claude",
    entry: "vertex_ai/claude-sonnet-4@20250514",
    svc: vertex("claude-sonnet-4@20250514"),
    parts: { cacheRead: true, cacheWrite: true, tier: 200_000, webSearch: true },
  },
  {
    name: "bedrock-claude-3-5-haiku",
    family: "bedrock",
    entry: "anthropic.claude-3-5-haiku-20241022-v1:0",
    svc: (m) => ({
      model: "bedrock/anthropic.claude-3-5-haiku-20241022-v1:0",
      api_base: m.mocks.bedrock.url,
      aws_region_name: UPSTREAM.awsRegion,
      aws_access_key_id: UPSTREAM.awsAccessKeyId,
      aws_secret_access_key: UPSTREAM.awsSecretAccessKey,
    }),
    parts: { cacheRead: true, cacheWrite: true },
  },
  {
    name: "command-a",
    family: "cohere",
    entry: "command-a-03-2025",
    svc: (m) => ({ model: "cohere/command-a-03-2025", api_base: m.mocks.cohere.url, api_key: UPSTREAM.cohereKey }),
    parts: {},
  },
];

// Non-chat endpoints.
const EMBEDDING = { name: "text-embedding-3-small", entry: "text-embedding-3-small" };
/** Cohere takes 96 texts a call: a longer list is sent in parts, whose usage is summed. */
const COHERE_EMBEDDING = { name: "embed-english-v3", entry: "embed-english-v3.0" };
const WHISPER = { name: "whisper-1", entry: "whisper-1" };
/** A transcription model priced by tokens, its audio ones apart. */
const TRANSCRIBE = { name: "gpt-4o-mini-transcribe", entry: "gpt-4o-mini-transcribe" };
const DALLE = { name: "dall-e-3" };
/**
 * A chat deployment the operator prices per second of the call (README lists
 * `input_cost_per_second` among the overrides), for a model the price file does not know. LiteLLM
 * charges such a model `response_time_ms / 1000 × input_cost_per_second` (custom pricing, cost per
 * second); the call's time is read from its log row (end_time − start_time).
 */
const PER_SECOND = { name: "per-second", rate: "0.000321987654321" };
const DALLE2 = { name: "dall-e-2" };
/** Vertex's text embeddings: billed per character (`metadata.billableCharacterCount`), in parts of 250 texts. */
const VERTEX_EMBEDDING = { name: "vertex-text-embedding-005", entry: "text-embedding-005" };
/** An image model priced per token: text and image tokens in, image tokens out. */
const IMAGE_MINI = { name: "gpt-image-1-mini", entry: "gpt-image-1-mini" };
/** Speech priced per character of its input: LiteLLM counts Python's len, code points. */
const TTS = { name: "tts-1", entry: "tts-1" };
/** Text to speak: ASCII, accents, CJK, emoji beyond the BMP (skin tones, ZWJ families), a flag. */
const SPOKEN = ["Priced", " to the", " pico-dollar.", " Déjà vu", " 日本語", " \u{1F44B}\u{1F3FD}", " \u{1F468}\u200D\u{1F469}\u200D\u{1F467}", " \u{1F1EB}\u{1F1F7}", " \u{1D54F}", " ok"];

// ---------------------------------------------------------------------------------------------
// Random usage, in each provider's wire format

/** A token count: mostly small, sometimes large, sometimes above the 200k tier. */
function tokens(rng: Random, max: number): number {
  const r = rng.next();
  if (r < 0.15) return 0;
  if (r < 0.7) return rng.int(Math.min(max, 2_000) + 1);
  return rng.int(max + 1);
}

/** A split of `total` into `n` random parts (some of them zero). */
function split(rng: Random, total: number, n: number): number[] {
  const cuts = Array.from({ length: n - 1 }, () => (rng.chance(0.3) ? 0 : rng.int(total + 1))).sort((a, b) => a - b);
  const out: number[] = [];
  let prev = 0;
  for (const c of [...cuts, total]) {
    out.push(c - prev);
    prev = c;
  }
  return out;
}

interface Plan {
  used: Used;
  /** The upstream's usage object as its provider writes it. */
  native: Json;
}

function planUsage(rng: Random, t: Target): Plan {
  const p = t.parts;
  // Prompts around a tier's threshold now and then, exactly on it too (not above it: the tier's rates start above).
  let prompt = tokens(rng, 300_000);
  if (p.tier && rng.chance(0.25)) prompt = p.tier + rng.pick([-1, 0, 1, 2, rng.int(50_000)]);
  const completion = tokens(rng, 40_000);
  const [plain = 0, cacheRead = 0, cacheWrite = 0, cacheWrite1h = 0, audioIn = 0] = split(rng, prompt, 5);
  const keep = (on: boolean | undefined, n: number) => (on && rng.chance(0.7) ? n : 0);
  // Of the cached tokens, some audio.
  const [cachedText = 0, cachedAudio = 0] = p.cachedAudio ? split(rng, cacheRead, 2) : [cacheRead, 0];
  const u: Used = {
    prompt: 0,
    completion,
    cacheRead: keep(p.cacheRead, cachedText),
    cacheReadAudio: keep(p.cachedAudio, cachedAudio),
    cacheWrite: keep(p.cacheWrite, cacheWrite),
    cacheWrite1h: keep(p.cacheWrite1h, cacheWrite1h),
    audioIn: keep(p.audio, audioIn),
  };
  u.prompt = plain + u.cacheRead! + u.cacheReadAudio! + u.cacheWrite! + u.cacheWrite1h! + u.audioIn!;
  const [textOut = 0, reasoning = 0, audioOut = 0] = split(rng, completion, 3);
  u.reasoning = keep(p.reasoning, reasoning);
  u.audioOut = t.family === "openai" ? keep(p.audio, audioOut) : 0;
  u.completion = textOut + u.reasoning + u.audioOut;
  if (p.webSearch && rng.chance(0.3)) u.webSearches = 1 + rng.int(5);
  if (p.perplexity) {
    u.searchSize = rng.pick(["low", "medium", "high"] as const);
    u.webSearches = p.perplexity === "request" ? 1 : 1 + rng.int(30);
  }
  if (p.perplexity === "queries") {
    // Deep Research reports its cited sources' and its reasoning's tokens beside prompt and completion.
    u.citation = rng.int(80_000);
    u.prompt += u.citation;
    const reasoning = rng.int(200_000);
    u.reasoning = (u.reasoning ?? 0) + reasoning;
    u.completion += reasoning;
  }
  if (p.citesWeb) {
    if (rng.chance(0.7)) u.webSearches = 1;
    u.searchSize = rng.maybe(0.7, ["low", "medium", "high"] as const);
  }
  return { used: u, native: nativeUsage(t.family, u, rng) };
}

function nativeUsage(family: Family, u: Used, rng: Random): Json {
  const writes = (u.cacheWrite ?? 0) + (u.cacheWrite1h ?? 0);
  switch (family) {
    case "openai":
    case "azure":
      return {
        prompt_tokens: u.prompt,
        completion_tokens: u.completion,
        total_tokens: u.prompt + u.completion,
        // Cached audio is counted in cached_tokens and audio_tokens both; cached_tokens_details splits the cached ones.
        prompt_tokens_details: {
          cached_tokens: (u.cacheRead ?? 0) + (u.cacheReadAudio ?? 0),
          audio_tokens: (u.audioIn ?? 0) + (u.cacheReadAudio ?? 0),
          ...(u.cacheReadAudio ? { cached_tokens_details: { text_tokens: u.cacheRead ?? 0, audio_tokens: u.cacheReadAudio } } : {}),
        },
        completion_tokens_details: { reasoning_tokens: u.reasoning ?? 0, audio_tokens: u.audioOut ?? 0, accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 },
      };
    case "perplexity":
      // Perplexity: the search context size searched at (Sonar's request fee), and Deep Research's search queries.
      return {
        prompt_tokens: u.prompt - (u.citation ?? 0),
        completion_tokens: u.completion - (u.reasoning ?? 0),
        total_tokens: u.prompt - (u.citation ?? 0) + u.completion - (u.reasoning ?? 0),
        search_context_size: u.searchSize,
        ...(u.citation !== undefined ? { citation_tokens: u.citation, num_search_queries: u.webSearches, reasoning_tokens: u.reasoning } : {}),
      };
    case "deepseek":
      // DeepSeek: cache hits and misses beside prompt_tokens (their sum), no prompt_tokens_details.
      return {
        prompt_tokens: u.prompt,
        completion_tokens: u.completion,
        total_tokens: u.prompt + u.completion,
        prompt_cache_hit_tokens: u.cacheRead ?? 0,
        prompt_cache_miss_tokens: u.prompt - (u.cacheRead ?? 0),
        ...(u.reasoning ? { completion_tokens_details: { reasoning_tokens: u.reasoning } } : {}),
      };
    case "anthropic":
    case "vertex-claude": {
      // Anthropic counts cache reads and writes apart from input_tokens; `cache_creation` splits writes by lifetime.
      const usage: Json = {
        input_tokens: u.prompt - (u.cacheRead ?? 0) - writes,
        cache_creation_input_tokens: writes,
        cache_read_input_tokens: u.cacheRead ?? 0,
        output_tokens: u.completion,
      };
      if (family === "anthropic" || rng.chance(0.5)) usage.cache_creation = { ephemeral_5m_input_tokens: u.cacheWrite ?? 0, ephemeral_1h_input_tokens: u.cacheWrite1h ?? 0 };
      if (u.webSearches) usage.server_tool_use = { web_search_requests: u.webSearches };
      return usage;
    }
    case "gemini": {
      // promptTokenCount includes the cached part; thoughts are counted apart from the candidates.
      const audio = u.audioIn ?? 0;
      const details = [{ modality: "TEXT", tokenCount: u.prompt - audio }];
      if (audio) details.push({ modality: "AUDIO", tokenCount: audio });
      const usage: Json = {
        promptTokenCount: u.prompt,
        candidatesTokenCount: u.completion - (u.reasoning ?? 0),
        totalTokenCount: u.prompt + u.completion,
        promptTokensDetails: details,
      };
      if (u.reasoning) usage.thoughtsTokenCount = u.reasoning;
      if (u.cacheRead) {
        usage.cachedContentTokenCount = u.cacheRead;
        usage.cacheTokensDetails = [{ modality: "TEXT", tokenCount: u.cacheRead }];
      }
      return usage;
    }
    case "bedrock": {
      const usage: Json = { inputTokens: u.prompt - (u.cacheRead ?? 0) - writes, outputTokens: u.completion, totalTokens: u.prompt + u.completion };
      if (u.cacheRead) usage.cacheReadInputTokens = u.cacheRead;
      if (writes) usage.cacheWriteInputTokens = writes;
      return usage;
    }
    case "cohere":
      // billed_units is what Cohere charges; tokens also counts its prompt template.
      return { billed_units: { input_tokens: u.prompt, output_tokens: u.completion }, tokens: { input_tokens: u.prompt + 213, output_tokens: u.completion } };
  }
}

// ---------------------------------------------------------------------------------------------
// Upstream answers: JSON, or stream bytes, in each provider's wire format

const TEXT = ["Priced", " to", " the", " pico", "-dollar."];
const sse = (data: unknown, event?: string) => `${event ? `event: ${event}\n` : ""}data: ${JSON.stringify(data)}\n\n`;

const CITATION = { type: "url_citation", url_citation: { start_index: 0, end_index: 6, title: "Prices", url: "https://example.com/prices" } };

function openAIAnswer(model: string, usage: Json, stream: boolean, cites = false): { json?: unknown; bytes?: Uint8Array } {
  const id = `chatcmpl-${crypto.randomUUID()}`;
  const created = 1_764_000_000;
  if (!stream) {
    return {
      json: {
        id,
        object: "chat.completion",
        created,
        model,
        choices: [{ index: 0, message: { role: "assistant", content: TEXT.join(""), refusal: null, annotations: cites ? [CITATION] : [] }, logprobs: null, finish_reason: "stop" }],
        usage,
        system_fingerprint: "fp_1",
      },
    };
  }
  const chunk = (choices: unknown[], u: unknown = null) => sse({ id, object: "chat.completion.chunk", created, model, system_fingerprint: "fp_1", choices, usage: u });
  const parts = [chunk([{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }])];
  for (const t of TEXT) parts.push(chunk([{ index: 0, delta: { content: t }, logprobs: null, finish_reason: null }]));
  if (cites) parts.push(chunk([{ index: 0, delta: { annotations: [CITATION] }, logprobs: null, finish_reason: null }]));
  parts.push(chunk([{ index: 0, delta: {}, logprobs: null, finish_reason: "stop" }]));
  parts.push(chunk([], usage));
  parts.push("data: [DONE]\n\n");
  return { bytes: enc.encode(parts.join("")) };
}

function anthropicAnswer(model: string, usage: Json, stream: boolean): { json?: unknown; bytes?: string[] } {
  const id = `msg_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
  const message = { id, type: "message", role: "assistant", model, content: [{ type: "text", text: TEXT.join("") }], stop_reason: "end_turn", stop_sequence: null, usage };
  if (!stream) return { json: message };
  // message_start carries the input side (output 1 so far); message_delta the final output count.
  const startUsage: Json = { ...usage, output_tokens: 1 };
  delete startUsage.server_tool_use;
  const events = [sse({ type: "message_start", message: { ...message, content: [], stop_reason: null, usage: startUsage } }, "message_start")];
  events.push(sse({ type: "content_block_start", index: 0, content_block: { type: "text", text: "" } }, "content_block_start"));
  for (const t of TEXT) events.push(sse({ type: "content_block_delta", index: 0, delta: { type: "text_delta", text: t } }, "content_block_delta"));
  events.push(sse({ type: "content_block_stop", index: 0 }, "content_block_stop"));
  // Searches run while the answer streams: message_start reports none yet, message_delta the final count.
  const finalUsage: Json = { output_tokens: usage.output_tokens };
  if (usage.server_tool_use) finalUsage.server_tool_use = usage.server_tool_use;
  events.push(sse({ type: "message_delta", delta: { stop_reason: "end_turn", stop_sequence: null }, usage: finalUsage }, "message_delta"));
  events.push(sse({ type: "message_stop" }, "message_stop"));
  return { bytes: events };
}

function geminiAnswer(model: string, usage: Json, stream: boolean): { json?: unknown; bytes?: string[] } {
  const responseId = crypto.randomUUID().slice(0, 20);
  const candidate = (text: string, finish?: string) => ({ content: { role: "model", parts: [{ text }] }, ...(finish ? { finishReason: finish } : {}), index: 0 });
  if (!stream) return { json: { candidates: [candidate(TEXT.join(""), "STOP")], usageMetadata: usage, modelVersion: model, responseId } };
  // Every event carries the usage so far; the last one the final figures.
  const partial = { promptTokenCount: usage.promptTokenCount, totalTokenCount: usage.promptTokenCount };
  return {
    bytes: TEXT.map((t, i) => `data: ${JSON.stringify({ candidates: [candidate(t, i === TEXT.length - 1 ? "STOP" : undefined)], usageMetadata: i === TEXT.length - 1 ? usage : partial, modelVersion: model, responseId })}\r\n\r\n`),
  };
}

function bedrockAnswer(usage: Json, stream: boolean): { json?: unknown; bytes?: Uint8Array } {
  if (!stream) return { json: { output: { message: { role: "assistant", content: [{ text: TEXT.join("") }] } }, stopReason: "end_turn", usage, metrics: { latencyMs: 12 } } };
  const frames = [eventFrame("messageStart", { role: "assistant" })];
  for (const t of TEXT) frames.push(eventFrame("contentBlockDelta", { contentBlockIndex: 0, delta: { text: t } }));
  frames.push(eventFrame("contentBlockStop", { contentBlockIndex: 0 }), eventFrame("messageStop", { stopReason: "end_turn" }), eventFrame("metadata", { usage, metrics: { latencyMs: 12 } }));
  return { bytes: renderedBytes(frames) };
}

function cohereAnswer(usage: Json, stream: boolean): { json?: unknown; bytes?: Uint8Array } {
  const id = crypto.randomUUID();
  if (!stream) return { json: { id, message: { role: "assistant", content: [{ type: "text", text: TEXT.join("") }] }, finish_reason: "COMPLETE", usage } };
  const events: Json[] = [{ id, type: "message-start", delta: { message: { role: "assistant", content: [], tool_plan: "", tool_calls: [], citations: [] } } }];
  events.push({ type: "content-start", index: 0, delta: { message: { content: { type: "text", text: "" } } } });
  for (const t of TEXT) events.push({ type: "content-delta", index: 0, delta: { message: { content: { text: t } } } });
  events.push({ type: "content-end", index: 0 }, { type: "message-end", delta: { finish_reason: "COMPLETE", usage } });
  return { bytes: enc.encode(events.map((e) => sse(e, String(e.type))).join("")) };
}

// ---------------------------------------------------------------------------------------------
// The gateway

let started: StartedProviderMocks;
let gw: TestGateway;
let client: OpenAI;
let keyToken: string;
let teamId: string;

beforeAll(async () => {
  started = await startProviderMocks({ serviceAccount: "pricing-diff@acme.iam.gserviceaccount.com" });
  const m = started.mocks;
  const model_list: Json[] = TARGETS.map((t) => ({ model_name: t.name, svc_params: t.svc(started), model_info: { id: `dep-${t.name}`, ...t.info } }));
  model_list.push(
    { model_name: EMBEDDING.name, svc_params: { model: `openai/${EMBEDDING.entry}`, api_base: m.openai.url, api_key: UPSTREAM.openaiKey }, model_info: { id: "dep-embedding" } },
    { model_name: WHISPER.name, svc_params: { model: "openai/whisper-1", api_base: m.openai.url, api_key: UPSTREAM.openaiKey }, model_info: { id: "dep-whisper" } },
    {
      model_name: PER_SECOND.name,
      svc_params: { model: "openai/acme-hosted-per-second", api_base: m.openai.url, api_key: UPSTREAM.openaiKey },
      model_info: { id: "dep-per-second", input_cost_per_second: Number(PER_SECOND.rate) },
    },
    { model_name: DALLE.name, svc_params: { model: "openai/dall-e-3", api_base: m.openai.url, api_key: UPSTREAM.openaiKey }, model_info: { id: "dep-dalle" } },
    { model_name: DALLE2.name, svc_params: { model: "openai/dall-e-2", api_base: m.openai.url, api_key: UPSTREAM.openaiKey }, model_info: { id: "dep-dalle2" } },
    { model_name: VERTEX_EMBEDDING.name, svc_params: vertex(VERTEX_EMBEDDING.entry)(started), model_info: { id: "dep-vertex-embedding" } },
    { model_name: IMAGE_MINI.name, svc_params: { model: `openai/${IMAGE_MINI.entry}`, api_base: m.openai.url, api_key: UPSTREAM.openaiKey }, model_info: { id: "dep-image-mini" } },
    { model_name: TTS.name, svc_params: { model: `openai/${TTS.entry}`, api_base: m.openai.url, api_key: UPSTREAM.openaiKey }, model_info: { id: "dep-tts" } },
    { model_name: TRANSCRIBE.name, svc_params: { model: `openai/${TRANSCRIBE.entry}`, api_base: m.openai.url, api_key: UPSTREAM.openaiKey }, model_info: { id: "dep-transcribe" } },
    { model_name: COHERE_EMBEDDING.name, svc_params: { model: `cohere/${COHERE_EMBEDDING.entry}`, api_base: m.cohere.url, api_key: UPSTREAM.cohereKey }, model_info: { id: "dep-cohere-embed" } },
  );
  gw = await startTestGateway({ model_list, general_settings: { master_key: MASTER_KEY } }, { store: {} });
  const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: "pricing" });
  teamId = team.team_id;
  const key = await requestOk<{ key: string; token: string }>(gw, "POST", "/key/generate", { key_alias: "pricing-diff", team_id: teamId });
  keyToken = key.token;
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: key.key, maxRetries: 0 });
}, 60_000);

afterAll(async () => {
  await gw?.stop();
  await started?.stop();
});

// ---------------------------------------------------------------------------------------------
// One call of each kind: sets the upstream's answer, calls, returns what was checked against

interface Done {
  /** What kind of call, for the seed's summary. */
  kind: string;
  what: string;
  /** Tokens the log row must show (chat calls). */
  used?: Used;
  /** Priced per second of the call: the expected cost comes from the log row's times. */
  perSecond?: Dec;
  expected: bigint;
  callId: string;
  /** The non-stream answer's x-svc-response-cost, exact text. */
  header?: string;
  /** The log row's status, when not "success". */
  status?: "failure";
}

/** The `usage` a client gets for `u` (OpenAI's shape: totals, cached and reasoning parts). */
function expectClientUsage(got: Json | undefined, u: Used, what: string): void {
  expect(got, what).toBeDefined();
  expect(got!.prompt_tokens, `${what}: prompt_tokens`).toBe(u.prompt);
  expect(got!.completion_tokens, `${what}: completion_tokens`).toBe(u.completion);
  expect(got!.total_tokens, `${what}: total_tokens`).toBe(u.prompt + u.completion);
  const pd = (got!.prompt_tokens_details ?? {}) as Json;
  const cd = (got!.completion_tokens_details ?? {}) as Json;
  // An OpenAI-compatible answer reaches the client as the provider wrote it: DeepSeek's cache hits in its own field.
  expect(pd.cached_tokens ?? got!.prompt_cache_hit_tokens ?? 0, `${what}: cached_tokens`).toBe((u.cacheRead ?? 0) + (u.cacheReadAudio ?? 0));
  expect(cd.reasoning_tokens ?? 0, `${what}: reasoning_tokens`).toBe(u.reasoning ?? 0);
  if (u.audioIn || u.cacheReadAudio) expect(pd.audio_tokens, `${what}: prompt audio_tokens`).toBe((u.audioIn ?? 0) + (u.cacheReadAudio ?? 0));
  if (u.audioOut) expect(cd.audio_tokens, `${what}: completion audio_tokens`).toBe(u.audioOut);
}

async function chatCall(rng: Random, i: number): Promise<Done> {
  const t = rng.pick(TARGETS);
  const stream = rng.chance(0.5);
  const plan = planUsage(rng, t);
  const what = `#${i} ${t.name} ${stream ? "stream" : "json"} ${JSON.stringify(plan.used)} ${seedNote}`;
  const m = started.mocks;
  const entry = entryOf(t.entry);
  switch (t.family) {
    case "openai":
    case "deepseek":
    case "perplexity":
    case "azure": {
      const a = openAIAnswer(t.entry, plan.native, stream, t.parts.citesWeb === true && plan.used.webSearches === 1);
      const mock = t.family === "azure" ? m.azure : m.openai;
      mock.fault(stream ? { kind: "wire", shape: () => ({ bytes: a.bytes!, cuts: [] }) } : { kind: "answer", body: a.json });
      break;
    }
    case "anthropic": {
      const a = anthropicAnswer(t.entry, plan.native, stream);
      m.anthropic.fault(stream ? { kind: "wire", shape: () => ({ bytes: enc.encode(a.bytes!.join("")), cuts: [] }) } : { kind: "answer", body: a.json });
      break;
    }
    case "gemini": {
      const a = geminiAnswer(t.entry, plan.native, stream);
      m.gemini.fault(stream ? { kind: "cannedStream", chunks: a.bytes!, path: "/models/" } : { kind: "canned", body: a.json, path: "/models/" });
      break;
    }
    case "vertex-claude": {
      const a = anthropicAnswer("claude-sonnet-4-20250514", plan.native, stream);
      m.gemini.fault(stream ? { kind: "cannedStream", chunks: a.bytes!, path: "/models/" } : { kind: "canned", body: a.json, path: "/models/" });
      break;
    }
    case "bedrock": {
      const a = bedrockAnswer(plan.native, stream);
      m.bedrock.fault(stream ? { kind: "wire", shape: () => ({ bytes: a.bytes!, cuts: [] }) } : { kind: "answer", body: a.json });
      break;
    }
    case "cohere": {
      const a = cohereAnswer(plan.native, stream);
      m.cohere.fault(stream ? { kind: "wire", shape: () => ({ bytes: a.bytes!, cuts: [] }) } : { kind: "answer", body: a.json });
      break;
    }
  }
  const expected = toPico(tokenCost(entry, plan.used));
  const size = plan.used.searchSize;
  const body = { model: t.name, messages: [{ role: "user" as const, content: `price call ${i}` }], max_tokens: 50_000, ...(size ? { web_search_options: { search_context_size: size } } : {}) };
  if (!stream) {
    const { data, response } = await client.chat.completions.create(body).withResponse();
    if (t.family === "perplexity") expect(data.usage, `${what}: usage as Perplexity wrote it`).toMatchObject(plan.native);
    else expectClientUsage(data.usage as unknown as Json, plan.used, what);
    return { kind: `${t.name} json`, what, used: plan.used, expected, callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
  }
  const { data, response } = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }).withResponse();
  let usage: Json | undefined;
  for await (const chunk of data) if (chunk.usage) usage = chunk.usage as unknown as Json;
  if (t.family === "perplexity") expect(usage, `${what}: usage as Perplexity wrote it`).toMatchObject(plan.native);
  else expectClientUsage(usage, plan.used, what);
  return { kind: `${t.name} stream`, what, used: plan.used, expected, callId: response.headers.get("x-svc-call-id")! };
}

async function perSecondCall(rng: Random, i: number): Promise<Done> {
  const stream = rng.chance(0.5);
  const t: Target = { name: PER_SECOND.name, family: "openai", entry: "", svc: openai(""), parts: { cacheRead: true } };
  const plan = planUsage(rng, t);
  const a = openAIAnswer("acme-hosted-per-second", plan.native, stream);
  // A stream comes in pieces a few milliseconds apart, so calls last from a millisecond to ~100 ms.
  const gapMs = rng.int(12);
  started.mocks.openai.fault(stream ? { kind: "wire", shape: (b) => ({ bytes: a.bytes!, cuts: Array.from({ length: 8 }, (_, k) => Math.floor(((k + 1) * b.length) / 9)), gapMs }) } : { kind: "answer", body: a.json });
  const what = `#${i} per-second ${stream ? "stream" : "json"} ${seedNote}`;
  const body = { model: PER_SECOND.name, messages: [{ role: "user" as const, content: `price call ${i}` }] };
  const common = { kind: `per-second ${stream ? "stream" : "json"}`, what, used: plan.used, expected: 0n, perSecond: dec(PER_SECOND.rate) };
  if (!stream) {
    const { data, response } = await client.chat.completions.create(body).withResponse();
    expectClientUsage(data.usage as unknown as Json, plan.used, what);
    return { ...common, callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
  }
  const { data, response } = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }).withResponse();
  for await (const _ of data) {
  }
  return { ...common, callId: response.headers.get("x-svc-call-id")! };
}

async function embeddingCall(rng: Random, i: number): Promise<Done> {
  const promptTokens = tokens(rng, 8_000);
  const inputs = 1 + rng.int(3);
  const data = Array.from({ length: inputs }, (_, index) => ({ object: "embedding", index, embedding: [0.25, -0.5, 0.125] }));
  started.mocks.openai.fault({ kind: "answer", body: { object: "list", data, model: EMBEDDING.entry, usage: { prompt_tokens: promptTokens, total_tokens: promptTokens } } });
  const what = `#${i} embeddings ${promptTokens} tokens ${seedNote}`;
  const { data: answer, response } = await client.embeddings.create({ model: EMBEDDING.name, input: Array.from({ length: inputs }, (_, k) => `text ${i} ${k}`) }).withResponse();
  expect(answer.usage.prompt_tokens, what).toBe(promptTokens);
  const expected = toPico(tokenCost(entryOf(EMBEDDING.entry), { prompt: promptTokens, completion: 0 }));
  return { kind: "embeddings", what, expected, callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
}

async function cohereEmbeddingCall(rng: Random, i: number): Promise<Done> {
  const inputs = 1 + rng.int(rng.chance(0.5) ? 250 : 20);
  const texts = Array.from({ length: inputs }, (_, k) => `text ${i} ${k}`);
  const parts = Math.ceil(inputs / 96);
  // Now and then a part after the first fails (a rate limit, a refused text, an outage): the call
  // fails, and is charged what the parts before it billed (Cohere charged them).
  const failing = parts > 1 && rng.chance(0.4) ? 1 + rng.int(parts - 1) : undefined;
  // One answer per part of at most 96 texts, each billing its own input tokens.
  let billed = 0;
  for (let at = 0, n = 0; at < inputs; at += 96, n++) {
    if (n === failing) {
      started.mocks.cohere.fault({ kind: "status", status: rng.pick([400, 429, 500]) });
      break;
    }
    const part = texts.slice(at, at + 96);
    const tokens = rng.int(5_000);
    billed += tokens;
    started.mocks.cohere.fault({
      kind: "answer",
      body: { id: crypto.randomUUID(), texts: part, embeddings: { float: part.map(() => [0.5, -0.25]) }, meta: { api_version: { version: "2" }, billed_units: { input_tokens: tokens } }, response_type: "embeddings_by_type" },
    });
  }
  const what = `#${i} cohere embeddings ${inputs} texts, ${billed} tokens${failing === undefined ? "" : `, part ${failing + 1} of ${parts} failing`} ${seedNote}`;
  const expected = toPico(tokenCost(entryOf(COHERE_EMBEDDING.entry), { prompt: billed, completion: 0 }));
  if (failing !== undefined) {
    const err = await client.embeddings.create({ model: COHERE_EMBEDDING.name, input: texts }).catch((e: unknown) => e);
    // The client hears the upstream's error, as for any failed call.
    expect(err, what).toBeInstanceOf(OpenAI.APIError);
    const callId = (err as InstanceType<typeof OpenAI.APIError>).headers?.get("x-svc-call-id");
    expect(callId, what).toBeString();
    return { kind: "cohere embeddings failing part-way", what, expected, callId: callId!, status: "failure" };
  }
  const { data: answer, response } = await client.embeddings.create({ model: COHERE_EMBEDDING.name, input: texts }).withResponse();
  expect(answer.data.length, what).toBe(inputs);
  expect(answer.usage.prompt_tokens, what).toBe(billed);
  return { kind: "cohere embeddings", what, expected, callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
}

/**
 * Vertex text embeddings: Google bills the characters it reports (`billableCharacterCount`: code
 * points, whitespace left out), not the tokens (`statistics.token_count`); a list of more than 250
 * texts goes in parts, whose characters are summed.
 */
async function vertexEmbeddingCall(rng: Random, i: number): Promise<Done> {
  const inputs = 1 + rng.int(rng.chance(0.3) ? 400 : 12);
  const texts = Array.from({ length: inputs }, (_, k) => `${rng.pick(SPOKEN)} ${k}\t${rng.pick(SPOKEN)}`);
  let billed = 0;
  let tokens = 0;
  for (let at = 0; at < inputs; at += 250) {
    const part = texts.slice(at, at + 250);
    const characters = part.reduce((n, t) => n + Array.from(t.replace(/\s/g, "")).length, 0);
    const predictions = part.map(() => {
      const count = 1 + rng.int(40);
      tokens += count;
      return { embeddings: { statistics: { truncated: false, token_count: count }, values: [0.5, -0.25] } };
    });
    billed += characters;
    started.mocks.gemini.fault({ kind: "canned", body: { predictions, metadata: { billableCharacterCount: characters } }, path: "/models/" });
  }
  const what = `#${i} vertex embeddings ${inputs} texts, ${billed} characters, ${tokens} tokens ${seedNote}`;
  const { data: answer, response } = await client.embeddings.create({ model: VERTEX_EMBEDDING.name, input: texts }).withResponse();
  expect(answer.data.length, what).toBe(inputs);
  expect(answer.usage.prompt_tokens, what).toBe(tokens);
  const expected = toPico(times(billed, rateOf(entryOf(VERTEX_EMBEDDING.entry), "input_cost_per_character")!));
  return { kind: "vertex embeddings", what, expected, callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
}

/** gpt-4o-mini-transcribe reports tokens: audio and text input apart, text output. */
async function tokenTranscriptionCall(rng: Random, i: number): Promise<Done> {
  const audio = rng.int(20_000);
  const text = rng.int(300);
  const output = rng.int(3_000);
  const usage = { type: "tokens", input_tokens: audio + text, input_token_details: { audio_tokens: audio, text_tokens: text }, output_tokens: output, total_tokens: audio + text + output };
  started.mocks.openai.fault({ kind: "answer", body: { text: "priced per token", usage } });
  const what = `#${i} token transcription ${JSON.stringify(usage)} ${seedNote}`;
  const { response } = await client.audio.transcriptions.create({ model: TRANSCRIBE.name, file: await toFile(new Uint8Array(64), "a.wav", { type: "audio/wav" }), response_format: "json" }).withResponse();
  const expected = toPico(tokenCost(entryOf(TRANSCRIBE.entry), { prompt: audio + text, audioIn: audio, completion: output }));
  return { kind: "transcription (tokens)", what, expected, callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
}

async function transcriptionCall(rng: Random, i: number): Promise<Done> {
  // A duration as whisper reports it: seconds with a fraction (a float32's decimals now and then).
  const seconds = rng.pick([`${1 + rng.int(600)}.${rng.int(10_000)}`, String(Math.fround(1 + rng.next() * 300)), `${1 + rng.int(90)}`]);
  const durationJson = `{"task":"transcribe","language":"english","duration":${seconds},"text":"priced per second","segments":[]}`;
  started.mocks.openai.fault({ kind: "answer", body: JSON.parse(durationJson) });
  const what = `#${i} transcription ${seconds} s ${seedNote}`;
  const { response } = await client.audio.transcriptions.create({ model: WHISPER.name, file: await toFile(new Uint8Array(64), "a.wav", { type: "audio/wav" }), response_format: "json" }).withResponse();
  // LiteLLM prices whisper by its duration × input_cost_per_second (input and output seconds are the same audio, charged once, README).
  const expected = toPico(mul(dec(String(Number(seconds))), rateOf(entryOf(WHISPER.entry), "input_cost_per_second")!));
  return { kind: "transcription (seconds)", what, expected, callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
}

/** tts-1: priced per character of the input, counted as code points (Array.from splits a string into them). */
async function speechCall(rng: Random, i: number): Promise<Done> {
  const input = Array.from({ length: 1 + rng.int(12) }, () => rng.pick(SPOKEN)).join("");
  const characters = Array.from(input).length;
  const what = `#${i} speech ${JSON.stringify(input)} (${characters} characters, ${input.length} UTF-16 units) ${seedNote}`;
  const { response } = await client.audio.speech.create({ model: TTS.name, input, voice: "alloy" }).withResponse();
  await response.arrayBuffer();
  const expected = toPico(times(characters, rateOf(entryOf(TTS.entry), "input_cost_per_character")!));
  return { kind: "speech", what, expected, callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
}

/**
 * gpt-image-1-mini: priced per token, as OpenAI's answer counts them (`usage`: input tokens with
 * their text and image parts, output tokens, all image tokens), whatever the size and quality.
 */
async function imageTokensCall(rng: Random, i: number): Promise<Done> {
  const n = 1 + rng.int(3);
  const size = rng.pick(["1024x1024", "1024x1536", "1536x1024"] as const);
  const quality = rng.pick(["low", "medium", "high"] as const);
  const text = 1 + rng.int(400);
  const image = rng.chance(0.3) ? rng.int(3_000) : 0;
  const output = n * rng.pick([272, 408, 1056, 1584, 4160, 6240]);
  const usage = { total_tokens: text + image + output, input_tokens: text + image, output_tokens: output, input_tokens_details: { text_tokens: text, image_tokens: image } };
  const data = Array.from({ length: n }, () => ({ b64_json: "iVBORw0KGgo=" }));
  started.mocks.openai.fault({ kind: "answer", body: { created: 1_764_000_000, background: "opaque", data, output_format: "png", quality, size, usage } });
  const what = `#${i} ${n} gpt-image-1-mini images ${JSON.stringify(usage)} ${seedNote}`;
  const { response } = await client.images.generate({ model: IMAGE_MINI.name, prompt: `pictures ${i}`, size, quality, n }).withResponse();
  const entry = entryOf(IMAGE_MINI.entry);
  const expected = [times(text, rateOf(entry, "input_cost_per_token")!), times(image, rateOf(entry, "input_cost_per_image_token")!), times(output, rateOf(entry, "output_cost_per_image_token")!)].reduce(add, ZERO);
  return { kind: "gpt-image-1-mini", what, expected: toPico(expected), callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
}

/** dall-e-2: several images a call, priced per pixel of the size asked, per image returned. */
async function manyImagesCall(rng: Random, i: number): Promise<Done> {
  const size = rng.pick(["256x256", "512x512", "1024x1024"] as const);
  const n = 1 + rng.int(4);
  started.mocks.openai.fault({ kind: "answer", body: { created: 1_764_000_000, data: Array.from({ length: n }, (_, k) => ({ url: `https://mock.invalid/${k}.png` })) } });
  const what = `#${i} ${n} dall-e-2 images ${size} ${seedNote}`;
  const { response } = await client.images.generate({ model: DALLE2.name, prompt: `pictures ${i}`, size, n }).withResponse();
  const entry = entryOf(`${size.replace("x", "-x-")}/dall-e-2`);
  const [w, h] = size.split("x").map(Number) as [number, number];
  const perPixel = add(rateOf(entry, "input_cost_per_pixel") ?? ZERO, rateOf(entry, "output_cost_per_pixel") ?? ZERO);
  return { kind: "dall-e-2", what, expected: toPico(times(n * w * h, perPixel)), callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
}

async function imageCall(rng: Random, i: number): Promise<Done> {
  const size = rng.pick(["1024x1024", "1024x1792", "1792x1024"] as const);
  const quality = rng.pick(["standard", "hd", undefined] as const);
  // dall-e-3 makes one image per call.
  started.mocks.openai.fault({ kind: "answer", body: { created: 1_764_000_000, data: [{ url: "https://mock.invalid/a.png", revised_prompt: "a" }] } });
  const what = `#${i} image ${size} ${quality ?? "(default)"} ${seedNote}`;
  const { response } = await client.images.generate({ model: DALLE.name, prompt: `picture ${i}`, size, ...(quality ? { quality } : {}) }).withResponse();
  const entry = entryOf(`${quality ?? "standard"}/${size.replace("x", "-x-")}/dall-e-3`);
  const [w, h] = size.split("x").map(Number) as [number, number];
  const perPixel = add(rateOf(entry, "input_cost_per_pixel") ?? ZERO, rateOf(entry, "output_cost_per_pixel") ?? ZERO);
  return { kind: "dall-e-3", what, expected: toPico(times(w * h, perPixel)), callId: response.headers.get("x-svc-call-id")!, header: response.headers.get("x-svc-response-cost") ?? undefined };
}

// ---------------------------------------------------------------------------------------------
// The run

/** The exact decimal of `"field": <number>` in a JSON text (management answers write money exactly). */
function moneyField(text: string, field: string): bigint {
  const m = new RegExp(`"${field}":\\s*(-?[0-9.eE+-]+)`).exec(text);
  if (!m) throw new Error(`no ${field} in ${text.slice(0, 300)}`);
  return toPico(dec(m[1]!));
}

test(`every call's cost equals the reference's, in its header, its log row and the key's and team's spend ${seedNote}`, async () => {
  console.log(`pricing differential: seed ${SEED}, ${CALLS} calls`);
  const rng = new Random(SEED);
  const done: Done[] = [];
  for (let i = 0; i < CALLS; i++) {
    const r = rng.next();
    const call = r < 0.7 ? chatCall : r < 0.77 ? perSecondCall : r < 0.79 ? embeddingCall : r < 0.815 ? vertexEmbeddingCall : r < 0.84 ? cohereEmbeddingCall : r < 0.88 ? transcriptionCall : r < 0.92 ? tokenTranscriptionCall : r < 0.94 ? imageCall : r < 0.96 ? manyImagesCall : r < 0.98 ? imageTokensCall : speechCall;
    const d = await call(rng, i);
    if (d.header !== undefined && !d.perSecond) expect(d.header, `${d.what}: x-svc-response-cost`).toBe(picoText(d.expected));
    done.push(d);
  }
  await gw.host!.spendWriter.flush();
  // Every row of /spend/logs/v2, and each row's spend as written (its exact decimal text, paired by order).
  const byCall = new Map<string, Json>();
  const spendByCall = new Map<string, bigint>();
  for (let page = 1; ; page++) {
    const logs = await requestJson<{ data: Json[]; total_pages: number }>(gw, "GET", `/spend/logs/v2?page=${page}&page_size=100&start_date=2000-01-01&end_date=2100-01-01`);
    expect(logs.status, logs.text).toBe(200);
    const spends = [...logs.text.matchAll(/"spend":\s*([0-9.eE+-]+)/g)].map((m) => toPico(dec(m[1]!)));
    expect(spends.length, logs.text.slice(0, 300)).toBe(logs.body.data.length);
    logs.body.data.forEach((row, k) => {
      byCall.set(String(row.call_id), row);
      spendByCall.set(String(row.call_id), spends[k]!);
    });
    if (page >= logs.body.total_pages) break;
  }
  // What the seed covered, for the log: calls per kind.
  const kinds = new Map<string, number>();
  for (const d of done) kinds.set(d.kind, (kinds.get(d.kind) ?? 0) + 1);
  console.log([...kinds].sort().map(([k, n]) => `${k}: ${n}`).join(", "));
  let total = 0n;
  for (const d of done) {
    const row = byCall.get(d.callId);
    expect(row, `${d.what}: log row`).toBeDefined();
    expect(row!.status ?? (row!.metadata as Json).status, d.what).toBe(d.status ?? "success");
    if (d.perSecond) {
      const ms = Date.parse(String(row!.end_time)) - Date.parse(String(row!.start_time));
      d.expected = toPico(mul({ n: BigInt(ms), s: 3 }, d.perSecond));
      if (d.header !== undefined) expect(d.header, `${d.what} (${ms} ms): x-svc-response-cost`).toBe(picoText(d.expected));
    }
    expect(picoText(spendByCall.get(d.callId)!), `${d.what}: spend log row`).toBe(picoText(d.expected));
    if (d.used) {
      // The row's tokens are what was charged: totals, and the cache parts (reads; writes of either lifetime).
      expect(row, `${d.what}: log row tokens`).toMatchObject({
        prompt_tokens: d.used.prompt,
        completion_tokens: d.used.completion,
        cache_read_input_tokens: (d.used.cacheRead ?? 0) + (d.used.cacheReadAudio ?? 0),
        cache_creation_input_tokens: (d.used.cacheWrite ?? 0) + (d.used.cacheWrite1h ?? 0),
      });
    }
    total += d.expected;
  }
  const key = await requestJson(gw, "GET", `/key/info?key=${keyToken}`);
  expect(key.status, key.text).toBe(200);
  expect(picoText(moneyField(key.text, "spend")), `key spend ${seedNote}`).toBe(picoText(total));
  const team = await requestJson(gw, "GET", `/team/info?team_id=${teamId}`);
  expect(team.status, team.text).toBe(200);
  expect(picoText(moneyField(team.text, "spend")), `team spend ${seedNote}`).toBe(picoText(total));
}, 60_000);

test("a split call that fails part-way counts what its answered parts billed against the key's budget", async () => {
  const { key, token } = await requestOk<{ key: string; token: string }>(gw, "POST", "/key/generate", { key_alias: "split-budget", max_budget: 0.015 });
  const poor = new OpenAI({ baseURL: gw.baseURL, apiKey: key, maxRetries: 0 });
  const texts = Array.from({ length: 150 }, (_, k) => `text ${k}`);
  // 90,000 tokens billed for the first 96 texts ($0.009 at $0.10 per million), then a rate limit on the rest.
  const failPartWay = () => {
    const part = texts.slice(0, 96);
    started.mocks.cohere.fault({
      kind: "answer",
      body: { id: crypto.randomUUID(), texts: part, embeddings: { float: part.map(() => [0.5]) }, meta: { billed_units: { input_tokens: 90_000 } }, response_type: "embeddings_by_type" },
    });
    started.mocks.cohere.fault({ kind: "status", status: 429 });
    return poor.embeddings.create({ model: COHERE_EMBEDDING.name, input: texts }).then(
      () => undefined,
      (e: InstanceType<typeof OpenAI.APIError>) => e,
    );
  };
  expect((await failPartWay())?.status).toBe(429);
  expect((await failPartWay())?.status).toBe(429);
  // $0.018 spent of $0.015: the next call is refused before it goes out.
  const refused = await poor.embeddings.create({ model: COHERE_EMBEDDING.name, input: ["one more"] }).then(
    () => undefined,
    (e: InstanceType<typeof OpenAI.APIError>) => e,
  );
  expect(refused?.status).toBe(400);
  expect((refused?.error as Json | undefined)?.type).toBe("budget_exceeded");
  await gw.host!.spendWriter.flush();
  const info = await requestJson(gw, "GET", `/key/info?key=${token}`);
  expect(picoText(moneyField(info.text, "spend"))).toBe("0.018");
});
