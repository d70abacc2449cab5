/**
 * Model discovery: `/models`, `/models/{id}` and `/model/info`. Every answer is cut to what the
 * caller may use (the same rules as a model call), and upstream addresses and credentials are never
 * shown.
 */
import { Elysia } from "elysia";
import { mayUseModel, unrestricted } from "../../access.ts";
import { Caller, forbidden, notFound } from "../../authz.ts";
import type { AccessLevel, AccessLevelName, AccessRules, Deployment, Principal } from "../../contract.ts";
import type { ModelEntry } from "../../config/schema.ts";
import { GatewayError } from "../../errors.ts";
import type { IdentityCache } from "../../identity/cache.ts";
import { isCredentialParam } from "../../secrets.ts";
import type { Snapshot } from "../../snapshot.ts";
import type { AppDeps } from "../app.ts";
import { authenticate } from "../auth.ts";
import { decodePathParam, queryFlag } from "../validate.ts";
import { type FallbackType, fallbacksFor } from "../../router/fallbacks.ts";

/** svc_params fields that say where the upstream is (credentials are `isCredentialParam`). */
const ADDRESS_PARAM = /^(api_base|base_url|headers|extra_headers)$|(^|_)(url|endpoint)$/i;

/** Credentials and the upstream's address; a numeric field such as `input_cost_per_token` is shown. */
function hidden(key: string, value: unknown): boolean {
  return ADDRESS_PARAM.test(key) || isCredentialParam(key, value);
}

function publicParams(params: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(params)) {
    if (hidden(k, v)) continue;
    out[k] = v !== null && typeof v === "object" && !Array.isArray(v) ? publicParams(v as Record<string, unknown>) : v;
  }
  return out;
}

function modelObject(id: string, created: number, ownedBy: string) {
  return { id, object: "model", created, owned_by: ownedBy };
}

function modelInfo(entry: ModelEntry, d: Deployment) {
  return {
    model_name: entry.model_name,
    svc_params: publicParams(entry.svc_params),
    model_info: { ...entry.model_info, id: d.id, db_model: (entry.model_info as Record<string, unknown> | undefined)?.db_model === true },
  };
}

const FALLBACK_TYPES: readonly FallbackType[] = ["general", "context_window", "content_policy"];

/**
 * Access groups a caller holds: those its levels name (in `models` or `access_group_ids`); every
 * group (config `model_info.access_groups` and stored) when no level restricts it.
 */
function heldAccessGroups(s: Snapshot, rules: AccessRules | undefined, identity: IdentityCache | undefined): string[] {
  const names = new Set<string>();
  const restricted = rules?.levels.filter((l) => !unrestricted(l)) ?? [];
  if (restricted.length === 0) {
    for (const { entry } of s.models.entries) for (const g of entry.model_info?.access_groups ?? []) names.add(g);
    for (const g of identity?.accessGroups.values() ?? []) names.add(g.accessGroupName);
    return [...names];
  }
  for (const level of restricted) {
    for (const m of level.models) if (s.accessGroups.byName(m)) names.add(m);
    for (const id of level.accessGroupIds) {
      const name = identity?.accessGroups.get(id)?.accessGroupName;
      if (name) names.add(name);
    }
  }
  return [...names];
}

/** Access rules of a team as such (for `?team_id=`): its own list and its org's, with their aliases. */
function teamRules(identity: IdentityCache, teamId: string): AccessRules | undefined {
  const team = identity.teams.get(teamId);
  if (!team) return undefined;
  const levels: AccessLevel[] = [{ level: "team", models: team.models, accessGroupIds: team.accessGroupIds }];
  const aliases: Record<string, string> = {};
  const aliasSources: Record<string, AccessLevelName> = {};
  const org = team.organizationId ? identity.orgs.get(team.organizationId) : undefined;
  const addAliases = (from: AccessLevelName, map: Record<string, unknown>) => {
    for (const [k, v] of Object.entries(map)) {
      if (typeof v !== "string") continue;
      aliases[k] = v;
      aliasSources[k] = from;
    }
  };
  if (org) {
    levels.push({ level: "org", models: org.models, accessGroupIds: [] });
    addAliases("org", org.modelAliases);
  }
  addAliases("team", team.modelAliases);
  return { levels, aliases, aliasSources, allowedRoutes: [], allowedPassthroughRoutes: [] };
}

