/**
 * config.yaml validation as an operator meets it: every problem listed at once, each with the
 * JSON-pointer path of the offending field, from the parser, from the snapshot builder (providers,
 * callbacks, ids) and from a gateway process that refuses to start.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { stringify } from "yaml";
import { parseConfig } from "../core/config/load.ts";
import { Live } from "../core/live.ts";
import { SnapshotError } from "../core/snapshot.ts";
import { type ConfigInput, configText, memoryLogger, spawnGateway, tempDir } from "./harness/gateway.ts";

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** Loads a config file through the same path the gateway uses at start (parse + snapshot build). */
async function start(config: ConfigInput): Promise<{ errors: string[] } | { live: Live; log: ReturnType<typeof memoryLogger> }> {
  const dir = tempDir("gw-config-");
  dirs.push(dir);
  const path = join(dir, "config.yaml");
  writeFileSync(path, configText(config));
  const log = memoryLogger();
  try {
    return { live: await Live.start(path, log), log };
  } catch (err) {
    if (err instanceof SnapshotError) return { errors: err.errors };
    throw err;
  }
}

async function startErrors(config: ConfigInput): Promise<string[]> {
  const r = await start(config);
  if ("live" in r) {
    await r.live.close();
    throw new Error("expected the config to be rejected, but it loaded");
  }
  return r.errors;
}

async function startOk(config: ConfigInput): Promise<{ live: Live; log: ReturnType<typeof memoryLogger> }> {
  const r = await start(config);
  if ("errors" in r) throw new Error(`expected the config to load, got:\n${r.errors.join("\n")}`);
  return r;
}

function parseErrors(text: string): string[] {
  const r = parseConfig(text);
  if (r.ok) throw new Error("expected parseConfig to reject the text");
  return r.errors;
}

/** The JSON-pointer path each error line starts with. */
const pathsOf = (errors: string[]) => new Set(errors.map((e) => e.slice(0, e.indexOf(": "))));

/** Three unrelated mistakes in one file. */
const THREE_ERRORS = {
  model_list: [
    { model_name: "a", svc_params: { model: "mock/a", timeout: "fast" } },
    { svc_params: { model: "mock/b" } },
    { model_name: "c", svc_params: { model: "openai/c", api_base: "ftp://example.com" } },
  ],
};
const THREE_PATHS = ["/model_list/0/svc_params/timeout", "/model_list/1/model_name", "/model_list/2/svc_params/api_base"];

