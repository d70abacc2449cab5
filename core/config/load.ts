/** Reads config.yaml: YAML → `os.environ/NAME` substitution → full validation by path (off the serving thread: parse-thread.ts). */
import { KindGuard, type TObject, type TSchema } from "@sinclair/typebox";
import { TypeCompiler, type TypeCheck } from "@sinclair/typebox/compiler";
import { Value } from "@sinclair/typebox/value";
import { parse, YAMLParseError } from "yaml";
import { parseOffThread } from "./parse-thread.ts";
import { ConfigSchema, FORMAT_ERRORS, type GatewayConfig } from "./schema.ts";

export type ConfigResult =
  | {
      ok: true;
      config: GatewayConfig;
      warnings: string[];
      text: string;
      /** `environment_variables` not set by the environment itself: set them (`applyConfigEnv`) once the config is taken. */
      env: Record<string, string>;
    }
  | {
      ok: false;
      errors: string[];
      /**
       * The parts of the file the schema accepts, for the registry build to check too (`refusalErrors`
       * in live.ts), so one start or reload lists every problem; absent when the file is no mapping,
       * or its plugins are invalid (what they provide cannot be checked without them).
       */
      usable?: { config: GatewayConfig; env: Record<string, string> };
    };

const ENV_REF = /^os\.environ\/([A-Za-z_][A-Za-z0-9_]*)$/;

const RENAMED: Record<string, string> = {
  litellm_params: "svc_params",
  litellm_settings: "svc_settings",
};

/**
 * The `environment_variables` a config has set in the process (name → the value it set), kept by
 * the live registry across reloads: a later config may change or drop them. The environment's own
 * variables (set before a config set them, or since) are never touched.
 */
export type ConfigEnv = Map<string, string>;

/**
 * `name`'s value in the environment, unless it is the one a config set. An empty variable counts as
 * unset, as it does for the run interface's variables: Docker Compose's `NAME=${NAME}` gives one.
 */
function environmentOwn(name: string, configSet: ReadonlyMap<string, string>): string | undefined {
  const v = process.env[name];
  return v === undefined || v === "" || configSet.get(name) === v ? undefined : v;
}

/** Why an `os.environ/NAME` reference has no value. */
export const unsetVariable = (name: string): string => `environment variable ${name} is ${process.env[name] === "" ? "empty" : "not set"}`;

/**
 * An `environment_variables` value as the variable's text: a number or true/false is set as LiteLLM
 * sets it (Python's `str(value)`: `4` is "4", `true` is "True"), so a LiteLLM config with unquoted
 * numbers loads; anything else is left to the schema to refuse.
 */
function envText(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (typeof v === "boolean") return v ? "True" : "False";
  return typeof v === "number" && Number.isFinite(v) ? String(v) : undefined;
}

/** Pass-through header values: read where the endpoints are built, `os.environ/NAME` anywhere in the text, an unset one an error. */
const PASS_THROUGH_HEADER = /^\/general_settings\/pass_through_endpoints\/\d+\/headers\/[^/]+$/;

/** Replaces every `os.environ/NAME` string; unset variables drop the field and are reported. */
function substituteEnv(value: unknown, path: string, warnings: string[], fileEnv: Record<string, string>, configSet: ReadonlyMap<string, string>): unknown {
  if (typeof value === "string") {
    if (PASS_THROUGH_HEADER.test(path)) return value;
    const ref = ENV_REF.exec(value);
    if (!ref) return value;
    const resolved = environmentOwn(ref[1]!, configSet) ?? (fileEnv[ref[1]!] || undefined);
    if (resolved === undefined) warnings.push(`${path}: ${unsetVariable(ref[1]!)}`);
    return resolved;
  }
  if (Array.isArray(value)) return value.map((v, i) => substituteEnv(v, `${path}/${i}`, warnings, fileEnv, configSet));
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      const resolved = substituteEnv(v, `${path}/${k}`, warnings, fileEnv, configSet);
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
    const format = typeof e.schema.format === "string" && e.message.endsWith("format") ? FORMAT_ERRORS[e.schema.format] : undefined;
    // A key a record refuses (a header name) fails a Never schema: to the operator, an unexpected property.
    const message = e.message === "Never" ? "Unexpected property" : (format ?? e.message);
    const hint = message === "Unexpected property" && RENAMED[key] ? ` (use ${RENAMED[key]})` : "";
    const expected = typeof e.schema.description === "string" ? ` (expected ${e.schema.description})` : "";
    out.push(`${prefix}${e.path || "/"}: ${message}${expected}${hint}`);
  }
  return [...new Set(out)];
}

