/**
 * An OpenAI chat request → Gemini's `GenerateContentRequest` (the body is the same for AI Studio
 * and Vertex AI, and for streaming: only the URL says "stream").
 */
import type { ChatRequest, Deployment } from "../../core/contract.ts";
import { argumentsObject, type ChatMessage, type ContentPart, contentText, functionTools, imageUrl, type SamplingNames, samplingSettings, toolCallsOf, toolChoice, toolNamesById } from "../shared/openai-request.ts";
import { reasoningEffort } from "../shared/reasoning-effort.ts";
import { audioMime, mediaPart } from "./media.ts";
import { geminiSchema, isEmptyParameters } from "./schema.ts";
import { geminiCallId, signatureOf } from "./tool-ids.ts";
import type { GeminiContent, GeminiFunctionDeclaration, GeminiGenerationConfig, GeminiPart, GeminiTool, GeminiToolConfig, GenerateContentRequest } from "./wire.ts";

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);

/** The OpenAI request fields this translation understands (beyond model, messages and stream). */
export const GEMINI_CHAT_PARAMS = [
  "temperature",
  "top_p",
  // Not OpenAI's, but Anthropic's and Gemini's own (topK); the Gemini-style routes send it.
  "top_k",
  "max_tokens",
  "max_completion_tokens",
  "stop",
  "n",
  "seed",
  "presence_penalty",
  "frequency_penalty",
  "response_format",
  "tools",
  "tool_choice",
  "functions",
  "function_call",
  "reasoning_effort",
  // Accepted for the clients that always send it; Gemini has no switch, it decides itself whether to call functions in parallel.
  "parallel_tool_calls",
  "stream_options",
  // Recorded in the spend log as the end user; Gemini has no such field.
  "user",
] as const;

/**
 * `reasoning_effort` → thinking budget (tokens). The same steps as other OpenAI-compatible
 * gateways use, so a client moving between them gets the same behaviour; `none` turns thinking off.
 */
const THINKING_BUDGET: Record<string, number> = { none: 0, minimal: 128, low: 1024, medium: 2048, high: 4096 };

/** One OpenAI content part → a Gemini part (undefined for parts Gemini cannot take). */
function contentPart(p: ContentPart): GeminiPart | undefined {
  switch (p.type) {
    case "text":
      return typeof p.text === "string" && p.text !== "" ? { text: p.text } : undefined;
    case "image_url": {
      const url = imageUrl(p);
      return url ? mediaPart(url, isObject(p.image_url) ? str(p.image_url.format) : undefined) : undefined;
    }
    case "input_audio": {
      const audio = isObject(p.input_audio) ? p.input_audio : {};
      return typeof audio.data === "string" ? { inlineData: { mimeType: audioMime(audio.format), data: audio.data } } : undefined;
    }
    case "file": {
      const file = isObject(p.file) ? p.file : {};
      const data = str(file.file_data);
      const id = str(file.file_id);
      const format = str(file.format);
      if (data) return mediaPart(data.startsWith("data:") ? data : `data:${format ?? "application/pdf"};base64,${data}`, format);
      return id ? mediaPart(id, format) : undefined;
    }
    default:
      return undefined;
  }
}

function userParts(content: ChatMessage["content"]): GeminiPart[] {
  if (typeof content === "string") return content === "" ? [] : [{ text: content }];
  if (!Array.isArray(content)) return [];
  const parts: GeminiPart[] = [];
  for (const p of content) {
    const part = contentPart(p);
    if (part) parts.push(part);
  }
  return parts;
}

function assistantParts(m: ChatMessage): GeminiPart[] {
  const parts: GeminiPart[] = [];
  const text = contentText(m.content);
  if (text !== "") parts.push({ text });
  // A legacy `function_call` has no id of its own (toolCallsOf names it by the function).
  const ids = new Set((m.tool_calls ?? []).map((c) => c.id));
  for (const call of toolCallsOf(m)) {
    const id = call.id !== "" && ids.has(call.id) ? geminiCallId(call.id) : undefined;
    const part: GeminiPart = { functionCall: { ...(id ? { id } : {}), name: call.function.name, args: argumentsObject(call.function.arguments) } };
    const signature = signatureOf(call.id);
    if (signature) part.thoughtSignature = signature;
    parts.push(part);
  }
  return parts;
}

/** A tool result: Gemini wants an object, so JSON objects go as they are and anything else is wrapped. */
function toolResult(content: ChatMessage["content"]): Record<string, unknown> {
  const text = contentText(content);
  try {
    const parsed: unknown = JSON.parse(text);
    if (isObject(parsed)) return parsed;
  } catch {
    // plain text result
  }
  return { content: text };
}

/** Appends parts to the last content when it has the same role: Gemini wants turns, not messages. */
function push(contents: GeminiContent[], role: "user" | "model", parts: GeminiPart[]): void {
  if (parts.length === 0) return;
  const last = contents[contents.length - 1];
  if (last?.role === role) last.parts.push(...parts);
  else contents.push({ role, parts });
}

