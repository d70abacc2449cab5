/**
 * One counter's sliding window, in memory: the start time and token count of every request of the
 * last 60 s (a log, not buckets, so the window and `retry-after` are exact), and the requests in
 * flight. Entries are appended in time order and expire from the front.
 */
import type { CallIntent, RateCounter, RateLimitKind } from "../contract.ts";
import { answerTokens } from "../cost/worst-case.ts";

export const WINDOW_MS = 60_000;

/** Whole seconds until a request fits, never 0 (a client told 0 would retry at once and fail again). */
export const retryAfterSeconds = (ms: number): number => Math.max(1, Math.ceil(ms / 1000));

/** Tokens a call may use: the prompt estimate plus its output bound, max_tokens for each answer (the prompt alone when unbounded). */
export function tokenEstimate(intent: Pick<CallIntent, "estimatedPromptTokens" | "maxOutputTokens" | "answers">): number {
  return intent.estimatedPromptTokens + (intent.maxOutputTokens === undefined ? 0 : answerTokens(intent.maxOutputTokens, intent.answers));
}

/** How a request too large for a tpm limit can be made smaller: only chat and completions take max_tokens. */
export function howToShrink(endpoint: CallIntent["endpoint"]): string {
  return endpoint === "chat" || endpoint === "completions" ? "lower max_tokens" : "send less input";
}

/** A share counter as applied: its rpm/tpm are the pool's part for `members` active members. */
export function applyShare(c: RateCounter, members: number): RateCounter {
  const s = c.share;
  if (!s) return c;
  const part = (pool: number | undefined, own: number | undefined) => (pool === undefined ? own : Math.max(1, Math.floor(pool / Math.max(1, members))));
  return { ...c, rpm: part(s.rpm, c.rpm), tpm: part(s.tpm, c.tpm) };
}

export interface WindowCheck {
  kind: RateLimitKind;
  limit: number;
  current: number;
  retryAfterMs: number;
}

export class SlidingWindow {
  private times: number[] = [];
  private tokens: number[] = [];
  /** Index of the oldest live entry; entries before it have expired. */
  private head = 0;
  /** Sequence number of `times[0]`, so an entry keeps its number when the arrays are compacted. */
  private firstSeq = 0;
  /** Entries taken back (`cancel`) still in the window: they hold their place in time but count for nothing. */
  private readonly cancelled = new Set<number>();
  tokenSum = 0;
  inFlight = 0;

  get requests(): number {
    return this.times.length - this.head - this.cancelled.size;
  }

  prune(now: number): void {
    const cutoff = now - WINDOW_MS;
    const times = this.times;
    let h = this.head;
    while (h < times.length && times[h]! <= cutoff) {
      this.tokenSum -= this.tokens[h]!;
      if (this.cancelled.size > 0) this.cancelled.delete(this.firstSeq + h);
      h++;
    }
    this.head = h;
    // Compact once the dead prefix dominates, so memory follows the live window.
    if (h > 256 && h * 2 > times.length) {
      this.times = times.slice(h);
      this.tokens = this.tokens.slice(h);
      this.firstSeq += h;
      this.head = 0;
    }
  }

  /** The first limit a new request of `tokens` would break, with when it would fit; undefined when it fits. */
  check(c: RateCounter, tokens: number, now: number): WindowCheck | undefined {
    // Said before any other limit: no wait makes it fit (a caller told to wait for the rpm would
    // wait, then be told this), and the router does not wait for a deployment it can never fit.
    if (c.tpm !== undefined && tokens > c.tpm) return { kind: "tokens", limit: c.tpm, current: this.tokenSum, retryAfterMs: WINDOW_MS };
    const count = this.requests;
    if (c.rpm !== undefined && count + 1 > c.rpm) {
      // The request fits once enough of the oldest requests leave the window.
      const retryAfterMs = c.rpm === 0 ? WINDOW_MS : this.counted(count - c.rpm) + WINDOW_MS - now;
      return { kind: "requests", limit: c.rpm, current: count, retryAfterMs };
    }
    if (c.tpm !== undefined && this.tokenSum + tokens > c.tpm) {
      let retryAfterMs = WINDOW_MS;
      let freed = 0;
      for (let i = this.head; i < this.times.length; i++) {
        freed += this.tokens[i]!;
        if (this.tokenSum - freed + tokens <= c.tpm) {
          retryAfterMs = this.times[i]! + WINDOW_MS - now;
          break;
        }
      }
      return { kind: "tokens", limit: c.tpm, current: this.tokenSum, retryAfterMs };
    }
    if (c.parallel !== undefined && this.inFlight + 1 > c.parallel) {
      return { kind: "parallel_requests", limit: c.parallel, current: this.inFlight, retryAfterMs: 0 };
    }
    return undefined;
  }

  /** Start time of the `n`th request still counted (0 = the oldest). */
  private counted(n: number): number {
    if (this.cancelled.size === 0) return this.times[this.head + n]!;
    for (let i = this.head; i < this.times.length; i++) {
      if (this.cancelled.has(this.firstSeq + i)) continue;
      if (n-- === 0) return this.times[i]!;
    }
    return this.times[this.times.length - 1]!;
  }

  /** Counts a request; returns its sequence number for `settle`. */
  add(tokens: number, now: number): number {
    this.times.push(now);
    this.tokens.push(tokens);
    this.tokenSum += tokens;
    this.inFlight++;
    return this.firstSeq + this.times.length - 1;
  }

  /** Replaces a request's reserved tokens with its real count (if it is still in the window) and ends it. */
  settle(seq: number, actualTokens: number): void {
    const i = seq - this.firstSeq;
    if (i >= this.head && i < this.tokens.length) {
      this.tokenSum += actualTokens - this.tokens[i]!;
      this.tokens[i] = actualTokens;
    }
    this.inFlight--;
  }

  /** Takes a request back (refused by a later check before it went out) and ends it: it counts for nothing. */
  cancel(seq: number): void {
    const i = seq - this.firstSeq;
    if (i >= this.head && i < this.tokens.length && !this.cancelled.has(seq)) {
      this.tokenSum -= this.tokens[i]!;
      this.tokens[i] = 0;
      this.cancelled.add(seq);
    }
    this.inFlight--;
  }

  /** True when nothing is counted any more (the window can be dropped). */
  get idle(): boolean {
    return this.inFlight === 0 && this.requests === 0;
  }
}
