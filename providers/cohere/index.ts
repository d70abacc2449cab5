/**
 * `cohere/<model>` (and LiteLLM's `cohere_chat/<model>`): Cohere's v2 API. Chat → `POST /v2/chat`,
 * embeddings → `POST /v2/embed`, bearer key from `api_key` or COHERE_API_KEY.
 */
import type { ChatRequest, Deployment, EmbeddingsRequest, EndpointAdapter, HttpCall, ProviderAdapter, WireJson } from "../../core/contract.ts";
import { openAIErrorMessage } from "../openai-compatible/adapter.ts";
import { upstreamErrorKind } from "../shared/error-kind.ts";
import { COHERE_CHAT_PARAMS, cohereChatBody, cohereChatParams } from "./chat-request.ts";
import { cohereChatResponse } from "./chat-response.ts";
import { type CohereStreamState, cohereChatStream } from "./chat-stream.ts";
import { joinEmbeddings } from "../shared/embedding-list.ts";
import { COHERE_EMBED_PARAMS, cohereEmbedBody, cohereEmbedParts, cohereEmbedResponse } from "./embed.ts";

export const COHERE_API_BASE = "https://api.cohere.com";

function post(d: Deployment, path: string, body: WireJson, stream = false): HttpCall {
  const headers: Record<string, string> = { "content-type": "application/json", accept: stream ? "text/event-stream" : "application/json", ...d.headers };
  if (d.apiKey) headers.authorization = `Bearer ${d.apiKey}`;
  return { url: `${d.apiBase}${path}`, method: "POST", headers, body: JSON.stringify(body) };
}

const chat: EndpointAdapter<"chat", CohereStreamState> = {
  request: (req: ChatRequest, d) => post(d, "/v2/chat", cohereChatBody(req, d.upstreamModel), req.stream === true),
  response: (body, req) => cohereChatResponse(body, req?.model ?? ""),
  stream: cohereChatStream,
  supportedParams: COHERE_CHAT_PARAMS,
  supportedParamsFor: cohereChatParams,
};

const embeddings: EndpointAdapter<"embeddings"> = {
  request: (req: EmbeddingsRequest, d) => post(d, "/v2/embed", cohereEmbedBody(req, d)),
  response: (body, req) => cohereEmbedResponse(body, req),
  // More than 96 texts: in batches of 96.
  split: (req) => cohereEmbedParts(req),
  join: joinEmbeddings,
  supportedParams: COHERE_EMBED_PARAMS,
};

export const cohereProvider: ProviderAdapter = {
  ids: ["cohere", "cohere_chat"],
  endpoints: { chat, embeddings },
  // Cohere's error body is `{id, message}`; the OpenAI reader takes a top-level `message` too.
  errorMessage: openAIErrorMessage,
  errorKind: upstreamErrorKind,
  resolve(d) {
    const apiBase = (d.apiBase ?? process.env.COHERE_API_BASE ?? COHERE_API_BASE).replace(/\/+$/, "");
    const apiKey = d.apiKey ?? process.env.COHERE_API_KEY ?? process.env.CO_API_KEY;
    return { ...d, apiBase, apiKey };
  },
};
