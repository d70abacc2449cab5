// The Anthropic provider end to end: the official `openai` SDK → the gateway → the mock Anthropic
// upstream (test/mock-upstream/anthropic.ts), which validates requests as strictly as Anthropic
// does. What the SDK parses here is what a client gets; `mock.requests` shows what went upstream.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI, { APIError, BadRequestError, RateLimitError } from "openai";
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { collect, failure } from "../harness/util.ts";
import { type MockAnthropic, startMockAnthropic } from "../mock-upstream/anthropic.ts";

const UPSTREAM_KEY = "sk-ant-api03-upstream-secret";
/** Small, so a context-window failure needs only a few kilobytes of prompt. */
const CONTEXT_WINDOW = 2000;

let mock: MockAnthropic;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockAnthropic({ apiKey: UPSTREAM_KEY, contextWindow: CONTEXT_WINDOW });
  const upstream = (extra: Record<string, unknown> = {}) => ({ model: "anthropic/claude-3-5-sonnet-20241022", api_base: mock.url, api_key: UPSTREAM_KEY, ...extra });
  gw = await startTestGateway({
    model_list: [
      { model_name: "claude", svc_params: upstream(), model_info: { id: "dep-claude" } },
      { model_name: "claude-wrong-key", svc_params: upstream({ api_key: "sk-ant-wrong" }), model_info: { id: "dep-wrong-key" } },
      { model_name: "claude-backup", svc_params: upstream(), model_info: { id: "dep-claude-backup" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
});

afterAll(async () => {
  await gw.stop();
  await mock.stop();
});

beforeEach(() => mock.reset());

const weather: ChatCompletionTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a place",
    parameters: { type: "object", properties: { location: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["location"] },
  },
};
const time: ChatCompletionTool = {
  type: "function",
  function: { name: "get_time", parameters: { type: "object", properties: { timezone: { type: "string" } } } },
};

const lastUpstreamBody = () => mock.requests.at(-1)!.body as Record<string, unknown>;

describe("chat", () => {
  test("a chat answer comes back as chat.completion; the upstream call is a Messages API call with the deployment's key", async () => {
    const { data, response } = await client.chat.completions
      .create({ model: "claude", messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello from the SDK" }], max_tokens: 100, user: "end-user-7" })
      .withResponse();
    expect(data.object).toBe("chat.completion");
    expect(data.id).toStartWith("msg_01");
    expect(data.model).toBe("claude-3-5-sonnet-20241022");
    expect(data.choices[0]!.message).toMatchObject({ role: "assistant", content: "Mock reply to: Hello from the SDK" });
    expect(data.choices[0]!.finish_reason).toBe("stop");
    // One token per word of the mock's reply.
    expect(data.usage!.completion_tokens).toBe(7);
    expect(data.usage!.total_tokens).toBe(data.usage!.prompt_tokens + 7);

    const sent = mock.requests.at(-1)!;
    expect(sent.path).toBe("/v1/messages");
    expect(sent.headers["x-api-key"]).toBe(UPSTREAM_KEY);
    expect(sent.headers["anthropic-version"]).toBe("2023-06-01");
    expect(sent.headers.authorization).toBeUndefined();
    expect(sent.body).toEqual({
      model: "claude-3-5-sonnet-20241022",
      max_tokens: 100,
      system: "Be brief.",
      messages: [{ role: "user", content: "Hello from the SDK" }],
      metadata: { user_id: "end-user-7" },
    });
    // Priced from the bundled table (claude-3-5-sonnet-20241022: $3 / $15 per million tokens).
    const cost = Number(response.headers.get("x-svc-response-cost"));
    expect(cost).toBeGreaterThan(0);
    // Anthropic's own rate-limit state, under OpenAI's header names.
    expect(response.headers.get("x-ratelimit-remaining-requests")).toBe("3999");
    expect(response.headers.get("x-ratelimit-limit-tokens")).toBe("480000");
    expect(cost).toBeCloseTo((data.usage!.prompt_tokens * 3 + 7 * 15) / 1e6, 12);
  });

  test("prompt caching: the first call writes the cache, the second reads it, is reported as cached and costs less", async () => {
    const manual = "Reference manual. ".repeat(200);
    const ask = () =>
      client.chat.completions
        .create({
          model: "claude",
          messages: [
            { role: "system", content: [{ type: "text", text: manual, cache_control: { type: "ephemeral" } } as never] },
            { role: "user", content: "Summarise" },
          ],
        })
        .withResponse();
    const first = await ask();
    const second = await ask();
    const u1 = first.data.usage as unknown as Record<string, number> & { prompt_tokens_details: { cached_tokens: number } };
    const u2 = second.data.usage as unknown as Record<string, number> & { prompt_tokens_details: { cached_tokens: number } };
    expect(u1.cache_creation_input_tokens).toBeGreaterThan(800);
    expect(u1.prompt_tokens_details.cached_tokens).toBe(0);
    expect(u2.prompt_tokens_details.cached_tokens).toBe(u1.cache_creation_input_tokens!);
    // Cached tokens are part of the prompt total (OpenAI's convention), not added to it.
    expect(u2.prompt_tokens).toBe(u1.prompt_tokens);
    expect(Number(second.response.headers.get("x-svc-response-cost"))).toBeLessThan(Number(first.response.headers.get("x-svc-response-cost")) / 3);
    expect((lastUpstreamBody().system as unknown[])[0]).toEqual({ type: "text", text: manual, cache_control: { type: "ephemeral" } });
  });

  test("a tool round trip: tool_calls come back with JSON arguments, the tool result goes back as a tool_result", async () => {
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: "Use get_weather for Paris" }];
    const first = await client.chat.completions.create({ model: "claude", messages, tools: [weather] });
    const choice = first.choices[0]!;
    expect(choice.finish_reason).toBe("tool_calls");
    expect(choice.message.content).toBe("Calling get_weather.");
    const call = choice.message.tool_calls![0]!;
    expect(call.id).toStartWith("toolu_01");
    expect(call.type).toBe("function");
    expect((call as { function: { name: string; arguments: string } }).function.name).toBe("get_weather");
    expect(JSON.parse((call as { function: { arguments: string } }).function.arguments)).toEqual({ location: "Paris", unit: "celsius" });

    messages.push(choice.message, { role: "tool", tool_call_id: call.id, content: "18 degrees and sunny" });
    const second = await client.chat.completions.create({ model: "claude", messages, tools: [weather] });
    expect(second.choices[0]!.message.content).toBe("Mock reply to: Tool result: 18 degrees and sunny");
    const sent = lastUpstreamBody().messages as { role: string; content: unknown }[];
    expect(sent.map((m) => m.role)).toEqual(["user", "assistant", "user"]);
    expect(sent[2]!.content).toEqual([{ type: "tool_result", tool_use_id: call.id, content: "18 degrees and sunny" }]);
  });

  test("response_format json_schema: the answer is JSON matching the schema", async () => {
    const res = await client.chat.completions.create({
      model: "claude",
      messages: [{ role: "user", content: "Where is the Louvre?" }],
      response_format: { type: "json_schema", json_schema: { name: "place", schema: { type: "object", properties: { city: { type: "string" }, count: { type: "integer" } } } } },
    });
    expect(JSON.parse(res.choices[0]!.message.content!)).toEqual({ city: "Paris", count: 1 });
    expect(res.choices[0]!.finish_reason).toBe("stop");
    expect(res.choices[0]!.message.tool_calls).toBeUndefined();
  });

  test("reasoning_effort turns thinking on: the reasoning comes back beside the answer", async () => {
    const res = await client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "Think about tea" }], reasoning_effort: "low" });
    const message = res.choices[0]!.message as unknown as { content: string; reasoning_content: string; thinking_blocks: { type: string; signature: string }[] };
    expect(message.reasoning_content).toBe("Considering: Think about tea");
    expect(message.thinking_blocks[0]!.signature.length).toBeGreaterThan(20);
    expect(message.content).toBe("Mock reply to: Think about tea");
    expect(lastUpstreamBody()).toMatchObject({ thinking: { type: "enabled", budget_tokens: 1024 }, max_tokens: 5120 });
  });

  test("images from data URLs reach Anthropic as base64 image blocks", async () => {
    await client.chat.completions.create({
      model: "claude",
      messages: [{ role: "user", content: [{ type: "text", text: "Describe" }, { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==" } }] }],
    });
    expect((lastUpstreamBody().messages as { content: unknown[] }[])[0]!.content[1]).toEqual({ type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgoAAAANSUhEUg==" } });
  });

  test("a request of system messages only is answered: their text is the user's turn, as for Gemini", async () => {
    const res = await client.chat.completions.create({ model: "claude", messages: [{ role: "system", content: "Say hello." }, { role: "developer", content: "Briefly." }] });
    expect(res.choices[0]!.message.content).toBe("Mock reply to: Say hello. Briefly.");
    const sent = lastUpstreamBody();
    expect(sent.messages).toEqual([{ role: "user", content: "Say hello.\n\nBriefly." }]);
    expect(sent).not.toHaveProperty("system");
  });

  test("an image/jpg data URL (as clients name a .jpg) is answered, sent to Anthropic as image/jpeg", async () => {
    for (const type of ["image/jpg", "IMAGE/JPG"]) {
      const res = await client.chat.completions.create({
        model: "claude",
        messages: [{ role: "user", content: [{ type: "text", text: "Describe" }, { type: "image_url", image_url: { url: `data:${type};base64,/9j/4AAQSkZJRg==` } }] }],
      });
      expect(res.choices[0]!.message.content).toStartWith("Mock reply to:");
      expect((lastUpstreamBody().messages as { content: unknown[] }[])[0]!.content[1]).toEqual({ type: "image", source: { type: "base64", media_type: "image/jpeg", data: "/9j/4AAQSkZJRg==" } });
    }
  });

  test("parameters Anthropic has no equivalent for are refused with a 400 naming them, or dropped on request", async () => {
    const err = await failure(client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }], n: 2, seed: 7 }));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as APIError).message).toContain("['n', 'seed']");
    expect(mock.requests).toHaveLength(0);
    const ok = await client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }], n: 2, drop_params: true } as never);
    expect(ok.choices).toHaveLength(1);
    expect(lastUpstreamBody().n).toBeUndefined();
  });
});

