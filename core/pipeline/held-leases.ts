/** Leases a call holds while it runs, ended once; and how their rate-limit headers combine. */
import type { Lease, Usage } from "../contract.ts";
import { ZERO } from "./call.ts";
import { cancelAll, settleAll } from "./record.ts";

/**
 * Leases held while a call (or a whole request) runs, ended once: settled with the usage it had,
 * or given up, counted if some attempt went out and taken back if none did.
 */
export class HeldLeases {
  private ended = false;
  /** Their `x-ratelimit-*` headers, the tightest of each kind. */
  readonly headers: Record<string, string>;

  constructor(private readonly leases: readonly Lease[]) {
    let headers: Record<string, string> = {};
    for (const l of leases) if (l.headers) headers = tightest(headers, l.headers);
    this.headers = headers;
  }

  settle(usage: Usage, cost: bigint): void {
    if (this.ended) return;
    this.ended = true;
    settleAll(this.leases, usage, cost);
  }

  giveUp(wentOut: boolean): void {
    if (this.ended) return;
    this.ended = true;
    if (wentOut) settleAll(this.leases, ZERO, 0n);
    else cancelAll(this.leases);
  }
}

export const NO_LEASES = new HeldLeases([]);

/** `x-ratelimit-*` of two grants: per kind, the one with less remaining. */
export function tightest(a: Record<string, string>, b: Record<string, string>): Record<string, string> {
  const out = { ...a };
  for (const kind of ["requests", "tokens"]) {
    const remaining = b[`x-ratelimit-remaining-${kind}`];
    if (remaining === undefined) continue;
    const current = out[`x-ratelimit-remaining-${kind}`];
    if (current !== undefined && Number(current) <= Number(remaining)) continue;
    out[`x-ratelimit-remaining-${kind}`] = remaining;
    const limit = b[`x-ratelimit-limit-${kind}`];
    if (limit !== undefined) out[`x-ratelimit-limit-${kind}`] = limit;
  }
  return out;
}
