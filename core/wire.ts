/**
 * The OpenAI wire format the gateway speaks to clients: request schemas (validated on every call)
 * and the loose JSON type of responses and chunks.
 */
import { type Static, Type as T } from "@sinclair/typebox";

/** A JSON object as sent on the wire. */
export type WireJson = Record<string, unknown>;

const Nullable = <S extends Parameters<typeof T.Union>[0][number]>(s: S) => T.Union([s, T.Null()]);

const ContentPart = T.Object({ type: T.String() }, { additionalProperties: true });

/**
 * The most tags one request may carry. Each tag of a call is a row of the daily tag report, upserted
 * with the call's batch (~10 µs of the store per tag): one call with 50,000 tags held the embedded
 * store, and every management call behind it, for half a second.
 */
export const MAX_REQUEST_TAGS = 100;

/**
 * The longest model name, end user (`user`) and tag a call may carry. Each is part of the key of a
 * daily aggregate row, whose index holds at most ~2,700 bytes: one call with a 10,000-character
 * `user` was refused by the store and held every later call's spend behind it. 256 UTF-16 units
 * are at most 768 bytes of UTF-8, so three of them and the rest of the key fit.
 */
export const MAX_NAME_CHARS = 256;
const ModelName = T.String({ minLength: 1, maxLength: MAX_NAME_CHARS });
const EndUser = T.String({ maxLength: MAX_NAME_CHARS });

/** A call's `metadata`: free-form, except `tags`, a list of strings the spend log and tag reports group by. */
const RequestMetadata = T.Object({ tags: T.Optional(Nullable(T.Array(T.String({ maxLength: MAX_NAME_CHARS }), { maxItems: MAX_REQUEST_TAGS }))) }, { additionalProperties: true });

export const ChatMessageSchema = T.Object(
  {
    role: T.Union([
      T.Literal("system"),
      T.Literal("developer"),
      T.Literal("user"),
      T.Literal("assistant"),
      T.Literal("tool"),
      T.Literal("function"),
    ]),
    content: T.Optional(Nullable(T.Union([T.String(), T.Array(ContentPart)]))),
    name: T.Optional(T.String()),
    tool_calls: T.Optional(T.Array(T.Record(T.String(), T.Unknown()))),
    tool_call_id: T.Optional(T.String()),
  },
  { additionalProperties: true },
);

const StringOrStrings = T.Union([T.String(), T.Array(T.String())]);

/** Gateway-level fields accepted on every model call and never forwarded upstream. */
export const GatewayOnlyFields = [
  "guardrails",
  "caching",
  "num_retries",
  "context_window_fallback_dict",
  "fallbacks",
  "metadata",
  "mock_response",
  "drop_params",
  // The embeddings body's gateway parameters (the spec lists them); never forwarded upstream.
  "timeout",
  "api_base",
  "api_version",
  "api_key",
  "api_type",
  "custom_llm_provider",
  "svc_call_id",
  "svc_logging_obj",
  "logger_fn",
  "cache",
] as const;

/**
 * Gateway fields an adapter may translate and no upstream is sent as they are; unlike
 * GatewayOnlyFields they change the answer, so they are part of the response cache's key.
 * `include_thoughts: true` asks a Gemini model for its thoughts at its own thinking budget
 * (Google's `thinkingConfig.includeThoughts`, which `reasoning_effort` also sets, with a budget);
 * a provider that has no such switch ignores it.
 */
export const GatewayHintFields = ["include_thoughts"] as const;

/** The fields an OpenAI-shaped upstream body leaves out of the client's. */
export const NotForwardedFields: readonly string[] = [...GatewayOnlyFields, ...GatewayHintFields];

