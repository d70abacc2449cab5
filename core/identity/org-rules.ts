/**
 * Rules an organization imposes on what it contains: a team (or anything else inside the org) may
 * only name models the org itself allows. Used by the organization routes (an org's models must
 * keep covering its teams) and by the team routes (a team's models must fit its org).
 */
import { type AccessGroupLookup, EVERYTHING, INHERIT, matchesEntry as entryCovers } from "../access.ts";
import type { OrgRow } from "./records.ts";

function orgCovers(orgModels: readonly string[], model: string, groups: AccessGroupLookup | undefined): boolean {
  for (const entry of orgModels) {
    if (entryCovers(entry, model)) return true;
    const group = groups?.byName(entry);
    if (group?.some((m) => entryCovers(m, model))) return true;
  }
  return false;
}

/**
 * Whether an org allows every model in `models`. An org without models (or without an org at all)
 * allows everything; an empty `models` list on the contained object means "inherit", which the
 * org's own level already restricts on the gateway path. A contained object naming "everything"
 * inside a restricted org is refused, and so is an access group unless the org covers each of its
 * models.
 */
export function orgAllowsModels(org: Pick<OrgRow, "models"> | undefined, models: readonly string[], groups?: AccessGroupLookup): boolean {
  if (!org) return true;
  const orgModels = org.models.filter((m) => !INHERIT.has(m));
  if (orgModels.length === 0 || orgModels.some((m) => EVERYTHING.has(m))) return true;
  return models.every((model) => modelAllowed(orgModels, model, groups));
}

function modelAllowed(orgModels: readonly string[], model: string, groups: AccessGroupLookup | undefined): boolean {
  if (INHERIT.has(model)) return true;
  if (EVERYTHING.has(model)) return false;
  if (orgCovers(orgModels, model, groups)) return true;
  const group = groups?.byName(model);
  return group !== undefined && group.length > 0 && group.every((m) => orgCovers(orgModels, m, groups));
}

/** The models in `models` the org does not allow (for error messages). */
export function modelsOutsideOrg(org: Pick<OrgRow, "models"> | undefined, models: readonly string[], groups?: AccessGroupLookup): string[] {
  return models.filter((m) => !orgAllowsModels(org, [m], groups));
}
