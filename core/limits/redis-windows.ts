/**
 * Rate-limit windows in Redis, shared by every instance. Per counter: a sorted set of the window's
 * requests (member = request id, score = start time in ms), a hash of their tokens (plus `sum`),
 * and a sorted set of requests in flight (score = when a lost one stops counting); per share pool, a
 * sorted set of its members (score = their last request), so a `dynamic` key's part is the same on
 * every instance. One Lua script checks every counter of a request and counts it on all or none,
 * using Redis's clock, so two instances enforce one limit exactly. While Redis is unreachable the instance counts alone and
 * says so; requests keep flowing.
 */
import type { Logger, RateCounter, RateGrant, RateLimitKind, RateRefusal, RateWindows } from "../contract.ts";
import { LuaScript, type ScriptRunner } from "../kv/scripts.ts";
import { AfterOutage } from "../kv/after-outage.ts";
import { LocalWindows } from "./local-windows.ts";
import { WINDOW_MS } from "./window.ts";

const PREFIX = "svc:rl:";
/**
 * An instance's liveness key (+ its id, the part of a request id before ':'). A request in flight
 * counts against max_parallel_requests until it ends, or its ttl (15 min) passes; an instance that
 * dies (SIGKILL, OOM, a lost node) ends none of its requests, and before, a key with
 * max_parallel_requests: 1 was refused on every instance for those 15 minutes. Now, when a request
 * would be refused for requests in flight, those of instances whose liveness key has lapsed are
 * dropped first. The key lasts LIVE_MS, set with every request counted and renewed every LIVE_MS / 3
 * while the instance has had requests within the ttl.
 */
const LIVE_PREFIX = "svc:rl-live:";
const LIVE_MS = 30_000;
const RENEW = new LuaScript("redis.call('SET', KEYS[1], '1', 'PX', ARGV[1]) return 0");

// KEYS: per counter (requests zset, tokens hash, in-flight zset, share members zset). ARGV: window
// ms, tokens, request id, in-flight ttl ms, then per counter rpm, tpm, parallel ('' = no limit),
// share member, share rpm pool, share tpm pool ('' = not a share).
// Returns {0, requests1, tokens1, rpm1, tpm1, …} when counted (limits as applied, '' = none), else
// {i, kind, current, retry-after ms, limit}. An empty request id only checks: no request is counted
// (a share still marks its member active).
const ACQUIRE = new LuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local win = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local id = ARGV[3]
local ttl = tonumber(ARGV[4])
local n = #KEYS / 4
local out = {0}
for i = 1, n do
  local z, h, p, a = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local arg = 4 + 6 * (i - 1)
  local rpm, tpm, par = ARGV[arg + 1], ARGV[arg + 2], ARGV[arg + 3]
  if ARGV[arg + 4] ~= '' then
    -- A share: the pool divided among the members active in the window, this one included.
    redis.call('ZADD', a, now, ARGV[arg + 4])
    redis.call('ZREMRANGEBYSCORE', a, '-inf', now - win)
    redis.call('PEXPIRE', a, win + 1000)
    local members = redis.call('ZCARD', a)
    if ARGV[arg + 5] ~= '' then rpm = tostring(math.max(1, math.floor(tonumber(ARGV[arg + 5]) / members))) end
    if ARGV[arg + 6] ~= '' then tpm = tostring(math.max(1, math.floor(tonumber(ARGV[arg + 6]) / members))) end
  end
  -- Every counter keeps its requests' tokens and those in flight, whatever limits it has now: a
  -- tpm or parallel limit set later counts what the window already holds (as in memory).
  local old = redis.call('ZRANGEBYSCORE', z, '-inf', now - win)
  if #old > 0 then
    local freed = 0
    for _, m in ipairs(old) do
      freed = freed + tonumber(redis.call('HGET', h, m) or '0')
      redis.call('HDEL', h, m)
    end
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now - win)
    -- (a Lua -0 would reach Redis as '-0', which HINCRBY refuses)
    if freed > 0 then redis.call('HINCRBY', h, 'sum', 0 - freed) end
  end
  -- A request larger than the whole tpm is said before any other limit: no wait makes it fit.
  if tpm ~= '' and tokens > tonumber(tpm) then
    return {i, 'tokens', tonumber(redis.call('HGET', h, 'sum') or '0'), win, tpm}
  end
  local count = redis.call('ZCARD', z)
  if rpm ~= '' and count + 1 > tonumber(rpm) then
    local r = tonumber(rpm)
    local retry = win
    if r > 0 then
      local e = redis.call('ZRANGE', z, count - r, count - r, 'WITHSCORES')
      retry = tonumber(e[2]) + win - now
    end
    return {i, 'requests', count, retry, rpm}
  end
  local sum = 0
  if tpm ~= '' then
    sum = tonumber(redis.call('HGET', h, 'sum') or '0')
    if sum + tokens > tonumber(tpm) then
      local lim = tonumber(tpm)
      local retry = win
      local entries = redis.call('ZRANGE', z, 0, -1, 'WITHSCORES')
      local freed = 0
      for j = 1, #entries, 2 do
        freed = freed + tonumber(redis.call('HGET', h, entries[j]) or '0')
        if sum - freed + tokens <= lim then
          retry = tonumber(entries[j + 1]) + win - now
          break
        end
      end
      return {i, 'tokens', sum, retry, tpm}
    end
  end
  if par ~= '' then
    redis.call('ZREMRANGEBYSCORE', p, '-inf', now)
    local inflight = redis.call('ZCARD', p)
    if inflight + 1 > tonumber(par) then
      -- Requests of an instance that died with them in flight (its liveness key lapsed) no longer count.
      for _, m in ipairs(redis.call('ZRANGE', p, 0, -1)) do
        local at = string.find(m, ':', 1, true)
        if at and redis.call('EXISTS', '${LIVE_PREFIX}' .. string.sub(m, 1, at - 1)) == 0 then redis.call('ZREM', p, m) end
      end
      inflight = redis.call('ZCARD', p)
      if inflight + 1 > tonumber(par) then return {i, 'parallel_requests', inflight, 0, par} end
    end
  end
  out[4 * i - 2] = count + 1
  out[4 * i - 1] = sum + tokens
  out[4 * i] = rpm
  out[4 * i + 1] = tpm
