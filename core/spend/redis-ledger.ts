/**
 * The budget ledger in Redis, shared by every instance: one hash per counter (`s` spend, `r`
 * reserved, `p` period), and one Lua script that checks and reserves on all of a call's counters
 * in one round trip. While Redis is unreachable the instance falls back to its local ledger (and
 * says so); calls keep flowing.
 *
 * Amounts are integers of pico-dollars, added with HINCRBY (exact in 64 bits). Comparisons inside
 * Lua use doubles: exact up to 2^53 pico-dollars (about $9,000) and within a few pico-dollars
 * beyond, far below a cent.
 *
 * Reservations are also kept per instance (`r:<instance>` beside the total `r`), and each instance
 * keeps a liveness key (`svc:budget-live:<instance>`, 30 s, renewed every 10 s while it has calls in
 * flight). An instance that dies with calls in flight (SIGKILL, OOM, a lost node) cannot settle
 * them: before, their reservations stayed in `r` for good, and a budget refused every call while
 * its spend was 0 ("$1 held by calls in flight"; LiteLLM's false budget-exceeded class, #36926,
 * PR #38647). When a call would be refused while reservations are held, those of instances whose
 * liveness key is gone are released first.
 */
import type Redis from "ioredis";
import type { BudgetCounter, BudgetLedger, LedgerGrant, LedgerRefusal, Logger } from "../contract.ts";
import { AfterOutage } from "../kv/after-outage.ts";
import { type CrossingListener, crossings, grantOnce, LocalLedger, laterThanDefinition, NO_LIMIT, refusedAtLimit } from "./ledger.ts";

const PREFIX = "svc:budget:";
/** An instance's liveness key (+ its id): while it is there, the instance's reservations hold. */
const LIVE_PREFIX = "svc:budget-live:";
/** How long a liveness key lasts; renewed every LIVE_MS / 3 while the instance has calls in flight. */
const LIVE_MS = 30_000;
/**
 * A reservation's own key while it is held (+ its id; fields: each counter's generation), and the
 * mark of one given up by its caller. An answer can be lost (a timeout, a dropped connection) while
 * Redis did run the command, and ioredis sends a command again after a reconnect: with them a
 * reservation is taken at most once and given back (settled, or voided by a caller that never had
 * the answer) exactly once. Both expire: a call does not outlive them.
 */
const HELD_PREFIX = "svc:budget-held:";
const VOID_PREFIX = "svc:budget-void:";
const HELD_MS = 24 * 3_600_000;

