/** Durations such as `30s`, `15m`, `24h`, `7d`, `2w`, `1mo`, `1y`; `-1` means "never". */

const UNIT_MS: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };
const PATTERN = /^(\d+)\s*(s|m|h|d|w|mo|y)$/;

/** Milliseconds, `null` for never (`-1`), or undefined when the text is not a duration. */
export function parseDuration(text: string): number | null | undefined {
  if (text.trim() === "-1") return null;
  const m = PATTERN.exec(text.trim());
  if (!m) return undefined;
  const n = Number(m[1]);
  if (m[2] === "mo") return n * 30 * UNIT_MS.d!;
  if (m[2] === "y") return n * 365 * UNIT_MS.d!;
  return n * UNIT_MS[m[2]!]!;
}

/** When something with this duration, starting now, ends (null = never). */
export function endsAt(text: string, from = Date.now()): Date | null | undefined {
  const ms = parseDuration(text);
  if (ms === undefined) return undefined;
  return ms === null ? null : new Date(from + ms);
}

export const DURATION_HINT = "a duration such as 30s, 15m, 24h, 7d, 1mo, or -1 for never";
