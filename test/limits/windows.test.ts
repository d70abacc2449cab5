// The sliding window itself, in memory (with a clock the test moves) and in Redis (with a short
// window): the (N+1)th request in the window is refused, capacity returns as the oldest requests
// leave it, retry-after says exactly when, refused requests consume nothing, tokens are settled to
// the real count, and all counters of a request are counted together or not at all.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { RateCounter, RateGrant, RateRefusal, RateWindows } from "../../core/contract.ts";
import { LocalWindows } from "../../core/limits/local-windows.ts";
import { nativeScriptRunner, type ScriptRunner } from "../../core/kv/scripts.ts";
import { RedisWindows } from "../../core/limits/redis-windows.ts";
import { memoryLogger } from "../harness/gateway.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

const uid = () => Math.random().toString(36).slice(2, 10);

function granted(r: RateGrant | RateRefusal): RateGrant {
  if (!r.ok) throw new Error(`refused: ${r.kind} ${r.current}/${r.limit}`);
  return r;
}
function refused(r: RateGrant | RateRefusal): RateRefusal {
  if (r.ok) throw new Error("granted");
  return r;
}

describe("in-memory sliding window", () => {
  let now = 1_000_000;
  const w = new LocalWindows(() => now);

  test("rpm: the 4th request within 60 s is refused; it fits again when the first leaves the window", () => {
    const c: RateCounter = { id: `k:${uid()}`, label: "Key a", rpm: 3 };
    granted(w.acquire([c], 0));
    now += 10_000;
    granted(w.acquire([c], 0));
    now += 10_000;
    const third = granted(w.acquire([c], 0));
    expect(third.remaining[0]!.requests).toBe(0);
    now += 5_000;
    const r = refused(w.acquire([c], 0));
    expect(r).toMatchObject({ kind: "requests", limit: 3, current: 3 });
    // The first request started 25 s ago: room again in 35 s.
    expect(r.retryAfterMs).toBe(35_000);
    // Refused requests consume nothing: asking again changes nothing.
    expect(refused(w.acquire([c], 0)).current).toBe(3);
    now += 34_999;
    refused(w.acquire([c], 0));
    now += 1;
    expect(granted(w.acquire([c], 0)).remaining[0]!.requests).toBe(0);
  });

  test("tpm: reserved from the estimate, settled to the real count; retry-after counts the tokens that must leave", () => {
    const c: RateCounter = { id: `k:${uid()}`, label: "Key b", tpm: 1000 };
    const a = granted(w.acquire([c], 600));
    expect(a.remaining[0]!.tokens).toBe(400);
    refused(w.acquire([c], 500));
    a.settle(100); // the call used far less than its estimate
    now += 20_000;
    const b = granted(w.acquire([c], 500));
    expect(b.remaining[0]!.tokens).toBe(400);
    b.settle(500);
    const r = refused(w.acquire([c], 500));
    expect(r).toMatchObject({ kind: "tokens", limit: 1000, current: 600 });
    // Leaving the first call's 100 tokens is enough: it started 20 s ago.
    expect(r.retryAfterMs).toBe(40_000);
    // A request larger than the whole limit never fits.
    expect(refused(w.acquire([c], 1001)).retryAfterMs).toBe(60_000);
  });

  test("a request larger than the whole tpm is refused for that, not for a used-up rpm: no wait makes it fit", () => {
    const c: RateCounter = { id: `k:${uid()}`, label: "Key g", rpm: 1, tpm: 1000 };
    granted(w.acquire([c], 10));
    expect(refused(w.acquire([c], 5000))).toMatchObject({ kind: "tokens", limit: 1000, retryAfterMs: 60_000 });
    // One that fits the tpm is refused for the rpm, and told when it fits.
    now += 1_000;
    expect(refused(w.acquire([c], 10))).toMatchObject({ kind: "requests", limit: 1, retryAfterMs: 59_000 });
  });

  test("parallel: a slot frees when a call ends, not when the window slides", () => {
    const c: RateCounter = { id: `k:${uid()}`, label: "Key c", parallel: 2 };
    const a = granted(w.acquire([c], 0));
    granted(w.acquire([c], 0));
    expect(refused(w.acquire([c], 0))).toMatchObject({ kind: "parallel_requests", current: 2 });
    a.settle(0);
    a.settle(0); // settling twice frees one slot, once
    granted(w.acquire([c], 0));
    expect(refused(w.acquire([c], 0)).kind).toBe("parallel_requests");
  });

  test("all or nothing: a refusal by the second counter leaves the first one untouched", () => {
    const key: RateCounter = { id: `k:${uid()}`, label: "Key d", rpm: 10 };
    const team: RateCounter = { id: `t:${uid()}`, label: "Team", rpm: 1 };
    granted(w.acquire([key, team], 0));
    const r = refused(w.acquire([key, team], 0));
    expect(r.counter.id).toBe(team.id);
    expect(w.usage(key.id).requests).toBe(1);
  });

  test("counted together, ended apart: one part of a grant settles or is taken back without the other", () => {
    const own: RateCounter = { id: `k:${uid()}`, label: "Key f", rpm: 5, tpm: 100 };
    const model: RateCounter = { id: `m:${uid()}`, label: "Key f for model=x", rpm: 5, tpm: 100 };
    const g = granted(w.acquire([own, model], 40));
    g.part(1, 2).cancel();
    expect([w.usage(own.id), w.usage(model.id)]).toEqual([
      { requests: 1, tokens: 40, inFlight: 1 },
      { requests: 0, tokens: 0, inFlight: 0 },
    ]);
    g.part(0, 1).settle(7);
    expect(w.usage(own.id)).toEqual({ requests: 1, tokens: 7, inFlight: 0 });
  });

  test("a request taken back (refused by a later check) frees its place, its tokens and its slot; retry-after skips it", () => {
    const c: RateCounter = { id: `k:${uid()}`, label: "Key e", rpm: 2, tpm: 100, parallel: 2 };
    const first = granted(w.acquire([c], 30));
    now += 10_000;
    const second = granted(w.acquire([c], 50));
    second.cancel();
    second.cancel(); // twice: taken back once
    expect(w.usage(c.id)).toEqual({ requests: 1, tokens: 30, inFlight: 1 });
    now += 10_000;
    const third = granted(w.acquire([c], 40));
    expect(third.remaining[0]).toEqual({ requests: 0, tokens: 30 });
    const r = refused(w.acquire([c], 0));
    expect(r).toMatchObject({ kind: "requests", current: 2 });
    // The oldest request still counted is the first (20 s ago), not the one taken back.
    expect(r.retryAfterMs).toBe(40_000);
    first.settle(30);
    now += 40_000;
    // The first left the window; the one taken back holds nothing when it leaves.
    expect(granted(w.acquire([c], 0)).remaining[0]).toEqual({ requests: 0, tokens: 60 });
    now += 10_000;
    expect(w.usage(c.id).tokens).toBe(40);
  });
});

