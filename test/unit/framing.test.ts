// The upstream stream parsers (SSE and NDJSON) fed input split at awkward places, and the
// OpenAI-compatible stream transform that turns each event into parts.
import { describe, expect, test } from "bun:test";
import type { ChatRequest, CompletionRequest, StreamPart } from "../../core/contract.ts";
import { type EventParser, MAX_EVENT_CHARS, NdjsonParser, OversizedEvent, SseParser } from "../../core/stream/framing.ts";
import { openAIChat, openAICompletions } from "../../providers/openai-compatible/adapter.ts";

/** A parser as a TransformStream, so decoded byte streams can be piped through it. */
function asTransform(parser: EventParser): TransformStream<string, string> {
  return new TransformStream({
    transform(text, c) {
      parser.push(text, (e) => c.enqueue(e));
    },
    flush(c) {
      parser.end((e) => c.enqueue(e));
    },
  });
}
const sseEvents = () => asTransform(new SseParser());
const ndjsonEvents = () => asTransform(new NdjsonParser());

/** Runs text chunks, exactly as given, through a framing transform and collects the events. */
async function run(framing: TransformStream<string, string>, chunks: string[]): Promise<string[]> {
  const source = new ReadableStream<string>({
    start(c) {
      for (const chunk of chunks) c.enqueue(chunk);
      c.close();
    },
  });
  const events: string[] = [];
  for await (const event of source.pipeThrough(framing)) events.push(event);
  return events;
}

/** Bytes split into pieces of `size`, decoded the way the pipeline does it (TextDecoderStream). */
async function runBytes(framing: TransformStream<string, string>, text: string, size: number): Promise<string[]> {
  const bytes = new TextEncoder().encode(text);
  const source = new ReadableStream<BufferSource>({
    start(c) {
      for (let i = 0; i < bytes.length; i += size) c.enqueue(bytes.slice(i, i + size));
      c.close();
    },
  });
  const events: string[] = [];
  for await (const event of source.pipeThrough(new TextDecoderStream()).pipeThrough(framing)) events.push(event);
  return events;
}

/** Every way of cutting `text` in two. */
const splits = (text: string) => Array.from({ length: text.length + 1 }, (_, i) => [text.slice(0, i), text.slice(i)]);

const OPENAI_STREAM =
  'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Grüße 👋"}}]}\n\n' +
  ": keep-alive\n\n" +
  'data: {"id":"c1","choices":[{"index":0,"delta":{"content":" world"}}]}\n\n' +
  "data: [DONE]\n\n";

const OPENAI_EVENTS = [
  '{"id":"c1","choices":[{"index":0,"delta":{"content":"Grüße 👋"}}]}',
  '{"id":"c1","choices":[{"index":0,"delta":{"content":" world"}}]}',
  "[DONE]",
];

