/**
 * Third-party plugins loaded by path from config.yaml: a provider and logging callbacks that work
 * end to end through the OpenAI SDK, the factory form for the compiled binary, and load errors
 * (plugin config validated against the plugin's own schema, missing file, provider id clash).
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative, resolve } from "node:path";
import OpenAI from "openai";
import { Live } from "../core/live.ts";
import { pluginTiming } from "../core/plugins.ts";
import { SnapshotError } from "../core/snapshot.ts";
import { type SinkEntry, sink } from "./fixtures/plugins/echo.ts";
import { type ConfigInput, configText, MASTER_KEY, memoryLogger, startTestGateway, type TestGateway, tempDir } from "./harness/gateway.ts";

const FIXTURES = resolve(import.meta.dir, "fixtures/plugins");
const ECHO = join(FIXTURES, "echo.ts");
const FACTORY = join(FIXTURES, "factory-greet.ts");
const DEFAULTS = join(FIXTURES, "defaults-probe.ts");
const SINK = "plugins-test";

/**
 * Plugin paths in config.yaml are relative to the config file. Test gateways keep config.yaml in
 * a fresh folder directly under the OS temp dir, so a path relative to any such folder works.
 */
const fromTempConfig = (abs: string) => relative(join(tmpdir(), "gw-test-anything"), abs);

/**
 * A reload to `bad` is refused with the models `before` still served, and a later reload to `good`
 * serves `before` and `after`: the errors of the refusal.
 */
async function refusedThenApplied(gw: TestGateway, bad: ConfigInput, good: ConfigInput): Promise<string[]> {
  gw.writeConfig(bad);
  const refused = await gw.live.reload("test");
  expect(refused.ok).toBe(false);
  expect(await listedModels(gw)).toEqual(["before"]);
  gw.writeConfig(good);
  expect((await gw.live.reload("test")).ok).toBe(true);
  expect(await listedModels(gw)).toEqual(["before", "after"]);
  return refused.ok ? [] : refused.errors;
}

/** A plugin still hanging does not hold the stop. */
async function stopsPromptly(gw: TestGateway): Promise<void> {
  const t0 = Date.now();
  await gw.stop();
  expect(Date.now() - t0).toBeLessThan(5_000);
}

