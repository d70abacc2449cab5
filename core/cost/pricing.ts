/**
 * Which prices a deployment is charged at. Lookup order (later wins field by field):
 * 1. the price table entry of `model_info.base_model`, else of `<provider>/<model>`, else of `<model>`
 *    (else, for a Bedrock inference profile, of its base model: see priceNames);
 * 2. cost fields in `svc_params` (`input_cost_per_token`, …);
 * 3. cost fields in `model_info`.
 * A deployment priced by none of these is charged at the entry of the model its answer names
 * (Usage.answerModel), as LiteLLM's last lookup step: Azure deployments are named by the operator.
 * An operator can so price a model the table lacks, or correct one it has, per deployment; a
 * base price they set replaces the table's prices derived from it (see DERIVED).
 */
import { BoundedMap } from "../bounded-map.ts";
import type { Deployment, Usage } from "../contract.ts";
import { costOf, worstCaseCost } from "./calculate.ts";
import type { Pico } from "./money.ts";
import { type ModelPrice, type PriceTable, type RawPrice, hasPrice, toModelPrice } from "./prices.ts";

const PRICE_FIELD = /cost|^max_(input_|output_)?tokens$|^mode$/;

/**
 * Table prices a provider states relative to a base price (its rates above a prompt size, cache
 * reads and writes as fractions or multiples of the input price). An operator who sets the base
 * price gets none of the table's derived ones, only those they set too: with their own input
 * price, a long prompt and cached tokens are charged at it, not at the table's tier or cache rates
 * (LiteLLM's custom pricing likewise prices with the operator's fields alone). Prices of another
 * kind (audio, reasoning, images, searches) are the provider's own, and stay.
 */
const DERIVED: Record<string, RegExp> = {
  // Per character too: the operator chose to price the input per token (Vertex's entries give both).
  input_cost_per_token: /^(input_cost_per_token_above_\d+k_tokens|cache_read_input_token_cost.*|cache_creation_input_token_cost.*|input_cost_per_token_cache_hit|input_cost_per_character.*)$/,
  output_cost_per_token: /^output_cost_per_token_above_\d+k_tokens$/,
  cache_read_input_token_cost: /^(cache_read_input_token_cost_above_\d+k_tokens|input_cost_per_token_cache_hit)$/,
  cache_creation_input_token_cost: /^cache_creation_input_token_cost_above_\d+k_tokens$/,
};

/** A table entry with an operator's overrides: theirs win field by field, and replace what the table derives from them (DERIVED). */
function overridden(table: RawPrice, overrides: RawPrice): RawPrice {
  const dropped = Object.keys(overrides).flatMap((k) => (DERIVED[k] ? [DERIVED[k]] : []));
  const out: RawPrice = {};
  for (const [k, v] of Object.entries(table)) if (!dropped.some((d) => d.test(k))) out[k] = v;
  return { ...out, ...overrides };
}

function priceFields(source: Record<string, unknown>): RawPrice {
  const out: RawPrice = {};
  for (const [k, v] of Object.entries(source)) if (PRICE_FIELD.test(k)) out[k] = v;
  return out;
}

/** The cost of one call, and whether the model had a price at all. */
export interface CallCost {
  cost: Pico;
  priced: boolean;
  /** Where the prices came from ("gpt-4o", "config"), or why there were none. */
  source: string;
}

/** Bedrock's API routes named in a model (`bedrock/converse/<id>`): not part of the model's name. */
const BEDROCK_ROUTE = /^(converse|invoke)\//;
/** Cross-region inference profiles' geography prefixes (`apac.anthropic.…`, `global.…`). */
const CROSS_REGION_PREFIX = /^(us|eu|apac|jp|au|ca|global|us-gov)\./;

/**
 * The names a model is priced under, exact first. A Bedrock inference profile (an ARN, whose
 * profile id follows its last `/`, or a cross-region id such as `apac.<model>`) costs what its base
 * model costs, and the price file has entries for only some of them: without one, the base model's
 * (LiteLLM's BedrockModelInfo.get_base_model prices them so too).
 */
