/**
 * `vertex_ai/<model>`: Google Cloud Vertex AI. Gemini models speak the same JSON as AI Studio (the
 * Gemini transforms are reused) at the `google` publisher's model URL; `claude-*` models are
 * Anthropic's, at the `anthropic` publisher (see claude.ts). Calls carry an OAuth bearer token from
 * the deployment's Google credentials (see credentials.ts, token.ts).
 *
 * svc_params: `vertex_project` (default: the key's `project_id`, VERTEXAI_PROJECT,
 * GOOGLE_CLOUD_PROJECT), `vertex_location` (default VERTEXAI_LOCATION, else us-central1),
 * `vertex_credentials`; `api_base` replaces the regional host, `api_version` the `v1` path segment.
 */
import type { Deployment, EndpointAdapter, ProviderAdapter } from "../../core/contract.ts";
import { GEMINI_EMBEDDING_PARAMS, predictEmbedBody, predictEmbedParts, predictEmbedResponse } from "../gemini/embeddings.ts";
import { joinEmbeddings } from "../shared/embedding-list.ts";
import { type GoogleModelApi, geminiChat, geminiCountTokens, googleCall } from "../gemini/endpoints.ts";
import { googleErrorKind, googleErrorMessage } from "../gemini/errors.ts";
import { claudeChat, claudeCountTokens, isAnthropicMessage, isClaude } from "./claude.ts";
import { loadCredentials } from "./credentials.ts";
import { dispatchChat, dispatchCountTokens } from "./dispatch.ts";
import { DEFAULT_LOCATION, publisherModelUrl, vertexHost } from "./location.ts";
import { accessToken, registerCredentials } from "./token.ts";

const str = (v: unknown): string | undefined => (typeof v === "string" && v !== "" ? v : undefined);

/** Gemini on Vertex: the `google` publisher; no key in the call (`authorize` adds the token). */
const vertexGemini: GoogleModelApi = {
  url: (d, method) => publisherModelUrl(d, "google", d.upstreamModel, method),
  auth: () => ({}),
};

const embeddings: EndpointAdapter<"embeddings"> = {
  request: (req, d) => googleCall(vertexGemini, d, "predict", predictEmbedBody(req, d)),
  response: predictEmbedResponse,
  // At most 250 texts per call; gemini-embedding-*: one.
  split: predictEmbedParts,
  join: joinEmbeddings,
  supportedParams: GEMINI_EMBEDDING_PARAMS,
};

/** The credential a deployment uses; throws (naming the setting, never its value) when it cannot be read. */
function credentialsOf(d: Deployment) {
  const creds = loadCredentials(d.options.vertex_credentials);
  if (typeof creds === "string") throw new Error(creds);
  return creds;
}

export const vertexProvider: ProviderAdapter = {
  ids: ["vertex_ai"],
  endpoints: {
    chat: dispatchChat(isClaude, isAnthropicMessage, geminiChat(vertexGemini) as EndpointAdapter<"chat", unknown>, claudeChat as EndpointAdapter<"chat", unknown>) as EndpointAdapter<"chat", unknown>,
    embeddings,
  },
  countTokens: dispatchCountTokens(isClaude, geminiCountTokens(vertexGemini, (body) => ({ contents: body.contents, systemInstruction: body.systemInstruction, tools: body.tools })), claudeCountTokens),
  errorMessage: googleErrorMessage,
  errorKind: googleErrorKind,
  resolve(d) {
    const creds = loadCredentials(d.options.vertex_credentials);
    if (typeof creds === "string") return `provider vertex_ai: ${creds}`;
    const project = str(d.options.vertex_project) ?? str(creds?.project_id) ?? str(process.env.VERTEXAI_PROJECT) ?? str(process.env.GOOGLE_CLOUD_PROJECT);
    if (!project) return "provider vertex_ai needs svc_params.vertex_project (or a service-account key with project_id, or VERTEXAI_PROJECT)";
    const location = str(d.options.vertex_location) ?? str(process.env.VERTEXAI_LOCATION) ?? DEFAULT_LOCATION;
    return {
      ...d,
      apiBase: (d.apiBase ?? vertexHost(location)).replace(/\/+$/, ""),
      options: { ...d.options, vertex_project: project, vertex_location: location },
      credentials: registerCredentials(creds),
    };
  },
  async authorize(call, d) {
    // Without the deployment's credentials (a client's own in their place), a client's key is its
    // Google access token, and no key is none: never a token of the gateway's Application Default Credentials.
    const id = str(d.credentials);
    const token = id === undefined ? d.apiKey : await accessToken(id, () => credentialsOf(d));
    return token ? { ...call, headers: { ...call.headers, authorization: `Bearer ${token}` } } : call;
  },
};
