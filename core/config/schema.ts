/** TypeBox schema of `config.yaml`: LiteLLM's proxy config format with `svc_params`. */
import { FormatRegistry, type Static, Type as T } from "@sinclair/typebox";
import { secretProblem } from "../callbacks/signing.ts";
import { CONTROL_CHARS } from "../header-text.ts";
import { DURATION_PATTERN, MAX_DURATION, parseDuration } from "../identity/duration.ts";
import { MAX_NAME_CHARS } from "../wire.ts";

const HTTP_URL = /^https?:\/\//;

// Checks a pattern cannot express. Each passes what its field's pattern refuses, so one mistake is one error.
/** What a value that fails one of these formats is told (the field's description follows). */
export const FORMAT_ERRORS: Record<string, string> = {
  "svc-url": "Expected a URL that parses",
  "svc-duration": `Expected a duration longer than 0 and at most ${MAX_DURATION}`,
  "svc-header-value": "Expected text a header can carry",
  "svc-model-name": "Expected text without control characters (answers carry it in x-svc-model-group / x-svc-model-id)",
  "svc-signing-secret": "Expected at least 16 bytes, or whsec_ and base64 of at least 16 bytes",
};
/**
 * What fetch sends as a header value (it refuses the rest when the call is made, every call): Latin-1
 * text without a NUL, and without line breaks but at either end, which it strips (a key read from a
 * file or a variable often ends with one).
 */
// biome-ignore lint/suspicious/noControlCharactersInRegex: NUL is what is refused
export const HEADER_VALUE = /^[\t\n\r ]*[^\r\n\u0000\u0100-\uffff]*?[\t\n\r ]*$/;
FormatRegistry.Set("svc-header-value", (v) => HEADER_VALUE.test(v));
FormatRegistry.Set("svc-model-name", (v) => !CONTROL_CHARS.test(v));
FormatRegistry.Set("svc-signing-secret", (v) => secretProblem(v) === undefined);
/** An http(s) URL must also parse: `http://` or `http://a b` pass the pattern, then fail every call (or the registry build). */
FormatRegistry.Set("svc-url", (v) => {
  if (!HTTP_URL.test(v)) return true;
  try {
    new URL(v);
    return true;
  } catch {
    return false;
  }
});
/** A duration longer than 0 and at most MAX_DURATION: `0d` would make a retention job run without pause, a budget period never end. */
FormatRegistry.Set("svc-duration", (v) => {
  if (!DURATION_PATTERN.test(v)) return true;
  const ms = parseDuration(v);
  return typeof ms === "number" && ms > 0;
});

const HttpUrl = T.String({ pattern: "^https?://", format: "svc-url", description: "an http(s) URL" });
const NonNegative = T.Number({ minimum: 0 });
const PositiveInt = T.Integer({ minimum: 1 });
/** A period (longer than 0, at most MAX_DURATION), in config.yaml and in management bodies (a per-model budget's `time_period`). */
export const Duration = T.String({ pattern: DURATION_PATTERN.source, format: "svc-duration", description: "a duration such as 1h, 1d, 30d" });
const HeaderValue = T.String({ format: "svc-header-value", description: "a header value: Latin-1 text, no line break inside, no NUL" });
/** Header names and values as fetch sends them: a name is an HTTP token (RFC 9110). */
const HttpHeaders = T.Record(T.String({ pattern: "^[!#$%&'*+\\-.^_`|~0-9A-Za-z]+$" }), HeaderValue, {
  additionalProperties: T.Never({ description: "a header name: letters, digits and !#$%&'*+-.^_`|~" }),
});

/**
 * Price overrides (svc_params, model_info): every field of the price file the gateway reads, in USD.
 * Bounded so that one call stays within what the spend log stores (2^63 pico-dollars, about $9.2M
 * a row): a larger price made every call of the deployment fail to be logged and charged.
 */
