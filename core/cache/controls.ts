/**
 * Whether and how one request uses the response cache: on when the request says `caching: true`
 * or the config turns the cache on (`svc_settings.cache`, `cache_params.mode: default_off` makes
 * it opt-in); per-request controls in `cache: {...}` — `no-cache` (do not read), `no-store` (do not
 * write), `ttl` (seconds to keep this answer), `s-maxage` (accept only answers younger than this),
 * `namespace` — each allowed only when the key's `allowed_cache_controls` is empty or lists it.
 */
import type { Endpoint, Principal } from "../contract.ts";
import { GatewayError } from "../errors.ts";

export interface CacheSettings {
  enabled: boolean;
  /** `default_off`: only requests with `caching: true` use the cache. */
  defaultOn: boolean;
  ttlMs: number;
  namespace: string | undefined;
}

export interface CacheUse {
  read: boolean;
  write: boolean;
  ttlMs: number;
  maxAgeMs: number | undefined;
  namespace: string | undefined;
}

const CONTROLS = ["no-cache", "no-store", "ttl", "s-maxage", "namespace"] as const;

/**
 * What the cache can hold: answers that are text and whose request is all in its JSON body. An
 * uploaded file is not part of the key (transcriptions), and speech answers are audio.
 */
const CACHEABLE: ReadonlySet<Endpoint> = new Set<Endpoint>(["chat", "completions", "embeddings", "images", "moderations"]);

/** How this request uses the cache, or undefined when it does not. */
export function cacheUse(settings: CacheSettings, endpoint: Endpoint, body: Record<string, unknown>, principal: Principal): CacheUse | undefined {
  if (!CACHEABLE.has(endpoint)) return undefined;
  const asked = body.caching === true;
  if (!asked && !(settings.enabled && settings.defaultOn)) return undefined;
  if (body.caching === false) return undefined;
  const raw = body.cache;
  const controls = raw && typeof raw === "object" && !Array.isArray(raw) ? (raw as Record<string, unknown>) : {};
  const allowed = principal.key?.allowedCacheControls ?? [];
  for (const name of Object.keys(controls)) {
    if (!(CONTROLS as readonly string[]).includes(name)) throw GatewayError.of(400, `Unknown cache control '${name}'. Known: ${CONTROLS.join(", ")}.`, "invalid_request_error", "cache");
    if (allowed.length > 0 && !allowed.includes(name)) {
      throw GatewayError.of(403, `Not allowed to set '${name}' as a cache control: this key allows only ${allowed.join(", ")}. Ask an admin to change allowed_cache_controls.`, "permission_error", "cache");
    }
  }
  const seconds = (v: unknown, name: string): number | undefined => {
    if (v === undefined) return undefined;
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw GatewayError.of(400, `cache.${name} must be a number of seconds >= 0`, "invalid_request_error", "cache");
    return v * 1000;
  };
  const ns = controls.namespace;
  if (ns !== undefined && typeof ns !== "string") throw GatewayError.of(400, "cache.namespace must be a string", "invalid_request_error", "cache");
  return {
    read: controls["no-cache"] !== true,
    write: controls["no-store"] !== true,
    ttlMs: seconds(controls.ttl, "ttl") ?? settings.ttlMs,
    maxAgeMs: seconds(controls["s-maxage"], "s-maxage"),
    namespace: ns ?? settings.namespace,
  };
}
