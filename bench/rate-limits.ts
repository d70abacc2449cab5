/**
 * What the rate limiter adds to a call: the built-in plugin's `acquire` (building the counters of a
 * key with rpm, tpm and parallel limits in a team with an rpm limit) plus `settle`, timed one call
 * at a time, in memory and against Redis (one Lua round trip each way; settle is not awaited on the
 * request path, so only acquire is on it). Also Redis acquisitions per second at 64 in flight.
 *
 *   bun bench/rate-limits.ts [--calls 100000] [--redis redis://127.0.0.1:6379]
 */
import { parseArgs } from "node:util";
import { NO_MODEL_REACH } from "../core/limits/capacity.ts";
import type { CallIntent, Hooks, IdentityView, KeyRow, Lease, PluginContext, Principal, RateWindows, TeamRow } from "../core/contract.ts";
import { nativeScriptRunner } from "../core/kv/scripts.ts";
import { LocalWindows } from "../core/limits/local-windows.ts";
import { RedisWindows } from "../core/limits/redis-windows.ts";
import rateLimits from "../plugins/rate-limits.ts";

const { values } = parseArgs({ args: Bun.argv.slice(2), options: { calls: { type: "string" }, redis: { type: "string" } } });
const CALLS = Number(values.calls ?? 100_000);
const REDIS_URL = values.redis ?? process.env.REDIS_URL ?? "redis://127.0.0.1:6379";

const key = { token: "a".repeat(64), keyName: "sk-...bench", rpmLimit: 1e9, tpmLimit: 1e12, maxParallelRequests: 1e6, models: [], teamId: "t1", budgetId: null, modelRpmLimit: null, modelTpmLimit: null } as unknown as KeyRow;
const team = { teamId: "t1", rpmLimit: 1e9, tpmLimit: null, maxParallelRequests: null, budgetId: null, modelRpmLimit: null, modelTpmLimit: null, models: [] } as unknown as TeamRow;
const identity: IdentityView = {
  lookupKey: () => key,
  keys: new Map([[key.token, key]]),
  keyByCounterToken: () => key,
  teams: new Map([["t1", team]]),
  orgs: new Map(),
  users: new Map(),
  budgets: new Map(),
  onChange: () => () => undefined,
  teamMember: () => undefined,
  touch: () => undefined,
};
const principal: Principal = { keyHash: key.token, role: "internal_user", teamId: "t1", metadata: {}, key, team };
const deployment = { id: "d", modelName: "m", provider: "openai", upstreamModel: "m", options: {}, info: {} };
const intent = (): CallIntent => ({
  principal,
  endpoint: "chat",
  scope: "request",
  modelGroup: "m",
  modelNames: ["m"],
  deployment,
  estimatedPromptTokens: 20,
  promptTokenBound: 60,
  maxOutputTokens: 100,
  answers: 1,
  worstCaseCost: 0n,
  startedAt: Date.now(),
  capacityGroup: "m",
  groupCapacity: {},
  modelReach: NO_MODEL_REACH,
});

async function limiter(windows: RateWindows): Promise<NonNullable<Hooks["rateLimiter"]>> {
  const ctx = { log: console, settings: { masterKey: undefined, providerBudgets: {} }, identity, rateWindows: windows } as unknown as PluginContext;
  return (await rateLimits.setup({}, ctx)).rateLimiter!;
}

function pct(sorted: Float64Array, p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

const USAGE = { promptTokens: 20, completionTokens: 80 };

async function sequential(name: string, windows: RateWindows, n: number): Promise<string> {
  const rl = await limiter(windows);
  const times = new Float64Array(n);
  for (let i = 0; i < Math.min(n, 2000); i++) {
    const l = (await rl.acquire(intent())) as Lease;
    l.settle(USAGE, 0n);
  }
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const got = rl.acquire(intent());
    const l = (got instanceof Promise ? await got : got) as Lease;
    times[i] = performance.now() - t0;
    if (!l.ok) throw new Error("refused");
    l.settle(USAGE, 0n);
  }
  times.sort();
  const us = (ms: number) => `${(ms * 1000).toFixed(1)} µs`;
  return `| ${name} | ${n} | ${us(pct(times, 50))} | ${us(pct(times, 90))} | ${us(pct(times, 99))} |`;
}

async function concurrent(windows: RateWindows, n: number, inFlight: number): Promise<number> {
  const rl = await limiter(windows);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (next++ < n) {
        const l = (await rl.acquire(intent())) as Lease;
        l.settle(USAGE, 0n);
      }
    }),
  );
  return n / ((performance.now() - t0) / 1000);
}

const rows = ["| limiter | calls | p50 | p90 | p99 |", "|---|---|---|---|---|"];
rows.push(await sequential("in memory", new LocalWindows(), CALLS));
const redis = nativeScriptRunner(REDIS_URL);
await redis.ready();
const inRedis = new RedisWindows(redis, console);
rows.push(await sequential("redis (one Lua round trip)", inRedis, Math.min(CALLS, 20_000)));
const rate = await concurrent(inRedis, 20_000, 64);
await Bun.sleep(200);
redis.close();
console.log(rows.join("\n"));
console.log(`\nredis: ${Math.round(rate)} acquisitions/s with 64 in flight (one connection)`);
