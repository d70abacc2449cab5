/**
 * The in-process budget ledger. Per counter: spend settled this period and the amount reserved by
 * calls in flight. A reservation passes only if, on every counter (but those it is only charged
 * to), spend has not reached the limit and spend + reserved + the call's worst case stays within
 * it; then it is taken on all of them in one synchronous step, so concurrent calls cannot pass the
 * same check together.
 */
import type { BudgetCounter, BudgetLedger, LedgerGrant, LedgerRefusal } from "../contract.ts";

interface Entry {
  periodEnd: number | null;
  spend: bigint;
  reserved: bigint;
  /** The newest definition of the period seen (BudgetCounter.definedAt). */
  definedAt: number;
}

/** Whether two period ends are a whole number of periods apart (or nothing says otherwise): two periods of one grid, not one period whose end a write moved. */
export function wholePeriodsApart(a: number, b: number, periodMs: number | null | undefined): boolean {
  return !periodMs || (a - b) % periodMs === 0;
}

/**
 * Whether a counter's period began after its definition was written. A write that moves a period's
 * end (budget_reset_at = write time + the new duration) carries on only the period it was made in;
 * a later period of that definition starts from the store even when no call was seen in between
 * (else the spend of the shortened period was carried into the next, refusing calls until the old
 * end). Half a period of slack absorbs the write's timestamps being taken apart.
 */
export function laterThanDefinition(c: BudgetCounter): boolean {
  const definedAt = c.definedAt ?? 0;
  return c.periodEnd !== null && !!c.periodMs && definedAt > 0 && c.periodEnd - definedAt >= WRITES_PERIOD_ENDS_WITHIN * c.periodMs;
}

/**
 * The period a write made ends one period after the write; the next, two: an end under one and a
 * half periods after the row's last definition is the write's own (flush.ts inWritesPeriod reads
 * rows the same way).
 */
export const WRITES_PERIOD_ENDS_WITHIN = 1.5;

/**
 * The id of the budget counter of a row that keeps its own spend (the ledger, admin resets and
 * alerts agree on it). A team member's id is `teamId\tuserId`.
 */
export function counterId(kind: "key" | "team" | "org" | "user" | "team_member", id: string): string {
  return `${kind}:${id}`;
}

/** Who owns each kind of counter, as refusals (`budget.entity`) and alerts (`event_group`) name it. */
const OWNER: Record<string, string> = {
  key: "key",
  key_model: "key",
  team: "team",
  team_model: "team",
  team_member: "team_member",
  org: "organization",
  org_model: "organization",
  user: "user",
  provider: "provider",
};

/**
 * Whose budget a counter is, read from its id (`counterId`, `key_model:<token>:<model>`,
 * `team_model:<team id>:<model>`, `org_model:<org id>:<model>`, `provider:<name>`): its kind, the owner's entity name and id (its
 * `ownerId` when it has one), and the model of a per-model budget.
 */
export function counterOwner(counter: Pick<BudgetCounter, "id" | "ownerId">): { kind: string; entity: string; id: string; model?: string } {
  const [kind = "", ...rest] = counter.id.split(":");
  const entity = OWNER[kind] ?? kind;
  let owner: { kind: string; entity: string; id: string; model?: string } = { kind, entity, id: rest.join(":") };
  if (kind === "key_model" || kind === "team_model" || kind === "org_model") {
    // A key's token holds no colon; a team's or an organization's id may, so its ownerId says where it ends (a model group may hold one too).
    const id = kind !== "key_model" && counter.ownerId !== undefined ? counter.ownerId : (rest[0] ?? "");
    owner = { kind, entity, id, model: counter.id.slice(kind.length + id.length + 2) };
  }
  return counter.ownerId === undefined ? owner : { ...owner, id: counter.ownerId };
}

/** The limit of a counter kept only for its soft budget: never reached (2^62 pico-dollars, about $4.6 million). */
export const NO_LIMIT = 2n ** 62n;

