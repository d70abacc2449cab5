/**
 * The live registry: the current snapshot, reloads (file watch and SIGHUP) serialized through one
 * promise chain, and disposal of a retired snapshot once its last pinned request has finished.
 */
import { stat } from "node:fs/promises";
import { type FSWatcher, watch } from "chokidar";
import { applyConfigEnv, type ConfigEnv, type ConfigResult, readConfig } from "./config/load.ts";
import type { GatewayConfig } from "./config/schema.ts";
import type { Logger } from "./contract.ts";
import { deliverPending } from "./pipeline/record.ts";
import { forgetDeploymentStates } from "./router/deployment-state.ts";
import type { HostServices } from "./services.ts";
import { buildSnapshot, type Snapshot, SnapshotError, servedStoredIds } from "./snapshot.ts";
import { overflowAfter } from "./limits/capacity.ts";
import { within } from "./timer.ts";

/** How long a plugin's dispose may take before the gateway goes on without it (a stop, a reload). */
const PLUGIN_DISPOSE_MS = 2000;
/** How long a stop waits for a reload under way before it goes on. */
const CLOSE_WAITS_FOR_RELOAD_MS = 5000;

/**
 * How often the watch also looks at the file the config path leads to: what the path watch does not
 * see (a symlink repointed, its target replaced, a ConfigMap's `..data` swapped, a deletion) is
 * reloaded, or its refusal logged, within this long.
 */
const FILE_CHECK_MS = 1000;

const ADDRESS_SETTINGS = {
  store: "the store's address (DATABASE_URL or general_settings.database_url)",
  Redis: "Redis's address (REDIS_URL or general_settings.redis_url)",
};

type Addresses = { store: string | undefined; Redis: string | undefined };

/**
 * The store's and Redis's addresses as a start would choose them now (the variable, the
 * environment's own or one environment_variables set, else general_settings): a reload cannot
 * change them, as they are opened once.
 */
function openedAtStart(config: GatewayConfig): Addresses {
  const general = config.general_settings;
  return { store: process.env.DATABASE_URL || general?.database_url, Redis: process.env.REDIS_URL || general?.redis_url };
}

export type ReloadResult = { ok: true; version: number; changed: boolean } | { ok: false; errors: string[] };

export interface Pin {
  snapshot: Snapshot;
  release(): void;
}

/**
 * Every problem of a file the schema refuses: the schema's errors, then what the registry build finds
 * in the parts of the file the schema accepts (unknown providers and callbacks, duplicate ids and
 * pass-through endpoints, unset variables in their headers, plugin configs), so one start or reload
 * lists them all. The check's plugins are disposed, and its environment_variables taken back.
 */
export async function refusalErrors(
  result: Extract<ConfigResult, { ok: false }>,
  configPath: string,
  log: Logger,
  services: HostServices = {},
  configEnv: ConfigEnv = new Map(),
): Promise<string[]> {
  if (!result.usable) return result.errors;
  const undoEnv = applyConfigEnv(result.usable.env, configEnv);
  try {
    // Stored models are not the file's: left out of the check (they only ever warn).
    const snap = await buildSnapshot(result.usable.config, configPath, 0, log, { ...services, loadDbModels: undefined });
    await Promise.allSettled(snap.plugins.map((p) => p.hooks.dispose?.()));
    return result.errors;
  } catch (err) {
    return err instanceof SnapshotError ? [...result.errors, ...err.errors] : result.errors;
  } finally {
    undoEnv();
  }
}

export class Live {
  private snap: Snapshot;
  private text: string;
  /** The config the current snapshot was built from (the last good file). */
  private config: GatewayConfig;
  private readonly pins = new Map<Snapshot, number>();
  /** Requests and streams holding a snapshot, and who waits for there to be none (shutdown). */
  private inFlight = 0;
  private idleWaiters: (() => void)[] = [];
  private readonly retired = new Set<Snapshot>();
  private chain: Promise<unknown> = Promise.resolve();
  private watcher: FSWatcher | undefined;
  private debounce: ReturnType<typeof setTimeout> | undefined;
  /** The check of the file behind the path (see FILE_CHECK_MS), and what it last found there. */
  private fileCheck: ReturnType<typeof setInterval> | undefined;
  private fileSeen: string | undefined;
  /** The rebuild started by the latest stored-model change, so a model write can return once it serves. */
  private modelsReload: Promise<ReloadResult> | undefined;

  private constructor(
    readonly configPath: string,
    private readonly log: Logger,
    private readonly services: HostServices,
    first: Snapshot,
    text: string,
    config: GatewayConfig,
    /** The `environment_variables` the serving config set: a reload changes or drops them. */
    private readonly configEnv: ConfigEnv,
    /** The store's and Redis's addresses the process opened (at start), which a reload cannot change. */
    private readonly opened: Addresses,
  ) {
    this.snap = first;
    this.text = text;
    this.config = config;
    // Stored models changed (here or on another instance): rebuild with the config that serves,
    // not the file, which may be half-edited or invalid right now (its own reload reports that).
    services.identity?.onChange((c) => {
      if (c.kind !== "models" && c.kind !== "all") return;
      const run = this.rebuildStoredModels();
      run.catch(() => undefined);
      this.modelsReload = run;
    });
  }

