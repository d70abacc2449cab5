/**
 * Delivery to a team's webhooks: each finished call of the team (billing metadata only: who,
 * which model, tokens, cost, status; never the prompt or the answer) and the team's budget
 * alerts, POSTed as JSON with the headers given at registration. Off the response path, two
 * attempts each, in order per webhook, a few at a time (PER_WEBHOOK), at most MAX_ACTIVE for all
 * webhooks together, of which each webhook has RESERVED of its own unless 16 others hold theirs;
 * a free slot goes to the waiting webhook with the fewest under way. Past MAX_WAITING deliveries
 * waiting for one webhook, its new ones are dropped (and that is logged): a webhook that hangs
 * costs only itself events, never another webhook (of its team or another one) nor the gateway's
 * own upstream calls, which share Bun's fetch.
 */
import { randomUUID } from "node:crypto";
import type { CallRecord, Logger } from "../contract.ts";
import { picoToUsd } from "../cost/money.ts";
import type { TeamRow } from "../identity/records.ts";
import { type TeamWebhook, teamWebhooks } from "../identity/team-callbacks.ts";
import { checkHost } from "../private-host.ts";
import { decrypt } from "../secrets.ts";
import { postNotification } from "./post.ts";
import { deliveryHeaders } from "./signing.ts";

export interface WebhookTarget {
  url: string;
  headers: Record<string, string>;
  /** A team admin's webhook: refused when its host resolves inside this machine or its network. */
  publicOnly?: boolean;
  /** Deliveries are signed with it (signing.ts). */
  secret?: string;
}

/** Deliveries one webhook may have under way at once; the others wait their turn in its queue. */
const PER_WEBHOOK = 16;
/**
 * Deliveries under way for all webhooks together. Bun's fetch makes at most 256 requests at once
 * (BUN_CONFIG_MAX_HTTP_REQUESTS) and queues the rest, upstream model calls included: webhooks that
 * hang must never hold them all.
 */
const MAX_ACTIVE = 128;
/**
 * A webhook's first RESERVED deliveries under way draw on MAX_ACTIVE alone; the ones past that
 * draw on SHARED, which all webhooks together may not exceed. So webhooks that hang hold at most
 * RESERVED each plus SHARED between them, and MAX_ACTIVE is full only when 16 webhooks hold
 * RESERVED each: more than one team may register (10). Before, 8 hanging webhooks (one team's)
 * held all 128 and another team's webhook got nothing for 21 s, then dropped events.
 */
const RESERVED = 4;
const SHARED = MAX_ACTIVE / 2;
/** Deliveries one webhook may have under way or waiting; past that its new events are dropped. */
const MAX_WAITING = 256;

/**
 * How long one attempt may take, the pause before the second one, and how often drops to one
 * webhook are logged while they go on (DropLog). These are the defaults; a test shortens them on
 * this object (read at every attempt) to exercise webhooks that hang.
 */
export const webhookTiming = { timeoutMs: 10_000, retryAfterMs: 1000, dropLogEveryMs: 60_000 };

/** Why a stored webhook is not delivered to, for logs and `GET /team/{id}/callback`. */
export const UNREADABLE_WEBHOOK =
  "its headers or signing secret cannot be decrypted with the current key (SVC_SALT_KEY, or without it the master key, changed since it was registered): it gets no events until it is registered again with POST /team/{team_id}/callback";

/** One stored webhook with its header values and secret readable; undefined when they were encrypted under another key. */
export function readableWebhook(w: TeamWebhook, key: Buffer | undefined): WebhookTarget | undefined {
  if (!key) return undefined;
  try {
    const headers = Object.fromEntries(Object.entries(w.headers).map(([h, v]) => [h, decrypt(v, key)]));
    const secret = typeof w.signing_secret === "string" ? decrypt(w.signing_secret, key) : undefined;
    return { url: w.url, headers, publicOnly: w.public_only === true, ...(secret === undefined ? {} : { secret }) };
  } catch {
    return undefined;
  }
}

/** Webhooks already reported unreadable: each stored webhook is logged once (a changed team row holds new ones). */
const reportedUnreadable = new WeakSet<TeamWebhook>();

/**
 * The team's webhooks with their header values readable. One that cannot be decrypted is not sent
 * with wrong headers, and not dropped without a word either: the log names the team and the
 * webhook (by origin) and says how to mend it.
 */
