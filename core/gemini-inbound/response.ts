/** An OpenAI chat completion → Gemini's `GenerateContentResponse`. */
import type { Usage } from "../contract.ts";
import { type GeminiCandidate, type GeminiPart, type GeminiResponse, type GeminiUsage, isObject, type Json, type RenderOptions } from "./types.ts";

/** OpenAI finish_reason → Gemini finishReason (a function call ends with STOP in Gemini too). */
const FINISH: Record<string, string> = {
  stop: "STOP",
  length: "MAX_TOKENS",
  tool_calls: "STOP",
  function_call: "STOP",
  content_filter: "SAFETY",
};

export function finishReason(reason: unknown): string | undefined {
  if (typeof reason !== "string") return undefined;
  return FINISH[reason] ?? "OTHER";
}

const num = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) ? v : 0);

/**
 * The gateway's usage → usageMetadata. Reasoning is inside the completion (OpenAI's convention);
 * Gemini counts thoughts apart from the candidates, so the candidates' count is the completion
 * minus reasoning. Zero details are left out, as Google leaves them out.
 */
export function geminiUsage(u: Usage, total = u.promptTokens + u.completionTokens): GeminiUsage {
  const reasoning = u.reasoningTokens ?? 0;
  const cached = u.cachedPromptTokens ?? 0;
  const out: GeminiUsage = {
    promptTokenCount: u.promptTokens,
    candidatesTokenCount: Math.max(0, u.completionTokens - reasoning),
    totalTokenCount: total,
  };
  if (cached > 0) out.cachedContentTokenCount = cached;
  if (reasoning > 0) out.thoughtsTokenCount = reasoning;
  return out;
}

/** OpenAI usage → usageMetadata. */
export function usageMetadata(usage: unknown): GeminiUsage | undefined {
  if (!isObject(usage)) return undefined;
  const promptTokens = num(usage.prompt_tokens);
  const completionTokens = num(usage.completion_tokens);
  const reasoningTokens = isObject(usage.completion_tokens_details) ? num(usage.completion_tokens_details.reasoning_tokens) : 0;
  const cachedPromptTokens = isObject(usage.prompt_tokens_details) ? num(usage.prompt_tokens_details.cached_tokens) : 0;
  return geminiUsage({ promptTokens, completionTokens, reasoningTokens, cachedPromptTokens }, num(usage.total_tokens) || promptTokens + completionTokens);
}

/** Tool-call arguments (a JSON text) → Gemini's `args` object. */
export function parseArgs(text: unknown): Json {
  if (typeof text !== "string" || text.trim() === "") return {};
  try {
    const v: unknown = JSON.parse(text);
    return isObject(v) ? v : { value: v };
  } catch {
    // Cut-off arguments (the model hit max tokens) are not JSON: hand them over rather than lose them.
    return { arguments: text };
  }
}

/** The reasoning text a provider returned beside the answer (`reasoning_content`, or `reasoning` on some). */
export function reasoningText(m: Json): string | undefined {
  const r = m.reasoning_content ?? m.reasoning;
  return typeof r === "string" && r !== "" ? r : undefined;
}

function messageParts(m: Json, opts: RenderOptions): GeminiPart[] {
  const parts: GeminiPart[] = [];
  const thought = reasoningText(m);
  if (thought && opts.includeThoughts) parts.push({ text: thought, thought: true });
  if (typeof m.content === "string" && m.content !== "") parts.push({ text: m.content });
  else if (typeof m.refusal === "string" && m.refusal !== "") parts.push({ text: m.refusal });
  if (Array.isArray(m.tool_calls)) {
    for (const c of m.tool_calls) {
      const fn = isObject(c) && isObject(c.function) ? c.function : undefined;
      if (!fn) continue;
      const call: GeminiPart["functionCall"] = { name: String(fn.name ?? ""), args: parseArgs(fn.arguments) };
      if (typeof c.id === "string") call!.id = c.id;
      parts.push({ functionCall: call });
    }
  }
  return parts.length > 0 ? parts : [{ text: "" }];
}

/**
 * `recorded`: the usage the call was logged with, for an answer that carries none (an
 * OpenAI-compatible server that sends no usage: the gateway's estimate).
 */
export function chatToGemini(body: unknown, opts: RenderOptions, recorded?: Usage): GeminiResponse {
  const b = isObject(body) ? body : {};
  const candidates: GeminiCandidate[] = [];
  for (const [i, choice] of (Array.isArray(b.choices) ? b.choices : []).entries()) {
    if (!isObject(choice)) continue;
    const finish = finishReason(choice.finish_reason);
    candidates.push({
      content: { parts: messageParts(isObject(choice.message) ? choice.message : {}, opts), role: "model" },
      ...(finish ? { finishReason: finish } : {}),
      index: typeof choice.index === "number" ? choice.index : i,
    });
  }
  const out: GeminiResponse = { candidates };
  const usage = usageMetadata(b.usage) ?? (recorded && geminiUsage(recorded));
  if (usage) out.usageMetadata = usage;
  if (typeof b.model === "string") out.modelVersion = b.model;
  if (typeof b.id === "string") out.responseId = b.id;
  return out;
}
