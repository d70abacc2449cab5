// general_settings.max_request_size_mb: a body over it is a 413 in the error envelope (announced
// or chunked, model calls and management alike), one under it is served, and a reload applies it.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readConfig } from "../../core/config/load.ts";
import { configText, MASTER_KEY, spawnGateway, startTestGateway, type TestGateway, tempDir } from "../harness/gateway.ts";
import { rawRequest } from "../harness/util.ts";

const model = { model_name: "chat-mock", svc_params: { model: "mock/chat" } };
/** A pass-through target that keeps the size of every body it read whole. */
const received: number[] = [];
const target = Bun.serve({
  port: 0,
  hostname: "127.0.0.1",
  async fetch(req) {
    received.push((await req.arrayBuffer()).byteLength);
    return Response.json({ ok: true });
  },
});
const config = (mb: number) => ({
  model_list: [model],
  general_settings: { master_key: MASTER_KEY, max_request_size_mb: mb, pass_through_endpoints: [{ path: "/upload", target: `http://127.0.0.1:${target.port}/in` }] },
});

const MIB = 1024 * 1024;

/** A chat body of about `bytes` bytes (one long user message). */
const chatBody = (bytes: number) => JSON.stringify({ model: "chat-mock", messages: [{ role: "user", content: "x".repeat(bytes) }] });

const chunked = (text: string) =>
  new ReadableStream<Uint8Array>({
    start(c) {
      const bytes = new TextEncoder().encode(text);
      for (let i = 0; i < bytes.length; i += 64 * 1024) c.enqueue(bytes.subarray(i, i + 64 * 1024));
      c.close();
    },
  });

describe("max_request_size_mb", () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway(config(1), { store: {} });
  });
  afterAll(async () => {
    await gw.stop();
    target.stop(true);
  });

  const post = (path: string, body: BodyInit) =>
    fetch(`${gw.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body, duplex: "half" } as RequestInit);

  test("a model call over the limit is a 413 naming it, announced or chunked; one under it is served", async () => {
    for (const body of [chatBody(1.5 * MIB), chunked(chatBody(1.5 * MIB))]) {
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(413);
      expect(((await res.json()) as { error: unknown }).error).toMatchObject({ type: "invalid_request_error", message: expect.stringContaining("(1 MiB)") });
    }
    expect((await post("/v1/chat/completions", chatBody(0.5 * MIB))).status).toBe(200);
    expect((await post("/v1/chat/completions", chunked(chatBody(0.5 * MIB)))).status).toBe(200);
  });

  test("a management body over the limit is refused before it is read", async () => {
    const res = await post("/key/generate", JSON.stringify({ metadata: { note: "x".repeat(1.5 * MIB) } }));
    expect(res.status).toBe(413);
    expect(await res.text()).toContain('"type":"invalid_request_error"');
  });

  test("a chunked body over the limit is a 413 on management and pass-through routes too; the target never gets it", async () => {
    const generate = await post("/key/generate", chunked(JSON.stringify({ metadata: { note: "x".repeat(1.5 * MIB) } })));
    expect(generate.status).toBe(413);
    expect(((await generate.json()) as { error: unknown }).error).toMatchObject({ type: "invalid_request_error", message: expect.stringContaining("(1 MiB)") });
    received.length = 0;
    const upload = await post("/upload", chunked("y".repeat(1.5 * MIB)));
    expect(upload.status).toBe(413);
    expect(((await upload.json()) as { error: unknown }).error).toMatchObject({ type: "invalid_request_error", message: expect.stringContaining("(1 MiB)") });
    expect(received).toEqual([]);
    const small = await post("/upload", chunked("y".repeat(0.5 * MIB)));
    expect(small.status).toBe(200);
    expect(received).toEqual([0.5 * MIB]);
  });

  test("a reload applies a new limit", async () => {
    gw.writeConfig(config(2));
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect((await post("/v1/chat/completions", chatBody(1.5 * MIB))).status).toBe(200);
    const over = await post("/v1/chat/completions", chatBody(2.5 * MIB));
    expect(over.status).toBe(413);
    expect(await over.text()).toContain("(2 MiB)");
  });

  test("a limit above the 64 MiB the gateway takes at most is refused by validation, naming the setting", async () => {
    const path = `${tempDir()}/config.yaml`;
    await Bun.write(path, configText(config(65)));
    const read = await readConfig(path);
    expect(read.ok).toBe(false);
    expect(JSON.stringify(read)).toContain("/general_settings/max_request_size_mb");
  });

  test("a body refused before it is read closes its connection, so a graceful stop does not wait out the drain for it", async () => {
    const proc = await spawnGateway(config(64), { env: { SVC_DRAIN_TIMEOUT: "5" } });
    try {
      // Over the limit (refused on its announced length), and under it but with no valid key.
      for (const [status, authorization, size] of [
        [413, `Bearer ${MASTER_KEY}`, 100 * MIB],
        [401, "Bearer sk-not-a-key", 60 * MIB],
      ] as const) {
        for (let i = 0; i < 3; i++) {
          const res = await fetch(`${proc.url}/v1/chat/completions`, { method: "POST", headers: { authorization, "content-type": "application/json" }, body: new Uint8Array(size) });
          expect(res.status).toBe(status);
          expect(res.headers.get("connection")).toBe("close");
          await res.text();
        }
      }
      // Announced far over Bun's own default limit (128 MiB), which would answer with a bare 413.
      const announced = await rawRequest(proc.url, `POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer ${MASTER_KEY}\r\nContent-Type: application/json\r\nContent-Length: ${4 * 1024 * MIB}\r\n\r\n{}`);
      expect(announced).toStartWith("HTTP/1.1 413");
      expect(announced.toLowerCase()).toContain("connection: close");
      expect(announced).toContain('"type":"invalid_request_error"');
      const served = await fetch(`${proc.url}/v1/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: chatBody(1000) });
      expect(served.status).toBe(200);
      expect(served.headers.get("connection")).not.toBe("close");
      await served.text();
    } finally {
      expect(await proc.stop()).toBe(0);
    }
    expect(proc.output()).toContain("draining in-flight requests");
    expect(proc.output()).not.toContain("drain timeout reached");
  }, 20_000);
});
