/**
 * Budget alerts: when settled spend crosses a soft budget, a low-budget threshold (a part of the
 * budget left: 15 % and 5 % by default) or a budget, one event per budget, threshold and period,
 * across every instance (the `budget_alerts` row decides who sends it). The event is logged, kept
 * in the store, and POSTed to the alert webhook when one is configured
 * (`general_settings.alert_webhook_url` or `WEBHOOK_URL`), in LiteLLM's WebhookEvent shape, with
 * retries until it is taken (alert-delivery.ts; a redirect is not followed: it is a failed attempt,
 * see callbacks/post.ts), signed when a secret is set (`alert_webhook_secret` or `WEBHOOK_SECRET`;
 * callbacks/signing.ts).
 */
import { randomUUID } from "node:crypto";
import { and, inArray, isNotNull, isNull, sql } from "drizzle-orm";
import { BoundedMap } from "../bounded-map.ts";
import { type BudgetCounter, type Logger, teamMemberOf } from "../contract.ts";
import { picoToText, picoToUsd } from "../cost/money.ts";
import type { Db } from "../store/db.ts";
import { budgetAlerts } from "../store/schema.ts";
import { AlertDelivery, type AlertWebhook } from "./alert-delivery.ts";
import { type BudgetEvent, type CrossingListener, counterOwner, NO_LIMIT } from "./ledger.ts";
import { storeErrorCause } from "../store/sql.ts";

/** LiteLLM's event message prefix per kind of counter. */
const PREFIX: Record<string, string> = {
  key: "Key Budget",
  key_model: "Key Model Budget",
  team: "Team Budget",
  team_model: "Team Model Budget",
  org: "Organization Budget",
  org_model: "Organization Model Budget",
  user: "User Budget",
  team_member: "Team Member Budget",
  provider: "Provider Budget",
};

/** LiteLLM's event messages; a threshold's names the part of the budget left ("15% Threshold Crossed"). */
const text = (event: BudgetEvent, left: number | undefined): string =>
  event === "soft_budget_crossed" ? "Soft Budget Crossed" : event === "budget_crossed" ? "Budget Crossed" : `${Math.round((left ?? 0) * 10_000) / 100}% Threshold Crossed`;

/** Low-budget thresholds when the config sets none: LiteLLM's, 15 % and 5 % of the budget left. */
const DEFAULT_THRESHOLDS: readonly number[] = [0.15, 0.05];

/**
 * An alert in LiteLLM's WebhookEvent shape. A team member's names the user, the team (so it also
 * reaches the team's webhooks) and the key whose call reached the budget.
 */
export function alertPayload(counter: BudgetCounter, event: BudgetEvent, spend: bigint, left?: number): Record<string, unknown> {
  const { kind, entity, id, model } = counterOwner(counter);
  const member = kind === "team_member" ? teamMemberOf(id) : undefined;
  return {
    spend: picoToUsd(spend),
    max_budget: counter.limit === NO_LIMIT ? null : picoToUsd(counter.limit),
    soft_budget: counter.soft === undefined ? null : picoToUsd(counter.soft),
    token: kind === "key" || kind === "key_model" ? id : member ? (counter.callerKey?.token ?? null) : null,
    key_alias: kind === "key" || kind === "key_model" || member ? (counter.callerKey?.alias ?? null) : null,
    user_id: kind === "user" ? id : (member?.userId ?? null),
    team_id: kind === "team" || kind === "team_model" ? id : (member?.teamId ?? null),
    organization_id: kind === "org" || kind === "org_model" ? id : null,
    provider: kind === "provider" ? id : null,
    model: model ?? null,
    budget: counter.label,
    budget_reset_at: counter.periodEnd === null ? null : new Date(counter.periodEnd).toISOString(),
    event,
    event_group: entity,
    event_message: `${PREFIX[kind] ?? "Budget"}: ${text(event, left)}`,
  };
}

export { alertTiming } from "./alert-delivery.ts";

/** How many of the latest alerts `sent` keeps: one per budget and period would otherwise pile up for the life of the process. */
const SENT_KEPT = 100;

interface AlertKey {
  counterId: string;
  event: BudgetEvent;
  period: string;
}

/**
 * The `budget_alerts` row an alert is sent once for: per budget, period and threshold. A budget
 * without a period is crossed once "for good", so a new threshold (a soft_budget or max_budget
 * written since) is part of it, else it would cross in silence (LiteLLM #16185: alerts stop after
 * the first one). A spend reset forgets the counter's alerts (forgetAlerts). Each low-budget
 * threshold is its own (LiteLLM's 5 % alert was swallowed by its 15 % one the same day).
 */
