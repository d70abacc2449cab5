/** How Bun.serve serves the app: in core/main.ts, and in the tests' in-process gateway alike. */
import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { errorInfo, errorResponse } from "../errors.ts";

type Fetch = (request: Request) => Response | Promise<Response>;

/**
 * Where Elysia looks for the path: from the first `/` at this index on (`http://` and a host of
 * 4 characters at least). A shorter host, as in `http://llm/key/list` (a Compose or Kubernetes
 * service called `llm`), would be routed as `/list`.
 */
const ELYSIA_PATH_FROM = 11;
/** The first index a URL's path can start at: past `http://` and a host of one character. */
const SHORTEST_PATH_FROM = 8;
/** The origin given to a request Elysia could not route under its own. No route reads it; the Host header is kept as sent. */
const ROUTABLE_ORIGIN = "http://localhost";
const SLASH = 47;

/**
 * The app taking any Host header: a request whose URL Elysia would misread gets one it reads, and
 * every other (every usual Host header) goes through as it is, at the cost of two lookups.
 * Bun leaves the URL without its scheme and host when the Host header is empty (or absent, in
 * HTTP/1.0): the server's own name is meant (RFC 9112 §3.3), so it is routed too. It does the same
 * when the Host header is not a valid host, which is a 400 (RFC 9112 §3.2); the connection is
 * closed, as a body may follow that nobody reads.
 */
export function routingAnyHost(fetch: Fetch): Fetch {
  return (request) => {
    const url = request.url;
    if (url.charCodeAt(0) !== SLASH) {
      const pathStart = url.indexOf("/", SHORTEST_PATH_FROM);
      return fetch(pathStart >= ELYSIA_PATH_FROM ? request : new Request(ROUTABLE_ORIGIN + url.slice(pathStart), request));
    }
    if (request.headers.get("host")) {
      return errorResponse(errorInfo(400, "Bad request: the Host header is not a valid host.", "invalid_request_error"), { connection: "close" });
    }
    return fetch(new Request(ROUTABLE_ORIGIN + url, request));
  };
}

/**
 * A response to a request whose body was never read (refused first: no valid key, say) closes
 * its connection. Otherwise the client goes on sending a body nobody reads, the connection never
 * falls idle, and a graceful stop waits out its whole drain deadline for it.
 */
export function closingUnreadBodies(fetch: Fetch): (request: Request) => Promise<Response> {
  return async (request) => {
    const response = await fetch(request);
    // bodyUsed first: it is true on every served call, and reading `body` would make a stream.
    if (!request.bodyUsed && request.body !== null) response.headers.set("connection", "close");
    return response;
  };
}

/**
 * Bun.serve's options for the app. Bun would refuse a body over its own limit with a bare 413 (no
 * error envelope) before the app sees it; its limit is lifted, as the app bounds every body it
 * reads or forwards (settings.maxRequestBytes) and answers in the envelope.
 * A request given a new URL (routingAnyHost) is the one whose body the app reads, so closingUnreadBodies looks at that one.
 */
export function serveOptions(app: { fetch: Fetch }): { fetch: Fetch; maxRequestBodySize: number } {
  return { fetch: routingAnyHost(closingUnreadBodies(app.fetch)), maxRequestBodySize: Number.MAX_SAFE_INTEGER };
}

/**
 * Why Bun.serve could not listen on `host`, for the line the start stops with. Bun's error says so
 * for a port in use, but for an address of another machine or a name that does not resolve it
 * reports whatever errno was left over (EINVAL, EEXIST, ENOTTY…). So the name is resolved here,
 * then any port of the address tried.
 */
export async function whyNotListening(host: string, err: unknown): Promise<string> {
  if ((err as { code?: unknown }).code === "EADDRINUSE") return "the port is in use (EADDRINUSE)";
  const address = host.replace(/^\[(.*)\]$/, "$1");
  if (!isIP(address)) {
    try {
      await lookup(address);
    } catch {
      return `host not found (${host} does not resolve)`;
    }
  }
  try {
    Bun.listen({ hostname: address, port: 0, socket: { data() {} } }).stop(true);
  } catch {
    return `address not available (${host} is not an address of this machine)`;
  }
  return err instanceof Error ? err.message : String(err);
}
