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
      try {
        const pong = await Promise.race([
          client.ping(),
          new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no answer within ${PING_TIMEOUT_MS} ms`)), PING_TIMEOUT_MS)),
        ]);
        return { ok: pong === "PONG", detail: pong };
      } catch (err) {
        return { ok: false, detail: err instanceof Error ? err.message : String(err) };
      }
    },
    async close() {
      client.disconnect();
    },
  };
}
