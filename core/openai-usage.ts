/** The gateway's Usage → OpenAI's `usage` object, for adapters whose upstream reports usage in its own shape. */
import type { Usage, WireJson } from "./contract.ts";

/**
 * OpenAI always sends both detail objects. What OpenAI has no field for, and the call is charged
 * for, goes where LiteLLM's usage puts it, so a client (and `/spend/calculate`, given the answer)
 * can price the answer as the gateway did: cache writes (`cache_creation_input_tokens`, and their
 * 5-minute and 1-hour parts in `prompt_tokens_details.cache_creation_token_details`, priced apart)
 * and the web searches the model ran (`server_tool_use.web_search_requests`).
 */
export function openAIUsage(u: Usage): WireJson {
  const promptDetails: WireJson = { cached_tokens: u.cachedPromptTokens ?? 0, ...(u.audioPromptTokens ? { audio_tokens: u.audioPromptTokens } : {}) };
  const usage: WireJson = {
    prompt_tokens: u.promptTokens,
    completion_tokens: u.completionTokens,
    total_tokens: u.promptTokens + u.completionTokens,
    prompt_tokens_details: promptDetails,
    completion_tokens_details: { reasoning_tokens: u.reasoningTokens ?? 0, ...(u.audioCompletionTokens ? { audio_tokens: u.audioCompletionTokens } : {}) },
  };
  if (u.cacheCreationTokens) {
    usage.cache_creation_input_tokens = u.cacheCreationTokens;
    const hour = u.cacheCreation1hTokens ?? 0;
    promptDetails.cache_creation_token_details = { ephemeral_5m_input_tokens: u.cacheCreationTokens - hour, ephemeral_1h_input_tokens: hour };
  }
  if (u.cachedPromptTokens) usage.cache_read_input_tokens = u.cachedPromptTokens;
  if (u.webSearchRequests) usage.server_tool_use = { web_search_requests: u.webSearchRequests };
  return usage;
}

const WHOLE_NUMBER = /^\s*-?\d+\s*$/;

/**
 * A count as reported: a finite number, or a whole number written as text (some compatible servers
 * quote their counts; LiteLLM's Usage reads "100" as 100). Anything else is no count.
 */
export function reportedCount(v: unknown): number | undefined {
  if (typeof v === "number") return Number.isFinite(v) ? v : undefined;
  return typeof v === "string" && WHOLE_NUMBER.test(v) ? Number(v) : undefined;
}

/**
 * Whether an OpenAI `usage` counts the call's tokens (a prompt, completion or total count). One
 * that does not (`{}`, nulls, only a vendor's own fields) is no usage: the call is estimated as an
 * answer without one is, where reading it made the call free.
 */
export function countsTokens(raw: unknown): boolean {
  if (raw === null || typeof raw !== "object") return false;
  const u = raw as Record<string, unknown>;
  return [u.prompt_tokens, u.completion_tokens, u.total_tokens].some((v) => reportedCount(v) !== undefined);
}
