// The OpenAI-compatible adapter's upstream request: the client's own bytes are forwarded when the
// upstream body would be identical, and rebuilt (model renamed, gateway fields removed, usage asked
// for on streams) whenever it would not.
import { describe, expect, test } from "bun:test";
import type { ChatRequest, Deployment, EmbeddingsRequest } from "../../core/contract.ts";
import { openAIChat, openAIEmbeddings } from "../../providers/openai-compatible/adapter.ts";

const deployment = (upstreamModel: string): Deployment => ({
  id: "d1",
  modelName: "public-name",
  provider: "openai",
  upstreamModel,
  apiBase: "https://upstream.example/v1",
  apiKey: "sk-upstream",
  options: {},
  info: {},
});
const chat = openAIChat();

describe("OpenAI-compatible upstream body", () => {
  const raw = '{ "model": "gpt-x",\n  "messages": [{"role": "user", "content": "hi"}] }';
  const req = JSON.parse(raw) as ChatRequest;

  test("unchanged requests go upstream byte for byte", () => {
    expect(chat.request(req, deployment("gpt-x"), raw).body).toBe(raw);
  });

  test("a different upstream model name rebuilds the body with it", () => {
    const body = JSON.parse(chat.request(req, deployment("gpt-x-2024"), raw).body!);
    expect(body.model).toBe("gpt-x-2024");
    expect(body.messages).toEqual(req.messages);
  });

  test("gateway-only fields are never forwarded", () => {
    const withGatewayFields = { ...req, fallbacks: ["other"], num_retries: 2, metadata: { tag: "a" } } as ChatRequest;
    const body = JSON.parse(chat.request(withGatewayFields, deployment("gpt-x"), JSON.stringify(withGatewayFields)).body!);
    expect(Object.keys(body).sort()).toEqual(["messages", "model"]);
  });

  test("a stream asks upstream for usage unless the client already did", () => {
    const stream = { ...req, stream: true } as ChatRequest;
    const rebuilt = JSON.parse(chat.request(stream, deployment("gpt-x"), JSON.stringify(stream)).body!);
    expect(rebuilt.stream_options).toEqual({ include_usage: true });
    const asked = { ...req, stream: true, stream_options: { include_usage: true } } as ChatRequest;
    const askedRaw = JSON.stringify(asked);
    expect(chat.request(asked, deployment("gpt-x"), askedRaw).body).toBe(askedRaw);
  });

  test("a stream without stream_options gets include_usage spliced into the client's own bytes", () => {
    const streamRaw = ' \n{ "model": "gpt-x", "stream": true,\n  "messages": [{"role": "user", "content": "hi {"}] }';
    const stream = JSON.parse(streamRaw) as ChatRequest;
    const body = chat.request(stream, deployment("gpt-x"), streamRaw).body!;
    expect(body).toBe(`{"stream_options":{"include_usage":true}, "model": "gpt-x", "stream": true,\n  "messages": [{"role": "user", "content": "hi {"}] }`);
    expect(JSON.parse(body)).toEqual({ ...stream, stream_options: { include_usage: true } });
    // Options the client set that leave usage out are rebuilt with it, keeping the rest.
    const partial = { ...stream, stream_options: { include_usage: false, include_obfuscation: false } } as ChatRequest;
    expect(JSON.parse(chat.request(partial, deployment("gpt-x"), JSON.stringify(partial)).body!).stream_options).toEqual({ include_usage: true, include_obfuscation: false });
  });

  test("embeddings: the body's gateway parameters (api_key, api_base, timeout) stay in the gateway", () => {
    const e = { model: "emb", input: "x", api_key: "sk-client", api_base: "http://evil.example", timeout: 5 } as EmbeddingsRequest;
    const body = JSON.parse(openAIEmbeddings().request(e, deployment("emb"), JSON.stringify(e)).body!);
    expect(body).toEqual({ model: "emb", input: "x" });
  });

  test("the deployment's key, not the client's, authenticates upstream", () => {
    expect(chat.request(req, deployment("gpt-x"), raw).headers.authorization).toBe("Bearer sk-upstream");
  });
});
