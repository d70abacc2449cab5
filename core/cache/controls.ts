/**
 * Whether and how one request uses the response cache: on when the request says `caching: true`
 * or the config turns the cache on (`svc_settings.cache`, `cache_params.mode: default_off` makes
 * it opt-in); per-request controls in `cache: {...}` — `no-cache` (do not read), `no-store` (do not
 * write), `ttl` (seconds to keep this answer), `s-maxage` (accept only answers younger than this),
 * `namespace` — each allowed only when the key's `allowed_cache_controls` is empty or lists it. A
 * malformed control is a 400 naming it, also when the cache is not used for the request.
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
 * What the cache can hold, as README says and LiteLLM does: chat, completions and embeddings. An
 * uploaded file is not part of the key (transcriptions), speech answers are audio, and an image
 * generation replayed would hand one caller's image to another for nothing.
 */
const CACHEABLE: ReadonlySet<Endpoint> = new Set<Endpoint>(["chat", "completions", "embeddings"]);

/** A value as the client sent it, for an error message. */
function shown(v: unknown): string {
  const text = JSON.stringify(v) ?? String(v);
  return text.length > 60 ? `${text.slice(0, 60)}…` : text;
}

function invalid(field: string, must: string, got: unknown): GatewayError {
  return GatewayError.of(400, `Invalid cache control: ${field} must be ${must}, got ${shown(got)}.`, "invalid_request_error", field);
}

/** A control's value, absent when unset (missing or null). */
const given = (controls: Record<string, unknown>, name: string): unknown => (controls[name] === null ? undefined : controls[name]);

function flag(controls: Record<string, unknown>, name: "no-cache" | "no-store"): boolean {
  const v = given(controls, name);
  if (v !== undefined && typeof v !== "boolean") throw invalid(`cache.${name}`, "true or false", v);
  return v === true;
}

function seconds(controls: Record<string, unknown>, name: "ttl" | "s-maxage"): number | undefined {
  const v = given(controls, name);
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw invalid(`cache.${name}`, "a number of seconds >= 0", v);
  return v * 1000;
}

interface Controls {
  names: string[];
  noCache: boolean;
  noStore: boolean;
  ttlMs: number | undefined;
  maxAgeMs: number | undefined;
  namespace: string | undefined;
}

const NONE: Controls = { names: [], noCache: false, noStore: false, ttlMs: undefined, maxAgeMs: undefined, namespace: undefined };

/**
 * The request's `cache` controls, checked whether or not the cache is used for it: a malformed one
 * (not an object, an unknown name, a value of the wrong type) is a 400 naming the field, never
 * ignored.
 */
function readControls(raw: unknown): Controls {
  if (raw === undefined || raw === null) return NONE;
  if (typeof raw !== "object" || Array.isArray(raw)) throw invalid("cache", `an object of cache controls (${CONTROLS.join(", ")})`, raw);
  const controls = raw as Record<string, unknown>;
  const names = Object.keys(controls);
  for (const name of names) {
    if (!(CONTROLS as readonly string[]).includes(name)) throw GatewayError.of(400, `Unknown cache control '${name}'. Known: ${CONTROLS.join(", ")}.`, "invalid_request_error", "cache");
  }
  const ns = given(controls, "namespace");
  if (ns !== undefined && typeof ns !== "string") throw invalid("cache.namespace", "a string", ns);
  return {
    names: names.filter((n) => controls[n] !== null),
    noCache: flag(controls, "no-cache"),
    noStore: flag(controls, "no-store"),
    ttlMs: seconds(controls, "ttl"),
    maxAgeMs: seconds(controls, "s-maxage"),
    namespace: ns,
  };
}

/** How this request uses the cache, or undefined when it does not. */
export function cacheUse(settings: CacheSettings, endpoint: Endpoint, body: Record<string, unknown>, principal: Principal): CacheUse | undefined {
  const controls = readControls(body.cache);
  // Like the format check, whether or not this call uses the cache: the same body gets the same answer.
  const allowed = principal.key?.allowedCacheControls ?? [];
  if (allowed.length > 0) {
    for (const name of controls.names) {
      if (!allowed.includes(name)) {
        throw GatewayError.of(403, `Not allowed to set '${name}' as a cache control: this key allows only ${allowed.join(", ")}. Ask an admin to change allowed_cache_controls.`, "permission_error", "cache");
      }
    }
  }
  if (!CACHEABLE.has(endpoint)) return undefined;
  const asked = body.caching === true;
  if (!asked && !(settings.enabled && settings.defaultOn)) return undefined;
  if (body.caching === false) return undefined;
  return {
    read: !controls.noCache,
    write: !controls.noStore,
    ttlMs: controls.ttlMs ?? settings.ttlMs,
    maxAgeMs: controls.maxAgeMs,
    namespace: controls.namespace ?? settings.namespace,
  };
}