describe("schema errors", () => {
  test("a file with three mistakes lists all three, each with its JSON-pointer path, and nothing else", () => {
    const errors = parseErrors(stringify(THREE_ERRORS));
    expect([...pathsOf(errors)].sort()).toEqual(THREE_PATHS);
    expect(errors).toContain("/model_list/0/svc_params/timeout: Expected number");
    expect(errors).toContain("/model_list/1/model_name: Expected required property");
    expect(errors).toContain("/model_list/2/svc_params/api_base: Expected string to match '^https?://' (expected an http(s) URL)");
  });

  test("the snapshot builder (gateway start) reports the same three paths", async () => {
    const errors = await startErrors(THREE_ERRORS);
    expect([...pathsOf(errors)].sort()).toEqual(THREE_PATHS);
  });

  test("LiteLLM's litellm_params / litellm_settings get a hint to use svc_params / svc_settings", () => {
    const errors = parseErrors(
      stringify({ model_list: [{ model_name: "a", litellm_params: { model: "openai/gpt-4o" } }], litellm_settings: { drop_params: true } }),
    );
    expect(errors).toContain("/model_list/0/litellm_params: Unexpected property (use svc_params)");
    expect(errors).toContain("/litellm_settings: Unexpected property (use svc_settings)");
    expect(errors).toContain("/model_list/0/svc_params: Expected required property");
  });

  test("general_settings.master_key must start with sk-", () => {
    const errors = parseErrors(stringify({ general_settings: { master_key: "letmein" } }));
    expect(errors).toEqual(["/general_settings/master_key: Expected string to match '^sk-' (expected a key starting with sk-)"]);
    expect(parseConfig(stringify({ general_settings: { master_key: "sk-letmein" } })).ok).toBe(true);
  });

  test("a YAML syntax error is reported with its line, not thrown", async () => {
    const text = "model_list:\n  - model_name: a\n    svc_params: { model: mock/a\n";
    const errors = parseErrors(text);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toStartWith("YAML syntax error:");
    expect(errors[0]).toMatch(/line \d+, column \d+/);
    expect(await startErrors(text)).toEqual(errors);
  });

  test("an http(s) URL must parse (api_base, a pass-through target), and the error does not show it", async () => {
    const config = {
      model_list: [{ model_name: "a", svc_params: { model: "openai/a", api_base: "http://" } }],
      general_settings: { pass_through_endpoints: [{ path: "/x", target: "http://admin:hunter2@[::1" }] },
    };
    const expected = [
      "/model_list/0/svc_params/api_base: Expected a URL that parses (expected an http(s) URL)",
      "/general_settings/pass_through_endpoints/0/target: Expected a URL that parses (expected an http(s) URL)",
    ];
    expect(parseErrors(stringify(config))).toEqual(expected);
    expect(await startErrors(config)).toEqual(expected);
  });

  test("headers (svc_params, pass-through) and api_key must be what HTTP can send; a line break at either end is fine", async () => {
    const config = {
      model_list: [
        { model_name: "a", svc_params: { model: "openai/a", api_key: "sk-a\nsk-b", headers: { "x-ok": "fine\n", "bad header": "x", "x-crlf": "a\r\nInjected: 1", "x-wide": "模型" } } },
        { model_name: "b", svc_params: { model: "openai/b", api_base: "http://127.0.0.1:9/v1", api_key: "sk-from-a-file\n" } },
      ],
      general_settings: { pass_through_endpoints: [{ path: "/x", target: "http://127.0.0.1:9", headers: { "": "x", "x-nul": "a\u0000b" } }] },
    };
    const value = "Expected text a header can carry (expected a header value: Latin-1 text, no line break inside, no NUL)";
    const name = "Unexpected property (expected a header name: letters, digits and !#$%&'*+-.^_`|~)";
    expect(parseErrors(stringify(config)).sort()).toEqual(
      [
        "/model_list/0/svc_params/api_key: Expected text a header can carry (expected a key sent in a header: Latin-1 text, no line break inside, no NUL)",
        `/model_list/0/svc_params/headers/bad header: ${name}`,
        `/model_list/0/svc_params/headers/x-crlf: ${value}`,
        `/model_list/0/svc_params/headers/x-wide: ${value}`,
        `/general_settings/pass_through_endpoints/0/headers/: ${name}`,
        `/general_settings/pass_through_endpoints/0/headers/x-nul: ${value}`,
      ].sort(),
    );
  });

  test("a model_name or model_info.id with a control character is refused; beyond Latin-1 (模型) is taken", async () => {
    const config = {
      model_list: [
        { model_name: "line\nbreak", svc_params: { model: "mock/a" } },
        { model_name: "模型", svc_params: { model: "mock/b" }, model_info: { id: "部署" } },
        { model_name: "ünï ok", svc_params: { model: "mock/c" }, model_info: { id: "tab\tid" } },
      ],
    };
    const expected = "Expected text without control characters (answers carry it in x-svc-model-group / x-svc-model-id)";
    expect(await startErrors(config)).toEqual([`/model_list/0/model_name: ${expected}`, `/model_list/2/model_info/id: ${expected}`]);
  });

  test("prices are numbers from 0 to $1 a token ($1,000 a second or image, $1,000,000 a pass-through call), every price field the README names", () => {
    const errors = parseErrors(
      stringify({
        model_list: [
          { model_name: "a", svc_params: { model: "mock/a", input_cost_per_token: 1e300, cache_read_input_token_cost: "0.001" }, model_info: { output_cost_per_reasoning_token: -1, input_cost_per_second: 5000 } },
        ],
        general_settings: { pass_through_endpoints: [{ path: "/x", target: "http://127.0.0.1:9", cost_per_request: 1e300 }] },
      }),
    );
    expect(errors).toEqual([
      "/model_list/0/svc_params/input_cost_per_token: Expected number to be less or equal to 1 (expected USD per token, at most 1)",
      "/model_list/0/svc_params/cache_read_input_token_cost: Expected number (expected USD per token, at most 1)",
      "/model_list/0/model_info/output_cost_per_reasoning_token: Expected number to be greater or equal to 0 (expected USD per token, at most 1)",
      "/model_list/0/model_info/input_cost_per_second: Expected number to be less or equal to 1000 (expected USD per unit, at most 1000)",
      "/general_settings/pass_through_endpoints/0/cost_per_request: Expected number to be less or equal to 1000000 (expected USD per call, at most 1000000)",
    ]);
  });

  test("a model_list written as a mapping (entries without their dashes) is refused, not read as an empty list", async () => {
    const text = "model_list:\n  model_name: gpt-4o\n  svc_params:\n    model: mock/gpt-4o\n";
    expect(parseErrors(text)).toEqual(["/model_list: Expected array"]);
    expect(await startErrors(text)).toEqual(["/model_list: Expected array"]);
    const { live } = await startOk("general_settings: {}\n");
    try {
      expect(live.current.models.entries).toHaveLength(0);
    } finally {
      await live.close();
    }
  });

  test("router_settings.max_retries and general_settings.alert_webhook_url, which the README documents, are validated", () => {
    const errors = parseErrors(stringify({ router_settings: { max_retries: -1 }, general_settings: { alert_webhook_url: 42 } }));
    expect(errors).toEqual([
      "/router_settings/max_retries: Expected integer to be greater or equal to 0",
      "/general_settings/alert_webhook_url: Expected string (expected an http(s) URL)",
    ]);
  });

  test("a duration must be longer than 0 and at most 100 years (retention, provider budget periods)", () => {
    const errors = parseErrors(
      stringify({
        router_settings: { provider_budget_config: { openai: { budget_limit: 10, time_period: "0d" }, groq: { budget_limit: 10, time_period: "100y" } } },
        general_settings: { maximum_spend_logs_retention_period: "999999999999d", maximum_spend_logs_retention_interval: "0s" },
      }),
    );
    const tooShortOrLong = "Expected a duration longer than 0 and at most 100y (expected a duration such as 1h, 1d, 30d)";
    expect(errors).toEqual([
      `/router_settings/provider_budget_config/openai/time_period: ${tooShortOrLong}`,
      `/general_settings/maximum_spend_logs_retention_period: ${tooShortOrLong}`,
      `/general_settings/maximum_spend_logs_retention_interval: ${tooShortOrLong}`,
    ]);
  });

  test("a section written empty (its keys commented out) is absent, as LiteLLM reads it; an empty scalar is still refused", async () => {
    const text = [
      "model_list:",
      "  - model_name: a",
      "    svc_params: { model: mock/a }",
      "    model_info:",
      "    #  id: mock-a",
      "router_settings:",
      "#  routing_strategy: simple-shuffle",
      "svc_settings:",
      "general_settings:",
      "  pass_through_endpoints:",
      "environment_variables:",
      "plugins:",
      "",
    ].join("\n");
    const { live } = await startOk(text);
    try {
      expect(live.current.models.resolve("a")).toHaveLength(1);
    } finally {
      await live.close();
    }
    const noModels = parseConfig("model_list:\n");
    expect(noModels.ok && noModels.config.model_list).toEqual([]);
    expect(parseErrors("model_list: []\ngeneral_settings:\n  master_key:\n")).toEqual(["/general_settings/master_key: Expected string (expected a key starting with sk-)"]);
  });

  test("a YAML syntax error names its line and column, not the line's text (which may hold a secret)", () => {
    const text = 'model_list:\n  - model_name: a\n    svc_params: { model: openai/a, api_key: "sk-do-not-print-me-12345 }\n';
    const errors = parseErrors(text);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/^YAML syntax error: .* at line \d+, column \d+$/);
    expect(errors[0]).not.toContain("do-not-print-me");
  });

  test("a file nested deeper than the parser can follow is refused with the same error wherever it is read", async () => {
    const text = `router_settings:\n  deep: ${"[".repeat(50_000)}${"]".repeat(50_000)}\n`;
    const error = "YAML syntax error: the file nests too deeply to be read (thousands of levels)";
    expect(parseErrors(text)).toEqual([error]);
    expect(await startErrors(text)).toEqual([error]);
  });

  test("two YAML documents in one file are refused as such", () => {
    const errors = parseErrors("model_list: []\n---\nmodel_list: []\n");
    expect(errors).toEqual(["YAML syntax error: the file holds more than one YAML document (a second '---'); config.yaml is one document at line 2, column 1"]);
  });

  test("a document that is not a mapping is rejected at /", () => {
    expect(parseErrors("- just\n- a list\n")).toEqual(["/: the config must be a YAML mapping"]);
  });
});

