/**
 * The floor for a gateway that prices its calls: the least work any such proxy must do beyond the
 * bare one. It reads the request's JSON (for the model), forwards the bytes, and reads the answer's
 * usage: for JSON by parsing the answer, for SSE by decoding each chunk as it passes through (in
 * Bun's direct stream, as the gateway does) and parsing the one that carries `"usage":{`. No auth,
 * limits, log or anything else. Measured next to the bare proxy, it shows how much of the gateway's
 * cost is the job itself and how much is the gateway.
 *
 *   bun bench/floor-proxy.ts --port 9100 --upstream http://127.0.0.1:9001/v1
 */
import { parseArgs } from "node:util";

const { values } = parseArgs({ args: Bun.argv.slice(2), options: { port: { type: "string" }, upstream: { type: "string" } } });
const target = `${(values.upstream ?? "http://127.0.0.1:9001/v1").replace(/\/+$/, "")}/chat/completions`;

interface Usage {
  prompt_tokens?: number;
  completion_tokens?: number;
}
let pricedTokens = 0;
const price = (u: Usage | undefined) => {
  pricedTokens += (u?.prompt_tokens ?? 0) + (u?.completion_tokens ?? 0);
};

/** Passes the SSE bytes on as they come, reading the usage event on the way. */
function relay(upstream: ReadableStream<Uint8Array>): ReadableStream<Uint8Array> {
  const reader = upstream.getReader();
  const decoder = new TextDecoder();
  const source: Bun.DirectUnderlyingSource<Uint8Array> = {
    type: "direct",
    async pull(c) {
      /** The usage event from its start, until its end arrives (it may span reads). */
      let usageEvent: string | undefined;
      let priced = false;
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        if (!priced) {
          const text = decoder.decode(value, { stream: true });
          if (usageEvent !== undefined) usageEvent += text;
          else if (text.includes('"usage":{')) usageEvent = text.slice(text.lastIndexOf("data: ", text.indexOf('"usage":{')) + 6);
          const end = usageEvent?.indexOf("\n") ?? -1;
          if (usageEvent !== undefined && end >= 0) {
            price((JSON.parse(usageEvent.slice(0, end)) as { usage?: Usage }).usage);
            priced = true;
          }
        }
        c.write(value);
        await c.flush();
      }
      c.close();
    },
  };
  // The DOM lib's ReadableStream overloads hide Bun's direct-source one.
  return new ReadableStream(source as unknown as UnderlyingDefaultSource<Uint8Array>);
}

const server = Bun.serve({
  port: Number(values.port ?? 0),
  hostname: "127.0.0.1",
  idleTimeout: 255,
  async fetch(req) {
    if (req.method !== "POST" || new URL(req.url).pathname !== "/v1/chat/completions") return new Response("not found", { status: 404 });
    const body = await req.text();
    const stream = (JSON.parse(body) as { stream?: boolean }).stream === true;
    const res = await fetch(target, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Bearer sk-upstream" },
      // The usage chunk must be asked for, as the gateway does.
      body: stream ? `{"stream_options":{"include_usage":true},${body.slice(body.indexOf("{") + 1)}` : body,
      signal: req.signal,
    });
    const type = res.headers.get("content-type") ?? "application/json";
    if (stream) return new Response(relay(res.body!), { status: res.status, headers: { "content-type": type } });
    const text = await res.text();
    price((JSON.parse(text) as { usage?: Usage }).usage);
    return new Response(text, { status: res.status, headers: { "content-type": type } });
  },
});
console.log(`listening http://${server.hostname}:${server.port}`);
process.on("SIGTERM", () => {
  console.log(`priced ${pricedTokens} tokens`);
  process.exit(0);
});
