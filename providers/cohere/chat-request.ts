/** An OpenAI chat request → Cohere's `POST /v2/chat` body. */
import type { ChatRequest, Deployment, WireJson } from "../../core/contract.ts";
import { type ChatMessage, contentParts, contentText, functionTools, imageUrl, SAMPLING_AND_TOOL_PARAMS, type SamplingNames, samplingSettings, toolCallsOf, toolChoice } from "../shared/openai-request.ts";
import { THINKING_BUDGET, reasoningEffort } from "../shared/reasoning-effort.ts";

/** Cohere's names for the OpenAI sampling fields. */
const COHERE_SAMPLING: SamplingNames = {
  temperature: "temperature",
  top_p: "p",
  max_tokens: "max_tokens",
  stop: "stop_sequences",
  seed: "seed",
  frequency_penalty: "frequency_penalty",
  presence_penalty: "presence_penalty",
};

/** The OpenAI fields this translation understands, for some model or other. */
export const COHERE_CHAT_PARAMS: readonly string[] = [...SAMPLING_AND_TOOL_PARAMS, "reasoning_effort"];
const NON_REASONING_CHAT_PARAMS: readonly string[] = SAMPLING_AND_TOOL_PARAMS;

/**
 * Only Cohere's reasoning models (`command-a-reasoning-…`) take `thinking`; the others refuse it, so
 * for them `reasoning_effort` is the client's 400 (or dropped with `drop_params`), named as ours.
 */
export function cohereChatParams(d: Deployment): readonly string[] {
  return d.upstreamModel.includes("reasoning") ? COHERE_CHAT_PARAMS : NON_REASONING_CHAT_PARAMS;
}

/** `reasoning_effort` → Cohere's `thinking`: `none` switches it off, other levels cap it with a budget. */
function thinking(req: ChatRequest): WireJson | undefined {
  const effort = reasoningEffort(req, "cohere");
  if (effort === undefined) return undefined;
  return effort === "none" ? { type: "disabled" } : { type: "enabled", token_budget: THINKING_BUDGET[effort]! };
}

/** User content: a plain string stays one; parts keep text and images (Cohere v2 takes OpenAI's `image_url` part). */
function userContent(content: ChatMessage["content"]): string | WireJson[] {
  if (typeof content === "string") return content;
  const parts: WireJson[] = [];
  for (const p of contentParts(content)) {
    if (p.type === "text" && typeof p.text === "string") parts.push({ type: "text", text: p.text });
    const url = imageUrl(p);
    if (url !== undefined) parts.push({ type: "image_url", image_url: { url } });
  }
  return parts;
}

function cohereMessage(m: ChatMessage): WireJson {
  switch (m.role) {
    case "system":
    case "developer":
      return { role: "system", content: contentText(m.content) };
    case "user":
      return { role: "user", content: userContent(m.content) };
    case "tool":
      return { role: "tool", tool_call_id: m.tool_call_id ?? "", content: contentText(m.content) };
    case "function":
      // The legacy function result: its call was named after the function (see toolCallsOf).
      return { role: "tool", tool_call_id: m.name ?? "", content: contentText(m.content) };
    case "assistant": {
      const text = contentText(m.content);
      const calls = toolCallsOf(m);
      if (calls.length === 0) return { role: "assistant", content: text };
      // Cohere keeps the words before a tool call as the turn's `tool_plan`, not as content.
      const out: WireJson = { role: "assistant", tool_calls: calls };
      if (text) out.tool_plan = text;
      return out;
    }
  }
}

function responseFormat(rf: WireJson): WireJson | undefined {
  if (rf.type === "json_object") return { type: "json_object" };
  if (rf.type === "json_schema") {
    const spec = rf.json_schema as { schema?: unknown } | undefined;
    return spec?.schema === undefined ? { type: "json_object" } : { type: "json_object", json_schema: spec.schema };
  }
  return rf.type === "text" ? { type: "text" } : undefined;
}

export function cohereChatBody(req: ChatRequest, model: string): WireJson {
  const body: WireJson = { model, messages: req.messages.map(cohereMessage) };
  if (req.stream) body.stream = true;
  const choice = toolChoice(req);
  let tools = functionTools(req);
  // Cohere cannot force one named tool; offering only that tool and requiring a call does.
  if (choice.kind === "function") tools = tools.filter((t) => t.name === choice.name);
  if (tools.length > 0) {
    body.tools = tools.map((t) => ({ type: "function", function: t }));
    if (choice.kind === "required" || choice.kind === "function") body.tool_choice = "REQUIRED";
    if (choice.kind === "none") body.tool_choice = "NONE";
  }
  samplingSettings(req, COHERE_SAMPLING, body);
  const format = req.response_format ? responseFormat(req.response_format) : undefined;
  if (format) body.response_format = format;
  const t = thinking(req);
  if (t) body.thinking = t;
  return body;
}