export function webhookTargets(team: TeamRow | undefined, key: Buffer | undefined, log: Logger): WebhookTarget[] {
  const out: WebhookTarget[] = [];
  for (const w of teamWebhooks(team)) {
    const target = readableWebhook(w, key);
    if (target) out.push(target);
    else if (!reportedUnreadable.has(w)) {
      reportedUnreadable.add(w);
      log.warn(`team webhook not delivered to: ${UNREADABLE_WEBHOOK}`, { team_id: team?.teamId, webhook: where(w.url) });
    }
  }
  return out;
}

/** Where a webhook is, for logs: its origin only (a path or query may carry a token). */
const where = (url: string) => (URL.canParse(url) ? new URL(url).origin : "(unreadable url)");

const iso = (ms: number | undefined) => (ms === undefined ? null : new Date(ms).toISOString());

/** What a team webhook receives for one call. */
export function callPayload(call: CallRecord): Record<string, unknown> {
  const p = call.principal;
  return {
    event: "llm_call",
    id: call.id,
    call_type: call.endpoint,
    status: call.status,
    model: call.requestedModel,
    model_group: call.modelGroup,
    model_id: call.deploymentId,
    provider: call.provider,
    response_id: call.responseId ?? null,
    response_cost: picoToUsd(call.cost),
    prompt_tokens: call.usage.promptTokens,
    completion_tokens: call.usage.completionTokens,
    total_tokens: call.usage.promptTokens + call.usage.completionTokens,
    cache_hit: call.cacheHit,
    stream: call.stream,
    start_time: iso(call.startedAt),
    end_time: iso(call.endedAt),
    api_key: p.keyHash,
    key_alias: p.keyAlias ?? null,
    team_id: p.teamId ?? null,
    user_id: p.userId ?? null,
    organization_id: p.orgId ?? null,
    end_user: call.endUser ?? null,
    request_tags: call.tags,
    error: call.error ? { message: call.error.message, type: call.error.type, code: String(call.error.status) } : null,
  };
}

interface Delivery {
  target: WebhookTarget;
  body: string;
  /** The event's, the same on every attempt (signing.ts). */
  id: string;
}

interface Queue {
  readonly url: string;
  /** Deliveries of this webhook waiting for a turn, in order. */
  readonly waiting: Delivery[];
  /** Delivers one with its attempts (the sender counts it done after). */
  readonly send: (d: Delivery) => Promise<void>;
  /** Its last waiting delivery has started: its sender forgets it. */
  readonly drained: () => void;
}

/**
 * What is under way in this process, every sender together: the bounds are Bun's fetch's, which
 * is per process, and a reload makes a new sender while the retired one still delivers (each
 * counting its own, two senders with hung webhooks held every fetch slot, model calls queued).
 */
const underWay = { all: 0, shared: 0, byUrl: new Map<string, number>() };

/**
 * Queues with deliveries waiting, every sender's, in the order of their last turn (a queue that
 * starts one goes to the back).
 */
const turns = new Set<Queue>();

function mayStart(active: number): boolean {
  return active < PER_WEBHOOK && (active < RESERVED || underWay.shared < SHARED);
}

/**
 * Starts what may start: each slot to the waiting webhook with the fewest under way, the one
 * whose turn is oldest among equals. Before, a freed slot went to the first queue in the map, so
 * webhooks that hang, queued first, won back every slot they freed.
 */
function pump(): void {
  while (underWay.all < MAX_ACTIVE) {
    let best: Queue | undefined;
    let fewest = PER_WEBHOOK;
    for (const q of turns) {
      const active = underWay.byUrl.get(q.url) ?? 0;
      if (active < fewest && mayStart(active)) {
        best = q;
        fewest = active;
      }
    }
    if (!best) return;
    turns.delete(best);
    const next = best.waiting.shift();
    if (!next) continue;
    if (best.waiting.length > 0) turns.add(best);
    else best.drained();
    start(best, next);
  }
}

function start(q: Queue, d: Delivery): void {
  const active = underWay.byUrl.get(q.url) ?? 0;
  const shared = active >= RESERVED;
  underWay.byUrl.set(q.url, active + 1);
  underWay.all++;
  if (shared) underWay.shared++;
  void q.send(d).finally(() => {
    const left = (underWay.byUrl.get(q.url) ?? 1) - 1;
    if (left > 0) underWay.byUrl.set(q.url, left);
    else underWay.byUrl.delete(q.url);
    underWay.all--;
    // The one past RESERVED is the one given back, whichever of them ended.
    if (left >= RESERVED) underWay.shared--;
    pump();
  });
}

