// The gateway as a process: run interface (flags, env), embedded store and its lockfile,
// PostgreSQL with concurrent starts, Redis up and down, no master key, SIGTERM drain.
// Every gateway here is a real `bun core/main.ts` child; PostgreSQL and Redis are the local
// servers (TEST_DATABASE_URL picks the PostgreSQL server, default postgres://postgres@127.0.0.1:5432).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { networkInterfaces } from "node:os";
import { join } from "node:path";
import type { Server, Subprocess } from "bun";
import OpenAI from "openai";
import postgres from "postgres";
import { migrations } from "../core/store/migrations/index.ts";
import { type ConfigInput, configText, MASTER_KEY, ROOT, type SpawnedGateway, spawnGateway, tempDir } from "./harness/gateway.ts";
import { accepts } from "./harness/util.ts";
import { TEST_REDIS_URL } from "./harness/redis.ts";

// A PGlite first boot runs initdb: a few seconds, much more on a loaded machine.
const SLOW = 90_000;

/** Variables from the outer environment that would change what a test means. */
const CLEAN_ENV = { DATABASE_URL: undefined, REDIS_URL: undefined, PORT: undefined, HOST: undefined, SVC_DRAIN_TIMEOUT: undefined };

const MOCK_CONFIG = {
  model_list: [{ model_name: "chat-mock", svc_params: { model: "mock/chat" } }],
};

// ---------------------------------------------------------------------------------------------
// Bookkeeping: everything created here is removed in afterAll, even when a test fails midway.

const children: Subprocess[] = [];
const dirs: string[] = [];
const servers: Server<unknown>[] = [];

function newDir(): string {
  const dir = tempDir("gw-proc-");
  dirs.push(dir);
  return dir;
}

/** spawnGateway in a tracked temp dir with a clean environment. */
async function gateway(
  config: ConfigInput,
  opts: { env?: Record<string, string | undefined>; args?: string[]; waitForListen?: boolean; dir?: string; freshStore?: boolean } = {},
): Promise<SpawnedGateway> {
  const dir = opts.dir ?? newDir();
  const gw = await spawnGateway(config, { ...opts, dir, env: { ...CLEAN_ENV, ...opts.env } });
  children.push(gw.proc);
  return gw;
}

interface Launched {
  proc: Subprocess;
  output(): string;
  exited: Promise<number>;
  /** Resolves with the first match of `re` in the output; rejects on exit or timeout. */
  waitFor(re: RegExp, ms?: number): Promise<RegExpExecArray>;
}

/** `bun core/main.ts ...args` with exactly these arguments (spawnGateway always adds --port 0). */
function launch(args: string[], opts: { cwd: string; env?: Record<string, string | undefined> }): Launched {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries({ ...process.env, SVC_MASTER_KEY: MASTER_KEY, ...CLEAN_ENV, ...opts.env })) if (v !== undefined) env[k] = v;
  const proc = Bun.spawn([process.execPath, join(ROOT, "core/main.ts"), ...args], { cwd: opts.cwd, env, stdout: "pipe", stderr: "pipe" });
  children.push(proc);
  let out = "";
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder();
    for await (const chunk of stream) out += decoder.decode(chunk, { stream: true });
  };
  const pumped = Promise.all([pump(proc.stdout as ReadableStream<Uint8Array>), pump(proc.stderr as ReadableStream<Uint8Array>)]);
  // Exit only counts once the pipes are drained, so output() is complete when it resolves.
  const exited = proc.exited.then(async (code) => {
    await pumped;
    return code;
  });
  let done = false;
  void exited.then(() => {
    done = true;
  });
  return {
    proc,
    output: () => out,
    exited,
    async waitFor(re, ms = 60_000) {
      const deadline = Date.now() + ms;
      for (;;) {
        const m = re.exec(out);
        if (m) return m;
        if (done) throw new Error(`process exited before printing ${re}:\n${out}`);
        if (Date.now() > deadline) throw new Error(`no ${re} within ${ms} ms:\n${out}`);
        await Bun.sleep(20);
      }
    },
  };
}

/** A port nothing listens on: bound by a throwaway listener, then released. */
function freePort(): number {
  const listener = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = listener.port;
  listener.stop(true);
  return port;
}


