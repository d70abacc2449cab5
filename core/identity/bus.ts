/**
 * Spreads identity changes: applied to this instance's cache before the admin call returns, and
 * published on Redis (when configured) so every other instance reloads the same rows within
 * milliseconds. Without Redis, instances sharing one PostgreSQL use its LISTEN/NOTIFY instead.
 */
import type Redis from "ioredis";
import type { Logger } from "../contract.ts";
import { channelName } from "../kv/redis.ts";
import type { Notifications } from "../store/db.ts";
import type { IdentityCache } from "./cache.ts";
import type { IdentityChange } from "./records.ts";
import { storeErrorCause } from "../store/sql.ts";

const CHANNEL = "svc:identity-changes";
/** PostgreSQL channel names are identifiers. */
const PG_CHANNEL = "svc_identity_changes";
/** NOTIFY payloads are limited to 8000 bytes; a larger batch is sent as "reload everything". */
const PG_PAYLOAD_MAX = 7900;
/** Unpublished changes kept while Redis is unreachable; beyond this, one full reload is sent instead. */
const MAX_PENDING = 1000;
/** How long `caughtUp` waits for its marker before going on without it (the channel is down or reconnecting). */
const CATCH_UP_MS = 1000;
/** A reload after a reconnection that failed (the store not answering yet) is tried again this much later. */
const RELOAD_RETRY_MS = 1000;

/**
 * What a batch too large to send is sent as instead: every row reloaded, and any spend reset
 * widened to every counter (a reload alone would leave the reset counters counting on).
 */
function widened(changes: readonly IdentityChange[]): IdentityChange[] {
  return changes.some((c) => c.kind === "spend_reset") ? [{ kind: "all" }, { kind: "spend_reset" }] : [{ kind: "all" }];
}

export class ChangeBus {
  private readonly instanceId = crypto.randomUUID();
  private subscriber: Redis | undefined;
  /** Changes made here that could not be published yet (Redis down); sent when it is back. */
  private pending: IdentityChange[] = [];
  private subscribedOnce: Promise<void> = Promise.resolve();
  /** Markers sent by `caughtUp`, resolved when they come back on the channel. */
  private readonly markers = new Map<string, () => void>();
  /** The Redis channel of this instance's database. */
  private readonly channel: string;
  private reloadRetry: ReturnType<typeof setTimeout> | undefined;
  private stopped = false;

  constructor(
    private readonly cache: IdentityCache,
    private readonly log: Logger,
    private readonly redis?: Redis,
    private readonly pg?: Notifications,
  ) {
    this.channel = redis ? channelName(redis, CHANNEL) : CHANNEL;
  }

  /**
   * Subscribes to other instances' changes. Every (re)connection resubscribes first and then reloads
   * everything, because messages published while we were away (or before the first subscription)
   * are gone; doing it in that order leaves no window in which a change could be missed.
   */
  async start(): Promise<void> {
    if (!this.redis) return this.startPg();
    // A subscriber waits for messages as long as they take: no command timeout.
    const sub = this.redis.duplicate({ enableOfflineQueue: true, maxRetriesPerRequest: null, lazyConnect: true, commandTimeout: undefined });
    this.subscriber = sub;
    // A first connection made at once can only have missed the changes of the last few
    // milliseconds (identity rows reloaded quietly); after an outage stored models may have
    // changed too, so the full reload also rebuilds the model registry.
    let outage = false;
    sub.on("error", () => {
      outage = true;
    });
    let first: (() => void) | undefined;
    this.subscribedOnce = new Promise<void>((resolve) => {
      first = resolve;
    });
    sub.on("ready", () => {
      const full = outage;
      outage = true;
      void this.resync(sub, full).finally(() => first?.());
    });
    sub.on("message", (_channel: string, message: string) => void this.receive(message));
    this.redis.on("ready", () => void this.flushPending());
    // Not awaited: with Redis down the subscription completes when it comes back.
    sub.connect().catch((err) => this.log.warn("identity change subscriber could not connect yet; retrying", { error: String(err) }));
  }

  /** LISTEN on the shared PostgreSQL; each re-listen after a lost connection reloads everything. */
  private async startPg(): Promise<void> {
    const pg = this.pg;
    if (!pg) return;
    let listenedBefore = false;
    this.subscribedOnce = pg
      .listen(
        PG_CHANNEL,
        (payload) => void this.receive(payload),
        () => {
          if (listenedBefore) void this.reload(true);
          listenedBefore = true;
        },
      )
      .catch((err) => this.log.warn("identity change listener could not start", storeErrorCause(err)));
    await this.subscribedOnce;
  }

  /** Resolves once the first subscription (and its resync) has completed; for tests and start-up checks. */
  subscribed(): Promise<void> {
    return this.subscribedOnce;
  }

