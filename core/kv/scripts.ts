/**
 * Lua scripts on the request path (rate limits), sent over Bun's native Redis client: it pipelines
 * commands by itself and writes to the socket natively, where ioredis over Bun's `node:net` layer
 * costs ~100 µs of CPU per command under load (measured in the gateway's profile). ioredis keeps the
 * rest (pub/sub, budgets, cache). Fails fast while Redis is unreachable (no offline queue), so the
 * caller can fall back at once; reconnects in the background.
 */
import { createHash } from "node:crypto";
import { RedisClient } from "bun";
import { beforeTimeout } from "../timer.ts";
import { REDIS_COMMAND_TIMEOUT_MS } from "./redis.ts";

const CONNECT_TIMEOUT_MS = 2000;

export class LuaScript {
  readonly sha: string;
  constructor(readonly lua: string) {
    this.sha = createHash("sha1").update(lua).digest("hex");
  }
}

export interface ScriptRunner {
  /** Resolves once connected, or when the first attempt failed or timed out (the runner keeps trying). */
  ready(): Promise<void>;
  run(script: LuaScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown>;
  close(): void;
}

export function nativeScriptRunner(url: string): ScriptRunner {
  const open = () => new RedisClient(url, { enableOfflineQueue: false, autoReconnect: true, maxRetries: 4_294_967_295, connectionTimeout: CONNECT_TIMEOUT_MS });
  let client = open();
  let connecting: Promise<void> | undefined;
  let closed = false;
  /** One connection attempt at a time; commands meanwhile fail fast (the caller falls back). */
  const ensureConnected = () => {
    if (closed || client.connected || connecting) return;
    const attempt: Promise<void> = client
      .connect()
      .catch(() => undefined)
      .finally(() => {
        if (connecting === attempt) connecting = undefined;
      });
    connecting = attempt;
  };
  /**
   * `reply`, or a rejection after REDIS_COMMAND_TIMEOUT_MS: then the connection, which no longer
   * answers, is replaced, and until the new one is up commands fail at once (the caller counts
   * without Redis) instead of each waiting out the timeout.
   */
  const answered = <T>(on: RedisClient, reply: Promise<T>): Promise<T> =>
    beforeTimeout(reply, REDIS_COMMAND_TIMEOUT_MS, () => {
      if (on === client && !closed) {
        client = open();
        connecting = undefined;
        on.close();
        ensureConnected();
      }
      return new Error(`redis did not answer within ${REDIS_COMMAND_TIMEOUT_MS} ms`);
    });
  ensureConnected();
  return {
    ready: async () => {
      ensureConnected();
      // With reconnects on, a refused connection may never settle the attempt: wait at most the timeout.
      let timer: ReturnType<typeof setTimeout> | undefined;
      const timeout = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, CONNECT_TIMEOUT_MS);
      });
      await Promise.race([connecting, timeout]);
      clearTimeout(timer);
    },
    async run(script, keys, args) {
      ensureConnected();
      const argv = [String(keys.length), ...keys, ...args.map(String)];
      const on = client;
      try {
        return await answered(on, on.send("EVALSHA", [script.sha, ...argv]));
      } catch (err) {
        if (err instanceof Error && err.message.includes("NOSCRIPT")) return answered(on, on.send("EVAL", [script.lua, ...argv]));
        throw err;
      }
    },
    close: () => {
      closed = true;
      client.close();
    },
  };
}
