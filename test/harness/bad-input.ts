/** Helpers shared by the bad-input fuzz tests (management routes and model-call routes). */

/** A reply body for a failure message: control characters shown escaped, long text cut. */
export function snippet(s: string, n = 160): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: NUL and the like shown escaped in failure messages
  const clean = s.replace(/[\u0000-\u001f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
  return clean.length > n ? `${clean.slice(0, n)}… (${s.length} chars)` : clean;
}

/** Runs `run` over `items` with at most `parallel` in flight (8: enough to find races, few enough not to swamp a 2-core machine). */
export async function inParallel<T>(items: T[], run: (item: T) => Promise<unknown>, parallel = 8): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(parallel, items.length) }, async () => {
      while (next < items.length) await run(items[next++]!);
    }),
  );
}

/** Sets `value` at `path` in `target`, making the objects (or, for a number segment, arrays) on the way. */
export function setAt(target: Record<string, unknown>, path: string[], value: unknown): void {
  let at: Record<string, unknown> = target;
  for (let i = 0; i < path.length - 1; i++) {
    const seg = path[i]!;
    if (typeof at[seg] !== "object" || at[seg] === null) at[seg] = /^\d+$/.test(path[i + 1]!) ? [] : {};
    at = at[seg] as Record<string, unknown>;
  }
  at[path[path.length - 1]!] = value;
}

const MARK = "\u0001bad-input\u0001";

/** The JSON text of `base` with `bad` (JSON text, inserted as it is: it may be no valid JSON value) at `path`. */
export function withBad(base: Record<string, unknown>, path: string[], bad: string): string {
  const body = structuredClone(base);
  setAt(body, path, MARK);
  return JSON.stringify(body).replace(JSON.stringify(MARK), () => bad);
}

/** The `error` object of a refusal's body with a non-empty `message`; what is wrong with the body otherwise. */
export function refusalError(status: number, text: string): { error: Record<string, unknown> } | { wrong: string } {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return { wrong: `refused with ${status} but the body is not JSON` };
  }
  const error = (body as { error?: Record<string, unknown> } | null)?.error;
  if (!error || typeof error.message !== "string" || !error.message) return { wrong: `refused with ${status} but not in an error envelope` };
  return { error };
}
