/**
 * Hot reload as an operator sees it: edits to config.yaml (in place or by atomic rename) change
 * what the gateway serves without a restart, a stream in flight finishes on the config it started
 * on, a bad file is rejected while the old config keeps serving, and SIGHUP forces a reload.
 */
import { afterAll, afterEach, describe, expect, setDefaultTimeout, test } from "bun:test";
import { renameSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import OpenAI from "openai";
import { slowEvents } from "./fixtures/plugins/slow-provider.ts";
import { configText, freshDatabase, MASTER_KEY, type SpawnedGateway, spawnGateway, startTestGateway, type TestGateway } from "./harness/gateway.ts";
import { waitFor } from "./harness/util.ts";

// Watch-driven tests poll for up to a few seconds each; bun's 5 s default is too tight under load.
setDefaultTimeout(20_000);

const SLOW_PLUGIN = resolve(import.meta.dir, "fixtures/plugins/slow-provider.ts");
const SLOW_SETUP_PLUGIN = resolve(import.meta.dir, "fixtures/plugins/slow-setup.ts");

const running: { stop(): Promise<unknown> }[] = [];
afterEach(async () => {
  await Promise.allSettled(running.splice(0).map((g) => g.stop()));
});

async function gateway(config: Record<string, unknown>, opts: { watch?: boolean } = {}): Promise<{ gw: TestGateway; client: OpenAI }> {
  const gw = await startTestGateway(config, opts);
  running.push(gw);
  // The watcher attaches asynchronously; an operator never edits within milliseconds of start.
  if (opts.watch) await Bun.sleep(150);
  return { gw, client: new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 }) };
}

async function modelIds(client: OpenAI): Promise<string[]> {
  const page = await client.models.list();
  return page.data.map((m) => m.id).sort();
}

const mockModel = (name: string, reply = `reply from ${name}`) => ({ model_name: name, svc_params: { model: `mock/${name}`, mock_response: reply } });
const withModels = (...names: string[]) => ({ model_list: names.map((n) => mockModel(n)), general_settings: { master_key: MASTER_KEY } });

/** The gateway process's `config reloaded` log lines of reloads SIGHUP asked for. */
function sighupReloads(gw: SpawnedGateway): Record<string, unknown>[] {
  return gw
    .output()
    .split("\n")
    .flatMap((line) => {
      try {
        return [JSON.parse(line) as Record<string, unknown>];
      } catch {
        return [];
      }
    })
    .filter((l) => l.msg === "config reloaded" && l.reason === "SIGHUP");
}

async function ask(client: OpenAI, model: string): Promise<string | null | undefined> {
  const res = await client.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] });
  return res.choices[0]?.message.content;
}

describe("file watch", () => {
  test("a model added to config.yaml appears in /v1/models and answers; a removed one disappears", async () => {
    const { gw, client } = await gateway(withModels("alpha"), { watch: true });
    expect(await modelIds(client)).toEqual(["alpha"]);

    gw.writeConfig(withModels("alpha", "beta"));
    await waitFor(() => modelIds(client), (ids) => ids.includes("beta"), "beta to appear");
    expect(await ask(client, "beta")).toBe("reply from beta");

    gw.writeConfig(withModels("beta"));
    expect(await waitFor(() => modelIds(client), (ids) => !ids.includes("alpha"), "alpha to disappear")).toEqual(["beta"]);
    await expect(ask(client, "alpha")).rejects.toMatchObject({ status: 400 });
  });

  test("atomic renames onto config.yaml are picked up, and the watch keeps working afterwards", async () => {
    const { gw, client } = await gateway(withModels("alpha"), { watch: true });
    const renameOnto = (config: Record<string, unknown>, n: number) => {
      const tmp = join(gw.dir, `.config.yaml.tmp-${n}`);
      writeFileSync(tmp, configText(config));
      renameSync(tmp, gw.configPath);
    };

    renameOnto(withModels("alpha", "gamma"), 1);
    await waitFor(() => modelIds(client), (ids) => ids.includes("gamma"), "gamma to appear after a rename");

    renameOnto(withModels("gamma"), 2);
    expect(await waitFor(() => modelIds(client), (ids) => !ids.includes("alpha"), "alpha to disappear after a second rename")).toEqual(["gamma"]);

    // An in-place edit after the file was replaced twice still reaches the gateway.
    gw.writeConfig(withModels("gamma", "delta"));
    expect(await waitFor(() => modelIds(client), (ids) => ids.includes("delta"), "delta to appear after an in-place edit")).toEqual(["delta", "gamma"]);
  });
});

