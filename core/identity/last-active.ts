/** Writes `last_active` of used keys in one batch every few seconds, off the request path. */
import { inArray } from "drizzle-orm";
import type { Logger } from "../contract.ts";
import type { Db } from "../store/db.ts";
import { virtualKeys } from "../store/schema.ts";
import type { IdentityCache } from "./cache.ts";

const INTERVAL_MS = 5000;

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
    const tokens = [...this.cache.touched];
    this.cache.touched.clear();
    const now = new Date();
    try {
      await this.db.update(virtualKeys).set({ lastActive: now }).where(inArray(virtualKeys.token, tokens));
      // The cached rows carry it too, so /key/info agrees without a reload.
      for (const t of tokens) {
        const row = this.cache.keys.get(t);
        if (row) row.lastActive = now;
      }
    } catch (err) {
      for (const t of tokens) this.cache.touched.add(t);
      this.log.warn("last_active write failed; will retry", { error: String(err) });
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.flush();
  }
}
