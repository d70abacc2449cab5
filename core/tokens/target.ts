/** The deployment a call to a model would reach, for the utilities that answer without calling it. */
import { authorizeModel } from "../access.ts";
import type { Deployment, Principal } from "../contract.ts";
import { routePolicy } from "../router/policy.ts";
import { Rotation } from "../router/strategy.ts";
import type { Snapshot } from "../snapshot.ts";

/**
 * The first deployment serving `model` for this caller (aliases and access rules applied exactly as
 * on a model call: a model the caller may not use is a 401), or undefined when nothing serves it.
 * A drained one is passed over as a call passes it over: counting tokens upstream is a call to it.
 */
export function deploymentFor(snapshot: Snapshot, principal: Principal, model: string): Deployment | undefined {
  const group = authorizeModel(principal, model, snapshot.accessGroups, snapshot.groupAliases);
  const deployments = snapshot.models.resolve(group);
  return deployments && Rotation.of(routePolicy(snapshot.config, principal, undefined).strategy, deployments).deployments[0];
}
