// Pass-through endpoints against an independent model of the README's forwarding rules, seeded
// random (PASSTHROUGH_DIFF_SEED=<n> runs another world; every failure names the seed and the step).
// The gateway runs as its own process on a fresh PostgreSQL database, so that everything it prints
// (its log lines, and what Bun itself prints) can be read.
//
// Each run draws a few endpoints (paths, some nested or with non-ASCII letters, two sharing a path
// with different methods; include_subpath on or off; targets with and without their own path prefix
// and query parameters, one that nothing listens on; methods lists; configured headers reading
// secrets with os.environ/; forward_headers; auth: false; cost_per_request; timeout) and a few
// callers (the master key, virtual keys with a budget, an rpm limit, allowed_routes,
// allowed_passthrough_routes of their own or their team's, a key the gateway does not know, none).
// Then a few hundred requests, sent as raw HTTP/1.1 so that their bytes are exactly what the test
// chose: random methods (HEAD and OPTIONS among them), paths with non-ASCII letters,
// percent-encodings (%2F, %5C, %2e%2e), dot segments, double and trailing slashes, queries with
// repeated keys and the keys the target URL sets, headers (the gateway key in Authorization and/or
// x-svc-api-key, other x-svc-* headers, hop-by-hop headers and those Connection names, a Host that
// is no valid host, Cookie, the client's own Authorization) and bodies with a length, chunked, or
// none. An echo target (Bun.serve) records what it got and answers as the test planned: a random
// status, headers (several Set-Cookie, a Content-Encoding, hop-by-hop ones), body bytes (empty,
// binary, large, streamed in pieces), or it hangs, stalls mid-answer, breaks off, or closes the
// connection before answering; sometimes the client leaves, mid-answer or before any.
//
// The model predicts every refusal (400 for an encoded separator or a bad Host, 404, 405 with
// allow, 401, 403, 429, 400 budget_exceeded) or exactly what the target receives (method, path,
// query in order, every header present or absent, body bytes and framing) and what the client gets
// (status, headers, bytes; 408 and 503 naming only the target's origin; an answer broken off cut
// short, never ended as if whole; a client that left: the target's request aborted), the spend-log
// row of every call (status, model, spend to the pico-dollar, key hash) and each key's spend. No
// gateway key reaches the target, and no gateway key, configured header value or secret in a
// target URL appears in an answer, a spend-log row, or anything the gateway process printed.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { connect } from "node:net";
import * as zlib from "node:zlib";
import postgres from "postgres";
import { MASTER_KEY, freshDatabase, requestJson, requestOk, type SpawnedGateway, spawnGateway } from "./harness/gateway.ts";
import { Random } from "./harness/random.ts";
import { sha256, until } from "./harness/util.ts";

const SEED = Number(process.env.PASSTHROUGH_DIFF_SEED || 20_261_127);
const REQUESTS = 400;
const SEED_NOTE = `PASSTHROUGH_DIFF_SEED=${SEED}`;

// ---------------------------------------------------------------------------------------------
// Raw HTTP/1.1 client: the request goes out byte for byte; the answer is parsed by its framing, so
// an answer cut short (no last chunk, fewer bytes than its length) is seen as such.

interface Reply {
  status: number;
  /** Names lowercased, in the order sent, repeated names kept. */
  headers: [string, string][];
  body: Uint8Array;
  /** The answer ended as its framing says (else the connection closed first). */
  complete: boolean;
  /** Everything the gateway sent. */
  raw: Buffer;
  /** The client left after the first bytes of the body. */
  left?: boolean;
}

interface Parsed {
  status: number;
  headers: [string, string][];
  body: Uint8Array;
  complete: boolean;
  /** More may come (the connection is open and the framing says the answer goes on). */
  partial: boolean;
}

/** The answer in `buf` so far; undefined while its head is incomplete on an open connection. */
function parseReply(buf: Buffer, isHead: boolean, closed: boolean): Parsed | undefined {
  const end = buf.indexOf("\r\n\r\n");
  if (end < 0) return closed ? { status: 0, headers: [], body: new Uint8Array(), complete: false, partial: false } : undefined;
  const lines = buf.subarray(0, end).toString("latin1").split("\r\n");
  const status = Number(lines[0]!.split(" ")[1]);
  const headers = lines.slice(1).map((l): [string, string] => {
    const i = l.indexOf(":");
    return [l.slice(0, i).trim().toLowerCase(), l.slice(i + 1).trim()];
  });
  const rest = buf.subarray(end + 4);
  const get = (n: string) => headers.find((h) => h[0] === n)?.[1];
  const done = (body: Uint8Array, complete: boolean): Parsed => ({ status, headers, body, complete, partial: !complete && !closed });
  if (isHead || status === 204 || status === 304 || status < 200) return done(new Uint8Array(), true);
  const te = get("transfer-encoding");
  if (te && /chunked/i.test(te)) {
    const parts: Buffer[] = [];
    let pos = 0;
    for (;;) {
      const lineEnd = rest.indexOf("\r\n", pos);
      if (lineEnd < 0) break;
      const size = Number.parseInt(rest.subarray(pos, lineEnd).toString("latin1"), 16);
      if (Number.isNaN(size)) break;
      if (size === 0) {
        if (rest.length >= lineEnd + 4) return done(Buffer.concat(parts), true);
        break;
      }
      parts.push(rest.subarray(lineEnd + 2, Math.min(rest.length, lineEnd + 2 + size)));
      if (rest.length < lineEnd + 2 + size + 2) break;
      pos = lineEnd + 2 + size + 2;
    }
    return done(Buffer.concat(parts), false);
  }
  const cl = get("content-length");
  if (cl !== undefined) return rest.length >= Number(cl) ? done(rest.subarray(0, Number(cl)), true) : done(rest, false);
  return done(rest, closed);
}

function send(port: number, head: string, body: { bytes: Uint8Array; chunks?: number[] } | undefined, opts: { isHead: boolean; leave: boolean; leaveWhen?: () => boolean }): Promise<Reply> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    let buf = Buffer.alloc(0);
    let done = false;
    const finish = (p: Parsed, left = false) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ ...p, raw: buf, left });
    };
    const timer = setTimeout(() => finish(parseReply(buf, opts.isHead, true)!), 20_000);
    // Leaves before any answer, once `leaveWhen` says so (polled).
    const leaveWhen = opts.leaveWhen;
    if (leaveWhen) {
      const poll = setInterval(() => {
        if (done) clearInterval(poll);
        else if (leaveWhen()) {
          clearInterval(poll);
          finish(parseReply(buf, opts.isHead, true)!, true);
        }
      }, 10);
    }
    const check = (closed: boolean) => {
      const p = parseReply(buf, opts.isHead, closed);
      if (!p) return;
      if (p.partial) {
        if (opts.leave && p.body.length > 0) finish(p, true);
        return;
      }
      finish(p);
    };
    socket.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      check(false);
    });
    socket.on("close", () => check(true));
    socket.on("error", () => check(true));
    socket.write(Buffer.from(head, "utf8"));
    if (body?.chunks) {
      let at = 0;
      for (const size of body.chunks) {
        const piece = body.bytes.subarray(at, at + size);
        at += size;
        if (piece.length === 0) continue;
        socket.write(`${piece.length.toString(16)}\r\n`);
        socket.write(piece);
        socket.write("\r\n");
      }
      socket.write("0\r\n\r\n");
    } else if (body) socket.write(body.bytes);
  });
}

