type Fetch = (request: Request) => Response | Promise<Response>;

/**
 * A response to a request whose body was never read (refused first: too large, no key) closes
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
