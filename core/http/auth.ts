/** Authentication on every non-public route: the credential from the request, resolved by the auth plugins in order. */
import type { AuthRequest, Denied, Principal } from "../contract.ts";
import { authorizeRoute } from "../access.ts";
import { GatewayError } from "../errors.ts";
import type { Snapshot } from "../snapshot.ts";

/**
 * The headers a client's SDK may carry its key in besides `x-svc-api-key`, in the order LiteLLM
 * reads them: OpenAI's `Authorization: Bearer`, Azure's `api-key`, Anthropic's `x-api-key`,
 * Google's `x-goog-api-key`, Azure API Management's `Ocp-Apim-Subscription-Key`. So an Azure or
 * Anthropic SDK pointed at the gateway authenticates as it would upstream.
 */
export const KEY_HEADERS = ["authorization", "api-key", "x-api-key", "x-goog-api-key", "ocp-apim-subscription-key"] as const;

const BEARER = /^bearer /i;

/** A value without its `Bearer ` scheme (in any case, as RFC 9110 §11.1 has schemes), trimmed. */
function withoutBearer(value: string): string {
  const trimmed = value.trim();
  return (BEARER.test(trimmed) ? trimmed.slice(7) : trimmed).trim();
}

/** A key header's credential: Authorization only as `Bearer …` (another scheme is not a key), the others as they are. */
function keyIn(name: (typeof KEY_HEADERS)[number], value: string): string | undefined {
  if (name !== "authorization") return value.trim() || undefined;
  return BEARER.test(value) ? withoutBearer(value) || undefined : undefined;
}

/** `x-svc-api-key` (bare or `Bearer …`), else the first of KEY_HEADERS that holds one. */
export function credentialOf(headers: Headers): string | undefined {
  const svc = headers.get("x-svc-api-key");
  if (svc) return withoutBearer(svc);
  for (const name of KEY_HEADERS) {
    const value = headers.get(name);
    const key = value === null ? undefined : keyIn(name, value);
    if (key) return key;
  }
  return undefined;
}

/**
 * The credentials a key header's value may hold, to keep gateway keys from a pass-through target:
 * each comma-separated part (a header sent twice arrives joined by `, `), bare or as `Bearer …`
 * in any header (a target may take `api-key: Bearer <key>`, which the gateway does not).
 */
function credentialsIn(value: string): Set<string> {
  const credentials = new Set<string>();
  for (const part of value.split(",")) {
    const credential = withoutBearer(part);
    if (credential) credentials.add(credential);
  }
  return credentials;
}

/**
 * The key headers of the request that carry one of the gateway's keys (usable or refused: a
 * blocked key is still one of its keys; bare, as `Bearer <key>` or among repeated values). One
 * may do so even when another header authenticated the call (a client that sets several), so a
 * pass-through target is never handed one.
 */
export async function headersCarryingGatewayKeys(snapshot: Snapshot, headers: Headers, path: string): Promise<ReadonlySet<string>> {
  const carrying = new Set<string>();
  for (const name of KEY_HEADERS) {
    const value = headers.get(name);
    if (value === null) continue;
    for (const credential of credentialsIn(value)) {
      if (await isGatewayKey(snapshot, { credential, path, headers })) {
        carrying.add(name);
        break;
      }
    }
  }
  return carrying;
}

async function isGatewayKey(snapshot: Snapshot, req: AuthRequest): Promise<boolean> {
  for (const resolver of snapshot.auth) {
    if ((await resolver.resolve(req)) !== null) return true;
  }
  return false;
}

export const NO_MASTER_KEY =
  "No master key is configured, so management calls are refused and only existing virtual keys are accepted. Set the environment variable SVC_MASTER_KEY (or general_settings.master_key in config.yaml) to a key starting with sk- and restart or reload.";

/**
 * Resolves the caller and checks its route lists against `method` on `path` (`passThrough`: a
 * pass-through endpoint's, a model call to the route groups); synchronous when every auth hook
 * answers synchronously (the hot path).
 */
export function authenticate(snapshot: Snapshot, headers: Headers, path: string, method: string, passThrough = false): Principal | Promise<Principal> {
  const credential = credentialOf(headers);
  const noMaster = !snapshot.settings.masterKey;
  if (!credential) {
    if (noMaster) throw GatewayError.of(401, NO_MASTER_KEY, "authentication_error");
    throw GatewayError.of(401, "Authentication Error: no API key passed in. Send it as 'Authorization: Bearer <key>' or 'x-svc-api-key: <key>' (an Azure, Anthropic or Google SDK's own key header works too).", "authentication_error");
  }
  const req = { credential, path, headers };
  for (let i = 0; i < snapshot.auth.length; i++) {
    const result = snapshot.auth[i]!.resolve(req);
    if (result instanceof Promise) return result.then((r) => (r === null ? resolveFrom(snapshot, req, i + 1, method, passThrough) : accept(r, path, method, passThrough)));
    if (result !== null) return accept(result, path, method, passThrough);
  }
  return refuse(noMaster);
}

function accept(result: Principal | Denied, path: string, method: string, passThrough: boolean): Principal {
  if ("ok" in result) throw new GatewayError(result.error);
  authorizeRoute(result, path, method, passThrough);
  return result;
}

async function resolveFrom(snapshot: Snapshot, req: AuthRequest, from: number, method: string, passThrough: boolean): Promise<Principal> {
  for (let i = from; i < snapshot.auth.length; i++) {
    const result = await snapshot.auth[i]!.resolve(req);
    if (result !== null) return accept(result, req.path, method, passThrough);
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