/**
 * The harness's `exited` can resolve before the last output is read from the pipes:
 * waits (briefly) until `text` shows up, then returns the whole output.
 */
async function outputWith(gw: SpawnedGateway, text: string, ms = 3_000): Promise<string> {
  const deadline = Date.now() + ms;
  while (!gw.output().includes(text) && Date.now() < deadline) await Bun.sleep(10);
  return gw.output();
}

interface Readiness {
  status: string;
  db: string;
  db_detail: string;
  cache: string | null;
  redis: string;
}

/** As the master key sees it: the database's version is shown to admins only. */
async function readiness(gw: { url: string }): Promise<{ status: number; body: Readiness }> {
  const res = await fetch(`${gw.url}/health/readiness`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
  return { status: res.status, body: (await res.json()) as Readiness };
}

function client(gw: { baseURL: string }, apiKey = MASTER_KEY): OpenAI {
  return new OpenAI({ baseURL: gw.baseURL, apiKey, maxRetries: 0 });
}

async function mockChat(gw: { baseURL: string }): Promise<string | null | undefined> {
  const r = await client(gw).chat.completions.create({ model: "chat-mock", messages: [{ role: "user", content: "ping" }] });
  return r.choices[0]?.message.content;
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL: fresh databases per run, dropped in afterAll.

const pgServer = new URL(process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres");
const createdDbs: string[] = [];
let admin: ReturnType<typeof postgres> | undefined;

function pgUrl(db: string): string {
  const u = new URL(pgServer);
  u.pathname = `/${db}`;
  return u.toString();
}

async function freshDatabase(): Promise<string> {
  admin ??= postgres(pgUrl(pgServer.pathname.slice(1) || "postgres"), { max: 1, onnotice: () => {} });
  const name = `gw_proc_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
  await admin.unsafe(`create database "${name}"`);
  createdDbs.push(name);
  return pgUrl(name);
}

/** The gateway's migration records in one database. */
async function appliedMigrations(url: string): Promise<string[]> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    const rows = await sql<{ hash: string }[]>`select hash from drizzle.__gateway_migrations order by id`;
    return rows.map((r) => r.hash);
  } finally {
    await sql.end();
  }
}

// Gateways whose store does not matter use one shared database (fast: no initdb per start).
let sharedDbUrl: string;

beforeAll(async () => {
  sharedDbUrl = await freshDatabase();
});

afterAll(async () => {
  for (const p of children) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
  await Promise.allSettled(children.map((p) => p.exited));
  for (const s of servers) s.stop(true);
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  if (admin) {
    for (const name of createdDbs) await admin.unsafe(`drop database if exists "${name}" with (force)`).catch(() => {});
    await admin.end();
  }
});

// ---------------------------------------------------------------------------------------------

describe("run interface", () => {
  test("--port 0 and --host 127.0.0.1 are honoured, and --port wins over PORT", async () => {
    const unusedPort = freePort();
    const gw = await gateway(MOCK_CONFIG, { env: { DATABASE_URL: sharedDbUrl, PORT: String(unusedPort) } });
    const m = /^http:\/\/127\.0\.0\.1:(\d+)$/.exec(gw.url);
    expect(m).not.toBeNull();
    const port = Number(m![1]);
    expect(port).toBeGreaterThan(0);
    expect(port).not.toBe(unusedPort);
    expect(await (await fetch(`${gw.url}/health/liveliness`)).text()).toContain("alive");
    expect(await gw.stop()).toBe(0);
  });

  test("PORT is the listen port when there is no --port; HOST the address when there is no --host", async () => {
    const dir = newDir();
    writeFileSync(join(dir, "config.yaml"), configText(MOCK_CONFIG));
    const port = freePort();
    const run = launch([], { cwd: dir, env: { PORT: String(port), HOST: "127.0.0.1", DATABASE_URL: sharedDbUrl } });
    const [, url] = await run.waitFor(/listening on (http:\/\/\S+?)"/);
    expect(url).toBe(`http://127.0.0.1:${port}`);
    expect(await mockChat({ baseURL: `${url}/v1` })).toBe("This is a mock response to: ping");
    run.proc.kill("SIGTERM");
    expect(await run.exited).toBe(0);
  }, SLOW);

  test("--config picks the config file; without it ./config.yaml is used", async () => {
    const dir = newDir();
    mkdirSync(join(dir, "elsewhere"));
    const model = (name: string) => ({ model_list: [{ model_name: name, svc_params: { model: `mock/${name}` } }] });
    writeFileSync(join(dir, "config.yaml"), configText(model("from-default-path")));
    writeFileSync(join(dir, "elsewhere", "gw.yaml"), configText(model("from-config-flag")));
    const env = { DATABASE_URL: sharedDbUrl };
    const models = async (run: Launched) => {
      const [, url] = await run.waitFor(/listening on (http:\/\/\S+?)"/);
      const list = await client({ baseURL: `${url}/v1` }).models.list();
      run.proc.kill("SIGTERM");
      expect(await run.exited).toBe(0);
      return list.data.map((m) => m.id);
    };
    expect(await models(launch(["--config", "elsewhere/gw.yaml", "--port", "0", "--host", "127.0.0.1"], { cwd: dir, env }))).toEqual([
      "from-config-flag",
    ]);
    expect(await models(launch(["--port", "0", "--host", "127.0.0.1"], { cwd: dir, env }))).toEqual(["from-default-path"]);
  }, SLOW);

  test("--help prints the usage and exits 0 without touching anything", async () => {
    const dir = newDir();
    const run = launch(["--help"], { cwd: dir });
    expect(await run.exited).toBe(0);
    expect(run.output()).toContain("usage: gateway");
    for (const flag of ["--config", "--port", "--host", "--data-dir", "DATABASE_URL", "SVC_MASTER_KEY"]) expect(run.output()).toContain(flag);
    expect(existsSync(join(dir, ".data"))).toBe(false);
  });

  test("bad flags and values exit non-zero with a one-line reason and the usage, no stack trace", async () => {
    const dir = newDir();
    const cases: [string[], Record<string, string>, RegExp][] = [
      [["--port", "abc"], {}, /invalid port "abc"/],
      [["--port", "70000"], {}, /invalid port "70000"/],
      [["--port", ""], {}, /invalid port ""/],
      [["--port", "1e3"], {}, /invalid port "1e3"/],
      [[], { PORT: "abc" }, /invalid port "abc"/],
      [[], { SVC_DRAIN_TIMEOUT: "5s" }, /invalid SVC_DRAIN_TIMEOUT "5s": expected a number of seconds/],
      [[], { SVC_DRAIN_TIMEOUT: "abc" }, /invalid SVC_DRAIN_TIMEOUT "abc"/],
      [[], { SVC_DRAIN_TIMEOUT: "-1" }, /invalid SVC_DRAIN_TIMEOUT "-1"/],
      [[], { SVC_DRAIN_TIMEOUT: "1e3" }, /invalid SVC_DRAIN_TIMEOUT "1e3"/],
      [["--bogus"], {}, /Unknown option '--bogus'/],
      [["--port"], {}, /argument missing/],
    ];
    for (const [args, env, reason] of cases) {
      const run = launch(args, { cwd: dir, env });
      const code = await run.exited;
      const out = run.output();
      expect({ args, code }).toEqual({ args, code: 1 });
      expect(out).toMatch(reason);
      expect(out).toContain("usage: gateway");
      expect(out).not.toMatch(/^\s+at /m);
    }
    expect(existsSync(join(dir, ".data"))).toBe(false);
  });

  test("the reason it does not start is redacted like every log line: a plugin's error quoting its key", async () => {
    const dir = newDir();
    const secret = "sk-pluginsecretAAAA11112222";
    writeFileSync(
      join(dir, "thrower.ts"),
      `import { definePlugin } from "${join(ROOT, "core/contract.ts")}";\nimport { Type } from "@sinclair/typebox";\nexport default definePlugin({ name: "thrower", config: Type.Object({ token: Type.String() }), setup(config) { throw new Error("setup failed with token " + config.token); } });\n`,
    );
    writeFileSync(join(dir, "config.yaml"), `model_list: []\nplugins:\n  - path: ./thrower.ts\n    config: { token: ${secret} }\n`);
    const run = launch([], { cwd: dir, env: { SVC_MASTER_KEY: MASTER_KEY } });
    expect(await run.exited).toBe(1);
    const out = run.output();
    expect(out).toContain("setup failed with token sk-plug");
    expect(out).not.toContain(secret);
  });
});

describe("embedded store (default)", () => {
  test(
    "PGlite is the store, the data dir is locked while running, a second gateway on it refuses, SIGTERM releases it",
    async () => {
      const dir = newDir();
      const dataDir = join(dir, "data");
      const lock = join(dataDir, "gateway.lock");
      // An empty folder, as a new user's: the first boot creates the store.
      const gw = await gateway(MOCK_CONFIG, { dir, freshStore: true });

      const ready = await readiness(gw);
      expect(ready.status).toBe(200);
      expect(ready.body).toMatchObject({ status: "healthy", db: "connected", redis: "not configured", cache: null });
      expect(ready.body.db_detail).toMatch(/^PostgreSQL \d+.*\(PGlite \d+\.\d+\.\d+\)/);
      expect(readFileSync(lock, "utf8").trim().split(" ")[0]).toBe(String(gw.proc.pid));
      expect(await mockChat(gw)).toBe("This is a mock response to: ping");

      const second = await gateway(MOCK_CONFIG, { args: ["--data-dir", dataDir], waitForListen: false });
      expect(await second.exited).toBe(1);
      const inUse = `data folder ${dataDir} is in use by process ${gw.proc.pid}`;
      expect(await outputWith(second, inUse)).toContain(inUse);
      expect(second.output()).not.toMatch(/^\s+at /m);
      // The refused one did not disturb the running one or its lock.
      expect(readFileSync(lock, "utf8").trim().split(" ")[0]).toBe(String(gw.proc.pid));
      expect((await readiness(gw)).status).toBe(200);

      gw.proc.kill("SIGTERM");
      expect(await gw.exited).toBe(0);
      expect(await outputWith(gw, '"msg":"stopped"')).toContain('"msg":"stopped"');
      expect(existsSync(lock)).toBe(false);
      expect(existsSync(join(dataDir, "pg"))).toBe(true);
    },
    SLOW,
  );

  test(
    "after a crash (SIGKILL) the stale lock is taken over and the data is still there",
    async () => {
      const dir = newDir();
      const dataDir = join(dir, "data");
      const first = await gateway(MOCK_CONFIG, { dir });
      first.proc.kill("SIGKILL");
      await first.exited;
      expect(readFileSync(join(dataDir, "gateway.lock"), "utf8").trim().split(" ")[0]).toBe(String(first.proc.pid));

      const second = await gateway(MOCK_CONFIG, { dir });
      const ready = await readiness(second);
      expect(ready.status).toBe(200);
      expect(ready.body.db).toBe("connected");
      expect(readFileSync(join(dataDir, "gateway.lock"), "utf8").trim().split(" ")[0]).toBe(String(second.proc.pid));
      expect(await second.stop()).toBe(0);
    },
    SLOW,
  );
});

describe("a port already in use", () => {
  test(
    "exits 1 with a one-line reason, no stack trace, and leaves the data folder unlocked",
    async () => {
      const taken = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("someone else") });
      servers.push(taken);
      const dir = newDir();
      const gw = await gateway(MOCK_CONFIG, { dir, args: ["--port", String(taken.port)], waitForListen: false });
      expect(await gw.exited).toBe(1);
      const out = gw.output();
      expect(out).toContain(`gateway: cannot listen on 127.0.0.1:${taken.port}: the port is in use (EADDRINUSE)`);
      expect(out).not.toMatch(/^\s+at /m);
      expect(out).not.toContain("listening on");
      expect(existsSync(join(dir, "data", "gateway.lock"))).toBe(false);
    },
    SLOW,
  );
});

