/**
 * How long a retry waits for what an upstream said (`retry-after`) and the settings ask
 * (`retry_after`). An upstream may say anything, a date years ahead among it.
 */
import type { Deployment } from "../contract.ts";
import type { GatewayError } from "../errors.ts";
import { MAX_BACKOFF_MS, type RoutePolicy } from "./policy.ts";

/** An upstream `retry-after` (seconds or an HTTP date) in ms. */
export function upstreamRetryAfterMs(err: GatewayError): number | undefined {
  const v = err.headers["retry-after"];
  if (!v) return undefined;
  const s = Number(v);
  if (Number.isFinite(s)) return Math.max(0, s * 1000);
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/**
 * The least a retry after `err` from `failed` must wait: `retry_after`, and the upstream's
 * `retry-after`, in full when the retry can only go back to the deployment that said it; when it
 * goes to another one, at most MAX_BACKOFF_MS (the two may share a provider's rate limit, but the
 * other one did not say so).
 */
export function requiredWaitMs(policy: RoutePolicy, err: GatewayError, failed: Deployment, next: readonly Deployment[]): number {
  const upstream = upstreamRetryAfterMs(err) ?? 0;
  const sameAgain = next.length > 0 && next.every((d) => d.id === failed.id);
  return Math.max(policy.retryAfterMs, sameAgain ? upstream : Math.min(MAX_BACKOFF_MS, upstream));
}