describe("stream", () => {
  test("text streams as chat.completion.chunks: role first, the words, finish, then the usage chunk asked for", async () => {
    const stream = await client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "stream these words please" }], stream: true, stream_options: { include_usage: true } });
    const chunks = await collect(stream);
    expect(chunks.every((c) => c.object === "chat.completion.chunk" && c.id === chunks[0]!.id)).toBe(true);
    expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant");
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
    expect(text).toBe("Mock reply to: stream these words please");
    // One chunk per upstream text delta: the translation does not buffer.
    expect(chunks.filter((c) => c.choices[0]?.delta.content).length).toBe(7);
    const finish = chunks.at(-2)!;
    expect(finish.choices[0]!.finish_reason).toBe("stop");
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage!.completion_tokens).toBe(7);
    expect(last.usage!.prompt_tokens).toBeGreaterThan(0);
    expect(lastUpstreamBody().stream).toBe(true);
    expect(lastUpstreamBody().stream_options).toBeUndefined();
  });

  test("without include_usage there is no usage chunk", async () => {
    const chunks = await collect(await client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }], stream: true }));
    expect(chunks.every((c) => c.choices.length === 1 && !c.usage)).toBe(true);
  });

  test("parallel tool calls stream in pieces: id and name first, then argument fragments by index", async () => {
    const stream = await client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "Call get_weather and get_time" }], tools: [weather, time], stream: true });
    const chunks: ChatCompletionChunk[] = await collect(stream);
    const calls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    const opened = calls.filter((c) => c.id);
    expect(opened.map((c) => [c.index, c.function!.name])).toEqual([
      [0, "get_weather"],
      [1, "get_time"],
    ]);
    const args = (i: number) =>
      calls
        .filter((c) => c.index === i)
        .map((c) => c.function?.arguments ?? "")
        .join("");
    // Arguments arrive in several pieces, cut through keys and values, and assemble to JSON.
    expect(calls.filter((c) => c.index === 0 && !c.id).length).toBeGreaterThan(2);
    expect(JSON.parse(args(0))).toEqual({ location: "Paris", unit: "celsius" });
    expect(JSON.parse(args(1))).toEqual({ timezone: "mock" });
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("tool_calls");
  });

  test("a stream cut by the upstream ends with an error the SDK raises", async () => {
    mock.fault({ kind: "cutStream", afterEvents: 5 });
    const stream = await client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "one two three four five six" }], stream: true });
    const seen: string[] = [];
    const err = await failure(
      (async () => {
        for await (const c of stream) seen.push(c.choices[0]?.delta.content ?? "");
      })(),
    );
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toContain("ended unexpectedly");
    expect(seen.join("")).toStartWith("Mock");
  });

  test("Anthropic's in-stream overloaded error reaches the client as an error event", async () => {
    mock.fault({ kind: "streamError", afterEvents: 4 });
    const stream = await client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }], stream: true });
    const err = await failure(collect(stream));
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toContain("overloaded_error: Overloaded");
  });

  // Before anything was sent (no event, or only those that open the message: message_start,
  // content_block_start, ping), an in-band error fails the attempt as an HTTP error would.
  for (const afterEvents of [0, 3]) {
    test(`an overloaded error after ${afterEvents} opening events is retried, then falls back, before the stream begins`, async () => {
      const body = { model: "claude", messages: [{ role: "user" as const, content: "hi" }], stream: true as const };
      mock.fault({ kind: "streamError", afterEvents });
      const retried = await client.chat.completions.create({ ...body, num_retries: 1 } as typeof body).withResponse();
      expect((await collect(retried.data)).map((c) => c.choices[0]?.delta.content ?? "").join("")).toStartWith("Mock reply");
      expect(retried.response.headers.get("x-svc-attempted-retries")).toBe("1");
      expect(mock.requests).toHaveLength(2);

      mock.fault({ kind: "streamError", afterEvents });
      const fellBack = await client.chat.completions.create({ ...body, fallbacks: ["claude-backup"] } as typeof body).withResponse();
      expect((await collect(fellBack.data)).length).toBeGreaterThan(1);
      expect(fellBack.response.headers.get("x-svc-model-id")).toBe("dep-claude-backup");
      expect(fellBack.response.headers.get("x-svc-attempted-fallbacks")).toBe("1");

      // With neither, the client gets the error's status, not a 200 and an error event.
      mock.fault({ kind: "streamError", afterEvents });
      const err = await failure(client.chat.completions.create(body));
      expect(err).toBeInstanceOf(APIError);
      expect((err as APIError).status).toBe(503);
      expect((err as APIError).message).toContain("overloaded_error: Overloaded");
      // The same failure as Anthropic's HTTP 529 (see "overloaded (529) …" below).
      expect((err as APIError).type).toBe("api_connection_error");
    });
  }

  test("an in-stream error that quotes the deployment's key reaches the client without it", async () => {
    mock.fault({ kind: "streamError", afterEvents: 4, errorType: "authentication_error", message: `bad credential ${UPSTREAM_KEY}` });
    const stream = await client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }], stream: true });
    const err = await failure(collect(stream));
    expect((err as APIError).message).toContain("bad credential [redacted]");
    expect(JSON.stringify(err)).not.toContain(UPSTREAM_KEY);
  });
});

