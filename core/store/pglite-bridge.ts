/**
 * The gateway side of the PGlite worker: the two methods drizzle's PGlite driver calls
 * (`query` and `transaction`), forwarded to the worker thread. Transactions hold PGlite's own
 * lock in the worker, so statements outside them wait their turn there, as they would in-process.
 */
// Embedded in a compiled binary as a file, as the worker's other assets are (see pglite-worker.ts).
import pgliteWasm from "@electric-sql/pglite/pglite.wasm" with { type: "file" };
import type { QueryResult, RawStatement, WorkerReply, WorkerRequest } from "./pglite-protocol.ts";

/** First boot (initdb) takes a few seconds; far longer means the worker is not running. */
const OPEN_TIMEOUT_MS = 120_000;

/**
 * PGlite's WebAssembly module (9 MB), compiled once per process and handed to each worker: a
 * first boot opens two workers, and a process that opens many stores (the tests) paid ~0.3 s of
 * compiling for each.
 */
let compiledWasm: Promise<WebAssembly.Module> | undefined;
function pgliteModule(): Promise<WebAssembly.Module> {
  compiledWasm ??= Bun.file(pgliteWasm)
    .arrayBuffer()
    .then((bytes) => WebAssembly.compile(bytes));
  return compiledWasm;
}

type Pending = { resolve(value: unknown): void; reject(err: Error): void };
type Payload = WorkerRequest extends infer R ? (R extends WorkerRequest ? Omit<R, "id"> : never) : never;

interface QueryConfig {
  rowMode?: "array" | "object";
  parsers?: Record<string, unknown>;
}

/**
 * Where the worker module is. In the single binary, modules live under `/$bunfs/root/` relative to
 * the build's common entrypoint folder (`core/`, see scripts/build.ts); from source, beside this file.
 */
function workerSpecifier(): string {
  return import.meta.url.startsWith("file:///$bunfs/") ? "./store/pglite-worker.ts" : new URL("./pglite-worker.ts", import.meta.url).href;
}

export class PgliteBridge {
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  /** Why the worker can no longer answer (it failed or was closed); undefined while it runs. */
  private failure: string | undefined;

  constructor() {
    this.worker = new Worker(workerSpecifier());
    this.worker.onmessage = (e: MessageEvent<WorkerReply>) => {
      const p = this.pending.get(e.data.id);
      if (!p) return;
      this.pending.delete(e.data.id);
      if (e.data.ok) p.resolve(e.data.value);
      else p.reject(Object.assign(new Error(e.data.error), e.data.code ? { code: e.data.code } : {}));
    };
    this.worker.onerror = (e) => this.fail(`PGlite worker failed: ${e.message}`);
    // A thread that ends without an error event (killed, out of memory) would leave every caller waiting forever.
    this.worker.addEventListener("close", () => this.fail("the PGlite worker thread ended"));
  }

  /** Fails what waits for an answer; later calls fail at once with the first reason. */
  private fail(reason: string): void {
    this.failure ??= reason;
    for (const p of this.pending.values()) p.reject(new Error(this.failure));
    this.pending.clear();
  }

  private call<T>(payload: Payload): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      if (this.failure) {
        reject(new Error(this.failure));
        return;
      }
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.worker.postMessage({ ...payload, id });
    });
  }

  /** Opens PGlite in the worker; a worker that never answers (failed to load) fails the start. */
  async open(dataDir: string): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`the PGlite worker did not open ${dataDir} within ${OPEN_TIMEOUT_MS / 1000} s`)), OPEN_TIMEOUT_MS);
    });
    try {
      await Promise.race([pgliteModule().then((wasm) => this.call({ op: "open", dataDir, wasm })), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  query(sql: string, params: unknown[] = [], config: QueryConfig = {}, tx?: number): Promise<QueryResult> {
    // drizzle's parsers all return the text value unchanged; the worker rebuilds them by type.
    const rawTypes = Object.keys(config.parsers ?? {}).map(Number);
    return this.call({ op: "query", sql, params, rowMode: config.rowMode ?? "object", rawTypes, tx });
  }

  /** `copy` (a `COPY … FROM '/dev/blob'` statement) reads `text`; then `then` runs; one transaction. */
  copyThen(copy: string, text: string, then: RawStatement): Promise<void> {
    return this.call({ op: "copy", copy, text, then });
  }

  async transaction<T>(fn: (tx: { query: PgliteBridge["query"] }) => Promise<T>): Promise<T> {
    const tx = await this.call<number>({ op: "begin" });
    let result: T;
    try {
      result = await fn({ query: (sql, params, config) => this.query(sql, params, config, tx) });
    } catch (err) {
      await this.call({ op: "end", tx, commit: false }).catch(() => undefined);
      throw err;
    }
    await this.call({ op: "end", tx, commit: true });
    return result;
  }

  /** Why the worker cannot answer, or undefined while it runs. */
  get failed(): string | undefined {
    return this.failure;
  }

  async close(): Promise<void> {
    // Failed or closed already: a dead thread would never answer the close.
    if (this.failure) {
      this.worker.terminate();
      return;
    }
    // Posted before the store counts as closed; every later statement fails at once.
    const closing = this.call({ op: "close" });
    this.failure = "the embedded store is closed";
    try {
      await closing;
    } finally {
      this.worker.terminate();
    }
  }
}
