/**
 * Reuse of per-day parts of spend reports. Finished days rarely change, so each day's JSON is
 * kept and reused while that day's rows are unchanged. A day's stamp is its version in
 * `daily_spend_days`, which a trigger bumps on every write of the day's rows of that entity type:
 * reading 30 stamps costs one index lookup, not a scan of the days' rows (tens of milliseconds
 * over 150,000 rows). Parts that hold names of keys, teams or orgs add `report_names.version`,
 * bumped by triggers when one of those names changes.
 *
 * Parts live in memory, and finished days' parts also in the store (`report_parts`): a gateway
 * that restarts, or another instance on the same database, reads them back (~60 ms for the 37 MB
 * of a 30-day report) instead of rebuilding them from the aggregates (over a second).
 */
import { createHash } from "node:crypto";
import { type SQL, sql } from "drizzle-orm";
import type { Logger } from "../../contract.ts";
import type { Db } from "../../store/db.ts";
import { rowBytes, rows, storeErrorCause } from "../../store/sql.ts";
import { nextTurn } from "../../timer.ts";

/** UTF-8 bytes of a JSON part. */
export type Bytes = Uint8Array<ArrayBuffer>;

interface FragmentCache {
  /** Each part is kept as UTF-8 bytes: answers are assembled from them without building (and collecting) a string of tens of megabytes per request. */
  entries: Map<string, { stamp: string; json: Bytes }>;
  bytes: number;
  /**
   * Parts being read or built: a request that needs one of them waits for it instead of building
   * it a second time (a dashboard opened while the prebuild runs, a client retrying a slow report).
   */
  pending: Map<string, { stamp: string; part: Promise<Bytes> }>;
}
/** One cache per store (tests run several gateways in one process). */
const caches = new WeakMap<Db, FragmentCache>();
/** Room for the largest reports side by side (two 37 MB reports over 10M rows would evict each other at 64 MB). */
const MAX_FRAGMENT_BYTES = 192 * 1024 * 1024;

function cacheOf(db: Db): FragmentCache {
  let c = caches.get(db);
  if (!c) {
    c = { entries: new Map(), bytes: 0, pending: new Map() };
    caches.set(db, c);
  }
  return c;
}

/**
 * What an entry costs: its part, and its key and bookkeeping, so that many small or empty parts
 * (a report asked with ever new filters) are bounded too.
 */
const entrySize = (key: string, json: Bytes) => json.byteLength + 2 * key.length + 96;

function remember(cache: FragmentCache, key: string, stamp: string, json: Bytes): void {
  const fragments = cache.entries;
  const old = fragments.get(key);
  if (old) cache.bytes -= entrySize(key, old.json);
  fragments.delete(key);
  fragments.set(key, { stamp, json });
  cache.bytes += entrySize(key, json);
  // Oldest first out (a Map iterates in insertion order; reuse re-inserts).
  for (const [k, v] of fragments) {
    if (cache.bytes <= MAX_FRAGMENT_BYTES) break;
    fragments.delete(k);
    cache.bytes -= entrySize(k, v.json);
  }
}

const encoder = new TextEncoder();
const EMPTY: Bytes = new Uint8Array(0);
const COMMA = encoder.encode(",");

/** A part's JSON text as the UTF-8 bytes parts are kept in. */
export const partBytes = (json: string): Bytes => encoder.encode(json);

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

/**
 * `part` of each day, with a turn of the event loop between days: building a report of many
 * large days at once (a 37 MB one takes most of a second) would hold every other request, model
 * calls included, until it is done.
 */
export async function partsByDay<R>(days: readonly [string, R][], part: (day: string, rows: R) => string | undefined): Promise<Map<string, Bytes>> {
  const out = new Map<string, Bytes>();
  for (const [i, [day, rows]] of days.entries()) {
    if (i > 0) await nextTurn();
    const text = part(day, rows);
    if (text) out.set(day, partBytes(text));
  }
  return out;
}

/** The days a report covers: a range, or a list. */
export type DaySpan = { start: string; end: string } | readonly string[];

export interface DayParts {
  db: Db;
  log: Logger;
  /** The entity type of the `daily_spend` rows the parts are built from (whose day versions stamp them). */
  entityType: string;
  span: DaySpan;
  /**
   * What a part depends on besides its day, the same in every process: the report, its filters,
   * and the version of its JSON format (stored parts outlive an upgrade that changes it).
   */
  report: string;
  /** The parts hold names of keys, teams or orgs: a renamed one makes them stale. */
  holdsNames: boolean;
  /** JSON parts of the days given, as UTF-8 (a day with no rows under the report's filters may have none). */
  build: (days: string[]) => Promise<Map<string, Bytes>>;
  /**
   * Only make sure the finished days have a current part in the store (the prebuild): build and
   * store the ones that have none, keep nothing in memory (an idle gateway does not hold tens of
   * megabytes for reports nobody asked), answer nothing.
   */
  storeOnly?: boolean;
}

