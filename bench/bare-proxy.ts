/**
 * The physical limit for a Bun proxy: forwards POST /v1/chat/completions to the upstream with fetch
 * and returns the upstream's Response as it is (body streamed through). Nothing else.
 *
 *   bun bench/bare-proxy.ts --port 9100 --upstream http://127.0.0.1:9001/v1
 */
import { parseArgs } from "node:util";

const { values } = parseArgs({ args: Bun.argv.slice(2), options: { port: { type: "string" }, upstream: { type: "string" } } });
const target = `${(values.upstream ?? "http://127.0.0.1:9001/v1").replace(/\/+$/, "")}/chat/completions`;

const server = Bun.serve({
  port: Number(values.port ?? 0),
  hostname: "127.0.0.1",
  idleTimeout: 255,
  async fetch(req) {
    if (req.method !== "POST" || new URL(req.url).pathname !== "/v1/chat/completions") return new Response("not found", { status: 404 });
    const res = await fetch(target, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Bearer sk-upstream" },
      body: await req.arrayBuffer(),
      signal: req.signal,
    });
    return new Response(res.body, { status: res.status, headers: { "content-type": res.headers.get("content-type") ?? "application/json" } });
  },
});
console.log(`listening http://${server.hostname}:${server.port}`);
