/**
 * How one call is routed: strategy, retries, backoff and cooldown settings, from config
 * `router_settings`, overridden by the key's (then team's) `router_settings`, then by the request.
 */
import type { Principal } from "../contract.ts";
import type { GatewayConfig } from "../config/schema.ts";

export type RoutingStrategy = "simple-shuffle" | "least-busy" | "latency-based-routing" | "usage-based-routing" | "usage-based-routing-v2" | "cost-based-routing";

export interface RoutePolicy {
  strategy: RoutingStrategy;
  /** Minimum wait between retries (`retry_after`). */
  retryAfterMs: number;
  /** First backoff step; doubled per retry up to MAX_BACKOFF_MS. */
  initialDelayMs: number;
  allowedFails: number;
  cooldownMs: number;
  cooldowns: boolean;
  maxFallbacks: number;
  /** Where retry policies are read when an attempt fails, most specific first (request, key, team, config). */
  retrySources: readonly Loose[];
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
    retryAfterMs: (numberIn([...keyLevel, r], "retry_after") ?? DEFAULTS.retryAfter) * 1000,
    initialDelayMs: (numberIn([r], "retry_initial_delay") ?? DEFAULTS.initialDelay) * 1000,
    allowedFails: numberIn([r], "allowed_fails") ?? DEFAULTS.allowedFails,
    cooldownMs: (numberIn([r], "cooldown_time") ?? DEFAULTS.cooldownTime) * 1000,
    cooldowns: r?.disable_cooldowns !== true,
    maxFallbacks: numberIn([...keyLevel, r], "max_fallbacks") ?? DEFAULTS.maxFallbacks,
    retrySources: sources,
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
  // A request sets only its `num_retries` (the spec's one retry field of a model call; the rest of the body is the upstream's).
  const request = typeof body?.num_retries === "number" ? { num_retries: body.num_retries } : undefined;
  return resolve(config, [request, key, team, r, svc], [key, team]);
}

/** A failed attempt, as the retry classes see it: the status answered, the upstream's own, the refusal's kind. */
export interface AttemptFailure {
  status: number;
  upstreamStatus?: number;
  kind?: string;
}

/**
 * LiteLLM's `retry_policy` fields: retries for one class of upstream error. An upstream's 504 is
 * answered as a 503 but is the timeout it says.
 */
const ERROR_CLASSES: readonly [string, (f: AttemptFailure) => boolean][] = [
  ["BadRequestErrorRetries", (f) => f.status === 400 || f.status === 422],
  ["AuthenticationErrorRetries", (f) => f.status === 401 || f.status === 403],
  ["TimeoutErrorRetries", (f) => f.status === 408 || f.upstreamStatus === 504],
  ["RateLimitErrorRetries", (f) => f.status === 429],
  ["InternalServerErrorRetries", (f) => f.status >= 500 && f.upstreamStatus !== 504],
];

function classRetries(policy: Loose, failure: AttemptFailure): number | undefined {
  if (!policy) return undefined;
  // A refusal with a fallback kind is no bad request to retry; content-policy ones have their own class.
  if (failure.kind) return failure.kind === "content_policy_violation" ? numberIn([policy], "ContentPolicyViolationErrorRetries") : undefined;
  for (const [field, matches] of ERROR_CLASSES) if (matches(failure)) return numberIn([policy], field);
  return undefined;
}

const asObject = (v: unknown): Loose => (v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined);

/**
 * How many retries `failure` in `group` gets, from the most specific source that
 * says: its `model_group_retry_policy[group]` (a class's retries, else `max_retries` /
 * `num_retries`), its `retry_policy` (a class's retries), its `num_retries` / `max_retries`.
 * `forced`: a retry policy named this class, so it is retried even when not retryable by default.
 */
export function retriesFor(policy: RoutePolicy, group: string, failure: AttemptFailure): { max: number; forced: boolean } {
  for (const source of policy.retrySources) {
    const forGroup = asObject(asObject(source?.model_group_retry_policy)?.[group]);
    const byGroupClass = classRetries(forGroup, failure);
    if (byGroupClass !== undefined) return { max: Math.floor(byGroupClass), forced: true };
    const byGroup = numberIn([forGroup], "max_retries") ?? numberIn([forGroup], "num_retries");
    if (byGroup !== undefined) return { max: Math.floor(byGroup), forced: false };
    const byClass = classRetries(asObject(source?.retry_policy), failure);
    if (byClass !== undefined) return { max: Math.floor(byClass), forced: true };
    const plain = numberIn([source], "num_retries") ?? numberIn([source], "max_retries");
    if (plain !== undefined) return { max: Math.floor(plain), forced: false };
  }
  return { max: DEFAULTS.numRetries, forced: false };
}

/** Wait before retry number `n` (1-based): exponential with jitter (at most MAX_BACKOFF_MS), at least `atLeastMs`. */
export function backoffMs(policy: RoutePolicy, n: number, atLeastMs: number): number {
  const exp = Math.min(MAX_BACKOFF_MS, policy.initialDelayMs * 2 ** (n - 1));
  return Math.max(atLeastMs, exp * (0.75 + Math.random() * 0.25));
}
