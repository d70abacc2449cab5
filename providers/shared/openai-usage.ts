/** The gateway's Usage → OpenAI's `usage` object, for adapters whose upstream reports usage in its own shape. */
import type { Usage, WireJson } from "../../core/contract.ts";

/**
 * OpenAI always sends both detail objects; cache writes have no OpenAI field, so they go where
 * OpenAI-compatible clients that track Anthropic-style caching look for them.
 */
export function openAIUsage(u: Usage): WireJson {
  const usage: WireJson = {
    prompt_tokens: u.promptTokens,
    completion_tokens: u.completionTokens,
    total_tokens: u.promptTokens + u.completionTokens,
    prompt_tokens_details: { cached_tokens: u.cachedPromptTokens ?? 0, ...(u.audioPromptTokens ? { audio_tokens: u.audioPromptTokens } : {}) },
    completion_tokens_details: { reasoning_tokens: u.reasoningTokens ?? 0, ...(u.audioCompletionTokens ? { audio_tokens: u.audioCompletionTokens } : {}) },
  };
  if (u.cacheCreationTokens) usage.cache_creation_input_tokens = u.cacheCreationTokens;
  if (u.cachedPromptTokens) usage.cache_read_input_tokens = u.cachedPromptTokens;
  return usage;
}
