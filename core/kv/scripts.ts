/**
 * Lua scripts on the request path (rate limits), sent over Bun's native Redis client: it pipelines
 * commands by itself and writes to the socket natively, where ioredis over Bun's `node:net` layer
 * costs ~100 µs of CPU per command under load (measured in the gateway's profile). ioredis keeps the
 * rest (pub/sub, budgets, cache). Fails fast while Redis is unreachable (no offline queue), so the
 * caller can fall back at once; reconnects in the background.
 */
import { createHash } from "node:crypto";
import { RedisClient } from "bun";

export class LuaScript {
  readonly sha: string;
  constructor(readonly lua: string) {
    this.sha = createHash("sha1").update(lua).digest("hex");
  }
}

export interface ScriptRunner {
  /** Resolves once connected, or when the first attempt failed (the runner keeps trying). */
  ready(): Promise<void>;
  run(script: LuaScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown>;
  close(): void;
}

export function nativeScriptRunner(url: string): ScriptRunner {
  const client = new RedisClient(url, { enableOfflineQueue: false, autoReconnect: true, maxRetries: 4_294_967_295, connectionTimeout: 2000 });
  let connecting: Promise<void> | undefined;
  let closed = false;
  /** One connection attempt at a time; commands meanwhile fail fast (the caller falls back). */
  const ensureConnected = () => {
    if (closed || client.connected || connecting) return;
    connecting = client
      .connect()
      .catch(() => undefined)
      .finally(() => {
        connecting = undefined;
      });
  };
  ensureConnected();
  return {
    ready: async () => {
      ensureConnected();
      await connecting;
    },
    async run(script, keys, args) {
      ensureConnected();
      const argv = [String(keys.length), ...keys, ...args.map(String)];
      try {
        return await client.send("EVALSHA", [script.sha, ...argv]);
      } catch (err) {
        if (err instanceof Error && err.message.includes("NOSCRIPT")) return client.send("EVAL", [script.lua, ...argv]);
        throw err;
      }
    },
    close: () => {
      closed = true;
      client.close();
    },
  };
}
