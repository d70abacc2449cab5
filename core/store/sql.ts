import type { SQL } from "drizzle-orm";
import type { Db } from "./db.ts";

/**
 * Runs raw SQL and returns its rows on either backend: drizzle's `execute` hands back PGlite's
 * `{ rows }` object but postgres.js's bare array. The row type is the caller's promise.
 */
export async function rows<T = Record<string, unknown>>(db: Db, query: SQL): Promise<T[]> {
  const result: unknown = await db.execute(query);
  if (Array.isArray(result)) return result as T[];
  if (typeof result === "object" && result !== null && "rows" in result && Array.isArray(result.rows)) {
    return result.rows as T[];
  }
  throw new Error("store: unexpected raw query result shape");
}

/** Whether a store error (or one it wraps) is a unique-key violation (SQLSTATE 23505), on either backend. */
export function isUniqueViolation(err: unknown): boolean {
  for (let e: unknown = err; e && typeof e === "object"; e = (e as { cause?: unknown }).cause) {
    if ((e as { code?: unknown }).code === "23505") return true;
  }
  return false;
}
