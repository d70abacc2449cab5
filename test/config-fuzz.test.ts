// config.yaml fuzzed, seeded random (CONFIG_FUZZ_SEED=<n> replays another run, CONFIG_FUZZ_CONFIGS=<n>
// sets how many files; every failure names the seed and the file's number, and prints its mutations
// and the file).
//
// Each file starts from one rich valid config (model groups of mock/, openai/ and plugin deployments,
// two wildcards, an embedding model, router_settings with fallbacks, retries, cooldowns and provider
// budgets, svc_settings with the cache and callbacks, general_settings with the master key from
// environment_variables, retention, an alert webhook and two pass-through endpoints, a plugin) and
// applies 1–3 random mutations: values a documented field allows at its edges (1e300, 0, 1e-9, 100y,
// other groups and upstreams); wrong types at random paths; out-of-range numbers (negative, 0,
// fractions where integers go, 1e309, .inf, .nan, numbers as text); odd strings (empty, line breaks,
// NUL, 10 kB, non-Latin text, URLs that do not parse, one with a password); unknown keys; missing
// fields; duplicate ids, entries and pass-through endpoints; header names and values HTTP cannot
// send; durations of 0 or beyond any date; `os.environ/` naming unset variables; hundreds of
// deployments; and YAML oddities (anchors and aliases, an alias bomb, several documents, tabs, broken
// quoting on a line that holds a secret, duplicate keys, nesting up to 20,000 deep, a document that is
// not a mapping, an empty file, CRLF, a BOM, tags). Once per run: a 5 MB file.
//
// Expectations come from the README (config.yaml, Hot reload, Routing, Response cache, Rate limits,
// Pass-through, Run interface), computed from the resulting file with the test's own YAML reading,
// not from the gateway's code:
// - the file is loaded as the gateway loads it at start (`Live.start`: read, validate, build the
//   registry; the process and a reload go the same way) and either refused with a non-empty list of
//   errors, each `<path>: <message>` whose path is in the file (or a field missing from a mapping
//   that is), or one YAML syntax error when the text is not one valid YAML document; never another
//   exception, never over 15 s; no error shows a secret of the file;
// - every documented field whose value is not what the README documents (type, range, a URL that
//   parses, a header HTTP can send, a duration from 1s to 100y, a price a call's cost can hold),
//   every missing required field, and, once the plugins load, every unknown provider or callback,
//   duplicate deployment, pass-through path and method or id served twice, unset or unsendable
//   variable in a pass-through header: the file is refused and an error names each, in one list;
// - a file with none of these is taken, and serves: /health/liveliness, /v1/models (exactly its
//   groups), /model/info, a JSON call to each group (up to 12; chat, or embeddings) and to a name each
//   wildcard matches, a stream, each pass-through endpoint; no 5xx but a 503 or 408 from an upstream
//   or target a mutation pointed elsewhere; every error in the envelope with its status as `code`;
//   without a master key, 401; no error logged, no secret in an answer or the log;
// - the same file as a reload of a gateway with a store serving the base config: refused with the
//   same errors while the base keeps serving (its models, a chat), or taken and serving as above
//   (and /config/pass_through_endpoint, /provider/budgets, /model/info answer 200), then a reload
//   back to the base is taken;
// - through the real process (`bun core/main.ts --config …`), the first refused file of each kind
//   (YAML, schema, registry, both): exit 1, "refusing to start", every error's path printed, nothing
//   secret, no listener; and one taken file: it serves as above and exits 0 on SIGTERM.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { cpSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { Document, isMap, isSeq, parse, parseAllDocuments, stringify } from "yaml";
import { createApp } from "../core/http/app.ts";
import { Live } from "../core/live.ts";
import { SnapshotError } from "../core/snapshot.ts";
import { initializedPgFolder, MASTER_KEY, memoryLogger, spawnGateway, startTestGateway, type TestGateway, tempDir } from "./harness/gateway.ts";
import { Random } from "./harness/random.ts";
import { type MockOpenAI, startMockOpenAI } from "./mock-upstream/openai.ts";

const SEED = Number(process.env.CONFIG_FUZZ_SEED ?? 20_261_127);
const CONFIGS = Number(process.env.CONFIG_FUZZ_CONFIGS ?? 300);
const HANG_MS = 15_000;
const ECHO_PLUGIN = resolve(import.meta.dir, "fixtures/plugins/echo.ts");

/** Every secret in the files contains this; no error, log line or output may. */
const SECRET_MARK = "fzsecret";
const UPSTREAM_KEY = `sk-0000-${SECRET_MARK}-upstream`;
const PT_SECRET = `pt-${SECRET_MARK}-token`;
const HEADER_SECRET = `hdr-${SECRET_MARK}-value`;
const URL_SECRET = `pw-${SECRET_MARK}`;
/** Variables the files set or name; cleared between gateways (a config's environment_variables stay in the process). */
const ENV_PREFIX = "FZ_";

type Json = Record<string, unknown>;
type Seg = string | number;

const failPrefix = (n: number) => `[CONFIG_FUZZ_SEED=${SEED}, config #${n}]`;

// ---- the base config

function baseConfig(mock: MockOpenAI): Json {
  return {
    model_list: [
      {
        model_name: "fz-chat",
        svc_params: { model: "mock/fz-chat", mock_response: "hello from the mock", rpm: 10_000, tpm: 10_000_000, weight: 2, timeout: 30, input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 },
        model_info: { id: "fz-chat-mock", access_groups: ["fz-group"] },
      },
      {
        model_name: "fz-chat",
        svc_params: { model: "openai/fz-up", api_base: mock.url, api_key: UPSTREAM_KEY, timeout: 30, stream_timeout: 30, rpm: 10_000, weight: 1, headers: { "x-fz-header": HEADER_SECRET } },
        model_info: { id: "fz-chat-openai", base_model: "gpt-4o-mini", input_cost_per_token: 0.000003, output_cost_per_token: 0.000004 },
      },
      { model_name: "fz-backup", svc_params: { model: "mock/fz-backup" }, model_info: { id: "fz-backup" } },
      { model_name: "fz-embed", svc_params: { model: "mock/text-embedding-3-small" }, model_info: { id: "fz-embed", mode: "embedding" } },
      { model_name: "fz-echo", svc_params: { model: "echo/fz" } },
      { model_name: "fzw/*", svc_params: { model: "openai/*", api_base: mock.url, api_key: UPSTREAM_KEY }, model_info: { id: "fz-wild-openai" } },
      { model_name: "fzm-*", svc_params: { model: "mock/*" } },
    ],
    router_settings: {
      routing_strategy: "simple-shuffle",
      num_retries: 1,
      max_retries: 1,
      retry_policy: { RateLimitErrorRetries: 1, TimeoutErrorRetries: 0 },
      model_group_retry_policy: { "fz-chat": { InternalServerErrorRetries: 2, max_retries: 2 } },
      timeout: 60,
      retry_after: 0,
      retry_initial_delay: 0.1,
      allowed_fails: 3,
      cooldown_time: 5,
      disable_cooldowns: false,
      fallbacks: [{ "fz-chat": ["fz-backup"] }],
      context_window_fallbacks: [{ "fz-chat": ["fz-backup"] }],
      content_policy_fallbacks: [{ "fz-chat": ["fz-backup"] }],
      default_fallbacks: ["fz-backup"],
      max_fallbacks: 2,
      provider_budget_config: { openai: { budget_limit: 100, time_period: "1d" }, mock: { budget_limit: 50, time_period: "30d" } },
    },
    svc_settings: {
      drop_params: true,
      num_retries: 1,
      request_timeout: 60,
      callbacks: ["echo-all"],
      success_callback: ["echo-success"],
      failure_callback: ["echo-failure"],
      cache: true,
      cache_params: { type: "local", ttl: 60, namespace: "fz", mode: "default_off" },
      allow_client_side_credentials: false,
      client_side_api_base_hosts: ["api.example.com"],
    },
    general_settings: {
      master_key: "os.environ/FZ_MASTER_KEY",
      max_request_size_mb: 10,
      alert_webhook_url: `${mock.url}/fz-alerts`,
      maximum_spend_logs_retention_period: "30d",
      maximum_spend_logs_retention_interval: "1d",
      store_prompts_in_spend_logs: false,
      disable_spend_logs: false,
      disable_error_logs: false,
      pass_through_endpoints: [
        { id: "fz-pt", path: "/fz/pt", target: `${mock.url}/chat/completions`, headers: { Authorization: "Bearer os.environ/FZ_PT_TOKEN" }, methods: ["POST"], cost_per_request: 0.001, timeout: 30 },
        { path: "/fz/sub", target: mock.url, include_subpath: true, forward_headers: false, auth: true },
      ],
    },
    environment_variables: { FZ_MASTER_KEY: MASTER_KEY, FZ_PT_TOKEN: PT_SECRET },
    plugins: [{ path: ECHO_PLUGIN, config: { sink: "config-fuzz", prefix: "echo: " } }],
  };
}

// ---- what the README documents for each field (the oracle of "must be refused")

