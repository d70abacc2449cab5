// The model table: how a requested model name finds its deployments (exact groups, then the most
// specific wildcard), and deployment ids that survive a rebuild of the same config.
import { describe, expect, test } from "bun:test";
import type { ModelEntry } from "../../core/config/schema.ts";
import { deploymentId, ModelTable, toDeployment } from "../../core/models.ts";
import { buildSnapshot } from "../../core/snapshot.ts";
import { MASTER_KEY, memoryLogger, startTestGateway } from "../harness/gateway.ts";

function table(entries: ModelEntry[]): ModelTable {
  return new ModelTable(entries.map((entry) => ({ entry, deployment: toDeployment(entry) })));
}

const entry = (model_name: string, model: string, id?: string, extra: Record<string, unknown> = {}): ModelEntry => ({
  model_name,
  svc_params: { model, ...extra },
  ...(id ? { model_info: { id } } : {}),
});

describe("resolve", () => {
  const models = table([
    entry("*", "openai/*", "catch-all"),
    entry("openai/*", "openai/*", "openai-wild"),
    entry("openai/gpt-4o", "azure/my-gpt4o-deployment", "exact"),
    entry("claude-*-latest", "anthropic/claude-*-latest", "affix"),
  ]);

  test("an exact group beats a matching wildcard", () => {
    const ds = models.resolve("openai/gpt-4o");
    expect(ds?.map((d) => d.id)).toEqual(["exact"]);
    expect(ds?.[0]).toMatchObject({ provider: "azure", upstreamModel: "my-gpt4o-deployment", modelName: "openai/gpt-4o" });
  });

  test("the most specific wildcard wins: `openai/*` over `*`", () => {
    const ds = models.resolve("openai/gpt-x");
    expect(ds?.map((d) => d.id)).toEqual(["openai-wild"]);
    expect(ds?.[0]).toMatchObject({ provider: "openai", upstreamModel: "gpt-x", modelName: "openai/gpt-x" });
    // Order in the config does not matter.
    const reversed = table([entry("openai/*", "openai/*", "openai-wild"), entry("*", "openai/*", "catch-all")]);
    expect(reversed.resolve("openai/gpt-x")?.map((d) => d.id)).toEqual(["openai-wild"]);
    expect(models.wildcards.map((w) => w.pattern)).toEqual(["claude-*-latest", "openai/*", "*"]);
  });

  test("`*` → `openai/*` maps any name to the same upstream model", () => {
    const ds = models.resolve("gpt-x");
    expect(ds?.map((d) => d.id)).toEqual(["catch-all"]);
    expect(ds?.[0]).toMatchObject({ provider: "openai", upstreamModel: "gpt-x", modelName: "gpt-x" });
  });

  test("a wildcard with prefix and suffix substitutes the middle", () => {
    expect(models.resolve("claude-3-5-sonnet-latest")?.[0]).toMatchObject({ id: "affix", provider: "anthropic", upstreamModel: "claude-3-5-sonnet-latest" });
  });

  test("repeated wildcard lookups return the same deployments", () => {
    expect(models.resolve("gpt-y")).toBe(models.resolve("gpt-y")!);
  });

  test("a wildcard's `*` stands for at least one character", () => {
    const t = table([entry("openai/*", "openai/*"), entry("claude-*-latest", "anthropic/claude-*-latest")]);
    expect(t.resolve("openai/")).toBeUndefined();
    expect(t.resolve("claude--latest")).toBeUndefined();
    expect(t.resolve("openai/x")?.[0]?.upstreamModel).toBe("x");
  });

  test("nothing matches without a catch-all", () => {
    const t = table([entry("openai/*", "openai/*"), entry("a", "openai/a")]);
    expect(t.resolve("gpt-x")).toBeUndefined();
  });

  test("several entries with one model_name form a group", () => {
    const t = table([entry("g", "openai/a", "g-1"), entry("other", "openai/o"), entry("g", "groq/b", "g-2")]);
    expect(t.resolve("g")?.map((d) => d.id)).toEqual(["g-1", "g-2"]);
    expect(t.groups.size).toBe(2);
    expect(t.findById("g-2")?.deployment.provider).toBe("groq");
    expect(t.findById("missing")).toBeUndefined();
  });
});

describe("deployment ids", () => {
  test("model_info.id is used when given", () => {
    expect(toDeployment(entry("a", "openai/x", "my-id")).id).toBe("my-id");
  });

  test("without model_info.id the id is a stable hash: same entry → same id, whatever the key order", () => {
    const a: ModelEntry = { model_name: "a", svc_params: { model: "openai/x", api_base: "http://h/v1", rpm: 5 } };
    const b: ModelEntry = { model_name: "a", svc_params: { rpm: 5, api_base: "http://h/v1", model: "openai/x" } };
    expect(deploymentId(a)).toMatch(/^[0-9a-f]{64}$/);
    expect(deploymentId(a)).toBe(deploymentId(b));
    expect(deploymentId(a)).toBe(deploymentId(structuredClone(a)));
    // Anything that changes the deployment changes the id.
    expect(deploymentId({ ...a, model_name: "b" })).not.toBe(deploymentId(a));
    expect(deploymentId({ ...a, svc_params: { ...a.svc_params, rpm: 6 } })).not.toBe(deploymentId(a));
  });

  test("ids are equal across two snapshot builds of the same config", async () => {
    const config = {
      model_list: [
        { model_name: "g", svc_params: { model: "openai/a", api_base: "http://one/v1", api_key: "k" } },
        { model_name: "g", svc_params: { model: "openai/a", api_base: "http://two/v1", api_key: "k" } },
        { model_name: "openai/*", svc_params: { model: "openai/*", api_base: "http://one/v1" } },
      ],
    };
    const ids = async () => {
      const s = await buildSnapshot(structuredClone(config), "/nonexistent/config.yaml", 1, memoryLogger());
      return s.models.entries.map((e) => e.deployment.id);
    };
    const first = await ids();
    expect(new Set(first).size).toBe(3);
    expect(await ids()).toEqual(first);
  });
});

describe("routing within a group", () => {
  test("over many calls both deployments of a group get picked", async () => {
    const gw = await startTestGateway({
      model_list: [
        { model_name: "pair", svc_params: { model: "mock/chat" }, model_info: { id: "pair-1" } },
        { model_name: "pair", svc_params: { model: "mock/chat" }, model_info: { id: "pair-2" } },
      ],
      general_settings: { master_key: MASTER_KEY },
    });
    try {
      const picked = new Map<string, number>();
      for (let i = 0; i < 60; i++) {
        const res = await fetch(`${gw.baseURL}/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "pair", messages: [{ role: "user", content: "hi" }] }),
        });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        const id = res.headers.get("x-svc-model-id")!;
        picked.set(id, (picked.get(id) ?? 0) + 1);
      }
      // Random choice: the chance one of them is never picked in 60 calls is 2 × 2^-60.
      expect([...picked.keys()].sort()).toEqual(["pair-1", "pair-2"]);
    } finally {
      await gw.stop();
    }
  });
});
