/** OpenAI embeddings ↔ Ollama's `POST /api/embed` (`input` in, `embeddings` and `prompt_eval_count` out). */
import type { Deployment, EmbeddingsRequest, Usage, WireJson } from "../../core/contract.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";
import { embeddingList, embeddingTexts } from "../shared/embedding-list.ts";

export const OLLAMA_EMBED_PARAMS = ["encoding_format", "dimensions", "user"] as const;

export function ollamaEmbedBody(req: EmbeddingsRequest, d: Deployment): WireJson {
  const texts = embeddingTexts(req.input, "Ollama");
  const body: WireJson = { model: d.upstreamModel, input: typeof req.input === "string" ? req.input : texts };
  if (req.dimensions != null) body.dimensions = req.dimensions;
  if (d.options.truncate !== undefined) body.truncate = d.options.truncate;
  if (d.options.keep_alive !== undefined) body.keep_alive = d.options.keep_alive;
  return body;
}

interface OllamaEmbedResponse {
  model?: string;
  embeddings?: number[][];
  prompt_eval_count?: number;
}

export function ollamaEmbedResponse(body: unknown, req: EmbeddingsRequest | undefined): { body: WireJson; usage: Usage } {
  const b = body as OllamaEmbedResponse;
  if (!Array.isArray(b.embeddings)) throw new Error("Ollama answer has no embeddings");
  // Absent when the input came from Ollama's cache: estimated, as for the other answers without it (chat-response.ts).
  const tokens = b.prompt_eval_count ?? (req ? estimateTokens(req.input) : 0);
  return { body: embeddingList(b.embeddings, b.model ?? req?.model ?? "", tokens, req?.encoding_format), usage: { promptTokens: tokens, completionTokens: 0 } };
}
