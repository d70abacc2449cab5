/**
 * A mock Azure OpenAI resource plus the Microsoft Entra ID token endpoint, in one server:
 *
 *   POST /openai/deployments/{deployment}/{chat/completions|completions|embeddings}?api-version=…
 *   POST /openai/v1/{chat/completions|completions|embeddings}        (the version-less v1 API)
 *   (also images/generations, audio/transcriptions (multipart) and audio/speech, on both forms)
 *   POST /{tenant}/oauth2/v2.0/token                                  (client credentials grant)
 *
 * Answers are OpenAI's format as Azure writes it: keys in alphabetical order, content filter
 * results on the prompt and on every choice, `apim-request-id` headers, Azure's error bodies. A
 * prompt containing `blockedPrompt` is refused by the content filter (400, `content_filter`); one
 * containing `filteredOutput` gets a completion cut with `finish_reason: "content_filter"`.
 */
import { type JsonObject, type MockServer, type Reply, approxTokens, chosenTool, isObject, jsonPieces, lastUserText, mockArguments, mockEmbedding, promptText, replyPieces, startMockServer } from "./native-kit.ts";

export interface MockAzureOptions {
  /** Accepted `api-key` header value. */
  apiKey?: string;
  /** App registrations that may get tokens (client credentials grant). */
  clients?: { tenantId: string; clientId: string; clientSecret: string }[];
  /** Extra bearer tokens accepted as they are (a fixed `azure_ad_token`). */
  staticTokens?: string[];
  /** Token lifetime in seconds (default 3599, Entra's). */
  tokenLifetime?: number;
  /** Deployment name → model; absent: every deployment serves gpt-4o. */
  deployments?: Record<string, string>;
  /** Accepted api-version values (default: a few GA and preview versions). */
  apiVersions?: string[];
  blockedPrompt?: string;
  filteredOutput?: string;
}

export interface MockAzure extends MockServer {
  /** Token requests answered (granted or refused). */
  readonly tokenRequests: number;
}

const API_VERSIONS = ["2024-02-01", "2024-06-01", "2024-10-21", "2025-01-01-preview", "2025-04-01-preview"];
const SYSTEM_FINGERPRINT = "fp_ee1d74bde0";
const DEFAULT_MODEL = "gpt-4o-2024-08-06";
const DEFAULT_DIMENSIONS = 8;

/** Azure writes JSON with its keys sorted. */
function sorted(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sorted);
  if (!isObject(v)) return v;
  return Object.fromEntries(
    Object.keys(v)
      .sort()
      .map((k) => [k, sorted(v[k])]),
  );
}

const azureError = (status: number, code: string, message: string, extra: JsonObject = {}): Reply => ({
  kind: "json",
  status,
  body: { error: { code, message, ...extra } },
});

function defaultError(status: number): JsonObject {
  const e = (code: string, message: string) => ({ error: { code, message } });
  switch (status) {
    case 400:
      return { error: { message: "The mock was told to reject this request.", type: "invalid_request_error", param: null, code: null } };
    case 401:
      return e("401", "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.");
    case 404:
      return e("DeploymentNotFound", "The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again.");
    case 429:
      return e("429", "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 1 second. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit.");
    default:
      return { error: { message: "The server had an error while processing your request. Sorry about that!", type: "server_error", param: null, code: null } };
  }
}

const safe = { filtered: false, severity: "safe" };
const notDetected = { filtered: false, detected: false };
const PROMPT_FILTER = { hate: safe, jailbreak: notDetected, self_harm: safe, sexual: safe, violence: safe };
const OUTPUT_FILTER = { hate: safe, protected_material_code: notDetected, protected_material_text: notDetected, self_harm: safe, sexual: safe, violence: safe };
const OUTPUT_BLOCKED = { ...OUTPUT_FILTER, violence: { filtered: true, severity: "medium" } };

const promptFilterResults = () => [{ prompt_index: 0, content_filter_results: PROMPT_FILTER }];

function contentFilterRefusal(): Reply {
  return azureError(
    400,
    "content_filter",
    "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
    {
      param: "prompt",
      status: 400,
      type: null,
      innererror: { code: "ResponsibleAIPolicyViolation", content_filter_result: { ...PROMPT_FILTER, violence: { filtered: true, severity: "medium" } } },
    },
  );
}

// ---------------------------------------------------------------------------------------------
// Entra ID

interface TokenState {
  issued: Set<string>;
  requests: number;
}

