/**
 * A mock Cohere v2 upstream: `POST /v2/chat` (JSON, or SSE whose `event:` line names each event)
 * and `POST /v2/embed`, with Cohere's error body `{id, message}`. It refuses OpenAI-only fields the
 * way Cohere does (`unknown field`), so an untranslated request fails here as it would there.
 * Reasoning models (`command-a-reasoning-…`) think unless `thinking: {type: "disabled"}`, up to its
 * `token_budget`, answered as `thinking` content before the text; other models refuse `thinking`.
 *
 *   const mock = await startMockCohere({ apiKey: "co-test" });
 *   mock.fault({ kind: "status", status: 429 });
 */
import {
  type JsonObject,
  type MockServer,
  type Reply,
  approxTokens,
  chosenTool,
  isObject,
  jsonPieces,
  lastUserText,
  mockArguments,
  mockEmbedding,
  promptText,
  replyPieces,
  startMockServer,
} from "./native-kit.ts";

export interface MockCohereOptions {
  /** When set, requests must carry `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** SSE line ends: "\n" (default) or "\r\n". */
  lineEnd?: "\n" | "\r\n";
  /** A prompt longer than this many characters is "too many tokens" (default 20 000). */
  contextChars?: number;
}

// The fields of Cohere's v2 chat and embed requests; anything else is refused.
const CHAT_FIELDS = new Set([
  "model",
  "messages",
  "stream",
  "tools",
  "strict_tools",
  "documents",
  "citation_options",
  "response_format",
  "safety_mode",
  "max_tokens",
  "stop_sequences",
  "temperature",
  "seed",
  "frequency_penalty",
  "presence_penalty",
  "k",
  "p",
  "logprobs",
  "tool_choice",
  "thinking",
]);
const EMBED_FIELDS = new Set(["model", "texts", "images", "inputs", "input_type", "embedding_types", "output_dimension", "max_tokens", "truncate"]);

/** The prompt template Cohere wraps every chat in: counted in `tokens`, not billed. */
const TEMPLATE_TOKENS = 66;
const DEFAULT_DIMENSIONS = 8;

const traceId = () => crypto.randomUUID();
const cohereError = (message: string): JsonObject => ({ id: traceId(), message });

function errorReply(status: number, message: string): Reply {
  return { kind: "json", status, body: cohereError(message) };
}

function defaultError(status: number): JsonObject {
  switch (status) {
    case 400:
      return cohereError("invalid request: the mock was told to reject this request.");
    case 401:
      return cohereError("invalid api token");
    case 404:
      return cohereError("model 'command-mock' not found, make sure the correct model ID was used and that you have access to the model.");
    case 429:
      return cohereError("You are using a Trial key, which is limited to 20 API calls / minute. You can continue to use the Trial key for free or upgrade to a Production key with higher rate limits at 'https://dashboard.cohere.com/api-keys'. Contact us on 'https://discord.gg/XW44jPfYJu' or email us at support@cohere.com with any questions");
    case 503:
      return cohereError("service unavailable");
    default:
      return cohereError("internal server error, this has been reported to our developers.");
  }
}

function unknownField(body: JsonObject, allowed: Set<string>): Reply | undefined {
  const extra = Object.keys(body).find((k) => !allowed.has(k));
  return extra === undefined ? undefined : errorReply(400, `invalid request: unknown field: parameter ${extra} is not a valid field`);
}

function checkAuth(req: Request, apiKey: string | undefined): Reply | undefined {
  if (apiKey === undefined) return undefined;
  const header = req.headers.get("authorization");
  if (!header) return errorReply(401, "no api key supplied");
  return header === `Bearer ${apiKey}` ? undefined : errorReply(401, "invalid api token");
}

function checkMessages(messages: unknown): Reply | undefined {
  if (!Array.isArray(messages) || messages.length === 0) return errorReply(400, "invalid request: messages cannot be empty");
  for (const m of messages) {
    if (!isObject(m) || !["system", "user", "assistant", "tool"].includes(String(m.role))) return errorReply(400, `invalid request: invalid role: ${isObject(m) ? String(m.role) : "?"}`);
    if (m.role === "tool" && typeof m.tool_call_id !== "string") return errorReply(400, "invalid request: tool message must have a tool_call_id");
    if (m.role === "assistant" && "content" in m && "tool_calls" in m) return errorReply(400, "invalid request: assistant message with tool_calls must use tool_plan, not content");
  }
  return undefined;
}

