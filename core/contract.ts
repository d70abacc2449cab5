/**
 * The plugin API: the only module a plugin (built-in or third-party) imports.
 * Nothing here depends on Elysia, so plugins survive framework upgrades and hot swaps.
 */
import type { Static, TSchema } from "@sinclair/typebox";
import type { AccessGroupLookup } from "./access.ts";
import type { ModelReach } from "./limits/capacity.ts";

export type { AccessGroupLookup };
import type { BudgetRow, IdentityChange, KeyRow, OrgRow, TeamMemberRow, TeamRow, UserRow } from "./identity/records.ts";
import type { ChatRequest, CompletionRequest, EmbeddingsRequest, ImageRequest, ModerationRequest, SpeechRequest, TranscriptionRequest, WireJson } from "./wire.ts";

export type { BudgetRow, IdentityChange, KeyRow, OrgRow, TeamMemberRow, TeamRow, UserRow } from "./identity/records.ts";
export { keyCounterToken, teamMemberId, teamMemberOf } from "./identity/records.ts";

export type { ChatRequest, CompletionRequest, EmbeddingsRequest, ImageRequest, ModerationRequest, SpeechRequest, TranscriptionRequest, WireJson } from "./wire.ts";

export type Endpoint = "chat" | "completions" | "embeddings" | "images" | "transcriptions" | "speech" | "moderations";
/** What a call is: a model endpoint, or a route forwarded as-is (`pass_through_endpoints`). */
export type CallType = Endpoint | "pass_through";

export interface WireRequest {
  chat: ChatRequest;
  completions: CompletionRequest;
  embeddings: EmbeddingsRequest;
  images: ImageRequest;
  transcriptions: TranscriptionRequest;
  speech: SpeechRequest;
  moderations: ModerationRequest;
}

/** What a call consumed, in the OpenAI convention: the details are parts of the totals, not additions. */
export interface Usage {
  promptTokens: number;
  completionTokens: number;
  /** Prompt tokens read from the provider's prompt cache (part of promptTokens). */
  cachedPromptTokens?: number;
  /**
   * Of cachedPromptTokens, those that were audio, so also counted in audioPromptTokens (OpenAI's
   * `prompt_tokens_details.cached_tokens_details.audio_tokens`): priced once, at the cached-audio rate.
   */
  cachedAudioPromptTokens?: number;
  /** Prompt tokens written to the provider's prompt cache (part of promptTokens). */
  cacheCreationTokens?: number;
  /** Of cacheCreationTokens, those written for an hour (Anthropic's `ephemeral_1h_input_tokens`), priced at their own rate. */
  cacheCreation1hTokens?: number;
  /** Prompt tokens that were audio (part of promptTokens). */
  audioPromptTokens?: number;
  /** Output tokens spent reasoning (part of completionTokens). */
  reasoningTokens?: number;
  /** Output tokens that were audio (part of completionTokens). */
  audioCompletionTokens?: number;
  /** Prompt tokens of sources the model cited (part of promptTokens; Perplexity's `citation_tokens`), priced at their own rate. */
  citationTokens?: number;
  /** Prompt tokens that were images (part of promptTokens; gpt-image models' `input_tokens_details.image_tokens`). */
  imagePromptTokens?: number;
  /** Output tokens that were images (part of completionTokens; what a gpt-image model's answer counts). */
  imageCompletionTokens?: number;
  /** Images generated: count, and the `size` (`1024x1024`) and `quality` asked for. */
  images?: { count: number; size?: string; quality?: string };
  /** Seconds of audio processed (transcription). */
  audioSeconds?: number;
  /** Characters of input (speech synthesis). */
  characters?: number;
  /** Web searches the model ran on the provider's side (Anthropic's `server_tool_use.web_search_requests`, an OpenAI search model's answer citing the web). */
  webSearchRequests?: number;
  /** The search context size they were asked at (`web_search_options.search_context_size`); default medium. */
  searchContextSize?: "low" | "medium" | "high";
  /**
   * The model the answer names, where it is the model behind a deployment of any name (Azure's):
   * the call is priced as that model when the deployment itself has no price.
   */
  answerModel?: string;
}

