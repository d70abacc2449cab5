/**
 * Every provider's wire mock at once, and one deployment of each in front of them: what the
 * randomized tests that go through every provider (streams, chat translation) start with.
 */
import { generateKeyPairSync } from "node:crypto";
import { type MockAnthropic, startMockAnthropic } from "../mock-upstream/anthropic.ts";
import { type MockAzure, startMockAzure } from "../mock-upstream/azure.ts";
import { type MockBedrock, startMockBedrock } from "../mock-upstream/bedrock.ts";
import { type MockCohere, startMockCohere } from "../mock-upstream/cohere.ts";
import { type MockGemini, startMockGemini } from "../mock-upstream/gemini.ts";
import { type MockOllama, startMockOllama } from "../mock-upstream/ollama.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

type Json = Record<string, unknown>;

export interface ProviderMocks {
  openai: MockOpenAI;
  azure: MockAzure;
  anthropic: MockAnthropic;
  gemini: MockGemini;
  bedrock: MockBedrock;
  cohere: MockCohere;
  ollama: MockOllama;
}

/** The upstream credentials the mocks take and the deployments send. */
export const UPSTREAM = {
  openaiKey: "sk-up-openai",
  azureKey: "azure-key",
  azureDeployment: "gpt-4o-prod",
  anthropicKey: "sk-ant-up",
  geminiKey: "AIza-up",
  awsRegion: "us-west-2",
  awsAccessKeyId: "AKIAIOSFODNN7EXAMPLE",
  awsSecretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
  cohereKey: "co-up",
  vertexProject: "acme",
  vertexLocation: "us-east5",
} as const;

export interface StartedProviderMocks {
  mocks: ProviderMocks;
  /** A service-account key the Gemini mock's token endpoint accepts, for `vertex_credentials`. */
  vertexCredentials: string;
  stop(): Promise<void>;
}

/** `contextChars`: how long a prompt the Cohere and Ollama mocks take before their context-window error. */
export async function startProviderMocks(opts: { serviceAccount: string; contextChars?: number }): Promise<StartedProviderMocks> {
  const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const context = opts.contextChars === undefined ? {} : { contextChars: opts.contextChars };
  const mocks: ProviderMocks = {
    openai: await startMockOpenAI({ apiKey: UPSTREAM.openaiKey }),
    azure: await startMockAzure({ apiKey: UPSTREAM.azureKey, deployments: { [UPSTREAM.azureDeployment]: "gpt-4o-2024-08-06" } }),
    anthropic: await startMockAnthropic({ apiKey: UPSTREAM.anthropicKey }),
    gemini: await startMockGemini({ apiKey: UPSTREAM.geminiKey, serviceAccounts: [{ email: opts.serviceAccount, publicKey: publicKey.export({ type: "spki", format: "pem" }) as string }] }),
    bedrock: await startMockBedrock({ region: UPSTREAM.awsRegion, credentials: { accessKeyId: UPSTREAM.awsAccessKeyId, secretAccessKey: UPSTREAM.awsSecretAccessKey } }),
    cohere: await startMockCohere({ apiKey: UPSTREAM.cohereKey, ...context }),
    ollama: await startMockOllama({ models: ["llama3.2:latest"], ...context }),
  };
  const vertexCredentials = JSON.stringify({
    type: "service_account",
    project_id: UPSTREAM.vertexProject,
    private_key_id: "1",
    private_key: privateKey.export({ type: "pkcs8", format: "pem" }),
    client_email: opts.serviceAccount,
    token_uri: mocks.gemini.tokenUrl,
  });
  return { mocks, vertexCredentials, stop: async () => void (await Promise.all(Object.values(mocks).map((m) => m.stop()))) };
}

/**
 * One deployment per provider (model_name = `openai`, `azure`, `anthropic`, `gemini`,
 * `vertex-gemini`, `vertex-claude`, `bedrock`, `cohere`, `ollama`; id `dep-<name>`), priced at
 * `prices`, each with `params` added to its svc_params.
 */
export function providerDeployments(started: StartedProviderMocks, prices: Json, params: Json = {}): Json[] {
  const { mocks: m, vertexCredentials } = started;
  const vertex = (model: string) => ({ model: `vertex_ai/${model}`, api_base: m.gemini.url, vertex_credentials: vertexCredentials, vertex_location: UPSTREAM.vertexLocation });
  const deployment = (name: string, svc: Json) => ({ model_name: name, svc_params: { ...params, ...svc }, model_info: { id: `dep-${name}`, ...prices } });
  return [
    deployment("openai", { model: "openai/gpt-4o", api_base: m.openai.url, api_key: UPSTREAM.openaiKey }),
    deployment("azure", { model: `azure/${UPSTREAM.azureDeployment}`, api_base: m.azure.url, api_key: UPSTREAM.azureKey }),
    deployment("anthropic", { model: "anthropic/claude-3-5-sonnet-20241022", api_base: m.anthropic.url, api_key: UPSTREAM.anthropicKey }),
    deployment("gemini", { model: "gemini/gemini-2.5-flash", api_base: m.gemini.url, api_key: UPSTREAM.geminiKey }),
    deployment("vertex-gemini", vertex("gemini-2.5-pro")),
    deployment("vertex-claude", vertex("claude-sonnet-4@20250514")),
    deployment("bedrock", {
      model: "bedrock/anthropic.claude-3-haiku-20240307-v1:0",
      api_base: m.bedrock.url,
      aws_region_name: UPSTREAM.awsRegion,
      aws_access_key_id: UPSTREAM.awsAccessKeyId,
      aws_secret_access_key: UPSTREAM.awsSecretAccessKey,
    }),
    deployment("cohere", { model: "cohere/command-a-03-2025", api_base: m.cohere.url, api_key: UPSTREAM.cohereKey }),
    deployment("ollama", { model: "ollama_chat/llama3.2", api_base: m.ollama.url }),
  ];
}
