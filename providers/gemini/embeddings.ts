/**
 * OpenAI embeddings ↔ Google's two embedding APIs: AI Studio's `batchEmbedContents` (one request
 * per input) and Vertex AI's `predict` (one instance per input, with token counts per instance).
 */
import type { Deployment, EmbeddingsRequest, Usage, WireJson } from "../../core/contract.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";
import { embeddingBatches, embeddingList, embeddingTexts } from "../shared/embedding-list.ts";

const isObject = (v: unknown): v is WireJson => typeof v === "object" && v !== null && !Array.isArray(v);

export const GEMINI_EMBEDDING_PARAMS = ["dimensions", "encoding_format", "user"] as const;

/** `svc_params.task_type` (RETRIEVAL_QUERY, RETRIEVAL_DOCUMENT, SEMANTIC_SIMILARITY, …), which Gemini tunes the vectors for. */
function taskType(d: Deployment): string | undefined {
  return typeof d.options.task_type === "string" ? d.options.task_type : undefined;
}

/** The `batchEmbedContents` body: `model` is repeated in every request, as `models/<name>`. */
export function batchEmbedBody(req: EmbeddingsRequest, d: Deployment, modelPath: string): WireJson {
  const task = taskType(d);
  return {
    requests: embeddingTexts(req.input, d.provider).map((text) => {
      const r: WireJson = { model: modelPath, content: { parts: [{ text }] } };
      if (task) r.taskType = task;
      if (req.dimensions != null) r.outputDimensionality = req.dimensions;
      return r;
    }),
  };
}

/** AI Studio takes at most 100 requests in one `batchEmbedContents` call. */
const BATCH_EMBED_MAX = 100;
/** Vertex's text embedding models take at most 250 instances per `predict` call; its Gemini embedding models one ("batchSize must be 1"). */
const PREDICT_MAX = 250;

/** A list longer than one `batchEmbedContents` call takes, in parts (in order; answered as one list). */
export function batchEmbedParts(req: EmbeddingsRequest, d: Deployment): EmbeddingsRequest[] | undefined {
  if (!Array.isArray(req.input) || req.input.length <= BATCH_EMBED_MAX) return undefined;
  return embeddingBatches(req, embeddingTexts(req.input, d.provider), BATCH_EMBED_MAX);
}

/** A list longer than one `predict` call takes (for Gemini embedding models, more than one text), in parts. */
export function predictEmbedParts(req: EmbeddingsRequest, d: Deployment): EmbeddingsRequest[] | undefined {
  const size = d.upstreamModel.startsWith("gemini-embedding") ? 1 : PREDICT_MAX;
  if (!Array.isArray(req.input) || req.input.length <= size) return undefined;
  return embeddingBatches(req, embeddingTexts(req.input, d.provider), size);
}

/** Vertex AI's `predict` body for text embedding models. */
export function predictEmbedBody(req: EmbeddingsRequest, d: Deployment): WireJson {
  const task = taskType(d);
  const body: WireJson = { instances: embeddingTexts(req.input, d.provider).map((content) => (task ? { content, task_type: task } : { content })) };
  if (req.dimensions != null) body.parameters = { outputDimensionality: req.dimensions };
  return body;
}

function values(v: unknown): number[] {
  if (!isObject(v) || !Array.isArray(v.values)) throw new Error("an embedding without values");
  return v.values as number[];
}

/**
 * The OpenAI list for the vectors, named after the model the client asked for (Google's answer
 * names none). When Google reports no token count, the prompt is estimated from the input (four
 * characters per token), so spend and budgets still see the call.
 */
function list(vectors: number[][], reported: number | undefined, req: EmbeddingsRequest | undefined, characters?: number): { body: WireJson; usage: Usage } {
  const promptTokens = reported ?? (req ? estimateTokens(req.input) : 0);
  const usage: Usage = characters === undefined ? { promptTokens, completionTokens: 0 } : { promptTokens, completionTokens: 0, characters };
  return { body: embeddingList(vectors, req?.model ?? "", promptTokens, req?.encoding_format), usage };
}

/** `{embeddings: [{values}], usageMetadata?}` → OpenAI's list. */
export function batchEmbedResponse(body: unknown, req?: EmbeddingsRequest): { body: WireJson; usage: Usage } {
  if (!isObject(body) || !Array.isArray(body.embeddings)) throw new Error("expected a batchEmbedContents response");
  const meta = isObject(body.usageMetadata) ? body.usageMetadata : undefined;
  const reported = typeof meta?.promptTokenCount === "number" ? meta.promptTokenCount : undefined;
  return list(body.embeddings.map(values), reported, req);
}

/**
 * `{predictions: [{embeddings: {values, statistics: {token_count}}}], metadata: {billableCharacterCount}}`
 * → OpenAI's list. The characters Google bills (code points, whitespace left out) are the usage
 * Vertex's embedding models are priced on (`input_cost_per_character`).
 */
export function predictEmbedResponse(body: unknown, req?: EmbeddingsRequest): { body: WireJson; usage: Usage } {
  if (!isObject(body) || !Array.isArray(body.predictions)) throw new Error("expected a predict response with predictions");
  let tokens = 0;
  let counted = false;
  const vectors = body.predictions.map((p: unknown) => {
    const e = isObject(p) ? p.embeddings : undefined;
    const stats = isObject(e) && isObject(e.statistics) ? e.statistics : undefined;
    if (typeof stats?.token_count === "number") {
      tokens += stats.token_count;
      counted = true;
    }
    return values(e);
  });
  const billable = isObject(body.metadata) ? body.metadata.billableCharacterCount : undefined;
  return list(vectors, counted ? tokens : undefined, req, typeof billable === "number" && Number.isInteger(billable) && billable >= 0 ? billable : undefined);
}