function tokenEndpoint(body: unknown, tenant: string, opts: MockAzureOptions, state: TokenState): Reply {
  state.requests++;
  const form = new URLSearchParams(typeof body === "string" ? body : "");
  const entraError = (status: number, error: string, code: number, description: string): Reply => ({
    kind: "json",
    status,
    body: {
      error,
      error_description: `AADSTS${code}: ${description}\r\nTrace ID: ${crypto.randomUUID()}\r\nCorrelation ID: ${crypto.randomUUID()}\r\nTimestamp: ${new Date().toISOString()}`,
      error_codes: [code],
      timestamp: new Date().toISOString(),
      trace_id: crypto.randomUUID(),
      correlation_id: crypto.randomUUID(),
      error_uri: `https://login.microsoftonline.com/error?code=${code}`,
    },
  });
  if (form.get("grant_type") !== "client_credentials") return entraError(400, "unsupported_grant_type", 70003, "The app requested an unsupported grant type.");
  if (form.get("scope") !== "https://cognitiveservices.azure.com/.default") return entraError(400, "invalid_scope", 1002012, `The provided value for scope ${form.get("scope")} is not valid.`);
  const client = (opts.clients ?? []).find((c) => c.tenantId === tenant && c.clientId === form.get("client_id"));
  if (!client) return entraError(400, "unauthorized_client", 700016, `Application with identifier '${form.get("client_id")}' was not found in the directory '${tenant}'.`);
  if (form.get("client_secret") !== client.clientSecret) {
    return entraError(401, "invalid_client", 7000215, `Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID, for a secret added to app '${client.clientId}'.`);
  }
  const token = `eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.${btoa(JSON.stringify({ aud: "https://cognitiveservices.azure.com", appid: client.clientId, jti: crypto.randomUUID() }))}.sig`;
  state.issued.add(token);
  const lifetime = opts.tokenLifetime ?? 3599;
  return { kind: "json", body: { token_type: "Bearer", expires_in: lifetime, ext_expires_in: lifetime, access_token: token } };
}

// ---------------------------------------------------------------------------------------------
// Data plane

function checkAuth(req: Request, opts: MockAzureOptions, tokens: TokenState): Reply | undefined {
  const key = req.headers.get("api-key");
  if (key !== null) return key === opts.apiKey ? undefined : defaultErrorReply(401);
  const bearer = /^Bearer (.+)$/.exec(req.headers.get("authorization") ?? "")?.[1];
  if (bearer && (tokens.issued.has(bearer) || opts.staticTokens?.includes(bearer))) return undefined;
  if (bearer) return azureError(401, "401", "Unauthorized. Access token is missing, invalid, audience is incorrect (https://cognitiveservices.azure.com), or have expired.");
  return azureError(401, "401", "Access denied due to missing subscription key. Make sure to include subscription key when making requests to an API.");
}

const defaultErrorReply = (status: number): Reply => ({ kind: "json", status, body: defaultError(status) });

interface Target {
  operation: "chat/completions" | "completions" | "embeddings" | "images/generations" | "audio/transcriptions" | "audio/speech";
  model: string;
  /** The api-version asked for; undefined on the v1 API. */
  version?: string;
}

/** The operation and model a path addresses, or Azure's 404. */
function target(url: URL, body: JsonObject, opts: MockAzureOptions): Target | Reply {
  const v1 = /^\/openai\/v1\/(chat\/completions|completions|embeddings|images\/generations|audio\/transcriptions|audio\/speech)$/.exec(url.pathname);
  if (v1) return { operation: v1[1] as Target["operation"], model: typeof body.model === "string" ? body.model : DEFAULT_MODEL };
  const m = /^\/openai\/deployments\/([^/]+)\/(chat\/completions|completions|embeddings|images\/generations|audio\/transcriptions|audio\/speech)$/.exec(url.pathname);
  if (!m) return azureError(404, "404", "Resource not found");
  const version = url.searchParams.get("api-version");
  if (!version || !(opts.apiVersions ?? API_VERSIONS).includes(version)) return azureError(404, "404", "Resource not found");
  const deployment = decodeURIComponent(m[1]!);
  const model = opts.deployments ? opts.deployments[deployment] : DEFAULT_MODEL;
  if (!model) return defaultErrorReply(404);
  return { operation: m[2] as Target["operation"], model, version };
}

const chatId = () => `chatcmpl-${crypto.randomUUID().replaceAll("-", "").slice(0, 29)}`;

function usage(prompt: number, completion: number): JsonObject {
  return {
    completion_tokens: completion,
    completion_tokens_details: { accepted_prediction_tokens: 0, audio_tokens: 0, reasoning_tokens: 0, rejected_prediction_tokens: 0 },
    prompt_tokens: prompt,
    prompt_tokens_details: { audio_tokens: 0, cached_tokens: 0 },
    total_tokens: prompt + completion,
  };
}

/** Before this api-version Azure did not know `stream_options`. */
const STREAM_OPTIONS_SINCE = "2024-09-01";

