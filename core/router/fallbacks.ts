/**
 * Which model groups to try when a group fails: general fallbacks for any failure, context-window
 * fallbacks when the prompt was too long for the model, content-policy fallbacks when the
 * provider's filter refused it. A specific list wins; without one, the general list applies.
 */
import type { GatewayConfig } from "../config/schema.ts";

export type FallbackType = "general" | "context_window" | "content_policy";

const SETTING: Record<FallbackType, "fallbacks" | "context_window_fallbacks" | "content_policy_fallbacks"> = {
  general: "fallbacks",
  context_window: "context_window_fallbacks",
  content_policy: "content_policy_fallbacks",
};

/** `router_settings.<type>: [{group: [fallback, …]}, …]` → the fallbacks of `group`. */
function configuredFallbacks(config: GatewayConfig, type: FallbackType, group: string): string[] {
  const list = config.router_settings?.[SETTING[type]];
  for (const item of list ?? []) {
    const to = item[group];
    if (Array.isArray(to)) return to.filter((x): x is string => typeof x === "string");
  }
  return [];
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

/** The fallbacks of `group` for a failure of `type`, request settings first. */
export function fallbacksFor(config: GatewayConfig, body: Record<string, unknown>, group: string, type: FallbackType): string[] {
  if (type === "context_window") {
    const dict = body.context_window_fallback_dict;
    const target = dict && typeof dict === "object" ? (dict as Record<string, unknown>)[group] : undefined;
    if (typeof target === "string") return [target];
    const configured = configuredFallbacks(config, "context_window", group);
    if (configured.length > 0) return configured;
  }
  if (type === "content_policy") {
    const configured = configuredFallbacks(config, "content_policy", group);
    if (configured.length > 0) return configured;
  }
  const fromRequest = stringsOf(body.fallbacks);
  if (fromRequest.length > 0) return fromRequest;
  const configured = configuredFallbacks(config, "general", group);
  if (configured.length > 0) return configured;
  return config.router_settings?.default_fallbacks ?? [];
}
