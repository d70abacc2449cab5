/**
 * ConverseStream events (decoded from AWS's event stream by the core) → OpenAI chat chunks.
 * Content blocks are numbered across text and tool uses; OpenAI numbers tool calls alone, so the
 * state maps one onto the other. The response-format tool's input streams as plain content.
 */
import type { AwsStreamEvent, ChatRequest, ErrorInfo, StreamPart, StreamTransform, Usage, WireJson } from "../../core/contract.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";
import { chatCompletionId, nowSeconds } from "../../core/openai-ids.ts";
import { openAIUsage } from "../../core/openai-usage.ts";
import { JSON_RESPONSE_TOOL, wantsJsonResponse } from "../shared/json-response-tool.ts";
import { asObject, converseUsage, finishReason, thinkingBlock } from "./converse-response.ts";

/** Marks the content block that carries the response-format answer. */
const JSON_ANSWER = -1;

export interface ConverseStreamState {
  id: string;
  created: number;
  model: string;
  clientWantsUsage: boolean;
  jsonResponse: boolean;
  /** contentBlockIndex → OpenAI tool call index (or JSON_ANSWER). */
  toolBlocks: Map<number, number>;
  toolCalls: number;
  /** Tool blocks (contentBlockIndex) with no argument bytes yet: a tool without parameters streams none. */
  argumentless: Set<number>;
  answeredInJson: boolean;
  /**
   * With a response format, the text written so far, held back: while thinking the JSON tool is not
   * forced, and a preamble before it ("Here is the JSON:") would make the content invalid JSON.
   * Dropped when the tool is called, sent at messageStop when it is not.
   */
  heldText: string;
  roleSent: boolean;
  promptEstimate: number;
  outputChars: number;
  /** messageStop came. */
  stopped: boolean;
  /** The open reasoning block's text, sent whole with its signature in `thinking_blocks`. */
  thinking: string;
}

/** Exceptions a stream can end with → the status and type the client sees. */
const STREAM_EXCEPTIONS: Record<string, { status: number; type: string }> = {
  throttlingException: { status: 429, type: "rate_limit_error" },
  validationException: { status: 400, type: "invalid_request_error" },
  serviceUnavailableException: { status: 503, type: "api_connection_error" },
  modelStreamErrorException: { status: 500, type: "api_error" },
  internalServerException: { status: 500, type: "internal_server_error" },
};

function streamError(e: AwsStreamEvent): ErrorInfo {
  const known = STREAM_EXCEPTIONS[e.type] ?? { status: 500, type: "api_error" };
  const payload = e.payload !== null && typeof e.payload === "object" ? (e.payload as Record<string, unknown>) : {};
  const detail = typeof payload.message === "string" ? payload.message : typeof payload.Message === "string" ? payload.Message : "";
  return { status: known.status, type: known.type, message: `bedrock stream failed with ${e.type}${detail ? `: ${detail}` : ""}`, param: null };
}

function chunk(s: ConverseStreamState, delta: WireJson, finish: string | null = null): Extract<StreamPart, { type: "chunk" }> {
  return {
    type: "chunk",
    chunk: { id: s.id, object: "chat.completion.chunk", created: s.created, model: s.model, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] },
  };
}

/** The first chunk carries the role; content arriving before `messageStart` still gets one. */
function opening(s: ConverseStreamState, parts: StreamPart[]): void {
  if (s.roleSent) return;
  s.roleSent = true;
  parts.push({ ...chunk(s, { role: "assistant", content: "" }), opens: true });
}

function toolIndex(s: ConverseStreamState, block: number): number {
  let index = s.toolBlocks.get(block);
  if (index === undefined) {
    index = s.toolCalls++;
    s.toolBlocks.set(block, index);
  }
  return index;
}

function blockStart(s: ConverseStreamState, p: Record<string, unknown>, parts: StreamPart[]): void {
  const start = p.start !== null && typeof p.start === "object" ? (p.start as Record<string, unknown>) : {};
  const use = start.toolUse;
  if (use === null || typeof use !== "object") return;
  const { toolUseId, name } = use as Record<string, unknown>;
  const block = Number(p.contentBlockIndex ?? 0);
  if (s.jsonResponse && name === JSON_RESPONSE_TOOL) {
    s.toolBlocks.set(block, JSON_ANSWER);
    s.answeredInJson = true;
    s.heldText = "";
    return;
  }
  const index = toolIndex(s, block);
  s.argumentless.add(block);
  parts.push(chunk(s, { tool_calls: [{ index, id: String(toolUseId ?? ""), type: "function", function: { name: String(name ?? ""), arguments: "" } }] }));
}

