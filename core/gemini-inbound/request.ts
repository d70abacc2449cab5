/**
 * A Gemini `GenerateContentRequest` → the gateway's OpenAI chat request, so the call goes through
 * the same pipeline (access, limits, budgets, spend) as /chat/completions.
 */
import type { ChatRequest } from "../contract.ts";
import { GatewayError } from "../errors.ts";
import { checkGenerateContentRequest } from "./check.ts";
import { toJsonSchema } from "./schema.ts";
import { field, isObject, type Json, type RenderOptions } from "./types.ts";

type Message = ChatRequest["messages"][number];

function invalid(message: string, param?: string): GatewayError {
  return GatewayError.of(400, message, "invalid_request_error", param ?? null);
}

const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);

/**
 * Tool-call ids across the conversation: Gemini pairs a functionResponse with its functionCall by
 * name (ids are optional), OpenAI by id. Calls without an id get one; a response without an id
 * takes the oldest unanswered call of the same name.
 */
class CallIds {
  private next = 0;
  private readonly open = new Map<string, string[]>();

  call(name: string, id: string | undefined): string {
    const callId = id || `call_${this.next++}_${name}`;
    const queue = this.open.get(name) ?? [];
    queue.push(callId);
    this.open.set(name, queue);
    return callId;
  }

  response(name: string, id: string | undefined): string {
    const queue = this.open.get(name) ?? [];
    if (id) {
      const at = queue.indexOf(id);
      if (at >= 0) queue.splice(at, 1);
      return id;
    }
    return queue.shift() ?? `call_${this.next++}_${name}`;
  }
}

/** Audio formats OpenAI's `input_audio` takes, by MIME type. */
const AUDIO_FORMATS: Record<string, string> = { "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/mp3": "mp3", "audio/mpeg": "mp3" };

/** Google runs code execution itself: its parts, in any turn, are a conversation no other model can continue. */
function refuseCodeExecution(part: Json, where: string): void {
  if (field(part, "executableCode") !== undefined || field(part, "codeExecutionResult") !== undefined) {
    throw invalid(`${where}: code execution parts are not supported by this gateway.`, "contents");
  }
}

/** A user part with media or text → an OpenAI content part. */
function contentPart(part: Json, where: string): Json | undefined {
  const text = str(part.text);
  if (text !== undefined) return part.thought === true ? undefined : { type: "text", text };
  const inline = field(part, "inlineData");
  if (isObject(inline)) {
    const mime = str(field(inline, "mimeType")) ?? "application/octet-stream";
    const data = str(inline.data) ?? "";
    if (mime.startsWith("image/")) return { type: "image_url", image_url: { url: `data:${mime};base64,${data}` } };
    const audio = AUDIO_FORMATS[mime];
    if (audio) return { type: "input_audio", input_audio: { data, format: audio } };
    return { type: "file", file: { file_data: `data:${mime};base64,${data}` } };
  }
  const file = field(part, "fileData");
  if (isObject(file)) {
    const uri = str(field(file, "fileUri")) ?? "";
    const mime = str(field(file, "mimeType")) ?? "";
    if (mime.startsWith("image/") || mime === "") return { type: "image_url", image_url: { url: uri } };
    return { type: "file", file: { file_id: uri, format: mime } };
  }
  refuseCodeExecution(part, where);
  // thoughtSignature-only and unknown parts carry nothing an OpenAI model can read.
  return undefined;
}

function userContent(parts: Json[]): Message["content"] {
  if (parts.length === 1 && parts[0]!.type === "text") return parts[0]!.text as string;
  return parts as { type: string }[];
}

function responseText(response: unknown): string {
  return typeof response === "string" ? response : JSON.stringify(response ?? {});
}

/** One Gemini content → OpenAI messages (tool results first: they answer the previous turn's calls). */
function contentMessages(content: Json, index: number, ids: CallIds): Message[] {
  const where = `contents[${index}]`;
  const role = str(content.role) ?? "user";
  const parts = Array.isArray(content.parts) ? content.parts : [];
  if (role === "model") {
    let text = "";
    const calls: Json[] = [];
    for (const [j, p] of parts.entries()) {
      if (!isObject(p)) continue;
      refuseCodeExecution(p, `${where}.parts[${j}]`);
      const fc = field(p, "functionCall");
      if (isObject(fc)) {
        const name = str(fc.name) ?? "";
        calls.push({ id: ids.call(name, str(fc.id)), type: "function", function: { name, arguments: JSON.stringify(fc.args ?? {}) } });
      } else if (typeof p.text === "string" && p.thought !== true) text += p.text;
    }
    if (calls.length === 0 && text === "") return [];
    const msg: Message = { role: "assistant", content: text === "" ? null : text };
    if (calls.length > 0) msg.tool_calls = calls;
    return [msg];
  }
  if (role !== "user" && role !== "function" && role !== "tool") {
    throw invalid(`Invalid value at '${where}.role' (${role}): use "user" or "model".`, "contents");
  }
  const tools: Message[] = [];
  const user: Json[] = [];
  for (const [j, p] of parts.entries()) {
    if (!isObject(p)) continue;
    const fr = field(p, "functionResponse");
    if (isObject(fr)) {
      const name = str(fr.name) ?? "";
      tools.push({ role: "tool", tool_call_id: ids.response(name, str(fr.id)), content: responseText(fr.response) });
      continue;
    }
    const part = contentPart(p, `${where}.parts[${j}]`);
    if (part) user.push(part);
  }
  return user.length > 0 ? [...tools, { role: "user", content: userContent(user) }] : tools;
}

