import type { Usage } from "../../core/contract.ts";

function num(v: unknown): number {
  return typeof v === "number" && Number.isFinite(v) ? v : 0;
}

function record(v: unknown): Record<string, unknown> | undefined {
  return v !== null && typeof v === "object" ? (v as Record<string, unknown>) : undefined;
}

/** OpenAI `usage` object → the gateway's Usage (0 when absent). */
export function usageFromOpenAI(raw: unknown): Usage {
  const u = record(raw);
  if (!u) return { promptTokens: 0, completionTokens: 0 };
  const usage: Usage = { promptTokens: num(u.prompt_tokens), completionTokens: num(u.completion_tokens) };
  const cached = num(record(u.prompt_tokens_details)?.cached_tokens);
  const reasoning = num(record(u.completion_tokens_details)?.reasoning_tokens);
  if (cached) usage.cachedPromptTokens = cached;
  if (reasoning) usage.reasoningTokens = reasoning;
  return usage;
}
