/**
 * Anthropic's rate-limit headers (`anthropic-ratelimit-requests-*`, `anthropic-ratelimit-tokens-*`)
 * as OpenAI's `x-ratelimit-*`, so a client sees the same headers whichever provider answered
 * (LiteLLM maps them the same way).
 */
const PAIRS = [
  ["anthropic-ratelimit-requests-limit", "x-ratelimit-limit-requests"],
  ["anthropic-ratelimit-requests-remaining", "x-ratelimit-remaining-requests"],
  ["anthropic-ratelimit-tokens-limit", "x-ratelimit-limit-tokens"],
  ["anthropic-ratelimit-tokens-remaining", "x-ratelimit-remaining-tokens"],
] as const;

export function anthropicRateLimitHeaders(upstream: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [from, to] of PAIRS) {
    const v = upstream.get(from);
    if (v !== null) out[to] = v;
  }
  return out;
}
