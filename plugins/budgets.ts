/**
 * Budgets: before a call goes upstream, its worst-case cost is reserved on every budget that
 * applies, and the real cost is settled when it ends. Which budgets apply:
 *
 * - the key's `max_budget` (or its budget object's), plus `temp_budget_increase` until
 *   `temp_budget_expiry`;
 * - the key's `model_max_budget` entry for the model group called;
 * - the team's, and the organization's (`max_budget`, or their budget object's), and the
 *   organization's `model_max_budget` entry for the model group called;
 * - the user's budget inside the team (`max_budget_in_team`, or the membership's budget object's),
 *   for a key of a user in a team;
 * - the user's own `max_budget`, for keys without a team (a team key is governed by its team, but
 *   its spend is the user's too: it is charged to the user's counter without being checked);
 * - the provider's budget (`router_settings.provider_budget_config`).
 *
 * A refusal is HTTP 400 `budget_exceeded` naming the budget, its limit and its spend.
 */
import { Type } from "@sinclair/typebox";
import {
  type BudgetCounter,
  type BudgetLedger,
  type BudgetRefusalDetail,
  type BudgetRow,
  type CallIntent,
  type CounterTable,
  type Denied,
  definePlugin,
  type Hooks,
  type IdentityView,
  keyCounterToken,
  type Lease,
  type LedgerGrant,
  type LedgerRefusal,
  type ProviderBudget,
  type SpendHistory,
  type TeamMemberRow,
  teamMemberId,
  teamMemberOf,
} from "../core/contract.ts";
import { columnToPico, picoToText, picoToUsd, type Pico, usdToPico } from "../core/cost/money.ts";
import { errorInfo } from "../core/errors.ts";
import { counterId, counterOwner, NO_LIMIT } from "../core/spend/ledger.ts";
import { type HistoryBudget, keyModelBudget, orgModelBudget, providerBudget, teamModelBudget } from "../core/spend/history-budgets.ts";
import { periodEnd, periodLength } from "../core/spend/period.ts";
import { budgetOf } from "./shared/budget-object.ts";
import { keyLabel } from "./shared/labels.ts";
import { storeErrorCause } from "../core/store/sql.ts";

const GRANTED: Lease = { ok: true, settle: () => undefined };

interface Limits {
  spend: string;
  maxBudget: string | null;
  softBudget: string | null;
  budgetDuration: string | null;
  budgetResetAt: Date | null;
  updatedAt?: Date;
}

/** A row's own limit, else its budget object's. */
function limitsOf(row: Limits, budget: BudgetRow | undefined) {
  const max = row.maxBudget ?? budget?.maxBudget ?? null;
  return {
    max: max === null ? undefined : columnToPico(max),
    soft: (row.softBudget ?? budget?.softBudget) == null ? undefined : columnToPico(row.softBudget ?? budget?.softBudget),
    duration: row.budgetDuration ?? budget?.budgetDuration ?? null,
  };
}

/** How long the ledger waits for a counter's stored spend before it takes the identity mirror's copy (the store may be away). */
const STORED_SPEND_WAIT_MS = 2000;

/**
 * A counter for a row that keeps its own spend (key, team, org, user, team member). The ledger
 * reads its stored spend once and then counts on its own, so that reading comes from the store
 * once the calls already ended are written (`history.counter`): the identity mirror's copy of the
 * row is as old as its last change, which is stale when a budget appears on a row that has spent
 * since (an update giving it one, a budget object gaining one). The mirror's copy is the fallback
 * while the store does not answer.
 */
