/**
 * Rate limits: `rpm_limit`, `tpm_limit` and `max_parallel_requests` on the key, its user, team and
 * organization, and a team member's `rpm_limit` / `tpm_limit` inside the team
 * (`/team/member_update`); `model_rpm_limit` / `model_tpm_limit` per model group on the key, user,
 * team and organization. A key, team, organization or team membership on a budget object
 * (`budget_id`) takes each limit it does not set itself from the budget: its rpm / tpm / parallel
 * limits, and per model group its `model_rpm_limit` / `model_tpm_limit` or its `model_max_budget`
 * entry's `rpm_limit` / `tpm_limit`. Such a limit is still the row's own (counted on the row's
 * counter, as LiteLLM's combined view does): two keys on one budget with `rpm_limit: 2` have 2 each.
 * Every limit counts over a sliding 60-second window; a request is counted on all of its counters
 * or on none (a refused request consumes nothing). Tokens are reserved from the request's estimate
 * (prompt estimate + `max_tokens`) and replaced by the real usage when the call ends.
 *
 * A refusal is HTTP 429 naming the limit (and the budget object it comes from), with `retry-after`
 * = seconds until the request would fit. Granted calls carry
 * `x-ratelimit-{limit,remaining}-{requests,tokens}` for the tightest limit that applies.
 */
import { Type } from "@sinclair/typebox";
import {
  type BudgetRow,
  type CallIntent,
  type Denied,
  definePlugin,
  type Hooks,
  type IdentityView,
  keyCounterToken,
  type KeyRow,
  type Lease,
  type RateCounter,
  type RateGrant,
  type RateLimitKind,
  type RateRefusal,
  type RateWindows,
  teamMemberId,
} from "../core/contract.ts";
import { errorInfo } from "../core/errors.ts";
import { firstGuaranteedExpiry, guaranteedLimit, type ModelReach, reservedOn, type ThroughputKind } from "../core/limits/capacity.ts";
import { rateHeaders } from "../core/limits/headers.ts";
import { howToShrink, retryAfterSeconds, tokenEstimate } from "../core/limits/window.ts";
import { budgetOf } from "./shared/budget-object.ts";
import { keyLabel } from "./shared/labels.ts";
import { BoundedMap } from "../core/bounded-map.ts";

const GRANTED: Lease = { ok: true, settle: () => undefined };

interface OwnLimits {
  rpmLimit: number | null;
  tpmLimit: number | null;
  maxParallelRequests?: number | null;
}

interface ModelLimits {
  modelRpmLimit: Record<string, number> | null;
  modelTpmLimit: Record<string, number> | null;
}

const num = (v: unknown) => (typeof v === "number" ? v : typeof v === "string" && v !== "" && Number.isFinite(Number(v)) ? Number(v) : undefined);


/** Picks each limit: the row's own, else its budget object's (noted in `sources`, for the refusal's message). */
class Limits {
  private sources: Partial<Record<RateLimitKind, string>> | undefined;

  constructor(private readonly budget: BudgetRow | undefined) {}

  pick(kind: RateLimitKind, own: unknown, inherited: (b: BudgetRow) => unknown): number | undefined {
    const mine = num(own);
    if (mine !== undefined || !this.budget) return mine;
    const theirs = num(inherited(this.budget));
    if (theirs !== undefined) this.sources = { ...this.sources, [kind]: `Budget=${this.budget.budgetId}` };
    return theirs;
  }

  counter(id: string, label: string, limits: { rpm?: number; tpm?: number; parallel?: number }): RateCounter {
    return this.sources ? { id, label, ...limits, sources: this.sources } : { id, label, ...limits };
  }
}

function rowCounter(out: RateCounter[], id: string, label: string, row: OwnLimits, budget: BudgetRow | undefined): void {
  const l = new Limits(budget);
  const rpm = l.pick("requests", row.rpmLimit, (b) => b.rpmLimit);
  const tpm = l.pick("tokens", row.tpmLimit, (b) => b.tpmLimit);
  const parallel = l.pick("parallel_requests", row.maxParallelRequests, (b) => b.maxParallelRequests);
  if (rpm !== undefined || tpm !== undefined || parallel !== undefined) out.push(l.counter(id, label, { rpm, tpm, parallel }));
}