/** The model ids `/v1/models` lists to the master key. */
async function listedModels(gw: TestGateway): Promise<string[]> {
  const res = await fetch(`${gw.baseURL}/models`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
  return ((await res.json()) as { data: { id: string }[] }).data.map((m) => m.id);
}

let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  gw = await startTestGateway({
    model_list: [
      { model_name: "echo-chat", svc_params: { model: "echo/parrot" }, model_info: { id: "echo-dep-1" } },
      { model_name: "echo-broken", svc_params: { model: "echo/fail" }, model_info: { id: "echo-dep-fail" } },
      { model_name: "greeter", svc_params: { model: "greet/any" } },
    ],
    plugins: [
      { path: fromTempConfig(ECHO), config: { sink: SINK } },
      { path: fromTempConfig(FACTORY), config: { greeting: "hello from a factory plugin" } },
    ],
    svc_settings: { callbacks: ["echo-all"], success_callback: ["echo-success"], failure_callback: ["echo-failure"] },
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
});
afterAll(() => gw.stop());

/** Callbacks run off the response path: wait until `n` records for the call have arrived. */
async function recordsFor(callId: string, n: number): Promise<SinkEntry[]> {
  const deadline = Date.now() + 3000;
  for (;;) {
    const got = sink(SINK).filter((e) => e.record.id === callId);
    if (got.length >= n || Date.now() > deadline) {
      await Bun.sleep(30); // let any extra (wrong) deliveries land too
      return sink(SINK).filter((e) => e.record.id === callId);
    }
    await Bun.sleep(10);
  }
}

describe("third-party plugin loaded from a path relative to config.yaml", () => {
  test("the plugin paths in the config really are relative", () => {
    expect(gw.live.current.config.plugins?.map((p) => p.path.startsWith(".."))).toEqual([true, true]);
  });

  test("its provider answers a chat call through the SDK, listed in /v1/models", async () => {
    const { data, response } = await client.chat.completions
      .create({ model: "echo-chat", messages: [{ role: "user", content: "hello plugin world" }] })
      .withResponse();
    expect(data.choices[0]?.message.content).toBe("echo: hello plugin world");
    expect(data.usage).toMatchObject({ prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 });
    expect(response.headers.get("x-svc-model-id")).toBe("echo-dep-1");

    const models = await client.models.list();
    const owners = Object.fromEntries(models.data.map((m) => [m.id, m.owned_by]));
    expect(owners).toEqual({ "echo-chat": "echo", "echo-broken": "echo", greeter: "greet" });
  });

  test("a successful call reaches the success callbacks with a complete CallRecord, not the failure one", async () => {
    const { response } = await client.chat.completions
      .create({ model: "echo-chat", messages: [{ role: "user", content: "count these four words" }] })
      .withResponse();
    const callId = response.headers.get("x-svc-call-id")!;
    expect(callId).toBeTruthy();

    const got = await recordsFor(callId, 2);
    expect(got.map((e) => e.via).sort()).toEqual(["echo-all", "echo-success"]);
    const record = got[0]!.record;
    expect(record).toMatchObject({
      id: callId,
      endpoint: "chat",
      status: "success",
      modelGroup: "echo-chat",
      provider: "echo",
      deploymentId: "echo-dep-1",
      upstreamModel: "parrot",
      stream: false,
      usage: { promptTokens: 4, completionTokens: 5 },
    });
    expect(record.principal.role).toBe("proxy_admin");
    expect(record.error).toBeUndefined();
    expect(record.endedAt).toBeGreaterThanOrEqual(record.startedAt);
  });

  test("an upstream 500 from the plugin's provider reaches the failure callbacks with the error", async () => {
    let caught: unknown;
    try {
      await client.chat.completions.create({ model: "echo-broken", messages: [{ role: "user", content: "boom" }] });
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(OpenAI.APIError);
    const err = caught as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(500);
    expect(err.message).toContain("echo upstream exploded");
    const callId = err.headers?.get("x-svc-call-id");
    expect(callId).toBeTruthy();

    const got = await recordsFor(callId!, 2);
    expect(got.map((e) => e.via).sort()).toEqual(["echo-all", "echo-failure"]);
    const record = got[0]!.record;
    expect(record).toMatchObject({ status: "failure", modelGroup: "echo-broken", provider: "echo", deploymentId: "echo-dep-fail" });
    expect(record.error?.status).toBe(500);
    expect(record.error?.message).toContain("echo upstream exploded");
  });

  test("a plugin default-exported as a factory (host) => host.definePlugin(...) works", async () => {
    const res = await client.chat.completions.create({ model: "greeter", messages: [{ role: "user", content: "hi" }] });
    expect(res.choices[0]?.message.content).toBe("hello from a factory plugin");
  });
});

describe("a plugin's config gets the defaults its schema declares", () => {
  const configWith = (pluginConfig: Record<string, unknown>) => ({
    model_list: [{ model_name: "probe", svc_params: { model: "defaults/any" } }],
    plugins: [{ path: fromTempConfig(DEFAULTS), config: pluginConfig }],
    general_settings: { master_key: MASTER_KEY },
  });
  /** What the plugin's setup received, as its provider tells it. */
  const received = async (gateway: TestGateway) => {
    const sdk = new OpenAI({ baseURL: gateway.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
    const res = await sdk.chat.completions.create({ model: "probe", messages: [{ role: "user", content: "config?" }] });
    return JSON.parse(res.choices[0]?.message.content ?? "null") as unknown;
  };

  test("on start and on reload: left-out fields, a left-out object and Record values are filled, given values kept", async () => {
    const probe = await startTestGateway(configWith({ tiers: { gold: { label: "Gold" }, free: { label: "Free", weight: 0 } } }));
    try {
      expect(await received(probe)).toEqual({
        retries: 5,
        greeting: "hi",
        backoff: { base_ms: 100, factor: 2 },
        tiers: { gold: { label: "Gold", weight: 1 }, free: { label: "Free", weight: 0 } },
      });

      probe.writeConfig(configWith({ retries: 2, backoff: { factor: 3 } }));
      expect((await probe.live.reload("test")).ok).toBe(true);
      expect(await received(probe)).toEqual({ retries: 2, greeting: "hi", backoff: { base_ms: 100, factor: 3 } });

      // A field without a default is still required where defaults fill the rest.
      probe.writeConfig(configWith({ tiers: { bronze: {} } }));
      const refused = await probe.live.reload("test");
      expect(refused.ok ? [] : refused.errors).toContain("/plugins/0/config/tiers/bronze/label: Expected required property (plugin defaults-probe)");
    } finally {
      await probe.stop();
    }
  });

  test("inside a list's items too: a left-out object and Record values are filled in each item", async () => {
    const sinks = [{ url: "http://a", headers: { "x-a": { value: "1" } } }, { url: "http://b", retry: { max: 0 } }];
    const probe = await startTestGateway(configWith({ sinks }));
    try {
      expect(await received(probe)).toMatchObject({
        sinks: [
          { url: "http://a", retry: { max: 3 }, headers: { "x-a": { value: "1", sensitive: false } } },
          { url: "http://b", retry: { max: 0 } },
        ],
      });
    } finally {
      await probe.stop();
    }
  });

  test("each error of a plugin's config is an entry of its own, starting with its path", async () => {
    const probe = await startTestGateway(configWith({}));
    try {
      probe.writeConfig(configWith({ retries: "many", sinks: [{ retry: {} }] }));
      const refused = await probe.live.reload("test");
      // The model of the plugin's provider is not reported unknown: the plugin did not load.
      expect(refused.ok ? [] : refused.errors).toEqual([
        "/plugins/0/config/retries: Expected number (plugin defaults-probe)",
        "/plugins/0/config/sinks/0/url: Expected required property (plugin defaults-probe)",
        "/plugins/0/config/sinks/0/url: Expected string (plugin defaults-probe)",
      ]);
    } finally {
      await probe.stop();
    }
  });
});

describe("a plugin whose setup never ends", () => {
  const HANG = join(FIXTURES, "hang-setup.ts");
  const model = (name: string) => ({ model_name: name, svc_params: { model: `mock/${name}` } });
  const withPlugin = (hang: boolean, models: string[]) => ({
    model_list: models.map(model),
    plugins: [{ path: fromTempConfig(HANG), config: { hang } }],
    general_settings: { master_key: MASTER_KEY },
  });

  test("a reload is refused once its setup time is up (the old config serving), later reloads still apply, and the stop is not held", async () => {
    const saved = pluginTiming.setupMs;
    pluginTiming.setupMs = 300;
    const gw = await startTestGateway(withPlugin(false, ["before"]));
    try {
      const errors = await refusedThenApplied(gw, withPlugin(true, ["before", "never"]), withPlugin(false, ["before", "after"]));
      expect(errors.join("\n")).toContain("plugin hang-setup: its setup did not finish within 0.3 s");
    } finally {
      await stopsPromptly(gw);
      pluginTiming.setupMs = saved;
    }
  });
});

describe("a plugin whose module never finishes loading (top-level await)", () => {
  const HANG = join(FIXTURES, "hang-import.ts");
  const model = (name: string) => ({ model_name: name, svc_params: { model: `mock/${name}` } });
  const config = (models: string[], hang: boolean) => ({
    model_list: models.map(model),
    ...(hang ? { plugins: [{ path: fromTempConfig(HANG) }] } : {}),
    general_settings: { master_key: MASTER_KEY },
  });

  test("a start is refused, naming the plugin's path; a reload is refused, later reloads still apply, and the stop is not held", async () => {
    const saved = pluginTiming.loadMs;
    pluginTiming.loadMs = 300;
    const error = `/plugins/0/path: ${HANG} did not finish loading within 0.3 s (its top-level code is still running)`;
    const gw = await startTestGateway(config(["before"], false));
    try {
      // Caught, not expect(…).rejects: that waits in a nested event loop which, with a server
      // running in the process, loses the config reader thread's reply, and the start never ends.
      expect(await startTestGateway(config(["never"], true)).catch((err: unknown) => err)).toMatchObject({ errors: [error] });

      expect(await refusedThenApplied(gw, config(["before", "never"], true), config(["before", "after"], false))).toEqual([error]);
    } finally {
      await stopsPromptly(gw);
      pluginTiming.loadMs = saved;
    }
  });
});

describe("plugin load errors", () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  /** Starts from a config file in a fresh folder and returns the load errors. */
  async function loadErrors(config: (dir: string) => ConfigInput): Promise<string[]> {
    const dir = tempDir("gw-plugins-");
    dirs.push(dir);
    const path = join(dir, "config.yaml");
    writeFileSync(path, configText(config(dir)));
    try {
      const live = await Live.start(path, memoryLogger());
      await live.close();
    } catch (err) {
      if (err instanceof SnapshotError) return err.errors;
      throw err;
    }
    throw new Error("expected the config to be rejected, but it loaded");
  }

  test("plugin config is validated against the plugin's own schema; every bad field is named by path", async () => {
    const errors = await loadErrors((dir) => ({
      plugins: [
        { path: relative(dir, ECHO), config: { prefix: 42 } },
        { path: relative(dir, FACTORY), config: { greeting: "" } },
      ],
    }));
    expect(errors.join("\n")).toContain("/plugins/0/config/sink: Expected required property");
    expect(errors.join("\n")).toContain("/plugins/0/config/prefix: Expected string");
    expect(errors.join("\n")).toContain("/plugins/1/config/greeting: Expected string length greater or equal to 1");
    expect(errors.join("\n")).toContain("plugin echo-test");
  });

  test("a plugin's bad config is listed with the file's other errors, not instead of them", async () => {
    const errors = await loadErrors((dir) => ({
      model_list: [
        { model_name: "a", svc_params: { model: "mock/a" }, model_info: { id: "dup" } },
        { model_name: "b", svc_params: { model: "mock/b" }, model_info: { id: "dup" } },
        { model_name: "c", svc_params: { model: "nosuch/c" } },
      ],
      plugins: [{ path: relative(dir, ECHO), config: { prefix: 42 } }],
    }));
    const text = errors.join("\n");
    expect(text).toContain("/plugins/0/config/prefix: Expected string");
    expect(text).toContain("/model_list/1/model_info/id: 'dup' is already used by /model_list/0");
    // Not a provider's name, though: the plugin that did not load may be the one providing it.
    expect(text).not.toContain("unknown provider");
  });

  test("a plugin file that does not exist is named at /plugins/N/path", async () => {
    const errors = await loadErrors((dir) => ({
      plugins: [
        { path: relative(dir, ECHO), config: { sink: SINK } },
        { path: "./no-such-plugin.ts" },
      ],
    }));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toStartWith("/plugins/1/path: plugin file not found:");
    expect(errors[0]).toContain("no-such-plugin.ts");
  });

  test("a plugin whose setup fails is named at /plugins/N with its error; the provider and callback it would give are not reported unknown", async () => {
    const errors = await loadErrors((dir) => {
      writeFileSync(
        join(dir, "failing.ts"),
        `export default (host) => host.definePlugin({ name: "failing", config: host.Type.Object({}), setup() { throw new Error("its backend is unreachable"); } });\n`,
      );
      return {
        model_list: [
          { model_name: "f", svc_params: { model: "failing/x" } },
          { model_name: "g", svc_params: { model: "mock/g" }, model_info: { id: "dup" } },
          { model_name: "h", svc_params: { model: "mock/h" }, model_info: { id: "dup" } },
        ],
        plugins: [{ path: "./failing.ts" }],
        svc_settings: { callbacks: ["failing-log"] },
      };
    });
    // The file's other errors are still listed.
    expect(errors).toEqual(["/plugins/0: plugin failing: setup failed: its backend is unreachable", "/model_list/2/model_info/id: 'dup' is already used by /model_list/1"]);
  });

  test("a plugin file that is not found leaves the names it may provide unchecked", async () => {
    const errors = await loadErrors(() => ({
      model_list: [{ model_name: "t", svc_params: { model: "tp/x" } }],
      plugins: [{ path: "./no-such-plugin.ts" }],
      svc_settings: { success_callback: ["tp-log"] },
    }));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toStartWith("/plugins/0/path: plugin file not found:");
  });

  test("a module that does not default-export a plugin is rejected at its path", async () => {
    const errors = await loadErrors((dir) => ({ plugins: [{ path: relative(dir, join(FIXTURES, "not-a-plugin.ts")) }] }));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toStartWith("/plugins/0/path:");
    expect(errors[0]).toContain("does not default-export a plugin");
  });

  test("a plugin file that does not compile is named at /plugins/N/path with the first error and its position, never the file's text", async () => {
    const errors = await loadErrors((dir) => {
      writeFileSync(join(dir, "broken.ts"), "export default {\n  name: 'x', setup( {\n");
      // Not a module at all (a credentials file named by mistake): Bun reports dozens of build errors.
      writeFileSync(join(dir, "credentials.js"), "deploy:sk-not-for-the-log-123456:0:0::/home/deploy:/bin/sh\nbackup:x:34:34::/var/backups:/bin/false\n");
      return { plugins: [{ path: "./broken.ts" }, { path: "./credentials.js" }] };
    });
    expect(errors).toHaveLength(2);
    expect(errors[0]).toMatch(/^\/plugins\/0\/path: \S*broken\.ts cannot be loaded: .+ at line \d+, column \d+$/);
    expect(errors[1]).toMatch(/^\/plugins\/1\/path: \S*credentials\.js cannot be loaded: .+ at line 1, column \d+( \(and \d+ more\))?$/);
    expect(errors.join("\n")).not.toContain("not-for-the-log");
  });

  test("a plugin registering an existing provider id (openai) is a load error", async () => {
    const errors = await loadErrors((dir) => ({ plugins: [{ path: relative(dir, join(FIXTURES, "dup-openai.ts")) }] }));
    expect(errors).toEqual(["plugin dup-openai: provider 'openai' is already registered by plugin builtin-providers"]);
  });

  test("one plugin listed twice (two destinations for one callback name) is a load error naming both entries, not one destination dropped", async () => {
    const errors = await loadErrors((dir) => {
      // A logger whose only hook is its callback, as a user writes one (a factory: it imports nothing).
      writeFileSync(
        join(dir, "my-logger.ts"),
        `export default (host) => host.definePlugin({ name: "my-logger", config: host.Type.Object({ url: host.Type.String() }), setup: () => ({ callbacks: { "my-logger": { log() {} } } }) });\n`,
      );
      return {
        plugins: [
          { path: "./my-logger.ts", config: { url: "https://logs.example/destination-a" } },
          { path: "./my-logger.ts", config: { url: "https://logs.example/destination-b" } },
        ],
        svc_settings: { callbacks: ["my-logger"] },
      };
    });
    expect(errors).toEqual(["/plugins/1: callback 'my-logger' is also provided by /plugins/0 (plugin my-logger): a callback name must come from one plugin entry"]);
  });

  test("a model using a plugin's provider without loading the plugin is an unknown provider", async () => {
    const errors = await loadErrors(() => ({ model_list: [{ model_name: "e", svc_params: { model: "echo/parrot" } }] }));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toStartWith("/model_list/0/svc_params/model: unknown provider 'echo'");
  });
});
