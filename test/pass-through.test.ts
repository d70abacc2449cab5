// Pass-through endpoints (`general_settings.pass_through_endpoints`): a gateway route forwarded as
// it is to another HTTP API. The target gets the method, the rest of the path (with
// include_subpath), the client's query after its own, the body and the configured headers (env
// references resolved), and never the gateway key; the client gets the target's status, headers
// and bytes, streamed. Keys, allowed_passthrough_routes (key's and team's), allowed_routes, rate
// limits and budgets apply; cost_per_request is charged per answered call and every call is in the
// spend log. Timeouts, dead targets and departed clients end the call cleanly; reloads add and
// remove endpoints; admins list them with header values hidden.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { connect } from "node:net";
import { sql } from "drizzle-orm";
import { rows } from "../core/store/sql.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "./harness/gateway.ts";

const SECRET = "pt-upstream-secret-7f3a9c";
process.env.PT_TEST_SECRET = SECRET;

interface Seen {
  method: string;
  path: string;
  search: string;
  headers: Record<string, string>;
  body: string;
}

const seen: Seen[] = [];
const ENCODED_TEXT = new TextEncoder().encode("an answer the target encoded ".repeat(8));
let releaseSecond: () => void = () => {};
let stallAborted = false;
let target: ReturnType<typeof Bun.serve>;
let gw: TestGateway;

function config(extra: Record<string, unknown>[] = []) {
  const base = `http://127.0.0.1:${target.port}`;
  return {
    model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" } }],
    general_settings: {
      master_key: MASTER_KEY,
      pass_through_endpoints: [
        { path: "/v1/rerank", target: `${base}/echo/rerank?api=1`, headers: { Authorization: "bearer os.environ/PT_TEST_SECRET", "x-static": "fixed" }, methods: ["POST"], cost_per_request: 0.25 },
        { path: "/bria", target: `${base}/echo/bria/`, include_subpath: true, forward_headers: true },
        { id: "public-status", path: "/status", target: `${base}/echo/status`, auth: false, forward_headers: true },
        { path: "/events", target: `${base}/sse` },
        { path: "/hang", target: `${base}/hang`, timeout: 0.3 },
        { path: "/dead", target: "http://127.0.0.1:9/x", headers: { "x-api-key": "os.environ/PT_TEST_SECRET" } },
        { path: "/stall", target: `${base}/stall` },
        ...extra,
      ],
    },
  };
}

const call = (path: string, init: RequestInit & { key?: string | null } = {}) => {
  const headers = new Headers(init.headers);
  if (init.key !== null && !headers.has("authorization")) headers.set("authorization", `Bearer ${init.key ?? MASTER_KEY}`);
  return fetch(`${gw.url}${path}`, { ...init, headers });
};

async function newKey(body: Record<string, unknown>): Promise<string> {
  const r = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body });
  expect(r.status).toBe(200);
  return r.body.key;
}

async function logRow(callId: string): Promise<Record<string, unknown>> {
  await gw.host!.spendWriter.flush();
  const [row] = await rows<Record<string, unknown>>(
    gw.host!.store.db,
    sql`select call_type, model, status, spend::text as spend, api_key from spend_logs where call_id = ${callId}`,
  );
  return row!;
}

beforeAll(async () => {
  target = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    idleTimeout: 30,
    async fetch(req) {
      const url = new URL(req.url);
      seen.push({ method: req.method, path: url.pathname, search: url.search, headers: Object.fromEntries(req.headers), body: await req.text() });
      if (url.pathname === "/sse") {
        const wait = new Promise<void>((r) => {
          releaseSecond = r;
        });
        const enc = new TextEncoder();
        const body = new ReadableStream<Uint8Array>({
          async start(c) {
            c.enqueue(enc.encode("data: one\n\n"));
            await wait;
            c.enqueue(enc.encode("data: two\n\n"));
            c.enqueue(enc.encode("data: [DONE]\n\n"));
            c.close();
          },
        });
        return new Response(body, { headers: { "content-type": "text/event-stream" } });
      }
      if (url.pathname === "/hang") {
        await new Promise((r) => req.signal.addEventListener("abort", r));
        return new Response("late");
      }
      if (url.pathname === "/stall") {
        req.signal.addEventListener("abort", () => {
          stallAborted = true;
        });
        const body = new ReadableStream<Uint8Array>({
          start(c) {
            c.enqueue(new TextEncoder().encode("first part "));
          },
        });
        return new Response(body, { headers: { "content-type": "text/plain" } });
      }
      if (url.pathname.endsWith("/big")) {
        // All of it at once: the target never keeps the gateway waiting.
        const mib = new Uint8Array(1 << 20).fill(97);
        let left = Number(url.searchParams.get("mib"));
        const body = new ReadableStream<Uint8Array>({
          pull(c) {
            if (left-- > 0) c.enqueue(mib);
            else c.close();
          },
        });
        return new Response(body, { headers: { "content-type": "application/octet-stream" } });
      }
      if (url.pathname.endsWith("/not-modified")) return new Response(null, { status: 304, headers: { etag: '"v1"', "content-length": "256" } });
      if (url.pathname.endsWith("/conn")) return new Response("ok", { headers: { connection: "x-gone", "x-gone": "1", "keep-alive": "timeout=9", "x-stays": "1" } });
      if (url.pathname.endsWith("/encoded")) {
        const encoding = url.searchParams.get("encoding")!;
        return new Response(encoding === "gzip" ? Bun.gzipSync(ENCODED_TEXT) : ENCODED_TEXT, { headers: { "content-type": "text/plain", "content-encoding": encoding } });
      }
      const status = Number(url.searchParams.get("status") ?? 200);
      const headers: Record<string, string> = { "content-type": "application/json", "x-target": "yes" };
      if (status === 429) headers["retry-after"] = "7";
      return new Response(JSON.stringify({ echoed: url.pathname, status }), { status, headers });
    },
  });
  gw = await startBackendGateway("pglite", config());
});

