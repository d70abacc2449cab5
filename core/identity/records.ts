/** Row types of the identity tables, as the cache and the management API see them. */
import type { accessGroups, budgets, orgMembers, organizations, rotatedKeys, teamMembers, teams, users, virtualKeys } from "../store/schema.ts";

export type KeyRow = typeof virtualKeys.$inferSelect;
export type TeamRow = typeof teams.$inferSelect;
export type OrgRow = typeof organizations.$inferSelect;
export type UserRow = typeof users.$inferSelect;
export type BudgetRow = typeof budgets.$inferSelect;
export type AccessGroupRow = typeof accessGroups.$inferSelect;
export type TeamMemberRow = typeof teamMembers.$inferSelect;
export type OrgMemberRow = typeof orgMembers.$inferSelect;
export type RotatedKeyRow = typeof rotatedKeys.$inferSelect;

export type TeamRole = "admin" | "user";

/**
 * The id of a team membership (`teamId\tuserId`): the identity cache, the member's budget and
 * rate-limit counters and the spend log's charge to `team_members` all use this one form.
 */
export const teamMemberId = (teamId: string, userId: string): string => `${teamId}\t${userId}`;
/** The team and user of a `teamMemberId`. */
export const teamMemberOf = (id: string): { teamId: string; userId: string } => {
  const tab = id.indexOf("\t");
  return { teamId: id.slice(0, tab), userId: id.slice(tab + 1) };
};

/**
 * What a key's budget and rate-limit counters are named by: the token it had first, which its
 * rotations keep (`first_token`, set by the first; until then the key still has it). Named by the
 * current token, a rotated key began new counters: its calls in flight held nothing on them and
 * settled on the old ones (max_budget, max_parallel_requests and rpm overrun), and its per-model
 * budgets started again.
 */
export const keyCounterToken = (key: Pick<KeyRow, "token" | "firstToken">): string => key.firstToken ?? key.token;

/** What changed, so every instance reloads exactly that from the store. */
export type IdentityChange =
  | { kind: "key"; token: string }
  | { kind: "team"; teamId: string }
  | { kind: "org"; orgId: string }
  | { kind: "user"; userId: string }
  | { kind: "budget"; budgetId: string }
  | { kind: "access_group"; accessGroupId: string }
  | { kind: "team_members"; teamId: string }
  | { kind: "org_members"; orgId: string }
  | { kind: "rotated_key"; token: string }
  | { kind: "models" }
  | { kind: "all" }
  /**
   * Budget counters whose spend an admin call reset (every counter without `counters`): the
   * instance that made it dropped its own copies and the shared ones; the others drop theirs.
   */
  | { kind: "spend_reset"; counters?: string[] };