describe("sseEvents", () => {
  test("whole input", async () => {
    expect(await run(sseEvents(), [OPENAI_STREAM])).toEqual(OPENAI_EVENTS);
  });

  test("split at every character position (mid-JSON, mid-field name, mid-separator)", async () => {
    for (const parts of splits(OPENAI_STREAM)) expect(await run(sseEvents(), parts)).toEqual(OPENAI_EVENTS);
  });

  test("one character per chunk", async () => {
    expect(await run(sseEvents(), [...OPENAI_STREAM])).toEqual(OPENAI_EVENTS);
  });

  test("byte-split input, multi-byte characters cut in the middle, through TextDecoderStream", async () => {
    for (const size of [1, 2, 3, 5, 7]) expect(await runBytes(sseEvents(), OPENAI_STREAM, size)).toEqual(OPENAI_EVENTS);
  });

  test("CRLF line ends, with the CR at the end of one chunk and the LF at the start of the next", async () => {
    // Were the split CRLF read as two line ends, the blank line would end the event after "a".
    expect(await run(sseEvents(), ["data: a\r", "\ndata: b\r\n\r\n"])).toEqual(["a\nb"]);
    expect(await run(sseEvents(), ["data: a\r\n\r", "\ndata: b\r\n\r\n"])).toEqual(["a", "b"]);
    const crlf = OPENAI_STREAM.replaceAll("\n", "\r\n");
    for (const parts of splits(crlf)) expect(await run(sseEvents(), parts)).toEqual(OPENAI_EVENTS);
  });

  test("a split CR followed by another CR is a blank line", async () => {
    expect(await run(sseEvents(), ["data: a\r", "\rdata: b\r\r"])).toEqual(["a", "b"]);
  });

  test("CR-only line ends", async () => {
    expect(await run(sseEvents(), ["data: x\rdata: y\r\rdata: z\r\r"])).toEqual(["x\ny", "z"]);
    const cr = OPENAI_STREAM.replaceAll("\n", "\r");
    for (const parts of splits(cr)) expect(await run(sseEvents(), parts)).toEqual(OPENAI_EVENTS);
  });

  test("multi-line data is joined with \\n", async () => {
    expect(await run(sseEvents(), ['data: {"a":\ndata: 1}\n\n'])).toEqual(['{"a":\n1}']);
    expect(await run(sseEvents(), ["data: one\ndata:two\ndata\n\n"])).toEqual(["one\ntwo\n"]);
  });

  test("only one leading space is stripped from the value", async () => {
    expect(await run(sseEvents(), ["data:  two spaces\n\n"])).toEqual([" two spaces"]);
  });

  test("comments and other fields are ignored; blank lines alone emit nothing", async () => {
    const text = ": keep-alive\n\nevent: message\nid: 7\nretry: 100\ndata: payload\n\n\n\n: bye\n";
    expect(await run(sseEvents(), [text])).toEqual(["payload"]);
    expect(await run(sseEvents(), [...text])).toEqual(["payload"]);
  });

  test("an event without a trailing blank line at EOF is flushed", async () => {
    expect(await run(sseEvents(), ["data: first\n\ndata: last"])).toEqual(["first", "last"]);
    expect(await run(sseEvents(), ["data: first\n\ndata: last\n"])).toEqual(["first", "last"]);
    expect(await run(sseEvents(), ["data: first\n\ndata: la", "st\r"])).toEqual(["first", "last"]);
  });

  test("empty chunks between a CR and its LF do not break the pair", async () => {
    expect(await run(sseEvents(), ["data: a\r", "", "\ndata: b\n\n"])).toEqual(["a\nb"]);
  });
});

describe("ndjsonEvents", () => {
  const NDJSON = '{"a":1}\n{"b":"ü 👋"}\r\n\n{"c":3}';
  const LINES = ['{"a":1}', '{"b":"ü 👋"}', '{"c":3}'];

  test("lines split across chunks, blank lines skipped, last line without newline flushed", async () => {
    expect(await run(ndjsonEvents(), ['{"a":1}\n{"b"', ':"ü 👋"}\r', '\n\n{"c":3}'])).toEqual(LINES);
    for (const parts of splits(NDJSON)) expect(await run(ndjsonEvents(), parts)).toEqual(LINES);
  });

  test("byte-split input", async () => {
    for (const size of [1, 2, 3]) expect(await runBytes(ndjsonEvents(), NDJSON, size)).toEqual(LINES);
  });
});

