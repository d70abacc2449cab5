/**
 * OpenAI chat request → Bedrock Converse request body. Converse has two roles (tool results are
 * user content, system text is a separate list), typed content blocks, and wants consecutive
 * messages of one role merged into one.
 */
import type { ChatRequest, Deployment, WireJson } from "../../core/contract.ts";
import { GatewayError } from "../../core/errors.ts";
import { type SamplingNames, samplingSettings } from "../shared/openai-request.ts";
import { THINKING_BUDGET } from "../shared/reasoning-effort.ts";
import { imageFormat } from "../shared/image-formats.ts";

type Block = WireJson;
interface ConverseMessage {
  role: "user" | "assistant";
  content: Block[];
}
type ChatMessage = ChatRequest["messages"][number];
type Part = { type: string } & Record<string, unknown>;

/**
 * `response_format` becomes a tool the model is made to call (Converse has no JSON mode); its input
 * is handed back as the message content. A tool of the client's own must not use this name.
 */
import { JSON_RESPONSE_TOOL } from "../shared/json-response-tool.ts";

/** The OpenAI fields this translation handles (see EndpointAdapter.supportedParams). */
export const CONVERSE_PARAMS = [
  "max_tokens",
  "max_completion_tokens",
  "temperature",
  "top_p",
  "stop",
  "tools",
  "tool_choice",
  "response_format",
  "reasoning_effort",
  "stream_options",
  "user",
] as const;

/** Room for the answer itself when the client set no max_tokens but asked for thinking. */
const ANSWER_TOKENS_AFTER_THINKING = 4096;


const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

function invalid(message: string, param: string): GatewayError {
  return GatewayError.of(400, `bedrock: ${message}`, "invalid_request_error", param);
}

/** A `data:` URL → Converse image block; Bedrock takes image bytes inline, never a link. */
function imageBlock(part: Part): Block {
  const ref = part.image_url;
  const url = typeof ref === "string" ? ref : isObject(ref) && typeof ref.url === "string" ? ref.url : "";
  const m = /^data:([^;,]+);base64,(.*)$/s.exec(url);
  if (!m) throw invalid("images must be sent inline as data: URLs (base64); Bedrock cannot fetch image links", "messages");
  const format = imageFormat(m[1]!);
  if (!format) throw invalid(`image type ${m[1]} is not supported (png, jpeg, gif, webp)`, "messages");
  return { image: { format, source: { bytes: m[2] } } };
}

/**
 * Converse refuses a blank text block ("The text field in the ContentBlock object is blank"), which
 * OpenAI takes: blank text says nothing, so it is left out (as the Anthropic translation does).
 */
const textBlock = (text: string): Block | undefined => (text.trim() === "" ? undefined : { text });

function partBlock(part: Part): Block | undefined {
  if (part.type === "text") return textBlock(String(part.text ?? ""));
  if (part.type === "image_url") return imageBlock(part);
  throw invalid(`content part type ${part.type} is not supported`, "messages");
}

/** Content (a string or parts) → blocks; a part marked with `cache_control` is followed by a cache point. */
function contentBlocks(content: ChatMessage["content"]): Block[] {
  if (content === undefined || content === null) return [];
  if (typeof content === "string") {
    const block = textBlock(content);
    return block ? [block] : [];
  }
  const blocks: Block[] = [];
  for (const part of content as Part[]) {
    const block = partBlock(part);
    if (block === undefined) continue;
    blocks.push(block);
    if (part.cache_control !== undefined) blocks.push({ cachePoint: { type: "default" } });
  }
  return blocks;
}

function toolUseBlock(call: Record<string, unknown>): Block {
  const fn = isObject(call.function) ? call.function : {};
  const args = typeof fn.arguments === "string" && fn.arguments.trim() !== "" ? fn.arguments : "{}";
  let input: unknown;
  try {
    input = JSON.parse(args);
  } catch {
    throw invalid(`tool call ${String(call.id)} has arguments that are not JSON`, "messages");
  }
  return { toolUse: { toolUseId: String(call.id ?? ""), name: String(fn.name ?? ""), input } };
}

