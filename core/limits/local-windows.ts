/** Rate-limit windows of one instance (no Redis, or Redis unreachable). */
import type { RateCounter, RateGrant, RateRefusal, RateWindows } from "../contract.ts";
import { SlidingWindow, WINDOW_MS } from "./window.ts";

const SWEEP_MS = WINDOW_MS;

export class LocalWindows implements RateWindows {
  private readonly windows = new Map<string, SlidingWindow>();
  private lastSweep = Date.now();

  constructor(private readonly clock: () => number = Date.now) {}

  acquire(counters: readonly RateCounter[], tokens: number): RateGrant | RateRefusal {
    const now = this.clock();
    if (now - this.lastSweep > SWEEP_MS) this.sweep(now);
    const windows: SlidingWindow[] = [];
    for (const c of counters) {
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
    const seqs = windows.map((w) => w.add(tokens, now));
    const remaining = counters.map((c, i) => ({
      requests: c.rpm === undefined ? undefined : c.rpm - windows[i]!.requests,
      tokens: c.tpm === undefined ? undefined : c.tpm - windows[i]!.tokenSum,
    }));
    let settled = false;
    return {
      ok: true,
      remaining,
      settle: (actual) => {
        if (settled) return;
        settled = true;
        for (const [i, w] of windows.entries()) w.settle(seqs[i]!, actual);
      },
    };
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
  }
}
