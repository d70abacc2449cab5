/**
 * Provider credentials stored in the database are encrypted at rest with AES-256-GCM. The key is
 * derived from SVC_SALT_KEY (or, failing that, the master key): changing it makes stored
 * credentials unreadable, so set SVC_SALT_KEY once and keep it.
 */
import { createCipheriv, createDecipheriv, createHash, randomBytes } from "node:crypto";
import type { Deployment } from "./contract.ts";

const PREFIX = "enc:v1:";
/** svc_params fields holding credentials: encrypted in the store, never returned by the API. */
export const SECRET_PARAM = /(^|_)(api_key|key|secret|token|password|credentials?)$|^aws_|_credentials$/i;

/** Query parameters that carry a credential (`?key=`, `?api-key=`, `?access_token=`, `?sig=`). */
export const SECRET_QUERY_PARAM = /key|token|secret|password|signature|credential|^sig$/i;

const decoded = (text: string): string => {
  try {
    return decodeURIComponent(text.replaceAll("+", " "));
  } catch {
    return text;
  }
};

/**
 * The credentials a URL carries: its password and the values of its credential-named query
 * parameters, as written and decoded (an upstream may quote either).
 */
export function urlCredentials(raw: string | undefined): string[] {
  const url = raw === undefined ? null : URL.parse(raw);
  if (!url) return [];
  const found = [url.password, decoded(url.password)];
  for (const pair of url.search.slice(1).split("&")) {
    const eq = pair.indexOf("=");
    if (eq > 0 && SECRET_QUERY_PARAM.test(decoded(pair.slice(0, eq)))) found.push(pair.slice(eq + 1), decoded(pair.slice(eq + 1)));
  }
  return found;
}

/**
 * A URL carrying a credential (`https://user:pass@host`, `…?key=…`, as an api_base may): a
 * credential as a whole, whatever its field's name; so is a value stored encrypted.
 */
function isCredentialText(value: unknown): boolean {
  return typeof value === "string" && (value.startsWith(PREFIX) || urlCredentials(value).some((c) => c !== ""));
}

/**
 * A credential holds text (or a structure) under a credential's name, or is a URL carrying one;
 * a number or flag under such a name (`input_cost_per_token`) is a price or setting.
 */
export function isCredentialParam(key: string, value: unknown): boolean {
  if (typeof value === "number" || typeof value === "boolean") return false;
  return SECRET_PARAM.test(key) || isCredentialText(value);
}

export function secretKey(saltKey: string | undefined, masterKey: string | undefined): Buffer | undefined {
  const source = saltKey || masterKey;
  return source ? createHash("sha256").update(`svc-gateway:${source}`).digest() : undefined;
}

export function encrypt(plain: string, key: Buffer): string {
  const iv = randomBytes(12);
  const cipher = createCipheriv("aes-256-gcm", key, iv);
  const body = Buffer.concat([cipher.update(plain, "utf8"), cipher.final()]);
  return PREFIX + Buffer.concat([iv, cipher.getAuthTag(), body]).toString("base64");
}

export function decrypt(stored: string, key: Buffer): string {
  if (!stored.startsWith(PREFIX)) return stored;
  const raw = Buffer.from(stored.slice(PREFIX.length), "base64");
  const decipher = createDecipheriv("aes-256-gcm", key, raw.subarray(0, 12));
  decipher.setAuthTag(raw.subarray(12, 28));
  return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString("utf8");
}

/** A mapping under a credential field (a Vertex key written as a mapping), stored as one string: its JSON, encrypted. */
const ENCRYPTED_MAPPING = "enc:json:";

const isMapping = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * A svc_params object with `text` applied to its credentials (credential fields' text, the values of
 * `headers`, which often carry a key) and `mapping` to a credential field's mapping; other fields unchanged.
 */
function mapCredentials(params: Record<string, unknown>, text: (v: string) => unknown, mapping: (v: Record<string, unknown>) => unknown): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(params)) {
    if (k === "headers" && isMapping(v)) out[k] = Object.fromEntries(Object.entries(v).map(([h, x]) => [h, typeof x === "string" ? text(x) : x]));
    else if (!isCredentialParam(k, v)) out[k] = v;
    else if (typeof v === "string") out[k] = text(v);
    else if (isMapping(v)) out[k] = mapping(v);
    else out[k] = v;
  }
  return out;
}

/** A stored model's svc_params as the store keeps them: every credential encrypted. */
export function encryptSecrets(params: Record<string, unknown>, key: Buffer): Record<string, unknown> {
  return mapCredentials(
    params,
    (v) => encrypt(v, key),
    (m) => ENCRYPTED_MAPPING + encrypt(JSON.stringify(m), key),
  );
}

