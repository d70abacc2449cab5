/**
 * Model and route access for a principal: every level (key, team or user, org) must allow the
 * model; a list may name models, wildcards (`openai/*`), access groups, or everything (`*`,
 * `all-proxy-models`). An empty list does not restrict its level (a key with no models inherits its
 * team's, a team with none may use every model); `all-team-models` on a key means the same.
 */
import type { AccessLevel, AccessLevelName, AccessRules, KeyRow, OrgRow, Principal, TeamRow, UserRow } from "./contract.ts";
import { GatewayError } from "./errors.ts";

/** Access groups by name (config `model_info.access_groups` and stored groups) and by stored id. */
export interface AccessGroupLookup {
  byName(name: string): readonly string[] | undefined;
  byId(id: string): readonly string[] | undefined;
}

/** No access groups at all (a call no model group's capacity applies to). */
export const NO_ACCESS_GROUPS: AccessGroupLookup = { byName: () => undefined, byId: () => undefined };

/**
 * `router_settings.model_group_alias`: a public name → the model group it calls (one step; an
 * alias wins over a group of its name, as in LiteLLM). `hidden` ones are callable, not listed.
 */
export type GroupAliases = ReadonlyMap<string, { readonly group: string; readonly hidden: boolean }>;

/** Model-list entries that grant every model. */
export const EVERYTHING: ReadonlySet<string> = new Set(["*", "all-proxy-models"]);
/** Names that mean "inherit the next level" rather than restrict. */
export const INHERIT: ReadonlySet<string> = new Set(["all-team-models"]);

/** `entry` names `model` exactly, is a catch-all, or is a pattern with one `*` (`openai/*`, `claude-*-latest`). */
export function matchesEntry(entry: string, model: string): boolean {
  if (entry === model || EVERYTHING.has(entry)) return true;
  const star = entry.indexOf("*");
  if (star < 0) return false;
  const prefix = entry.slice(0, star);
  const suffix = entry.slice(star + 1);
  return model.length >= prefix.length + suffix.length && model.startsWith(prefix) && model.endsWith(suffix);
}

/**
 * The levels whose lists bind a key's model calls: its own, its team's (a personal key: its user's),
 * and its organizations' (the key's own and its team's).
 */
export function keyAccessLevels(
  key: Pick<KeyRow, "models" | "accessGroupIds">,
  team: Pick<TeamRow, "models" | "accessGroupIds"> | undefined,
  user: Pick<UserRow, "models"> | undefined,
  orgs: readonly Pick<OrgRow, "models">[],
): AccessLevel[] {
  const levels: AccessLevel[] = [{ level: "key", models: key.models, accessGroupIds: key.accessGroupIds }];
  if (team) levels.push({ level: "team", models: team.models, accessGroupIds: team.accessGroupIds });
  else if (user) levels.push({ level: "user", models: user.models, accessGroupIds: [] });
  for (const org of orgs) levels.push({ level: "org", models: org.models, accessGroupIds: [] });
  return levels;
}

/** Whether `level` restricts nothing. */
export function unrestricted(level: AccessLevel): boolean {
  if (level.models.some((m) => INHERIT.has(m))) return true;
  return level.models.length === 0 && level.accessGroupIds.length === 0;
}

/** Whether one level's list lets it use `model` (names, wildcards, access groups, catch-alls; an empty list restricts nothing). */
export function levelAllows(level: AccessLevel, model: string, groups: AccessGroupLookup): boolean {
  if (unrestricted(level)) return true;
  for (const entry of level.models) {
    if (matchesEntry(entry, model)) return true;
    if (groups.byName(entry)?.some((m) => matchesEntry(m, model))) return true;
  }
  for (const id of level.accessGroupIds) if (groups.byId(id)?.some((m) => matchesEntry(m, model))) return true;
  return false;
}

/** The levels and aliases that judge a model call (an AccessRules without its routes). */
export type ModelRules = Pick<AccessRules, "levels" | "aliases" | "aliasSources">;

