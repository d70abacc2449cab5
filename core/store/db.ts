// Opens the gateway's store: embedded PGlite by default, PostgreSQL when a URL is given.
// Both sides share one schema, one migration set and one Db type. Bun-only (Bun.file, file imports).
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import type { PGlite } from "@electric-sql/pglite";
import { sql } from "drizzle-orm";
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core";
import { drizzle as drizzlePglite } from "drizzle-orm/pglite";
import { drizzle as drizzlePostgres } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { acquireLock } from "./lock.ts";
import { AnswerWatch } from "./pg-answer-watch.ts";
import { PgliteBridge } from "./pglite-bridge.ts";
import type { RawStatement } from "./pglite-protocol.ts";
import { runMigrations } from "./migrate.ts";
import * as schema from "./schema.ts";
import { rows } from "./sql.ts";

export type Db = PgDatabase<PgQueryResultHKT, typeof schema>;

export interface StoreLog {
  info(m: string): void;
  warn(m: string): void;
}

export interface Store {
  db: Db;
  kind: "pglite" | "postgres";
  /** `select version()`; never throws. */
  ping(): Promise<{ ok: boolean; detail: string }>;
  /** Idempotent. */
  close(): Promise<void>;
  /** PostgreSQL LISTEN/NOTIFY, so instances sharing a database can tell each other of changes. */
  notifications?: Notifications;
  /**
   * Bulk load, where the backend makes it cheaper than an INSERT: `load.text` (COPY text format)
   * into `load.table`, then `then`, in one transaction (both or neither). The embedded store has it.
   */
  copyIn?(load: CopyLoad, then: RawStatement): Promise<void>;
}

export type { RawStatement };

export interface CopyLoad {
  table: string;
  columns: readonly string[];
  /** Rows in COPY's text format: tab-separated, `\N` for null, one row per line. */
  text: string;
}

export interface Notifications {
  /** Calls `onMessage` for every notification; `onListen` after each (re)connection of the listener. */
  listen(channel: string, onMessage: (payload: string) => void, onListen: () => void): Promise<void>;
  notify(channel: string, payload: string): Promise<void>;
}

export interface OpenStoreOptions {
  /** postgres:// URL; when unset the embedded PGlite in `<dataDir>/pg` is used. */
  databaseUrl?: string;
  /** How long a PostgreSQL connection may leave a request unanswered before it is closed (pg-answer-watch.ts); default `DATABASE_ANSWER_TIMEOUT_MS` or 30 s. */
  answerTimeoutMs?: number;
  dataDir: string;
  log?: StoreLog;
}

// Key of the session advisory lock that serializes migrations across gateway instances sharing
// one PostgreSQL ("gateway" in ASCII). Fixed forever: instances of different versions must agree.
const MIGRATION_LOCK_KEY = "29104508263162233";

export async function openStore(opts: OpenStoreOptions): Promise<Store> {
  return opts.databaseUrl ? openPostgres(opts.databaseUrl, opts.answerTimeoutMs ?? defaultAnswerTimeout(), opts.log) : openPglite(opts.dataDir, opts.log);
}

const DEFAULT_ANSWER_TIMEOUT_MS = 30_000;
/** A lost database should fail calls within seconds, not the driver's default 30 s. */
const CONNECT_TIMEOUT_S = 5;
/**
 * Seconds a connection that failed waits before it connects again: postgres.js's own curve,
 * capped at 2 s rather than 20. Its count of failures is the pool's, so after an outage of seconds
 * under load every connection waited 10 to 20 s, and management calls failed for that long after
 * the database was back.
 */
const reconnectDelayS = (failures: number): number => (0.5 + Math.random() / 2) * Math.min(3 ** failures / 100, 2);

function defaultAnswerTimeout(): number {
  const fromEnv = Number(process.env.DATABASE_ANSWER_TIMEOUT_MS);
  return Number.isFinite(fromEnv) && fromEnv > 0 ? fromEnv : DEFAULT_ANSWER_TIMEOUT_MS;
}

/** A readiness probe must answer quickly even while a lost database is being reconnected. */
const PING_TIMEOUT_MS = 2000;
/** How often a probe's patience is counted (see `patience`). */
const PATIENCE_TICK_MS = 100;

type PingResult = { ok: boolean; detail: string; timedOut?: boolean };

