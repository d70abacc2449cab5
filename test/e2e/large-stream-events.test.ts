// One large upstream event arriving in many network reads: it reaches the client whole (each read
// is framed once, so its cost is linear in its size: test/unit/framing.test.ts counts it); an
// upstream line that never ends fails the stream at the framing bound (64 Mi characters) with an
// error event, instead of the gateway buffering it without limit.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Server } from "bun";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { until } from "../harness/util.ts";

const MiB = 1024 * 1024;
const BIG_CHARS = 16 * MiB;
const chunkText = (delta: object, finish: string | null) =>
  JSON.stringify({ id: "chatcmpl-big", object: "chat.completion.chunk", created: 1, model: "big", choices: [{ index: 0, delta, finish_reason: finish }] });
const event = (delta: object, finish: string | null = null) => `data: ${chunkText(delta, finish)}\n\n`;

let upstream: Server<undefined>;
let gw: TestGateway;
/** Whether the gateway hung up on the endless stream before its end. */
let endlessCancelled = false;

/** Writes `text` in `size`-character writes, each flushed (a read of its own at the gateway, mostly). */
async function writeInPieces(c: ReadableStreamDirectController, text: string, size: number): Promise<void> {
  for (let i = 0; i < text.length; i += size) {
    c.write(text.slice(i, i + size));
    await c.flush();
  }
}

/**
 * A first event, then one whose line never ends: 1 MiB pieces until the gateway cancels (for at most
 * 20 s). Past the bound the pieces come 5 ms apart: the gateway's HTTP client reads ahead of its
 * framing, and on a busy host it once read all of a fixed 80 MiB, so the stream had ended before the
 * gateway could hang up on it.
 */
function endlessEvent(): ReadableStream<string> {
  const piece = "x".repeat(MiB);
  const endAt = Date.now() + 20_000;
  let sent = 0;
  return new ReadableStream<string>(
    {
      start(c) {
        c.enqueue(event({ role: "assistant", content: "hello" }));
        c.enqueue(`data: ${chunkText({ content: "" }, null).slice(0, -10)}`);
      },
      async pull(c) {
        if (sent++ >= 64) await Bun.sleep(5);
        if (Date.now() > endAt) c.close();
        else c.enqueue(piece);
      },
      cancel() {
        endlessCancelled = true;
      },
    },
    { highWaterMark: 0 },
  );
}

beforeAll(async () => {
  upstream = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      const prompt = JSON.stringify(await req.json());
      const headers = { "content-type": "text/event-stream" };
      if (prompt.includes("endless")) return new Response(endlessEvent(), { headers });
      const source: Bun.DirectUnderlyingSource<Uint8Array> = {
        type: "direct",
        async pull(c) {
          c.write(event({ role: "assistant", content: "hello" }));
          await writeInPieces(c, event({ content: "y".repeat(BIG_CHARS) }), 16 * 1024);
          c.write(`${event({}, "stop")}data: [DONE]\n\n`);
          await c.flush();
          c.close();
        },
      };
      return new Response(new ReadableStream(source as unknown as UnderlyingDefaultSource<Uint8Array>), { headers });
    },
  });
  gw = await startTestGateway({
    model_list: [{ model_name: "big", svc_params: { model: "openai/big", api_base: `http://127.0.0.1:${upstream.port}/v1`, api_key: "sk-up" } }],
    general_settings: { master_key: MASTER_KEY },
  });
}, 30_000);
afterAll(async () => {
  await gw?.stop();
  upstream?.stop(true);
});

const streamCall = (content: string) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "big", stream: true, messages: [{ role: "user", content }] }),
  });

/** The data of each SSE event in `text`. */
const eventData = (text: string) =>
  text
    .split("\n\n")
    .filter((e) => e.startsWith("data: "))
    .map((e) => e.slice("data: ".length));

test("a 16 MiB event in 16 KiB reads reaches the client whole", async () => {
  const res = await streamCall("big");
  expect(res.status).toBe(200);
  const data = eventData(await res.text());
  expect(data.at(-1)).toBe("[DONE]");
  const content = data
    .slice(0, -1)
    .map((d) => (JSON.parse(d) as { choices: { delta: { content?: string } }[] }).choices[0]?.delta.content ?? "")
    .join("");
  expect(content.length).toBe(5 + BIG_CHARS);
  expect(content === `hello${"y".repeat(BIG_CHARS)}`).toBe(true);
}, 30_000);

test("an upstream line that never ends: the chunks so far, then an error event at 64 Mi characters; the gateway keeps serving", async () => {
  const res = await streamCall("endless");
  expect(res.status).toBe(200);
  const data = eventData(await res.text());
  expect(data).not.toContain("[DONE]");
  expect((JSON.parse(data[0]!) as { choices: { delta: { content: string } }[] }).choices[0]?.delta.content).toBe("hello");
  const error = (JSON.parse(data.at(-1)!) as { error: { code: string; message: string } }).error;
  expect(error.code).toBe("500");
  expect(error.message).toBe(`openai sent a corrupt event stream for model big: a stream event is over ${64 * MiB} characters`);
  expect(await until(async () => endlessCancelled, 10_000)).toBe(true);
  expect((await fetch(`${gw.url}/health/liveliness`)).status).toBe(200);
}, 30_000);
