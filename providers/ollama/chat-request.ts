/** An OpenAI chat request → Ollama's `POST /api/chat` body. */
import type { ChatRequest, Deployment, WireJson } from "../../core/contract.ts";
import {
  type ChatMessage,
  argumentsObject,
  contentParts,
  contentText,
  functionTools,
  imageUrl,
  parseDataUrl,
  type SamplingNames,
  samplingSettings,
  toolCallsOf,
  toolChoice,
  toolNamesById,
  SAMPLING_AND_TOOL_PARAMS,
} from "../shared/openai-request.ts";
import { reasoningEffort } from "../shared/reasoning-effort.ts";

/** The OpenAI fields this translation understands. */
export const OLLAMA_CHAT_PARAMS: readonly string[] = [...SAMPLING_AND_TOOL_PARAMS, "reasoning_effort"];

/**
 * `reasoning_effort` → Ollama's `think`, as LiteLLM maps it. gpt-oss takes a level; Ollama refuses
 * a level for any other model, which thinks or not (on from "low" up). gpt-oss always reasons, so
 * `none` sends false (which it ignores) and `minimal` its lowest level, as Ollama knows no "minimal".
 */
const THINK: Record<string, { level: string | false; on: boolean }> = {
  none: { level: false, on: false },
  minimal: { level: "low", on: false },
  low: { level: "low", on: true },
  medium: { level: "medium", on: true },
  high: { level: "high", on: true },
};

function think(req: ChatRequest, d: Deployment): unknown {
  const effort = reasoningEffort(req, "ollama");
  // The client's effort wins over the deployment's default (`svc_params.think`).
  if (effort === undefined) return d.options.think;
  const t = THINK[effort]!;
  return /^gpt-oss/i.test(d.upstreamModel) ? t.level : t.on;
}

/** Images go as bare base64 in `images`; Ollama cannot fetch a link, so only data URLs can be sent. */
function images(content: ChatMessage["content"]): string[] {
  const out: string[] = [];
  for (const p of contentParts(content)) {
    const url = imageUrl(p);
    if (url === undefined) continue;
    const inline = parseDataUrl(url);
    if (!inline) throw new Error("Ollama takes images as base64 data URLs (data:image/png;base64,...), not links");
    out.push(inline.data);
  }
  return out;
}

function ollamaMessage(m: ChatMessage, toolNames: Map<string, string>): WireJson {
  switch (m.role) {
    case "system":
    case "developer":
      return { role: "system", content: contentText(m.content) };
    case "user": {
      const out: WireJson = { role: "user", content: contentText(m.content) };
      const imgs = images(m.content);
      if (imgs.length > 0) out.images = imgs;
      return out;
    }
    case "assistant": {
      const out: WireJson = { role: "assistant", content: contentText(m.content) };
      const calls = toolCallsOf(m);
      if (calls.length > 0) out.tool_calls = calls.map((c) => ({ function: { name: c.function.name, arguments: argumentsObject(c.function.arguments) } }));
      return out;
    }
    case "tool":
    case "function": {
      // Ollama matches a result to its call by the function's name.
      const out: WireJson = { role: "tool", content: contentText(m.content) };
      const name = m.role === "function" ? m.name : toolNames.get(m.tool_call_id ?? "");
      if (name) out.tool_name = name;
      return out;
    }
  }
}

function format(rf: WireJson): unknown {
  if (rf.type === "json_object") return "json";
  if (rf.type === "json_schema") return (rf.json_schema as { schema?: unknown } | undefined)?.schema ?? "json";
  return undefined;
}

/** Ollama's names for the OpenAI sampling fields (its `options`), for chat and generate alike. */
const OLLAMA_SAMPLING: SamplingNames = {
  temperature: "temperature",
  top_p: "top_p",
  max_tokens: "num_predict",
  stop: "stop",
  seed: "seed",
  frequency_penalty: "frequency_penalty",
  presence_penalty: "presence_penalty",
};

/** A request's Ollama `options`, or undefined when it sets none. */
export function ollamaOptions(req: Parameters<typeof samplingSettings>[0], d: Deployment): WireJson | undefined {
  const o = samplingSettings(req, OLLAMA_SAMPLING);
  // The context size is the operator's choice per deployment (Ollama's default is small).
  if (typeof d.options.num_ctx === "number") o.num_ctx = d.options.num_ctx;
  return Object.keys(o).length > 0 ? o : undefined;
}

export function ollamaChatBody(req: ChatRequest, d: Deployment): WireJson {
  const names = toolNamesById(req.messages);
  // Ollama streams unless told otherwise, so `stream` is always sent.
  const body: WireJson = { model: d.upstreamModel, messages: req.messages.map((m) => ollamaMessage(m, names)), stream: req.stream === true };
  const choice = toolChoice(req);
  let tools = choice.kind === "none" ? [] : functionTools(req);
  if (choice.kind === "function") tools = tools.filter((t) => t.name === choice.name);
  if (tools.length > 0) body.tools = tools.map((t) => ({ type: "function", function: t }));
  const f = req.response_format ? format(req.response_format) : undefined;
  if (f !== undefined) body.format = f;
  const o = ollamaOptions(req, d);
  if (o) body.options = o;
  if (d.options.keep_alive !== undefined) body.keep_alive = d.options.keep_alive;
  const t = think(req, d);
  if (t !== undefined) body.think = t;
  return body;
}
