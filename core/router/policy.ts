/**
 * How one call is routed: strategy, retries, backoff and cooldown settings, from config
 * `router_settings`, overridden by the key's (then team's) `router_settings`, then by the request.
 */
import type { Principal } from "../contract.ts";
import type { GatewayConfig } from "../config/schema.ts";

export type RoutingStrategy = "simple-shuffle" | "least-busy" | "latency-based-routing" | "usage-based-routing" | "usage-based-routing-v2" | "cost-based-routing";

export interface RoutePolicy {
  strategy: RoutingStrategy;
  numRetries: number;
  /** Minimum wait between retries. */
  retryAfterMs: number;
  /** First backoff step; doubled per retry up to MAX_BACKOFF_MS. */
  initialDelayMs: number;
  allowedFails: number;
  cooldownMs: number;
  cooldowns: boolean;
  maxFallbacks: number;
}

export const MAX_BACKOFF_MS = 8000;
const DEFAULTS = { numRetries: 0, retryAfter: 0, initialDelay: 0.5, allowedFails: 3, cooldownTime: 5, maxFallbacks: 5 };

const STRATEGIES = new Set<string>(["simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing", "usage-based-routing-v2", "cost-based-routing"]);

type Loose = Record<string, unknown> | null | undefined;

function numberIn(sources: Loose[], name: string): number | undefined {
  for (const s of sources) {
    const v = s?.[name];
    if (typeof v === "number" && Number.isFinite(v) && v >= 0) return v;
  }
  return undefined;
}

/** The config's own policy, resolved once per config (most calls have nothing to override it with). */
const basePolicies = new WeakMap<GatewayConfig, RoutePolicy>();

function resolve(config: GatewayConfig, sources: Loose[], keyLevel: Loose[]): RoutePolicy {
  const r = config.router_settings as Loose;
  const strategy = [...keyLevel, r].map((s) => s?.routing_strategy).find((v): v is RoutingStrategy => typeof v === "string" && STRATEGIES.has(v));
  return {
    strategy: strategy ?? "simple-shuffle",
    numRetries: Math.floor(numberIn(sources, "num_retries") ?? DEFAULTS.numRetries),
    retryAfterMs: (numberIn([...keyLevel, r], "retry_after") ?? DEFAULTS.retryAfter) * 1000,
    initialDelayMs: (numberIn([r], "retry_initial_delay") ?? DEFAULTS.initialDelay) * 1000,
    allowedFails: numberIn([r], "allowed_fails") ?? DEFAULTS.allowedFails,
    cooldownMs: (numberIn([r], "cooldown_time") ?? DEFAULTS.cooldownTime) * 1000,
    cooldowns: r?.disable_cooldowns !== true,
    maxFallbacks: numberIn([r], "max_fallbacks") ?? DEFAULTS.maxFallbacks,
  };
}

/** The policy of one call: the request's `num_retries`, then the key's and team's `router_settings`, then the config. */
export function routePolicy(config: GatewayConfig, principal: Principal, body: Loose): RoutePolicy {
  const key = principal.key?.routerSettings as Loose;
  const team = principal.team?.routerSettings as Loose;
  const r = config.router_settings as Loose;
  const svc = config.svc_settings as Loose;
  if (!key && !team && typeof body?.num_retries !== "number") {
    let base = basePolicies.get(config);
    if (!base) {
      base = resolve(config, [r, svc], []);
      basePolicies.set(config, base);
    }
    return base;
  }
  return resolve(config, [body, key, team, r, svc], [key, team]);
}

/** Wait before retry number `n` (1-based): exponential with jitter, at least `retry_after` and the upstream's `retry-after`. */
export function backoffMs(policy: RoutePolicy, n: number, upstreamRetryAfterMs: number | undefined): number {
  const exp = Math.min(MAX_BACKOFF_MS, policy.initialDelayMs * 2 ** (n - 1));
  const jittered = exp * (0.75 + Math.random() * 0.25);
  return Math.max(policy.retryAfterMs, Math.min(MAX_BACKOFF_MS, upstreamRetryAfterMs ?? 0), jittered);
}