// ---------------------------------------------------------------------------------------------
// The echo target: records what it got, answers as planned.

interface Seen {
  method: string;
  path: string;
  /** With its "?", as received ("" when none). */
  search: string;
  headers: [string, string][];
  body: Uint8Array;
  aborted: boolean;
}

type Answer = { status: number; headers: [string, string][]; body: Uint8Array<ArrayBuffer>; pieces?: number[]; delayMs: number };
type Plan =
  | ({ kind: "answer" } & Answer)
  /** Never answers (a timeout). */
  | { kind: "hang" }
  /** Headers and the first piece, then nothing (a timeout mid-answer). */
  | ({ kind: "stall" } & Answer)
  /** Headers and the first piece, then the connection breaks. */
  | ({ kind: "break" } & Answer)
  /** Closes the connection before any answer. */
  | { kind: "slam" }
  /** Headers and the first piece, then waits: the client leaves. */
  | ({ kind: "leave" } & Answer)
  /** Never answers; the client leaves first. */
  | { kind: "leave-early" };

const seen: Seen[] = [];
let plan: Plan | undefined;

function startTarget() {
  return Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    idleTimeout: 30,
    async fetch(req) {
      const url = new URL(req.url);
      const s: Seen = { method: req.method, path: url.pathname, search: url.search, headers: [...req.headers], body: new Uint8Array(await req.arrayBuffer()), aborted: false };
      const aborted = new Promise<void>((r) => {
        if (req.signal.aborted) r();
        req.signal.addEventListener("abort", () => r());
      }).then(() => {
        s.aborted = true;
      });
      seen.push(s);
      const p = plan ?? { kind: "answer", status: 200, headers: [["content-type", "text/plain"]], body: new TextEncoder().encode("unplanned"), delayMs: 0 };
      // A closed connection stays closed for the step: Bun's fetch asks once more (GET, PUT, DELETE).
      if (p.kind !== "slam") plan = undefined;
      const headersOf = (a: Answer) => {
        const h = new Headers();
        for (const [n, v] of a.headers) h.append(n, v);
        return h;
      };
      const waitAbort = () => Promise.race([aborted, Bun.sleep(8000)]);
      switch (p.kind) {
        case "hang":
        case "leave-early":
          await waitAbort();
          return new Response("too late");
        case "slam":
          return new Response(
            new ReadableStream({
              start(c) {
                // No reason: Bun cuts the connection without printing one.
                c.error();
              },
            }),
          );
        case "answer": {
          if (p.status === 204 || p.status === 304) return new Response(null, { status: p.status, headers: headersOf(p) });
          if (!p.pieces) return new Response(p.body, { status: p.status, headers: headersOf(p) });
          const parts = split(p.body, p.pieces);
          let i = 0;
          return new Response(
            new ReadableStream({
              async pull(c) {
                if (i >= parts.length) return c.close();
                if (p.delayMs) await Bun.sleep(p.delayMs);
                c.enqueue(parts[i++]!);
              },
            }),
            { status: p.status, headers: headersOf(p) },
          );
        }
        default: {
          // stall, break, leave: the first piece, then trouble.
          let sent = false;
          return new Response(
            new ReadableStream({
              async pull(c) {
                if (!sent) {
                  sent = true;
                  c.enqueue(p.body);
                  return;
                }
                if (p.kind === "break") {
                  await Bun.sleep(30);
                  c.error();
                  return;
                }
                await waitAbort();
                c.close();
              },
            }),
            { status: p.status, headers: headersOf(p) },
          );
        }
      }
    },
  });
}

function split(bytes: Uint8Array, pieces: number[]): Uint8Array[] {
  const out: Uint8Array[] = [];
  let at = 0;
  for (const n of pieces) {
    out.push(bytes.subarray(at, at + n));
    at += n;
  }
  if (at < bytes.length) out.push(bytes.subarray(at));
  return out.filter((p) => p.length > 0);
}

// ---------------------------------------------------------------------------------------------
// The world: endpoints and callers.

interface Endpoint {
  id?: string;
  /** As written in the config. */
  path: string;
  /** The path as requests name it (URL form, without trailing slashes): what matching compares. */
  key: string;
  /** As the spend log names it: the configured path without its trailing slash. */
  logName: string;
  target: string;
  targetPath: string;
  /** The target URL's own query, without "?" ("" when none). */
  ownQuery: string;
  dead: boolean;
  includeSubpath: boolean;
  forwardHeaders: boolean;
  auth: boolean;
  methods: string[];
  methodsWritten: boolean;
  /** Configured headers as written, and resolved (names lowercased). */
  headers: Record<string, string>;
  resolved: Map<string, string>;
  costUsd: string;
  costPico: bigint;
  timeout?: number;
}

interface Caller {
  label: string;
  key?: string;
  /** sha256 of the key, for the spend log. */
  hash?: string;
  /** A key the gateway knows. */
  known: boolean;
  allowedRoutes: string[];
  /** The key's own allowed_passthrough_routes, else its team's. */
  passthroughRoutes: string[];
  rpm?: number;
  budgetPico?: bigint;
  virtual: boolean;
}

const EVERY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"];
const PATH_POOL = ["/pt-alpha", "/pt-beta/v1", "/v1/pt-rerank", "/pt-alpha/deep", "/pt-gamma", "/pt-ünï", "/pt-delta/", "/pt-eps"];
const TARGET_PREFIXES = ["", "/", "/base", "/base/v2/", "/ü-base/x", "/echo/~user"];
const COSTS = ["0", "0", "0.25", "0.05", "0.0001", "0.3333", "1.5"];

/** USD decimal text → pico-dollars, exactly. */
function pico(usd: string): bigint {
  const [whole, frac = ""] = usd.split(".");
  return BigInt(whole!) * 1_000_000_000_000n + BigInt(`${frac}000000000000`.slice(0, 12));
}
function picoText(p: bigint): string {
  const s = p.toString().padStart(13, "0");
  return `${s.slice(0, -12)}.${s.slice(-12)}`;
}

/** The path part of a request target as an HTTP server reads it (dot segments resolved, `\` as `/`, non-ASCII percent-encoded). */
function urlPath(raw: string): string {
  return new URL(raw, "http://h").pathname;
}

