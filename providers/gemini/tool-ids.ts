/**
 * Gemini function calls have no ids; OpenAI clients need one per call, and must send it back with
 * the result. Thinking models also attach a `thoughtSignature` to a call that Gemini wants back
 * with that call in the next turn (Gemini 3 refuses the turn without it), and an OpenAI client
 * only ever echoes the id, so the signature travels inside the id.
 */

const ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const SIGNATURE_MARK = "__thought__";

export function randomId(length: number): string {
  const bytes = crypto.getRandomValues(new Uint8Array(length));
  let out = "";
  for (const b of bytes) out += ALNUM[b % ALNUM.length];
  return out;
}

/** A new tool call id (`call_` + 24 characters, OpenAI's shape), carrying the call's thought signature if any. */
export function toolCallId(signature?: string): string {
  const id = `call_${randomId(24)}`;
  return signature ? `${id}${SIGNATURE_MARK}${signature}` : id;
}

/** The thought signature carried by a tool call id, if it has one. */
export function signatureOf(id: string): string | undefined {
  const at = id.indexOf(SIGNATURE_MARK);
  return at < 0 ? undefined : id.slice(at + SIGNATURE_MARK.length) || undefined;
}