afterAll(async () => {
  await gw?.stop();
  target?.stop(true);
});

const last = (): Seen => seen[seen.length - 1]!;

/** Serves `extra` endpoints besides the usual ones while `run` runs. */
async function withEndpoints(extra: Record<string, unknown>[], run: () => Promise<void>): Promise<void> {
  gw.writeConfig(config(extra));
  expect((await gw.live.reload("test")).ok).toBe(true);
  try {
    await run();
  } finally {
    gw.writeConfig(config());
    expect((await gw.live.reload("test")).ok).toBe(true);
  }
}

interface RawReply {
  status: number;
  headers: Headers;
  body: Buffer;
  /** The answer ended as its framing says, not with the connection cut first. */
  complete: boolean;
}

/** An HTTP/1.1 answer as it came over the wire, unchunked. */
function parseRaw(raw: Buffer): RawReply {
  const end = raw.indexOf("\r\n\r\n");
  if (end < 0) return { status: 0, headers: new Headers(), body: Buffer.alloc(0), complete: false };
  const [statusLine, ...lines] = raw.subarray(0, end).toString("latin1").split("\r\n");
  const headers = new Headers(lines.map((l): [string, string] => [l.slice(0, l.indexOf(":")), l.slice(l.indexOf(":") + 1).trim()]));
  const rest = raw.subarray(end + 4);
  const status = Number(statusLine!.split(" ")[1]);
  if (!/chunked/i.test(headers.get("transfer-encoding") ?? "")) {
    const length = Number(headers.get("content-length") ?? 0);
    return { status, headers, body: rest.subarray(0, length), complete: rest.length >= length };
  }
  const parts: Buffer[] = [];
  for (let at = 0; ; ) {
    const lineEnd = rest.indexOf("\r\n", at);
    const size = lineEnd < 0 ? Number.NaN : Number.parseInt(rest.subarray(at, lineEnd).toString("latin1"), 16);
    if (Number.isNaN(size) || rest.length < lineEnd + 2 + size + 2) return { status, headers, body: Buffer.concat(parts), complete: false };
    if (size === 0) return { status, headers, body: Buffer.concat(parts), complete: true };
    parts.push(rest.subarray(lineEnd + 2, lineEnd + 2 + size));
    at = lineEnd + 2 + size + 2;
  }
}

/**
 * One request over a connection of its own, from a client as slow as asked: its body sent in
 * `parts`, `gapMs` apart; the answer not read for `readAfterMs` (the socket paused, so the
 * gateway's writes back up as over a slow link); or the client gone by `leaveAfterMs`.
 */
function slowClient(head: string, opts: { parts?: string[]; gapMs?: number; readAfterMs?: number; leaveAfterMs?: number }): Promise<RawReply> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    const socket = connect(Number(new URL(gw.url).port), "127.0.0.1", async () => {
      if (opts.readAfterMs !== undefined || opts.leaveAfterMs !== undefined) socket.pause();
      if (opts.readAfterMs !== undefined) setTimeout(() => socket.resume(), opts.readAfterMs);
      if (opts.leaveAfterMs !== undefined) setTimeout(() => socket.destroy(), opts.leaveAfterMs);
      socket.write(head);
      for (const [i, part] of (opts.parts ?? []).entries()) {
        if (i > 0) await Bun.sleep(opts.gapMs ?? 0);
        socket.write(part);
      }
    });
    socket.on("data", (d: Buffer) => chunks.push(d));
    // A cut connection: what came before it is the answer.
    socket.on("error", () => {});
    socket.on("close", () => resolve(parseRaw(Buffer.concat(chunks))));
  });
}

const getHead = (path: string) => `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${MASTER_KEY}\r\nConnection: close\r\n\r\n`;

