// The Bedrock adapter with no network: the AWS event-stream parser on real and hand-built frames
// split at every byte, and golden fixtures in both directions (OpenAI → Converse/InvokeModel
// bodies, Converse answers and streams → OpenAI), errors and credentials.
import { describe, expect, test } from "bun:test";
import type { AwsStreamEvent, ChatRequest, Deployment, EmbeddingsRequest, StreamPart, WireJson } from "../../core/contract.ts";
import { GatewayError } from "../../core/errors.ts";
import { AwsEventStreamParser } from "../../core/stream/aws-eventstream.ts";
import { authorizeBedrock, resolveBedrock } from "../../providers/bedrock/credentials.ts";
import { bedrockProvider } from "../../providers/bedrock/index.ts";

const chat = bedrockProvider.endpoints.chat!;
const embeddings = bedrockProvider.endpoints.embeddings!;

// ---------------------------------------------------------------------------------------------
// Frames built by hand (independently of the codec the gateway uses): prelude, string headers, CRC32s.

const enc = new TextEncoder();

function handFrame(headers: [string, string][], payload: string): Uint8Array {
  const headerBytes: number[] = [];
  for (const [name, value] of headers) {
    const n = enc.encode(name);
    const v = enc.encode(value);
    headerBytes.push(n.length, ...n, 7, v.length >> 8, v.length & 0xff, ...v);
  }
  const body = enc.encode(payload);
  const total = 12 + headerBytes.length + body.length + 4;
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  view.setUint32(0, total);
  view.setUint32(4, headerBytes.length);
  view.setUint32(8, Bun.hash.crc32(out.subarray(0, 8)));
  out.set(headerBytes, 12);
  out.set(body, 12 + headerBytes.length);
  view.setUint32(total - 4, Bun.hash.crc32(out.subarray(0, total - 4)));
  return out;
}

const event = (type: string, payload: string) =>
  handFrame(
    [
      [":event-type", type],
      [":content-type", "application/json"],
      [":message-type", "event"],
    ],
    payload,
  );

const exception = (type: string, payload: string) =>
  handFrame(
    [
      [":exception-type", type],
      [":content-type", "application/json"],
      [":message-type", "exception"],
    ],
    payload,
  );

function concat(frames: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(frames.reduce((n, f) => n + f.length, 0));
  let at = 0;
  for (const f of frames) {
    out.set(f, at);
    at += f.length;
  }
  return out;
}

/** Feeds `chunks` to a fresh parser and returns the events (as parsed objects). */
function parse(chunks: Uint8Array[]): AwsStreamEvent[] {
  const parser = new AwsEventStreamParser();
  const events: AwsStreamEvent[] = [];
  const onEvent = (data: string) => events.push(JSON.parse(data) as AwsStreamEvent);
  for (const c of chunks) parser.push(c, onEvent);
  parser.end(onEvent);
  return events;
}

const fromHex = (hex: string) => Uint8Array.from(hex.match(/../g)!.map((b) => Number.parseInt(b, 16)));

// A frame as AWS sent it (InvokeModelWithResponseStream `chunk`), bytes and CRCs untouched.
const AWS_CHUNK_FRAME = fromHex(
  "0000010b0000004b38a0a5c50b3a6576656e742d747970650700056368756e6b0d3a636f6e74656e742d747970650700106170706c69636174696f6e2f6a736f6e0d3a6d6573736167652d747970650700056576656e747b226279746573223a2265794a6a614739705932567a496a706265794a70626d526c654349364d4377696257567a6332466e5a53493665794a796232786c496a6f6959584e7a61584e305957353049697769593239756447567564434936496b6b696653776963335276634639795a57467a623234694f6d3531624778395858303d222c2270223a226162636465666768696a6b6c6d6e6f707172737475767778797a4142434445464748494a4b227d1106313f",
);

// A ConverseStream answer in Bedrock's shape: text, then a tool use whose input arrives in pieces
// (one piece cut mid-string), then the stop reason and usage with cache reads.
const GOLDEN_STREAM = [
  event("messageStart", '{"p":"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW","role":"assistant"}'),
  event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"text":"Let me check"},"p":"abcdefghijk"}'),
  event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"text":" the weather."},"p":"abcd"}'),
  event("contentBlockStop", '{"contentBlockIndex":0,"p":"abcdefghijklmnopqrs"}'),
  event("contentBlockStart", '{"contentBlockIndex":1,"p":"abcdefghijklmnop","start":{"toolUse":{"name":"get_weather","toolUseId":"tooluse_kZJMlvQmRJ6eAyJE5GIl7Q"}}}'),
  event("contentBlockDelta", '{"contentBlockIndex":1,"delta":{"toolUse":{"input":""}},"p":"abcdefghijklmnopqrstuvwxyzABC"}'),
  event("contentBlockDelta", '{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{\\"location\\": \\"Pa"}},"p":"abcdefgh"}'),
  event("contentBlockDelta", '{"contentBlockIndex":1,"delta":{"toolUse":{"input":"ris\\", \\"unit\\": \\"celsius\\"}"}},"p":"abcdefghijklmnopqrstu"}'),
  event("contentBlockStop", '{"contentBlockIndex":1,"p":"abcdefghijklmnopqrstuvwxyzABCDEF"}'),
  event("messageStop", '{"p":"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123","stopReason":"tool_use"}'),
  event("metadata", '{"metrics":{"latencyMs":1019},"p":"abcdefghijklmnopqrstuvwx","usage":{"cacheReadInputTokens":1200,"cacheWriteInputTokens":0,"inputTokens":412,"outputTokens":61,"totalTokens":1673}}'),
];

