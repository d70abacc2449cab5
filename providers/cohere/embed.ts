/** OpenAI embeddings ↔ Cohere's `POST /v2/embed` (`texts` in, `embeddings.float` and billed input tokens out). */
import type { Deployment, EmbeddingsRequest, Usage, WireJson } from "../../core/contract.ts";
import { embeddingBatches, embeddingList, embeddingTexts } from "../shared/embedding-list.ts";

/** Cohere's v3+ embedding models need to know what the text is for; a stored document by default. */
const DEFAULT_INPUT_TYPE = "search_document";

export const COHERE_EMBED_PARAMS = ["encoding_format", "dimensions", "input_type", "user"] as const;

/** Cohere's embed endpoint takes at most 96 texts per call. */
const MAX_TEXTS = 96;

/** A list longer than one call takes, in batches of 96 (in order; answered as one list). */
export function cohereEmbedParts(req: EmbeddingsRequest): EmbeddingsRequest[] | undefined {
  if (!Array.isArray(req.input) || req.input.length <= MAX_TEXTS) return undefined;
  return embeddingBatches(req, embeddingTexts(req.input, "Cohere"), MAX_TEXTS);
}

export function cohereEmbedBody(req: EmbeddingsRequest, d: Deployment): WireJson {
  const inputType = (req as WireJson).input_type ?? d.options.input_type ?? DEFAULT_INPUT_TYPE;
  const body: WireJson = { model: d.upstreamModel, texts: embeddingTexts(req.input, "Cohere"), input_type: inputType, embedding_types: ["float"] };
  if (req.dimensions != null) body.output_dimension = req.dimensions;
  return body;
}

interface CohereEmbedResponse {
  embeddings?: { float?: number[][] } | number[][];
  meta?: { billed_units?: { input_tokens?: number } };
}

export function cohereEmbedResponse(body: unknown, req: EmbeddingsRequest | undefined): { body: WireJson; usage: Usage } {
  const b = body as CohereEmbedResponse;
  // v2 answers by type (`{float: [...]}`); the v1 shape (a bare list) is accepted too.
  const vectors = Array.isArray(b.embeddings) ? b.embeddings : b.embeddings?.float;
  if (!Array.isArray(vectors)) throw new Error("Cohere answer has no float embeddings");
  const tokens = b.meta?.billed_units?.input_tokens ?? 0;
  return { body: embeddingList(vectors, req?.model ?? "", tokens, req?.encoding_format), usage: { promptTokens: tokens, completionTokens: 0 } };
}
