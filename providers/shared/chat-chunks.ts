/**
 * OpenAI `chat.completion.chunk`s for a native provider's stream: the role on the first chunk,
 * tool calls by index with incremental arguments, one finish chunk, and the usage chunk
 * (`choices: []`) only when the client asked for it with `stream_options.include_usage`.
 */
import type { ChatRequest, StreamPart, Usage, WireJson } from "../../core/contract.ts";
import { chatCompletionId, nowSeconds } from "../../core/openai-ids.ts";
import { openAIUsage } from "../../core/openai-usage.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";
import type { OpenAIFinishReason, ResponseHead } from "./chat-completion.ts";

export class ChatChunkWriter implements ResponseHead {
  id = chatCompletionId();
  created = nowSeconds();
  model: string;
  private roleSent = false;
  private readonly clientWantsUsage: boolean;
  private readonly promptEstimate: number;
  /** Output characters so far, for the estimate of a stream that ends without usage. */
  private outputChars = 0;
  private finished = false;

  constructor(req: ChatRequest) {
    this.model = req.model;
    this.clientWantsUsage = req.stream_options?.include_usage === true;
    this.promptEstimate = estimateTokens(req.messages.map((m) => m.content));
  }

  private chunk(delta: WireJson, finish: OpenAIFinishReason | null = null): Extract<StreamPart, { type: "chunk" }> {
    const d = this.roleSent ? delta : { role: "assistant", ...delta };
    this.roleSent = true;
    return {
      type: "chunk",
      chunk: { id: this.id, object: "chat.completion.chunk", created: this.created, model: this.model, choices: [{ index: 0, delta: d, logprobs: null, finish_reason: finish }] },
    };
  }

  /** The opening chunk (`role` and empty content), as OpenAI sends before any text; it only opens the message (StreamPart's `opens`). */
  start(): StreamPart[] {
    return this.roleSent ? [] : [{ ...this.chunk({ content: "" }), opens: true }];
  }

  text(content: string): StreamPart[] {
    if (content === "") return [];
    this.outputChars += content.length;
    return [this.chunk({ content })];
  }

  reasoning(text: string): StreamPart[] {
    if (text === "") return [];
    this.outputChars += text.length;
    return [this.chunk({ reasoning_content: text })];
  }

  /** A tool call's first chunk: its id and name, and the arguments known so far. */
  toolCall(index: number, id: string, name: string, args = ""): StreamPart[] {
    this.outputChars += name.length + args.length;
    return [this.chunk({ tool_calls: [{ index, id, type: "function", function: { name, arguments: args } }] })];
  }

  toolArguments(index: number, piece: string): StreamPart[] {
    if (piece === "") return [];
    this.outputChars += piece.length;
    return [this.chunk({ tool_calls: [{ index, function: { arguments: piece } }] })];
  }

  /** The finish chunk, the usage the gateway records and, if asked for, the usage chunk. */
  finish(reason: OpenAIFinishReason, usage: Usage | undefined): StreamPart[] {
    if (this.finished) return [];
    this.finished = true;
    const parts: StreamPart[] = [this.chunk({}, reason)];
    if (!usage) return parts;
    parts.push({ type: "usage", usage });
    if (this.clientWantsUsage) {
      parts.push({ type: "chunk", chunk: { id: this.id, object: "chat.completion.chunk", created: this.created, model: this.model, choices: [], usage: openAIUsage(usage) } });
    }
    return parts;
  }

  /** Whether the finish chunk was written (the provider's end of answer came). */
  get finishedAnswer(): boolean {
    return this.finished;
  }

  /** About four characters per token, for streams cut or cancelled before the provider's usage. */
  estimate(): Usage {
    return { promptTokens: this.promptEstimate, completionTokens: Math.ceil(this.outputChars / 4) };
  }
}
