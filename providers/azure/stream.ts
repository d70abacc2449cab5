/**
 * Azure's stream is OpenAI's plus chunks of its own content filter, which are not OpenAI chunks
 * (`"object": ""`, no id): the prompt's filter results before the first choice, and annotations of
 * the asynchronous filter. The prompt results ride on the first real chunk; annotations are dropped.
 * Every chunk names the model behind the deployment: the usage, Azure's or estimated, carries it.
 */
import type { Endpoint, StreamPart, StreamTransform, WireJson } from "../../core/contract.ts";
import { answerModelOf, withAnswerModel } from "./answer-model.ts";

export interface AzureStreamState<S> {
  inner: S;
  promptFilterResults?: unknown;
  /**
   * The model the first answer chunk names (null: it named none). Without it, a stream whose usage
   * is estimated (no usage chunk on an api-version before stream_options, a cut, a client that
   * left) could not be priced: the deployment's own name has no price.
   */
  answerModel?: string | null;
}

function withPromptFilters(part: StreamPart, results: unknown): StreamPart | undefined {
  // `opens` is kept: a failure right after the role chunk is still retried or falls back.
  const opens = (part.type === "data" || part.type === "chunk") && part.opens ? { opens: part.opens } : {};
  if (part.type === "data") return { type: "chunk", chunk: { ...(JSON.parse(part.data) as WireJson), prompt_filter_results: results }, ...opens };
  if (part.type === "chunk") return { type: "chunk", chunk: { ...part.chunk, prompt_filter_results: results }, ...opens };
  return undefined;
}

/** Azure's chunk of prompt filter results, before the answer: `"object": ""`. */
const PROMPT_FILTER_CHUNK = /"object"\s*:\s*""/;

export function azureStream<E extends Endpoint, S>(inner: StreamTransform<E, S>): StreamTransform<E, AzureStreamState<S>> {
  return {
    framing: inner.framing,
    init: (req) => ({ inner: inner.init(req) }),
    event(data, s) {
      // Safe as text: inside a JSON string the quotes would be escaped (and JSON allows spaces around ':').
      if (PROMPT_FILTER_CHUNK.test(data)) {
        if (data.includes('"prompt_filter_results"')) s.promptFilterResults = (JSON.parse(data) as WireJson).prompt_filter_results;
        return [];
      }
      const parts = inner.event(data, s.inner);
      // Read from the first chunk only: one parse a stream, not one a chunk.
      if (s.answerModel === undefined && data !== "[DONE]") s.answerModel = answerModelOf(JSON.parse(data)) ?? null;
      const usage = parts.findIndex((p) => p.type === "usage");
      if (usage >= 0) parts[usage] = { type: "usage", usage: withAnswerModel((parts[usage] as Extract<StreamPart, { type: "usage" }>).usage, s.answerModel ?? undefined) };
      if (s.promptFilterResults === undefined) return parts;
      for (let i = 0; i < parts.length; i++) {
        const merged = withPromptFilters(parts[i]!, s.promptFilterResults);
        if (!merged) continue;
        parts[i] = merged;
        s.promptFilterResults = undefined;
        break;
      }
      return parts;
    },
    estimate: (s) => withAnswerModel(inner.estimate(s.inner), s.answerModel ?? undefined),
    responseId: (s) => inner.responseId?.(s.inner),
    complete: inner.complete ? (s) => inner.complete!(s.inner) : undefined,
  };
}
