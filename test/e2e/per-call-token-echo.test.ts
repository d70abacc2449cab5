// Tokens a provider gets per call (Azure's Entra ID client credentials, Vertex's service-account
// OAuth) are credentials like a configured key: an upstream error that quotes the Authorization
// header it was sent (some gateways in front of Azure do) reaches the client, the spend log and the
// gateway's log with the token replaced by [redacted] (README, Errors).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

const ENTRA_TOKEN = "eyJENTRAaccessTOKENsecret123";
const GOOGLE_TOKEN = "ya29.GOOGLEaccessTOKENsecret456";
const QUERY_KEY = "QUERYkey+secret/789";
const AZURE_CONFIG_KEY = "azureCONFIGkey0123456789";
const AZURE_ENV_KEY = "azureENVIRONMENTkey9876543210";
let savedAzureKey: string | undefined;

const urls: string[] = [];

let upstream: ReturnType<typeof Bun.serve>;
let gw: TestGateway;

beforeAll(async () => {
  // Both token endpoints, and a data plane that refuses every call quoting its Authorization header.
  upstream = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch(req) {
      const path = new URL(req.url).pathname;
      if (path.endsWith("/oauth2/v2.0/token")) return Response.json({ token_type: "Bearer", expires_in: 3600, access_token: ENTRA_TOKEN });
      if (path === "/google-token") return Response.json({ token_type: "Bearer", expires_in: 3600, access_token: GOOGLE_TOKEN });
      urls.push(req.url);
      return Response.json({ error: { code: 401, status: "UNAUTHENTICATED", message: `Access denied: ${req.headers.get("authorization") ?? `api-key ${req.headers.get("api-key")}`} at ${req.url}` } }, { status: 401 });
    },
  });
  const base = `http://127.0.0.1:${upstream.port}`;
  savedAzureKey = process.env.AZURE_API_KEY;
  process.env.AZURE_API_KEY = AZURE_ENV_KEY;
  const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const serviceAccount = {
    type: "service_account",
    project_id: "acme",
    private_key: privateKey.export({ type: "pkcs8", format: "pem" }) as string,
    client_email: "gateway@acme.iam.gserviceaccount.com",
    token_uri: `${base}/google-token`,
  };
  gw = await startBackendGateway("pglite", {
    model_list: [
      {
        model_name: "az",
        svc_params: { model: "azure/echo-dep", api_base: base, azure_authority_host: base, tenant_id: "t1", client_id: "c1", client_secret: "CLIENTSECRETazure" },
      },
      { model_name: "az-key", svc_params: { model: "azure/echo-dep", api_base: base, api_key: AZURE_CONFIG_KEY } },
      { model_name: "az-env", svc_params: { model: "azure/echo-dep", api_base: base } },
      { model_name: "vx", svc_params: { model: "vertex_ai/gemini-2.5-pro", api_base: base, vertex_credentials: serviceAccount } },
      { model_name: "oq", svc_params: { model: "openai/gpt-4o-mini", api_base: `${base}/v1?tier=2&key=${encodeURIComponent(QUERY_KEY)}`, api_key: "sk-operator-key" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
});

afterAll(async () => {
  if (savedAzureKey === undefined) delete process.env.AZURE_API_KEY;
  else process.env.AZURE_API_KEY = savedAzureKey;
  await gw?.stop();
  upstream?.stop(true);
});

describe("an upstream error that quotes the per-call bearer token", () => {
  for (const [model, token] of [
    ["az", ENTRA_TOKEN],
    ["vx", GOOGLE_TOKEN],
    // Azure's api-key, from svc_params or from AZURE_API_KEY.
    ["az-key", AZURE_CONFIG_KEY],
    ["az-env", AZURE_ENV_KEY],
  ] as const) {
    test(`${model}: the client, the spend log and the log see [redacted] instead of the token`, async () => {
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] }),
      });
      const text = await res.text();
      expect(res.status).toBe(401);
      expect(JSON.parse(text).error.message).toContain(model.startsWith("az-") ? "Access denied: api-key [redacted]" : "Access denied: Bearer [redacted]");
      expect(text).not.toContain(token);

      await gw.host!.spendWriter.flush();
      const logs = await requestJson<{ metadata: { error_information: { error_message: string } } }[]>(gw, "GET", `/spend/logs?request_id=${res.headers.get("x-svc-call-id")}&summarize=false`);
      expect(logs.body.map((r) => r.metadata.error_information.error_message)).toEqual([expect.stringContaining("Access denied: ")]);
      expect(logs.text).toContain("[redacted]");
      expect(logs.text).not.toContain(token);
      expect(JSON.stringify(gw.log.lines)).not.toContain(token);
    });
  }
});

describe("an upstream error that quotes the URL it was sent", () => {
  test("a key in api_base's query is [redacted] for the client, the spend log and the log; the path goes before the query", async () => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "oq", messages: [{ role: "user", content: "hi" }] }),
    });
    const text = await res.text();
    expect(res.status).toBe(401);
    // Sent as written in api_base (percent-encoded), after the call's path.
    expect(urls.at(-1)).toEndWith(`/v1/chat/completions?tier=2&key=${encodeURIComponent(QUERY_KEY)}`);
    expect(JSON.parse(text).error.message).toContain("/v1/chat/completions?tier=2&key=[redacted]");
    await gw.host!.spendWriter.flush();
    const logs = await requestJson(gw, "GET", `/spend/logs?request_id=${res.headers.get("x-svc-call-id")}&summarize=false`);
    expect(logs.text).toContain("key=[redacted]");
    for (const shown of [text, logs.text, JSON.stringify(gw.log.lines)]) {
      expect(shown).not.toContain(encodeURIComponent(QUERY_KEY));
      expect(shown).not.toContain(QUERY_KEY);
    }
  });
});