/** What an empty tool result says: Converse refuses a blank text block in a result as elsewhere. */
const EMPTY_TOOL_RESULT: Block = { text: "(empty)" };

function toolResultBlock(m: ChatMessage): Block {
  const content = contentBlocks(m.content).filter((b) => !("cachePoint" in b));
  return { toolResult: { toolUseId: m.tool_call_id ?? "", content: content.length > 0 ? content : [EMPTY_TOOL_RESULT] } };
}

/**
 * Thinking blocks the client echoes back on an assistant turn (as the gateway returned them in
 * `thinking_blocks`): Claude wants them, signature intact, before the tool use they led to.
 */
function reasoningBlocks(m: ChatMessage): Block[] {
  const blocks = (m as Record<string, unknown>).thinking_blocks;
  if (!Array.isArray(blocks)) return [];
  const out: Block[] = [];
  for (const b of blocks) {
    if (!isObject(b)) continue;
    if (b.type === "thinking" && typeof b.thinking === "string") {
      const text: WireJson = { text: b.thinking };
      if (typeof b.signature === "string") text.signature = b.signature;
      out.push({ reasoningContent: { reasoningText: text } });
    } else if (b.type === "redacted_thinking" && typeof b.data === "string") out.push({ reasoningContent: { redactedContent: b.data } });
  }
  return out;
}

/** One OpenAI message → a Converse message (undefined for system messages, collected apart). */
function converseMessage(m: ChatMessage): ConverseMessage | undefined {
  switch (m.role) {
    case "system":
    case "developer":
      return undefined;
    case "user":
      return { role: "user", content: contentBlocks(m.content) };
    case "assistant":
      return { role: "assistant", content: [...reasoningBlocks(m), ...contentBlocks(m.content), ...(m.tool_calls ?? []).map(toolUseBlock)] };
    case "tool":
      return { role: "user", content: [toolResultBlock(m)] };
    default:
      throw invalid(`messages with role ${m.role} are not supported`, "messages");
  }
}

function conversation(messages: ChatRequest["messages"]): { system: Block[]; messages: ConverseMessage[] } {
  const system: Block[] = [];
  const out: ConverseMessage[] = [];
  for (const m of messages) {
    if (m.role === "system" || m.role === "developer") {
      system.push(...contentBlocks(m.content));
      continue;
    }
    const converted = converseMessage(m)!;
    // Converse refuses a message without content ("content: ''" or null, no tool calls); it says nothing.
    if (converted.content.length === 0) continue;
    const last = out[out.length - 1];
    if (last?.role === converted.role) last.content.push(...converted.content);
    else out.push(converted);
  }
  // Converse needs a message: a request of instructions alone sends them as the user's turn, as for Gemini.
  if (out.length === 0 && system.length > 0) return { system: [], messages: [{ role: "user", content: system }] };
  return { system, messages: out };
}

function toolSpec(tool: Record<string, unknown>): Block {
  const fn = tool.function;
  if (tool.type !== "function" || !isObject(fn) || typeof fn.name !== "string") throw invalid("only function tools are supported", "tools");
  const spec: WireJson = { name: fn.name };
  if (typeof fn.description === "string") spec.description = fn.description;
  spec.inputSchema = { json: isObject(fn.parameters) ? fn.parameters : { type: "object", properties: {} } };
  return { toolSpec: spec };
}

function toolChoice(choice: ChatRequest["tool_choice"]): Block | undefined {
  if (choice === "auto") return { auto: {} };
  if (choice === "required") return { any: {} };
  if (isObject(choice) && isObject(choice.function) && typeof choice.function.name === "string") return { tool: { name: choice.function.name } };
  return undefined;
}

/** The forced tool standing in for `response_format` json_object / json_schema, if asked. */
function responseFormatTool(format: ChatRequest["response_format"]): Block | undefined {
  if (!isObject(format) || (format.type !== "json_object" && format.type !== "json_schema")) return undefined;
  const js = isObject(format.json_schema) ? format.json_schema : {};
  const schema = isObject(js.schema) ? js.schema : { type: "object" };
  const description = typeof js.description === "string" ? js.description : "Respond with a JSON object.";
  return { toolSpec: { name: JSON_RESPONSE_TOOL, description, inputSchema: { json: schema } } };
}

