/**
 * Spend-log values as the store can hold them, and rows in COPY's text format for the embedded
 * store's bulk load. PostgreSQL text cannot hold NUL and its JSON refuses unpaired surrogates;
 * client-chosen values (`user`, tags, an upstream's error message) may carry either, and one such
 * row must not stop the whole spend log, so both become U+FFFD.
 */
import { picoToText } from "../cost/money.ts";
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
  "end_time", "completion_start_time", "status", "stream", "cache_hit", "request_tags", "metadata",
] as const;

const COPY_ESCAPES: Record<string, string> = { "\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r" };
const COPY_SPECIAL = /[\\\t\n\r]/;

/** One COPY text field: `\N` for null, the four special characters escaped. */
function field(value: string | null): string {
  if (value === null) return "\\N";
  const s = storable(value);
  return COPY_SPECIAL.test(s) ? s.replace(/[\\\t\n\r]/g, (c) => COPY_ESCAPES[c]!) : s;
}

/** A text[] literal: every element quoted, `"` and `\` escaped. */
function arrayLiteral(items: string[]): string {
  if (items.length === 0) return "{}";
  return `{${items.map((t) => `"${t.replace(/["\\]/g, (c) => `\\${c}`)}"`).join(",")}}`;
}

const timestamp = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());

/** The rows of a batch in COPY text format, columns as in `SPEND_LOG_COLUMNS`. */
export function copyRows(batch: SpendEntry[]): string {
  let out = "";
  for (const e of batch) {
    const values: (string | null)[] = [
      e.callId, e.requestId, e.callType, e.apiKey, e.keyAlias, e.userId, e.teamId, e.organizationId, e.endUser,
      e.model, e.modelGroup, e.provider, e.modelId, e.upstreamModel, picoToText(BigInt(e.spendPico)),
      String(e.promptTokens), String(e.completionTokens), String(e.promptTokens + e.completionTokens),
      String(e.cacheReadTokens), String(e.cacheCreationTokens), String(e.reasoningTokens),
      timestamp(e.startTime), timestamp(e.endTime), timestamp(e.completionStartTime), e.status,
      e.stream ? "t" : "f", e.cacheHit ? "t" : "f", arrayLiteral(e.tags.map(storable)),
      Object.keys(e.metadata).length > 0 ? storableJson(e.metadata) : "{}",
    ];
    out += `${values.map(field).join("\t")}\n`;
  }
  return out;
}
