// Ollama golden fixtures, both directions: the OpenAI request → the `/api/chat` body Ollama's API
// documents, and Ollama's answers and NDJSON streams (cut mid-line) → what an OpenAI client receives.
import { afterEach, describe, expect, test } from "bun:test";
import type { ChatRequest, CompletionRequest, Deployment, WireJson } from "../../core/contract.ts";
import { paramsFor, supportedBody } from "../../core/pipeline/params.ts";
import { ollamaProvider } from "../../providers/ollama/index.ts";
import { assemble, chunks, cutEvery, runStream, usageOf } from "./run-stream.ts";

const chat = ollamaProvider.endpoints.chat!;
const embeddings = ollamaProvider.endpoints.embeddings!;

function deployment(over: Partial<Deployment> = {}): Deployment {
  const resolved = ollamaProvider.resolve!({ id: "dep-ol", modelName: "llama", provider: "ollama", upstreamModel: "llama3.2", options: {}, info: {}, ...over });
  if (typeof resolved === "string") throw new Error(resolved);
  return resolved;
}

const savedBase = process.env.OLLAMA_API_BASE;
afterEach(() => {
  if (savedBase === undefined) delete process.env.OLLAMA_API_BASE;
  else process.env.OLLAMA_API_BASE = savedBase;
});

/** Content parts as a client sends them (the request schema types parts loosely). */
const parts = (...list: WireJson[]) => list as ChatRequest["messages"][number]["content"];

const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
const weatherTool = {
  type: "function",
  function: { name: "get_weather", description: "Current weather for a place", parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] } },
};

describe("OpenAI request → Ollama /api/chat", () => {
  test("images as base64, tool calls with object arguments, tool results by name, options, format", () => {
    const req: ChatRequest = {
      model: "llama",
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: parts({ type: "text", text: "What is this, and the weather in Paris?" }, { type: "image_url", image_url: { url: `data:image/png;base64,${PNG}` } }) },
        { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"location":"Paris"}' } }] },
        { role: "tool", tool_call_id: "call_1", content: "22 degrees and sunny" },
      ],
      tools: [weatherTool],
      temperature: 0.2,
      top_p: 0.8,
      max_tokens: 128,
      stop: ["\n\n"],
      seed: 42,
      frequency_penalty: 0.5,
      presence_penalty: 0.25,
      response_format: { type: "json_schema", json_schema: { name: "a", schema: { type: "object", properties: { answer: { type: "string" } } } } },
    };
    const call = chat.request(req, deployment({ options: { num_ctx: 8192, keep_alive: "10m" } }));
    expect(call.url).toBe("http://localhost:11434/api/chat");
    expect(call.headers.authorization).toBeUndefined();
    expect(JSON.parse(call.body!)).toEqual({
      model: "llama3.2",
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: "What is this, and the weather in Paris?", images: [PNG] },
        { role: "assistant", content: "", tool_calls: [{ function: { name: "get_weather", arguments: { location: "Paris" } } }] },
        { role: "tool", content: "22 degrees and sunny", tool_name: "get_weather" },
      ],
      // Ollama streams unless told not to.
      stream: false,
      tools: [weatherTool],
      format: { type: "object", properties: { answer: { type: "string" } } },
      options: { temperature: 0.2, top_p: 0.8, num_predict: 128, stop: ["\n\n"], seed: 42, frequency_penalty: 0.5, presence_penalty: 0.25, num_ctx: 8192 },
      keep_alive: "10m",
    });
  });

  test("json_object → format json; tool_choice none drops the tools; a key is sent as bearer; base from OLLAMA_API_BASE", () => {
    process.env.OLLAMA_API_BASE = "http://gpu-box:11434/";
    const call = chat.request({ model: "llama", messages: [{ role: "user", content: "hi" }], stream: true, tools: [weatherTool], tool_choice: "none", response_format: { type: "json_object" } }, deployment({ apiKey: "ol-key" }));
    expect(call.url).toBe("http://gpu-box:11434/api/chat");
    expect(call.headers.authorization).toBe("Bearer ol-key");
    expect(JSON.parse(call.body!)).toEqual({ model: "llama3.2", messages: [{ role: "user", content: "hi" }], stream: true, format: "json" });
  });

  test("an image link cannot be sent (Ollama fetches nothing): the error says so", () => {
    const req: ChatRequest = { model: "llama", messages: [{ role: "user", content: parts({ type: "image_url", image_url: { url: "https://example.com/cat.png" } }) }] };
    expect(() => chat.request(req, deployment())).toThrow(/base64 data URLs/);
  });
});