function priceNames(provider: string, model: string): string[] {
  if (provider !== "bedrock") return [model];
  const id = model.replace(BEDROCK_ROUTE, "");
  const profile = id.startsWith("arn:") ? id.slice(id.lastIndexOf("/") + 1) : id;
  return [...new Set([model, id, profile, profile.replace(CROSS_REGION_PREFIX, "")])];
}

/** A provider-named base model (`azure/dall-e-3`, LiteLLM's convention) has its variants under the provider: `azure/hd/…/dall-e-3`. */
function bareModel(provider: string, model: string): string {
  return model.startsWith(`${provider}/`) ? model.slice(provider.length + 1) : model;
}

/** Normalizes an image size for price-file keys: `1024x1792` → `1024-x-1792`. */
function sizeKey(size: string): string {
  return size.replace(/\s*[x×]\s*/, "-x-");
}

/**
 * Image prices looked up per size and quality, which the client chooses: made-up values would
 * each keep an entry until the next reload.
 */
const VARIANT_CACHE_LIMIT = 1000;

export class Pricing {
  private readonly cache = new BoundedMap<string, ModelPrice | null>(VARIANT_CACHE_LIMIT);
  /** Deployment objects live as long as their snapshot (wildcard matches are cached too): the hot path looks up by identity. */
  private readonly byDeployment = new WeakMap<Deployment, ModelPrice | null>();

  constructor(private readonly table: PriceTable) {}

  /** The deployment's prices, or undefined when neither the table nor the config prices it. */
  priceOf(d: Deployment, variant?: { size?: string; quality?: string }): ModelPrice | undefined {
    if (!variant) {
      let price = this.byDeployment.get(d);
      if (price === undefined) {
        price = this.resolve(d) ?? null;
        this.byDeployment.set(d, price);
      }
      return price ?? undefined;
    }
    const key = `${d.id}\0${d.upstreamModel}\0${variant.quality ?? ""}\0${variant.size ?? ""}`;
    const hit = this.cache.get(key);
    if (hit !== undefined) return hit ?? undefined;
    const price = this.resolve(d, variant);
    this.cache.set(key, price ?? null);
    return price;
  }

  /**
   * Whether the table prices this size and quality of the deployment's image model itself
   * (`hd/1024-x-1792/dall-e-3`), not only through the model's own entry (gpt-image-1's price per
   * pixel, which would price any size, `13x7` too).
   */
  hasVariantPrice(d: Deployment, variant: { size?: string; quality?: string }): boolean {
    return this.variantEntry(d.provider, pricedModel(d), variant) !== undefined;
  }

  /**
   * Of `sizes` and `qualities`, those the table prices the deployment's image model at (what a
   * refusal of an unpriced one suggests): a quality with entries of its own, as a model priced per
   * size alone (dall-e-2) takes any quality at its size's price.
   */
  imageVariants(d: Deployment, sizes: readonly string[], qualities: readonly string[]): { sizes: string[]; qualities: string[] } {
    const model = pricedModel(d);
    const priced = sizes.filter((size) => this.variantEntry(d.provider, model, { size }) !== undefined);
    const bare = bareModel(d.provider, model);
    const own = qualities.filter((quality) => priced.some((size) => this.table.find(d.provider, `${quality}/${sizeKey(size)}/${bare}`) !== undefined));
    return { sizes: priced, qualities: own };
  }

  private resolve(d: Deployment, variant?: { size?: string; quality?: string }): ModelPrice | undefined {
    const overrides = { ...priceFields(d.options), ...priceFields(d.info) };
    const found = this.lookup(d.provider, pricedModel(d), variant);
    const customized = hasPrice(overrides);
    if (!found && !customized) return undefined;
    const raw = overridden(found?.raw ?? {}, overrides);
    return toModelPrice(raw, customized ? `config${found ? ` over ${found.name}` : ""}` : found!.name);
  }

