/**
 * Cohere's chat stream (SSE whose `event:` line repeats the data's `type`) → OpenAI chunks.
 * Text, thinking and tool-plan deltas become content; tool calls keep their pieces; `message-end`
 * carries the finish reason and the usage.
 */
import type { ChatRequest, StreamPart, StreamTransform } from "../../core/contract.ts";
import { ChatChunkWriter } from "../shared/chat-chunks.ts";
import { cohereFinish, cohereUsage } from "./chat-response.ts";

interface CohereDeltaMessage {
  content?: { type?: string; text?: string; thinking?: string };
  tool_plan?: string;
  tool_calls?: { id?: string; function?: { name?: string; arguments?: string } };
}

interface CohereStreamEvent {
  type?: string;
  id?: string;
  index?: number;
  delta?: { message?: CohereDeltaMessage; finish_reason?: string; usage?: unknown; error?: string };
}

export interface CohereStreamState {
  w: ChatChunkWriter;
  /** Cohere's tool-call index → the OpenAI `tool_calls[].index` given to it. */
  tools: Map<number, number>;
}

function contentDelta(s: CohereStreamState, m: CohereDeltaMessage | undefined): StreamPart[] {
  const c = m?.content;
  if (!c) return [];
  if (typeof c.thinking === "string") return s.w.reasoning(c.thinking);
  return typeof c.text === "string" ? s.w.text(c.text) : [];
}

export const cohereChatStream: StreamTransform<"chat", CohereStreamState> = {
  framing: "sse",
  init: (req: ChatRequest) => ({ w: new ChatChunkWriter(req), tools: new Map() }),
  event(data, s) {
    if (data === "[DONE]") return [];
    const ev = JSON.parse(data) as CohereStreamEvent;
    const message = ev.delta?.message;
    switch (ev.type) {
      case "message-start":
        if (ev.id) s.w.id = ev.id;
        return s.w.start();
      case "content-start":
      case "content-delta":
        return contentDelta(s, message);
      case "tool-plan-delta":
        return s.w.text(message?.tool_plan ?? "");
      case "tool-call-start": {
        const call = message?.tool_calls;
        const index = s.tools.size;
        s.tools.set(ev.index ?? index, index);
        return s.w.toolCall(index, call?.id ?? "", call?.function?.name ?? "", call?.function?.arguments ?? "");
      }
      case "tool-call-delta": {
        const index = s.tools.get(ev.index ?? s.tools.size - 1) ?? 0;
        return s.w.toolArguments(index, message?.tool_calls?.function?.arguments ?? "");
      }
      case "message-end": {
        const d = ev.delta ?? {};
        if (d.error) return [{ type: "error", error: { status: 500, type: "api_error", message: `Cohere stream failed: ${d.error}` } }];
        return [...s.w.finish(cohereFinish(d.finish_reason), d.usage === undefined ? undefined : cohereUsage(d.usage)), { type: "end" }];
      }
      default:
        // content-end, tool-call-end, citation-start/end, debug: nothing for an OpenAI client.
        return [];
    }
  },
  estimate: (s) => s.w.estimate(),
  responseId: (s) => s.w.id,
  complete: (s) => s.w.finishedAnswer,
};