/** One `model_list` entry after config resolution: what an adapter needs to reach its upstream. */
export interface Deployment {
  /** Deployment id (`model_info.id`, or a stable hash of the entry). */
  id: string;
  /** Public model group name (`model_name`). */
  modelName: string;
  /** Provider id, the part of `svc_params.model` before the first `/`. */
  provider: string;
  /** Upstream model id, the part of `svc_params.model` after the first `/`. */
  upstreamModel: string;
  apiBase?: string;
  apiKey?: string;
  apiVersion?: string;
  /** Seconds. */
  timeout?: number;
  headers?: Record<string, string>;
  /**
   * What the provider's `resolve` made of the deployment's credentials (its `svc_params`' or the
   * environment's), in the form its transforms and `authorize` read them: an Azure key or Entra ID
   * client, a Google credential's id. Opaque to the core, which drops it (with `apiKey`,
   * `headers` and credential fields) when a client's own credentials take the deployment's place.
   */
  credentials?: unknown;
  /** Every other `svc_params` field, for adapters with provider-specific options. */
  options: Record<string, unknown>;
  /** The entry's `model_info` (prices, `base_model`, `mode`, …); `{}` when absent. */
  info: Record<string, unknown>;
  /**
   * A client-chosen `api_base` host and the address it was checked at (the host itself for an
   * address literal): calls connect there (core/pinned-fetch.ts), not to what the name resolves
   * to by then, and follow no redirect.
   */
  connectTo?: { host: string; address: string };
}

export interface HttpCall {
  url: string;
  method?: "POST" | "GET";
  headers: Record<string, string>;
  body?: string;
  /** A multipart body (an uploaded file) instead of `body`; fetch sets its content type. */
  form?: FormData;
}

/** An error the gateway answers with, in the spec's envelope. */
export interface ErrorInfo {
  status: number;
  type: string;
  message: string;
  param?: string | null;
  /** For `budget_exceeded`: which budget refused the call, in figures a client can act on. */
  budget?: BudgetRefusalDetail;
}

/** The budget a call was refused by (the error envelope's `budget`), amounts in USD. */
export interface BudgetRefusalDetail {
  /** `key`, `team`, `organization`, `user`, `team_member`, `provider`, `budget`, … */
  entity: string;
  /** The key's hash, the team's id, the provider's name, … (`team_id\tuser_id` for a team member). */
  id: string;
  /** For a key's budget on one model (`model_max_budget`). */
  model?: string;
  /** The budget object `max_budget` comes from, when the owner has none of its own. */
  budget_id?: string;
  max_budget: number;
  spend: number;
  /** Held by calls in flight. */
  reserved: number;
  /** The most this call could have cost, when it was refused for that (the budget not yet spent). */
  call_cost?: number;
  /** When the budget's period ends (null: it never resets). */
  budget_reset_at: string | null;
}

/** A stream part produced by an adapter: the OpenAI chunk to send, or usage learned from upstream. */
export type StreamPart =
  /**
   * `opens`: the chunk only opens the message (its role, no content), as Anthropic's and Bedrock's
   * first event does: an upstream error after it still fails the attempt before the client got
   * anything (pipeline/stream.ts), so the router can retry it or fall back.
   */
  | { type: "chunk"; chunk: WireJson; opens?: true }
  /** A chunk already serialized as JSON text, sent as is (no re-serialization on the hot path). */
  | { type: "data"; data: string; opens?: true }
  | { type: "usage"; usage: Usage }
  | { type: "error"; error: ErrorInfo }
  /**
   * The provider's terminal event, one its wire format sends nothing after (OpenAI's `[DONE]`,
   * Anthropic's `message_stop`): the stream ends there as at the end of the body, without waiting
   * for it (an upstream may hold the connection open), and nothing after it is read. Not a finish
   * reason: OpenAI's usage chunk and Bedrock's metadata come after theirs.
   */
  | { type: "end" };