  private lookup(provider: string, model: string, variant?: { size?: string; quality?: string }) {
    for (const name of priceNames(provider, model)) {
      const found = (variant && this.variantEntry(provider, name, variant)) || this.table.find(provider, name);
      if (found) return found;
    }
    return undefined;
  }

  /** Image models are priced per size and quality: `hd/1024-x-1792/dall-e-3`, `1024-x-1024/dall-e-2`. */
  private variantEntry(provider: string, model: string, variant: { size?: string; quality?: string }) {
    // OpenAI's default size; an image model's price entries are per size.
    const size = sizeKey(variant.size ?? "1024x1024");
    const bare = bareModel(provider, model);
    // Without a quality, the model's default: `standard` (dall-e-3), `medium` (gpt-image-1).
    const names = variant.quality ? [`${variant.quality}/${size}/${bare}`, `${size}/${bare}`] : [`standard/${size}/${bare}`, `medium/${size}/${bare}`, `${size}/${bare}`];
    for (const name of names) {
      const found = this.table.find(provider, name);
      if (found) return found;
    }
    return undefined;
  }

  /**
   * An image model that counts its images in tokens (gpt-image-1-mini) is charged for the tokens
   * its answer reports, at its entry's token prices, and not also at a size's price per image
   * (OpenAI's per-image prices are what such tokens typically come to); else the size's entry.
   */
  private pricesFor(d: Deployment, usage: Usage): ModelPrice | undefined {
    if (usage.images && (usage.imageCompletionTokens ?? 0) > 0) {
      const own = this.priceOf(d);
      if (own?.outputPerImageToken !== undefined) return own;
    }
    return this.priceOf(d, usage.images);
  }

  /** The price entry of the model an answer names (see answerModel), for a deployment without prices of its own. */
  private answerPriceOf(provider: string, model: string): ModelPrice | undefined {
    // Deployment ids never start with NUL: no clash with the variants' keys.
    const key = `\0${provider}\0${model}`;
    const hit = this.cache.get(key);
    if (hit !== undefined) return hit ?? undefined;
    const found = this.lookup(provider, model);
    const price = found && toModelPrice(found.raw, found.name);
    this.cache.set(key, price ?? null);
    return price;
  }

  /** `callMs`: how long the call took, for a model priced per second of the call. */
  costOf(d: Deployment, usage: Usage, callMs?: number): CallCost {
    const price = this.pricesFor(d, usage) ?? (usage.answerModel ? this.answerPriceOf(d.provider, usage.answerModel) : undefined);
    if (!price) return { cost: 0n, priced: false, source: `no price for ${d.provider}/${d.upstreamModel}` };
    return { cost: costOf(price, usage, callMs), priced: true, source: price.source };
  }

  /** The most answer tokens the model gives one answer: its entry's limit, else DEFAULT_MAX_OUTPUT_TOKENS. */
  outputLimit(d: Deployment): number {
    return this.priceOf(d)?.maxOutputTokens ?? DEFAULT_MAX_OUTPUT_TOKENS;
  }

  /**
   * The most the call can cost (see worstCaseCost); output defaults to the model's own limit.
   * `maxCallMs`: the longest the call is charged for, should the model be priced per second of it;
   * `maxSearches`: the most web searches it can be charged, should the model price them.
   */
  worstCase(d: Deployment, promptTokens: number, maxOutputTokens: number | undefined, maxCallMs?: number, maxSearches?: number): Pico {
    const price = this.priceOf(d);
    if (!price) return 0n;
    return worstCaseCost(price, promptTokens, maxOutputTokens ?? this.outputLimit(d), maxCallMs, maxSearches);
  }
}

/** The model a deployment is priced as: its `model_info.base_model`, else the model it calls. */
function pricedModel(d: Deployment): string {
  return typeof d.info.base_model === "string" ? d.info.base_model : d.upstreamModel;
}

/** Output bound for a priced model whose entry gives no limit and whose request sets no max_tokens. */
export const DEFAULT_MAX_OUTPUT_TOKENS = 4096;
