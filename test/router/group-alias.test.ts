// router_settings.model_group_alias: a public name for a model group (LiteLLM's `{"gpt-4": "gpt-4o"}`,
// or `{model, hidden}`). Calls to the alias reach the group it names, for the master key and for
// keys whose models allow either name; /v1/models lists the alias unless it is hidden; a malformed
// map is refused with its path. Fallbacks are looked up under the name called (the alias), then
// its group, in routing and in /v1/models' metadata alike.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI, { AuthenticationError } from "openai";
import { stringify } from "yaml";
import { parseConfig } from "../../core/config/load.ts";
import { MASTER_KEY, requestOk, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { CONTEXT_ERROR, type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

let gw: TestGateway;

beforeAll(async () => {
  gw = await startTestGateway(
    {
      model_list: [
        { model_name: "gpt-4o", svc_params: { model: "mock/gpt-4o" }, model_info: { id: "dep-4o" } },
        { model_name: "gpt-b", svc_params: { model: "mock/gpt-b" }, model_info: { id: "dep-b" } },
      ],
      router_settings: { model_group_alias: { "gpt-4": "gpt-4o", "internal-name": { model: "gpt-b", hidden: true } } },
      general_settings: { master_key: MASTER_KEY },
    },
    { store: {} },
  );
}, 30_000);
afterAll(async () => {
  await gw?.stop();
});

const sdk = (apiKey: string) => new OpenAI({ baseURL: gw.baseURL, apiKey, maxRetries: 0 });

async function groupOf(apiKey: string, model: string): Promise<string | null> {
  const { response } = await sdk(apiKey).chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] }).withResponse();
  return response.headers.get("x-svc-model-group");
}

async function listed(apiKey: string): Promise<string[]> {
  const ids: string[] = [];
  for await (const m of sdk(apiKey).models.list()) ids.push(m.id);
  return ids.sort();
}

async function keyFor(models: string[]): Promise<string> {
  return (await requestOk<{ key: string }>(gw, "POST", "/key/generate", { models })).key;
}

describe("model_group_alias", () => {
  test("a call to the alias is answered by the group it names; a hidden alias is callable too", async () => {
    expect(await groupOf(MASTER_KEY, "gpt-4")).toBe("gpt-4o");
    expect(await groupOf(MASTER_KEY, "internal-name")).toBe("gpt-b");
  });

  test("/v1/models lists the alias, not the hidden one", async () => {
    expect(await listed(MASTER_KEY)).toEqual(["gpt-4", "gpt-4o", "gpt-b"]);
  });

  test("a key that may use the group may use its alias; one that lists only the alias may call it, not the group by name", async () => {
    const groupKey = await keyFor(["gpt-4o"]);
    expect(await groupOf(groupKey, "gpt-4")).toBe("gpt-4o");
    expect(await listed(groupKey)).toEqual(["gpt-4", "gpt-4o"]);

    const aliasKey = await keyFor(["gpt-4"]);
    expect(await groupOf(aliasKey, "gpt-4")).toBe("gpt-4o");
    expect(await listed(aliasKey)).toEqual(["gpt-4"]);
    await expect(groupOf(aliasKey, "gpt-4o")).rejects.toBeInstanceOf(AuthenticationError);

    const otherKey = await keyFor(["gpt-b"]);
    await expect(groupOf(otherKey, "gpt-4")).rejects.toBeInstanceOf(AuthenticationError);
    expect(await listed(otherKey)).toEqual(["gpt-b"]);
  });

  test("a malformed alias map is refused with its path", () => {
    const result = parseConfig(stringify({ router_settings: { model_group_alias: { a: 5, b: { model: "x", hiden: true } } } }));
    expect(result.ok).toBe(false);
    const errors = result.ok ? "" : result.errors.join("\n");
    expect(errors).toContain("/router_settings/model_group_alias/a");
    expect(errors).toContain("/router_settings/model_group_alias/b");
  });
});

describe("fallbacks of an alias", () => {
  let up: MockOpenAI;
  let g: TestGateway;
  beforeAll(async () => {
    up = await startMockOpenAI({ apiKey: "sk-up" });
    g = await startTestGateway(
      {
        model_list: ["gpt-4o", "backup", "backup2", "secret", "big"].map((name) => ({ model_name: name, svc_params: { model: `openai/${name}`, api_base: up.url, api_key: "sk-up" } })),
        router_settings: {
          num_retries: 0,
          model_group_alias: { "gpt-4": "gpt-4o", "gpt-4-turbo": "gpt-4o" },
          fallbacks: [{ "gpt-4": ["backup"] }, { "gpt-4o": ["backup2", "secret"] }],
        },
        general_settings: { master_key: MASTER_KEY },
      },
      { store: {} },
    );
  }, 30_000);
  afterAll(async () => {
    await g?.stop();
    await up?.stop();
  });

  /** The group that answered a call to `model` whose first upstream call fails with `fault`. */
  const answeredBy = async (model: string, fault: { status: number; body?: object }, extra: Record<string, unknown> = {}) => {
    up.fault({ kind: "status", ...fault });
    const res = await fetch(`${g.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], ...extra }),
    });
    await res.text();
    return [res.status, res.headers.get("x-svc-model-group")];
  };
  const metadata = async (apiKey: string, query: string) => {
    const res = await fetch(`${g.url}/v1/models?${query}`, { headers: { authorization: `Bearer ${apiKey}` } });
    const body = (await res.json()) as { data: { id: string; metadata?: { fallbacks: string[] } }[] };
    return Object.fromEntries(body.data.map((m) => [m.id, m.metadata?.fallbacks]));
  };

  test("a call to the alias falls back by the alias's list, else its group's; the request's context_window_fallback_dict by the alias too", async () => {
    expect(await answeredBy("gpt-4", { status: 500 })).toEqual([200, "backup"]);
    expect(await answeredBy("gpt-4-turbo", { status: 500 })).toEqual([200, "backup2"]);
    expect(await answeredBy("gpt-4o", { status: 500 })).toEqual([200, "backup2"]);
    expect(await answeredBy("gpt-4", { status: 400, body: CONTEXT_ERROR }, { context_window_fallback_dict: { "gpt-4": "big" } })).toEqual([200, "big"]);
  });

  test("/v1/models' metadata names the fallbacks routing would go to, those the caller may use (include_metadata=True too)", async () => {
    expect(await metadata(MASTER_KEY, "include_metadata=True")).toMatchObject({ "gpt-4": ["backup"], "gpt-4-turbo": ["backup2", "secret"], "gpt-4o": ["backup2", "secret"] });
    const key = (await requestOk<{ key: string }>(g, "POST", "/key/generate", { models: ["gpt-4o", "backup", "backup2"] })).key;
    expect(await metadata(key, "include_metadata=true")).toMatchObject({ "gpt-4": ["backup"], "gpt-4o": ["backup2"] });
  });
});