describe("YAML anchors, aliases and merge keys", () => {
  test("a merge key (<<: *base) merges the base under the entry's own keys, as LiteLLM's YAML 1.1 parser does", async () => {
    const text = [
      "model_list:",
      "  - model_name: a",
      "    svc_params: &base { model: openai/gpt-a, api_base: http://127.0.0.1:9/v1, api_key: sk-from-the-base-0123 }",
      "  - model_name: b",
      "    svc_params:",
      "      <<: *base",
      "      model: openai/gpt-b",
      "  - model_name: c",
      "    svc_params: { <<: [*base, { timeout: 7 }], api_key: sk-c-own-key-4567 }",
      "",
    ].join("\n");
    const { live } = await startOk(text);
    try {
      const [b] = live.current.models.resolve("b")!;
      expect([b?.upstreamModel, b?.apiBase, b?.apiKey]).toEqual(["gpt-b", "http://127.0.0.1:9/v1", "sk-from-the-base-0123"]);
      expect(b?.options).not.toHaveProperty("<<");
      const [c] = live.current.models.resolve("c")!;
      expect([c?.upstreamModel, c?.apiBase, c?.apiKey, c?.timeout]).toEqual(["gpt-a", "http://127.0.0.1:9/v1", "sk-c-own-key-4567", 7]);
    } finally {
      await live.close();
    }
    expect(parseErrors("a: { <<: 5 }\n")).toEqual(["YAML syntax error: Merge sources must be maps or map aliases"]);
  });

  test("a long model list sharing one base through aliases is read; an alias bomb is still refused", async () => {
    const entries = Array.from({ length: 300 }, (_, i) => `  - model_name: m${i}\n    svc_params: ${i === 0 ? "&base { model: mock/m }" : "*base"}`);
    const text = `model_list:\n${entries.join("\n")}\n`;
    const r = parseConfig(text);
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.config.model_list).toHaveLength(300);

    const bomb = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]'];
    for (let k = 1; k < 9; k++) bomb.push(`${String.fromCharCode(97 + k)}: &${String.fromCharCode(97 + k)} [${Array(10).fill(`*${String.fromCharCode(96 + k)}`).join(",")}]`);
    expect(parseErrors(`router_settings:\n  bomb:\n${bomb.map((l) => `    ${l}`).join("\n")}\n`)).toEqual([
      "YAML syntax error: aliases repeat one anchor more than 10000 times (nested repeats multiplied), which the parser refuses as a file that expands without bound",
    ]);
  });
});