const PerToken = T.Number({ minimum: 0, maximum: 1, description: "USD per token, at most 1" });
const PerUnit = T.Number({ minimum: 0, maximum: 1000, description: "USD per unit, at most 1000" });
const TIERS = ["1000k", "272k", "256k", "200k", "128k"];
const PRICE_FIELDS = {
  input_cost_per_token: T.Optional(PerToken),
  output_cost_per_token: T.Optional(PerToken),
  cache_read_input_token_cost: T.Optional(PerToken),
  cache_creation_input_token_cost: T.Optional(PerToken),
  output_cost_per_reasoning_token: T.Optional(PerToken),
  input_cost_per_audio_token: T.Optional(PerToken),
  output_cost_per_audio_token: T.Optional(PerToken),
  input_cost_per_character: T.Optional(PerToken),
  output_cost_per_character: T.Optional(PerToken),
  input_cost_per_pixel: T.Optional(PerToken),
  output_cost_per_pixel: T.Optional(PerToken),
  input_cost_per_second: T.Optional(PerUnit),
  output_cost_per_second: T.Optional(PerUnit),
  input_cost_per_image: T.Optional(PerUnit),
  output_cost_per_image: T.Optional(PerUnit),
  ...Object.fromEntries(
    TIERS.flatMap((k) =>
      ["input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost", "cache_creation_input_token_cost"].map((f) => [`${f}_above_${k}_tokens`, T.Optional(PerToken)]),
    ),
  ),
};

/** A name the gateway sends back in x-svc-model-group / x-svc-model-id (percent-encoded when a header cannot carry it as it is). */
const ModelName = T.String({ minLength: 1, maxLength: MAX_NAME_CHARS, format: "svc-model-name" });

export const SvcParamsSchema = T.Object(
  {
    model: T.String({ pattern: "^[^/\\s]+/\\S+$", maxLength: MAX_NAME_CHARS, description: "<provider>/<model>" }),
    api_base: T.Optional(HttpUrl),
    api_key: T.Optional(T.String({ format: "svc-header-value", description: "a key sent in a header: Latin-1 text, no line break inside, no NUL" })),
    api_version: T.Optional(T.String()),
    rpm: T.Optional(PositiveInt),
    tpm: T.Optional(PositiveInt),
    timeout: T.Optional(T.Number({ exclusiveMinimum: 0 })),
    stream_timeout: T.Optional(T.Number({ exclusiveMinimum: 0 })),
    weight: T.Optional(NonNegative),
    ...PRICE_FIELDS,
    headers: T.Optional(HttpHeaders),
    mock_response: T.Optional(T.String()),
  },
  { additionalProperties: true },
);

export const ModelInfoSchema = T.Object(
  {
    id: T.Optional(ModelName),
    mode: T.Optional(T.String()),
    base_model: T.Optional(T.String()),
    ...PRICE_FIELDS,
    access_groups: T.Optional(T.Array(T.String())),
  },
  { additionalProperties: true },
);

export const ModelEntrySchema = T.Object(
  {
    model_name: ModelName,
    svc_params: SvcParamsSchema,
    model_info: T.Optional(ModelInfoSchema),
  },
  { additionalProperties: false },
);

export const PluginEntrySchema = T.Object(
  {
    path: T.String({ minLength: 1, description: "file path of the plugin module, relative to config.yaml" }),
    config: T.Optional(T.Record(T.String(), T.Unknown())),
  },
  { additionalProperties: false },
);

/** `[{"gpt-4": ["gpt-4o-mini", …]}, …]`: per model group, the groups tried in order when it fails. */
const FallbackList = T.Array(T.Record(T.String(), T.Array(T.String())));

const Retries = T.Optional(T.Integer({ minimum: 0 }));
/** LiteLLM's retry policy: retries per class of upstream error (a content-policy refusal goes to its fallbacks, never retried). */
const RetryPolicySchema = T.Object(
  {
    BadRequestErrorRetries: Retries,
    AuthenticationErrorRetries: Retries,
    TimeoutErrorRetries: Retries,
    RateLimitErrorRetries: Retries,
    InternalServerErrorRetries: Retries,
    ContentPolicyViolationErrorRetries: Retries,
    max_retries: Retries,
    num_retries: Retries,
  },
  { additionalProperties: false },
);

