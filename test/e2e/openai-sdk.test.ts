// The gateway seen through the official `openai` SDK, in front of the mock OpenAI upstream: what the
// SDK parses, assembles and raises here is what a real client gets, and `mock.requests` shows what
// the gateway actually sent upstream.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import type { Server } from "bun";
import OpenAI, {
  APIError,
  APIUserAbortError,
  AuthenticationError,
  AzureOpenAI,
  BadRequestError,
  InternalServerError,
  NotFoundError,
  RateLimitError,
  UnprocessableEntityError,
} from "openai";
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, mockEmbedding, startMockOpenAI } from "../mock-upstream/openai.ts";
import { collect, failure } from "../harness/util.ts";

const UPSTREAM_KEY = "sk-upstream-secret-0123456789";
const UPSTREAM_HEADER_VALUE = "tag-from-deployment-headers";

let mock: MockOpenAI;
let gw: TestGateway;
let client: OpenAI;
/** A bare upstream that never answers and counts requests whose caller went away. */
let hangServer: Server<undefined>;
const hang = { started: 0, aborted: 0 };
let deadBase: string;
let hangBase: string;

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
  hangServer = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    idleTimeout: 0,
    fetch(req) {
      hang.started++;
      return new Promise<Response>((resolve) => {
        req.signal.addEventListener(
          "abort",
          () => {
            hang.aborted++;
            resolve(new Response(null, { status: 499 }));
          },
          { once: true },
        );
      });
    },
  });
  // A privileged port nothing in the suite can bind (an ephemeral port found closed now may be
  // taken by another test's server before this one calls it).
  deadBase = "http://127.0.0.1:9/v1";
  hangBase = `http://127.0.0.1:${hangServer.port}/v1`;
  const upstream = (model: string, extra: Record<string, unknown> = {}) => ({
    model,
    api_base: mock.url,
    api_key: UPSTREAM_KEY,
    ...extra,
  });
  gw = await startTestGateway({
    model_list: [
      {
        model_name: "gpt-public",
        svc_params: upstream("openai/gpt-4o-mini", { headers: { "x-upstream-tag": UPSTREAM_HEADER_VALUE } }),
        model_info: { id: "dep-chat" },
      },
      { model_name: "instruct", svc_params: upstream("openai/gpt-3.5-turbo-instruct"), model_info: { id: "dep-instruct" } },
      { model_name: "embedder", svc_params: upstream("openai/text-embedding-3-small"), model_info: { id: "dep-embed", mode: "embedding" } },
      { model_name: "openai/*", svc_params: upstream("openai/*"), model_info: { id: "dep-wild" } },
      { model_name: "gpt-timeout", svc_params: upstream("openai/gpt-4o-mini", { timeout: 0.5 }), model_info: { id: "dep-timeout" } },
      { model_name: "gpt-dead", svc_params: { model: "openai/gpt-4o-mini", api_base: deadBase, api_key: UPSTREAM_KEY }, model_info: { id: "dep-dead" } },
      { model_name: "gpt-hang", svc_params: { model: "openai/gpt-4o-mini", api_base: hangBase, api_key: UPSTREAM_KEY }, model_info: { id: "dep-hang" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
});

afterAll(async () => {
  await gw.stop();
  await mock.stop();
  await hangServer.stop(true);
});

beforeEach(() => mock.reset());

const user = (content: string) => [{ role: "user" as const, content }];

const weatherTool: ChatCompletionTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a place",
    parameters: {
      type: "object",
      properties: { location: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
      required: ["location"],
    },
  },
};

/** Raw POST to the gateway, for what the SDK hides (headers, bytes, bodies the SDK would not send). */
function post(path: string, body: unknown, headers: Record<string, string> = { authorization: `Bearer ${MASTER_KEY}` }): Promise<Response> {
  return fetch(`${gw.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

function get(path: string): Promise<Response> {
  return fetch(`${gw.url}${path}`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
}

/** Asserts the spec's error envelope: exactly `{error: {message, type, param, code}}`, code = status. */
function expectEnvelope(body: unknown, status: number): { message: string; type: string; param: string | null; code: string } {
  expect(body).toBeObject();
  expect(Object.keys(body as object)).toEqual(["error"]);
  const error = (body as { error: Record<string, unknown> }).error;
  expect(Object.keys(error).sort()).toEqual(["code", "message", "param", "type"]);
  expect(error.code).toBe(String(status));
  expect(typeof error.message).toBe("string");
  expect((error.message as string).length).toBeGreaterThan(0);
  expect(typeof error.type).toBe("string");
  expect(error.param === null || typeof error.param === "string").toBe(true);
  return error as { message: string; type: string; param: string | null; code: string };
}

async function expectErrorResponse(res: Response, status: number) {
  expect(res.status).toBe(status);
  expect(res.headers.get("content-type")).toStartWith("application/json");
  return expectEnvelope(await res.json(), status);
}

/** Asserts an SDK error of the given class and status whose body is the gateway's envelope. */
function expectSdkError(err: unknown, ErrorClass: abstract new (...args: never[]) => APIError, status: number): APIError {
  expect(err).toBeInstanceOf(ErrorClass);
  const e = err as APIError;
  expect(e.status).toBe(status);
  expectEnvelope({ error: e.error }, status);
  expect(e.code).toBe(String(status));
  return e;
}

/** Polls `check` every 10 ms for up to `ms`; true once it holds. */
async function eventually(check: () => boolean, ms = 1000): Promise<boolean> {
  const until = performance.now() + ms;
  while (!check()) {
    if (performance.now() > until) return false;
    await Bun.sleep(10);
  }
  return true;
}

/** The model the upstream was asked for in its `i`th request. */
function sentModel(i: number): unknown {
  return (mock.requests[i]?.body as { model?: unknown } | undefined)?.model;
}

/** SSE events of a raw gateway response, split on the blank line. */
function sseEvents(raw: string): string[] {
  const events = raw.split("\n\n");
  expect(events.pop()).toBe(""); // every event ends with the separator
  return events;
}

describe("chat completions", () => {
  test("non-stream: content, usage, upstream id, gateway headers; upstream got its own model, key and no gateway fields", async () => {
    const { data, response } = await client.chat.completions
      .create({
        model: "gpt-public",
        messages: user("Hello there gateway"),
        // Gateway-only fields: accepted from the client, never forwarded.
        fallbacks: ["other-model"],
        num_retries: 2,
        caching: true,
        metadata: { team: "alpha" },
        mock_response: "never forwarded",
      } as OpenAI.ChatCompletionCreateParamsNonStreaming)
      .withResponse();

    expect(data.choices[0]?.message.content).toBe("Mock reply to: Hello there gateway");
    expect(data.choices[0]?.finish_reason).toBe("stop");
    expect(data.usage?.completion_tokens).toBe(6);
    expect(data.usage?.total_tokens).toBe((data.usage?.prompt_tokens ?? 0) + 6);
    // The upstream's own id and fingerprint come through untouched.
    expect(data.id).toMatch(/^chatcmpl-[A-Za-z0-9]{29}$/);
    expect(data.system_fingerprint).toBe("fp_0ba0d124f1");
    expect(data.model).toBe("gpt-4o-mini");

    expect(response.headers.get("x-svc-model-id")).toBe("dep-chat");
    const callId = response.headers.get("x-svc-call-id");
    expect(callId).toMatch(/^[0-9a-f-]{36}$/);
    expect(callId).not.toBe(data.id);

    expect(mock.requests).toHaveLength(1);
    const sent = mock.requests[0]!;
    expect(sent.path).toBe("/v1/chat/completions");
    expect(sent.headers.authorization).toBe(`Bearer ${UPSTREAM_KEY}`);
    expect(JSON.stringify(sent.headers)).not.toContain(MASTER_KEY);
    expect(sent.body).toEqual({ model: "gpt-4o-mini", messages: user("Hello there gateway") });
    for (const field of ["fallbacks", "num_retries", "caching", "metadata", "mock_response"]) {
      expect(Object.keys(sent.body as object)).not.toContain(field);
    }
  });

  test("a deployment-level headers map reaches the upstream", async () => {
    await client.chat.completions.create({ model: "gpt-public", messages: user("hi") });
    expect(mock.requests[0]?.headers["x-upstream-tag"]).toBe(UPSTREAM_HEADER_VALUE);
    // Other deployments do not get it.
    await client.chat.completions.create({ model: "gpt-timeout", messages: user("hi") });
    expect(mock.requests).toHaveLength(2);
    expect(mock.requests[1]!.headers["x-upstream-tag"]).toBeUndefined();
  });

  test("all four path forms reach the deployment; the path model overrides the body model", async () => {
    const forms: [string, string][] = [
      [gw.url, "gpt-public"],
      [gw.baseURL, "gpt-public"],
      [`${gw.url}/openai/deployments/gpt-public`, "not-a-configured-model"],
      [`${gw.url}/engines/gpt-public`, "not-a-configured-model"],
    ];
    for (const [baseURL, model] of forms) {
      const c = new OpenAI({ baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
      const { data, response } = await c.chat.completions.create({ model, messages: user("paths") }).withResponse();
      expect(data.choices[0]?.message.content).toBe("Mock reply to: paths");
      expect(response.headers.get("x-svc-model-id")).toBe("dep-chat");
    }
    expect(mock.requests.map((r) => (r.body as { model: string }).model)).toEqual(Array(4).fill("gpt-4o-mini"));
  });
});

describe("streaming", () => {
  test("content concatenates, iteration ends at [DONE]; no usage chunk unless asked, though upstream was asked", async () => {
    const stream = await client.chat.completions.create({ model: "gpt-public", messages: user("stream me please"), stream: true });
    const chunks = await collect(stream); // returns only once the SDK saw [DONE] / the end

    expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe("Mock reply to: stream me please");
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
    expect(chunks[chunks.length - 1]!.choices[0]?.finish_reason).toBe("stop");
    for (const c of chunks) {
      expect("usage" in c).toBe(false);
      expect(c.choices.length).toBeGreaterThan(0);
    }
    // The gateway always asks upstream for usage, for its own accounting.
    const sent = mock.requests[0]!.body as { stream: boolean; stream_options?: { include_usage?: boolean } };
    expect(sent.stream).toBe(true);
    expect(sent.stream_options?.include_usage).toBe(true);
  });

  test("usage chunk is passed through when the client asks for it", async () => {
    const chunks = await collect(
      await client.chat.completions.create({
        model: "gpt-public",
        messages: user("stream me please"),
        stream: true,
        stream_options: { include_usage: true },
      }),
    );
    const last = chunks[chunks.length - 1]!;
    expect(last.choices).toEqual([]);
    expect(last.usage?.completion_tokens).toBe(6);
    expect(last.usage?.prompt_tokens).toBe(Math.ceil("stream me please".length / 4) + 3);
    for (const c of chunks.slice(0, -1)) expect(c.usage).toBeNull();
  });

  test("chunks reach the client incrementally, as the upstream produces them", async () => {
    mock.fault({ kind: "slowStream", chunkDelayMs: 100, chunks: 10 });
    const started = performance.now();
    const stream = await client.chat.completions.create({ model: "gpt-public", messages: user("slow"), stream: true });
    const arrivals: number[] = [];
    let text = "";
    for await (const chunk of stream) {
      arrivals.push(performance.now() - started);
      text += chunk.choices[0]?.delta.content ?? "";
    }
    const ended = performance.now() - started;
    // role chunk + 10 content chunks + finish chunk, the last 11 each 100 ms after the previous one.
    expect(arrivals).toHaveLength(12);
    expect(text.split(" ")).toHaveLength(10);
    expect(ended).toBeGreaterThanOrEqual(1000);
    expect(arrivals[0]!).toBeLessThan(ended - 700);
    // Spread out, not delivered in one burst at the end.
    expect(arrivals[5]! - arrivals[0]!).toBeGreaterThan(300);
  });

  test("tool-call streaming is assembled by the SDK's stream helper", async () => {
    const done = await client.chat.completions
      .stream({ model: "gpt-public", messages: user("What's the weather in Paris?"), tools: [weatherTool] })
      .finalChatCompletion();
    const choice = done.choices[0]!;
    expect(choice.finish_reason).toBe("tool_calls");
    const call = choice.message.tool_calls?.[0];
    if (call?.type !== "function") throw new Error("expected a function tool call");
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual({ location: "Paris", unit: "celsius" });
  });

  test("raw SSE framing: `data: ` events separated by a blank line, ending with `data: [DONE]`", async () => {
    const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("bytes"), stream: true });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/event-stream");
    expect(res.headers.get("x-svc-model-id")).toBe("dep-chat");
    const raw = await res.text();
    expect(raw.endsWith("\n\ndata: [DONE]\n\n")).toBe(true);
    expect(raw.includes("\r")).toBe(false);
    const events = sseEvents(raw);
    expect(events.pop()).toBe("data: [DONE]");
    expect(events.length).toBe(1 + 4 + 1); // role, "Mock reply to: bytes", finish
    for (const event of events) {
      expect(event.startsWith("data: {")).toBe(true);
      expect(event.includes("\n")).toBe(false);
      const chunk = JSON.parse(event.slice("data: ".length)) as ChatCompletionChunk;
      expect(chunk.object).toBe("chat.completion.chunk");
    }
  });

  test("an upstream event spread over several `data:` lines (valid SSE) reaches the client as one event on one line, which the SDK reads", async () => {
    /** Every event's JSON split after its first member, as servers that pretty-print their chunks send it. */
    const multiLine = () =>
      mock.fault({
        kind: "wire",
        shape: (bytes) => {
          const text = new TextDecoder().decode(bytes).replaceAll(',"object":', ',\ndata: "object":');
          return { bytes: new TextEncoder().encode(text), cuts: [] };
        },
      });
    multiLine();
    const chunks = await collect(await client.chat.completions.create({ model: "gpt-public", messages: user("many lines"), stream: true }));
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe("Mock reply to: many lines");
    multiLine();
    const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("many lines"), stream: true });
    const events = sseEvents(await res.text());
    expect(events.pop()).toBe("data: [DONE]");
    for (const event of events) {
      expect(event.includes("\n"), event).toBe(false);
      expect((JSON.parse(event.slice("data: ".length)) as ChatCompletionChunk).object).toBe("chat.completion.chunk");
    }
  });
});

describe("legacy completions and embeddings", () => {
  test("completions, non-stream", async () => {
    const res = await client.completions.create({ model: "instruct", prompt: "hello world" });
    expect(res.object).toBe("text_completion");
    expect(res.choices[0]?.text).toBe("Mock completion of: hello world");
    expect(res.usage?.completion_tokens).toBe(5);
    expect(sentModel(0)).toBe("gpt-3.5-turbo-instruct");
  });

  test("completions, stream", async () => {
    const chunks = await collect(await client.completions.create({ model: "instruct", prompt: "hello world", stream: true }));
    expect(chunks.map((c) => c.choices[0]?.text ?? "").join("")).toBe("Mock completion of: hello world");
    expect(chunks[chunks.length - 1]!.choices[0]?.finish_reason).toBe("stop");
    for (const c of chunks) expect(c.choices.length).toBeGreaterThan(0);
  });

  test("completions with the model in the query string", async () => {
    const res = await post("/v1/completions?model=instruct", { prompt: "query form" });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-svc-model-id")).toBe("dep-instruct");
    const body = (await res.json()) as OpenAI.Completion;
    expect(body.choices[0]?.text).toBe("Mock completion of: query form");

    const streamed = await post("/completions?model=instruct", { prompt: "query form", stream: true });
    expect(streamed.headers.get("content-type")).toBe("text/event-stream");
    expect((await streamed.text()).endsWith("data: [DONE]\n\n")).toBe(true);
    expect(mock.requests.map((r) => (r.body as { model: string }).model)).toEqual(["gpt-3.5-turbo-instruct", "gpt-3.5-turbo-instruct"]);
  });

  test("completions and embeddings answer in every path form; the path model overrides the body model", async () => {
    const forms = (model: string): [string, string][] => [
      [gw.url, model],
      [gw.baseURL, model],
      [`${gw.url}/openai/deployments/${model}`, "not-a-configured-model"],
      [`${gw.url}/engines/${model}`, "not-a-configured-model"],
    ];
    for (const [baseURL, model] of forms("instruct")) {
      const c = new OpenAI({ baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
      const { data, response } = await c.completions.create({ model, prompt: "paths" }).withResponse();
      expect([baseURL, data.choices[0]?.text]).toEqual([baseURL, "Mock completion of: paths"]);
      expect(response.headers.get("x-svc-model-id")).toBe("dep-instruct");
    }
    for (const [baseURL, model] of forms("embedder")) {
      const c = new OpenAI({ baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
      const { data, response } = await c.embeddings.create({ model, input: "paths", encoding_format: "float" }).withResponse();
      expect([baseURL, data.data[0]?.embedding]).toEqual([baseURL, mockEmbedding("paths")]);
      expect(response.headers.get("x-svc-model-id")).toBe("dep-embed");
    }
    expect(mock.requests.map((r) => (r.body as { model: string }).model)).toEqual([...Array(4).fill("gpt-3.5-turbo-instruct"), ...Array(4).fill("text-embedding-3-small")]);
  });

  test("embeddings as floats", async () => {
    const res = await client.embeddings.create({ model: "embedder", input: ["alpha", "beta"], encoding_format: "float" });
    expect(res.data.map((d) => d.embedding)).toEqual([mockEmbedding("alpha"), mockEmbedding("beta")]);
    expect(res.usage.prompt_tokens).toBeGreaterThan(0);
    const sent = mock.requests[0]!.body as { model: string; encoding_format: string };
    expect(sent.model).toBe("text-embedding-3-small");
    expect(sent.encoding_format).toBe("float");
  });

  test("embeddings through the SDK's default base64 path decode to the same vectors", async () => {
    const res = await client.embeddings.create({ model: "embedder", input: "gamma" });
    expect((mock.requests[0]!.body as { encoding_format: string }).encoding_format).toBe("base64");
    expect(res.data[0]?.embedding).toEqual(mockEmbedding("gamma"));
  });
});

describe("models", () => {
  test("list holds exactly the configured model names", async () => {
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids.sort()).toEqual(["embedder", "gpt-dead", "gpt-hang", "gpt-public", "gpt-timeout", "instruct"]);
  });

  test("the models routes answer without /v1 too", async () => {
    const list = await get("/models");
    expect(list.status).toBe(200);
    expect(((await list.json()) as { data: { id: string }[] }).data.map((m) => m.id)).toContain("gpt-public");
    const one = await get("/models/gpt-public");
    expect(((await one.json()) as { id: string }).id).toBe("gpt-public");
    await expectErrorResponse(await get("/models/no-such-model"), 404);
  });

  test("retrieve a configured name, a wildcard-resolved name containing `/`, and an unknown one", async () => {
    expect((await client.models.retrieve("gpt-public")).id).toBe("gpt-public");
    expect((await client.models.retrieve("openai/gpt-x")).id).toBe("openai/gpt-x");
    // The same with a literal slash in the path.
    const raw = await get("/v1/models/openai/gpt-x");
    expect(raw.status).toBe(200);
    expect(((await raw.json()) as { id: string }).id).toBe("openai/gpt-x");

    const err = await failure(client.models.retrieve("no-such-model"));
    expectSdkError(err, NotFoundError, 404);
  });

  test("a wildcard deployment serves `openai/gpt-x` as upstream model `gpt-x`", async () => {
    const { response } = await client.chat.completions.create({ model: "openai/gpt-x", messages: user("hi") }).withResponse();
    expect(response.headers.get("x-svc-model-id")).toBe("dep-wild");
    expect(sentModel(0)).toBe("gpt-x");
  });

  test("a wildcard names at least one character: `openai/` is no model (404 on retrieve, 400 on a call, nothing sent upstream)", async () => {
    expectSdkError(await failure(client.models.retrieve("openai/")), NotFoundError, 404);
    const e = expectSdkError(await failure(client.chat.completions.create({ model: "openai/", messages: user("hi") })), BadRequestError, 400);
    expect(e.message).toContain("model=openai/.");
    expect(mock.requests).toHaveLength(0);
  });

  test("a wildcard call for a model name a header cannot carry (openai/模型) is answered, the group percent-encoded in x-svc-model-group", async () => {
    const { response } = await client.chat.completions.create({ model: "openai/模型", messages: user("hi") }).withResponse();
    expect(response.status).toBe(200);
    expect(response.headers.get("x-svc-model-group")).toBe(encodeURIComponent("openai/模型"));
    expect(sentModel(0)).toBe("模型");
  });

  test("/model/info lists every entry and reveals no upstream address or key", async () => {
    const res = await get("/model/info");
    expect(res.status).toBe(200);
    const text = await res.text();
    for (const secret of [mock.url, `127.0.0.1:${mock.port}`, UPSTREAM_KEY, deadBase, hangBase, UPSTREAM_HEADER_VALUE, "api_base", "api_key"]) {
      expect(text).not.toContain(secret);
    }
    const body = JSON.parse(text) as { data: { model_name: string; model_info: { id: string } }[] };
    expect(body.data.map((e) => e.model_info.id)).toEqual(["dep-chat", "dep-instruct", "dep-embed", "dep-wild", "dep-timeout", "dep-dead", "dep-hang"]);
  });

  test("/model/info?svc_model_id= returns exactly that entry; an unknown id is a 404", async () => {
    const res = await get("/model/info?svc_model_id=dep-embed");
    expect(res.status).toBe(200);
    const body = (await res.json()) as { data: { model_name: string; model_info: { id: string; mode: string } }[] };
    expect(body.data).toHaveLength(1);
    expect(body.data[0]?.model_name).toBe("embedder");
    expect(body.data[0]?.model_info).toMatchObject({ id: "dep-embed", mode: "embedding" });

    await expectErrorResponse(await get("/model/info?svc_model_id=nope"), 404);
  });
});

describe("gateway errors are typed SDK errors", () => {
  test("wrong key → AuthenticationError (401)", async () => {
    const bad = new OpenAI({ baseURL: gw.baseURL, apiKey: "sk-wrong-key", maxRetries: 0 });
    const err = await failure(bad.chat.completions.create({ model: "gpt-public", messages: user("hi") }));
    expectSdkError(err, AuthenticationError, 401);
    expect(mock.requests).toHaveLength(0);
  });

  test("the key may come in x-svc-api-key instead of Authorization, bare or as Bearer (the scheme in any case, as in Authorization)", async () => {
    for (const value of [MASTER_KEY, `Bearer ${MASTER_KEY}`, `bearer ${MASTER_KEY}`, `BEARER ${MASTER_KEY}`]) {
      const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("header") }, { "x-svc-api-key": value });
      expect([value, res.status]).toEqual([value, 200]);
      const auth = await post("/v1/chat/completions", { model: "gpt-public", messages: user("header") }, { authorization: value });
      expect([value, auth.status]).toEqual([value, value === MASTER_KEY ? 401 : 200]);
    }
    const wrong = await post("/v1/chat/completions", { model: "gpt-public", messages: user("header") }, { "x-svc-api-key": "sk-wrong-key" });
    expect((await expectErrorResponse(wrong, 401)).type).toBe("authentication_error");
  });

  test("the Azure SDK's api-key header authenticates (AzureOpenAI against /openai/deployments/…); Anthropic's x-api-key too", async () => {
    const azure = new AzureOpenAI({ endpoint: gw.url, apiKey: MASTER_KEY, apiVersion: "2024-10-21", deployment: "gpt-public", maxRetries: 0 });
    const { data, response } = await azure.chat.completions.create({ model: "gpt-public", messages: user("azure sdk") }).withResponse();
    expect(data.choices[0]?.message.content).toBe("Mock reply to: azure sdk");
    expect(response.headers.get("x-svc-model-id")).toBe("dep-chat");
    const wrongAzure = new AzureOpenAI({ endpoint: gw.url, apiKey: "sk-wrong-key", apiVersion: "2024-10-21", deployment: "gpt-public", maxRetries: 0 });
    expectSdkError(await failure(wrongAzure.chat.completions.create({ model: "gpt-public", messages: user("x") })), AuthenticationError, 401);
    const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("anthropic header") }, { "x-api-key": MASTER_KEY });
    expect(res.status).toBe(200);
  });

  test("no key → 401", async () => {
    const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("hi") }, {});
    const error = await expectErrorResponse(res, 401);
    expect(error.type).toBe("authentication_error");
  });

  test("unknown model → BadRequestError (400) pointing to /v1/models", async () => {
    const err = await failure(client.chat.completions.create({ model: "no-such-model", messages: user("hi") }));
    const e = expectSdkError(err, BadRequestError, 400);
    expect(e.message).toContain("/v1/models");
    expect(e.message).toContain("no-such-model");
  });

  test("temperature out of range → UnprocessableEntityError (422) naming temperature", async () => {
    const err = await failure(client.chat.completions.create({ model: "gpt-public", messages: user("hi"), temperature: 3 }));
    const e = expectSdkError(err, UnprocessableEntityError, 422);
    expect(e.message).toContain("temperature");
    expect(e.param).toBe("temperature");
    expect(mock.requests).toHaveLength(0);
  });

  test("missing messages → 422 naming messages", async () => {
    const err = await failure(client.chat.completions.create({ model: "gpt-public" } as OpenAI.ChatCompletionCreateParamsNonStreaming));
    const e = expectSdkError(err, UnprocessableEntityError, 422);
    expect(e.message).toContain("messages");
    expect(e.param).toBe("messages");
  });

  test("invalid JSON body → 400 envelope", async () => {
    const error = await expectErrorResponse(await post("/v1/chat/completions", "{not json"), 400);
    expect(error.type).toBe("invalid_request_error");
  });

  test("unknown route → 404 envelope, NotFoundError in the SDK", async () => {
    await expectErrorResponse(await post("/v1/does-not-exist", {}), 404);
    await expectErrorResponse(await get("/nowhere"), 404);
    const err = await failure(client.post("/does-not-exist", { body: {} }));
    expectSdkError(err, NotFoundError, 404);
  });

  test("a route asked with a method it does not serve → 405 naming the methods it does (Allow), not a 404", async () => {
    const cases: [string, string, string][] = [
      ["GET", "/v1/chat/completions", "POST"],
      ["PUT", "/openai/deployments/gpt-public/chat/completions", "POST"],
      ["GET", "/engines/gpt-public/embeddings", "POST"],
      ["POST", "/v1/models", "GET"],
      ["DELETE", "/key/generate", "POST"],
    ];
    for (const [method, path, allow] of cases) {
      const res = await fetch(`${gw.url}${path}`, { method, headers: { authorization: `Bearer ${MASTER_KEY}` } });
      const error = await expectErrorResponse(res, 405);
      expect(res.headers.get("allow"), `${method} ${path}`).toBe(allow);
      expect(error.message).toBe(`${method} is not allowed on ${path}; use ${allow}.`);
    }
    // In the SDK: a typed error, not a NotFoundError.
    const err = await failure(client.get("/chat/completions"));
    expect((err as APIError).status).toBe(405);
  });

  test("the spec's assistants, threads, batches, fine-tuning and vector store routes: a 404 that says they are not served and how to forward them", async () => {
    const calls: [string, () => Promise<unknown>][] = [
      ["/assistants", () => client.beta.assistants.create({ model: "gpt-public" })],
      ["/threads", () => client.beta.threads.create({})],
      ["/batches", () => client.batches.list()],
      ["/fine_tuning/jobs", () => client.fineTuning.jobs.list()],
      ["/vector_stores", () => client.vectorStores.create({})],
    ];
    for (const [path, call] of calls) {
      const e = expectSdkError(await failure(call()), NotFoundError, 404);
      expect(e.message).toContain(`(/v1${path}) are not served by this gateway`);
      expect(e.message).toContain("pass_through_endpoints");
    }
    // Without the /v1 prefix too, as the spec lists them; a look-alike path is an unknown route.
    const error = await expectErrorResponse(await get("/threads/thread_abc/messages"), 404);
    expect(error.message).toContain("Threads (/threads/thread_abc/messages) are not served by this gateway");
    expect((await expectErrorResponse(await get("/v1/assistantsx"), 404)).message).toContain("no such route");
  });
});

describe("upstream faults map to the spec's statuses", () => {
  const chat = (model = "gpt-public") => client.chat.completions.create({ model, messages: user("hi") });

  test("upstream 400 → BadRequestError carrying the upstream message", async () => {
    mock.fault({ kind: "status", status: 400 });
    const e = expectSdkError(await failure(chat()), BadRequestError, 400);
    expect(e.message).toContain("Invalid value for 'messages': the mock was told to reject this request.");
  });

  test("an upstream error that quotes the deployment's key or header values reaches the client without them", async () => {
    mock.fault({ kind: "status", status: 401, body: { error: { message: `Incorrect API key provided: ${UPSTREAM_KEY} with ${UPSTREAM_HEADER_VALUE}`, type: "invalid_request_error", param: null, code: "invalid_api_key" } } });
    const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("hi") });
    expect(res.status).toBe(401);
    const text = await res.text();
    expect(text).toContain("Incorrect API key provided: [redacted] with [redacted]");
    for (const secret of [UPSTREAM_KEY, UPSTREAM_HEADER_VALUE]) expect(text).not.toContain(secret);
  });

  test("upstream 401 → 401", async () => {
    mock.fault({ kind: "status", status: 401 });
    expectSdkError(await failure(chat()), AuthenticationError, 401);
  });

  test("upstream 429 → RateLimitError keeping retry-after", async () => {
    mock.fault({ kind: "status", status: 429, headers: { "retry-after": "7" } });
    const e = expectSdkError(await failure(chat()), RateLimitError, 429);
    expect(e.headers?.get("retry-after")).toBe("7");
    expect(e.headers?.get("x-svc-model-id")).toBe("dep-chat");
    expect(e.headers?.get("x-svc-model-group")).toBe("gpt-public");
  });

  test("upstream 500 → InternalServerError (500), with the gateway's headers", async () => {
    mock.fault({ kind: "status", status: 500 });
    const e = expectSdkError(await failure(chat()), InternalServerError, 500);
    expect(e.headers?.get("x-svc-model-group")).toBe("gpt-public");
    expect(e.headers?.get("x-svc-call-id")).toBeTruthy();
    // A stream that fails before its first event is answered as an HTTP error with them too.
    mock.fault({ kind: "status", status: 500 });
    const streamed = await post("/v1/chat/completions", { model: "gpt-public", messages: user("x"), stream: true });
    expect(streamed.status).toBe(500);
    expect(streamed.headers.get("x-svc-model-group")).toBe("gpt-public");
  });

  test("upstream 503 → 503", async () => {
    mock.fault({ kind: "status", status: 503 });
    expectSdkError(await failure(chat()), InternalServerError, 503);
  });

  test("an error answered with a 200 ({error} and no choices) is that error: its code's status (429 → 429, 503 → 503), anything else a retryable 500; nothing charged", async () => {
    mock.fault({ kind: "status", status: 200, body: { error: { message: "Rate limit reached for gpt-4o-mini", type: "requests", param: null, code: "429" } } });
    const limited = await post("/v1/chat/completions", { model: "gpt-public", messages: user("hi") });
    expect(limited.status).toBe(429);
    expect(limited.headers.get("x-svc-response-cost")).toBeNull();
    expect(expectEnvelope(await limited.json(), 429).message).toContain("Rate limit reached for gpt-4o-mini");
    mock.fault({ kind: "status", status: 200, body: { error: { message: "The server had an error", type: "server_error", param: null, code: null } } });
    const retried = await post("/v1/chat/completions", { model: "gpt-public", messages: user("hi"), num_retries: 1 });
    expect(retried.status).toBe(200);
    expect(retried.headers.get("x-svc-attempted-retries")).toBe("1");
    mock.fault({ kind: "status", status: 200, body: { error: { message: "embedder down", code: 503 } } });
    expect((await post("/v1/embeddings", { model: "embedder", input: "hi" })).status).toBe(503);
  });

  test("upstream slower than the deployment timeout → 408", async () => {
    mock.fault({ kind: "delay", ms: 2000 });
    const started = performance.now();
    const e = expectSdkError(await failure(chat("gpt-timeout")), APIError, 408);
    expect(performance.now() - started).toBeLessThan(1500);
    expect(e.type).toBe("timeout_error");
  });

  test("upstream that never answers, with a timeout set → 408", async () => {
    mock.fault({ kind: "hang" });
    expectSdkError(await failure(chat("gpt-timeout")), APIError, 408);
  });

  test("connection refused → 503 api_connection_error", async () => {
    const e = expectSdkError(await failure(chat("gpt-dead")), InternalServerError, 503);
    expect(e.type).toBe("api_connection_error");
  });

  test("invalid JSON from upstream → 500 with a clear message", async () => {
    mock.fault({ kind: "invalidJson" });
    const e = expectSdkError(await failure(chat()), InternalServerError, 500);
    expect(e.message).toContain("invalid JSON");
    expect(e.message).toContain("gpt-public");
  });

  test("JSON body cut mid-way (connection reset) → 503 naming the cut, with the call id; a retry may answer", async () => {
    mock.fault({ kind: "cutStream", afterChunks: 1 });
    const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("cut my answer") });
    expect(res.status).toBe(503);
    expect(res.headers.get("x-svc-call-id")).toBeTruthy();
    const error = expectEnvelope(await res.json(), 503);
    expect(error.message).toContain("ended unexpectedly");
    expect(error.type).toBe("api_connection_error");
    // Retryable as any connection failure: the second attempt answers.
    mock.fault({ kind: "cutStream", afterChunks: 1 });
    const retried = await post("/v1/chat/completions", { model: "gpt-public", messages: user("cut my answer"), num_retries: 1 });
    expect(retried.status).toBe(200);
    expect(retried.headers.get("x-svc-attempted-retries")).toBe("1");
  });

  test("stream cut after 2 chunks: the client gets both, then an error event (raw)", async () => {
    mock.fault({ kind: "cutStream", afterChunks: 2 });
    const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("a fairly long message to stream"), stream: true });
    expect(res.status).toBe(200);
    const events = sseEvents(await res.text());
    expect(events).toHaveLength(3);
    for (const event of events.slice(0, 2)) {
      expect((JSON.parse(event.slice("data: ".length)) as ChatCompletionChunk).object).toBe("chat.completion.chunk");
    }
    expect(events[2]!.startsWith("data: ")).toBe(true);
    const error = expectEnvelope(JSON.parse(events[2]!.slice("data: ".length)), 503);
    expect(error.message).toContain("ended unexpectedly");
  });

  test("stream cut after its opening chunk (the role, no content): the attempt failed before the stream began, so it is retried", async () => {
    mock.fault({ kind: "cutStream", afterChunks: 1 });
    const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("cut after the role"), stream: true });
    expect(res.status).toBe(503);
    expect(expectEnvelope(await res.json(), 503).message).toContain("ended unexpectedly");
    mock.fault({ kind: "cutStream", afterChunks: 1 });
    const retried = await post("/v1/chat/completions", { model: "gpt-public", messages: user("cut after the role"), stream: true, num_retries: 1 });
    expect(retried.status).toBe(200);
    expect(retried.headers.get("x-svc-attempted-retries")).toBe("1");
    expect(sseEvents(await retried.text()).at(-1)).toBe("data: [DONE]");
  });

  test("an error event as a stream's first event keeps the status its code gives (429 → 429, a string code → 500)", async () => {
    const errorEvent = (error: unknown) => () => ({ bytes: new TextEncoder().encode(`data: ${JSON.stringify({ error })}\n\n`), cuts: [] });
    mock.fault({ kind: "wire", shape: errorEvent({ message: "Rate limit exceeded", code: 429 }) });
    const limited = await post("/v1/chat/completions", { model: "gpt-public", messages: user("x"), stream: true });
    expect(limited.status).toBe(429);
    expect(expectEnvelope(await limited.json(), 429).message).toContain("Rate limit exceeded");
    mock.fault({ kind: "wire", shape: errorEvent({ message: "something broke", code: "server_error" }) });
    const broken = await post("/v1/chat/completions", { model: "gpt-public", messages: user("x"), stream: true });
    expect(broken.status).toBe(500);
  });

  test("stream cut after 2 chunks: the SDK iteration yields them, then throws", async () => {
    mock.fault({ kind: "cutStream", afterChunks: 2 });
    const stream = await client.chat.completions.create({ model: "gpt-public", messages: user("a fairly long message to stream"), stream: true });
    const seen: ChatCompletionChunk[] = [];
    const err = await failure(
      (async () => {
        for await (const chunk of stream) seen.push(chunk);
      })(),
    );
    expect(seen).toHaveLength(2);
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toContain("ended unexpectedly");
  });

  test("a malformed first upstream stream event → 500 before the stream begins (the attempt failed: nothing was sent)", async () => {
    mock.fault({ kind: "invalidJson" });
    const res = await post("/v1/chat/completions", { model: "gpt-public", messages: user("hi"), stream: true });
    expect(res.status).toBe(500);
    expectEnvelope(await res.json(), 500);
  });
});

describe("client disconnect aborts the upstream call", () => {
  test("stream: abort after 3 chunks cancels the upstream stream", async () => {
    mock.fault({ kind: "slowStream", chunkDelayMs: 50, chunks: 50 });
    const stream = await client.chat.completions.create({ model: "gpt-public", messages: user("slow"), stream: true });
    const it = stream[Symbol.asyncIterator]();
    for (let i = 0; i < 3; i++) expect((await it.next()).done).toBe(false);
    stream.controller.abort();
    // The gateway cancels the upstream at once (a few ms). The bound is well under the ~700 ms after
    // which Bun drops an abandoned upstream connection by itself, so a gateway that forgot to abort
    // the upstream fails here rather than passing late.
    expect(await eventually(() => mock.streamsCancelled === 1, 400)).toBe(true);
    expect(mock.streamsCancelled).toBe(1);
  });

  test("non-stream: abort while the upstream hangs aborts the upstream request", async () => {
    const before = { ...hang };
    const controller = new AbortController();
    const pending = failure(client.chat.completions.create({ model: "gpt-hang", messages: user("hi") }, { signal: controller.signal }));
    expect(await eventually(() => hang.started === before.started + 1)).toBe(true);
    expect(hang.aborted).toBe(before.aborted);
    controller.abort();
    expect(await pending).toBeInstanceOf(APIUserAbortError);
    expect(await eventually(() => hang.aborted === before.aborted + 1)).toBe(true);
  });
});