// ARGV: amount, then per counter: limit, period, initial spend ('' when not known yet), the
// period's length in ms (0: none), when it was defined (BudgetCounter.periodMs, definedAt) and
// '1' when the asked period began after that definition (ledger.ts laterThanDefinition).
// A stored period whose end is not a whole number of periods from the asked one is the same
// period, its end moved by a write (a new budget_duration): it carries on, and takes the asked end
// when the asked definition is the newer (`d`), as the local ledger does; unless the asked period
// is a later one of that definition (the moved end has passed too): that one starts from the store.
// Returns {0, generation…} when granted, {-1, i…} for counters that need their stored spend
// first, {-2} when its caller gave it up already, or {i, spend, reserved} for the counter that
// refused. A counter's generation (`g`) is new each time it starts from a stored spend, so a
// settle can tell whether its reservation is still there.
// The last ARGV are the reservation's id and the instance's id. The same reservation run again
// (sent again after a reconnect) is granted as it was, and takes nothing more.
const RESERVE = `
local amount = ARGV[1]
local amt = tonumber(amount)
local inst = ARGV[#ARGV]
local held = '${HELD_PREFIX}' .. ARGV[#ARGV - 1]
if redis.call('EXISTS', '${VOID_PREFIX}' .. ARGV[#ARGV - 1]) == 1 then return {-2} end
if redis.call('EXISTS', held) == 1 then
  local again = {0}
  for i = 1, #KEYS do again[i + 1] = redis.call('HGET', held, tostring(i)) or '' end
  return again
end
local missing = {}
for i = 1, #KEYS do
  local base = 1 + (i - 1) * 6
  local want = ARGV[base + 2]
  local ms = tonumber(ARGV[base + 4])
  local defined = tonumber(ARGV[base + 5])
  local p = redis.call('HGET', KEYS[i], 'p')
  local stale = (not p) or (p ~= want and not (p ~= 'flat' and want ~= 'flat' and tonumber(p) > tonumber(want)))
  if p and p ~= want and p ~= 'flat' and want ~= 'flat' and ms > 0 and (tonumber(p) - tonumber(want)) % ms ~= 0 then
    stale = false
    if defined > tonumber(redis.call('HGET', KEYS[i], 'd') or '0') then
      if ARGV[base + 6] == '1' then stale = true else redis.call('HSET', KEYS[i], 'p', want, 'd', defined) end
    end
  end
  if stale then
    local init = ARGV[base + 3]
    if init == '' then
      missing[#missing + 1] = i
    else
      for _, f in ipairs(redis.call('HKEYS', KEYS[i])) do
        if string.sub(f, 1, 2) == 'r:' then redis.call('HDEL', KEYS[i], f) end
      end
      redis.call('HSET', KEYS[i], 's', init, 'r', 0, 'p', want, 'd', defined, 'g', redis.call('INCR', 'svc:budget-generation'))
    end
  end
end
if #missing > 0 then
  table.insert(missing, 1, -1)
  return missing
end
for i = 1, #KEYS do
  local limit = tonumber(ARGV[1 + (i - 1) * 6 + 1])
  local s = redis.call('HGET', KEYS[i], 's')
  local r = redis.call('HGET', KEYS[i], 'r')
  local sn = tonumber(s)
  if sn < limit and tonumber(r) > 0 and sn + tonumber(r) + amt > limit then
    -- Reservations of instances that died with their calls in flight no longer hold.
    local f = redis.call('HGETALL', KEYS[i])
    for j = 1, #f, 2 do
      local name = f[j]
      if string.sub(name, 1, 2) == 'r:' and redis.call('EXISTS', '${LIVE_PREFIX}' .. string.sub(name, 3)) == 0 then
        local v = f[j + 1]
        if string.sub(v, 1, 1) == '-' then v = string.sub(v, 2) else v = '-' .. v end
        redis.call('HINCRBY', KEYS[i], 'r', v)
        redis.call('HDEL', KEYS[i], name)
      end
    end
    r = redis.call('HGET', KEYS[i], 'r')
  end
  if sn >= limit or sn + tonumber(r) + amt > limit then
    return {i, s, r}
  end
end
redis.call('SET', '${LIVE_PREFIX}' .. inst, '1', 'PX', ${LIVE_MS})
local out = {0}
for i = 1, #KEYS do
  redis.call('HINCRBY', KEYS[i], 'r', amount)
  redis.call('HINCRBY', KEYS[i], 'r:' .. inst, amount)
  out[i + 1] = redis.call('HGET', KEYS[i], 'g') or ''
  redis.call('HSET', held, tostring(i), out[i + 1])
end
redis.call('PEXPIRE', held, ${HELD_MS})
return out
`;

// ARGV: reserved amount, actual cost, then per counter the period and generation the reservation
// was taken in. A counter that moved to a new period meanwhile keeps its fresh start: the old
// reservation is dropped. One read again from the store in the same period (a spend reset) holds
// no reservation of the call, but the call's cost counts there, as in the stored spend. One whose
// end a write moved (same generation, another period) still holds it: released, and the cost counts. The new
// spend is read back as the stored text: HINCRBY's reply is a Lua double, which tostring writes
// with 14 digits ("1.2345678901234e+14" from $123.45 up), not the integer.
// The last ARGV are the reservation's id ('' for spend counted without one: a call the local
// ledger granted), 'void' when its caller never had the reservation's answer (it is given back, and
// marked given up should it run later), and the settling instance's id: its own part of the
// reservation is released with the total (no more than that part holds: one released as its
// instance's meanwhile is not released twice). A reservation settles once: run again, it does nothing.
const SETTLE = `
local inst = ARGV[#ARGV]
local rid = ARGV[#ARGV - 2]
local gens = {}
for i = 1, #KEYS do gens[i] = ARGV[2 + 2 * i] end
if rid ~= '' then
  local held = '${HELD_PREFIX}' .. rid
  if ARGV[#ARGV - 1] == 'void' then redis.call('SET', '${VOID_PREFIX}' .. rid, '1', 'PX', ${HELD_MS}) end
  if redis.call('EXISTS', held) == 0 then
    local none = {}
    for i = 1, #KEYS do none[i] = '' end
    return none
  end
  for i = 1, #KEYS do gens[i] = redis.call('HGET', held, tostring(i)) or '' end
  redis.call('DEL', held)
end
local out = {}
for i = 1, #KEYS do
  local same = gens[i] ~= '' and (redis.call('HGET', KEYS[i], 'g') or '') == gens[i]
  if same or redis.call('HGET', KEYS[i], 'p') == ARGV[1 + 2 * i] then
    if ARGV[1] ~= '0' and same then
      local mine = redis.call('HGET', KEYS[i], 'r:' .. inst)
      if mine and tonumber(mine) > 0 then
        local take = ARGV[1]
        if tonumber(mine) < tonumber(take) then take = mine end
        redis.call('HINCRBY', KEYS[i], 'r', '-' .. take)
        if redis.call('HINCRBY', KEYS[i], 'r:' .. inst, '-' .. take) <= 0 then redis.call('HDEL', KEYS[i], 'r:' .. inst) end
      end
    end
    redis.call('HINCRBY', KEYS[i], 's', ARGV[2])
    out[i] = redis.call('HGET', KEYS[i], 's')
  else
    out[i] = ''
  end
end
return out
`;

