/**
 * A Messages API answer → OpenAI's `chat.completion`. Text blocks become `content`, thinking becomes
 * `reasoning_content` (and `thinking_blocks`, signatures intact, for the client to send back on its
 * next turn), tool_use blocks become `tool_calls` with JSON-string arguments.
 */
import { nowSeconds } from "../../core/openai-ids.ts";
import type { Usage, WireJson } from "../../core/contract.ts";
import { JSON_RESPONSE_TOOL } from "../shared/json-response-tool.ts";
import { openAIUsage } from "../../core/openai-usage.ts";
import { finishReason } from "./finish-reason.ts";
import { usageFromAnthropic } from "./usage.ts";
import type { AnthropicResponse, ContentBlock, ToolUseBlock } from "./wire.ts";

function asResponse(raw: unknown): AnthropicResponse {
  const r = raw as Partial<AnthropicResponse> | null;
  if (r === null || typeof r !== "object" || r.type !== "message" || !Array.isArray(r.content)) {
    throw new Error("expected a Messages API response (type: message)");
  }
  return r as AnthropicResponse;
}

export function anthropicChatResponse(raw: unknown): { body: WireJson; usage: Usage } {
  const r = asResponse(raw);
  let text = "";
  /** The response_format tool's input: the whole answer when it comes (see below). */
  let json: string | undefined;
  let reasoning = "";
  const thinkingBlocks: ContentBlock[] = [];
  const toolCalls: WireJson[] = [];
  for (const block of r.content) {
    switch (block.type) {
      case "text":
        text += (block as { text: string }).text;
        break;
      case "thinking":
        reasoning += (block as { thinking: string }).thinking;
        thinkingBlocks.push(block);
        break;
      case "redacted_thinking":
        thinkingBlocks.push(block);
        break;
      case "tool_use": {
        const use = block as ToolUseBlock;
        if (use.name === JSON_RESPONSE_TOOL) json = (json ?? "") + JSON.stringify(use.input);
        else toolCalls.push({ id: use.id, type: "function", function: { name: use.name, arguments: JSON.stringify(use.input ?? {}) } });
        break;
      }
    }
  }
  // While thinking the JSON tool is not forced, and Claude may write a preamble ("Here is the
  // JSON:") before calling it: the client asked for JSON, so the tool's input alone is the content.
  if (json !== undefined) text = json;
  const message: WireJson = { role: "assistant", content: text === "" && toolCalls.length > 0 ? null : text };
  if (toolCalls.length > 0) message.tool_calls = toolCalls;
  if (thinkingBlocks.length > 0) {
    message.reasoning_content = reasoning;
    message.thinking_blocks = thinkingBlocks;
  }
  message.refusal = null;
  message.annotations = [];
  const usage = usageFromAnthropic(r.usage);
  const body: WireJson = {
    id: r.id,
    object: "chat.completion",
    created: nowSeconds(),
    model: r.model,
    choices: [{ index: 0, message, logprobs: null, finish_reason: finishReason(r.stop_reason, json !== undefined && toolCalls.length === 0) }],
    usage: openAIUsage(usage),
  };
  return { body, usage };
}
