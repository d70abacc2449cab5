/**
 * Rules an organization imposes on what it contains: a team's list (`models` and
 * `access_group_ids`) names only what a call through the org may use, judged as the call path
 * judges it (access.ts listedOutside: names, wildcards, access groups, the team's and the org's
 * aliases). Used by the team routes (a team's list must fit its org) and by the organization
 * routes (an org's models must keep covering its teams).
 */
import { type AccessGroupLookup, accessAliases, type GroupAliases, listedOutside } from "../access.ts";
import type { OrgRow, TeamRow } from "./records.ts";

/** The entries of a team's list its organization would never let a call use (none without an org). */
export function teamOutsideOrg(
  org: Pick<OrgRow, "models" | "modelAliases"> | undefined,
  team: Pick<TeamRow, "models" | "accessGroupIds" | "modelAliases">,
  groups: AccessGroupLookup,
  groupAliases: GroupAliases,
): { models: string[]; accessGroupIds: string[] } {
  if (!org) return { models: [], accessGroupIds: [] };
  const above = { levels: [{ level: "org" as const, models: org.models, accessGroupIds: [] }], ...accessAliases(undefined, team, [org]) };
  return listedOutside(above, team, groups, groupAliases);
}