/**
 * A per-model map's entry for the group, under any of its `names` (the group's own first): an admin
 * may know a group only by its `model_group_alias` name, and a call by either name is one group's.
 */
function perModel<T>(byModel: Record<string, T> | null | undefined, names: readonly string[]): T | undefined {
  for (const name of names) if (byModel?.[name] !== undefined) return byModel[name];
  return undefined;
}

/** A budget object's `model_max_budget` entry for a group: `{max_budget, budget_duration, tpm_limit, rpm_limit}`. */
function modelEntry(b: BudgetRow, names: readonly string[]): Record<string, unknown> | undefined {
  const entry = perModel(b.modelMaxBudget, names);
  return entry !== null && typeof entry === "object" ? (entry as Record<string, unknown>) : undefined;
}

function modelCounter(out: RateCounter[], id: string, label: string, row: ModelLimits, intent: CallIntent, budget?: BudgetRow): void {
  const group = intent.modelGroup;
  const names = intent.modelNames;
  const l = new Limits(budget);
  const rpm = l.pick("requests", perModel(row.modelRpmLimit, names), (b) => perModel(b.modelRpmLimit, names) ?? modelEntry(b, names)?.rpm_limit);
  const tpm = l.pick("tokens", perModel(row.modelTpmLimit, names), (b) => perModel(b.modelTpmLimit, names) ?? modelEntry(b, names)?.tpm_limit);
  if (rpm !== undefined || tpm !== undefined) out.push(l.counter(`${id}:${group}`, `${label} for model=${group}`, { rpm, tpm }));
}

/**
 * The throughput types on a model group whose capacity is known (every deployment sets `rpm`/`tpm`),
 * a wildcard route being one group for all the names it serves (CallIntent.capacityGroup):
 *
 * - `guaranteed_throughput`: the key's limit is reserved out of the capacity (checked when the key
 *   is written); traffic of keys that are not guaranteed shares only what is left, so the reserved
 *   share is free whenever its key calls.
 * - `dynamic`: the key gets an equal share of what is left, among the dynamic keys that called the
 *   group in the last 60 s (across instances when the windows are in Redis), so shares grow and
 *   shrink as keys come and go.
 * - `best_effort_throughput` (default): only the key's own limit, and the shared remainder.
 */
/** The counter of what guaranteed keys leave of a group's capacity: `group_shared:<group>`. */
const SHARED_POOL = "group_shared:";

/**
 * Groups whose reserved sums are kept at once. A wildcard route makes a group of every model name
 * a client sends (`openai/<anything>`): past this many, the sums start over instead of growing.
 */
const RESERVED_CACHE_LIMIT = 1000;

class Throughput {
  private readonly reserved = new BoundedMap<string, number>(RESERVED_CACHE_LIMIT);
  /** When the first guaranteed key still counted expires: the sums are stale from then on (an expired key reserves nothing). */
  private validUntil = 0;

  readonly dispose: () => void;

  constructor(private readonly identity: IdentityView) {
    this.dispose = identity.onChange(() => {
      this.reserved.clear();
      this.validUntil = 0;
    });
  }

  reservedOn(group: string, kind: ThroughputKind, reach: ModelReach): number {
    const now = Date.now();
    if (now >= this.validUntil) {
      this.reserved.clear();
      this.validUntil = firstGuaranteedExpiry(this.identity.keys.values(), now);
    }
    const id = `${kind}:${group}`;
    let sum = this.reserved.get(id);
    if (sum === undefined) {
      sum = reservedOn(this.identity.keys.values(), this.identity, group, kind, reach);
      this.reserved.set(id, sum);
    }
    return sum;
  }

