/** Loading plugins: the built-ins, and third-party modules named by path in config.yaml. */
import { dirname, isAbsolute, resolve } from "node:path";
import { Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import builtinProviders from "../providers/index.ts";
import authMasterKey from "../plugins/auth-master-key.ts";
import authVirtualKeys from "../plugins/auth-virtual-keys.ts";
import budgets from "../plugins/budgets.ts";
import rateLimits from "../plugins/rate-limits.ts";
import teamWebhooks from "../plugins/team-webhooks.ts";
import { schemaErrors } from "./config/load.ts";
import { definePlugin, type Hooks, type PluginContext, type PluginDef } from "./contract.ts";

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

export async function importPlugin(path: string, configPath: string): Promise<PluginDef> {
  const abs = isAbsolute(path) ? path : resolve(dirname(configPath), path);
  const file = Bun.file(abs);
  if (!(await file.exists())) throw new Error(`plugin file not found: ${abs}`);
  // The query makes an edited plugin file load anew on reload instead of from the module cache.
  const mod = (await import(`${abs}?v=${file.lastModified}`)) as { default?: unknown };
  const exported = typeof mod.default === "function" ? (mod.default as (h: PluginHost) => unknown)({ definePlugin, Type }) : mod.default;
  if (!isPluginDef(exported)) throw new Error(`${abs} does not default-export a plugin (definePlugin({...}))`);
  return exported;
}

export interface LoadedPlugin {
  name: string;
  hooks: Hooks;
}

/** Validates a plugin's config against its own schema, then runs its setup. */
export async function setupPlugin(plugin: PluginDef, rawConfig: unknown, ctx: PluginContext, where: string): Promise<LoadedPlugin> {
  const cfg = Value.Default(plugin.config, Value.Clone(rawConfig ?? {}));
  const errors = schemaErrors(plugin.config, cfg, `${where}`);
  if (errors.length > 0) throw new AggregateError([], errors.map((e) => `plugin ${plugin.name}: ${e}`).join("\n"));
  return { name: plugin.name, hooks: await plugin.setup(cfg, ctx) };
}
