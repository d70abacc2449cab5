/**
 * Whether a host names this machine or a private network by name or address literal: loopback,
 * private, link-local (cloud metadata), unspecified, IPv4-mapped. A DNS name that resolves there is
 * not caught here (`resolvesPrivate` catches it). The SSRF guard wherever a caller chooses an
 * address the gateway will fetch.
 */
import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { BoundedMap } from "./bounded-map.ts";

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

/**
 * The first loopback or private address `hostname` resolves to, if any: a DNS name (a host's own
 * name in /etc/hosts, `*.nip.io`, a record its owner points inward) passes `isPrivateHost` and
 * still makes the gateway fetch this machine or its network (LiteLLM's SSRF reports, #24952,
 * #37053), so a caller-chosen host is resolved before each fetch and refused when it lands inside.
 * A name that does not resolve is left to the fetch (which fails). A record changed between this
 * lookup and the fetch's own (DNS rebinding with a zero TTL) is not caught; a lookup is reused for
 * LOOKUP_REUSE_MS.
 */
export function resolvesPrivate(hostname: string, now = Date.now()): Promise<string | undefined> {
  const host = hostname.replace(/^\[|\]$/g, "");
  if (isPrivateHost(host)) return Promise.resolve(host);
  if (isIP(host)) return Promise.resolve(undefined);
  const seen = lookups.get(host);
  if (seen && now - seen.at < LOOKUP_REUSE_MS) return seen.inside;
  const inside = lookup(host, { all: true }).then(
    (addresses) => addresses.find((a) => isPrivateHost(a.address))?.address,
    () => undefined,
  );
  lookups.set(host, { at: now, inside });
  return inside;
}

/**
 * How long a host's lookup is reused. A team webhook is delivered once per call of its team, and
 * a client's `api_base` checked at every call: without it, each cost a resolver round trip. A
 * record pointed inward is seen within this long (rebinding faster than that is not caught anyway).
 */
const LOOKUP_REUSE_MS = 5_000;
/** By host name (client-chosen: bounded). */
const lookups = new BoundedMap<string, { at: number; inside: Promise<string | undefined> }>(1000);
