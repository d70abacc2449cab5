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
 * 429 for a call larger than every deployment's whole `tpm`: no wait makes it fit, so no
 * `retry-after` (a client would retry it for ever), and how to make it smaller.
 */
export function tooLargeForDeployments(group: string, tokens: number, largestTpm: number, smaller: string): GatewayError {
  return new GatewayError(
    errorInfo(429, `No deployments available for model ${group}: this request alone may use ${tokens} tokens, more than any of its deployments serves per minute (largest tpm ${largestTpm}); ${smaller}.`, "rate_limit_error"),
  );
}

/**
 * Ms until one of `candidates` has room for a call of `tokens`, or undefined when one has room now
 * (asked without counting: a slot taken to ask would refuse other calls meanwhile), or when none
 * ever will: a call larger than a deployment's whole `tpm` gains nothing by waiting for it, and
 * the caller's own refusal (which says how to make the call smaller) stands.
 */
export async function capacityWaitMs(windows: RateWindows, candidates: readonly Deployment[], tokens: number): Promise<number | undefined> {
  let wait = Number.POSITIVE_INFINITY;
  for (const d of candidates) {
    const counter = capacityCounter(d);
    if (!counter) return undefined;
    const refused = await windows.refusal([counter], counter.tpm === undefined ? 0 : tokens);
    if (!refused) return undefined;
    if (refused.kind === "tokens" && tokens > refused.limit) continue;
    wait = Math.min(wait, refused.retryAfterMs);
  }
  return Number.isFinite(wait) ? wait : undefined;
}

/** A call counted by `AwaitingCapacity`: `leave()` (idempotent) once it moved on; disposing leaves too. */
export interface Awaiting extends Disposable {
  leave(): void;
}

/** For a call no refusal waits for (no caller leases, or no deployment of its group counts rpm/tpm). */
export const NOT_AWAITING: Awaiting = { leave: () => undefined, [Symbol.dispose]: () => undefined };

/**
 * Calls of each model group that hold their caller's rate-limit leases and have not yet been counted
 * at a deployment's own rpm/tpm (nor refused by all of them). Under a burst at a group at capacity,
 * those the deployments are about to refuse hold slots of the caller's limits that they give back a
 * moment later; a caller refusal meanwhile waits for them to move on and asks again, rather than
 * blame requests that never ran. In-process: across instances the windows in Redis still race.
 */
class AwaitingCapacity {
  private readonly groups = new Map<string, { calls: number; movedOn: PromiseWithResolvers<void> }>();

  /** Counts a call of `group` as waiting until it leaves (or its `using` scope ends). */
  enter(group: string): Awaiting {
    let entry = this.groups.get(group);
    if (!entry) {
      entry = { calls: 0, movedOn: Promise.withResolvers() };
      this.groups.set(group, entry);
    }
    const e = entry;
    e.calls++;
    let left = false;
    const leave = () => {
      if (left) return;
      left = true;
      e.calls--;
      e.movedOn.resolve();
      if (e.calls > 0) e.movedOn = Promise.withResolvers();
      else if (this.groups.get(group) === e) this.groups.delete(group);
    };
    return { leave, [Symbol.dispose]: leave };
  }

  /** True once one of `group`'s waiting calls moves on; false at once when none waits, or after `ms`. */
  async oneMovesOn(group: string, ms: number): Promise<boolean> {
    const entry = this.groups.get(group);
    if (!entry || ms <= 0) return false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), ms);
    });
    try {
      return await Promise.race([entry.movedOn.promise.then(() => true as const), timedOut]);
    } finally {
      clearTimeout(timer);
    }
  }
}

export const awaitingCapacity = new AwaitingCapacity();

/** How long a caller refusal may wait for its group's calls to move on (they take a round trip or two). */
export const AWAIT_CAPACITY_MS = 500;
