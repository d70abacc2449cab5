/**
 * Legacy completions (`/v1/completions`) → Ollama's `POST /api/generate`, and its answer (one JSON
 * object, or NDJSON lines of `response` pieces ending with a `done: true` line that carries the
 * counts) → OpenAI `text_completion` objects and chunks.
 */
import type { CompletionRequest, Deployment, StreamPart, StreamTransform, Usage, WireJson } from "../../core/contract.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";
import { nowSeconds, textCompletionId } from "../../core/openai-ids.ts";
import { openAIUsage } from "../../core/openai-usage.ts";
import { ollamaOptions } from "./chat-request.ts";
import { createdSeconds, ollamaUsage } from "./chat-response.ts";

/** The OpenAI completion fields this translation understands. */
export const OLLAMA_GENERATE_PARAMS = ["temperature", "top_p", "max_tokens", "stop", "seed", "frequency_penalty", "presence_penalty", "suffix", "stream_options", "user"] as const;

/** Ollama completes one prompt per call: a single string (or a one-string list). */
function promptOf(prompt: CompletionRequest["prompt"]): string {
  if (typeof prompt === "string") return prompt;
  if (prompt.length === 1 && typeof prompt[0] === "string") return prompt[0];
  if (prompt.every((p) => typeof p === "string")) throw new Error("Ollama completes one prompt per request; send the prompts one by one");
  throw new Error("Ollama takes the prompt as text, not as token ids");
}

export function ollamaGenerateBody(req: CompletionRequest, d: Deployment): WireJson {
  // A field the schema lets through without naming it.
  const suffix = (req as { suffix?: unknown }).suffix;
  // Ollama streams unless told otherwise, so `stream` is always sent.
  const body: WireJson = { model: d.upstreamModel, prompt: promptOf(req.prompt), stream: req.stream === true };
  if (typeof suffix === "string") body.suffix = suffix;
  const o = ollamaOptions(req, d);
  if (o) body.options = o;
  if (d.options.keep_alive !== undefined) body.keep_alive = d.options.keep_alive;
  return body;
}

interface OllamaGenerateLine {
  model?: string;
  created_at?: string;
  response?: string;
  done?: boolean;
  done_reason?: string;
  prompt_eval_count?: number;
  eval_count?: number;
  error?: string;
}

const finishReason = (line: OllamaGenerateLine) => (line.done_reason === "length" ? "length" : "stop");

export function ollamaGenerateResponse(body: unknown, req: CompletionRequest | undefined): { body: WireJson; usage: Usage } {
  const b = body as OllamaGenerateLine;
  if (typeof b !== "object" || b === null || typeof b.response !== "string") throw new Error("Ollama answer has no response text");
  const usage = ollamaUsage(b, () => (req ? estimateTokens(req.prompt) : 0));
  return {
    body: {
      id: textCompletionId(),
      object: "text_completion",
      created: createdSeconds(b.created_at),
      model: b.model ?? "",
      choices: [{ text: b.response, index: 0, logprobs: null, finish_reason: finishReason(b) }],
      usage: openAIUsage(usage),
    },
    usage,
  };
}

export interface OllamaGenerateState {
  id: string;
  created: number;
  model: string;
  lines: number;
  clientWantsUsage: boolean;
  promptEstimate: number;
  outputChars: number;
  /** The `done: true` line came. */
  done: boolean;
}

function chunk(s: OllamaGenerateState, text: string, finish: string | null): StreamPart {
  return { type: "chunk", chunk: { id: s.id, object: "text_completion", created: s.created, model: s.model, choices: [{ text, index: 0, logprobs: null, finish_reason: finish }] } };
}

export const ollamaGenerateStream: StreamTransform<"completions", OllamaGenerateState> = {
  framing: "ndjson",
  init: (req: CompletionRequest) => ({
    id: textCompletionId(),
    created: nowSeconds(),
    model: req.model,
    lines: 0,
    clientWantsUsage: req.stream_options?.include_usage === true,
    promptEstimate: estimateTokens(req.prompt),
    outputChars: 0,
    done: false,
  }),
  event(data, s) {
    const line = JSON.parse(data) as OllamaGenerateLine;
    if (typeof line.error === "string") return [{ type: "error", error: { status: 500, type: "api_error", message: `Ollama stream failed: ${line.error}` } }];
    if (s.lines++ === 0) {
      if (line.model) s.model = line.model;
      s.created = createdSeconds(line.created_at);
    }
    const parts: StreamPart[] = [];
    if (line.response) {
      s.outputChars += line.response.length;
      parts.push(chunk(s, line.response, null));
    }
    if (line.done) {
      s.done = true;
      const usage = ollamaUsage(line, () => s.promptEstimate);
      parts.push(chunk(s, "", finishReason(line)), { type: "usage", usage });
      if (s.clientWantsUsage) parts.push({ type: "chunk", chunk: { id: s.id, object: "text_completion", created: s.created, model: s.model, choices: [], usage: openAIUsage(usage) } });
      parts.push({ type: "end" });
    }
    return parts;
  },
  // About four characters per token, for streams cut or cancelled before Ollama's counts.
  estimate: (s) => ({ promptTokens: s.promptEstimate, completionTokens: Math.ceil(s.outputChars / 4) }),
  responseId: (s) => s.id,
  complete: (s) => s.done,
};
