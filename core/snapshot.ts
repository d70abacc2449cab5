/**
 * An immutable registry snapshot: everything one config version serves with. A request pins the
 * snapshot it started on; a reload builds a new one and swaps a single reference.
 */
import { dirname, isAbsolute, resolve } from "node:path";
import type { AccessGroupLookup, GroupAliases } from "./access.ts";
import type { CacheSettings } from "./cache/controls.ts";
import { type CacheStore, MemoryCache } from "./cache/store.ts";
import { type GatewayConfig, MAX_REQUEST_MB, type ModelEntry } from "./config/schema.ts";
import type {
  AuthResolver,
  BudgetChecker,
  CallIntent,
  Denied,
  Deployment,
  Lease,
  Logger,
  LoggingCallback,
  PluginContext,
  ProviderAdapter,
  RateLimiter,
  RateWindows,
  SpendRecorder,
  TeamRow,
} from "./contract.ts";
import { PriceTable } from "./cost/prices.ts";
import { Pricing } from "./cost/pricing.ts";
import type { IdentityCache } from "./identity/cache.ts";
import { LocalWindows } from "./limits/local-windows.ts";
import { ModelTable, toDeployment } from "./models.ts";
import { buildPassThrough, type PassThroughTable } from "./pass-through/table.ts";
import type { ClientCredentialSettings } from "./pipeline/client-credentials.ts";
import { BUILTIN_PLUGINS, importPlugin, type LoadedPlugin, PluginError, setupPlugin } from "./plugins.ts";
import type { CooldownShare } from "./router/cooldown-bus.ts";
import type { HostServices, SpendLog } from "./services.ts";

export interface Settings extends ClientCredentialSettings {
  masterKey: string | undefined;
  /** Seconds before an upstream call is abandoned with 408. */
  requestTimeout: number;
  dropParams: boolean;
  /** `general_settings.store_prompts_in_spend_logs`: the prompt and the answer go into the call's log row. */
  storePrompts: boolean;
  /** Larger request bodies are a 413: `general_settings.max_request_size_mb` (validated at most MAX_REQUEST_MB), in bytes. */
  maxRequestBytes: number;
}

/** One check a call passes before it goes upstream: a lease to settle when it ends, or a refusal. */
export type Gate = (intent: CallIntent) => Lease | Denied | Promise<Lease | Denied>;

export interface Snapshot {
  readonly version: number;
  readonly loadedAt: number;
  readonly config: GatewayConfig;
  readonly settings: Settings;
  readonly models: ModelTable;
  /** Prices per deployment: the bundled table, the operator's price file, model_info overrides. */
  readonly pricing: Pricing;
  readonly accessGroups: AccessGroupLookup;
  readonly groupAliases: GroupAliases;
  readonly providers: ReadonlyMap<string, ProviderAdapter>;
  readonly auth: readonly AuthResolver[];
  readonly rateLimiters: readonly RateLimiter[];
  readonly budgets: readonly BudgetChecker[];
  /** The rate limiters as checks a call passes in order (built once per snapshot); then the budgets'. */
  readonly limitGates: readonly Gate[];
  readonly budgetGates: readonly Gate[];
  readonly spend: readonly SpendRecorder[];
  readonly cache: ResponseCache;
  /** Rate-limit windows: the plugins' limits and the router's per-deployment rpm/tpm. */
  readonly rateWindows: RateWindows;
  /** Where the router tells other instances of a deployment it cooled down (with Redis). */
  readonly cooldowns?: CooldownShare;
  /** The store's spend log (absent without a store). */
  readonly spendLog?: SpendLog;
  /** The identity mirror's teams as they are now (absent without a store), not as a call's principal captured them. */
  readonly teams?: ReadonlyMap<string, TeamRow>;
  readonly successCallbacks: readonly LoggingCallback[];
  readonly failureCallbacks: readonly LoggingCallback[];
  readonly plugins: readonly LoadedPlugin[];
  /** `general_settings.pass_through_endpoints`. */
  readonly passThrough: PassThroughTable;
}

export class SnapshotError extends Error {
  constructor(readonly errors: string[]) {
    super(errors.join("\n"));
  }
}