describe("an address that cannot be listened on", () => {
  test(
    "exits 1 saying why: not an address of this machine, or a name that does not resolve",
    async () => {
      const own = new Set(Object.values(networkInterfaces()).flatMap((list) => (list ?? []).map((i) => i.address)));
      const foreign = ["192.0.2.1", "198.51.100.1", "203.0.113.1"].find((a) => !own.has(a))!;
      const cases: [string, string][] = [
        [foreign, `address not available (${foreign} is not an address of this machine)`],
        ["nothost.invalid", "host not found (nothost.invalid does not resolve)"],
        ["999.1.1.1", "host not found (999.1.1.1 does not resolve)"],
      ];
      await Promise.all(
        cases.map(async ([host, reason]) => {
          const gw = await gateway(MOCK_CONFIG, { env: { DATABASE_URL: sharedDbUrl }, args: ["--host", host], waitForListen: false });
          const code = await gw.exited;
          const line = (await outputWith(gw, "cannot listen")).split("\n").find((l) => l.includes("cannot listen"));
          expect({ host, code, line }).toEqual({ host, code: 1, line: `gateway: cannot listen on ${host}:0: ${reason}` });
        }),
      );
    },
    SLOW,
  );
});

describe("the example config.yaml", () => {
  test(
    "serves a chat and an embedding through the SDK on the embedded store, as the README's first command runs it",
    async () => {
      const gw = await gateway(readFileSync(join(ROOT, "config.yaml"), "utf8"), { env: { OPENAI_API_KEY: undefined }, freshStore: true });
      const sdk = client(gw);
      const chat = await sdk.chat.completions.create({ model: "gpt-4o-mini", messages: [{ role: "user", content: "hi" }] });
      expect(chat.choices[0]?.message.content).toContain("hi");
      expect(chat.usage?.total_tokens).toBeGreaterThan(0);
      const emb = await sdk.embeddings.create({ model: "text-embedding-3-small", input: "hi", encoding_format: "float" });
      expect(emb.data[0]?.embedding.length).toBeGreaterThan(0);
      expect((await sdk.models.list()).data.map((m) => m.id)).toEqual(expect.arrayContaining(["gpt-4o-mini", "text-embedding-3-small"]));
    },
    SLOW,
  );
});

