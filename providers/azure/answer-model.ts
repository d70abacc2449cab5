/**
 * Azure deployments are named by the operator (`azure/prod-chat`), and their answers name the model
 * behind them (`"model": "gpt-4o-2024-08-06"`): kept with the usage, a deployment the price table
 * does not know is priced as that model (Usage.answerModel), as LiteLLM prices it.
 */
import type { Usage } from "../../core/contract.ts";

/** `usage` with the model `answer` names, when it names one. */
export function withAnswerModel(usage: Usage, answer: unknown): Usage {
  const model = answer !== null && typeof answer === "object" ? (answer as { model?: unknown }).model : undefined;
  return typeof model === "string" && model !== "" ? { ...usage, answerModel: model } : usage;
}