end
if id == '' then return out end
redis.call('SET', '${LIVE_PREFIX}' .. string.sub(id, 1, string.find(id, ':', 1, true) - 1), '1', 'PX', ${LIVE_MS})
for i = 1, n do
  local z, h, p = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1]
  redis.call('ZADD', z, now, id)
  redis.call('PEXPIRE', z, win + 1000)
  redis.call('HSET', h, id, tokens)
  if tokens ~= 0 then redis.call('HINCRBY', h, 'sum', tokens) end
  redis.call('PEXPIRE', h, win + 1000)
  redis.call('ZADD', p, now + ttl, id)
  redis.call('PEXPIRE', p, ttl + 1000)
end
return out
`);

// KEYS as above. ARGV: request id, actual tokens.
const SETTLE = new LuaScript(`
for i = 1, #KEYS / 4 do
  local h, p = KEYS[4 * i - 2], KEYS[4 * i - 1]
  local old = redis.call('HGET', h, ARGV[1])
  if old then
    redis.call('HSET', h, ARGV[1], ARGV[2])
    local delta = tonumber(ARGV[2]) - tonumber(old)
    if delta ~= 0 then redis.call('HINCRBY', h, 'sum', delta) end
  end
  redis.call('ZREM', p, ARGV[1])
end
return 0
`);

// KEYS as above. ARGV: request id. Takes the request out of every window, as if never counted.
const CANCEL = new LuaScript(`
for i = 1, #KEYS / 4 do
  local z, h, p = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1]
  redis.call('ZREM', z, ARGV[1])
  local old = redis.call('HGET', h, ARGV[1])
  if old then
    redis.call('HDEL', h, ARGV[1])
    if tonumber(old) ~= 0 then redis.call('HINCRBY', h, 'sum', 0 - tonumber(old)) end
  end
  redis.call('ZREM', p, ARGV[1])