/** How an upstream stream is framed: SSE `data:` events, one JSON object per line, or AWS's binary event stream. */
export type StreamFraming = "sse" | "ndjson" | "aws-eventstream";

/**
 * One message of an `aws-eventstream` upstream, as the JSON text `StreamTransform.event` receives:
 * `type` is the `:event-type` header (`:exception-type` for exceptions, `:error-code` for errors),
 * `payload` the message's JSON payload.
 */
export interface AwsStreamEvent {
  messageType: "event" | "exception" | "error";
  type: string;
  payload: unknown;
}

export interface StreamTransform<E extends Endpoint, S> {
  /** Upstream framing; the core parses it. */
  framing: StreamFraming;
  init(req: WireRequest[E]): S;
  /** One upstream event's data → parts to emit (for `aws-eventstream`: an `AwsStreamEvent` as JSON text). */
  event(data: string, state: S): StreamPart[];
  /** Best usage estimate when the stream ends without upstream usage (cut or cancelled). */
  estimate(state: S): Usage;
  /** The response `id` the client saw in the stream, if any (spend logs key on it). */
  responseId?(state: S): string | undefined;
  /**
   * Whether the upstream's own end of the answer was seen (OpenAI's `[DONE]` or usage chunk,
   * Anthropic's message_delta, a finish on every Gemini candidate, …). A body that ends before it
   * is a stream that failed (the client gets an error event, not `[DONE]`). Absent: not checked.
   */
  complete?(state: S): boolean;
}

/** Pure transforms for one endpoint: no I/O. The core owns fetch, timeouts, abort and framing. */
export interface EndpointAdapter<E extends Endpoint, S = unknown> {
  /**
   * `raw` is the client's body exactly as it arrived, given when the gateway changed nothing in it:
   * an adapter whose upstream body would be identical may forward these bytes instead of
   * re-serializing (large base64 payloads).
   */
  request(req: WireRequest[E], deployment: Deployment, raw?: string): HttpCall;
  /**
   * `req`, the client's request, is for what the upstream does not echo back (the model name,
   * `encoding_format`); `headers`, the upstream's response headers, for what it says only there
   * (Bedrock's InvokeModel token counts).
   */
  response(body: unknown, req?: WireRequest[E], headers?: Headers): { body: WireJson; usage: Usage; text?: TextAnswer };
  /**
   * An upstream answer that is not JSON (a transcript as plain text, SRT or VTT), passed on as it
   * is. Absent: such an answer is an error.
   */
  textResponse?(text: string, contentType: string, req: WireRequest[E]): { text: TextAnswer; usage: Usage };
  /**
   * The answer is binary (synthesized audio): passed on as the upstream sent it, with this usage
   * (known from the request). Present: `response` is not called.
   */
  binaryUsage?(req: WireRequest[E], answer: { bytes: number; contentType: string }): Usage;
  stream?: StreamTransform<E, S>;
  /**
   * For an upstream that takes fewer inputs per call than a client may send (Titan embeddings: one
   * text per call): the request as the parts to send instead, one call each (built by `request`,
   * mapped by `response`), one after another; the first that fails ends the call. `join` makes the
   * client's answer of their answers. Undefined (or absent): one call. Never for streams.
   */
  split?(req: WireRequest[E], deployment: Deployment): WireRequest[E][] | undefined;
  join?(answers: { body: WireJson; usage: Usage }[], req: WireRequest[E]): { body: WireJson; usage: Usage };
  /**
   * The OpenAI request fields this adapter translates (beyond `model`, `messages`/`prompt`/`input`
   * and `stream`). Absent means "everything OpenAI accepts" (pass-through adapters). Other fields
   * are refused with a 400 naming them, or dropped with `drop_params`.
   */
  supportedParams?: readonly string[];
  /**
   * The fields translated for one deployment, where that depends on it (one provider id serving
   * two APIs, as `vertex_ai` serves Gemini and Claude); `supportedParams` then lists them all, for
   * callers without a deployment at hand. Undefined: `supportedParams`.
   */
  supportedParamsFor?(deployment: Deployment): readonly string[] | undefined;
}