function rowCounter(
  table: CounterTable,
  id: string,
  label: string,
  row: Limits,
  budget: BudgetRow | undefined,
  at: number,
  history: SpendHistory | undefined,
  extra: Pico = 0n,
): BudgetCounter | undefined {
  const l = limitsOf(row, budget);
  // A soft budget alone still needs a counter (for its alert), one that never refuses.
  if (l.max === undefined && l.soft === undefined) return undefined;
  const end = periodEnd(row.budgetResetAt, l.duration, at);
  // The row's spend belongs to the period its budget_reset_at closes; a later period starts at 0.
  const inPeriod = (spend: string, resetAt: Date | null) => (end === null || resetAt?.getTime() === end ? columnToPico(spend) : 0n);
  const cached = inPeriod(row.spend, row.budgetResetAt);
  const read = history?.counter;
  const storedSpend = read
    ? async () => {
        let timer: ReturnType<typeof setTimeout> | undefined;
        const late = new Promise<undefined>((resolve) => {
          timer = setTimeout(() => resolve(undefined), STORED_SPEND_WAIT_MS);
        });
        try {
          const stored = await Promise.race([read.call(history, table, id), late]);
          return stored ? inPeriod(stored.spend, stored.budgetResetAt) : cached;
        } catch {
          return cached;
        } finally {
          clearTimeout(timer);
        }
      }
    : () => cached;
  return {
    id: counterId(table, id),
    label,
    limit: l.max === undefined ? NO_LIMIT : l.max + extra,
    soft: l.soft,
    periodEnd: end,
    periodMs: periodLength(l.duration),
    definedAt: Math.max(row.updatedAt?.getTime() ?? 0, budget?.updatedAt.getTime() ?? 0),
    ...(budget && row.maxBudget === null && budget.maxBudget !== null ? { fromBudget: budget.budgetId } : {}),
    storedSpend,
  };
}

