/**
 * Spreads identity changes: applied to this instance's cache before the admin call returns, and
 * published on Redis (when configured) so every other instance reloads the same rows within
 * milliseconds.
 */
import type Redis from "ioredis";
import type { Logger } from "../contract.ts";
import type { IdentityCache } from "./cache.ts";
import type { IdentityChange } from "./records.ts";

const CHANNEL = "svc:identity-changes";

export class ChangeBus {
  private readonly instanceId = crypto.randomUUID();
  private subscriber: Redis | undefined;

  constructor(
    private readonly cache: IdentityCache,
    private readonly log: Logger,
    private readonly redis?: Redis,
  ) {}

  /** Subscribes to other instances' changes. A lost connection reloads everything on reconnect. */
  async start(): Promise<void> {
    if (!this.redis) return;
    const sub = this.redis.duplicate({ enableOfflineQueue: true, maxRetriesPerRequest: null });
    this.subscriber = sub;
    sub.on("error", () => undefined);
    let connectedBefore = false;
    sub.on("ready", () => {
      // Messages published while we were away are gone: resynchronise from the store.
      if (connectedBefore) void this.cache.apply({ kind: "all" }).catch((err) => this.log.error("identity resync failed", { error: String(err) }));
      connectedBefore = true;
    });
    sub.on("message", (_channel: string, message: string) => void this.receive(message));
    // Not awaited: with Redis down the subscription completes when it comes back.
    void sub.subscribe(CHANNEL).catch((err) => this.log.warn("identity change subscription failed", { error: String(err) }));
  }

  private async receive(message: string): Promise<void> {
    try {
      const { origin, changes } = JSON.parse(message) as { origin: string; changes: IdentityChange[] };
      if (origin === this.instanceId) return;
      for (const change of changes) await this.cache.apply(change);
    } catch (err) {
      this.log.error("bad identity change message", { error: String(err) });
    }
  }

  /** Applies changes locally, then tells the other instances. */
  async publish(...changes: IdentityChange[]): Promise<void> {
    for (const change of changes) await this.cache.apply(change);
    if (!this.redis) return;
    try {
      await this.redis.publish(CHANNEL, JSON.stringify({ origin: this.instanceId, changes }));
    } catch (err) {
      this.log.warn("could not publish identity change to other instances", { error: String(err) });
    }
  }

  async stop(): Promise<void> {
    this.subscriber?.disconnect();
  }
}
