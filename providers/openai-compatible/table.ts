/**
 * Where a provider's request body departs from OpenAI's. Such a provider refuses what it does not
 * know (Mistral: a 422 `extra_forbidden`), so the body is rewritten rather than passed through.
 */
export interface Dialect {
  /** It refuses `stream_options` and sends a stream's usage on its last chunk unasked: the option is never sent. */
  usageUnasked?: boolean;
  /** OpenAI request fields it names otherwise (`seed` → `random_seed`); the OpenAI field wins over one already in the native name. */
  renamed?: Readonly<Record<string, string>>;
  /**
   * OpenAI fields it refuses that only describe the caller (`user`, which the gateway records as
   * the end user): left out of the body rather than refused.
   */
  unused?: readonly string[];
  /** Every field it takes besides `model` and `messages`, by OpenAI's names where it renames them: others are the client's 400 (or dropped with `drop_params`), not its 422. */
  accepted?: readonly string[];
}

/**
 * Every provider that speaks OpenAI's wire format, as data: default base URL, the environment
 * variable that holds its key, and the header the key goes in when it is not
 * `Authorization: Bearer`. `apiBase: undefined` means the operator must set `api_base`.
 */
export interface OpenAICompatibleProvider {
  id: string;
  apiBase: string | undefined;
  apiKeyEnv: string | undefined;
  /** A header that takes the bare key (`api-key`); absent means `Authorization: Bearer <key>`. */
  authHeader?: string;
  dialect?: Dialect;
}

const p = (id: string, apiBase: string | undefined, apiKeyEnv: string | undefined, authHeader?: string): OpenAICompatibleProvider =>
  authHeader === undefined ? { id, apiBase, apiKeyEnv } : { id, apiBase, apiKeyEnv, authHeader };

/** Mistral's chat API (also Codestral's): its own names for the token limit and the seed, as LiteLLM's MistralConfig maps them. */
const MISTRAL: Dialect = {
  usageUnasked: true,
  renamed: { max_completion_tokens: "max_tokens", seed: "random_seed" },
  unused: ["user"],
  // Mistral's chat completion request (its OpenAPI), `random_seed`, `safe_prompt` and `prompt_mode` being its own.
  accepted: [
    ...["frequency_penalty", "max_completion_tokens", "max_tokens", "n", "parallel_tool_calls", "prediction", "presence_penalty", "response_format"],
    ...["seed", "stop", "temperature", "tool_choice", "tools", "top_p", "user", "random_seed", "safe_prompt", "prompt_mode"],
  ],
};

export const OPENAI_COMPATIBLE_PROVIDERS: readonly OpenAICompatibleProvider[] = [
  p("openai", "https://api.openai.com/v1", "OPENAI_API_KEY"),
  p("groq", "https://api.groq.com/openai/v1", "GROQ_API_KEY"),
  { ...p("mistral", "https://api.mistral.ai/v1", "MISTRAL_API_KEY"), dialect: MISTRAL },
  { ...p("codestral", "https://codestral.mistral.ai/v1", "CODESTRAL_API_KEY"), dialect: MISTRAL },
  p("deepseek", "https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
  p("together_ai", "https://api.together.xyz/v1", "TOGETHERAI_API_KEY"),
  p("fireworks_ai", "https://api.fireworks.ai/inference/v1", "FIREWORKS_AI_API_KEY"),
  p("openrouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
  p("xai", "https://api.x.ai/v1", "XAI_API_KEY"),
  p("perplexity", "https://api.perplexity.ai", "PERPLEXITYAI_API_KEY"),
  p("deepinfra", "https://api.deepinfra.com/v1/openai", "DEEPINFRA_API_KEY"),
  p("cerebras", "https://api.cerebras.ai/v1", "CEREBRAS_API_KEY"),
  p("sambanova", "https://api.sambanova.ai/v1", "SAMBANOVA_API_KEY"),
  p("nvidia_nim", "https://integrate.api.nvidia.com/v1", "NVIDIA_NIM_API_KEY"),
  p("github", "https://models.inference.ai.azure.com", "GITHUB_API_KEY"),
  p("nebius", "https://api.studio.nebius.ai/v1", "NEBIUS_API_KEY"),
  p("novita", "https://api.novita.ai/v3/openai", "NOVITA_API_KEY"),
  p("hyperbolic", "https://api.hyperbolic.xyz/v1", "HYPERBOLIC_API_KEY"),
  p("moonshot", "https://api.moonshot.ai/v1", "MOONSHOT_API_KEY"),
  p("dashscope", "https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "DASHSCOPE_API_KEY"),
  p("volcengine", "https://ark.cn-beijing.volces.com/api/v3", "VOLCENGINE_API_KEY"),
  p("lambda_ai", "https://api.lambda.ai/v1", "LAMBDA_API_KEY"),
  p("featherless_ai", "https://api.featherless.ai/v1", "FEATHERLESS_AI_API_KEY"),
  p("friendliai", "https://api.friendli.ai/serverless/v1", "FRIENDLI_TOKEN"),
  p("nscale", "https://inference.api.nscale.com/v1", "NSCALE_API_KEY"),
  p("ai21", "https://api.ai21.com/studio/v1", "AI21_API_KEY"),
  p("huggingface", "https://router.huggingface.co/v1", "HF_TOKEN"),
  p("meta_llama", "https://api.llama.com/compat/v1", "LLAMA_API_KEY"),
  p("vercel_ai_gateway", "https://ai-gateway.vercel.sh/v1", "VERCEL_AI_GATEWAY_API_KEY"),
  p("zai", "https://api.z.ai/api/paas/v4", "ZAI_API_KEY"),
  p("wandb", "https://api.inference.wandb.ai/v1", "WANDB_API_KEY"),
  p("baseten", "https://inference.baseten.co/v1", "BASETEN_API_KEY"),
  p("lm_studio", "http://localhost:1234/v1", "LM_STUDIO_API_KEY"),
  p("llamafile", "http://localhost:8080/v1", undefined),
  p("xinference", "http://127.0.0.1:9997/v1", "XINFERENCE_API_KEY"),
  p("hosted_vllm", undefined, "HOSTED_VLLM_API_KEY"),
  p("databricks", undefined, "DATABRICKS_API_KEY"),
  p("cloudflare", undefined, "CLOUDFLARE_API_KEY"),
  // Azure AI serverless endpoints (`https://<endpoint>.<region>.models.ai.azure.com/v1`) take Azure's `api-key` header.
  p("azure_ai", undefined, "AZURE_AI_API_KEY", "api-key"),
  p("openai_like", undefined, undefined),
  p("custom_openai", undefined, undefined),
];