/**
 * A YAML error's message and position, without the excerpt of the file the parser appends: the
 * line may hold a key or a password, and the error is printed and logged.
 */
function yamlErrorText(err: unknown): string {
  // Where the parser runs out of stack depends on how deep the stack already is: no position, so a start and a reload say the same.
  if (err instanceof RangeError || (err instanceof YAMLParseError && err.code === "RESOURCE_EXHAUSTION")) return "the file nests too deeply to be read (thousands of levels)";
  if (err instanceof ReferenceError && err.message.startsWith("Excessive alias count")) {
    return `aliases repeat one anchor more than ${MAX_ALIAS_COUNT} times (nested repeats multiplied), which the parser refuses as a file that expands without bound`;
  }
  // A merge key (`<<`) whose value is not a mapping or an alias of one.
  if (!(err instanceof YAMLParseError)) return err instanceof Error ? err.message : String(err);
  const pos = err.linePos?.[0];
  const where = pos ? ` at line ${pos.line}, column ${pos.col}` : "";
  if (err.code === "MULTIPLE_DOCS") return `the file holds more than one YAML document (a second '---'); config.yaml is one document${where}`;
  const first = err.message.split("\n")[0]!.replace(/:$/, "");
  return first.includes(" at line ") ? first : `${first}${where}`;
}

/**
 * How often one anchor may be repeated through aliases, nested repeats multiplied (the parser's
 * guard against a file that expands without bound, "billion laughs"). Its default, 100, refused a
 * model list of a hundred entries sharing `svc_params: *base`.
 */
export const MAX_ALIAS_COUNT = 10_000;

/**
 * The file's YAML. Merge keys (`<<: *base`) merge as YAML 1.1 has them, as LiteLLM's parser does:
 * otherwise `<<` was read as a key of its own, and an entry built on a base lost its api_base and
 * api_key (its calls went to the provider's public API with the environment's key).
 */
function parseYaml(text: string): unknown {
  return parse(text, { merge: true, maxAliasCount: MAX_ALIAS_COUNT });
}

/**
 * ConfigSchema compiled, once: a valid file (nearly every one) is checked by it alone, and only a
 * refused one walks the schema again for its errors (Value.Errors, several times slower).
 */
let configCheck: TypeCheck<typeof ConfigSchema> | undefined;
function configErrors(value: unknown): string[] {
  configCheck ??= TypeCompiler.Compile(ConfigSchema);
  return configCheck.Check(value) ? [] : schemaErrors(ConfigSchema, value);
}

/** `configSet`: the variables the serving config set (`ConfigEnv`), read as this file sets them, or as unset when it does not. */
export function parseConfig(text: string, configSet: ReadonlyMap<string, string> = new Map()): ConfigResult {
  let raw: unknown;
  try {
    raw = parseYaml(text) ?? {};
  } catch (err) {
    return { ok: false, errors: [`YAML syntax error: ${yamlErrorText(err)}`] };
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    return { ok: false, errors: ["/: the config must be a YAML mapping"] };
  }
  // Not set here: a file that is refused (here, or later by the registry build) must change nothing.
  const env: Record<string, string> = {};
  const envVars = (raw as Record<string, unknown>).environment_variables;
  if (envVars && typeof envVars === "object") {
    for (const [k, v] of Object.entries(envVars)) {
      const text = envText(v);
      if (text !== undefined && environmentOwn(k, configSet) === undefined) env[k] = text;
    }
  }
  const warnings: string[] = [];
  const substituted = substituteEnv(raw, "", warnings, env, configSet) as Record<string, unknown>;
  withoutEmptySections(ConfigSchema, substituted);
  // Only a missing (or empty) model_list is empty: one written as a mapping (the entries without their dashes) is an error.
  if (substituted.model_list === undefined || substituted.model_list === null) substituted.model_list = [];
  // No Value.Default: ConfigSchema declares no default (the code that reads a setting knows it), and
  // walking it cost a fifth of a large file's reading.
  const errors = configErrors(substituted);
  // A refused file's unset variables are listed with its errors: a required field they dropped is
  // otherwise reported missing though the file plainly has it.
  if (errors.length > 0) return { ok: false, errors: [...errors, ...warnings], usable: usablePart(substituted, env) };
  return { ok: true, config: substituted as GatewayConfig, warnings, text, env };
}