const utcToday = () => new Date().toISOString().slice(0, 10);
const dayList = (days: readonly string[]) => sql.join(days.map((d) => sql`${d}::date`), sql`, `);

/**
 * The JSON part of each day of the span that has one, oldest first: from memory while the day's
 * stamp is unchanged, else from a read or build of it already under way, else from the store's
 * finished-day parts, else built (and finished days stored, after the answer). A day with no part
 * is remembered as having none.
 */
export async function reuseDays(p: DayParts): Promise<Map<string, Bytes>> {
  const { db, span } = p;
  const inSpan = Array.isArray(span)
    ? span.length === 0
      ? sql`false`
      : sql`v.date in (${dayList(span)})`
    : sql`v.date between ${(span as { start: string }).start}::date and ${(span as { end: string }).end}::date`;
  const names: SQL = p.holdsNames ? sql` || ':' || (select n.version from report_names n where n.id = 1)` : sql``;
  const stamps = await rows<{ day: string; stamp: string }>(
    db,
    sql`select v.date::text as day, v.version::text${names} as stamp from daily_spend_days v where v.entity_type = ${p.entityType} and ${inSpan} order by v.date`,
  );
  const cache = cacheOf(db);
  const keyOf = (day: string) => `${p.report}\u0000${day}`;
  if (p.storeOnly) {
    const today = utcToday();
    const finished = stamps.filter((s) => s.day < today && cache.entries.get(keyOf(s.day))?.stamp !== s.stamp && cache.pending.get(keyOf(s.day))?.stamp !== s.stamp);
    await claimed(cache, keyOf, finished, (days) => storeMissing(p, days));
    return new Map();
  }
  const parts = new Map<string, Bytes>();
  const missing: { day: string; stamp: string }[] = [];
  const underWay: { day: string; stamp: string; part: Promise<Bytes> }[] = [];
  for (const s of stamps) {
    const key = keyOf(s.day);
    const hit = cache.entries.get(key);
    const pending = cache.pending.get(key);
    if (hit && hit.stamp === s.stamp) {
      parts.set(s.day, hit.json);
      remember(cache, key, hit.stamp, hit.json);
    } else if (pending && pending.stamp === s.stamp) underWay.push({ ...s, part: pending.part });
    else missing.push(s);
  }
  for (const [day, json] of await claimed(cache, keyOf, missing, (days) => findParts(p, cache, days))) parts.set(day, json);
  for (const u of underWay) {
    const json = await u.part;
    parts.set(u.day, json);
    // The prebuild keeps what it builds in the store only: a request that waited for it keeps it.
    remember(cache, keyOf(u.day), u.stamp, json);
  }
  const ordered = new Map<string, Bytes>();
  for (const s of stamps) {
    const part = parts.get(s.day);
    if (part && part.byteLength > 0) ordered.set(s.day, part);
  }
  return ordered;
}

/**
 * Runs `work` for `days` while announcing their parts as under way (`pending`), so that a request
 * needing one of them waits for it; waiters get what `work` found, or its error.
 */
async function claimed(
  cache: FragmentCache,
  keyOf: (day: string) => string,
  days: { day: string; stamp: string }[],
  work: (days: { day: string; stamp: string }[]) => Promise<Map<string, Bytes>>,
): Promise<Map<string, Bytes>> {
  if (days.length === 0) return new Map();
  const promised = new Map(days.map((d) => [d.day, Promise.withResolvers<Bytes>()]));
  for (const d of days) {
    const { promise } = promised.get(d.day)!;
    // Nobody may be waiting: a failed build must not become an unhandled rejection.
    promise.catch(() => undefined);
    cache.pending.set(keyOf(d.day), { stamp: d.stamp, part: promise });
  }
  try {
    const found = await work(days);
    for (const d of days) promised.get(d.day)!.resolve(found.get(d.day) ?? EMPTY);
    return found;
  } catch (err) {
    for (const w of promised.values()) w.reject(err);
    throw err;
  } finally {
    for (const d of days) if (cache.pending.get(keyOf(d.day))?.part === promised.get(d.day)!.promise) cache.pending.delete(keyOf(d.day));
  }
}

