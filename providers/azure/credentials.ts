/**
 * How an Azure OpenAI deployment proves who it is: an `api-key`, a fixed Entra ID bearer token
 * (`azure_ad_token`), or client credentials exchanged for tokens. The deployment's own
 * `svc_params` win over the environment (AZURE_API_KEY, AZURE_AD_TOKEN, AZURE_TENANT_ID/…).
 */
import type { Deployment } from "../../core/contract.ts";
import { COGNITIVE_SERVICES_SCOPE, type ClientCredentials, ENTRA_AUTHORITY } from "./entra-token.ts";

export type AzureAuth = { kind: "api-key"; key: string } | { kind: "bearer"; token: string } | ({ kind: "client-credentials" } & ClientCredentials);

const text = (v: unknown): string | undefined => (typeof v === "string" && v !== "" ? v : undefined);

type Source = (name: string) => string | undefined;

function clientCredentials(get: Source, o: Record<string, unknown>): AzureAuth | undefined {
  const tenantId = get("tenant_id");
  const clientId = get("client_id");
  const clientSecret = get("client_secret");
  if (!tenantId || !clientId || !clientSecret) return undefined;
  const authority = text(o.azure_authority_host) ?? text(process.env.AZURE_AUTHORITY_HOST) ?? ENTRA_AUTHORITY;
  const scope = text(o.azure_scope) ?? COGNITIVE_SERVICES_SCOPE;
  return { kind: "client-credentials", authority, tenantId, clientId, clientSecret, scope };
}

/** The credentials a deployment configures, or undefined when it has none. */
export function findAzureAuth(d: Deployment): AzureAuth | undefined {
  const o = d.options;
  if (d.apiKey) return { kind: "api-key", key: d.apiKey };
  const adToken = text(o.azure_ad_token);
  if (adToken) return { kind: "bearer", token: adToken };
  const fromParams = clientCredentials((n) => text(o[n]), o);
  if (fromParams) return fromParams;
  const env = process.env;
  if (text(env.AZURE_API_KEY)) return { kind: "api-key", key: env.AZURE_API_KEY! };
  if (text(env.AZURE_AD_TOKEN)) return { kind: "bearer", token: env.AZURE_AD_TOKEN! };
  return clientCredentials((n) => text(o[n]) ?? text(env[`AZURE_${n.toUpperCase()}`]), o);
}

/** A resolved deployment with its credentials attached (the key moves off `apiKey`, which means bearer elsewhere). */
export function withAzureAuth(d: Deployment, auth: AzureAuth): Deployment {
  return { ...d, apiKey: undefined, credentials: auth };
}

/**
 * The credentials a call is made with: those `resolve` attached, else a key put on the resolved
 * deployment in their place (a client's own `api_key`), which Azure reads from `api-key` too.
 */
export function azureAuth(d: Deployment): AzureAuth | undefined {
  if (d.credentials !== undefined) return d.credentials as AzureAuth;
  return d.apiKey ? { kind: "api-key", key: d.apiKey } : undefined;
}

/** Headers the transforms can set; client credentials get theirs in `authorize`. */
export function staticAuthHeaders(auth: AzureAuth | undefined): Record<string, string> {
  if (auth?.kind === "api-key") return { "api-key": auth.key };
  if (auth?.kind === "bearer") return { authorization: `Bearer ${auth.token}` };
  return {};
}