const DEFAULT_REQUEST_TIMEOUT_S = 600;

/** Without host services (no store), limits still count: one window set for the process, kept across reloads. */
const processWindows = new LocalWindows();
/** The in-memory response cache outlives reloads too. */
const processCache = new MemoryCache();

export interface ResponseCache {
  settings: CacheSettings;
  store: CacheStore;
}

const DEFAULT_CACHE_TTL_S = 600;

function buildCache(config: GatewayConfig, services: HostServices, errors: string[]): ResponseCache {
  const s = config.svc_settings ?? {};
  const p = s.cache_params ?? {};
  if (p.type === "redis" && !services.redisCache) errors.push("/svc_settings/cache_params/type: 'redis' needs REDIS_URL (or general_settings.redis_url)");
  const store = p.type === "local" ? processCache : (services.redisCache ?? processCache);
  return {
    settings: { enabled: s.cache === true, defaultOn: p.mode !== "default_off", ttlMs: (p.ttl ?? DEFAULT_CACHE_TTL_S) * 1000, namespace: p.namespace },
    store,
  };
}

export function resolveSettings(config: GatewayConfig): Settings {
  return {
    masterKey: process.env.SVC_MASTER_KEY || config.general_settings?.master_key,
    requestTimeout: config.router_settings?.timeout ?? config.svc_settings?.request_timeout ?? DEFAULT_REQUEST_TIMEOUT_S,
    dropParams: config.svc_settings?.drop_params ?? false,
    storePrompts: config.general_settings?.store_prompts_in_spend_logs === true,
    maxRequestBytes: Math.floor((config.general_settings?.max_request_size_mb ?? MAX_REQUEST_MB) * 1024 * 1024),
    allowClientSideCredentials: config.svc_settings?.allow_client_side_credentials === true,
    clientSideApiBaseHosts: config.svc_settings?.client_side_api_base_hosts,
  };
}

