/** Entry point: flags and environment → config → store → Redis → HTTP server; SIGHUP reloads, SIGTERM drains. */
// Only light modules here: the gateway's own (host, app, …) are imported in main(), once SIGHUP is
// handled (see reloadOnSighup). Loading them takes seconds on a busy machine.
import pkg from "../package.json" with { type: "json" };
import { parseRunOptions, USAGE } from "./cli.ts";
import { BoundedMap } from "./bounded-map.ts";
import type { Host } from "./host.ts";
import type { Live } from "./live.ts";
import { createLogger, redact } from "./log.ts";
import { delay, within } from "./timer.ts";

const log = createLogger("gateway");
/** How long shutdown waits, after closing the connections left at the drain deadline, for their calls to end. */
const CUT_CALLS_MS = 1000;
/** How long shutdown waits for plugins' spend recorders and logging callbacks to flush. */
const PLUGIN_FLUSH_MS = 5000;

/** The reason the gateway does not start, on stderr; key-shaped text redacted as in every log line (a plugin's error may quote its config). */
function fatal(message: string, errors?: string[]): never {
  console.error(redact(`gateway: ${message}`));
  for (const e of errors ?? []) console.error(redact(`  ${e}`));
  process.exit(1);
}

function warnNoMasterKey(): void {
  const bar = "!".repeat(78);
  console.error(
    `${bar}\n!! NO MASTER KEY IS SET: every management call is refused with 401 (model calls take only virtual keys already in the store).\n!! Set one before starting, e.g.  SVC_MASTER_KEY=sk-$(openssl rand -hex 16)\n!! or put  general_settings.master_key: os.environ/SVC_MASTER_KEY  in config.yaml.\n${bar}`,
  );
}

/**
 * Bun's fetch makes at most BUN_CONFIG_MAX_HTTP_REQUESTS requests at once (256 unless set) and
 * queues the rest, whichever provider they are for: 256 long streams, or calls to one provider
 * that hangs, make every other provider's calls wait (and time out, and cool healthy deployments
 * down). It is read once, when the process starts, so only its environment can raise it
 * (`npm start` sets 4096).
 */
const FEW_UPSTREAM_CONNECTIONS = 1024;

function warnFewUpstreamConnections(): void {
  const set = Number(process.env.BUN_CONFIG_MAX_HTTP_REQUESTS ?? 256);
  if (set >= FEW_UPSTREAM_CONNECTIONS) return;
  log.warn(
    `at most ${set} upstream calls can be under way at once (BUN_CONFIG_MAX_HTTP_REQUESTS); past that, calls to every provider wait in one queue. Start the gateway with BUN_CONFIG_MAX_HTTP_REQUESTS=4096 in its environment (npm start does).`,
  );
}

/** Distinct unhandled errors logged, each once: a fire-and-forget logger failing on every call would flood the log. */
const UNHANDLED_KINDS_LOGGED = 100;

/**
 * An error no code awaited (a plugin's fire-and-forget fetch that rejects, a throw inside a timer
 * its `setup` started) is logged, redacted like every line, once per kind, and the gateway keeps
 * serving: by default Bun exits the process on either, cutting every call under way and losing
 * spend not yet written.
 */
function keepServingOnUnhandledErrors(): void {
  const seen = new BoundedMap<string, true>(UNHANDLED_KINDS_LOGGED);
  const report = (event: string, err: unknown) => {
    const error = err instanceof Error ? err : new Error(String(err));
    const kind = `${event}\t${error.name}\t${error.message}`;
    if (seen.has(kind)) return;
    seen.set(kind, true);
    log.error("unhandled error (a plugin's?); the gateway goes on serving, and further errors of this kind are not logged", {
      event,
      error: String(error),
      stack: error.stack,
    });
  };
  process.on("unhandledRejection", (reason) => report("unhandledRejection", reason));
  process.on("uncaughtException", (err) => report("uncaughtException", err));
}

/**
 * SIGHUP handled from the start of main(): its default action kills the process, and a start (the
 * gateway's modules loading, the store opening and migrating, plugins setting up) can take many
 * seconds, during which a config reloader may well signal. A reload asked before the registry is up is run once it is: the file it
 * was read from may have changed since. Returns what hands the handler the registry.
 */
function reloadOnSighup(): (live: Live) => void {
  let live: Live | undefined;
  let asked = false;
  process.on("SIGHUP", () => {
    if (live) void live.reload("SIGHUP", true);
    else if (!asked) {
      asked = true;
      log.info("SIGHUP while starting: the config is read again once the gateway has started");
    }
  });
  return (started) => {
    live = started;
    if (asked) void started.reload("SIGHUP", true);
  };
}