describe("errors found when the registry is built", () => {
  test("unknown provider names the model field and the provider", async () => {
    const errors = await startErrors({ model_list: [{ model_name: "x", svc_params: { model: "foo/bar" } }] });
    expect(errors).toHaveLength(1);
    expect(errors[0]).toStartWith("/model_list/0/svc_params/model: unknown provider 'foo'");
    expect(errors[0]).toContain("mock");
  });

  test("a duplicate model_info.id names the second entry and the first one", async () => {
    const errors = await startErrors({
      model_list: [
        { model_name: "a", svc_params: { model: "mock/a" }, model_info: { id: "same-id" } },
        { model_name: "b", svc_params: { model: "mock/b" }, model_info: { id: "other" } },
        { model_name: "c", svc_params: { model: "mock/c" }, model_info: { id: "same-id" } },
      ],
    });
    expect(errors).toEqual(["/model_list/2/model_info/id: 'same-id' is already used by /model_list/0"]);
  });

  test("two equal entries without model_info.id are named by the entry (they have no model_info to point at)", async () => {
    const entry = { model_name: "a", svc_params: { model: "mock/a" } };
    const errors = await startErrors({ model_list: [entry, { model_name: "b", svc_params: { model: "mock/b" } }, entry] });
    expect(errors).toEqual(["/model_list/2: the same deployment as /model_list/0 (same model_name and svc_params, so the same derived id): give one of them a model_info.id"]);
  });

  test("hosted_vllm without api_base is rejected with the path; with api_base it loads", async () => {
    const errors = await startErrors({ model_list: [{ model_name: "v", svc_params: { model: "hosted_vllm/llama" } }] });
    expect(errors).toEqual(["/model_list/0/svc_params: provider hosted_vllm needs svc_params.api_base"]);

    const { live } = await startOk({ model_list: [{ model_name: "v", svc_params: { model: "hosted_vllm/llama", api_base: "http://127.0.0.1:9/v1/" } }] });
    try {
      expect(live.current.models.resolve("v")?.[0]?.apiBase).toBe("http://127.0.0.1:9/v1");
    } finally {
      await live.close();
    }
  });

  test("vertex_credentials that names no readable file is not quoted in the error (base64 of the key, the key's JSON in quotes)", async () => {
    const key = JSON.stringify({ type: "service_account", client_email: "a@b.iam.gserviceaccount.com", private_key: "PRIVATE-KEY-SECRET-VALUE" });
    const vertex = (credentials: string) => ({ model_list: [{ model_name: "vx", svc_params: { model: "vertex_ai/gemini-2.5-pro", vertex_project: "p", vertex_credentials: credentials } }] });
    const base64 = Buffer.from(key).toString("base64");
    const [fromBase64] = await startErrors(vertex(base64));
    expect(fromBase64).toStartWith("/model_list/0/svc_params: provider vertex_ai: svc_params.vertex_credentials names a file that cannot be read (ENOENT;");
    expect(fromBase64).toContain(`a value of ${base64.length} characters: it looks like base64 text`);
    expect(fromBase64).not.toContain(base64.slice(0, 16));
    const [quoted] = await startErrors(vertex(`'${key}'`));
    expect(quoted).toContain("it looks like JSON in quotes");
    expect(quoted).not.toContain("PRIVATE-KEY-SECRET-VALUE");

    // A reload refused for it logs the same message.
    const { live, log } = await startOk({ model_list: [] });
    try {
      writeFileSync(live.configPath, configText(vertex(`"${key}"`)));
      const r = await live.reload("test");
      expect(r.ok).toBe(false);
      expect(JSON.stringify(r)).not.toContain("PRIVATE-KEY-SECRET-VALUE");
      expect(JSON.stringify(log.lines)).not.toContain("PRIVATE-KEY-SECRET-VALUE");
      expect(JSON.stringify(log.lines)).toContain("it looks like JSON in quotes");
    } finally {
      await live.close();
    }
  });

  test("an unknown callback name is rejected with its list index, in every callback list", async () => {
    const errors = await startErrors({
      model_list: [],
      svc_settings: { callbacks: ["nope"], success_callback: [], failure_callback: ["also-nope"] },
    });
    expect(errors).toHaveLength(2);
    expect(errors[0]).toStartWith("/svc_settings/callbacks/0: no plugin provides a callback named 'nope'");
    expect(errors[1]).toStartWith("/svc_settings/failure_callback/0: no plugin provides a callback named 'also-nope'");
  });

  test("registry errors of different kinds in one file are all listed together", async () => {
    const errors = await startErrors({
      model_list: [
        { model_name: "x", svc_params: { model: "foo/bar" } },
        { model_name: "v", svc_params: { model: "hosted_vllm/llama" } },
        { model_name: "a", svc_params: { model: "mock/a" }, model_info: { id: "dup" } },
        { model_name: "b", svc_params: { model: "mock/b" }, model_info: { id: "dup" } },
      ],
      svc_settings: { success_callback: ["ghost"] },
    });
    expect([...pathsOf(errors)]).toEqual([
      "/model_list/0/svc_params/model",
      "/model_list/1/svc_params",
      "/model_list/3/model_info/id",
      "/svc_settings/success_callback/0",
    ]);
  });
});