type RedisWithScripts = Redis & {
  svcBudgetReserve(numKeys: number, ...args: string[]): Promise<(number | string)[]>;
  svcBudgetSettle(numKeys: number, ...args: string[]): Promise<string[]>;
};

const periodText = (c: BudgetCounter) => (c.periodEnd === null ? "flat" : String(c.periodEnd));

export class RedisLedger implements BudgetLedger {
  private readonly redis: RedisWithScripts;
  /** Follows the shared counters; counts alone while Redis is away. */
  private readonly local: LocalLedger;
  private degraded = false;
  /** Spend settled on the local ledger while Redis was away, added to Redis once it is back. */
  private unsynced = new Map<string, { counter: BudgetCounter; amount: bigint }>();
  /** This instance's id in the shared counters (its part of their reservations, its liveness key). */
  private readonly instance = crypto.randomUUID();
  /** Calls granted in Redis and not settled yet; while there are any, the liveness key is renewed. */
  private inFlight = 0;
  private renewal: ReturnType<typeof setInterval> | undefined;
  /** Numbers this instance's reservations (their id: instance and number). */
  private reservations = 0;
  /** Settle script runs whose answer did not come (a reservation given up, a settle): each acts once however often it runs (HELD_PREFIX). */
  private readonly retries = new AfterOutage<{ keys: string[]; args: string[] }>();

  constructor(
    redis: Redis,
    private readonly log: Logger,
    private readonly onCross?: CrossingListener,
  ) {
    redis.defineCommand("svcBudgetReserve", { lua: RESERVE });
    redis.defineCommand("svcBudgetSettle", { lua: SETTLE });
    this.redis = redis as RedisWithScripts;
    this.local = new LocalLedger(onCross);
  }

  async reserve(counters: readonly BudgetCounter[], amount: bigint): Promise<LedgerGrant | LedgerRefusal> {
    if (counters.length === 0) return { ok: true, settle: () => undefined };
    const keys = counters.map((c) => PREFIX + c.id);
    const known = new Map<number, bigint>();
    const rid = `${this.instance}:${++this.reservations}`;
    // Sent on a ready connection: Redis may run it even when its answer never comes back (not
    // ready, ioredis refuses it unsent, with no offline queue).
    let mayHaveRun = false;
    try {
      for (let attempt = 0; attempt < 3; attempt++) {
        const args: string[] = [amount.toString()];
        // A counter the call is only charged to is checked against a limit it cannot reach.
        for (const [i, c] of counters.entries()) {
          args.push((c.chargeOnly ? NO_LIMIT : c.limit).toString(), periodText(c), known.get(i)?.toString() ?? "", String(c.periodMs ?? 0), String(c.definedAt ?? 0), laterThanDefinition(c) ? "1" : "0");
        }
        mayHaveRun ||= this.redis.status === "ready";
        const res = await this.redis.svcBudgetReserve(keys.length, ...keys, ...args, rid, this.instance);
        this.recovered();
        const head = Number(res[0]);
        if (head === 0) return this.grant(counters, keys, amount, rid);
        if (head === -2) throw new Error("the reservation was given up");
        if (head > 0) {
          const refused = { ok: false as const, counter: counters[head - 1]!, spend: BigInt(String(res[1])), reserved: BigInt(String(res[2])) };
          refusedAtLimit(refused.counter, refused.spend, this.onCross);
          return refused;
        }
        // Counters Redis has not seen this period: read their stored spend, then ask again.
        for (const i of res.slice(1).map(Number)) known.set(i - 1, await counters[i - 1]!.storedSpend());
      }
      throw new Error("budget counters kept changing period");
    } catch (err) {
      this.degrade(err);
      // Redis may have taken it with the answer lost: given back once Redis answers (or marked given up, should it run later).
      if (mayHaveRun) this.retries.add({ keys, args: [amount.toString(), "0", ...counters.flatMap((c) => [periodText(c), ""]), rid, "void", this.instance] });
      const local = await this.local.reserve(counters, amount);
      if (!local.ok) return local;
      return {
        ok: true,
        settle: (actual: bigint) => {
          local.settle(actual);
          if (!this.degraded) {
            void this.redis
              .svcBudgetSettle(keys.length, ...keys, "0", actual.toString(), ...counters.flatMap((c) => [periodText(c), ""]), "", "spend", this.instance)
              .catch((err) => this.log.warn("budget settle failed in redis; the spend log still has the call", { error: String(err) }));
            return;
          }
          for (const c of counters) {
            const k = `${c.id}\u0000${periodText(c)}`;
            const cur = this.unsynced.get(k);
            if (cur) cur.amount += actual;
            else this.unsynced.set(k, { counter: c, amount: actual });
          }
        },
      };
    }
  }