describe("large events", () => {
  const MiB = 1024 * 1024;
  /** Pushes `text` in pieces of `size` and ends; the events, and the characters the parser read for line ends. */
  const pushInPieces = (parser: SseParser | NdjsonParser, text: string, size: number) => {
    const events: string[] = [];
    for (let i = 0; i < text.length; i += size) parser.push(text.slice(i, i + size), (e) => events.push(e));
    parser.end((e) => events.push(e));
    return { events, scanned: parser.scanned };
  };

  // A 16 MiB event in 16 KiB reads took seconds, blocking the event loop, when each read re-read
  // the event held so far: 1024 reads of 8 MiB on average. Counted, not timed.
  test("an event arriving in many reads is read once: the work is linear in its size", () => {
    const body = "x".repeat(16 * MiB);
    const sse = pushInPieces(new SseParser(), `data: ${body}\n\ndata: [DONE]\n\n`, 16 * 1024);
    expect(sse.events.length).toBe(2);
    expect(sse.events[0] === body).toBe(true);
    expect(sse.scanned).toBeLessThanOrEqual(body.length + 32);
    const ndjson = pushInPieces(new NdjsonParser(), `${body}\r\n{"done":true}\n`, 16 * 1024);
    expect(ndjson.events.length).toBe(2);
    expect(ndjson.events[0] === body).toBe(true);
    expect(ndjson.scanned).toBeLessThanOrEqual(body.length + 32);
  });

  test("an event split everywhere still comes out whole, with CRLF, CR and multi-line data", () => {
    const text = "data: a\r\ndata: bb\rdata: ccc\n\r\n: note\ndata: d\r\r";
    for (const size of [1, 2, 3, 5]) expect(pushInPieces(new SseParser(), text, size).events).toEqual(["a\nbb\nccc", "d"]);
  });

  test("a line that never ends fails the stream past the bound, instead of buffering without limit", () => {
    const parser = new SseParser(100);
    const events: string[] = [];
    // Up to the bound an event is kept whole, over several reads.
    parser.push(`data: ${"a".repeat(44)}`, (e) => events.push(e));
    parser.push(`${"a".repeat(50)}\n\n`, (e) => events.push(e));
    expect(events).toEqual(["a".repeat(94)]);
    parser.push("data: ", (e) => events.push(e));
    for (let i = 0; i < 9; i++) parser.push("b".repeat(10), (e) => events.push(e));
    expect(() => parser.push("b".repeat(10), (e) => events.push(e))).toThrow(OversizedEvent);
    expect(events).toEqual(["a".repeat(94)]);

    const ndjson = new NdjsonParser(100);
    ndjson.push("c".repeat(100), () => undefined);
    expect(() => ndjson.push("c", () => undefined)).toThrow("a stream event is over 100 characters");
  });

  test("an SSE event of endless short data lines fails past the bound too", () => {
    const parser = new SseParser(100);
    expect(() => {
      for (let i = 0; i < 100; i++) parser.push("data: 0123456789\n", () => undefined);
    }).toThrow(OversizedEvent);
    // Comments and other fields are not held: they never count.
    const quiet = new SseParser(100);
    for (let i = 0; i < 100; i++) quiet.push(": keep-alive 0123456789\nevent: ping\n", () => undefined);
  });

  test("the default bound is 64 Mi characters", () => {
    expect(MAX_EVENT_CHARS).toBe(64 * MiB);
    const parser = new SseParser();
    // The same 1 MiB piece each time: the parser holds references, not 64 MiB of copies.
    const piece = "x".repeat(MiB);
    parser.push("data: ", () => undefined);
    for (let i = 0; i < 63; i++) parser.push(piece, () => undefined);
    expect(() => parser.push(piece, () => undefined)).toThrow(OversizedEvent);
  });
});

