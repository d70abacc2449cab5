/** Rate-limit windows of one instance (no Redis, or Redis unreachable). */
import type { RateCounter, RateGrant, RateRefusal, RateWindows } from "../contract.ts";
import { applyShare, SlidingWindow, WINDOW_MS } from "./window.ts";

const SWEEP_MS = WINDOW_MS;

export class LocalWindows implements RateWindows {
  private readonly windows = new Map<string, SlidingWindow>();
  /** Per share pool: when each member last counted a request on it. */
  private readonly members = new Map<string, Map<string, number>>();
  private lastSweep = Date.now();

  constructor(private readonly clock: () => number = Date.now) {}

  refusal(counters: readonly RateCounter[], tokens: number): RateRefusal | undefined {
    const checked = this.check(counters, tokens, this.clock());
    return "ok" in checked ? checked : undefined;
  }

  /** Every counter's window, or the first refusal. */
  private check(counters: readonly RateCounter[], tokens: number, now: number): RateRefusal | { windows: SlidingWindow[]; applied: RateCounter[] } {
    if (now - this.lastSweep > SWEEP_MS) this.sweep(now);
    const windows: SlidingWindow[] = [];
    const applied: RateCounter[] = [];
    for (const asked of counters) {
      const c = asked.share ? applyShare(asked, this.activeMembers(asked.share, now)) : asked;
      applied.push(c);
      let w = this.windows.get(c.id);
      if (!w) {
        w = new SlidingWindow();
        this.windows.set(c.id, w);
      }
      w.prune(now);
      const refused = w.check(c, tokens, now);
      if (refused) return { ok: false, counter: c, ...refused };
      windows.push(w);
    }
    return { windows, applied };
  }

  acquire(counters: readonly RateCounter[], tokens: number): RateGrant | RateRefusal {
    const now = this.clock();
    const checked = this.check(counters, tokens, now);
    if ("ok" in checked) return checked;
    const { windows, applied } = checked;
    const seqs = windows.map((w) => w.add(tokens, now));
    const remaining = applied.map((c, i) => ({
      requests: c.rpm === undefined ? undefined : c.rpm - windows[i]!.requests,
      tokens: c.tpm === undefined ? undefined : c.tpm - windows[i]!.tokenSum,
    }));
    /** Ends the request on counters `from` to `to`, once. */
    const ender = (from: number, to: number) => {
      let ended = false;
      const end = (fn: (w: SlidingWindow, seq: number) => void) => {
        if (ended) return;
        ended = true;
        for (let i = from; i < to; i++) fn(windows[i]!, seqs[i]!);
      };
      return { settle: (actual: number) => end((w, seq) => w.settle(seq, actual)), cancel: () => end((w, seq) => w.cancel(seq)) };
    };
    return { ok: true, applied, remaining, ...ender(0, windows.length), part: ender };
  }

  /** Marks the share's member active on its pool now; returns how many members are. */
  private activeMembers(share: NonNullable<RateCounter["share"]>, now: number): number {
    let seen = this.members.get(share.among);
    if (!seen) {
      seen = new Map();
      this.members.set(share.among, seen);
    }
    seen.set(share.member, now);
    for (const [m, at] of seen) if (at <= now - WINDOW_MS) seen.delete(m);
    return seen.size;
  }

  /** What a counter holds now (tests, `/health`). */
  usage(id: string): { requests: number; tokens: number; inFlight: number } {
    const w = this.windows.get(id);
    if (!w) return { requests: 0, tokens: 0, inFlight: 0 };
    w.prune(this.clock());
    return { requests: w.requests, tokens: w.tokenSum, inFlight: w.inFlight };
  }

  private sweep(now: number): void {
    this.lastSweep = now;
    for (const [id, w] of this.windows) {
      w.prune(now);
      if (w.idle) this.windows.delete(id);
    }
    for (const [among, seen] of this.members) {
      for (const [m, at] of seen) if (at <= now - WINDOW_MS) seen.delete(m);
      if (seen.size === 0) this.members.delete(among);
    }
  }
}