describe("reasoning_effort → think", () => {
  const ask = (effort: unknown): ChatRequest => ({ model: "llama", messages: [{ role: "user", content: "why?" }], reasoning_effort: effort }) as ChatRequest;
  const sentThink = (effort: unknown, d: Deployment) => (JSON.parse(chat.request(ask(effort), d).body!) as WireJson).think;

  test("is accepted, not refused as a parameter Ollama lacks", () => {
    const d = deployment();
    expect(supportedBody(ask("high"), paramsFor(chat, d)!, d, false)).toMatchObject({ reasoning_effort: "high" });
  });

  test("a thinking model thinks from low up (minimal and none do not); gpt-oss gets the level, minimal as its lowest", () => {
    const qwen = deployment({ upstreamModel: "qwen3" });
    const gptOss = deployment({ upstreamModel: "gpt-oss:20b" });
    const levels = ["none", "minimal", "low", "medium", "high"];
    expect(levels.map((e) => sentThink(e, qwen))).toEqual([false, false, true, true, true]);
    expect(levels.map((e) => sentThink(e, gptOss))).toEqual([false, "low", "low", "medium", "high"]);
  });

  test("the client's effort overrides svc_params.think, which still applies when the client sets none", () => {
    const d = deployment({ upstreamModel: "qwen3", options: { think: true } });
    expect(sentThink("none", d)).toBe(false);
    expect(sentThink(undefined, d)).toBe(true);
    expect("think" in (JSON.parse(chat.request(ask(undefined), deployment()).body!) as WireJson)).toBe(false);
  });

  test("a level OpenAI does not know is the client's 400", () => {
    expect(() => chat.request(ask("extreme"), deployment())).toThrow(/reasoning_effort "extreme" is not one of none, minimal, low, medium, high/);
  });
});

describe("Ollama answer → chat.completion", () => {
  const req: ChatRequest = { model: "llama", messages: [{ role: "user", content: "why is the sky blue?" }] };

  test("text with the counts as usage", () => {
    const answer = {
      model: "llama3.2",
      created_at: "2023-12-12T14:13:43.416799Z",
      message: { role: "assistant", content: "Hello! How are you today?" },
      done_reason: "stop",
      done: true,
      total_duration: 5191566416,
      load_duration: 2154458,
      prompt_eval_count: 26,
      prompt_eval_duration: 383809000,
      eval_count: 298,
      eval_duration: 4799921000,
    };
    const { body, usage } = chat.response(answer, req);
    expect(body).toEqual({
      id: expect.stringMatching(/^chatcmpl-/),
      object: "chat.completion",
      created: 1702390423,
      model: "llama3.2",
      choices: [{ index: 0, message: { role: "assistant", content: "Hello! How are you today?" }, logprobs: null, finish_reason: "stop" }],
      usage: { prompt_tokens: 26, completion_tokens: 298, total_tokens: 324, prompt_tokens_details: { cached_tokens: 0 }, completion_tokens_details: { reasoning_tokens: 0 } },
    });
    expect(usage).toEqual({ promptTokens: 26, completionTokens: 298 });
  });

  test("tool calls (arguments as an object, no id) → JSON text with a call id, finish tool_calls", () => {
    const answer = {
      model: "llama3.2",
      created_at: "2024-07-22T20:33:28.123648Z",
      message: { role: "assistant", content: "", tool_calls: [{ function: { name: "get_current_weather", arguments: { format: "celsius", location: "Paris, FR" } } }] },
      done_reason: "stop",
      done: true,
      prompt_eval_count: 210,
      eval_count: 25,
    };
    const { body } = chat.response(answer, req);
    const choice = (body.choices as WireJson[])[0]!;
    expect(choice.finish_reason).toBe("tool_calls");
    const message = choice.message as WireJson;
    expect(message.content).toBeNull();
    const calls = message.tool_calls as WireJson[];
    expect(calls).toEqual([{ id: expect.stringMatching(/^call_/), type: "function", function: { name: "get_current_weather", arguments: '{"format":"celsius","location":"Paris, FR"}' } }]);
  });

  test("done_reason length → length; thinking → reasoning_content", () => {
    const answer = { model: "qwen3", created_at: "2025-05-29T09:35:56.012222Z", message: { role: "assistant", content: "The sky", thinking: "Rayleigh." }, done_reason: "length", done: true, prompt_eval_count: 12, eval_count: 2 };
    const { body, usage } = chat.response(answer, req);
    const choice = (body.choices as WireJson[])[0]!;
    expect(choice.finish_reason).toBe("length");
    expect(choice.message).toEqual({ role: "assistant", content: "The sky", reasoning_content: "Rayleigh." });
    expect(usage).toEqual({ promptTokens: 12, completionTokens: 2 });
  });
});

