/** OpenAI's `reasoning_effort`, read once for the adapters that translate it into a provider's own thinking switch. */
import type { ChatRequest } from "../../core/contract.ts";
import { GatewayError } from "../../core/errors.ts";

/**
 * Thinking budgets in tokens per effort level, for providers that take a budget rather than a level
 * (LiteLLM's numbers; 1024 is the smallest budget Claude accepts, so `minimal` cannot go lower).
 */
export const THINKING_BUDGET: Readonly<Record<string, number>> = { minimal: 1024, low: 1024, medium: 2048, high: 4096 };

/** The levels OpenAI documents, `none` included (its newer models can switch reasoning off). */
const LEVELS = ["none", "minimal", "low", "medium", "high"];

/**
 * The request's effort level, or undefined when it sets none. A value OpenAI would refuse is the
 * client's 400 here too, rather than a guess sent upstream that fails there with a vaguer message.
 */
export function reasoningEffort(req: ChatRequest, provider: string): string | undefined {
  const effort = (req as { reasoning_effort?: unknown }).reasoning_effort;
  if (effort === undefined || effort === null) return undefined;
  if (typeof effort === "string" && LEVELS.includes(effort)) return effort;
  throw GatewayError.of(400, `${provider}: reasoning_effort ${JSON.stringify(effort)} is not one of ${LEVELS.join(", ")}`, "invalid_request_error", "reasoning_effort");
}
