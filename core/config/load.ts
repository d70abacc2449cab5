/** Reads config.yaml: YAML → `os.environ/NAME` substitution → defaults → full validation by path. */
import type { TSchema } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { parse, YAMLParseError } from "yaml";
import { ConfigSchema, type GatewayConfig } from "./schema.ts";

export type ConfigResult =
  | {
      ok: true;
      config: GatewayConfig;
      warnings: string[];
      text: string;
      /** `environment_variables` not set in the environment: set them (`applyConfigEnv`) once the config is taken. */
      env: Record<string, string>;
    }
  | { ok: false; errors: string[] };

const ENV_REF = /^os\.environ\/([A-Za-z_][A-Za-z0-9_]*)$/;

const RENAMED: Record<string, string> = {
  litellm_params: "svc_params",
  litellm_settings: "svc_settings",
};

/** Replaces every `os.environ/NAME` string; unset variables drop the field and are reported. */
function substituteEnv(value: unknown, path: string, warnings: string[], fileEnv: Record<string, string>): unknown {
  if (typeof value === "string") {
    const ref = ENV_REF.exec(value);
    if (!ref) return value;
    const resolved = process.env[ref[1]!] ?? fileEnv[ref[1]!];
    if (resolved === undefined) warnings.push(`${path}: environment variable ${ref[1]} is not set`);
    return resolved;
  }
  if (Array.isArray(value)) return value.map((v, i) => substituteEnv(v, `${path}/${i}`, warnings, fileEnv));
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      const resolved = substituteEnv(v, `${path}/${k}`, warnings, fileEnv);
      if (resolved !== undefined) out[k] = resolved;
    }
    return out;
  }
  return value;
}

/** Every schema violation, one line each, with its JSON-pointer path. */
export function schemaErrors(schema: TSchema, value: unknown, prefix = ""): string[] {
  const out: string[] = [];
  for (const e of Value.Errors(schema, value)) {
    const key = e.path.split("/").pop() ?? "";
    const hint = e.message === "Unexpected property" && RENAMED[key] ? ` (use ${RENAMED[key]})` : "";
    const expected = typeof e.schema.description === "string" ? ` (expected ${e.schema.description})` : "";
    out.push(`${prefix}${e.path || "/"}: ${e.message}${expected}${hint}`);
  }
  return [...new Set(out)];
}

export function parseConfig(text: string): ConfigResult {
  let raw: unknown;
  try {
    raw = parse(text) ?? {};
  } catch (err) {
    const msg = err instanceof YAMLParseError ? err.message : String(err);
    return { ok: false, errors: [`YAML syntax error: ${msg}`] };
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    return { ok: false, errors: ["/: the config must be a YAML mapping"] };
  }
  // Not set here: a file that is refused (here, or later by the registry build) must change nothing.
  const env: Record<string, string> = {};
  const envVars = (raw as Record<string, unknown>).environment_variables;
  if (envVars && typeof envVars === "object") {
    for (const [k, v] of Object.entries(envVars)) if (typeof v === "string" && process.env[k] === undefined) env[k] = v;
  }
  const warnings: string[] = [];
  const substituted = substituteEnv(raw, "", warnings, env);
  const withDefaults = Value.Default(ConfigSchema, substituted);
  const errors = schemaErrors(ConfigSchema, withDefaults);
  if (errors.length > 0) return { ok: false, errors };
  return { ok: true, config: withDefaults as GatewayConfig, warnings, text, env };
}

/**
 * Sets a config's `environment_variables` that the environment lacks (providers and plugins read
 * them, e.g. `OPENAI_API_KEY`); returns what takes them back, for a config the build refuses.
 */
export function applyConfigEnv(env: Record<string, string>): () => void {
  const set = Object.entries(env).filter(([k]) => process.env[k] === undefined);
  for (const [k, v] of set) process.env[k] = v;
  return () => {
    for (const [k, v] of set) if (process.env[k] === v) delete process.env[k];
  };
}

export async function readConfig(path: string): Promise<ConfigResult> {
  const file = Bun.file(path);
  if (!(await file.exists())) return { ok: false, errors: [`config file not found: ${path}`] };
  return parseConfig(await file.text());
}