function drawEndpoints(rng: Random, port: number, deadPort: number, secrets: { env: Record<string, string>; static: string[]; query: string }): Endpoint[] {
  const paths = rng.some(PATH_POOL, 6);
  while (paths.length < 4) {
    const p = rng.pick(PATH_POOL);
    if (!paths.includes(p)) paths.push(p);
  }
  const out: Endpoint[] = [];
  const headerChoices: [string, string][] = [
    ["Authorization", "Bearer os.environ/PT_DIFF_SECRET_A"],
    ["x-api-key", "os.environ/PT_DIFF_SECRET_B"],
    ["X-Static-Token", secrets.static[0]!],
    ["x-combo", "a=os.environ/PT_DIFF_SECRET_A;b=os.environ/PT_DIFF_SECRET_B"],
    ["x-override", secrets.static[1]!],
    ["Accept", "application/x-configured"],
  ];
  const make = (path: string, methods: string[] | undefined, i: number): Endpoint => {
    const dead = i === 0 ? false : rng.chance(0.12);
    const prefix = rng.pick(TARGET_PREFIXES);
    const ownQuery = rng.pick(["", "", `api_key=${secrets.query}`, `tier=a%20b&api_key=${secrets.query}`, "flag", "v=1&v=2"]);
    const target = `http://127.0.0.1:${dead ? deadPort : port}${prefix}${ownQuery ? `?${ownQuery}` : ""}`;
    const headers: Record<string, string> = {};
    for (const [n, v] of rng.some(headerChoices, 3)) if (rng.chance(0.7)) headers[n] = v;
    const resolved = new Map<string, string>();
    for (const [n, v] of Object.entries(headers)) resolved.set(n.toLowerCase(), v.replace(/os\.environ\/([A-Z_]+)/g, (_, name: string) => secrets.env[name]!));
    const costUsd = rng.pick(COSTS);
    return {
      path,
      key: urlPath(path).replace(/\/+$/, "") || "/",
      logName: path.replace(/\/+$/, "") || "/",
      target,
      targetPath: new URL(target).pathname,
      ownQuery,
      dead,
      includeSubpath: rng.chance(0.6),
      forwardHeaders: rng.chance(0.55),
      auth: !rng.chance(0.25),
      methods: methods ?? EVERY_METHOD,
      methodsWritten: methods !== undefined,
      headers,
      resolved,
      costUsd,
      costPico: pico(costUsd),
      timeout: rng.chance(0.5) ? rng.pick([0.6, 0.8]) : undefined,
    };
  };
  for (const [i, path] of paths.entries()) {
    const listed = rng.chance(0.4) ? rng.some(EVERY_METHOD, 3) : undefined;
    const e = make(path, listed, i);
    out.push(e);
    // Sometimes a second endpoint on the same path, for the methods the first does not serve.
    if (listed && rng.chance(0.4)) {
      const others = EVERY_METHOD.filter((m) => !listed.includes(m));
      const second = make(path, rng.some(others, others.length), i + 1);
      second.includeSubpath = e.includeSubpath;
      e.id = `${path}#a`;
      second.id = `${path}#b`;
      out.push(second);
    }
  }
  // Every kind at least once: a public endpoint, one with subpaths, a timeout, both header modes.
  const live = out.filter((e) => !e.dead);
  if (!out.some((e) => !e.auth)) rng.pick(live).auth = false;
  if (!out.some((e) => e.includeSubpath)) for (const e of out.filter((x) => x.path === out[0]!.path)) e.includeSubpath = true;
  if (!live.some((e) => e.timeout !== undefined)) rng.pick(live).timeout = 0.8;
  if (!out.some((e) => e.forwardHeaders)) rng.pick(out).forwardHeaders = true;
  if (!out.some((e) => !e.forwardHeaders)) rng.pick(out).forwardHeaders = false;
  return out;
}

function endpointConfig(e: Endpoint): Record<string, unknown> {
  const c: Record<string, unknown> = { path: e.path, target: e.target };
  if (e.id) c.id = e.id;
  if (Object.keys(e.headers).length > 0) c.headers = e.headers;
  if (e.methodsWritten) c.methods = e.methods;
  if (e.includeSubpath) c.include_subpath = true;
  if (e.forwardHeaders) c.forward_headers = true;
  if (!e.auth) c.auth = false;
  if (e.costUsd !== "0") c.cost_per_request = Number(e.costUsd);
  if (e.timeout !== undefined) c.timeout = e.timeout;
  return c;
}

// ---------------------------------------------------------------------------------------------
// The model.

const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"]);
/** Headers the gateway's own fetch may add when the request does not set them. */
const FETCH_ADDS = new Set(["host", "connection", "user-agent", "accept", "content-length", "transfer-encoding"]);

/** The query the target gets: its own parameters as written, then the client's, except those naming a parameter the target sets. */
function expectedQuery(ownQuery: string, clientSearch: string): string {
  const parts = (s: string) => s.split("&").filter((p) => p !== "");
  const keyOf = (part: string) => [...new URLSearchParams(part).keys()][0] ?? "";
  const own = parts(ownQuery);
  const ownKeys = new Set(own.map(keyOf));
  const client = parts(clientSearch.replace(/^\?/, "")).filter((p) => !ownKeys.has(keyOf(p)));
  const all = [...own, ...client];
  return all.length > 0 ? `?${all.join("&")}` : "";
}

/** Whether a route pattern (exact, or `prefix/*`) names `path`. */
function routeAllows(pattern: string, path: string): boolean {
  if (pattern.endsWith("/*")) {
    const prefix = pattern.slice(0, -2);
    return path === prefix || path.startsWith(`${prefix}/`);
  }
  return path === pattern;
}

type Matched = { endpoint: Endpoint; subpath: string } | { allowed: string[] } | undefined;

/** The endpoint a normalized path and method reach: an exact path first, else the longest include_subpath prefix. */
function route(endpoints: Endpoint[], path: string, method: string): Matched {
  const stripped = path.replace(/\/+$/, "") || "/";
  const pick = (list: Endpoint[], subpath: string): Matched => {
    const e = list.find((x) => x.methods.includes(method));
    return e ? { endpoint: e, subpath } : { allowed: [...new Set(list.flatMap((x) => x.methods))] };
  };
  const exact = endpoints.filter((e) => e.key === stripped);
  if (exact.length > 0) return pick(exact, "");
  const prefixed = endpoints.filter((e) => e.includeSubpath && stripped.startsWith(`${e.key}/`));
  if (prefixed.length === 0) return undefined;
  const longest = Math.max(...prefixed.map((e) => e.key.length));
  const list = prefixed.filter((e) => e.key.length === longest);
  // The rest of the path as it was, trailing slash included.
  return pick(list, path.slice(longest));
}

/** The credential the gateway reads: x-svc-api-key (bare or Bearer), else Authorization: Bearer. */
function credentialOf(headers: [string, string][]): string | undefined {
  const get = (n: string) => headers.filter((h) => h[0].toLowerCase() === n).map((h) => h[1]);
  const svc = get("x-svc-api-key")[0];
  if (svc) return svc.replace(/^bearer /i, "").trim();
  const auth = get("authorization")[0];
  if (auth && /^bearer /i.test(auth)) return auth.slice(7).trim() || undefined;
  return undefined;
}

/** Headers by lowercased name, repeated ones joined as HTTP joins them. */
function grouped(headers: [string, string][]): Map<string, string> {
  const m = new Map<string, string>();
  for (const [n, v] of headers) {
    const name = n.toLowerCase();
    const prev = m.get(name);
    m.set(name, prev === undefined ? v : `${prev}${name === "cookie" ? "; " : ", "}${v}`);
  }
  return m;
}

