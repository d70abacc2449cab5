/**
 * Reuse of per-day parts of spend reports. Finished days do not change, so each day's JSON is
 * kept and reused while that day's rows are unchanged. A day's stamp is its row count and request
 * total: every write of spend adds at least one request to some row of its day, so any write
 * changes the stamp (and the part is built again).
 */
import { type SQL, sql } from "drizzle-orm";
import type { IdentityView } from "../../contract.ts";
import type { Db } from "../../store/db.ts";
import { rows } from "../../store/sql.ts";

interface FragmentCache {
  entries: Map<string, { stamp: string; json: string }>;
  bytes: number;
}
/** One cache per store (tests run several gateways in one process). */
const caches = new WeakMap<Db, FragmentCache>();
const MAX_FRAGMENT_BYTES = 64 * 1024 * 1024;

function cacheOf(db: Db): FragmentCache {
  let c = caches.get(db);
  if (!c) {
    c = { entries: new Map(), bytes: 0 };
    caches.set(db, c);
  }
  return c;
}

function remember(cache: FragmentCache, key: string, stamp: string, json: string): void {
  const fragments = cache.entries;
  const old = fragments.get(key);
  if (old) cache.bytes -= old.json.length;
  fragments.delete(key);
  fragments.set(key, { stamp, json });
  cache.bytes += json.length;
  // Oldest first out (a Map iterates in insertion order; reuse re-inserts).
  for (const [k, v] of fragments) {
    if (cache.bytes <= MAX_FRAGMENT_BYTES) break;
    fragments.delete(k);
    cache.bytes -= v.json.length;
  }
}

/**
 * The JSON part of each day that has rows under `where` (oldest first): reused when its stamp is
 * unchanged, else made by `build` (given the days to make).
 */
export async function reuseDays(db: Db, where: SQL, cacheKey: string, build: (days: string[]) => Promise<Map<string, string>>): Promise<Map<string, string>> {
  const stamps = await rows<{ day: string; n: string | number; r: string | number }>(
    db,
    sql`select d.date::text as day, count(*) as n, sum(d.api_requests) as r from daily_spend d where ${where} group by d.date order by d.date`,
  );
  const cache = cacheOf(db);
  const parts = new Map<string, string>();
  const missing: string[] = [];
  for (const s of stamps) {
    const hit = cache.entries.get(`${cacheKey}\u0000${s.day}`);
    if (hit && hit.stamp === `${s.n}/${s.r}`) {
      parts.set(s.day, hit.json);
      remember(cache, `${cacheKey}\u0000${s.day}`, hit.stamp, hit.json);
    } else missing.push(s.day);
  }
  if (missing.length > 0) {
    const built = await build(missing);
    const stampOf = new Map(stamps.map((s) => [s.day, `${s.n}/${s.r}`]));
    for (const [day, json] of built) {
      parts.set(day, json);
      remember(cache, `${cacheKey}\u0000${day}`, stampOf.get(day) ?? "", json);
    }
  }
  const ordered = new Map<string, string>();
  for (const s of stamps) {
    const part = parts.get(s.day);
    if (part !== undefined) ordered.set(s.day, part);
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