  get storedModelsReload(): Promise<ReloadResult> | undefined {
    return this.modelsReload;
  }

  /**
   * Loads the first config; throws SnapshotError listing every problem when it is invalid.
   * `configEnv`: the variables the file's environment_variables already set (the host sets them
   * before it opens the store).
   */
  static async start(configPath: string, log: Logger, services: HostServices = {}, configEnv: ConfigEnv = new Map()): Promise<Live> {
    const result = await readConfig(configPath, configEnv);
    if (!result.ok) throw new SnapshotError(await refusalErrors(result, configPath, log, services, configEnv));
    for (const w of result.warnings) log.warn(`config: ${w}`);
    applyConfigEnv(result.env, configEnv);
    const snap = await buildSnapshot(result.config, configPath, 1, log, services);
    return new Live(configPath, log, services, snap, result.text, result.config, configEnv, openedAtStart(result.config));
  }

  get current(): Snapshot {
    return this.snap;
  }

  /** Pins the current snapshot for the life of a request or stream. */
  pin(): Pin {
    const snapshot = this.snap;
    this.pins.set(snapshot, (this.pins.get(snapshot) ?? 0) + 1);
    this.inFlight++;
    let released = false;
    return {
      snapshot,
      release: () => {
        if (released) return;
        released = true;
        if (--this.inFlight === 0) for (const wake of this.idleWaiters.splice(0)) wake();
        const left = (this.pins.get(snapshot) ?? 1) - 1;
        if (left > 0) this.pins.set(snapshot, left);
        else {
          this.pins.delete(snapshot);
          if (this.retired.has(snapshot)) void this.dispose(snapshot);
        }
      },
    };
  }

