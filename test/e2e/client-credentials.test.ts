// Client-side credentials on embeddings: `api_base` / `api_key` in the body are refused unless the
// operator allows them (a client-chosen address is an SSRF hole); when allowed, only listed hosts
// (or public https ones without a list) are reached, with the client's key.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import { lookup } from "node:dns/promises";
import { hostname } from "node:os";
import { isPrivateHost } from "../../core/private-host.ts";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

let configured: MockOpenAI;

/** A name (this host's own) that no literal check catches but that resolves to a loopback or private address here, if any. */
const inwardName = await lookup(hostname(), { all: true }).then(
  (a) => (!isPrivateHost(hostname()) && a.some((x) => isPrivateHost(x.address)) ? hostname() : undefined),
  () => undefined,
);
let clients: MockOpenAI;

async function embed(gw: TestGateway, extra: Record<string, unknown>): Promise<{ status: number; hit: boolean; body: { error?: { message: string; param: string } } }> {
  const res = await fetch(`${gw.url}/v1/embeddings`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "emb", input: "hello", ...extra }),
  });
  return { status: res.status, hit: res.headers.get("x-svc-cache-hit") === "true", body: (await res.json()) as never };
}

const config = (svc: Record<string, unknown>) => ({
  model_list: [{ model_name: "emb", svc_params: { model: "openai/text-embedding-3-small", api_base: configured.url, api_key: "sk-operator" } }],
  svc_settings: svc,
  general_settings: { master_key: MASTER_KEY },
});

beforeAll(async () => {
  configured = await startMockOpenAI({ apiKey: "sk-operator" });
  clients = await startMockOpenAI({ apiKey: "sk-client" });
});
afterAll(async () => {
  await configured?.stop();
  await clients?.stop();
});

