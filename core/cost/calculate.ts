/**
 * Cost of a call from its usage and its model's prices: every part summed in yocto-dollars and
 * rounded to pico-dollars once. Token details (cached, reasoning, audio) are parts of the totals,
 * so each token is priced exactly once (cached audio, a part of two of them, once too).
 */
import type { Usage } from "../contract.ts";
import { type Pico, type Rate, rateToPico, scaled } from "./money.ts";
import type { ModelPrice, PriceTier } from "./prices.ts";

/** Decimals a duration is read to: more than a double's shortest text has for any length worth a pico-dollar. */
const SECOND_DIGITS = 30;

function tierFor(price: ModelPrice, promptTokens: number): PriceTier | undefined {
  return price.tiers.find((t) => promptTokens > t.above);
}

function times(count: number | undefined, r: Rate | undefined): bigint {
  if (!count || r === undefined) return 0n;
  return BigInt(Math.round(count)) * r;
}

/** Pixels of a `WIDTHxHEIGHT` size, or undefined. */
export function pixelsOf(size: string | undefined): number | undefined {
  const m = /^(\d+)\s*[x×-]+\s*(\d+)$/.exec(size ?? "");
  return m ? Number(m[1]) * Number(m[2]) : undefined;
}

/** Text models priced per second and not per token; audio and video models are priced for their media's length. */
const pricedByCallTime = (price: ModelPrice): boolean =>
  price.inputPerToken === undefined && price.outputPerToken === undefined && (price.mode === undefined || price.mode === "chat" || price.mode === "completion" || price.mode === "embedding");

/** Yocto-dollars for `callMs` of a model priced per second of the call (0 for any other). */
function callTimeRate(price: ModelPrice, callMs: number): bigint {
  const perSecond = price.inputPerSecond ?? price.outputPerSecond;
  if (perSecond === undefined || !(callMs > 0) || !pricedByCallTime(price)) return 0n;
  return (BigInt(Math.round(callMs)) * perSecond) / 1000n;
}

/**
 * `callMs`: the call's duration. A model priced per second and not per token (an operator's
 * `input_cost_per_second` on a chat deployment, SageMaker-style) is charged for it, as LiteLLM
 * charges `response_time_ms / 1000 × cost per second`; audio is charged for its own length instead.
 */