describe("AWS event-stream parser", () => {
  test("decodes a frame captured from AWS, headers and payload", () => {
    const [e] = parse([AWS_CHUNK_FRAME]);
    expect(e!.messageType).toBe("event");
    expect(e!.type).toBe("chunk");
    const inner = atob((e!.payload as { bytes: string }).bytes);
    expect(JSON.parse(inner)).toEqual({ choices: [{ index: 0, message: { role: "assistant", content: "I" }, stop_reason: null }] });
  });

  test("every split point of a multi-frame stream gives the same events", () => {
    const bytes = concat(GOLDEN_STREAM.slice(0, 5));
    const whole = parse([bytes]);
    expect(whole.map((e) => e.type)).toEqual(["messageStart", "contentBlockDelta", "contentBlockDelta", "contentBlockStop", "contentBlockStart"]);
    for (let i = 0; i <= bytes.length; i++) {
      expect(parse([bytes.subarray(0, i), bytes.subarray(i)])).toEqual(whole);
    }
  });

  test("one byte per read, and several frames per read", () => {
    const bytes = concat(GOLDEN_STREAM);
    const whole = parse([bytes]);
    expect(whole).toHaveLength(GOLDEN_STREAM.length);
    expect(parse(Array.from(bytes, (b) => Uint8Array.of(b)))).toEqual(whole);
    // Three reads, each ending mid-frame and holding several whole frames.
    const a = Math.floor(bytes.length / 3);
    expect(parse([bytes.subarray(0, a), bytes.subarray(a, 2 * a), bytes.subarray(2 * a)])).toEqual(whole);
  });

  test("a broken message CRC, a broken prelude CRC and an impossible length are errors", () => {
    const frame = GOLDEN_STREAM[1]!;
    const badBody = frame.slice();
    badBody[badBody.length - 6] = badBody[badBody.length - 6]! ^ 1;
    expect(() => parse([badBody])).toThrow(/checksum/);
    const badPrelude = frame.slice();
    badPrelude[7] = badPrelude[7]! ^ 1; // headers length: the prelude CRC catches it
    expect(() => parse([badPrelude])).toThrow(/checksum/);
    expect(() => parse([Uint8Array.of(0, 0, 0, 3, 0, 0, 0, 0)])).toThrow(/out of range/);
  });

  test("a stream that ends inside a frame is an error, not a silent end", () => {
    const frame = GOLDEN_STREAM[0]!;
    expect(() => parse([frame.subarray(0, frame.length - 1)])).toThrow(/ended inside a message/);
  });

  test("exception and error messages keep their type", () => {
    const [ex] = parse([exception("throttlingException", '{"message":"Too many requests, please wait before trying again."}')]);
    expect(ex).toEqual({ messageType: "exception", type: "throttlingException", payload: { message: "Too many requests, please wait before trying again." } });
    const [err] = parse([
      handFrame(
        [
          [":message-type", "error"],
          [":error-code", "InternalFailure"],
          [":error-message", 'An "internal" error'],
        ],
        "",
      ),
    ]);
    expect(err).toEqual({ messageType: "error", type: "InternalFailure", payload: { message: 'An "internal" error' } });
  });
});

// ---------------------------------------------------------------------------------------------
// Requests

const SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

function deployment(upstreamModel: string, extra: Partial<Deployment> = {}): Deployment {
  const d: Deployment = {
    id: "dep",
    modelName: "claude",
    provider: "bedrock",
    upstreamModel,
    options: { aws_region_name: "us-west-2", aws_access_key_id: "AKIDEXAMPLE", aws_secret_access_key: SECRET },
    info: {},
    ...extra,
  };
  const resolved = resolveBedrock(d, {});
  if (typeof resolved === "string") throw new Error(resolved);
  return resolved;
}

const CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0";
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a place",
    parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] },
  },
};

/** A chat request as a client would send it (content parts carry fields the wire type leaves open). */
type LooseChat = Omit<Partial<ChatRequest>, "messages"> & { messages: unknown[]; reasoning_effort?: string };

function requestBody(req: LooseChat, d = deployment(CLAUDE)): WireJson {
  const call = chat.request({ model: "claude", ...req } as ChatRequest, d);
  return JSON.parse(call.body!) as WireJson;
}

function badRequest(fn: () => unknown): GatewayError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).info.status).toBe(400);
    return err as GatewayError;
  }
  throw new Error("expected a 400");
}

