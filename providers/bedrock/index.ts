/**
 * `bedrock/<model id>`: Amazon Bedrock's native Converse API for chat (streamed as AWS's binary
 * event stream), InvokeModel for Titan and Cohere embeddings, SigV4 or a Bedrock API key.
 */
import type { ChatRequest, Deployment, EmbeddingsRequest, EndpointAdapter, HttpCall, ProviderAdapter, WireJson } from "../../core/contract.ts";
import { upstreamErrorKind } from "../shared/error-kind.ts";
import { CONVERSE_PARAMS, converseBody } from "./converse-request.ts";
import { converseResponse } from "./converse-response.ts";
import { type ConverseStreamState, converseStream } from "./converse-stream.ts";
import { authorizeBedrock, resolveBedrock } from "./credentials.ts";
import { bedrockErrorMessage } from "./errors.ts";
import { joinEmbeddings } from "../shared/embedding-list.ts";
import { EMBEDDING_PARAMS, embeddingBody, embeddingParamsFor, embeddingParts, embeddingResponse } from "./embeddings.ts";

/** `bedrock/converse/<id>` names the API explicitly; Converse is the only chat API served. */
const modelId = (d: Deployment) => d.upstreamModel.replace(/^converse\//, "");

function call(d: Deployment, action: "converse" | "converse-stream" | "invoke", body: WireJson): HttpCall {
  const headers: Record<string, string> = {
    "content-type": "application/json",
    accept: action === "converse-stream" ? "application/vnd.amazon.eventstream" : "application/json",
    ...d.headers,
  };
  if (d.apiKey) headers.authorization = `Bearer ${d.apiKey}`;
  // Model ids hold `:` and ARNs hold `/`: one encoded path segment either way.
  return { url: `${d.apiBase}/model/${encodeURIComponent(modelId(d))}/${action}`, method: "POST", headers, body: JSON.stringify(body) };
}

const chat: EndpointAdapter<"chat", ConverseStreamState> = {
  request: (req, d) => call(d, req.stream ? "converse-stream" : "converse", converseBody(req, { ...d, upstreamModel: modelId(d) })),
  response: (body, req?: ChatRequest) => converseResponse(body, req),
  stream: converseStream(),
  supportedParams: CONVERSE_PARAMS,
};

const embeddings: EndpointAdapter<"embeddings"> = {
  request: (req, d) => call(d, "invoke", embeddingBody(req, { ...d, upstreamModel: modelId(d) })),
  response: (body, req?: EmbeddingsRequest, headers?: Headers) => embeddingResponse(body, req, headers),
  // Titan: one call per text.
  split: (req, d) => embeddingParts(req, modelId(d)),
  join: joinEmbeddings,
  supportedParams: EMBEDDING_PARAMS,
  supportedParamsFor: (d) => embeddingParamsFor(modelId(d)),
};

export const bedrockProvider: ProviderAdapter = {
  ids: ["bedrock"],
  endpoints: { chat, embeddings },
  resolve: (d) => resolveBedrock(d),
  authorize: authorizeBedrock,
  errorMessage: bedrockErrorMessage,
  errorKind: upstreamErrorKind,
};
