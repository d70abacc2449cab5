/**
 * A model group's capacity and which keys may draw on it, for the throughput types:
 * `guaranteed_throughput` reserves a key's limit out of the capacity of every group it may call,
 * and `dynamic` splits a group's capacity among the keys active on it.
 */
import { type AccessGroupLookup, accessAliases, type GroupAliases, keyAccessLevels, type ModelRules, mayUseModel, modelTarget, NO_ACCESS_GROUPS } from "../access.ts";
import type { Deployment, GroupCapacity, KeyRow, OrgRow, TeamRow, UserRow } from "../contract.ts";
import { ModelTable } from "../models.ts";

/**
 * What decides which model group a call reaches, and whether a key may make it: the model table,
 * the access groups and the config's `model_group_alias`. A snapshot is one; a model write is
 * judged on the table as it would leave it.
 */
export interface ModelReach {
  readonly models: ModelTable;
  readonly accessGroups: AccessGroupLookup;
  readonly groupAliases: GroupAliases;
}

/** For a call that draws on no model group's capacity (a pass-through route). */
export const NO_MODEL_REACH: ModelReach = { models: new ModelTable([]), accessGroups: NO_ACCESS_GROUPS, groupAliases: new Map() };

const capacities = new WeakMap<readonly Deployment[], GroupCapacity>();

function sumOf(list: readonly Deployment[], field: "rpm" | "tpm"): number | undefined {
  let sum = 0;
  for (const d of list) {
    const v = d.options[field];
    if (typeof v !== "number" || v <= 0) return undefined;
    sum += v;
  }
  return sum;
}

/** The sum of the deployments' `rpm` and `tpm`, when every deployment of the group sets it. */
export function groupCapacity(deployments: readonly Deployment[]): GroupCapacity {
  let c = capacities.get(deployments);
  if (!c) {
    c = { rpm: sumOf(deployments, "rpm"), tpm: sumOf(deployments, "tpm") };
    capacities.set(deployments, c);
  }
  return c;
}

/** The rows besides a key whose model lists bind its calls, by id. */
export interface KeyOwners {
  readonly teams: ReadonlyMap<string, TeamRow>;
  readonly users: ReadonlyMap<string, UserRow>;
  readonly orgs: ReadonlyMap<string, OrgRow>;
}

/** A key as it will be stored, for the guaranteed-throughput check at creation and update: its lists, the rows that bind them, its limits. */
export type PlannedKey = Pick<
  KeyRow,
  "token" | "models" | "accessGroupIds" | "aliases" | "teamId" | "userId" | "organizationId" | "rpmLimit" | "tpmLimit" | "rpmLimitType" | "tpmLimitType"
>;

/** The levels and aliases a model call of the key is judged by, as auth-virtual-keys builds them. */
function keyRules(key: Pick<PlannedKey, "models" | "accessGroupIds" | "aliases" | "teamId" | "userId" | "organizationId">, owners: KeyOwners): ModelRules {
  const team = key.teamId ? owners.teams.get(key.teamId) : undefined;
  const user = key.userId ? owners.users.get(key.userId) : undefined;
  const orgIds = new Set([key.organizationId, team?.organizationId]);
  const orgs = [...orgIds].flatMap((id) => (id ? (owners.orgs.get(id) ?? []) : []));
  return { levels: keyAccessLevels(key, team, user, orgs), ...accessAliases(key, team, orgs) };
}

/** Every entry of the key's levels' lists, with the models of the access groups they name. */
function* listedEntries(rules: ModelRules, groups: AccessGroupLookup): Iterable<string> {
  for (const level of rules.levels) {
    for (const entry of level.models) {
      yield entry;
      yield* groups.byName(entry) ?? [];
    }
    for (const id of level.accessGroupIds) yield* groups.byId(id) ?? [];
  }
}

/** A character no model name has: between a prefix and a suffix it makes a name that no group or alias has. */
const NO_NAME = "\u0000";

/**
 * Names that stand for all those a key's lists may allow under the wildcard route `pattern`: each
 * name they list, and the route's prefix and suffix, each widened by those of a pattern they list,
 * around a character no name has. A name of the route that every level allows matches an entry of
 * each; the longest prefix and suffix among those, around that character, match them all too.
 */
function routeNames(pattern: string, rules: ModelRules, groups: AccessGroupLookup): string[] {
  const star = pattern.indexOf("*");
  const prefix = pattern.slice(0, star);
  const suffix = pattern.slice(star + 1);
  const prefixes = new Set([prefix]);
  const suffixes = new Set([suffix]);
  const names: string[] = [];
  for (const entry of listedEntries(rules, groups)) {
    const at = entry.indexOf("*");
    if (at < 0) {
      names.push(entry);
      continue;
    }
    // A pattern whose prefix the route's extends adds nothing; one that neither extends matches no name of the route.
    if (entry.slice(0, at).startsWith(prefix)) prefixes.add(entry.slice(0, at));
    if (entry.slice(at + 1).endsWith(suffix)) suffixes.add(entry.slice(at + 1));
  }
  for (const p of prefixes) for (const s of suffixes) names.push(p + NO_NAME + s);
  return names;
}

/**
 * The names a call may ask for to reach `group`: the group's own (for a wildcard route, names
 * that stand for those its lists allow there), and every alias (the key's, its team's and
 * organizations', the config's `model_group_alias`), which may lead to it.
 */
function namesReaching(group: string, rules: ModelRules, reach: ModelReach): Iterable<string> {
  const own = group.includes("*") ? routeNames(group, rules, reach.accessGroups) : [group];
  return new Set([...own, ...Object.keys(rules.aliases), ...reach.groupAliases.keys()]);
}