export const ChatRequestSchema = T.Object(
  {
    model: ModelName,
    messages: T.Array(ChatMessageSchema, { minItems: 1 }),
    frequency_penalty: T.Optional(Nullable(T.Number({ minimum: -2, maximum: 2 }))),
    presence_penalty: T.Optional(Nullable(T.Number({ minimum: -2, maximum: 2 }))),
    logit_bias: T.Optional(Nullable(T.Record(T.String(), T.Number()))),
    logprobs: T.Optional(Nullable(T.Boolean())),
    top_logprobs: T.Optional(Nullable(T.Integer({ minimum: 0 }))),
    max_tokens: T.Optional(Nullable(T.Integer({ minimum: 1 }))),
    max_completion_tokens: T.Optional(Nullable(T.Integer({ minimum: 1 }))),
    n: T.Optional(Nullable(T.Integer({ minimum: 1 }))),
    response_format: T.Optional(Nullable(T.Record(T.String(), T.Unknown()))),
    seed: T.Optional(Nullable(T.Integer())),
    service_tier: T.Optional(Nullable(T.String())),
    stop: T.Optional(Nullable(StringOrStrings)),
    stream_options: T.Optional(Nullable(T.Record(T.String(), T.Unknown()))),
    temperature: T.Optional(Nullable(T.Number({ minimum: 0, maximum: 2 }))),
    top_p: T.Optional(Nullable(T.Number({ minimum: 0, maximum: 1 }))),
    tools: T.Optional(Nullable(T.Array(T.Record(T.String(), T.Unknown())))),
    tool_choice: T.Optional(Nullable(T.Union([T.String(), T.Record(T.String(), T.Unknown())]))),
    parallel_tool_calls: T.Optional(Nullable(T.Boolean())),
    function_call: T.Optional(Nullable(T.Union([T.String(), T.Record(T.String(), T.Unknown())]))),
    functions: T.Optional(Nullable(T.Array(T.Record(T.String(), T.Unknown())))),
    user: T.Optional(Nullable(EndUser)),
    stream: T.Optional(Nullable(T.Boolean())),
    metadata: T.Optional(Nullable(RequestMetadata)),
    guardrails: T.Optional(Nullable(T.Array(T.String()))),
    caching: T.Optional(Nullable(T.Boolean())),
    num_retries: T.Optional(Nullable(T.Integer({ minimum: 0 }))),
    context_window_fallback_dict: T.Optional(Nullable(T.Record(T.String(), T.String()))),
    // Group names, or the config's form {group: [fallback, …]}; anything else would be dropped unseen.
    fallbacks: T.Optional(Nullable(T.Array(T.Union([T.String(), T.Record(T.String(), T.Array(T.String()))])))),
    mock_response: T.Optional(Nullable(T.String())),
  },
  { additionalProperties: true },
);
export type ChatRequest = Static<typeof ChatRequestSchema>;

export const CompletionRequestSchema = T.Object(
  {
    model: ModelName,
    prompt: T.Union([T.String(), T.Array(T.String()), T.Array(T.Integer()), T.Array(T.Array(T.Integer()))]),
    max_tokens: T.Optional(Nullable(T.Integer({ minimum: 1 }))),
    temperature: T.Optional(Nullable(T.Number({ minimum: 0, maximum: 2 }))),
    top_p: T.Optional(Nullable(T.Number({ minimum: 0, maximum: 1 }))),
    frequency_penalty: T.Optional(Nullable(T.Number({ minimum: -2, maximum: 2 }))),
    presence_penalty: T.Optional(Nullable(T.Number({ minimum: -2, maximum: 2 }))),
    n: T.Optional(Nullable(T.Integer({ minimum: 1 }))),
    // Candidates generated (and billed) for the n returned: budgets reserve them all.
    best_of: T.Optional(Nullable(T.Integer({ minimum: 1 }))),
    stop: T.Optional(Nullable(StringOrStrings)),
    stream: T.Optional(Nullable(T.Boolean())),
    stream_options: T.Optional(Nullable(T.Record(T.String(), T.Unknown()))),
    user: T.Optional(Nullable(EndUser)),
    metadata: T.Optional(Nullable(RequestMetadata)),
    caching: T.Optional(Nullable(T.Boolean())),
  },
  { additionalProperties: true },
);
export type CompletionRequest = Static<typeof CompletionRequestSchema>;

