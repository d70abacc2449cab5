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
