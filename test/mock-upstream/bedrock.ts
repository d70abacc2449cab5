/**
 * A mock Amazon Bedrock runtime that answers in Bedrock's own wire format: Converse JSON,
 * ConverseStream as real `application/vnd.amazon.eventstream` frames (CRCs included, payloads
 * padded with Bedrock's `p` field), InvokeModel for Titan and Cohere embeddings, and Bedrock's
 * error bodies (`{"message"}` plus `x-amzn-ErrorType`). It verifies SigV4 signatures: each
 * request's signature is recomputed from the known secret and compared, so a gateway that signs
 * wrongly gets the 403 real AWS sends.
 *
 *   const mock = await startMockBedrock({ credentials: { accessKeyId, secretAccessKey } });
 *   mock.fault({ kind: "status", status: 429 });   // the next request is throttled
 *   ... point the gateway at mock.url (svc_params.api_base) ...
 *   await mock.stop();
 *
 * Replies are deterministic: "Mock reply to: <first words of the last user text>", one stream
 * delta per word; a tool is called when forced, or when the last user text mentions the weather.
 * With Claude's thinking on, the last assistant turn, when it calls tools, must start with its
 * reasoning block, as Bedrock requires.
 */
import { EventStreamCodec, type MessageHeaders } from "@smithy/eventstream-codec";
import { AwsV4Signer } from "aws4fetch";
import type { Server } from "bun";
import { thinkingFirst } from "./anthropic.ts";
import { mockEmbedding } from "./openai.ts";
import { renderedBytes, shapedStream, type WireShaper } from "./wire-shape.ts";

// ---------------------------------------------------------------------------------------------
// Public types

export type BedrockAction = "converse" | "converse-stream" | "invoke";

/** One misbehaviour, applied to the next matching request (FIFO); `action` restricts it. */
export type BedrockFault = { action?: BedrockAction } & (
  | {
      /** Answer with this status and Bedrock's error body; the exception name and message default per status. */
      kind: "status";
      status: number;
      errorType?: string;
      message?: string;
    }
  | { /** Never answer: the request stays open until the client aborts or `stop()`. */ kind: "hang" }
  | { /** Send this many frames, then reset the connection. A JSON answer is cut in half. */ kind: "cutStream"; afterFrames: number }
  | {
      /** After this many event frames, an exception frame (`:message-type: exception`) ends the stream. */
      kind: "exception";
      afterFrames: number;
      exceptionType: string;
      message: string;
    }
  | { /** Frame number `frame` (0-based) goes out with a broken message CRC. */ kind: "corruptFrame"; frame: number }
  | { /** The stream's bytes go out in pieces of this size, splitting frames anywhere. */ kind: "fragment"; bytes: number }
  | { /** The stream's bytes cut, replaced or ended as the shaper says (wire-shape.ts); a JSON answer is sent as usual. */ kind: "wire"; shape: WireShaper }
  | {
      /**
       * 200 with this JSON body instead of the planned answer, once the request passed the mock's
       * checks (a test's own answer); `headers` replace InvokeModel's token-count headers.
       */
      kind: "answer";
      body: unknown;
      headers?: Record<string, string>;
    }
);

export interface RecordedRequest {
  method: string;
  /** Path as sent, still percent-encoded: `/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse`. */
  path: string;
  /** Decoded model id. */
  modelId: string;
  action: string;
  /** Header names lower-cased. */
  headers: Record<string, string>;
  /** Parsed JSON body, or the raw text when it is not JSON. */
  body: unknown;
}

export interface MockBedrockOptions {
  port?: number;
  /** The region requests must be signed for (default us-east-1). */
  region?: string;
  /** IAM credentials whose SigV4 signatures are accepted. */
  credentials?: { accessKeyId: string; secretAccessKey: string; sessionToken?: string };
  /** A Bedrock API key accepted as `Authorization: Bearer`. */
  apiKey?: string;
}

