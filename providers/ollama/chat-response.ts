/**
 * Ollama's `/api/chat` answer → OpenAI. A stream is NDJSON whose lines have the same shape as the
 * whole answer (a message piece each); the `done: true` line carries the counts.
 */
import type { ChatRequest, StreamPart, StreamTransform, Usage, WireJson } from "../../core/contract.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";
import { ChatChunkWriter } from "../shared/chat-chunks.ts";
import { type OpenAIFinishReason, type OpenAIToolCall, chatCompletion } from "../shared/chat-completion.ts";
import { chatCompletionId, nowSeconds, toolCallId } from "../../core/openai-ids.ts";

interface OllamaToolCall {
  id?: string;
  function?: { name?: string; arguments?: unknown };
}

interface OllamaChatLine {
  model?: string;
  created_at?: string;
  message?: { content?: string; thinking?: string; tool_calls?: OllamaToolCall[] };
  done?: boolean;
  done_reason?: string;
  prompt_eval_count?: number;
  eval_count?: number;
  error?: string;
}

/**
 * `prompt_eval_count` is absent when the whole prompt came from Ollama's cache (a repeated system
 * prompt): the prompt was still sent and is not free, so it is estimated, as answers without counts are.
 */
export function ollamaUsage(line: { prompt_eval_count?: number; eval_count?: number }, promptEstimate: () => number): Usage {
  return { promptTokens: line.prompt_eval_count ?? promptEstimate(), completionTokens: line.eval_count ?? 0 };
}

/** Ollama's `created_at` (ISO text) as OpenAI's `created` (seconds); now when absent or unreadable. */
export function createdSeconds(at: string | undefined): number {
  const ms = at === undefined ? Number.NaN : Date.parse(at);
  return Number.isNaN(ms) ? nowSeconds() : Math.floor(ms / 1000);
}

function finish(line: OllamaChatLine, sawToolCalls: boolean): OpenAIFinishReason {
  if (line.done_reason === "length") return "length";
  return sawToolCalls ? "tool_calls" : "stop";
}

/** Ollama gives arguments as an object (and no call id); OpenAI wants JSON text and an id. */
function toolCall(c: OllamaToolCall): OpenAIToolCall {
  const args = c.function?.arguments;
  return {
    id: c.id || toolCallId(),
    type: "function",
    function: { name: c.function?.name ?? "", arguments: typeof args === "string" ? args : JSON.stringify(args ?? {}) },
  };
}

export function ollamaChatResponse(body: unknown, req: ChatRequest | undefined): { body: WireJson; usage: Usage } {
  const b = body as OllamaChatLine;
  if (typeof b !== "object" || b === null || typeof b.message !== "object") throw new Error("Ollama answer has no message");
  const toolCalls = (b.message.tool_calls ?? []).map(toolCall);
  const usage = ollamaUsage(b, () => (req ? estimateTokens(req.messages.map((m) => m.content)) : 0));
  const head = { id: chatCompletionId(), created: createdSeconds(b.created_at), model: b.model ?? "" };
  const content = b.message.content ?? "";
  const out = chatCompletion(head, { content: content === "" && toolCalls.length > 0 ? null : content, toolCalls, reasoning: b.message.thinking }, finish(b, toolCalls.length > 0), usage);
  return { body: out, usage };
}

export interface OllamaStreamState {
  w: ChatChunkWriter;
  lines: number;
  toolCalls: number;
}

export const ollamaChatStream: StreamTransform<"chat", OllamaStreamState> = {
  framing: "ndjson",
  init: (req: ChatRequest) => ({ w: new ChatChunkWriter(req), lines: 0, toolCalls: 0 }),
  event(data, s) {
    const line = JSON.parse(data) as OllamaChatLine;
    if (typeof line.error === "string") return [{ type: "error", error: { status: 500, type: "api_error", message: `Ollama stream failed: ${line.error}` } }];
    if (s.lines++ === 0) {
      if (line.model) s.w.model = line.model;
      s.w.created = createdSeconds(line.created_at);
    }
    const parts: StreamPart[] = [];
    const m = line.message;
    if (m?.thinking) parts.push(...s.w.reasoning(m.thinking));
    if (m?.content) parts.push(...s.w.text(m.content));
    // Ollama sends each tool call whole, in one line.
    for (const c of m?.tool_calls ?? []) {
      const call = toolCall(c);
      parts.push(...s.w.toolCall(s.toolCalls++, call.id, call.function.name, call.function.arguments));
    }
    if (line.done) {
      parts.push(...s.w.start(), ...s.w.finish(finish(line, s.toolCalls > 0), ollamaUsage(line, () => s.w.estimate().promptTokens)), { type: "end" });
    }
    return parts;
  },
  estimate: (s) => s.w.estimate(),
  responseId: (s) => s.w.id,
  complete: (s) => s.w.finishedAnswer,
};
