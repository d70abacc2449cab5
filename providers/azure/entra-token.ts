/**
 * Microsoft Entra ID access tokens for Azure OpenAI by client credentials (an app registration's
 * tenant, client id and secret). One token per credential set, shared by every request and
 * renewed shortly before it expires; concurrent requests wait on one token request.
 */
import { createHash } from "node:crypto";
import { CredentialsRefused } from "../../core/errors.ts";

export const ENTRA_AUTHORITY = "https://login.microsoftonline.com";
export const COGNITIVE_SERVICES_SCOPE = "https://cognitiveservices.azure.com/.default";

export interface ClientCredentials {
  /** Token service base (`https://login.microsoftonline.com`, or a sovereign cloud's). */
  authority: string;
  tenantId: string;
  clientId: string;
  clientSecret: string;
  scope: string;
}

interface CachedToken {
  token: string;
  /** Milliseconds since the epoch: past this the token is renewed in the background. */
  renewAt: number;
  /** Past this the token is no longer used. */
  expiresAt: number;
}

/** Renew this long before expiry (or at half the lifetime of a shorter-lived token). */
const RENEW_MARGIN_MS = 5 * 60_000;
const REQUEST_TIMEOUT_MS = 30_000;

/** The secret is part of the key only as a hash: a rotated secret gets its own token. */
function cacheKey(c: ClientCredentials): string {
  const secret = createHash("sha256").update(c.clientSecret).digest("hex");
  return [c.authority, c.tenantId, c.clientId, c.scope, secret].join("\u0000");
}

/** The first line of Entra's `error_description` (the rest is trace and correlation ids). */
function refusal(status: number, text: string): string {
  try {
    const body = JSON.parse(text) as { error?: unknown; error_description?: unknown };
    const what = typeof body.error === "string" ? body.error : `HTTP ${status}`;
    const why = typeof body.error_description === "string" ? body.error_description.split(/\r?\n/)[0] : "";
    return why ? `${what}: ${why}` : what;
  } catch {
    return `HTTP ${status}`;
  }
}

export class EntraTokenCache {
  private readonly tokens = new Map<string, CachedToken>();
  private readonly pending = new Map<string, Promise<CachedToken>>();
  /** Token requests sent (for tests and diagnostics). */
  requests = 0;

  constructor(private readonly now: () => number = Date.now) {}

  async token(c: ClientCredentials): Promise<string> {
    const key = cacheKey(c);
    const cached = this.tokens.get(key);
    const now = this.now();
    if (cached && now < cached.renewAt) return cached.token;
    const renewal = this.renew(key, c);
    // A token in its renewal window is still good: use it while the new one is fetched.
    if (cached && now < cached.expiresAt) {
      renewal.catch(() => undefined);
      return cached.token;
    }
    return (await renewal).token;
  }

  private renew(key: string, c: ClientCredentials): Promise<CachedToken> {
    let p = this.pending.get(key);
    if (!p) {
      p = this.fetchToken(c).then(
        (t) => {
          this.tokens.set(key, t);
          this.pending.delete(key);
          return t;
        },
        (err: unknown) => {
          this.pending.delete(key);
          throw err;
        },
      );
      this.pending.set(key, p);
    }
    return p;
  }

  private async fetchToken(c: ClientCredentials): Promise<CachedToken> {
    this.requests++;
    const url = `${c.authority.replace(/\/+$/, "")}/${encodeURIComponent(c.tenantId)}/oauth2/v2.0/token`;
    const form = new URLSearchParams({ grant_type: "client_credentials", client_id: c.clientId, client_secret: c.clientSecret, scope: c.scope });
    let res: Response;
    try {
      res = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/x-www-form-urlencoded", accept: "application/json" },
        body: form.toString(),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
    } catch (err) {
      throw new Error(`Microsoft Entra ID token request to ${url} failed: ${err instanceof Error ? err.message : String(err)}`);
    }
    const text = await res.text();
    if (!res.ok) {
      // Entra never echoes the secret, but a proxy in between might: keep it out of every message.
      const reason = refusal(res.status, text).replaceAll(c.clientSecret, "***");
      // 4xx: these credentials are wrong; 5xx: the token service is in trouble (a 503 upstream).
      const Failure = res.status < 500 ? CredentialsRefused : Error;
      throw new Failure(`Microsoft Entra ID refused the client credentials of client ${c.clientId} in tenant ${c.tenantId} (${reason})`);
    }
    const body = JSON.parse(text) as { access_token?: unknown; expires_in?: unknown };
    if (typeof body.access_token !== "string") throw new Error(`Microsoft Entra ID answered ${url} without an access_token`);
    const lifetimeMs = Number(body.expires_in ?? 3600) * 1000;
    const now = this.now();
    return { token: body.access_token, expiresAt: now + lifetimeMs, renewAt: now + lifetimeMs - Math.min(RENEW_MARGIN_MS, lifetimeMs / 2) };
  }
}