/** How far up an alias is trusted: an alias set on a level speaks for that level and those below it. */
const RANK: Record<AccessLevelName, number> = { key: 0, user: 1, team: 1, org: 2 };

/**
 * A level passes when it allows the model actually called, or when it allows the requested alias
 * and the alias was set at that level or above. So a key alias (set by a team admin) cannot reach a
 * model its team or org does not allow, while an org alias listed by name in a team's models works.
 */
function passes(level: AccessLevel, requested: string, target: string, aliasFrom: AccessLevelName | undefined, groups: AccessGroupLookup): boolean {
  if (levelAllows(level, target, groups)) return true;
  if (target === requested || aliasFrom === undefined) return false;
  return RANK[aliasFrom] >= RANK[level.level] && levelAllows(level, requested, groups);
}

function aliasOf(rules: ModelRules, requested: string): { target: string; from: AccessLevelName | undefined } {
  const target = rules.aliases[requested];
  if (target === undefined) return { target: requested, from: undefined };
  // Without a recorded source the alias is trusted only by the key level (the safe default).
  return { target, from: rules.aliasSources?.[requested] ?? "key" };
}

const DENIAL_TYPE: Record<AccessLevelName, string> = {
  key: "key_model_access_denied",
  team: "team_model_access_denied",
  org: "org_model_access_denied",
  user: "user_model_access_denied",
};

/** The names a level allows, for the denial message: its list, with its access groups' models. */
function allowedNames(level: AccessLevel, groups: AccessGroupLookup): string[] {
  const names = [...level.models];
  for (const id of level.accessGroupIds) names.push(...(groups.byId(id) ?? [`access_group:${id}`]));
  return [...new Set(names)];
}

/**
 * The model name a call for `requested` goes to, once allowed: the caller's alias of it, then the
 * config's `model_group_alias` of that.
 */
export function modelTarget(rules: ModelRules | undefined, requested: string, groupAliases: GroupAliases): string {
  const target = rules?.aliases[requested] ?? requested;
  return groupAliases.get(target)?.group ?? target;
}

/**
 * The model group to call for `requested` (after the caller's aliases, then the config's
 * `model_group_alias`), or a 401 naming the level that denied it.
 */
export function authorizeModel(principal: Principal, requested: string, groups: AccessGroupLookup, groupAliases: GroupAliases): string {
  const rules = principal.access;
  if (!rules) return modelTarget(undefined, requested, groupAliases);
  const { target, from } = aliasOf(rules, requested);
  const routed = groupAliases.get(target)?.group;
  for (const level of rules.levels) {
    if (passesRouted(level, requested, target, routed, from, groups)) continue;
    // The model refused is the alias's target: naming the alias alone said a model the level lists was refused.
    const tried = target === requested ? requested : `${target} (alias ${requested})`;
    throw GatewayError.of(
      401,
      `${level.level} not allowed to access model. This ${level.level} can only access models=${JSON.stringify(allowedNames(level, groups))}. Tried to access ${tried}`,
      DENIAL_TYPE[level.level],
      "model",
    );
  }
  return routed ?? target;
}

/** An operator's alias speaks for every level: a level that allows the group it calls allows it too. */
function passesRouted(level: AccessLevel, requested: string, target: string, routed: string | undefined, from: AccessLevelName | undefined, groups: AccessGroupLookup): boolean {
  return passes(level, requested, target, from, groups) || (routed !== undefined && levelAllows(level, routed, groups));
}

/** Whether the principal may use `model` (for listing models). */
export function mayUseModel(rules: ModelRules | undefined, model: string, groups: AccessGroupLookup, groupAliases: GroupAliases): boolean {
  if (!rules) return true;
  const { target, from } = aliasOf(rules, model);
  const routed = groupAliases.get(target)?.group;
  return rules.levels.every((l) => passesRouted(l, model, target, routed, from, groups));
}

/** A list as written on a key or a team: its model entries and its access group ids. */
export type ListedAccess = Pick<AccessLevel, "models" | "accessGroupIds">;

/** The levels above a list (a key's team, a team's organization) and the aliases its calls read. */
export type LevelsAbove = ModelRules;

