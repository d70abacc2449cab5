// The SSRF guard's address check (core/private-host.ts) against IANA's special-purpose registries:
// every block not globally reachable is inside, and public addresses (also behind NAT64/6to4) are not.
import { expect, test } from "bun:test";
import { isPrivateHost } from "../../core/private-host.ts";

const inside = [
  ...["0.1.2.3", "10.0.0.1", "100.64.0.1", "100.100.100.200", "100.127.255.255", "127.0.0.1", "169.254.169.254", "172.16.0.1", "172.31.255.255"],
  ...["192.0.0.192", "192.0.2.1", "192.88.99.1", "192.168.1.1", "198.18.0.1", "198.19.255.255", "198.51.100.1", "203.0.113.1", "224.0.0.1", "240.0.0.1", "255.255.255.255"],
  ...["[::]", "[::1]", "[::a00:1]", "[::ffff:7f00:1]", "::ffff:8.8.8.8", "[64:ff9b::a00:1]", "64:ff9b::169.254.169.254", "[64:ff9b:1::1]", "[100::1]"],
  ...["[2001::1]", "[2001:2::1]", "[2001:db8::1]", "[2002:a00:1::]", "[2002:6440:1::]", "[3fff::1]", "[5f00::1]", "[fc00::1]", "[fd12::1]", "[fe80::1]", "[fec0::1]", "[ff02::1]"],
];
const outside = ["8.8.8.8", "1.1.1.1", "100.63.255.255", "100.128.0.1", "172.32.0.1", "192.0.1.1", "198.17.255.255", "198.20.0.1", "223.255.255.255", "[2606:4700::1111]", "[64:ff9b::808:808]", "[2002:808:808::]", "api.openai.com"];

test("every IANA special-purpose block that is not globally reachable is inside; multicast and reserved space too", () => {
  expect(inside.filter((h) => !isPrivateHost(h))).toEqual([]);
});

test("public addresses pass, also a NAT64 or 6to4 address around a public IPv4 address", () => {
  expect(outside.filter((h) => isPrivateHost(h))).toEqual([]);
});
