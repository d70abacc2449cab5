/**
 * Deployment cooldowns shared between instances (with REDIS_URL): when one instance cools a
 * deployment down, it says so on a Redis channel and every other instance skips that deployment
 * for the same time, instead of each paying `allowed_fails` failed calls to learn it is down.
 * Best effort by design: a message lost while Redis is away only means that instance learns alone.
 */
import type Redis from "ioredis";
import type { Logger } from "../contract.ts";
import { channelName } from "../kv/redis.ts";
import { MAX_COOLDOWN_MS, stateOf } from "./deployment-state.ts";

const CHANNEL = "svc:deployment-cooldowns";

export interface CooldownShare {
  /** Tells the other instances that `deploymentId` cools down for `ms` from now. */
  cooledDown(deploymentId: string, ms: number): void;
}

interface CooldownMessage {
  from: string;
  id: string;
  ms: number;
}

function parse(text: string): CooldownMessage | undefined {
  try {
    const m = JSON.parse(text) as Partial<CooldownMessage>;
    if (typeof m.from === "string" && typeof m.id === "string" && typeof m.ms === "number" && m.ms > 0 && m.ms <= MAX_COOLDOWN_MS) return m as CooldownMessage;
  } catch {
    // Not ours, or cut: ignored.
  }
  return undefined;
}

export class CooldownBus implements CooldownShare {
  private readonly instance = crypto.randomUUID();
  private readonly channel: string;
  private subscriber: Redis | undefined;

  constructor(
    private readonly redis: Redis,
    private readonly log: Logger,
    /**
     * Whether this instance serves a deployment: a cooldown another instance announces for one it
     * does not (another config, a fleet mid-deploy) is not kept, or its figures would stay for good.
     */
    private readonly serves: (deploymentId: string) => boolean = () => true,
  ) {
    this.channel = channelName(redis, CHANNEL);
  }

  start(): void {
    // A subscriber waits for messages as long as they take: no command timeout.
    const sub = this.redis.duplicate({ enableOfflineQueue: true, maxRetriesPerRequest: null, lazyConnect: true, commandTimeout: undefined });
    this.subscriber = sub;
    sub.on("error", () => undefined);
    // (Re)subscribes on every connection; cooldowns announced meanwhile are simply not heard.
    let announced = false;
    sub.on("ready", () => {
      sub
        .subscribe(this.channel)
        .then(() => {
          if (!announced) this.log.info("deployment cooldowns are shared with other instances through redis");
          announced = true;
        })
        .catch(() => undefined);
    });
    sub.on("message", (_channel: string, text: string) => {
      const m = parse(text);
      if (!m || m.from === this.instance || !this.serves(m.id)) return;
      // Relative time: instances' clocks need not agree.
      stateOf(m.id).coolUntil(Date.now() + m.ms);
    });
    sub.connect().catch((err) => this.log.warn("deployment cooldown subscriber could not connect yet; retrying", { error: String(err) }));
  }

  cooledDown(deploymentId: string, ms: number): void {
    const message: CooldownMessage = { from: this.instance, id: deploymentId, ms };
    this.redis.publish(this.channel, JSON.stringify(message)).catch(() => undefined);
  }

  stop(): void {
    // disconnect, not quit: with Redis away a quit would wait in the offline queue.
    this.subscriber?.disconnect();
    this.subscriber = undefined;
  }
}