/** An answer sent as text rather than JSON (`response_format: text`, `srt`, `vtt`). */
export interface TextAnswer {
  body: string;
  contentType: string;
}

/**
 * Upstream failures the router treats specially: a prompt too long for the model goes to the
 * context-window fallbacks, a refusal by the provider's content filter to the content-policy ones.
 */
export type UpstreamErrorKind = "context_window_exceeded" | "content_policy_violation";

/** A provider's own token-counting endpoint (`/utils/token_counter` with `call_endpoint=true`). */
export interface TokenCountAdapter {
  request(req: ChatRequest, deployment: Deployment): HttpCall;
  /** The upstream answer → the prompt's token count. */
  response(body: unknown): number;
}

export interface ProviderAdapter {
  /** Provider ids this adapter serves (`openai`, `groq`, …). */
  ids: readonly string[];
  endpoints: { [E in Endpoint]?: EndpointAdapter<E, unknown> };
  /**
   * Called once per deployment when a config is loaded: fills provider defaults (base URL, key
   * from the environment). Returns an error message when the deployment cannot work.
   */
  resolve?(deployment: Deployment): Deployment | string;
  /**
   * The upstream's own rate-limit state as OpenAI's `x-ratelimit-*` headers, passed on where no
   * gateway limit of that kind applies. Absent: OpenAI's header names are read as they are.
   */
  rateLimitHeaders?(upstream: Headers): Record<string, string>;
  /** Maps an upstream error body to the message shown to the client. */
  errorMessage?(status: number, body: string): string;
  /**
   * Recognises context-window and content-policy failures in an upstream error answer, or in an
   * error event of its stream (then `body` is the message the stream transform made of it).
   */
  errorKind?(status: number, body: string): UpstreamErrorKind | undefined;
  /**
   * Asynchronous credentials applied to a built call just before it is sent (AWS SigV4 signing,
   * a Google OAuth access token). The adapter's transforms stay pure; only this step may do I/O.
   */
  authorize?(call: HttpCall, deployment: Deployment): Promise<HttpCall>;
  countTokens?: TokenCountAdapter;
  /**
   * Replaces the network for this provider: receives the built call and answers as the upstream
   * would. Used by in-process providers such as `mock`.
   */
  transport?(call: HttpCall, signal: AbortSignal): Promise<Response>;
}

export type Role = "proxy_admin" | "proxy_admin_viewer" | "internal_user" | "internal_user_viewer";

/** Who is calling, as established by an auth plugin. */
export interface Principal {
  /** sha256 hex of the key (the master key's too). */
  keyHash: string;
  role: Role;
  keyAlias?: string;
  userId?: string;
  teamId?: string;
  orgId?: string;
  metadata: Record<string, unknown>;
  /** Which models and routes this caller may use; absent means unrestricted (the master key). */
  access?: AccessRules;
  /** The stored records behind a virtual key, for limit and budget plugins. */
  key?: KeyRow;
  team?: TeamRow;
  org?: OrgRow;
  user?: UserRow;
}

export type AccessLevelName = "key" | "team" | "org" | "user";

/** One level's model list: empty `models` and `accessGroupIds` mean "no restriction at this level". */
export interface AccessLevel {
  level: AccessLevelName;
  models: readonly string[];
  accessGroupIds: readonly string[];
}

export interface AccessRules {
  /** Every level must allow the model. */
  levels: readonly AccessLevel[];
  /** Requested model name → model group actually called (key aliases over team and org ones). */
  aliases: Readonly<Record<string, string>>;
  /** Which level set each alias (a level trusts only aliases set at or above it); absent means `key`. */
  aliasSources?: Readonly<Record<string, AccessLevelName>>;
  /** The key's own `allowed_routes`: exact paths, `prefix/*` patterns or named groups; empty means every route. */
  allowedRoutes: readonly string[];
  /**
   * The route groups of the key's `key_type`, which bind it when it has no `allowed_routes`: kept
   * apart so they do not stand for its own list (its `allowed_passthrough_routes` apply within them).
   */
  keyTypeRoutes?: readonly string[];
  allowedPassthroughRoutes: readonly string[];
}

