/**
 * One model call as the client sees it: authorize the model → pick a deployment → limits and
 * budgets (once per model group, not per retry) → attempts at deployments with retries and
 * backoff → fallback groups when the group fails. Failing deployments cool down; deployments at
 * their own `rpm`/`tpm` are skipped. The answer says which deployment answered and how many
 * retries and fallbacks it took (`x-svc-attempted-retries`, `x-svc-attempted-fallbacks`).
 */
import { authorizeModel, mayUseModel } from "../access.ts";
import type { CallRecord, Deployment, Endpoint, Lease, RateGrant, UpstreamErrorKind, Usage, WireRequest } from "../contract.ts";
import { GatewayError } from "../errors.ts";
import type { Snapshot } from "../snapshot.ts";
import { type Attempt, type CallContext, Intent, Refusal, ZERO, acquireLeases, attemptTimeout, callDeployment, callRecord, deploymentTimeout, promptOf, wantsStream } from "../pipeline/call.ts";
import { dispatchRecord } from "../pipeline/record.ts";
import { HeldLeases, NO_LEASES, tightest } from "../pipeline/held-leases.ts";
import { AT_CAPACITY, AWAIT_CAPACITY_MS, NOT_AWAITING, awaitingCapacity, capacityCounter, capacityWaitMs, noDeployments, tooLargeForDeployments } from "./capacity.ts";
import { stateOf } from "./deployment-state.ts";
import { type FallbackType, fallbacksFor } from "./fallbacks.ts";
import { type RoutePolicy, backoffMs, retriesFor, routePolicy } from "./policy.ts";
import { Rotation } from "./strategy.ts";
import { requiredWaitMs, upstreamRetryAfterMs } from "./waits.ts";
import { delay } from "../timer.ts";
import { headerText } from "../header-text.ts";
import { rateHeaders } from "../limits/headers.ts";
import { howToShrink, tokenEstimate } from "../limits/window.ts";
import { cacheUse } from "../cache/controls.ts";
import { cacheKey } from "../cache/key.ts";
import { answeredBy, cachedAnswer, cachedEntry, requireBudgetsForHit, storeAnswer } from "../cache/answer.ts";
import { usesClientCredentials, withClientCredentials } from "../pipeline/client-credentials.ts";

/** Statuses worth another attempt: the upstream may answer differently next time. */
const RETRYABLE = new Set([408, 429, 500, 502, 503, 504]);
/** Statuses after which a deployment counts a failure toward its cooldown. */
const COOLDOWN_STATUSES = new Set([401, 404, 408, 429, 500, 502, 503, 504]);

/** A model group gave up; the router may try its fallbacks. */
class GroupFailure {
  constructor(
    readonly error: GatewayError,
    readonly kind: UpstreamErrorKind | undefined,
  ) {}
}

/** Where a successful answer is cached. */
interface CacheSave {
  key: string;
  ttlMs: number;
}

interface Progress {
  /** The request's own rate-limit leases (key, user, team, member, org): taken with the first group's limits, in one step, then held until the request ends. */
  request?: HeldLeases;
  attempts: number;
  /** Whether some attempt was logged (reached, or tried to reach, an upstream). */
  recorded: boolean;
  retries: number;
  fallbacks: number;
  save?: CacheSave;
}

/** One request through the router: what every model group it tries shares. */
interface Run<E extends Endpoint> {
  endpoint: E;
  ctx: CallContext;
  policy: RoutePolicy;
  progress: Progress;
}

function routerHeaders(p: Progress): Record<string, string> {
  return { "x-svc-attempted-retries": String(p.retries), "x-svc-attempted-fallbacks": String(p.fallbacks) };
}

/** 400: the model is unknown, or not one the caller may use (the same answer either way). */
export function invalidModel(model: string): GatewayError {
  return GatewayError.of(400, `Invalid model name passed in model=${model}. Call \`/v1/models\` to view available models for your key.`, "invalid_request_error", "model");
}

/**
 * Whether an attempt's failure says something about its deployment. One its caller brought about
 * says nothing: a timeout the request shortened (its own `timeout`, below the deployment's), or a
 * refusal by the upstream of credentials the client sent. Counted, it would let one caller cool a
 * deployment down for every other.
 */