function conversation(messages: ChatRequest["messages"]): { contents: GeminiContent[]; system: GeminiPart[] } {
  const contents: GeminiContent[] = [];
  const system: GeminiPart[] = [];
  // A result names its call by id; Gemini wants the function's name, from the call.
  const toolNames = toolNamesById(messages);
  for (const m of messages) {
    switch (m.role) {
      case "system":
      case "developer": {
        const text = contentText(m.content);
        if (text !== "") system.push({ text });
        break;
      }
      case "user":
        push(contents, "user", userParts(m.content));
        break;
      case "assistant":
        push(contents, "model", assistantParts(m));
        break;
      case "tool":
      case "function": {
        const name = (m.tool_call_id ? toolNames.get(m.tool_call_id) : undefined) ?? m.name ?? m.tool_call_id ?? "";
        // The call's id pairs the result with its call: parallel calls of one function share the name.
        const id = m.tool_call_id ? geminiCallId(m.tool_call_id) : undefined;
        push(contents, "user", [{ functionResponse: { ...(id ? { id } : {}), name, response: toolResult(m.content) } }]);
        break;
      }
    }
  }
  return { contents, system };
}

/** OpenAI function tools → one Gemini tool of declarations; other entries are Gemini tools given as they are (`{googleSearch: {}}`). */
function tools(req: ChatRequest): GeminiTool[] | undefined {
  const declarations: GeminiFunctionDeclaration[] = functionTools(req).map((fn) => {
    const decl: GeminiFunctionDeclaration = { name: fn.name };
    if (fn.description !== undefined) decl.description = fn.description;
    if (!isEmptyParameters(fn.parameters)) decl.parameters = geminiSchema(fn.parameters);
    return decl;
  });
  const native: GeminiTool[] = (req.tools ?? []).filter((t) => t.type !== "function");
  const all = [...(declarations.length > 0 ? [{ functionDeclarations: declarations }] : []), ...native];
  return all.length > 0 ? all : undefined;
}

function toolConfig(req: ChatRequest): GeminiToolConfig | undefined {
  if (req.tool_choice == null && req.function_call == null) return undefined;
  const choice = toolChoice(req);
  switch (choice.kind) {
    case "auto":
      return { functionCallingConfig: { mode: "AUTO" } };
    case "none":
      return { functionCallingConfig: { mode: "NONE" } };
    case "required":
      return { functionCallingConfig: { mode: "ANY" } };
    case "function":
      return { functionCallingConfig: { mode: "ANY", allowedFunctionNames: [choice.name] } };
  }
}

function responseFormat(format: ChatRequest["response_format"], config: GeminiGenerationConfig): void {
  if (!format) return;
  if (format.type === "json_object") config.responseMimeType = "application/json";
  else if (format.type === "json_schema") {
    config.responseMimeType = "application/json";
    const spec = isObject(format.json_schema) ? format.json_schema : {};
    if (isObject(spec.schema)) config.responseSchema = geminiSchema(spec.schema);
  }
}

/** Gemini's names for the OpenAI sampling fields (its `generationConfig`). */
const GEMINI_SAMPLING: SamplingNames = {
  temperature: "temperature",
  top_p: "topP",
  max_tokens: "maxOutputTokens",
  stop: "stopSequences",
  seed: "seed",
  frequency_penalty: "frequencyPenalty",
  presence_penalty: "presencePenalty",
};

function generationConfig(req: ChatRequest): GeminiGenerationConfig | undefined {
  // The table names exactly the sampling fields of GeminiGenerationConfig.
  const c = samplingSettings(req, GEMINI_SAMPLING) as GeminiGenerationConfig;
  if (req.n != null) c.candidateCount = req.n;
  const topK = (req as { top_k?: unknown }).top_k;
  if (typeof topK === "number") c.topK = topK;
  responseFormat(req.response_format, c);
  const effort = reasoningEffort(req, "gemini");
  if (effort !== undefined) {
    const budget = THINKING_BUDGET[effort]!;
    c.thinkingConfig = budget === 0 ? { thinkingBudget: 0 } : { includeThoughts: true, thinkingBudget: budget };
  } else if ((req as { include_thoughts?: unknown }).include_thoughts === true) {
    c.thinkingConfig = { includeThoughts: true };
  }
  return Object.keys(c).length > 0 ? c : undefined;
}

/** The `GenerateContentRequest` for a chat request; `svc_params.safety_settings` is passed through. */
export function generateContentBody(req: ChatRequest, d?: Deployment): GenerateContentRequest {
  const { contents, system } = conversation(req.messages);
  // Gemini needs at least one turn: a request of instructions alone sends them as the user's turn.
  const body: GenerateContentRequest = contents.length > 0 ? { contents } : { contents: [{ role: "user", parts: system }] };
  if (system.length > 0 && contents.length > 0) body.systemInstruction = { parts: system };
  const t = tools(req);
  if (t) body.tools = t;
  const tc = toolConfig(req);
  if (tc) body.toolConfig = tc;
  const gc = generationConfig(req);
  if (gc) body.generationConfig = gc;
  const safety = d?.options.safety_settings;
  if (Array.isArray(safety)) body.safetySettings = safety;
  return body;
}
