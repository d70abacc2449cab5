/** The deployment a call to a model would reach, for the utilities that answer without calling it. */
import { authorizeModel } from "../access.ts";
import type { Deployment, Principal } from "../contract.ts";
import type { Snapshot } from "../snapshot.ts";

/**
 * The first deployment serving `model` for this caller (aliases and access rules applied exactly as
 * on a model call: a model the caller may not use is a 401), or undefined when nothing serves it.
 */
export function deploymentFor(snapshot: Snapshot, principal: Principal, model: string): Deployment | undefined {
  const group = authorizeModel(principal, model, snapshot.accessGroups, snapshot.groupAliases);
  return snapshot.models.resolve(group)?.[0];
}
