import { Type } from "@sinclair/typebox";
import { definePlugin } from "../core/contract.ts";
import { bedrockProvider } from "./bedrock/index.ts";
import { anthropicProvider } from "./anthropic/index.ts";
import { azureProvider } from "./azure/index.ts";
import { cohereProvider } from "./cohere/index.ts";
import { geminiProvider } from "./gemini/index.ts";
import { mockProvider } from "./mock/index.ts";
import { ollamaProvider } from "./ollama/index.ts";
import { openAICompatibleAdapter } from "./openai-compatible/adapter.ts";
import { OPENAI_COMPATIBLE_PROVIDERS } from "./openai-compatible/table.ts";
import { vertexProvider } from "./vertex/index.ts";

/** Every provider shipped with the gateway, registered through the same contract as a third party's. */
export default definePlugin({
  name: "builtin-providers",
  config: Type.Object({}),
  setup: () => ({ providers: [openAICompatibleAdapter(OPENAI_COMPATIBLE_PROVIDERS), mockProvider, anthropicProvider, bedrockProvider, azureProvider, cohereProvider, ollamaProvider, geminiProvider, vertexProvider] }),
});
