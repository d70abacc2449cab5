/**
 * A mock Mistral upstream: `POST /v1/chat/completions` (JSON, or SSE ending in `[DONE]`) as
 * api.mistral.ai answers it. Like Mistral's API it validates the body against its documented
 * schema and refuses any field the schema lacks, at the top level or in a message, with a 422
 * `extra_forbidden` (`stream_options`, `max_completion_tokens`, `seed`: Mistral's names are
 * `max_tokens` and `random_seed`, and it sends a stream's usage on its last chunk unasked).
 *
 *   const mock = await startMockMistral({ apiKey: "mi-test" });
 */
import {
  type JsonObject,
  type MockServer,
  type Reply,
  approxTokens,
  isObject,
  lastUserText,
  promptText,
  replyPieces,
  startMockServer,
} from "./native-kit.ts";

export interface MockMistralOptions {
  /** When set, requests must carry `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
}

// The chat request's fields (mistralai/client-python ChatCompletionRequest / ChatCompletionStreamRequest).
const CHAT_FIELDS = new Set([
  "model",
  "messages",
  "temperature",
  "top_p",
  "max_tokens",
  "stream",
  "stop",
  "random_seed",
  "metadata",
  "response_format",
  "tools",
  "tool_choice",
  "presence_penalty",
  "frequency_penalty",
  "n",
  "prediction",
  "parallel_tool_calls",
  "prompt_mode",
  "safe_prompt",
]);

// Each message role's fields (SystemMessage, UserMessage, AssistantMessage, ToolMessage).
const MESSAGE_FIELDS: Record<string, Set<string>> = {
  system: new Set(["role", "content"]),
  user: new Set(["role", "content"]),
  assistant: new Set(["role", "content", "tool_calls", "prefix"]),
  tool: new Set(["role", "content", "tool_call_id", "name"]),
};

interface Violation {
  type: string;
  loc: (string | number)[];
  msg: string;
  input: unknown;
}

/** Mistral's error body: a validation failure's pydantic details under `message.detail`. */
const mistralError = (message: unknown, type = "invalid_request_error"): JsonObject => ({ object: "error", message, type, param: null, code: null });

function errorReply(status: number, message: unknown): Reply {
  return { kind: "json", status, body: mistralError(message) };
}

function defaultError(status: number): JsonObject {
  switch (status) {
    case 401:
      return { message: "Unauthorized", request_id: crypto.randomUUID().replaceAll("-", "") };
    case 429:
      return mistralError("Requests rate limit exceeded", "rate_limited");
    default:
      return mistralError("Service unavailable.", "internal_server_error");
  }
}

function extraFields(body: JsonObject, allowed: Set<string>, at: (string | number)[]): Violation[] {
  return Object.keys(body)
    .filter((k) => !allowed.has(k))
    .map((k) => ({ type: "extra_forbidden", loc: [...at, k], msg: "Extra inputs are not permitted", input: body[k] }));
}

function violations(body: JsonObject): Violation[] {
  const found = extraFields(body, CHAT_FIELDS, ["body"]);
  if (!Array.isArray(body.messages) || body.messages.length === 0) {
    found.push({ type: "missing", loc: ["body", "messages"], msg: "Field required", input: body.messages });
    return found;
  }
  for (const [i, m] of body.messages.entries()) {
    const fields = isObject(m) ? MESSAGE_FIELDS[String(m.role)] : undefined;
    if (!fields) found.push({ type: "union_tag_invalid", loc: ["body", "messages", i], msg: "Input tag does not match any of the expected tags: 'assistant', 'system', 'tool', 'user'", input: m });
    else found.push(...extraFields(m as JsonObject, fields, ["body", "messages", i, String((m as JsonObject).role)]));
  }
  return found;
}

function checkAuth(req: Request, apiKey: string | undefined): Reply | undefined {
  if (apiKey === undefined || req.headers.get("authorization") === `Bearer ${apiKey}`) return undefined;
  return { kind: "json", status: 401, body: defaultError(401) };
}

/** Control tokens of Mistral's chat template around each message (`[INST]`, `[/INST]`…): counted in `prompt_tokens`. */
const TEMPLATE_TOKENS_PER_MESSAGE = 3;

/** The usage Mistral reports: the prompt at four characters a token and its template's tokens, one token a reply piece. */
function usageOf(body: JsonObject, pieces: string[]): JsonObject {
  const prompt = approxTokens(promptText(body.messages)) + TEMPLATE_TOKENS_PER_MESSAGE * (body.messages as unknown[]).length;
  return { prompt_tokens: prompt, total_tokens: prompt + pieces.length, completion_tokens: pieces.length };
}

function chat(body: JsonObject): Reply {
  const bad = violations(body);
  if (bad.length > 0) return errorReply(422, { detail: bad });
  const { pieces, truncated } = replyPieces(lastUserText(body.messages), typeof body.max_tokens === "number" ? body.max_tokens : undefined);
  const finish = truncated ? "length" : "stop";
  const usage = usageOf(body, pieces);
  const head = { id: crypto.randomUUID().replaceAll("-", ""), created: Math.floor(Date.now() / 1000), model: body.model };
  if (body.stream !== true) {
    const message = { role: "assistant", tool_calls: null, content: pieces.join("") };
    return { kind: "json", body: { ...head, object: "chat.completion", usage, choices: [{ index: 0, message, finish_reason: finish }] } };
  }
  const chunk = (delta: JsonObject, finishReason: string | null, extra: JsonObject = {}) =>
    `data: ${JSON.stringify({ ...head, object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finishReason }], ...extra })}\n\n`;
  // The usage rides on the last chunk, the one with the finish reason; Mistral has no usage-only chunk.
  const parts = [chunk({ role: "assistant", content: "" }, null), ...pieces.map((p) => chunk({ content: p }, null)), chunk({ content: "" }, finish, { usage }), "data: [DONE]\n\n"];
  return { kind: "stream", contentType: "text/event-stream", parts };
}

export type MockMistral = MockServer;

export function startMockMistral(opts: MockMistralOptions = {}): Promise<MockMistral> {
  return startMockServer({
    errorBody: defaultError,
    route(req, url, body) {
      const denied = checkAuth(req, opts.apiKey);
      if (denied) return denied;
      if (req.method !== "POST" || url.pathname !== "/v1/chat/completions") return { kind: "json", status: 404, body: { detail: "Not Found" } };
      if (!isObject(body)) return errorReply(422, { detail: [{ type: "model_attributes_type", loc: ["body"], msg: "Input should be a valid dictionary or object to extract fields from", input: body }] });
      return chat(body);
    },
  });
}
