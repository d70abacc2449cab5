// Every OpenAI-compatible provider, as a user configures it: `model: <id>/some-model` with only the
// provider's key variable set in the environment (and `api_base` where the provider has no public
// one). The real adapter resolves the deployment and builds the chat call; the URL and the
// credential header must be the provider's documented ones, written out here by hand.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Deployment } from "../../core/contract.ts";
import { openAICompatibleAdapter } from "../../providers/openai-compatible/adapter.ts";
import { OPENAI_COMPATIBLE_PROVIDERS } from "../../providers/openai-compatible/table.ts";

interface Case {
  id: string;
  /** The environment variable holding the key; undefined for keyless local servers. */
  keyEnv: string | undefined;
  url: string;
  /** For providers without a public base URL. */
  apiBase?: string;
  /** The header carrying the key, when it is not `Authorization: Bearer`. */
  authHeader?: string;
}

const CASES: Case[] = [
  { id: "openai", keyEnv: "OPENAI_API_KEY", url: "https://api.openai.com/v1/chat/completions" },
  { id: "groq", keyEnv: "GROQ_API_KEY", url: "https://api.groq.com/openai/v1/chat/completions" },
  { id: "mistral", keyEnv: "MISTRAL_API_KEY", url: "https://api.mistral.ai/v1/chat/completions" },
  { id: "codestral", keyEnv: "CODESTRAL_API_KEY", url: "https://codestral.mistral.ai/v1/chat/completions" },
  { id: "deepseek", keyEnv: "DEEPSEEK_API_KEY", url: "https://api.deepseek.com/v1/chat/completions" },
  { id: "together_ai", keyEnv: "TOGETHERAI_API_KEY", url: "https://api.together.xyz/v1/chat/completions" },
  { id: "fireworks_ai", keyEnv: "FIREWORKS_AI_API_KEY", url: "https://api.fireworks.ai/inference/v1/chat/completions" },
  { id: "openrouter", keyEnv: "OPENROUTER_API_KEY", url: "https://openrouter.ai/api/v1/chat/completions" },
  { id: "xai", keyEnv: "XAI_API_KEY", url: "https://api.x.ai/v1/chat/completions" },
  { id: "perplexity", keyEnv: "PERPLEXITYAI_API_KEY", url: "https://api.perplexity.ai/chat/completions" },
  { id: "deepinfra", keyEnv: "DEEPINFRA_API_KEY", url: "https://api.deepinfra.com/v1/openai/chat/completions" },
  { id: "cerebras", keyEnv: "CEREBRAS_API_KEY", url: "https://api.cerebras.ai/v1/chat/completions" },
  { id: "sambanova", keyEnv: "SAMBANOVA_API_KEY", url: "https://api.sambanova.ai/v1/chat/completions" },
  { id: "nvidia_nim", keyEnv: "NVIDIA_NIM_API_KEY", url: "https://integrate.api.nvidia.com/v1/chat/completions" },
  { id: "github", keyEnv: "GITHUB_API_KEY", url: "https://models.inference.ai.azure.com/chat/completions" },
  { id: "nebius", keyEnv: "NEBIUS_API_KEY", url: "https://api.studio.nebius.ai/v1/chat/completions" },
  { id: "novita", keyEnv: "NOVITA_API_KEY", url: "https://api.novita.ai/v3/openai/chat/completions" },
  { id: "hyperbolic", keyEnv: "HYPERBOLIC_API_KEY", url: "https://api.hyperbolic.xyz/v1/chat/completions" },
  { id: "moonshot", keyEnv: "MOONSHOT_API_KEY", url: "https://api.moonshot.ai/v1/chat/completions" },
  { id: "dashscope", keyEnv: "DASHSCOPE_API_KEY", url: "https://dashscope-intl.aliyuncs.com/compatible-mode/v1/chat/completions" },
  { id: "volcengine", keyEnv: "VOLCENGINE_API_KEY", url: "https://ark.cn-beijing.volces.com/api/v3/chat/completions" },
  { id: "lambda_ai", keyEnv: "LAMBDA_API_KEY", url: "https://api.lambda.ai/v1/chat/completions" },
  { id: "featherless_ai", keyEnv: "FEATHERLESS_AI_API_KEY", url: "https://api.featherless.ai/v1/chat/completions" },
  { id: "friendliai", keyEnv: "FRIENDLI_TOKEN", url: "https://api.friendli.ai/serverless/v1/chat/completions" },
  { id: "nscale", keyEnv: "NSCALE_API_KEY", url: "https://inference.api.nscale.com/v1/chat/completions" },
  { id: "ai21", keyEnv: "AI21_API_KEY", url: "https://api.ai21.com/studio/v1/chat/completions" },
  { id: "huggingface", keyEnv: "HF_TOKEN", url: "https://router.huggingface.co/v1/chat/completions" },
  { id: "meta_llama", keyEnv: "LLAMA_API_KEY", url: "https://api.llama.com/compat/v1/chat/completions" },
  { id: "vercel_ai_gateway", keyEnv: "VERCEL_AI_GATEWAY_API_KEY", url: "https://ai-gateway.vercel.sh/v1/chat/completions" },
  { id: "zai", keyEnv: "ZAI_API_KEY", url: "https://api.z.ai/api/paas/v4/chat/completions" },
  { id: "wandb", keyEnv: "WANDB_API_KEY", url: "https://api.inference.wandb.ai/v1/chat/completions" },
  { id: "baseten", keyEnv: "BASETEN_API_KEY", url: "https://inference.baseten.co/v1/chat/completions" },
  { id: "lm_studio", keyEnv: "LM_STUDIO_API_KEY", url: "http://localhost:1234/v1/chat/completions" },
  { id: "llamafile", keyEnv: undefined, url: "http://localhost:8080/v1/chat/completions" },
  { id: "xinference", keyEnv: "XINFERENCE_API_KEY", url: "http://127.0.0.1:9997/v1/chat/completions" },
  { id: "hosted_vllm", keyEnv: "HOSTED_VLLM_API_KEY", apiBase: "http://vllm.internal:8000/v1", url: "http://vllm.internal:8000/v1/chat/completions" },
  {
    id: "databricks",
    keyEnv: "DATABRICKS_API_KEY",
    apiBase: "https://adb-1234567890123456.7.azuredatabricks.net/serving-endpoints",
    url: "https://adb-1234567890123456.7.azuredatabricks.net/serving-endpoints/chat/completions",
  },
  {
    id: "cloudflare",
    keyEnv: "CLOUDFLARE_API_KEY",
    apiBase: "https://api.cloudflare.com/client/v4/accounts/0123abcd/ai/v1",
    url: "https://api.cloudflare.com/client/v4/accounts/0123abcd/ai/v1/chat/completions",
  },
  {
    id: "azure_ai",
    keyEnv: "AZURE_AI_API_KEY",
    apiBase: "https://Mistral-large-abcd.eastus2.models.ai.azure.com/v1",
    url: "https://Mistral-large-abcd.eastus2.models.ai.azure.com/v1/chat/completions",
    authHeader: "api-key",
  },
  { id: "openai_like", keyEnv: undefined, apiBase: "http://my-server:9000/v1/", url: "http://my-server:9000/v1/chat/completions" },
  { id: "custom_openai", keyEnv: undefined, apiBase: "https://llm.example.com/openai", url: "https://llm.example.com/openai/chat/completions" },
];

