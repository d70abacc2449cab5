/**
 * Answers from the response cache: a hit replays the stored bytes (a JSON body, or a whole SSE
 * stream), costs nothing, consumes no limit or budget, and is logged as a cache hit; the answer
 * carries `x-svc-cache-hit: true` and `x-svc-cache-key`. A caller already over a budget is refused
 * a hit as it would be a miss (the router checks access before it reads the cache).
 */
import type { CallRecord, Deployment, Endpoint, Logger, WireRequest } from "../contract.ts";
import { type CallContext, Intent, acquireLeases, callRecord, promptOf, responseHeaders, storedAnswer, wantsStream } from "../pipeline/call.ts";
import { cancelAll, dispatchRecord } from "../pipeline/record.ts";
import type { ModelTable } from "../models.ts";
import type { CachedResponse, CacheStore } from "./store.ts";

/** The entry stored under `key`, unless it is older than `maxAgeMs` (`s-maxage`); an unreachable cache is a miss. */
export async function cachedEntry(store: CacheStore, key: string, maxAgeMs: number | undefined, log: Logger): Promise<CachedResponse | undefined> {
  let hit: CachedResponse | undefined;
  try {
    hit = await store.get(key);
  } catch (err) {
    // An unreachable cache is a miss, not a failed call.
    log.warn("response cache unreachable; calling the model", { error: String(err) });
    return undefined;
  }
  if (!hit || (maxAgeMs !== undefined && Date.now() - hit.storedAt > maxAgeMs)) return undefined;
  return hit;
}

/**
 * The deployment a hit is answered as: the one that produced the entry (of the asked group, or of
 * the fallback group that answered), while it still serves; else (an entry stored without it, or
 * a deployment since removed) the asked group's first.
 */
export function answeredBy(hit: CachedResponse, group: string, deployments: readonly Deployment[], models: ModelTable): Deployment {
  const id = hit.deploymentId;
  if (id === undefined) return deployments[0]!;
  const list = hit.modelGroup === undefined || hit.modelGroup === group ? deployments : (models.resolve(hit.modelGroup) ?? []);
  return list.find((d) => d.id === id) ?? deployments[0]!;
}

/** The intent of a call answered from the cache: it costs nothing and calls no provider. */
class CacheHitIntent extends Intent {
  readonly cacheHit = true;
  override get worstCaseCost(): bigint {
    return 0n;
  }
}

/**
 * Refuses a hit to a caller over a budget (key, its budget object, team, member, user, org; a
 * per-model key budget), with the refusal a miss gets: the budgets are asked for a call of no
 * cost, which only a budget already spent refuses, and the grant is taken back at once.
 */
export async function requireBudgetsForHit(endpoint: Endpoint, body: WireRequest[Endpoint], group: string, d: Deployment, ctx: CallContext): Promise<void> {
  const { snapshot } = ctx;
  if (snapshot.budgetGates.length === 0) return;
  const intent = new CacheHitIntent(ctx.principal, endpoint, group, d, Date.now(), body, snapshot, "group");
  cancelAll(await acquireLeases(snapshot.budgetGates, intent));
}

/** The answer to a request from a cache entry (the caller has passed its budget check), logged as a hit. */
export function cachedAnswer(endpoint: Endpoint, body: WireRequest[Endpoint], key: string, hit: CachedResponse, d: Deployment, ctx: CallContext): Response {
  const now = Date.now();
  const stream = wantsStream(endpoint, body);
  const keepPrompt = ctx.snapshot.settings.storePrompts;
  const record = callRecord(ctx, endpoint, body, d, {
    stream,
    status: "success",
    usage: { promptTokens: hit.promptTokens, completionTokens: hit.completionTokens },
    cost: 0n,
    priced: true,
    costSource: "cache hit",
    // The log's request_id is the response id the client got: the cached answer's.
    responseId: hit.responseId,
    cacheHit: true,
    startedAt: now,
    firstByteAt: now,
    prompt: keepPrompt ? promptOf(body) : undefined,
    answer: keepPrompt ? storedAnswer(endpoint, stream, hit.body) : undefined,
  });
  ctx.onRecord?.(record);
  // Queued before the snapshot is released: its callbacks get the call before a reload disposes them.
  if (ctx.record !== false) dispatchRecord(ctx.snapshot, record, ctx.log);
  ctx.release();
  const headers = responseHeaders(d, ctx.callId, stream ? "text/event-stream" : "application/json");
  // Every answer says what the router did; a hit made no attempt.
  headers["x-svc-attempted-retries"] = "0";
  headers["x-svc-attempted-fallbacks"] = "0";
  headers["x-svc-cache-hit"] = "true";
  headers["x-svc-cache-key"] = key;
  headers["x-svc-response-cost"] = "0";
  if (stream) headers["cache-control"] = "no-cache";
  return new Response(hit.body, { headers });
}

export function storeAnswer(store: CacheStore, save: { key: string; ttlMs: number }, body: string, record: CallRecord, ctx: CallContext): void {
  if (!body) return;
  const value: CachedResponse = {
    body,
    storedAt: Date.now(),
    promptTokens: record.usage.promptTokens,
    completionTokens: record.usage.completionTokens,
    responseId: record.responseId,
    deploymentId: record.deploymentId,
    modelGroup: record.modelGroup,
  };
  store.set(save.key, value, save.ttlMs).catch((err) => ctx.log.warn("response cache write failed", { error: String(err) }));
}