  /**
   * Resolves true once no request or stream holds a snapshot (a call releases it as it hands its
   * record to the spend log), false when some still do after `ms`.
   */
  idle(ms: number): Promise<boolean> {
    if (this.inFlight === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        this.idleWaiters = this.idleWaiters.filter((w) => w !== wake);
        resolve(false);
      }, ms);
      this.idleWaiters.push(wake);
    });
  }

  /** Rebuilds from the file; an invalid file leaves the current snapshot serving. */
  reload(reason: string, force = false): Promise<ReloadResult> {
    const run = this.chain.then(() => this.doReload(reason, force));
    this.chain = run.catch(() => undefined);
    return run;
  }

  /** Rebuilds with the serving config (stored models are read again), queued like `reload`. */
  private rebuildStoredModels(): Promise<ReloadResult> {
    const run = this.chain.then(() => this.swap("stored models changed", this.config, this.text));
    this.chain = run.catch(() => undefined);
    return run;
  }

  private async doReload(reason: string, force: boolean): Promise<ReloadResult> {
    // What this reload reads is what the file check has seen: it does not reload it again.
    if (this.fileCheck) this.fileSeen = await this.fileIdentity();
    const result = await readConfig(this.configPath, this.configEnv);
    if (!result.ok) {
      const errors = await refusalErrors(result, this.configPath, this.log, this.services, this.configEnv);
      this.log.error("config reload rejected; the previous config keeps serving", { reason, errors });
      return { ok: false, errors };
    }
    if (!force && result.text === this.text) return { ok: true, version: this.snap.version, changed: false };
    // An empty file the watch sees is most likely a write caught between its truncation and its text:
    // serving it would drop every model. A start or SIGHUP (forced) takes it, as the operator asked.
    if (!force && result.text.trim() === "") {
      const errors = ["config file is empty (a write not finished?); to serve no models, write `model_list: []` or send SIGHUP"];
      this.log.error("config reload rejected; the previous config keeps serving", { reason, errors });
      return { ok: false, errors };
    }
    for (const w of result.warnings) this.log.warn(`config: ${w}`);
    const before = openedAtStart(this.config);
    const swapped = await this.swap(reason, result.config, result.text, result.env);
    if (swapped.ok) {
      const now = openedAtStart(this.config);
      // Said once per change, and not for a change back to what the process opened.
      for (const what of ["store", "Redis"] as const) {
        if (now[what] !== before[what] && now[what] !== this.opened[what]) {
          this.log.warn(`config: ${ADDRESS_SETTINGS[what]} changed; it is opened once, at start: restart the gateway to use the new one`);
        }
      }
    }
    return swapped;
  }

  /** `env`: the new file's environment_variables; none for a rebuild with the serving config (they stay as they are). */
  private async swap(reason: string, config: GatewayConfig, text: string, env?: Record<string, string>): Promise<ReloadResult> {
    let next: Snapshot;
    // The new file's environment_variables are set for its build (plugins and providers read them),
    // those the old file set and the new one does not are unset, and all is taken back if it fails.
    const undoEnv = env ? applyConfigEnv(env, this.configEnv) : () => undefined;
    try {
      next = await buildSnapshot(config, this.configPath, this.snap.version + 1, this.log, this.services, servedStoredIds(this.snap));
    } catch (err) {
      undoEnv();
      const errors = err instanceof SnapshotError ? err.errors : [String(err)];
      this.log.error("config reload rejected; the previous config keeps serving", { reason, errors });
      return { ok: false, errors };
    }
    const old = this.snap;
    this.snap = next;
    this.text = text;
    this.config = config;
    this.retired.add(old);
    if (!this.pins.has(old)) void this.dispose(old);
    this.log.info("config reloaded", { reason, version: next.version, models: next.models.entries.length });
    this.warnOverbooked(next);
    return { ok: true, version: next.version, changed: true };
  }

  /**
   * A reload that leaves a group serving less than its guaranteed keys reserve (its deployments'
   * rpm/tpm lowered, one removed) is taken, as the capacity is what the operator says it is, but
   * said: those keys then get less than they reserve, and best-effort keys nothing of that group.
   */
  private warnOverbooked(s: Snapshot): void {
    const identity = this.services.identity;
    if (!identity) return;
    const problem = overflowAfter(() => true, s, identity.keys.values(), identity);
    if (problem) this.log.warn("config reloaded with guaranteed_throughput keys reserving more than their model groups now serve; lower their limits or raise the groups' rpm/tpm", { problem });
  }

  private async dispose(s: Snapshot): Promise<void> {
    this.retired.delete(s);
    // The router's figures of deployments that neither the serving snapshot nor a pinned one has.
    const serving = new Set<string>();
    for (const snap of [this.snap, ...this.pins.keys()]) for (const e of snap.models.entries) serving.add(e.deployment.id);
    forgetDeploymentStates(s.models.entries.map((e) => e.deployment.id).filter((id) => !serving.has(id)));
    // The last calls on it (their release is what got here) reach its callbacks first.
    if (!(await within(PLUGIN_DISPOSE_MS, deliverPending()))) this.log.warn("logging callbacks did not take the last calls in time; disposing them anyway", { waitedMs: PLUGIN_DISPOSE_MS });
    await Promise.all(
      s.plugins.map(async (p) => {
        // A plugin's dispose that never ends must not hold the gateway's stop.
        const disposed = Promise.resolve().then(() => p.hooks.dispose?.());
        disposed.catch((err) => this.log.warn("plugin dispose failed", { plugin: p.name, error: String(err) }));
        if (!(await within(PLUGIN_DISPOSE_MS, disposed))) this.log.warn("plugin dispose did not end in time; going on without it", { plugin: p.name, waitedMs: PLUGIN_DISPOSE_MS });
      }),
    );
  }

  /**
   * Watches the config file: edits in place and atomic renames through the path watch, and, checked
   * every FILE_CHECK_MS, the file the path resolves to (symlinks followed), so a repointed link, a
   * replaced target, a ConfigMap update or a deletion is reloaded too (a missing file is refused).
   */
  watch(): void {
    this.watcher = watch(this.configPath, { ignoreInitial: true, awaitWriteFinish: { stabilityThreshold: 50, pollInterval: 10 } });
    const trigger = () => {
      clearTimeout(this.debounce);
      this.debounce = setTimeout(() => void this.reload("file changed"), 50);
    };
    this.watcher.on("add", trigger).on("change", trigger);
    let checking = false;
    void this.fileIdentity().then((id) => {
      this.fileSeen ??= id;
    });
    this.fileCheck = setInterval(async () => {
      if (checking) return;
      checking = true;
      try {
        const id = await this.fileIdentity();
        if (this.fileSeen !== undefined && id !== this.fileSeen) trigger();
        this.fileSeen = id;
      } finally {
        checking = false;
      }
    }, FILE_CHECK_MS);
    this.fileCheck.unref?.();
  }

  /** The file the config path leads to, as a string that changes when it is replaced, written, or its mode changes. */
  private async fileIdentity(): Promise<string> {
    try {
      const s = await stat(this.configPath);
      return `${s.dev}:${s.ino}:${s.size}:${s.mtimeMs}:${s.ctimeMs}:${s.mode}`;
    } catch (err) {
      return `missing:${(err as NodeJS.ErrnoException).code ?? String(err)}`;
    }
  }

  async close(): Promise<void> {
    clearTimeout(this.debounce);
    clearInterval(this.fileCheck);
    await this.watcher?.close();
    // A reload under way may finish first, but not hold the stop (a plugin's setup is bounded too).
    await Promise.race([this.chain, new Promise((resolve) => setTimeout(resolve, CLOSE_WAITS_FOR_RELOAD_MS).unref?.())]);
    await this.dispose(this.snap);
    for (const s of [...this.retired]) await this.dispose(s);
  }
}