describe("PostgreSQL (DATABASE_URL)", () => {
  let serverVersion: string;
  beforeAll(async () => {
    const sql = postgres(sharedDbUrl, { max: 1 });
    serverVersion = (await sql<{ version: string }[]>`select version()`)[0]!.version;
    await sql.end();
  });

  test(
    "readiness reports the server's version, migrations ran, no embedded store is created",
    async () => {
      const url = await freshDatabase();
      const gw = await gateway(MOCK_CONFIG, { env: { DATABASE_URL: url } });
      const ready = await readiness(gw);
      expect(ready.status).toBe(200);
      expect(ready.body.db).toBe("connected");
      expect(ready.body.db_detail).toBe(serverVersion);
      expect(ready.body.db_detail).toMatch(/^PostgreSQL \d+/);
      expect(ready.body.db_detail).not.toContain("PGlite");
      expect(await appliedMigrations(url)).toEqual(migrations.map((m) => m.hash));
      expect(existsSync(join(gw.dir, "data"))).toBe(false);
      expect(gw.output()).toContain(`store: PostgreSQL at ${new URL(url).host}${new URL(url).pathname}`);
      expect(await mockChat(gw)).toBe("This is a mock response to: ping");
      expect(await gw.stop()).toBe(0);
    },
    SLOW,
  );

  test(
    "DATABASE_URL and REDIS_URL given in config.yaml's environment_variables choose the store and Redis, as the environment's own would",
    async () => {
      const url = await freshDatabase();
      const gw = await gateway({ ...MOCK_CONFIG, environment_variables: { DATABASE_URL: url, REDIS_URL: TEST_REDIS_URL } });
      const ready = await readiness(gw);
      expect(ready.status).toBe(200);
      expect(ready.body).toMatchObject({ db: "connected", db_detail: serverVersion, redis: "connected" });
      expect(ready.body.db_detail).not.toContain("PGlite");
      expect(await appliedMigrations(url)).toEqual(migrations.map((m) => m.hash));
      expect(gw.output()).toContain(`store: PostgreSQL at ${new URL(url).host}${new URL(url).pathname}`);
      expect(await gw.stop()).toBe(0);
    },
    SLOW,
  );

  test(
    "two gateways started at once on one fresh database both start and migrate it once",
    async () => {
      const url = await freshDatabase();
      const [a, b] = await Promise.all([gateway(MOCK_CONFIG, { env: { DATABASE_URL: url } }), gateway(MOCK_CONFIG, { env: { DATABASE_URL: url } })]);
      for (const gw of [a, b]) {
        const ready = await readiness(gw);
        expect(ready.status).toBe(200);
        expect(ready.body.db_detail).toBe(serverVersion);
        expect(await mockChat(gw)).toBe("This is a mock response to: ping");
      }
      expect(await appliedMigrations(url)).toEqual(migrations.map((m) => m.hash));
      expect(await Promise.all([a.stop(), b.stop()])).toEqual([0, 0]);
    },
    SLOW,
  );
});