export interface MockBedrock {
  /** Base URL for `svc_params.api_base` (no path). */
  readonly url: string;
  readonly requests: RecordedRequest[];
  fault(...faults: BedrockFault[]): void;
  /** Clears requests, faults and the prompt cache. */
  reset(): void;
  stop(): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Helpers

type JsonObject = Record<string, unknown>;
const isObject = (v: unknown): v is JsonObject => typeof v === "object" && v !== null && !Array.isArray(v);
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const codec = new EventStreamCodec(
  (b) => decoder.decode(b),
  (s) => encoder.encode(s),
);
const approxTokens = (text: string) => Math.ceil(text.length / 4);
const ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

function randomAlnum(length: number): string {
  let out = "";
  for (const b of crypto.getRandomValues(new Uint8Array(length))) out += ALNUM[b % ALNUM.length];
  return out;
}

/** Bedrock pads stream payloads with a `p` field of variable length to hide token sizes. */
const PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
let padSeq = 0;
const padding = () => PADDING.slice(0, 1 + ((padSeq++ * 7) % PADDING.length));

// ---------------------------------------------------------------------------------------------
// Errors, as Bedrock's Coral front end writes them

const CORAL = "http://internal.amazon.com/coral/com.amazon.coral.service/";
const BEDROCK = "http://internal.amazon.com/coral/com.amazon.bedrock/";

const DEFAULT_ERRORS: Record<number, [string, string]> = {
  400: ["ValidationException", "Malformed input request, please reformat your input and try again."],
  403: ["AccessDeniedException", "You don't have access to the model with the specified model ID."],
  404: ["ResourceNotFoundException", "Could not resolve the foundation model from the provided model identifier."],
  408: ["ModelTimeoutException", "Model has timed out in processing the request. Try your request again."],
  424: ["ModelErrorException", "The system encountered an unexpected error during processing. Try your request again."],
  429: ["ThrottlingException", "Too many requests, please wait before trying again."],
  500: ["InternalServerException", "The server encountered an internal error while processing the request."],
  503: ["ServiceUnavailableException", "Bedrock is unable to process your request."],
};

function bedrockError(status: number, errorType: string, message: string, namespace = BEDROCK): Response {
  return new Response(JSON.stringify({ message }), {
    status,
    headers: { "content-type": "application/json", "x-amzn-errortype": `${errorType}:${namespace}`, "x-amzn-requestid": crypto.randomUUID() },
  });
}

const SIGNATURE_MISMATCH =
  "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.";

const invalidSignature = (message: string) => bedrockError(403, "InvalidSignatureException", message, CORAL);
const unrecognizedClient = () => bedrockError(403, "UnrecognizedClientException", "The security token included in the request is invalid.", CORAL);

// ---------------------------------------------------------------------------------------------
// Authentication: SigV4 recomputed with the known secret, or a Bedrock API key

const AUTH_HEADER = /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/([^/]+)\/aws4_request, ?SignedHeaders=([^, ]+), ?Signature=([0-9a-f]{64})$/;
const SKEW_MS = 15 * 60 * 1000;

function amzDateMs(value: string): number {
  const m = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/.exec(value);
  return m ? Date.UTC(+m[1]!, +m[2]! - 1, +m[3]!, +m[4]!, +m[5]!, +m[6]!) : Number.NaN;
}

async function checkAuth(req: Request, rawBody: string, options: MockBedrockOptions): Promise<Response | undefined> {
  const auth = req.headers.get("authorization");
  if (!auth) return bedrockError(403, "MissingAuthenticationTokenException", "Missing Authentication Token", CORAL);
  if (auth.startsWith("Bearer ")) {
    if (options.apiKey !== undefined && auth === `Bearer ${options.apiKey}`) return undefined;
    return bedrockError(403, "AccessDeniedException", "Authentication failed: Please make sure your API Key is valid.", BEDROCK);
  }
  const m = AUTH_HEADER.exec(auth);
  if (!m) return bedrockError(403, "IncompleteSignatureException", `Authorization header requires 'Credential', 'Signature' and 'SignedHeaders' parameters. Authorization=${auth.split(" ")[0]}`, CORAL);
  const [, accessKeyId, day, region, service, signedHeaders, signature] = m as unknown as string[];
  const creds = options.credentials;
  if (!creds || accessKeyId !== creds.accessKeyId) return unrecognizedClient();
  if (service !== "bedrock") return invalidSignature(`Credential should be scoped to correct service: 'bedrock'. `);
  if (region !== (options.region ?? "us-east-1")) return invalidSignature(`Credential should be scoped to a valid region. `);
  const amzDate = req.headers.get("x-amz-date") ?? "";
  const at = amzDateMs(amzDate);
  if (Number.isNaN(at) || amzDate.slice(0, 8) !== day) return invalidSignature(SIGNATURE_MISMATCH);
  if (Math.abs(Date.now() - at) > SKEW_MS) return invalidSignature(`Signature expired: ${amzDate} is now earlier than the allowed clock skew of 15 minutes.`);
  const token = req.headers.get("x-amz-security-token") ?? undefined;
  if (creds.sessionToken !== token) return unrecognizedClient();
  const names = signedHeaders!.split(";");
  if (!names.includes("host") || !names.includes("x-amz-date")) return invalidSignature(SIGNATURE_MISMATCH);
  const headers: Record<string, string> = {};
  for (const name of names) if (name !== "host") headers[name] = req.headers.get(name) ?? "";
  // The signature as the server computes it: the same canonical request over the headers the
  // client says it signed, with the secret only the server and the client know.
  const expected = new AwsV4Signer({
    method: req.method,
    url: req.url,
    headers,
    body: rawBody,
    accessKeyId: creds.accessKeyId,
    secretAccessKey: creds.secretAccessKey,
    service,
    region,
    datetime: amzDate,
    allHeaders: true,
  });
  if (expected.signedHeaders !== signedHeaders || (await expected.signature()) !== signature) return invalidSignature(SIGNATURE_MISMATCH);
  return undefined;
}

// ---------------------------------------------------------------------------------------------
// Converse: what the "model" answers

type Block = JsonObject;

interface PlannedText {
  kind: "text";
  pieces: string[];
}
interface PlannedTool {
  kind: "toolUse";
  toolUseId: string;
  name: string;
  input: JsonObject;
  /** The input JSON as the stream sends it, in pieces. */
  pieces: string[];
}
interface PlannedReasoning {
  kind: "reasoning";
  pieces: string[];
  signature: string;
}
type PlannedBlock = PlannedText | PlannedTool | PlannedReasoning;

interface Plan {
  blocks: PlannedBlock[];
  stopReason: string;
  usage: JsonObject;
}

function blockText(block: unknown): string {
  if (!isObject(block)) return "";
  if (typeof block.text === "string") return block.text;
  if (isObject(block.toolResult) && Array.isArray(block.toolResult.content)) return block.toolResult.content.map(blockText).join(" ");
  if (isObject(block.json)) return JSON.stringify(block.json);
  return "";
}

const contentOf = (m: unknown): unknown[] => (isObject(m) && Array.isArray(m.content) ? m.content : []);

/** A Converse block's type in Claude's terms (what Bedrock hands on to an Anthropic model). */
const claudeType = (b: unknown): string => (isObject(b) ? ("toolUse" in b ? "tool_use" : "toolResult" in b ? "tool_result" : "reasoningContent" in b ? (isObject(b.reasoningContent) && "redactedContent" in b.reasoningContent ? "redacted_thinking" : "thinking") : "image" in b ? "image" : "text") : "text");

function validateConverse(body: JsonObject): Response | undefined {
  const messages = body.messages;
  if (!Array.isArray(messages) || messages.length === 0) return bedrockError(400, "ValidationException", "The messages field is required and must contain at least one message.");
  if (!isObject(messages[0]) || messages[0].role !== "user") {
    return bedrockError(400, "ValidationException", "A conversation must start with a user message. Try again with a conversation that starts with a user message.");
  }
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i];
    if (!isObject(m) || (m.role !== "user" && m.role !== "assistant")) return bedrockError(400, "ValidationException", `1 validation error detected: Value at 'messages.${i + 1}.member.role' failed to satisfy constraint: Member must satisfy enum value set: [user, assistant]`);
    if (i > 0 && isObject(messages[i - 1]) && (messages[i - 1] as JsonObject).role === m.role) {
      return bedrockError(400, "ValidationException", "A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again.");
    }
    const content = contentOf(m);
    if (content.length === 0) return bedrockError(400, "ValidationException", `The content field in the Message object at messages.${i}.content is empty. Add a ContentBlock object to the content field and try again.`);
    // A tool result's text blocks are held to the same rule as the message's own.
    const toolResultContent = content.flatMap((b) => (isObject(b) && isObject(b.toolResult) && Array.isArray(b.toolResult.content) ? b.toolResult.content : []));
    for (const b of [...content, ...toolResultContent]) {
      if (isObject(b) && typeof b.text === "string" && b.text.trim() === "") {
        return bedrockError(400, "ValidationException", "The text field in the ContentBlock object is blank. Add text to the text field, and try again.");
      }
      if (isObject(b) && ("toolUse" in b || "toolResult" in b) && !isObject(body.toolConfig)) {
        return bedrockError(400, "ValidationException", "The toolConfig field must be defined when using toolUse and toolResult content blocks.");
      }
    }
  }
  const extra = isObject(body.additionalModelRequestFields) ? body.additionalModelRequestFields : {};
  if (isObject(extra.thinking) && extra.thinking.type === "enabled") {
    const problem = thinkingFirst(messages, (m) => contentOf(m).map(claudeType));
    if (problem) return bedrockError(400, "ValidationException", `The model returned the following errors: ${problem}`);
  }
  return undefined;
}