export type BudgetEvent = "soft_budget_crossed" | "threshold_crossed" | "budget_crossed";

/** Told when settled spend crosses a counter's soft budget, a low-budget threshold or its limit. */
export interface CrossingListener {
  /**
   * The low-budget thresholds, as fractions of a budget left (LiteLLM's: 0.15 and 0.05), at
   * which `threshold_crossed` is told.
   */
  thresholds(): readonly number[];
  /**
   * `left`: the threshold crossed, for `threshold_crossed`. `wasPast`: spend had reached the level
   * before this call (a budget set at or below the spend already made): told again at every call,
   * it is for the listener to send it once.
   */
  crossed(counter: BudgetCounter, event: BudgetEvent, spend: bigint, left?: number, wasPast?: boolean): void;
}

/** A grant whose settle runs once, however often it is called (a call ends once). */
export function grantOnce(settle: (actual: bigint) => void): LedgerGrant {
  let settled = false;
  return {
    ok: true,
    settle: (actual: bigint) => {
      if (settled) return;
      settled = true;
      settle(actual);
    },
  };
}

/** Parts of a budget a threshold is counted in (a threshold of 0.15 is 1,500 of them). */
const THRESHOLD_PARTS = 10_000n;

/**
 * What spend settled from `before` to `after` has reached: each level it is at or past, whether
 * this call crossed it or it was already past (a soft budget, max_budget or threshold written at or
 * below the spend already made is as much a new threshold as a raised one: LiteLLM's condition is
 * `spend >= soft_budget`). A low-budget threshold reached by the same call that reached the limit
 * is not told: the budget is spent, which `budget_crossed` says.
 */
export function crossings(counter: BudgetCounter, before: bigint, after: bigint, listener: CrossingListener | undefined): void {
  if (!listener || after <= before) return;
  const reached = (level: bigint, event: BudgetEvent, left?: number) => {
    if (after >= level) listener.crossed(counter, event, after, left, before >= level);
  };
  if (counter.soft !== undefined) reached(counter.soft, "soft_budget_crossed");
  if (!hasLimit(counter)) return;
  if (after >= counter.limit) {
    reached(counter.limit, "budget_crossed");
    return;
  }
  for (const left of listener.thresholds()) {
    reached(counter.limit - (counter.limit * BigInt(Math.round(left * Number(THRESHOLD_PARTS)))) / THRESHOLD_PARTS, "threshold_crossed", left);
  }
}

const hasLimit = (counter: BudgetCounter) => counter.limit !== NO_LIMIT && counter.limit > 0n;

/**
 * A call refused because the counter's spend is at its limit: a max_budget written at or below the
 * spend already made is reached without any call settling, so it is told here.
 */
export function refusedAtLimit(counter: BudgetCounter, spend: bigint, listener: CrossingListener | undefined): void {
  if (listener && hasLimit(counter) && spend >= counter.limit) listener.crossed(counter, "budget_crossed", spend, undefined, true);
}

export class LocalLedger implements BudgetLedger {
  private readonly entries = new Map<string, Entry>();
  /** Counters whose stored spend is being read; reservations on them wait for it. */
  private readonly loading = new Map<string, Promise<void>>();

  constructor(private readonly onCross?: CrossingListener) {}