  /** `key`: the caller's key row; a caller without one (the master key) is never guaranteed nor dynamic, and shares the pool. */
  counters(intent: CallIntent, key: KeyRow | undefined, label: string, out: RateCounter[]): void {
    const cap = intent.groupCapacity;
    if (cap.rpm === undefined && cap.tpm === undefined) return;
    // A wildcard route's names share its deployments: one pool, and one reservation per key, for all of them.
    const group = intent.capacityGroup;
    const shared: RateCounter = { id: `${SHARED_POOL}${group}`, label: `Model ${group} (capacity left after guaranteed keys)` };
    const pools: { rpm?: number; tpm?: number } = {};
    for (const kind of ["rpm", "tpm"] as const) {
      const capacity = cap[kind];
      if (capacity === undefined || (key && guaranteedLimit(key, kind) !== undefined)) continue;
      const reserved = this.reservedOn(group, kind, intent.modelReach);
      const pool = Math.max(0, capacity - reserved);
      if (reserved > 0) shared[kind] = pool;
      if ((kind === "rpm" ? key?.rpmLimitType : key?.tpmLimitType) === "dynamic") pools[kind] = pool;
    }
    if (shared.rpm !== undefined || shared.tpm !== undefined) out.push(shared);
    if (key && (pools.rpm !== undefined || pools.tpm !== undefined)) {
      const named = keyCounterToken(key);
      out.push({ id: `key_dynamic:${named}:${group}`, label: `${label} (dynamic share of model=${group})`, share: { among: `dynamic:${group}`, member: named, ...pools } });
    }
  }
}

/** Per model group tried: the per-model limits and the model's capacity shares. */
function groupCounters(intent: CallIntent, identity: IdentityView | undefined, throughput: Throughput | undefined): RateCounter[] {
  const p = intent.principal;
  const out: RateCounter[] = [];
  const key = p.key;
  const label = keyLabel(p);
  if (key) modelCounter(out, `key_model:${keyCounterToken(key)}`, label, key, intent, budgetOf(key.budgetId, identity));
  // Every caller draws from what the guaranteed keys leave, a key-less one (the master key) too.
  throughput?.counters(intent, key, label, out);
  if (!key) return out;
  const user = p.user ?? (p.userId ? identity?.users.get(p.userId) : undefined);
  if (user) modelCounter(out, `user_model:${user.userId}`, `User=${user.userId}`, user, intent);
  const team = p.team ?? (p.teamId ? identity?.teams.get(p.teamId) : undefined);
  if (team) modelCounter(out, `team_model:${team.teamId}`, `Team=${team.teamId}`, team, intent, budgetOf(team.budgetId, identity));
  const org = p.org ?? (p.orgId ? identity?.orgs.get(p.orgId) : undefined);
  if (org) modelCounter(out, `org_model:${org.organizationId}`, `Organization=${org.organizationId}`, org, intent, budgetOf(org.budgetId, identity));
  return out;
}

/** Once per client request, however many groups it tries: the caller's own limits. */
function requestCounters(intent: CallIntent, identity: IdentityView | undefined): RateCounter[] {
  const p = intent.principal;
  const out: RateCounter[] = [];
  const key = p.key;
  if (!key) return out;
  const label = keyLabel(p);
  const team = p.team ?? (p.teamId ? identity?.teams.get(p.teamId) : undefined);
  const org = p.org ?? (p.orgId ? identity?.orgs.get(p.orgId) : undefined);
  // Named by what a rotation keeps: the key's windows and its calls in flight carry over to its new token.
  rowCounter(out, `key:${keyCounterToken(key)}`, label, key, budgetOf(key.budgetId, identity));
  const user = p.user ?? (p.userId ? identity?.users.get(p.userId) : undefined);
  if (user) rowCounter(out, `user:${user.userId}`, `User=${user.userId}`, user, undefined);
  if (team) rowCounter(out, `team:${team.teamId}`, `Team=${team.teamId}`, team, budgetOf(team.budgetId, identity));
  const member = p.teamId && p.userId ? identity?.teamMember(p.teamId, p.userId) : undefined;
  // A membership's rpm / tpm (its own, else its budget object's; a parallel limit only from the budget).
  if (member) rowCounter(out, `team_member:${teamMemberId(member.teamId, member.userId)}`, `User=${member.userId} in Team=${member.teamId}`, member, budgetOf(member.budgetId, identity));
  if (org) rowCounter(out, `org:${org.organizationId}`, `Organization=${org.organizationId}`, org, budgetOf(org.budgetId, identity));
  return out;
}

