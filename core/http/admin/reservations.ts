/**
 * What guaranteed keys reserve (core/limits/capacity.ts) depends on more than the keys: their
 * team's, user's and organization's model lists and the team's limits, and the deployments of
 * each group. A write to one of those must leave room for every reservation, as a key write must.
 */
import { badRequest } from "../../authz.ts";
import type { AccessGroupLookup } from "../../access.ts";
import type { KeyRow } from "../../contract.ts";
import { type KeyOwners, overflowAfter } from "../../limits/capacity.ts";
import type { ModelTable } from "../../models.ts";
import type { AdminCtx } from "./context.ts";

/** How a write leaves things: the keys it may affect, and the rows or model table it replaces. */
export interface ReservingChange {
  affected(key: KeyRow): boolean;
  owners?: Partial<KeyOwners>;
  models?: ModelTable;
  accessGroups?: AccessGroupLookup;
}

/** 400 (the key write's, naming the key that would no longer fit) when `change` would overbook a group or a team. */
export function refuseOverbooking(ctx: AdminCtx, change: ReservingChange, param: string): void {
  const { identity, snapshot } = ctx;
  const owners: KeyOwners = { teams: identity.teams, users: identity.users, orgs: identity.orgs, ...change.owners };
  const reach = { models: change.models ?? snapshot.models, accessGroups: change.accessGroups ?? snapshot.accessGroups, groupAliases: snapshot.groupAliases };
  const problem = overflowAfter(change.affected, reach, identity.keys.values(), owners);
  if (problem) throw badRequest(problem, param);
}