/** Names a Connection header lists (hop-by-hop for this connection only). */
function connectionListed(headers: Map<string, string>): Set<string> {
  return new Set(
    (headers.get("connection") ?? "")
      .split(",")
      .map((t) => t.trim().toLowerCase())
      .filter(Boolean),
  );
}

// ---------------------------------------------------------------------------------------------
// Random requests.

interface ClientRequest {
  method: string;
  rawPath: string;
  /** Without "?"; undefined: no "?" at all. */
  rawQuery?: string;
  headers: [string, string][];
  body?: { bytes: Uint8Array; chunks?: number[] };
  caller: Caller;
  placement: string;
}

function randomBytes(rng: Random, n: number): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(n);
  let x = (rng.int(0x7fffffff) | 1) >>> 0;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 0xff;
  }
  return out;
}

function randomSize(rng: Random): number {
  const r = rng.next();
  if (r < 0.12) return 0;
  if (r < 0.6) return 1 + rng.int(200);
  if (r < 0.97) return 200 + rng.int(64 * 1024);
  return 256 * 1024 + rng.int(1024 * 1024);
}

const SEGMENTS = ["x", "v1", "items", "%20", "caf%C3%A9", "日本", "😀", "%41", "%25", "a;b", "~u", "!$&'()*+,;=", "@:", "..", "%2e%2e", ".", "%2E", "", "q%3Fx", "%23frag"];
const RARE_SEGMENTS = ["%2F", "%2f", "%5C", "%5c", "a%2Fb", "..%2f..", "\\", "x\\y"];
const TOKEN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.";
/** Host headers that are no valid host (RFC 9112 §3.2: a 400). An empty one means the gateway's own name (§3.3). */
const BAD_HOSTS = ["evil/../x", "evil?x=1", "u@evil", "evil#x", "a b"];

function word(rng: Random, n = 6): string {
  return Array.from({ length: 1 + rng.int(n) }, () => TOKEN[rng.int(TOKEN.length)]).join("");
}

function headerValue(rng: Random): string {
  const chars = `${TOKEN} ;=,/:"()[]{}?@!#$%&'*+~^|`;
  const v = Array.from({ length: 1 + rng.int(24) }, () => chars[rng.int(chars.length)]).join("");
  return v.trim() || "v";
}

// ---------------------------------------------------------------------------------------------

interface RowExpectation {
  step: string;
  callId: string;
  model: string;
  status: "success" | "failure" | "cancelled";
  spendPico: bigint;
  apiKey: string;
}

let target: ReturnType<typeof startTarget>;
let gw: SpawnedGateway | undefined;
let db: Awaited<ReturnType<typeof freshDatabase>> | undefined;

beforeAll(() => {
  target = startTarget();
});
afterAll(async () => {
  if (gw?.proc.exitCode === null) await gw.stop();
  await db?.drop();
  target?.stop(true);
});

