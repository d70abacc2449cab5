/** Cohere's `/v2/chat` answer → OpenAI's `chat.completion`; its finish reasons and usage. */
import type { Usage, WireJson } from "../../core/contract.ts";
import { type OpenAIFinishReason, type OpenAIToolCall, chatCompletion } from "../shared/chat-completion.ts";
import { nowSeconds } from "../../core/openai-ids.ts";

const FINISH: Record<string, OpenAIFinishReason> = {
  COMPLETE: "stop",
  STOP_SEQUENCE: "stop",
  MAX_TOKENS: "length",
  TOOL_CALL: "tool_calls",
  ERROR_TOXIC: "content_filter",
};

/** Cohere's `finish_reason` → OpenAI's; `ERROR`, `TIMEOUT` and unknown values end as `stop`. */
export function cohereFinish(reason: unknown): OpenAIFinishReason {
  return (typeof reason === "string" ? FINISH[reason] : undefined) ?? "stop";
}

const num = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) ? v : 0);
const obj = (v: unknown): WireJson => (typeof v === "object" && v !== null && !Array.isArray(v) ? (v as WireJson) : {});

/**
 * Cohere's `usage` → Usage. `billed_units` is what Cohere charges, so it wins over `tokens` (which
 * also counts the prompt template). Billed input leaves out prompt-cache hits (`cached_tokens`
 * shows up larger than it), so the prompt total is both, with the hits as its cached part.
 */
export function cohereUsage(raw: unknown): Usage {
  const u = obj(raw);
  const billed = obj(u.billed_units);
  const tokens = obj(u.tokens);
  const cached = num(u.cached_tokens);
  const usage: Usage =
    "input_tokens" in billed || "output_tokens" in billed
      ? { promptTokens: num(billed.input_tokens) + cached, completionTokens: num(billed.output_tokens) }
      : { promptTokens: Math.max(num(tokens.input_tokens), cached), completionTokens: num(tokens.output_tokens) };
  if (cached) usage.cachedPromptTokens = cached;
  return usage;
}

interface CohereContent {
  type?: string;
  text?: string;
  thinking?: string;
}

interface CohereMessage {
  content?: CohereContent[];
  tool_plan?: string;
  tool_calls?: { id?: string; function?: { name?: string; arguments?: string } }[];
}

export function cohereChatResponse(body: unknown, model: string): { body: WireJson; usage: Usage } {
  const b = obj(body);
  if (typeof b.message !== "object" || b.message === null) throw new Error("Cohere answer has no message");
  const m = b.message as CohereMessage;
  let text = "";
  let reasoning = "";
  for (const c of m.content ?? []) {
    if (c.type === "text" && typeof c.text === "string") text += c.text;
    else if (c.type === "thinking" && typeof c.thinking === "string") reasoning += c.thinking;
  }
  const toolCalls: OpenAIToolCall[] = (m.tool_calls ?? []).map((c) => ({
    id: c.id ?? "",
    type: "function",
    function: { name: c.function?.name ?? "", arguments: c.function?.arguments ?? "{}" },
  }));
  // The plan ("I will look up the weather") is the only text of a tool-calling turn: keep it as content.
  if (text === "" && m.tool_plan) text = m.tool_plan;
  const usage = cohereUsage(b.usage);
  const head = { id: typeof b.id === "string" ? b.id : "", created: nowSeconds(), model };
  const out = chatCompletion(head, { content: text === "" && toolCalls.length > 0 ? null : text, toolCalls, reasoning }, cohereFinish(b.finish_reason), usage);
  return { body: out, usage };
}