const line = (o: object) => `${JSON.stringify(o)}\n`;

describe("a prompt Ollama took from its cache (no prompt_eval_count) is estimated, not free", () => {
  // "why is the sky blue?": 20 characters, 5 tokens at four characters a token.
  const question = "why is the sky blue?";
  const cached = { model: "llama3.2", created_at: "2025-05-29T09:35:56Z", done_reason: "stop", done: true, eval_count: 3 };

  test("chat, whole and streamed", () => {
    const req: ChatRequest = { model: "llama", messages: [{ role: "user", content: question }] };
    expect(chat.response({ ...cached, message: { role: "assistant", content: "Hi" } }, req).usage).toEqual({ promptTokens: 5, completionTokens: 3 });
    const stream = line({ ...cached, message: { role: "assistant", content: "Hi" } });
    const { parts } = runStream(chat.stream!, { ...req, stream: true, stream_options: { include_usage: true } }, [stream]);
    expect(usageOf(parts)).toEqual({ promptTokens: 5, completionTokens: 3 });
    expect(assemble(chunks(parts)).usage).toMatchObject({ prompt_tokens: 5, completion_tokens: 3 });
  });

  test("legacy completions (/api/generate), whole and streamed", () => {
    const completions = ollamaProvider.endpoints.completions!;
    const req: CompletionRequest = { model: "llama", prompt: question };
    expect(completions.response({ ...cached, response: "Hi" }, req).usage).toEqual({ promptTokens: 5, completionTokens: 3 });
    const stream = completions.stream!;
    const parts = stream.event(JSON.stringify({ ...cached, response: "Hi" }), stream.init({ ...req, stream: true }));
    expect(usageOf(parts)).toEqual({ promptTokens: 5, completionTokens: 3 });
  });

  test("embeddings", () => {
    const answer = { model: "all-minilm", embeddings: [[0.1, 0.2]] };
    expect(embeddings.response(answer, { model: "embedder", input: question }).usage).toEqual({ promptTokens: 5, completionTokens: 0 });
  });
});

const TEXT_STREAM = [
  line({ model: "llama3.2", created_at: "2023-08-04T08:52:19.385406455-07:00", message: { role: "assistant", content: "The" }, done: false }),
  line({ model: "llama3.2", created_at: "2023-08-04T08:52:19.385406455-07:00", message: { role: "assistant", content: ' sky is "blue"' }, done: false }),
  line({ model: "llama3.2", created_at: "2023-08-04T08:52:19.385406455-07:00", message: { role: "assistant", content: "." }, done: false }),
  line({
    model: "llama3.2",
    created_at: "2023-08-04T19:22:45.499127Z",
    message: { role: "assistant", content: "" },
    done_reason: "stop",
    done: true,
    total_duration: 4883583458,
    load_duration: 1334875,
    prompt_eval_count: 26,
    prompt_eval_duration: 342546000,
    eval_count: 282,
    eval_duration: 4535599000,
  }),
].join("");

const TOOL_STREAM = [
  line({ model: "qwen3", created_at: "2025-05-29T09:35:56Z", message: { role: "assistant", content: "", thinking: "The user wants weather." }, done: false }),
  line({
    model: "qwen3",
    created_at: "2025-05-29T09:35:57Z",
    message: { role: "assistant", content: "", tool_calls: [{ function: { name: "get_weather", arguments: { location: "Paris" } } }, { id: "call_zz9", function: { name: "get_time", arguments: {} } }] },
    done: false,
  }),
  line({ model: "qwen3", created_at: "2025-05-29T09:35:57Z", message: { role: "assistant", content: "" }, done_reason: "stop", done: true, prompt_eval_count: 180, eval_count: 40 }),
].join("");

