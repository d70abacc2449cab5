/**
 * Every path no other route serves: a configured pass-through endpoint (looked up in the snapshot
 * the request pins, so a reload adds and removes them at once), or the 404 of an unknown route.
 */
import { Elysia } from "elysia";
import { authorizePassThrough } from "../../access.ts";
import type { Principal } from "../../contract.ts";
import { GatewayError, errorInfo } from "../../errors.ts";
import { forwardPassThrough } from "../../pass-through/forward.ts";
import { newCallId } from "../../pipeline/call.ts";
import type { AppDeps } from "../app.ts";
import { authenticate, headersCarryingGatewayKeys } from "../auth.ts";
import type { ServedRoutes } from "../served-routes.ts";

export const NO_SUCH_ROUTE = "Not found: no such route. Model calls live under /v1 (e.g. POST /v1/chat/completions).";

/**
 * Families of the spec's routes this gateway does not serve (each also under /v1): a client of
 * one of them is told so, and how an operator can reach the provider's own, rather than that the
 * route does not exist. Still a 404: a 5xx or 501 would make the SDKs retry.
 */
const UNSERVED = /^(?:\/v1)?\/(assistants|threads|batches|fine_tuning|vector_stores|files)(?:\/|$)/;
const UNSERVED_NAMES: Record<string, string> = {
  assistants: "Assistants",
  threads: "Threads",
  batches: "Batches",
  fine_tuning: "Fine-tuning jobs",
  vector_stores: "Vector stores",
  files: "Files",
};

/** The answer for a path no pass-through endpoint serves: the 405 of a route asked with another method, else a 404. */
function notServed(method: string, pathname: string, served: ServedRoutes): GatewayError {
  const allowed = served.methodsFor(pathname);
  if (allowed.length === 0) return noSuchRoute(pathname);
  return new GatewayError(errorInfo(405, `${method} is not allowed on ${pathname}; use ${allowed.join(", ")}.`, "invalid_request_error"), { allow: allowed.join(", ") });
}

/** The 404 for a path no route or pass-through endpoint serves. */
export function noSuchRoute(pathname: string): GatewayError {
  const family = UNSERVED.exec(pathname)?.[1];
  if (!family) return GatewayError.of(404, NO_SUCH_ROUTE, "not_found_error");
  return GatewayError.of(
    404,
    `Not found: ${UNSERVED_NAMES[family]} (${pathname}) are not served by this gateway. An operator can forward them to a provider that serves them with general_settings.pass_through_endpoints (e.g. path: /v1/${family}, target: https://api.openai.com/v1/${family}, include_subpath: true).`,
    "not_found_error",
  );
}

const ENCODED_SEPARATOR = /%2f|%5c/i;

/** The caller of a public (`auth: false`) endpoint. */
const ANONYMOUS: Principal = { keyHash: "", role: "internal_user", metadata: {} };
const NONE_WITHHELD: ReadonlySet<string> = new Set();

/** `served`: the app's other routes (a path they serve with another method is a 405). */
export function passThroughRoutes(deps: AppDeps, served: ServedRoutes) {
  const { live, log } = deps;
  const handle = async ({ request }: { request: Request }): Promise<Response> => {
    // Always absolute: a request whose Host is not a valid host was answered 400 before the app (serving.ts routingAnyHost).
    const url = new URL(request.url);
    // An encoded slash or backslash would let a path step out of its endpoint (or its allowed prefix) at a target that decodes it.
    if (ENCODED_SEPARATOR.test(url.pathname)) throw GatewayError.of(400, "Encoded slashes and backslashes (%2F, %5C) are not allowed in this path.", "invalid_request_error");
    const pin = live.pin();
    try {
      const match = pin.snapshot.passThrough.match(url.pathname, request.method);
      if (!match) throw notServed(request.method, url.pathname, served);
      if ("allowed" in match) {
        throw new GatewayError(errorInfo(405, `${request.method} is not allowed on ${url.pathname}; use ${match.allowed.join(", ")}.`, "invalid_request_error"), { allow: match.allowed.join(", ") });
      }
      let principal = ANONYMOUS;
      if (match.endpoint.auth) {
        // A key's route lists judge what the call reaches: the endpoint (`/v1/rerank/` is `/v1/rerank`), and what follows it.
        const route = match.endpoint.route + match.subpath;
        principal = await authenticate(pin.snapshot, request.headers, route, request.method, true);
        authorizePassThrough(principal, route, request.method);
      }
      // x-svc-* headers never go to the target; a key header (Authorization, api-key, x-api-key, …)
      // does not when it carries one of the gateway's keys, whichever header authenticated the
      // call, and on a public route too.
      const withheld = match.endpoint.forwardHeaders ? await headersCarryingGatewayKeys(pin.snapshot, request.headers, url.pathname) : NONE_WITHHELD;
      const ctx = { snapshot: pin.snapshot, principal, callId: newCallId(), log, release: pin.release, withheld };
      return await forwardPassThrough(match.endpoint, match.subpath, request, ctx);
    } catch (err) {
      pin.release();
      throw err;
    }
  };
  return new Elysia().all("/*", handle, { parse: "none" });
}
