/**
 * What a team's `allowed_passthrough_routes` lets its keys list in theirs: every entry within the
 * team's (an exact path the team's list matches, or a `prefix/*` below a `prefix/*` of the team's).
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

/** Method-blind: of the named groups only `info_routes` reads the method, and it is read-only routes, which a written list is not about. */
function covers(grant: string, entry: string): boolean {
  if (!entry.endsWith("/*")) return routeMatches(grant, entry, "POST");
  return grant.endsWith("/*") && routeMatches(grant, entry.slice(0, -2), "POST");
}
