/**
 * JSON written as text, for reports too large to build as objects and stringify (a 30-day report
 * over a busy gateway is tens of megabytes). Pieces go into an array joined once: strings grown by
 * `+=` stay ropes, which cost several times more each time the text is used.
 */

/** What JSON.stringify would escape in a string (quotes, backslashes, controls, surrogates). */
// biome-ignore lint/suspicious/noControlCharactersInRegex: these are exactly the characters JSON escapes
const NEEDS_ESCAPE = /["\\\u0000-\u001f\ud800-\udfff]/;

/** A JSON string literal; ids and names are plain text nearly always, so quoting is the whole job. */
export const quote = (s: string): string => (NEEDS_ESCAPE.test(s) ? JSON.stringify(s) : `"${s}"`);
