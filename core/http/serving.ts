/** How Bun.serve serves the app: in core/main.ts, and in the tests' in-process gateway alike. */
type Fetch = (request: Request) => Response | Promise<Response>;

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
 */
export function serveOptions(app: { fetch: Fetch }): { fetch: (request: Request) => Promise<Response>; maxRequestBodySize: number } {
  return { fetch: closingUnreadBodies(app.fetch), maxRequestBodySize: Number.MAX_SAFE_INTEGER };
}