  /** Adds what was settled locally during an outage to the shared counters (same period only). */
  private async syncLocalSpend(): Promise<void> {
    const pending = [...this.unsynced.values()];
    this.unsynced = new Map();
    for (const { counter, amount } of pending) {
      try {
        await this.redis.svcBudgetSettle(1, PREFIX + counter.id, "0", amount.toString(), periodText(counter), "", "", "spend", this.instance);
      } catch (err) {
        this.log.warn("could not add spend counted during the redis outage; the store still has it", { budget: counter.label, error: String(err) });
      }
    }
  }

  private async runRetries(): Promise<void> {
    const failed = await this.retries.replay(({ keys, args }) => this.redis.svcBudgetSettle(keys.length, ...keys, ...args));
    if (failed) this.degrade(failed);
  }

  private grant(counters: readonly BudgetCounter[], keys: string[], amount: bigint, rid: string): LedgerGrant {
    this.began();
    return grantOnce((actual: bigint) => {
      this.ended();
      // The generations the reservation was taken in are read from its own key in Redis.
      const args = [amount.toString(), actual.toString(), ...counters.flatMap((c) => [periodText(c), ""]), rid, "settle", this.instance];
      this.redis
        .svcBudgetSettle(keys.length, ...keys, ...args)
        .then((after) => {
          for (const [i, s] of after.entries()) {
            if (s === "") continue;
            const spend = BigInt(s);
            // The local ledger follows the shared figures, so an outage starts from them.
            this.local.observe(counters[i]!, spend);
            crossings(counters[i]!, spend - actual, spend, this.onCross);
          }
        })
        .catch((err) => {
          this.log.warn("budget settle got no answer from redis; it is sent again once redis answers (and counts once)", { error: String(err) });
          this.retries.add({ keys, args });
          this.degrade(err);
        });
    });
  }

  /** A call granted in Redis: its reservation holds while this instance's liveness key is there. */
  private began(): void {
    if (this.inFlight++ > 0) return;
    this.renewal = setInterval(() => {
      this.redis.set(LIVE_PREFIX + this.instance, "1", "PX", LIVE_MS).catch(() => undefined);
    }, LIVE_MS / 3);
    this.renewal.unref?.();
  }

  private ended(): void {
    if (--this.inFlight > 0) return;
    clearInterval(this.renewal);
    this.renewal = undefined;
  }

  async forget(ids: readonly string[]): Promise<void> {
    await this.local.forget(ids);
    if (ids.length > 0) await this.redis.del(...ids.map((id) => PREFIX + id));
  }

  forgetHere(ids: readonly string[]): Promise<void> {
    return this.local.forget(ids);
  }

  private degrade(err: unknown): void {
    if (this.degraded) return;
    this.degraded = true;
    this.log.warn("redis unreachable: budgets are counted on this instance alone until it is back", { error: String(err) });
  }

  private recovered(): void {
    if (!this.degraded) return;
    this.degraded = false;
    this.log.info("redis reachable again: budgets are shared across instances again");
    void this.syncLocalSpend();
    void this.runRetries();
  }
}