/**
 * The entries of a list that the levels above it would never let a call use, judged as calls are
 * (mayUseModel: names, wildcards, access groups, aliases): an access group, named or by id, fits
 * when each of its models does (one deleted since grants nothing, so nothing of it is outside),
 * `*` only where no level above restricts, `all-team-models` always. So what may be written into
 * a key's or a team's list is what its calls may use.
 */
export function listedOutside(above: LevelsAbove, list: ListedAccess, groups: AccessGroupLookup, groupAliases: GroupAliases): { models: string[]; accessGroupIds: string[] } {
  const may = (model: string) => mayUseModel(above, model, groups, groupAliases);
  const fits = (entry: string): boolean => {
    if (INHERIT.has(entry)) return true;
    if (EVERYTHING.has(entry)) return above.levels.every((l) => unrestricted(l) || l.models.some((m) => EVERYTHING.has(m)));
    const members = groups.byName(entry);
    return members !== undefined && members.length > 0 ? members.every(may) : may(entry);
  };
  return { models: list.models.filter((e) => !fits(e)), accessGroupIds: list.accessGroupIds.filter((id) => !(groups.byId(id) ?? []).every(may)) };
}

/** String values of a stored alias map (anything else is ignored, as a call ignores it). */
function stringMap(v: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  if (v && typeof v === "object") for (const [k, x] of Object.entries(v)) if (typeof x === "string") out[k] = x;
  return out;
}

/** Aliases of a key (or, without one, a team), its team and its orgs, the most specific winning, with where each came from. */
export function accessAliases(
  key: Pick<KeyRow, "aliases"> | undefined,
  team: Pick<TeamRow, "modelAliases"> | undefined,
  orgs: readonly Pick<OrgRow, "modelAliases">[],
): Pick<AccessRules, "aliases" | "aliasSources"> {
  const aliases: Record<string, string> = {};
  const aliasSources: Record<string, AccessLevelName> = {};
  const add = (from: AccessLevelName, map: unknown) => {
    for (const [name, target] of Object.entries(stringMap(map))) {
      aliases[name] = target;
      aliasSources[name] = from;
    }
  };
  for (const org of orgs) add("org", org.modelAliases);
  add("team", team?.modelAliases);
  add("key", key?.aliases);
  return { aliases, aliasSources };
}

/**
 * Named route groups usable in `allowed_routes` (LiteLLM's names): model calls, everything else
 * (management), and the management API's reads (`info_routes`, below).
 */
const LLM_API_ROUTE = /^\/(v1\/)?(chat\/completions|completions|embeddings|images\/generations|audio\/transcriptions|audio\/speech|moderations|models(\/.*)?|model\/info)$|^\/(openai\/deployments|engines|v1beta\/models)\/|^\/utils\/(token_counter|supported_openai_params|transform_request)$/;

/**
 * LiteLLM's `info_routes`: the management API's reads (info, lists, spend, activity, audit), and
 * the reads of READ_ONLY_INFO. What a `key_type: read_only` key may call.
 */
const INFO_ROUTE =
  /^\/(key\/(info|list|aliases|health)|v2\/key\/info|team\/(info|list|available|permissions_list)|v2\/team\/list|user\/(info|list)|organization\/(info|list)|budget\/(info|list|settings)|(v1\/|v2\/)?model\/info|model_group\/info|access_group\/(list|[^/]+\/info)|spend\/(logs|logs\/v2|keys|users|tags)|global\/spend\/(report|tags)|(team|organization|user)\/daily\/activity|provider\/budgets|audit\/logs|health(\/[a-z]+)?)$/;

/**
 * Paths that are info routes for reads only: the model listings (`/v1/models`,
 * `/v1/models/{model_id}`, an id may hold `/`; a POST under them is a Gemini-style model call,
 * `/v1/models/gpt-4o:generateContent`) and `/v1/access_group/{id}` (its PUT and DELETE write).
 */
const READ_ONLY_INFO = /^\/(v1\/)?models(\/.+)?$|^\/v1\/access_group\/[^/]+$/;
const READ_METHODS: ReadonlySet<string> = new Set(["GET", "HEAD"]);