export const RouterSettingsSchema = T.Object(
  {
    routing_strategy: T.Optional(
      T.Union([
        T.Literal("simple-shuffle"),
        T.Literal("least-busy"),
        T.Literal("latency-based-routing"),
        T.Literal("usage-based-routing"),
        T.Literal("usage-based-routing-v2"),
        T.Literal("cost-based-routing"),
      ]),
    ),
    num_retries: T.Optional(T.Integer({ minimum: 0 })),
    /** LiteLLM's other name for num_retries. */
    max_retries: T.Optional(T.Integer({ minimum: 0 })),
    retry_policy: T.Optional(RetryPolicySchema),
    /** A retry policy per model group (which may also set `max_retries`). */
    model_group_retry_policy: T.Optional(T.Record(T.String(), RetryPolicySchema)),
    timeout: T.Optional(T.Number({ exclusiveMinimum: 0 })),
    /** Minimum seconds between retries; upstream `retry-after` and the exponential backoff can make it longer. */
    retry_after: T.Optional(T.Number({ minimum: 0 })),
    /** Seconds of the first backoff step (doubled per retry, at most 8 s). */
    retry_initial_delay: T.Optional(T.Number({ minimum: 0 })),
    /** Failures per minute a deployment may have before it cools down. */
    allowed_fails: T.Optional(T.Integer({ minimum: 0 })),
    /** Seconds a failing deployment is left out of routing. */
    cooldown_time: T.Optional(T.Number({ minimum: 0 })),
    disable_cooldowns: T.Optional(T.Boolean()),
    fallbacks: T.Optional(FallbackList),
    context_window_fallbacks: T.Optional(FallbackList),
    content_policy_fallbacks: T.Optional(FallbackList),
    default_fallbacks: T.Optional(T.Array(T.String())),
    max_fallbacks: T.Optional(T.Integer({ minimum: 0 })),
    /** Public names of model groups: `{gpt-4: gpt-4o}`, or `{gpt-4: {model: gpt-4o, hidden: true}}` to serve a name /v1/models does not list. */
    model_group_alias: T.Optional(
      T.Record(T.String({ minLength: 1 }), T.Union([T.String({ minLength: 1 }), T.Object({ model: T.String({ minLength: 1 }), hidden: T.Optional(T.Boolean()) }, { additionalProperties: false })])),
    ),
    /** Spend caps per provider: `{openai: {budget_limit: 100, time_period: "1d"}}` (USD per period, periods aligned to UTC). */
    provider_budget_config: T.Optional(
      T.Record(
        T.String(),
        T.Object(
          {
            budget_limit: NonNegative,
            time_period: Duration,
          },
          { additionalProperties: false },
        ),
      ),
    ),
  },
  { additionalProperties: true },
);

export const SvcSettingsSchema = T.Object(
  {
    drop_params: T.Optional(T.Boolean()),
    num_retries: T.Optional(T.Integer({ minimum: 0 })),
    request_timeout: T.Optional(T.Number({ exclusiveMinimum: 0 })),
    callbacks: T.Optional(T.Array(T.String())),
    success_callback: T.Optional(T.Array(T.String())),
    failure_callback: T.Optional(T.Array(T.String())),
    /** A price file in the bundled file's format; its entries replace the bundled ones by name. */
    model_prices_path: T.Optional(T.String({ minLength: 1 })),
    /** Lets an embeddings request carry its own api_base / api_key / api_version (off: such a request is a 400). */
    allow_client_side_credentials: T.Optional(T.Boolean()),
    /** With client-side credentials on: the only hosts a request's api_base may name. */
    client_side_api_base_hosts: T.Optional(T.Array(T.String({ minLength: 1 }))),
    /** Response cache for every call (see cache_params); requests may still opt out with `caching: false`. */
    cache: T.Optional(T.Boolean()),
    cache_params: T.Optional(
      T.Object(
        {
          /** `redis` needs REDIS_URL; default: redis when configured, else this process's memory. */
          type: T.Optional(T.Union([T.Literal("local"), T.Literal("redis")])),
          /** Seconds an answer is kept (default 600). */
          ttl: T.Optional(T.Number({ exclusiveMinimum: 0 })),
          namespace: T.Optional(T.String()),
          /** `default_off`: only requests with `caching: true` use the cache. */
          mode: T.Optional(T.Union([T.Literal("default_on"), T.Literal("default_off")])),
        },
        { additionalProperties: true },
      ),
    ),
  },
  { additionalProperties: true },
);

/** `general_settings.pass_through_endpoints[]`: a route of the gateway forwarded as-is to another HTTP API. */
export const PassThroughEndpointSchema = T.Object(
  {
    /** Names the endpoint in `/config/pass_through_endpoint` (default: its path). */
    id: T.Optional(T.String({ minLength: 1 })),
    path: T.String({ pattern: "^/[^?#\\s]*$", description: "a path starting with /" }),
    target: HttpUrl,
    /** Sent upstream with every call; `os.environ/NAME` anywhere in a value reads the environment. */
    headers: T.Optional(HttpHeaders),
    /** Also send the client's own headers (never the gateway credential it authenticated with). */
    forward_headers: T.Optional(T.Boolean()),
    /** `/path/anything…` is forwarded to `target/anything…` too. */
    include_subpath: T.Optional(T.Boolean()),
    /** USD charged for each successful call (spend, budgets). */
    cost_per_request: T.Optional(T.Number({ minimum: 0, maximum: 1_000_000, description: "USD per call, at most 1000000" })),
    /** Default true: a gateway key is required. `false` makes the route public. */
    auth: T.Optional(T.Boolean()),
    /** Default: every method. */
    methods: T.Optional(T.Array(T.Union([T.Literal("GET"), T.Literal("POST"), T.Literal("PUT"), T.Literal("PATCH"), T.Literal("DELETE")]), { minItems: 1 })),
    /** Seconds without an answer (or between two parts of it) before 408; default the gateway's request timeout. */
    timeout: T.Optional(T.Number({ exclusiveMinimum: 0 })),
  },
  { additionalProperties: false },
);