describe("a stream in flight across a reload", () => {
  const slowConfig = (reply: string) => ({
    model_list: [{ model_name: "slow-model", svc_params: { model: "slow/x" }, model_info: { id: "slow-dep" } }],
    plugins: [{ path: SLOW_PLUGIN, config: { reply, chunks: 12, delayMs: 40 } }],
    svc_settings: { callbacks: ["slow-log"] },
    general_settings: { master_key: MASTER_KEY },
  });

  test("finishes on the old config with [DONE]; new requests get the new one; the old plugin is disposed only after", async () => {
    const events = slowEvents();
    events.length = 0;
    const { gw, client } = await gateway(slowConfig("v1"));
    expect(events).toEqual(["setup:v1"]);

    // Two streams on v1: one read by the SDK, one raw to see the exact SSE ending.
    const sdkStream = await client.chat.completions.create({ model: "slow-model", stream: true, messages: [{ role: "user", content: "go" }] });
    const raw = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "slow-model", stream: true, messages: [{ role: "user", content: "go" }] }),
    });
    expect(raw.status).toBe(200);
    const rawText = raw.text();
    rawText.catch(() => undefined); // awaited below; keeps a failed run from leaking into the next test

    const it = sdkStream[Symbol.asyncIterator]();
    let sdkText = "";
    let lastFinish: string | null | undefined;
    // Read until the first content arrived, so the stream is surely mid-way when the reload happens.
    while (!sdkText) {
      const next = await it.next();
      if (next.done) throw new Error("stream ended before the reload");
      sdkText += next.value.choices[0]?.delta.content ?? "";
    }

    gw.writeConfig(slowConfig("v2"));
    const reloaded = await gw.live.reload("test");
    expect(reloaded).toEqual({ ok: true, version: 2, changed: true });
    expect(events).toContain("setup:v2");
    expect(events).not.toContain("dispose:v1");

    // A new request while the old streams are still running is served by the new config.
    expect(await ask(client, "slow-model")).toBe("v2 ".repeat(12));
    expect(events.filter((e) => e.startsWith("stream-end:v1"))).toEqual([]);
    expect(events).not.toContain("dispose:v1");

    for (;;) {
      const next = await it.next();
      if (next.done) break;
      sdkText += next.value.choices[0]?.delta.content ?? "";
      lastFinish = next.value.choices[0]?.finish_reason ?? lastFinish;
    }
    expect(sdkText).toBe("v1 ".repeat(12));
    expect(lastFinish).toBe("stop");

    const body = await rawText;
    expect(body.endsWith("data: [DONE]\n\n")).toBe(true);
    expect(body).not.toContain("v2");
    expect(body.match(/"content":"v1 "/g)).toHaveLength(12);

    // The retired snapshot is disposed once its last stream has ended, and only then.
    await waitFor(() => [...events], (e) => e.includes("dispose:v1"), "the v1 plugin to be disposed");
    const ends = events.flatMap((e, i) => (e === "stream-end:v1" ? [i] : []));
    expect(ends).toHaveLength(2);
    expect(events.indexOf("dispose:v1")).toBeGreaterThan(Math.max(...ends));
    // Both streams' calls reached the old config's logging callback, before its dispose (the last
    // one's record came after it once: queued after its pin was released).
    const logged = events.flatMap((e, i) => (e === "log:v1" ? [i] : []));
    expect(logged).toHaveLength(2);
    expect(events.indexOf("dispose:v1")).toBeGreaterThan(Math.max(...logged));
    expect(events.filter((e) => e === "dispose:v1")).toHaveLength(1);
    expect(events).not.toContain("dispose:v2");
  });

  test("with nothing in flight, the old plugin is disposed at reload", async () => {
    const events = slowEvents();
    events.length = 0;
    const { gw, client } = await gateway(slowConfig("w1"));
    expect(await ask(client, "slow-model")).toBe("w1 ".repeat(12));
    gw.writeConfig(slowConfig("w2"));
    expect((await gw.live.reload("test")).ok).toBe(true);
    await waitFor(() => [...events], (e) => e.includes("dispose:w1"), "the w1 plugin to be disposed");
    expect(await ask(client, "slow-model")).toBe("w2 ".repeat(12));
  });
});

