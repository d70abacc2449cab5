/**
 * Gemini gives a function call an id only sometimes (`functionCall.id`); OpenAI clients need one
 * per call, and must send it back with the result. Gemini's own id is kept when it gives one, so a
 * result pairs with its call by id (parallel calls of one function among them). Thinking models
 * also attach a `thoughtSignature` to a call that Gemini wants back with that call in the next
 * turn (Gemini 3 refuses the turn without it), and an OpenAI client only ever echoes the id, so
 * the signature travels inside the id.
 */

const ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const SIGNATURE_MARK = "__thought__";

export function randomId(length: number): string {
  const bytes = crypto.getRandomValues(new Uint8Array(length));
  let out = "";
  for (const b of bytes) out += ALNUM[b % ALNUM.length];
  return out;
}

/** A call's tool call id: Gemini's id, else a new one (`call_` + 24 characters, OpenAI's shape), carrying its thought signature if any. */
export function toolCallId(signature?: string, geminiId?: string): string {
  const id = geminiId || `call_${randomId(24)}`;
  return signature ? `${id}${SIGNATURE_MARK}${signature}` : id;
}

/** The thought signature carried by a tool call id, if it has one. */
export function signatureOf(id: string): string | undefined {
  const at = id.indexOf(SIGNATURE_MARK);
  return at < 0 ? undefined : id.slice(at + SIGNATURE_MARK.length) || undefined;
}

/** The id Gemini is sent for a call and its result: the tool call id without the signature it carries. */
export function geminiCallId(id: string): string {
  const at = id.indexOf(SIGNATURE_MARK);
  return at < 0 ? id : id.slice(0, at);
}
