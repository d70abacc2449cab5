/**
 * Test gateways. `startTestGateway` runs the real app in-process on a random port (fast, most
 * tests); `spawnGateway` runs `core/main.ts` as its own process (signals, store, run interface).
 */
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { stringify } from "yaml";
import type { Logger } from "../../core/contract.ts";
import postgres from "postgres";
import { type Host, type HostOptions, startHost } from "../../core/host.ts";
import { createApp } from "../../core/http/app.ts";
import { serveOptions } from "../../core/http/serving.ts";
import { openStore } from "../../core/store/db.ts";
import { Live } from "../../core/live.ts";
import type { HostServices } from "../../core/services.ts";

export const MASTER_KEY = "sk-test-master-key";
export const ROOT = resolve(import.meta.dir, "../..");

export type ConfigInput = string | Record<string, unknown>;

export function configText(config: ConfigInput): string {
  return typeof config === "string" ? config : stringify(config);
}

export function tempDir(prefix = "gw-test-"): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** Log lines captured for assertions instead of printed. */
export function memoryLogger(): Logger & { lines: { level: string; msg: string; fields?: Record<string, unknown> }[] } {
  const lines: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
  return {
    lines,
    info: (msg, fields) => lines.push({ level: "info", msg, fields }),
    warn: (msg, fields) => lines.push({ level: "warn", msg, fields }),
    error: (msg, fields) => lines.push({ level: "error", msg, fields }),
  };
}

export interface TestGateway {
  url: string;
  /** `${url}/v1`, the base URL for the openai SDK. */
  baseURL: string;
  live: Live;
  /** Present when started with a store. */
  host?: Host;
  dir: string;
  configPath: string;
  log: ReturnType<typeof memoryLogger>;
  /** Rewrites config.yaml (the file watch may pick it up; call `live.reload` to apply at once). */
  writeConfig(config: ConfigInput): void;
  stop(): Promise<void>;
}

export interface TestGatewayOptions {
  watch?: boolean;
  /**
   * Run with a real store (and the identity cache, management API): embedded PGlite in a temp
   * folder, or PostgreSQL at `databaseUrl` (see `freshDatabase`).
   */
  store?: { databaseUrl?: string; databaseAnswerTimeoutMs?: number; redisUrl?: string; spend?: HostOptions["spend"] };
}

let pgliteTemplate: Promise<string> | undefined;

/**
 * What an initialized store folder depends on: the migrations and the PGlite build. A template
 * made by an earlier run (or by another test process of this run) with the same ones is reused.
 */
function templateVersion(): string {
  const hash = new Bun.CryptoHasher("sha256");
  const migrations = join(ROOT, "core/store/migrations");
  for (const name of readdirSync(migrations).sort()) if (name.endsWith(".sql")) hash.update(name).update(readFileSync(join(migrations, name)));
  hash.update(readFileSync(join(ROOT, "node_modules/@electric-sql/pglite/package.json")));
  return hash.digest("hex").slice(0, 16);
}

/**
 * An embedded store's folder, initialized and migrated once: gateways on the embedded store start
 * from a copy of it (tens of milliseconds) instead of running initdb (seconds of CPU each). It is
 * kept in `.test-tmp/` under its version, so test processes running side by side (`--parallel`)
 * and later runs share it; it is built in a folder of its own and renamed into place, so no process
 * copies a half-made one. A store's first boot is still tested where it matters (test/store.test.ts
 * opens fresh folders).
 */
export function initializedPgFolder(): Promise<string> {
  pgliteTemplate ??= (async () => {
    const final = join(ROOT, ".test-tmp", `pglite-template-${templateVersion()}`);
    if (!existsSync(join(final, "pg", "PG_VERSION"))) {
      mkdirSync(join(ROOT, ".test-tmp"), { recursive: true });
      // Templates of earlier migrations (~40 MB each) are no use any more.
      for (const name of readdirSync(join(ROOT, ".test-tmp")))
        if (/^pglite-template-[0-9a-f]{16}$/.test(name) && !final.endsWith(name)) rmSync(join(ROOT, ".test-tmp", name), { recursive: true, force: true });
      const building = mkdtempSync(`${final}.building-`);
      try {
        const store = await openStore({ dataDir: building });
        await store.close();
        renameSync(building, final);
      } catch (err) {
        // Another process put its template in place first: use that one.
        if (!existsSync(join(final, "pg", "PG_VERSION"))) throw err;
      } finally {
        rmSync(building, { recursive: true, force: true });
      }
    }
    return join(final, "pg");
  })();
  return pgliteTemplate;
}