describe("errors", () => {
  test("a prompt over the context window → 400 context_window_exceeded with Anthropic's message", async () => {
    const err = await failure(client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "word ".repeat(CONTEXT_WINDOW * 2) }] }));
    expect(err).toBeInstanceOf(BadRequestError);
    const e = err as APIError;
    expect(e.status).toBe(400);
    expect(e.type).toBe("context_window_exceeded");
    expect(e.message).toMatch(/prompt is too long: \d+ tokens > 2000 maximum/);
  });

  test("a rate limit keeps its status and retry-after", async () => {
    mock.fault({ kind: "status", status: 429 });
    const err = await failure(client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }] }));
    expect(err).toBeInstanceOf(RateLimitError);
    expect((err as APIError).headers?.get("retry-after")).toBe("1");
    expect((err as APIError).message).toContain("rate_limit_error");
  });

  test("overloaded (529) is a server error that names Anthropic's error type", async () => {
    mock.fault({ kind: "status", status: 529 });
    const err = await failure(client.chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }] }));
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).status).toBe(503);
    expect((err as APIError).type).toBe("api_connection_error");
    expect((err as APIError).message).toContain("anthropic returned 529 for model claude: overloaded_error: Overloaded");
  });

  test("a wrong upstream key → 401 with Anthropic's message", async () => {
    const err = await failure(client.chat.completions.create({ model: "claude-wrong-key", messages: [{ role: "user", content: "hi" }] }));
    expect((err as APIError).status).toBe(401);
    expect((err as APIError).message).toContain("authentication_error: invalid x-api-key");
  });
});

test("token counting with call_endpoint=true asks Anthropic's count_tokens", async () => {
  const res = await fetch(`${gw.url}/utils/token_counter?call_endpoint=true`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "claude", messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "How many tokens is this?" }] }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { total_tokens: number; tokenizer_type: string; original_response: { input_tokens: number } };
  expect(body.tokenizer_type).toBe("anthropic_api");
  expect(body.total_tokens).toBe(body.original_response.input_tokens);
  expect(body.total_tokens).toBeGreaterThan(5);
  expect(mock.requests.at(-1)!.path).toBe("/v1/messages/count_tokens");
  expect(mock.requests.at(-1)!.body).toEqual({ model: "claude-3-5-sonnet-20241022", system: "Be brief.", messages: [{ role: "user", content: "How many tokens is this?" }] });
});