describe("Redis (REDIS_URL)", () => {
  test("a reachable Redis is reported connected", async () => {
    const gw = await gateway(MOCK_CONFIG, { env: { DATABASE_URL: sharedDbUrl, REDIS_URL: TEST_REDIS_URL } });
    const ready = await readiness(gw);
    expect(ready.body).toMatchObject({ status: "healthy", db: "connected", cache: "redis", redis: "connected" });
    expect(ready.status).toBe(200);
    expect(await gw.stop()).toBe(0);
  });

  test("an unreachable Redis does not stop the gateway: chat works, readiness is 503 with redis disconnected", async () => {
    const gw = await gateway(MOCK_CONFIG, { env: { DATABASE_URL: sharedDbUrl, REDIS_URL: `redis://127.0.0.1:${freePort()}` } });
    expect(await mockChat(gw)).toBe("This is a mock response to: ping");
    const ready = await readiness(gw);
    expect(ready.status).toBe(503);
    expect(ready.body).toMatchObject({ status: "unhealthy", db: "connected", cache: "redis", redis: "disconnected" });
    expect((await fetch(`${gw.url}/health/liveliness`)).status).toBe(200);
    expect(gw.proc.exitCode).toBeNull();
    expect(gw.output()).toContain("redis unreachable");
    expect(await gw.stop()).toBe(0);
  });
});