/**
 * Drops logged per webhook and incident: the first at once, then while they go on one line per
 * `dropLogEveryMs` with how many since; a quiet spell that long ends the incident, so the next one
 * is logged at once too. Before, a sender logged its 1st, 1001st, … drop: a second incident in the
 * same process logged nothing.
 */
class DropLog {
  private readonly incidents = new Map<string, { since: number }>();

  constructor(private readonly log: Logger) {}

  dropped(url: string): void {
    const incident = this.incidents.get(url);
    if (incident) {
      incident.since++;
      return;
    }
    this.log.warn("team webhook deliveries dropped: too many waiting", { webhook: where(url), dropped: 1 });
    this.watch(url, { since: 0 });
  }

  private watch(url: string, incident: { since: number }): void {
    this.incidents.set(url, incident);
    const timer = setTimeout(() => {
      if (incident.since === 0) {
        this.incidents.delete(url);
        return;
      }
      this.log.warn("team webhook deliveries dropped: too many waiting", { webhook: where(url), dropped: incident.since, within_ms: webhookTiming.dropLogEveryMs });
      this.watch(url, { since: 0 });
    }, webhookTiming.dropLogEveryMs);
    timer.unref?.();
  }
}

export class WebhookSender {
  /** One queue per webhook URL with deliveries waiting. */
  private readonly queues = new Map<string, Queue>();
  /** This sender's deliveries under way or waiting. */
  private pending = 0;
  private readonly drops: DropLog;
  private idleWaiters: (() => void)[] = [];

  constructor(private readonly log: Logger) {
    this.drops = new DropLog(log);
  }

  /** Fire-and-forget. */
  post(target: WebhookTarget, payload: Record<string, unknown>): void {
    const url = target.url;
    let q = this.queues.get(url);
    if ((underWay.byUrl.get(url) ?? 0) + (q?.waiting.length ?? 0) >= MAX_WAITING) {
      this.drops.dropped(url);
      return;
    }
    if (!q) {
      const queue: Queue = {
        url,
        waiting: [],
        send: (d) => this.deliver(d).finally(() => this.done()),
        drained: () => {
          if (this.queues.get(url) === queue) this.queues.delete(url);
        },
      };
      this.queues.set(url, queue);
      q = queue;
    }
    // A call's event is known by the call's id; an alert gets one of its own.
    q.waiting.push({ target, body: JSON.stringify(payload), id: typeof payload.id === "string" ? payload.id : `msg_${randomUUID()}` });
    this.pending++;
    turns.add(q);
    pump();
  }

  private done(): void {
    this.pending--;
    if (this.pending === 0) for (const w of this.idleWaiters.splice(0)) w();
  }

  /** Resolves once nothing is being delivered or waiting (or after `ms`). */
  idle(ms = 5000): Promise<void> {
    if (this.pending === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.idleWaiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  private async deliver({ target, body, id }: Delivery): Promise<void> {
    // Checked at every delivery, not only at registration: the name's record may point inward since
    // (SSRF); and the delivery connects to the address checked, not to a new answer (DNS rebinding).
    const check = target.publicOnly && URL.canParse(target.url) ? await checkHost(new URL(target.url).hostname) : undefined;
    if (check?.inside) {
      this.log.warn("team webhook not delivered: its host resolves to this machine or a private network", { webhook: where(target.url), address: check.inside });
      return;
    }
    if (check?.unresolved) {
      this.log.warn("team webhook not delivered: its host does not resolve", { webhook: where(target.url) });
      return;
    }
    for (let attempt = 1; attempt <= 2; attempt++) {
      try {
        // A content type the team registered is sent as it is, instead of the gateway's (never both).
        const given = Object.keys(target.headers).some((h) => h.toLowerCase() === "content-type") ? target.headers : { ...target.headers, "content-type": "application/json" };
        const headers = { ...given, ...deliveryHeaders(id, body, target.secret) };
        const res = await postNotification(target.url, headers, body, webhookTiming.timeoutMs, check?.address);
        if (res.ok) return;
        this.log.warn("team webhook answered an error", { webhook: where(target.url), status: res.status, attempt });
      } catch (err) {
        this.log.warn("team webhook unreachable", { webhook: where(target.url), error: String(err), attempt });
      }
      if (attempt === 1) await new Promise((r) => setTimeout(r, webhookTiming.retryAfterMs));
    }
  }
}