/** `encryptSecrets` undone; a value stored in clear (rows written before headers and mappings were encrypted) is read as it is. */
export function decryptSecrets(params: Record<string, unknown>, key: Buffer): Record<string, unknown> {
  return mapCredentials(
    params,
    (v) => (v.startsWith(ENCRYPTED_MAPPING) ? JSON.parse(decrypt(v.slice(ENCRYPTED_MAPPING.length), key)) : decrypt(v, key)),
    (m) => m,
  );
}

/** Configured headers as shown to an admin: their names, never their values (any may carry a credential). */
export function hiddenHeaderValues(headers: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.keys(headers).map((h) => [h, "[redacted]"]));
}

const isRawJson = (JSON as JSON & { isRawJSON(v: unknown): boolean }).isRawJSON;

/** Secrets never reach the audit trail or a response: plaintext keys and credential fields are replaced. */

export function redactSecrets(value: unknown, field = ""): unknown {
  if (typeof value === "string") {
    if (value.startsWith("sk-") && value.length > 12) return `${value.slice(0, 5)}…[redacted]`;
    return (SECRET_PARAM.test(field) && field !== "token") || isCredentialText(value) ? "[redacted]" : value;
  }
  if (Array.isArray(value)) return value.map((v) => redactSecrets(v, field));
  if (value instanceof Date) return value.toISOString();
  // Exact money (JSON.rawJSON): a number as far as JSON is concerned, not an object to copy.
  if (isRawJson(value)) return value;
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, redactSecrets(v, k)]));
  }
  return value;
}

const RESOLVED_SECRET_FIELD = /key|token|secret|password/i;

/**
 * Secrets a provider's `resolve` attached (Azure's key read from AZURE_API_KEY, its client
 * secret): named by their field (`key`, `token`, `clientSecret`), not its other fields (`kind`).
 */
function resolvedCredentials(credentials: unknown): unknown[] {
  if (!isMapping(credentials)) return [];
  return Object.entries(credentials).map(([k, v]) => (RESOLVED_SECRET_FIELD.test(k) ? v : undefined));
}

/** Shorter values are not worth replacing (and could be ordinary words). */
const MIN_CREDENTIAL_LENGTH = 6;
const credentialCache = new WeakMap<Deployment, string[]>();

/** A deployment's credentials as an upstream could echo them: its api key, header values, credential fields and those in its api_base. */
function credentialsOf(d: Deployment): string[] {
  let found = credentialCache.get(d);
  if (!found) {
    const fields = Object.entries(d.options).map(([k, v]) => (SECRET_PARAM.test(k) ? v : undefined));
    const values = [d.apiKey, ...Object.values(d.headers ?? {}), ...fields, ...urlCredentials(d.apiBase), ...resolvedCredentials(d.credentials)];
    found = values.filter((v): v is string => typeof v === "string" && v.length >= MIN_CREDENTIAL_LENGTH);
    credentialCache.set(d, found);
  }
  return found;
}

/** Tokens a deployment's recent calls were given: a few, as calls under way when a token is renewed still hold the old one. */
const RECENT_TOKENS_KEPT = 8;
const sentTokens = new WeakMap<Deployment, string[]>();
const CREDENTIAL_HEADER = /auth|key|token|secret|signature/i;

/**
 * Header values a provider's `authorize` put on a call (an Entra ID or Google OAuth token, made
 * per call and so in no config field): scrubbed from the deployment's error text like its
 * configured credentials. Of `Bearer <token>` the token is kept, as an upstream may quote it
 * without its scheme.
 */
export function rememberSentCredentials(d: Deployment, built: Record<string, string>, sent: Record<string, string>): void {
  for (const [name, value] of Object.entries(sent)) {
    // Not every header a signer adds is secret (SigV4's x-amz-date, which AWS errors quote).
    if (built[name] === value || !CREDENTIAL_HEADER.test(name)) continue;
    const credential = /^\S+ (\S+)$/.exec(value)?.[1] ?? value;
    const recent = sentTokens.get(d) ?? [];
    if (credential.length < MIN_CREDENTIAL_LENGTH || recent.includes(credential)) continue;
    recent.push(credential);
    if (recent.length > RECENT_TOKENS_KEPT) recent.shift();
    sentTokens.set(d, recent);
  }
}

/** Upstream error text without the deployment's credentials in it (an upstream may quote what it was sent). */
export function withoutCredentials(text: string, d: Deployment): string {
  let out = text;
  for (const c of [...credentialsOf(d), ...(sentTokens.get(d) ?? [])]) if (out.includes(c)) out = out.replaceAll(c, "[redacted]");
  return out;
}