/** Builds and stores the finished `days` that have no current part in the store; day → the parts built. */
async function storeMissing(p: DayParts, days: { day: string; stamp: string }[]): Promise<Map<string, Bytes>> {
  const reportId = createHash("sha256").update(p.report).digest("base64url");
  const stored = await storedDays(p.db, reportId, days);
  const unstored = days.filter((d) => !stored.has(d.day));
  const built = await buildDays(p, unstored);
  const toStore = unstored.flatMap((d) => {
    const body = built.get(d.day);
    return body && body.byteLength > 0 ? [{ ...d, body }] : [];
  });
  await storeParts(p.db, reportId, toStore);
  return built;
}

/**
 * The parts of `missing` days: finished days from the store's parts, the others built (and the
 * finished ones built stored, after the answer); each is remembered. Day → JSON (empty: none).
 */
async function findParts(p: DayParts, cache: FragmentCache, missing: { day: string; stamp: string }[]): Promise<Map<string, Bytes>> {
  const { db } = p;
  const reportId = createHash("sha256").update(p.report).digest("base64url");
  const today = utcToday();
  const finished = missing.filter((m) => m.day < today);
  // Days not finished yet are never stored: they are built while the finished ones are read.
  const [builtOpen, stored] = await Promise.all([buildDays(p, missing.filter((m) => m.day >= today)), readParts(db, reportId, finished)]);
  const unstored = finished.filter((m) => !stored.has(m.day));
  const builtFinished = await buildDays(p, unstored);
  const found = new Map<string, Bytes>();
  for (const m of missing) {
    const json = stored.get(m.day) ?? builtOpen.get(m.day) ?? builtFinished.get(m.day) ?? EMPTY;
    found.set(m.day, json);
    remember(cache, `${p.report}\u0000${m.day}`, m.stamp, json);
  }
  // Not awaited: the answer does not wait for a cache write, and a failed one costs a rebuild.
  // Days without a part are not stored: finding no rows again is cheap, and a report asked with
  // ever new filters that match nothing then leaves nothing behind.
  const toStore = unstored.flatMap((m) => {
    const body = builtFinished.get(m.day);
    return body && body.byteLength > 0 ? [{ ...m, body }] : [];
  });
  if (toStore.length > 0) void storeParts(db, reportId, toStore).catch((err) => p.log.warn("report parts not stored", storeErrorCause(err)));
  return found;
}

async function buildDays(p: DayParts, days: { day: string }[]): Promise<Map<string, Bytes>> {
  return days.length === 0 ? new Map() : p.build(days.map((d) => d.day));
}

const decoder = new TextDecoder();

/** The stored parts (`p`) of `days` whose stamp is still the day's. */
const currentIn = (days: { day: string; stamp: string }[]): SQL =>
  sql`(p.day, p.stamp) in (${sql.join(
    days.map((d) => sql`(${d.day}::date, ${d.stamp})`),
    sql`, `,
  )})`;

/** The stored parts of `days` whose stamp is still the day's: day → JSON as UTF-8 bytes. */
async function readParts(db: Db, report: string, days: { day: string; stamp: string }[]): Promise<Map<string, Bytes>> {
  if (days.length === 0) return new Map();
  const stored = await rowBytes(
    db,
    sql`select p.day::text as day, p.body from report_parts p where p.report = ${report} and ${currentIn(days)}`,
  );
  return new Map(stored.map(([day, body]) => [decoder.decode(day!), body!]));
}

/** Which of `days` have a stored part whose stamp is still the day's (their bodies not read). */
async function storedDays(db: Db, report: string, days: { day: string; stamp: string }[]): Promise<Set<string>> {
  if (days.length === 0) return new Set();
  const found = await rows<{ day: string }>(
    db,
    sql`select p.day::text as day from report_parts p where p.report = ${report} and ${currentIn(days)}`,
  );
  return new Set(found.map((r) => r.day));
}

/** One statement per day: a megabyte-sized message at a time (one message of them all cost twice the CPU to encode) and no long pause of the event loop. */
async function storeParts(db: Db, report: string, parts: { day: string; stamp: string; body: Bytes }[]): Promise<void> {
  for (const x of parts) {
    await db.execute(
      sql`insert into report_parts (report, day, stamp, body) values (${report}, ${x.day}::date, ${x.stamp}, ${decoder.decode(x.body)})
        on conflict (report, day) do update set stamp = excluded.stamp, body = excluded.body, stored_at = now()`,
    );
  }
}
