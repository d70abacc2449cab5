/** Writes `last_active` of used keys in batches every few seconds (at most once a minute per key), off the request path. */
import { inArray } from "drizzle-orm";
import type { Logger } from "../contract.ts";
import type { Db } from "../store/db.ts";
import { virtualKeys } from "../store/schema.ts";
import type { IdentityCache } from "./cache.ts";
import { storeErrorCause } from "../store/sql.ts";
import { nextTurn } from "../timer.ts";

const INTERVAL_MS = 5000;
/**
 * `last_active` is a coarse "last used": a key written less than this long ago is not rewritten.
 * With thousands of busy keys, rewriting every key every 5 s would cost the embedded store
 * hundreds of milliseconds per flush, on the request thread.
 */
const RESOLUTION_MS = 60_000;
/** Rows per UPDATE; the flush yields between chunks so requests are never held for long. */
const CHUNK = 250;

export class LastActiveWriter {
  private timer: ReturnType<typeof setInterval> | undefined;

  constructor(
    private readonly db: Db,
    private readonly cache: IdentityCache,
    private readonly log: Logger,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.flush(), INTERVAL_MS);
    this.timer.unref?.();
  }

  async flush(): Promise<void> {
    if (this.cache.touched.size === 0) return;
    const now = new Date();
    const tokens: string[] = [];
    for (const t of this.cache.touched) {
      const last = this.cache.keys.get(t)?.lastActive;
      if (!last || now.getTime() - last.getTime() >= RESOLUTION_MS) tokens.push(t);
    }
    this.cache.touched.clear();
    for (let i = 0; i < tokens.length; i += CHUNK) {
      const chunk = tokens.slice(i, i + CHUNK);
      try {
        // Rows locked in token order, as the spend writer locks the keys it charges (spend/flush.ts
        // LOCK_ORDER): in the order the scan met them, this write and a spend batch each held a key
        // the other waited for, and PostgreSQL failed one after a second.
        const inOrder = this.db.select({ token: virtualKeys.token }).from(virtualKeys).where(inArray(virtualKeys.token, chunk)).orderBy(virtualKeys.token).for("no key update");
        await this.db.update(virtualKeys).set({ lastActive: now }).where(inArray(virtualKeys.token, inOrder));
        // The cached rows carry it too, so /key/info agrees without a reload.
        for (const t of chunk) {
          const row = this.cache.keys.get(t);
          if (row) row.lastActive = now;
        }
      } catch (err) {
        for (const t of tokens.slice(i)) this.cache.touched.add(t);
        this.log.warn("last_active write failed; will retry", storeErrorCause(err));
        return;
      }
      if (i + CHUNK < tokens.length) await nextTurn();
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.flush();
  }
}
