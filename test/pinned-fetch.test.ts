// DNS rebinding: a name checked as public (private-host.ts checkHost) and then resolved again by
// the fetch can answer a loopback address the second time. Fetches to caller-chosen hosts connect
// to the address the check saw instead, keeping the name for the Host header and for TLS (the
// certificate is still checked against the name: test/fixtures/tls holds a self-signed one for
// example.test, made for these tests only). A client-chosen upstream follows no redirect.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { lookup } from "node:dns/promises";
import { hostname } from "node:os";
import { join } from "node:path";
import { webhookTiming } from "../core/callbacks/team-webhooks.ts";
import type { Deployment, ProviderAdapter } from "../core/contract.ts";
import { pinnedRequest } from "../core/pinned-fetch.ts";
import { Deadline, send } from "../core/pipeline/upstream.ts";
import { forgetLookups, hostResolver, isPrivateHost } from "../core/private-host.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "./harness/gateway.ts";

const TLS = join(import.meta.dir, "fixtures/tls");
const seen: { server: string; host: string | null; path: string }[] = [];
let https: ReturnType<typeof Bun.serve>;
let plain: ReturnType<typeof Bun.serve>;
let elsewhere: ReturnType<typeof Bun.serve>;

/** A server that notes every request it gets (which server, Host header, path), then answers with `reply`. */
function recording(server: string, options: { hostname: string; tls?: Parameters<typeof Bun.serve>[0]["tls"] }, reply: (path: string) => Response) {
  return Bun.serve({
    port: 0,
    ...options,
    fetch(req) {
      const path = new URL(req.url).pathname;
      seen.push({ server, host: req.headers.get("host"), path });
      return reply(path);
    },
  });
}

beforeAll(() => {
  const tls = { cert: Bun.file(join(TLS, "example-test.cert.pem")), key: Bun.file(join(TLS, "example-test.key.pem")) };
  https = recording("https", { hostname: "127.0.0.1", tls }, () => new Response("ok"));
  elsewhere = recording("elsewhere", { hostname: "127.0.0.1" }, () => new Response("you were redirected here"));
  plain = recording("plain", { hostname: "0.0.0.0" }, (path) =>
    path === "/redirect/embeddings" ? Response.redirect(`http://127.0.0.1:${elsewhere.port}/metadata`, 302) : new Response("ok"),
  );
});
afterAll(() => {
  for (const s of [https, plain, elsewhere]) s?.stop(true);
});

test("over TLS: connected to the address, the certificate checked against the name, the Host header the name's", async () => {
  const to = pinnedRequest(`https://example.test:${https.port}/v1/x`, { authorization: "Bearer t" }, "127.0.0.1");
  expect(to.url).toBe(`https://127.0.0.1:${https.port}/v1/x`);
  const ca = await Bun.file(join(TLS, "example-test.cert.pem")).text();
  const res = await fetch(to.url, { headers: to.headers, tls: { ...to.tls, ca } });
  expect(await res.text()).toBe("ok");
  expect(seen.at(-1)).toEqual({ server: "https", host: `example.test:${https.port}`, path: "/v1/x" });
  // The same address under a name the certificate does not hold is refused, as a fetch by that name would be.
  const other = pinnedRequest(`https://other.test:${https.port}/v1/x`, {}, "127.0.0.1");
  await expect(fetch(other.url, { headers: other.headers, tls: { ...other.tls, ca } })).rejects.toThrow();
});

test("over plain HTTP: a Host header given by the caller is replaced by the name's; an IPv6 address is bracketed; literals stay as they are", () => {
  const to = pinnedRequest("http://hooks.example.test:8080/in?x=1", { Host: "somewhere-else", "x-a": "1" }, "203.0.113.7");
  expect(to).toEqual({ url: "http://203.0.113.7:8080/in?x=1", headers: { "x-a": "1", host: "hooks.example.test:8080" } });
  expect(pinnedRequest("https://hooks.example.test/in", {}, "2001:db8::1")).toEqual({ url: "https://[2001:db8::1]/in", headers: { host: "hooks.example.test" }, tls: { serverName: "hooks.example.test" } });
  expect(pinnedRequest("http://203.0.113.7/in", { a: "b" }, "203.0.113.7")).toEqual({ url: "http://203.0.113.7/in", headers: { a: "b" } });
  expect(pinnedRequest("http://hooks.example.test/in", { a: "b" }, undefined)).toEqual({ url: "http://hooks.example.test/in", headers: { a: "b" } });
});

