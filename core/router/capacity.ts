/**
 * Deployments' own `rpm` / `tpm`, counted by the router: a deployment at its limit is skipped for
 * another one of its group, and when all are, the group answers 429 naming them.
 */
import type { Deployment, RateCounter, RateWindows } from "../contract.ts";
import { GatewayError, errorInfo } from "../errors.ts";
import { retryAfterSeconds } from "../limits/window.ts";

const capacityCounters = new WeakMap<Deployment, RateCounter | null>();

/** The router's own counter for a deployment's `rpm` / `tpm` (null when it sets neither), built once per deployment. */
export function capacityCounter(d: Deployment): RateCounter | null {
  let c = capacityCounters.get(d);
  if (c === undefined) {
    const rpm = typeof d.options.rpm === "number" ? d.options.rpm : undefined;
    const tpm = typeof d.options.tpm === "number" ? d.options.tpm : undefined;
    c = rpm === undefined && tpm === undefined ? null : { id: `deployment:${d.id}`, label: `Deployment ${d.id} of model ${d.modelName}`, rpm, tpm };
    capacityCounters.set(d, c);
  }
  return c;
}

/** 429: no deployment of the group can take the call now, and when one can. */
export function noDeployments(group: string, why: string, retryMs: number): GatewayError {
  const seconds = retryAfterSeconds(retryMs);
  return new GatewayError(errorInfo(429, `No deployments available for model ${group}: ${why}. Try again in ${seconds} s.`, "rate_limit_error"), { "retry-after": String(seconds) });
}

export const AT_CAPACITY = "every deployment is at its rpm/tpm limit";

/**
 * Ms until one of `candidates` has room for a call of `tokens`, or undefined when one has room now
 * (asked without counting: a slot taken to ask would refuse other calls meanwhile).
 */
export async function capacityWaitMs(windows: RateWindows, candidates: readonly Deployment[], tokens: number): Promise<number | undefined> {
  let wait = Number.POSITIVE_INFINITY;
  for (const d of candidates) {
    const counter = capacityCounter(d);
    if (!counter) return undefined;
    const refused = await windows.refusal([counter], counter.tpm === undefined ? 0 : tokens);
    if (!refused) return undefined;
    wait = Math.min(wait, refused.retryAfterMs);
  }
  return candidates.length > 0 ? wait : undefined;
}