describe("a large file", () => {
  test("is read off the serving thread: timers (and so calls and streams) go on while it is parsed", async () => {
    const { gw, client } = await gateway(withModels("alpha"));
    // 4,000 models, 600 KB: seconds of parsing on a busy machine.
    gw.writeConfig(withModels(...Array.from({ length: 4000 }, (_, i) => `m${i}`)));
    let longestPause = 0;
    let last = performance.now();
    const tick = () => {
      const now = performance.now();
      longestPause = Math.max(longestPause, now - last);
      last = now;
    };
    const ticker = setInterval(tick, 5);
    const started = performance.now();
    const reloaded = await gw.live.reload("test");
    const took = performance.now() - started;
    clearInterval(ticker);
    tick();
    expect(reloaded.ok).toBe(true);
    expect((await modelIds(client)).length).toBe(4000);
    // A ratio, not a bound, so that a slow machine does not fail it: parsed on this thread, the
    // pause was nearly the whole reload (the registry build is a small part of it).
    expect(longestPause).toBeLessThan(took / 2);
  }, 60_000);
});

describe("a bad file written over a good one", () => {
  const rejections = (gw: TestGateway) =>
    gw.log.lines.filter((l) => l.level === "error" && l.msg.startsWith("config reload rejected")).map((l) => ((l.fields?.errors as string[] | undefined) ?? []).join("\n"));

  test("is rejected with the error and its path logged; the old config keeps serving; a good file is accepted again", async () => {
    const { gw, client } = await gateway(withModels("alpha"), { watch: true });

    // A schema error.
    gw.writeConfig({
      model_list: [mockModel("alpha"), { model_name: "broken", svc_params: { model: "openai/x", api_base: "ftp://nope" } }],
      general_settings: { master_key: MASTER_KEY },
    });
    const first = await waitFor(() => rejections(gw), (r) => r.length >= 1, "the bad file to be rejected");
    expect(first[0]).toContain("/model_list/1/svc_params/api_base:");
    expect(await modelIds(client)).toEqual(["alpha"]);
    expect(await ask(client, "alpha")).toBe("reply from alpha");

    // An error only the registry build finds.
    gw.writeConfig({ model_list: [mockModel("alpha"), { model_name: "ghost", svc_params: { model: "nosuch/x" } }], general_settings: { master_key: MASTER_KEY } });
    const second = await waitFor(() => rejections(gw), (r) => r.length >= 2, "the unknown provider to be rejected");
    expect(second[1]).toContain("/model_list/1/svc_params/model: unknown provider 'nosuch'");

    // Broken YAML.
    writeFileSync(gw.configPath, "model_list:\n  - model_name: [unclosed\n");
    const third = await waitFor(() => rejections(gw), (r) => r.length >= 3, "the YAML error to be rejected");
    expect(third[2]).toContain("YAML syntax error");

    expect(await modelIds(client)).toEqual(["alpha"]);
    expect(await ask(client, "alpha")).toBe("reply from alpha");
    expect(gw.live.current.version).toBe(1);

    gw.writeConfig(withModels("alpha", "fixed"));
    expect(await waitFor(() => modelIds(client), (ids) => ids.includes("fixed"), "the good file to be accepted")).toEqual(["alpha", "fixed"]);
    expect(await ask(client, "fixed")).toBe("reply from fixed");
    expect(gw.log.lines.some((l) => l.msg === "config reloaded")).toBe(true);
  });
});

