/** Names a gateway answer echoes in its headers (x-svc-model-group, x-svc-model-id). */

/** Control characters: refused in a configured or stored name (nothing a name is meant to hold). */
// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what is matched
export const CONTROL_CHARS = /[\u0000-\u001f\u007f]/;

/** Not sendable in a header as it is: control characters and anything beyond Latin-1. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what is matched
const UNSENDABLE = /[\u0000-\u001f\u007f\u0100-\uffff]/;

/**
 * A name as a header value: one a header can carry goes as it is; any other (`模型`, a wildcard
 * call for `openai/模型`) goes percent-encoded as UTF-8, a lone surrogate as U+FFFD (which
 * encodeURIComponent would otherwise throw on).
 */
export const headerText = (name: string): string => (UNSENDABLE.test(name) ? encodeURIComponent(name.toWellFormed()) : name);