export const EmbeddingsRequestSchema = T.Object(
  {
    model: ModelName,
    input: T.Optional(T.Union([T.String(), T.Array(T.String()), T.Array(T.Integer()), T.Array(T.Array(T.Integer()))])),
    encoding_format: T.Optional(Nullable(T.Union([T.Literal("float"), T.Literal("base64")]))),
    dimensions: T.Optional(Nullable(T.Integer({ minimum: 1 }))),
    timeout: T.Optional(Nullable(T.Integer({ minimum: 1 }))),
    caching: T.Optional(Nullable(T.Boolean())),
    api_base: T.Optional(Nullable(T.String())),
    api_version: T.Optional(Nullable(T.String())),
    api_key: T.Optional(Nullable(T.String())),
    api_type: T.Optional(Nullable(T.String())),
    user: T.Optional(Nullable(EndUser)),
    custom_llm_provider: T.Optional(Nullable(T.Union([T.String(), T.Record(T.String(), T.Unknown())]))),
    svc_call_id: T.Optional(Nullable(T.String())),
    svc_logging_obj: T.Optional(Nullable(T.Record(T.String(), T.Unknown()))),
    logger_fn: T.Optional(Nullable(T.String())),
    metadata: T.Optional(Nullable(RequestMetadata)),
  },
  { additionalProperties: true },
);
export type EmbeddingsRequest = Static<typeof EmbeddingsRequestSchema>;

export const ImageRequestSchema = T.Object(
  {
    model: ModelName,
    prompt: T.String({ minLength: 1 }),
    n: T.Optional(Nullable(T.Integer({ minimum: 1, maximum: 10 }))),
    size: T.Optional(Nullable(T.String({ pattern: "^(auto|\\d+x\\d+)$", description: "auto or WIDTHxHEIGHT" }))),
    quality: T.Optional(Nullable(T.String())),
    response_format: T.Optional(Nullable(T.Union([T.Literal("url"), T.Literal("b64_json")]))),
    style: T.Optional(Nullable(T.String())),
    user: T.Optional(Nullable(EndUser)),
    metadata: T.Optional(Nullable(RequestMetadata)),
    caching: T.Optional(Nullable(T.Boolean())),
  },
  { additionalProperties: true },
);
export type ImageRequest = Static<typeof ImageRequestSchema>;

/** `POST /v1/audio/transcriptions`: the multipart form's fields (`file` is the uploaded audio). */
export const TranscriptionRequestSchema = T.Object(
  {
    model: ModelName,
    /** Checked to be a Blob after the schema (see validate.ts). */
    file: T.Any({ description: "an audio file" }),
    language: T.Optional(T.String()),
    prompt: T.Optional(T.String()),
    response_format: T.Optional(T.Union([T.Literal("json"), T.Literal("text"), T.Literal("srt"), T.Literal("verbose_json"), T.Literal("vtt")])),
    temperature: T.Optional(T.Number({ minimum: 0, maximum: 1 })),
    timestamp_granularities: T.Optional(T.Array(T.Union([T.Literal("word"), T.Literal("segment")]))),
    stream: T.Optional(T.Boolean()),
    user: T.Optional(EndUser),
  },
  { additionalProperties: true },
);
export type TranscriptionRequest = Omit<Static<typeof TranscriptionRequestSchema>, "file"> & { file: Blob };

/** OpenAI's limit on a speech input, in characters: code points (see codePoints), checked after the schema (validate.ts). */
export const MAX_SPEECH_CHARACTERS = 4096;

/** `POST /v1/audio/speech`: text to speech; the answer is the audio itself. */
export const SpeechRequestSchema = T.Object(
  {
    model: ModelName,
    // The schema's maxLength would count UTF-16 units: 2,500 emoji would be over 4,096.
    input: T.String({ minLength: 1 }),
    voice: T.Union([T.String({ minLength: 1 }), T.Object({ id: T.String() }, { additionalProperties: true })]),
    response_format: T.Optional(T.Union(["mp3", "opus", "aac", "flac", "wav", "pcm"].map((f) => T.Literal(f)))),
    speed: T.Optional(T.Number({ minimum: 0.25, maximum: 4 })),
    instructions: T.Optional(T.String()),
    metadata: T.Optional(Nullable(RequestMetadata)),
  },
  { additionalProperties: true },
);
export type SpeechRequest = Static<typeof SpeechRequestSchema>;