describe("OpenAI chat → Converse request", () => {
  test("URL, method and headers: regional endpoint, model id encoded as one segment", () => {
    const d = deployment(CLAUDE);
    const call = chat.request({ model: "claude", messages: [{ role: "user", content: "hi" }] }, d);
    expect(call.url).toBe("https://bedrock-runtime.us-west-2.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse");
    expect(call.method).toBe("POST");
    expect(call.headers["content-type"]).toBe("application/json");
    expect(call.headers.authorization).toBeUndefined(); // signed later, in authorize
    const stream = chat.request({ model: "claude", messages: [{ role: "user", content: "hi" }], stream: true }, d);
    expect(stream.url).toEndWith("/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse-stream");
    expect(stream.headers.accept).toBe("application/vnd.amazon.eventstream");
    const arn = "arn:aws:bedrock:us-west-2:123456789012:inference-profile/us.anthropic.claude-3-5-sonnet-20240620-v1:0";
    expect(chat.request({ model: "claude", messages: [{ role: "user", content: "hi" }] }, deployment(arn)).url).toBe(
      "https://bedrock-runtime.us-west-2.amazonaws.com/model/arn%3Aaws%3Abedrock%3Aus-west-2%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse",
    );
  });

  test("system, image, tools, tool calls and results, merged roles, inference settings", () => {
    const body = requestBody({
      messages: [
        { role: "system", content: "You are terse." },
        { role: "developer", content: [{ type: "text", text: "Use metric units." }] },
        {
          role: "user",
          content: [
            { type: "text", text: "What is in this picture, and the weather in Paris?" },
            { type: "image_url", image_url: { url: `data:image/png;base64,${PNG}` } },
          ],
        },
        {
          role: "assistant",
          content: "Checking.",
          tool_calls: [{ id: "tooluse_1", type: "function", function: { name: "get_weather", arguments: '{"location":"Paris"}' } }],
        },
        { role: "tool", tool_call_id: "tooluse_1", content: '{"temp_c":21}' },
        { role: "user", content: "Thanks. And tomorrow?" },
      ],
      tools: [weatherTool],
      tool_choice: "auto",
      max_tokens: 300,
      temperature: 0.2,
      top_p: 0.9,
      stop: "END",
    });
    expect(body).toEqual({
      messages: [
        {
          role: "user",
          content: [{ text: "What is in this picture, and the weather in Paris?" }, { image: { format: "png", source: { bytes: PNG } } }],
        },
        { role: "assistant", content: [{ text: "Checking." }, { toolUse: { toolUseId: "tooluse_1", name: "get_weather", input: { location: "Paris" } } }] },
        // The tool result and the next user turn are one user message in Converse.
        { role: "user", content: [{ toolResult: { toolUseId: "tooluse_1", content: [{ text: '{"temp_c":21}' }] } }, { text: "Thanks. And tomorrow?" }] },
      ],
      system: [{ text: "You are terse." }, { text: "Use metric units." }],
      inferenceConfig: { maxTokens: 300, temperature: 0.2, topP: 0.9, stopSequences: ["END"] },
      toolConfig: {
        tools: [
          {
            toolSpec: {
              name: "get_weather",
              description: "Current weather for a place",
              inputSchema: { json: { type: "object", properties: { location: { type: "string" } }, required: ["location"] } },
            },
          },
        ],
        toolChoice: { auto: {} },
      },
    });
  });

  test("tool_choice: required → any, a named function → tool, none → no tools", () => {
    const messages = [{ role: "user", content: "weather?" }];
    expect(requestBody({ messages, tools: [weatherTool], tool_choice: "required" }).toolConfig).toMatchObject({ toolChoice: { any: {} } });
    expect(requestBody({ messages, tools: [weatherTool], tool_choice: { type: "function", function: { name: "get_weather" } } }).toolConfig).toMatchObject({
      toolChoice: { tool: { name: "get_weather" } },
    });
    expect(requestBody({ messages, tools: [weatherTool], tool_choice: "none" }).toolConfig).toBeUndefined();
  });

  test("max_completion_tokens wins over max_tokens; stop lists pass as they are", () => {
    const body = requestBody({ messages: [{ role: "user", content: "hi" }], max_tokens: 10, max_completion_tokens: 20, stop: ["a", "b"] });
    expect(body.inferenceConfig).toEqual({ maxTokens: 20, stopSequences: ["a", "b"] });
  });

  test("response_format json_schema → a forced tool carrying the schema", () => {
    const schema = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
    const body = requestBody({
      messages: [{ role: "user", content: "Pick a city" }],
      response_format: { type: "json_schema", json_schema: { name: "city", schema } },
    });
    expect(body.toolConfig).toEqual({
      tools: [{ toolSpec: { name: "json_tool_call", description: "Respond with a JSON object.", inputSchema: { json: schema } } }],
      toolChoice: { tool: { name: "json_tool_call" } },
    });
    // With the client's own tools: one of them or the JSON tool must be called ("auto" as when unset); "none" leaves only the JSON tool.
    const messages = [{ role: "user" as const, content: "Weather?" }];
    const choiceWith = (tool_choice: ChatRequest["tool_choice"]) => (requestBody({ messages, tools: [weatherTool], tool_choice, response_format: { type: "json_object" } }).toolConfig as WireJson).toolChoice;
    expect(choiceWith(undefined)).toEqual({ any: {} });
    expect(choiceWith("auto")).toEqual({ any: {} });
    expect(choiceWith("required")).toEqual({ any: {} });
    expect(choiceWith({ type: "function", function: { name: "get_weather" } })).toEqual({ tool: { name: "get_weather" } });
    expect(choiceWith("none")).toEqual({ tool: { name: "json_tool_call" } });
    // Claude refuses a forced tool while thinking: the JSON tool is then only offered.
    const thinking = requestBody({ messages, reasoning_effort: "low", response_format: { type: "json_object" } }).toolConfig as WireJson;
    expect(thinking).toEqual({ tools: [expect.objectContaining({ toolSpec: expect.objectContaining({ name: "json_tool_call" }) })] });
  });

  test("reasoning_effort → Claude's thinking budget, with room left for the answer", () => {
    const body = requestBody({ messages: [{ role: "user", content: "think" }], reasoning_effort: "medium" });
    expect(body.additionalModelRequestFields).toEqual({ thinking: { type: "enabled", budget_tokens: 2048 } });
    expect(body.inferenceConfig).toEqual({ maxTokens: 2048 + 4096 });
    const other = requestBody({ messages: [{ role: "user", content: "think" }], reasoning_effort: "low" }, deployment("openai.gpt-oss-120b-1:0"));
    expect(other.additionalModelRequestFields).toEqual({ reasoning_effort: "low" });
  });

  test("thinking blocks echoed on an assistant turn go back first as reasoning content, signature intact", () => {
    const body = requestBody({
      messages: [
        { role: "user", content: "Weather?" },
        {
          role: "assistant",
          content: null,
          thinking_blocks: [
            { type: "thinking", thinking: "Need the weather.", signature: "EqQBCgIYAh" },
            { type: "redacted_thinking", data: "RWQ=" },
          ],
          tool_calls: [{ id: "t1", type: "function", function: { name: "get_weather", arguments: "{}" } }],
        },
        { role: "tool", tool_call_id: "t1", content: "sunny" },
      ],
      tools: [weatherTool],
      reasoning_effort: "low",
    });
    expect((body.messages as WireJson[])[1]).toEqual({
      role: "assistant",
      content: [
        { reasoningContent: { reasoningText: { text: "Need the weather.", signature: "EqQBCgIYAh" } } },
        { reasoningContent: { redactedContent: "RWQ=" } },
        { toolUse: { toolUseId: "t1", name: "get_weather", input: {} } },
      ],
    });
  });

  test("cache_control on a part becomes a cache point after it", () => {
    const body = requestBody({
      messages: [
        { role: "system", content: [{ type: "text", text: "Long instructions", cache_control: { type: "ephemeral" } }] },
        { role: "user", content: "hi" },
      ],
    });
    expect(body.system).toEqual([{ text: "Long instructions" }, { cachePoint: { type: "default" } }]);
  });

  test("what Converse cannot take is a 400 naming the problem", () => {
    const link = badRequest(() => requestBody({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "https://example.com/cat.png" } }] }] }));
    expect(link.info.message).toContain("data: URLs");
    badRequest(() => requestBody({ messages: [{ role: "user", content: [{ type: "input_audio", input_audio: {} }] }] }));
    badRequest(() => requestBody({ messages: [{ role: "user", content: "hi" }], tools: [{ type: "web_search" }] }));
    badRequest(() =>
      requestBody({ messages: [{ role: "user", content: "x" }, { role: "assistant", tool_calls: [{ id: "t", type: "function", function: { name: "f", arguments: "{not json" } }] }] }),
    );
  });

  test("a Bedrock API key goes as a bearer token and is not re-signed", async () => {
    const d = resolveBedrock({ id: "k", modelName: "m", provider: "bedrock", upstreamModel: CLAUDE, apiKey: "ABSKbedrockkey", options: { aws_region_name: "eu-west-1" }, info: {} }, {});
    if (typeof d === "string") throw new Error(d);
    const call = chat.request({ model: "m", messages: [{ role: "user", content: "hi" }] }, d);
    expect(call.headers.authorization).toBe("Bearer ABSKbedrockkey");
    expect(await authorizeBedrock(call, d)).toEqual(call);
  });

  test("SigV4: scope names the key, day, region and the bedrock service; the session token is sent", async () => {
    const d = deployment(CLAUDE, { options: { aws_region_name: "us-west-2", aws_access_key_id: "AKIDEXAMPLE", aws_secret_access_key: SECRET, aws_session_token: "session-token-1" } });
    const signed = await authorizeBedrock(chat.request({ model: "claude", messages: [{ role: "user", content: "hi" }] }, d), d);
    const day = signed.headers["x-amz-date"]!.slice(0, 8);
    expect(signed.headers.authorization).toMatch(new RegExp(`^AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/${day}/us-west-2/bedrock/aws4_request, SignedHeaders=[a-z0-9;-]*host[a-z0-9;-]*, Signature=[0-9a-f]{64}$`));
    expect(signed.headers["x-amz-security-token"]).toBe("session-token-1");
    expect(JSON.stringify(signed)).not.toContain(SECRET);
  });
});