/** The plugins that set up, and the errors of those that did not (listed with the rest of the file's). */
async function loadPlugins(config: GatewayConfig, configPath: string, settings: Settings, log: Logger, services: HostServices): Promise<{ loaded: LoadedPlugin[]; errors: string[] }> {
  const ctx: PluginContext = {
    log,
    settings: { masterKey: settings.masterKey, providerBudgets: config.router_settings?.provider_budget_config ?? {} },
    identity: services.identity,
    ledger: services.ledger,
    spendHistory: services.spendHistory,
    rateWindows: services.rateWindows ?? processWindows,
  };
  const errors: string[] = [];
  const loaded: LoadedPlugin[] = [];
  for (const plugin of BUILTIN_PLUGINS) loaded.push(await setupPlugin(plugin, {}, ctx, `/builtin/${plugin.name}`));
  for (const [i, entry] of (config.plugins ?? []).entries()) {
    if (entry === undefined) continue;
    try {
      const def = await importPlugin(entry.path, configPath);
      loaded.push(await setupPlugin(def, entry.config, ctx, `/plugins/${i}`));
    } catch (err) {
      if (err instanceof PluginError) errors.push(...err.problems);
      else errors.push(`/plugins/${i}/path: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  return { loaded, errors };
}

/**
 * The logging callbacks by name. A name two plugin entries provide (one plugin listed twice with two
 * destinations) is an error naming both: `svc_settings.callbacks` could enable only one of them,
 * and the other's destination would never get a call.
 */
function collectCallbacks(plugins: LoadedPlugin[], errors: string[]): Map<string, LoggingCallback> {
  const named = new Map<string, LoggingCallback>();
  const providedBy = new Map<string, LoadedPlugin>();
  for (const p of plugins) {
    for (const [name, cb] of Object.entries(p.hooks.callbacks ?? {})) {
      const first = providedBy.get(name);
      if (first) {
        errors.push(`${p.entry}: callback '${name}' is also provided by ${first.entry} (plugin ${first.name}): a callback name must come from one plugin entry`);
        continue;
      }
      named.set(name, cb);
      providedBy.set(name, p);
    }
  }
  return named;
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

/** A config entry → its resolved deployment, or the reason it cannot serve (`unknown`: no plugin provides its provider). */
function resolveEntry(entry: ModelEntry, providers: Map<string, ProviderAdapter>): Deployment | { field: string; message: string; unknown?: true } {
  const base = toDeployment(entry);
  const adapter = providers.get(base.provider);
  if (!adapter) return { field: "svc_params/model", message: `unknown provider '${base.provider}' (known: ${[...providers.keys()].sort().join(", ")})`, unknown: true };
  const resolved = adapter.resolve ? adapter.resolve(base) : base;
  return typeof resolved === "string" ? { field: "svc_params", message: resolved } : resolved;
}

/** `unknownNames`: where a model whose provider no plugin provides is reported (see assemble). */
function buildModels(list: ModelEntry[], providers: Map<string, ProviderAdapter>, errors: string[], unknownNames: string[], dbModels: ModelEntry[], log: Logger): ModelTable {
  const seen = new Map<string, string>();
  const entries: { entry: ModelEntry; deployment: Deployment }[] = [];
  for (const [i, entry] of list.entries()) {
    // A refused file's check leaves the entries the schema refused out, as holes at their index.
    if (entry === undefined) continue;
    const d = resolveEntry(entry, providers);
    if ("message" in d) {
      (d.unknown ? unknownNames : errors).push(`/model_list/${i}/${d.field}: ${d.message}`);
      continue;
    }
    const dup = seen.get(d.id);
    if (dup !== undefined) {
      // Without model_info.id the id is derived from the entry: an equal entry has the same one.
      if (entry.model_info?.id === undefined) errors.push(`/model_list/${i}: the same deployment as ${dup} (same model_name and svc_params, so the same derived id): give one of them a model_info.id`);
      else errors.push(`/model_list/${i}/model_info/id: '${d.id}' is already used by ${dup}`);
    }
    seen.set(d.id, `/model_list/${i}`);
    entries.push({ entry, deployment: d });
  }
  // A stored model that cannot load (its provider plugin was removed, its id now clashes with the
  // config) must not stop the config from loading: it is skipped with a warning.
  for (const entry of dbModels) {
    const d = resolveEntry(entry, providers);
    if ("message" in d) {
      log.warn("stored model skipped", { model_id: entry.model_info?.id, model_name: entry.model_name, problem: d.message });
      continue;
    }
    const clash = seen.get(d.id);
    if (clash !== undefined) {
      // /model/new refuses a config model's id, but the file may gain one later (here, or on
      // another instance whose file differs).
      log.warn(
        `stored model '${d.id}' is not served: config.yaml's model at ${clash} has the same id, and config.yaml wins. Delete the stored model (/model/delete) or give the config model another model_info.id.`,
        { model_id: d.id, stored_model_name: entry.model_name, config_entry: clash },
      );
      continue;
    }
    seen.set(d.id, `stored model ${d.id}`);
    entries.push({ entry, deployment: d });
  }
  return new ModelTable(entries);
}

function groupAliasesOf(config: GatewayConfig): GroupAliases {
  const out = new Map<string, { group: string; hidden: boolean }>();
  for (const [alias, to] of Object.entries(config.router_settings?.model_group_alias ?? {})) {
    out.set(alias, typeof to === "string" ? { group: to, hidden: false } : { group: to.model, hidden: to.hidden === true });
  }
  return out;
}

/** Access groups declared on deployments (`model_info.access_groups`, config and stored models): name → model names. */
export function declaredAccessGroups(models: ModelTable): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const { entry } of models.entries) {
    for (const group of entry.model_info?.access_groups ?? []) {
      const list = out.get(group) ?? [];
      if (!list.includes(entry.model_name)) list.push(entry.model_name);
      out.set(group, list);
    }
  }
  return out;
}

/** A stored group's models and those of the deployments that declare its name (either may be missing). */
export function groupModels(stored: readonly string[] | undefined, declared: readonly string[] | undefined): readonly string[] | undefined {
  if (!stored || !declared) return stored ?? declared;
  return [...new Set([...stored, ...declared])];
}