end
return 0
`);

const NOTHING_TO_END = { settle: () => undefined, cancel: () => undefined };


/** The counter's keys, hash-tagged so one counter's keys share a cluster slot; a share's members are kept per pool. */
function keysOf(c: RateCounter): string[] {
  const tag = `${PREFIX}{${c.id}}`;
  return [`${tag}:r`, `${tag}:t`, `${tag}:p`, c.share ? `${PREFIX}{share:${c.share.among}}` : `${tag}:a`];
}

/** A limit as Redis returned it ('' = none). */
const limitOf = (v: unknown) => (v === "" || v === null || v === undefined ? undefined : Number(v));

const limitArg = (n: number | undefined) => (n === undefined ? "" : String(n));

export class RedisWindows implements RateWindows {
  private readonly local = new LocalWindows();
  private degraded = false;
  private readonly instance = crypto.randomUUID().slice(0, 8);
  private seq = 0;
  /** When this instance last counted a request; its liveness key is renewed while that is within the ttl. */
  private lastCounted = 0;
  /**
   * Scripts to run once Redis answers again: the CANCEL of a request whose acquire got no answer
   * (Redis may have counted it, then held it in flight for the whole ttl: a key with
   * max_parallel_requests 1 refused everywhere for 15 minutes), and a SETTLE or CANCEL that could
   * not be sent. Both act once however often they run.
   */
  private readonly pending = new AfterOutage<{ keys: string[]; script: LuaScript; args: (string | number)[] }>();
  /** The replay of `pending` under way, which every command that counts waits for. */
  private replaying: Promise<unknown> | undefined;
  private renewal: ReturnType<typeof setInterval> | undefined;

  /**
   * `inFlightTtlMs`: how long a request lost with its instance keeps counting as in flight.
   * `windowMs` is 60 s; tests shorten it to watch the window slide.
   */
  constructor(
    private readonly redis: ScriptRunner,
    private readonly log: Logger,
    private readonly inFlightTtlMs = 15 * 60_000,
    private readonly windowMs = WINDOW_MS,
  ) {}

  /** Runs ACQUIRE (`id` empty: only checks); undefined when Redis did not answer. */
  private async run(counters: readonly RateCounter[], tokens: number, id: string): Promise<(number | string)[] | undefined> {
    const args: (string | number)[] = [this.windowMs, tokens, id, this.inFlightTtlMs];
    for (const c of counters) args.push(limitArg(c.rpm), limitArg(c.tpm), limitArg(c.parallel), c.share?.member ?? "", limitArg(c.share?.rpm), limitArg(c.share?.tpm));
    try {
      // What ended during the outage ends in Redis first: else the first request after it is
      // judged with those still in flight (a key with max_parallel_requests 1 refused).
      if (this.replaying || !this.pending.empty) {
        const failed = await this.runPending();
        if (failed) throw failed;
      }
      const res = (await this.redis.run(ACQUIRE, counters.flatMap(keysOf), args)) as (number | string)[];
      this.recovered();
      return res;
    } catch (err) {
      this.degrade(err);
      return undefined;
    }
  }

  /** The refusal ACQUIRE answered, if it refused. */
  private refused(counters: readonly RateCounter[], res: (number | string)[]): RateRefusal | undefined {
    const head = Number(res[0]);
    if (head === 0) return undefined;
    const asked = counters[head - 1]!;
    const kind = String(res[1]) as RateLimitKind;
    const limit = Number(res[4]);
    const counter = !asked.share ? asked : kind === "requests" ? { ...asked, rpm: limit } : kind === "tokens" ? { ...asked, tpm: limit } : asked;
    return { ok: false, counter, kind, limit, current: Number(res[2]), retryAfterMs: Number(res[3]) };
  }

  async refusal(counters: readonly RateCounter[], tokens: number): Promise<RateRefusal | undefined> {
    if (counters.length === 0) return undefined;
    const res = await this.run(counters, tokens, "");
    return res ? this.refused(counters, res) : this.local.refusal(counters, tokens);
  }

  async acquire(counters: readonly RateCounter[], tokens: number): Promise<RateGrant | RateRefusal> {
    if (counters.length === 0) return { ok: true, applied: [], remaining: [], settle: () => undefined, cancel: () => undefined, part: () => NOTHING_TO_END };
    const keys = counters.flatMap(keysOf);
    const id = `${this.instance}:${++this.seq}`;
    const res = await this.run(counters, tokens, id);
    if (!res) {
      this.pending.add({ keys, script: CANCEL, args: [id] });
      return this.local.acquire(counters, tokens);
    }
    const refused = this.refused(counters, res);
    if (refused) return refused;
    this.keepAlive();
    const applied = counters.map((c, i) => (c.share ? { ...c, rpm: limitOf(res[4 * i + 3]), tpm: limitOf(res[4 * i + 4]) } : c));
    const remaining = applied.map((c, i) => ({
      requests: c.rpm === undefined ? undefined : c.rpm - Number(res[4 * i + 1]),
      tokens: c.tpm === undefined ? undefined : c.tpm - Number(res[4 * i + 2]),
    }));
    /** Ends the request on some of its counters' keys, once. */
    const ender = (on: string[]) => {
      let ended = false;
      const end = (script: LuaScript, args: (string | number)[], what: string) => {
        if (ended) return;
        ended = true;
        this.redis.run(script, on, args).catch((err) => {
          this.log.warn(`rate-limit ${what} failed in redis; it is sent again once redis answers`, { error: String(err) });
          this.pending.add({ keys: on, script, args });
          this.degrade(err);
        });
      };
      return {
        settle: (actual: number) => end(SETTLE, [id, Math.max(0, Math.round(actual))], "settle"),
        cancel: () => end(CANCEL, [id], "cancel"),
      };
    };
    return { ok: true, applied, remaining, ...ender(keys), part: (from, to) => ender(counters.slice(from, to).flatMap(keysOf)) };
  }

  /** Renews the liveness key while requests this instance counted may still be in flight. */
  private keepAlive(): void {
    this.lastCounted = Date.now();
    if (this.renewal) return;
    this.renewal = setInterval(() => {
      if (Date.now() - this.lastCounted > this.inFlightTtlMs) {
        clearInterval(this.renewal);
        this.renewal = undefined;
        return;
      }
      this.redis.run(RENEW, [LIVE_PREFIX + this.instance], [LIVE_MS]).catch(() => undefined);
    }, LIVE_MS / 3);
    this.renewal.unref?.();
  }

  private degrade(err: unknown): void {
    if (this.degraded) return;
    this.degraded = true;
    this.log.warn("redis unreachable: rate limits are counted on this instance alone until it is back", { error: String(err) });
  }

  private recovered(): void {
    if (!this.degraded) return;
    this.degraded = false;
    this.log.info("redis reachable again: rate limits are shared across instances again");
  }

  /** Sends the kept scripts, one replay at a time; the error that stopped it, if one did. */
  private runPending(): Promise<unknown> {
    this.replaying ??= this.pending.replay(({ keys, script, args }) => this.redis.run(script, keys, args)).finally(() => {
      this.replaying = undefined;
    });
    return this.replaying;
  }
}
