/**
 * Answers from the response cache: a hit replays the stored bytes (a JSON body, or a whole SSE
 * stream), costs nothing, consumes no limit or budget, and is logged as a cache hit; the answer
 * carries `x-svc-cache-hit: true` and `x-svc-cache-key`.
 */
import type { CallRecord, Deployment, Endpoint, WireRequest } from "../contract.ts";
import { type CallContext, callRecord, promptOf, responseHeaders, storedAnswer, wantsStream } from "../pipeline/call.ts";
import { dispatchRecord } from "../pipeline/record.ts";
import type { CacheStore } from "./store.ts";

export async function cachedAnswer(endpoint: Endpoint, body: WireRequest[Endpoint], key: string, maxAgeMs: number | undefined, d: Deployment, ctx: CallContext): Promise<Response | undefined> {
  const store = ctx.snapshot.cache.store;
  let hit: Awaited<ReturnType<CacheStore["get"]>>;
  try {
    hit = await store.get(key);
  } catch (err) {
    // An unreachable cache is a miss, not a failed call.
    ctx.log.warn("response cache unreachable; calling the model", { error: String(err) });
    return undefined;
  }
  const now = Date.now();
  if (!hit || (maxAgeMs !== undefined && now - hit.storedAt > maxAgeMs)) return undefined;
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
  ctx.release();
  if (ctx.record !== false) dispatchRecord(ctx.snapshot, record, ctx.log);
  const headers = responseHeaders(d, ctx.callId, stream ? "text/event-stream" : "application/json");
  headers["x-svc-cache-hit"] = "true";
  headers["x-svc-cache-key"] = key;
  headers["x-svc-response-cost"] = "0";
  if (stream) headers["cache-control"] = "no-cache";
  return new Response(hit.body, { headers });
}

export function storeAnswer(store: CacheStore, save: { key: string; ttlMs: number }, body: string, record: CallRecord, ctx: CallContext): void {
  if (!body) return;
  const value = { body, storedAt: Date.now(), promptTokens: record.usage.promptTokens, completionTokens: record.usage.completionTokens, responseId: record.responseId };
  store.set(save.key, value, save.ttlMs).catch((err) => ctx.log.warn("response cache write failed", { error: String(err) }));
}