interface ToolSpec {
  name: string;
  schema: unknown;
}

function toolSpecs(body: JsonObject): ToolSpec[] {
  const config = isObject(body.toolConfig) ? body.toolConfig : {};
  const tools = Array.isArray(config.tools) ? config.tools : [];
  return tools.flatMap((t) => {
    if (!isObject(t) || !isObject(t.toolSpec) || typeof t.toolSpec.name !== "string") return [];
    const schema = isObject(t.toolSpec.inputSchema) ? t.toolSpec.inputSchema.json : undefined;
    return [{ name: t.toolSpec.name, schema }];
  });
}

function mockValue(key: string, schema: unknown): unknown {
  if (!isObject(schema)) return "mock";
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum[0];
  if (schema.type === "number" || schema.type === "integer") return 1;
  if (schema.type === "boolean") return true;
  if (schema.type === "array") return [];
  if (schema.type === "object") return {};
  return /location|city|place/i.test(key) ? "Paris" : "mock";
}

function mockInput(schema: unknown): JsonObject {
  const properties = isObject(schema) && isObject(schema.properties) ? schema.properties : {};
  const input: JsonObject = {};
  for (const [key, s] of Object.entries(properties)) input[key] = mockValue(key, s);
  return input;
}

/** The tool the "model" calls, honouring toolChoice as Bedrock does; undefined means a text answer. */
function chooseTool(body: JsonObject, lastUser: unknown[]): { tool: ToolSpec; forced: boolean } | undefined {
  const tools = toolSpecs(body);
  if (tools.length === 0) return undefined;
  const choice = isObject(body.toolConfig) ? body.toolConfig.toolChoice : undefined;
  if (isObject(choice) && isObject(choice.tool)) {
    const tool = tools.find((t) => t.name === (choice.tool as JsonObject).name);
    return tool ? { tool, forced: true } : undefined;
  }
  if (isObject(choice) && isObject(choice.any)) return { tool: tools[0]!, forced: true };
  if (lastUser.some((b) => isObject(b) && "toolResult" in b)) return undefined;
  return /\bweather\b/i.test(lastUser.map(blockText).join(" ")) ? { tool: tools[0]!, forced: false } : undefined;
}