function countersFor(intent: CallIntent, identity: IdentityView, history: SpendHistory | undefined, providers: Readonly<Record<string, ProviderBudget>>): BudgetCounter[] {
  const p = intent.principal;
  const at = intent.startedAt;
  const out: BudgetCounter[] = [];
  const callerKey = p.key ? { token: p.key.token, alias: p.keyAlias ?? null } : undefined;
  const add = (c: BudgetCounter | undefined) => {
    if (c) out.push(callerKey ? { ...c, callerKey } : c);
  };
  const key = p.key ? (identity.lookupKey(p.key.token, at) ?? p.key) : undefined;
  if (key) {
    const budget = budgetOf(key.budgetId, identity);
    const temp = key.tempBudgetIncrease !== null && (key.tempBudgetExpiry?.getTime() ?? 0) > at ? columnToPico(key.tempBudgetIncrease) : 0n;
    // Named by what a rotation keeps (keyCounterToken); refusals and alerts name the key by the token it has.
    const named = keyCounterToken(key);
    const own = rowCounter("key", named, keyLabel(p), key, budget, at, history, temp);
    if (own) add({ ...own, ownerId: key.token });
    // The key's own per-model budgets, else its budget object's.
    const perModel = keyModelBudget(named, key.modelMaxBudget ?? budget?.modelMaxBudget, intent.modelGroup, at);
    if (perModel && history) {
      // Its calls are logged under the token each had: this one, and those before the latest rotations.
      const apiKeys = [key.token, ...key.rotatedFrom];
      const sumSince = (since: number) => history.sum({ apiKeys, modelGroup: intent.modelGroup, since });
      const fromBudget = budget && !key.modelMaxBudget ? { fromBudget: budget.budgetId } : {};
      add({ ...historyCounter(perModel, `${keyLabel(p)} for model=${intent.modelGroup}`, history, sumSince), ownerId: key.token, ...fromBudget });
    }
  }
  const team = p.teamId ? identity.teams.get(p.teamId) : undefined;
  if (team) {
    const budget = budgetOf(team.budgetId, identity);
    add(rowCounter("team", team.teamId, `Team=${team.teamId}`, team, budget, at, history));
    // Its budget object's per-model budgets, over every call of the team's keys.
    const perModel = teamModelBudget(team.teamId, budget?.modelMaxBudget, intent.modelGroup, at);
    if (perModel && history) {
      const sumSince = (since: number) => history.sum({ teamId: team.teamId, modelGroup: intent.modelGroup, since });
      add({ ...historyCounter(perModel, `Team=${team.teamId} for model=${intent.modelGroup}`, history, sumSince), ownerId: team.teamId, fromBudget: budget!.budgetId });
    }
  }
  const member = p.teamId && p.userId ? identity.teamMember(p.teamId, p.userId) : undefined;
  if (member) {
    // A membership's spend is never reset by a period (the team's period governs the team's budget).
    const limits = { spend: member.spend, maxBudget: memberMaxBudget(member, identity), softBudget: null, budgetDuration: null, budgetResetAt: null };
    add(rowCounter("team_member", teamMemberId(member.teamId, member.userId), `User=${member.userId} in Team=${member.teamId}`, limits, undefined, at, history));
  }
  const org = p.orgId ? identity.orgs.get(p.orgId) : undefined;
  if (org) {
    const budget = budgetOf(org.budgetId, identity);
    add(rowCounter("org", org.organizationId, `Organization=${org.organizationId}`, org, budget, at, history));
    // The organization's per-model budgets (its row mirrors its budget object's), over every call of its keys.
    const perModel = orgModelBudget(org.organizationId, org.modelMaxBudget ?? budget?.modelMaxBudget, intent.modelGroup, at);
    if (perModel && history) {
      const sumSince = (since: number) => history.sum({ orgId: org.organizationId, modelGroup: intent.modelGroup, since });
      add({ ...historyCounter(perModel, `Organization=${org.organizationId} for model=${intent.modelGroup}`, history, sumSince), ownerId: org.organizationId });
    }
  }
  const user = p.userId ? identity.users.get(p.userId) : undefined;
  const userCounter = user ? rowCounter("user", user.userId, `User=${user.userId}`, user, undefined, at, history) : undefined;
  // A team key is governed by its team, not by its user's own budget; but what it spends is the
  // user's spend (the stored counter counts every call of the user), so the ledger counts it too.
  if (userCounter) add(p.teamId ? { ...userCounter, chargeOnly: true } : userCounter);
  // A cache hit calls no provider: its budget is not the caller's to be refused by.
  const name = intent.deployment.provider;
  const provider = intent.cacheHit ? undefined : providerBudget(name, providers, at);
  if (provider && history) add(historyCounter(provider, `Provider=${name}`, history, (since) => history.sum({ provider: name, since })));
  return out;
}

/** A membership's budget: its max_budget_in_team, else its budget object's. */
function memberMaxBudget(member: TeamMemberRow, identity: IdentityView): string | null {
  return member.maxBudgetInTeam ?? budgetOf(member.budgetId, identity)?.maxBudget ?? null;
}

/** Whether a row has a budget (its own or its budget object's, max or soft): what makes `rowCounter` give it a counter. */
function budgeted(row: Limits, budget: BudgetRow | undefined): boolean {
  const l = limitsOf(row, budget);
  return l.max !== undefined || l.soft !== undefined;
}

/** Whether the row of a row counter (an id `counterId` made) still has a budget; other counters (per model, provider) always. */
function stillBudgeted(id: string, identity: IdentityView): boolean {
  const at = id.indexOf(":");
  const rest = id.slice(at + 1);
  switch (id.slice(0, at)) {
    case "key": {
      const key = identity.keyByCounterToken(rest);
      return key !== undefined && budgeted(key, budgetOf(key.budgetId, identity));
    }
    case "team": {
      const team = identity.teams.get(rest);
      return team !== undefined && budgeted(team, budgetOf(team.budgetId, identity));
    }
    case "org": {
      const org = identity.orgs.get(rest);
      return org !== undefined && budgeted(org, budgetOf(org.budgetId, identity));
    }
    case "user": {
      const user = identity.users.get(rest);
      return user !== undefined && budgeted(user, undefined);
    }
    case "team_member": {
      const { teamId, userId } = teamMemberOf(rest);
      const member = identity.teamMember(teamId, userId);
      return member !== undefined && memberMaxBudget(member, identity) !== null;
    }
    default:
      return true;
  }
}