describe("environment_variables of a refused file", () => {
  const LEAK = "GW_RELOAD_LEAK_TEST";
  afterAll(() => {
    delete process.env[LEAK];
  });

  test("are not applied: a later good file's os.environ/ reference stays unset; a good file's are applied", async () => {
    delete process.env[LEAK];
    const { gw, client } = await gateway(withModels("alpha"));
    const refused = [
      // A schema error, and an error only the registry build finds.
      { environment_variables: { [LEAK]: "from-a-bad-file" }, model_list: [{ model_name: "x", svc_params: { model: "mock/x", rpm: 0 } }], general_settings: { master_key: MASTER_KEY } },
      { environment_variables: { [LEAK]: "from-a-bad-file" }, model_list: [{ model_name: "x", svc_params: { model: "nosuch/x" } }], general_settings: { master_key: MASTER_KEY } },
    ];
    for (const bad of refused) {
      gw.writeConfig(bad);
      expect((await gw.live.reload("file changed")).ok).toBe(false);
      expect(process.env[LEAK]).toBeUndefined();
    }
    const envModel = { model_name: "env-model", svc_params: { model: "mock/e", mock_response: `os.environ/${LEAK}` } };
    gw.writeConfig({ model_list: [envModel], general_settings: { master_key: MASTER_KEY } });
    expect((await gw.live.reload("file changed")).ok).toBe(true);
    expect(await ask(client, "env-model")).not.toBe("from-a-bad-file");

    gw.writeConfig({ environment_variables: { [LEAK]: "from-a-good-file" }, model_list: [envModel], general_settings: { master_key: MASTER_KEY } });
    expect((await gw.live.reload("file changed")).ok).toBe(true);
    expect(process.env[LEAK]).toBe("from-a-good-file");
    expect(await ask(client, "env-model")).toBe("from-a-good-file");
  });
});

describe("environment_variables a later file no longer sets", () => {
  const DROPPED = "GW_RELOAD_ENV_DROPPED";
  const CHANGED = "GW_RELOAD_ENV_CHANGED";
  const OUTSIDE = "GW_RELOAD_ENV_OUTSIDE";
  const names = [DROPPED, CHANGED, OUTSIDE];
  afterAll(() => {
    for (const n of names) delete process.env[n];
  });
  const envModels = names.map((n) => ({ model_name: n.toLowerCase(), svc_params: { model: `mock/${n.toLowerCase()}`, mock_response: `os.environ/${n}` } }));
  const withEnv = (env?: Record<string, string>) => ({ ...(env ? { environment_variables: env } : {}), model_list: envModels, general_settings: { master_key: MASTER_KEY } });

  test("are unset on reload (a changed one takes its new value); the environment's own are never touched; a stored-model rebuild keeps them", async () => {
    for (const n of names) delete process.env[n];
    process.env[OUTSIDE] = "from the environment";
    const db = await freshDatabase("gw_reload_env");
    try {
      const gw = await startTestGateway(withEnv({ [DROPPED]: "dropped-1", [CHANGED]: "changed-1", [OUTSIDE]: "from the file" }), { store: { databaseUrl: db.url } });
      running.push(gw);
      const client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
      const env = () => Object.fromEntries(names.map((n) => [n, process.env[n]]));
      const answers = async () => Object.fromEntries(await Promise.all(names.map(async (n) => [n, await ask(client, n.toLowerCase())])));
      expect(env()).toEqual({ [DROPPED]: "dropped-1", [CHANGED]: "changed-1", [OUTSIDE]: "from the environment" });
      expect(await answers()).toEqual(env());

      // A stored-model change rebuilds with the serving config: its variables stay.
      const stored = await fetch(`${gw.url}/model/new`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model_name: "stored", svc_params: { model: "mock/stored" } }),
      });
      expect(stored.status).toBe(200);
      expect(env()).toEqual({ [DROPPED]: "dropped-1", [CHANGED]: "changed-1", [OUTSIDE]: "from the environment" });

      gw.writeConfig(withEnv({ [CHANGED]: "changed-2", [OUTSIDE]: "from the file, again" }));
      expect((await gw.live.reload("file changed")).ok).toBe(true);
      expect(env()).toEqual({ [DROPPED]: undefined, [CHANGED]: "changed-2", [OUTSIDE]: "from the environment" });
      const second = await answers();
      expect(second[DROPPED]).not.toBe("dropped-1");
      expect(second).toMatchObject({ [CHANGED]: "changed-2", [OUTSIDE]: "from the environment" });

      // A refused file changes nothing.
      gw.writeConfig({ ...withEnv({ [DROPPED]: "from a refused file" }), model_list: [{ model_name: "x", svc_params: { model: "nosuch/x" } }] });
      expect((await gw.live.reload("file changed")).ok).toBe(false);
      expect(env()).toEqual({ [DROPPED]: undefined, [CHANGED]: "changed-2", [OUTSIDE]: "from the environment" });

      gw.writeConfig(withEnv());
      expect((await gw.live.reload("file changed")).ok).toBe(true);
      expect(env()).toEqual({ [DROPPED]: undefined, [CHANGED]: undefined, [OUTSIDE]: "from the environment" });
      expect((await answers())[CHANGED]).not.toBe("changed-2");

      // Given again, set again.
      gw.writeConfig(withEnv({ [DROPPED]: "dropped-3" }));
      expect((await gw.live.reload("file changed")).ok).toBe(true);
      expect(process.env[DROPPED]).toBe("dropped-3");
      expect(await ask(client, DROPPED.toLowerCase())).toBe("dropped-3");
    } finally {
      await Promise.allSettled(running.splice(0).map((g) => g.stop()));
      await db.drop();
    }
  });
});

