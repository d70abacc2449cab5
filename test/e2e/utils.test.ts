// The /utils endpoints over HTTP, and the unsupported-parameter check on /chat/completions:
// token_counter with OpenAI's tokenizer (counts written literally: common English words are one
// token each) or the provider's own counter (Anthropic's count_tokens, under a deadline);
// supported_openai_params from the adapter's list; transform_request showing the exact upstream
// call with credentials redacted; a virtual key's model access on all of them.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI, { BadRequestError } from "openai";
import { redactUrl } from "../../core/http/routes/utils.ts";
import { MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { Random } from "../harness/random.ts";
import { failure } from "../harness/util.ts";
import { type MockAnthropic, startMockAnthropic } from "../mock-upstream/anthropic.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const OPENAI_KEY = "sk-upstream-openai-secret-42";
const ANTHROPIC_KEY = "sk-ant-upstream-secret-42";
const CLAUDE = "claude-sonnet-4-20250514";

let openai: MockOpenAI;
let anthropic: MockAnthropic;
let gw: TestGateway;
/** A virtual key that may use gpt-4o-model only. */
let narrowKey: string;

beforeAll(async () => {
  openai = await startMockOpenAI({ apiKey: OPENAI_KEY });
  anthropic = await startMockAnthropic({ apiKey: ANTHROPIC_KEY });
  const viaOpenAI = (model: string, extra: Record<string, unknown> = {}) => ({ model, api_base: openai.url, api_key: OPENAI_KEY, ...extra });
  const viaAnthropic = (extra: Record<string, unknown> = {}) => ({ model: `anthropic/${CLAUDE}`, api_base: anthropic.url, api_key: ANTHROPIC_KEY, ...extra });
  gw = await startTestGateway(
    {
      model_list: [
        { model_name: "gpt-4o-model", svc_params: viaOpenAI("openai/gpt-4o") },
        { model_name: "gpt4-legacy", svc_params: viaOpenAI("openai/gpt-4") },
        { model_name: "embedder", svc_params: viaOpenAI("openai/text-embedding-3-small"), model_info: { mode: "embedding" } },
        {
          model_name: "with-headers",
          svc_params: viaOpenAI("openai/gpt-4o-mini", { headers: { "x-goog-api-key": "g-secret-1", "api-key": "a-secret-2", "x-trace": "keep-me" } }),
        },
        { model_name: "query-base", svc_params: viaOpenAI("openai/gpt-4o-mini", { api_base: `${openai.url}/v2?tier=2&key=QUERYsecret42` }) },
        { model_name: "claude", svc_params: viaAnthropic() },
        { model_name: "claude-slow", svc_params: viaAnthropic({ timeout: 0.5 }) },
        // Drained, listed first: nothing listens there.
        { model_name: "claude-pair", svc_params: viaAnthropic({ api_base: "http://127.0.0.1:1", weight: 0 }) },
        { model_name: "claude-pair", svc_params: viaAnthropic({ weight: 1 }) },
        // Never called: transform_request only builds the upstream request.
        { model_name: "local", svc_params: { model: "ollama/llama3.2", api_base: "http://127.0.0.1:9" } },
      ],
      general_settings: { master_key: MASTER_KEY },
    },
    { store: {} },
  );
  const created = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["gpt-4o-model"], allowed_routes: ["llm_api_routes"] } });
  expect(created.status).toBe(200);
  narrowKey = created.body.key;
});

afterAll(async () => {
  await gw?.stop();
  await openai?.stop();
  await anthropic?.stop();
});

beforeEach(() => {
  openai.reset();
  anthropic.reset();
});

const user = (content: string) => [{ role: "user", content }];