/** `POST /v1/moderations`: `model` may be left out (the gateway then picks its moderation model). */
export const ModerationRequestSchema = T.Object(
  {
    model: ModelName,
    input: T.Union([T.String(), T.Array(T.String(), { minItems: 1 }), T.Array(ContentPart, { minItems: 1 })]),
    metadata: T.Optional(Nullable(RequestMetadata)),
    caching: T.Optional(Nullable(T.Boolean())),
  },
  { additionalProperties: true },
);
export type ModerationRequest = Static<typeof ModerationRequestSchema>;

/** Speech runs at about this many characters a second (English at speed 1). */
const SPOKEN_CHARACTERS_PER_SECOND = 15;
/** Slower than any voice speaks: for the most a call can cost. */
const SLOWEST_CHARACTERS_PER_SECOND = 5;
/** OpenAI's PCM (and WAV) speech: 24 kHz, 16-bit, mono. */
const PCM_BYTES_PER_SECOND = 48_000;

type SpeechUsage = { promptTokens: number; completionTokens: number; characters: number; audioSeconds: number };

/**
 * Characters as speech is priced per character: Unicode code points, as LiteLLM counts them
 * (Python's `len`), not UTF-16 units (`length`, two for an emoji and any other character beyond
 * the Basic Multilingual Plane). A lone surrogate is one.
 */
export function codePoints(s: string): number {
  // A string iterates by code point (a lone surrogate is one).
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/**
 * What speech synthesis is priced on: its input's characters (tts-1), or its text tokens and
 * seconds of audio (gpt-4o-mini-tts). Seconds are measured from a PCM or WAV answer, else
 * estimated from the text at the asked `speed`, to the millisecond (an estimate has no more digits
 * worth charging; a length measured or reported is priced as it is).
 */
export function speechUsage(req: SpeechRequest, answer?: { bytes: number; contentType: string }): SpeechUsage {
  const characters = codePoints(req.input);
  let audioSeconds = Math.round((characters / SPOKEN_CHARACTERS_PER_SECOND / (req.speed ?? 1)) * 1000) / 1000;
  if (answer && /pcm|wav/.test(answer.contentType)) audioSeconds = Math.max(0, answer.bytes - (answer.contentType.includes("wav") ? 44 : 0)) / PCM_BYTES_PER_SECOND;
  return { promptTokens: Math.ceil(characters / 4), completionTokens: 0, characters, audioSeconds };
}

/** The most a speech request can be priced on: a token per UTF-8 byte, and speech slower than any voice. */
export function speechBound(req: SpeechRequest): SpeechUsage {
  const characters = codePoints(req.input);
  const audioSeconds = characters / SLOWEST_CHARACTERS_PER_SECOND / Math.min(1, req.speed ?? 1);
  return { promptTokens: Buffer.byteLength(req.input, "utf8"), completionTokens: 0, characters, audioSeconds };
}

/**
 * The images an image request asks for, as a call's usage counts them: `n` (default 1), its size
 * and its quality (lower case). Undefined where the model picks: a size of `auto`, a quality of
 * `auto` or none.
 */
export function imagesAsked(req: ImageRequest): { count: number; size?: string; quality?: string } {
  const quality = req.quality?.toLowerCase();
  // No size is OpenAI's default, 1024x1024; `auto` leaves it to the model.
  const size = req.size === "auto" ? undefined : (req.size ?? "1024x1024");
  return { count: req.n ?? 1, size, quality: quality && quality !== "auto" ? quality : undefined };
}

/** Sizes and qualities an image model may pick when the request leaves them to it (for the most a call can cost). */
export const IMAGE_SIZES = ["1024x1024", "1024x1536", "1536x1024", "1024x1792", "1792x1024", "512x512", "256x256"] as const;
export const IMAGE_QUALITIES = ["low", "medium", "standard", "hd", "high"] as const;