function blamesDeployment(endpoint: Endpoint, body: WireRequest[Endpoint], d: Deployment, snapshot: Snapshot, status: number): boolean {
  if (usesClientCredentials(endpoint, body)) return false;
  return status !== 408 || attemptTimeout(body, d, snapshot) >= deploymentTimeout(body, d, snapshot);
}

function kindOf(err: GatewayError): UpstreamErrorKind | undefined {
  const t = err.info.type;
  return t === "context_window_exceeded" || t === "content_policy_violation" ? t : undefined;
}

function fallbackType(kind: UpstreamErrorKind | undefined): FallbackType {
  return kind === "context_window_exceeded" ? "context_window" : kind === "content_policy_violation" ? "content_policy" : "general";
}

export async function modelCall<E extends Endpoint>(endpoint: E, body: WireRequest[E], ctx: CallContext): Promise<Response> {
  const startedAt = Date.now();
  const { snapshot, principal } = ctx;
  const group = authorizeModel(principal, body.model, snapshot.accessGroups, snapshot.groupAliases);
  const deployments = snapshot.models.resolve(group);
  if (!deployments || deployments.length === 0) throw invalidModel(body.model);
  const loose = body as unknown as Record<string, unknown>;
  const use = cacheUse(snapshot.cache.settings, endpoint, loose, principal);
  const policy = routePolicy(snapshot.config, principal, loose);
  const progress: Progress = { attempts: 0, recorded: false, retries: 0, fallbacks: 0 };
  try {
    if (use) {
      const key = cacheKey(endpoint, group, loose, use.namespace);
      if (use.read) {
        // A request the deployment would refuse (client-side credentials not allowed) is refused on a hit too.
        withClientCredentials(endpoint, body, deployments[0]!, snapshot.settings);
        const hit = await cachedEntry(snapshot.cache.store, key, use.maxAgeMs, ctx.log);
        // A fallback's answer is served only to a caller who may use that fallback: its miss would skip it.
        if (hit && (hit.modelGroup === undefined || hit.modelGroup === group || mayUseModel(principal.access, hit.modelGroup, snapshot.accessGroups, snapshot.groupAliases))) {
          // A caller over a budget gets the refusal a miss would get (access was checked above).
          const by = answeredBy(hit, group, deployments, snapshot.models);
          await requireBudgetsForHit(endpoint, body, group, by, ctx);
          return cachedAnswer(endpoint, body, key, hit, by, ctx);
        }
      }
      if (use.write) progress.save = { key, ttlMs: use.ttlMs };
    }
    return await withFallbacks({ endpoint, ctx, policy, progress }, body, group, deployments);
  } catch (err) {
    progress.request?.giveUp(progress.recorded);
    // Every answer says how many retries and fallbacks it took, also an error that ended the call at once (a 400).
    if (err instanceof GatewayError) {
      Object.assign(err.headers, routerHeaders(progress));
      // The group that answered last, else the asked one (a refusal before any deployment was asked).
      err.headers["x-svc-model-group"] ??= headerText(group);
      // An answer that no attempt gave (every deployment cooling down after retries) says the call's id too.
      if (progress.recorded) err.headers["x-svc-call-id"] ??= ctx.callId;
    }
    // Refused before any deployment was asked (a budget, a rate limit, none free): still a call, logged as a failure,
    // also when its client left while it waited (a budget's first reading of a row's spend may take seconds).
    if (!progress.recorded && err instanceof GatewayError) {
      recordRefusal(endpoint, body, deployments[0]!, ctx, err, startedAt);
      err.headers["x-svc-call-id"] = ctx.callId;
    }
    throw err;
  }
}

/** A call refused before any deployment was asked: a failure that cost nothing, with no deployment. */
function recordRefusal(endpoint: Endpoint, body: WireRequest[Endpoint], groupDeployment: Deployment, ctx: CallContext, err: GatewayError, startedAt: number): void {
  if (ctx.record === false) return;
  const record = callRecord(ctx, endpoint, body, { ...groupDeployment, id: "" }, {
    stream: wantsStream(endpoint, body),
    status: "failure",
    usage: ZERO,
    cost: 0n,
    priced: true,
    costSource: "refused before any deployment was called",
    cacheHit: false,
    startedAt,
    error: err.info,
    prompt: ctx.snapshot.settings.storePrompts ? promptOf(body) : undefined,
  });
  dispatchRecord(ctx.snapshot, record, ctx.log);
}