describe("credentials and endpoint resolution", () => {
  const base = { id: "d", modelName: "m", provider: "bedrock", upstreamModel: CLAUDE, info: {} };

  test("region and IAM keys from the environment when svc_params have none", () => {
    const d = resolveBedrock({ ...base, options: {} }, { AWS_DEFAULT_REGION: "ap-south-1", AWS_ACCESS_KEY_ID: "AKIAENV", AWS_SECRET_ACCESS_KEY: "envsecret", AWS_SESSION_TOKEN: "tok" });
    expect(d).toMatchObject({ apiBase: "https://bedrock-runtime.ap-south-1.amazonaws.com", options: { aws_region_name: "ap-south-1", aws_access_key_id: "AKIAENV", aws_session_token: "tok" } });
  });

  test("svc_params win over the environment; api_base overrides the endpoint", () => {
    const d = resolveBedrock(
      { ...base, apiBase: "http://127.0.0.1:9999/", options: { aws_region_name: "us-east-2", aws_access_key_id: "AKIAPARAM", aws_secret_access_key: "p" } },
      { AWS_REGION: "eu-west-1", AWS_ACCESS_KEY_ID: "AKIAENV", AWS_SECRET_ACCESS_KEY: "e", AWS_BEARER_TOKEN_BEDROCK: "bearer" },
    );
    expect(d).toMatchObject({ apiBase: "http://127.0.0.1:9999", apiKey: undefined, options: { aws_region_name: "us-east-2", aws_access_key_id: "AKIAPARAM" } });
  });

  test("no region or no credentials: a config error that says what to set", () => {
    expect(resolveBedrock({ ...base, options: { aws_access_key_id: "a", aws_secret_access_key: "b" } }, {})).toContain("aws_region_name");
    expect(resolveBedrock({ ...base, options: { aws_region_name: "us-east-1" } }, {})).toContain("credentials");
  });
});

// ---------------------------------------------------------------------------------------------
// Responses

const req = (extra: Partial<ChatRequest> = {}): ChatRequest => ({ model: "claude-public", messages: [{ role: "user", content: "weather in Paris?" }], ...extra });