test("a client-chosen upstream that answers a redirect: the redirect is not followed", async () => {
  const adapter = { endpoints: {} } as unknown as ProviderAdapter;
  const d: Deployment = { id: "d", modelName: "m", provider: "openai", upstreamModel: "m", options: {}, info: {}, connectTo: { host: "127.0.0.1", address: "127.0.0.1" } };
  const before = seen.length;
  const res = await send(adapter, d, { url: `http://127.0.0.1:${plain.port}/redirect/embeddings`, headers: { authorization: "Bearer client-key" }, body: "{}" }, new Deadline(new AbortController().signal, 5));
  expect(res.status).toBe(302);
  expect(seen.slice(before).map((s) => s.server)).toEqual(["plain"]);
  // Configured deployments (no connectTo) keep fetch's default; so does a call to a host other
  // than the client's api_base (an adapter that calls its provider's own endpoint).
  const { connectTo: _, ...configured } = d;
  const elsewhereChosen: Deployment = { ...d, connectTo: { host: "api.example.test", address: "203.0.113.9" } };
  for (const deployment of [configured, elsewhereChosen]) {
    const followed = await send(adapter, deployment, { url: `http://127.0.0.1:${plain.port}/redirect/embeddings`, headers: {}, body: "{}" }, new Deadline(new AbortController().signal, 5));
    expect(await followed.text()).toBe("you were redirected here");
  }
});

/** A name (this host's own) that no literal check catches but that resolves to a loopback or private address here, if any. */
const inwardName = await lookup(hostname(), { all: true }).then(
  (a) => (!isPrivateHost(hostname()) && a.some((x) => isPrivateHost(x.address)) ? hostname() : undefined),
  () => undefined,
);

test.skipIf(!inwardName)("a team admin's webhook whose name was checked as public is delivered to that address, not to where the name points by then", async () => {
  let gw: TestGateway | undefined;
  const realLookup = hostResolver.lookup;
  // The record as the check sees it: a public address (AS112's, a DNS sink: nothing answers on this port). The fetch's own resolution would give this machine.
  hostResolver.lookup = async (host) => (host === inwardName ? [{ address: "192.31.196.1", family: 4 }] : realLookup(host));
  forgetLookups();
  const timing = { ...webhookTiming };
  Object.assign(webhookTiming, { timeoutMs: 500, retryAfterMs: 50 });
  try {
    gw = await startBackendGateway("pglite", { model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" } }], general_settings: { master_key: MASTER_KEY } });
    expect((await requestJson(gw, "POST", "/user/new", { body: { user_id: "rebind-admin" } })).status).toBe(200);
    expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: "rebind", members_with_roles: [{ role: "admin", user_id: "rebind-admin" }] } })).status).toBe(200);
    const adminKey = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: "rebind", user_id: "rebind-admin" } })).body.key;
    const url = `http://${inwardName}:${plain.port}/rebound`;
    const reg = await fetch(`${gw.url}/team/rebind/callback`, {
      method: "POST",
      headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
      body: JSON.stringify({ callbacks: [{ callback_type: "webhook", url }] }),
    });
    expect(reg.status).toBe(200);
    const call = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "chat", messages: [{ role: "user", content: "hi" }] }),
    });
    expect(call.status).toBe(200);
    await call.text();
    // Two attempts at the checked address, both failing; none at this machine.
    const failed = () => gw!.log.lines.filter((l) => l.msg === "team webhook unreachable").length;
    for (const end = Date.now() + 30_000; failed() < 2 && Date.now() < end; ) await Bun.sleep(50);
    expect(failed()).toBe(2);
    expect(seen.filter((s) => s.path === "/rebound")).toEqual([]);
  } finally {
    hostResolver.lookup = realLookup;
    forgetLookups();
    Object.assign(webhookTiming, timing);
    await gw?.stop();
  }
}, 60_000);