/** Splits JSON the way a tokenizer would: runs of word characters vs. punctuation. */
const jsonPieces = (json: string) => json.match(/[A-Za-z0-9]+|[^A-Za-z0-9]+/g) ?? [json];
const wordPieces = (words: string[]) => words.map((w, i) => (i === 0 ? w : ` ${w}`));

/** Text of the prompt before its last cache point, the part a cache read or write covers. */
function cachedPrefix(body: JsonObject): string | undefined {
  const blocks: unknown[] = [...(Array.isArray(body.system) ? body.system : []), ...(Array.isArray(body.messages) ? body.messages.flatMap(contentOf) : [])];
  let last = -1;
  blocks.forEach((b, i) => {
    if (isObject(b) && "cachePoint" in b) last = i;
  });
  return last < 0 ? undefined : blocks.slice(0, last).map(blockText).join("\n");
}

function planConverse(body: JsonObject, cache: Set<string>): Plan {
  const messages = body.messages as unknown[];
  const lastUser = contentOf(messages[messages.length - 1]);
  const inference = isObject(body.inferenceConfig) ? body.inferenceConfig : {};
  const maxTokens = typeof inference.maxTokens === "number" ? inference.maxTokens : undefined;
  const stops = Array.isArray(inference.stopSequences) ? inference.stopSequences.filter((s): s is string => typeof s === "string") : [];
  const blocks: PlannedBlock[] = [];
  const extra = isObject(body.additionalModelRequestFields) ? body.additionalModelRequestFields : {};
  if (isObject(extra.thinking) && extra.thinking.type === "enabled") {
    blocks.push({ kind: "reasoning", pieces: wordPieces(["Thinking", "about", "the", "question."]), signature: `sig${randomAlnum(24)}` });
  }
  const chosen = chooseTool(body, lastUser);
  let stopReason = "end_turn";
  if (chosen) {
    if (!chosen.forced) blocks.push({ kind: "text", pieces: wordPieces(["Let", "me", "check", "that."]) });
    const input = mockInput(chosen.tool.schema);
    blocks.push({ kind: "toolUse", toolUseId: `tooluse_${randomAlnum(22)}`, name: chosen.tool.name, input, pieces: jsonPieces(JSON.stringify(input)) });
    stopReason = "tool_use";
  } else {
    let words = ["Mock", "reply", "to:", ...lastUser.map(blockText).join(" ").split(/\s+/).filter(Boolean).slice(0, 12)];
    const stopAt = words.findIndex((w) => stops.includes(w));
    if (stopAt >= 0) {
      words = words.slice(0, stopAt);
      stopReason = "stop_sequence";
    }
    if (maxTokens !== undefined && words.length > maxTokens) {
      words = words.slice(0, maxTokens);
      stopReason = "max_tokens";
    }
    blocks.push({ kind: "text", pieces: wordPieces(words) });
  }
  const promptChars = [...(Array.isArray(body.system) ? body.system : []), ...messages.flatMap(contentOf)].map(blockText).join("").length;
  let inputTokens = Math.ceil(promptChars / 4) + 3 * messages.length;
  const usage: JsonObject = {};
  const prefix = cachedPrefix(body);
  if (prefix !== undefined) {
    const cached = Math.min(inputTokens, approxTokens(prefix));
    inputTokens -= cached;
    if (cache.has(prefix)) usage.cacheReadInputTokens = cached;
    else {
      cache.add(prefix);
      usage.cacheWriteInputTokens = cached;
    }
  }
  const outputTokens = blocks.reduce((n, b) => n + b.pieces.length, 0);
  usage.inputTokens = inputTokens;
  usage.outputTokens = outputTokens;
  usage.totalTokens = inputTokens + outputTokens + Number(usage.cacheReadInputTokens ?? 0) + Number(usage.cacheWriteInputTokens ?? 0);
  return { blocks, stopReason, usage };
}