describe("the store's and Redis's addresses", () => {
  const NAMES = ["DATABASE_URL", "REDIS_URL"] as const;
  const saved = Object.fromEntries(NAMES.map((n) => [n, process.env[n]]));
  afterAll(() => {
    for (const n of NAMES) if (saved[n] === undefined) delete process.env[n];
    else process.env[n] = saved[n];
  });

  test("a reload that changes them (general_settings or environment_variables) is applied otherwise, and warns that they need a restart, unless back to what the process opened", async () => {
    for (const n of NAMES) delete process.env[n];
    const { gw, client } = await gateway(withModels("a"));
    const warnings = () => gw.log.lines.filter((l) => l.level === "warn" && l.msg.includes("it is opened once")).map((l) => l.msg);
    gw.writeConfig({ ...withModels("a", "b"), general_settings: { master_key: MASTER_KEY, database_url: "postgres://127.0.0.1:1/other" } });
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect(await modelIds(client)).toEqual(["a", "b"]);
    expect(warnings()).toEqual([
      "config: the store's address (DATABASE_URL or general_settings.database_url) changed; it is opened once, at start: restart the gateway to use the new one",
    ]);
    gw.writeConfig({ ...withModels("a", "b"), environment_variables: { DATABASE_URL: "postgres://127.0.0.1:1/other", REDIS_URL: "redis://127.0.0.1:1" } });
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect(warnings()).toHaveLength(2);
    expect(warnings()[1]).toStartWith("config: Redis's address (REDIS_URL or general_settings.redis_url) changed");
    // An unrelated change says nothing more; nor does dropping them: back to what the process opened.
    gw.writeConfig({ ...withModels("a"), environment_variables: { DATABASE_URL: "postgres://127.0.0.1:1/other", REDIS_URL: "redis://127.0.0.1:1" } });
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect(warnings()).toHaveLength(2);
    gw.writeConfig(withModels("a"));
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect(warnings()).toHaveLength(2);
    expect(process.env.DATABASE_URL).toBeUndefined();
    // Added again, then removed again: one warning, for the change away from it.
    gw.writeConfig({ ...withModels("a"), general_settings: { master_key: MASTER_KEY, redis_url: "redis://127.0.0.1:1" } });
    expect((await gw.live.reload("test")).ok).toBe(true);
    gw.writeConfig(withModels("a"));
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect(warnings()).toHaveLength(3);
  });
});

