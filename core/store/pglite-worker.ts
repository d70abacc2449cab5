/**
 * The embedded PGlite, on its own thread. PGlite's WebAssembly instance (about a gigabyte of memory
 * and tens of thousands of wasm functions) would otherwise sit in the gateway's JavaScript heap,
 * where the garbage collector pays for it on every request; here it has a heap of its own.
 * Listed as a second entrypoint of the single-binary build (scripts/build.ts).
 */
import { PGlite, type Transaction } from "@electric-sql/pglite";
import initdbWasm from "@electric-sql/pglite/initdb.wasm" with { type: "file" };
// PGlite locates these through `new URL(..., import.meta.url)`, which the bundler does not
// follow, so a compiled binary would miss them. Imported as files they get embedded.
import pgliteData from "@electric-sql/pglite/pglite.data" with { type: "file" };
import type { QueryResult, WorkerReply, WorkerRequest } from "./pglite-protocol.ts";

declare const self: Worker;

let pg: PGlite | undefined;
let nextTx = 1;
interface OpenTransaction {
  tx: Transaction;
  end(commit: boolean): void;
  done: Promise<unknown>;
}
/** Open transactions: the callback PGlite runs them in waits until the gateway ends them. */
const open = new Map<number, OpenTransaction>();

const identity = (value: string) => value;

async function handle(m: WorkerRequest): Promise<unknown> {
  switch (m.op) {
    case "open": {
      pg = await PGlite.create(m.dataDir, {
        pgliteWasmModule: m.wasm,
        initdbWasmModule: await WebAssembly.compile(await Bun.file(initdbWasm).arrayBuffer()),
        fsBundle: Bun.file(pgliteData),
      });
      return null;
    }
    case "query": {
      const target = m.tx === undefined ? pg! : open.get(m.tx)?.tx;
      if (!target) throw new Error(`transaction ${m.tx} is not open`);
      const parsers = Object.fromEntries(m.rawTypes.map((t) => [t, identity]));
      const r = await target.query(m.sql, m.params, { rowMode: m.rowMode, parsers });
      const result: QueryResult = { rows: r.rows, affectedRows: r.affectedRows, fields: r.fields };
      return result;
    }
    case "copy": {
      // COPY parses rows straight into the table: no per-row JSON or expression work.
      await pg!.transaction(async (tx) => {
        await tx.query(m.copy, [], { blob: new Blob([m.text]) });
        await tx.query(m.then.sql, m.then.params);
      });
      return null;
    }
    case "begin": {
      const id = nextTx++;
      const started = Promise.withResolvers<OpenTransaction>();
      const done = pg!.transaction(
        (tx) =>
          new Promise<void>((resolve, reject) => {
            started.resolve({ tx, end: (commit) => (commit ? resolve() : reject(new Error("rolled back"))), done: Promise.resolve() });
          }),
      );
      done.catch(() => undefined);
      const entry = await Promise.race([started.promise, done.then(() => Promise.reject(new Error("transaction did not start")))]);
      entry.done = done;
      open.set(id, entry);
      return id;
    }
    case "end": {
      const t = open.get(m.tx);
      if (!t) throw new Error(`transaction ${m.tx} is not open`);
      open.delete(m.tx);
      t.end(m.commit);
      try {
        await t.done;
      } catch (err) {
        if (m.commit) throw err;
      }
      return null;
    }
    case "close": {
      await pg?.close();
      pg = undefined;
      return null;
    }
  }
}

self.onmessage = async (event: MessageEvent<WorkerRequest>) => {
  const m = event.data;
  let reply: WorkerReply;
  try {
    reply = { id: m.id, ok: true, value: await handle(m) };
  } catch (err) {
    const code = (err as { code?: unknown } | null)?.code;
    reply = { id: m.id, ok: false, error: err instanceof Error ? err.message : String(err), ...(typeof code === "string" ? { code } : {}) };
  }
  self.postMessage(reply);
};