type Rule =
  | "string"
  | "nonEmptyString"
  | "name"
  | "credential"
  | "url"
  | "providerModel"
  | "path"
  | "skKey"
  | "int>=0"
  | "int>=1"
  | "num>0"
  | "num>=0"
  | "perToken"
  | "perCall"
  | "bool"
  | "envText"
  | "duration"
  | "stringList"
  | "hostList"
  | "methods"
  | "strategy"
  | "cacheType"
  | "cacheMode"
  | "headers"
  | "map"
  | "list";

interface Spec {
  rule: Rule;
  required?: boolean;
}

const RETRY_POLICY_FIELDS = [
  "BadRequestErrorRetries",
  "AuthenticationErrorRetries",
  "TimeoutErrorRetries",
  "RateLimitErrorRetries",
  "InternalServerErrorRetries",
  "ContentPolicyViolationErrorRetries",
  "max_retries",
  "num_retries",
];
const FALLBACK_LISTS = ["fallbacks", "context_window_fallbacks", "content_policy_fallbacks"];

/** Path patterns (`*`: any key or index) → the documented shape of the value there. */
const SPECS: [string, Spec][] = [
  ["model_list", { rule: "list" }],
  ["model_list/*", { rule: "map" }],
  ["model_list/*/model_name", { rule: "name", required: true }],
  ["model_list/*/svc_params", { rule: "map", required: true }],
  ["model_list/*/svc_params/model", { rule: "providerModel", required: true }],
  ["model_list/*/svc_params/api_base", { rule: "url" }],
  ["model_list/*/svc_params/api_key", { rule: "credential" }],
  ["model_list/*/svc_params/api_version", { rule: "string" }],
  ["model_list/*/svc_params/timeout", { rule: "num>0" }],
  ["model_list/*/svc_params/stream_timeout", { rule: "num>0" }],
  ["model_list/*/svc_params/rpm", { rule: "int>=1" }],
  ["model_list/*/svc_params/tpm", { rule: "int>=1" }],
  ["model_list/*/svc_params/weight", { rule: "num>=0" }],
  ["model_list/*/svc_params/input_cost_per_token", { rule: "perToken" }],
  ["model_list/*/svc_params/output_cost_per_token", { rule: "perToken" }],
  ["model_list/*/svc_params/mock_response", { rule: "string" }],
  ["model_list/*/svc_params/headers", { rule: "headers" }],
  ["model_list/*/model_info", { rule: "map" }],
  ["model_list/*/model_info/id", { rule: "name" }],
  ["model_list/*/model_info/mode", { rule: "string" }],
  ["model_list/*/model_info/base_model", { rule: "string" }],
  ["model_list/*/model_info/input_cost_per_token", { rule: "perToken" }],
  ["model_list/*/model_info/output_cost_per_token", { rule: "perToken" }],
  ["model_list/*/model_info/access_groups", { rule: "stringList" }],
  ["router_settings", { rule: "map" }],
  ["router_settings/routing_strategy", { rule: "strategy" }],
  ["router_settings/num_retries", { rule: "int>=0" }],
  ["router_settings/max_retries", { rule: "int>=0" }],
  ["router_settings/timeout", { rule: "num>0" }],
  ["router_settings/retry_after", { rule: "num>=0" }],
  ["router_settings/retry_initial_delay", { rule: "num>=0" }],
  ["router_settings/allowed_fails", { rule: "int>=0" }],
  ["router_settings/cooldown_time", { rule: "num>=0" }],
  ["router_settings/disable_cooldowns", { rule: "bool" }],
  ["router_settings/default_fallbacks", { rule: "stringList" }],
  ["router_settings/max_fallbacks", { rule: "int>=0" }],
  ...FALLBACK_LISTS.flatMap((f): [string, Spec][] => [
    [`router_settings/${f}`, { rule: "list" }],
    [`router_settings/${f}/*`, { rule: "map" }],
    [`router_settings/${f}/*/*`, { rule: "stringList" }],
  ]),
  ["router_settings/retry_policy", { rule: "map" }],
  ...RETRY_POLICY_FIELDS.map((f): [string, Spec] => [`router_settings/retry_policy/${f}`, { rule: "int>=0" }]),
  ["router_settings/model_group_retry_policy", { rule: "map" }],
  ["router_settings/model_group_retry_policy/*", { rule: "map" }],
  ...RETRY_POLICY_FIELDS.map((f): [string, Spec] => [`router_settings/model_group_retry_policy/*/${f}`, { rule: "int>=0" }]),
  ["router_settings/provider_budget_config", { rule: "map" }],
  ["router_settings/provider_budget_config/*", { rule: "map" }],
  ["router_settings/provider_budget_config/*/budget_limit", { rule: "num>=0", required: true }],
  ["router_settings/provider_budget_config/*/time_period", { rule: "duration", required: true }],
  ["svc_settings", { rule: "map" }],
  ["svc_settings/drop_params", { rule: "bool" }],
  ["svc_settings/num_retries", { rule: "int>=0" }],
  ["svc_settings/request_timeout", { rule: "num>0" }],
  ["svc_settings/callbacks", { rule: "stringList" }],
  ["svc_settings/success_callback", { rule: "stringList" }],
  ["svc_settings/failure_callback", { rule: "stringList" }],
  ["svc_settings/cache", { rule: "bool" }],
  ["svc_settings/cache_params", { rule: "map" }],
  ["svc_settings/cache_params/type", { rule: "cacheType" }],
  ["svc_settings/cache_params/ttl", { rule: "num>0" }],
  ["svc_settings/cache_params/namespace", { rule: "string" }],
  ["svc_settings/cache_params/mode", { rule: "cacheMode" }],
  ["svc_settings/allow_client_side_credentials", { rule: "bool" }],
  ["svc_settings/client_side_api_base_hosts", { rule: "hostList" }],
  ["general_settings", { rule: "map" }],
  ["general_settings/master_key", { rule: "skKey" }],
  ["general_settings/max_request_size_mb", { rule: "num>0" }],
  ["general_settings/maximum_spend_logs_retention_period", { rule: "duration" }],
  ["general_settings/maximum_spend_logs_retention_interval", { rule: "duration" }],
  ["general_settings/store_prompts_in_spend_logs", { rule: "bool" }],
  ["general_settings/disable_spend_logs", { rule: "bool" }],
  ["general_settings/disable_error_logs", { rule: "bool" }],
  ["general_settings/alert_webhook_url", { rule: "url" }],
  ["general_settings/pass_through_endpoints", { rule: "list" }],
  ["general_settings/pass_through_endpoints/*", { rule: "map" }],
  ["general_settings/pass_through_endpoints/*/id", { rule: "nonEmptyString" }],
  ["general_settings/pass_through_endpoints/*/path", { rule: "path", required: true }],
  ["general_settings/pass_through_endpoints/*/target", { rule: "url", required: true }],
  ["general_settings/pass_through_endpoints/*/headers", { rule: "headers" }],
  ["general_settings/pass_through_endpoints/*/forward_headers", { rule: "bool" }],
  ["general_settings/pass_through_endpoints/*/include_subpath", { rule: "bool" }],
  ["general_settings/pass_through_endpoints/*/cost_per_request", { rule: "perCall" }],
  ["general_settings/pass_through_endpoints/*/auth", { rule: "bool" }],
  ["general_settings/pass_through_endpoints/*/methods", { rule: "methods" }],
  ["general_settings/pass_through_endpoints/*/timeout", { rule: "num>0" }],
  ["plugins", { rule: "list" }],
  ["plugins/*", { rule: "map" }],
  ["plugins/*/path", { rule: "nonEmptyString", required: true }],
  ["plugins/*/config", { rule: "map" }],
  ["environment_variables", { rule: "map" }],
  ["environment_variables/*", { rule: "envText" }],
];

const matches = (pattern: string, path: readonly Seg[]) => {
  const parts = pattern.split("/");
  return parts.length === path.length && parts.every((p, i) => p === "*" || p === String(path[i]));
};

function specAt(path: readonly Seg[]): Spec | undefined {
  return SPECS.find(([pattern]) => matches(pattern, path))?.[1];
}

const SECTION_RULES = new Set<Rule>(["map", "list", "stringList", "hostList", "methods", "headers"]);

/** README: an optional mapping or list field written empty (YAML null, its keys commented out) is absent; not a list item or a mapping's value. */
function emptySection(path: readonly Seg[], v: unknown): boolean {
  const found = SPECS.find(([pattern]) => matches(pattern, path));
  return v === null && found !== undefined && !found[1].required && SECTION_RULES.has(found[1].rule) && !found[0].endsWith("*");
}