describe("every problem of a file in one list", () => {
  /** Schema errors and errors only the registry build finds, mixed. */
  const MIXED = {
    model_list: [
      { model_name: "a", svc_params: { model: "mock/a", timeout: "fast" } },
      { model_name: "b", svc_params: { model: "nosuch/b" } },
      { model_name: "c", svc_params: { model: "mock/c" }, model_info: { id: "same" } },
      { model_name: "d", svc_params: { model: "mock/d" }, model_info: { id: "same" } },
    ],
    svc_settings: { callbacks: ["ghost"], request_timeout: -1 },
    general_settings: {
      pass_through_endpoints: [
        { path: "/p", target: "http://127.0.0.1:9" },
        { path: "/q", target: "http://127.0.0.1:9", timeout: "slow" },
        { path: "/p", target: "http://127.0.0.1:9" },
      ],
    },
  };
  const PATHS = [
    "/model_list/0/svc_params/timeout",
    "/svc_settings/request_timeout",
    "/general_settings/pass_through_endpoints/1/timeout",
    "/model_list/1/svc_params/model",
    "/model_list/3/model_info/id",
    "/general_settings/pass_through_endpoints/2/id",
    "/general_settings/pass_through_endpoints/2/path",
    "/svc_settings/callbacks/0",
  ];

  test("a start lists the schema's errors and the registry's (unknown provider and callback, duplicate ids and paths) together", async () => {
    const errors = await startErrors(MIXED);
    expect(errors.map((e) => e.slice(0, e.indexOf(": ")))).toEqual(PATHS);
    expect(errors).toContain("/model_list/3/model_info/id: 'same' is already used by /model_list/2");
    expect(errors).toContain("/general_settings/pass_through_endpoints/2/path: '/p' (GET, POST, PUT, PATCH, DELETE) is already served by /general_settings/pass_through_endpoints/0");
  });

  test("a reload lists the same, and the config that serves is untouched", async () => {
    const { live } = await startOk({ model_list: [{ model_name: "ok", svc_params: { model: "mock/ok" } }] });
    try {
      writeFileSync(live.configPath, configText(MIXED));
      const r = await live.reload("test");
      expect(r.ok).toBe(false);
      expect(r.ok ? [] : r.errors.map((e) => e.slice(0, e.indexOf(": ")))).toEqual(PATHS);
      expect(live.current.models.resolve("ok")).toHaveLength(1);
    } finally {
      await live.close();
    }
  });

  test("plugins that cannot be read leave only the schema's errors (what they provide cannot be checked)", async () => {
    const errors = await startErrors({ ...MIXED, plugins: [{ path: 42 }] });
    expect(errors.map((e) => e.slice(0, e.indexOf(": ")))).toEqual(["/model_list/0/svc_params/timeout", "/svc_settings/request_timeout", "/general_settings/pass_through_endpoints/1/timeout", "/plugins/0/path"]);
  });
});