describe(`pass-through endpoints against a model (${SEED_NOTE})`, () => {
  test(
    `${REQUESTS} random requests`,
    async () => {
      const started = Date.now();
      const rng = new Random(SEED);
      const tag = `${SEED}-${rng.int(1e9).toString(36)}`;
      const secrets = {
        env: { PT_DIFF_SECRET_A: `ptdiff-secret-a-${tag}`, PT_DIFF_SECRET_B: `ptdiff-secret-b-${tag}` },
        static: [`ptdiff-static-${tag}`, `ptdiff-override-${tag}`],
        query: `ptdiff-query-${tag}`,
      };
      for (const [k, v] of Object.entries(secrets.env)) process.env[k] = v;
      // A port nothing listens on.
      const closed = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("") });
      const deadPort = closed.port as number;
      closed.stop(true);

      const endpoints = drawEndpoints(rng, target.port as number, deadPort, secrets);
      const world = endpoints.map((e) => ({ ...endpointConfig(e) }));
      const where = (step: number | string, extra = "") => `${SEED_NOTE} step ${step}${extra ? `: ${extra}` : ""}\n  endpoints: ${JSON.stringify(world)}`;
      // A gateway process of its own (everything it prints is read: Bun's own error output included) on a fresh PostgreSQL database.
      db = await freshDatabase("gw_pt_diff");
      const g = await spawnGateway({ model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" } }], general_settings: { master_key: MASTER_KEY, pass_through_endpoints: world } }, { env: { DATABASE_URL: db.url, ...secrets.env } });
      gw = g;
      const gwPort = Number(new URL(g.url).port);

      // Callers.
      const asciiEndpoints = endpoints.filter((e) => /^[\x21-\x7e]+$/.test(e.key));
      const pattern = () => {
        const e = rng.pick(asciiEndpoints);
        return rng.pick([e.key, `${e.key}/*`, "/pt-nowhere/*"]);
      };
      const keyOf = async (label: string, body: Record<string, unknown>, c: Partial<Caller>): Promise<Caller> => {
        const r = await requestOk<{ key: string }>(g, "POST", "/key/generate", { key_alias: `${label}-${tag}`, ...body });
        return { label, key: r.key, hash: sha256(r.key), known: true, allowedRoutes: [], passthroughRoutes: [], virtual: true, ...c };
      };
      const budgetUsd = rng.pick(["0.3", "0.75", "1.5"]);
      const ownRoutes = [pattern(), ...(rng.chance(0.5) ? [pattern()] : [])];
      const teamRoutes = [pattern(), pattern()];
      const team = await requestOk<{ team_id: string }>(g, "POST", "/team/new", { team_alias: `pt-diff-${tag}`, allowed_passthrough_routes: teamRoutes });
      const teamOwn = rng.chance(0.4) ? [pattern()] : [];
      const routesOnly = [pattern()];
      const callers: Caller[] = [
        { label: "master", key: MASTER_KEY, hash: sha256(MASTER_KEY), known: true, allowedRoutes: [], passthroughRoutes: [], virtual: false },
        await keyOf("plain", {}, {}),
        await keyOf("budget", { max_budget: Number(budgetUsd) }, { budgetPico: pico(budgetUsd) }),
        await keyOf("rpm", { rpm_limit: 4 }, { rpm: 4 }),
        await keyOf("own-routes", { allowed_passthrough_routes: ownRoutes }, { passthroughRoutes: ownRoutes }),
        await keyOf("team", { team_id: team.team_id, ...(teamOwn.length > 0 ? { allowed_passthrough_routes: teamOwn } : {}) }, { passthroughRoutes: teamOwn.length > 0 ? teamOwn : teamRoutes }),
        await keyOf("allowed-routes", { allowed_routes: routesOnly, allowed_passthrough_routes: [pattern()] }, { allowedRoutes: routesOnly }),
        { label: "unknown", key: `sk-ptdiff-unknown-${tag}`, known: false, allowedRoutes: [], passthroughRoutes: [], virtual: false },
        { label: "none", known: false, allowedRoutes: [], passthroughRoutes: [], virtual: false },
      ];
      const gatewayKeys = callers.filter((c) => c.known).map((c) => c.key!);
      const allSecrets = [...Object.values(secrets.env), ...secrets.static, secrets.query, ...gatewayKeys];
      const spent = new Map<string, bigint>(callers.map((c) => [c.label, 0n]));
      const admitted = new Map<string, number[]>();
      const rowsExpected: RowExpectation[] = [];
      /** Rows of calls whose id the client never saw: matched by what they hold. */
      const unnamedRows: RowExpectation[] = [];
      const callIds = new Set<string>();
      const stats: Record<string, number> = {};
      const count = (k: string) => {
        stats[k] = (stats[k] ?? 0) + 1;
      };

      const drawRequest = (): ClientRequest | undefined => {
        let method = rng.pick(["GET", "GET", "GET", "POST", "POST", "POST", "PUT", "PATCH", "DELETE", "DELETE", "HEAD", "OPTIONS"]);
        // The path: an endpoint's (in another spelling now and then), maybe more below it; or nothing configured.
        let rawPath: string;
        if (rng.chance(0.94)) {
          const e = rng.pick(endpoints);
          if (rng.chance(0.75)) method = rng.pick(e.methods);
          rawPath = rng.chance(0.5) ? e.path : e.key;
          if (rng.chance(0.1)) rawPath += "/";
        } else rawPath = rng.pick(["/zz-none", "/pt-nothing", "/pt-alphabet", "/v1/pt-rerankx", "/pt-gamma2"]);
        const below = endpoints.some((e) => e.includeSubpath && (rawPath === e.path || rawPath === e.key || rawPath === `${e.key}/`));
        if (rng.chance(below ? 0.75 : 0.15)) {
          const n = 1 + rng.int(3);
          for (let i = 0; i < n; i++) rawPath += `/${rng.chance(0.06) ? rng.pick(RARE_SEGMENTS) : rng.chance(0.3) ? word(rng) : rng.pick(SEGMENTS)}`;
          if (rng.chance(0.15)) rawPath += "/";
        }
        // Paths that leave the world under test (a built-in route) are not sent.
        const norm = urlPath(rawPath);
        if (!/^\/(pt-|zz-|v1\/pt-)/.test(norm)) return undefined;
        let rawQuery: string | undefined;
        if (rng.chance(0.55)) {
          const choices = ["k=v", "q=a%20b", "q=a+b", "f", "e=", "api_key=evil", "tier=x", "v=9", "ap%69_key=evil2", "u=%C3%BC", "ü=ö", "x=~!*'()", "arr[]=1", "arr[]=2", "s=a/b?c", `k=${word(rng)}`, "", "%zz=1"];
          rawQuery = Array.from({ length: rng.int(5) }, () => rng.pick(choices)).join("&");
        }
        // Mostly callers that get through; each of the others now and then.
        const caller = rng.pick([...callers, callers[0]!, callers[0]!, callers[1]!, callers[1]!, callers[2]!]);
        const headers: [string, string][] = [["Host", rng.chance(0.03) ? rng.pick(BAD_HOSTS) : rng.pick(["gateway.example", `127.0.0.1:${gwPort}`, "evil.example:8443", "llm", ""])]];
        let placement = "none";
        if (caller.key) {
          placement = rng.pick(["auth", "auth-lower", "svc", "svc-bearer", "both", "svc+own", "svc+master"]);
          const k = caller.key;
          if (placement === "auth") headers.push(["Authorization", `Bearer ${k}`]);
          else if (placement === "auth-lower") headers.push(["authorization", `bearer ${k}`]);
          else if (placement === "svc") headers.push(["x-svc-api-key", k]);
          else if (placement === "svc-bearer") headers.push(["X-SVC-API-KEY", `Bearer ${k}`]);
          else if (placement === "both") headers.push(["x-svc-api-key", k], ["Authorization", `Bearer ${k}`]);
          else if (placement === "svc+own") headers.push(["x-svc-api-key", k], ["Authorization", "Bearer the-clients-own-upstream-token"]);
          else headers.push(["x-svc-api-key", k], ["Authorization", `Bearer ${MASTER_KEY}`]);
        } else if (rng.chance(0.3)) headers.push(["Authorization", "Bearer the-clients-own-upstream-token"]);
        const extras: (() => [string, string][])[] = [
          () => [[`X-Client-${word(rng, 4)}`, headerValue(rng)]],
          () => [
            ["x-dup", "one"],
            ["x-dup", "two"],
          ],
          () => [["Content-Type", rng.pick(["application/json", "application/octet-stream", "text/plain; charset=utf-8", "multipart/form-data; boundary=xyz"])]],
          () => [["Accept", rng.pick(["application/json", "*/*", "text/event-stream", "image/png, */*;q=0.5"])]],
          () => [["Accept-Encoding", rng.pick(["gzip", "identity", "br, gzip"])]],
          () => [["Cookie", `session=${word(rng)}; theme=dark`]],
          () => [["User-Agent", "ptdiff-client/1.0"]],
          () => [["x-svc-trace", word(rng)]],
          () => [["X-SVC-Custom", headerValue(rng)]],
          () => {
            const hop = `X-Hop-${word(rng, 3)}`;
            return [
              ["Connection", `keep-alive, ${hop}`],
              [hop, "hop-value"],
            ];
          },
          () => [["Keep-Alive", "timeout=5"]],
          () => [["Upgrade", "h2c"]],
          () => [["TE", "trailers"]],
          () => [["Trailer", "x-later"]],
          () => [["Proxy-Authorization", "Basic cHJveHk6cGFzcw=="]],
          () => [["x-override", "from-the-client"]],
          () => [["X-Forwarded-For", "203.0.113.7"]],
        ];
        for (let i = rng.int(6); i > 0; i--) headers.push(...rng.pick(extras)());
        // Not two Connection headers: one with keep-alive or the hop names, else "close".
        if (!headers.some((h) => h[0] === "Connection")) headers.push(["Connection", "close"]);
        let body: ClientRequest["body"];
        const bodyAllowed = method !== "HEAD" && method !== "OPTIONS" && (method !== "GET" || rng.chance(0.1));
        if (bodyAllowed && rng.chance(0.8)) {
          const bytes = randomBytes(rng, randomSize(rng));
          if (rng.chance(0.25)) {
            const chunks: number[] = [];
            for (let left = bytes.length; left > 0; ) {
              const n = Math.min(left, 1 + rng.int(Math.max(1, Math.floor(bytes.length / 2))));
              chunks.push(n);
              left -= n;
            }
            body = { bytes, chunks };
            headers.push(["Transfer-Encoding", "chunked"]);
          } else {
            body = { bytes };
            headers.push(["Content-Length", String(bytes.length)]);
          }
        }
        return { method, rawPath, rawQuery, headers, body, caller, placement };
      };

      const drawAnswer = (): Answer => {
        const status = rng.pick([200, 200, 200, 201, 202, 204, 206, 299, 301, 302, 303, 304, 307, 308, 400, 401, 403, 404, 409, 418, 422, 429, 500, 502, 503, 504]);
        const headers: [string, string][] = [["content-type", rng.pick(["application/json", "application/octet-stream", "text/plain; charset=utf-8", "text/event-stream", "image/png"])]];
        for (let i = rng.int(4); i > 0; i--) headers.push([`x-t-${word(rng, 4).toLowerCase()}`, headerValue(rng)]);
        for (let i = rng.chance(0.4) ? 1 + rng.int(3) : 0; i > 0; i--) headers.push(["set-cookie", `c${i}=${word(rng)}; Path=/; Expires=Wed, 21 Oct 2026 07:28:00 GMT; HttpOnly`]);
        if (status >= 300 && status < 400) headers.push(["location", rng.pick(["/elsewhere", "https://example.com/x?y=1"])]);
        if (rng.chance(0.15)) headers.push(["retry-after", "7"]);
        if (rng.chance(0.1)) headers.push(["x-svc-call-id", "the-targets-own-id"]);
        if (rng.chance(0.1)) headers.push(["keep-alive", "timeout=9"]);
        if (rng.chance(0.1)) headers.push(["connection", "x-t-hop"], ["x-t-hop", "hop"]);
        if (rng.chance(0.1)) headers.push(["x-multi", "a"], ["x-multi", "b"]);
        const noBody = status === 204 || status === 304;
        let body = noBody ? new Uint8Array() : randomBytes(rng, randomSize(rng));
        if (!noBody && body.length > 0 && rng.chance(0.2)) {
          const enc = rng.pick(["gzip", "br", "deflate", "x-custom", "gzip, br"]);
          headers.push(["content-encoding", enc]);
          if (enc === "gzip") body = zlib.gzipSync(body);
          else if (enc === "br") body = zlib.brotliCompressSync(body);
          else if (enc === "deflate") body = zlib.deflateSync(body);
          else if (enc === "gzip, br") body = zlib.brotliCompressSync(zlib.gzipSync(body));
        }
        const pieces = !noBody && rng.chance(0.35) ? Array.from({ length: 1 + rng.int(5) }, () => 1 + rng.int(Math.max(1, body.length))) : undefined;
        return { status, headers, body: new Uint8Array(body), pieces, delayMs: pieces ? rng.int(15) : 0 };
      };

      for (let step = 0; step < REQUESTS; step++) {
        const req = drawRequest();
        if (!req) {
          step--;
          continue;
        }
        const { method, caller } = req;
        const norm = urlPath(req.rawPath);
        const search = req.rawQuery === undefined ? "" : new URL(`http://h/?${req.rawQuery}`).search;
        const requestLine = `${method} ${req.rawPath}${req.rawQuery === undefined ? "" : `?${req.rawQuery}`}`;
        const label = where(step, `${caller.label} (${req.placement}) ${requestLine} headers ${JSON.stringify(req.headers)} body ${req.body ? `${req.body.bytes.length} bytes${req.body.chunks ? " chunked" : ""}` : "none"}`);
        const isHead = method === "HEAD";

        // --- What the gateway must do before any call: refusals.
        type Refusal = { status: number; type?: string; allow?: string[] };
        let refusal: Refusal | undefined;
        let match: Matched;
        if (BAD_HOSTS.includes(req.headers[0]![1]) || /%2f|%5c/i.test(norm)) refusal = { status: 400, type: "invalid_request_error" };
        else {
          match = route(endpoints, norm, method);
          if (!match) refusal = { status: 404, type: "not_found_error" };
          else if ("allowed" in match) refusal = { status: 405, type: "invalid_request_error", allow: match.allowed };
        }
        const endpoint = match && "endpoint" in match ? match.endpoint : undefined;
        const subpath = match && "endpoint" in match ? match.subpath : "";
        // The route a key's lists are held to: the endpoint's path, and what follows it.
        const routePath = endpoint ? endpoint.key + subpath : norm;
        const credential = credentialOf(req.headers);
        const knownCredential = credential !== undefined && gatewayKeys.includes(credential);
        let principal: Caller | undefined;
        if (!refusal && endpoint?.auth) {
          principal = callers.find((c) => c.key !== undefined && c.key === credential);
          if (!knownCredential || !principal) refusal = { status: 401, type: "authentication_error" };
          else if (principal.allowedRoutes.length > 0) {
            if (!principal.allowedRoutes.some((p) => routeAllows(p, routePath))) refusal = { status: 403, type: "permission_error" };
          } else if (principal.passthroughRoutes.length > 0 && !principal.passthroughRoutes.some((p) => routeAllows(p, routePath))) refusal = { status: 403, type: "permission_error" };
        }
        const t0 = Date.now();
        let limited: "rpm" | "budget" | undefined;
        let rpmEither = false;
        if (!refusal && principal?.rpm !== undefined) {
          const times = admitted.get(principal.label) ?? [];
          const surely = times.filter((t) => t > t0 - 59_000).length;
          const maybe = times.filter((t) => t > t0 - 61_000).length;
          if (surely >= principal.rpm) limited = "rpm";
          else if (maybe >= principal.rpm) rpmEither = true;
        }
        if (!refusal && !limited && principal?.budgetPico !== undefined && endpoint) {
          const s = spent.get(principal.label)!;
          if (s >= principal.budgetPico || s + endpoint.costPico > principal.budgetPico) limited = "budget";
        }

        // --- What the target does, when it is asked.
        const reaches = !refusal && !limited && endpoint !== undefined && !endpoint.dead;
        let p: Plan | undefined;
        if (reaches) {
          const r = rng.next();
          const timed = endpoint!.timeout !== undefined;
          if (timed && r < 0.04) p = { kind: "hang" };
          else if (timed && r < 0.08) p = { kind: "stall", ...drawAnswer() };
          else if (r < 0.11) p = { kind: "break", ...drawAnswer() };
          else if (r < 0.14) p = { kind: "slam" };
          else if (r < 0.18) p = { kind: "leave", ...drawAnswer() };
          else if (r < 0.2) p = { kind: "leave-early" };
          else p = { kind: "answer", ...drawAnswer() };
          if (p.kind === "stall" || p.kind === "break" || p.kind === "leave") {
            // Trouble after a first piece: an answer with a body.
            if (p.status === 204 || p.status === 304) p.status = 200;
            if (p.body.length === 0) p.body = randomBytes(rng, 1 + rng.int(500));
            p.headers = p.headers.filter((h) => h[0] !== "content-encoding");
          }
        }
        count(refusal ? `refused ${refusal.status}` : limited ? `limited ${limited}` : endpoint?.dead ? "dead target" : p!.kind);
        plan = p;
        const before = seen.length;
        const head = `${requestLine} HTTP/1.1\r\n${req.headers.map(([n, v]) => `${n}: ${v}\r\n`).join("")}\r\n`;
        const reply = await send(gwPort, head, req.body, { isHead, leave: p?.kind === "leave", leaveWhen: p?.kind === "leave-early" ? () => seen.length > before : undefined });
        plan = undefined;
        const replyText = reply.raw.toString("latin1");
        const headersOf = grouped(reply.headers);
        const bodyText = () => new TextDecoder().decode(reply.body);
        const where2 = `${label}\n  answer: ${reply.status} ${JSON.stringify(reply.headers)} ${bodyText().slice(0, 300)}`;

        for (const s of allSecrets) expect(replyText.includes(s), `${where2}\n  the answer shows a secret (${s.slice(0, 12)}…)`).toBe(false);

        const errorOf = (): { type?: string; message?: string } => {
          try {
            return (JSON.parse(bodyText()) as { error: { type?: string; message?: string } }).error;
          } catch {
            return {};
          }
        };

        if (refusal) {
          expect(reply.status, where2).toBe(refusal.status);
          expect(seen.length - before, `${where2}\n  a refused request reached the target`).toBe(0);
          if (refusal.allow) expect(new Set((headersOf.get("allow") ?? "").split(",").map((m) => m.trim())), where2).toEqual(new Set(refusal.allow));
          if (!isHead) expect(errorOf().type, where2).toBe(refusal.type);
          continue;
        }
        const e = endpoint!;
        if (p?.kind === "leave-early") {
          // The client left before any answer: the target's request is aborted, the call logged as cancelled (its id never reached the client).
          expect(reply.status, `${where2}\n  an answer came before the client left`).toBe(0);
          const got = seen[before];
          expect(got !== undefined && (await until(async () => got.aborted, 3000)), `${where2}\n  the client left, but the target's request was not aborted`).toBe(true);
          if (principal?.rpm !== undefined) admitted.set(principal.label, [...(admitted.get(principal.label) ?? []), t0]);
          unnamedRows.push({ step: label, callId: "", model: e.logName, status: "cancelled", spendPico: 0n, apiKey: e.auth ? principal!.hash! : "" });
          continue;
        }
        const callId = headersOf.get("x-svc-call-id");
        expect(callId ?? "(none)", `${where2}\n  every call answers with its x-svc-call-id`).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
        expect(callIds.has(callId!), `${where2}\n  a call id used twice`).toBe(false);
        callIds.add(callId!);
        const apiKey = e.auth ? principal!.hash! : "";
        const row = (status: RowExpectation["status"], charged: boolean) => {
          const cost = charged ? e.costPico : 0n;
          if (e.auth && cost > 0n) spent.set(principal!.label, spent.get(principal!.label)! + cost);
          rowsExpected.push({ step: label, callId: callId!, model: e.logName, status, spendPico: cost, apiKey });
        };
        if (rpmEither) {
          // At the window's edge: the gateway's answer tells which.
          if (reply.status === 429 && seen.length === before) limited = "rpm";
        }
        if (limited) {
          expect(reply.status, where2).toBe(limited === "rpm" ? 429 : 400);
          expect(errorOf().type, where2).toBe(limited === "rpm" ? "rate_limit_error" : "budget_exceeded");
          if (limited === "rpm") expect(Number(headersOf.get("retry-after")), where2).toBeGreaterThan(0);
          expect(seen.length - before, `${where2}\n  a refused call reached the target`).toBe(0);
          row("failure", false);
          continue;
        }
        if (principal?.rpm !== undefined) admitted.set(principal.label, [...(admitted.get(principal.label) ?? []), t0]);

        if (e.dead || p!.kind === "slam") {
          expect(reply.status, where2).toBe(503);
          const err = errorOf();
          expect(err.type, where2).toBe("api_connection_error");
          const origin = new URL(e.target).origin;
          expect(err.message, `${where2}\n  a 503 names the target's origin`).toContain(origin);
          if (e.targetPath.length > 1) expect(err.message!.includes(`${origin}${e.targetPath}`), `${where2}\n  a 503 names only the origin`).toBe(false);
          // Bun's fetch asks once more when the connection closes before an answer to GET, PUT or DELETE.
          const asked = seen.length - before;
          if (e.dead) expect(asked, where2).toBe(0);
          else expect(asked === 1 || (asked === 2 && ["GET", "PUT", "DELETE"].includes(method)), `${where2}\n  the target was asked ${asked} times`).toBe(true);
          row("failure", false);
          continue;
        }

        // --- The target got exactly one request, the one the model says.
        expect(seen.length - before, `${where2}\n  the target was asked ${seen.length - before} times`).toBe(1);
        const got = seen[seen.length - 1]!;
        const gotHeaders = grouped(got.headers);
        const sent = grouped(req.headers);
        // Bun's fetch sends a path that starts with "//" with one slash (a limit of Bun's, README).
        const expectedPath = (subpath === "" ? e.targetPath : e.targetPath.replace(/\/+$/, "") + subpath).replace(/^\/+/, "/");
        const upstream = `\n  the target got: ${got.method} ${got.path}${got.search} ${JSON.stringify(got.headers)} body ${got.body.length} bytes`;
        expect(got.method, where2 + upstream).toBe(method);
        expect(got.path, `${where2}${upstream}\n  path`).toBe(expectedPath);
        expect(got.search, `${where2}${upstream}\n  query`).toBe(expectedQuery(e.ownQuery, search));
        // Headers: the configured ones; the client's (all but the gateway's own and hop-by-hop ones, with forward_headers; else what the body is and what it accepts).
        const want = new Map<string, string>();
        if (e.forwardHeaders) {
          const listed = connectionListed(sent);
          for (const [name, value] of sent) {
            if (HOP_BY_HOP.has(name) || listed.has(name) || name === "host" || name === "content-length" || name.startsWith("x-svc-")) continue;
            if (name === "authorization" && /^bearer /i.test(value) && gatewayKeys.includes(value.slice(7).trim())) continue;
            want.set(name, value);
          }
        } else {
          for (const name of ["content-type", "accept"]) if (sent.has(name)) want.set(name, sent.get(name)!);
          want.set("accept-encoding", "identity");
        }
        for (const [name, value] of e.resolved) want.set(name, value);
        for (const [name, value] of want) expect(gotHeaders.get(name), `${where2}${upstream}\n  header ${name}`).toBe(value);
        for (const [name, value] of gotHeaders) {
          if (want.has(name)) continue;
          expect(FETCH_ADDS.has(name), `${where2}${upstream}\n  the target got a header it should not: ${name}: ${value}`).toBe(true);
          if (name === "user-agent") expect(value, `${where2}${upstream}\n  user-agent`).toStartWith("Bun/");
          if (name === "accept") expect(value, `${where2}${upstream}\n  accept`).toBe("*/*");
          if (name === "host") expect(value, `${where2}${upstream}\n  host`).toBe(new URL(e.target).host);
        }
        for (const k of gatewayKeys) expect(JSON.stringify(got.headers).includes(k), `${where2}${upstream}\n  a gateway key reached the target`).toBe(false);
        // The body: as sent (a GET's is dropped), with its length when the client gave one, else streamed.
        const wantBody = method === "GET" || !req.body ? new Uint8Array() : req.body.bytes;
        expect(Buffer.from(got.body).equals(Buffer.from(wantBody)), `${where2}${upstream}\n  body: ${got.body.length} bytes, expected ${wantBody.length}`).toBe(true);
        if (method !== "GET" && req.body && !req.body.chunks) {
          expect(gotHeaders.get("content-length"), `${where2}${upstream}\n  content-length`).toBe(String(req.body.bytes.length));
          expect(gotHeaders.get("transfer-encoding"), `${where2}${upstream}\n  transfer-encoding`).toBeUndefined();
        } else if (method !== "GET" && req.body?.chunks) {
          // Streamed; Bun's fetch gives a stream it already holds whole its length.
          const framing = gotHeaders.get("transfer-encoding") ?? `content-length: ${gotHeaders.get("content-length")}`;
          expect(["chunked", `content-length: ${req.body.bytes.length}`], `${where2}${upstream}\n  framing of a streamed body`).toContain(framing);
        } else expect(gotHeaders.get("content-length") ?? "0", `${where2}${upstream}\n  content-length without a body`).toBe("0");

        if (p!.kind === "hang") {
          expect(reply.status, where2).toBe(408);
          const err = errorOf();
          expect(err.type, where2).toBe("timeout_error");
          expect(err.message, where2).toContain(new URL(e.target).origin);
          if (e.targetPath.length > 1) expect(err.message!.includes(e.targetPath), `${where2}\n  a 408 names only the origin`).toBe(false);
          row("failure", false);
          continue;
        }

        // --- What the client got: the target's status, headers and bytes.
        const a = p as Extract<Plan, { status: number }>;
        expect(reply.status, where2).toBe(a.status);
        const targetHeaders = grouped(a.headers);
        const listed = connectionListed(targetHeaders);
        const expectHeaders = new Map<string, string>();
        for (const [name, value] of targetHeaders) {
          if (HOP_BY_HOP.has(name) || listed.has(name) || name === "content-length" || name === "x-svc-call-id") continue;
          expectHeaders.set(name, value);
        }
        const cookies = reply.headers.filter((h) => h[0] === "set-cookie").map((h) => h[1]);
        expect(cookies, `${where2}\n  set-cookie, one header each`).toEqual(a.headers.filter((h) => h[0] === "set-cookie").map((h) => h[1]));
        expect(reply.headers.filter((h) => h[0] === "x-svc-call-id").length, `${where2}\n  one x-svc-call-id`).toBe(1);
        const actual = new Map<string, string>();
        for (const [name, value] of headersOf) {
          if (name === "date" || name === "content-length" || name === "transfer-encoding" || name === "x-svc-call-id" || name === "set-cookie" || name.startsWith("x-ratelimit-")) continue;
          if (name === "connection" && /^(close|keep-alive)$/i.test(value)) continue;
          actual.set(name, value);
        }
        expectHeaders.delete("set-cookie");
        expect(Object.fromEntries(actual), `${where2}\n  headers`).toEqual(Object.fromEntries(expectHeaders));
        if (e.auth && principal?.rpm !== undefined) {
          const used = (admitted.get(principal.label) ?? []).filter((t) => t > t0 - 59_000).length;
          expect(headersOf.get("x-ratelimit-limit-requests"), where2).toBe(String(principal.rpm));
          if (!rpmEither) expect(headersOf.get("x-ratelimit-remaining-requests"), where2).toBe(String(principal.rpm - used));
        }
        const charged = a.status >= 200 && a.status < 300;
        if (p!.kind === "answer") {
          expect(reply.complete, `${where2}\n  the answer ended early`).toBe(true);
          expect(Buffer.from(reply.body).equals(Buffer.from(a.body)), `${where2}\n  body: ${reply.body.length} bytes, expected ${a.body.length}`).toBe(true);
          row(a.status < 400 ? "success" : "failure", charged);
        } else if (p!.kind === "leave") {
          expect(reply.left, where2).toBe(true);
          const gone = await until(async () => got.aborted, 3000);
          expect(gone, `${where2}\n  the client left, but the target's request was not aborted`).toBe(true);
          row("cancelled", charged);
        } else {
          // stall or break: the first piece, then the answer is cut (never ended as if whole).
          expect(reply.complete, `${where2}\n  a broken answer must not end cleanly`).toBe(false);
          expect(Buffer.from(reply.body).equals(Buffer.from(a.body)), `${where2}\n  the first piece: ${reply.body.length} bytes, expected ${a.body.length}`).toBe(true);
          row("failure", charged);
        }
      }

      // --- Each key's spend; then, the gateway stopped (SIGTERM writes what is pending), the spend log: one row per call, as the model says.
      for (const c of callers.filter((x) => x.virtual)) {
        // Written by the spend writer, a second or so after the calls.
        let stored = Number.NaN;
        const equal = await until(async () => {
          stored = (await requestJson<{ info: { spend: number } }>(g, "GET", `/key/info?key=${c.key}`)).body.info.spend;
          return Math.abs(stored - Number(spent.get(c.label)!) / 1e12) < 1e-9;
        }, 5000);
        expect(equal, where("key spend", `${c.label}: ${stored}, model ${picoText(spent.get(c.label)!)}`)).toBe(true);
      }
      expect(await g.stop(), where("stop", g.output().slice(-2000))).toBe(0);
      const store = postgres(db.url, { max: 1, onnotice: () => {} });
      type Row = { call_id: string; model: string; status: string; spend: string; api_key: string; metadata: string };
      const logged = await store<Row[]>`select call_id, model, status, spend::text as spend, api_key, metadata::text as metadata from spend_logs where call_type = 'pass_through'`;
      await store.end();
      expect(logged.length, where("spend log", "rows, as many as calls")).toBe(rowsExpected.length + unnamedRows.length);
      const byId = new Map(logged.map((r) => [r.call_id, r]));
      for (const x of rowsExpected) {
        const r = byId.get(x.callId);
        expect(r, `${x.step}\n  no spend-log row`).toBeDefined();
        expect({ model: r!.model, status: r!.status, spend: r!.spend, api_key: r!.api_key }, `${x.step}\n  spend-log row`).toEqual({ model: x.model, status: x.status, spend: picoText(x.spendPico), api_key: x.apiKey });
        for (const s of allSecrets) expect(r!.metadata.includes(s), `${x.step}\n  the spend-log row shows a secret`).toBe(false);
      }
      const shape = (x: { model: string; status: string; spend: string; api_key: string }) => JSON.stringify([x.model, x.status, x.spend, x.api_key]);
      const named = new Set(rowsExpected.map((x) => x.callId));
      const others = logged.filter((r) => !named.has(r.call_id)).map(shape).sort();
      expect(others, where("spend log", "the rows of calls the client left before any answer")).toEqual(unnamedRows.map((x) => shape({ model: x.model, status: x.status, spend: picoText(x.spendPico), api_key: x.apiKey })).sort());
      // Everything the gateway printed: its log lines, and what Bun itself prints.
      const output = g.output();
      for (const s of allSecrets) {
        const at = output.indexOf(s);
        expect(at, where("output", `the gateway printed a secret (${s.slice(0, 12)}…): ${output.slice(Math.max(0, at - 600), at + 100)}`)).toBe(-1);
      }
      if (process.env.PASSTHROUGH_DIFF_STATS) console.log(SEED_NOTE, JSON.stringify({ ...stats, rows: rowsExpected.length, seconds: (Date.now() - started) / 1000 }));
    },
    120_000,
  );
});
