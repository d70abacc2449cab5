/**
 * A mock Ollama server: `POST /api/chat` and `POST /api/generate` (JSON, or NDJSON lines ending in
 * `\n` — Ollama streams unless the body says `"stream": false`), `POST /api/embed`, `GET /api/tags`, with Ollama's
 * error body `{"error": "<text>"}`. `think` is honoured as Ollama documents it: thinking comes back as
 * `message.thinking` (true for most models; a level, and always some thinking, for gpt-oss).
 *
 *   const mock = await startMockOllama({ models: ["llama3.2"] });
 */
import {
  type JsonObject,
  type MockServer,
  type Reply,
  approxTokens,
  chosenTool,
  isObject,
  lastUserText,
  mockArguments,
  mockEmbedding,
  promptText,
  replyPieces,
  startMockServer,
} from "./native-kit.ts";

export interface MockOllamaOptions {
  /** Models "pulled"; others get Ollama's 404. Absent: every model exists. */
  models?: string[];
  /** When set, requests must carry `Authorization: Bearer <apiKey>` (ollama.com, or a proxy). */
  apiKey?: string;
  /** A prompt longer than this many characters exceeds the context length (default 20 000). */
  contextChars?: number;
}

const DEFAULT_DIMENSIONS = 8;
const THINKING = ["Let", " me", " think", "."];
/** gpt-oss reasons at a level ("medium" unless told), longer the higher; a boolean does not change it. */
const LEVEL_THINKING: Record<string, string[]> = {
  low: ["Quick", " check", "."],
  medium: THINKING,
  high: ["Let", " me", " think", " this", " through", " step", " by", " step", "."],
};

const errorReply = (status: number, error: string): Reply => ({ kind: "json", status, body: { error } });

function defaultError(status: number): JsonObject {
  switch (status) {
    case 400:
      return { error: "invalid request: the mock was told to reject this request" };
    case 401:
      return { error: "unauthorized" };
    case 404:
      return { error: 'model "llama-mock" not found, try pulling it first' };
    default:
      return { error: "llama runner process has terminated: exit status 2" };
  }
}

/** Durations in nanoseconds, as Ollama reports them. */
function timings(promptTokens: number, evalTokens: number): JsonObject {
  return {
    total_duration: 5_191_566_416,
    load_duration: 2_154_458,
    prompt_eval_count: promptTokens,
    prompt_eval_duration: 383_809_000,
    eval_count: evalTokens,
    eval_duration: 4_799_921_000,
  };
}

function checkModel(body: JsonObject, models: string[] | undefined): Reply | undefined {
  if (typeof body.model !== "string" || body.model === "") return errorReply(400, "model is required");
  if (models && !models.includes(body.model) && !models.includes(`${body.model}:latest`)) return errorReply(404, `model "${body.model}" not found, try pulling it first`);
  return undefined;
}

/**
 * The thinking `think` asks for, or Ollama's 400: a level ("low"/"medium"/"high") only for gpt-oss,
 * which thinks whatever a boolean says; any other model thinks only when `think` is true.
 */
function thinkingFor(model: string, think: unknown): string[] | Reply {
  const gptOss = model.startsWith("gpt-oss");
  if (typeof think === "string") {
    if (!Object.hasOwn(LEVEL_THINKING, think)) return errorReply(400, `invalid think value: "${think}" (must be "high", "medium", "low", true, or false)`);
    if (!gptOss) return errorReply(400, `think value "${think}" is not supported for this model`);
    return LEVEL_THINKING[think]!;
  }
  if (think !== undefined && typeof think !== "boolean") return errorReply(400, "json: cannot unmarshal think value");
  if (gptOss) return LEVEL_THINKING.medium!;
  return think === true ? THINKING : [];
}