async function main(): Promise<void> {
  const sighupReloads = reloadOnSighup();
  let opts: ReturnType<typeof parseRunOptions>;
  try {
    opts = parseRunOptions(process.argv.slice(2), process.env);
  } catch (err) {
    fatal(`${err instanceof Error ? err.message : String(err)}\n${USAGE}`);
  }

  // Before the plugins' setup runs: a timer it starts may throw at any time after.
  keepServingOnUnhandledErrors();
  const [{ startHost }, { createApp }, { serveOptions, whyNotListening }, { SnapshotError }, { deliverPending }] = await Promise.all([
    import("./host.ts"),
    import("./http/app.ts"),
    import("./http/serving.ts"),
    import("./snapshot.ts"),
    import("./pipeline/record.ts"),
  ]);
  let host: Host;
  try {
    host = await startHost({ configPath: opts.configPath, dataDir: opts.dataDir, databaseUrl: opts.databaseUrl, redisUrl: opts.redisUrl, log });
  } catch (err) {
    if (err instanceof SnapshotError) fatal(`refusing to start: ${opts.configPath} is invalid`, err.errors);
    fatal(`cannot start: ${err instanceof Error ? err.message : String(err)}`);
  }
  const { live, store, redis } = host;
  // Opening the embedded store leaves a large, short-lived heap behind; collect it now rather than
  // in the first requests' GC pauses.
  Bun.gc(true);
  if (!live.current.settings.masterKey) warnNoMasterKey();
  warnFewUpstreamConnections();

  const app = createApp({ live, log, services: host.services, probes: { store: store.ping, redis: async () => redis?.ping(), version: pkg.version } });
  let server: ReturnType<typeof Bun.serve>;
  try {
    server = Bun.serve({ port: opts.port, hostname: opts.host, ...serveOptions(app), idleTimeout: 255 });
  } catch (err) {
    // The store is open by now: closed, so that its folder's lock goes with this process.
    await host.close();
    fatal(`cannot listen on ${opts.host}:${opts.port}: ${await whyNotListening(opts.host, err)}`);
  }
  live.watch();
  sighupReloads(live);
  let stopping = false;
  const shutdown = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    // Closes the listener at once; logged after, so whoever reads the line finds new connections refused.
    const drained = server.stop(false).then(() => true);
    log.info(`${signal}: draining in-flight requests`, { timeoutSeconds: opts.drainSeconds });
    const timedOut = delay(opts.drainSeconds * 1000).then(() => false as const);
    if (!(await Promise.race([drained, timedOut]))) {
      log.warn("drain timeout reached; closing remaining connections");
      await server.stop(true);
    }
    // Calls cut at the deadline end (logged as cancelled) once they notice their client has gone,
    // within a tick: their records must reach the spend writer before it flushes.
    if (!(await live.idle(CUT_CALLS_MS))) log.warn("calls still running after the drain; their spend may not be logged", { waitedMs: CUT_CALLS_MS });
    const snap = live.current;
    // The drained calls' records reach the callbacks before those flush (they came after the flush before).
    // A plugin's flush that never ends (its logging backend gone, no timeout of its own) must not hold the exit.
    const callbacks = new Set([...snap.successCallbacks, ...snap.failureCallbacks]);
    const flushed = deliverPending().then(() => Promise.allSettled([...snap.spend.map((s) => s.flush()), ...[...callbacks].map((c) => Promise.resolve().then(() => c.flush?.()))]));
    if (!(await within(PLUGIN_FLUSH_MS, flushed))) log.warn("a spend recorder or logging callback did not finish flushing; stopping without it", { waitedMs: PLUGIN_FLUSH_MS });
    await host.close();
    log.info("stopped");
    process.exit(0);
  };
  process.on("SIGTERM", () => void shutdown("SIGTERM"));
  process.on("SIGINT", () => void shutdown("SIGINT"));
  // Announced only once the signal handlers are in place: a supervisor (or test) that signals as
  // soon as it reads this line must not hit the default action, which kills the process.
  log.info(`listening on http://${server.hostname}:${server.port}`, {
    config: opts.configPath,
    models: live.current.models.entries.length,
    store: store.kind === "pglite" ? `embedded (${opts.dataDir})` : "postgresql",
    redis: redis ? "configured" : "off",
  });
}

await main();
