/** Where cached responses live: in this process (bounded LRU), or in Redis (shared by every instance). */
import type Redis from "ioredis";

export interface CachedResponse {
  /** The body as the client got it: JSON text, or the whole SSE text of a stream. */
  body: string;
  /** When it was stored (ms since the epoch), for `s-maxage`. */
  storedAt: number;
  /** The upstream's usage, for the cache-hit log entry. */
  promptTokens: number;
  completionTokens: number;
  /** The answer's `id` (`chatcmpl-…`), for the cache-hit log entry's request_id; absent when it had none. */
  responseId?: string;
  /**
   * The deployment that answered (`x-svc-model-id` on a hit) and its model group (a fallback's,
   * when one answered); absent in entries stored before they were kept.
   */
  deploymentId?: string;
  modelGroup?: string;
}

export interface CacheStore {
  readonly kind: "local" | "redis";
  get(key: string): Promise<CachedResponse | undefined>;
  set(key: string, value: CachedResponse, ttlMs: number): Promise<void>;
}

export class MemoryCache implements CacheStore {
  readonly kind = "local";
  private readonly entries = new Map<string, { value: CachedResponse; expiresAt: number; size: number }>();
  private bytes = 0;

  constructor(
    private readonly maxEntries = 10_000,
    private readonly maxBytes = 128 * 1024 * 1024,
  ) {}

  async get(key: string): Promise<CachedResponse | undefined> {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (e.expiresAt <= Date.now()) {
      this.delete(key);
      return undefined;
    }
    // Most recently used last: eviction takes from the front.
    this.entries.delete(key);
    this.entries.set(key, e);
    return e.value;
  }

  async set(key: string, value: CachedResponse, ttlMs: number): Promise<void> {
    const size = value.body.length * 2 + 64;
    if (size > this.maxBytes) return;
    this.delete(key);
    this.entries.set(key, { value, expiresAt: Date.now() + ttlMs, size });
    this.bytes += size;
    for (const [k] of this.entries) {
      if (this.entries.size <= this.maxEntries && this.bytes <= this.maxBytes) break;
      this.delete(k);
    }
  }

  private delete(key: string): void {
    const e = this.entries.get(key);
    if (!e) return;
    this.entries.delete(key);
    this.bytes -= e.size;
  }
}

const PREFIX = "svc:cache:";
/**
 * Redis refuses an expiry past what its millisecond clock holds (a `ttl` of 1e20 s), which would
 * leave the answer silently uncached: a longer ttl is kept for a century instead.
 */
const REDIS_MAX_TTL_MS = 100 * 365 * 86_400_000;

export class RedisCache implements CacheStore {
  readonly kind = "redis";
  constructor(private readonly redis: Redis) {}

  async get(key: string): Promise<CachedResponse | undefined> {
    const text = await this.redis.get(PREFIX + key);
    return text === null ? undefined : (JSON.parse(text) as CachedResponse);
  }

  async set(key: string, value: CachedResponse, ttlMs: number): Promise<void> {
    await this.redis.set(PREFIX + key, JSON.stringify(value), "PX", Math.min(REDIS_MAX_TTL_MS, Math.max(1, Math.round(ttlMs))));
  }
}