const isObj = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const isNum = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
/** A header name HTTP can send (RFC 9110 token), and a value fetch sends: Latin-1, without CR, LF or NUL. */
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const headerValueOk = (v: string) => !/[\r\n\0\u0100-\uffff]/.test(v.replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, ""));
const DURATION = /^(\d+)\s*(s|m|h|d|w|mo|y)$/;
/** Durations the README allows: a count > 0 of a unit, at most 100 years (a period past year 275760 is no date). */
function durationOk(v: unknown): boolean {
  if (typeof v !== "string") return false;
  const m = DURATION.exec(v.trim());
  if (!m) return false;
  const days = { s: 1 / 86_400, m: 1 / 1440, h: 1 / 24, d: 1, w: 7, mo: 30, y: 365 }[m[2] as "s"]!;
  const n = Number(m[1]);
  return n > 0 && n * days <= 36_500;
}
function urlOk(v: unknown): boolean {
  if (typeof v !== "string" || !/^https?:\/\//.test(v)) return false;
  try {
    new URL(v);
    return true;
  } catch {
    return false;
  }
}

/** Whether `v` is what the README documents for `rule`. */
function valid(rule: Rule, v: unknown): boolean {
  switch (rule) {
    case "string":
      return typeof v === "string";
    case "nonEmptyString":
      return typeof v === "string" && v.length > 0;
    case "name":
      // Sent back in x-svc-model-group / x-svc-model-id (percent-encoded beyond Latin-1): any text but control characters.
      // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what is looked for
      return typeof v === "string" && v.length > 0 && !/[\u0000-\u001f\u007f]/.test(v);
    case "credential":
      return typeof v === "string" && headerValueOk(v);
    case "url":
      return urlOk(v);
    case "providerModel":
      return typeof v === "string" && /^[^/\s]+\/\S+$/.test(v);
    case "path":
      return typeof v === "string" && /^\/[^?#\s]*$/.test(v);
    case "skKey":
      return typeof v === "string" && v.startsWith("sk-");
    case "int>=0":
      return isNum(v) && Number.isInteger(v) && v >= 0;
    case "int>=1":
      return isNum(v) && Number.isInteger(v) && v >= 1;
    case "num>0":
      return isNum(v) && v > 0;
    case "num>=0":
      return isNum(v) && v >= 0;
    // Prices: at most $1 a token, $1,000,000 a pass-through call (one call's cost must fit the spend log).
    case "perToken":
      return isNum(v) && v >= 0 && v <= 1;
    case "perCall":
      return isNum(v) && v >= 0 && v <= 1_000_000;
    case "bool":
      return typeof v === "boolean";
    case "envText":
      return envText(v) !== undefined;
    case "duration":
      return durationOk(v);
    case "stringList":
      return Array.isArray(v) && v.every((x) => typeof x === "string");
    case "hostList":
      return Array.isArray(v) && v.every((x) => typeof x === "string" && x.length > 0);
    case "methods":
      return Array.isArray(v) && v.length > 0 && v.every((x) => ["GET", "POST", "PUT", "PATCH", "DELETE"].includes(x as string));
    case "strategy":
      return ["simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing", "usage-based-routing-v2", "cost-based-routing"].includes(v as string);
    case "cacheType":
      return v === "local" || v === "redis";
    case "cacheMode":
      return v === "default_on" || v === "default_off";
    case "headers":
      return isObj(v) && Object.entries(v).every(([k, x]) => HEADER_NAME.test(k) && (x === undefined || (typeof x === "string" && headerValueOk(x))));
    case "map":
      return isObj(v);
    case "list":
      return Array.isArray(v);
  }
}

/** The providers the README lists, and the fixture plugin's. */
const PROVIDERS = new Set(
  (
    "mock openai groq mistral codestral deepseek together_ai fireworks_ai openrouter xai perplexity deepinfra cerebras sambanova nvidia_nim github nebius novita hyperbolic " +
    "moonshot dashscope volcengine lambda_ai featherless_ai friendliai nscale ai21 huggingface meta_llama vercel_ai_gateway zai wandb baseten xinference azure_ai lm_studio " +
    "llamafile hosted_vllm databricks cloudflare openai_like custom_openai anthropic gemini vertex_ai bedrock azure cohere ollama"
  ).split(" "),
);
const ECHO_CALLBACKS = new Set(["echo-all", "echo-success", "echo-failure"]);
/** Providers with no default address: they need svc_params.api_base. */
const NEEDS_API_BASE = new Set(["hosted_vllm", "openai_like", "custom_openai", "xinference", "lm_studio", "llamafile", "databricks", "cloudflare", "azure_ai", "azure", "baseten"]);

const ENV_ANYWHERE = /os\.environ\/([A-Za-z_][A-Za-z0-9_]*)/g;

/**
 * The paths a refusal must name for the document `doc`, by the README: documented fields with a
 * value outside what it documents (after `os.environ/` is read), required fields missing, and, where
 * the plugins load, what the registry checks (unknown providers and callbacks, duplicate deployments,
 * pass-through endpoints sharing a path and method or an id, unset variables in their headers).
 * Empty: the file must be taken.
 */
function violations(doc: unknown): string[] {
  if (!isObj(doc)) return ["/"];
  const out: string[] = [];
  const env = (v: unknown) => envValue(doc, v);
  const all = paths(doc);
  for (const path of all) {
    const spec = specAt(path);
    if (!spec) continue;
    let v = env(get(doc, path));
    if (spec.rule === "headers" && isObj(v)) v = Object.fromEntries(Object.entries(v).map(([k, x]) => [k, env(x)]));
    if (v === undefined || emptySection(path, v)) {
      if (spec.required) out.push(pointer(path));
    } else if (!valid(spec.rule, v)) out.push(pointer(path));
  }
  // Required fields that are missing.
  for (const [pattern, spec] of SPECS) {
    if (!spec.required) continue;
    const parent = pattern.split("/").slice(0, -1).join("/");
    const field = pattern.split("/").pop()!;
    for (const p of all) if (matches(parent, p) && isObj(get(doc, p)) && !has(doc, [...p, field])) out.push(pointer([...p, field]));
  }
  if (out.length > 0 && out.some((v) => v.startsWith("/plugins"))) return out;
  // What the registry build checks, on the parts that are valid on their own, once the plugins load.
  const clean = (prefix: string) => !out.some((v) => v === prefix || v.startsWith(`${prefix}/`));
  const plugins = Array.isArray(doc.plugins) ? doc.plugins : [];
  const echo = plugins.some((p) => isObj(p) && env(p.path) === ECHO_PLUGIN);
  for (const [i, p] of plugins.entries()) {
    if (!isObj(p)) continue;
    const path = env(p.path);
    if (path !== ECHO_PLUGIN) {
      out.push(pointer(["plugins", i, "path"]));
      continue;
    }
    // The plugin's own schema: sink, a non-empty string; prefix, a string (an unset variable leaves its default).
    const config = isObj(p.config) ? p.config : {};
    const sink = env(config.sink);
    const prefix = env(config.prefix);
    if (typeof sink !== "string" || sink.length === 0) out.push(pointer(["plugins", i, "config", "sink"]));
    if (prefix !== undefined && typeof prefix !== "string") out.push(pointer(["plugins", i, "config", "prefix"]));
  }
  if (out.some((v) => v.startsWith("/plugins"))) return out;
  const list = Array.isArray(doc.model_list) ? doc.model_list : [];
  const ids = new Map<string, number>();
  for (const [i, e] of list.entries()) {
    if (!isObj(e) || !clean(pointer(["model_list", i]))) continue;
    const sp = e.svc_params as Json;
    const model = String(env(sp.model));
    const provider = model.slice(0, model.indexOf("/"));
    if (!PROVIDERS.has(provider) && !(echo && provider === "echo")) out.push(pointer(["model_list", i, "svc_params", "model"]));
    else if (NEEDS_API_BASE.has(provider) && env(sp.api_base) === undefined) out.push(pointer(["model_list", i, "svc_params"]));
    const info = isObj(e.model_info) ? e.model_info : {};
    const explicit = env(info.id);
    const resolved = Object.fromEntries(
      Object.entries(sp)
        .map(([k, v]) => [k, env(v)])
        .filter(([k, v]) => v !== undefined && !emptySection(["model_list", i, "svc_params", String(k)], v))
        .sort(([a], [b]) => String(a).localeCompare(String(b))),
    );
    const id = typeof explicit === "string" ? `id:${explicit}` : `entry:${JSON.stringify([env(e.model_name), resolved])}`;
    if (ids.has(id)) out.push(pointer(typeof explicit === "string" ? ["model_list", i, "model_info", "id"] : ["model_list", i]));
    else ids.set(id, i);
  }
  const s = isObj(doc.svc_settings) ? doc.svc_settings : {};
  for (const name of ["callbacks", "success_callback", "failure_callback"]) {
    const names = env(s[name]);
    if (!Array.isArray(names) || !clean(pointer(["svc_settings", name]))) continue;
    for (const [i, n] of names.entries()) if (!echo || !ECHO_CALLBACKS.has(String(env(n)))) out.push(pointer(["svc_settings", name, i]));
  }
  const g = isObj(doc.general_settings) ? doc.general_settings : {};
  const endpoints = Array.isArray(g.pass_through_endpoints) ? g.pass_through_endpoints : [];
  const routes: { route: string; methods: string[] }[] = [];
  const ptIds = new Set<string>();
  for (const [i, e] of endpoints.entries()) {
    const at = ["general_settings", "pass_through_endpoints", i];
    if (!isObj(e) || !clean(pointer(at))) continue;
    const path = String(env(e.path)).replace(/\/+$/, "") || "/";
    const methods = (env(e.methods) as string[] | undefined) ?? ["GET", "POST", "PUT", "PATCH", "DELETE"];
    const id = String(env(e.id) ?? path);
    const route = path;
    if (ptIds.has(id) || routes.some((r) => r.route === route && r.methods.some((m) => methods.includes(m)))) out.push(pointer(at));
    ptIds.add(id);
    routes.push({ route, methods });
    // README: os.environ/NAME anywhere in a value; an unset one is an error, and what it reads must make a header value.
    for (const [name, value] of Object.entries(isObj(e.headers) ? e.headers : {})) {
      const refs = typeof value === "string" ? [...value.matchAll(ENV_ANYWHERE)].map((m) => env(`os.environ/${m[1]}`)) : [];
      if (refs.some((r) => r === undefined || !headerValueOk(String(r)))) out.push(pointer([...at, "headers", name]));
    }
  }
  return [...new Set(out)];
}

// ---- the document: paths, reads, writes

function get(doc: unknown, path: readonly Seg[]): unknown {
  let at = doc;
  for (const s of path) {
    if (Array.isArray(at)) at = at[Number(s)];
    else if (isObj(at)) at = Object.hasOwn(at, String(s)) ? at[String(s)] : undefined;
    else return undefined;
  }
  return at;
}

function has(doc: unknown, path: readonly Seg[]): boolean {
  if (path.length === 0) return true;
  const parent = get(doc, path.slice(0, -1));
  const last = path[path.length - 1]!;
  if (Array.isArray(parent)) return /^\d+$/.test(String(last)) && Number(last) < parent.length;
  return isObj(parent) && Object.hasOwn(parent, String(last));
}

function set(doc: unknown, path: readonly Seg[], value: unknown): void {
  const parent = get(doc, path.slice(0, -1));
  const last = path[path.length - 1]!;
  if (Array.isArray(parent)) parent[Number(last)] = value;
  else if (isObj(parent)) parent[String(last)] = value;
}

function remove(doc: unknown, path: readonly Seg[]): void {
  const parent = get(doc, path.slice(0, -1));
  const last = path[path.length - 1]!;
  if (Array.isArray(parent)) parent.splice(Number(last), 1);
  else if (isObj(parent)) delete parent[String(last)];
}

/** Every path in the document (containers and leaves), root excluded. */
function paths(doc: unknown, at: Seg[] = []): Seg[][] {
  const out: Seg[][] = [];
  const children: [Seg, unknown][] = Array.isArray(doc) ? doc.map((v, i) => [i, v]) : isObj(doc) ? Object.entries(doc) : [];
  for (const [k, v] of children) {
    const p = [...at, k];
    out.push(p, ...paths(v, p));
  }
  return out;
}

const pointer = (path: readonly Seg[]) => `/${path.map((s) => String(s).replaceAll("~", "~0").replaceAll("/", "~1")).join("/")}`;
function unpointer(p: string): Seg[] {
  if (p === "/" || p === "") return [];
  return p
    .slice(1)
    .split("/")
    .map((s) => s.replaceAll("~1", "/").replaceAll("~0", "~"));
}

const clone = <T>(v: T): T => structuredClone(v);

// ---- mutations

/** What was done to the base config (for the failure report; expectations come from the resulting file). */
interface Mutation {
  kind: string;
  /** Where it applied (a JSON pointer, or a line). */
  at?: string;
  value?: string;
}

interface Fuzzed {
  n: number;
  text: string;
  mutations: Mutation[];
}

/** A value written into the YAML as it is (`1e309`, `.nan`), not as a quoted string. */
class Raw {
  constructor(readonly yaml: string) {}
}

const WRONG_TYPED: unknown[] = ["fuzz", "", "42", "true", 42, -7, 0, 3.5, true, false, null, [], ["x", 1], {}, { nested: { x: 1 } }];
const typeOf = (v: unknown) => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);

const NUMBERS: unknown[] = [
  -1,
  0,
  -0.5,
  0.5,
  1e300,
  new Raw("9007199254740993"),
  1e-300,
  99999999999,
  new Raw("1e309"),
  new Raw("-1e309"),
  new Raw(".inf"),
  new Raw("-.inf"),
  new Raw(".nan"),
  "NaN",
  "1e309",
  "Infinity",
  "30",
  "30s",
];

const STRINGS: unknown[] = [
  "",
  " ",
  "  padded  ",
  "line\nbreak",
  "cr\r\nlf",
  "tab\there",
  "nul\u0000char",
  "x".repeat(10_000),
  "模型-🚀",
  "http://",
  "http:// bad host",
  "https://[::1",
  `http://admin:${URL_SECRET}@[bad`,
  "http://127.0.0.1:1/v1",
  "os.environ/",
  "sk-",
  "/",
  "*",
  "**",
  "mock/",
  "a/b/c",
  "../../etc/passwd",
  "$" + "{HOME}",
];

const DURATIONS: unknown[] = ["0s", "0d", "-1", "1x", "30 d", "999999999999999d", "9999999y", "1mo", "", "30", 30, "1h"];

const BAD_HEADERS: Json[] = [{ "bad header": "x" }, { "x-fz-crlf": "a\r\nInjected: 1" }, { "x-fz-lf": "a\nb" }, { "": "empty name" }, { "x-fz-nul": "a\u0000b" }, { "x-ü": "x" }, { "x-fz": "ünïcödé" }];

/** Values each rule allows, at its edges (and ones that change what serves: other groups, other upstreams). */
const EDGE: Partial<Record<Rule, (mock: MockOpenAI, now: unknown) => unknown[]>> = {
  "int>=1": () => [1, 2, 2 ** 31, 1e15, Number.MAX_SAFE_INTEGER, 1e300],
  "int>=0": () => [0, 1, 7, 1e9, 1e300],
  "num>0": () => [1e-9, 0.001, 1, 86_400, 1e300, Number.MIN_VALUE],
  "num>=0": () => [0, 1e-30, 0.5, 1e6, 1e300],
  perToken: () => [0, 1e-30, 0.5, 1],
  perCall: () => [0, 1e-12, 1, 1_000_000],
  bool: (_m, now) => [!now, true, false],
  duration: () => ["1s", "100y", "1 h", "7d", "36500d", "1mo"],
  strategy: () => ["simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing", "usage-based-routing-v2", "cost-based-routing"],
  cacheMode: () => ["default_on", "default_off"],
  cacheType: () => ["local"],
  stringList: () => [[], ["fz-backup", "no-such-group"], ["*"], ["fz-chat"], ["x".repeat(300)]],
  hostList: () => [[], ["api.example.com", "127.0.0.1"]],
  methods: () => [["GET"], ["POST", "PUT"], ["DELETE"], ["GET", "POST", "PUT", "PATCH", "DELETE"]],
  url: (mock) => [`${mock.url}/`, "http://127.0.0.1:1/v1", `http://localhost:${mock.port}/v1`, `${mock.url}/chat/completions?x=1#frag`],
  path: () => ["/fz/new", "/", "/v1/chat/completions", "/fz/é", "/fz/a/b/", "/health"],
  name: () => ["a b", "UPPER", "x".repeat(300), "with:colon", "fz-chat", "fz-backup", "*", "fz-*", "ünï"],
  nonEmptyString: () => ["pt-other", "x".repeat(500), "ünï"],
  credential: () => ["k", "ünïcödé", "", " spaced ", "sk-ends-with-a-newline\n"],
  skKey: () => ["sk-other-master", "sk-"],
  string: () => ["", "ünïcödé 模型 🚀", "x".repeat(100_000), "%", "line\nbreak"],
  providerModel: () => ["mock/other", "openai/gpt-x", "echo/y", "mock/a/b", "openai/*", "mock/*"],
  headers: () => [{}, { "x-a": "" }, { "X-Upper": "ünï" }, { "x-fz-header": "value with spaces" }],
};

let unsetSerial = 0;

/** Pointer paths matching `re`, out of the document. */
function pathsLike(doc: unknown, re: RegExp): Seg[][] {
  return paths(doc).filter((p) => re.test(pointer(p)));
}

function mutate(rng: Random, doc: Json, mock: MockOpenAI): Mutation {
  const all = paths(doc);
  const leaves = all.filter((p) => !isObj(get(doc, p)) && !Array.isArray(get(doc, p)));
  const kind = rng.pick([
    "edgeValue",
    "edgeValue",
    "edgeValue",
    "edgeValue",
    "edgeValue",
    "edgeValue",
    "wrongType",
    "wrongType",
    "wrongTypeDocumented",
    "wrongTypeDocumented",
    "number",
    "number",
    "string",
    "string",
    "unknownKey",
    "removeKey",
    "removeKey",
    "duplicateId",
    "envUnset",
    "envUnset",
    "badHeader",
    "duration",
    "emptyList",
    "bigList",
  ]);
  switch (kind) {
    case "edgeValue": {
      // A value the README allows, at the edge of what is usual: the file must then serve.
      const documented = all.filter((p) => {
        const spec = specAt(p);
        return spec && EDGE[spec.rule] && !/\/plugins\//.test(pointer(p));
      });
      const path = rng.pick(documented);
      const v = clone(rng.pick(EDGE[specAt(path)!.rule]!(mock, get(doc, path))));
      set(doc, path, v);
      return { kind, at: pointer(path), value: JSON.stringify(v)?.slice(0, 60) };
    }
    case "wrongType":
    case "wrongTypeDocumented": {
      const pool = kind === "wrongType" ? all : all.filter((p) => specAt(p));
      const path = rng.pick(pool.length > 0 ? pool : all);
      const now = get(doc, path);
      const v = clone(rng.pick(WRONG_TYPED.filter((w) => typeOf(w) !== typeOf(now))));
      set(doc, path, v);
      return { kind, at: pointer(path), value: JSON.stringify(v) };
    }
    case "number": {
      const numeric = leaves.filter((p) => typeof get(doc, p) === "number");
      const path = rng.pick(numeric);
      const v = rng.pick(NUMBERS);
      set(doc, path, v);
      return { kind, at: pointer(path), value: v instanceof Raw ? v.yaml : JSON.stringify(v) };
    }
    case "string": {
      const strings = leaves.filter((p) => typeof get(doc, p) === "string");
      const path = rng.pick(strings);
      let v = rng.pick(STRINGS);
      // A password only where the README counts it as one (a URL the gateway calls); elsewhere the same shape without it.
      if (typeof v === "string" && v.includes(URL_SECRET) && !/\/(api_base|target|alert_webhook_url)$/.test(pointer(path))) v = v.replace(URL_SECRET, "not-a-secret");
      set(doc, path, v);
      return { kind, at: pointer(path), value: JSON.stringify(v).slice(0, 60) };
    }
    case "unknownKey": {
      const objects = [[], ...all.filter((p) => isObj(get(doc, p)))];
      const path = rng.pick(objects);
      const key = rng.pick(["fz_unknown", "modle_name", "litellm_params", "api_bas", "timeout_s", "x-extra", "123", "~tilde/slash"]);
      set(doc, [...path, key], clone(rng.pick(WRONG_TYPED)));
      return { kind, at: pointer([...path, key]) };
    }
    case "removeKey": {
      const path = rng.chance(0.5) ? rng.pick(all.filter((p) => specAt(p)?.required)) : rng.pick(all);
      remove(doc, path);
      return { kind, at: pointer(path) };
    }
    case "duplicateId": {
      // Earlier mutations may have made these lists (or their entries) something else.
      const list = Array.isArray(doc.model_list) ? (doc.model_list as unknown[]) : [];
      const g = doc.general_settings;
      const pts = isObj(g) && Array.isArray(g.pass_through_endpoints) ? (g.pass_through_endpoints as unknown[]) : [];
      const entries = [...list.keys()].filter((i) => isObj(list[i]));
      const which = rng.int(3);
      if (which === 0 && entries.length >= 2) {
        const [i, j] = rng.some(entries, 2).sort((a, b) => a - b) as [number, number];
        if (j === undefined) return { kind: "duplicateId (none)" };
        const id = `dup-${rng.int(100)}`;
        for (const k of [i, j]) {
          const e = list[k] as Json;
          e.model_info = { ...(isObj(e.model_info) ? e.model_info : {}), id };
        }
        return { kind: "duplicate model_info.id", at: pointer(["model_list", j, "model_info", "id"]) };
      }
      if (which === 1 && pts.length > 0) {
        pts.push(clone(pts[rng.int(pts.length)]));
        return { kind: "duplicate pass-through endpoint", at: pointer(["general_settings", "pass_through_endpoints", pts.length - 1]) };
      }
      // An entry copied as it is.
      if (list.length === 0) return { kind: "duplicateId (none)" };
      list.push(clone(list[rng.int(list.length)]));
      return { kind: "copied model entry", at: pointer(["model_list", list.length - 1]) };
    }
    case "envUnset": {
      const strings = leaves.filter((p) => typeof get(doc, p) === "string");
      const path = rng.pick(strings);
      const name = `${ENV_PREFIX}UNSET_${++unsetSerial}`;
      const inHeader = /pass_through_endpoints\/\d+\/headers\//.test(pointer(path));
      set(doc, path, inHeader && rng.chance(0.5) ? `Bearer os.environ/${name}` : `os.environ/${name}`);
      return { kind, at: pointer(path), value: name };
    }
    case "badHeader": {
      const holders = [
        ...pathsLike(doc, /^\/model_list\/\d+\/svc_params$/).map((p) => [...p, "headers"]),
        ...pathsLike(doc, /^\/general_settings\/pass_through_endpoints\/\d+$/).map((p) => [...p, "headers"]),
      ];
      const path = rng.pick(holders);
      const bad = rng.pick(BAD_HEADERS);
      const before = get(doc, path);
      const v = { ...(isObj(before) ? before : {}), ...bad };
      set(doc, path, v);
      return { kind, at: pointer(path), value: JSON.stringify(bad) };
    }
    case "duration": {
      const durations = [
        ...pathsLike(doc, /^\/general_settings\/maximum_spend_logs_retention_(period|interval)$/),
        ...pathsLike(doc, /^\/router_settings\/provider_budget_config\/[^/]+\/time_period$/),
      ];
      const path = rng.pick(durations);
      const v = rng.pick(DURATIONS);
      set(doc, path, v);
      return { kind, at: pointer(path), value: JSON.stringify(v) };
    }
    case "emptyList": {
      const lists = all.filter((p) => Array.isArray(get(doc, p)));
      const path = rng.pick(lists);
      set(doc, path, []);
      return { kind, at: pointer(path) };
    }
    default: {
      // Many deployments in one group.
      if (!Array.isArray(doc.model_list)) return { kind: "bigList (none)" };
      const list = doc.model_list as Json[];
      const n = 50 + rng.int(400);
      for (let i = 0; i < n; i++) list.push({ model_name: "fz-many", svc_params: { model: `${rng.pick(["mock", "openai"])}/many-${i}`, api_base: mock.url, api_key: UPSTREAM_KEY } });
      return { kind: "bigList", value: String(n) };
    }
  }
}

/** Raw values are written as placeholders, then put in place in the text. */
function toYaml(doc: Json): string {
  const raws: Raw[] = [];
  const swap = (v: unknown): unknown => {
    if (v instanceof Raw) {
      raws.push(v);
      return `__FZRAW_${raws.length - 1}__`;
    }
    if (Array.isArray(v)) return v.map(swap);
    if (isObj(v)) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, swap(x)]));
    return v;
  };
  let text = stringify(swap(doc), { lineWidth: 0 });
  for (const [i, r] of raws.entries()) text = text.replaceAll(`__FZRAW_${i}__`, r.yaml);
  return text;
}