export async function startTestGateway(config: ConfigInput, opts: TestGatewayOptions = {}): Promise<TestGateway> {
  const dir = tempDir();
  const configPath = join(dir, "config.yaml");
  writeFileSync(configPath, configText(config));
  const log = memoryLogger();
  let host: Host | undefined;
  let live: Live;
  let services: HostServices = {};
  if (opts.store) {
    if (!opts.store.databaseUrl) cpSync(await initializedPgFolder(), join(dir, "data", "pg"), { recursive: true });
    host = await startHost({ configPath, dataDir: join(dir, "data"), databaseUrl: opts.store.databaseUrl, databaseAnswerTimeoutMs: opts.store.databaseAnswerTimeoutMs, redisUrl: opts.store.redisUrl, log, spend: opts.store.spend });
    live = host.live;
    services = host.services;
  } else {
    live = await Live.start(configPath, log);
  }
  const store = host?.store;
  const app = createApp({
    live,
    log,
    services,
    probes: {
      store: async () => (store ? store.ping() : { ok: true, detail: "in-process test" }),
      redis: async () => host?.redis?.ping(),
      version: "test",
    },
  });
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", ...serveOptions(app), idleTimeout: 60 });
  if (opts.watch) live.watch();
  const url = `http://127.0.0.1:${server.port}`;
  return {
    url,
    baseURL: `${url}/v1`,
    live,
    host,
    dir,
    configPath,
    log,
    writeConfig: (c) => writeFileSync(configPath, configText(c)),
    async stop() {
      await server.stop(true);
      if (host) await host.close();
      else await live.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A new, empty PostgreSQL database on the local server; `drop()` removes it. */
export async function freshDatabase(prefix = "gw_test"): Promise<{ url: string; drop(): Promise<void> }> {
  const server = process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
  const name = `${prefix}_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
  const admin = postgres(server, { max: 1, onnotice: () => {} });
  await admin.unsafe(`create database "${name}"`);
  await admin.end();
  const url = new URL(server);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    async drop() {
      const a = postgres(server, { max: 1, onnotice: () => {} });
      await a.unsafe(`drop database if exists "${name}" with (force)`);
      await a.end();
    },
  };
}

export interface SpawnedGateway {
  url: string;
  baseURL: string;
  proc: ReturnType<typeof Bun.spawn>;
  dir: string;
  configPath: string;
  /** Everything the process printed so far (stdout and stderr). */
  output(): string;
  /** Resolves with the exit code. */
  exited: Promise<number>;
  stop(signal?: NodeJS.Signals): Promise<number>;
}

/**
 * Runs the gateway as a process: `bun core/main.ts` (or `cmd` such as a compiled binary). On the
 * embedded store its data folder starts as a copy of the initialized template (a first boot runs
 * initdb, ~8 s of CPU each) unless `freshStore` asks for an empty folder, as a new user has.
 */
export async function spawnGateway(
  config: ConfigInput,
  opts: { env?: Record<string, string | undefined>; args?: string[]; cmd?: string[]; dir?: string; waitForListen?: boolean; freshStore?: boolean } = {},
): Promise<SpawnedGateway> {
  const dir = opts.dir ?? tempDir();
  const pgDir = join(dir, "data", "pg");
  const embedded = !(opts.env && "DATABASE_URL" in opts.env ? opts.env.DATABASE_URL : process.env.DATABASE_URL);
  if (embedded && !opts.freshStore && !existsSync(pgDir)) cpSync(await initializedPgFolder(), pgDir, { recursive: true });
  const configPath = join(dir, "config.yaml");
  writeFileSync(configPath, configText(config));
  const cmd = opts.cmd ?? [process.execPath, join(ROOT, "core/main.ts")];
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries({ ...process.env, SVC_MASTER_KEY: MASTER_KEY, ...opts.env })) if (v !== undefined) env[k] = v;
  const proc = Bun.spawn([...cmd, "--config", configPath, "--port", "0", "--host", "127.0.0.1", "--data-dir", join(dir, "data"), ...(opts.args ?? [])], {
    cwd: dir,
    env,
    stdout: "pipe",
    stderr: "pipe",
  });
  let out = "";
  let onOutput: (() => void) | undefined;
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder();
    for await (const chunk of stream) {
      out += decoder.decode(chunk, { stream: true });
      onOutput?.();
    }
  };
  const pumped = Promise.all([pump(proc.stdout as ReadableStream<Uint8Array>), pump(proc.stderr as ReadableStream<Uint8Array>)]);
  // Resolves once the process has exited and everything it printed has been read.
  const exited = proc.exited.then(async (code) => {
    await pumped;
    return code;
  });
  let url = "";
  if (opts.waitForListen !== false) {
    url = await new Promise<string>((resolveUrl, reject) => {
      const check = () => {
        const m = /listening on (http:\/\/[^"\s]+)/.exec(out);
        if (m) resolveUrl(m[1]!.replace("0.0.0.0", "127.0.0.1"));
      };
      onOutput = check;
      check();
      void exited.then((code) => reject(new Error(`gateway exited with ${code} before listening:\n${out}`)));
      setTimeout(() => reject(new Error(`gateway did not start within 60s:\n${out}`)), 60_000);
    });
  }
  return {
    url,
    baseURL: `${url}/v1`,
    proc,
    dir,
    configPath,
    output: () => out,
    exited,
    async stop(signal: NodeJS.Signals = "SIGTERM") {
      if (proc.exitCode === null) proc.kill(signal);
      const code = await exited;
      if (!opts.dir) rmSync(dir, { recursive: true, force: true });
      return code;
    },
  };
}

/** The stores every store-backed suite runs on. */
export const BACKENDS = ["pglite", "postgres"] as const;
export type Backend = (typeof BACKENDS)[number];

/**
 * A gateway with a real store: embedded PGlite in a temp folder, or a fresh PostgreSQL database
 * that `stop()` drops again.
 */
export async function startBackendGateway(
  backend: Backend,
  config: ConfigInput,
  opts: { redisUrl?: string; dbPrefix?: string; spend?: HostOptions["spend"] } = {},
): Promise<TestGateway & { databaseUrl?: string }> {
  const db = backend === "postgres" ? await freshDatabase(opts.dbPrefix) : undefined;
  try {
    const gw = await startTestGateway(config, { store: { databaseUrl: db?.url, redisUrl: opts.redisUrl, spend: opts.spend } });
    const stop = gw.stop;
    return Object.assign(gw, {
      databaseUrl: db?.url,
      async stop() {
        await stop();
        await db?.drop();
      },
    });
  } catch (err) {
    await db?.drop();
    throw err;
  }
}

export interface JsonReply<T> {
  status: number;
  body: T;
  text: string;
}

/** A JSON request to the gateway with a key (the master key by default). */
export async function requestJson<T = Record<string, unknown>>(
  gw: { url: string },
  method: string,
  path: string,
  opts: { key?: string; body?: unknown; headers?: Record<string, string> } = {},
): Promise<JsonReply<T>> {
  const res = await fetch(`${gw.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${opts.key ?? MASTER_KEY}`, "content-type": "application/json", ...opts.headers },
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
  });
  const text = await res.text();
  return { status: res.status, body: (text ? JSON.parse(text) : null) as T, text };
}

/** A management call that must answer 200: its body (else an error with the answer's status and text). */
export async function requestOk<T = Record<string, unknown>>(gw: { url: string }, method: string, path: string, body?: unknown): Promise<T> {
  const r = await requestJson<T>(gw, method, path, { body });
  if (r.status !== 200) throw new Error(`${method} ${path} → ${r.status}: ${r.text}`);
  return r.body;
}
