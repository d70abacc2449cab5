/**
 * The price table: the bundled LiteLLM-format price file (see data/SOURCES.md), an optional
 * operator file in the same format that replaces entries by name, and per-deployment overrides
 * from `model_info` / `svc_params`.
 */
import { readFileSync } from "node:fs";
import bundledFile from "./data/model_prices_and_context_window.json" with { type: "file" };
import { type Rate, rate } from "./money.ts";

/** One price-file entry: only the fields the gateway prices with are read. */
export type RawPrice = Record<string, unknown>;

/** Per-token rates above a prompt size (Gemini's `_above_128k_tokens`, Claude's `_above_200k_tokens`). */
export interface PriceTier {
  /** Applies when the prompt has more than this many tokens. */
  above: number;
  input?: Rate;
  output?: Rate;
  cacheRead?: Rate;
  cacheCreation?: Rate;
  /** 1-hour cache writes (see cacheCreation1hAbove). */
  cacheCreation1h?: Rate;
}

/** A model's prices in yocto-dollars per unit; absent means "not charged". */
export interface ModelPrice {
  /** Which entry the prices came from ("gpt-4o", "config", …), for logs and `/model/info`. */
  source: string;
  mode?: string;
  inputPerToken?: Rate;
  outputPerToken?: Rate;
  cacheReadPerToken?: Rate;
  cacheCreationPerToken?: Rate;
  /** Cache writes kept for an hour (Anthropic's 1-hour TTL). */
  cacheCreation1hPerToken?: Rate;
  reasoningPerToken?: Rate;
  inputPerAudioToken?: Rate;
  /** Audio prompt tokens read from the prompt cache (OpenAI's realtime models). */
  cacheReadPerAudioToken?: Rate;
  outputPerAudioToken?: Rate;
  /** Image tokens (gpt-image models count images in and out as tokens). */
  inputPerImageToken?: Rate;
  outputPerImageToken?: Rate;
  /** Tokens of the sources a model cites (Perplexity's Deep Research). */
  citationPerToken?: Rate;
  /** A fee per call, whatever it used (Perplexity's online models). */
  perRequest?: Rate;
  /** Highest tier first. */
  tiers: PriceTier[];
  inputPerSecond?: Rate;
  outputPerSecond?: Rate;
  inputPerCharacter?: Rate;
  outputPerCharacter?: Rate;
  inputPerImage?: Rate;
  outputPerImage?: Rate;
  inputPerPixel?: Rate;
  outputPerPixel?: Rate;
  /** A web search the model runs, per search context size (`search_context_cost_per_query`). */
  perWebSearch?: { low?: Rate; medium?: Rate; high?: Rate };
  maxInputTokens?: number;
  maxOutputTokens?: number;
}

const TIER_SIZES = [1_000_000, 272_000, 256_000, 200_000, 128_000] as const;

function rateField(raw: RawPrice, name: string): Rate | undefined {
  const v = raw[name];
  return typeof v === "number" && Number.isFinite(v) && v >= 0 ? rate(v) : undefined;
}

/** The price of a search per context size: `search_context_cost_per_query` is an object of sizes. */
function searchRate(raw: RawPrice): ModelPrice["perWebSearch"] {
  const sizes = raw.search_context_cost_per_query;
  if (sizes === null || typeof sizes !== "object" || Array.isArray(sizes)) return undefined;
  const s = sizes as RawPrice;
  return { low: rateField(s, "search_context_size_low"), medium: rateField(s, "search_context_size_medium"), high: rateField(s, "search_context_size_high") };
}

function intField(raw: RawPrice, name: string): number | undefined {
  const v = raw[name];
  return typeof v === "number" && Number.isInteger(v) && v > 0 ? v : undefined;
}

/**
 * A 1-hour cache write's price above a prompt size: the entry's
 * `cache_creation_input_token_cost_above_1hr_above_<N>k_tokens` (LiteLLM's name for it), else,
 * for a tier that raises the input price, the 1-hour price raised alike (to the yocto-dollar).
 * The file names no such field; Anthropic multiplies a long prompt's input price and a cache
 * write's multiplier applies on top of it: claude-sonnet-4's 1-hour writes are $6 per million (2×
 * its $3 input) and $12 above 200k tokens (2× its $6). LiteLLM, without the field, keeps the $6.
 */
function cacheCreation1hAbove(raw: RawPrice, suffix: string, tierInput: Rate | undefined): Rate | undefined {
  const own = rateField(raw, `cache_creation_input_token_cost_above_1hr${suffix}`);
  if (own !== undefined) return own;
  const hour = rateField(raw, "cache_creation_input_token_cost_above_1hr");
  const input = rateField(raw, "input_cost_per_token");
  if (hour === undefined || tierInput === undefined || input === undefined || input === 0n) return undefined;
  return (hour * tierInput) / input;
}