describe("Converse response → OpenAI chat.completion", () => {
  test("text, a tool use and cache usage", () => {
    const golden = {
      metrics: { latencyMs: 1187 },
      output: {
        message: {
          content: [
            { text: "Let me look that up." },
            { toolUse: { input: { location: "Paris", unit: "celsius" }, name: "get_weather", toolUseId: "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q" } },
          ],
          role: "assistant",
        },
      },
      stopReason: "tool_use",
      usage: { cacheReadInputTokens: 1024, cacheWriteInputTokens: 256, inputTokens: 30, outputTokens: 48, totalTokens: 1358 },
    };
    const { body, usage } = chat.response(golden, req());
    expect(usage).toEqual({ promptTokens: 1310, completionTokens: 48, cachedPromptTokens: 1024, cacheCreationTokens: 256 });
    expect(body).toMatchObject({
      object: "chat.completion",
      model: "claude-public",
      choices: [
        {
          index: 0,
          message: {
            role: "assistant",
            content: "Let me look that up.",
            tool_calls: [{ id: "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q", type: "function", function: { name: "get_weather", arguments: '{"location":"Paris","unit":"celsius"}' } }],
          },
          logprobs: null,
          finish_reason: "tool_calls",
        },
      ],
      usage: { prompt_tokens: 1310, completion_tokens: 48, total_tokens: 1358, prompt_tokens_details: { cached_tokens: 1024 }, cache_creation_input_tokens: 256 },
    });
    expect(body.id).toMatch(/^chatcmpl-/);
    expect(typeof body.created).toBe("number");
  });

  test("only a tool use: content is null", () => {
    const { body } = chat.response(
      { output: { message: { role: "assistant", content: [{ toolUse: { toolUseId: "t1", name: "f", input: {} } }] } }, stopReason: "tool_use", usage: { inputTokens: 1, outputTokens: 1, totalTokens: 2 } },
      req(),
    );
    expect((body.choices as { message: WireJson }[])[0]!.message.content).toBeNull();
  });

  test("stop reasons map to OpenAI's finish reasons", () => {
    const finish = (stopReason: string) => {
      const { body } = chat.response({ output: { message: { role: "assistant", content: [{ text: "x" }] } }, stopReason, usage: { inputTokens: 1, outputTokens: 1, totalTokens: 2 } }, req());
      return (body.choices as { finish_reason: string }[])[0]!.finish_reason;
    };
    expect(finish("end_turn")).toBe("stop");
    expect(finish("stop_sequence")).toBe("stop");
    expect(finish("max_tokens")).toBe("length");
    expect(finish("guardrail_intervened")).toBe("content_filter");
    expect(finish("content_filtered")).toBe("content_filter");
  });

  test("reasoning content comes back as reasoning_content, and signed in thinking_blocks for the next turn", () => {
    const { body } = chat.response(
      {
        output: {
          message: {
            role: "assistant",
            content: [{ reasoningContent: { reasoningText: { text: "Two plus two.", signature: "EqQB" } } }, { reasoningContent: { redactedContent: "RWQ=" } }, { text: "4" }],
          },
        },
        stopReason: "end_turn",
        usage: { inputTokens: 5, outputTokens: 9, totalTokens: 14 },
      },
      req(),
    );
    expect((body.choices as { message: WireJson }[])[0]!.message).toMatchObject({
      content: "4",
      reasoning_content: "Two plus two.",
      thinking_blocks: [
        { type: "thinking", thinking: "Two plus two.", signature: "EqQB" },
        { type: "redacted_thinking", data: "RWQ=" },
      ],
    });
  });

  test("the response-format tool's input is the answer's content", () => {
    const { body } = chat.response(
      { output: { message: { role: "assistant", content: [{ toolUse: { toolUseId: "t", name: "json_tool_call", input: { city: "Lyon" } } }] } }, stopReason: "tool_use", usage: { inputTokens: 3, outputTokens: 4, totalTokens: 7 } },
      req({ response_format: { type: "json_object" } }),
    );
    const choice = (body.choices as { message: WireJson; finish_reason: string }[])[0]!;
    expect(choice.message.content).toBe('{"city":"Lyon"}');
    expect(choice.message.tool_calls).toBeUndefined();
    expect(choice.finish_reason).toBe("stop");
  });

  test("response_format while thinking (the JSON tool not forced): a preamble before the JSON tool is dropped, the content is the JSON alone", () => {
    const content = [
      { reasoningContent: { reasoningText: { text: "JSON wanted.", signature: "sig" } } },
      { text: "Here is the JSON:\n" },
      { toolUse: { toolUseId: "t", name: "json_tool_call", input: { city: "Lyon" } } },
    ];
    const { body } = chat.response({ output: { message: { role: "assistant", content } }, stopReason: "tool_use", usage: { inputTokens: 3, outputTokens: 4 } }, req({ response_format: { type: "json_object" } }));
    const choice = (body.choices as { message: WireJson; finish_reason: string }[])[0]!;
    expect(JSON.parse(choice.message.content as string)).toEqual({ city: "Lyon" });
    expect(choice.message.reasoning_content).toBe("JSON wanted.");
    expect(choice.finish_reason).toBe("stop");
  });
});

// ---------------------------------------------------------------------------------------------
// Streams

function runStream(frames: Uint8Array[], request: ChatRequest, split = 0): { parts: StreamPart[]; state: unknown } {
  const stream = chat.stream!;
  const state = stream.init(request);
  const parts: StreamPart[] = [];
  const parser = new AwsEventStreamParser();
  const bytes = concat(frames);
  const onEvent = (data: string) => parts.push(...stream.event(data, state));
  if (split > 0) for (let i = 0; i < bytes.length; i += split) parser.push(bytes.subarray(i, i + split), onEvent);
  else parser.push(bytes, onEvent);
  parser.end(onEvent);
  return { parts, state };
}