/** Proxy admins (and viewers), team admins and org admins: who `scope=expand` widens to every model. */
function mayExpand(caller: Caller): boolean {
  return caller.canReadAll || caller.adminTeams().length > 0 || caller.adminOrgs().length > 0;
}

/** The rules `/models` lists by: the caller's own, a team's (`team_id`), or none (`scope=expand`). */
function listingRules(principal: Principal, url: URL, identity: IdentityCache | undefined): AccessRules | undefined {
  const caller = new Caller(principal, identity, "");
  const scope = url.searchParams.get("scope");
  if (scope !== null && scope !== "expand") {
    throw GatewayError.of(400, `Invalid scope '${scope}': the only accepted value is 'expand'.`, "invalid_request_error", "scope");
  }
  const teamId = url.searchParams.get("team_id");
  if (teamId) {
    const member = caller.teamRole(teamId) !== undefined || principal.teamId === teamId;
    // Outside the team it is a 403 whether or not the team exists.
    if (!caller.canReadAll && !member) throw forbidden(`You are not a member of team '${teamId}', so you may not list its models.`);
    const rules = identity ? teamRules(identity, teamId) : undefined;
    if (!rules) throw notFound(`Team '${teamId}' does not exist.`, "team_id");
    return rules;
  }
  if (scope === "expand" && mayExpand(caller)) return undefined;
  return principal.access;
}

/** Concrete model names named in the rules (levels, their groups, aliases) that the table can serve. */
function namedModels(s: Snapshot, rules: AccessRules): string[] {
  const names = new Set<string>();
  const add = (m: string) => {
    if (!m.includes("*") && s.models.resolve(m)) names.add(m);
  };
  for (const level of rules.levels) {
    for (const m of level.models) {
      add(m);
      for (const g of s.accessGroups.byName(m) ?? []) add(g);
    }
    for (const id of level.accessGroupIds) for (const g of s.accessGroups.byId(id) ?? []) add(g);
  }
  return [...names];
}

/** The model group a call to `name` goes to (through the caller's and the operator's aliases). */
function groupOf(s: Snapshot, rules: AccessRules | undefined, name: string): string {
  const target = rules?.aliases[name] ?? name;
  return s.groupAliases.get(target)?.group ?? target;
}

/**
 * Ids of the deployments the caller's calls may reach, as a call is checked: by any name it may use
 * that routes there (a group, the caller's or the operator's alias, or a name its rules grant that a
 * wildcard entry such as `mock-*` serves), not only by the entry's own `model_name`.
 */
function reachableDeployments(s: Snapshot, rules: AccessRules): Set<string> {
  const ids = new Set<string>();
  const names = new Set([...s.models.groups.keys(), ...s.groupAliases.keys(), ...namedModels(s, rules), ...Object.keys(rules.aliases)]);
  for (const name of names) {
    if (!mayUseModel(rules, name, s.accessGroups, s.groupAliases)) continue;
    for (const d of s.models.resolve(groupOf(s, rules, name)) ?? []) ids.add(d.id);
  }
  return ids;
}

function ownerOf(s: Snapshot, rules: AccessRules | undefined, name: string): string | undefined {
  return s.models.resolve(groupOf(s, rules, name))?.[0]?.provider;
}