  private async resync(sub: Redis, full: boolean): Promise<void> {
    try {
      await sub.subscribe(this.channel);
    } catch (err) {
      this.log.error("identity resync failed", storeErrorCause(err));
      return;
    }
    await this.reload(full);
  }

  /**
   * Reloads what changes missed while the channel was away may have touched; retried until it
   * succeeds: a channel back before the store (or with the store's connections being replaced)
   * otherwise left this instance on its stale rows until the next change (a key blocked elsewhere
   * meanwhile kept working here).
   */
  private async reload(full: boolean): Promise<void> {
    clearTimeout(this.reloadRetry);
    try {
      await (full ? this.cache.apply({ kind: "all" }) : this.cache.refresh());
    } catch (err) {
      this.log.error("identity resync failed; retrying", storeErrorCause(err));
      if (this.stopped) return;
      this.reloadRetry = setTimeout(() => void this.reload(full), RELOAD_RETRY_MS);
      this.reloadRetry.unref?.();
    }
  }

  private async receive(message: string): Promise<void> {
    try {
      const { origin, changes, marker } = JSON.parse(message) as { origin: string; changes?: IdentityChange[]; marker?: string };
      if (origin === this.instanceId) {
        if (marker) this.markers.get(marker)?.();
        return;
      }
      // Queued at once, in order: a marker that arrives after this message finds them all in the cache's queue.
      await Promise.all((changes ?? []).map((change) => this.cache.apply(change)));
    } catch (err) {
      this.log.error("bad identity change message", { error: String(err) });
    }
  }

  /**
   * Resolves once every change other instances published before this call has been applied here:
   * a marker sent on the channel comes back after all of them (Redis delivers a channel's messages
   * in order, PostgreSQL its notifications in commit order), then the cache's queue is awaited. So
   * a management call sees what a call through another instance has already written, not a cache
   * a few milliseconds behind. Best effort: without a channel (or while Redis is not connected), or
   * when the marker is not back within a second, it resolves without it.
   */
  async caughtUp(): Promise<void> {
    if (!this.redis && !this.pg) return;
    // With Redis away, nothing comes back: don't hold every management call for the timeout.
    if (this.redis && (this.redis.status !== "ready" || this.subscriber?.status !== "ready")) return this.cache.settled();
    const marker = crypto.randomUUID();
    const back = new Promise<void>((resolve) => this.markers.set(marker, resolve));
    // An empty change list too: an instance of an earlier version reads the message as nothing to do.
    const payload = JSON.stringify({ origin: this.instanceId, changes: [], marker });
    const sent = this.redis ? this.redis.publish(this.channel, payload) : this.pg!.notify(PG_CHANNEL, payload);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, CATCH_UP_MS);
    });
    try {
      await Promise.race([sent.then(() => back), late]);
    } catch {
      // Not sent (the channel is down): nothing to wait for.
    } finally {
      clearTimeout(timer);
      this.markers.delete(marker);
    }
    await this.cache.settled();
  }

  /** Applies changes locally, then tells the other instances. */
  async publish(...changes: IdentityChange[]): Promise<void> {
    for (const change of changes) await this.cache.apply(change);
    await this.send(changes);
  }

  /** Tells the other instances only, of what this one has done already (a spend reset's counters). */
  async announce(...changes: IdentityChange[]): Promise<void> {
    await this.send(changes);
  }

  private async send(changes: IdentityChange[]): Promise<void> {
    if (!this.redis) return this.sendPg(changes);
    try {
      await this.redis.publish(this.channel, JSON.stringify({ origin: this.instanceId, changes }));
    } catch (err) {
      // The other instances would otherwise keep serving the old rows until their own reconnect.
      this.pending.push(...changes);
      if (this.pending.length > MAX_PENDING) this.pending = widened(this.pending);
      this.log.warn("could not publish identity change to other instances; will send it when Redis is back", { error: String(err) });
    }
  }

  private async sendPg(changes: IdentityChange[]): Promise<void> {
    if (!this.pg) return;
    let payload = JSON.stringify({ origin: this.instanceId, changes });
    if (payload.length > PG_PAYLOAD_MAX) payload = JSON.stringify({ origin: this.instanceId, changes: widened(changes) });
    try {
      await this.pg.notify(PG_CHANNEL, payload);
    } catch (err) {
      this.log.warn("could not notify other instances of an identity change", storeErrorCause(err));
    }
  }

  private async flushPending(): Promise<void> {
    if (this.pending.length === 0) return;
    const changes = this.pending;
    this.pending = [];
    await this.send(changes);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.reloadRetry);
    this.subscriber?.disconnect();
  }
}
