/**
 * Spend-log values as the store can hold them, and rows in COPY's text format for the embedded
 * store's bulk load. PostgreSQL text cannot hold NUL and its JSON refuses unpaired surrogates;
 * client-chosen values (`user`, tags, an upstream's error message) may carry either, and one such
 * row must not stop the whole spend log, so both become U+FFFD.
 */
import { type PicoJson, picoToText, safePicoToText } from "../cost/money.ts";
import type { SpendEntry } from "./entry.ts";

/** A string the store accepts: NUL and unpaired surrogates replaced. */
export function storable(s: string): string {
  if (s.isWellFormed() && !s.includes("\0")) return s;
  return s.toWellFormed().replaceAll("\0", "\uFFFD");
}

const cleanStrings = (_key: string, value: unknown) => (typeof value === "string" ? storable(value) : value);

/** JSON text of an object the store's jsonb accepts (escaped NUL or lone surrogates cleaned). */
export function storableJson(value: unknown): string {
  const json = JSON.stringify(value);
  return /\\u(?:0000|d[89a-f])/i.test(json) ? JSON.stringify(value, cleanStrings) : json;
}

/** spend_logs columns in the order `copyRows` writes them. */
export const SPEND_LOG_COLUMNS = [
  "call_id", "request_id", "call_type", "api_key", "key_alias", "user_id", "team_id", "organization_id", "end_user",
  "model", "model_group", "provider", "model_id", "upstream_model", "spend", "prompt_tokens", "completion_tokens",
  "total_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_tokens", "start_time",
  "end_time", "completion_start_time", "status", "stream", "cache_hit", "request_tags", "metadata", "audio_seconds",
] as const;

const COPY_ESCAPES: Record<string, string> = { "\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r" };
/** Anything a field must be escaped or cleaned for (surrogates: an unpaired one is cleaned). */
const NEEDS_WORK = /[\\\t\n\r\0\uD800-\uDFFF]/;

/** One COPY text field: `\N` for null, the four special characters escaped. */
function field(value: string | null): string {
  if (value === null) return "\\N";
  if (!NEEDS_WORK.test(value)) return value;
  return storable(value).replace(/[\\\t\n\r]/g, (c) => COPY_ESCAPES[c]!);
}

/** A text[] literal: every element quoted, `"` and `\` escaped (`field` then cleans and escapes it whole). */
function arrayLiteral(items: string[]): string {
  if (items.length === 0) return "{}";
  return `{${items.map((t) => `"${t.replace(/["\\]/g, (c) => `\\${c}`)}"`).join(",")}}`;
}

/**
 * ISO 8601 text of an instant. A batch's timestamps mostly share their second, so the part up to
 * the second is kept from the last call: a third of the cost of `toISOString` per timestamp.
 */
let lastSecond = Number.NaN;
let lastPrefix = "";
function timestamp(ms: number | null): string {
  if (ms === null) return "\\N";
  if (!Number.isInteger(ms)) return new Date(ms).toISOString();
  const second = Math.floor(ms / 1000);
  if (second !== lastSecond) {
    lastSecond = second;
    lastPrefix = new Date(second * 1000).toISOString().slice(0, 19);
  }
  const frac = ms - second * 1000;
  return `${lastPrefix}.${frac < 10 ? "00" : frac < 100 ? "0" : ""}${frac}Z`;
}

/** Integer pico-units (`spendPico`, `audioPicoseconds`) as decimal text of whole units. */
const picoText = (p: PicoJson): string => (typeof p === "number" && Number.isSafeInteger(p) && p >= 0 ? safePicoToText(p) : picoToText(BigInt(p)));

/** One spend-log row in COPY text format (with its newline), columns as in `SPEND_LOG_COLUMNS`. */
export function copyRow(e: SpendEntry): string {
  const spend = picoText(e.spendPico);
  return (
    `${field(e.callId)}\t${field(e.requestId)}\t${field(e.callType)}\t${field(e.apiKey)}\t${field(e.keyAlias)}\t` +
    `${field(e.userId)}\t${field(e.teamId)}\t${field(e.organizationId)}\t${field(e.endUser)}\t${field(e.model)}\t` +
    `${field(e.modelGroup)}\t${field(e.provider)}\t${field(e.modelId)}\t${field(e.upstreamModel)}\t${spend}\t` +
    `${e.promptTokens}\t${e.completionTokens}\t${e.promptTokens + e.completionTokens}\t${e.cacheReadTokens}\t` +
    `${e.cacheCreationTokens}\t${e.reasoningTokens}\t${timestamp(e.startTime)}\t${timestamp(e.endTime)}\t` +
    `${timestamp(e.completionStartTime)}\t${field(e.status)}\t${e.stream ? "t" : "f"}\t${e.cacheHit ? "t" : "f"}\t` +
    `${field(arrayLiteral(e.tags))}\t${Object.keys(e.metadata).length > 0 ? field(storableJson(e.metadata)) : "{}"}\t` +
    `${e.audioPicoseconds == null ? "\\N" : picoText(e.audioPicoseconds)}\n`
  );
}

/** The rows of a batch in COPY text format. */
export function copyRows(batch: readonly SpendEntry[]): string {
  let out = "";
  for (const e of batch) out += copyRow(e);
  return out;
}

/** The batch's call ids in COPY text, for `spend_calls` when the log itself is off. */
export function copyIds(batch: readonly SpendEntry[]): string {
  let out = "";
  for (const e of batch) out += `${field(e.callId)}\n`;
  return out;
}
