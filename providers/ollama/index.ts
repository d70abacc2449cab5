/**
 * `ollama/<model>` and `ollama_chat/<model>`: Ollama's native API. Chat → `POST /api/chat` (NDJSON
 * stream), legacy completions → `POST /api/generate`, embeddings → `POST /api/embed`. No key by default; `api_key` (or OLLAMA_API_KEY) is sent
 * as a bearer token for Ollama behind an authenticating proxy or on ollama.com.
 */
import type { ChatRequest, CompletionRequest, Deployment, EmbeddingsRequest, EndpointAdapter, HttpCall, ProviderAdapter, UpstreamErrorKind, WireJson } from "../../core/contract.ts";
import { openAIErrorMessage } from "../openai-compatible/adapter.ts";
import { upstreamErrorKind } from "../shared/error-kind.ts";
import { OLLAMA_CHAT_PARAMS, ollamaChatBody } from "./chat-request.ts";
import { type OllamaStreamState, ollamaChatResponse, ollamaChatStream } from "./chat-response.ts";
import { OLLAMA_EMBED_PARAMS, ollamaEmbedBody, ollamaEmbedResponse } from "./embed.ts";
import { OLLAMA_GENERATE_PARAMS, type OllamaGenerateState, ollamaGenerateBody, ollamaGenerateResponse, ollamaGenerateStream } from "./generate.ts";

export const OLLAMA_API_BASE = "http://localhost:11434";

function post(d: Deployment, path: string, body: WireJson): HttpCall {
  const headers: Record<string, string> = { "content-type": "application/json", ...d.headers };
  if (d.apiKey) headers.authorization = `Bearer ${d.apiKey}`;
  return { url: `${d.apiBase}${path}`, method: "POST", headers, body: JSON.stringify(body) };
}

const chat: EndpointAdapter<"chat", OllamaStreamState> = {
  request: (req: ChatRequest, d) => post(d, "/api/chat", ollamaChatBody(req, d)),
  response: (body, req) => ollamaChatResponse(body, req),
  stream: ollamaChatStream,
  supportedParams: OLLAMA_CHAT_PARAMS,
};

const completions: EndpointAdapter<"completions", OllamaGenerateState> = {
  request: (req: CompletionRequest, d) => post(d, "/api/generate", ollamaGenerateBody(req, d)),
  response: (body, req) => ollamaGenerateResponse(body, req),
  stream: ollamaGenerateStream,
  supportedParams: OLLAMA_GENERATE_PARAMS,
};

const embeddings: EndpointAdapter<"embeddings"> = {
  request: (req: EmbeddingsRequest, d) => post(d, "/api/embed", ollamaEmbedBody(req, d)),
  response: (body, req) => ollamaEmbedResponse(body, req),
  supportedParams: OLLAMA_EMBED_PARAMS,
};

/** Ollama reports a prompt over the context length with a 500 as often as with a 400. */
function ollamaErrorKind(status: number, body: string): UpstreamErrorKind | undefined {
  return upstreamErrorKind(status >= 500 ? 400 : status, body);
}

export const ollamaProvider: ProviderAdapter = {
  ids: ["ollama", "ollama_chat"],
  endpoints: { chat, completions, embeddings },
  // Ollama's error body is `{"error": "<text>"}`.
  errorMessage: openAIErrorMessage,
  errorKind: ollamaErrorKind,
  resolve(d) {
    const apiBase = (d.apiBase ?? process.env.OLLAMA_API_BASE ?? OLLAMA_API_BASE).replace(/\/+$/, "");
    return { ...d, apiBase, apiKey: d.apiKey ?? process.env.OLLAMA_API_KEY };
  },
};