export interface AuthRequest {
  /** The bearer credential from `Authorization` or `x-svc-api-key`, if any. */
  credential: string | undefined;
  path: string;
  headers: Headers;
}

/** `null` means "not mine"; the next auth plugin is asked. A denial stops the request. */
export interface AuthResolver {
  resolve(req: AuthRequest): Promise<Principal | Denied | null> | Principal | Denied | null;
}

export interface Denied {
  ok: false;
  error: ErrorInfo;
  retryAfterSeconds?: number;
  /** Extra response headers (`x-ratelimit-*`). */
  headers?: Record<string, string>;
  /**
   * The refused limit is a share of the model group's own capacity (a dynamic share, what
   * guaranteed keys leave): the refusal already names the group's capacity, so the router does not
   * answer for the deployments instead when they are at their rpm/tpm too.
   */
  groupCapacity?: boolean;
}

export interface Lease {
  ok: true;
  /** `cost`: what the call really cost, in pico-dollars (1e-12 USD). */
  settle(actual: Usage, cost: bigint): void;
  /**
   * The call was refused before it went upstream (by a later gate, or no deployment could take it):
   * undo what was counted, as if it had never been asked. Without it, `settle` with zero usage.
   */
  cancel?(): void;
  /** Headers the answer carries because of this lease (`x-ratelimit-*`). */
  headers?: Record<string, string>;
  /** For a `both` intent: the request's part and the group's, settled (or taken back) separately. */
  parts?: { request: Lease; group: Lease };
}

export interface CallIntent {
  principal: Principal;
  endpoint: CallType;
  /**
   * What a rate limiter counts. A request's own limits (the key's, user's, team's, member's and
   * org's) are counted once and held until the request ends, whatever fallbacks it takes; per-model
   * limits and model capacity shares once per model group tried. The first group asks for both in
   * one step (`both`; the lease then has `parts`, so each is ended at its own time), a fallback
   * group for its own (`group`). `request` asks for the request's own alone. Budgets are asked per
   * group and may ignore the scope.
   */
  scope: "request" | "group" | "both";
  modelGroup: string;
  /** The names a per-model limit may give the group: its own, then the `model_group_alias` names that call it. */
  modelNames: readonly string[];
  /** The deployment the call will go to. */
  deployment: Deployment;
  /** A conservative prompt size (an upper estimate, not a tokenizer's exact count): rate limits reserve it. */
  estimatedPromptTokens: number;
  /** A prompt size the real count never exceeds (a token per UTF-8 byte): budgets reserve on it. */
  promptTokenBound: number;
  /** The answer-token limit the request sets for one answer (`max_completion_tokens`, `max_tokens`), if any. */
  maxOutputTokens: number | undefined;
  /**
   * How many answers the call is billed for, each up to `maxOutputTokens`: a chat call's `n`; a
   * completions call's `n`, or its `best_of` candidates when more, for each prompt of a batch; else 1.
   */
  answers: number;
  /** The most the call can cost, in pico-dollars: prompt bound and output bound at the model's prices (0 when unpriced). */
  worstCaseCost: bigint;
  /** Milliseconds since the epoch; budgets charge the call to the period it started in. */
  startedAt: number;
  /**
   * The answer comes from the response cache: it costs nothing (`worstCaseCost` is 0) and calls no
   * provider, so a budget refuses it only when already spent, and provider budgets do not apply.
   */
  cacheHit?: boolean;
  /**
   * What the call draws capacity from: `modelGroup`, or the wildcard route (`openai/*`) serving it,
   * whose deployments every name it serves shares.
   */
  capacityGroup: string;
  /** The capacity group's capacity: the sum of its deployments' `rpm` / `tpm` (absent when any deployment has none). */
  groupCapacity: GroupCapacity;
  /** The call's model table, access groups and `model_group_alias`: which keys may call a group, as a model call judges it. */
  modelReach: ModelReach;
}

export interface GroupCapacity {
  rpm?: number;
  tpm?: number;
}