function isInfoRoute(path: string, method: string): boolean {
  return INFO_ROUTE.test(path) || (READ_METHODS.has(method) && READ_ONLY_INFO.test(path));
}

/**
 * The routes a key's `key_type` allows when it has no `allowed_routes` of its own (LiteLLM's):
 * `llm_api` model calls only, `management` the management API only, `read_only` its reads only.
 */
export function keyTypeRoutes(keyType: string): readonly string[] {
  return KEY_TYPE_ROUTES[keyType] ?? NO_ROUTES;
}
const KEY_TYPE_ROUTES: Readonly<Record<string, readonly string[]>> = { llm_api: ["llm_api_routes"], management: ["management_routes"], read_only: ["info_routes"] };
const NO_ROUTES: readonly string[] = [];

/** A model-call route is served with and without `/v1`, so a pattern naming either form matches both. */
function forms(path: string): string[] {
  if (!LLM_API_ROUTE.test(path)) return [path];
  return path.startsWith("/v1/") ? [path, path.slice(3)] : [path, `/v1${path}`];
}

/**
 * Whether `method` on `path` is one `pattern` of an allowed-routes list names (exact, `prefix/*`, or
 * a named group). A pass-through route is a model call to the groups (LiteLLM's `is_llm_api_route`):
 * it spends the operator's provider key, which is no part of the management API.
 */
export function routeMatches(pattern: string, requested: string, method: string, passThrough = false): boolean {
  // The app serves `/v1/chat/completions/` as `/v1/chat/completions`: it is judged as that route
  // (else a management key made model calls through the slash, and an llm_api key was refused).
  const path = requested.length > 1 && requested.endsWith("/") ? requested.replace(/\/+$/, "") || "/" : requested;
  if (pattern === "llm_api_routes") return passThrough || LLM_API_ROUTE.test(path);
  if (pattern === "management_routes") return !passThrough && !LLM_API_ROUTE.test(path);
  if (pattern === "info_routes") return !passThrough && isInfoRoute(path, method);
  const prefix = pattern.endsWith("/*") ? pattern.slice(0, -1) : undefined;
  return forms(path).some((p) => (prefix === undefined ? p === pattern : p === prefix.slice(0, -1) || p.startsWith(prefix)));
}

/**
 * `allowed_routes` on a key (exact paths, `prefix/*`, or a named group), else its `key_type`'s;
 * none allows every route.
 */
export function authorizeRoute(principal: Principal, path: string, method: string, passThrough = false): void {
  const access = principal.access;
  const routes = access && access.allowedRoutes.length > 0 ? access.allowedRoutes : access?.keyTypeRoutes;
  if (!routes || routes.length === 0 || routes.some((r) => routeMatches(r, path, method, passThrough))) return;
  throw GatewayError.of(403, `This key may not call ${path}. Allowed routes: ${routes.join(", ")}`, "permission_error");
}

/**
 * A pass-through route must be in both levels' lists (an empty one allows every route): the key's
 * (its own `allowed_routes`, which authorizeRoute already applied, else its `allowed_passthrough_routes`,
 * within what its `key_type` allows)
 * and its team's `allowed_passthrough_routes`, whatever the key's lists say: a team's admin sets
 * those, and must not reach past what a proxy admin let the team call.
 */
export function authorizePassThrough(principal: Principal, path: string, method: string): void {
  const access = principal.access;
  if (!access) return;
  if (access.allowedRoutes.length === 0) refuseOutside(access.allowedPassthroughRoutes, path, method, "This key may not call");
  if (principal.team) refuseOutside(principal.team.allowedPassthroughRoutes, path, method, `The keys of team ${principal.team.teamId} may not call`);
}

function refuseOutside(routes: readonly string[], path: string, method: string, who: string): void {
  if (routes.length === 0 || routes.some((r) => routeMatches(r, path, method, true))) return;
  throw GatewayError.of(403, `${who} the pass-through route ${path}. Allowed pass-through routes: ${routes.join(", ")}`, "permission_error");
}