  private current(c: BudgetCounter): Entry | undefined {
    const e = this.entries.get(c.id);
    if (!e) return undefined;
    const definedAt = c.definedAt ?? 0;
    if (e.periodEnd === c.periodEnd) {
      e.definedAt = Math.max(e.definedAt, definedAt);
      return e;
    }
    if (e.periodEnd !== null && c.periodEnd !== null) {
      // One period whose end a write moved (a new budget_duration keeps the spend): the entry
      // carries on, its spend and reservations kept, with the newer definition's end; a caller
      // that still had the older one charges it as it is now. Reloading it from the store lost
      // the calls not yet written (the key could then pass its budget), and keeping the later
      // end of a shortened period refused calls until that end.
      if (!wholePeriodsApart(e.periodEnd, c.periodEnd, c.periodMs)) {
        if (definedAt > e.definedAt) {
          if (laterThanDefinition(c)) return undefined;
          e.periodEnd = c.periodEnd;
          e.definedAt = definedAt;
        }
        return e;
      }
      // A caller still in an older period than the ledger (a call that started just before the
      // reset): charge the current period rather than revive the old one.
      if (e.periodEnd > c.periodEnd) return e;
    }
    return undefined;
  }

  private async load(counters: readonly BudgetCounter[]): Promise<void> {
    const waits: Promise<void>[] = [];
    for (const c of counters) {
      if (this.current(c)) continue;
      let p = this.loading.get(c.id);
      if (!p) {
        p = Promise.resolve(c.storedSpend()).then(
          (spend) => {
            if (!this.current(c)) this.entries.set(c.id, { periodEnd: c.periodEnd, spend, reserved: 0n, definedAt: c.definedAt ?? 0 });
          },
        ).finally(() => this.loading.delete(c.id));
        this.loading.set(c.id, p);
      }
      waits.push(p);
    }
    await Promise.all(waits);
  }

  reserve(counters: readonly BudgetCounter[], amount: bigint): LedgerGrant | LedgerRefusal | Promise<LedgerGrant | LedgerRefusal> {
    const entries: Entry[] = [];
    for (const c of counters) {
      const e = this.current(c);
      if (!e) return this.load(counters).then(() => this.reserve(counters, amount));
      entries.push(e);
    }
    return this.take(counters, entries, amount);
  }

  /** Synchronous from check to take: nothing can interleave. */
  private take(counters: readonly BudgetCounter[], entries: Entry[], amount: bigint): LedgerGrant | LedgerRefusal {
    for (let i = 0; i < counters.length; i++) {
      const c = counters[i]!;
      const e = entries[i]!;
      if (c.chargeOnly) continue;
      if (e.spend >= c.limit || e.spend + e.reserved + amount > c.limit) {
        refusedAtLimit(c, e.spend, this.onCross);
        return { ok: false, counter: c, spend: e.spend, reserved: e.reserved };
      }
    }
    for (const e of entries) e.reserved += amount;
    return grantOnce((actual) => {
      for (let i = 0; i < entries.length; i++) {
        const e = entries[i]!;
        e.reserved -= amount;
        // The counter was read again while the call ran (a spend reset, a budget given or removed):
        // that reading could not hold this call's cost, nor its reservation; in the same period the
        // call counts there (as it does in the stored spend).
        const now = this.entries.get(counters[i]!.id);
        const counted = now !== undefined && now !== e && now.periodEnd === e.periodEnd ? now : e;
        const before = counted.spend;
        counted.spend += actual;
        crossings(counters[i]!, before, counted.spend, this.onCross);
      }
    });
  }

  /** Takes a counter's spend as known elsewhere (the shared ledger), keeping local reservations. */
  observe(counter: BudgetCounter, spend: bigint): void {
    const e = this.current(counter);
    if (e) e.spend = spend;
    else this.entries.set(counter.id, { periodEnd: counter.periodEnd, spend, reserved: 0n, definedAt: counter.definedAt ?? 0 });
  }

  async forget(ids: readonly string[]): Promise<void> {
    for (const id of ids) this.entries.delete(id);
  }

  forgetHere(ids: readonly string[]): Promise<void> {
    return this.forget(ids);
  }

  /** Spend and reservations of a counter (tests, `/provider/budgets`). */
  peek(id: string): { spend: bigint; reserved: bigint; periodEnd: number | null } | undefined {
    const e = this.entries.get(id);
    return e ? { spend: e.spend, reserved: e.reserved, periodEnd: e.periodEnd } : undefined;
  }
}