/** A tool called without arguments still needs parseable ones: the non-stream answer has `{}` too. */
function blockStop(s: ConverseStreamState, p: Record<string, unknown>, parts: StreamPart[]): void {
  const block = Number(p.contentBlockIndex ?? 0);
  if (!s.argumentless.delete(block)) return;
  parts.push(chunk(s, { tool_calls: [{ index: toolIndex(s, block), function: { arguments: "{}" } }] }));
}

function blockDelta(s: ConverseStreamState, p: Record<string, unknown>, parts: StreamPart[]): void {
  const delta = asObject(p.delta, "contentBlockDelta.delta");
  if (typeof delta.text === "string") {
    s.outputChars += delta.text.length;
    // Text after the JSON tool's call is no more part of the answer than text before it.
    if (!s.jsonResponse) parts.push(chunk(s, { content: delta.text }));
    else if (!s.answeredInJson) s.heldText += delta.text;
    return;
  }
  const use = delta.toolUse;
  if (use !== null && typeof use === "object") {
    const input = String((use as Record<string, unknown>).input ?? "");
    s.outputChars += input.length;
    const block = Number(p.contentBlockIndex ?? 0);
    if (input !== "") s.argumentless.delete(block);
    const index = toolIndex(s, block);
    parts.push(index === JSON_ANSWER ? chunk(s, { content: input }) : chunk(s, { tool_calls: [{ index, function: { arguments: input } }] }));
    return;
  }
  const reasoning = delta.reasoningContent;
  if (reasoning !== null && typeof reasoning === "object") {
    const r = reasoning as Record<string, unknown>;
    if (typeof r.text === "string") {
      s.outputChars += r.text.length;
      s.thinking += r.text;
      parts.push(chunk(s, { reasoning_content: r.text }));
    }
    // The signature ends a thinking block: the whole block, signed, is what the client sends back.
    if (typeof r.signature === "string") {
      parts.push(chunk(s, { thinking_blocks: [thinkingBlock({ reasoningText: { text: s.thinking, signature: r.signature } })] }));
      s.thinking = "";
    }
    if (typeof r.redactedContent === "string") parts.push(chunk(s, { thinking_blocks: [thinkingBlock(r)] }));
  }
}

export function converseStream(): StreamTransform<"chat", ConverseStreamState> {
  return {
    framing: "aws-eventstream",
    init: (req: ChatRequest): ConverseStreamState => ({
      id: chatCompletionId(),
      created: nowSeconds(),
      model: req.model,
      clientWantsUsage: req.stream_options?.include_usage === true,
      jsonResponse: wantsJsonResponse(req),
      toolBlocks: new Map(),
      toolCalls: 0,
      argumentless: new Set(),
      answeredInJson: false,
      heldText: "",
      roleSent: false,
      promptEstimate: estimateTokens(req.messages.map((m) => m.content)),
      outputChars: 0,
      stopped: false,
      thinking: "",
    }),
    event(data: string, s: ConverseStreamState): StreamPart[] {
      const e = JSON.parse(data) as AwsStreamEvent;
      if (e.messageType !== "event") return [{ type: "error", error: streamError(e) }];
      const p = asObject(e.payload, e.type);
      const parts: StreamPart[] = [];
      switch (e.type) {
        case "messageStart":
          opening(s, parts);
          break;
        case "contentBlockStart":
          opening(s, parts);
          blockStart(s, p, parts);
          break;
        case "contentBlockDelta":
          opening(s, parts);
          blockDelta(s, p, parts);
          break;
        case "contentBlockStop":
          blockStop(s, p, parts);
          break;
        case "messageStop":
          s.stopped = true;
          opening(s, parts);
          // A response format answered without the JSON tool: the text held back is the answer after all.
          if (s.heldText !== "") parts.push(chunk(s, { content: s.heldText }));
          s.heldText = "";
          parts.push(chunk(s, {}, finishReason(p.stopReason, s.answeredInJson && s.toolCalls === 0)));
          break;
        case "metadata": {
          const usage = converseUsage(p.usage);
          parts.push({ type: "usage", usage });
          if (s.clientWantsUsage) {
            parts.push({ type: "chunk", chunk: { id: s.id, object: "chat.completion.chunk", created: s.created, model: s.model, choices: [], usage: openAIUsage(usage) } });
          }
          // ConverseStream's last event (after messageStop, which is not).
          parts.push({ type: "end" });
          break;
        }
        // Events added later carry nothing the client needs.
      }
      return parts;
    },
    estimate: (s: ConverseStreamState): Usage => ({ promptTokens: s.promptEstimate, completionTokens: Math.ceil(s.outputChars / 4) }),
    responseId: (s: ConverseStreamState) => s.id,
    complete: (s: ConverseStreamState) => s.stopped,
  };
}