describe("client-side credentials", () => {
  test("by default api_base and api_key in the body are a 400, and nothing is fetched", async () => {
    const gw = await startTestGateway(config({}));
    try {
      const r = await embed(gw, { api_base: clients.url, api_key: "sk-client" });
      expect(r.status).toBe(400);
      expect(r.body.error!.param).toBe("api_base");
      expect(r.body.error!.message).toContain("allow_client_side_credentials");
      expect((await embed(gw, { api_key: "sk-client" })).status).toBe(400);
      expect(clients.requests.length + configured.requests.length).toBe(0);
      // Without them the configured deployment answers.
      expect((await embed(gw, {})).status).toBe(200);
    } finally {
      await gw.stop();
    }
  });

  test("allowed with a host list: a listed host is reached with the client's key; others are refused", async () => {
    const gw = await startTestGateway(config({ allow_client_side_credentials: true, client_side_api_base_hosts: ["127.0.0.1"] }));
    try {
      const r = await embed(gw, { api_base: clients.url, api_key: "sk-client" });
      expect(r.status).toBe(200);
      expect(clients.requests.at(-1)!.headers.authorization).toBe("Bearer sk-client");
      const other = await embed(gw, { api_base: "https://attacker.example/v1", api_key: "sk-client" });
      expect(other.status).toBe(400);
      expect(other.body.error!.message).toContain("not allowed");
    } finally {
      await gw.stop();
    }
  });

  test("a client's api_base without an api_key gets none of the operator's credentials: no key, no configured headers", async () => {
    const withHeaders = config({ allow_client_side_credentials: true, client_side_api_base_hosts: ["127.0.0.1"] });
    const entry = withHeaders.model_list[0]!;
    const gw = await startTestGateway({ ...withHeaders, model_list: [{ ...entry, svc_params: { ...entry.svc_params, headers: { "X-Operator-Auth": "operator-header-secret" } } }] });
    try {
      const before = clients.requests.length;
      await embed(gw, { api_base: clients.url });
      const sent = clients.requests.at(-1)!;
      expect(clients.requests.length).toBe(before + 1);
      expect(JSON.stringify(sent.headers)).not.toContain("sk-operator");
      expect(JSON.stringify(sent.headers)).not.toContain("operator-header-secret");
      // With its own key the client's address gets that key; the operator's address still gets the operator's.
      expect((await embed(gw, { api_base: clients.url, api_key: "sk-client" })).status).toBe(200);
      expect(clients.requests.at(-1)!.headers.authorization).toBe("Bearer sk-client");
      expect((await embed(gw, {})).status).toBe(200);
      expect(configured.requests.at(-1)!.headers.authorization).toBe("Bearer sk-operator");
      expect(configured.requests.at(-1)!.headers["x-operator-auth"]).toBe("operator-header-secret");
    } finally {
      await gw.stop();
    }
  });

  test("Azure (api-key, AD token, Entra ID client) and Vertex: a client's api_base gets neither the operator's credentials nor a token made from them; a client's key goes where the provider reads one", async () => {
    // One server stands for the operator's address, the client's and both token endpoints.
    const seen: { path: string; headers: Record<string, string> }[] = [];
    const echo = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      fetch(req) {
        const path = new URL(req.url).pathname;
        if (path.endsWith("/oauth2/v2.0/token")) return Response.json({ token_type: "Bearer", expires_in: 3600, access_token: "ENTRA-operator-token" });
        if (path === "/google-token") return Response.json({ token_type: "Bearer", expires_in: 3600, access_token: "ya29.GOOGLE-operator-token" });
        seen.push({ path, headers: Object.fromEntries(req.headers) });
        return Response.json({ error: { message: "refused" } }, { status: 401 });
      },
    });
    const base = `http://127.0.0.1:${echo.port}`;
    const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
    const serviceAccount = { type: "service_account", project_id: "acme", private_key: privateKey.export({ type: "pkcs8", format: "pem" }), client_email: "gw@acme.iam.gserviceaccount.com", token_uri: `${base}/google-token` };
    const operator = ["AZ-operator-key", "AZ-operator-ad-token", "ENTRA-operator-secret", "ENTRA-operator-token", "ya29.GOOGLE-operator-token"];
    const gw = await startTestGateway({
      model_list: [
        { model_name: "az", svc_params: { model: "azure/emb", api_base: base, api_key: operator[0] } },
        { model_name: "az-ad", svc_params: { model: "azure/emb", api_base: base, azure_ad_token: operator[1] } },
        { model_name: "az-entra", svc_params: { model: "azure/emb", api_base: base, tenant_id: "t", client_id: "c", client_secret: operator[2], azure_authority_host: base } },
        { model_name: "vtx", svc_params: { model: "vertex_ai/text-embedding-004", api_base: base, vertex_credentials: serviceAccount } },
      ],
      svc_settings: { allow_client_side_credentials: true, client_side_api_base_hosts: ["127.0.0.1"] },
      general_settings: { master_key: MASTER_KEY },
    });
    const sent = (path: string) => seen.filter((s) => s.path.startsWith(path));
    try {
      for (const model of ["az", "az-ad", "az-entra", "vtx"]) {
        // The operator's own address gets the operator's credentials (the Entra and Google tokens are made then).
        await embed(gw, { model });
        for (const [body, who] of [
          [{ api_base: `${base}/client-${model}` }, "no key"],
          [{ api_base: `${base}/client-${model}`, api_key: "client-own-key" }, "the client's key"],
        ] as const) {
          await embed(gw, { model, ...body });
          const got = sent(`/client-${model}`).at(-1);
          const headers = JSON.stringify(got?.headers);
          expect([model, who, operator.filter((c) => headers.includes(c))]).toEqual([model, who, []]);
          const keyHeader = model === "vtx" ? ["authorization", "Bearer client-own-key"] : ["api-key", "client-own-key"];
          expect([model, who, got?.headers[keyHeader[0]!]]).toEqual([model, who, "api_key" in body ? keyHeader[1] : undefined]);
        }
      }
      // A client's key without api_base, on Azure: in api-key instead of the operator's, not as a bearer token beside it.
      await embed(gw, { model: "az", api_key: "client-own-key" });
      const own = sent("/openai/deployments/emb").at(-1)!.headers;
      expect([own["api-key"], own.authorization]).toEqual(["client-own-key", undefined]);
    } finally {
      await gw.stop();
      echo.stop(true);
    }
  });

  test("allowed without a list: plain http and private addresses are refused", async () => {
    const gw = await startTestGateway(config({ allow_client_side_credentials: true }));
    try {
      expect((await embed(gw, { api_base: clients.url })).status).toBe(400);
      // A fully qualified name's trailing dot changes nothing: `localhost.` is this machine too.
      for (const base of ["https://127.0.0.1/v1", "https://10.0.0.5/v1", "https://169.254.169.254/latest", "https://localhost/v1", "https://localhost.:1/v1", "https://foo.localhost./v1"]) {
        const r = await embed(gw, { api_base: base });
        expect([base, r.status]).toEqual([base, 400]);
        expect(r.body.error!.message).toContain("private addresses");
      }
      // IANA's other special-purpose blocks are no public endpoint either: shared/CGNAT (Alibaba Cloud's
      // metadata service), benchmarking, IETF protocol assignments, multicast, and IPv6 around an inside IPv4 address.
      const before = clients.requests.length + configured.requests.length;
      const special = ["100.100.100.200", "198.18.0.1", "192.0.0.192", "224.0.0.1", "[64:ff9b::a9fe:a9fe]", "[2002:a00:1::]", "[::a00:1]", "[64:ff9b:1::1]", "[2001:db8::1]"];
      for (const host of special) {
        const r = await embed(gw, { api_base: `https://${host}/v1` });
        expect([host, r.status, r.body.error?.message]).toEqual([host, 400, expect.stringContaining("private addresses")]);
      }
      expect(clients.requests.length + configured.requests.length).toBe(before);
      // A name that does not resolve here is refused too: the fetch's own resolver might find one the check never saw.
      const unresolved = await embed(gw, { api_base: "https://no-such-host.invalid/v1" });
      expect(unresolved.status).toBe(400);
      expect(unresolved.body.error!.message).toContain("does not resolve");
      // The client's key alone goes to the configured address.
      expect((await embed(gw, { api_key: "sk-operator" })).status).toBe(200);
    } finally {
      await gw.stop();
    }
  });

  // LiteLLM #24952 / #37053: a client-chosen api_base was an SSRF hole; a name is no way around the private-address check.
  test.skipIf(!inwardName)("allowed without a list: a host name that resolves to a private address is refused, and nothing is fetched", async () => {
    const gw = await startTestGateway(config({ allow_client_side_credentials: true }));
    try {
      const before = clients.requests.length;
      const port = new URL(clients.url).port;
      const r = await embed(gw, { api_base: `https://${inwardName}:${port}/v1`, api_key: "sk-client" });
      expect(r.status).toBe(400);
      expect(r.body.error!.param).toBe("api_base");
      expect(r.body.error!.message).toContain("resolves to");
      expect(clients.requests.length).toBe(before);
    } finally {
      await gw.stop();
    }
  });

  test("with the response cache: credentials are refused on a hit too, and answers from another api_base or key are cached apart", async () => {
    let input = `cached ${Math.random()}`;
    const off = await startTestGateway(config({ cache: true }));
    try {
      expect((await embed(off, { input })).status).toBe(200);
      expect((await embed(off, { input })).hit).toBe(true);
      // Refused as without the cache: the cached answer does not let a forbidden field through.
      const r = await embed(off, { input, api_base: clients.url, api_key: "sk-client" });
      expect(r.status).toBe(400);
      expect(r.body.error!.param).toBe("api_base");
    } finally {
      await off.stop();
    }
    const on = await startTestGateway(config({ cache: true, allow_client_side_credentials: true, client_side_api_base_hosts: ["127.0.0.1"] }));
    try {
      // Another input: the in-memory cache outlives a gateway in this process.
      input = `${input} again`;
      const before = { configured: configured.requests.length, clients: clients.requests.length };
      // The client's own server answered: that answer is not one for callers of the configured deployment.
      expect(await embed(on, { input, api_base: clients.url, api_key: "sk-client" })).toMatchObject({ status: 200, hit: false });
      expect(await embed(on, { input })).toMatchObject({ status: 200, hit: false });
      expect(await embed(on, { input, api_base: clients.url, api_key: "sk-client" })).toMatchObject({ status: 200, hit: true });
      expect(await embed(on, { input })).toMatchObject({ status: 200, hit: true });
      // Another key at the same address is asked itself (a wrong one is refused there, not answered from the cache).
      expect(await embed(on, { input, api_base: clients.url, api_key: "sk-wrong" })).toMatchObject({ status: 401, hit: false });
      expect({ configured: configured.requests.length - before.configured, clients: clients.requests.length - before.clients }).toEqual({ configured: 1, clients: 2 });
    } finally {
      await on.stop();
    }
  });
});