describe("Ollama NDJSON stream → chat.completion.chunk", () => {
  const req = (includeUsage: boolean): ChatRequest => ({ model: "llama", messages: [{ role: "user", content: "why is the sky blue?" }], stream: true, ...(includeUsage ? { stream_options: { include_usage: true } } : {}) });

  test("text: whole, and cut mid-line every 9 characters, gives the same chunks", () => {
    for (const pieces of [[TEXT_STREAM], cutEvery(TEXT_STREAM, 9), cutEvery(TEXT_STREAM, 1)]) {
      const { parts, state } = runStream(chat.stream!, req(true), pieces);
      const list = chunks(parts);
      expect(list[0]).toEqual({
        id: chat.stream!.responseId!(state),
        object: "chat.completion.chunk",
        created: 1691164339,
        model: "llama3.2",
        choices: [{ index: 0, delta: { role: "assistant", content: "The" }, logprobs: null, finish_reason: null }],
      });
      expect(assemble(list)).toMatchObject({ role: "assistant", content: 'The sky is "blue".', finish: "stop", usage: { prompt_tokens: 26, completion_tokens: 282, total_tokens: 308 } });
      expect(list.at(-1)!.choices).toEqual([]);
      expect(usageOf(parts)).toEqual({ promptTokens: 26, completionTokens: 282 });
    }
  });

  test("tool calls (each whole in one line) get indexes and ids; thinking is reasoning_content; finish tool_calls", () => {
    const { parts } = runStream(chat.stream!, req(false), cutEvery(TOOL_STREAM, 17));
    const out = assemble(chunks(parts));
    expect(out.reasoning).toBe("The user wants weather.");
    expect(out.toolCalls).toEqual([
      { id: expect.stringMatching(/^call_/), name: "get_weather", arguments: '{"location":"Paris"}' },
      { id: "call_zz9", name: "get_time", arguments: "{}" },
    ]);
    expect(out.finish).toBe("tool_calls");
    expect(out.usage).toBeUndefined();
    expect(usageOf(parts)).toEqual({ promptTokens: 180, completionTokens: 40 });
  });

  test("an error line ends the stream with the error", () => {
    const text = `${TEXT_STREAM.split("\n")[0]}\n${line({ error: "an error was encountered while running the model: unexpected EOF" })}`;
    const { parts } = runStream(chat.stream!, req(false), [text]);
    expect(parts.at(-1)).toEqual({ type: "error", error: { status: 500, type: "api_error", message: "Ollama stream failed: an error was encountered while running the model: unexpected EOF" } });
  });
});

describe("embeddings ↔ /api/embed", () => {
  test("input as given, dimensions; embeddings and prompt_eval_count back", () => {
    const call = embeddings.request({ model: "embedder", input: ["Why is the sky blue?", "Why is the grass green?"], dimensions: 4 }, deployment({ upstreamModel: "all-minilm" }));
    expect(call.url).toBe("http://localhost:11434/api/embed");
    expect(JSON.parse(call.body!)).toEqual({ model: "all-minilm", input: ["Why is the sky blue?", "Why is the grass green?"], dimensions: 4 });
    expect((JSON.parse(embeddings.request({ model: "embedder", input: "one" }, deployment()).body!) as WireJson).input).toBe("one");
    const answer = { model: "all-minilm", embeddings: [[0.010071029, -0.0017594862], [-0.0098027075, 0.06042469]], total_duration: 14143917, load_duration: 1019500, prompt_eval_count: 8 };
    const { body, usage } = embeddings.response(answer, { model: "embedder", input: ["a", "b"] });
    expect(body).toEqual({
      object: "list",
      data: [
        { object: "embedding", index: 0, embedding: [0.010071029, -0.0017594862] },
        { object: "embedding", index: 1, embedding: [-0.0098027075, 0.06042469] },
      ],
      model: "all-minilm",
      usage: { prompt_tokens: 8, total_tokens: 8 },
    });
    expect(usage).toEqual({ promptTokens: 8, completionTokens: 0 });
  });
});

describe("errors", () => {
  test("Ollama's {error} body gives the message; a prompt over the context length is a context-window error at 400 or 500", () => {
    const body = '{"error":"the input length exceeds the context length"}';
    expect(ollamaProvider.errorMessage!(400, body)).toBe("the input length exceeds the context length");
    expect(ollamaProvider.errorKind!(400, body)).toBe("context_window_exceeded");
    expect(ollamaProvider.errorKind!(500, body)).toBe("context_window_exceeded");
    const missing = '{"error":"model \\"llama3\\" not found, try pulling it first"}';
    expect(ollamaProvider.errorMessage!(404, missing)).toBe('model "llama3" not found, try pulling it first');
    expect(ollamaProvider.errorKind!(404, missing)).toBeUndefined();
    expect(ollamaProvider.errorKind!(500, '{"error":"llama runner process has terminated: exit status 2"}')).toBeUndefined();
  });

  test("ollama/ and ollama_chat/ are both served", () => {
    expect(ollamaProvider.ids).toEqual(["ollama", "ollama_chat"]);
  });
});