/**
 * The asked group, then its fallbacks depth first, as LiteLLM chains them: a fallback that fails
 * tries its own fallbacks (the list for how it failed) before the next one of its parent's list.
 * A group is tried at most once per call (fallbacks that name each other end), and at most
 * `max_fallbacks` fallback groups in all.
 */
async function withFallbacks<E extends Endpoint>(run: Run<E>, body: WireRequest[E], group: string, deployments: readonly Deployment[]): Promise<Response> {
  const tried = new Set([body.model, group]);
  try {
    return await callGroup(run, body, group, deployments);
  } catch (first) {
    if (!(first instanceof GroupFailure)) throw first;
    const answer = await fallBack(run, body, [body.model, group], first, tried);
    if (answer instanceof GroupFailure) throw answer.error;
    return answer;
  }
}

/** Runs `fn` when the scope that holds the result with `using` ends, however it ends. */
const onExit = (fn: () => void): Disposable => ({ [Symbol.dispose]: fn });

/**
 * The fallbacks of the failed group, each followed by its own: the first answer, else the last
 * failure. `failed`: the name the group was called by (the client's, or a fallback list's), then the group.
 */
async function fallBack<E extends Endpoint>(run: Run<E>, body: WireRequest[E], failed: readonly [string, string], failure: GroupFailure, tried: Set<string>): Promise<Response | GroupFailure> {
  const { ctx, policy, progress } = run;
  const { snapshot, principal } = ctx;
  let last = failure;
  // One line per call, however many the body names: a list of thousands was as many log lines.
  const denied: string[] = [];
  using _reportDenied = onExit(() => {
    if (denied.length > 0) ctx.log.warn("fallbacks skipped: the key may not use them", { models: denied.slice(0, 5), count: denied.length });
  });
  for (const name of fallbacksFor(snapshot.config, body as unknown as Record<string, unknown>, failed, fallbackType(failure.kind), principal)) {
    if (progress.fallbacks >= policy.maxFallbacks || ctx.clientSignal.aborted) break;
    if (tried.has(name)) continue;
    tried.add(name);
    let target: string;
    try {
      target = authorizeModel(principal, name, snapshot.accessGroups, snapshot.groupAliases);
    } catch {
      denied.push(name);
      continue;
    }
    // An alias naming a group already tried is that group again.
    if (target !== name && tried.has(target)) continue;
    tried.add(target);
    const list = snapshot.models.resolve(target);
    if (!list || list.length === 0) continue;
    progress.fallbacks++;
    try {
      return await callGroup(run, { ...body, model: name }, target, list, false);
    } catch (err) {
      // A fallback the caller may not use now (its limit or budget on that model) is passed over
      // as one it may not use at all: its refusal is the answer only if no later fallback answers.
      if (err instanceof Refusal) {
        last = new GroupFailure(err, undefined);
        continue;
      }
      if (!(err instanceof GroupFailure)) throw err;
      const deeper = await fallBack(run, body, [name, target], err, tried);
      if (!(deeper instanceof GroupFailure)) return deeper;
      last = deeper;
    }
  }
  return last;
}

/**
 * The caller's rate limits for a call to `group`. A refusal while every deployment of the group is
 * at its own rpm/tpm names the deployments (a GroupFailure, as when they refuse it later): under a
 * burst, calls the deployments then refuse count against the caller's limits until they give them
 * back, so the caller's refusal would blame limits the caller has not used. For that reason too, a
 * refusal while a deployment has room waits for the group's calls not yet counted at one, then asks again.
 */
