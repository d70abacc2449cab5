/**
 * A finished call as the spend writer queues it: the spend-log row plus the counters it charges,
 * each with the budget period it belongs to. Plain JSON (money as decimal text), so a queue that
 * outgrows memory can spill to disk and come back unchanged.
 */
import type { CallRecord, CounterTable, ProviderBudget, Usage } from "../contract.ts";
import { PICO_DIGITS, type PicoJson, picoJson, scaled } from "../cost/money.ts";
import type { IdentityCache } from "../identity/cache.ts";
import { keyCounterToken, teamMemberId } from "../identity/records.ts";
import { parseDuration } from "../identity/duration.ts";
import { type HistoryBudget, keyModelBudget, orgModelBudget, providerBudget, teamModelBudget } from "./history-budgets.ts";
import { periodEnd, periodLength } from "./period.ts";
import { storable } from "./row-text.ts";


export interface Charge {
  /** `period`: a counter without a row (history-budgets.ts), charged to budget_period_spend. */
  table: CounterTable | "period";
  /** Row id; `team_id\tuser_id` for team members; the counter's id for `period`. */
  id: string;
  /** End (ms) of the budget period the call was charged to; null for a budget that never resets. */
  periodEnd: number | null;
  /** That period's length (ms; BudgetCounter.periodMs): the store tells a rollover from a write that moved the end by it. Absent in entries queued before it existed. */
  periodMs?: number | null;
}

export interface SpendEntry {
  callId: string;
  requestId: string;
  callType: string;
  apiKey: string;
  keyAlias: string | null;
  userId: string | null;
  teamId: string | null;
  organizationId: string | null;
  endUser: string | null;
  model: string;
  modelGroup: string;
  provider: string;
  modelId: string;
  upstreamModel: string;
  /** Cost in integer pico-dollars (1e-12 USD): a number, or its decimal text past $9,007 (picoJson). */
  spendPico: PicoJson;
  promptTokens: number;
  completionTokens: number;
  cacheReadTokens: number;
  cacheCreationTokens: number;
  reasoningTokens: number;
  /**
   * The seconds of audio the call was priced with, in integer picoseconds (the log's scale), as
   * `spendPico` is written; null when its usage has none. Absent in entries queued before it existed.
   */
  audioPicoseconds?: PicoJson | null;
  startTime: number;
  endTime: number;
  completionStartTime: number | null;
  status: string;
  stream: boolean;
  cacheHit: boolean;
  tags: string[];
  metadata: Record<string, unknown>;
  charges: Charge[];
}

interface PeriodFields {
  budgetResetAt: Date | null;
}

/**
 * The period a call that started at `at` is charged to, from its row as the call found it
 * (`then`) and as it is now (with their budget durations). A period that ended while the call ran
 * has moved the row on by whole periods: the call stays in the period it started in. A budget
 * given or changed meanwhile starts a new grid, in whose current period the call counts (as it
 * does in the ledger); so does a row that did not move.
 */
function chargedPeriod(then: PeriodFields | undefined, thenDuration: string | null | undefined, now: PeriodFields | undefined, nowDuration: string | null | undefined, at: number): number | null {
  const current = now ? periodEnd(now.budgetResetAt, nowDuration, at) : null;
  if (!then?.budgetResetAt || !now?.budgetResetAt || !thenDuration || thenDuration !== nowDuration) return current;
  const ms = parseDuration(thenDuration);
  const moved = now.budgetResetAt.getTime() - then.budgetResetAt.getTime();
  if (!ms || moved <= 0 || moved % ms !== 0) return current;
  return periodEnd(then.budgetResetAt, thenDuration, at);
}

/**
 * The counters a call charges, with their periods as of the call's start (see chargedPeriod); the
 * budgets without a row (history-budgets.ts) in their grid period, or for good.
 */
