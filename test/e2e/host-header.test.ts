// The Host header does not change what a request reaches: a short service name (`http://llm/…` in
// Docker Compose or Kubernetes), an IPv6 literal, an empty one (or none, in HTTP/1.0) and an
// absolute-form request target are routed as `Host: localhost` is; one that is no valid host is a 400.
// fetch sets the Host header itself, so these are raw HTTP/1.1 requests.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { rawRequest } from "../harness/util.ts";

let gw: TestGateway;

beforeAll(async () => {
  gw = await startTestGateway({ model_list: [{ model_name: "chat-mock", svc_params: { model: "mock/chat" } }], general_settings: { master_key: MASTER_KEY } }, { store: {} });
}, 60_000);
afterAll(async () => {
  await gw.stop();
});

interface RawAnswer {
  status: number;
  body: string;
}

/** `target` asked with this Host header line (none when `host` is undefined), as the master key. */
async function ask(method: string, target: string, host: string | undefined, body?: unknown, version = "HTTP/1.1"): Promise<RawAnswer> {
  const json = body === undefined ? "" : JSON.stringify(body);
  const head = [`${method} ${target} ${version}`, ...(host === undefined ? [] : [`Host: ${host}`]), `Authorization: Bearer ${MASTER_KEY}`, "Connection: close"];
  if (json) head.push("Content-Type: application/json", `Content-Length: ${Buffer.byteLength(json)}`);
  const text = await rawRequest(gw.url, `${head.join("\r\n")}\r\n\r\n${json}`);
  // "HTTP/1.1 200 OK\r\n…\r\n\r\nbody"
  return { status: Number(text.slice(9, 12)), body: text.slice(text.indexOf("\r\n\r\n") + 4) };
}

/** What a client sees of the routes the report found broken, asked with this Host header line. */
async function answers(host: string | undefined, version?: string): Promise<Record<string, string>> {
  const seen: Record<string, string> = {};
  const show = (r: RawAnswer, pick: (body: Record<string, unknown>) => unknown) => `${r.status} ${r.status === 200 ? JSON.stringify(pick(JSON.parse(r.body))) : r.body}`;
  const live = await ask("GET", "/health/liveliness", host, undefined, version);
  seen.liveliness = `${live.status} ${live.body}`;
  seen.readiness = show(await ask("GET", "/health/readiness", host, undefined, version), (b) => b.status);
  const made = await ask("POST", "/key/generate", host, { key_alias: `host-${host}-${version}` }, version);
  seen.generate = show(made, (b) => typeof b.key);
  const key = made.status === 200 ? String(JSON.parse(made.body).key) : "none";
  seen.info = show(await ask("GET", `/key/info?key=${key}`, host, undefined, version), (b) => (b.info as { key_alias: string }).key_alias);
  seen.models = show(await ask("GET", "/v1/models", host, undefined, version), (b) => (b.data as { id: string }[]).map((m) => m.id));
  const chat = { model: "chat-mock", messages: [{ role: "user", content: "hi" }] };
  seen.chat = show(await ask("POST", "/v1/chat/completions", host, chat, version), (b) => (b.choices as { message: { content: string } }[])[0]?.message.content);
  return seen;
}

const served = (alias: string) => ({
  liveliness: `200 "I'm alive!"`,
  readiness: '200 "healthy"',
  generate: '200 "string"',
  info: `200 ${JSON.stringify(alias)}`,
  models: '200 ["chat-mock"]',
  chat: '200 "This is a mock response to: hi"',
});

describe("the Host header", () => {
  test("a short name, an IPv6 literal or an empty one is routed as localhost is: health, management and model calls", async () => {
    const port = new URL(gw.url).port;
    for (const host of [`localhost:${port}`, "llm", "ai", "gw", "a", "llm:80", "[::1]", `[::1]:${port}`, ""]) {
      expect({ host, answers: await answers(host) }).toEqual({ host, answers: served(`host-${host}-undefined`) });
    }
  });

  test("HTTP/1.0 without a Host header is routed as localhost is", async () => {
    expect(await answers(undefined, "HTTP/1.0")).toEqual(served("host-undefined-HTTP/1.0"));
  });

  test("an absolute-form request target is routed by its path", async () => {
    for (const [target, host] of [
      ["http://llm/key/list?page=1", "llm"],
      ["http://gateway.example:8080/key/list?page=1", "gw"],
    ] as const) {
      const r = await ask("GET", target, host);
      expect({ target, status: r.status, body: Object.keys(JSON.parse(r.body)) }).toEqual({ target, status: 200, body: ["keys", "total_count", "current_page", "total_pages"] });
    }
  });

  test("one that is not a valid host is a 400 saying so, on every route (RFC 9112 §3.2)", async () => {
    for (const host of ["a b", "u@evil", "evil/../x", "evil?x=1"]) {
      for (const [method, path] of [
        ["GET", "/health/liveliness"],
        ["GET", "/key/list"],
        ["GET", "/v1/models"],
        ["POST", "/v1/chat/completions"],
      ] as const) {
        const r = await ask(method, path, host, method === "POST" ? { model: "chat-mock", messages: [{ role: "user", content: "hi" }] } : undefined);
        expect({ host, path, status: r.status, body: JSON.parse(r.body) }).toEqual({
          host,
          path,
          status: 400,
          body: { error: { message: "Bad request: the Host header is not a valid host.", type: "invalid_request_error", param: null, code: "400" } },
        });
      }
    }
  });
});
