/** A seeded generator for randomized (differential) suites: a failing data set and request list come back with their seed. */

/**
 * `n` random lowercase letters: text that does not compress, so it really is as long as it looks
 * to an index (a repeated letter would compress to fit).
 */
export function randomLetters(n: number): string {
  return Array.from({ length: n }, () => String.fromCharCode(97 + Math.floor(Math.random() * 26))).join("");
}

/** mulberry32: small and seeded. */
export class Random {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  }
  int(n: number): number {
    return Math.floor(this.next() * n);
  }
  chance(p: number): boolean {
    return this.next() < p;
  }
  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }
  /** With chance `p` one of `items`, else undefined (an optional parameter, sometimes given). */
  maybe<T>(p: number, items: readonly T[]): T | undefined {
    return this.chance(p) ? this.pick(items) : undefined;
  }
  some<T>(items: readonly T[], max: number): T[] {
    const left = [...items];
    return Array.from({ length: 1 + this.int(Math.min(max, left.length)) }, () => left.splice(this.int(left.length), 1)[0]!);
  }
  /** Two days of `days`, in order. */
  range(days: readonly string[]): [string, string] {
    const a = this.pick(days);
    const b = this.pick(days);
    return a <= b ? [a, b] : [b, a];
  }
}

/** A query string of the parameters that are set, each value percent-encoded. */
export function queryString(params: Record<string, string | number | undefined>): string {
  return Object.entries(params)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${encodeURIComponent(String(v))}`)
    .join("&");
}