/** A mutation of the text itself. */
function mutateText(rng: Random, doc: Json): { text: string; mutation: Mutation } {
  const kind = rng.pick(["alias", "aliasBomb", "multiDoc", "tab", "brokenQuote", "duplicateKey", "deepNesting", "notMapping", "empty", "crlf", "bom", "tagged"]);
  const text = toYaml(doc);
  const lines = text.split("\n");
  switch (kind) {
    case "alias": {
      // Anchors and aliases: one mapping used at two places.
      const d = new Document(doc);
      const list = d.get("model_list") as unknown;
      if (!isSeq(list) || list.items.length < 2) return { text, mutation: { kind: "alias (none)" } };
      // An alias comes after its anchor.
      const i = rng.int(list.items.length - 1);
      const j = i + 1 + rng.int(list.items.length - i - 1);
      const from = list.items[i];
      const to = list.items[j];
      if (!isMap(from) || !isMap(to)) return { text, mutation: { kind: "alias (none)" } };
      const which = rng.pick(["svc_params", "model_info"]);
      const node = from.get(which, true);
      if (!node || !(isMap(node) || isSeq(node))) return { text, mutation: { kind: "alias (none)" } };
      to.set(which, d.createAlias(node as Parameters<typeof d.createAlias>[0]));
      return { text: d.toString({ lineWidth: 0 }), mutation: { kind: "alias", at: pointer(["model_list", j, which]) } };
    }
    case "aliasBomb": {
      const bomb = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'];
      for (let k = 1; k < 9; k++) {
        const prev = String.fromCharCode(96 + k);
        const cur = String.fromCharCode(97 + k);
        bomb.push(`${cur}: &${cur} [${Array(9).fill(`*${prev}`).join(",")}]`);
      }
      return { text: `${text}fz_bomb:\n${bomb.map((l) => `  ${l}`).join("\n")}\n`, mutation: { kind } };
    }
    case "multiDoc":
      return { text: rng.chance(0.5) ? `${text}---\nmodel_list: []\n` : `---\n${text}...\n---\n${text}`, mutation: { kind } };
    case "tab": {
      const i = 1 + rng.int(lines.length - 2);
      lines[i] = lines[i]!.replace(/^( +)/, (s) => `\t${s.slice(1)}`);
      return { text: lines.join("\n"), mutation: { kind, at: `line ${i + 1}` } };
    }
    case "brokenQuote": {
      // On a line that holds a secret when there is one: the error must not show it.
      const secretLines = lines.flatMap((l, i) => (l.includes(SECRET_MARK) ? [i] : []));
      const i = secretLines.length > 0 && rng.chance(0.7) ? rng.pick(secretLines) : rng.int(lines.length - 1);
      lines[i] = `${lines[i]} "unclosed: [`;
      return { text: lines.join("\n"), mutation: { kind, at: `line ${i + 1}` } };
    }
    case "duplicateKey":
      return { text: `${text}router_settings: {}\n`, mutation: { kind } };
    case "deepNesting": {
      // Under router_settings (which keeps keys it does not know): the whole depth is read.
      const depth = rng.pick([50, 500, 3000, 20_000]);
      const flow = rng.chance(0.5);
      const at = lines.indexOf("router_settings:");
      if (at < 0) return { text, mutation: { kind: "deepNesting (none)" } };
      const deep: string[] = [];
      if (flow) deep.push(`  fz_deep: ${"[".repeat(depth)}${"]".repeat(depth)}`);
      else {
        deep.push("  fz_deep:");
        for (let k = 0; k < depth; k++) deep.push(`${" ".repeat(4 + k)}k:`);
        deep.push(`${" ".repeat(4 + depth)}v: 1`);
      }
      lines.splice(at + 1, 0, ...deep);
      return { text: lines.join("\n"), mutation: { kind: `deepNesting ${flow ? "flow" : "block"} ${depth}` } };
    }
    case "notMapping":
      return { text: rng.pick(["- a\n- b\n", "42\n", "'just text'\n", "~\n", "null\n", "[]\n", "true\n"]), mutation: { kind } };
    case "empty":
      return { text: rng.pick(["", "\n\n", "# only a comment\n", "   \n", "---\n"]), mutation: { kind } };
    case "crlf":
      return { text: text.replaceAll("\n", "\r\n"), mutation: { kind } };
    case "bom":
      return { text: `\ufeff${text}`, mutation: { kind } };
    default: {
      const i = lines.findIndex((l) => /^\s+model_name: /.test(l));
      if (i >= 0) lines[i] = lines[i]!.replace("model_name: ", `model_name: ${rng.pick(["!!binary ", "!custom ", "!!int ", "!!str "])}`);
      return { text: lines.join("\n"), mutation: { kind, at: `line ${i + 1}` } };
    }
  }
}

