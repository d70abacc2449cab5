/**
 * Reuse of per-day parts of spend reports. Finished days rarely change, so each day's JSON is
 * kept and reused while that day's rows are unchanged. A day's stamp is its version in
 * `daily_spend_days`, which a trigger bumps on every write of the day's rows of that entity type:
 * reading 30 stamps costs one index lookup, not a scan of the days' rows (tens of milliseconds
 * over 150,000 rows).
 */
import { sql } from "drizzle-orm";
import type { IdentityView } from "../../contract.ts";
import type { Db } from "../../store/db.ts";
import { rows } from "../../store/sql.ts";

/** UTF-8 bytes of a JSON part. */
type Bytes = Uint8Array<ArrayBuffer>;

interface FragmentCache {
  /** Each part is kept as UTF-8 bytes: answers are assembled from them without building (and collecting) a string of tens of megabytes per request. */
  entries: Map<string, { stamp: string; json: Bytes }>;
  bytes: number;
}
/** One cache per store (tests run several gateways in one process). */
const caches = new WeakMap<Db, FragmentCache>();
/** Room for the largest reports side by side (two 37 MB reports over 10M rows would evict each other at 64 MB). */
const MAX_FRAGMENT_BYTES = 192 * 1024 * 1024;

function cacheOf(db: Db): FragmentCache {
  let c = caches.get(db);
  if (!c) {
    c = { entries: new Map(), bytes: 0 };
    caches.set(db, c);
  }
  return c;
}

function remember(cache: FragmentCache, key: string, stamp: string, json: Bytes): void {
  const fragments = cache.entries;
  const old = fragments.get(key);
  if (old) cache.bytes -= old.json.byteLength;
  fragments.delete(key);
  fragments.set(key, { stamp, json });
  cache.bytes += json.byteLength;
  // Oldest first out (a Map iterates in insertion order; reuse re-inserts).
  for (const [k, v] of fragments) {
    if (cache.bytes <= MAX_FRAGMENT_BYTES) break;
    fragments.delete(k);
    cache.bytes -= v.json.byteLength;
  }
}

const encoder = new TextEncoder();
const EMPTY: Bytes = new Uint8Array(0);
const COMMA = encoder.encode(",");

/** A JSON answer `head` + the parts joined by commas + `tail`, as a Blob of the cached bytes (no copy into one string). */
export function joinedParts(head: string, parts: Iterable<Bytes>, tail: string): Blob {
  const pieces: BlobPart[] = [head];
  let first = true;
  for (const p of parts) {
    if (!first) pieces.push(COMMA);
    pieces.push(p);
    first = false;
  }
  pieces.push(tail);
  return new Blob(pieces, { type: "application/json" });
}

/** The days a report covers: a range, or a list. */
export type DaySpan = { start: string; end: string } | readonly string[];

/**
 * The JSON part of each day of `entityType` in `span` that `build` makes one for (oldest first):
 * reused while the day's version is unchanged, else made by `build` (given the days to make). A day
 * `build` makes no part for (no rows under the report's filters) is remembered as having none.
 */
export async function reuseDays(
  db: Db,
  entityType: string,
  span: DaySpan,
  cacheKey: string,
  build: (days: string[]) => Promise<Map<string, string>>,
): Promise<Map<string, Bytes>> {
  const inSpan = Array.isArray(span)
    ? span.length === 0
      ? sql`false`
      : sql`v.date in (${sql.join(span.map((d) => sql`${d}::date`), sql`, `)})`
    : sql`v.date between ${(span as { start: string }).start}::date and ${(span as { end: string }).end}::date`;
  const stamps = await rows<{ day: string; version: string | number }>(
    db,
    sql`select v.date::text as day, v.version from daily_spend_days v where v.entity_type = ${entityType} and ${inSpan} order by v.date`,
  );
  const cache = cacheOf(db);
  const parts = new Map<string, Bytes>();
  const missing: string[] = [];
  for (const s of stamps) {
    const key = `${cacheKey}\u0000${s.day}`;
    const hit = cache.entries.get(key);
    if (hit && hit.stamp === String(s.version)) {
      parts.set(s.day, hit.json);
      remember(cache, key, hit.stamp, hit.json);
    } else missing.push(s.day);
  }
  if (missing.length > 0) {
    const built = await build(missing);
    const stampOf = new Map(stamps.map((s) => [s.day, String(s.version)]));
    for (const day of missing) {
      const text = built.get(day);
      const json = text ? encoder.encode(text) : EMPTY;
      parts.set(day, json);
      remember(cache, `${cacheKey}\u0000${day}`, stampOf.get(day) ?? "", json);
    }
  }
  const ordered = new Map<string, Bytes>();
  for (const s of stamps) {
    const part = parts.get(s.day);
    if (part && part.byteLength > 0) ordered.set(s.day, part);
  }
  return ordered;
}

const generations = new WeakMap<IdentityView, { n: number }>();

/** A number that changes whenever keys, teams or orgs change (their names are inside cached parts). */
export function identityGeneration(identity: IdentityView): number {
  let g = generations.get(identity);
  if (!g) {
    const counter = { n: 0 };
    identity.onChange(() => {
      counter.n++;
    });
    generations.set(identity, counter);
    g = counter;
  }
  return g.n;
}