describe("upstream calls at once", () => {
  test("below 1024 (Bun's default is 256), the start warns how to raise it; with npm start's 4096 it does not", async () => {
    const few = await gateway(MOCK_CONFIG, { env: { DATABASE_URL: sharedDbUrl, BUN_CONFIG_MAX_HTTP_REQUESTS: undefined } });
    expect(few.output()).toContain("at most 256 upstream calls can be under way at once");
    expect(await few.stop()).toBe(0);
    const many = await gateway(MOCK_CONFIG, { env: { DATABASE_URL: sharedDbUrl, BUN_CONFIG_MAX_HTTP_REQUESTS: "4096" } });
    expect(many.output()).not.toContain("upstream calls can be under way");
    expect(await many.stop()).toBe(0);
  });
});

describe("no master key", () => {
  test("a loud warning at start; management and model calls are refused with 401 saying how to set one", async () => {
    // The example config.yaml's master_key, with the variable empty (Docker Compose's SVC_MASTER_KEY=${SVC_MASTER_KEY}): unset, not a key.
    const config = { ...MOCK_CONFIG, general_settings: { master_key: "os.environ/SVC_MASTER_KEY" } };
    const gw = await gateway(config, { env: { DATABASE_URL: sharedDbUrl, SVC_MASTER_KEY: "" } });
    expect(gw.output()).toContain("NO MASTER KEY IS SET");
    expect(gw.output()).toContain("/general_settings/master_key: environment variable SVC_MASTER_KEY is empty");
    expect(gw.output()).toContain("SVC_MASTER_KEY=");

    const expectRefusal = async (res: Response) => {
      expect(res.status).toBe(401);
      const body = (await res.json()) as { error: Record<string, unknown> };
      expect(Object.keys(body)).toEqual(["error"]);
      expect(body.error).toEqual({ message: expect.stringContaining("SVC_MASTER_KEY"), type: "authentication_error", param: null, code: "401" });
      expect(body.error.message).toContain("general_settings.master_key");
    };
    const auth = { authorization: `Bearer ${MASTER_KEY}` };
    await expectRefusal(await fetch(`${gw.url}/health`, { headers: auth }));
    await expectRefusal(
      await fetch(`${gw.baseURL}/chat/completions`, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify({ model: "chat-mock", messages: [{ role: "user", content: "hi" }] }),
      }),
    );
    // Through the SDK: an AuthenticationError carrying the same message.
    const err = await mockChat(gw).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).status).toBe(401);
    expect((err as Error).message).toContain("SVC_MASTER_KEY");
    // Public probes still answer.
    expect((await fetch(`${gw.url}/health/liveliness`)).status).toBe(200);
    expect(await gw.stop()).toBe(0);
  });
});

