/**
 * Gemini's stream (`streamGenerateContent?alt=sse`: one whole `GenerateContentResponse` per SSE
 * event) → OpenAI `chat.completion.chunk`s. Gemini sends each function call whole in one event,
 * so a call becomes one tool-call delta with its complete arguments. Candidates (`n` > 1) keep
 * their own index, role chunk, tool-call numbering and finish chunk.
 */
import type { ChatRequest, StreamPart, StreamTransform, Usage, WireJson } from "../../core/contract.ts";
import { estimateTokens } from "../openai-compatible/adapter.ts";
import { chatCompletionId, nowSeconds } from "../../core/openai-ids.ts";
import { openAIUsage } from "../../core/openai-usage.ts";
import { finishReason, promptBlocked, sortParts } from "./response.ts";
import { groundingSearches, usageFromGemini } from "./usage.ts";
import type { GeminiCandidate, GenerateContentResponse, GoogleErrorBody } from "./wire.ts";

interface CandidateState {
  started: boolean;
  toolCalls: number;
  finished: boolean;
}

export interface GeminiStreamState {
  id: string;
  /** Whether `id` is still the generated one (Gemini's `responseId` replaces it before the first chunk). */
  idGenerated: boolean;
  created: number;
  model: string;
  clientWantsUsage: boolean;
  candidates: Map<number, CandidateState>;
  /** The candidates asked for (`n`): one may finish before the next has started. */
  asked: number;
  /** Candidates finished; the usage chunk follows the last one's finish. */
  finished: number;
  /** The latest usage Gemini reported (its figures grow as the stream goes). */
  reported?: Usage;
  /** Per candidate, the web searches its latest grounding metadata lists (Grounding with Google Search). */
  searches: Map<number, number>;
  usageSent: boolean;
  promptEstimate: number;
  outputChars: number;
}

function chunk(s: GeminiStreamState, choices: WireJson[], usage?: WireJson): StreamPart {
  const c: WireJson = { id: s.id, object: "chat.completion.chunk", created: s.created, model: s.model, choices };
  if (usage) c.usage = usage;
  return { type: "chunk", chunk: c };
}

function delta(s: GeminiStreamState, index: number, d: WireJson, finish: string | null = null): StreamPart {
  const c = candidate(s, index);
  const withRole = c.started ? d : { role: "assistant", ...d };
  c.started = true;
  return chunk(s, [{ index, delta: withRole, logprobs: null, finish_reason: finish }]);
}

function candidate(s: GeminiStreamState, index: number): CandidateState {
  let c = s.candidates.get(index);
  if (!c) {
    c = { started: false, toolCalls: 0, finished: false };
    s.candidates.set(index, c);
  }
  return c;
}

/** One candidate's slice of an event → its deltas (thinking, text, calls) and, at its end, the finish chunk. */
function candidateParts(s: GeminiStreamState, c: GeminiCandidate, position: number): StreamPart[] {
  const index = c.index ?? position;
  const searches = groundingSearches(c);
  if (searches > 0) s.searches.set(index, searches);
  const state = candidate(s, index);
  if (state.finished) return [];
  const parts: StreamPart[] = [];
  const sorted = sortParts(c.content?.parts);
  if (sorted.reasoning) parts.push(delta(s, index, { reasoning_content: sorted.reasoning }));
  if (sorted.text) parts.push(delta(s, index, { content: sorted.text }));
  for (const call of sorted.calls) {
    const first = state.started ? {} : { content: null };
    parts.push(delta(s, index, { ...first, tool_calls: [{ index: state.toolCalls++, ...call }] }));
  }
  s.outputChars += sorted.reasoning.length + sorted.text.length + sorted.calls.reduce((n, call) => n + call.function.name.length + call.function.arguments.length, 0);
  if (c.finishReason) {
    if (!state.started) parts.push(delta(s, index, { content: "" }));
    parts.push(delta(s, index, {}, finishReason(c.finishReason, state.toolCalls > 0)));
    state.finished = true;
    s.finished++;
  }
  return parts;
}

/** An error Google sends inside the stream; its code is mapped as an HTTP answer's would be (unavailable → 503). */
function streamError(res: GoogleErrorBody): StreamPart {
  const e = res.error ?? {};
  const code = typeof e.code === "number" ? e.code : 500;
  const status = code >= 400 && code < 500 ? code : code >= 502 && code <= 504 ? 503 : 500;
  const type = status === 429 ? "rate_limit_error" : status < 500 ? "invalid_request_error" : "api_error";
  return { type: "error", error: { status, type, message: `Gemini stream error${e.status ? ` (${e.status})` : ""}: ${e.message ?? "unknown error"}` } };
}

/** Every candidate asked for, and every one that came, has its finish reason. */
const allFinished = (s: GeminiStreamState): boolean => s.finished >= s.asked && s.finished === s.candidates.size;

function event(data: string, s: GeminiStreamState): StreamPart[] {
  const parsed: unknown = JSON.parse(data);
  // Vertex without `alt=sse` streams a JSON array; an SSE event holds one object.
  const res = (Array.isArray(parsed) ? parsed[0] : parsed) as GenerateContentResponse & GoogleErrorBody;
  if (res === null || typeof res !== "object") throw new Error("stream event is not a JSON object");
  if (res.error) return [streamError(res)];
  const blocked = promptBlocked(res);
  if (blocked) return [{ type: "error", error: { status: 400, type: blocked.kind, message: blocked.message } }];
  if (s.idGenerated && res.responseId) s.id = res.responseId;
  s.idGenerated = false;
  if (res.modelVersion) s.model = res.modelVersion;

  const parts: StreamPart[] = [];
  for (const [i, c] of (res.candidates ?? []).entries()) parts.push(...candidateParts(s, c, i));
  if (!res.usageMetadata) return parts;
  s.reported = usageFromGemini(res.usageMetadata);
  let searches = 0;
  for (const n of s.searches.values()) searches += n;
  if (searches > 0) s.reported.webSearchRequests = searches;
  if (allFinished(s)) {
    // Gemini's last event carries the final counts (earlier ones only the prompt's); a later one
    // (rare) only refines what is recorded.
    parts.push({ type: "usage", usage: s.reported });
    if (!s.usageSent && s.clientWantsUsage) parts.push(chunk(s, [], openAIUsage(s.reported)));
    s.usageSent = true;
  }
  return parts;
}

/**
 * A stream that ends before Gemini's final counts: the prompt as Gemini reported it (else
 * estimated), the output as the larger of what Gemini reported and what was streamed.
 */
function estimate(s: GeminiStreamState): Usage {
  const streamed = Math.ceil(s.outputChars / 4);
  if (!s.reported) return { promptTokens: s.promptEstimate, completionTokens: streamed };
  return { ...s.reported, promptTokens: s.reported.promptTokens || s.promptEstimate, completionTokens: Math.max(s.reported.completionTokens, streamed) };
}

export function geminiStream(): StreamTransform<"chat", GeminiStreamState> {
  return {
    framing: "sse",
    init: (req: ChatRequest): GeminiStreamState => ({
      id: chatCompletionId(),
      idGenerated: true,
      created: nowSeconds(),
      model: req.model,
      clientWantsUsage: req.stream_options?.include_usage === true,
      candidates: new Map(),
      asked: Math.max(1, req.n ?? 1),
      finished: 0,
      usageSent: false,
      searches: new Map(),
      promptEstimate: estimateTokens(req.messages.map((m) => m.content)),
      outputChars: 0,
    }),
    event,
    estimate,
    responseId: (s) => s.id,
    complete: allFinished,
  };
}