describe("redis sliding window", () => {
  let redis: ScriptRunner;
  let windows: RateWindows;
  beforeAll(async () => {
    redis = nativeScriptRunner(TEST_REDIS_URL);
    await redis.ready();
    windows = new RedisWindows(redis, memoryLogger(), 60_000, 1500);
  });
  afterAll(() => redis.close());

  test("rpm over a 1.5 s window: refused at N+1, retry-after within the window, capacity returns as it slides", async () => {
    const c: RateCounter = { id: `k:${uid()}`, label: "Key r", rpm: 5 };
    for (let i = 0; i < 5; i++) {
      granted(await windows.acquire([c], 0));
      await Bun.sleep(100);
    }
    const r = refused(await windows.acquire([c], 0));
    expect(r).toMatchObject({ kind: "requests", limit: 5, current: 5 });
    // The first request left ~500 ms ago: it leaves the window in ~1 s.
    expect(r.retryAfterMs).toBeGreaterThan(900);
    expect(r.retryAfterMs).toBeLessThanOrEqual(1000);
    refused(await windows.acquire([c], 0));
    await Bun.sleep(r.retryAfterMs + 20);
    // Only the first request left: room for exactly one more.
    expect(granted(await windows.acquire([c], 0)).remaining[0]!.requests).toBe(0);
    refused(await windows.acquire([c], 0));
  });

  test("tpm settle and parallel slots are shared through redis", async () => {
    const c: RateCounter = { id: `k:${uid()}`, label: "Key s", tpm: 100, parallel: 2 };
    const a = granted(await windows.acquire([c], 80));
    expect(a.remaining[0]!.tokens).toBe(20);
    granted(await windows.acquire([c], 10));
    expect(refused(await windows.acquire([c], 5)).kind).toBe("parallel_requests");
    a.settle(30);
    await Bun.sleep(50);
    const b = granted(await windows.acquire([c], 50));
    expect(b.remaining[0]!.tokens).toBe(10);
  });

  test("a request larger than the whole tpm is refused for that, not for a used-up rpm", async () => {
    const c: RateCounter = { id: `k:${uid()}`, label: "Key x", rpm: 1, tpm: 1000 };
    granted(await windows.acquire([c], 10));
    // Told to wait the whole window, as in memory: it never fits.
    expect(refused(await windows.acquire([c], 5000))).toMatchObject({ kind: "tokens", limit: 1000, current: 10, retryAfterMs: 1500 });
    expect(await windows.refusal([c], 5000)).toMatchObject({ kind: "tokens", limit: 1000 });
    expect(refused(await windows.acquire([c], 10))).toMatchObject({ kind: "requests", limit: 1 });
  });

  test("all or nothing across counters", async () => {
    const key: RateCounter = { id: `k:${uid()}`, label: "Key t", rpm: 10 };
    const team: RateCounter = { id: `t:${uid()}`, label: "Team", rpm: 1 };
    granted(await windows.acquire([key, team], 0));
    expect(refused(await windows.acquire([key, team], 0)).counter.id).toBe(team.id);
    const solo = granted(await windows.acquire([key], 0));
    expect(solo.remaining[0]!.requests).toBe(8);
  });

  test("one part of a grant is taken back in redis without the other", async () => {
    const own: RateCounter = { id: `k:${uid()}`, label: "Key v", rpm: 1 };
    const model: RateCounter = { id: `m:${uid()}`, label: "Key v for model=x", rpm: 1 };
    const g = granted(await windows.acquire([own, model], 0));
    g.part(1, 2).cancel();
    await Bun.sleep(50);
    expect(refused(await windows.acquire([own], 0)).counter.id).toBe(own.id);
    expect(granted(await windows.acquire([model], 0)).remaining[0]!.requests).toBe(0);
  });

  test("a request taken back frees its place, its tokens and its slot on every instance", async () => {
    const c: RateCounter = { id: `k:${uid()}`, label: "Key u", rpm: 2, tpm: 100, parallel: 2 };
    granted(await windows.acquire([c], 30));
    const second = granted(await windows.acquire([c], 50));
    second.cancel();
    await Bun.sleep(50);
    const other = new RedisWindows(redis, memoryLogger(), 60_000, 1500);
    const third = granted(await other.acquire([c], 40));
    expect(third.remaining[0]).toEqual({ requests: 0, tokens: 30 });
    expect(refused(await other.acquire([c], 0))).toMatchObject({ kind: "requests", current: 2 });
  });
});