function outputBlock(b: PlannedBlock): Block {
  if (b.kind === "text") return { text: b.pieces.join("") };
  if (b.kind === "toolUse") return { toolUse: { input: b.input, name: b.name, toolUseId: b.toolUseId } };
  return { reasoningContent: { reasoningText: { signature: b.signature, text: b.pieces.join("") } } };
}

const latency = () => 200 + Math.floor(Math.random() * 300);

function converseJson(plan: Plan): JsonObject {
  return {
    metrics: { latencyMs: latency() },
    output: { message: { content: plan.blocks.map(outputBlock), role: "assistant" } },
    stopReason: plan.stopReason,
    usage: plan.usage,
  };
}

// ---------------------------------------------------------------------------------------------
// ConverseStream: binary event-stream frames

function frame(headers: Record<string, string>, payload: string): Uint8Array {
  const typed: MessageHeaders = {};
  for (const [name, value] of Object.entries(headers)) typed[name] = { type: "string", value };
  return codec.encode({ headers: typed, body: encoder.encode(payload) });
}

/** An event frame; Bedrock puts its padding after the event's own fields. */
export const eventFrame = (type: string, payload: JsonObject) =>
  frame({ ":event-type": type, ":content-type": "application/json", ":message-type": "event" }, JSON.stringify({ ...payload, p: padding() }));