function chat(body: JsonObject, t: Target, opts: MockAzureOptions): Reply {
  const model = t.model;
  if (!Array.isArray(body.messages)) return azureError(400, "BadRequest", "'messages' is a required property");
  if ("stream_options" in body && t.version !== undefined && t.version < STREAM_OPTIONS_SINCE) {
    return { kind: "json", status: 400, body: { error: { message: "Unrecognized request argument supplied: stream_options", type: "invalid_request_error", param: null, code: null } } };
  }
  const prompt = lastUserText(body.messages);
  const all = promptText(body.messages);
  if (opts.blockedPrompt && all.includes(opts.blockedPrompt)) return contentFilterRefusal();
  const tool = body.tool_choice === "none" ? undefined : chosenTool(body.tools, prompt, body.tool_choice === "required");
  const limit = typeof body.max_completion_tokens === "number" ? body.max_completion_tokens : typeof body.max_tokens === "number" ? body.max_tokens : undefined;
  const reply = replyPieces(prompt, limit);
  const blocked = opts.filteredOutput !== undefined && all.includes(opts.filteredOutput);
  // A filtered completion stops where the filter caught it.
  const pieces = tool ? jsonPieces(JSON.stringify(mockArguments(tool.parameters))) : blocked ? reply.pieces.slice(0, 2) : reply.pieces;
  const finish = tool ? "tool_calls" : blocked ? "content_filter" : reply.truncated ? "length" : "stop";
  const id = chatId();
  const created = Math.floor(Date.now() / 1000);
  const callId = `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
  const u = usage(approxTokens(all) + 7, pieces.length);
  const outputFilter = blocked ? OUTPUT_BLOCKED : OUTPUT_FILTER;
  if (body.stream !== true) {
    const message: JsonObject = tool
      ? { content: null, refusal: null, role: "assistant", tool_calls: [{ function: { arguments: pieces.join(""), name: tool.name }, id: callId, type: "function" }] }
      : { annotations: [], content: pieces.join(""), refusal: null, role: "assistant" };
    return {
      kind: "json",
      body: sorted({
        choices: [{ content_filter_results: tool ? {} : outputFilter, finish_reason: finish, index: 0, logprobs: null, message }],
        created,
        id,
        model,
        object: "chat.completion",
        prompt_filter_results: promptFilterResults(),
        system_fingerprint: SYSTEM_FINGERPRINT,
        usage: u,
      }),
    };
  }
  const includeUsage = isObject(body.stream_options) && body.stream_options.include_usage === true;
  const chunk = (choices: unknown[], extra: JsonObject = {}) =>
    JSON.stringify(sorted({ choices, created, id, model, object: "chat.completion.chunk", system_fingerprint: SYSTEM_FINGERPRINT, ...(includeUsage ? { usage: null } : {}), ...extra }));
  const choice = (delta: JsonObject, filter: JsonObject, finishReason: string | null = null) => ({ content_filter_results: filter, delta, finish_reason: finishReason, index: 0, logprobs: null });
  const events = [JSON.stringify(sorted({ choices: [], created: 0, id: "", model: "", object: "", prompt_filter_results: promptFilterResults() }))];
  if (tool) {
    events.push(chunk([choice({ content: null, refusal: null, role: "assistant", tool_calls: [{ function: { arguments: "", name: tool.name }, id: callId, index: 0, type: "function" }] }, {})]));
    for (const p of pieces) events.push(chunk([choice({ tool_calls: [{ function: { arguments: p }, index: 0 }] }, {})]));
  } else {
    events.push(chunk([choice({ content: "", refusal: null, role: "assistant" }, {})]));
    for (const p of pieces) events.push(chunk([choice({ content: p }, outputFilter)]));
  }
  events.push(chunk([choice({}, {}, finish)]));
  if (includeUsage) events.push(chunk([], { usage: u }));
  events.push("[DONE]");
  return { kind: "stream", contentType: "text/event-stream; charset=utf-8", parts: events.map((e) => `data: ${e}\n\n`) };
}

function completions(body: JsonObject, model: string): Reply {
  const prompt = typeof body.prompt === "string" ? body.prompt : Array.isArray(body.prompt) ? body.prompt.join(" ") : "";
  const { pieces, truncated } = replyPieces(prompt, typeof body.max_tokens === "number" ? body.max_tokens : 16);
  return {
    kind: "json",
    body: sorted({
      choices: [{ content_filter_results: OUTPUT_FILTER, finish_reason: truncated ? "length" : "stop", index: 0, logprobs: null, text: pieces.join("") }],
      created: Math.floor(Date.now() / 1000),
      id: `cmpl-${crypto.randomUUID().replaceAll("-", "").slice(0, 29)}`,
      model,
      object: "text_completion",
      prompt_filter_results: promptFilterResults(),
      usage: { completion_tokens: pieces.length, prompt_tokens: approxTokens(prompt), total_tokens: pieces.length + approxTokens(prompt) },
    }),
  };
}

function float32Base64(v: number[]): string {
  return Buffer.from(new Float32Array(v).buffer).toString("base64");
}

function embeddings(body: JsonObject, model: string): Reply {
  const inputs = typeof body.input === "string" ? [body.input] : Array.isArray(body.input) ? body.input.map(String) : undefined;
  if (!inputs) return azureError(400, "BadRequest", "'input' is a required property");
  const dims = typeof body.dimensions === "number" ? body.dimensions : DEFAULT_DIMENSIONS;
  const base64 = body.encoding_format === "base64";
  const tokens = inputs.reduce((n, t) => n + approxTokens(t), 0);
  return {
    kind: "json",
    body: {
      object: "list",
      data: inputs.map((t, index) => ({ object: "embedding", index, embedding: base64 ? float32Base64(mockEmbedding(t, dims)) : mockEmbedding(t, dims) })),
      model,
      usage: { prompt_tokens: tokens, total_tokens: tokens },
    },
  };
}

/** Azure's image generation answer: `n` image URLs with the revised prompt. */
function images(body: JsonObject): Reply {
  if (typeof body.prompt !== "string") return azureError(400, "BadRequest", "'prompt' is a required property");
  const n = typeof body.n === "number" ? body.n : 1;
  const data = Array.from({ length: n }, (_, i) => ({ url: `https://dalle.mock.invalid/${i}.png`, revised_prompt: body.prompt }));
  return { kind: "json", body: { created: Math.floor(Date.now() / 1000), data } };
}