interface ChatPlan {
  id: string;
  thinking: string[];
  text: string[];
  plan: string[];
  tool?: { id: string; name: string; pieces: string[] };
  finish: "COMPLETE" | "MAX_TOKENS" | "TOOL_CALL";
  usage: JsonObject;
}

const THINKING = ["The", " user", " wants", " a", " reply", ";", " I", " will", " give", " one", "."];

/** What a chat's `thinking` asks for, or Cohere's 400 for a malformed one or a model that cannot think. */
function thinkingFor(body: JsonObject): string[] | Reply {
  const t = body.thinking;
  const reasoning = String(body.model).includes("reasoning");
  if (t === undefined) return reasoning ? THINKING : [];
  if (!reasoning) return errorReply(400, `invalid request: thinking is not supported by model '${String(body.model)}'`);
  if (!isObject(t) || (t.type !== "enabled" && t.type !== "disabled")) return errorReply(400, "invalid request: thinking.type must be one of enabled, disabled");
  if (t.token_budget !== undefined && !(Number.isInteger(t.token_budget) && (t.token_budget as number) >= 1)) return errorReply(400, "invalid request: thinking.token_budget must be a positive integer");
  if (t.type === "disabled") return [];
  // Past the budget the model stops thinking and answers (a token a piece here).
  return typeof t.token_budget === "number" ? THINKING.slice(0, t.token_budget) : THINKING;
}

function planChat(body: JsonObject, thinking: string[]): ChatPlan {
  const prompt = lastUserText(body.messages);
  const tool = body.tool_choice === "NONE" ? undefined : chosenTool(body.tools, prompt, body.tool_choice === "REQUIRED");
  const billedIn = approxTokens(promptText(body.messages));
  const usage = (out: number) => ({ billed_units: { input_tokens: billedIn, output_tokens: out }, tokens: { input_tokens: billedIn + TEMPLATE_TOKENS, output_tokens: out } });
  const id = crypto.randomUUID();
  if (tool) {
    const plan = ["I", " will", " look", " up", " the", " weather", "."];
    const args = JSON.stringify(mockArguments(tool.parameters));
    const pieces = jsonPieces(args);
    return { id, thinking, text: [], plan, tool: { id: `${tool.name}_${crypto.randomUUID().slice(0, 12)}`, name: tool.name, pieces }, finish: "TOOL_CALL", usage: usage(thinking.length + plan.length + pieces.length) };
  }
  const { pieces, truncated } = replyPieces(prompt, typeof body.max_tokens === "number" ? body.max_tokens : undefined);
  return { id, thinking, text: pieces, plan: [], finish: truncated ? "MAX_TOKENS" : "COMPLETE", usage: usage(thinking.length + pieces.length) };
}

function chatJson(p: ChatPlan): JsonObject {
  const message: JsonObject = { role: "assistant" };
  if (p.tool) {
    message.tool_plan = p.plan.join("");
    message.tool_calls = [{ id: p.tool.id, type: "function", function: { name: p.tool.name, arguments: p.tool.pieces.join("") } }];
  } else {
    message.content = [{ type: "text", text: p.text.join("") }];
  }
  if (p.thinking.length > 0) message.content = [{ type: "thinking", thinking: p.thinking.join("") }, ...((message.content as JsonObject[] | undefined) ?? [])];
  return { id: p.id, message, finish_reason: p.finish, usage: p.usage };
}

function chatEvents(p: ChatPlan): JsonObject[] {
  const events: JsonObject[] = [
    { id: p.id, type: "message-start", delta: { message: { role: "assistant", content: [], tool_plan: "", tool_calls: [], citations: [] } } },
  ];
  if (p.thinking.length > 0) {
    events.push({ type: "content-start", index: 0, delta: { message: { content: { type: "thinking", thinking: "" } } } });
    for (const piece of p.thinking) events.push({ type: "content-delta", index: 0, delta: { message: { content: { thinking: piece } } } });
    events.push({ type: "content-end", index: 0 });
  }
  const textIndex = p.thinking.length > 0 ? 1 : 0;
  if (p.tool) {
    for (const piece of p.plan) events.push({ type: "tool-plan-delta", delta: { message: { tool_plan: piece } } });
    events.push({ type: "tool-call-start", index: 0, delta: { message: { tool_calls: { id: p.tool.id, type: "function", function: { name: p.tool.name, arguments: "" } } } } });
    for (const piece of p.tool.pieces) events.push({ type: "tool-call-delta", index: 0, delta: { message: { tool_calls: { function: { arguments: piece } } } } });
    events.push({ type: "tool-call-end", index: 0 });
  } else {
    events.push({ type: "content-start", index: textIndex, delta: { message: { content: { type: "text", text: "" } } } });
    for (const piece of p.text) events.push({ type: "content-delta", index: textIndex, delta: { message: { content: { text: piece } } } });
    events.push({ type: "content-end", index: textIndex });
  }
  events.push({ type: "message-end", delta: { finish_reason: p.finish, usage: p.usage } });
  return events;
}