/**
 * The counters a change of the key with this token may concern: the one named by the token (the
 * key's before any rotation, or gone with it) and, for a live key, the one its counters go by.
 */
function keyCounters(token: string, identity: IdentityView): string[] {
  const key = identity.keys.get(token);
  const named = key ? keyCounterToken(key) : token;
  return named === token ? [counterId("key", token)] : [counterId("key", token), counterId("key", named)];
}

/**
 * Row counters the ledger has met, per ledger (kept across the plugin's rebuilds on reload). The
 * ledger reads a counter's stored spend once and then counts its calls; a row whose budget goes
 * away stops being counted (its calls no longer reserve on it), so its entry is dropped then, and
 * a budget given to it again starts from the store rather than from what the ledger last had.
 */
const metCounters = new WeakMap<BudgetLedger, Set<string>>();

/**
 * A counter without a row (per-model key budgets, provider budgets), on a grid period (or none).
 * Its stored spend is the period's own record (budget_period_spend), or the log's sum since the
 * period began, whichever is more: the log holds nothing with `disable_spend_logs` or past
 * retention, and the record nothing of calls made before it existed.
 */
function historyCounter(budget: HistoryBudget, label: string, history: SpendHistory, sumSince: (since: number) => Promise<bigint>): BudgetCounter {
  const { id, period } = budget;
  const storedSpend = async () => {
    const [recorded, summed] = await Promise.all([history.periodSpend ? history.periodSpend(id, period?.end ?? null) : 0n, sumSince(period?.start ?? 0)]);
    // Bigints: Math.max does not take them.
    if (recorded > summed) return recorded;
    return summed;
  };
  return { id, label, limit: usdToPico(budget.limitUsd), periodEnd: period?.end ?? null, storedSpend };
}

const usd = (p: Pico) => `$${picoToText(p)}`;

/**
 * What a call of an endpoint without max_tokens is reserved at, as the refusal says it. Only chat
 * and completions take max_tokens (reservedAt): a transcription refused for the longest audio its
 * file could hold was told to "set max_tokens", which that endpoint has no parameter for.
 */
const UNBOUNDED: Record<Exclude<CallIntent["endpoint"], "chat" | "completions">, string> = {
  transcriptions: "the longest audio its file could hold (the length its WAV header gives, else a second per 750 bytes: the file is all that is known before the call)",
  speech: "its input's length",
  images: "the number of images asked, at the dearest size and quality the request leaves open (set size and quality to reserve less)",
  embeddings: "its input's length",
  moderations: "its input's length",
  pass_through: "the route's price per call",
};

/** What the call was reserved at, as its refusal says it: its output bound for each answer it is billed for. */
function reservedAt(intent: CallIntent): string {
  const each = intent.answers > 1 ? ` for each of ${intent.answers} answers` : "";
  if (intent.maxOutputTokens !== undefined) return `max_tokens=${intent.maxOutputTokens}${each}`;
  if (intent.endpoint === "chat" || intent.endpoint === "completions") return `the model's output limit${each} (set max_tokens to reserve less)`;
  return UNBOUNDED[intent.endpoint];
}

/** The refusing budget in figures (the error envelope's `budget`): a client can tell which one, and what is left, without reading the message. */
function refusedBudget(c: BudgetCounter, spend: Pico, reserved: Pico, callCost: Pico | undefined): BudgetRefusalDetail {
  const { entity, id, model } = counterOwner(c);
  return {
    entity,
    id,
    ...(model === undefined ? {} : { model }),
    ...(c.fromBudget === undefined ? {} : { budget_id: c.fromBudget }),
    max_budget: picoToUsd(c.limit),
    spend: picoToUsd(spend),
    reserved: picoToUsd(reserved),
    ...(callCost === undefined ? {} : { call_cost: picoToUsd(callCost) }),
    budget_reset_at: c.periodEnd === null ? null : new Date(c.periodEnd).toISOString(),
  };
}