/** A price-file entry → typed rates. */
export function toModelPrice(raw: RawPrice, source: string): ModelPrice {
  const tiers: PriceTier[] = [];
  for (const size of TIER_SIZES) {
    const suffix = `_above_${size / 1000}k_tokens`;
    const tier: PriceTier = {
      above: size,
      input: rateField(raw, `input_cost_per_token${suffix}`),
      output: rateField(raw, `output_cost_per_token${suffix}`),
      cacheRead: rateField(raw, `cache_read_input_token_cost${suffix}`),
      cacheCreation: rateField(raw, `cache_creation_input_token_cost${suffix}`),
    };
    tier.cacheCreation1h = cacheCreation1hAbove(raw, suffix, tier.input);
    if (tier.input !== undefined || tier.output !== undefined) tiers.push(tier);
  }
  return {
    source,
    mode: typeof raw.mode === "string" ? raw.mode : undefined,
    inputPerToken: rateField(raw, "input_cost_per_token"),
    outputPerToken: rateField(raw, "output_cost_per_token"),
    // DeepSeek's entries name their cache-hit price `input_cost_per_token_cache_hit` (some only that way).
    cacheReadPerToken: rateField(raw, "cache_read_input_token_cost") ?? rateField(raw, "input_cost_per_token_cache_hit"),
    cacheCreationPerToken: rateField(raw, "cache_creation_input_token_cost"),
    cacheCreation1hPerToken: rateField(raw, "cache_creation_input_token_cost_above_1hr"),
    reasoningPerToken: rateField(raw, "output_cost_per_reasoning_token"),
    inputPerAudioToken: rateField(raw, "input_cost_per_audio_token"),
    // Cached audio input. The file gives it as cache_read_input_audio_token_cost on a few entries
    // and, on most OpenAI and Azure realtime ones, as cache_creation_input_audio_token_cost: OpenAI
    // charges nothing to write its cache, and those values are its published cached audio input
    // prices (gpt-4o-realtime-preview-2024-10-01: $20 per million, beside $2.50 for cached text).
    cacheReadPerAudioToken: rateField(raw, "cache_read_input_audio_token_cost") ?? rateField(raw, "cache_creation_input_audio_token_cost"),
    outputPerAudioToken: rateField(raw, "output_cost_per_audio_token"),
    inputPerImageToken: rateField(raw, "input_cost_per_image_token"),
    outputPerImageToken: rateField(raw, "output_cost_per_image_token"),
    perRequest: rateField(raw, "input_cost_per_request"),
    citationPerToken: rateField(raw, "citation_cost_per_token"),
    tiers,
    inputPerSecond: rateField(raw, "input_cost_per_second"),
    outputPerSecond: rateField(raw, "output_cost_per_second"),
    inputPerCharacter: rateField(raw, "input_cost_per_character"),
    outputPerCharacter: rateField(raw, "output_cost_per_character"),
    inputPerImage: rateField(raw, "input_cost_per_image"),
    outputPerImage: rateField(raw, "output_cost_per_image"),
    inputPerPixel: rateField(raw, "input_cost_per_pixel"),
    outputPerPixel: rateField(raw, "output_cost_per_pixel"),
    perWebSearch: searchRate(raw),
    maxInputTokens: intField(raw, "max_input_tokens"),
    maxOutputTokens: intField(raw, "max_output_tokens") ?? intField(raw, "max_tokens"),
  };
}

/** True when an entry (or override) names at least one price. */
export function hasPrice(raw: RawPrice): boolean {
  return Object.entries(raw).some(([k, v]) => k.includes("cost") && typeof v === "number");
}

function readPriceFile(path: string): Record<string, RawPrice> {
  const parsed: unknown = JSON.parse(readFileSync(path, "utf8"));
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error(`${path}: expected a JSON object of model entries`);
  const out: Record<string, RawPrice> = {};
  for (const [name, entry] of Object.entries(parsed)) {
    if (name !== "sample_spec" && entry !== null && typeof entry === "object" && !Array.isArray(entry)) out[name] = entry as RawPrice;
  }
  return out;
}

// With `type: "file"` Bun gives the file's path (inside a compiled binary, its embedded copy);
// TypeScript types every JSON import as its contents, so the path is re-typed here.
const bundledPath = bundledFile as unknown as string;
let bundled: Record<string, RawPrice> | undefined;

/** The bundled entries, parsed once per process. */
export function bundledPrices(): Record<string, RawPrice> {
  bundled ??= readPriceFile(bundledPath);
  return bundled;
}

export class PriceTable {
  private readonly entries: Record<string, RawPrice>;

  /** `overridePath`: an operator file in the same format; its entries replace bundled ones by name. */
  constructor(overridePath?: string) {
    this.entries = overridePath ? { ...bundledPrices(), ...readPriceFile(overridePath) } : bundledPrices();
  }

  /** The entry for `provider/model`: the full name first, then the model alone (OpenAI and Anthropic are keyed bare). */
  find(provider: string, model: string): { name: string; raw: RawPrice } | undefined {
    for (const name of [`${provider}/${model}`, model]) {
      const raw = this.entries[name];
      if (raw) return { name, raw };
    }
    return undefined;
  }

  get(name: string): RawPrice | undefined {
    return this.entries[name];
  }
}