describe("SIGHUP", () => {
  const ENV = "GW_RELOAD_TEST_REPLY";
  afterAll(() => {
    delete process.env[ENV];
  });

  test("live.reload('SIGHUP', true) re-reads an unchanged file (picking up a changed environment variable)", async () => {
    process.env[ENV] = "first";
    const { gw, client } = await gateway({
      model_list: [{ model_name: "env-model", svc_params: { model: "mock/e", mock_response: `os.environ/${ENV}` } }],
      general_settings: { master_key: MASTER_KEY },
    });
    expect(await ask(client, "env-model")).toBe("first");

    process.env[ENV] = "second";
    // A file-change reload of identical text is a no-op…
    expect(await gw.live.reload("file changed")).toEqual({ ok: true, version: 1, changed: false });
    expect(await ask(client, "env-model")).toBe("first");
    // …a forced one (what SIGHUP does) rebuilds.
    expect(await gw.live.reload("SIGHUP", true)).toEqual({ ok: true, version: 2, changed: true });
    expect(await ask(client, "env-model")).toBe("second");
  });

  test("live.reload('SIGHUP', true) applies a rewritten file at once, without a watcher", async () => {
    const { gw, client } = await gateway(withModels("alpha"));
    gw.writeConfig(withModels("alpha", "sighup-model"));
    expect((await gw.live.reload("SIGHUP", true)).ok).toBe(true);
    expect(await modelIds(client)).toEqual(["alpha", "sighup-model"]);
  });

  test("a real SIGHUP to a gateway process reloads config.yaml and the process keeps serving", async () => {
    const gw: SpawnedGateway = await spawnGateway(withModels("alpha"));
    running.push(gw);
    const client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
    expect(await modelIds(client)).toEqual(["alpha"]);

    writeFileSync(gw.configPath, configText(withModels("alpha", "omega")));
    gw.proc.kill("SIGHUP");
    await waitFor(() => modelIds(client), (ids) => ids.includes("omega"), "omega to appear after SIGHUP", 10_000);
    expect(await ask(client, "omega")).toBe("reply from omega");

    // The watcher may have reloaded too, but the SIGHUP itself must have caused a reload.
    const logged = await waitFor(() => sighupReloads(gw), (l) => l.length > 0, "a 'config reloaded' log line with reason SIGHUP");
    expect(logged[0]?.models).toBe(2);
    expect(gw.proc.exitCode).toBeNull();
    expect(await gw.stop()).toBe(0);
  }, 75_000); // a process opens its embedded store first: ~5 s alone, far more on a busy 2-CPU machine

  test("a SIGHUP while the gateway is still starting does not kill it: the file is read again once it has started", async () => {
    const gw = await spawnGateway({ ...withModels("alpha"), plugins: [{ path: SLOW_SETUP_PLUGIN, config: { ms: 1500 } }] }, { waitForListen: false });
    running.push(gw);
    // Its store is open; its registry is being built.
    await waitFor(() => gw.output(), (out) => out.includes("slow-setup: setting up"), "the plugin's setup to begin", 60_000);
    writeFileSync(gw.configPath, configText({ ...withModels("alpha", "omega"), plugins: [{ path: SLOW_SETUP_PLUGIN, config: { ms: 0 } }] }));
    gw.proc.kill("SIGHUP");
    const logged = await waitFor(() => sighupReloads(gw), (l) => l.length > 0, "a 'config reloaded' log line with reason SIGHUP", 30_000);
    expect(logged[0]?.models).toBe(2);
    expect(gw.output()).toContain("listening on");
    expect(gw.proc.exitCode).toBeNull();
    expect(await gw.stop()).toBe(0);
  }, 75_000);
});