export const exceptionFrame = (exceptionType: string, message: string) =>
  frame({ ":exception-type": exceptionType, ":content-type": "application/json", ":message-type": "exception" }, JSON.stringify({ message }));

function blockFrames(b: PlannedBlock, index: number): Uint8Array[] {
  const frames: Uint8Array[] = [];
  if (b.kind === "toolUse") {
    frames.push(eventFrame("contentBlockStart", { contentBlockIndex: index, start: { toolUse: { name: b.name, toolUseId: b.toolUseId } } }));
    for (const piece of b.pieces) frames.push(eventFrame("contentBlockDelta", { contentBlockIndex: index, delta: { toolUse: { input: piece } } }));
  } else if (b.kind === "reasoning") {
    for (const piece of b.pieces) frames.push(eventFrame("contentBlockDelta", { contentBlockIndex: index, delta: { reasoningContent: { text: piece } } }));
    frames.push(eventFrame("contentBlockDelta", { contentBlockIndex: index, delta: { reasoningContent: { signature: b.signature } } }));
  } else {
    for (const piece of b.pieces) frames.push(eventFrame("contentBlockDelta", { contentBlockIndex: index, delta: { text: piece } }));
  }
  frames.push(eventFrame("contentBlockStop", { contentBlockIndex: index }));
  return frames;
}

function converseFrames(plan: Plan): Uint8Array[] {
  return [
    eventFrame("messageStart", { role: "assistant" }),
    ...plan.blocks.flatMap(blockFrames),
    eventFrame("messageStop", { stopReason: plan.stopReason }),
    eventFrame("metadata", { metrics: { latencyMs: latency() }, usage: plan.usage }),
  ];
}

// ---------------------------------------------------------------------------------------------
// InvokeModel: embeddings

const TITAN_KEYS = new Set(["inputText", "dimensions", "normalize", "embeddingTypes"]);

/** A test's own answer to an InvokeModel request that passed the checks (Bedrock's headers, the test's body and token count). */
type InvokeAnswer = Extract<BedrockFault, { kind: "answer" }> | undefined;

function titanEmbedding(modelId: string, body: JsonObject, answered: InvokeAnswer): Response {
  for (const key of Object.keys(body)) {
    if (!TITAN_KEYS.has(key)) return bedrockError(400, "ValidationException", `Malformed input request: extraneous key [${key}] is not permitted, please reformat your input and try again.`);
  }
  if (typeof body.inputText !== "string") return bedrockError(400, "ValidationException", "Malformed input request: #: required key [inputText] not found, please reformat your input and try again.");
  const v2 = modelId.includes("v2");
  if (body.dimensions !== undefined && (!v2 || ![256, 512, 1024].includes(body.dimensions as number))) {
    return bedrockError(400, "ValidationException", `Malformed input request: #/dimensions: ${JSON.stringify(body.dimensions)} is not a valid enum value, please reformat your input and try again.`);
  }
  if (answered) return invokeAnswer(answered.body as JsonObject, 0, answered.headers ?? {});
  const dimensions = typeof body.dimensions === "number" ? body.dimensions : v2 ? 1024 : 1536;
  const embedding = mockEmbedding(body.inputText, dimensions);
  const tokens = Math.max(1, approxTokens(body.inputText));
  const answer: JsonObject = v2 ? { embedding, embeddingsByType: { float: embedding }, inputTextTokenCount: tokens } : { embedding, inputTextTokenCount: tokens };
  return invokeAnswer(answer, tokens);
}