describe("/utils/token_counter", () => {
  const count = (body: unknown, query = "", key = MASTER_KEY) => requestJson(gw, "POST", `/utils/token_counter${query}`, { body, key });

  test("a prompt with o200k_base (gpt-4o): 'hello world' is 2 tokens", async () => {
    const res = await count({ model: "gpt-4o-model", prompt: "hello world" });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ total_tokens: 2, request_model: "gpt-4o-model", model_used: "gpt-4o", tokenizer_type: "openai_tokenizer" });
  });

  test("messages carry OpenAI's overhead: 3 per message, the role, the text, 3 to prime the reply", async () => {
    expect((await count({ model: "gpt-4o-model", messages: user("hello world") })).body.total_tokens).toBe(3 + 1 + 2 + 3);
    const twoTurns = [
      { role: "system", content: "You are a helpful assistant." },
      { role: "user", content: "hello world" },
    ];
    expect((await count({ model: "gpt-4o-model", messages: twoTurns })).body.total_tokens).toBe(3 + 1 + 6 + (3 + 1 + 2) + 3);
    // cl100k_base (gpt-4) splits these words the same way.
    expect((await count({ model: "gpt4-legacy", messages: twoTurns })).body).toEqual({ total_tokens: 19, request_model: "gpt4-legacy", model_used: "gpt-4", tokenizer_type: "openai_tokenizer" });
  });

  test("Gemini contents are counted as the messages they translate to", async () => {
    const res = await count({ model: "gpt-4o-model", contents: [{ role: "user", parts: [{ text: "hello world" }] }] });
    expect(res.body.total_tokens).toBe(9);
  });

  test("a model the gateway does not serve is counted with its own name's tokenizer", async () => {
    expect((await count({ model: "gpt-3.5-turbo", prompt: "The quick brown fox jumps over the lazy dog" })).body).toEqual({
      total_tokens: 9,
      request_model: "gpt-3.5-turbo",
      model_used: "gpt-3.5-turbo",
      tokenizer_type: "openai_tokenizer",
    });
  });

  test("a count of 800,000 characters holds no other request: /health/liveliness answers within 200 ms all along", async () => {
    // Random words of letters and punctuation: nothing the vocabulary holds whole, the BPE's slowest text.
    const rng = new Random(7);
    const words: string[] = [];
    for (let chars = 0; chars < 800_000; ) {
      const word = Array.from({ length: 1 + rng.int(12) }, () => "abcdefghijklmnopqrstuvwxyz.,!?"[rng.int(30)]).join("");
      words.push(word);
      chars += word.length + 1;
    }
    // The encoding loads on first use (megabytes of JavaScript, once per process): not the count's time.
    expect((await count({ model: "gpt-4o-model", prompt: "warm up" })).status).toBe(200);
    let counting = true;
    const counted = count({ model: "gpt-4o-model", prompt: words.join(" ") }).finally(() => {
      counting = false;
    });
    const waits: number[] = [];
    while (counting) {
      const started = performance.now();
      expect((await fetch(`${gw.url}/health/liveliness`)).status).toBe(200);
      waits.push(performance.now() - started);
    }
    const res = await counted;
    expect(res.status).toBe(200);
    expect(res.body.total_tokens).toBeGreaterThan(words.length);
    expect(waits.length).toBeGreaterThan(0);
    expect(Math.max(...waits)).toBeLessThan(200);
  });

  test("call_endpoint=true: Anthropic's count_tokens answers, with its original response", async () => {
    const res = await count({ model: "claude", messages: user("How many tokens does Claude see here?") }, "?call_endpoint=true");
    expect(res.status).toBe(200);
    const body = res.body as { total_tokens: number; original_response: { input_tokens: number } };
    expect(body).toMatchObject({ request_model: "claude", model_used: CLAUDE, tokenizer_type: "anthropic_api" });
    expect(body.original_response).toEqual({ input_tokens: body.total_tokens });
    expect(body.total_tokens).toBeGreaterThan(0);
    expect(anthropic.requests).toHaveLength(1);
    const sent = anthropic.requests[0]!;
    expect(sent.path).toBe("/v1/messages/count_tokens");
    expect(sent.headers["x-api-key"]).toBe(ANTHROPIC_KEY);
    expect(sent.body).toEqual({ model: CLAUDE, messages: [{ role: "user", content: "How many tokens does Claude see here?" }] });

    // The flag may also come in the body; a prompt is sent as one user message.
    const viaBody = await count({ model: "claude", prompt: "How many tokens does Claude see here?", call_endpoint: true });
    expect(viaBody.body.total_tokens).toBe(body.total_tokens);
  });

  test("call_endpoint=true asks a deployment a call would reach: not a drained one (weight 0) listed first", async () => {
    const res = await count({ model: "claude-pair", messages: user("hello world") }, "?call_endpoint=true");
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ request_model: "claude-pair", model_used: CLAUDE, tokenizer_type: "anthropic_api" });
    expect(anthropic.requests.map((r) => r.path)).toEqual(["/v1/messages/count_tokens"]);
  });

  test("call_endpoint is read as a boolean, as FastAPI reads one: True (Python's requests sends that), 1, yes, on ask the provider; False, 0, no, off count locally over the body's true", async () => {
    for (const flag of ["True", "1", "yes", "on", "TRUE"]) {
      const res = await count({ model: "claude", messages: user("hello world") }, `?call_endpoint=${flag}`);
      expect(res.body.tokenizer_type, flag).toBe("anthropic_api");
    }
    expect(anthropic.requests).toHaveLength(5);
    for (const flag of ["False", "0", "no", "off"]) {
      const res = await count({ model: "claude", messages: user("hello world"), call_endpoint: true }, `?call_endpoint=${flag}`);
      expect(res.body.tokenizer_type, flag).toBe("openai_tokenizer");
    }
    expect(anthropic.requests).toHaveLength(5);
  });

  test("without call_endpoint (or for a provider without a counter) the count is local", async () => {
    expect((await count({ model: "claude", messages: user("hello world") })).body).toEqual({ total_tokens: 9, request_model: "claude", model_used: CLAUDE, tokenizer_type: "openai_tokenizer" });
    expect((await count({ model: "gpt-4o-model", messages: user("hello world") }, "?call_endpoint=true")).body.tokenizer_type).toBe("openai_tokenizer");
    expect(anthropic.requests).toHaveLength(0);
    expect(openai.requests).toHaveLength(0);
  });

  test("the provider's counter runs under the deployment's deadline (408), and its errors map like a call's", async () => {
    anthropic.fault({ kind: "hang", path: "/v1/messages/count_tokens" });
    const started = performance.now();
    const slow = await count({ model: "claude-slow", messages: user("hi") }, "?call_endpoint=true");
    expect(slow.status).toBe(408);
    expect(performance.now() - started).toBeLessThan(5000);

    anthropic.fault({ kind: "status", status: 429, path: "/v1/messages/count_tokens" });
    const limited = await count({ model: "claude", messages: user("hi") }, "?call_endpoint=true");
    expect(limited.status).toBe(429);
    expect((limited.body as { error: { message: string } }).error.message).toContain("anthropic returned 429");
  });

  test("a virtual key counts only for its models; inputs are required", async () => {
    expect((await count({ model: "gpt-4o-model", prompt: "hello world" }, "", narrowKey)).body.total_tokens).toBe(2);
    const denied = await count({ model: "claude", prompt: "hi" }, "?call_endpoint=true", narrowKey);
    expect(denied.status).toBe(401);
    expect(anthropic.requests).toHaveLength(0);
    expect((await count({ model: "gpt-4o-model" })).status).toBe(400);
    expect((await count({ prompt: "hi" })).status).toBe(400);
  });
});