/** All configured rate limiters must grant. */
export interface RateLimiter {
  acquire(intent: CallIntent): Promise<Lease | Denied> | Lease | Denied;
}

/** All configured budget checkers must grant. */
export interface BudgetChecker {
  reserve(intent: CallIntent): Promise<Lease | Denied> | Lease | Denied;
}

export type CallStatus = "success" | "failure" | "cancelled";

/** One finished model call, handed to spend recorders and logging callbacks off the response path. */
export interface CallRecord {
  id: string;
  endpoint: CallType;
  principal: Principal;
  modelGroup: string;
  provider: string;
  deploymentId: string;
  upstreamModel: string;
  stream: boolean;
  status: CallStatus;
  usage: Usage;
  /** In pico-dollars (1e-12 USD); 0 for failures and for models without a price. */
  cost: bigint;
  /** False when the model had no price (the cost is then 0, not a real figure). */
  priced: boolean;
  /** Which price entry the cost came from, or why there was none. */
  costSource: string;
  /** The model name the client asked for (before aliases). */
  requestedModel: string;
  /** The response `id` the client saw (`chatcmpl-…`), when the upstream gave one. */
  responseId?: string;
  /** The request's `user` field: the caller's own end user. */
  endUser?: string;
  /** Request tags (`metadata.tags` in the body) and the key's tags. */
  tags: readonly string[];
  cacheHit: boolean;
  startedAt: number;
  firstByteAt?: number;
  endedAt: number;
  error?: ErrorInfo;
  /** With `store_prompts_in_spend_logs`: what was asked (`messages`, `prompt` or `input`) and the answer as the client got it (a stream assembled into one object). */
  prompt?: unknown;
  answer?: unknown;
}

export interface SpendRecorder {
  record(call: CallRecord): void;
  flush(): Promise<void>;
}

export interface LoggingCallback {
  log(call: CallRecord): void | Promise<void>;
  flush?(): Promise<void>;
}

export interface Hooks {
  providers?: ProviderAdapter[];
  auth?: AuthResolver;
  rateLimiter?: RateLimiter;
  budget?: BudgetChecker;
  spend?: SpendRecorder;
  /** Named callbacks; enabled by name in `svc_settings.callbacks` (or success/failure lists). */
  callbacks?: Record<string, LoggingCallback>;
  dispose?(): Promise<void> | void;
}

/** One budget a call is checked against (money in pico-dollars, 1e-12 USD). */
export interface BudgetCounter {
  /** Stable id: `key:<token>`, `team:<id>`, `key_model:<token>:<model>`, `team_model:<team id>:<model>`, `org_model:<org id>:<model>`, `provider:<name>` (a key's token: `keyCounterToken`). */
  id: string;
  /** Whose budget, for messages: `Key sk-...abcd (alias)`, `Team=t1`, `Provider=openai`. */
  label: string;
  /**
   * The owner's id as refusals (`budget.id`) and alerts (`token`) give it, where the id names it
   * otherwise: a key's counters go by its first token, the key is named by the one it has now.
   */
  ownerId?: string;
  /**
   * The key whose call this counter was built for: an alert about a budget the key does not own
   * (a team member's) names it, as LiteLLM's alerts name the key that made the call.
   */
  callerKey?: { token: string; alias: string | null };
  /** A call is refused once spend has reached this. */
  limit: bigint;
  /** Alert (without blocking) when spend reaches this. */
  soft?: bigint;
  /**
   * Counted (reserved on and settled) but never refusing: a call that spends on this counter
   * without being governed by its budget (a user's team key: its spend is the user's spend).
   */
  chargeOnly?: boolean;
  /** End of the current period (ms since the epoch), null for a budget that never resets. */
  periodEnd: number | null;
  /**
   * The period's length (ms), for a budget that resets: two ends a whole number of periods apart
   * are two periods (a rollover); ends a write set apart otherwise (a new `budget_duration`, which
   * moves `budget_reset_at` and keeps the spend) are one period whose end moved.
   */
  periodMs?: number | null;
  /** When the period was last defined (the last write of its row, or of the budget object it follows; ms): of two definitions, the later holds. */
  definedAt?: number;
  /** The budget object (`budget_id`) the limit comes from, when the owner sets none of its own: refusals name it. */
  fromBudget?: string;
  /** Spend already in the store for this period; asked only when the ledger first meets the counter. */
  storedSpend(): bigint | Promise<bigint>;
}