function systemText(system: unknown): string | undefined {
  if (typeof system === "string") return system;
  if (!isObject(system) || !Array.isArray(system.parts)) return undefined;
  const texts = system.parts.filter(isObject).map((p) => str(p.text)).filter((t): t is string => t !== undefined);
  return texts.length > 0 ? texts.join("\n") : undefined;
}

/** The fields of a Gemini `Tool` other than function declarations: Google-hosted tools the gateway cannot run. */
function hostedTools(tool: Json): string[] {
  return Object.keys(tool).filter((k) => k !== "functionDeclarations" && k !== "function_declarations" && tool[k] !== undefined && tool[k] !== null);
}

function openAITools(tools: unknown): Json[] | undefined {
  if (!Array.isArray(tools)) return undefined;
  const out: Json[] = [];
  for (const [i, tool] of tools.entries()) {
    if (!isObject(tool)) continue;
    const hosted = hostedTools(tool);
    if (hosted.length > 0) throw invalid(`tools[${i}]: ${hosted.join(", ")} ${hosted.length === 1 ? "is a Google-hosted tool" : "are Google-hosted tools"} that this gateway cannot run; declare functions instead.`, "tools");
    const decls = field(tool, "functionDeclarations");
    if (!Array.isArray(decls)) continue;
    for (const d of decls) {
      if (!isObject(d)) continue;
      const jsonSchema = field(d, "parametersJsonSchema");
      const params = isObject(jsonSchema) ? jsonSchema : d.parameters !== undefined ? toJsonSchema(d.parameters) : { type: "object", properties: {} };
      const fn: Json = { name: str(d.name) ?? "" };
      if (typeof d.description === "string") fn.description = d.description;
      fn.parameters = params;
      out.push({ type: "function", function: fn });
    }
  }
  return out.length > 0 ? out : undefined;
}

/**
 * toolConfig → OpenAI's tool_choice, and the tools to offer. ANY with allowedFunctionNames lets the
 * model call only those functions: one name is OpenAI's forced function; several are offered alone,
 * with "required" (OpenAI's tool_choice names one function or none).
 */
function toolChoice(config: unknown, tools: Json[]): { choice?: ChatRequest["tool_choice"]; tools: Json[] } {
  const fcc = isObject(config) ? field(config, "functionCallingConfig") : undefined;
  if (!isObject(fcc)) return { tools };
  const mode = str(fcc.mode)?.toUpperCase();
  if (mode === "NONE") return { choice: "none", tools };
  if (mode === "AUTO" || mode === "VALIDATED") return { choice: "auto", tools };
  if (mode !== "ANY") return { tools };
  const allowed = field(fcc, "allowedFunctionNames");
  if (!Array.isArray(allowed) || allowed.length === 0) return { choice: "required", tools };
  const nameOf = (t: Json) => (t.function as Json).name;
  const unknown = allowed.filter((name) => !tools.some((t) => nameOf(t) === name));
  if (unknown.length > 0) {
    throw invalid(`toolConfig.functionCallingConfig.allowedFunctionNames: ${unknown.map((n) => JSON.stringify(n)).join(", ")} ${unknown.length === 1 ? "is" : "are"} not among the declared functions.`, "toolConfig");
  }
  if (allowed.length === 1) return { choice: { type: "function", function: { name: allowed[0] as string } }, tools };
  return { choice: "required", tools: tools.filter((t) => allowed.includes(nameOf(t))) };
}

function responseFormat(config: Json): Json | undefined {
  const mime = str(field(config, "responseMimeType"));
  // The bare enum value as text: no OpenAI answer mode gives it (JSON mode would quote it, and an
  // object-only structured output refuses a string schema), so it is refused rather than changed.
  if (mime === "text/x.enum") {
    throw invalid('generationConfig.responseMimeType: "text/x.enum" (the bare enum value as text) cannot be served by this gateway; ask for "application/json" with the schema instead.', "generationConfig");
  }
  const jsonSchema = field(config, "responseJsonSchema");
  const schema = field(config, "responseSchema");
  if (isObject(jsonSchema)) return { type: "json_schema", json_schema: { name: "response", schema: jsonSchema } };
  if (isObject(schema)) return { type: "json_schema", json_schema: { name: "response", schema: toJsonSchema(schema) } };
  if (mime === "application/json") return { type: "json_object" };
  return undefined;
}