/** Whisper on Azure: OpenAI's answers; the file taken as 16 kHz 16-bit mono PCM (32,000 bytes a second). */
function transcription(body: JsonObject): Reply | Response {
  const file = isObject(body.file) ? body.file : undefined;
  if (!file) return azureError(400, "BadRequest", "'file' is a required property");
  const size = typeof file.size === "number" ? file.size : 0;
  const duration = Math.round((size / 32_000) * 100) / 100;
  const text = `Azure transcript of ${String(file.filename)} (${size} bytes).`;
  if (body.response_format === "verbose_json") return { kind: "json", body: { duration, language: "english", segments: [{ end: duration, id: 0, seek: 0, start: 0, text: ` ${text}` }], task: "transcribe", text } };
  if (body.response_format === "text") return new Response(`${text}\n`, { headers: { "content-type": "text/plain; charset=utf-8" } });
  return { kind: "json", body: { text } };
}

/** Speech on Azure: an `ID3` tag and 10 bytes per character, as audio/mpeg (audio/wav for wav). */
function speech(body: JsonObject): Reply | Response {
  if (typeof body.input !== "string" || body.input === "") return azureError(400, "BadRequest", "'input' is a required property");
  const bytes = new Uint8Array(3 + body.input.length * 10);
  bytes.set([0x49, 0x44, 0x33]);
  return new Response(bytes, { headers: { "content-type": body.response_format === "wav" ? "audio/wav" : "audio/mpeg", "apim-request-id": crypto.randomUUID() } });
}

export async function startMockAzure(opts: MockAzureOptions = {}): Promise<MockAzure> {
  const tokens: TokenState = { issued: new Set(), requests: 0 };
  const server = await startMockServer({
    errorBody: defaultError,
    headers: () => ({ "apim-request-id": crypto.randomUUID(), "x-request-id": crypto.randomUUID(), "x-ms-region": "Sweden Central", "x-ms-rai-invoked": "true" }),
    route(req, url, body) {
      const token = /^\/([^/]+)\/oauth2\/v2\.0\/token$/.exec(url.pathname);
      if (token && req.method === "POST") return tokenEndpoint(body, decodeURIComponent(token[1]!), opts, tokens);
      const denied = checkAuth(req, opts, tokens);
      if (denied) return denied;
      if (req.method !== "POST" || !isObject(body)) return azureError(404, "404", "Resource not found");
      const t = target(url, body, opts);
      if ("kind" in t) return t;
      if (t.operation === "chat/completions") return chat(body, t, opts);
      if (t.operation === "completions") return completions(body, t.model);
      if (t.operation === "images/generations") return images(body);
      if (t.operation === "audio/transcriptions") return transcription(body);
      if (t.operation === "audio/speech") return speech(body);
      return embeddings(body, t.model);
    },
  });
  return Object.defineProperty(server, "tokenRequests", { get: () => tokens.requests }) as MockAzure;
}