function alertKey(counter: BudgetCounter, event: BudgetEvent, left: number | undefined): AlertKey {
  const threshold = event === "soft_budget_crossed" ? counter.soft : event === "threshold_crossed" ? `${left}:${picoToText(counter.limit)}` : counter.limit;
  const level = typeof threshold === "bigint" ? picoToText(threshold) : (threshold ?? "");
  return { counterId: counter.id, event, period: `${counter.periodEnd === null ? "flat" : String(counter.periodEnd)}@${level}` };
}

export class BudgetAlerts implements CrossingListener {
  /** The latest alerts sent by this instance, oldest first, at most SENT_KEPT (tests read it). */
  readonly sent: Record<string, unknown>[] = [];

  /** Delivery to the alert webhook, owed until it is taken (alert-delivery.ts). */
  readonly delivery: AlertDelivery;

  /** Past levels already asked of the store (crossed's wasPast); bounded, each asked again at worst. */
  private readonly askedPast = new BoundedMap<string, true>(10_000);

  constructor(
    private readonly db: Db,
    private readonly log: Logger,
    /** Where alerts are POSTed, and the secret they are signed with (callbacks/signing.ts). */
    webhook: AlertWebhook,
    /** Also tells a team's own webhooks about the team's budget. */
    private readonly toTeam?: (teamId: string, payload: Record<string, unknown>) => void,
    /** The low-budget thresholds the config sets (`general_settings.budget_alert_thresholds`), if any. */
    private readonly configuredThresholds: () => readonly number[] | undefined = () => undefined,
  ) {
    this.delivery = new AlertDelivery(db, log, webhook);
  }

  thresholds(): readonly number[] {
    return this.configuredThresholds() ?? DEFAULT_THRESHOLDS;
  }

  /**
   * Fire-and-forget: never slows or fails the call that crossed the line. A level spend was already
   * past (told at every call of the budget) is asked of the store once per process; the store's
   * row says whether it was sent.
   */
  crossed(counter: BudgetCounter, event: BudgetEvent, spend: bigint, left?: number, wasPast = false): void {
    const key = alertKey(counter, event, left);
    const asked = `${key.counterId}\t${key.event}\t${key.period}`;
    if (wasPast && this.askedPast.has(asked)) return;
    // The call that crossed marks it too: the next call's "already past" could otherwise reach the
    // store first and send the alert with its later spend.
    this.askedPast.set(asked, true);
    void this.deliver(counter, key, spend, left).catch((err) => {
      // Asked again at the next call, which may find the store back.
      this.askedPast.delete(asked);
      this.log.error("budget alert failed", { ...storeErrorCause(err), budget: counter.label });
    });
  }

  private async deliver(counter: BudgetCounter, key: AlertKey, spend: bigint, left: number | undefined): Promise<void> {
    const payload = alertPayload(counter, key.event, spend, left);
    // One id for every attempt, by any instance: a receiver that got an attempt whose answer was lost drops the retry.
    const deliveryId = `msg_${randomUUID()}`;
    const inserted = await this.db
      .insert(budgetAlerts)
      .values({ ...key, payload, deliveryId, nextAttemptAt: this.delivery.firstDue() })
      .onConflictDoNothing()
      .returning({ id: budgetAlerts.counterId });
    if (inserted.length === 0) return;
    this.sent.push(payload);
    if (this.sent.length > SENT_KEPT) this.sent.splice(0, this.sent.length - SENT_KEPT);
    this.log.warn(String(payload.event_message), { budget: counter.label, spend: payload.spend, max_budget: payload.max_budget, soft_budget: payload.soft_budget });
    if (typeof payload.team_id === "string") this.toTeam?.(payload.team_id, payload);
    await this.delivery.deliverNew(key, deliveryId, payload);
  }
}

/**
 * Forgets the alerts sent for these counters: their spend was reset (the key's, or the global
 * reset), so crossing a threshold again is news again, also in the same period and for a budget
 * without one (before, its alert was sent once for the life of the key).
 */
export async function forgetAlerts(db: Db, counterIds: readonly string[]): Promise<void> {
  for (let i = 0; i < counterIds.length; i += 1000) {
    const ids = counterIds.slice(i, i + 1000);
    // One still owed to the webhook is delivered all the same, under another key, no longer in the way of a new one.
    await db
      .update(budgetAlerts)
      .set({ period: sql`${budgetAlerts.period} || '#reset ' || ${randomUUID()}` })
      .where(and(inArray(budgetAlerts.counterId, ids), isNotNull(budgetAlerts.nextAttemptAt)));
    await db.delete(budgetAlerts).where(and(inArray(budgetAlerts.counterId, ids), isNull(budgetAlerts.nextAttemptAt)));
  }
}