describe("os.environ/NAME", () => {
  const SET = "GW_CONFIG_TEST_SET_VAR";
  const UNSET = "GW_CONFIG_TEST_UNSET_VAR";
  afterAll(() => {
    delete process.env[SET];
    delete process.env[UNSET];
  });

  test("a set variable is substituted into the field", async () => {
    process.env[SET] = "from the environment";
    delete process.env[UNSET];
    const r = parseConfig(stringify({ model_list: [{ model_name: "m", svc_params: { model: "mock/m", mock_response: `os.environ/${SET}` } }] }));
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.config.model_list[0]?.svc_params.mock_response).toBe("from the environment");
    expect(r.warnings).toEqual([]);
  });

  test("an unset variable is a warning naming the path and variable, and the gateway still starts", async () => {
    delete process.env[UNSET];
    const config = { model_list: [{ model_name: "m", svc_params: { model: "openai/gpt-4o", api_key: `os.environ/${UNSET}` } }] };
    const r = parseConfig(stringify(config));
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.warnings).toEqual([`/model_list/0/svc_params/api_key: environment variable ${UNSET} is not set`]);
    expect(r.config.model_list[0]?.svc_params.api_key).toBeUndefined();

    const { live, log } = await startOk(config);
    try {
      expect(live.current.models.resolve("m")).toHaveLength(1);
      const warning = log.lines.find((l) => l.level === "warn" && l.msg.includes(UNSET));
      expect(warning?.msg).toContain("/model_list/0/svc_params/api_key");
    } finally {
      await live.close();
    }
  });

  test("an empty variable counts as unset: an optional field is dropped with a warning, a required one is missing, environment_variables fills it", async () => {
    process.env[SET] = "";
    try {
      const r = parseConfig(stringify({ model_list: [{ model_name: "m", svc_params: { model: "openai/gpt-4o", api_key: `os.environ/${SET}` } }], general_settings: { master_key: `os.environ/${SET}` } }));
      if (!r.ok) throw new Error(r.errors.join("\n"));
      expect(r.config.general_settings?.master_key).toBeUndefined();
      expect(r.warnings).toEqual([`/model_list/0/svc_params/api_key: environment variable ${SET} is empty`, `/general_settings/master_key: environment variable ${SET} is empty`]);

      const required = parseConfig(stringify({ model_list: [{ model_name: "m", svc_params: { model: `os.environ/${SET}` } }] }));
      if (required.ok) throw new Error("accepted");
      expect(required.errors).toContain(`/model_list/0/svc_params/model: environment variable ${SET} is empty`);
      expect(required.errors.some((e) => e.startsWith("/model_list/0/svc_params/model: Expected required property"))).toBe(true);

      const filled = parseConfig(stringify({ environment_variables: { [SET]: "sk-from-file" }, general_settings: { master_key: `os.environ/${SET}` } }));
      if (!filled.ok) throw new Error(filled.errors.join("\n"));
      expect(filled.config.general_settings?.master_key).toBe("sk-from-file");
      expect(filled.env).toEqual({ [SET]: "sk-from-file" });
      // Set in the process as for a variable the environment lacks (providers read their keys there).
      const { live } = await startOk({ environment_variables: { [SET]: "sk-from-file" } });
      await live.close();
      expect(process.env[SET]).toBe("sk-from-file");
    } finally {
      delete process.env[SET];
    }
  });

  test("an unset variable on a required field: the refusal lists it beside the missing field, so the file's text explains itself", () => {
    delete process.env[UNSET];
    const r = parseConfig(stringify({ model_list: [{ model_name: "m", svc_params: { model: `os.environ/${UNSET}` } }] }));
    if (r.ok) throw new Error("accepted");
    expect(r.errors).toContain(`/model_list/0/svc_params/model: environment variable ${UNSET} is not set`);
    expect(r.errors.some((e) => e.startsWith("/model_list/0/svc_params/model: Expected required property"))).toBe(true);
  });

  test("environment_variables may be numbers and true/false, set as their text as LiteLLM sets them; a list or mapping is refused", async () => {
    const names = ["GW_CONFIG_TEST_NUM", "GW_CONFIG_TEST_FLOAT", "GW_CONFIG_TEST_FLAG", "GW_CONFIG_TEST_OFF"];
    for (const n of names) delete process.env[n];
    try {
      const { live } = await startOk("environment_variables: { GW_CONFIG_TEST_NUM: 4, GW_CONFIG_TEST_FLOAT: 1.5, GW_CONFIG_TEST_FLAG: true, GW_CONFIG_TEST_OFF: false }\nmodel_list: []\n");
      await live.close();
      expect(names.map((n) => process.env[n])).toEqual(["4", "1.5", "True", "False"]);
    } finally {
      for (const n of names) delete process.env[n];
    }
    expect(parseErrors("environment_variables: { A: [1], B: { c: 1 } }\n")).toEqual([
      "/environment_variables/A: Expected union value (expected text, a number or true/false)",
      "/environment_variables/B: Expected union value (expected text, a number or true/false)",
    ]);
  });

  test("environment_variables in the file provide values for os.environ/ references", () => {
    delete process.env[UNSET];
    try {
      const r = parseConfig(
        stringify({
          environment_variables: { [UNSET]: "sk-from-file" },
          general_settings: { master_key: `os.environ/${UNSET}` },
        }),
      );
      if (!r.ok) throw new Error(r.errors.join("\n"));
      expect(r.config.general_settings?.master_key).toBe("sk-from-file");
    } finally {
      delete process.env[UNSET];
    }
  });
});