function listModels(s: Snapshot, url: URL, rules: AccessRules | undefined, identity: IdentityCache | undefined, principal: Principal) {
  const fallbackParam = url.searchParams.get("fallback_type");
  if (fallbackParam !== null && !(FALLBACK_TYPES as readonly string[]).includes(fallbackParam)) {
    throw GatewayError.of(400, `Invalid fallback_type '${fallbackParam}': use one of ${FALLBACK_TYPES.join(", ")}.`, "invalid_request_error", "fallback_type");
  }
  const may = (name: string) => mayUseModel(rules, name, s.accessGroups, s.groupAliases);
  const models = new Map<string, string>();
  const add = (name: string) => {
    const owner = ownerOf(s, rules, name);
    if (owner && !models.has(name) && may(name)) models.set(name, owner);
  };
  if (!queryFlag(url, "only_model_access_groups", false)) {
    for (const name of s.models.groups.keys()) add(name);
    for (const [alias, { hidden }] of s.groupAliases) if (!hidden) add(alias);
    if (queryFlag(url, "return_wildcard_routes", false)) {
      for (const w of s.models.wildcards) if (may(w.pattern)) models.set(w.pattern, w.deployments[0]!.provider);
    }
    if (rules) {
      for (const name of namedModels(s, rules)) add(name);
      for (const alias of Object.keys(rules.aliases)) add(alias);
    }
  }
  const data: ({ id: string; object: string; created: number; owned_by: string } & { metadata?: { fallbacks: string[] } })[] = [];
  const withMetadata = queryFlag(url, "include_metadata", false);
  const fallbackType = (fallbackParam ?? "general") as FallbackType;
  for (const [id, owner] of models) {
    const m = modelObject(id, s.loadedAt, owner);
    // The fallbacks a failure of that type would really go to for the caller (absent request overrides; its key's and team's router_settings first): a type with no list of its own uses the general one, then default_fallbacks.
    // Looked up as routing does (the name called, then its group), less those the caller may not use, which routing skips.
    data.push(withMetadata ? { ...m, metadata: { fallbacks: fallbacksFor(s.config, {}, [id, groupOf(s, rules, id)], fallbackType, principal).filter(may) } } : m);
  }
  if (queryFlag(url, "include_model_access_groups", false) || queryFlag(url, "only_model_access_groups", false)) {
    // A held group is listed when the caller may use every model in it (no level above forbids part).
    for (const group of heldAccessGroups(s, rules, identity)) {
      const members = s.accessGroups.byName(group) ?? [];
      if (members.length > 0 && members.every(may) && !models.has(group)) data.push(modelObject(group, s.loadedAt, "access_group"));
    }
  }
  return { object: "list", data };
}

/** Proxy admins and admin viewers see every deployment in `/model/info`; others what they may use. */
function seesAll(principal: Principal): boolean {
  return principal.access === undefined || principal.role === "proxy_admin" || principal.role === "proxy_admin_viewer";
}

export function modelRoutes({ live, services }: AppDeps) {
  const guard = async (request: Request) => {
    const s = live.current;
    const principal = await authenticate(s, request.headers, new URL(request.url).pathname, request.method);
    return { s, principal };
  };
  const list = async ({ request }: { request: Request }) => {
    const { s, principal } = await guard(request);
    const url = new URL(request.url);
    return listModels(s, url, listingRules(principal, url, services.identity), services.identity, principal);
  };
  const one = async ({ request, params }: { request: Request; params: Record<string, string> }) => {
    const { s, principal } = await guard(request);
    const id = decodePathParam(params["*"] ?? "", "model");
    const owner = ownerOf(s, principal.access, id);
    if (!owner || !mayUseModel(principal.access, id, s.accessGroups, s.groupAliases)) {
      throw GatewayError.of(404, `Model '${id}' does not exist or is not available to this key. Call /v1/models to list models.`, "not_found_error", "model");
    }
    return modelObject(id, s.loadedAt, owner);
  };
  const info = async ({ request }: { request: Request }) => {
    const { s, principal } = await guard(request);
    const rules = principal.access;
    const reachable = seesAll(principal) || !rules ? undefined : reachableDeployments(s, rules);
    const visible = (e: { entry: ModelEntry; deployment: Deployment }) =>
      !reachable || reachable.has(e.deployment.id) || mayUseModel(rules, e.entry.model_name, s.accessGroups, s.groupAliases);
    const id = new URL(request.url).searchParams.get("svc_model_id");
    if (id) {
      const found = s.models.findById(id);
      if (!found || !visible(found)) throw GatewayError.of(404, `No model deployment with id '${id}'.`, "not_found_error", "svc_model_id");
      return { data: [modelInfo(found.entry, found.deployment)] };
    }
    return { data: s.models.entries.filter(visible).map((e) => modelInfo(e.entry, e.deployment)) };
  };
  return new Elysia()
    .get("/models", list)
    .get("/v1/models", list)
    .get("/models/*", one)
    .get("/v1/models/*", one)
    .get("/model/info", info)
    .get("/v1/model/info", info);
}
