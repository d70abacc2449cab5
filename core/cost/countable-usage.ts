/**
 * Usage as an upstream (or a provider plugin) reported it, made countable before it is priced and
 * logged. A fractional count (a self-hosted server's), a negative, absurd or non-numeric one, or a
 * part larger than its total was priced one way and refused by the spend log's integer columns,
 * and a refused row held its whole batch, and every call after it, out of the log.
 */
import type { Usage } from "../contract.ts";

/**
 * The most tokens (or images, characters, searches) one call is counted with: the spend log's
 * integer columns hold 2^31 - 1, its total_tokens the sum of two counts.
 */
export const MAX_COUNT = 2 ** 30 - 1;

/** A count as a whole number from 0 to MAX_COUNT (anything else not a number: 0). */
function count(value: unknown): number {
  if (typeof value !== "number" || !(value > 0)) return 0;
  return Math.min(MAX_COUNT, Math.round(value));
}

const countable = (value: unknown): boolean => value === undefined || (Number.isSafeInteger(value) && (value as number) >= 0 && (value as number) <= MAX_COUNT);

/** Usage's counts of things (optional ones) beside its two totals. */
type CountField = "cachedPromptTokens" | "cachedAudioPromptTokens" | "cacheCreationTokens" | "cacheCreation1hTokens" | "audioPromptTokens" | "imagePromptTokens" | "citationTokens" | "reasoningTokens" | "audioCompletionTokens" | "imageCompletionTokens" | "characters" | "webSearchRequests";

/**
 * Each count and what bounds it: the total it is a part of (a part of a part after its whole), or
 * nothing. Parts are not checked against each other: providers count them in ways that overlap.
 */
const COUNTS: readonly (readonly [CountField, "promptTokens" | "completionTokens" | "cachedPromptTokens" | "cacheCreationTokens" | null])[] = [
  ["cachedPromptTokens", "promptTokens"],
  ["cachedAudioPromptTokens", "cachedPromptTokens"],
  ["cacheCreationTokens", "promptTokens"],
  ["cacheCreation1hTokens", "cacheCreationTokens"],
  ["audioPromptTokens", "promptTokens"],
  ["imagePromptTokens", "promptTokens"],
  ["citationTokens", "promptTokens"],
  ["reasoningTokens", "completionTokens"],
  ["audioCompletionTokens", "completionTokens"],
  ["imageCompletionTokens", "completionTokens"],
  ["characters", null],
  ["webSearchRequests", null],
];

/** Whether `usage` is countable as it is (the common case: nothing to copy). */
function isCountable(u: Usage): boolean {
  if (!countable(u.promptTokens) || !countable(u.completionTokens) || !countable(u.images?.count)) return false;
  if (u.audioSeconds !== undefined && !(Number.isFinite(u.audioSeconds) && u.audioSeconds >= 0)) return false;
  for (const [field, total] of COUNTS) {
    const v = u[field];
    if (v === undefined) continue;
    if (!countable(v) || (total !== null && v > (u[total] ?? 0))) return false;
  }
  return true;
}

/**
 * `usage` with every count a whole number from 0 to MAX_COUNT, and each part no larger than its
 * total (COUNTS); `corrected` says whether anything changed.
 */
export function countableUsage(usage: Usage): { usage: Usage; corrected: boolean } {
  if (isCountable(usage)) return { usage, corrected: false };
  const out: Usage = { ...usage, promptTokens: count(usage.promptTokens), completionTokens: count(usage.completionTokens) };
  for (const [field, total] of COUNTS) {
    if (usage[field] === undefined) continue;
    const v = count(usage[field]);
    out[field] = total === null ? v : Math.min(v, out[total] ?? 0);
  }
  if (usage.images) out.images = { ...usage.images, count: count(usage.images.count) };
  if (usage.audioSeconds !== undefined) out.audioSeconds = Number.isFinite(usage.audioSeconds) && usage.audioSeconds > 0 ? usage.audioSeconds : 0;
  return { usage: out, corrected: true };
}