export interface LedgerRefusal {
  ok: false;
  counter: BudgetCounter;
  spend: bigint;
  /** Held by calls in flight. */
  reserved: bigint;
}

export interface LedgerGrant {
  ok: true;
  /** Releases the reservation and adds the real cost. */
  settle(actual: bigint): void;
}

/**
 * Budget counters shared by every instance (in memory, or in Redis with REDIS_URL): a
 * reservation is checked and taken on all counters at once, or on none.
 */
export interface BudgetLedger {
  reserve(counters: readonly BudgetCounter[], amount: bigint): LedgerGrant | LedgerRefusal | Promise<LedgerGrant | LedgerRefusal>;
  /** Drops counters (after an admin reset of spend); their next use starts again from the store. */
  forget(ids: readonly string[]): Promise<void>;
  /** Drops only this instance's copies of counters another instance reset (it dropped the shared ones). */
  forgetHere(ids: readonly string[]): Promise<void>;
}

/**
 * One rate-limit counter over a sliding 60-second window: requests and tokens started in the last
 * 60 s, and requests in flight. Absent limits are not checked (the counter still counts).
 */
export interface RateCounter {
  /** Stable id: `key:<token>`, `team:<id>`, `key_model:<token>:<model>`, `deployment:<id>` (a key's token: `keyCounterToken`). */
  id: string;
  /** Whose limit, for messages: `Key sk-...abcd`, `Team=t1`. */
  label: string;
  rpm?: number;
  tpm?: number;
  parallel?: number;
  /**
   * A `dynamic` key's share of a pool: its rpm/tpm are the pool divided among the members that
   * counted a request on `among` in the window (this one included), at least 1. The windows keep
   * that set, so with Redis every instance sees the same members.
   */
  share?: { among: string; member: string; rpm?: number; tpm?: number };
  /**
   * Per kind, where a limit comes from when the counter's owner does not set it itself (a key's
   * rpm_limit taken from its budget object: `Budget=b1`), for messages. Windows ignore it.
   */
  sources?: Partial<Record<RateLimitKind, string>>;
}

export type RateLimitKind = "requests" | "tokens" | "parallel_requests";

export interface RateGrant {
  ok: true;
  /** The counters as applied (same order as asked): a share's rpm/tpm resolved to its current part. */
  applied: readonly RateCounter[];
  /** What is left on each counter right after this request was counted (same order as asked). */
  remaining: readonly { requests: number | undefined; tokens: number | undefined }[];
  /** Replaces the reserved token estimate with the real count and ends the in-flight request. */
  settle(actualTokens: number): void;
  /** Takes the request back: a later check refused the call before it went out, so it counts for nothing. */
  cancel(): void;
  /** The counters `from` to `to` (exclusive) alone, to be settled or taken back at their own time. */
  part(from: number, to: number): { settle(actualTokens: number): void; cancel(): void };
}

export interface RateRefusal {
  ok: false;
  /** The counter that refused, as applied (a share resolved). */
  counter: RateCounter;
  kind: RateLimitKind;
  limit: number;
  /** Used in the window (or in flight) when refused. */
  current: number;
  /** Milliseconds until the request would fit (0 when unknown, e.g. waiting on requests in flight). */
  retryAfterMs: number;
}

/**
 * Sliding-window counters (in memory, or in Redis with REDIS_URL): a request is checked and
 * counted on all of its counters at once, or on none, so a refused request consumes nothing.
 */
export interface RateWindows {
  acquire(counters: readonly RateCounter[], tokens: number): RateGrant | RateRefusal | Promise<RateGrant | RateRefusal>;
  /** What `acquire` would refuse now, counting nothing (undefined: it would grant). */
  refusal(counters: readonly RateCounter[], tokens: number): RateRefusal | undefined | Promise<RateRefusal | undefined>;
}

