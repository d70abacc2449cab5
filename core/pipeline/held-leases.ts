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
  /** What attempts that failed after using something cost (see `charge`). */
  private spent: { usage: Usage; cost: bigint } | undefined;
  /** Their `x-ratelimit-*` headers, the tightest of each kind. */
  readonly headers: Record<string, string>;

  constructor(private readonly leases: readonly Lease[]) {
    let headers = NO_HEADERS;
    for (const l of leases) if (l.headers) headers = tightest(headers, l.headers);
    this.headers = headers;
  }

  /**
   * An attempt failed after the upstream billed part of it (a split call's parts answered before
   * one failed): its cost and usage are added to whatever the leases are ended with.
   */
  charge(usage: Usage, cost: bigint): void {
    // NO_LEASES is shared: it holds nothing to charge.
    if (this.ended || this.leases.length === 0) return;
    const s = this.spent;
    this.spent = s ? { usage: { promptTokens: s.usage.promptTokens + usage.promptTokens, completionTokens: s.usage.completionTokens + usage.completionTokens }, cost: s.cost + cost } : { usage, cost };
  }

  settle(usage: Usage, cost: bigint): void {
    if (this.ended) return;
    this.ended = true;
    const s = this.spent;
    if (s) settleAll(this.leases, { ...usage, promptTokens: usage.promptTokens + s.usage.promptTokens, completionTokens: usage.completionTokens + s.usage.completionTokens }, cost + s.cost);
    else settleAll(this.leases, usage, cost);
  }

  /** Ends them without an answer: counted if some attempt went out (with what failed attempts were charged), else taken back. */
  giveUp(wentOut: boolean): void {
    if (this.ended) return;
    this.ended = true;
    if (this.spent) settleAll(this.leases, this.spent.usage, this.spent.cost);
    else if (wentOut) settleAll(this.leases, ZERO, 0n);
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
