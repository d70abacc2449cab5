/**
 * A fetch that connects to the address a host was checked at (private-host.ts checkHost), not to
 * whatever the name resolves to by the time the connection is made: with a zero-TTL record, a name
 * can pass the check as a public address and then resolve to this machine for the fetch (DNS
 * rebinding). The URL gets the address; the request keeps the name in its Host header and, over
 * TLS, as the server name the certificate is checked against.
 */
import { isIP } from "node:net";

/** The fetch arguments that connect to `address` for `url`'s host; `url` and `headers` as they are without an address. */
export function pinnedRequest(url: string, headers: Record<string, string>, address: string | undefined): { url: string; headers: Record<string, string>; tls?: { serverName: string } } {
  if (address === undefined) return { url, headers };
  const u = new URL(url);
  const name = u.hostname.replace(/^\[|\]$/g, "");
  if (isIP(name) || name === address) return { url, headers };
  const host = u.host;
  u.hostname = isIP(address) === 6 ? `[${address}]` : address;
  const named = Object.fromEntries(Object.entries(headers).filter(([h]) => h.toLowerCase() !== "host"));
  return { url: u.href, headers: { ...named, host }, ...(u.protocol === "https:" ? { tls: { serverName: name } } : {}) };
}
