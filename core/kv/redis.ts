/** The optional Redis connection (REDIS_URL): fails fast instead of queueing when Redis is down. */
import Redis from "ioredis";
import type { Logger } from "../contract.ts";

export interface RedisHandle {
  client: Redis;
  ping(): Promise<{ ok: boolean; detail: string }>;
  close(): Promise<void>;
}

const PING_TIMEOUT_MS = 1000;

export function connectRedis(url: string, log: Logger): RedisHandle {
  const client = new Redis(url, {
    maxRetriesPerRequest: 1,
    enableOfflineQueue: false,
    retryStrategy: (attempt) => Math.min(attempt * 200, 2000),
  });
  let down = false;
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