describe("os.environ/NAME in pass-through headers", () => {
  const NAME = "GW_CONFIG_TEST_PT_VAR";
  afterAll(() => {
    delete process.env[NAME];
  });
  const config = (value: string) => ({ general_settings: { pass_through_endpoints: [{ path: "/x", target: "http://127.0.0.1:9", headers: { Authorization: value } }] } });

  test("an unset variable is an error whether it is the whole value or part of it (it was dropped with a warning when whole)", async () => {
    delete process.env[NAME];
    const error = `/general_settings/pass_through_endpoints/0/headers/Authorization: environment variable ${NAME} is not set`;
    expect(await startErrors(config(`os.environ/${NAME}`))).toEqual([error]);
    expect(await startErrors(config(`Bearer os.environ/${NAME}`))).toEqual([error]);
    // An empty one too: it would send `Bearer ` with no token.
    process.env[NAME] = "";
    expect(await startErrors(config(`Bearer os.environ/${NAME}`))).toEqual([error.replace("is not set", "is empty")]);
  });

  test("a variable that puts a line break inside the value is refused; one at its end is stripped as HTTP does", async () => {
    process.env[NAME] = "token\nInjected: 1";
    expect(await startErrors(config(`Bearer os.environ/${NAME}`))).toEqual([
      `/general_settings/pass_through_endpoints/0/headers/Authorization: with ${NAME} read in, the value has a line break inside, a NUL or a character beyond Latin-1, which a header cannot carry`,
    ]);
    process.env[NAME] = "token-from-a-file\n";
    const { live } = await startOk(config(`os.environ/${NAME}`));
    try {
      expect(live.current.passThrough.endpoints[0]?.headers.Authorization).toBe("token-from-a-file\n");
    } finally {
      await live.close();
    }
  });
});

describe("gateway process with an invalid config", () => {
  test("refuses to start, exits non-zero and prints every error with its path", async () => {
    const gw = await spawnGateway(THREE_ERRORS, { waitForListen: false });
    const code = await gw.exited;
    // Output pipes may drain a moment after the exit.
    for (let i = 0; i < 40 && !THREE_PATHS.every((p) => gw.output().includes(p)); i++) await Bun.sleep(50);
    const out = gw.output();
    await gw.stop();
    expect(code).not.toBe(0);
    expect(out).toContain("refusing to start");
    for (const p of THREE_PATHS) expect(out).toContain(`${p}: `);
    expect(out).not.toContain("listening on");
  });
});