function fuzzedConfig(rng: Random, n: number, mock: MockOpenAI): Fuzzed {
  const doc = baseConfig(mock);
  if (n === 0) return { n, text: toYaml(doc), mutations: [] };
  const mutations: Mutation[] = [];
  const count = rng.pick([1, 1, 1, 1, 2, 2, 2, 3]);
  for (let i = 0; i < count; i++) mutations.push(mutate(rng, doc, mock));
  if (rng.chance(0.15)) {
    const t = mutateText(rng, doc);
    return { n, text: t.text, mutations: [...mutations, t.mutation] };
  }
  return { n, text: toYaml(doc), mutations };
}

/** The 5 MB file: the base config and ~2,000 more deployments, each with a long fixed reply. */
function bigConfig(mock: MockOpenAI, n: number): Fuzzed {
  const doc = baseConfig(mock);
  const list = doc.model_list as Json[];
  const filler = "lorem ipsum ".repeat(200);
  for (let i = 0; list.length < 2100; i++) list.push({ model_name: `fz-big-${i % 50}`, svc_params: { model: `mock/big-${i}`, mock_response: filler }, model_info: { id: `fz-big-${i}` } });
  let text = toYaml(doc);
  text += `# ${"x".repeat(Math.max(0, 5 * 1024 * 1024 - text.length - 3))}\n`;
  return { n, text, mutations: [{ kind: "5 MB file", value: `${(text.length / 1048576).toFixed(2)} MB` }] };
}

