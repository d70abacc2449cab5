/**
 * OpenAI's response shapes, built from what a native provider answered: the `usage` object and a
 * whole `chat.completion`. Native adapters share these so every provider answers the client alike.
 */
import type { Usage, WireJson } from "../../core/contract.ts";
import { openAIUsage } from "../../core/openai-usage.ts";

export type OpenAIFinishReason = "stop" | "length" | "tool_calls" | "content_filter";

/** The response's head: the same on the completion and on every chunk of a stream. */
export interface ResponseHead {
  id: string;
  created: number;
  model: string;
}

export interface OpenAIToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export interface AssistantMessage {
  content: string | null;
  toolCalls?: OpenAIToolCall[];
  /** Thinking text, under `reasoning_content` as the gateway's clients expect it. */
  reasoning?: string;
  /**
   * Claude's signed thinking blocks (`{type: "thinking", thinking, signature}` or
   * `{type: "redacted_thinking", data}`), under `thinking_blocks`: the client sends them back with
   * its next turn, and Claude wants them before the tool calls they led to.
   */
  thinkingBlocks?: WireJson[];
  /** OpenAI's `refusal` field, for adapters that send it (null: no refusal). */
  refusal?: string | null;
}

export function chatCompletion(head: ResponseHead, message: AssistantMessage, finish: OpenAIFinishReason, usage: Usage): WireJson {
  const msg: WireJson = { role: "assistant", content: message.content };
  if (message.reasoning) msg.reasoning_content = message.reasoning;
  if (message.thinkingBlocks && message.thinkingBlocks.length > 0) msg.thinking_blocks = message.thinkingBlocks;
  if (message.toolCalls && message.toolCalls.length > 0) msg.tool_calls = message.toolCalls;
  if (message.refusal !== undefined) msg.refusal = message.refusal;
  return {
    id: head.id,
    object: "chat.completion",
    created: head.created,
    model: head.model,
    choices: [{ index: 0, message: msg, logprobs: null, finish_reason: finish }],
    usage: openAIUsage(usage),
  };
}
