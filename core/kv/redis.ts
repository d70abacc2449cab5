/** The optional Redis connection (REDIS_URL): fails fast instead of queueing when Redis is down. */
import Redis, { type Command } from "ioredis";
import type { Logger } from "../contract.ts";

/**
 * The longest a command may wait for Redis. A Redis that stops answering without closing the
 * connection (a link that drops packets, a stalled proxy) would otherwise hold every call that
 * reads the cache, a budget or a rate limit until TCP gives up, for minutes.
 */
export const REDIS_COMMAND_TIMEOUT_MS = 1000;
const TIMED_OUT = "Command timed out";

/**
 * A client that reconnects once a command times out: until the new connection is ready (its
 * ready check answered), commands fail at once (no offline queue) and their callers fall back,
 * instead of each waiting out the timeout on a connection that no longer answers.
 */
class StallAwareRedis extends Redis {
  onStall: () => void = () => undefined;
  /** When a command last got its answer. */
  private answeredAt = 0;

  override sendCommand(command: Command, stream?: Parameters<Redis["sendCommand"]>[1]): unknown {
    const sentAt = performance.now();
    const result = super.sendCommand(command, stream);
    command.promise.then(
      () => {
        this.answeredAt = performance.now();
      },
      (err: unknown) => {
        // Stalled: nothing answered since this command went out a whole timeout ago. (A command
        // sent again after a reconnect keeps its first timer, and may time out at once: not that.)
        const stalled = err instanceof Error && err.message === TIMED_OUT && this.answeredAt < sentAt && performance.now() - sentAt >= REDIS_COMMAND_TIMEOUT_MS * 0.9;
        if (stalled && this.status === "ready") {
          this.onStall();
          this.disconnect(true);
        }
      },
    );
    return result;
  }
}

export interface RedisHandle {
  client: Redis;
  ping(): Promise<{ ok: boolean; detail: string }>;
  close(): Promise<void>;
}

const PING_TIMEOUT_MS = 1000;

export function connectRedis(url: string, log: Logger): RedisHandle {
  const client = new StallAwareRedis(url, {
    maxRetriesPerRequest: 1,
    enableOfflineQueue: false,
    commandTimeout: REDIS_COMMAND_TIMEOUT_MS,
    retryStrategy: (attempt) => Math.min(attempt * 200, 2000),
  });
  let down = false;
  client.onStall = () => {
    if (!down) log.warn(`redis did not answer within ${REDIS_COMMAND_TIMEOUT_MS} ms; reconnecting, and counting without it meanwhile`);
    down = true;
  };
  client.on("error", (err) => {
    if (!down) log.warn("redis unreachable; retrying in the background", { error: err.message });
    down = true;
  });
  client.on("ready", () => {
    if (down) log.info("redis reachable again");
    down = false;
  });
  return {
    client,
    async ping() {
      let timer: ReturnType<typeof setTimeout> | undefined;
      let onReady: (() => void) | undefined;
      try {
        const timeout = new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error(`no answer within ${PING_TIMEOUT_MS} ms (${client.status})`)), PING_TIMEOUT_MS);
        });
        // Right after start (or during a reconnect) the client is still connecting, and with no
        // offline queue a command would fail at once: wait for the connection within the budget.
        if (client.status !== "ready") {
          const ready = new Promise<void>((resolve) => {
            onReady = resolve;
            client.once("ready", resolve);
          });
          await Promise.race([ready, timeout]);
        }
        const pong = await Promise.race([client.ping(), timeout]);
        return { ok: pong === "PONG", detail: pong };
      } catch (err) {
        return { ok: false, detail: err instanceof Error ? err.message : String(err) };
      } finally {
        clearTimeout(timer);
        if (onReady) client.off("ready", onReady);
      }
    },
    async close() {
      client.disconnect();
    },
  };
}

/**
 * A pub/sub channel of `client`'s database. Redis delivers a channel's messages to subscribers on
 * every database index, so gateways sharing one server with different ones (`redis://…/1` for
 * staging, `/2` for production) would hear each other's cooldowns and identity changes; beyond
 * database 0 the index is part of the name (database 0 keeps the plain name earlier releases used).
 */
export function channelName(client: Redis, name: string): string {
  const db = client.options.db ?? 0;
  return db === 0 ? name : `${name}:db${db}`;
}