/**
 * Resolves once `ms` have passed in which this process was free to read an answer. A stretch in
 * which its event loop was held counts as one tick, not as its length: a gateway parsing and
 * serializing megabytes for other calls held it for 6 s, the probe's answer waited unread, and a
 * timer counting wall time gave up on it.
 */
function patience(ms: number): { over: Promise<void>; cancel(): void } {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const over = new Promise<void>((resolve) => {
    let counted = 0;
    let last = performance.now();
    const tick = () => {
      const now = performance.now();
      counted += Math.min(now - last, PATIENCE_TICK_MS);
      last = now;
      if (counted >= ms) resolve();
      else timer = setTimeout(tick, PATIENCE_TICK_MS);
    };
    timer = setTimeout(tick, PATIENCE_TICK_MS);
  });
  return { over, cancel: () => clearTimeout(timer) };
}

/**
 * A probe: `version` answers the database's version, or fails. It is given up after
 * PING_TIMEOUT_MS of this process's free time; `version` is told so by `abandoned`.
 */
function pinger(version: (abandoned: Promise<void>) => Promise<string>): () => Promise<PingResult> {
  return async () => {
    const wait = patience(PING_TIMEOUT_MS);
    try {
      const answer = await Promise.race([version(wait.over), wait.over.then(() => undefined)]);
      if (answer === undefined) return { ok: false, detail: `no answer within ${PING_TIMEOUT_MS} ms`, timedOut: true };
      return { ok: true, detail: answer };
    } catch (e) {
      return { ok: false, detail: e instanceof Error ? e.message : String(e) };
    } finally {
      wait.cancel();
    }
  };
}

/**
 * The embedded store is a thread of this process with one connection: a ping queued behind a long
 * statement or a large batch is late because the store is busy, not because it is unreachable.
 * Only a failed or closed worker, or an error from the query itself, is down.
 */
function pglitePinger(db: Db, bridge: PgliteBridge): Store["ping"] {
  const ping = pinger(async () => (await rows<{ version: string }>(db, sql`select version() as version`))[0]?.version ?? "unknown version");
  return async () => {
    if (bridge.failed) return { ok: false, detail: bridge.failed };
    const r = await ping();
    if (r.ok || !r.timedOut || bridge.failed) return { ok: r.ok, detail: bridge.failed ?? r.detail };
    return { ok: true, detail: `embedded PGlite, busy (the probe had ${r.detail})` };
  };
}

/**
 * PostgreSQL is probed on a connection of its own. Through the pool, the probe waited behind every
 * query of a busy gateway (its 10 connections each reading a megabyte team list), timed out, and a
 * busy store was reported unreachable: readiness said disconnected, and management calls were
 * answered 503. A probe that failed leaves nothing behind (a connection that stopped answering
 * would hold every later probe): the next one connects anew.
 */
function postgresPinger(url: string, socket: AnswerWatch["connect"]): { ping: Store["ping"]; close(): Promise<void> } {
  let client: postgres.Sql | undefined;
  let closed = false;
  const drop = (failed: postgres.Sql) => {
    if (client === failed) client = undefined;
    return failed.end({ timeout: 0 }).catch(() => {});
  };
  const version = async (abandoned: Promise<void>) => {
    if (closed) throw new Error("the store is closed");
    client ??= postgres(url, { max: 1, onnotice: () => {}, connect_timeout: CONNECT_TIMEOUT_S, ...({ socket } as object) });
    const probing = client;
    abandoned.then(() => drop(probing));
    try {
      const [row] = await probing<{ version: string }[]>`select version() as version`;
      return row?.version ?? "unknown version";
    } catch (e) {
      void drop(probing);
      throw e;
    }
  };
  return {
    ping: pinger(version),
    close: async () => {
      closed = true;
      if (client) await drop(client);
    },
  };
}

function once(fn: () => Promise<void>): () => Promise<void> {
  let done: Promise<void> | undefined;
  return () => {
    done ??= fn();
    return done;
  };
}

