/**
 * What a team's `allowed_passthrough_routes` lets its keys list in theirs: every entry within the
 * team's (an exact path the team's list matches, a `prefix/*` below a `prefix/*` of the team's, or
 * a route group naming no more pass-through routes than the team's list).
 * The gateway path holds a key to both lists anyway (access.ts authorizePassThrough); a key that
 * lists more is refused when written, as one naming models outside its team's is.
 */
import { routeMatches } from "../access.ts";
import type { TeamRow } from "./records.ts";

/** The entries of a key's `routes` its team's list does not cover (none when the team's is empty: every route). */
export function routesOutsideTeam(team: Pick<TeamRow, "allowedPassthroughRoutes">, routes: readonly string[]): string[] {
  const granted = team.allowedPassthroughRoutes;
  if (granted.length === 0) return [];
  return routes.filter((entry) => !granted.some((grant) => covers(grant, entry)));
}

/**
 * Whether the team's grant covers every pass-through route the key's entry names, both read as a
 * call reads them (access.ts authorizePassThrough): of the route groups, `llm_api_routes` names
 * every pass-through route and the others none. Method-blind: of the groups only `info_routes`
 * reads the method, and it names no pass-through route.
 */
function covers(grant: string, entry: string): boolean {
  if (entry === "llm_api_routes") return grant === "llm_api_routes" || grant === "/*";
  if (entry === "management_routes" || entry === "info_routes") return true;
  if (!entry.endsWith("/*")) return routeMatches(grant, entry, "POST", true);
  return (grant === "llm_api_routes" || grant.endsWith("/*")) && routeMatches(grant, entry.slice(0, -2), "POST", true);
}