/**
 * Whether a key may call `group` (a model group, or a wildcard route by its pattern, `openai/*`) as
 * a model call would judge it: some name it may ask for (the group's, one the route serves, or an
 * alias that leads there) is served by the group, and its own list, its team's (a personal key:
 * its user's) and its organizations' all allow that call (names, wildcards, access groups, `*` /
 * `all-proxy-models`, `all-team-models`, aliases; an empty list restricts nothing).
 */
export function keyMayCallGroup(
  key: Pick<PlannedKey, "models" | "accessGroupIds" | "aliases" | "teamId" | "userId" | "organizationId">,
  owners: KeyOwners,
  group: string,
  reach: ModelReach,
): boolean {
  const rules = keyRules(key, owners);
  for (const name of namesReaching(group, rules, reach)) {
    if (reach.models.servingName(modelTarget(rules, name, reach.groupAliases)) === group && mayUseModel(rules, name, reach.accessGroups, reach.groupAliases)) return true;
  }
  return false;
}

/** A key that can no longer call (blocked, or expired) reserves nothing. */
const reserves = (k: KeyRow, now: number): boolean => !k.blocked && (k.expires === null || k.expires.getTime() > now);

export type ThroughputKind = "rpm" | "tpm";

/** The key's limit of `kind` when it is guaranteed, else undefined. */
export function guaranteedLimit(key: Pick<KeyRow, "rpmLimit" | "tpmLimit" | "rpmLimitType" | "tpmLimitType">, kind: ThroughputKind): number | undefined {
  const type = kind === "rpm" ? key.rpmLimitType : key.tpmLimitType;
  const limit = kind === "rpm" ? key.rpmLimit : key.tpmLimit;
  return type === "guaranteed_throughput" && limit !== null ? Number(limit) : undefined;
}

/** What the guaranteed keys that may call `group` have reserved out of its capacity. */
export function reservedOn(
  keys: Iterable<KeyRow>,
  owners: KeyOwners,
  group: string,
  kind: ThroughputKind,
  reach: ModelReach,
  exceptToken?: string,
  now = Date.now(),
): number {
  let sum = 0;
  for (const k of keys) {
    if (k.token === exceptToken || !reserves(k, now)) continue;
    const g = guaranteedLimit(k, kind);
    if (g === undefined) continue;
    if (keyMayCallGroup(k, owners, group, reach)) sum += g;
  }
  return sum;
}

/** When the first guaranteed key that reserves now will expire (Infinity: none will). */
export function firstGuaranteedExpiry(keys: Iterable<KeyRow>, now: number): number {
  let first = Number.POSITIVE_INFINITY;
  for (const k of keys) {
    if (k.expires === null || !reserves(k, now)) continue;
    if (guaranteedLimit(k, "rpm") === undefined && guaranteedLimit(k, "tpm") === undefined) continue;
    first = Math.min(first, k.expires.getTime());
  }
  return first;
}

export const isGuaranteed = (key: PlannedKey): boolean => key.rpmLimitType === "guaranteed_throughput" || key.tpmLimitType === "guaranteed_throughput";

/**
 * Why a guaranteed key does not fit, or undefined: the guaranteed limits of every key that may call
 * a group (this one included) must fit in the group's capacity, and in the key's team's limit.
 */
export function guaranteedOverflow(key: PlannedKey, reach: ModelReach, keys: Iterable<KeyRow>, owners: KeyOwners): string | undefined {
  const team = key.teamId ? owners.teams.get(key.teamId) : undefined;
  const now = Date.now();
  const all = [...keys].filter((k) => reserves(k, now));
  for (const kind of ["rpm", "tpm"] as const) {
    const mine = guaranteedLimit(key, kind);
    if (mine === undefined) continue;
    const field = `${kind}_limit`;
    for (const [group, deployments] of reach.models.serving()) {
      const capacity = groupCapacity(deployments)[kind];
      if (capacity === undefined || !keyMayCallGroup(key, owners, group, reach)) continue;
      const reserved = reservedOn(all, owners, group, kind, reach, key.token, now);
      if (reserved + mine > capacity) {
        return `guaranteed_throughput: model ${group} serves ${capacity} ${kind} (the sum of its deployments' ${kind}); other keys already reserve ${reserved}, so this key's ${field} ${mine} does not fit (at most ${Math.max(0, capacity - reserved)}).`;
      }
    }
    const teamLimit = team ? (kind === "rpm" ? team.rpmLimit : team.tpmLimit) : null;
    if (team && teamLimit !== null) {
      const inTeam = all.filter((k) => k.teamId === team.teamId);
      const reserved = inTeam.reduce((sum, k) => sum + (k.token === key.token ? 0 : (guaranteedLimit(k, kind) ?? 0)), 0);
      if (reserved + mine > Number(teamLimit)) {
        return `guaranteed_throughput: team ${team.teamId} has ${field} ${teamLimit}; its other keys already reserve ${reserved}, so this key's ${field} ${mine} does not fit.`;
      }
    }
  }
  return undefined;
}

/**
 * Why a write to something other than a key (a team's models or limits, a deployment) would
 * overbook: the first guaranteed key `affected` by it that no longer fits beside the others once
 * the model table (`reach`) and the `owners` are as the write leaves them, worded as its own write
 * would be refused.
 */
export function overflowAfter(affected: (key: KeyRow) => boolean, reach: ModelReach, keys: Iterable<KeyRow>, owners: KeyOwners): string | undefined {
  const now = Date.now();
  const all = [...keys].filter((k) => reserves(k, now));
  for (const key of all) {
    if (!isGuaranteed(key) || !affected(key)) continue;
    const problem = guaranteedOverflow(key, reach, all, owners);
    if (problem) return `Key ${key.keyAlias ?? key.keyName}: ${problem}`;
  }
  return undefined;
}