describe("OpenAI-compatible stream transform", () => {
  const chat = openAIChat().stream!;
  const request = (extra: Partial<ChatRequest> = {}): ChatRequest => ({
    model: "m",
    messages: [{ role: "user", content: "hello there" }],
    stream: true,
    ...extra,
  });
  const usageChunk = JSON.stringify({
    id: "c1",
    object: "chat.completion.chunk",
    choices: [],
    usage: { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8, completion_tokens_details: { reasoning_tokens: 2 } },
  });
  const contentChunk = JSON.stringify({ id: "c1", object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: "hi" } }], usage: null });

  /** What the client receives for each part: chunks as parsed JSON, whatever their representation. */
  const sent = (parts: StreamPart[]) =>
    parts.map((p) => (p.type === "data" ? { type: "chunk", chunk: JSON.parse(p.data) } : p.type === "chunk" ? { type: "chunk", chunk: p.chunk } : p));

  test("framing is SSE", () => {
    expect(chat.framing).toBe("sse");
  });

  test("client did not ask for usage: the usage-only chunk is dropped and reported as usage; usage: null is stripped", () => {
    const s = chat.init(request());
    expect(sent(chat.event(contentChunk, s))).toEqual([
      { type: "chunk", chunk: { id: "c1", object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: "hi" } }] } },
    ]);
    expect(chat.event(usageChunk, s)).toEqual([{ type: "usage", usage: { promptTokens: 3, completionTokens: 5, reasoningTokens: 2 } }]);
    expect(chat.event("[DONE]", s)).toEqual([{ type: "end" }]);
  });

  test("client asked for usage: the usage chunk is kept as a chunk and also reported", () => {
    const s = chat.init(request({ stream_options: { include_usage: true } }));
    const parts = chat.event(usageChunk, s);
    expect(sent(parts)).toEqual([
      { type: "usage", usage: { promptTokens: 3, completionTokens: 5, reasoningTokens: 2 } },
      { type: "chunk", chunk: JSON.parse(usageChunk) },
    ]);
    expect(sent(chat.event(contentChunk, s))).toEqual([{ type: "chunk", chunk: JSON.parse(contentChunk) }]);
  });

  // JSON allows whitespace around ':' and ','; some OpenAI-compatible servers pretty-print each chunk.
  test("pretty-printed chunks: the usage is read (not estimated), usage: null stripped, the id and an error event found", () => {
    const pretty = (text: string) => JSON.stringify(JSON.parse(text), null, 1);
    const s = chat.init(request());
    expect(sent(chat.event(pretty(contentChunk), s))).toEqual([
      { type: "chunk", chunk: { id: "c1", object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: "hi" } }] } },
    ]);
    expect(chat.event(pretty(usageChunk), s)).toEqual([{ type: "usage", usage: { promptTokens: 3, completionTokens: 5, reasoningTokens: 2 } }]);
    expect(chat.responseId?.(s)).toBe("c1");
    const first = chat.init(request());
    expect(sent(chat.event('{ "usage": null, "id": "c2", "choices": [] }', first))).toEqual([{ type: "chunk", chunk: { id: "c2", choices: [] } }]);
    const failed = chat.event(' { "error" : { "message": "upstream exploded" } } ', chat.init(request()));
    expect(failed.map((p) => p.type)).toEqual(["error"]);
  });

  test("an upstream error event becomes an error part", () => {
    const s = chat.init(request());
    const parts = chat.event(JSON.stringify({ error: { message: "upstream exploded", type: "server_error" } }), s);
    expect(parts).toHaveLength(1);
    expect(parts[0]?.type).toBe("error");
    if (parts[0]?.type !== "error") throw new Error("unreachable");
    expect(parts[0].error.message).toBe("upstream exploded");
    expect(parts[0].error.status).toBe(500);
  });

  test("invalid JSON throws (the pipeline turns it into an error event)", () => {
    expect(() => chat.event('{"id":', chat.init(request()))).toThrow();
  });

  test("estimate: prompt from the messages, completion from the chunk count", () => {
    const s = chat.init(request());
    chat.event(contentChunk, s);
    chat.event(contentChunk, s);
    expect(chat.estimate(s)).toEqual({ promptTokens: Math.ceil("hello there".length / 4), completionTokens: 2 });
  });

  test("legacy completions share the behaviour", () => {
    const completions = openAICompletions().stream!;
    const req: CompletionRequest = { model: "m", prompt: "abc", stream: true };
    const s = completions.init(req);
    const legacyUsage = JSON.stringify({ id: "x", object: "text_completion", choices: [], usage: { prompt_tokens: 1, completion_tokens: 2 } });
    expect(completions.event(legacyUsage, s)).toEqual([{ type: "usage", usage: { promptTokens: 1, completionTokens: 2 } }]);
  });
});

describe("OpenAI-compatible request", () => {
  test("streaming requests always ask upstream for usage, keeping the client's other stream_options", () => {
    const d = {
      id: "d",
      modelName: "public",
      provider: "openai",
      upstreamModel: "gpt-4o-mini",
      apiBase: "http://up/v1",
      apiKey: "sk-up",
      options: { model: "openai/gpt-4o-mini" },
      info: {},
    };
    const call = openAIChat().request(
      { model: "public", messages: [{ role: "user", content: "x" }], stream: true, stream_options: { other: 1 }, fallbacks: ["y"] },
      d,
    );
    expect(call.url).toBe("http://up/v1/chat/completions");
    expect(call.headers.authorization).toBe("Bearer sk-up");
    expect(JSON.parse(call.body as string)).toEqual({
      model: "gpt-4o-mini",
      messages: [{ role: "user", content: "x" }],
      stream: true,
      stream_options: { other: 1, include_usage: true },
    });
  });
});
