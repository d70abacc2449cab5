/**
 * `api_base` / `api_key` / `api_version` in an embeddings body (the spec lists them): refused
 * unless the operator allows client-side credentials (`svc_settings.allow_client_side_credentials`),
 * because a client-chosen `api_base` makes the gateway fetch any address it can reach (SSRF). When
 * allowed, `api_base` must name a host listed in `svc_settings.client_side_api_base_hosts` when
 * that list is set (plain http only for listed hosts); without a list, it must be https and not a
 * loopback or private address.
 */
import type { Deployment, Endpoint, WireRequest } from "../contract.ts";
import { GatewayError } from "../errors.ts";
import { checkHost, isPrivateHost } from "../private-host.ts";
import { isCredentialParam } from "../secrets.ts";

export interface ClientCredentialSettings {
  allowClientSideCredentials: boolean;
  clientSideApiBaseHosts: readonly string[] | undefined;
}

function refuse(message: string, param: string): GatewayError {
  return GatewayError.of(400, message, "invalid_request_error", param);
}

/** Whether the request names credentials of its own (its call then goes out with them, not the deployment's). */
export function usesClientCredentials(endpoint: Endpoint, body: WireRequest[Endpoint]): boolean {
  if (endpoint !== "embeddings") return false;
  const b = body as WireRequest["embeddings"];
  return (b.api_base ?? b.api_key ?? b.api_version ?? undefined) !== undefined;
}

export function withClientCredentials(endpoint: Endpoint, body: WireRequest[Endpoint], d: Deployment, s: ClientCredentialSettings): Deployment {
  if (!usesClientCredentials(endpoint, body)) return d;
  const b = body as WireRequest["embeddings"];
  const apiBase = b.api_base ?? undefined;
  const apiKey = b.api_key ?? undefined;
  const apiVersion = b.api_version ?? undefined;
  const param = apiBase !== undefined ? "api_base" : apiKey !== undefined ? "api_key" : "api_version";
  if (!s.allowClientSideCredentials) {
    throw refuse(`${param} in the request body is not allowed on this gateway: the operator has not enabled client-side credentials (svc_settings.allow_client_side_credentials).`, param);
  }
  if (apiBase !== undefined) {
    let url: URL;
    try {
      url = new URL(apiBase);
    } catch {
      throw refuse("api_base must be an absolute https URL.", "api_base");
    }
    const hosts = s.clientSideApiBaseHosts;
    const listed = hosts?.includes(url.hostname) ?? false;
    if (url.protocol !== "https:" && !listed) throw refuse("api_base must be an https URL (or name a host in svc_settings.client_side_api_base_hosts).", "api_base");
    if (hosts ? !listed : isPrivateHost(url.hostname)) {
      throw refuse(`api_base host ${url.hostname} is not allowed${hosts ? ` (allowed: ${hosts.join(", ")})` : ": loopback and private addresses are refused"}.`, "api_base");
    }
  }
  // The operator's credentials go only to the operator's address: a call to a client's address
  // carries the client's key or none (else any key holder could collect the provider key or a
  // token made from it). A client's key takes the place of what the provider made of the
  // operator's credentials (an Azure `api-key`), not a place beside it.
  const base = apiBase !== undefined ? withoutOperatorCredentials(d) : apiKey !== undefined ? { ...d, credentials: undefined } : d;
  return { ...base, apiBase: apiBase?.replace(/\/+$/, "") ?? d.apiBase, apiKey: apiKey ?? base.apiKey, apiVersion: apiVersion ?? d.apiVersion };
}

/**
 * `d` without its api key, configured headers (any may carry a credential), what its provider
 * made of its credentials (whatever the provider calls it: see Deployment.credentials) and
 * credential fields (its prices stay).
 */
function withoutOperatorCredentials(d: Deployment): Deployment {
  const options = Object.fromEntries(Object.entries(d.options).filter(([k, v]) => !isCredentialParam(k, v)));
  return { ...d, apiKey: undefined, headers: undefined, credentials: undefined, options };
}

/**
 * Without a host list, a client's `api_base` is also resolved before the call: a name that passes
 * the literal check (this host's own name, `127.0.0.1.nip.io`, a record pointed inward) would
 * still make the gateway fetch this machine or its network (LiteLLM #24952, #37053). Checked at
 * every call, not once: the record may change. Resolves to the address the call then connects to
 * (`Deployment.connectTo`: a record changed between the check and the fetch is not followed).
 */
export function refuseInwardApiBase(endpoint: Endpoint, body: WireRequest[Endpoint], s: ClientCredentialSettings): Promise<NonNullable<Deployment["connectTo"]>> | undefined {
  // Undefined (no promise, nothing to await) for every call that names no api_base: the common case.
  if (endpoint !== "embeddings" || !s.allowClientSideCredentials || s.clientSideApiBaseHosts) return undefined;
  const apiBase = (body as WireRequest["embeddings"]).api_base;
  if (typeof apiBase !== "string" || !URL.canParse(apiBase)) return undefined;
  const host = new URL(apiBase).hostname;
  return checkHost(host).then((check) => {
    if (check.inside) throw refuse(`api_base host ${host} is not allowed: it resolves to ${check.inside}, and loopback and private addresses are refused.`, "api_base");
    if (check.unresolved) throw refuse(`api_base host ${host} does not resolve.`, "api_base");
    return { host, address: check.address ?? host };
  });
}