describe("/utils/supported_openai_params", () => {
  const params = (model: string | undefined, key = MASTER_KEY) => requestJson<string[]>(gw, "GET", `/utils/supported_openai_params${model === undefined ? "" : `?model=${encodeURIComponent(model)}`}`, { key });

  test("an OpenAI deployment takes every OpenAI chat parameter", async () => {
    const res = await params("gpt-4o-model");
    expect(res.status).toBe(200);
    for (const p of ["temperature", "top_p", "n", "seed", "logprobs", "top_logprobs", "tools", "tool_choice", "response_format", "stream", "max_completion_tokens"]) expect(res.body).toContain(p);
  });

  test("Anthropic's list: what its adapter translates, and no more", async () => {
    const res = await params("claude");
    for (const p of ["max_tokens", "temperature", "top_p", "top_k", "stop", "tools", "tool_choice", "response_format", "reasoning_effort", "stream"]) expect(res.body).toContain(p);
    for (const p of ["seed", "n", "logprobs", "frequency_penalty", "presence_penalty"]) expect(res.body).not.toContain(p);
  });

  test("an embedding model lists the embedding parameters", async () => {
    expect((await params("embedder")).body).toEqual(["dimensions", "encoding_format", "user"]);
  });

  test("model is required and must be served; a key sees only its models", async () => {
    // A required query parameter left out is a validation failure: 422, as the spec's Conventions say.
    const missing = await params(undefined);
    expect(missing.status).toBe(422);
    expect(missing.body).toMatchObject({ error: { type: "validation_error", param: "model", code: "422" } });
    expect((await params("no-such-model")).status).toBe(400);
    expect((await params("claude", narrowKey)).status).toBe(401);
    expect((await params("gpt-4o-model", narrowKey)).status).toBe(200);
  });
});

