/**
 * Embeddings through Bedrock's InvokeModel, whose body is the model family's own: Amazon Titan
 * (`inputText`, one text per call) and Cohere (`texts`, a batch of up to 96 per call).
 */
import type { Deployment, EmbeddingsRequest, Usage, WireJson } from "../../core/contract.ts";
import { GatewayError } from "../../core/errors.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";
import { embeddingBatches } from "../shared/embedding-list.ts";

/** Titan's; Cohere's models also take the client's `input_type` (what the text is for), as `cohere/` does. */
const TITAN_PARAMS = ["dimensions", "encoding_format", "user"] as const;
const COHERE_PARAMS = [...TITAN_PARAMS, "input_type"] as const;
export const EMBEDDING_PARAMS: readonly string[] = COHERE_PARAMS;

type Family = "titan" | "cohere";

/** The fields the deployment's model family takes (an unknown family takes Titan's; its call is refused anyway). */
export function embeddingParamsFor(modelId: string): readonly string[] {
  return modelId.includes("cohere.embed") ? COHERE_PARAMS : TITAN_PARAMS;
}

function family(modelId: string): Family {
  if (modelId.includes("titan-embed")) return "titan";
  if (modelId.includes("cohere.embed")) return "cohere";
  throw GatewayError.of(400, `bedrock: embeddings are supported for Amazon Titan and Cohere models, not ${modelId}`, "invalid_request_error", "model");
}

function texts(input: EmbeddingsRequest["input"]): string[] {
  if (typeof input === "string") return [input];
  if (Array.isArray(input) && input.every((x): x is string => typeof x === "string")) return input;
  throw GatewayError.of(400, "bedrock: embeddings input must be a string or an array of strings (token arrays are not supported)", "invalid_request_error", "input");
}

/** Cohere's embed models on Bedrock take at most 96 texts per call. */
const COHERE_BATCH = 96;

/**
 * Titan takes one text per call, Cohere 96: a longer list is sent in parts, one call each (in
 * order), and answered as one list, as LiteLLM does for Titan. Undefined: one call.
 */
export function embeddingParts(req: EmbeddingsRequest, modelId: string): EmbeddingsRequest[] | undefined {
  const size = family(modelId) === "titan" ? 1 : COHERE_BATCH;
  if (!Array.isArray(req.input) || req.input.length <= size) return undefined;
  return embeddingBatches(req, texts(req.input), size);
}

/** The InvokeModel body for the deployment's model family. */
export function embeddingBody(req: EmbeddingsRequest, d: Deployment): WireJson {
  const inputs = texts(req.input);
  if (inputs.length === 0) throw GatewayError.of(400, "bedrock: embeddings input is empty: send a text to embed", "invalid_request_error", "input");
  if (family(d.upstreamModel) === "titan") {
    if (inputs.length !== 1) {
      throw GatewayError.of(400, `bedrock: Titan embedding models take one input per call, got ${inputs.length}`, "invalid_request_error", "input");
    }
    const body: WireJson = { inputText: inputs[0] };
    if (req.dimensions) body.dimensions = req.dimensions;
    return body;
  }
  // `input_type` matters to Cohere's v3+ models: the client's, else the deployment's; documents is the right default for indexing.
  const asked = (req as WireJson).input_type;
  const inputType = typeof asked === "string" ? asked : typeof d.options.input_type === "string" ? d.options.input_type : "search_document";
  const body: WireJson = { texts: inputs, input_type: inputType };
  if (req.dimensions) body.output_dimension = req.dimensions;
  return body;
}

/** Float32 little-endian bytes in base64: OpenAI's `encoding_format: "base64"`. */
function base64Floats(vector: number[]): string {
  const bytes = new Uint8Array(new Float32Array(vector).buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

function vectors(b: Record<string, unknown>): number[][] {
  if (Array.isArray(b.embedding)) return [b.embedding as number[]];
  const e = b.embeddings;
  if (Array.isArray(e)) return e as number[][];
  // Cohere with `embedding_types` answers `{float: [[…]]}`.
  if (e !== null && typeof e === "object" && Array.isArray((e as Record<string, unknown>).float)) return (e as { float: number[][] }).float;
  throw new Error("expected `embedding` or `embeddings` in the InvokeModel response");
}

/** InvokeModel's own count of the input, in a response header (absent: undefined). */
function headerCount(headers: Headers | undefined): number | undefined {
  const text = headers?.get("x-amzn-bedrock-input-token-count");
  const n = text ? Number(text) : Number.NaN;
  return Number.isInteger(n) && n >= 0 ? n : undefined;
}

export function embeddingResponse(body: unknown, req?: EmbeddingsRequest, headers?: Headers): { body: WireJson; usage: Usage } {
  if (body === null || typeof body !== "object" || Array.isArray(body)) throw new Error("expected a JSON object");
  const b = body as Record<string, unknown>;
  const asBase64 = req?.encoding_format === "base64";
  const data = vectors(b).map((v, index) => ({ object: "embedding", index, embedding: asBase64 ? base64Floats(v) : v }));
  // Titan counts its input in the body; for Cohere, Bedrock counts it in the
  // `X-Amzn-Bedrock-Input-Token-Count` header. Only without either is it estimated.
  const counted = b.inputTextTokenCount;
  const promptTokens = typeof counted === "number" ? counted : (headerCount(headers) ?? estimateTokens(Array.isArray(b.texts) ? b.texts : (req?.input ?? "")));
  const usage: Usage = { promptTokens, completionTokens: 0 };
  return { body: { object: "list", data, model: req?.model ?? "", usage: { prompt_tokens: promptTokens, total_tokens: promptTokens } }, usage };
}
