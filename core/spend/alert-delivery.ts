/**
 * Delivery of budget alerts to the alert webhook, owed until the webhook takes them: the
 * `budget_alerts` row keeps what is owed (`next_attempt_at`), so an alert whose first attempts
 * failed (the receiver down for an hour, the gateway restarted meanwhile) is tried again by any
 * instance, with the same `webhook-id`, backing off up to an hour between attempts, for a day; then
 * it is given up, logged, and stays in the table with its last error (the dead letters). LiteLLM
 * sends each alert once, unsigned, and forgets it.
 */
import { sql } from "drizzle-orm";
import type { Logger } from "../contract.ts";
import { PeriodicJob } from "../periodic-job.ts";
import { postNotification } from "../callbacks/post.ts";
import { deliveryHeaders } from "../callbacks/signing.ts";
import type { Db } from "../store/db.ts";
import { rows } from "../store/sql.ts";

/**
 * The pause before each of the first attempts and how long one may take; how often owed alerts are
 * looked for, the first pause between later attempts (doubling, at most `maxBackoffMs`), and how
 * long an alert is owed. These are the defaults; a test shortens them on this object.
 */
export const alertTiming = { pausesMs: [0, 1000, 5000], timeoutMs: 10_000, sweepMs: 30_000, backoffMs: 60_000, maxBackoffMs: 3_600_000, giveUpMs: 86_400_000 };

/** An instant as raw SQL takes it on both stores (postgres.js refuses a Date there). */
const stamp = (ms: number) => new Date(ms).toISOString();

/** Alerts taken per look; the rest wait for the next one. */
const BATCH = 20;

/** Where alerts go and the secret that signs them. */
export type AlertWebhook = () => { url: string; secret?: string } | undefined;

/** A budget_alerts row's key. */
export interface RowKey {
  counterId: string;
  event: string;
  period: string;
}

/** An owed alert as its row holds it. */
interface Owed {
  counter_id: string;
  event: string;
  period: string;
  payload: Record<string, unknown> | string;
  delivery_id: string;
  attempts: number;
  sent_at: Date | string;
}

/** How long the first attempts of a new alert (or one attempt of an owed one) may take: no other instance takes it meanwhile. */
const claimMs = () => alertTiming.pausesMs.reduce((a, b) => a + b, 0) + alertTiming.pausesMs.length * alertTiming.timeoutMs + 5_000;

export class AlertDelivery {
  private readonly sweeper = new PeriodicJob(
    () => this.sweep(),
    (err) => this.log.warn("owed budget alerts could not be read; trying again later", { error: String(err) }),
  );

  constructor(
    private readonly db: Db,
    private readonly log: Logger,
    private readonly webhook: AlertWebhook,
  ) {}

  /** When a new alert's row is written: owed at once when a webhook is set (claimed by this instance for its first attempts). */
  firstDue(now = Date.now()): Date | null {
    return this.webhook() ? new Date(now + claimMs()) : null;
  }

  /** The first attempts of an alert just written (its row owes it, claimed by `firstDue`). */
  async deliverNew(key: RowKey, deliveryId: string, payload: Record<string, unknown>): Promise<void> {
    const target = this.webhook();
    if (!target) return;
    const body = JSON.stringify(payload);
    let error = "";
    let attempts = 0;
    for (const wait of alertTiming.pausesMs) {
      if (wait) await new Promise((r) => setTimeout(r, wait));
      attempts++;
      error = await this.attempt(target, deliveryId, body, attempts);
      if (!error) return this.record(key, attempts, "", Date.now());
    }
    await this.record(key, attempts, error, Date.now());
  }

  start(): void {
    this.sweeper.start(alertTiming.sweepMs);
  }

  stop(): Promise<void> {
    return this.sweeper.stop();
  }

  /** One attempt at each owed alert that is due (taken from other instances' reach while it runs). */
  async sweep(now = Date.now()): Promise<void> {
    const target = this.webhook();
    if (!target) return;
    const due = await rows<Owed>(
      this.db,
      sql`update budget_alerts set next_attempt_at = ${stamp(now + claimMs())}::timestamptz
        where (counter_id, event, period) in (
          select counter_id, event, period from budget_alerts where next_attempt_at <= ${stamp(now)}::timestamptz
          order by next_attempt_at limit ${BATCH} for update skip locked)
        returning counter_id, event, period, payload, delivery_id, attempts, sent_at`,
    );
    for (const row of due) {
      const key = { counterId: row.counter_id, event: row.event, period: row.period };
      const body = typeof row.payload === "string" ? row.payload : JSON.stringify(row.payload);
      const error = await this.attempt(target, row.delivery_id, body, row.attempts + 1);
      await this.record(key, row.attempts + 1, error, new Date(row.sent_at).getTime());
    }
  }

  /** One POST; the error as text ("" when the webhook took it). */
  private async attempt(target: { url: string; secret?: string }, id: string, body: string, attempt: number): Promise<string> {
    try {
      const headers = { "content-type": "application/json", ...deliveryHeaders(id, body, target.secret) };
      const res = await postNotification(target.url, headers, body, alertTiming.timeoutMs);
      if (res.ok) return "";
      this.log.warn("budget alert webhook answered an error", { status: res.status, attempt });
      return `HTTP ${res.status}`;
    } catch (err) {
      this.log.warn("budget alert webhook unreachable", { error: String(err), attempt });
      return String(err);
    }
  }

  /** What an attempt left owed: nothing when taken or given up, else the next attempt, backing off. */
  private async record(key: RowKey, attempts: number, error: string, sentAt: number): Promise<void> {
    const now = Date.now();
    const firstAttempts = alertTiming.pausesMs.length;
    const backoff = Math.min(alertTiming.maxBackoffMs, alertTiming.backoffMs * 2 ** Math.max(0, attempts - firstAttempts));
    const givenUp = error !== "" && now + backoff - sentAt > alertTiming.giveUpMs;
    const next = error === "" || givenUp ? null : stamp(now + backoff);
    if (givenUp) this.log.error("budget alert not delivered: given up", { attempts, error, counter: key.counterId, event: key.event });
    await this.db.execute(sql`update budget_alerts set attempts = ${attempts}, next_attempt_at = ${next}::timestamptz,
        delivered_at = ${error === "" ? stamp(now) : null}::timestamptz, last_error = ${error === "" ? null : error}
      where counter_id = ${key.counterId} and event = ${key.event} and period = ${key.period}`);
  }
}