async function openPglite(dataDir: string, log?: StoreLog): Promise<Store> {
  mkdirSync(dataDir, { recursive: true });
  const release = await acquireLock(join(dataDir, "gateway.lock"), dataDir);
  // PGlite runs on a worker thread (see pglite-worker.ts): its memory stays out of this heap.
  let bridge = new PgliteBridge();
  try {
    const pgDir = join(dataDir, "pg");
    const started = performance.now();
    const firstBoot = !existsSync(join(pgDir, "PG_VERSION"));
    await bridge.open(pgDir);
    if (firstBoot) {
      // The worker that ran initdb keeps ~400 MB it no longer needs until it ends: a new one
      // opens the initialized folder at ~300 MB instead of ~700 MB (a later start's size).
      await bridge.close();
      bridge = new PgliteBridge();
      await bridge.open(pgDir);
    }
    // drizzle's PGlite driver calls only `query` and `transaction`, which the bridge provides.
    const db: Db = drizzlePglite({ client: bridge as unknown as PGlite, schema });
    // One process holds the lockfile, so nothing else can be migrating this directory.
    await runMigrations(db);
    log?.info(`store: embedded PGlite at ${pgDir} ready in ${Math.round(performance.now() - started)} ms`);
    return {
      db,
      kind: "pglite",
      ping: pglitePinger(db, bridge),
      copyIn: (load, then) => bridge.copyThen(`copy ${load.table} (${load.columns.join(", ")}) from '/dev/blob'`, load.text, then),
      close: once(async () => {
        try {
          await bridge.close();
        } finally {
          release();
        }
      }),
    };
  } catch (e) {
    await bridge.close().catch(() => {});
    release();
    throw e;
  }
}

/** Channel the listener check listens to and leaves again: a round trip on the LISTEN connection, which otherwise only reads. */
const LISTENER_CHECK_CHANNEL = "svc_listener_check";

async function openPostgres(url: string, answerMs: number, log?: StoreLog): Promise<Store> {
  const watch = new AnswerWatch(answerMs, ({ waited_ms, host }) =>
    log?.warn(`store: a PostgreSQL connection (${host}) left a request unanswered for ${waited_ms} ms; it was closed, and the next query opens a new one`),
  );
  let listenerCheck: ReturnType<typeof setInterval> | undefined;
  // drizzle's migrator issues `CREATE SCHEMA IF NOT EXISTS`, whose NOTICE would otherwise be
  // printed to stdout on every start.
  const client = postgres(url, {
    max: 10,
    onnotice: () => {},
    connect_timeout: CONNECT_TIMEOUT_S,
    backoff: reconnectDelayS,
    // Not in postgres.js's types; documented in its README ("custom socket").
    ...({ socket: watch.connect } as object),
  });
  try {
    const db: Db = drizzlePostgres({ client, schema });
    // drizzle's migrate reads the last applied migration outside its transaction and takes no
    // lock, so replicas starting together would apply the same migration twice. A session lock
    // on a reserved connection serializes them; the migration itself may use any pool connection.
    const reserved = await client.reserve();
    try {
      await reserved.unsafe(`select pg_advisory_lock(${MIGRATION_LOCK_KEY})`);
      try {
        await runMigrations(db);
      } finally {
        await reserved.unsafe(`select pg_advisory_unlock(${MIGRATION_LOCK_KEY})`);
      }
    } finally {
      reserved.release();
    }
    watch.arm();
    const probe = postgresPinger(url, watch.connect);
    log?.info(`store: PostgreSQL at ${redact(url)}`);
    return {
      db,
      kind: "postgres",
      ping: probe.ping,
      // Everything that writes has stopped by now. The bound matters: postgres.js 3.4.9 never ends
      // a connection whose query was cut by the server (a restart, pg_terminate_backend), so end()
      // always waited out its whole timeout then (porsager/postgres#1097).
      close: once(async () => {
        watch.stop();
        clearInterval(listenerCheck);
        await Promise.all([client.end({ timeout: 1 }), probe.close()]);
      }),
      notifications: {
        // postgres.js keeps one dedicated listening connection and re-listens after a reconnect.
        listen: async (channel, onMessage, onListen) => {
          await client.listen(channel, onMessage, onListen);
          // A listening connection only reads: one that stopped answering is found by asking it something.
          listenerCheck ??= setInterval(() => {
            client
              .listen(LISTENER_CHECK_CHANNEL, () => {})
              .then((l) => l.unlisten())
              .catch(() => {});
          }, answerMs);
          listenerCheck.unref?.();
        },
        notify: async (channel, payload) => {
          await client.notify(channel, payload);
        },
      },
    };
  } catch (e) {
    watch.stop();
    await client.end({ timeout: 1 }).catch(() => {});
    throw e;
  }
}

/** host:port/db only; the URL may carry a password. */
function redact(url: string): string {
  try {
    const u = new URL(url);
    return `${u.host}${u.pathname}`;
  } catch {
    return "(unparseable url)";
  }
}