describe("forwarding", () => {
  test("method, path, the client's query after the target's, body and configured headers reach the target; the gateway key does not", async () => {
    const res = await call("/v1/rerank?top_n=3", { method: "POST", headers: { "content-type": "application/json", "x-client-only": "c" }, body: JSON.stringify({ query: "q", documents: ["a"] }) });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-target")).toBe("yes");
    expect(res.headers.get("x-svc-call-id")).toBeTruthy();
    expect(await res.json()).toEqual({ echoed: "/echo/rerank", status: 200 });
    const s = last();
    expect(s).toMatchObject({ method: "POST", path: "/echo/rerank", search: "?api=1&top_n=3", body: JSON.stringify({ query: "q", documents: ["a"] }) });
    expect(s.headers.authorization).toBe(`bearer ${SECRET}`);
    expect(s.headers["x-static"]).toBe("fixed");
    expect(s.headers["content-type"]).toBe("application/json");
    // A body of known length goes with its length, not chunked.
    expect(s.headers["content-length"]).toBe(String(s.body.length));
    expect(s.headers["transfer-encoding"]).toBeUndefined();
    // Without forward_headers only what the body is and what the client accepts go along.
    expect(s.headers["x-client-only"]).toBeUndefined();
    expect(JSON.stringify(s.headers)).not.toContain(MASTER_KEY);
  });

  test("forward_headers sends the client's headers on, except the gateway credential it authenticated with", async () => {
    const key = await newKey({});
    const res = await fetch(`${gw.url}/bria/v1/text-to-image/base/2.3`, { method: "POST", headers: { "x-svc-api-key": key, "x-client": "c1", "content-type": "text/plain" }, body: "hello" });
    expect(res.status).toBe(200);
    const s = last();
    expect(s).toMatchObject({ method: "POST", path: "/echo/bria/v1/text-to-image/base/2.3", body: "hello" });
    expect(s.headers["x-client"]).toBe("c1");
    expect(s.headers["x-svc-api-key"]).toBeUndefined();
    expect(s.headers.authorization).toBeUndefined();
    expect(JSON.stringify(s.headers)).not.toContain(key);
  });

  test("a query parameter the target URL sets is the operator's: the client cannot override it", async () => {
    expect((await call("/v1/rerank?api=evil&top_n=2", { method: "POST", body: "{}" })).status).toBe(200);
    expect(last().search).toBe("?api=1&top_n=2");
  });

  test("an encoded slash or backslash in the path is refused, so it cannot step out of the endpoint or its allowed prefix", async () => {
    const before = seen.length;
    for (const path of ["/bria/..%2f..%2fadmin", "/bria/x%5C..%5Cy", "/bria/%2F"]) {
      const res = await call(path);
      expect(res.status).toBe(400);
      expect((await res.json()).error.code).toBe("400");
    }
    expect(seen.length).toBe(before);
  });

  test("include_subpath: only the endpoint that asks for it takes paths below its own; the others are unknown routes", async () => {
    expect((await call("/bria", { method: "GET" })).status).toBe(200);
    expect(last().path).toBe("/echo/bria/");
    const res = await call("/v1/rerank/extra", { method: "POST", body: "{}" });
    expect(res.status).toBe(404);
    expect((await res.json()).error).toMatchObject({ type: "not_found_error", code: "404" });
  });

  test("an endpoint path with non-ASCII letters serves the requests that name it (percent-encoded, as clients send it)", async () => {
    gw.writeConfig(config([{ path: "/résumé", target: `http://127.0.0.1:${target.port}/echo/cv`, include_subpath: true }]));
    expect((await gw.live.reload("test")).ok).toBe(true);
    try {
      for (const path of ["/résumé", "/r%C3%A9sum%C3%A9/t%C3%AAte"]) expect((await call(`${path}?x=1`)).status).toBe(200);
      expect(last()).toMatchObject({ path: "/echo/cv/t%C3%AAte", search: "?x=1" });
    } finally {
      gw.writeConfig(config());
      expect((await gw.live.reload("test")).ok).toBe(true);
    }
  });

  test("an encoded answer reaches the client as the target sent it, with its content-encoding; without forward_headers the target is asked for identity", async () => {
    for (const encoding of ["gzip", "x-custom"]) {
      const init = { decompress: false } as RequestInit;
      const res = await call(`/bria/encoded?encoding=${encoding}`, init);
      expect(res.status).toBe(200);
      expect(res.headers.get("content-encoding")).toBe(encoding);
      const bytes = new Uint8Array(await res.arrayBuffer());
      expect(bytes).toEqual(encoding === "gzip" ? Bun.gzipSync(ENCODED_TEXT) : ENCODED_TEXT);
    }
    // forward_headers: the client's accept-encoding, or none (fetch adds none of its own).
    await (await call("/bria/plain", { headers: { "accept-encoding": "br" } })).arrayBuffer();
    expect(last().headers["accept-encoding"]).toBe("br");
    await (await call("/bria/plain", { decompress: false } as RequestInit)).arrayBuffer();
    expect(last().headers["accept-encoding"]).toBeUndefined();
    await (await call("/v1/rerank", { method: "POST", body: "{}", headers: { "accept-encoding": "gzip" } })).arrayBuffer();
    expect(last().headers["accept-encoding"]).toBe("identity");
  });

  test("the target's Content-Length reaches the client: it is no hop-by-hop header", async () => {
    // A 304 has no body: its length is the one a GET would have.
    const res = await call("/bria/not-modified", { headers: { "if-none-match": '"v1"' } });
    expect(res.status).toBe(304);
    expect(res.headers.get("etag")).toBe('"v1"');
    expect(res.headers.get("content-length")).toBe("256");
    // A body's length, where the client gets one, is that of the bytes it gets, also when they are compressed.
    const encoded = await call("/bria/encoded?encoding=gzip", { decompress: false } as RequestInit);
    const bytes = await encoded.arrayBuffer();
    expect(encoded.headers.get("content-length") ?? String(bytes.byteLength)).toBe(String(bytes.byteLength));
  });

  test("hop-by-hop headers, and those a Connection header names, are not passed on either way", async () => {
    const res = await call("/bria/conn", { headers: { connection: "keep-alive, x-hop", "x-hop": "1", "keep-alive": "timeout=5", "x-kept": "2" } });
    expect(await res.text()).toBe("ok");
    expect(last().headers["x-hop"]).toBeUndefined();
    expect(last().headers["x-kept"]).toBe("2");
    expect(res.headers.get("x-gone")).toBeNull();
    expect(res.headers.get("keep-alive")).toBeNull();
    expect(res.headers.get("x-stays")).toBe("1");
  });

  test("a method the endpoint does not serve is a 405 naming the ones it does", async () => {
    const res = await call("/v1/rerank", { method: "GET" });
    expect(res.status).toBe(405);
    expect(res.headers.get("allow")).toBe("POST");
    expect((await res.json()).error.message).toContain("use POST");
  });

  test("a redirect reaches the client as it is (not followed) and is not charged", async () => {
    const key = await newKey({});
    const res = await call("/v1/rerank?status=302", { method: "POST", key, body: "{}" });
    expect(res.status).toBe(302);
    expect(await logRow(res.headers.get("x-svc-call-id")!)).toMatchObject({ call_type: "pass_through", status: "success", spend: "0.000000000000" });
  });

  test("the target's error status, body and retry-after reach the client; the call is logged as a failure and not charged", async () => {
    const res = await call("/bria/fail?status=429", { method: "GET" });
    expect(res.status).toBe(429);
    expect(res.headers.get("retry-after")).toBe("7");
    expect(await res.json()).toEqual({ echoed: "/echo/bria/fail", status: 429 });
    expect(await logRow(res.headers.get("x-svc-call-id")!)).toMatchObject({ call_type: "pass_through", model: "/bria", status: "failure", spend: "0.000000000000" });
  });

  test("a streamed answer arrives as the target sends it, not at its end", async () => {
    const res = await call("/events");
    expect(res.headers.get("content-type")).toBe("text/event-stream");
    const reader = res.body!.getReader();
    const first = await reader.read();
    expect(new TextDecoder().decode(first.value)).toBe("data: one\n\n");
    releaseSecond();
    let rest = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      rest += new TextDecoder().decode(value);
    }
    expect(rest).toBe("data: two\n\ndata: [DONE]\n\n");
  });
});