function cohereEmbedding(body: JsonObject, answered: InvokeAnswer): Response {
  const texts = body.texts;
  if (!Array.isArray(texts) || !texts.every((t) => typeof t === "string")) {
    return bedrockError(400, "ValidationException", "Malformed input request: #: required key [texts] not found, please reformat your input and try again.");
  }
  if (typeof body.input_type !== "string") return bedrockError(400, "ValidationException", "Malformed input request: #: required key [input_type] not found, please reformat your input and try again.");
  if (texts.length > 96) return bedrockError(400, "ValidationException", `Malformed input request: #/texts: expected maximum item count: 96, found: ${texts.length}, please reformat your input and try again.`);
  if (answered) return invokeAnswer(answered.body as JsonObject, 0, answered.headers ?? {});
  const dimensions = typeof body.output_dimension === "number" ? body.output_dimension : 1024;
  const vectors = texts.map((t) => mockEmbedding(t, dimensions));
  const byType = Array.isArray(body.embedding_types);
  const answer = { embeddings: byType ? { float: vectors } : vectors, id: crypto.randomUUID(), response_type: byType ? "embeddings_by_type" : "embeddings_floats", texts };
  return invokeAnswer(answer, texts.reduce((n, t) => n + Math.max(1, approxTokens(t)), 0));
}

function invokeAnswer(answer: JsonObject, inputTokens: number, headers?: Record<string, string>): Response {
  return new Response(JSON.stringify(answer), {
    headers: {
      "content-type": "application/json",
      "x-amzn-requestid": crypto.randomUUID(),
      ...(headers ?? { "x-amzn-bedrock-input-token-count": String(inputTokens), "x-amzn-bedrock-invocation-latency": String(latency()) }),
    },
  });
}

// ---------------------------------------------------------------------------------------------
// Delivery, possibly misbehaving on purpose

/** Long enough for the client to read the last bytes before the reset discards them. */
const CUT_FLUSH_MS = 10;

/** One piece per pull; erroring the controller with `undefined` resets the connection. */
function byteStream(pieces: Uint8Array[], cutAfter?: number): ReadableStream<Uint8Array> {
  let sent = 0;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (cutAfter !== undefined && sent >= cutAfter) {
          await Bun.sleep(CUT_FLUSH_MS);
          controller.error(undefined);
          return;
        }
        controller.enqueue(pieces[sent++]!);
        if (sent >= pieces.length && cutAfter === undefined) controller.close();
      },
    },
    { highWaterMark: 0 },
  );
}

function fragment(frames: Uint8Array[], size: number): Uint8Array[] {
  const all = new Uint8Array(frames.reduce((n, f) => n + f.length, 0));
  let at = 0;
  for (const f of frames) {
    all.set(f, at);
    at += f.length;
  }
  const pieces: Uint8Array[] = [];
  for (let i = 0; i < all.length; i += size) pieces.push(all.slice(i, i + size));
  return pieces;
}

function deliverFrames(frames: Uint8Array[], fault: BedrockFault | undefined): Response {
  let pieces = frames;
  let cutAfter: number | undefined;
  if (fault?.kind === "exception") pieces = [...frames.slice(0, fault.afterFrames), exceptionFrame(fault.exceptionType, fault.message)];
  if (fault?.kind === "cutStream") cutAfter = fault.afterFrames;
  if (fault?.kind === "corruptFrame" && pieces[fault.frame]) {
    const bad = pieces[fault.frame]!.slice();
    bad[bad.length - 5] = bad[bad.length - 5]! ^ 0xff; // last payload byte: the message CRC no longer matches
    pieces = pieces.map((p, i) => (i === fault.frame ? bad : p));
  }
  if (fault?.kind === "fragment") pieces = fragment(pieces, fault.bytes);
  const headers = { "content-type": "application/vnd.amazon.eventstream", "x-amzn-requestid": crypto.randomUUID() };
  if (fault?.kind === "wire") return new Response(shapedStream(renderedBytes(pieces), fault.shape), { headers });
  return new Response(byteStream(pieces, cutAfter), { headers });
}