function refusal(r: LedgerRefusal, intent: CallIntent): Denied {
  const { counter: c, spend, reserved } = r;
  const resets = c.periodEnd === null ? "" : ` It resets at ${new Date(c.periodEnd).toISOString()}.`;
  // Named as rate-limit refusals name a limit taken from a budget object.
  const max = `max budget ${usd(c.limit)}${c.fromBudget === undefined ? "" : ` (from Budget=${c.fromBudget})`}`;
  let message: string;
  if (spend >= c.limit) message = `Budget has been exceeded! ${c.label}: spend ${usd(spend)}, ${max}.${resets}`;
  else {
    const left = c.limit - spend - reserved;
    message =
      `Budget would be exceeded: ${c.label} has ${usd(left > 0n ? left : 0n)} left of its ${max} ` +
      `(spend ${usd(spend)}, ${usd(reserved)} held by calls in flight), and this call may cost up to ${usd(intent.worstCaseCost)} at ${reservedAt(intent)}.${resets}`;
  }
  const budget = refusedBudget(c, spend, reserved, spend >= c.limit ? undefined : intent.worstCaseCost);
  return { ok: false, error: { ...errorInfo(400, message, "budget_exceeded"), budget } };
}

export default definePlugin({
  name: "budgets",
  config: Type.Object({}),
  setup(_config, ctx): Hooks {
    const identity = ctx.identity;
    const ledger: BudgetLedger | undefined = ctx.ledger;
    if (!identity || !ledger) return {};
    const providers = ctx.settings.providerBudgets;
    const seen = metCounters.get(ledger) ?? new Set<string>();
    metCounters.set(ledger, seen);
    const unsubscribe = identity.onChange((change) => {
      if (change.kind === "spend_reset") {
        // Another instance reset these counters' spend: read them again from the store, budgeted or not.
        const reset = change.counters ?? [...seen];
        void ledger.forgetHere(reset).catch((err) => ctx.log.warn("budget counters reset on another instance could not be dropped", storeErrorCause(err)));
        return;
      }
      // A change of one key, team, org or user concerns its own counter; others (memberships, budget objects, all) any.
      const own =
        change.kind === "key" ? keyCounters(change.token, identity)
        : change.kind === "team" ? [counterId("team", change.teamId)]
        : change.kind === "org" ? [counterId("org", change.orgId)]
        : change.kind === "user" ? [counterId("user", change.userId)]
        : undefined;
      const gone: string[] = [];
      // One row's counter is dropped even if this instance never met it: with Redis another instance
      // (or this one before a restart) may have left it there.
      for (const id of own ?? seen) {
        if (stillBudgeted(id, identity)) continue;
        seen.delete(id);
        gone.push(id);
      }
      if (gone.length > 0) void Promise.resolve(ledger.forget(gone)).catch((err) => ctx.log.warn("budget counters of rows without a budget could not be dropped", storeErrorCause(err)));
    });
    return {
      dispose: unsubscribe,
      budget: {
        reserve(intent) {
          const counters = countersFor(intent, identity, ctx.spendHistory, providers);
          if (counters.length === 0) return GRANTED;
          for (const c of counters) seen.add(c.id);
          const toLease = (r: LedgerGrant | LedgerRefusal): Lease | Denied => (r.ok ? { ok: true, settle: (_usage, cost) => r.settle(cost) } : refusal(r, intent));
          const result = ledger.reserve(counters, intent.worstCaseCost);
          return result instanceof Promise ? result.then(toLease) : toLease(result);
        },
      },
    };
  },
});
