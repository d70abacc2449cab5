/**
 * One POST of a notification the gateway sends on its own (a team webhook's event, a budget
 * alert). A redirect is not followed: it would let the receiver send the gateway, and the headers
 * it carries, to an address the operator or team never chose (this machine or a private network
 * among them). A 3xx is then an answer other than 2xx: a failed attempt like any other.
 */
import { boundBy } from "../fetch-bound.ts";
import { pinnedRequest } from "../pinned-fetch.ts";

export async function postNotification(url: string, headers: Record<string, string>, body: string, timeoutMs: number, address?: string): Promise<Response> {
  // `address`: the one the host was checked at (a team admin's webhook), connected to (pinned-fetch.ts).
  const to = pinnedRequest(url, headers, address);
  const res = await fetch(to.url, { method: "POST", headers: to.headers, body, ...boundBy(AbortSignal.timeout(timeoutMs)), redirect: "manual", ...(to.tls ? { tls: to.tls } : {}) });
  // Read to the end, so the connection is free for the next delivery.
  await res.arrayBuffer().catch(() => undefined);
  return res;
}