const KIND_TEXT = { requests: "requests per minute", tokens: "tokens per minute", parallel_requests: "parallel requests" } as const;


export function rateRefusal(r: RateRefusal, tokens: number, endpoint: CallIntent["endpoint"] = "chat"): Denied {
  const c = r.counter;
  const retry = retryAfterSeconds(r.retryAfterMs);
  const from = c.sources?.[r.kind];
  let message = `Rate limit exceeded for ${c.label}: ${KIND_TEXT[r.kind]} limit ${r.limit}${from ? ` (from ${from})` : ""}`;
  if (r.kind === "parallel_requests") message += `, ${r.current} requests in flight.`;
  else if (r.kind === "tokens" && tokens > r.limit) message += `, and this request alone may use ${tokens} tokens (${howToShrink(endpoint)}).`;
  else message += `, ${r.current} used in the last 60 s. Try again in ${retry} s.`;
  const headers: Record<string, string> = {};
  if (r.kind === "requests") Object.assign(headers, { "x-ratelimit-limit-requests": String(r.limit), "x-ratelimit-remaining-requests": "0" });
  if (r.kind === "tokens") Object.assign(headers, { "x-ratelimit-limit-tokens": String(r.limit), "x-ratelimit-remaining-tokens": String(Math.max(0, r.limit - r.current)) });
  return { ok: false, error: errorInfo(429, message, "rate_limit_error"), retryAfterSeconds: retry, headers, groupCapacity: c.share !== undefined || c.id.startsWith(SHARED_POOL) };
}

export default definePlugin({
  name: "rate-limits",
  config: Type.Object({}),
  setup(_config, ctx): Hooks {
    const windows: RateWindows | undefined = ctx.rateWindows;
    if (!windows) return {};
    const identity = ctx.identity;
    const throughput = identity ? new Throughput(identity) : undefined;
    return {
      rateLimiter: {
        acquire(intent) {
          const own = intent.scope === "group" ? [] : requestCounters(intent, identity);
          const counters = intent.scope === "request" ? own : [...own, ...groupCounters(intent, identity, throughput)];
          if (counters.length === 0) return GRANTED;
          const tokens = counters.some((c) => c.tpm !== undefined || c.share?.tpm !== undefined) ? tokenEstimate(intent) : 0;
          const toLease = (r: RateGrant | RateRefusal): Lease | Denied => {
            if (!r.ok) return rateRefusal(r, tokens, intent.endpoint);
            const lease = (end: { settle(actual: number): void; cancel(): void }, headers?: Record<string, string>): Lease => ({
              ok: true,
              headers,
              settle: (usage) => end.settle(usage.promptTokens + usage.completionTokens),
              cancel: () => end.cancel(),
            });
            if (intent.scope !== "both") return lease(r, rateHeaders(r.applied, r.remaining));
            // Counted together (one step, all or nothing), ended apart: the request's part when it ends, the group's when the group does.
            const n = own.length;
            const part = (from: number, to: number) => lease(r.part(from, to), rateHeaders(r.applied.slice(from, to), r.remaining.slice(from, to)));
            return { ...lease(r), parts: { request: part(0, n), group: part(n, counters.length) } };
          };
          const result = windows.acquire(counters, tokens);
          return result instanceof Promise ? result.then(toLease) : toLease(result);
        },
      },
      dispose: () => throughput?.dispose(),
    };
  },
});
