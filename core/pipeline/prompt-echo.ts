/**
 * An upstream's error message may quote what the caller sent (a content-policy or validation
 * error echoing the input). The client gets the message as it is (its own text), but what the
 * gateway keeps or sends elsewhere (the spend log, team webhooks, logging callbacks) must not carry
 * the prompt: every run of at least RUN characters of the request's own text found in the message
 * becomes PROMPT_REDACTED. Shorter runs stay, so the message still says what went wrong, and which
 * field or value it means, without quoting the prompt.
 */
import type { ErrorInfo } from "../contract.ts";

/** Shorter runs are too common to be the prompt (a field name, a model name, a short word). */
export const RUN = 16;
export const PROMPT_REDACTED = "[prompt redacted]";

/** Fields of a request body that hold what the caller asked (never its model name or options). */
const PROMPT_FIELDS = ["messages", "prompt", "input", "query", "documents", "system", "instructions", "suffix", "contents"];

/** Every string of the request's prompt fields at least RUN long. */
export function promptTexts(body: unknown): string[] {
  const out: string[] = [];
  const walk = (v: unknown): void => {
    if (typeof v === "string") {
      if (v.length >= RUN) out.push(v);
    } else if (Array.isArray(v)) for (const x of v) walk(x);
    else if (v !== null && typeof v === "object") for (const x of Object.values(v)) walk(x);
  };
  if (body !== null && typeof body === "object") for (const f of PROMPT_FIELDS) walk((body as Record<string, unknown>)[f]);
  return out;
}

const BASE = 0x01000193;
let pow = 1;
for (let i = 1; i < RUN; i++) pow = Math.imul(pow, BASE);
const POW = pow;

/**
 * Calls `visit(start, hash)` for each RUN-long window of `s`, with a rolling hash (linear in the
 * length: a prompt may be megabytes); stops when `visit` returns false.
 */
function windows(s: string, visit: (start: number, hash: number) => boolean): void {
  let h = 0;
  for (let i = 0; i < s.length; i++) {
    if (i >= RUN) h = (h - Math.imul(s.charCodeAt(i - RUN), POW)) | 0;
    h = (Math.imul(h, BASE) + s.charCodeAt(i)) | 0;
    if (i >= RUN - 1 && !visit(i - RUN + 1, h)) return;
  }
}

function sameRun(a: string, i: number, b: string, j: number): boolean {
  for (let k = 0; k < RUN; k++) if (a.charCodeAt(i + k) !== b.charCodeAt(j + k)) return false;
  return true;
}

/** `message` with every run of RUN or more characters that also occurs in one of `texts` replaced. */
export function withoutPromptText(message: string, texts: readonly string[]): string {
  if (message.length < RUN || texts.length === 0) return message;
  // Where each window of the message starts, by hash; a window is removed once found.
  const open = new Map<number, number[]>();
  windows(message, (i, h) => {
    const list = open.get(h);
    if (list) list.push(i);
    else open.set(h, [i]);
    return true;
  });
  const quoted = new Uint8Array(message.length);
  for (const text of texts) {
    windows(text, (j, h) => {
      const list = open.get(h);
      if (!list) return true;
      for (let n = list.length - 1; n >= 0; n--) {
        const i = list[n]!;
        if (!sameRun(message, i, text, j)) continue;
        quoted.fill(1, i, i + RUN);
        list.splice(n, 1);
      }
      if (list.length === 0) open.delete(h);
      return open.size > 0;
    });
    if (open.size === 0) break;
  }
  if (!quoted.includes(1)) return message;
  let out = "";
  for (let i = 0; i < message.length; ) {
    let end = i;
    while (end < message.length && quoted[end] === quoted[i]) end++;
    out += quoted[i] ? PROMPT_REDACTED : message.slice(i, end);
    i = end;
  }
  return out;
}

/** The error as the gateway keeps it: its message without the request's own text. */
export function errorWithoutPrompt(error: ErrorInfo, body: unknown): ErrorInfo {
  const message = withoutPromptText(error.message, promptTexts(body));
  return message === error.message ? error : { ...error, message };
}