/**
 * Access groups by name and by stored id. A deployment that declares a stored group's name joins
 * that group (LiteLLM keeps groups on deployments): the group grants its stored models and the
 * declaring deployments' together, looked up by name or by id alike.
 */
function accessGroupLookup(models: ModelTable, identity: IdentityCache | undefined): AccessGroupLookup {
  const declared = declaredAccessGroups(models);
  return {
    byName: (name) => groupModels(identity?.accessGroupByName(name)?.modelNames, declared.get(name)),
    byId: (id) => {
      const row = identity?.accessGroups.get(id);
      return row && groupModels(row.modelNames, declared.get(row.accessGroupName));
    },
  };
}

/**
 * What answers to `name` as a model, for messages (`the model group 'gpt-4o'`): a model group, a
 * wildcard route's pattern, or a `model_group_alias`; undefined when nothing does. A `models` list
 * naming it means that model, so an access group of the same name would widen every such list.
 */
export function modelNamed(models: ModelTable, aliases: GroupAliases, name: string): string | undefined {
  if (models.groups.has(name)) return `the model group '${name}'`;
  if (models.wildcards.some((w) => w.pattern === name)) return `the wildcard route '${name}'`;
  const alias = aliases.get(name);
  return alias ? `the model_group_alias '${name}' (of ${alias.group})` : undefined;
}

/**
 * Access groups named like a model, which the management API refuses but config.yaml may bring (a
 * deployment's `model_info.access_groups`, or a model named like a stored group): taken, since the
 * file is the operator's and a stored group must not stop it from loading, and said, as a list
 * naming the name then gets the model and the group's models.
 */
