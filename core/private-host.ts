/**
 * Whether a host names this machine or a network that is not the public internet, by name or
 * address literal: every block of IANA's special-purpose address registries (IPv4 and IPv6) that is
 * not globally reachable (loopback, private, shared/CGNAT, link-local with cloud metadata,
 * benchmarking, documentation, unspecified, IPv4-mapped, unique-local, …), multicast and reserved
 * space, and a NAT64 or 6to4 address around such an IPv4 address. A DNS name that resolves there
 * is not caught here (`checkHost` catches it). The SSRF guard wherever a caller chooses an address
 * the gateway will fetch.
 */
import { lookup } from "node:dns/promises";
import { BlockList, isIP } from "node:net";
import { BoundedMap } from "./bounded-map.ts";

/** https://www.iana.org/assignments/iana-ipv4-special-registry (Globally Reachable: False), and 224/4 multicast, 240/4 reserved, broadcast. */
const INSIDE_V4: readonly [string, number][] = [
  ["0.0.0.0", 8],
  ["10.0.0.0", 8],
  // Shared address space: carrier-grade NAT, and cloud-internal services (Alibaba Cloud's metadata at 100.100.100.200).
  ["100.64.0.0", 10],
  ["127.0.0.0", 8],
  ["169.254.0.0", 16],
  ["172.16.0.0", 12],
  ["192.0.0.0", 24],
  ["192.0.2.0", 24],
  ["192.88.99.0", 24],
  ["192.168.0.0", 16],
  ["198.18.0.0", 15],
  ["198.51.100.0", 24],
  ["203.0.113.0", 24],
  ["224.0.0.0", 3],
];

/**
 * https://www.iana.org/assignments/iana-ipv6-special-registry (Globally Reachable: False), and
 * site-local and multicast. `::/96` holds `::`, `::1` and the deprecated IPv4-compatible `::a.b.c.d`.
 * 2001::/23 is refused whole: its few globally reachable assignments are no provider's address.
 * IPv4-mapped `::ffff:0:0/96` is not listed (a BlockList matches every IPv4 address against it): see isMapped.
 */
const INSIDE_V6: readonly [string, number][] = [
  ["::", 96],
  ["64:ff9b:1::", 48],
  ["100::", 64],
  ["100:0:0:1::", 64],
  ["2001::", 23],
  ["2001:db8::", 32],
  ["3fff::", 20],
  ["5f00::", 16],
  ["fc00::", 7],
  ["fe80::", 10],
  ["fec0::", 10],
  ["ff00::", 8],
];

const inside = new BlockList();
for (const [net, prefix] of INSIDE_V4) inside.addSubnet(net, prefix, "ipv4");
for (const [net, prefix] of INSIDE_V6) inside.addSubnet(net, prefix, "ipv6");

/** An IPv6 address's eight 16-bit groups (an embedded dotted IPv4 tail as its two). */
function ipv6Groups(address: string): number[] {
  const tail = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(address);
  const group = (high: string | undefined, low: string | undefined) => (Number(high) * 256 + Number(low)).toString(16);
  const hex = tail ? `${address.slice(0, tail.index)}${group(tail[1], tail[2])}:${group(tail[3], tail[4])}` : address;
  const [head = "", rest] = hex.split("::");
  const parse = (part: string) => (part === "" ? [] : part.split(":").map((g) => Number.parseInt(g, 16)));
  const front = parse(head);
  const back = rest === undefined ? [] : parse(rest);
  return [...front, ...Array<number>(8 - front.length - back.length).fill(0), ...back];
}

/** `::ffff:a.b.c.d`: refused whatever the IPv4 address (no provider is addressed so; a way round an IPv4 check). */
const isMapped = (g: number[]): boolean => g.slice(0, 5).every((x) => x === 0) && g[5] === 0xffff;

const v4Of = (high: number, low: number): string => [high >> 8, high & 255, low >> 8, low & 255].join(".");

/** The IPv4 address a NAT64 (64:ff9b::/96) or 6to4 (2002::/16) address leads to, if it is one. */
function embeddedV4(address: string): string | undefined {
  const g = ipv6Groups(address);
  if (g[0] === 0x64 && g[1] === 0xff9b && g.slice(2, 6).every((x) => x === 0)) return v4Of(g[6]!, g[7]!);
  if (g[0] === 0x2002) return v4Of(g[1]!, g[2]!);
  return undefined;
}

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
  if (v === 4) return inside.check(host, "ipv4");
  if (v !== 6) return false;
  if (inside.check(host, "ipv6") || isMapped(ipv6Groups(host))) return true;
  const v4 = embeddedV4(host);
  return v4 !== undefined && inside.check(v4, "ipv4");
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
