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

/** Whether `usage` is countable as it is (the common case: nothing to copy). */
function isCountable(u: Usage): boolean {
  const within = (part: number | undefined, total: number) => part === undefined || part <= total;
  return (
    countable(u.promptTokens) &&
    countable(u.completionTokens) &&
    countable(u.cachedPromptTokens) &&
    countable(u.cacheCreationTokens) &&
    countable(u.cacheCreation1hTokens) &&
    countable(u.audioPromptTokens) &&
    countable(u.reasoningTokens) &&
    countable(u.audioCompletionTokens) &&
    countable(u.characters) &&
    countable(u.webSearchRequests) &&
    countable(u.images?.count) &&
    (u.audioSeconds === undefined || (Number.isFinite(u.audioSeconds) && u.audioSeconds >= 0)) &&
    within(u.cachedPromptTokens, u.promptTokens) &&
    within(u.cacheCreationTokens, u.promptTokens) &&
    within(u.audioPromptTokens, u.promptTokens) &&
    within(u.cacheCreation1hTokens, u.cacheCreationTokens ?? 0) &&
    within(u.reasoningTokens, u.completionTokens) &&
    within(u.audioCompletionTokens, u.completionTokens)
  );
}

/** Sets `key` when the original had it. */
function optional<K extends keyof Usage>(out: Usage, key: K, value: Usage[K], had: boolean): void {
  if (had) out[key] = value;
}

/**
 * `usage` with every count a whole number from 0 to MAX_COUNT, and each part (cache reads and
 * writes, audio, reasoning) no larger than its total; `corrected` says whether anything changed.
 * Parts are not checked against each other: providers count them in ways that overlap.
 */
export function countableUsage(usage: Usage): { usage: Usage; corrected: boolean } {
  if (isCountable(usage)) return { usage, corrected: false };
  const prompt = count(usage.promptTokens);
  const completion = count(usage.completionTokens);
  const created = Math.min(prompt, count(usage.cacheCreationTokens));
  const out: Usage = { ...usage, promptTokens: prompt, completionTokens: completion };
  optional(out, "cachedPromptTokens", Math.min(prompt, count(usage.cachedPromptTokens)), usage.cachedPromptTokens !== undefined);
  optional(out, "cacheCreationTokens", created, usage.cacheCreationTokens !== undefined);
  optional(out, "cacheCreation1hTokens", Math.min(created, count(usage.cacheCreation1hTokens)), usage.cacheCreation1hTokens !== undefined);
  optional(out, "audioPromptTokens", Math.min(prompt, count(usage.audioPromptTokens)), usage.audioPromptTokens !== undefined);
  optional(out, "reasoningTokens", Math.min(completion, count(usage.reasoningTokens)), usage.reasoningTokens !== undefined);
  optional(out, "audioCompletionTokens", Math.min(completion, count(usage.audioCompletionTokens)), usage.audioCompletionTokens !== undefined);
  optional(out, "characters", count(usage.characters), usage.characters !== undefined);
  optional(out, "webSearchRequests", count(usage.webSearchRequests), usage.webSearchRequests !== undefined);
  if (usage.images) out.images = { ...usage.images, count: count(usage.images.count) };
  if (usage.audioSeconds !== undefined) out.audioSeconds = Number.isFinite(usage.audioSeconds) && usage.audioSeconds > 0 ? usage.audioSeconds : 0;
  return { usage: out, corrected: true };
}
