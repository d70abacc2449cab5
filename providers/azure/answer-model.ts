/**
 * Azure deployments are named by the operator (`azure/prod-chat`), and their answers name the model
 * behind them (`"model": "gpt-4o-2024-08-06"`): kept with the usage, a deployment the price table
 * does not know is priced as that model (Usage.answerModel), as LiteLLM prices it.
 */
import type { Usage } from "../../core/contract.ts";

/** The model an answer (or a stream's chunk) names, when it names one. */
export function answerModelOf(answer: unknown): string | undefined {
  const model = answer !== null && typeof answer === "object" ? (answer as { model?: unknown }).model : undefined;
  return typeof model === "string" && model !== "" ? model : undefined;
}

/** `usage` with the model the answer names, when it names one. */
export function withAnswerModel(usage: Usage, model: string | undefined): Usage {
  return model === undefined ? usage : { ...usage, answerModel: model };
}