const adapter = openAICompatibleAdapter(OPENAI_COMPATIBLE_PROVIDERS);
const KEY_VARS = CASES.flatMap((c) => (c.keyEnv ? [c.keyEnv] : []));
const saved = new Map(KEY_VARS.map((k) => [k, process.env[k]]));

beforeAll(() => {
  for (const k of KEY_VARS) delete process.env[k];
});
afterAll(() => {
  for (const [k, v] of saved) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
});

test("every OpenAI-compatible provider resolves to its documented URL and credential header, from its own key variable only", () => {
  // The table and this list name the same providers: a new row needs its case here.
  expect(CASES.map((c) => c.id).sort()).toEqual(OPENAI_COMPATIBLE_PROVIDERS.map((r) => r.id).sort());
  expect(CASES.filter((c) => c.id !== "openai_like" && c.id !== "custom_openai").length).toBeGreaterThanOrEqual(35);

  for (const c of CASES) {
    const key = `key-for-${c.id}`;
    if (c.keyEnv) process.env[c.keyEnv] = key;
    try {
      const base: Deployment = { id: `dep-${c.id}`, modelName: "m", provider: c.id, upstreamModel: "some-model", apiBase: c.apiBase, options: {}, info: {} };
      const d = adapter.resolve!(base);
      if (typeof d === "string") throw new Error(`${c.id}: ${d}`);
      const call = adapter.endpoints.chat!.request({ model: "m", messages: [{ role: "user", content: "hi" }] }, d);
      expect({ id: c.id, url: call.url }).toEqual({ id: c.id, url: c.url });
      expect({ id: c.id, model: JSON.parse(call.body!).model }).toEqual({ id: c.id, model: "some-model" });
      const credentials = Object.fromEntries(Object.entries(call.headers).filter(([h]) => h === "authorization" || h === "api-key"));
      const expected = !c.keyEnv ? {} : c.authHeader ? { [c.authHeader]: key } : { authorization: `Bearer ${key}` };
      expect({ id: c.id, credentials }).toEqual({ id: c.id, credentials: expected });
    } finally {
      if (c.keyEnv) delete process.env[c.keyEnv];
    }
  }
});

test("providers without a public base URL refuse to load without api_base, naming it", () => {
  for (const id of ["hosted_vllm", "databricks", "cloudflare", "azure_ai", "openai_like", "custom_openai"]) {
    expect(adapter.resolve!({ id: "d", modelName: "m", provider: id, upstreamModel: "x", options: {}, info: {} })).toBe(`provider ${id} needs svc_params.api_base`);
  }
});
