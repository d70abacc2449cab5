/**
 * Google credentials for Vertex AI: `svc_params.vertex_credentials` (a path to a key file, the
 * key's JSON text, or the key as a YAML mapping), else the file GOOGLE_APPLICATION_CREDENTIALS
 * names, else none (Application Default Credentials: the metadata server, gcloud's login).
 * Messages never quote the credential itself: it holds a private key.
 */
import { readFileSync } from "node:fs";

export type CredentialsJson = Record<string, unknown>;

const isObject = (v: unknown): v is CredentialsJson => typeof v === "object" && v !== null && !Array.isArray(v);

function parse(text: string, what: string): CredentialsJson | string {
  try {
    const json: unknown = JSON.parse(text);
    return isObject(json) ? json : `${what} is not a JSON object`;
  } catch {
    return `${what} is not valid JSON`;
  }
}

/** The credential JSON, undefined for Application Default Credentials, or why it cannot be read. */
export function loadCredentials(value: unknown, envPath = process.env.GOOGLE_APPLICATION_CREDENTIALS): CredentialsJson | undefined | string {
  if (isObject(value)) return value;
  if (typeof value === "string" && value.trim() !== "") {
    if (value.trimStart().startsWith("{")) return parse(value, "svc_params.vertex_credentials");
    return readKeyFile(value, "svc_params.vertex_credentials");
  }
  if (value !== undefined && value !== null && value !== "") return "svc_params.vertex_credentials must be a file path, the key's JSON, or a mapping";
  return envPath ? readKeyFile(envPath, "GOOGLE_APPLICATION_CREDENTIALS") : undefined;
}

function readKeyFile(path: string, what: string): CredentialsJson | string {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    const code = err instanceof Error && "code" in err ? String((err as { code: unknown }).code) : "unreadable";
    return `${what} names a file that cannot be read (${code}; ${unquotedValue(path)})`;
  }
  return parse(text, `the key file ${path}`);
}

/**
 * What a value that names no readable file looked like, without the value: a key's JSON in base64
 * or in quotes (as .env files write it) lands here, and so would its private key in a start error,
 * a reload log line or a /model/new answer.
 */
function unquotedValue(value: string): string {
  const trimmed = value.trim();
  const kind = /^["']\s*\{/.test(trimmed)
    ? "it looks like JSON in quotes; give the JSON without them"
    : trimmed.length >= 100 && /^[A-Za-z0-9+/=_-]+$/.test(trimmed)
      ? "it looks like base64 text; give the decoded JSON or a file path"
      : "not shown, as it may hold the key";
  return `a value of ${value.length} characters: ${kind}`;
}

/** A service-account key (the usual kind), as opposed to a user login or workload identity configuration. */
export function isServiceAccount(json: CredentialsJson): json is CredentialsJson & { client_email: string; private_key: string } {
  return typeof json.client_email === "string" && typeof json.private_key === "string";
}
