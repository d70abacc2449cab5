/**
 * An immutable registry snapshot: everything one config version serves with. A request pins the
 * snapshot it started on; a reload builds a new one and swaps a single reference.
 */
import type {
  AuthResolver,
  BudgetChecker,
  Deployment,
  LoggingCallback,
  Logger,
  ProviderAdapter,
  RateLimiter,
  SpendRecorder,
} from "./contract.ts";
import type { GatewayConfig, ModelEntry } from "./config/schema.ts";
import { ModelTable, toDeployment } from "./models.ts";
import { BUILTIN_PLUGINS, type LoadedPlugin, importPlugin, setupPlugin } from "./plugins.ts";

export interface Settings {
  masterKey: string | undefined;
  /** Seconds before an upstream call is abandoned with 408. */
  requestTimeout: number;
  dropParams: boolean;
}

export interface Snapshot {
  readonly version: number;
  readonly loadedAt: number;
  readonly config: GatewayConfig;
  readonly settings: Settings;
  readonly models: ModelTable;
  readonly providers: ReadonlyMap<string, ProviderAdapter>;
  readonly auth: readonly AuthResolver[];
  readonly rateLimiters: readonly RateLimiter[];
  readonly budgets: readonly BudgetChecker[];
  readonly spend: readonly SpendRecorder[];
  readonly successCallbacks: readonly LoggingCallback[];
  readonly failureCallbacks: readonly LoggingCallback[];
  readonly plugins: readonly LoadedPlugin[];
}

export class SnapshotError extends Error {
  constructor(readonly errors: string[]) {
    super(errors.join("\n"));
  }
}

const DEFAULT_REQUEST_TIMEOUT_S = 600;

export function resolveSettings(config: GatewayConfig): Settings {
  return {
    masterKey: process.env.SVC_MASTER_KEY || config.general_settings?.master_key,
    requestTimeout: config.router_settings?.timeout ?? config.svc_settings?.request_timeout ?? DEFAULT_REQUEST_TIMEOUT_S,
    dropParams: config.svc_settings?.drop_params ?? false,
  };
}

async function loadPlugins(config: GatewayConfig, configPath: string, settings: Settings, log: Logger): Promise<LoadedPlugin[]> {
  const ctx = { log, settings: { masterKey: settings.masterKey } };
  const errors: string[] = [];
  const loaded: LoadedPlugin[] = [];
  for (const plugin of BUILTIN_PLUGINS) loaded.push(await setupPlugin(plugin, {}, ctx, `/builtin/${plugin.name}`));
  for (const [i, entry] of (config.plugins ?? []).entries()) {
    try {
      const def = await importPlugin(entry.path, configPath);
      loaded.push(await setupPlugin(def, entry.config, ctx, `/plugins/${i}/config`));
    } catch (err) {
      errors.push(err instanceof AggregateError ? err.message : `/plugins/${i}/path: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  if (errors.length > 0) {
    await Promise.allSettled(loaded.map((p) => p.hooks.dispose?.()));
    throw new SnapshotError(errors);
  }
  return loaded;
}

function collectProviders(plugins: LoadedPlugin[], errors: string[]): Map<string, ProviderAdapter> {
  const providers = new Map<string, ProviderAdapter>();
  const owner = new Map<string, string>();
  for (const p of plugins) {
    for (const adapter of p.hooks.providers ?? []) {
      for (const id of adapter.ids) {
        if (providers.has(id)) errors.push(`plugin ${p.name}: provider '${id}' is already registered by plugin ${owner.get(id)}`);
        providers.set(id, adapter);
        owner.set(id, p.name);
      }
    }
  }
  return providers;
}

function buildModels(list: ModelEntry[], providers: Map<string, ProviderAdapter>, errors: string[]): ModelTable {
  const seen = new Map<string, number>();
  const entries: { entry: ModelEntry; deployment: Deployment }[] = [];
  for (const [i, entry] of list.entries()) {
    const base = toDeployment(entry);
    const adapter = providers.get(base.provider);
    if (!adapter) {
      errors.push(`/model_list/${i}/svc_params/model: unknown provider '${base.provider}' (known: ${[...providers.keys()].sort().join(", ")})`);
      continue;
    }
    const resolved = adapter.resolve ? adapter.resolve(base) : base;
    if (typeof resolved === "string") {
      errors.push(`/model_list/${i}/svc_params: ${resolved}`);
      continue;
    }
    const dup = seen.get(resolved.id);
    if (dup !== undefined) errors.push(`/model_list/${i}/model_info/id: '${resolved.id}' is already used by /model_list/${dup}`);
    seen.set(resolved.id, i);
    entries.push({ entry, deployment: resolved });
  }
  return new ModelTable(entries);
}

function pickCallbacks(names: string[], where: string, named: Map<string, LoggingCallback>, errors: string[]): LoggingCallback[] {
  const out: LoggingCallback[] = [];
  for (const [i, name] of names.entries()) {
    const cb = named.get(name);
    if (cb) out.push(cb);
    else errors.push(`${where}/${i}: no plugin provides a callback named '${name}' (known: ${[...named.keys()].join(", ") || "none"})`);
  }
  return out;
}

export async function buildSnapshot(config: GatewayConfig, configPath: string, version: number, log: Logger): Promise<Snapshot> {
  const settings = resolveSettings(config);
  const plugins = await loadPlugins(config, configPath, settings, log);
  const errors: string[] = [];
  const providers = collectProviders(plugins, errors);
  const models = buildModels(config.model_list, providers, errors);

  const named = new Map<string, LoggingCallback>();
  for (const p of plugins) for (const [name, cb] of Object.entries(p.hooks.callbacks ?? {})) named.set(name, cb);
  const s = config.svc_settings ?? {};
  const both = pickCallbacks(s.callbacks ?? [], "/svc_settings/callbacks", named, errors);
  const success = [...both, ...pickCallbacks(s.success_callback ?? [], "/svc_settings/success_callback", named, errors)];
  const failure = [...both, ...pickCallbacks(s.failure_callback ?? [], "/svc_settings/failure_callback", named, errors)];

  if (errors.length > 0) {
    await Promise.allSettled(plugins.map((p) => p.hooks.dispose?.()));
    throw new SnapshotError(errors);
  }
  const hooks = plugins.map((p) => p.hooks);
  return {
    version,
    loadedAt: Math.floor(Date.now() / 1000),
    config,
    settings,
    models,
    providers,
    auth: hooks.flatMap((h) => (h.auth ? [h.auth] : [])),
    rateLimiters: hooks.flatMap((h) => (h.rateLimiter ? [h.rateLimiter] : [])),
    budgets: hooks.flatMap((h) => (h.budget ? [h.budget] : [])),
    spend: hooks.flatMap((h) => (h.spend ? [h.spend] : [])),
    successCallbacks: [...new Set(success)],
    failureCallbacks: [...new Set(failure)],
    plugins,
  };
}