function warnGroupsNamedLikeModels(models: ModelTable, aliases: GroupAliases, identity: IdentityCache | undefined, log: Logger): void {
  const names = new Set([...declaredAccessGroups(models).keys(), ...[...(identity?.accessGroups.values() ?? [])].map((g) => g.accessGroupName)]);
  for (const name of names) {
    const model = modelNamed(models, aliases, name);
    if (!model) continue;
    log.warn(`access group '${name}' has the name of ${model}: a key, team or organization listing '${name}' gets that model and the group's models. Rename the group (model_info.access_groups, or a stored group) or the model.`, {
      access_group: name,
    });
  }
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

function buildPricing(config: GatewayConfig, configPath: string, errors: string[]): Pricing {
  const file = config.svc_settings?.model_prices_path;
  if (!file) return new Pricing(new PriceTable());
  const path = isAbsolute(file) ? file : resolve(dirname(configPath), file);
  try {
    return new Pricing(new PriceTable(path));
  } catch (err) {
    errors.push(`/svc_settings/model_prices_path: cannot read ${path}: ${err instanceof Error ? err.message : String(err)}`);
    return new Pricing(new PriceTable());
  }
}

/** The stored model `s` serves as `id`, if it does (not a config.yaml model of that id). */
export function servedStoredDeployment(s: Snapshot, id: string): Deployment | undefined {
  const found = s.models.findById(id);
  return found && isStored(s, found.entry) ? found.deployment : undefined;
}

const isStored = (s: Snapshot, entry: ModelEntry): boolean => !s.config.model_list.includes(entry);

/** The ids of the stored models `s` serves (not config.yaml models of those ids). */
export function servedStoredIds(s: Snapshot): ReadonlySet<string> {
  return new Set(s.models.entries.filter((e) => isStored(s, e.entry)).map((e) => e.deployment.id));
}

/**
 * `servedStored`: the stored models the snapshot this one replaces serves (none at start). Ids, not
 * that snapshot: what the new one's closures keep would otherwise keep every snapshot before it.
 */
export async function buildSnapshot(
  config: GatewayConfig,
  configPath: string,
  version: number,
  log: Logger,
  services: HostServices = {},
  servedStored: ReadonlySet<string> = new Set(),
): Promise<Snapshot> {
  const settings = resolveSettings(config);
  const { loaded: plugins, errors: pluginErrors } = await loadPlugins(config, configPath, settings, log, services);
  try {
    return await assemble(config, configPath, version, log, services, settings, plugins, pluginErrors, servedStored);
  } catch (err) {
    // Refused or failed (the store unreachable, a stored model the new master key cannot read):
    // the plugins set up for it never serve, and must not stay subscribed to identity changes.
    await Promise.allSettled(plugins.map((p) => p.hooks.dispose?.()));
    throw err;
  }
}

/**
 * The snapshot around its plugins; throws SnapshotError listing every problem: those of plugins
 * that did not set up too (before, they alone were listed, and the rest came up one run later).
 */
async function assemble(
  config: GatewayConfig,
  configPath: string,
  version: number,
  log: Logger,
  services: HostServices,
  settings: Settings,
  plugins: LoadedPlugin[],
  pluginErrors: string[],
  servedStored: ReadonlySet<string>,
): Promise<Snapshot> {
  const errors: string[] = [...pluginErrors];
  // A plugin entry that failed (not found, not loaded, its config or setup refused) may be the one
  // that provides a provider or callback the file names: those names go unchecked until it loads,
  // rather than be reported unknown on top of its own error.
  const unknownNames = pluginErrors.length > 0 ? [] : errors;
  const providers = collectProviders(plugins, errors);
  const stored = (await services.loadDbModels?.(settings)) ?? { entries: [], unreadable: [] };
  const dbModels = stored.entries;
  for (const m of stored.unreadable) {
    const why = "its credentials cannot be decrypted with this config's key (SVC_SALT_KEY, or without it the master key, changed since it was stored)";
    const fix = "Set SVC_SALT_KEY to the key it was stored with, or store its credentials again with /model/update.";
    // At start the gateway serves the rest (it refused to start, saying only that a decryption
    // failed); a reload that would drop the model is refused, and the config serving it stays.
    // One the serving snapshot does not serve either (unreadable since start, or stored by an
    // instance with another key) is not dropped: refusing would freeze every later change.
    if (servedStored.has(m.id)) errors.push(`stored model '${m.id}' (${m.name}): ${why}. ${fix}`);
    else log.error(`stored model not served: ${why}. ${fix}`, { model_id: m.id, model_name: m.name });
  }
  const models = buildModels(config.model_list, providers, errors, unknownNames, dbModels, log);
  const groupAliases = groupAliasesOf(config);
  const pricing = buildPricing(config, configPath, errors);
  const cache = buildCache(config, services, errors);
  const passThrough = buildPassThrough(config.general_settings?.pass_through_endpoints, errors);

  const named = collectCallbacks(plugins, errors);
  const s = config.svc_settings ?? {};
  const both = pickCallbacks(s.callbacks ?? [], "/svc_settings/callbacks", named, unknownNames);
  const success = [...both, ...pickCallbacks(s.success_callback ?? [], "/svc_settings/success_callback", named, unknownNames)];
  const failure = [...both, ...pickCallbacks(s.failure_callback ?? [], "/svc_settings/failure_callback", named, unknownNames)];

  if (errors.length > 0) throw new SnapshotError(errors);
  warnGroupsNamedLikeModels(models, groupAliases, services.identity, log);
  const hooks = plugins.map((p) => p.hooks);
  const rateLimiters = hooks.flatMap((h) => (h.rateLimiter ? [h.rateLimiter] : []));
  const budgets = hooks.flatMap((h) => (h.budget ? [h.budget] : []));
  return {
    version,
    loadedAt: Math.floor(Date.now() / 1000),
    config,
    settings,
    models,
    pricing,
    accessGroups: accessGroupLookup(models, services.identity),
    groupAliases,
    providers,
    auth: hooks.flatMap((h) => (h.auth ? [h.auth] : [])),
    rateLimiters,
    budgets,
    limitGates: rateLimiters.map((r) => (i: CallIntent) => r.acquire(i)),
    budgetGates: budgets.map((b) => (i: CallIntent) => b.reserve(i)),
    spend: hooks.flatMap((h) => (h.spend ? [h.spend] : [])),
    rateWindows: services.rateWindows ?? processWindows,
    cooldowns: services.cooldowns,
    cache,
    spendLog: services.spendLog,
    teams: services.identity?.teams,
    successCallbacks: [...new Set(success)],
    failureCallbacks: [...new Set(failure)],
    plugins,
    passThrough,
  };
}
