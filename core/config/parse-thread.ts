/**
 * config.yaml read on a thread of its own (parse-worker.ts). Parsing and checking a large file is
 * seconds of CPU (2,000 models, 290 KB: about 1 s of the `yaml` parser alone on a busy 2-CPU
 * machine, 28 s for 20,000), and on the serving thread that stalled every call, stream and timer of
 * the gateway for as long. One worker, started at the first read and kept (a new one takes longer
 * to load than a small file to parse), holds the process open only while it has a file to read.
 */
import type { ConfigResult } from "./load.ts";

export interface ParseRequest {
  id: number;
  text: string;
  /** The variables the serving config set (ConfigEnv), as entries. */
  configSet: [string, string][];
  /** The serving thread's environment: a worker's own is a copy made when it started. */
  env: Record<string, string>;
}
export type ParseReply = { id: number; result: ConfigResult } | { id: number; error: string };

/**
 * Where the worker module is. In the single binary, modules live under `/$bunfs/root/` relative to
 * the build's common entrypoint folder (`core/`, see scripts/build.ts); from source, beside this file.
 */
function workerSpecifier(): string {
  return import.meta.url.startsWith("file:///$bunfs/") ? "./config/parse-worker.ts" : new URL("./parse-worker.ts", import.meta.url).href;
}

type Pending = { resolve(result: ConfigResult): void; reject(err: Error): void };
/** Bun's Worker, which the DOM lib types without ref and unref. */
type BunWorker = Worker & Pick<Bun.Worker, "ref" | "unref">;
type Reader = (text: string, configSet: ReadonlyMap<string, string>) => Promise<ConfigResult>;

function environment(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined) env[k] = v;
  return env;
}

/** The running reader; a failed one is replaced at the next read. */
let reader: Reader | undefined;

function startReader(): Reader {
  const worker = new Worker(workerSpecifier()) as BunWorker;
  const pending = new Map<number, Pending>();
  let nextId = 1;
  const read: Reader = (text, configSet) => {
    const id = nextId++;
    return new Promise<ConfigResult>((resolve, reject) => {
      pending.set(id, { resolve, reject });
      worker.ref();
      worker.postMessage({ id, text, configSet: [...configSet], env: environment() } satisfies ParseRequest);
    });
  };
  worker.onmessage = (e: MessageEvent<ParseReply>) => {
    const reply = e.data;
    const p = pending.get(reply.id);
    pending.delete(reply.id);
    if (pending.size === 0) worker.unref();
    if ("error" in reply) p?.reject(new Error(reply.error));
    else p?.resolve(reply.result);
  };
  const fail = (reason: string) => {
    if (reader === read) reader = undefined;
    for (const p of pending.values()) p.reject(new Error(reason));
    pending.clear();
  };
  worker.onerror = (e) => fail(`the config reader thread failed: ${e.message}`);
  // A thread that ends without an error event (out of memory) would leave the read waiting for ever.
  worker.addEventListener("close", () => fail("the config reader thread ended"));
  return read;
}

/** parseConfig(text, configSet), run on the reader thread against this thread's environment. */
export function parseOffThread(text: string, configSet: ReadonlyMap<string, string>): Promise<ConfigResult> {
  reader ??= startReader();
  return reader(text, configSet);
}
