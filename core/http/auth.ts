/** Authentication on every non-public route: the credential from the request, resolved by the auth plugins in order. */
import type { AuthRequest, Denied, Principal } from "../contract.ts";
import { authorizeRoute } from "../access.ts";
import { GatewayError } from "../errors.ts";
import type { Snapshot } from "../snapshot.ts";

/** `x-svc-api-key` (bare or `Bearer …`), else `Authorization: Bearer …`. */
export function credentialOf(headers: Headers): string | undefined {
  const svc = headers.get("x-svc-api-key");
  if (svc) return svc.startsWith("Bearer ") || svc.startsWith("bearer ") ? svc.slice(7).trim() : svc.trim();
  const auth = headers.get("authorization");
  if (auth && /^bearer /i.test(auth)) return auth.slice(7).trim() || undefined;
  return undefined;
}

/**
 * Whether the request's Authorization header carries one of the gateway's keys (usable or refused:
 * a blocked key is still one of its keys), as `Bearer <key>` or bare. It may do so even when
 * x-svc-api-key authenticated the call (a client that sets both), so a pass-through target is
 * never handed it.
 */
export async function authorizationCarriesGatewayKey(snapshot: Snapshot, headers: Headers, path: string): Promise<boolean> {
  const auth = headers.get("authorization");
  if (!auth) return false;
  const credential = (/^bearer /i.test(auth) ? auth.slice(7) : auth).trim();
  if (!credential) return false;
  const req = { credential, path, headers };
  for (const resolver of snapshot.auth) if ((await resolver.resolve(req)) !== null) return true;
  return false;
}

export const NO_MASTER_KEY =
  "No master key is configured, so management calls are refused and only existing virtual keys are accepted. Set the environment variable SVC_MASTER_KEY (or general_settings.master_key in config.yaml) to a key starting with sk- and restart or reload.";

/** Resolves the caller; synchronous when every auth hook answers synchronously (the hot path). */
export function authenticate(snapshot: Snapshot, headers: Headers, path: string): Principal | Promise<Principal> {
  const credential = credentialOf(headers);
  const noMaster = !snapshot.settings.masterKey;
  if (!credential) {
    if (noMaster) throw GatewayError.of(401, NO_MASTER_KEY, "authentication_error");
    throw GatewayError.of(401, "Authentication Error: no API key passed in. Send it as 'Authorization: Bearer <key>' or 'x-svc-api-key: <key>'.", "authentication_error");
  }
  const req = { credential, path, headers };
  for (let i = 0; i < snapshot.auth.length; i++) {
    const result = snapshot.auth[i]!.resolve(req);
    if (result instanceof Promise) return result.then((r) => (r === null ? resolveFrom(snapshot, req, i + 1) : accept(r, path)));
    if (result !== null) return accept(result, path);
  }
  return refuse(noMaster);
}

function accept(result: Principal | Denied, path: string): Principal {
  if ("ok" in result) throw new GatewayError(result.error);
  authorizeRoute(result, path);
  return result;
}

async function resolveFrom(snapshot: Snapshot, req: AuthRequest, from: number): Promise<Principal> {
  for (let i = from; i < snapshot.auth.length; i++) {
    const result = await snapshot.auth[i]!.resolve(req);
    if (result !== null) return accept(result, req.path);
  }
  return refuse(!snapshot.settings.masterKey);
}

function refuse(noMaster: boolean): never {
  if (noMaster) throw GatewayError.of(401, NO_MASTER_KEY, "authentication_error");
  throw GatewayError.of(401, "Authentication Error: invalid API key.", "authentication_error", null);
}

/** Management routes are refused outright while no master key is configured. */
export function requireMasterKeyConfigured(snapshot: Snapshot): void {
  if (!snapshot.settings.masterKey) throw GatewayError.of(401, NO_MASTER_KEY, "authentication_error");
}

/** Proxy admins (and admin viewers) only. */
export function requireAdmin(snapshot: Snapshot, principal: Principal): void {
  requireMasterKeyConfigured(snapshot);
  if (principal.role !== "proxy_admin" && principal.role !== "proxy_admin_viewer") {
    throw GatewayError.of(403, "Only a proxy admin may call this endpoint.", "permission_error");
  }
}