// ---- the test's own reading of a file

interface Reading {
  /** The document as a YAML parser reads it; undefined when it is not one valid YAML document. */
  doc: unknown;
  yamlValid: boolean;
}

function read(text: string): Reading {
  try {
    const docs = parseAllDocuments(text);
    if (!Array.isArray(docs) || docs.length > 1 || docs.some((d) => d.errors.length > 0)) return { doc: undefined, yamlValid: false };
    // Merge keys as YAML 1.1 has them, and the README's bound on aliases.
    return { doc: parse(text, { merge: true, maxAliasCount: 10_000 }) ?? {}, yamlValid: true };
  } catch {
    return { doc: undefined, yamlValid: false };
  }
}

/** An `environment_variables` value as the README says it is set: text as it is, a number as its digits, true/false as True/False (LiteLLM's `str(value)`). */
function envText(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (typeof v === "boolean") return v ? "True" : "False";
  return typeof v === "number" && Number.isFinite(v) ? String(v) : undefined;
}

/** `os.environ/NAME` read as the README says: the environment's variable, else the file's `environment_variables`; an empty one is unset. */
function envValue(doc: Json, v: unknown): unknown {
  if (typeof v !== "string") return v;
  const m = /^os\.environ\/([A-Za-z_][A-Za-z0-9_]*)$/.exec(v);
  if (!m) return v;
  const own = process.env[m[1]!];
  if (own) return own;
  const file = doc.environment_variables;
  return (isObj(file) && envText(file[m[1]!])) || undefined;
}

/** The master key an accepted file gives (SVC_MASTER_KEY is unset here). */
function masterKeyOf(doc: Json): string | undefined {
  const g = doc.general_settings;
  const k = isObj(g) ? envValue(doc, g.master_key) : undefined;
  return typeof k === "string" && k.length > 0 ? k : undefined;
}

interface Group {
  name: string;
  /** The name a call sends (a wildcard's: a name it matches). */
  call: string;
  wildcard: boolean;
  embedding: boolean;
  /** An upstream the mutations pointed away from the mock: a 503 or 408 may come from it. */
  elsewhere: boolean;
  /** A deployment would call a provider's public API (no api_base): not called from the test. */
  external: boolean;
  /** The fixture plugin's echo/ provider answers JSON only. */
  noStream: boolean;
}

function groupsOf(doc: Json, mock: MockOpenAI): Group[] {
  const byName = new Map<string, Group>();
  for (const e of Array.isArray(doc.model_list) ? doc.model_list : []) {
    if (!isObj(e) || typeof e.model_name !== "string" || !isObj(e.svc_params)) continue;
    const name = e.model_name;
    const sp = e.svc_params;
    const model = String(envValue(doc, sp.model));
    const provider = model.slice(0, model.indexOf("/"));
    const base = envValue(doc, sp.api_base);
    const wildcard = name.includes("*");
    const g = byName.get(name) ?? { name, call: wildcard ? name.replace("*", "fuzzq") : name, wildcard, embedding: false, elsewhere: false, external: false, noStream: false };
    const info = isObj(e.model_info) ? e.model_info : {};
    if (info.mode === "embedding") g.embedding = true;
    if (provider === "echo") g.noStream = true;
    if (provider !== "mock" && provider !== "echo") {
      if (base === undefined) g.external = true;
      else if (String(base).replace(/\/+$/, "") !== mock.url) g.elsewhere = true;
    }
    byName.set(name, g);
  }
  return [...byName.values()];
}

/** Pass-through endpoints of the file, as the test calls them. */
function passThroughOf(doc: Json, mock: MockOpenAI): { path: string; method: string; elsewhere: boolean; auth: boolean }[] {
  const g = doc.general_settings;
  const list = isObj(g) && Array.isArray(g.pass_through_endpoints) ? g.pass_through_endpoints : [];
  return list.filter(isObj).map((e) => {
    const methods = Array.isArray(e.methods) && e.methods.length > 0 ? (e.methods as string[]) : ["POST"];
    const target = String(envValue(doc, e.target));
    const sameOrigin = (() => {
      try {
        return new URL(target).origin === new URL(mock.url).origin;
      } catch {
        return false;
      }
    })();
    return { path: String(e.path), method: methods.includes("POST") ? "POST" : methods[0]!, elsewhere: !sameOrigin, auth: e.auth !== false };
  });
}

// ---- checking a refusal

/** The path an error names: `<path>: …`, also after a `plugin <name>: ` prefix. */
function errorPath(e: string): string | undefined {
  const m = /^(?:plugin [^:]+: )?(\/[^:]*): /.exec(e);
  return m?.[1];
}

/** Whether some error names `v` (the path itself, a field under it, or an object above it other than the root). */
function named(errors: string[], v: string): boolean {
  return errors.some((e) => {
    const p = errorPath(e);
    if (p === undefined) return v === "/" && e.startsWith("YAML syntax error:");
    return p === v || p.startsWith(`${v === "/" ? "" : v}/`) || (p !== "/" && v.startsWith(`${p}/`));
  });
}

function checkRefusal(reading: Reading, expected: string[], errors: string[], where: string): string | undefined {
  if (!Array.isArray(errors) || errors.length === 0) return `${where}: refused with no error listed`;
  for (const e of errors) {
    if (typeof e !== "string" || e.trim() === "") return `${where}: an empty or non-text error: ${JSON.stringify(e)}`;
    if (e.includes(SECRET_MARK)) return `${where}: an error shows a secret of the file: ${e.slice(0, 400)}`;
    if (e.startsWith("YAML syntax error:")) {
      if (reading.yamlValid) return `${where}: a YAML syntax error for a text that is one valid YAML document: ${e.slice(0, 300)}`;
      continue;
    }
    const p = errorPath(e);
    if (p === undefined) return `${where}: an error without a path: ${e.slice(0, 300)}`;
    if (!reading.yamlValid) continue;
    // A path in the file, or a field missing from a mapping that is (a required one, or one inside a missing mapping).
    const segs = unpointer(p);
    let known = 0;
    while (known < segs.length && has(reading.doc, segs.slice(0, known + 1))) known++;
    // A mapping written empty (YAML null) is absent to the gateway: a required field under it is missing.
    const deepest = get(reading.doc, segs.slice(0, known));
    if (known < segs.length && !isObj(deepest) && !emptySection(segs.slice(0, known), deepest)) {
      return `${where}: an error names a path that is not in the file: ${e.slice(0, 300)}`;
    }
  }
  if (!reading.yamlValid && !errors.some((e) => e.startsWith("YAML syntax error:"))) return `${where}: a text that is not one valid YAML document was not refused as such: ${errors.join(" | ").slice(0, 300)}`;
  const missed = expected.filter((v) => !named(errors, v));
  if (missed.length > 0) return `${where}: no error names ${missed.join(", ")} (the file has ${expected.join(", ")}): ${errors.join(" | ").slice(0, 800)}`;
  return undefined;
}