function chat(body: JsonObject, opts: MockCohereOptions): Reply {
  const bad = unknownField(body, CHAT_FIELDS) ?? checkMessages(body.messages);
  if (bad) return bad;
  if (typeof body.model !== "string") return errorReply(400, "invalid request: model must be specified");
  if (body.tool_choice !== undefined && body.tool_choice !== "REQUIRED" && body.tool_choice !== "NONE") {
    return errorReply(400, `invalid request: tool_choice must be one of REQUIRED, NONE, got ${JSON.stringify(body.tool_choice)}`);
  }
  const chars = promptText(body.messages).length;
  const limit = opts.contextChars ?? 20_000;
  if (chars > limit) {
    return errorReply(400, `too many tokens: total number of tokens in the prompt cannot exceed ${Math.ceil(limit / 4)} - received ${Math.ceil(chars / 4)}. Try using a shorter prompt, or enabling prompt truncating. See https://docs.cohere.com/reference/chat for more details.`);
  }
  const thinking = thinkingFor(body);
  if (!Array.isArray(thinking)) return thinking;
  const plan = planChat(body, thinking);
  if (body.stream !== true) return { kind: "json", body: chatJson(plan), headers: { num_tokens: String(approxTokens(promptText(body.messages))) } };
  const nl = opts.lineEnd ?? "\n";
  const parts = chatEvents(plan).map((e) => `event: ${String(e.type)}${nl}data: ${JSON.stringify(e)}${nl}${nl}`);
  return { kind: "stream", contentType: "text/event-stream", parts };
}

function embed(body: JsonObject): Reply {
  const bad = unknownField(body, EMBED_FIELDS);
  if (bad) return bad;
  if (typeof body.model !== "string") return errorReply(400, "invalid request: model must be specified");
  if (!Array.isArray(body.texts) || !body.texts.every((t) => typeof t === "string")) return errorReply(400, "invalid request: texts must be a list of strings");
  if (typeof body.input_type !== "string") return errorReply(400, "invalid request: valid input_type must be provided with the provided model");
  if (body.texts.length > 96) return errorReply(400, `invalid request: texts cannot have more than 96 elements, received ${body.texts.length}`);
  const types = Array.isArray(body.embedding_types) ? body.embedding_types : ["float"];
  const dims = typeof body.output_dimension === "number" ? body.output_dimension : DEFAULT_DIMENSIONS;
  const texts = body.texts as string[];
  const embeddings: JsonObject = {};
  if (types.includes("float")) embeddings.float = texts.map((t) => mockEmbedding(t, dims));
  const tokens = texts.reduce((n, t) => n + approxTokens(t), 0);
  return {
    kind: "json",
    body: { id: crypto.randomUUID(), texts, embeddings, meta: { api_version: { version: "2" }, billed_units: { input_tokens: tokens } }, response_type: "embeddings_by_type" },
  };
}

export type MockCohere = MockServer;

export function startMockCohere(opts: MockCohereOptions = {}): Promise<MockCohere> {
  return startMockServer({
    errorBody: defaultError,
    headers: () => ({ "x-debug-trace-id": traceId().replaceAll("-", "") }),
    route(req, url, body) {
      const denied = checkAuth(req, opts.apiKey);
      if (denied) return denied;
      if (req.method !== "POST" || (url.pathname !== "/v2/chat" && url.pathname !== "/v2/embed")) return errorReply(404, `Not Found: ${req.method} ${url.pathname}`);
      if (!isObject(body)) return errorReply(400, "invalid request: the request body must be a JSON object");
      return url.pathname === "/v2/chat" ? chat(body, opts) : embed(body);
    },
  });
}
