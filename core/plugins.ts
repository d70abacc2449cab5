/** Loading plugins: the built-ins, and third-party modules named by path in config.yaml. */
import { dirname, isAbsolute, resolve } from "node:path";
import { Type } from "@sinclair/typebox";
import builtinProviders from "../providers/index.ts";
import authMasterKey from "../plugins/auth-master-key.ts";
import authVirtualKeys from "../plugins/auth-virtual-keys.ts";
import budgets from "../plugins/budgets.ts";
import rateLimits from "../plugins/rate-limits.ts";
import teamWebhooks from "../plugins/team-webhooks.ts";
import { schemaErrors } from "./config/load.ts";
import { definePlugin, type Hooks, type PluginContext, type PluginDef } from "./contract.ts";
import { withDefaults } from "./plugin-defaults.ts";
import { beforeTimeout } from "./timer.ts";

export const BUILTIN_PLUGINS: readonly PluginDef[] = [builtinProviders, authMasterKey, authVirtualKeys, rateLimits, budgets, teamWebhooks];

/** What a plugin module may default-export: a plugin, or a factory given the host's runtime. */
export type PluginModuleExport = PluginDef | ((host: PluginHost) => PluginDef);
export interface PluginHost {
  definePlugin: typeof definePlugin;
  Type: typeof Type;
}

function isPluginDef(v: unknown): v is PluginDef {
  if (v === null || typeof v !== "object") return false;
  const p = v as Record<string, unknown>;
  return typeof p.name === "string" && typeof p.setup === "function" && typeof p.config === "object";
}

/**
 * How long loading a plugin's module, then its setup, may each take. One that never ends would hold
 * the config being loaded, every reload and stored-model change after it (they run in turn), and
 * the gateway's stop. A test shortens them on this object.
 */
export const pluginTiming = { loadMs: 30_000, setupMs: 30_000 };

class LoadTimeout extends Error {}

/**
 * The plugin file at `abs`, if it is there. A path longer than the system takes (ENAMETOOLONG)
 * names no file either: its error's message cut the path at the system's limit, so where it was cut
 * depended on the folder of config.yaml, and a start and a reload said it differently.
 */
async function pluginFile(abs: string): Promise<Bun.BunFile | undefined> {
  try {
    const file = Bun.file(abs);
    return (await file.exists()) ? file : undefined;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENAMETOOLONG") return undefined;
    throw err;
  }
}

export async function importPlugin(path: string, configPath: string): Promise<PluginDef> {
  const abs = isAbsolute(path) ? path : resolve(dirname(configPath), path);
  const file = await pluginFile(abs);
  if (!file) throw new Error(`plugin file not found: ${abs}`);
  let mod: { default?: unknown };
  // The query makes an edited plugin file load anew on reload instead of from the module cache.
  const loading = import(`${abs}?v=${file.lastModified}`) as Promise<{ default?: unknown }>;
  try {
    // Top-level code that never ends (an await on a backend that never answers) is a load error,
    // as a setup that never ends is; should the module load later, it is not used.
    mod = await beforeTimeout(loading, pluginTiming.loadMs, () => new LoadTimeout(`${abs} did not finish loading within ${pluginTiming.loadMs / 1000} s (its top-level code is still running)`));
  } catch (err) {
    if (err instanceof LoadTimeout) throw err;
    throw new Error(`${abs} cannot be loaded: ${loadFailure(err)}`);
  }
  const exported = typeof mod.default === "function" ? (mod.default as (h: PluginHost) => unknown)({ definePlugin, Type }) : mod.default;
  if (!isPluginDef(exported)) throw new Error(`${abs} does not default-export a plugin (definePlugin({...}))`);
  return exported;
}

/**
 * Why a module did not load. Bun reports one that does not compile as an AggregateError ("109 errors
 * building …"): its first message and position say what (the line's text is left out: it may hold a secret).
 */
function loadFailure(err: unknown): string {
  const all = err instanceof AggregateError && err.errors.length > 0 ? err.errors : [err];
  const first = all[0] as { message?: unknown; position?: { line?: number; column?: number } | null } | null;
  const at = first?.position?.line ? ` at line ${first.position.line}, column ${first.position.column}` : "";
  const more = all.length > 1 ? ` (and ${all.length - 1} more)` : "";
  return `${String(first?.message ?? err)}${at}${more}`;
}

export interface LoadedPlugin {
  name: string;
  /** Where it is listed, for errors: `/plugins/<i>` (config.yaml), `/builtin/<name>`. */
  entry: string;
  hooks: Hooks;
}

/** Why a plugin entry cannot serve: one line per problem, as the config's errors are listed (each its own entry). */
export class PluginError extends Error {
  constructor(readonly problems: string[]) {
    super(problems.join("\n"));
  }
}

/** Fills in a plugin's config defaults, validates it against its own schema, then runs its setup (bounded by pluginTiming.setupMs). */
export async function setupPlugin(plugin: PluginDef, rawConfig: unknown, ctx: PluginContext, entry: string): Promise<LoadedPlugin> {
  const cfg = withDefaults(plugin.config, rawConfig ?? {});
  const errors = schemaErrors(plugin.config, cfg, `${entry}/config`);
  if (errors.length > 0) throw new PluginError(errors.map((e) => `${e} (plugin ${plugin.name})`));
  // A setup that throws at once fails as one that rejects: the plugin's entry is named, not its path.
  const setup = Promise.resolve().then(() => plugin.setup(cfg, ctx));
  const tooLate = () => new PluginError([`${entry}: plugin ${plugin.name}: its setup did not finish within ${pluginTiming.setupMs / 1000} s`]);
  try {
    // A setup that finishes after it was given up on serves nothing: its hooks are disposed.
    const hooks = await beforeTimeout(setup, pluginTiming.setupMs, tooLate, (late) => void Promise.resolve(late.dispose?.()).catch(() => undefined));
    return { name: plugin.name, entry, hooks };
  } catch (err) {
    if (err instanceof PluginError) throw err;
    throw new PluginError([`${entry}: plugin ${plugin.name}: setup failed: ${err instanceof Error ? err.message : String(err)}`]);
  }
}
