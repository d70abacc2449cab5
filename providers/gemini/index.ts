/**
 * `gemini/<model>`: Google AI Studio (the Generative Language API), authenticated with an API key
 * (`svc_params.api_key`, else GEMINI_API_KEY) in the `x-goog-api-key` header.
 */
import type { Deployment, ProviderAdapter } from "../../core/contract.ts";
import { joinEmbeddings } from "../shared/embedding-list.ts";
import { batchEmbedBody, batchEmbedParts, batchEmbedResponse, GEMINI_EMBEDDING_PARAMS } from "./embeddings.ts";
import { type GoogleModelApi, geminiChat, geminiCountTokens, googleCall } from "./endpoints.ts";
import { googleErrorKind, googleErrorMessage } from "./errors.ts";

export const AI_STUDIO_BASE = "https://generativelanguage.googleapis.com";
const DEFAULT_VERSION = "v1beta";

/** `gemini-2.5-flash` → `models/gemini-2.5-flash`; a full resource name (`tunedModels/…`) stays as it is. */
export function modelResource(d: Deployment): string {
  return d.upstreamModel.includes("/") ? d.upstreamModel : `models/${d.upstreamModel}`;
}

/** `api_base` is the host (the API version follows it: `api_version`, default v1beta). */
const aiStudio: GoogleModelApi = {
  url: (d, method) => `${d.apiBase}/${d.apiVersion ?? DEFAULT_VERSION}/${modelResource(d)}:${method}`,
  auth: (d): Record<string, string> => (d.apiKey ? { "x-goog-api-key": d.apiKey } : {}),
};

export const geminiProvider: ProviderAdapter = {
  ids: ["gemini"],
  endpoints: {
    chat: geminiChat(aiStudio),
    embeddings: {
      request: (req, d) => googleCall(aiStudio, d, "batchEmbedContents", batchEmbedBody(req, d, modelResource(d))),
      response: batchEmbedResponse,
      // More than 100 texts: in batches of 100.
      split: batchEmbedParts,
      join: joinEmbeddings,
      supportedParams: GEMINI_EMBEDDING_PARAMS,
    },
  },
  countTokens: geminiCountTokens(aiStudio, (body, d) => ({ generateContentRequest: { model: modelResource(d), ...body } })),
  errorMessage: googleErrorMessage,
  errorKind: googleErrorKind,
  resolve: (d) => ({ ...d, apiBase: (d.apiBase ?? AI_STUDIO_BASE).replace(/\/+$/, ""), apiKey: d.apiKey ?? process.env.GEMINI_API_KEY }),
};