/** The largest request body the gateway takes, in MiB (a 25 MB audio upload fits twice over). */
export const MAX_REQUEST_MB = 64;

export const GeneralSettingsSchema = T.Object(
  {
    master_key: T.Optional(T.String({ pattern: "^sk-", description: "a key starting with sk-" })),
    database_url: T.Optional(T.String({ pattern: "^postgres(ql)?://", description: "a postgres:// URL" })),
    redis_url: T.Optional(T.String({ pattern: "^rediss?://", description: "a redis:// URL" })),
    /** Request bodies larger than this are refused with a 413 (default and most: MAX_REQUEST_MB). */
    max_request_size_mb: T.Optional(T.Number({ exclusiveMinimum: 0, maximum: MAX_REQUEST_MB })),
    /** Budget alerts are POSTed here (else WEBHOOK_URL). */
    alert_webhook_url: T.Optional(HttpUrl),
    /**
     * Low-budget alerts (`threshold_crossed`) when this part of a budget is left (default [0.15, 0.05],
     * LiteLLM's; [] for none), each once per budget and period.
     */
    budget_alert_thresholds: T.Optional(T.Array(T.Number({ exclusiveMinimum: 0, exclusiveMaximum: 1 }), { maxItems: 10, uniqueItems: true })),
    /** Budget alerts are signed with it, Standard Webhooks style (else WEBHOOK_SECRET; unsigned without either). */
    alert_webhook_secret: T.Optional(T.String({ format: "svc-signing-secret", description: "a signing secret" })),
    /** Spend-log rows older than this are deleted (daily aggregates and counters stay). */
    maximum_spend_logs_retention_period: T.Optional(Duration),
    /** How often the retention clean-up runs (default 24h). */
    maximum_spend_logs_retention_interval: T.Optional(Duration),
    /** The prompt and the answer of each call are kept in its spend-log row (off: neither is stored). */
    store_prompts_in_spend_logs: T.Optional(T.Boolean()),
    /** No spend-log rows at all; spend counters, budgets and daily aggregates are kept as ever. */
    disable_spend_logs: T.Optional(T.Boolean()),
    /** Failed calls that cost nothing are not logged (no spend-log row, not counted as failed requests). */
    disable_error_logs: T.Optional(T.Boolean()),
    pass_through_endpoints: T.Optional(T.Array(PassThroughEndpointSchema)),
    /** The unfiltered spend reports' finished days of this many days back are built in the background, at start and after each UTC midnight (default 30; 0: only when asked). */
    spend_report_prebuild_days: T.Optional(T.Integer({ minimum: 0, maximum: 366 })),
  },
  { additionalProperties: true },
);

/** Declares no `default`: the loader fills in none (parseConfig), the code that reads a setting knows it. */
export const ConfigSchema = T.Object(
  {
    /** Required by the type; a file without one gets [] (set by the loader, not a schema default: TypeBox's would turn a mapping written here into []). */
    model_list: T.Array(ModelEntrySchema),
    router_settings: T.Optional(RouterSettingsSchema),
    svc_settings: T.Optional(SvcSettingsSchema),
    general_settings: T.Optional(GeneralSettingsSchema),
    plugins: T.Optional(T.Array(PluginEntrySchema)),
    /** A number or true/false is set as its text, as LiteLLM does (`str(value)`): see load.ts envText. */
    environment_variables: T.Optional(T.Record(T.String(), T.Union([T.String(), T.Number(), T.Boolean()], { description: "text, a number or true/false" }))),
  },
  { additionalProperties: false },
);

export type GatewayConfig = Static<typeof ConfigSchema>;
export type ModelEntry = Static<typeof ModelEntrySchema>;
export type PassThroughEndpointConfig = Static<typeof PassThroughEndpointSchema>;
