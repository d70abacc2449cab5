/** Messages between the gateway and the worker thread that holds the embedded PGlite. */

export type WorkerRequest =
  /** `wasm`: PGlite's module, compiled once per process (see pglite-bridge.ts) */
  | { id: number; op: "open"; dataDir: string; wasm: WebAssembly.Module }
  | { id: number; op: "query"; sql: string; params: unknown[]; rowMode: "array" | "object"; rawTypes: number[]; tx?: number }
  | { id: number; op: "copy"; copy: string; text: string; then: RawStatement }
  | { id: number; op: "begin" }
  | { id: number; op: "end"; tx: number; commit: boolean }
  | { id: number; op: "close" };

/** A failure carries PostgreSQL's SQLSTATE (`code`), by which callers tell a duplicate (23505) from a fault. */
export type WorkerReply = { id: number; ok: true; value: unknown } | { id: number; ok: false; error: string; code?: string };

/** A query result as PGlite returns it (the parts drizzle reads). */
export interface QueryResult {
  rows: unknown[];
  affectedRows?: number;
  fields: { name: string; dataTypeID: number }[];
}

/** A statement with `$n` placeholders and its parameters, run as is. */
export interface RawStatement {
  sql: string;
  params: unknown[];
}