const hasToolBlocks = (messages: ConverseMessage[]) => messages.some((m) => m.content.some((b) => "toolUse" in b || "toolResult" in b));

/**
 * Converse refuses a conversation holding tool calls or results without `toolConfig`, though the
 * turn may offer no tool (a closing "summarize" turn, `tool_choice: "none"`): then this one is
 * offered, as LiteLLM offers its dummy tool, so the client's tools stay uncallable.
 */
const NO_TOOLS_PLACEHOLDER: Block = {
  toolSpec: {
    name: "no_tools_available",
    description: "Not a real tool: never call it. The tools used earlier in this conversation are not available now.",
    inputSchema: { json: { type: "object", properties: {} } },
  },
};

/** `tool_choice: "none"`, which Converse lacks, is the client's tools left out. */
function toolConfig(req: ChatRequest, messages: ConverseMessage[], thinking: boolean): WireJson | undefined {
  const tools = req.tool_choice === "none" ? [] : (req.tools ?? []).map(toolSpec);
  let choice = tools.length > 0 ? toolChoice(req.tool_choice) : undefined;
  const formatTool = responseFormatTool(req.response_format);
  if (formatTool) {
    // The answer is that tool's input, so a tool call is required: the JSON tool, or one of the
    // client's own where the client lets the model call them (auto or unset, required, a named one).
    // Claude refuses a forced tool while thinking: then the JSON tool is only offered.
    const own = tools.length > 0;
    if (!thinking) choice = !own ? { tool: { name: JSON_RESPONSE_TOOL } } : choice && !("auto" in choice) ? choice : { any: {} };
    tools.push(formatTool);
  }
  if (tools.length === 0 && hasToolBlocks(messages)) tools.push(NO_TOOLS_PLACEHOLDER);
  if (tools.length === 0) return undefined;
  return choice ? { tools, toolChoice: choice } : { tools };
}

/** Claude models on Bedrock: served by Anthropic's extended-thinking fields. */
const isClaude = (modelId: string) => modelId.includes("anthropic.claude");

/** Converse's names for the OpenAI sampling fields it takes (`maxTokens` is set above them). */
const CONVERSE_SAMPLING: SamplingNames = { temperature: "temperature", top_p: "topP", stop: "stopSequences" };

function inferenceConfig(req: ChatRequest, thinkingBudget: number | undefined): WireJson | undefined {
  const config: WireJson = {};
  const max = req.max_completion_tokens ?? req.max_tokens;
  if (max !== undefined && max !== null) config.maxTokens = max;
  else if (thinkingBudget !== undefined) config.maxTokens = thinkingBudget + ANSWER_TOKENS_AFTER_THINKING;
  samplingSettings(req, CONVERSE_SAMPLING, config);
  return Object.keys(config).length > 0 ? config : undefined;
}

export function converseBody(req: ChatRequest, d: Deployment): WireJson {
  const { system, messages } = conversation(req.messages);
  const body: WireJson = { messages };
  if (system.length > 0) body.system = system;
  const requested = (req as WireJson).reasoning_effort;
  const effort = typeof requested === "string" ? requested : undefined;
  let thinkingBudget: number | undefined;
  if (effort !== undefined && effort !== "none") {
    if (isClaude(d.upstreamModel)) {
      thinkingBudget = THINKING_BUDGET[effort];
      if (thinkingBudget === undefined) throw invalid(`reasoning_effort ${effort} is not one of minimal, low, medium, high`, "reasoning_effort");
      body.additionalModelRequestFields = { thinking: { type: "enabled", budget_tokens: thinkingBudget } };
    } else body.additionalModelRequestFields = { reasoning_effort: effort };
  }
  const inference = inferenceConfig(req, thinkingBudget);
  if (inference) body.inferenceConfig = inference;
  const tools = toolConfig(req, messages, thinkingBudget !== undefined);
  if (tools) body.toolConfig = tools;
  // A deployment-level guardrail (`svc_params.guardrailConfig`), passed as Converse expects it.
  if (isObject(d.options.guardrailConfig)) body.guardrailConfig = d.options.guardrailConfig;
  return body;
}