async function limitLeases(snapshot: Snapshot, intent: Intent, group: string, candidates: readonly Deployment[]): Promise<Lease[]> {
  const deadline = Date.now() + AWAIT_CAPACITY_MS;
  for (;;) {
    try {
      return await acquireLeases(snapshot.limitGates, intent);
    } catch (err) {
      if (!(err instanceof Refusal) || err.info.status !== 429 || err.groupCapacity) throw err;
      const waitMs = await capacityWaitMs(snapshot.rateWindows, candidates, tokenEstimate(intent));
      if (waitMs === undefined) {
        // A deployment has room: the caller's slots may be held by calls the deployments are about to refuse.
        if (await awaitingCapacity.oneMovesOn(group, deadline - Date.now())) continue;
        throw err;
      }
      // Either may still hold the call back: it fits when both have room.
      const callerMs = (Number(err.headers["retry-after"]) || 0) * 1000;
      throw new GroupFailure(noDeployments(group, AT_CAPACITY, Math.max(waitMs, callerMs)), undefined);
    }
  }
}

/** Calls within one model group, with retries; throws GroupFailure when the group gives up. */
async function callGroup<E extends Endpoint>(run: Run<E>, body: WireRequest[E], group: string, whole: readonly Deployment[], useRawBody = true): Promise<Response> {
  const { endpoint, ctx, policy, progress } = run;
  const { snapshot } = ctx;
  // Drained deployments are not the group's for this call: never picked, nor counted (a group's only
  // deployment in rotation never cools down; "all N are cooling down" counts those in rotation).
  const rotation = Rotation.of(policy.strategy, whole);
  const deployments = rotation.deployments;
  const startedAt = Date.now();
  const failedHere = new Set<string>();
  let retriesHere = 0;
  const available = (now: number): readonly Deployment[] => {
    // A group's only deployment never cools down, and there is nothing else to prefer.
    if (deployments.length === 1) return deployments;
    const live = deployments.filter((d) => !stateOf(d.id).coolingDown(now));
    // Prefer deployments this call has not failed on yet.
    const fresh = live.filter((d) => !failedHere.has(d.id));
    return fresh.length > 0 ? fresh : live;
  };
  let candidates = available(startedAt);
  if (candidates.length === 0) throw new GroupFailure(allCoolingDown(group, deployments, startedAt), undefined);
  let d = rotation.pick(candidates, snapshot.pricing, startedAt);

  // The first group counts the request's own limits too, in the same step; later groups only their own.
  const scope = progress.request ? "group" : "both";
  let intent = new Intent(ctx.principal, endpoint, group, d, startedAt, body, snapshot, scope);
  const granted = snapshot.limitGates.length === 0 ? [] : await limitLeases(snapshot, intent, group, candidates);
  // Until counted at a deployment's own rpm/tpm, a refusal of the caller's limits may wait for this call (limitLeases).
  using awaiting = granted.length > 0 && deployments.some((x) => capacityCounter(x) !== null) ? awaitingCapacity.enter(group) : NOT_AWAITING;
  if (scope === "both") progress.request = new HeldLeases(granted.flatMap((l) => (l.parts ? [l.parts.request] : [])));
  const limits = new HeldLeases(scope === "both" ? granted.map((l) => l.parts?.group ?? l) : granted);
  let budgets = NO_LEASES;
  /** Deployments whose provider budget could not take this call, and the last such refusal. */
  const overBudget = new Set<string>();
  let budgetRefusal: Refusal | undefined;
  // Nearly every call: no provider budget refused, the list as it is (no copy per pick).
  const withinBudget = (list: readonly Deployment[]) => (overBudget.size === 0 ? list : list.filter((x) => !overBudget.has(x.id)));
  const passedOver = (err: unknown, refusing: Deployment): boolean => {
    if (!(err instanceof Refusal) || err.info.budget?.entity !== "provider") return false;
    overBudget.add(refusing.id);
    budgetRefusal = err;
    return true;
  };
  let capacityRetryMs = Number.POSITIVE_INFINITY;
  const atCapacity = new Set<string>();
  /** The largest `tpm` of the deployments that refused a call larger than their whole `tpm`; -1 once one refused for want of room now. */
  let tooLargeFor = 0;
  /** Whether an attempt reached the upstream: until one has, giving up takes every lease back (a refused call consumes nothing). */
  let wentOut = false;
  const settle = (usage: Usage, cost: bigint) => {
    limits.settle(usage, cost);
    budgets.settle(usage, cost);
  };
  const giveUp = () => {
    limits.giveUp(wentOut);
    budgets.giveUp(wentOut);
  };
  /**
   * Moving to a deployment of `pool`: the budgets must hold its worst case too (it may cost more,
   * or spend another provider's budget). One whose provider budget cannot take the call is passed
   * over for another, as LiteLLM filters such deployments out; when none is left, or another
   * budget refuses, the call ends with that refusal.
   */
  const switchTo = async (pool: readonly Deployment[]): Promise<Deployment> => {
    for (;;) {
      const open = withinBudget(pool);
      if (budgetRefusal && open.length === 0) {
        giveUp();
        throw budgetRefusal;
      }
      const next = rotation.pick(open, snapshot.pricing, Date.now());
      const holding = budgets !== NO_LEASES;
      if (snapshot.budgetGates.length === 0 || (holding && next === intent.deployment)) return next;
      const nextIntent = new Intent(ctx.principal, endpoint, group, next, startedAt, body, snapshot, "group");
      if (holding && next.provider === intent.deployment.provider && nextIntent.worstCaseCost <= intent.worstCaseCost) return next;
      budgets.giveUp(false);
      budgets = NO_LEASES;
      try {
        budgets = new HeldLeases(await acquireLeases(snapshot.budgetGates, nextIntent));
      } catch (err) {
        if (!passedOver(err, next)) {
          giveUp();
          throw err;
        }
        continue;
      }
      intent = nextIntent;
      return next;
    }
  };
  if (snapshot.budgetGates.length > 0) {
    try {
      budgets = new HeldLeases(await acquireLeases(snapshot.budgetGates, intent));
    } catch (err) {
      if (!passedOver(err, d)) {
        limits.giveUp(false);
        throw err;
      }
      d = await switchTo(candidates);
    }
  }
  const leaseHeaders = tightest(tightest(progress.request?.headers ?? {}, limits.headers), budgets.headers);

  for (;;) {
    // A deployment at its own rpm/tpm is skipped, not failed: another one may have room.
    const counter = capacityCounter(d);
    let capacity: RateGrant | undefined;
    if (counter) {
      const tokens = counter.tpm === undefined ? 0 : tokenEstimate(intent);
      const got = await snapshot.rateWindows.acquire([counter], tokens);
      if (!got.ok) {
        atCapacity.add(d.id);
        capacityRetryMs = Math.min(capacityRetryMs, got.retryAfterMs);
        if (tooLargeFor >= 0) tooLargeFor = got.kind === "tokens" && tokens > got.limit ? Math.max(tooLargeFor, got.limit) : -1;
        const rest = withinBudget(available(Date.now())).filter((x) => !atCapacity.has(x.id));
        if (rest.length === 0) {
          giveUp();
          throw new GroupFailure(tooLargeFor > 0 ? tooLargeForDeployments(group, tokens, tooLargeFor, howToShrink(endpoint)) : noDeployments(group, AT_CAPACITY, capacityRetryMs), undefined);
        }
        d = await switchTo(rest);
        continue;
      }
      capacity = got;
    }
    awaiting.leave();

    const n = progress.attempts++;
    const state = stateOf(d.id);
    const seq = state.started(Date.now(), policy.strategy === "usage-based-routing" || policy.strategy === "usage-based-routing-v2");
    let returned = false;
    let recorded = false;
    let captured = "";
    const save = progress.save;
    // The deployment's own rpm/tpm are limits on this call too: their headers join the tightest.
    const capacityHeaders = capacity ? rateHeaders(capacity.applied, capacity.remaining) : undefined;
    const attempt: Attempt = {
      headers: { ...(capacityHeaders ? tightest(leaseHeaders, capacityHeaders) : leaseHeaders), ...routerHeaders(progress) },
      startedAt: n === 0 ? startedAt : undefined,
      capture: save
        ? (text) => {
            captured += text;
          }
        : undefined,
      ended: (record: CallRecord) => {
        recorded = true;
        progress.recorded = true;
        wentOut = true;
        if (save && record.status === "success") storeAnswer(snapshot.cache.store, save, captured, record, ctx);
        const tokens = record.usage.promptTokens + record.usage.completionTokens;
        state.ended(seq, tokens);
        capacity?.settle(tokens);
        if (record.status === "success") state.succeeded((record.firstByteAt ?? record.endedAt) - record.startedAt);
        // A failure before the answer started may still be retried: the leases stay held until the router gives up.
        if (record.status !== "failure" || returned) {
          settle(record.usage, record.cost);
          progress.request?.settle(record.usage, record.cost);
          ctx.release();
        } else if (record.cost > 0n) {
          // Billed though it failed (parts of a split call): counted whatever the call does next.
          limits.charge(record.usage, record.cost);
          budgets.charge(record.usage, record.cost);
          progress.request?.charge(record.usage, record.cost);
        }
      },
    };
    const attemptCtx: CallContext = {
      ...ctx,
      callId: n === 0 ? ctx.callId : `${ctx.callId}-${n}`,
      release: () => undefined,
      rawBody: useRawBody ? ctx.rawBody : undefined,
    };
    try {
      const res = await callDeployment(endpoint, body, d, attemptCtx, attempt);
      returned = true;
      return res;
    } catch (err) {
      const fromUpstream = err instanceof GatewayError && err.headers["x-svc-call-id"] !== undefined;
      if (fromUpstream) wentOut = true;
      if (!recorded) {
        // Refused before it reached the upstream (no adapter for the endpoint, unsupported stream): nothing else ends it.
        state.ended(seq, 0);
        if (fromUpstream) capacity?.settle(0);
        else capacity?.cancel();
      }
      if (!(err instanceof GatewayError) || ctx.clientSignal.aborted) {
        giveUp();
        throw err;
      }
      const status = err.info.status;
      const kind = kindOf(err);
      const blamed = fromUpstream && blamesDeployment(endpoint, body, d, snapshot, status);
      if (blamed && status === 408) state.timedOut(attemptTimeout(body, d, snapshot) * 1000);
      if (blamed && !kind && COOLDOWN_STATUSES.has(status) && deployments.length > 1) {
        const cooldownMs = state.failed(policy, Date.now(), status === 429, upstreamRetryAfterMs(err));
        if (cooldownMs > 0) {
          ctx.log.warn("deployment cooling down", { deployment: d.id, model: group, status });
          snapshot.cooldowns?.cooledDown(d.id, cooldownMs);
        }
      }
      failedHere.add(d.id);
      const allowed = retriesFor(policy, group, { status, upstreamStatus: err.upstreamStatus, kind });
      // A context-window or content-policy refusal goes to its fallbacks, unless a retry policy names its class.
      const retryable = fromUpstream && (kind ? allowed.forced : RETRYABLE.has(status) || allowed.forced);
      const next = retryable ? available(Date.now()) : [];
      // A deployment this call has not failed on yet is asked at once (LiteLLM does so with more
      // than one healthy deployment): it did not say to wait, and backing off only delays the answer.
      const untried = next.length > 0 && next.every((x) => !failedHere.has(x.id));
      const required = !retryable ? 0 : untried ? policy.retryAfterMs : requiredWaitMs(policy, err, d, next);
      // Each group (the asked one, then each fallback) gets its own retries. A retry that must wait
      // longer than an attempt may take is not made: the client hears now what the upstream said
      // (its 429 and retry-after), unless a fallback answers.
      if (!retryable || retriesHere >= allowed.max || required > attemptTimeout(body, d, snapshot) * 1000) {
        giveUp();
        // A bad request is the client's to fix, whoever noticed it; other failures may fall back.
        if (!kind && (status === 400 || status === 422 || (!fromUpstream && status < 500))) throw err;
        throw new GroupFailure(err, kind);
      }
      const wait = untried ? required : backoffMs(policy, retriesHere + 1, required);
      if (wait > 0) await delay(wait, ctx.clientSignal);
      if (ctx.clientSignal.aborted) {
        giveUp();
        throw err;
      }
      candidates = available(Date.now());
      if (candidates.length === 0) {
        giveUp();
        throw new GroupFailure(allCoolingDown(group, deployments, Date.now()), undefined);
      }
      // Counted once it is made: a retry left without a deployment is none.
      progress.retries++;
      retriesHere++;
      d = await switchTo(candidates);
    }
  }
}

function allCoolingDown(group: string, deployments: readonly Deployment[], now: number): GatewayError {
  const until = Math.min(...deployments.map((d) => stateOf(d.id).cooldownUntil));
  return noDeployments(group, `all ${deployments.length} are cooling down after failures`, until - now);
}
