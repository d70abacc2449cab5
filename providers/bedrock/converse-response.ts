/** Bedrock Converse response → OpenAI `chat.completion`; the stop-reason and usage tables the stream shares. */
import type { ChatRequest, Usage, WireJson } from "../../core/contract.ts";
import { chatCompletion, type OpenAIFinishReason, type OpenAIToolCall } from "../shared/chat-completion.ts";
import { chatCompletionId, nowSeconds } from "../../core/openai-ids.ts";
import { JSON_RESPONSE_TOOL, wantsJsonResponse } from "../shared/json-response-tool.ts";

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
const count = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) ? v : 0);

export function asObject(v: unknown, what: string): Record<string, unknown> {
  if (!isObject(v)) throw new Error(`expected ${what} to be a JSON object`);
  return v;
}

/** Converse `stopReason` → OpenAI `finish_reason`. */
const FINISH_REASONS: Record<string, OpenAIFinishReason> = {
  end_turn: "stop",
  stop_sequence: "stop",
  max_tokens: "length",
  model_context_window_exceeded: "length",
  tool_use: "tool_calls",
  guardrail_intervened: "content_filter",
  content_filtered: "content_filter",
};

/** `answeredInJson`: the only tool called was the response-format one, so the turn ended with an answer. */
export function finishReason(stopReason: unknown, answeredInJson: boolean): OpenAIFinishReason {
  if (stopReason === "tool_use" && answeredInJson) return "stop";
  return FINISH_REASONS[String(stopReason)] ?? "stop";
}

/**
 * Converse usage → Usage. Bedrock counts cache reads and writes apart from `inputTokens`; in the
 * OpenAI convention they are parts of the prompt total.
 */
export function converseUsage(raw: unknown): Usage {
  const u = isObject(raw) ? raw : {};
  const cacheRead = count(u.cacheReadInputTokens);
  const cacheWrite = count(u.cacheWriteInputTokens);
  const usage: Usage = { promptTokens: count(u.inputTokens) + cacheRead + cacheWrite, completionTokens: count(u.outputTokens) };
  if (cacheRead) usage.cachedPromptTokens = cacheRead;
  if (cacheWrite) usage.cacheCreationTokens = cacheWrite;
  return usage;
}

/**
 * A Converse `reasoningContent` block → Claude's thinking block as the Anthropic API writes it
 * (`thinking` with its signature, or `redacted_thinking`): what the client sends back.
 */
export function thinkingBlock(r: Record<string, unknown>): WireJson | undefined {
  if (isObject(r.reasoningText) && typeof r.reasoningText.text === "string") {
    const block: WireJson = { type: "thinking", thinking: r.reasoningText.text };
    if (typeof r.reasoningText.signature === "string") block.signature = r.reasoningText.signature;
    return block;
  }
  return typeof r.redactedContent === "string" ? { type: "redacted_thinking", data: r.redactedContent } : undefined;
}

export function converseResponse(body: unknown, req?: ChatRequest): { body: WireJson; usage: Usage } {
  const b = asObject(body, "the Converse response");
  const message = asObject(asObject(b.output, "output").message, "output.message");
  const content = Array.isArray(message.content) ? message.content : [];
  let text = "";
  /** The response-format tool's input: the whole answer when it comes (see below). */
  let json: string | undefined;
  let reasoning = "";
  const thinkingBlocks: WireJson[] = [];
  const toolCalls: OpenAIToolCall[] = [];
  // Without the request at hand, the reserved tool name alone tells the answer apart.
  const jsonAnswer = req === undefined || wantsJsonResponse(req);
  for (const block of content) {
    if (!isObject(block)) continue;
    if (typeof block.text === "string") text += block.text;
    else if (isObject(block.toolUse)) {
      const use = block.toolUse;
      const args = JSON.stringify(use.input ?? {});
      if (jsonAnswer && use.name === JSON_RESPONSE_TOOL) json = (json ?? "") + args;
      else toolCalls.push({ id: String(use.toolUseId ?? ""), type: "function", function: { name: String(use.name ?? ""), arguments: args } });
    } else if (isObject(block.reasoningContent)) {
      const thinking = thinkingBlock(block.reasoningContent);
      if (thinking?.type === "thinking") reasoning += String(thinking.thinking);
      if (thinking) thinkingBlocks.push(thinking);
    }
  }
  // While thinking the JSON tool is not forced, and Claude may write a preamble ("Here is the
  // JSON:") before calling it: the client asked for JSON, so the tool's input alone is the content.
  if (json !== undefined) text = json;
  const usage = converseUsage(b.usage);
  const head = { id: chatCompletionId(), created: nowSeconds(), model: req?.model ?? "" };
  const answer = { content: text === "" && toolCalls.length > 0 ? null : text, toolCalls, reasoning: reasoning || undefined, thinkingBlocks, refusal: null };
  return {
    body: chatCompletion(head, answer, finishReason(b.stopReason, json !== undefined && toolCalls.length === 0), usage),
    usage,
  };
}
