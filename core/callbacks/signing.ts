/**
 * Webhook signing in the Standard Webhooks scheme (standardwebhooks.com), which receivers can check
 * with that project's libraries: every delivery carries `webhook-id` (the same on each attempt of
 * one event: the receiver's idempotency key) and `webhook-timestamp` (Unix seconds of the attempt),
 * and, when the webhook has a secret, `webhook-signature: v1,<base64 HMAC-SHA256 of
 * "<id>.<timestamp>.<body>">`. LiteLLM sends its webhooks unsigned, so a receiver cannot tell the
 * gateway's alerts from anyone's POST.
 */
import { createHmac } from "node:crypto";

/** Shortest secret accepted, in bytes (the scheme's own secrets are 24 to 64). */
export const MIN_SECRET_BYTES = 16;
const PREFIX = "whsec_";

/**
 * The key bytes of a secret: `whsec_<base64>` as the scheme writes it (the base64 decoded), any other
 * text as its UTF-8 bytes. Undefined when the secret is too short or its base64 is not base64.
 */
export function signingKey(secret: string): Buffer | undefined {
  let key: Buffer;
  if (secret.startsWith(PREFIX)) {
    const b64 = secret.slice(PREFIX.length);
    if (!/^[A-Za-z0-9+/]+={0,2}$/.test(b64)) return undefined;
    key = Buffer.from(b64, "base64");
  } else key = Buffer.from(secret, "utf8");
  return key.length >= MIN_SECRET_BYTES ? key : undefined;
}

/** Why a secret is refused, for a 400 or a config error; undefined when it is usable. */
export function secretProblem(secret: string): string | undefined {
  if (signingKey(secret)) return undefined;
  return secret.startsWith(PREFIX)
    ? `a whsec_ secret must be base64 of at least ${MIN_SECRET_BYTES} bytes`
    : `a signing secret must be at least ${MIN_SECRET_BYTES} bytes`;
}

/** The headers of one attempt to deliver `body` as event `id`. */
export function deliveryHeaders(id: string, body: string, secret: string | undefined, nowMs = Date.now()): Record<string, string> {
  const timestamp = String(Math.floor(nowMs / 1000));
  const headers: Record<string, string> = { "webhook-id": id, "webhook-timestamp": timestamp };
  const key = secret === undefined ? undefined : signingKey(secret);
  if (key) headers["webhook-signature"] = `v1,${createHmac("sha256", key).update(`${id}.${timestamp}.${body}`).digest("base64")}`;
  return headers;
}
