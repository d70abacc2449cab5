/**
 * Virtual key values. A key is `sk-` + 24 random bytes (192 bits) in base64url; only its sha256
 * hex (`token`) is stored. The plaintext exists in memory just long enough to be returned once.
 */
import { createHash, randomBytes } from "node:crypto";

export const KEY_PREFIX = "sk-";

/** A fresh key value: `sk-` + 32 base64url characters. */
export function newKeyValue(): string {
  return KEY_PREFIX + randomBytes(24).toString("base64url");
}

/**
 * The fewest characters a caller-chosen key has after `sk-`: `key_name` shows the last 4 in every
 * later response (to viewers and team members too), so a shorter key would be given away whole or
 * nearly; 20 leaves 16 unseen, and is under the 22 of LiteLLM's own keys (LiteLLM sets no bound).
 */
export const MIN_CUSTOM_KEY_CHARS = 20;

/** sha256 hex of the whole key, `sk-` included (what LiteLLM and its tests compute). */
export function hashKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

/** The abbreviated display name: `sk-...` + the last 4 characters. */
export function keyName(key: string): string {
  return `${KEY_PREFIX}...${key.slice(-4)}`;
}

/** A key as an endpoint receives it, plain (`sk-…`) or already hashed, as its token. */
export function tokenOf(keyOrHash: string): string {
  const v = keyOrHash.trim();
  return v.startsWith(KEY_PREFIX) ? hashKey(v) : v;
}

export function isPlainKey(value: string): boolean {
  return value.trim().startsWith(KEY_PREFIX);
}
