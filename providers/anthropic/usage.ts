/**
 * Anthropic usage → the gateway's Usage. Anthropic counts cached and cache-written prompt tokens
 * apart from `input_tokens`; OpenAI's convention (and the gateway's) makes them parts of the prompt total.
 */
import type { Usage } from "../../core/contract.ts";
import type { AnthropicUsage } from "./wire.ts";

const count = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) && v > 0 ? v : 0);

export function usageFromAnthropic(u: AnthropicUsage | undefined): Usage {
  const cached = count(u?.cache_read_input_tokens);
  const created = count(u?.cache_creation_input_tokens);
  const usage: Usage = { promptTokens: count(u?.input_tokens) + cached + created, completionTokens: count(u?.output_tokens) };
  if (cached) usage.cachedPromptTokens = cached;
  if (created) usage.cacheCreationTokens = created;
  // Writes cached for an hour cost more than 5-minute ones (`cache_creation_input_token_cost_above_1hr`).
  const hour = Math.min(created, count(u?.cache_creation?.ephemeral_1h_input_tokens));
  if (hour) usage.cacheCreation1hTokens = hour;
  const searches = count(u?.server_tool_use?.web_search_requests);
  if (searches) usage.webSearchRequests = searches;
  return usage;
}
