/** Durations such as `30s`, `15m`, `24h`, `7d`, `2w`, `1mo`, `1y`; `-1` means "never". */

const DAY_MS = 86_400_000;
const UNIT_MS: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: DAY_MS, w: 7 * DAY_MS, mo: 30 * DAY_MS, y: 365 * DAY_MS };
/** Spaces around it allowed: config.yaml's schema takes this pattern's source, and a value is read trimmed. */
export const DURATION_PATTERN = /^\s*(\d+)\s*(s|m|h|d|w|mo|y)\s*$/;
/**
 * The longest duration: an instant that far ahead is still a date the store and JSON write in
 * the usual form (`100000000d` from now is not a date at all, and was a 500 on every write).
 */
export const MAX_DURATION = "100y";
const MAX_DURATION_MS = 100 * UNIT_MS.y!;

/** Milliseconds, `null` for never (`-1`), or undefined when the text is not a duration (or one longer than MAX_DURATION). */
export function parseDuration(text: string): number | null | undefined {
  if (text.trim() === "-1") return null;
  const m = DURATION_PATTERN.exec(text);
  if (!m) return undefined;
  const ms = Number(m[1]) * UNIT_MS[m[2]!]!;
  return ms <= MAX_DURATION_MS ? ms : undefined;
}

/** `parseDuration` in SQL, of a text column or expression: ms as bigint, null for none, `-1` or text that is no duration (the store's own reading of a row's period). */
export function durationMsSql(text: string): string {
  const units = Object.entries(UNIT_MS).map(([unit, ms]) => `when '${unit}' then ${ms}`).join(" ");
  return `(select m[1]::bigint * case m[2] ${units} end from regexp_match(${text}, '${DURATION_PATTERN.source}') as m)`;
}

/** When something with this duration, starting now, ends (null = never). */
export function endsAt(text: string, from = Date.now()): Date | null | undefined {
  const ms = parseDuration(text);
  if (ms === undefined) return undefined;
  return ms === null ? null : new Date(from + ms);
}

export const DURATION_HINT = `a duration such as 30s, 15m, 24h, 7d, 1mo (at most ${MAX_DURATION}), or -1 for never`;