describe("/utils/transform_request", () => {
  const transform = (body: unknown, key = MASTER_KEY) =>
    requestJson<{ raw_request_api_base: string; raw_request_body: Record<string, unknown>; raw_request_headers: Record<string, string> }>(gw, "POST", "/utils/transform_request", { body, key });

  test("an OpenAI call: the upstream URL, the body without gateway fields, the key redacted", async () => {
    const res = await transform({ call_type: "completion", request_body: { model: "gpt-4o-model", messages: user("hi"), temperature: 0.1, metadata: { tags: ["t"] }, num_retries: 2 } });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      raw_request_api_base: `${openai.url}/chat/completions`,
      raw_request_body: { model: "gpt-4o", messages: user("hi"), temperature: 0.1 },
      raw_request_headers: { "content-type": "application/json", authorization: "REDACTED" },
    });
    expect(res.text).not.toContain(OPENAI_KEY);
    expect(openai.requests).toHaveLength(0);
  });

  test("an Anthropic call: the Messages body and headers, x-api-key redacted", async () => {
    const res = await transform({ call_type: "completion", request_body: { model: "claude", messages: [{ role: "system", content: "terse" }, ...user("hi")], max_tokens: 20 } });
    expect(res.body.raw_request_api_base).toBe(`${anthropic.url}/v1/messages`);
    expect(res.body.raw_request_headers).toEqual({ "content-type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "REDACTED" });
    expect(res.body.raw_request_body).toMatchObject({ model: CLAUDE, system: "terse", max_tokens: 20, messages: [{ role: "user", content: "hi" }] });
    expect(res.text).not.toContain(ANTHROPIC_KEY);
    expect(anthropic.requests).toHaveLength(0);
  });

  test("headers configured on the deployment are redacted whatever their name (any may carry a credential)", async () => {
    const res = await transform({ request_body: { model: "with-headers", messages: user("hi") } });
    expect(res.body.raw_request_headers).toEqual({ "content-type": "application/json", "x-goog-api-key": "REDACTED", "api-key": "REDACTED", "x-trace": "REDACTED", authorization: "REDACTED" });
    expect(res.text).not.toContain("g-secret-1");
    expect(res.text).not.toContain("a-secret-2");
    expect(res.text).not.toContain("keep-me");
  });

  test("a stored model's header values are not shown to a key allowed the model, as /model/info hides them", async () => {
    const svc_params = { model: "openai/gpt-4o-mini", api_base: openai.url, api_key: "sk-stored-upstream", headers: { "X-Custom-Auth": "STORED-HEADER-SECRET" } };
    expect((await requestJson(gw, "POST", "/model/new", { body: { model_name: "stored-with-headers", svc_params } })).status).toBe(200);
    const created = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["stored-with-headers", "with-headers"] } });
    for (const model of ["stored-with-headers", "with-headers"]) {
      const res = await transform({ request_body: { model, messages: user("hi") } }, created.body.key);
      expect(res.status).toBe(200);
      for (const secret of ["STORED-HEADER-SECRET", "sk-stored-upstream", "keep-me", "g-secret-1"]) expect(res.text).not.toContain(secret);
    }
  });

  test("the unsupported-parameter check applies: refused, or dropped with drop_params", async () => {
    const refused = await transform({ call_type: "completion", request_body: { model: "claude", messages: user("hi"), seed: 3 } });
    expect(refused.status).toBe(400);
    expect((refused.body as unknown as { error: { message: string } }).error.message).toContain("anthropic does not support parameters: ['seed']");
    const dropped = await transform({ call_type: "completion", request_body: { model: "claude", messages: user("hi"), seed: 3, drop_params: true } });
    expect(dropped.status).toBe(200);
    expect(dropped.body.raw_request_body.seed).toBeUndefined();
  });

  test("embeddings and legacy completions; an unknown call_type, a missing body, a model the key may not use", async () => {
    expect((await transform({ call_type: "embedding", request_body: { model: "embedder", input: "hi" } })).body.raw_request_api_base).toBe(`${openai.url}/embeddings`);
    expect((await transform({ call_type: "text_completion", request_body: { model: "gpt-4o-model", prompt: "hi" } })).body.raw_request_api_base).toBe(`${openai.url}/completions`);
    expect((await transform({ call_type: "rerank", request_body: { model: "gpt-4o-model" } })).status).toBe(400);
    expect((await transform({ call_type: "completion" })).status).toBe(400);
    expect((await transform({ call_type: "completion", request_body: { model: "claude", messages: user("hi") } }, narrowKey)).status).toBe(401);
  });

  test("a request the adapter cannot translate is the client's 400, as on the call itself, not a 500", async () => {
    const r = await transform({ call_type: "text_completion", request_body: { model: "local", prompt: ["first", "second"] } });
    expect(r.status).toBe(400);
    expect(r.text).toContain("ollama cannot take this request");
    expect(r.text).toContain("one prompt per request");
  });

  test("an api_base with a query: the call's path before that query, as the call is sent, its key redacted", async () => {
    const res = await transform({ request_body: { model: "query-base", messages: user("hi") } });
    expect(res.status).toBe(200);
    expect(res.body.raw_request_api_base).toBe(`${openai.url}/v2/chat/completions?tier=2&key=REDACTED`);
    expect(res.text).not.toContain("QUERYsecret42");
  });

  test("credentials in a URL (password, key-like query parameters) are redacted", () => {
    expect(redactUrl("https://user:pw@example.com/v1beta/models/m:generateContent?key=abc&alt=sse&access_token=t")).toBe(
      "https://user:REDACTED@example.com/v1beta/models/m:generateContent?key=REDACTED&alt=sse&access_token=REDACTED",
    );
  });
});

