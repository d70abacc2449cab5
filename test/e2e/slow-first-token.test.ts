// A model slow to its first token (a reasoning model, a long prompt): the client gets the status
// and headers (its call id among them) after a second, through an SSE comment, not only when the
// first event comes; the openai SDK's stream is unchanged by it. Once that comment is out, a stall
// before the first event can no longer be retried or fall back (README §Errors).
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Server } from "bun";
import OpenAI from "openai";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";

const FIRST_EVENT_AFTER_MS = 2500;
const chunk = (delta: object, finish: string | null) =>
  `data: ${JSON.stringify({ id: "chatcmpl-slow", object: "chat.completion.chunk", created: 1, model: "slow", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

let upstream: Server<undefined>;
let gw: TestGateway;

beforeAll(async () => {
  // Sends its headers and a comment at once (as OpenAI does), the first event only later.
  upstream = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      // Model "stalls": the opening chunk, then nothing until the gateway gives up.
      if (((await req.json()) as { model: string }).model === "stalls") {
        const opening = new TextEncoder().encode(chunk({ role: "assistant", content: "" }, null));
        return new Response(new ReadableStream({ start: (c) => c.enqueue(opening) }), { headers: { "content-type": "text/event-stream" } });
      }
      const source: Bun.DirectUnderlyingSource<Uint8Array> = {
        type: "direct",
        async pull(c) {
          c.write(": upstream ping\n\n");
          await c.flush();
          await Bun.sleep(FIRST_EVENT_AFTER_MS);
          c.write(`${chunk({ role: "assistant", content: "late" }, null)}${chunk({}, "stop")}data: [DONE]\n\n`);
          await c.flush();
          c.close();
        },
      };
      return new Response(new ReadableStream(source as unknown as UnderlyingDefaultSource<Uint8Array>), { headers: { "content-type": "text/event-stream" } });
    },
  });
  gw = await startTestGateway({
    model_list: [
      { model_name: "slow", svc_params: { model: "openai/slow", api_base: `http://127.0.0.1:${upstream.port}/v1`, api_key: "sk-up" } },
      { model_name: "stalls", svc_params: { model: "openai/stalls", api_base: `http://127.0.0.1:${upstream.port}/v1`, api_key: "sk-up", stream_timeout: 1.5 } },
    ],
    router_settings: { num_retries: 0, fallbacks: [{ stalls: ["slow"] }] },
    general_settings: { master_key: MASTER_KEY },
  });
}, 30_000);
afterAll(async () => {
  await gw?.stop();
  upstream?.stop(true);
});

test("headers and the call id come before the first event; the body then carries the answer", async () => {
  const started = performance.now();
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "slow", stream: true, messages: [{ role: "user", content: "think hard" }] }),
  });
  const headersAt = performance.now() - started;
  expect(res.status).toBe(200);
  expect(res.headers.get("x-svc-call-id")).toBeTruthy();
  expect(headersAt).toBeLessThan(FIRST_EVENT_AFTER_MS - 500);
  const text = await res.text();
  expect(performance.now() - started).toBeGreaterThanOrEqual(FIRST_EVENT_AFTER_MS - 50);
  expect(text.startsWith(": ")).toBe(true);
  expect(text).toContain('"content":"late"');
  expect(text.endsWith("data: [DONE]\n\n")).toBe(true);
}, 15_000);

test("the openai SDK reads the stream as if the comment were not there", async () => {
  const client = new OpenAI({ apiKey: MASTER_KEY, baseURL: `${gw.url}/v1`, maxRetries: 0 });
  const stream = await client.chat.completions.create({ model: "slow", stream: true, messages: [{ role: "user", content: "think hard" }] });
  let text = "";
  for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
  expect(text).toBe("late");
}, 15_000);

test("a stall past a stream_timeout of a second or more, after the comment sent the 200, ends the stream with its error: no fallback", async () => {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "stalls", stream: true, messages: [{ role: "user", content: "think hard" }] }),
  });
  expect(res.status).toBe(200);
  expect(res.headers.get("x-svc-attempted-fallbacks")).toBe("0");
  const text = await res.text();
  expect(text.startsWith(": waiting for the model\n\n")).toBe(true);
  const last = JSON.parse(text.trimEnd().split("\n\n").at(-1)!.slice("data: ".length)) as { error: { code: string } };
  expect(last.error.code).toBe("408");
  expect(text).not.toContain("[DONE]");
}, 15_000);
