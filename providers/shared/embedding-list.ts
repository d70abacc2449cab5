/** OpenAI's embeddings answer (`{object: "list", data, model, usage}`) from a native provider's vectors. */
import type { EmbeddingsRequest, Usage, WireJson } from "../../core/contract.ts";

/** Little-endian float32 bytes in base64: what OpenAI sends for `encoding_format: "base64"`. */
function float32Base64(vector: readonly number[]): string {
  const view = new DataView(new ArrayBuffer(vector.length * 4));
  for (let i = 0; i < vector.length; i++) view.setFloat32(i * 4, vector[i]!, true);
  return Buffer.from(view.buffer).toString("base64");
}

export function embeddingList(vectors: readonly (readonly number[])[], model: string, promptTokens: number, format: EmbeddingsRequest["encoding_format"]): WireJson {
  return {
    object: "list",
    data: vectors.map((v, index) => ({ object: "embedding", index, embedding: format === "base64" ? float32Base64(v) : v })),
    model,
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens },
  };
}

/** The texts to embed; token-id inputs need the provider's own tokenizer, which native APIs do not take. */
export function embeddingTexts(input: EmbeddingsRequest["input"], provider: string): string[] {
  if (typeof input === "string") return [input];
  if (Array.isArray(input) && input.every((x): x is string => typeof x === "string")) return input;
  throw new Error(`${provider} embeddings take text input (a string or an array of strings), not token ids`);
}

/**
 * A request with more texts than the upstream takes per call, as parts of at most `size` texts
 * (one text alone when `size` is 1), in order; undefined when one call takes them all.
 */
export function embeddingBatches(req: EmbeddingsRequest, texts: readonly string[], size: number): EmbeddingsRequest[] | undefined {
  if (texts.length <= size) return undefined;
  const parts: EmbeddingsRequest[] = [];
  for (let i = 0; i < texts.length; i += size) parts.push({ ...req, input: size === 1 ? texts[i]! : texts.slice(i, i + size) });
  return parts;
}

/** One OpenAI list of the lists a request sent in parts got: the vectors in order, indexed anew, the usage (tokens, billed characters) summed. */
export function joinEmbeddingLists(answers: readonly { body: WireJson; usage: Usage }[], model: string): { body: WireJson; usage: Usage } {
  const data = answers.flatMap((a) => (Array.isArray(a.body.data) ? (a.body.data as WireJson[]) : [])).map((e, index) => ({ ...e, index }));
  const promptTokens = answers.reduce((n, a) => n + a.usage.promptTokens, 0);
  const usage: Usage = { promptTokens, completionTokens: 0 };
  // Billed characters (Vertex's), where the parts report them.
  if (answers.some((a) => a.usage.characters !== undefined)) usage.characters = answers.reduce((n, a) => n + (a.usage.characters ?? 0), 0);
  return { body: { object: "list", data, model, usage: { prompt_tokens: promptTokens, total_tokens: promptTokens } }, usage };
}

/** An embeddings adapter's `join`: the parts' lists as one, under the model the client asked for. */
export const joinEmbeddings = (answers: readonly { body: WireJson; usage: Usage }[], req: EmbeddingsRequest) => joinEmbeddingLists(answers, req.model);
