import type { Usage } from "../../core/contract.ts";
import { reportedCount } from "../../core/openai-usage.ts";

/** A count as reported, else 0. */
export function num(v: unknown): number {
  return reportedCount(v) ?? 0;
}

function record(v: unknown): Record<string, unknown> | undefined {
  return v !== null && typeof v === "object" ? (v as Record<string, unknown>) : undefined;
}

/**
 * The prompt and completion counts. Where one is left out beside a total, it is the total less
 * the other; a total alone is split into the prompt as estimated (no more than the total) and the
 * answer, the rest. Without an estimate, a total alone is the prompt's (an embedding's).
 */
function tokenCounts(u: Record<string, unknown>, promptEstimate?: () => number): Pick<Usage, "promptTokens" | "completionTokens"> {
  let prompt = reportedCount(u.prompt_tokens);
  let completion = reportedCount(u.completion_tokens);
  const total = reportedCount(u.total_tokens);
  if (total !== undefined && (prompt === undefined || completion === undefined)) {
    prompt ??= Math.max(0, completion === undefined ? Math.min(promptEstimate?.() ?? total, total) : total - completion);
    completion ??= Math.max(0, total - prompt);
  }
  return { promptTokens: prompt ?? 0, completionTokens: completion ?? 0 };
}

/**
 * OpenAI `usage` object → the gateway's Usage (0 when absent). `promptEstimate`: the prompt's
 * tokens as estimated, for a usage that reports only its total.
 */
export function usageFromOpenAI(raw: unknown, promptEstimate?: () => number): Usage {
  const u = record(raw);
  if (!u) return { promptTokens: 0, completionTokens: 0 };
  const usage: Usage = tokenCounts(u, promptEstimate);
  const promptDetails = record(u.prompt_tokens_details);
  const completionDetails = record(u.completion_tokens_details);
  // DeepSeek reports its cache hits as prompt_cache_hit_tokens (part of prompt_tokens), as LiteLLM's Usage maps them.
  const cached = num(promptDetails?.cached_tokens) || num(u.prompt_cache_hit_tokens);
  const reasoning = num(completionDetails?.reasoning_tokens);
  // Audio tokens (gpt-4o-audio-preview, realtime models) are parts of the totals priced at their own rates.
  const audioIn = num(promptDetails?.audio_tokens);
  const audioOut = num(completionDetails?.audio_tokens);
  if (cached) usage.cachedPromptTokens = cached;
  if (reasoning) usage.reasoningTokens = reasoning;
  if (audioIn) usage.audioPromptTokens = audioIn;
  // cached_tokens counts cached text and audio alike, audio_tokens all audio, cached or not: the
  // cached audio (cached_tokens_details.audio_tokens) is in both, and is priced once (calculate.ts).
  const cachedAudio = Math.min(cached, audioIn, num(record(promptDetails?.cached_tokens_details)?.audio_tokens));
  if (cachedAudio > 0) usage.cachedAudioPromptTokens = cachedAudio;
  if (audioOut) usage.audioCompletionTokens = audioOut;
  withPerplexityParts(usage, u, reasoning);
  withPerplexitySearch(usage, u);
  return usage;
}

/**
 * The tokens a gpt-image model's answer counts (`usage`: `input_tokens` with their text and image
 * parts in `input_tokens_details`, `output_tokens`, image tokens unless `output_tokens_details`
 * says some were text); none for dall-e, which answers without usage.
 */
export function usageFromImages(raw: unknown): Pick<Usage, "promptTokens" | "completionTokens" | "imagePromptTokens" | "imageCompletionTokens"> {
  const u = record(raw);
  const positive = (v: unknown) => Math.max(0, num(v));
  const promptTokens = positive(u?.input_tokens);
  const completionTokens = positive(u?.output_tokens);
  return {
    promptTokens,
    completionTokens,
    imagePromptTokens: Math.min(promptTokens, positive(record(u?.input_tokens_details)?.image_tokens)),
    imageCompletionTokens: Math.max(0, completionTokens - positive(record(u?.output_tokens_details)?.text_tokens)),
  };
}

/**
 * Perplexity's Deep Research reports the tokens of the sources it cited (`citation_tokens`) and of
 * its reasoning (`reasoning_tokens`) beside its prompt and completion counts, not within them; they
 * become parts of the totals here, priced at their own rates (`citation_cost_per_token`,
 * `output_cost_per_reasoning_token`) as LiteLLM and Perplexity price them.
 */
function withPerplexityParts(usage: Usage, u: Record<string, unknown>, detailedReasoning: number): void {
  // Only in Perplexity's usage (its search fields beside them): another provider's top-level reasoning count may be within its completion.
  if (!("citation_tokens" in u || "num_search_queries" in u || "search_context_size" in u)) return;
  const cited = num(u.citation_tokens);
  const reasoning = detailedReasoning ? 0 : num(u.reasoning_tokens);
  if (cited > 0) {
    usage.promptTokens += cited;
    usage.citationTokens = cited;
  }
  if (reasoning > 0) {
    usage.completionTokens += reasoning;
    usage.reasoningTokens = reasoning;
  }
}

const SEARCH_SIZES: readonly string[] = ["low", "medium", "high"];

/**
 * Perplexity's grounded answers: a usage reporting `search_context_size` is an answer that searched
 * the web at that size, billed a request fee (Sonar models; `search_context_cost_per_query` of the
 * size), and one reporting `num_search_queries` is billed per search query (Sonar Deep Research),
 * as Perplexity prices them. (LiteLLM counts only the queries, at the low size's price a
 * thousandth of what the file gives.)
 */
function withPerplexitySearch(usage: Usage, u: Record<string, unknown>): void {
  const size = u.search_context_size;
  const queries = num(u.num_search_queries);
  if (queries > 0) usage.webSearchRequests = queries;
  else if (typeof size === "string" && SEARCH_SIZES.includes(size)) usage.webSearchRequests = 1;
  if (usage.webSearchRequests && typeof size === "string" && SEARCH_SIZES.includes(size)) usage.searchContextSize = size as Usage["searchContextSize"];
}

/**
 * A transcription's usage: `usage: {type: "tokens", input_tokens, output_tokens}` (gpt-4o-transcribe)
 * and the audio's length, from `usage: {type: "duration", seconds}` or verbose_json's `duration`.
 */
export function usageFromTranscription(body: Record<string, unknown>): Usage {
  const u = record(body.usage);
  const usage: Usage = { promptTokens: 0, completionTokens: 0 };
  if (u?.type === "tokens") {
    usage.promptTokens = num(u.input_tokens);
    usage.completionTokens = num(u.output_tokens);
    const audio = num(record(u.input_token_details)?.audio_tokens);
    if (audio) usage.audioPromptTokens = audio;
  }
  const seconds = u?.type === "duration" ? u.seconds : body.duration;
  if (typeof seconds === "number" && Number.isFinite(seconds)) usage.audioSeconds = seconds;
  return usage;
}
