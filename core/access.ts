/**
 * Model and route access for a principal: every level (key, team, org, user) must allow the model;
 * a list may name models, wildcards (`openai/*`), access groups, or everything (`*`,
 * `all-proxy-models`). An empty list does not restrict its level.
 */
import type { AccessLevel, AccessLevelName, AccessRules, Principal } from "./contract.ts";
import { GatewayError } from "./errors.ts";

/** Access groups by name (config `model_info.access_groups` and stored groups) and by stored id. */
export interface AccessGroupLookup {
  byName(name: string): readonly string[] | undefined;
  byId(id: string): readonly string[] | undefined;
}

const EVERYTHING = new Set(["*", "all-proxy-models"]);
/** Names that mean "inherit the next level" rather than restrict. */
const INHERIT = new Set(["all-team-models"]);

function matchesEntry(entry: string, model: string): boolean {
  if (entry === model || EVERYTHING.has(entry)) return true;
  return entry.endsWith("*") && model.startsWith(entry.slice(0, -1));
}

function levelAllows(level: AccessLevel, model: string, groups: AccessGroupLookup): boolean {
  const entries = level.models.filter((m) => !INHERIT.has(m));
  if (entries.length === 0 && level.accessGroupIds.length === 0) return true;
  for (const entry of entries) {
    if (matchesEntry(entry, model)) return true;
    const group = groups.byName(entry);
    if (group?.some((m) => matchesEntry(m, model))) return true;
  }
  for (const id of level.accessGroupIds) if (groups.byId(id)?.some((m) => matchesEntry(m, model))) return true;
  return false;
}

const DENIAL_TYPE: Record<AccessLevelName, string> = {
  key: "key_model_access_denied",
  team: "team_model_access_denied",
  org: "org_model_access_denied",
  user: "user_model_access_denied",
};

/** The model group to call for `requested` (after aliases), or a 401 naming the level that denied it. */
export function authorizeModel(principal: Principal, requested: string, groups: AccessGroupLookup): string {
  const rules = principal.access;
  if (!rules) return requested;
  const target = rules.aliases[requested] ?? requested;
  for (const level of rules.levels) {
    if (levelAllows(level, target, groups) || (target !== requested && levelAllows(level, requested, groups))) continue;
    const allowed = [...level.models, ...level.accessGroupIds.map((id) => `access_group:${id}`)];
    throw GatewayError.of(
      401,
      `${level.level} not allowed to access model. This ${level.level} can only access models=${JSON.stringify(allowed)}. Tried to access ${requested}`,
      DENIAL_TYPE[level.level],
      "model",
    );
  }
  return target;
}

/** Whether the principal may use `model` (for listing models). */
export function mayUseModel(rules: AccessRules | undefined, model: string, groups: AccessGroupLookup): boolean {
  if (!rules) return true;
  const target = rules.aliases[model] ?? model;
  return rules.levels.every((l) => levelAllows(l, target, groups) || levelAllows(l, model, groups));
}

function routeMatches(pattern: string, path: string): boolean {
  if (pattern.endsWith("/*")) return path === pattern.slice(0, -2) || path.startsWith(pattern.slice(0, -1));
  return pattern === path;
}

/** `allowed_routes` on a key: exact paths or `prefix/*`; empty allows every route. */
export function authorizeRoute(principal: Principal, path: string): void {
  const routes = principal.access?.allowedRoutes;
  if (!routes || routes.length === 0 || routes.some((r) => routeMatches(r, path))) return;
  throw GatewayError.of(403, `This key may not call ${path}. Allowed routes: ${routes.join(", ")}`, "permission_error");
}
