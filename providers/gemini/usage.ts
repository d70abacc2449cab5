import type { Usage } from "../../core/contract.ts";
import type { GeminiCandidate, GeminiModalityCount, GeminiUsageMetadata } from "./wire.ts";

const count = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) ? v : 0);

/** The tokens of one modality in a `*TokensDetails` list. */
function modality(list: GeminiModalityCount[] | undefined, name: string): number {
  if (!Array.isArray(list)) return 0;
  let n = 0;
  for (const d of list) if (d?.modality === name) n += count(d.tokenCount);
  return n;
}

/**
 * Web searches a candidate ran (Grounding with Google Search): its `groundingMetadata`'s
 * `webSearchQueries`, one search each, as LiteLLM counts them (web_search_requests). They are
 * charged at the entry's `search_context_cost_per_query` (medium), which the price file gives no
 * Gemini model: an operator's, in `model_info`.
 */
export function groundingSearches(c: GeminiCandidate | undefined): number {
  const queries = c?.groundingMetadata?.webSearchQueries;
  return Array.isArray(queries) ? queries.length : 0;
}

/**
 * Gemini's `usageMetadata` → the gateway's Usage. Gemini counts thinking apart from the answer
 * (`thoughtsTokenCount` is not in `candidatesTokenCount`) and tool-use prompts apart from the
 * prompt; OpenAI's convention puts both inside the totals, so they are added in, and the cached
 * and reasoning figures are reported as the parts of those totals they are.
 */
export function usageFromGemini(u: GeminiUsageMetadata | undefined): Usage {
  if (!u) return { promptTokens: 0, completionTokens: 0 };
  const thoughts = count(u.thoughtsTokenCount);
  const usage: Usage = {
    promptTokens: count(u.promptTokenCount) + count(u.toolUsePromptTokenCount),
    completionTokens: count(u.candidatesTokenCount) + thoughts,
  };
  const cached = count(u.cachedContentTokenCount);
  if (cached) usage.cachedPromptTokens = cached;
  if (thoughts) usage.reasoningTokens = thoughts;
  // Audio in the prompt has its own rate (input_cost_per_audio_token); cached audio is a cache read.
  const audio = Math.max(0, modality(u.promptTokensDetails, "AUDIO") - modality(u.cacheTokensDetails, "AUDIO"));
  if (audio) usage.audioPromptTokens = Math.min(audio, usage.promptTokens - cached);
  return usage;
}
