import { Type } from "@sinclair/typebox";
import { definePlugin } from "../core/contract.ts";
import { azureProvider } from "./azure/index.ts";
import { bedrockProvider } from "./bedrock/index.ts";
import { cohereProvider } from "./cohere/index.ts";
import { mockProvider } from "./mock/index.ts";
import { ollamaProvider } from "./ollama/index.ts";
import { openAICompatibleAdapter } from "./openai-compatible/adapter.ts";
import { OPENAI_COMPATIBLE_PROVIDERS } from "./openai-compatible/table.ts";

/** Every provider shipped with the gateway, registered through the same contract as a third party's. */
export default definePlugin({
  name: "builtin-providers",
  config: Type.Object({}),
  setup: () => ({ providers: [openAICompatibleAdapter(OPENAI_COMPATIBLE_PROVIDERS), mockProvider, bedrockProvider, azureProvider, cohereProvider, ollamaProvider] }),
});
