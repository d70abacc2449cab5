/** Leases a call holds while it runs, ended once; and how their rate-limit headers combine. */
import type { Lease, Usage } from "../contract.ts";
import { ZERO } from "./call.ts";
import { cancelAll, settleAll } from "./record.ts";

/** Shared by every holder without rate-limit headers; `tightest` copies before it adds any. */
const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({});

/**
 * Leases held while a call (or a whole request) runs, ended once: settled with the usage it had,
 * or given up, counted if some attempt went out and taken back if none did.
 */
export class HeldLeases {
  private ended = false;
  /** Their `x-ratelimit-*` headers, the tightest of each kind. */
  readonly headers: Record<string, string>;

  constructor(private readonly leases: readonly Lease[]) {
    let headers = NO_HEADERS;
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

const KINDS = [
  { remaining: "x-ratelimit-remaining-requests", limit: "x-ratelimit-limit-requests" },
  { remaining: "x-ratelimit-remaining-tokens", limit: "x-ratelimit-limit-tokens" },
] as const;

/**
 * `x-ratelimit-*` of two grants: per kind, the one with less remaining. Neither argument is
 * changed; when `b` tightens nothing, `a` itself is the answer (this runs on every call).
 */
export function tightest(a: Record<string, string>, b: Record<string, string>): Record<string, string> {
  let out = a;
  for (const { remaining, limit } of KINDS) {
    const theirs = b[remaining];
    if (theirs === undefined) continue;
    const current = out[remaining];
    if (current !== undefined && Number(current) <= Number(theirs)) continue;
    if (out === a) out = { ...a };
    out[remaining] = theirs;
    const cap = b[limit];
    if (cap !== undefined) out[limit] = cap;
  }
  return out;
}
