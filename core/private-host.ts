/**
 * Whether a host names this machine or a private network by name or address literal: loopback,
 * private, link-local (cloud metadata), unspecified, IPv4-mapped. A DNS name that resolves there is
 * not caught here (`checkHost` catches it). The SSRF guard wherever a caller chooses an
 * address the gateway will fetch.
 */
import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { BoundedMap } from "./bounded-map.ts";

const PRIVATE_V4 = [/^127\./, /^10\./, /^172\.(1[6-9]|2\d|3[01])\./, /^192\.168\./, /^169\.254\./, /^0\./];

/**
 * A host as names compare: without IPv6 brackets, lower case, and without the trailing dot of a
 * fully qualified name (`localhost.` is `localhost`, and reaches this machine as surely).
 */
const bare = (hostname: string): string => hostname.replace(/^\[|\]$/g, "").replace(/\.+$/, "").toLowerCase();

/** `hostname` as `URL.hostname` gives it (IPv6 in brackets). */
export function isPrivateHost(hostname: string): boolean {
  const host = bare(hostname);
  if (host === "localhost" || host.endsWith(".localhost")) return true;
  const v = isIP(host);
  if (v === 4) return PRIVATE_V4.some((r) => r.test(host));
  if (v === 6) return host === "::" || host === "::1" || /^f[cd]/.test(host) || /^fe[89ab]/.test(host) || /^::ffff:/.test(host);
  return false;
}

/** What a caller-chosen host resolved to: its first loopback or private address, else the address to connect to. */
export interface HostCheck {
  /** A loopback or private address among the host's: the fetch is refused. */
  inside?: string;
  /**
   * The address the check passed, which the fetch then connects to (pinned-fetch.ts): a record
   * changed between this lookup and the fetch's own (DNS rebinding with a zero TTL) would send it
   * inside. Undefined for an address literal (nothing to pin).
   */
  address?: string;
  /**
   * The name did not resolve here: the fetch is refused too, as its own resolver may still find an
   * address this check never saw (Bun's fetch resolves `*.localhost` to loopback by itself).
   */
  unresolved?: true;
}

/** The resolver checks use; a test replaces `lookup` to play a record that changes. */
export const hostResolver = { lookup: (host: string) => lookup(host, { all: true }) };

/**
 * Resolves a caller-chosen host: a DNS name (a host's own name in /etc/hosts, `*.nip.io`, a record
 * its owner points inward) passes `isPrivateHost` and still makes the gateway fetch this machine or
 * its network (LiteLLM's SSRF reports, #24952, #37053), so it is resolved before each fetch, refused
 * when any of its addresses is inside, and otherwise fetched at the address checked. A name that
 * does not resolve is refused as well (`unresolved`). A lookup is reused for LOOKUP_REUSE_MS.
 */
export function checkHost(hostname: string, now = Date.now()): Promise<HostCheck> {
  const host = bare(hostname);
  if (isPrivateHost(host)) return Promise.resolve({ inside: host });
  if (isIP(host)) return Promise.resolve({});
  const seen = lookups.get(host);
  if (seen && now - seen.at < LOOKUP_REUSE_MS) return seen.check;
  const check = hostResolver.lookup(host).then(
    (addresses): HostCheck => {
      const inside = addresses.find((a) => isPrivateHost(a.address))?.address;
      if (inside) return { inside };
      return addresses[0] ? { address: addresses[0].address } : { unresolved: true };
    },
    (): HostCheck => ({ unresolved: true }),
  );
  lookups.set(host, { at: now, check });
  return check;
}

/** The first loopback or private address `hostname` resolves to, if any (see checkHost). */
export function resolvesPrivate(hostname: string, now = Date.now()): Promise<string | undefined> {
  return checkHost(hostname, now).then((c) => c.inside);
}

/** Forgets every lookup (a test that changes what a name resolves to). */
export function forgetLookups(): void {
  lookups.clear();
}

/**
 * How long a host's lookup is reused. A team webhook is delivered once per call of its team, and
 * a client's `api_base` checked at every call: without it, each cost a resolver round trip. A
 * record pointed inward is followed within this long; until then the fetch still goes to the
 * address checked (pinned), never to the new one.
 */
const LOOKUP_REUSE_MS = 5_000;
/** By host name (client-chosen: bounded). */
const lookups = new BoundedMap<string, { at: number; check: Promise<HostCheck> }>(1000);
