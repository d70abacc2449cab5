/**
 * Recognises context-window and content-policy failures in an upstream error body, for every
 * provider: each states them differently (an error code, or only a sentence), and the router's
 * fallbacks depend on telling them apart from ordinary 400s.
 */
import type { UpstreamErrorKind } from "../../core/contract.ts";

const CONTEXT_WINDOW = [
  /context_length_exceeded/i,
  /maximum context length/i,
  /context window/i,
  /prompt is too long/i,
  /input is too long/i,
  /too many (input )?tokens/i,
  /exceeds? the (maximum|max) (number of )?tokens/i,
  /input token count.*exceeds/i,
  /reduce the length of the messages/i,
  // Ollama: "the input length exceeds the context length".
  /exceeds the context length/i,
  // Anthropic: "input length and `max_tokens` exceed context limit: 187254 + 20000 > 200000, …"
  /exceed context limit/i,
];

const CONTENT_POLICY = [/content_policy_violation/i, /content_filter/i, /content management policy/i, /safety (system|filter)/i, /responsible ?AI/i, /content filtering policy/i,
  // Google: "… was blocked due to safety reasons", "blocked by the safety filters"
  /blocked (due to|by) (the |its )?safety/i,
  // Bedrock: "This request has been blocked by our content filters.", a guardrail's intervention
  /blocked by (our |the |your )?(content filters?|guardrails?)/i, /guardrail[_ ]intervened/i];

export function upstreamErrorKind(status: number, body: string): UpstreamErrorKind | undefined {
  if (status < 400 || status >= 500) return undefined;
  if (CONTEXT_WINDOW.some((r) => r.test(body))) return "context_window_exceeded";
  if (CONTENT_POLICY.some((r) => r.test(body))) return "content_policy_violation";
  return undefined;
}