// A limit set on a counter that is already counting (a key given a tpm_limit or a
// max_parallel_requests while it has calls in the window): the requests it counted before hold
// their tokens and slots for the new limit too, in memory and in Redis alike.
describe("a limit added to a counter in use counts what the window already holds", () => {
  let redis: ScriptRunner;
  beforeAll(async () => {
    redis = nativeScriptRunner(TEST_REDIS_URL);
    await redis.ready();
  });
  afterAll(() => redis.close());

  for (const kind of ["memory", "redis"] as const) {
    test(`${kind}: tokens settled and calls in flight before the limit existed`, async () => {
      const w: RateWindows = kind === "memory" ? new LocalWindows() : new RedisWindows(redis, memoryLogger());
      const id = `k:${uid()}`;
      // Only an rpm limit: no tokens reserved, the real count settled.
      const before: RateCounter = { id, label: "Key w", rpm: 10 };
      (granted(await w.acquire([before], 0))).settle(60);
      const inFlight = granted(await w.acquire([before], 0));
      await Bun.sleep(20);
      // Now with tpm 100 and one call at a time: 60 tokens are used and one call is in flight.
      const after: RateCounter = { id, label: "Key w", rpm: 10, tpm: 100 };
      expect(refused(await w.acquire([after], 50))).toMatchObject({ kind: "tokens", current: 60 });
      expect(granted(await w.acquire([after], 40)).remaining[0]).toEqual({ requests: 7, tokens: 0 });
      expect(refused(await w.acquire([{ ...after, tpm: undefined, parallel: 2 }], 0))).toMatchObject({ kind: "parallel_requests", current: 2 });
      inFlight.settle(0);
    });
  }
});