/** The rows that keep their own spend, each a budget counter. */
export type CounterTable = "key" | "team" | "org" | "user" | "team_member";

/** Sums of the stored spend log, for budgets whose spend is not kept on a row. */
export interface SpendHistory {
  /** `apiKeys`: one key's tokens (its calls are logged under the token each had); `orgId`: an organization's calls. */
  sum(filter: { apiKeys?: readonly string[]; teamId?: string; orgId?: string; modelGroup?: string; provider?: string; since: number }): Promise<bigint>;
  /**
   * A spend counter's row as stored once every call already ended is written (the identity
   * mirror's copy is as old as the row's last change); undefined when the row is gone.
   */
  counter?(table: CounterTable, id: string): Promise<{ spend: string; budgetResetAt: Date | null } | undefined>;
  /** The spend recorded for the period ending at `periodEnd` (null: a budget that never resets) of a counter without a row (`key_model:…`, `org_model:…`, `provider:…`); 0 when none. */
  periodSpend?(counter: string, periodEnd: number | null): Promise<bigint>;
}

export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

/** `router_settings.provider_budget_config.<provider>`: USD per period. */
export interface ProviderBudget {
  budget_limit: number;
  time_period: string;
}

/** What the host hands every plugin at setup. */
export interface PluginContext {
  log: Logger;
  /** The resolved gateway settings a plugin may need. */
  settings: { masterKey: string | undefined; providerBudgets: Readonly<Record<string, ProviderBudget>> };
  /** The in-process mirror of keys, teams, orgs and users; absent when the gateway runs without a store. */
  identity?: IdentityView;
  /** Budget counters; absent without a store. */
  ledger?: BudgetLedger;
  spendHistory?: SpendHistory;
  /** Rate-limit windows (always present: in memory without Redis). */
  rateWindows?: RateWindows;
}

/** Read access to the identity mirror (no database round trip). */
export interface IdentityView {
  /** The live key for a sha256 token, following a rotated key to its successor during its grace period. */
  lookupKey(token: string, now?: number): KeyRow | undefined;
  /** Every live key by token (for checks across keys, such as guaranteed throughput). */
  readonly keys: ReadonlyMap<string, KeyRow>;
  /** The live key whose budget and rate-limit counters go by this (`keyCounterToken`), whatever token it has now. */
  keyByCounterToken(counterToken: string): KeyRow | undefined;
  readonly teams: ReadonlyMap<string, TeamRow>;
  readonly orgs: ReadonlyMap<string, OrgRow>;
  readonly users: ReadonlyMap<string, UserRow>;
  readonly budgets: ReadonlyMap<string, BudgetRow>;
  /** A user's membership of a team (its budget and limits inside the team). */
  teamMember(teamId: string, userId: string): TeamMemberRow | undefined;
  /** Calls `listener` after each change has been applied; returns the unsubscribe function. */
  onChange(listener: (change: IdentityChange) => void): () => void;
  /** Marks a key as used now (written in batches). */
  touch(token: string): void;
}

export interface PluginDef<S extends TSchema = TSchema> {
  name: string;
  version?: string;
  config: S;
  setup(config: Static<S>, ctx: PluginContext): Hooks | Promise<Hooks>;
}

/**
 * Rejects hook names that are not part of `Hooks` (a typo such as `callbackz` is a type error
 * naming the key). `H` is left unconstrained on purpose: with `H extends Hooks` a returned object
 * with an unknown key fails the constraint, `H` falls back to `Hooks`, and the typo goes unnoticed.
 */
type ExactHooks<H> = H & Hooks & { [K in Exclude<keyof H, keyof Hooks>]: `${K & string} is not a plugin hook` };

export function definePlugin<S extends TSchema, H>(plugin: {
  name: string;
  version?: string;
  config: S;
  setup(config: Static<S>, ctx: PluginContext): ExactHooks<H> | Promise<ExactHooks<H>>;
}): PluginDef<S> {
  return plugin as PluginDef<S>;
}
