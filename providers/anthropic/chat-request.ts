/**
 * An OpenAI chat request → the body of Anthropic's `POST /v1/messages`. The body is a plain object
 * (not text) so an adapter for another host of the same API (Claude on Vertex AI) can drop `model`
 * or add its own version field before serializing.
 */
import type { ChatRequest, WireJson } from "../../core/contract.ts";
import { THINKING_BUDGET, reasoningEffort } from "../shared/reasoning-effort.ts";
import { anthropicMessages } from "./messages.ts";
import type { AnthropicTool, AnthropicToolChoice } from "./wire.ts";

/** Anthropic requires `max_tokens`; this is used when the client gives none (every Claude model allows it). */
export const DEFAULT_MAX_TOKENS = 4096;

/**
 * `response_format` is carried by a tool of this name that the model is made to call: its input is
 * the JSON answer (Anthropic's documented way to get JSON matching a schema, on every Claude model).
 * The response and stream transforms turn a call of this tool back into message content.
 */
import { JSON_RESPONSE_TOOL } from "../shared/json-response-tool.ts";

/** The OpenAI chat fields this translation handles; `n`, `seed`, `logprobs`, penalties… are not among them. */
export const ANTHROPIC_CHAT_PARAMS = [
  "max_tokens",
  "max_completion_tokens",
  "temperature",
  "top_p",
  "top_k",
  "stop",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "response_format",
  "user",
  "reasoning_effort",
  "thinking",
  "stream_options",
] as const;


type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** Extension fields some OpenAI clients send (LiteLLM's conventions). */
interface ChatExtensions {
  reasoning_effort?: string | null;
  thinking?: Json | null;
  top_k?: number | null;
}

function thinkingOf(req: ChatRequest & ChatExtensions): Json | undefined {
  const effort = reasoningEffort(req, "anthropic");
  if (isObject(req.thinking)) return req.thinking;
  const budget = effort === undefined ? undefined : THINKING_BUDGET[effort];
  return budget === undefined ? undefined : { type: "enabled", budget_tokens: budget };
}

function thinkingBudget(thinking: Json | undefined): number {
  return thinking?.type === "enabled" && typeof thinking.budget_tokens === "number" ? thinking.budget_tokens : 0;
}

/** OpenAI function tools → Anthropic tools; native Anthropic tools (`web_search_…`, `computer_…`) pass as they are. */
function tools(list: readonly Json[]): (AnthropicTool | Json)[] {
  return list.map((t) => {
    if (t.type !== "function" || !isObject(t.function)) return t;
    const fn = t.function;
    const tool: AnthropicTool = { name: String(fn.name ?? ""), input_schema: fn.parameters ?? { type: "object", properties: {} } };
    if (typeof fn.description === "string") tool.description = fn.description;
    if (isObject(t.cache_control)) tool.cache_control = t.cache_control;
    return tool;
  });
}

function toolChoice(choice: ChatRequest["tool_choice"], parallel: boolean | null | undefined): AnthropicToolChoice | undefined {
  if (choice === "none") return { type: "none" };
  let out: Exclude<AnthropicToolChoice, { type: "none" }> | undefined;
  if (choice === "auto") out = { type: "auto" };
  else if (choice === "required") out = { type: "any" };
  else if (isObject(choice) && isObject(choice.function)) out = { type: "tool", name: String(choice.function.name ?? "") };
  if (parallel === false) out = { ...(out ?? { type: "auto" }), disable_parallel_tool_use: true };
  return out;
}

function jsonTool(format: Json): AnthropicTool | undefined {
  if (format.type === "json_object") return { name: JSON_RESPONSE_TOOL, description: "Respond with a JSON object.", input_schema: { type: "object" } };
  if (format.type !== "json_schema") return undefined;
  const spec = isObject(format.json_schema) ? format.json_schema : {};
  const description = typeof spec.description === "string" ? spec.description : "Respond with a JSON object matching the schema.";
  return { name: JSON_RESPONSE_TOOL, description, input_schema: spec.schema ?? { type: "object" } };
}


function stopSequences(stop: ChatRequest["stop"]): string[] | undefined {
  const list = typeof stop === "string" ? [stop] : Array.isArray(stop) ? stop : [];
  // Anthropic refuses whitespace-only stop sequences; OpenAI accepts them (they rarely matter).
  const kept = list.filter((s) => s.trim() !== "");
  return kept.length > 0 ? kept : undefined;
}

/** The Messages API body for an OpenAI chat request; `model` is left out when undefined (Vertex AI puts it in the URL). */
export function anthropicMessagesBody(req: ChatRequest, model: string | undefined): WireJson {
  const r = req as ChatRequest & ChatExtensions;
  const { system, messages } = anthropicMessages(req.messages);
  const thinking = thinkingOf(r);
  const budget = thinkingBudget(thinking);
  const body: WireJson = {};
  if (model !== undefined) body.model = model;
  // With thinking on, max_tokens covers thinking and answer (as max_completion_tokens does in OpenAI).
  body.max_tokens = req.max_completion_tokens ?? req.max_tokens ?? DEFAULT_MAX_TOKENS + budget;
  if (system !== undefined) body.system = system;
  body.messages = messages;
  if (thinking) body.thinking = thinking;
  if (req.temperature != null) body.temperature = req.temperature;
  if (req.top_p != null) body.top_p = req.top_p;
  if (r.top_k != null) body.top_k = r.top_k;
  const stop = stopSequences(req.stop);
  if (stop) body.stop_sequences = stop;

  const toolList = req.tools ? tools(req.tools) : [];
  let choice = toolList.length > 0 ? toolChoice(req.tool_choice, req.parallel_tool_calls) : undefined;
  const json = isObject(req.response_format) ? jsonTool(req.response_format) : undefined;
  if (json) {
    // The answer is that tool's input, so a tool call is required: the JSON tool, or one of the
    // client's own where the client lets the model call them (auto or unset becomes "any"; "none"
    // would forbid the JSON tool too). Anthropic refuses a forced tool while thinking: then the
    // JSON tool is only offered.
    if (budget === 0) {
      if (toolList.length === 0 || req.tool_choice === "none") choice = { type: "tool", name: JSON_RESPONSE_TOOL };
      else if (!choice || choice.type === "auto") choice = { ...choice, type: "any" };
    }
    toolList.push(json);
  }
  if (toolList.length > 0) body.tools = toolList;
  if (choice) body.tool_choice = choice;
  if (typeof req.user === "string" && req.user !== "") body.metadata = { user_id: req.user };
  if (req.stream === true) body.stream = true;
  return body;
}