const isMapping = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * Drops the optional mappings and lists of `value` (an object of `schema`) written empty: a section
 * whose keys are all commented out (`router_settings:`, an entry's `model_info:`) is YAML null,
 * which LiteLLM reads as absent. A scalar written empty is left for the schema to refuse.
 */
function withoutEmptySections(schema: TObject, value: Record<string, unknown>): void {
  for (const [key, field] of Object.entries(schema.properties)) {
    const v = value[key];
    if (v === null && KindGuard.IsOptional(field) && (KindGuard.IsObject(field) || KindGuard.IsRecord(field) || KindGuard.IsArray(field))) delete value[key];
    else if (KindGuard.IsObject(field) && isMapping(v)) withoutEmptySections(field, v);
    else if (KindGuard.IsArray(field) && KindGuard.IsObject(field.items) && Array.isArray(v)) for (const item of v) if (isMapping(item)) withoutEmptySections(field.items, item);
  }
}

/**
 * What the schema accepts of `value` (an object of `schema`): each known field that is valid on its
 * own; a list of mappings (model_list, pass_through_endpoints) keeps its valid entries at their own
 * index (a sparse list), so the registry's errors name the file's paths; a mapping is pruned the same
 * way, any other field is kept whole or dropped.
 */
function prune(schema: TObject, value: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, field] of Object.entries(schema.properties)) {
    const v = value[key];
    if (v === undefined) continue;
    if (Value.Check(field, v)) out[key] = v;
    else if (KindGuard.IsArray(field) && KindGuard.IsObject(field.items) && Array.isArray(v)) {
      const kept: unknown[] = [];
      for (const [i, item] of (v as unknown[]).entries()) if (Value.Check(field.items, item)) kept[i] = item;
      out[key] = kept;
    } else if (KindGuard.IsObject(field) && isMapping(v)) out[key] = prune(field, v);
  }
  return out;
}

function usablePart(value: Record<string, unknown>, env: Record<string, string>): { config: GatewayConfig; env: Record<string, string> } | undefined {
  const plugins = ConfigSchema.properties.plugins;
  if (value.plugins !== undefined && !Value.Check(plugins, value.plugins)) return undefined;
  return { config: { model_list: [], ...prune(ConfigSchema, value) } as GatewayConfig, env };
}

/**
 * Sets a config's `environment_variables` that the environment lacks (providers and plugins read
 * them, e.g. `OPENAI_API_KEY`), recorded in `configSet`. Those the previous config set (in
 * `configSet`) take this config's value, or, when it no longer sets them, are restored to what
 * they were before a config set them: unset. Returns what takes this back, for a config the build
 * refuses.
 */
export function applyConfigEnv(env: Record<string, string>, configSet: ConfigEnv = new Map()): () => void {
  const previous = new Map(configSet);
  /** Variables changed here (each once): the value before, and the one set. */
  const changed = new Map<string, { before: string | undefined; after: string | undefined }>();
  const put = (k: string, v: string | undefined) => {
    changed.set(k, { before: process.env[k], after: v });
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  };
  for (const [k, v] of previous) {
    if (Object.hasOwn(env, k)) continue;
    // Still the value it set: unset, as before it was set (changed since by someone else: theirs, left alone).
    if (process.env[k] === v) put(k, undefined);
    configSet.delete(k);
  }
  for (const [k, v] of Object.entries(env)) {
    const current = process.env[k];
    // An empty variable is one the environment lacks (environmentOwn).
    if (current !== undefined && current !== "" && previous.get(k) !== current) continue;
    if (current !== v) put(k, v);
    configSet.set(k, v);
  }
  return () => {
    for (const [k, { before, after }] of changed) {
      if (process.env[k] !== after) continue;
      if (before === undefined) delete process.env[k];
      else process.env[k] = before;
    }
    configSet.clear();
    for (const [k, v] of previous) configSet.set(k, v);
  };
}

/** The file at `path`, read and checked off the serving thread (parseOffThread): what parseConfig makes of it. */
export async function readConfig(path: string, configSet: ReadonlyMap<string, string> = new Map()): Promise<ConfigResult> {
  const file = Bun.file(path);
  if (!(await file.exists())) return { ok: false, errors: [`config file not found: ${path}`] };
  let text: string;
  try {
    text = await file.text();
  } catch (err) {
    // Unreadable (mode 000, a folder in its place): refused like an invalid file, not thrown past the reload's log.
    const code = (err as NodeJS.ErrnoException).code;
    return { ok: false, errors: [`cannot read config file ${path}: ${code ?? (err instanceof Error ? err.message : String(err))}`] };
  }
  return parseOffThread(text, configSet);
}
