/** A row's budget object (`budget_id`), which the budget and rate-limit plugins both read limits from. */
import type { BudgetRow, IdentityView } from "../../core/contract.ts";

/** The budget object `id` names, if it has one and it exists. */
export const budgetOf = (id: string | null, identity: IdentityView | undefined): BudgetRow | undefined => (id ? identity?.budgets.get(id) : undefined);
