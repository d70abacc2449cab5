/**
 * OAuth access tokens for Vertex AI, from google-auth-library. One client per credential, kept for
 * the life of the process: the library caches its token and refreshes it shortly before expiry, so
 * calls share one token instead of signing a new grant each. The library is loaded on first use:
 * gateways without Vertex deployments never pay for it.
 */

import { createHash } from "node:crypto";
import type { AuthClient, GoogleAuth } from "google-auth-library";
import { CredentialsRefused } from "../../core/errors.ts";
import { type CredentialsJson, isServiceAccount } from "./credentials.ts";

const SCOPES = ["https://www.googleapis.com/auth/cloud-platform"];
/** Where the library sends a service account's token request, whatever the key's `token_uri` says. */
const GOOGLE_TOKEN_URL = "https://oauth2.googleapis.com/token";
const ADC = "application-default";

interface TokenSource {
  token(): Promise<string>;
}

const sources = new Map<string, Promise<TokenSource>>();

/** A stable id for a credential (its hash), so deployments sharing a key share its client. */
export function credentialsId(json: CredentialsJson | undefined): string {
  return json ? createHash("sha256").update(JSON.stringify(json)).digest("hex") : ADC;
}

/**
 * A service-account key's client. The key's `token_uri` is honoured (the library always uses
 * Google's public endpoint): private endpoints (Private Service Connect) and test token servers
 * then work as the key says.
 */
async function serviceAccountSource(json: CredentialsJson & { client_email: string; private_key: string }): Promise<TokenSource> {
  const { JWT } = await import("google-auth-library");
  const client = new JWT({
    email: json.client_email,
    key: json.private_key,
    keyId: typeof json.private_key_id === "string" ? json.private_key_id : undefined,
    scopes: SCOPES,
  });
  const tokenUri = typeof json.token_uri === "string" ? json.token_uri : GOOGLE_TOKEN_URL;
  if (tokenUri !== GOOGLE_TOKEN_URL) {
    client.transporter.interceptors.request.add({
      resolved: async (config) => {
        if (config.url.href === GOOGLE_TOKEN_URL) config.url = new URL(tokenUri);
        return config;
      },
    });
  }
  return clientSource(client);
}

function clientSource(client: AuthClient | GoogleAuth): TokenSource {
  return {
    async token() {
      const t = await client.getAccessToken();
      const token = typeof t === "string" ? t : t?.token;
      if (!token) throw new Error("Google returned no access token");
      return token;
    },
  };
}

async function createSource(json: CredentialsJson | undefined): Promise<TokenSource> {
  if (json && isServiceAccount(json)) return serviceAccountSource(json);
  const { GoogleAuth } = await import("google-auth-library");
  // Other credential types (a user's gcloud login, workload identity federation), or none: the library decides.
  return clientSource(new GoogleAuth(json ? { credentials: json, scopes: SCOPES } : { scopes: SCOPES }));
}

/** Registers a credential's client once (idempotent), returning its id. */
export function registerCredentials(json: CredentialsJson | undefined): string {
  const id = credentialsId(json);
  if (!sources.has(id)) {
    const created = createSource(json);
    // A failed creation (the library would not load) must not stick: the next call tries again.
    created.catch(() => sources.delete(id));
    sources.set(id, created);
  }
  return id;
}

/**
 * A bearer token for the credential registered under `id`; `load` reads the credential when it
 * was not registered (a deployment built without `resolve`).
 */
export async function accessToken(id: string | undefined, load: () => CredentialsJson | undefined): Promise<string> {
  const source = sources.get(id !== undefined && sources.has(id) ? id : registerCredentials(load()))!;
  try {
    return await (await source).token();
  } catch (err) {
    // The library's message names the failure (invalid_grant, an unreachable token server), never the key.
    const message = `could not get a Google access token: ${err instanceof Error ? err.message : String(err)}`;
    // The token server answered 4xx: it rejects these credentials. Anything else: it could not be asked.
    const status = (err as { response?: { status?: unknown } } | null)?.response?.status;
    throw typeof status === "number" && status >= 400 && status < 500 ? new CredentialsRefused(message) : new Error(message);
  }
}