function deliverJson(body: JsonObject, fault: BedrockFault | undefined): Response {
  const text = JSON.stringify(body);
  const headers = { "content-type": "application/json", "x-amzn-requestid": crypto.randomUUID() };
  if (fault?.kind === "cutStream") return new Response(byteStream([encoder.encode(text.slice(0, text.length >> 1))], 1), { headers });
  return new Response(text, { headers });
}

// ---------------------------------------------------------------------------------------------
// Server

interface MockState {
  requests: RecordedRequest[];
  faults: BedrockFault[];
  /** Prompt prefixes already written to the "prompt cache". */
  cache: Set<string>;
}

const ROUTE = /^\/model\/([^/]+)\/(converse|converse-stream|invoke)$/;

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

function takeFault(faults: BedrockFault[], action: string): BedrockFault | undefined {
  const i = faults.findIndex((f) => f.action === undefined || f.action === action);
  return i < 0 ? undefined : faults.splice(i, 1)[0];
}

async function handle(req: Request, state: MockState, options: MockBedrockOptions): Promise<Response> {
  const url = new URL(req.url);
  const raw = await req.text();
  const route = ROUTE.exec(url.pathname);
  let body: unknown = raw;
  try {
    body = JSON.parse(raw);
  } catch {
    // recorded as text
  }
  const modelId = route ? decodeURIComponent(route[1]!) : "";
  const action = route?.[2] ?? "";
  state.requests.push({ method: req.method, path: url.pathname + url.search, modelId, action, headers: Object.fromEntries(req.headers), body });

  const denied = await checkAuth(req, raw, options);
  if (denied) return denied;
  if (!route || req.method !== "POST") return bedrockError(404, "UnknownOperationException", "Unknown operation", CORAL);
  const fault = takeFault(state.faults, action);
  if (fault?.kind === "status") {
    const [type, message] = DEFAULT_ERRORS[fault.status] ?? ["InternalServerException", "The server encountered an internal error while processing the request."];
    return bedrockError(fault.status, fault.errorType ?? type, fault.message ?? message);
  }
  if (fault?.kind === "hang") {
    await untilAborted(req.signal);
    return new Response(null, { status: 499 });
  }
  if (!isObject(body)) return bedrockError(400, "SerializationException", "Unexpected character at the start of the body: expected a JSON object.", CORAL);
  if (action === "invoke") {
    const answered = fault?.kind === "answer" ? fault : undefined;
    if (modelId.includes("titan-embed")) return titanEmbedding(modelId, body, answered);
    if (modelId.includes("cohere.embed")) return cohereEmbedding(body, answered);
    return bedrockError(400, "ValidationException", "The provided model identifier is invalid.");
  }
  const invalid = validateConverse(body);
  if (invalid) return invalid;
  if (fault?.kind === "answer") return deliverJson(fault.body as JsonObject, undefined);
  const plan = planConverse(body, state.cache);
  return action === "converse-stream" ? deliverFrames(converseFrames(plan), fault) : deliverJson(converseJson(plan), fault);
}

export async function startMockBedrock(options: MockBedrockOptions = {}): Promise<MockBedrock> {
  const state: MockState = { requests: [], faults: [], cache: new Set() };
  const server: Server<undefined> = Bun.serve({
    hostname: "127.0.0.1",
    port: options.port ?? 0,
    idleTimeout: 0,
    fetch: (req) => handle(req, state, options),
  });
  return {
    url: `http://127.0.0.1:${server.port}`,
    get requests() {
      return state.requests;
    },
    fault: (...faults) => {
      state.faults.push(...faults);
    },
    reset: () => {
      state.requests.length = 0;
      state.faults.length = 0;
      state.cache.clear();
    },
    stop: () => server.stop(true),
  };
}
