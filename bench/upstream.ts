/**
 * A fast, constant OpenAI-compatible upstream for benchmarks: every answer is precomputed, so the
 * mock costs the same for every target and as little as possible.
 *
 *   bun bench/upstream.ts --port 9001        → prints `listening http://127.0.0.1:9001/v1`
 *
 * POST /v1/chat/completions (or /chat/completions): a chat.completion JSON, or with `"stream": true`
 * an SSE stream of 10 chat.completion.chunk events (role, 8 content words, finish_reason + usage
 * when stream_options.include_usage) and `data: [DONE]`, each chunk written as its own enqueue.
 */
import { parseArgs } from "node:util";

const { values } = parseArgs({ args: Bun.argv.slice(2), options: { port: { type: "string" }, host: { type: "string" } } });
const created = Math.floor(Date.now() / 1000);
const id = "chatcmpl-BENCHbenchBENCHbenchBENCHbench";
const words = ["This", " is", " a", " constant", " reply", " from", " the", " mock."];
const usage = { prompt_tokens: 12, completion_tokens: words.length, total_tokens: 12 + words.length };

const json = JSON.stringify({
  id,
  object: "chat.completion",
  created,
  model: "bench-model",
  choices: [{ index: 0, message: { role: "assistant", content: words.join(""), refusal: null, annotations: [] }, logprobs: null, finish_reason: "stop" }],
  usage,
  service_tier: "default",
  system_fingerprint: "fp_bench",
});

const chunk = (delta: object, finish: string | null, withUsage?: object | null) =>
  `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: "bench-model", service_tier: "default", system_fingerprint: "fp_bench", choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }], ...(withUsage !== undefined ? { usage: withUsage } : {}) })}\n\n`;

const enc = new TextEncoder();
function sse(includeUsage: boolean): Uint8Array[] {
  const u = includeUsage ? null : undefined;
  const parts = [chunk({ role: "assistant", content: "", refusal: null }, null, u), ...words.map((w) => chunk({ content: w }, null, u)), chunk({}, "stop", u)];
  if (includeUsage) parts.push(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: "bench-model", service_tier: "default", system_fingerprint: "fp_bench", choices: [], usage })}\n\n`);
  parts.push("data: [DONE]\n\n");
  return parts.map((p) => enc.encode(p));
}
const SSE_PLAIN = sse(false);
const SSE_USAGE = sse(true);

const JSON_HEADERS = { "content-type": "application/json", "x-request-id": "req_bench" };
const SSE_HEADERS = { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", "x-request-id": "req_bench" };

/** One write per event, one flush: the whole stream leaves in as few syscalls as Bun can manage. */
function streamOf(parts: Uint8Array[]): ReadableStream<Uint8Array> {
  const source: Bun.DirectUnderlyingSource<Uint8Array> = {
    type: "direct",
    async pull(c) {
      for (const p of parts) c.write(p);
      await c.flush();
      c.close();
    },
  };
  // The DOM lib's ReadableStream overloads hide Bun's direct-source one.
  return new ReadableStream(source as unknown as UnderlyingDefaultSource<Uint8Array>);
}

const server = Bun.serve({
  port: Number(values.port ?? 0),
  hostname: values.host ?? "127.0.0.1",
  idleTimeout: 255,
  async fetch(req) {
    const path = new URL(req.url).pathname;
    if (req.method !== "POST" || (path !== "/v1/chat/completions" && path !== "/chat/completions")) {
      return new Response(JSON.stringify({ error: { message: "not found", type: "invalid_request_error" } }), { status: 404, headers: JSON_HEADERS });
    }
    // Only the two fields that change the answer are looked at; the body is still read and parsed once.
    const body = (await req.json()) as { stream?: boolean; stream_options?: { include_usage?: boolean } };
    if (body.stream !== true) return new Response(json, { headers: JSON_HEADERS });
    return new Response(streamOf(body.stream_options?.include_usage ? SSE_USAGE : SSE_PLAIN), { headers: SSE_HEADERS });
  },
});
console.log(`listening http://${server.hostname}:${server.port}/v1`);
