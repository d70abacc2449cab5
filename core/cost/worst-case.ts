/**
 * The most a call can cost before it is made, per endpoint: what budgets reserve. It must never be
 * below what the call is then charged, or concurrent calls could overspend.
 */
import type { CallType, Deployment, Endpoint, WireRequest } from "../contract.ts";
import { IMAGE_QUALITIES, IMAGE_SIZES, imagesAsked, speechBound } from "../wire.ts";
import { knownAudioSeconds } from "./audio-length.ts";
import { audioBound } from "./estimate.ts";
import type { Pico } from "./money.ts";
import type { Pricing } from "./pricing.ts";

/**
 * The most output tokens a gpt-image model counts for one image: OpenAI's table tops out at 6,240
 * (high quality, 1024x1536).
 */
const MAX_TOKENS_PER_IMAGE = 6_240;

/**
 * Over every size and quality the model may pick where the request leaves them open; for a model
 * priced per image token, the prompt and the most tokens its images can count, besides.
 */
function worstImages(pricing: Pricing, d: Deployment, promptTokens: number, req: WireRequest["images"]): Pico {
  const asked = imagesAsked(req);
  const tokens = pricing.worstCase(d, promptTokens, asked.count * MAX_TOKENS_PER_IMAGE);
  let worst = 0n;
  for (const size of asked.size ? [asked.size] : IMAGE_SIZES) {
    for (const quality of asked.quality ? [asked.quality] : [undefined, ...IMAGE_QUALITIES]) {
      const c = pricing.costOf(d, { promptTokens, completionTokens: 0, images: { count: asked.count, size, quality } });
      // An entry the model has no price for (a size it does not make) says nothing.
      if (c.priced && c.cost > worst) worst = c.cost;
    }
  }
  return worst + tokens;
}

/**
 * Priced per second or per token, whichever the model uses; a transcript is shorter than its
 * audio's tokens. An answer without its audio's length is charged for the call's time instead
 * (a model priced per second of the call), so the dearer of the two. `audioSeconds`: the length
 * it was priced with, where a price per second made the cost (a call charged this logs it).
 */
export function transcriptionBound(pricing: Pricing, d: Deployment, promptTokens: number, req: WireRequest["transcriptions"], maxCallMs: number): { cost: Pico; audioSeconds?: number } {
  const audio = audioBound(req.file.size, knownAudioSeconds(req.file));
  const usage = { promptTokens: promptTokens + audio.tokens, audioPromptTokens: audio.tokens, completionTokens: audio.tokens };
  const bySeconds = pricing.costOf(d, { ...usage, audioSeconds: audio.seconds }).cost;
  const byCallTime = pricing.costOf(d, usage, maxCallMs).cost;
  if (byCallTime > bySeconds) return { cost: byCallTime };
  // A model priced by tokens alone was not priced with the length.
  return bySeconds > pricing.costOf(d, usage).cost ? { cost: bySeconds, audioSeconds: audio.seconds } : { cost: bySeconds };
}

/** The answer-token limit a request sets, if any. */
export function maxOutput(body: WireRequest[Endpoint]): number | undefined {
  const b = body as { max_tokens?: number | null; max_completion_tokens?: number | null };
  return b.max_completion_tokens ?? b.max_tokens ?? undefined;
}

/** How many prompts a completions call holds: a list of texts or of token lists is a batch, each answered on its own. */
function completionPrompts(prompt: WireRequest["completions"]["prompt"]): number {
  // A text, or one list of token ids, is one prompt.
  return Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== "number" ? prompt.length : 1;
}

/**
 * How many answers a call is billed for: a chat call's `n` choices; a completions call's `n`, or
 * its `best_of` candidates when more (the upstream generates and bills every candidate, then
 * returns the `n` best), for each prompt of a batch; 1 on other endpoints.
 */
export function answersBilled(endpoint: CallType, body: WireRequest[Endpoint]): number {
  if (endpoint !== "chat" && endpoint !== "completions") return 1;
  const n = Math.max(1, (body as { n?: number | null }).n ?? 1);
  if (endpoint === "chat") return n;
  const b = body as WireRequest["completions"];
  return Math.max(n, b.best_of ?? 1) * completionPrompts(b.prompt);
}

/** How many choices an answer holds: `n`, for each prompt of a completions batch (`best_of`'s other candidates are not returned). */
export function choicesAnswered(endpoint: "chat" | "completions", body: WireRequest["chat" | "completions"]): number {
  const n = Math.max(1, body.n ?? 1);
  return endpoint === "chat" ? n : n * completionPrompts((body as WireRequest["completions"]).prompt);
}

/** Past 2^53 a count is not exact (nor a BigInt of an infinite one possible); no budget or limit holds that many tokens. */
const MAX_ANSWER_TOKENS = Number.MAX_SAFE_INTEGER;

/** The answer tokens of `answers` answers of at most `perAnswer` tokens each. */
export const answerTokens = (perAnswer: number, answers: number): number => Math.min(perAnswer * answers, MAX_ANSWER_TOKENS);

/**
 * The most answer tokens a chat or completions call can have: its limit for each answer it is
 * billed for (answersBilled); undefined when the request sets no limit.
 */
export function answerTokenBound(endpoint: CallType, body: WireRequest[Endpoint], maxOutputTokens = maxOutput(body)): number | undefined {
  return maxOutputTokens === undefined ? undefined : answerTokens(maxOutputTokens, answersBilled(endpoint, body));
}

/**
 * The most web searches a chat call can be charged, where the request bounds them: the `max_uses`
 * of each Anthropic web search tool it gives (`web_search_…`), and the one search an OpenAI-shaped
 * answer citing the web is charged. A web search tool without `max_uses` is unbounded: its
 * searches are charged after the call, not reserved.
 */
export function searchBound(body: WireRequest[Endpoint]): number {
  const tools = (body as { tools?: unknown }).tools;
  let bound = 1;
  for (const t of Array.isArray(tools) ? tools : []) {
    const tool = t as { type?: unknown; max_uses?: unknown };
    if (typeof tool.type !== "string" || !tool.type.startsWith("web_search")) continue;
    if (typeof tool.max_uses === "number" && Number.isInteger(tool.max_uses) && tool.max_uses > 0) bound += tool.max_uses;
  }
  return bound;
}

/**
 * `promptTokens`: the prompt's bound; `maxOutputTokens`: the request's limit for one answer, if it sets one;
 * `maxCallMs`: the longest the call is charged for (its attempt's timeout), for a model priced
 * per second of the call.
 */
export function worstCaseOf<E extends Endpoint>(endpoint: E, body: WireRequest[E], d: Deployment, pricing: Pricing, promptTokens: number, maxOutputTokens: number | undefined, maxCallMs: number): Pico {
  switch (endpoint) {
    case "embeddings":
    case "moderations":
      return pricing.worstCase(d, promptTokens, 0, maxCallMs);
    case "images":
      return worstImages(pricing, d, promptTokens, body as WireRequest["images"]);
    case "speech":
      return pricing.costOf(d, speechBound(body as WireRequest["speech"]), maxCallMs).cost;
    case "transcriptions":
      return transcriptionBound(pricing, d, promptTokens, body as WireRequest["transcriptions"], maxCallMs).cost;
    default: {
      // Chat and completions: without max_tokens every answer may run to the model's output limit.
      const output = answerTokens(maxOutputTokens ?? pricing.outputLimit(d), answersBilled(endpoint, body));
      return pricing.worstCase(d, promptTokens, output, maxCallMs, endpoint === "chat" ? searchBound(body) : 0);
    }
  }
}
