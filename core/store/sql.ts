import type { SQL } from "drizzle-orm";
import { PgDialect } from "drizzle-orm/pg-core";
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

const dialect = new PgDialect();

/** The two clients a Db wraps, as far as reading rows as arrays goes. */
type ArrayClient =
  | { unsafe(text: string, params: unknown[]): { values(): Promise<unknown[][]>; raw(): Promise<(Uint8Array | null)[][]> } }
  | { query(text: string, params: unknown[], config: { rowMode: "array" }): Promise<{ rows: unknown[][] }> };

/** The statement's text and parameters, and the client under `db` to run it on. */
function prepared(db: Db, query: SQL): { text: string; params: unknown[]; client: ArrayClient } {
  const { sql: text, params } = dialect.sqlToQuery(query);
  return { text, params, client: (db as unknown as { $client: ArrayClient }).$client };
}

/**
 * Runs raw SQL and returns its rows as arrays of column values, in the select's order: no object
 * per row, for reads of hundreds of thousands of rows (a 30-day report's aggregates).
 */
export async function rowValues(db: Db, query: SQL): Promise<unknown[][]> {
  const { text, params, client } = prepared(db, query);
  if ("unsafe" in client) return client.unsafe(text, params).values();
  return (await client.query(text, params, { rowMode: "array" })).rows;
}

const utf8 = new TextEncoder();

/**
 * Runs raw SQL and returns each column as the UTF-8 bytes of its text (null stays null): megabytes
 * of stored JSON reach the answer without being decoded into strings and encoded back (PostgreSQL
 * hands them over as they are; the embedded store's strings are encoded once).
 */
export async function rowBytes(db: Db, query: SQL): Promise<(Uint8Array<ArrayBuffer> | null)[][]> {
  const { text, params, client } = prepared(db, query);
  if (!("unsafe" in client)) {
    const { rows: found } = await client.query(text, params, { rowMode: "array" });
    return found.map((row) => row.map((v) => (v === null ? null : utf8.encode(String(v)))));
  }
  const found = (await client.unsafe(text, params).raw()) as (Uint8Array<ArrayBuffer> | null)[][];
  // A value is a view into the buffer it arrived in (a whole socket read for small rows): kept as
  // it is, a small value would keep that whole buffer alive.
  return found.map((row) => row.map((v) => (v && v.buffer.byteLength > 2 * v.byteLength ? new Uint8Array(v) : v)));
}

/**
 * The error in a store error's chain (drizzle wraps the driver's error as `cause`) whose SQLSTATE
 * (`code`) `matches`, on either backend; undefined when none does.
 */
export function withSqlState(err: unknown, matches: (code: string) => boolean): object | undefined {
  for (let e: unknown = err; e && typeof e === "object"; e = (e as { cause?: unknown }).cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && matches(code)) return e;
  }
  return undefined;
}

/** The driver's and the socket's codes for a connection that went away, besides SQLSTATE class 08. */
const CONNECTION_LOST = new Set(["CONNECTION_CLOSED", "CONNECTION_DESTROYED", "CONNECTION_ENDED", "CONNECT_TIMEOUT", "ECONNRESET", "ECONNREFUSED", "EPIPE", "57P01", "57P02", "57P03"]);

/**
 * Whether a store error (or one it wraps) is the connection going away under the statement (a
 * restart, a failover, the backend terminated), not the statement failing: whether it was
 * applied is not known, and trying again is the caller's to decide.
 */
export function isConnectionLost(err: unknown): boolean {
  // 08P01 (protocol violation) is a message the server refused, the connection kept: a statement
  // of 65,536 parameters or more, whose count the protocol's 16 bits wrapped, is the embedded store's.
  return withSqlState(err, (code) => CONNECTION_LOST.has(code) || (code.startsWith("08") && code !== "08P01")) !== undefined;
}

/** Whether a store error (or one it wraps) is a unique-key violation (SQLSTATE 23505), on either backend. */
export function isUniqueViolation(err: unknown): boolean {
  return withSqlState(err, (code) => code === "23505") !== undefined;
}

/** Longest message `storeErrorCause` hands a log line. */
const CAUSE_MAX_CHARS = 300;

/**
 * What went wrong under a store error, for a log line: the innermost error's message (the
 * driver's or the socket's) and the innermost code in the chain (SQLSTATE, or the socket's:
 * ECONNREFUSED, ENOSPC), the message bounded. Never drizzle's own message, which holds the
 * statement and every parameter (for a spend batch, hundreds of KB of key hashes, end users and
 * metadata) and not the cause.
 */
export function storeErrorCause(err: unknown): { error: string; code?: string } {
  let inner: unknown = err;
  let code: string | undefined;
  // Bounded: a chain that loops back on itself must not hold the caller.
  for (let e: unknown = err, depth = 0; e && typeof e === "object" && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    inner = e;
    const c = (e as { code?: unknown }).code;
    if (typeof c === "string" || typeof c === "number") code = String(c);
  }
  const statement = inner && typeof inner === "object" && "params" in inner && "query" in inner;
  const message = statement ? "the query failed" : inner instanceof Error ? inner.message : String(inner);
  const error = message.length > CAUSE_MAX_CHARS ? `${message.slice(0, CAUSE_MAX_CHARS)}…` : message;
  return code === undefined ? { error } : { error, code };
}