const chunks = (parts: StreamPart[]) => parts.filter((p): p is Extract<StreamPart, { type: "chunk" }> => p.type === "chunk").map((p) => p.chunk as WireJson);
const deltas = (parts: StreamPart[]): WireJson[] =>
  chunks(parts).flatMap((c) => (c.choices as { delta: WireJson; finish_reason: string | null }[]).map((ch) => ({ ...ch.delta, finish: ch.finish_reason })));

describe("the event-stream parser", () => {
  test("a large message arriving in many reads is joined once: the bytes copied stay linear in its size", () => {
    // One 8 MiB text delta, framed as Bedrock frames it, pushed in 16 KiB reads.
    const big = "x".repeat(8 * 1024 * 1024);
    const bytes = concat([event("contentBlockDelta", JSON.stringify({ contentBlockIndex: 0, delta: { text: big } }))]);
    const parser = new AwsEventStreamParser();
    const events: string[] = [];
    for (let i = 0; i < bytes.length; i += 16 * 1024) parser.push(bytes.subarray(i, i + 16 * 1024), (e) => events.push(e));
    parser.end(() => undefined);
    expect(events).toHaveLength(1);
    expect(events[0]!.length).toBeGreaterThan(big.length);
    // Copying the held bytes at every read was ~4e12 bytes here; joining once is about the message.
    expect(parser.copied).toBeLessThan(3 * bytes.length);
  });
});

describe("ConverseStream → OpenAI chunks", () => {
  test("text, then a tool call whose arguments arrive in pieces, then finish and usage", () => {
    const { parts } = runStream(GOLDEN_STREAM, req({ stream: true, stream_options: { include_usage: true } }), 13);
    const all = chunks(parts);
    for (const c of all) expect(c).toMatchObject({ object: "chat.completion.chunk", model: "claude-public", id: all[0]!.id });
    expect(deltas(parts)).toEqual([
      { role: "assistant", content: "", finish: null },
      { content: "Let me check", finish: null },
      { content: " the weather.", finish: null },
      // Block 1 in Converse is tool call 0 in OpenAI's numbering.
      { tool_calls: [{ index: 0, id: "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q", type: "function", function: { name: "get_weather", arguments: "" } }], finish: null },
      { tool_calls: [{ index: 0, function: { arguments: "" } }], finish: null },
      { tool_calls: [{ index: 0, function: { arguments: '{"location": "Pa' } }], finish: null },
      { tool_calls: [{ index: 0, function: { arguments: 'ris", "unit": "celsius"}' } }], finish: null },
      { finish: "tool_calls" },
    ]);
    const last = all[all.length - 1]!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toEqual({ prompt_tokens: 1612, completion_tokens: 61, total_tokens: 1673, prompt_tokens_details: { cached_tokens: 1200 }, completion_tokens_details: { reasoning_tokens: 0 }, cache_read_input_tokens: 1200 });
    expect(parts.find((p) => p.type === "usage")).toEqual({ type: "usage", usage: { promptTokens: 1612, completionTokens: 61, cachedPromptTokens: 1200 } });
  });

  test("a tool called without arguments streams \"{}\" as its arguments, as the non-stream answer has, with or without an empty input delta", () => {
    const open = [event("messageStart", '{"role":"assistant"}'), event("contentBlockStart", '{"contentBlockIndex":0,"start":{"toolUse":{"name":"get_time","toolUseId":"tooluse_t"}}}')];
    const close = [event("contentBlockStop", '{"contentBlockIndex":0}'), event("messageStop", '{"stopReason":"tool_use"}')];
    const emptyDelta = event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"toolUse":{"input":""}}}');
    for (const frames of [[...open, ...close], [...open, emptyDelta, ...close]]) {
      const calls = deltas(runStream(frames, req({ stream: true })).parts).flatMap((d) => (d.tool_calls ?? []) as { function: { arguments: string } }[]);
      const joined = calls.map((c) => c.function.arguments).join("");
      expect(JSON.parse(joined)).toEqual({});
    }
    // Arguments that did arrive are not followed by another "{}".
    const args = deltas(runStream(GOLDEN_STREAM, req({ stream: true })).parts).flatMap((d) => (d.tool_calls ?? []) as { function: { arguments: string } }[]);
    expect(JSON.parse(args.map((c) => c.function.arguments).join(""))).toEqual({ location: "Paris", unit: "celsius" });
  });

  test("without include_usage there is no usage chunk, but usage is still learned", () => {
    const { parts } = runStream(GOLDEN_STREAM, req({ stream: true }));
    expect(chunks(parts).every((c) => (c.choices as unknown[]).length === 1)).toBe(true);
    expect(parts.some((p) => p.type === "usage")).toBe(true);
  });

  test("an exception frame ends the stream with an error part of the right status", () => {
    const { parts } = runStream([GOLDEN_STREAM[0]!, GOLDEN_STREAM[1]!, exception("throttlingException", '{"message":"Too many tokens, please wait before trying again."}')], req({ stream: true }));
    const error = parts.find((p) => p.type === "error");
    expect(error).toEqual({
      type: "error",
      error: { status: 429, type: "rate_limit_error", message: "bedrock stream failed with throttlingException: Too many tokens, please wait before trying again.", param: null },
    });
    const validation = runStream([exception("validationException", '{"message":"Input is too long for requested model."}')], req({ stream: true })).parts;
    expect(validation[0]).toMatchObject({ type: "error", error: { status: 400 } });
  });

  test("reasoning deltas stream as reasoning_content; the signature is not text but closes the signed block in thinking_blocks", () => {
    const { parts } = runStream(
      [
        event("messageStart", '{"role":"assistant"}'),
        event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"Hmm"}}}'),
        event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"."}}}'),
        event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"reasoningContent":{"signature":"EqQBCkgIARABGAIiQ"}}}'),
        event("contentBlockDelta", '{"contentBlockIndex":1,"delta":{"reasoningContent":{"redactedContent":"RWQ="}}}'),
        event("contentBlockDelta", '{"contentBlockIndex":2,"delta":{"text":"4"}}'),
        event("messageStop", '{"stopReason":"end_turn"}'),
      ],
      req({ stream: true }),
    );
    expect(deltas(parts).slice(1)).toEqual([
      { reasoning_content: "Hmm", finish: null },
      { reasoning_content: ".", finish: null },
      { thinking_blocks: [{ type: "thinking", thinking: "Hmm.", signature: "EqQBCkgIARABGAIiQ" }], finish: null },
      { thinking_blocks: [{ type: "redacted_thinking", data: "RWQ=" }], finish: null },
      { content: "4", finish: null },
      { finish: "stop" },
    ]);
  });

  test("with response_format, the forced tool's input streams as content and finishes with stop", () => {
    const { parts } = runStream(
      [
        event("messageStart", '{"role":"assistant"}'),
        event("contentBlockStart", '{"contentBlockIndex":0,"start":{"toolUse":{"name":"json_tool_call","toolUseId":"tooluse_x"}}}'),
        event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"toolUse":{"input":"{\\"city\\":"}}}'),
        event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"toolUse":{"input":"\\"Lyon\\"}"}}}'),
        event("messageStop", '{"stopReason":"tool_use"}'),
      ],
      req({ stream: true, response_format: { type: "json_object" } }),
    );
    expect(deltas(parts).slice(1)).toEqual([{ content: '{"city":', finish: null }, { content: '"Lyon"}', finish: null }, { finish: "stop" }]);
  });

  test("response_format while thinking: a preamble before the JSON tool never reaches the client; text answered without the tool is sent whole before the finish", () => {
    const jsonReq = req({ stream: true, response_format: { type: "json_object" } });
    const thinking = event("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"JSON wanted."}}}');
    const text = [event("contentBlockDelta", '{"contentBlockIndex":1,"delta":{"text":"Here is "}}'), event("contentBlockDelta", '{"contentBlockIndex":1,"delta":{"text":"the JSON:"}}')];
    const called = runStream(
      [
        event("messageStart", '{"role":"assistant"}'),
        thinking,
        ...text,
        event("contentBlockStart", '{"contentBlockIndex":2,"start":{"toolUse":{"name":"json_tool_call","toolUseId":"tooluse_x"}}}'),
        event("contentBlockDelta", '{"contentBlockIndex":2,"delta":{"toolUse":{"input":"{\\"city\\":\\"Lyon\\"}"}}}'),
        event("messageStop", '{"stopReason":"tool_use"}'),
      ],
      jsonReq,
    ).parts;
    expect(deltas(called).slice(1)).toEqual([{ reasoning_content: "JSON wanted.", finish: null }, { content: '{"city":"Lyon"}', finish: null }, { finish: "stop" }]);
    const uncalled = runStream([event("messageStart", '{"role":"assistant"}'), thinking, ...text, event("messageStop", '{"stopReason":"end_turn"}')], jsonReq).parts;
    expect(deltas(uncalled).slice(1)).toEqual([{ reasoning_content: "JSON wanted.", finish: null }, { content: "Here is the JSON:", finish: null }, { finish: "stop" }]);
  });

  test("a cut stream's usage is estimated from what arrived", () => {
    const { state } = runStream(GOLDEN_STREAM.slice(0, 3), req({ stream: true }));
    const estimate = chat.stream!.estimate(state);
    expect(estimate.completionTokens).toBe(Math.ceil("Let me check the weather.".length / 4));
    expect(estimate.promptTokens).toBeGreaterThan(0);
  });
});

