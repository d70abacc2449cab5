/** Gemini's `GenerateContentResponse` → an OpenAI `chat.completion`. */
import type { Usage, WireJson } from "../../core/contract.ts";
import type { OpenAIFinishReason, OpenAIToolCall } from "../shared/chat-completion.ts";
import { chatCompletionId, nowSeconds } from "../../core/openai-ids.ts";
import { openAIUsage } from "../../core/openai-usage.ts";
import { toolCallId } from "./tool-ids.ts";
import { groundingSearches, usageFromGemini } from "./usage.ts";
import type { GeminiCandidate, GeminiPart, GenerateContentResponse } from "./wire.ts";

/** Gemini finish reasons that mean its filters stopped the answer; every other one but MAX_TOKENS is a plain stop. */
const FILTERED = new Set(["SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "MODEL_ARMOR"]);

export function finishReason(reason: string | undefined, calledTools: boolean): OpenAIFinishReason {
  if (reason === "MAX_TOKENS") return "length";
  if (reason !== undefined && FILTERED.has(reason)) return "content_filter";
  return calledTools ? "tool_calls" : "stop";
}

/**
 * A successful answer that is really a refusal: Gemini blocked the prompt itself
 * (`promptFeedback.blockReason`) and generated nothing. `kind` is what the router's
 * content-policy fallbacks key on.
 */
export class PromptBlocked extends Error {
  readonly kind = "content_policy_violation" as const;
}

/** The refusal in a response whose prompt Gemini blocked, if it did. */
export function promptBlocked(res: GenerateContentResponse): PromptBlocked | undefined {
  const reason = res.promptFeedback?.blockReason;
  if (!reason || (res.candidates?.length ?? 0) > 0) return undefined;
  const detail = res.promptFeedback?.blockReasonMessage ? `: ${res.promptFeedback.blockReasonMessage}` : "";
  return new PromptBlocked(`Gemini blocked the prompt under its content policy (blockReason ${reason})${detail}`);
}

/** A candidate's parts, sorted into answer text, thinking text and function calls. */
export interface SortedParts {
  text: string;
  reasoning: string;
  calls: OpenAIToolCall[];
}

export function sortParts(parts: readonly GeminiPart[] | undefined): SortedParts {
  const out: SortedParts = { text: "", reasoning: "", calls: [] };
  for (const p of parts ?? []) {
    if (p.functionCall) {
      out.calls.push({
        id: toolCallId(p.thoughtSignature, typeof p.functionCall.id === "string" ? p.functionCall.id : undefined),
        type: "function",
        function: { name: p.functionCall.name, arguments: JSON.stringify(p.functionCall.args ?? {}) },
      });
    } else if (typeof p.text === "string") {
      if (p.thought) out.reasoning += p.text;
      else out.text += p.text;
    }
  }
  return out;
}

function choice(c: GeminiCandidate, position: number): WireJson {
  const { text, reasoning, calls } = sortParts(c.content?.parts);
  const message: WireJson = { role: "assistant", content: text === "" && (calls.length > 0 || c.finishReason !== "STOP") ? null : text };
  if (reasoning) message.reasoning_content = reasoning;
  if (calls.length > 0) message.tool_calls = calls;
  message.refusal = null;
  return { index: c.index ?? position, message, logprobs: null, finish_reason: finishReason(c.finishReason, calls.length > 0) };
}

export function asResponse(body: unknown): GenerateContentResponse {
  if (body === null || typeof body !== "object" || Array.isArray(body)) throw new Error("expected a GenerateContentResponse object");
  return body as GenerateContentResponse;
}

/**
 * The `chat.completion` for a Gemini answer. The id is Gemini's `responseId` when it gives one;
 * `model` is the model version Gemini reports, else `fallbackModel`.
 */
export function chatCompletionFrom(body: unknown, fallbackModel = ""): { body: WireJson; usage: Usage } {
  const res = asResponse(body);
  const blocked = promptBlocked(res);
  if (blocked) throw blocked;
  // Not an answer the client could use (an OpenAI answer has a choice): a failed call, which may be retried.
  if (!res.candidates?.length) throw new Error("the answer has no candidates (and no promptFeedback.blockReason)");
  const usage = usageFromGemini(res.usageMetadata);
  const searches = (res.candidates ?? []).reduce((n, c) => n + groundingSearches(c), 0);
  if (searches > 0) usage.webSearchRequests = searches;
  const choices = (res.candidates ?? []).map(choice).sort((a, b) => (a.index as number) - (b.index as number));
  return {
    body: {
      id: res.responseId ?? chatCompletionId(),
      object: "chat.completion",
      created: nowSeconds(),
      model: res.modelVersion ?? fallbackModel,
      choices,
      usage: openAIUsage(usage),
    },
    usage,
  };
}
