/**
 * Typed reading of an OpenAI chat request for adapters that translate it into another API:
 * message text, images, tool calls, tools and tool choice, stop sequences.
 */
import type { ChatRequest, WireJson } from "../../core/contract.ts";
import type { OpenAIToolCall } from "./chat-completion.ts";

export type ChatMessage = ChatRequest["messages"][number];

const isObject = (v: unknown): v is WireJson => typeof v === "object" && v !== null && !Array.isArray(v);

/** A content part of a message (`text`, `image_url`, …). */
export type ContentPart = { type: string } & WireJson;

export function contentParts(content: ChatMessage["content"]): ContentPart[] {
  if (typeof content === "string") return [{ type: "text", text: content }];
  return Array.isArray(content) ? (content as ContentPart[]) : [];
}

/** A message's text: the string, or its text parts joined. */
export function contentText(content: ChatMessage["content"]): string {
  if (typeof content === "string") return content;
  let text = "";
  for (const p of contentParts(content)) if (p.type === "text" && typeof p.text === "string") text += p.text;
  return text;
}

/** The URL of an `image_url` part (`{image_url: {url}}`, or the older bare string). */
export function imageUrl(part: ContentPart): string | undefined {
  if (part.type !== "image_url") return undefined;
  const v = part.image_url;
  if (typeof v === "string") return v;
  return isObject(v) && typeof v.url === "string" ? v.url : undefined;
}

/** `data:image/png;base64,AAAA` → its media type and base64 payload; undefined for other URLs. */
export function parseDataUrl(url: string): { mediaType: string; data: string } | undefined {
  const m = /^data:([^;,]+)?(?:;[^;,]*)*;base64,/.exec(url);
  return m ? { mediaType: m[1] ?? "application/octet-stream", data: url.slice(m[0].length) } : undefined;
}

export function stopSequences(stop: ChatRequest["stop"]): string[] | undefined {
  if (stop === undefined || stop === null) return undefined;
  return typeof stop === "string" ? [stop] : stop;
}

/** The OpenAI sampling fields of a chat or completion request. */
interface SamplingRequest {
  temperature?: number | null;
  top_p?: number | null;
  max_tokens?: number | null;
  max_completion_tokens?: number | null;
  stop?: string | string[] | null;
  seed?: unknown;
  frequency_penalty?: number | null;
  presence_penalty?: number | null;
}

/** What a provider calls each OpenAI sampling field; a field it has no name for is not sent. */
export type SamplingNames = Partial<Record<"temperature" | "top_p" | "max_tokens" | "stop" | "seed" | "frequency_penalty" | "presence_penalty", string>>;

/**
 * The sampling settings a request sets, written into `into` under the provider's names:
 * `max_tokens` is `max_completion_tokens ?? max_tokens`, `stop` always a list.
 */
export function samplingSettings(req: SamplingRequest, names: SamplingNames, into: WireJson = {}): WireJson {
  const set = (field: keyof SamplingNames, value: unknown) => {
    const name = names[field];
    if (name !== undefined && value !== undefined && value !== null) into[name] = value;
  };
  set("temperature", req.temperature);
  set("top_p", req.top_p);
  set("max_tokens", req.max_completion_tokens ?? req.max_tokens);
  set("stop", stopSequences(req.stop));
  set("seed", typeof req.seed === "number" ? req.seed : undefined);
  set("frequency_penalty", req.frequency_penalty);
  set("presence_penalty", req.presence_penalty);
  return into;
}

/** An assistant message's tool calls (the legacy `function_call` counts as one). */
export function toolCallsOf(m: ChatMessage): OpenAIToolCall[] {
  const calls: OpenAIToolCall[] = [];
  for (const c of m.tool_calls ?? []) {
    const fn = isObject(c.function) ? c.function : {};
    calls.push({
      id: typeof c.id === "string" ? c.id : "",
      type: "function",
      function: { name: typeof fn.name === "string" ? fn.name : "", arguments: typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments ?? {}) },
    });
  }
  const legacy = (m as WireJson).function_call;
  if (isObject(legacy) && typeof legacy.name === "string") {
    calls.push({ id: legacy.name, type: "function", function: { name: legacy.name, arguments: typeof legacy.arguments === "string" ? legacy.arguments : "{}" } });
  }
  return calls;
}

/** Tool arguments as an object, for APIs that take them parsed; text that is not an object is kept under `input`. */
export function argumentsObject(args: string): WireJson {
  if (args.trim() === "") return {};
  try {
    const parsed: unknown = JSON.parse(args);
    return isObject(parsed) ? parsed : { input: parsed };
  } catch {
    return { input: args };
  }
}

export interface FunctionTool {
  name: string;
  description?: string;
  parameters?: unknown;
}

/** The request's function tools (and the legacy `functions`). */
export function functionTools(req: ChatRequest): FunctionTool[] {
  const tools: FunctionTool[] = [];
  const add = (fn: unknown) => {
    if (!isObject(fn) || typeof fn.name !== "string") return;
    const t: FunctionTool = { name: fn.name };
    if (typeof fn.description === "string") t.description = fn.description;
    if (fn.parameters !== undefined) t.parameters = fn.parameters;
    tools.push(t);
  };
  for (const t of req.tools ?? []) if (t.type === "function") add(t.function);
  for (const f of req.functions ?? []) add(f);
  return tools;
}

export type ToolChoice = { kind: "auto" } | { kind: "none" } | { kind: "required" } | { kind: "function"; name: string };

export function toolChoice(req: ChatRequest): ToolChoice {
  const c = req.tool_choice ?? req.function_call;
  if (c === "none" || c === "required" || c === "auto") return { kind: c };
  if (isObject(c)) {
    const fn = isObject(c.function) ? c.function : c;
    if (typeof fn.name === "string") return { kind: "function", name: fn.name };
  }
  return { kind: "auto" };
}

/** Tool-call id → function name, from the assistant turns (APIs that name tool results by function). */
export function toolNamesById(messages: readonly ChatMessage[]): Map<string, string> {
  const names = new Map<string, string>();
  for (const m of messages) if (m.role === "assistant") for (const c of toolCallsOf(m)) names.set(c.id, c.function.name);
  return names;
}

/** The OpenAI fields a provider with sampling settings, tools and JSON output translates (Cohere, Ollama). */
export const SAMPLING_AND_TOOL_PARAMS = [
  "temperature",
  "top_p",
  "max_tokens",
  "max_completion_tokens",
  "stop",
  "seed",
  "frequency_penalty",
  "presence_penalty",
  "tools",
  "tool_choice",
  "functions",
  "function_call",
  "response_format",
  "stream_options",
  "user",
] as const;
