/**
 * Which model groups to try when a group fails: general fallbacks for any failure, context-window
 * fallbacks when the prompt was too long for the model, content-policy fallbacks when the
 * provider's filter refused it. A specific list wins; without one, the general list applies.
 * Each list is read from the most specific settings that have one for the group: the request,
 * the key's `router_settings`, the team's, the config's. A group is looked up by the name it was
 * called by first (an alias, as the client knows it), then by the group that name resolved to.
 */
import type { GatewayConfig } from "../config/schema.ts";
import type { Principal } from "../contract.ts";

export type FallbackType = "general" | "context_window" | "content_policy";

const SETTING: Record<FallbackType, "fallbacks" | "context_window_fallbacks" | "content_policy_fallbacks"> = {
  general: "fallbacks",
  context_window: "context_window_fallbacks",
  content_policy: "content_policy_fallbacks",
};

type Settings = Record<string, unknown> | null | undefined;

/** The router_settings a caller's calls use, most specific first: its key's, its team's, the config's. */
export function settingsOf(config: GatewayConfig, principal: Principal | undefined): Settings[] {
  return [principal?.key?.routerSettings as Settings, principal?.team?.routerSettings as Settings, config.router_settings as Settings];
}

/**
 * `<settings>.<type>: [{group: [fallback, …]}, …]` → the fallbacks of a group known by `names`,
 * from the first settings that list one of them (in them, the first name listed).
 */
function configuredFallbacks(sources: readonly Settings[], type: FallbackType, names: readonly string[]): string[] {
  for (const settings of sources) {
    const list = settings?.[SETTING[type]];
    if (!Array.isArray(list)) continue;
    for (const name of names) {
      for (const item of list) {
        const to = item && typeof item === "object" ? (item as Record<string, unknown>)[name] : undefined;
        if (Array.isArray(to)) return to.filter((x): x is string => typeof x === "string");
      }
    }
  }
  return [];
}

/** The value `dict` keeps under the first of `names` it has. */
function firstListed(dict: unknown, names: readonly string[]): unknown {
  if (!dict || typeof dict !== "object") return undefined;
  const found = names.find((name) => Object.hasOwn(dict, name));
  return found === undefined ? undefined : (dict as Record<string, unknown>)[found];
}

function stringsOf(v: unknown): string[] {
  if (!Array.isArray(v)) return [];
  const out: string[] = [];
  for (const item of v) {
    if (typeof item === "string") out.push(item);
    // The request may also use the config form: [{group: [fallback, …]}].
    else if (item && typeof item === "object") for (const to of Object.values(item)) out.push(...stringsOf(to));
  }
  return out;
}

/**
 * The fallbacks of a failed group for a failure of `type` of a call by `principal`: the request's
 * first, then the key's, the team's, the config's. `names`: the name the group was called by,
 * then the group it resolved to.
 */
export function fallbacksFor(config: GatewayConfig, body: Record<string, unknown>, names: readonly string[], type: FallbackType, principal?: Principal): string[] {
  const sources = settingsOf(config, principal);
  if (type === "context_window") {
    const target = firstListed(body.context_window_fallback_dict, names);
    if (typeof target === "string") return [target];
    const configured = configuredFallbacks(sources, "context_window", names);
    if (configured.length > 0) return configured;
  }
  if (type === "content_policy") {
    const configured = configuredFallbacks(sources, "content_policy", names);
    if (configured.length > 0) return configured;
  }
  const fromRequest = stringsOf(body.fallbacks);
  if (fromRequest.length > 0) return fromRequest;
  const configured = configuredFallbacks(sources, "general", names);
  if (configured.length > 0) return configured;
  for (const settings of sources) if (Array.isArray(settings?.default_fallbacks)) return stringsOf(settings.default_fallbacks);
  return [];
}