// ---------------------------------------------------------------------------------------------
// Embeddings

describe("embeddings via InvokeModel", () => {
  const embed = (input: EmbeddingsRequest["input"], model: string, extra: Partial<EmbeddingsRequest> = {}) => {
    const call = embeddings.request({ model: "embedder", input, ...extra }, deployment(model));
    return { url: call.url, body: JSON.parse(call.body!) as WireJson };
  };

  test("Titan: one inputText per call, dimensions passed; a list is sent as one call per text", () => {
    const titan = deployment("amazon.titan-embed-text-v2:0");
    const { url, body } = embed("hello world", "amazon.titan-embed-text-v2:0", { dimensions: 256 });
    expect(url).toEndWith("/model/amazon.titan-embed-text-v2%3A0/invoke");
    expect(body).toEqual({ inputText: "hello world", dimensions: 256 });
    expect(embed(["only one"], "amazon.titan-embed-text-v2:0").body).toEqual({ inputText: "only one" });
    expect(embeddings.split!({ model: "embedder", input: ["a", "b"], dimensions: 256 }, titan)).toEqual([
      { model: "embedder", input: "a", dimensions: 256 },
      { model: "embedder", input: "b", dimensions: 256 },
    ]);
    expect(embeddings.split!({ model: "embedder", input: "a" }, titan)).toBeUndefined();
    expect(embeddings.split!({ model: "embedder", input: ["a"] }, titan)).toBeUndefined();
    expect(embeddings.split!({ model: "embedder", input: ["a", "b"] }, deployment("cohere.embed-english-v3"))).toBeUndefined();
    // Cohere: at most 96 texts per call.
    const texts = Array.from({ length: 100 }, (_, i) => `t${i}`);
    expect(embeddings.split!({ model: "embedder", input: texts }, deployment("cohere.embed-english-v3"))!.map((p) => p.input)).toEqual([texts.slice(0, 96), texts.slice(96)]);
    expect(badRequest(() => embeddings.split!({ model: "embedder", input: [[1, 2], [3]] }, titan)).info.message).toContain("token arrays");
    expect(badRequest(() => embed([], "amazon.titan-embed-text-v2:0")).info.message).toContain("empty");
    const joined = embeddings.join!(
      [
        embeddings.response({ embedding: [0.5], inputTextTokenCount: 3 }, { model: "embedder", input: "a" }),
        embeddings.response({ embedding: [-0.25], inputTextTokenCount: 4 }, { model: "embedder", input: "b" }),
      ],
      { model: "embedder", input: ["a", "b"] },
    );
    expect(joined.body).toEqual({
      object: "list",
      data: [
        { object: "embedding", index: 0, embedding: [0.5] },
        { object: "embedding", index: 1, embedding: [-0.25] },
      ],
      model: "embedder",
      usage: { prompt_tokens: 7, total_tokens: 7 },
    });
    expect(joined.usage).toEqual({ promptTokens: 7, completionTokens: 0 });
  });

  test("Cohere: the whole batch in texts, with an input_type (the client's, else the deployment's, else search_document)", () => {
    expect(embed(["a", "b"], "cohere.embed-english-v3").body).toEqual({ texts: ["a", "b"], input_type: "search_document" });
    expect(embed(["q"], "cohere.embed-english-v3", { input_type: "search_query" } as Partial<EmbeddingsRequest>).body).toEqual({ texts: ["q"], input_type: "search_query" });
    expect(embeddings.supportedParamsFor!(deployment("cohere.embed-english-v3"))).toContain("input_type");
    expect(embeddings.supportedParamsFor!(deployment("amazon.titan-embed-text-v2:0"))).not.toContain("input_type");
  });

  test("answers → OpenAI's list, with Titan's token count, Bedrock's count for Cohere, or an estimate", () => {
    const titan = embeddings.response({ embedding: [0.5, -0.25], embeddingsByType: { float: [0.5, -0.25] }, inputTextTokenCount: 3 }, { model: "embedder", input: "hi there" });
    expect(titan.body).toEqual({ object: "list", data: [{ object: "embedding", index: 0, embedding: [0.5, -0.25] }], model: "embedder", usage: { prompt_tokens: 3, total_tokens: 3 } });
    expect(titan.usage).toEqual({ promptTokens: 3, completionTokens: 0 });
    const cohere = embeddings.response(
      { embeddings: [[1, 0], [0, 1]], id: "5d4b6f0e", response_type: "embeddings_floats", texts: ["first text", "second"] },
      { model: "embedder", input: ["first text", "second"] },
    );
    expect((cohere.body.data as { index: number; embedding: number[] }[]).map((d) => [d.index, d.embedding])).toEqual([
      [0, [1, 0]],
      [1, [0, 1]],
    ]);
    expect(cohere.usage.promptTokens).toBe(Math.ceil("first textsecond".length / 4));
    // Bedrock counts Cohere's input in a response header: that count, not the estimate.
    const counted = embeddings.response(
      { embeddings: [[1, 0]], id: "5d4b6f0e", response_type: "embeddings_floats", texts: ["first text"] },
      { model: "embedder", input: ["first text"] },
      new Headers({ "x-amzn-bedrock-input-token-count": "17", "x-amzn-bedrock-invocation-latency": "31" }),
    );
    expect(counted.usage.promptTokens).toBe(17);
    expect(counted.body.usage).toEqual({ prompt_tokens: 17, total_tokens: 17 });
    const byType = embeddings.response({ embeddings: { float: [[0.25]] }, response_type: "embeddings_by_type", texts: ["x"] }, { model: "e", input: ["x"] });
    expect((byType.body.data as { embedding: number[] }[])[0]!.embedding).toEqual([0.25]);
  });

  test("encoding_format base64 → little-endian float32 bytes", () => {
    const { body } = embeddings.response({ embedding: [1, -2.5], inputTextTokenCount: 1 }, { model: "e", input: "x", encoding_format: "base64" });
    const b64 = (body.data as { embedding: string }[])[0]!.embedding;
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    expect(Array.from(new Float32Array(bytes.buffer))).toEqual([1, -2.5]);
  });
});

