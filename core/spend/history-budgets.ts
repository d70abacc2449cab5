/**
 * Budgets without a row of their own: a key's, a team's and an organization's per-model budget
 * (`model_max_budget`, else their budget object's; a team's from its budget object only) and a provider's
 * (`router_settings.provider_budget_config`). The ledger reserves on them (plugins/budgets.ts),
 * and the spend writer charges their period (entry.ts), from this one reading of the settings.
 */
import type { ProviderBudget } from "../contract.ts";
import { gridPeriod } from "./period.ts";

export interface HistoryBudget {
  /** The counter's id: `key_model:<token>:<group>` (the key's `keyCounterToken`), `team_model:<team id>:<group>`, `org_model:<org id>:<group>` or `provider:<name>`. */
  id: string;
  limitUsd: number;
  /** Its grid period at the instant asked (spend/period.ts gridPeriod); null for a budget that never resets. */
  period: { start: number; end: number } | null;
}

type ModelMaxBudget = Record<string, unknown> | null | undefined;

/** The `model_max_budget` entry for the group (a key's `budget_limit`/`time_period`, or a budget object's `max_budget`/`budget_duration`), counted as `<owner>:<group>`. */
function modelBudget(owner: string, modelMaxBudget: ModelMaxBudget, modelGroup: string, at: number): HistoryBudget | undefined {
  const perModel = modelMaxBudget?.[modelGroup] as { budget_limit?: unknown; max_budget?: unknown; time_period?: unknown; budget_duration?: unknown } | undefined;
  const limit = perModel?.budget_limit ?? perModel?.max_budget;
  if (typeof limit !== "number") return undefined;
  return { id: `${owner}:${modelGroup}`, limitUsd: limit, period: periodOf(String(perModel?.time_period ?? perModel?.budget_duration ?? ""), at) };
}

export function keyModelBudget(counterToken: string, modelMaxBudget: ModelMaxBudget, modelGroup: string, at: number): HistoryBudget | undefined {
  return modelBudget(`key_model:${counterToken}`, modelMaxBudget, modelGroup, at);
}

/** A team's per-model budgets: only its budget object's (`model_max_budget` on the team itself is refused). */
export function teamModelBudget(teamId: string, modelMaxBudget: ModelMaxBudget, modelGroup: string, at: number): HistoryBudget | undefined {
  return modelBudget(`team_model:${teamId}`, modelMaxBudget, modelGroup, at);
}

export function orgModelBudget(orgId: string, modelMaxBudget: ModelMaxBudget, modelGroup: string, at: number): HistoryBudget | undefined {
  return modelBudget(`org_model:${orgId}`, modelMaxBudget, modelGroup, at);
}

export function providerBudget(name: string, budgets: Readonly<Record<string, ProviderBudget>>, at: number): HistoryBudget | undefined {
  const budget = budgets[name];
  if (!budget) return undefined;
  return { id: `provider:${name}`, limitUsd: budget.budget_limit, period: periodOf(budget.time_period, at) };
}

const periodOf = (duration: string, at: number) => (duration ? gridPeriod(duration, at) : null);