export function costOf(price: ModelPrice, usage: Usage, callMs?: number): Pico {
  const tier = tierFor(price, usage.promptTokens);
  const input = tier?.input ?? price.inputPerToken;
  const output = tier?.output ?? price.outputPerToken;
  const cacheRead = tier?.cacheRead ?? price.cacheReadPerToken ?? input;
  const cacheCreation = tier?.cacheCreation ?? price.cacheCreationPerToken ?? input;
  // 1-hour writes at their own rate (LiteLLM's calculate_cache_writing_cost), the tier's above a
  // prompt size (prices.ts: cacheCreation1hAbove).
  const cacheCreation1h = tier?.cacheCreation1h ?? price.cacheCreation1hPerToken ?? cacheCreation;
  const audioIn = price.inputPerAudioToken ?? input;
  const cacheReadAudio = price.cacheReadPerAudioToken ?? cacheRead;
  const audioOut = price.outputPerAudioToken ?? output;
  const imageIn = price.inputPerImageToken ?? input;
  const imageOut = price.outputPerImageToken ?? output;
  const reasoning = price.reasoningPerToken ?? output;

  const cached = usage.cachedPromptTokens ?? 0;
  const created = usage.cacheCreationTokens ?? 0;
  const createdHour = Math.min(created, usage.cacheCreation1hTokens ?? 0);
  const audioPrompt = usage.audioPromptTokens ?? 0;
  // Cached audio is counted both as cached and as audio (OpenAI's realtime and audio models): it is
  // priced once, at the cached-audio rate. At least the overlap the totals force is taken as cached
  // audio (cached and audio tokens together beyond the prompt), so the parts never outgrow it.
  const cachedAudio = Math.min(cached, audioPrompt, Math.max(usage.cachedAudioPromptTokens ?? 0, cached + audioPrompt - usage.promptTokens));
  const imagePrompt = usage.imagePromptTokens ?? 0;
  const cited = usage.citationTokens ?? 0;
  const plainPrompt = Math.max(0, usage.promptTokens - cached - created - (audioPrompt - cachedAudio) - imagePrompt - cited);
  const reasoned = usage.reasoningTokens ?? 0;
  const audioCompletion = usage.audioCompletionTokens ?? 0;
  const imageCompletion = usage.imageCompletionTokens ?? 0;
  const plainCompletion = Math.max(0, usage.completionTokens - reasoned - audioCompletion - imageCompletion);

  // A prompt billed by its characters (Vertex's embeddings report them) is not also billed by its tokens.
  const byCharacters = (usage.characters ?? 0) > 0 && price.inputPerCharacter !== undefined;
  let total =
    times(byCharacters ? 0 : plainPrompt, input) +
    times(cached - cachedAudio, cacheRead) +
    times(cachedAudio, cacheReadAudio) +
    times(created - createdHour, cacheCreation) +
    times(createdHour, cacheCreation1h) +
    times(audioPrompt - cachedAudio, audioIn) +
    times(plainCompletion, output) +
    times(reasoned, reasoning) +
    times(audioCompletion, audioOut) +
    times(imagePrompt, imageIn) +
    times(cited, price.citationPerToken ?? input) +
    times(imageCompletion, imageOut);
  // A fee per call, for a call that used anything (one refused or left before its answer used nothing).
  if (price.perRequest !== undefined && (usage.promptTokens > 0 || usage.completionTokens > 0)) total += price.perRequest;

  // An image model priced per image token (gpt-image-1-mini; gpt-image-1 where the operator gives
  // its token prices) is charged for its tokens, not also per image or pixel of its size.
  const byImageTokens = imageCompletion > 0 && price.outputPerImageToken !== undefined;
  if (usage.images && usage.images.count > 0 && !byImageTokens) {
    const perImage = price.outputPerImage ?? price.inputPerImage;
    if (perImage !== undefined) total += times(usage.images.count, perImage);
    else {
      const pixels = pixelsOf(usage.images.size) ?? 1024 * 1024;
      const perPixel = (price.inputPerPixel ?? 0n) + (price.outputPerPixel ?? 0n);
      total += BigInt(usage.images.count) * BigInt(pixels) * perPixel;
    }
  }
  // Audio by duration: a transcription is charged once for its length (LiteLLM prices whisper's
  // input and output seconds alike; charging both would double the bill). The length as the
  // upstream wrote it (8.470000267028809 s), not rounded to the millisecond: the product is exact
  // to the yocto-dollar, and cutting it there cannot move the one rounding to pico-dollars below.
  const perSecond = price.inputPerSecond ?? price.outputPerSecond;
  if (usage.audioSeconds && usage.audioSeconds > 0 && Number.isFinite(usage.audioSeconds)) {
    if (perSecond !== undefined) total += (scaled(usage.audioSeconds, SECOND_DIGITS) * perSecond) / 10n ** BigInt(SECOND_DIGITS);
  } else if (callMs !== undefined) total += callTimeRate(price, callMs);
  if (usage.characters) total += times(usage.characters, price.inputPerCharacter ?? price.outputPerCharacter);
  // Searches a model runs on the provider's side are billed per search, at the context size asked
  // (LiteLLM: Anthropic's at the medium size's price, OpenAI's at web_search_options' size, else medium).
  if (usage.webSearchRequests) total += times(usage.webSearchRequests, price.perWebSearch?.[usage.searchContextSize ?? "medium"]);
  return rateToPico(total);
}

const larger = (a: bigint, b: bigint): bigint => (a > b ? a : b);

/**
 * The most a call can cost: its prompt estimate at the highest input rate that could apply, and
 * `maxOutputTokens` at the highest output rate (reasoning, audio and image tokens included), its
 * fee per call, `maxSearches` web searches at the dearest context size; for a model priced per
 * second of the call, `maxCallMs` (the longest it is charged for) at that rate.
 */
export function worstCaseCost(price: ModelPrice, promptTokens: number, maxOutputTokens: number, maxCallMs = 0, maxSearches = 0): Pico {
  const tier = tierFor(price, promptTokens);
  const input = tier?.input ?? price.inputPerToken ?? 0n;
  const cacheCreation = tier?.cacheCreation ?? price.cacheCreationPerToken ?? 0n;
  const cacheCreation1h = tier?.cacheCreation1h ?? price.cacheCreation1hPerToken ?? 0n;
  const output = tier?.output ?? price.outputPerToken ?? 0n;
  const reasoning = price.reasoningPerToken ?? 0n;
  // A character is at least a byte, so the prompt's bound (a token per byte) bounds its characters too.
  const maxIn = [input, cacheCreation, cacheCreation1h, price.inputPerAudioToken ?? 0n, price.cacheReadPerAudioToken ?? 0n, price.inputPerImageToken ?? 0n, price.inputPerCharacter ?? 0n, price.citationPerToken ?? 0n].reduce(larger);
  const maxOut = [output, reasoning, price.outputPerAudioToken ?? 0n, price.outputPerImageToken ?? 0n].reduce(larger);
  const search = Object.values(price.perWebSearch ?? {}).reduce<bigint>((a, b) => larger(a, b ?? 0n), 0n);
  return rateToPico(BigInt(promptTokens) * maxIn + BigInt(maxOutputTokens) * maxOut + callTimeRate(price, maxCallMs) + (price.perRequest ?? 0n) + BigInt(maxSearches) * search);
}
