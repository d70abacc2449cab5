/**
 * Redis commands kept for when Redis answers again: those whose answer never came, written to act
 * once however often they run (a budget reservation voided or settled, a rate-limit request
 * cancelled or settled). The budget ledger and the rate-limit windows keep one each.
 */

/** Kept at most (an outage of hours under load drops the oldest; the store has every call, and windows forget within their ttl). */
const MAX_KEPT = 100_000;

export class AfterOutage<T> {
  private kept: T[] = [];

  get empty(): boolean {
    return this.kept.length === 0;
  }

  add(item: T): void {
    this.kept.push(item);
    if (this.kept.length > MAX_KEPT) this.kept.shift();
  }

  /** Sends what is kept, in order; from the first that fails, they are kept for the next time, and its error returned. */
  async replay(send: (item: T) => Promise<unknown>): Promise<unknown> {
    const items = this.kept;
    this.kept = [];
    for (const [i, item] of items.entries()) {
      try {
        await send(item);
      } catch (err) {
        this.kept.unshift(...items.slice(i));
        return err;
      }
    }
    return undefined;
  }
}