function chat(body: JsonObject, opts: MockOllamaOptions): Reply {
  const bad = checkModel(body, opts.models);
  if (bad) return bad;
  const thinking = thinkingFor(body.model as string, body.think);
  if (!Array.isArray(thinking)) return thinking;
  if (!Array.isArray(body.messages)) return errorReply(400, "messages is required");
  const text = promptText(body.messages);
  if (text.length > (opts.contextChars ?? 20_000)) return errorReply(400, "the input length exceeds the context length");
  const options = isObject(body.options) ? body.options : {};
  const prompt = lastUserText(body.messages);
  const tool = chosenTool(body.tools, prompt, false);
  const model = body.model as string;
  const createdAt = new Date().toISOString();
  let pieces: string[] = [];
  let doneReason = "stop";
  if (!tool) {
    const reply = replyPieces(prompt, typeof options.num_predict === "number" ? options.num_predict : undefined);
    pieces = body.format !== undefined ? [JSON.stringify({ reply: reply.pieces.join("") })] : reply.pieces;
    if (reply.truncated) doneReason = "length";
  }
  const calls = tool ? [{ function: { name: tool.name, arguments: mockArguments(tool.parameters) } }] : undefined;
  const counts = timings(approxTokens(text), thinking.length + pieces.length + (tool ? 8 : 0));
  if (body.stream === false) {
    const message: JsonObject = { role: "assistant", content: pieces.join("") };
    if (thinking.length > 0) message.thinking = thinking.join("");
    if (calls) message.tool_calls = calls;
    return { kind: "json", body: { model, created_at: createdAt, message, done_reason: doneReason, done: true, ...counts } };
  }
  const lines: JsonObject[] = [];
  for (const t of thinking) lines.push({ model, created_at: createdAt, message: { role: "assistant", content: "", thinking: t }, done: false });
  for (const p of pieces) lines.push({ model, created_at: createdAt, message: { role: "assistant", content: p }, done: false });
  if (calls) lines.push({ model, created_at: createdAt, message: { role: "assistant", content: "", tool_calls: calls }, done: false });
  lines.push({ model, created_at: createdAt, message: { role: "assistant", content: "" }, done_reason: doneReason, done: true, ...counts });
  return { kind: "stream", contentType: "application/x-ndjson", parts: lines.map((l) => `${JSON.stringify(l)}\n`) };
}

/** `/api/generate`: the reply pieces as `response` text, the last line `done: true` with the counts. */
function generate(body: JsonObject, opts: MockOllamaOptions): Reply {
  const bad = checkModel(body, opts.models);
  if (bad) return bad;
  if (typeof body.prompt !== "string") return errorReply(400, "prompt must be a string");
  if (body.prompt.length > (opts.contextChars ?? 20_000)) return errorReply(400, "the input length exceeds the context length");
  const options = isObject(body.options) ? body.options : {};
  const reply = replyPieces(body.prompt, typeof options.num_predict === "number" ? options.num_predict : undefined);
  const pieces = typeof body.suffix === "string" ? [...reply.pieces, ` [before ${body.suffix}]`] : reply.pieces;
  const doneReason = reply.truncated ? "length" : "stop";
  const model = body.model as string;
  const createdAt = new Date().toISOString();
  const counts = timings(approxTokens(body.prompt), pieces.length);
  const context = [128006, 882, 128007];
  if (body.stream === false) {
    return { kind: "json", body: { model, created_at: createdAt, response: pieces.join(""), done: true, done_reason: doneReason, context, ...counts } };
  }
  const lines: JsonObject[] = pieces.map((p) => ({ model, created_at: createdAt, response: p, done: false }));
  lines.push({ model, created_at: createdAt, response: "", done: true, done_reason: doneReason, context, ...counts });
  return { kind: "stream", contentType: "application/x-ndjson", parts: lines.map((l) => `${JSON.stringify(l)}\n`) };
}

function embed(body: JsonObject, opts: MockOllamaOptions): Reply {
  const bad = checkModel(body, opts.models);
  if (bad) return bad;
  const inputs = typeof body.input === "string" ? [body.input] : Array.isArray(body.input) ? body.input : undefined;
  if (!inputs?.every((t) => typeof t === "string")) return errorReply(400, "invalid input type");
  const texts = inputs as string[];
  if (texts.some((t) => t.length > (opts.contextChars ?? 20_000))) return errorReply(400, "the input length exceeds the context length");
  const dims = typeof body.dimensions === "number" ? body.dimensions : DEFAULT_DIMENSIONS;
  const tokens = texts.reduce((n, t) => n + approxTokens(t), 0);
  return {
    kind: "json",
    body: { model: body.model, embeddings: texts.map((t) => mockEmbedding(t, dims)), total_duration: 14_143_917, load_duration: 1_019_500, prompt_eval_count: tokens },
  };
}

export type MockOllama = MockServer;

export function startMockOllama(opts: MockOllamaOptions = {}): Promise<MockOllama> {
  return startMockServer({
    errorBody: defaultError,
    route(req, url, body) {
      if (opts.apiKey !== undefined && req.headers.get("authorization") !== `Bearer ${opts.apiKey}`) return errorReply(401, "unauthorized");
      if (req.method === "GET" && url.pathname === "/api/tags") {
        return { kind: "json", body: { models: (opts.models ?? []).map((name) => ({ name, model: name, modified_at: "2025-01-01T00:00:00Z", size: 2_019_393_189 })) } };
      }
      const handlers: Record<string, (b: JsonObject, o: MockOllamaOptions) => Reply> = { "/api/chat": chat, "/api/generate": generate, "/api/embed": embed };
      const handler = handlers[url.pathname];
      if (req.method !== "POST" || !handler) return new Response("404 page not found", { status: 404, headers: { "content-type": "text/plain" } });
      if (!isObject(body)) return errorReply(400, "invalid character 'x' looking for beginning of value");
      return handler(body, opts);
    },
  });
}