// ---------------------------------------------------------------------------------------------
// Errors

describe("Bedrock errors", () => {
  const message = bedrockProvider.errorMessage!;
  const kind = bedrockProvider.errorKind!;

  test("the message of Bedrock's error body", () => {
    expect(message(400, '{"message":"Malformed input request, please reformat your input and try again."}')).toBe("Malformed input request, please reformat your input and try again.");
    expect(message(403, '{"Message":"User: arn:aws:iam::123:user/x is not authorized to perform: bedrock:InvokeModel"}')).toContain("not authorized");
    expect(message(502, "<html>Bad Gateway</html>")).toBe("<html>Bad Gateway</html>");
  });

  test("context-window and content-policy refusals are recognised; throttling is not either", () => {
    expect(kind(400, '{"message":"Input is too long for requested model."}')).toBe("context_window_exceeded");
    expect(kind(400, '{"message":"Too many input tokens. Max input tokens: 8192, request input token count: 9001 "}')).toBe("context_window_exceeded");
    expect(kind(400, '{"message":"The model returned the following errors: input length and `max_tokens` exceed context limit: 199000 + 4096 > 200000"}')).toBe("context_window_exceeded");
    expect(kind(400, '{"message":"This request has been blocked by our content filters."}')).toBe("content_policy_violation");
    expect(kind(400, '{"message":"Your request was blocked by guardrails."}')).toBe("content_policy_violation");
    expect(kind(429, '{"message":"Too many requests, please wait before trying again."}')).toBeUndefined();
    expect(kind(400, '{"message":"Malformed input request, please reformat your input and try again."}')).toBeUndefined();
  });
});
