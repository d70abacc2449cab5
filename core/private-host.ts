/**
 * Whether a host names this machine or a private network by name or address literal: loopback,
 * private, link-local (cloud metadata), unspecified, IPv4-mapped. A DNS name that resolves there is
 * not caught. The SSRF guard wherever a caller chooses an address the gateway will fetch.
 */
import { isIP } from "node:net";

const PRIVATE_V4 = [/^127\./, /^10\./, /^172\.(1[6-9]|2\d|3[01])\./, /^192\.168\./, /^169\.254\./, /^0\./];

/** `hostname` as `URL.hostname` gives it (IPv6 in brackets). */
export function isPrivateHost(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, "").toLowerCase();
  if (host === "localhost" || host.endsWith(".localhost")) return true;
  const v = isIP(host);
  if (v === 4) return PRIVATE_V4.some((r) => r.test(host));
  if (v === 6) return host === "::" || host === "::1" || /^f[cd]/.test(host) || /^fe[89ab]/.test(host) || /^::ffff:/.test(host);
  return false;
}