describe("who may call", () => {
  test("no key: 401 in the spec's envelope; the target is not asked", async () => {
    const before = seen.length;
    const res = await call("/v1/rerank", { method: "POST", key: null, body: "{}" });
    expect(res.status).toBe(401);
    expect((await res.json()).error.type).toBe("authentication_error");
    expect(seen.length).toBe(before);
  });

  test("auth: false makes an endpoint public, and the client's own Authorization goes to the target, but never one of the gateway's keys", async () => {
    const res = await call("/status", { key: null, headers: { authorization: "Bearer upstream-token" } });
    expect(res.status).toBe(200);
    expect(last().headers.authorization).toBe("Bearer upstream-token");
    const key = await newKey({});
    for (const gatewayKey of [MASTER_KEY, key]) {
      expect((await call("/status", { key: gatewayKey })).status).toBe(200);
      expect(last().headers.authorization).toBeUndefined();
      expect(JSON.stringify(last().headers)).not.toContain(gatewayKey);
    }
  });

  test("with the gateway key in x-svc-api-key, the client's own Authorization still goes to a forward_headers target", async () => {
    const key = await newKey({});
    const res = await fetch(`${gw.url}/bria/y`, { headers: { "x-svc-api-key": key, authorization: "Bearer for-the-target" } });
    expect(res.status).toBe(200);
    expect(last().headers.authorization).toBe("Bearer for-the-target");
    expect(last().headers["x-svc-api-key"]).toBeUndefined();
  });

  test("a gateway key in Authorization never reaches a forward_headers target, also when x-svc-api-key authenticated the call", async () => {
    const key = await newKey({});
    // An SDK's apiKey plus a default x-svc-api-key header; or another of the gateway's keys; bare or as Bearer.
    for (const [path, svc, auth] of [
      ["/bria/both", key, `Bearer ${key}`],
      ["/bria/both", key, `Bearer ${MASTER_KEY}`],
      ["/bria/both", key, key],
      ["/status", key, `bearer ${key}`],
    ]) {
      const res = await fetch(`${gw.url}${path}`, { headers: { "x-svc-api-key": svc!, authorization: auth! } });
      expect(res.status).toBe(200);
      expect(last().headers.authorization).toBeUndefined();
      expect(JSON.stringify(last().headers)).not.toContain(key);
    }
  });

  test("a gateway key never reaches a forward_headers target in a key header sent twice, or in any key header as Bearer", async () => {
    const key = await newKey({});
    const withKey = (name: string, ...values: string[]) => {
      const headers = new Headers({ "x-svc-api-key": key });
      for (const value of values) headers.append(name, value);
      return headers;
    };
    for (const headers of [
      withKey("authorization", `Bearer ${key}`, `Bearer ${key}`),
      withKey("authorization", "Bearer provider-own-key", `Bearer ${key}`),
      withKey("x-api-key", key, key),
      withKey("api-key", "provider-own-key", key),
      withKey("api-key", `Bearer ${key}`),
      withKey("x-goog-api-key", `BEARER ${MASTER_KEY}`),
    ]) {
      const res = await fetch(`${gw.url}/bria/dup`, { headers });
      expect(res.status).toBe(200);
      const sent = JSON.stringify(last().headers);
      expect([[...headers].join(" "), sent.includes(key) || sent.includes(MASTER_KEY)]).toEqual([[...headers].join(" "), false]);
    }
  });

  test("an Azure, Anthropic or Google SDK's key header authenticates a pass-through call; with a gateway key it never reaches the target, with the client's own key it does", async () => {
    const key = await newKey({});
    for (const header of ["api-key", "x-api-key", "x-goog-api-key", "ocp-apim-subscription-key"]) {
      const res = await fetch(`${gw.url}/bria/sdk`, { headers: { [header]: key } });
      expect(res.status).toBe(200);
      expect(last().headers[header]).toBeUndefined();
      expect(JSON.stringify(last().headers)).not.toContain(key);
      // The client's own provider key next to the gateway's: the target gets it.
      const both = await fetch(`${gw.url}/bria/sdk`, { headers: { authorization: `Bearer ${key}`, [header]: "provider-own-key" } });
      expect(both.status).toBe(200);
      expect(last().headers[header]).toBe("provider-own-key");
      expect(last().headers.authorization).toBeUndefined();
    }
    const wrong = await fetch(`${gw.url}/bria/sdk`, { headers: { "api-key": "sk-not-a-gateway-key" } });
    expect(wrong.status).toBe(401);
  });

  test("a key's allowed_passthrough_routes limit which endpoints it may call", async () => {
    const key = await newKey({ allowed_passthrough_routes: ["/bria/*"] });
    expect((await call("/bria/x", { key })).status).toBe(200);
    const refused = await call("/v1/rerank", { method: "POST", key, body: "{}" });
    expect(refused.status).toBe(403);
    expect((await refused.json()).error).toMatchObject({ type: "permission_error", message: expect.stringContaining("/bria/*") });
  });

  test("a trailing slash after an endpoint's path is that endpoint, for a key's route lists too", async () => {
    const key = await newKey({ allowed_passthrough_routes: ["/v1/rerank"] });
    for (const path of ["/v1/rerank", "/v1/rerank/", "/v1/rerank//"]) {
      const res = await call(path, { method: "POST", key, body: "{}" });
      expect(res.status).toBe(200);
      expect(last().path).toBe("/echo/rerank");
    }
    const routes = await newKey({ allowed_routes: ["/v1/rerank"] });
    expect((await call("/v1/rerank/", { method: "POST", key: routes, body: "{}" })).status).toBe(200);
  });

  test("a key without its own list follows its team's allowed_passthrough_routes", async () => {
    const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { allowed_passthrough_routes: ["/v1/rerank"] } });
    expect(team.status).toBe(200);
    const key = await newKey({ team_id: team.body.team_id });
    expect((await call("/v1/rerank", { method: "POST", key, body: "{}" })).status).toBe(200);
    expect((await call("/bria/x", { key })).status).toBe(403);
  });

  test("allowed_routes, when set, decide alone: pass-through routes are llm_api_routes, not management_routes", async () => {
    const management = await newKey({ allowed_routes: ["management_routes"], allowed_passthrough_routes: ["/bria/*"] });
    expect((await call("/bria/x", { key: management })).status).toBe(403);
    const llm = await newKey({ allowed_routes: ["llm_api_routes"], allowed_passthrough_routes: ["/bria/*"] });
    expect((await call("/v1/rerank", { method: "POST", key: llm, body: "{}" })).status).toBe(200);
  });

  test("a key's key_type holds it on pass-through routes, and its own allowed_passthrough_routes within that", async () => {
    const calls = seen.length;
    for (const body of [{ key_type: "management" }, { key_type: "management", allowed_passthrough_routes: ["/v1/rerank"] }, { key_type: "read_only" }]) {
      const key = await newKey(body);
      for (const [path, method] of [["/v1/rerank", "POST"], ["/bria/x", "GET"]] as const) {
        const refused = await call(path, { method, key, ...(method === "POST" ? { body: "{}" } : {}) });
        expect(refused.status).toBe(403);
        expect((await refused.json()).error.type).toBe("permission_error");
      }
    }
    // The operator's provider key never went out for them.
    expect(seen.length).toBe(calls);
    expect((await call("/v1/rerank", { method: "POST", key: await newKey({ key_type: "llm_api" }), body: "{}" })).status).toBe(200);
    const listed = await newKey({ key_type: "llm_api", allowed_passthrough_routes: ["/v1/rerank"] });
    expect((await call("/v1/rerank", { method: "POST", key: listed, body: "{}" })).status).toBe(200);
    expect((await call("/bria/x", { key: listed })).status).toBe(403);
    // A llm_api key still reaches no management route.
    expect((await requestJson(gw, "GET", "/key/info", { key: listed })).status).toBe(403);
  });

  describe("a team's allowed_passthrough_routes bind its keys, whatever the team's admin gives them", () => {
    let team: string;
    let adminKey: string;
    const asAdmin = (path: string, body: Record<string, unknown>) => requestJson<{ key: string; error: { param: string; message: string } }>(gw, "POST", path, { key: adminKey, body });

    beforeAll(async () => {
      const made = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { allowed_passthrough_routes: ["/bria/*"], members_with_roles: [{ role: "admin", user_id: "pt-team-admin" }] } });
      team = made.body.team_id;
      adminKey = await newKey({ team_id: team, user_id: "pt-team-admin" });
    });

    test("a key listing routes outside the team's is refused, on generate and on update", async () => {
      const wider = await asAdmin("/key/generate", { team_id: team, allowed_passthrough_routes: ["/v1/rerank", "/bria/v2/*"] });
      expect(wider.status).toBe(400);
      expect(wider.body.error.param).toBe("allowed_passthrough_routes");
      // Only the entry outside the team's is named.
      expect(wider.body.error.message).toContain("allowed_passthrough_routes: /v1/rerank. ");
      const narrow = await asAdmin("/key/generate", { team_id: team, allowed_passthrough_routes: ["/bria/v2/*"] });
      expect(narrow.status).toBe(200);
      expect((await asAdmin("/key/update", { key: narrow.body.key, allowed_passthrough_routes: ["/bria/*", "/status"] })).status).toBe(400);
      expect((await call("/bria/v2/x", { key: narrow.body.key })).status).toBe(200);
      expect((await call("/bria/x", { key: narrow.body.key })).status).toBe(403);
    });

    test("a key's allowed_routes reach no pass-through route its team's list leaves out", async () => {
      const everything = await asAdmin("/key/generate", { team_id: team, allowed_routes: ["/*"] });
      expect(everything.status).toBe(200);
      const refused = await call("/v1/rerank", { method: "POST", key: everything.body.key, body: "{}" });
      expect(refused.status).toBe(403);
      expect((await refused.json()).error.message).toContain(`team ${team}`);
      expect((await call("/bria/x", { key: everything.body.key })).status).toBe(200);
      const plain = await asAdmin("/key/generate", { team_id: team });
      expect((await asAdmin("/key/update", { key: plain.body.key, allowed_routes: ["/*"] })).status).toBe(200);
      expect((await call("/v1/rerank", { method: "POST", key: plain.body.key, body: "{}" })).status).toBe(403);
    });

    test("a route group in the team's list is read as at call time by key writes and the team's listing: llm_api_routes is every pass-through route, management_routes none", async () => {
      const endpointsOf = async (teamId: string) =>
        (await requestJson<{ endpoints: { id: string }[] }>(gw, "GET", `/config/pass_through_endpoint/team/${teamId}`)).body.endpoints.map((e) => e.id);
      const every = ["/v1/rerank", "/bria", "public-status", "/events", "/hang", "/dead", "/stall"];
      for (const [group, callable] of [
        ["llm_api_routes", true],
        ["management_routes", false],
      ] as const) {
        const made = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { allowed_passthrough_routes: [group] } });
        const teamId = made.body.team_id;
        const teamKey = await newKey({ team_id: teamId });
        expect((await call("/bria/x", { key: teamKey })).status).toBe(callable ? 200 : 403);
        expect(await endpointsOf(teamId)).toEqual(callable ? every : []);
        const narrower = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: teamId, allowed_passthrough_routes: ["/bria/*"] } });
        expect(narrower.status).toBe(callable ? 200 : 400);
        if (callable) expect((await call("/bria/x", { key: narrower.body.key })).status).toBe(200);
        // A key listing the group itself lies within a team that lists it, and within no narrower team.
        expect((await requestJson(gw, "POST", "/key/generate", { body: { team_id: teamId, allowed_passthrough_routes: ["llm_api_routes"] } })).status).toBe(callable ? 200 : 400);
      }
      expect((await requestJson(gw, "POST", "/key/generate", { body: { team_id: team, allowed_passthrough_routes: ["llm_api_routes"] } })).status).toBe(400);
    });

    test("a key whose list was written before its team's narrowed is held to the team's at call time", async () => {
      const open = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: {} });
      const key = await newKey({ team_id: open.body.team_id, allowed_passthrough_routes: ["/v1/rerank", "/bria/*"] });
      expect((await call("/v1/rerank", { method: "POST", key, body: "{}" })).status).toBe(200);
      expect((await requestJson(gw, "POST", "/team/update", { body: { team_id: open.body.team_id, allowed_passthrough_routes: ["/bria/*"] } })).status).toBe(200);
      expect((await call("/v1/rerank", { method: "POST", key, body: "{}" })).status).toBe(403);
      expect((await call("/bria/x", { key })).status).toBe(200);
    });
  });
});