/**
 * Gemini's thinking budget in tokens → OpenAI's reasoning effort (the same steps the gateway uses
 * the other way: 0 none, 1024 low, 2048 medium, more high). -1 (dynamic) leaves the model's default.
 */
function reasoningEffort(thinking: unknown): string | undefined {
  if (!isObject(thinking)) return undefined;
  const level = str(field(thinking, "thinkingLevel"));
  if (level && level !== "THINKING_LEVEL_UNSPECIFIED") return level.toLowerCase();
  const budget = field(thinking, "thinkingBudget");
  if (typeof budget !== "number" || budget < 0) return undefined;
  return budget === 0 ? "none" : budget <= 1024 ? "low" : budget <= 2048 ? "medium" : "high";
}

/**
 * thinkingConfig → `reasoning_effort`, and `include_thoughts` when thoughts are asked for without
 * a level or budget (a reasoning effort asks a Gemini model for its thoughts already).
 */
function thinkingFields(thinking: unknown): Json {
  const effort = reasoningEffort(thinking);
  if (effort) return { reasoning_effort: effort };
  return isObject(thinking) && field(thinking, "includeThoughts") === true ? { include_thoughts: true } : {};
}

/** Answers the gateway can give on these routes: text (and the calls a model makes). */
const ANSWER_MODALITIES = ["TEXT", "MODALITY_UNSPECIFIED"];

/** An image or audio answer asked for is refused: left out, the client got text it did not ask for. */
function refuseOtherModalities(config: Json): void {
  const asked = field(config, "responseModalities");
  if (!Array.isArray(asked)) return;
  const others = asked.filter((m) => !ANSWER_MODALITIES.includes(String(m).toUpperCase()));
  if (others.length > 0) {
    throw invalid(`generationConfig.responseModalities: this gateway answers the Gemini routes with text only; ${others.map((m) => JSON.stringify(m)).join(", ")} cannot be served.`, "generationConfig");
  }
}

/** generationConfig → OpenAI sampling fields; fields without an OpenAI counterpart (topK, safety) are left out. */
function generationFields(config: unknown): Json {
  if (!isObject(config)) return {};
  refuseOtherModalities(config);
  const out: Json = {};
  const copy: [string, string][] = [
    ["temperature", "temperature"],
    ["topP", "top_p"],
    ["maxOutputTokens", "max_tokens"],
    ["candidateCount", "n"],
    ["seed", "seed"],
    ["presencePenalty", "presence_penalty"],
    ["frequencyPenalty", "frequency_penalty"],
  ];
  for (const [from, to] of copy) {
    const v = field(config, from);
    if (v !== undefined && v !== null) out[to] = v;
  }
  const stop = field(config, "stopSequences");
  if (Array.isArray(stop) && stop.length > 0) out.stop = stop;
  const format = responseFormat(config);
  if (format) out.response_format = format;
  Object.assign(out, thinkingFields(field(config, "thinkingConfig")));
  return out;
}

/** How the answer should be rendered back, read from the same request. */
export function renderOptions(body: Json): RenderOptions {
  const config = field(body, "generationConfig");
  const thinking = isObject(config) ? field(config, "thinkingConfig") : undefined;
  return { includeThoughts: isObject(thinking) && field(thinking, "includeThoughts") === true };
}

/** The Gemini request's messages and tools, for token counting as well as for calls. */
export function geminiMessages(body: Json): { messages: Message[]; tools: Json[] | undefined } {
  checkGenerateContentRequest(body);
  const cache = field(body, "cachedContent");
  if (typeof cache === "string" && cache !== "") {
    throw invalid(`cachedContent: ${JSON.stringify(cache)} is a context cache kept by Google that this gateway cannot read; send its contents in the request instead.`, "cachedContent");
  }
  const messages: Message[] = [];
  const system = systemText(field(body, "systemInstruction"));
  if (system !== undefined) messages.push({ role: "system", content: system });
  const raw = body.contents;
  const contents = Array.isArray(raw) ? raw : isObject(raw) ? [raw] : [];
  const ids = new CallIds();
  for (const [i, c] of contents.entries()) {
    if (!isObject(c)) throw invalid(`Invalid value at 'contents[${i}]': expected a Content object.`, "contents");
    messages.push(...contentMessages(c, i, ids));
  }
  return { messages, tools: openAITools(body.tools) };
}

/** A Gemini generateContent body → the OpenAI chat request the gateway calls `model` with. */
export function geminiToChat(body: Json, model: string, stream: boolean): ChatRequest {
  const { messages, tools } = geminiMessages(body);
  if (!messages.some((m) => m.role !== "system")) throw invalid("* GenerateContentRequest.contents: contents is not specified", "contents");
  const req: ChatRequest = { model, messages, ...generationFields(field(body, "generationConfig")) };
  if (tools) {
    const { choice, tools: offered } = toolChoice(field(body, "toolConfig"), tools);
    req.tools = offered;
    if (choice !== undefined) req.tool_choice = choice;
  }
  if (stream) {
    req.stream = true;
    req.stream_options = { include_usage: true };
  }
  return req;
}