describe("SIGTERM", () => {
  /** An OpenAI-shaped upstream that answers each chat completion after `delayMs`. */
  function slowUpstream(delayMs: number) {
    let arrived = 0;
    const server = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      idleTimeout: 60,
      async fetch(req) {
        if (!new URL(req.url).pathname.endsWith("/chat/completions")) return new Response("not found", { status: 404 });
        arrived++;
        await Bun.sleep(delayMs);
        return Response.json({
          id: "chatcmpl-slow",
          object: "chat.completion",
          created: Math.floor(Date.now() / 1000),
          model: "slow",
          choices: [{ index: 0, message: { role: "assistant", content: "finally" }, logprobs: null, finish_reason: "stop" }],
          usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
        });
      },
    });
    servers.push(server);
    const config = {
      model_list: [{ model_name: "slow", svc_params: { model: "openai/slow", api_base: `http://127.0.0.1:${server.port}/v1`, api_key: "sk-upstream" } }],
    };
    return {
      config,
      async untilArrived() {
        const deadline = Date.now() + 10_000;
        while (arrived === 0) {
          if (Date.now() > deadline) throw new Error("the request never reached the upstream");
          await Bun.sleep(10);
        }
      },
    };
  }

  // A drain timeout past what one timer holds (~24.8 days) is no timeout at all, not an instant one.
  test.each([
    ["", {}],
    [" (SVC_DRAIN_TIMEOUT of 35 days)", { SVC_DRAIN_TIMEOUT: String(35 * 86_400) }],
  ])(
    "drains%s: the in-flight request completes with 200, new connections are refused, exit 0 after 'stopped'",
    async (_label, env) => {
      const upstream = slowUpstream(1500);
      const gw = await gateway(upstream.config, { env });
      const port = Number(new URL(gw.url).port);
      const inFlight = client(gw)
        .chat.completions.create({ model: "slow", messages: [{ role: "user", content: "take your time" }] })
        .withResponse();
      await upstream.untilArrived();

      gw.proc.kill("SIGTERM");
      const deadline = Date.now() + 5_000;
      while (!gw.output().includes("draining in-flight requests") && Date.now() < deadline) await Bun.sleep(10);
      expect(gw.output()).toContain("draining in-flight requests");
      expect(gw.proc.exitCode).toBeNull();
      expect(await accepts(port)).toBe(false);

      const { data, response } = await inFlight;
      expect(response.status).toBe(200);
      expect(data.choices[0]?.message.content).toBe("finally");
      expect(await gw.exited).toBe(0);
      expect(await outputWith(gw, '"msg":"stopped"')).toContain('"msg":"stopped"');
      expect(gw.output()).not.toContain("drain timeout reached");
    },
    SLOW,
  );

  test(
    "SVC_DRAIN_TIMEOUT bounds the drain: a hung upstream does not keep the process alive",
    async () => {
      const upstream = slowUpstream(10_000);
      const gw = await gateway(upstream.config, { env: { SVC_DRAIN_TIMEOUT: "1" } });
      const inFlight = fetch(`${gw.baseURL}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "slow", messages: [{ role: "user", content: "hang" }] }),
      }).then(
        (r) => r.status,
        () => "connection closed",
      );
      await upstream.untilArrived();

      const started = performance.now();
      gw.proc.kill("SIGTERM");
      const code = await gw.exited;
      const elapsed = performance.now() - started;
      expect(code).toBe(0);
      expect(elapsed).toBeGreaterThanOrEqual(900);
      expect(elapsed).toBeLessThan(3_000);
      expect(await outputWith(gw, '"msg":"stopped"')).toContain('"msg":"stopped"');
      expect(gw.output()).toContain("drain timeout reached");
      expect(await inFlight).not.toBe(200);
    },
    SLOW,
  );
});