describe("unsupported parameters on /chat/completions", () => {
  const client = () => new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });

  test("fields the adapter does not translate: a 400 naming them, nothing sent upstream", async () => {
    const err = await failure(client().chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }], seed: 1, n: 2 }));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as BadRequestError).message).toContain(`anthropic does not support parameters: ['seed', 'n'], for model=${CLAUDE}. To drop these, set drop_params=true`);
    expect(anthropic.requests).toHaveLength(0);
  });

  test("drop_params: true drops them and the call goes through", async () => {
    const res = await client().chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }], seed: 1, n: 2, drop_params: true } as never);
    expect(res.choices[0]!.message.content).toBe("Mock reply to: hi");
    const sent = anthropic.requests[0]!.body as Record<string, unknown>;
    expect(sent.seed).toBeUndefined();
    expect(sent.n).toBeUndefined();
  });

  test("null values and a pass-through adapter are never refused", async () => {
    expect((await client().chat.completions.create({ model: "claude", messages: [{ role: "user", content: "hi" }], seed: null } as never)).choices).toHaveLength(1);
    const res = await client().chat.completions.create({ model: "gpt-4o-model", messages: [{ role: "user", content: "hi" }], seed: 1, logprobs: true });
    expect(res.choices).toHaveLength(1);
    expect(openai.requests[0]!.body).toMatchObject({ seed: 1, logprobs: true });
  });
});