// ---- serving checks

interface Reply {
  status: number;
  text: string;
  headers: Headers;
}

async function call(url: string, method: string, path: string, key: string | undefined, body?: unknown): Promise<Reply> {
  const headers: Record<string, string> = {};
  if (key) headers.authorization = `Bearer ${key}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const res = await withTimeout(fetch(url + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) }), `${method} ${path}`);
  return { status: res.status, text: await res.text(), headers: res.headers };
}

/** A problem with an error answer's envelope, or undefined. */
function envelopeProblem(r: Reply): string | undefined {
  try {
    const e = (JSON.parse(r.text) as { error?: Json }).error;
    if (!e || typeof e.message !== "string" || typeof e.type !== "string" || !("param" in e) || e.code !== String(r.status)) return "not in the error envelope";
  } catch {
    return "not JSON";
  }
  return undefined;
}

/** A 5xx (or a stream's error event) the config caused, or a malformed answer; undefined when fine. */
function answerProblem(r: Reply, what: string, elsewhere: boolean, stream = false): string | undefined {
  const show = `${what} → ${r.status} ${r.text.slice(0, 300)}`;
  if (r.status >= 500) {
    if (elsewhere && (r.status === 503 || r.status === 408)) return undefined;
    return `5xx: ${show}`;
  }
  if (r.status >= 400) {
    const p = envelopeProblem(r);
    return p ? `${p}: ${show}` : undefined;
  }
  if (stream && r.status === 200) {
    const err = /data: (\{"error".*)\n/.exec(r.text);
    if (err) {
      const code = Number((JSON.parse(err[1]!) as { error: { code?: string } }).error.code);
      if (code >= 500 && !(elsewhere && (code === 503 || code === 408))) return `stream ended with a ${code}: ${show}`;
      return undefined;
    }
    if (!r.text.endsWith("data: [DONE]\n\n")) return `stream did not end with [DONE]: ${what} … ${r.text.slice(-200)}`;
  }
  return undefined;
}

/** Calls an accepted config's gateway as a client would; returns the first problem. */
async function serveProblems(url: string, doc: Json, mock: MockOpenAI, rng: Random, opts: { management: boolean; strict?: boolean }): Promise<string | undefined> {
  const key = masterKeyOf(doc);
  const live = await call(url, "GET", "/health/liveliness", undefined);
  if (live.status !== 200) return `/health/liveliness → ${live.status} ${live.text.slice(0, 200)}`;
  const models = await call(url, "GET", "/v1/models", key);
  if (!key) {
    if (models.status !== 401) return `without a master key /v1/models → ${models.status}, want 401: ${models.text.slice(0, 200)}`;
    const chat = await call(url, "POST", "/v1/chat/completions", "sk-anything", { model: "fz-chat", messages: [{ role: "user", content: "hi" }] });
    return chat.status === 401 ? undefined : `without a master key a chat → ${chat.status}, want 401: ${chat.text.slice(0, 200)}`;
  }
  const groups = groupsOf(doc, mock);
  if (models.status !== 200) return `/v1/models → ${models.status} ${models.text.slice(0, 300)}`;
  const listed = ((JSON.parse(models.text) as { data: { id: string }[] }).data ?? []).map((m) => m.id).sort();
  const want = [...new Set(groups.filter((g) => !g.wildcard).map((g) => g.name))].sort();
  if (JSON.stringify(listed) !== JSON.stringify(want)) return `/v1/models lists ${JSON.stringify(listed).slice(0, 300)}, the file's groups are ${JSON.stringify(want).slice(0, 300)}`;
  const info = await call(url, "GET", "/model/info", key);
  if (info.status !== 200) return `/model/info → ${info.status} ${info.text.slice(0, 300)}`;
  if (info.text.includes(SECRET_MARK)) return `/model/info shows a secret: ${info.text.slice(0, 300)}`;
  const callable = groups.filter((g) => !g.external);
  for (const g of callable.slice(0, 12)) {
    const path = g.embedding ? "/v1/embeddings" : "/v1/chat/completions";
    const body = g.embedding ? { model: g.call, input: "fuzz" } : { model: g.call, messages: [{ role: "user", content: "fuzz hello" }], caching: rng.chance(0.3) };
    const r = await call(url, "POST", path, key, body);
    const p = answerProblem(r, `${path} '${g.call.slice(0, 80)}'`, g.elsewhere);
    if (p) return p;
    if (opts.strict && r.status !== 200) return `the base config: ${path} '${g.call}' → ${r.status} ${r.text.slice(0, 300)}`;
    if (r.text.includes(SECRET_MARK)) return `an answer shows a secret: ${r.text.slice(0, 300)}`;
  }
  const chats = callable.filter((g) => !g.embedding && !g.noStream);
  if (chats.length > 0) {
    const g = rng.pick(chats);
    const r = await call(url, "POST", "/v1/chat/completions", key, { model: g.call, stream: true, messages: [{ role: "user", content: "fuzz stream" }] });
    const p = answerProblem(r, `stream '${g.call.slice(0, 80)}'`, g.elsewhere, true);
    if (p) return p;
  }
  for (const pt of passThroughOf(doc, mock).slice(0, 4)) {
    if (!pt.path.startsWith("/") || /[\s?#]/.test(pt.path)) continue;
    const body = pt.method === "GET" || pt.method === "DELETE" ? undefined : { model: "pt-model", messages: [{ role: "user", content: "through" }] };
    const r = await call(url, pt.method, pt.path, key, body);
    if (r.status >= 500 && !(pt.elsewhere && (r.status === 503 || r.status === 408))) return `pass-through ${pt.method} ${pt.path} → ${r.status} ${r.text.slice(0, 300)}`;
  }
  if (opts.management) {
    for (const path of ["/config/pass_through_endpoint", "/provider/budgets", "/model/info"]) {
      const r = await call(url, "GET", path, key);
      if (r.status !== 200) return `management read ${path} → ${r.status} ${r.text.slice(0, 300)}`;
      if (r.text.includes(SECRET_MARK)) return `management read ${path} shows a secret: ${r.text.slice(0, 300)}`;
    }
  }
  return undefined;
}

// ---- plumbing

async function withTimeout<T>(p: Promise<T>, what: string, ms = HANG_MS): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`hang: ${what} took over ${ms} ms`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** Unsets the variables the files set or name (a config's environment_variables stay in the process). */
function clearFileEnv(): void {
  for (const k of Object.keys(process.env)) if (k.startsWith(ENV_PREFIX)) delete process.env[k];
}

type StartOutcome = { refused: string[] } | { live: Live };

/** Loads a file as the gateway does at start (read, validate, build the registry); any other exception is a crash. */
async function startFrom(dir: string, text: string, log: ReturnType<typeof memoryLogger>): Promise<StartOutcome> {
  const path = join(dir, "config.yaml");
  writeFileSync(path, text);
  try {
    return { live: await withTimeout(Live.start(path, log), "Live.start") };
  } catch (err) {
    if (err instanceof SnapshotError) return { refused: err.errors };
    throw new Error(`start crashed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
  }
}

// ---- the run

/** Log lines a gateway must not write for a file: errors other than a refused reload, and anything holding a secret. */
function logProblem(lines: { level: string; msg: string; fields?: Record<string, unknown> }[], who: string): string | undefined {
  for (const l of lines) {
    const text = JSON.stringify(l);
    if (text.includes(SECRET_MARK)) return `${who} logged a secret: ${text.slice(0, 400)}`;
    if (l.level === "error" && !l.msg.startsWith("config reload rejected")) return `${who} logged an error: ${text.slice(0, 400)}`;
  }
  return undefined;
}

/** Which kind of refusal a list of errors is (the process runs take one of each). */
function refusalKind(errors: string[]): string {
  if (errors.some((e) => e.startsWith("YAML syntax error:"))) return "yaml";
  const registry = errors.filter((e) => !/: (Expected|Unexpected)/.test(e)).length;
  return registry === 0 ? "schema" : registry === errors.length ? "registry" : "mixed";
}

describe(`config fuzz (CONFIG_FUZZ_SEED=${SEED})`, () => {
  const rng = new Random(SEED);
  let mock: MockOpenAI;
  let reloadGw: TestGateway;
  const dir = tempDir("gw-config-fuzz-");
  const stats = { configs: 0, refused: 0, accepted: 0, mustRefuse: 0, reloadsTaken: 0, processRuns: 0, ms: 0, kinds: {} as Record<string, number> };
  const savedMasterKey = process.env.SVC_MASTER_KEY;

  beforeAll(async () => {
    delete process.env.SVC_MASTER_KEY;
    clearFileEnv();
    mock = await startMockOpenAI();
    reloadGw = await startTestGateway(toYaml(baseConfig(mock)), { store: {} });
  }, 120_000);

  afterAll(async () => {
    await reloadGw?.stop();
    await mock?.stop();
    rmSync(dir, { recursive: true, force: true });
    clearFileEnv();
    if (savedMasterKey !== undefined) process.env.SVC_MASTER_KEY = savedMasterKey;
    console.log(`config fuzz seed ${SEED}: ${JSON.stringify(stats)}`);
  });

  /** A start from the file, then the same file as a reload of the gateway serving the base; the outcome of the start. */
  async function checkFile(f: Fuzzed, baseText: string): Promise<{ refused?: string[] }> {
    const fail = (msg: string): never => {
      throw new Error(`${failPrefix(f.n)} ${msg}\nmutations: ${JSON.stringify(f.mutations)}\nfile (first 3000 characters):\n${f.text.slice(0, 3000)}`);
    };
    stats.configs++;
    for (const m of f.mutations) stats.kinds[m.kind] = (stats.kinds[m.kind] ?? 0) + 1;
    clearFileEnv();
    const reading = read(f.text);
    const expected = reading.yamlValid ? violations(reading.doc) : [];
    const mustRefuse = !reading.yamlValid || expected.length > 0;
    if (mustRefuse) stats.mustRefuse++;

    // 1. A start from the file.
    const log = memoryLogger();
    let outcome: StartOutcome;
    try {
      outcome = await startFrom(dir, f.text, log);
    } catch (err) {
      return fail(String(err instanceof Error ? err.message : err));
    }
    if ("refused" in outcome) {
      stats.refused++;
      const problem = checkRefusal(reading, expected, outcome.refused, "start");
      if (problem) fail(problem);
    } else {
      stats.accepted++;
      const live = outcome.live;
      if (mustRefuse) {
        await live.close();
        if (!reading.yamlValid) fail("accepted a text that is not one valid YAML document");
        fail(`accepted, but the README says it must be refused: ${expected.map((v) => `${v} = ${JSON.stringify(get(reading.doc, unpointer(v)))?.slice(0, 80)}`).join("; ")}`);
      }
      const app = createApp({ live, log, services: {}, probes: { store: async () => ({ ok: true, detail: "fuzz" }), redis: async () => undefined, version: "fuzz" } });
      const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch, idleTimeout: 30 });
      let problem: string | undefined;
      try {
        problem = await serveProblems(`http://127.0.0.1:${server.port}`, reading.doc as Json, mock, rng, { management: false, strict: f.n === 0 });
      } catch (err) {
        problem = `serving threw: ${err instanceof Error ? err.message : String(err)}`;
      } finally {
        await server.stop(true);
        await live.close();
      }
      if (problem) fail(`accepted at start, then: ${problem}`);
    }
    const started = logProblem(log.lines, "the gateway started from the file");
    if (started) fail(started);
    clearFileEnv();

    // 2. The same file as a reload of a gateway serving the base config (with a store).
    writeFileSync(reloadGw.configPath, f.text);
    let result: Awaited<ReturnType<Live["reload"]>>;
    try {
      result = await withTimeout(reloadGw.live.reload("fuzz", true), "reload");
    } catch (err) {
      return fail(`reload crashed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    }
    if ("refused" in outcome) {
      if (result.ok) return fail(`refused at start (${outcome.refused.join(" | ").slice(0, 300)}) but taken by a reload`);
      const problem = checkRefusal(reading, expected, result.errors, "reload");
      if (problem) fail(problem);
      // The same errors, but for the folder the file is in (plugin paths are relative to it).
      const inDir = (errors: string[], d: string) => errors.map((e) => e.replaceAll(d, "<dir>")).sort();
      if (JSON.stringify(inDir(result.errors, reloadGw.dir)) !== JSON.stringify(inDir(outcome.refused, dir))) {
        fail(`the reload's errors differ from the start's:\nreload: ${result.errors.join("\n")}\nstart: ${outcome.refused.join("\n")}`);
      }
      // The base keeps serving.
      const models = await call(reloadGw.url, "GET", "/v1/models", MASTER_KEY);
      const names = ((JSON.parse(models.text) as { data?: { id: string }[] }).data ?? []).map((m) => m.id).sort();
      if (models.status !== 200 || JSON.stringify(names) !== JSON.stringify(["fz-backup", "fz-chat", "fz-echo", "fz-embed"])) fail(`after a refused reload /v1/models → ${models.status} ${models.text.slice(0, 300)}`);
      const chat = await call(reloadGw.url, "POST", "/v1/chat/completions", MASTER_KEY, { model: "fz-chat", messages: [{ role: "user", content: "still there?" }] });
      if (chat.status !== 200) fail(`after a refused reload the base's fz-chat → ${chat.status} ${chat.text.slice(0, 300)}`);
    } else {
      if (!result.ok) return fail(`taken at start but refused by a reload: ${result.errors.join(" | ").slice(0, 600)}`);
      stats.reloadsTaken++;
      let problem: string | undefined;
      try {
        problem = await serveProblems(reloadGw.url, reading.doc as Json, mock, rng, { management: masterKeyOf(reading.doc as Json) !== undefined });
      } catch (err) {
        problem = `serving threw: ${err instanceof Error ? err.message : String(err)}`;
      }
      if (problem) fail(`taken by a reload, then: ${problem}`);
      // And back to the base.
      writeFileSync(reloadGw.configPath, baseText);
      const back = await withTimeout(reloadGw.live.reload("fuzz back", true), "reload back");
      if (!back.ok) fail(`the reload back to the base config was refused: ${back.errors.join(" | ")}`);
    }
    const reloaded = logProblem(reloadGw.log.lines, "the reloaded gateway");
    if (reloaded) fail(reloaded);
    reloadGw.log.lines.length = 0;
    return "refused" in outcome ? { refused: outcome.refused } : {};
  }

  test("every file is refused with errors by path, or starts, serves and reloads cleanly", async () => {
    const started = Date.now();
    const baseText = toYaml(baseConfig(mock));
    /** Files for the process runs: the first refusal of each kind, and one accepted file. */
    const forProcess = new Map<string, { f: Fuzzed; errors?: string[] }>();
    const bigAt = 1 + rng.int(CONFIGS - 1);
    for (let n = 0; n < CONFIGS; n++) {
      const f = n === bigAt ? bigConfig(mock, n) : fuzzedConfig(rng, n, mock);
      const { refused } = await checkFile(f, baseText);
      const kind = refused ? refusalKind(refused) : "accepted";
      if (!forProcess.has(kind) && f.text.length < 100_000 && (kind !== "accepted" || n > 0)) forProcess.set(kind, { f, errors: refused });
    }
    stats.ms = Date.now() - started;

    // 3. Through the real process: refused files exit 1 printing every error's path and no secret; an accepted one serves.
    for (const [kind, { f, errors }] of forProcess) {
      stats.processRuns++;
      const where = `${failPrefix(f.n)} process run (${kind})`;
      const procDir = tempDir("gw-config-fuzz-proc-");
      // The embedded store starts from an initialized copy (initdb takes seconds).
      if (!errors) cpSync(await initializedPgFolder(), join(procDir, "data", "pg"), { recursive: true });
      clearFileEnv();
      const env = { DATABASE_URL: undefined, REDIS_URL: undefined, SVC_MASTER_KEY: undefined, SVC_DRAIN_TIMEOUT: "2" };
      try {
        if (errors) {
          const gw = await spawnGateway(f.text, { waitForListen: false, env, dir: procDir });
          const code = await withTimeout(gw.exited, "the gateway process to exit", 30_000);
          const out = gw.output();
          if (code !== 1) throw new Error(`${where}: exit code ${code}, want 1\n${out.slice(0, 2000)}`);
          if (out.includes("listening on")) throw new Error(`${where}: it listened\n${out.slice(0, 2000)}`);
          if (out.includes(SECRET_MARK)) throw new Error(`${where}: a secret is printed\n${out.slice(0, 2000)}`);
          if (!out.includes("refusing to start")) throw new Error(`${where}: no "refusing to start"\n${out.slice(0, 2000)}`);
          for (const e of errors) {
            const p = errorPath(e);
            if (p !== undefined && !out.includes(`${p}: `)) throw new Error(`${where}: the error at ${p} is not printed\n${out.slice(0, 2000)}`);
            if (p === undefined && !out.includes(e.slice(0, 40))) throw new Error(`${where}: the error ${e.slice(0, 80)} is not printed\n${out.slice(0, 2000)}`);
          }
        } else {
          const gw = await spawnGateway(f.text, { env, dir: procDir });
          const problem = await serveProblems(gw.url, parse(f.text) as Json, mock, rng, { management: masterKeyOf(parse(f.text) as Json) !== undefined });
          const code = await gw.stop();
          const out = gw.output();
          if (problem) throw new Error(`${where}: ${problem}\n${out.slice(0, 2000)}`);
          if (code !== 0) throw new Error(`${where}: exit code ${code} after SIGTERM, want 0\n${out.slice(0, 2000)}`);
          if (out.includes(SECRET_MARK)) throw new Error(`${where}: a secret is printed\n${out.slice(0, 2000)}`);
        }
      } finally {
        rmSync(procDir, { recursive: true, force: true });
      }
    }
    expect(stats.refused).toBeGreaterThan(0);
    expect(stats.accepted).toBeGreaterThan(0);
  }, 300_000);
});