describe("limits, budgets and spend", () => {
  test("cost_per_request is reserved against the key's budget and charged exactly; the log names the route", async () => {
    // Two calls leave $0.10, less than the third may cost.
    const key = await newKey({ max_budget: 0.6 });
    const statuses: number[] = [];
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await call("/v1/rerank", { method: "POST", key, body: "{}" });
      statuses.push(res.status);
      ids.push(res.headers.get("x-svc-call-id")!);
      if (res.status === 400) {
        const { error } = await res.json();
        expect(error.type).toBe("budget_exceeded");
        // A pass-through call has no max_tokens: it is reserved at the route's price.
        expect(error.message).toContain("at the route's price per call");
        expect(error.message).not.toContain("max_tokens");
      } else await res.arrayBuffer();
    }
    expect(statuses).toEqual([200, 200, 400]);
    expect(await logRow(ids[0]!)).toMatchObject({ call_type: "pass_through", model: "/v1/rerank", status: "success", spend: "0.250000000000" });
    const info = await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${key}`);
    expect(info.body.info.spend).toBe(0.5);
  });

  test("a key's rpm_limit counts pass-through calls, with the rate-limit headers", async () => {
    const key = await newKey({ rpm_limit: 2 });
    const a = await call("/bria/a", { key });
    expect(a.headers.get("x-ratelimit-remaining-requests")).toBe("1");
    expect((await call("/bria/b", { key })).status).toBe(200);
    const third = await call("/bria/c", { key });
    expect(third.status).toBe(429);
    expect(Number(third.headers.get("retry-after"))).toBeGreaterThan(0);
  });
});

describe("when things go wrong", () => {
  test("a target that does not answer within the endpoint's timeout: 408", async () => {
    const started = Date.now();
    const res = await call("/hang");
    expect(res.status).toBe(408);
    expect((await res.json()).error.type).toBe("timeout_error");
    expect(Date.now() - started).toBeLessThan(5000);
  });

  test("a dead target: 503, and the configured credential appears in no answer and no log line", async () => {
    const res = await call("/dead", { method: "POST", body: "{}" });
    expect(res.status).toBe(503);
    const text = await res.text();
    expect(JSON.parse(text).error.type).toBe("api_connection_error");
    expect(text).not.toContain(SECRET);
    expect(JSON.stringify(gw.log.lines)).not.toContain(SECRET);
  });

  test("a client that leaves mid-answer aborts the target's request; the call is logged as cancelled", async () => {
    stallAborted = false;
    const controller = new AbortController();
    const res = await call("/stall", { signal: controller.signal });
    const callId = res.headers.get("x-svc-call-id")!;
    const reader = res.body!.getReader();
    expect(new TextDecoder().decode((await reader.read()).value)).toBe("first part ");
    controller.abort();
    const end = Date.now() + 3000;
    while (!stallAborted && Date.now() < end) await Bun.sleep(20);
    expect(stallAborted).toBe(true);
    let row = await logRow(callId);
    while (!row && Date.now() < end) row = await logRow(callId);
    expect(row).toMatchObject({ call_type: "pass_through", status: "cancelled" });
  });
});

describe("a slow client is not a slow target", () => {
  const slowLink = () => ({ path: "/slow-link", target: `http://127.0.0.1:${target.port}/echo/slow-link`, include_subpath: true, timeout: 0.5 });
  // More than the sockets between client and gateway hold, so the gateway waits on the client.
  const MIB = 48;
  const slowLinkCalls = async () => {
    await gw.host!.spendWriter.flush();
    return rows<{ status: string }>(gw.host!.store.db, sql`select status from spend_logs where model = '/slow-link' order by start_time, call_id`);
  };

  test("an answer the client takes longer than the endpoint's timeout to read reaches it whole; the call is a success", async () => {
    await withEndpoints([slowLink()], async () => {
      const logged = gw.log.lines.length;
      const reply = await slowClient(getHead(`/slow-link/big?mib=${MIB}`), { readAfterMs: 1500 });
      expect(reply.status).toBe(200);
      expect(reply.complete).toBe(true);
      expect(reply.body.length).toBe(MIB << 20);
      expect(await logRow(reply.headers.get("x-svc-call-id")!)).toMatchObject({ call_type: "pass_through", status: "success" });
      expect(JSON.stringify(gw.log.lines.slice(logged))).not.toContain("mid-answer");
    });
  });

  test("an upload slower than the endpoint's timeout reaches the target whole, with a length or chunked; the target's timeout starts once it has the body", async () => {
    const head = (framing: string) => `POST /slow-link/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${MASTER_KEY}\r\nContent-Type: text/plain\r\n${framing}Connection: close\r\n\r\n`;
    await withEndpoints([slowLink()], async () => {
      const parts = ["first part, ", "second part, ", "last part"];
      const withLength = await slowClient(head(`Content-Length: ${parts.join("").length}\r\n`), { parts, gapMs: 500 });
      expect(withLength.status).toBe(200);
      expect(last()).toMatchObject({ method: "POST", path: "/echo/slow-link/upload", body: parts.join("") });
      const chunk = (text: string) => `${text.length.toString(16)}\r\n${text}\r\n`;
      const chunked = await slowClient(head("Transfer-Encoding: chunked\r\n"), { parts: [...parts.map(chunk), "0\r\n\r\n"], gapMs: 400 });
      expect(chunked.status).toBe(200);
      expect(last()).toMatchObject({ method: "POST", path: "/echo/slow-link/upload", body: parts.join("") });
      for (const reply of [withLength, chunked]) expect(await logRow(reply.headers.get("x-svc-call-id")!)).toMatchObject({ status: "success" });
    });
    // A client that leaves mid-upload: the call is cancelled, not a timeout (with a length, the target is never asked).
    for (const framing of [`Content-Length: 100\r\n`, "Transfer-Encoding: chunked\r\n"]) {
      await withEndpoints([slowLink()], async () => {
        const before = await slowLinkCalls();
        const asked = seen.length;
        await slowClient(head(framing), { parts: [framing.startsWith("Content") ? "a few bytes" : "3\r\nabc\r\n"], leaveAfterMs: 1000 });
        let after = await slowLinkCalls();
        for (const end = Date.now() + 3000; after.length === before.length && Date.now() < end; ) after = await slowLinkCalls();
        expect(after.slice(before.length)).toEqual([{ status: "cancelled" }]);
        if (framing.startsWith("Content")) expect(seen.length).toBe(asked);
      });
    }
    // Once the target has the body, its timeout runs as before.
    const started = Date.now();
    const hung = await slowClient(`POST /hang HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${MASTER_KEY}\r\nContent-Length: 4\r\nConnection: close\r\n\r\n`, { parts: ["ab", "cd"], gapMs: 500 });
    expect(hung.status).toBe(408);
    expect(Date.now() - started).toBeGreaterThan(750);
  });

  test("a client that leaves while the gateway waits on it: the call is logged as cancelled, not as a target that stalled", async () => {
    await withEndpoints([slowLink()], async () => {
      const before = await slowLinkCalls();
      await slowClient(getHead(`/slow-link/big?mib=${MIB}`), { leaveAfterMs: 1200 });
      // Paused, the client may not even have read the answer's head: its call is the one new row.
      let after = await slowLinkCalls();
      for (const end = Date.now() + 3000; after.length === before.length && Date.now() < end; ) after = await slowLinkCalls();
      expect(after.slice(before.length)).toEqual([{ status: "cancelled" }]);
    });
  });
});

describe("configuration", () => {
  test("a reload adds and removes endpoints at once", async () => {
    gw.writeConfig(config([{ path: "/extra", target: `http://127.0.0.1:${target.port}/echo/extra` }]));
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect((await call("/extra")).status).toBe(200);
    gw.writeConfig(config());
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect((await call("/extra")).status).toBe(404);
  });

  test("an operator's pass-through serves a route of the spec the gateway does not (batches), instead of its 404", async () => {
    expect((await (await call("/v1/batches/batch_1")).json()).error.message).toContain("are not served by this gateway");
    gw.writeConfig(config([{ path: "/v1/batches", target: `http://127.0.0.1:${target.port}/echo/batches`, include_subpath: true }]));
    expect((await gw.live.reload("test")).ok).toBe(true);
    try {
      expect((await call("/v1/batches/batch_1")).status).toBe(200);
      expect(seen.at(-1)!.path).toBe("/echo/batches/batch_1");
    } finally {
      gw.writeConfig(config());
      expect((await gw.live.reload("test")).ok).toBe(true);
    }
  });

  test("a bad list is refused with every error and its path; the old one keeps serving", async () => {
    gw.writeConfig(
      config([
        { path: "/v1/rerank", target: "http://127.0.0.1:1/x", methods: ["POST", "GET"] },
        { path: "/unset", target: "http://127.0.0.1:1/x", headers: { Authorization: "Bearer os.environ/PT_TEST_UNSET_VAR" } },
        { path: "/typo", target: "http://127.0.0.1:1/x", forward_header: true },
      ]),
    );
    const r = await gw.live.reload("test");
    expect(r.ok).toBe(false);
    const errors = JSON.stringify(r);
    expect(errors).toContain("/general_settings/pass_through_endpoints/9");
    gw.writeConfig(config([{ path: "/v1/rerank", target: "http://127.0.0.1:1/x", methods: ["POST", "GET"] }, { path: "/unset", target: "http://127.0.0.1:1/x", headers: { Authorization: "Bearer os.environ/PT_TEST_UNSET_VAR" } }]));
    const semantic = JSON.stringify(await gw.live.reload("test"));
    expect(semantic).toContain("/general_settings/pass_through_endpoints/7/path: '/v1/rerank' (POST) is already served by /general_settings/pass_through_endpoints/0");
    expect(semantic).toContain("/general_settings/pass_through_endpoints/8/headers/Authorization: environment variable PT_TEST_UNSET_VAR is not set");
    gw.writeConfig(config());
    expect((await call("/v1/rerank", { method: "POST", body: "{}" })).status).toBe(200);
  });

  test("admins list the endpoints (a team's: those it may call) with header values and target credentials hidden", async () => {
    const all = await requestJson<{ endpoints: Record<string, unknown>[] }>(gw, "GET", "/config/pass_through_endpoint");
    expect(all.status).toBe(200);
    expect(all.body.endpoints.map((e) => e.id)).toEqual(["/v1/rerank", "/bria", "public-status", "/events", "/hang", "/dead", "/stall"]);
    expect(all.body.endpoints[0]).toEqual({
      id: "/v1/rerank",
      path: "/v1/rerank",
      target: `http://127.0.0.1:${target.port}/echo/rerank?[redacted]`,
      headers: { Authorization: "[redacted]", "x-static": "[redacted]" },
      forward_headers: false,
      include_subpath: false,
      cost_per_request: 0.25,
      auth: true,
      methods: ["POST"],
    });
    expect(all.text).not.toContain(SECRET);

    const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { allowed_passthrough_routes: ["/bria/*", "/status"] } });
    const mine = await requestJson<{ endpoints: { id: string }[] }>(gw, "GET", `/config/pass_through_endpoint/team/${team.body.team_id}`);
    expect(mine.body.endpoints.map((e) => e.id)).toEqual(["/bria", "public-status"]);
    const one = await requestJson<{ endpoints: { id: string }[] }>(gw, "GET", `/config/pass_through_endpoint/team/${team.body.team_id}?endpoint_id=public-status`);
    expect(one.body.endpoints.map((e) => e.id)).toEqual(["public-status"]);
    expect((await requestJson(gw, "GET", `/config/pass_through_endpoint/team/${team.body.team_id}?endpoint_id=/dead`)).status).toBe(404);
    expect((await requestJson(gw, "GET", "/config/pass_through_endpoint/team/no-such-team")).status).toBe(404);
    // A grant below an endpoint that serves its subpaths lets the team call it: listed too.
    const narrow = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { allowed_passthrough_routes: ["/bria/v2/*", "/briaX"] } });
    const narrowList = await requestJson<{ endpoints: { id: string }[] }>(gw, "GET", `/config/pass_through_endpoint/team/${narrow.body.team_id}`);
    expect(narrowList.body.endpoints.map((e) => e.id)).toEqual(["/bria"]);
    const plain = await newKey({});
    expect((await requestJson(gw, "GET", "/config/pass_through_endpoint", { key: plain })).status).toBe(403);
  });
});