export function chargesOf(call: CallRecord, identity: IdentityCache | undefined, providerBudgets: Readonly<Record<string, ProviderBudget>> = {}): Charge[] {
  const p = call.principal;
  const at = call.startedAt;
  const charges: Charge[] = [];
  const key = p.key;
  if (key) {
    const budget = key.budgetId ? identity?.budgets.get(key.budgetId) : undefined;
    const duration = key.budgetDuration ?? budget?.budgetDuration;
    charges.push({ table: "key", id: key.token, periodEnd: periodEnd(key.budgetResetAt, duration, at), periodMs: periodLength(duration) });
    // As the ledger reads it: the key as it is now, else as the call found it.
    const now = identity?.keys.get(key.token) ?? key;
    const nowBudget = now.budgetId ? identity?.budgets.get(now.budgetId) : undefined;
    periodCharge(charges, keyModelBudget(keyCounterToken(key), now.modelMaxBudget ?? nowBudget?.modelMaxBudget, call.modelGroup, at));
  }
  if (!call.cacheHit) periodCharge(charges, providerBudget(call.provider, providerBudgets, at));
  if (p.userId) {
    const user = identity?.users.get(p.userId);
    const then = p.user?.userId === p.userId ? p.user : undefined;
    charges.push({ table: "user", id: p.userId, periodEnd: user ? chargedPeriod(then, then?.budgetDuration, user, user.budgetDuration, at) : null, periodMs: periodLength(user?.budgetDuration) });
  }
  if (p.teamId) {
    const team = identity?.teams.get(p.teamId);
    const then = p.team?.teamId === p.teamId ? p.team : undefined;
    charges.push({ table: "team", id: p.teamId, periodEnd: team ? chargedPeriod(then, then?.budgetDuration, team, team.budgetDuration, at) : null, periodMs: periodLength(team?.budgetDuration) });
    if (p.userId) charges.push({ table: "team_member", id: teamMemberId(p.teamId, p.userId), periodEnd: null });
    const budget = team?.budgetId ? identity?.budgets.get(team.budgetId) : undefined;
    periodCharge(charges, teamModelBudget(p.teamId, budget?.modelMaxBudget, call.modelGroup, at));
  }
  if (p.orgId) {
    const org = identity?.orgs.get(p.orgId);
    const budget = org?.budgetId ? identity?.budgets.get(org.budgetId) : undefined;
    const then = p.org?.organizationId === p.orgId ? p.org : undefined;
    const thenBudget = then?.budgetId ? identity?.budgets.get(then.budgetId) : undefined;
    const duration = org?.budgetDuration ?? budget?.budgetDuration;
    charges.push({
      table: "org",
      id: p.orgId,
      periodEnd: org ? chargedPeriod(then, then?.budgetDuration ?? thenBudget?.budgetDuration, org, duration, at) : null,
      periodMs: periodLength(duration),
    });
    // As the ledger reads it: the organization as it is now.
    periodCharge(charges, orgModelBudget(p.orgId, org?.modelMaxBudget ?? budget?.modelMaxBudget, call.modelGroup, at));
  }
  return charges;
}

function periodCharge(charges: Charge[], budget: HistoryBudget | undefined): void {
  if (!budget) return;
  const { id, period } = budget;
  charges.push({ table: "period", id, periodEnd: period?.end ?? null, periodMs: period ? period.end - period.start : null });
}

/** The longest `request_id` stored: 3 bytes of UTF-8 per unit at most, well within an index entry. */
const MAX_REQUEST_ID_CHARS = 512;

/**
 * The log's `request_id`: the answer's id, else the call id. A cache hit answers with the id of the
 * answer it replays, so its row is `<id>_cache_hit<ms>` (as LiteLLM names it): a lookup by the
 * response id finds the call that was priced, not a 0 the hit replayed it at.
 */
function requestIdOf(call: CallRecord): string {
  // The upstream's id, cut to what the log's request_id index holds with room to spare: an
  // upstream answering with a 10,000-character id would otherwise have its calls set aside.
  const id = storable((call.responseId ?? call.id).slice(0, MAX_REQUEST_ID_CHARS));
  return call.cacheHit && call.responseId !== undefined ? `${id}_cache_hit${call.startedAt}` : id;
}

/** See SpendEntry.audioPicoseconds. */
function audioPicoseconds(u: Usage): PicoJson | null {
  const s = u.audioSeconds;
  return s !== undefined && Number.isFinite(s) && s >= 0 ? picoJson(scaled(s, PICO_DIGITS)) : null;
}

export function toSpendEntry(call: CallRecord, identity: IdentityCache | undefined, providerBudgets?: Readonly<Record<string, ProviderBudget>>): SpendEntry {
  const p = call.principal;
  const u = call.usage;
  // Only what the row's columns do not say (key_alias and status are added when logs are read).
  const metadata: Record<string, unknown> = {};
  if (!call.priced) metadata.cost_note = `${call.costSource}: the call was logged at 0. Set model_info.input_cost_per_token / output_cost_per_token to price it.`;
  if (call.error) metadata.error_information = { error_code: String(call.error.status), error_class: storable(call.error.type), error_message: storable(call.error.message) };
  // Stored prompts ride in the metadata column; reads lift them to the row's `messages` and `response`.
  if (call.prompt !== undefined) metadata.messages = call.prompt;
  if (call.answer !== undefined) metadata.response = call.answer;
  // Client-chosen text (`user`, tags, a wildcard model name, an upstream's error message) may hold
  // what the store cannot: cleaned here, before entries are grouped by these values.
  return {
    callId: call.id,
    requestId: requestIdOf(call),
    callType: call.endpoint,
    apiKey: p.keyHash,
    keyAlias: p.keyAlias === undefined ? null : storable(p.keyAlias),
    userId: p.userId ?? null,
    teamId: p.teamId ?? null,
    organizationId: p.orgId ?? null,
    endUser: call.endUser === undefined ? null : storable(call.endUser),
    model: storable(call.requestedModel),
    modelGroup: storable(call.modelGroup),
    provider: call.provider,
    modelId: call.deploymentId,
    upstreamModel: storable(call.upstreamModel),
    spendPico: picoJson(call.cost),
    promptTokens: u.promptTokens,
    completionTokens: u.completionTokens,
    cacheReadTokens: u.cachedPromptTokens ?? 0,
    cacheCreationTokens: u.cacheCreationTokens ?? 0,
    reasoningTokens: u.reasoningTokens ?? 0,
    audioPicoseconds: audioPicoseconds(u),
    startTime: call.startedAt,
    endTime: call.endedAt,
    completionStartTime: call.firstByteAt ?? null,
    status: call.status,
    stream: call.stream,
    cacheHit: call.cacheHit,
    tags: call.tags.map(storable),
    metadata,
    charges: chargesOf(call, identity, providerBudgets),
  };
}
