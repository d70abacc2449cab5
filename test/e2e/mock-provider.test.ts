import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";

let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  gw = await startTestGateway({
    model_list: [
      { model_name: "chat-mock", svc_params: { model: "mock/chat" }, model_info: { id: "mock-chat-1" } },
      { model_name: "fixed-mock", svc_params: { model: "mock/fixed", mock_response: "Fixed answer." } },
      { model_name: "embed-mock", svc_params: { model: "mock/embed" }, model_info: { mode: "embedding" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
});
afterAll(() => gw.stop());

describe("built-in mock provider (works with no network)", () => {
  test("chat answers deterministically with usage and the deployment id header", async () => {
    const { data, response } = await client.chat.completions
      .create({ model: "chat-mock", messages: [{ role: "user", content: "ping pong" }] })
      .withResponse();
    expect(data.choices[0]?.message.content).toBe("This is a mock response to: ping pong");
    expect(data.usage?.completion_tokens).toBe(8);
    expect(data.usage?.total_tokens).toBe((data.usage?.prompt_tokens ?? 0) + 8);
    expect(response.headers.get("x-svc-model-id")).toBe("mock-chat-1");
  });

  test("svc_params.mock_response fixes the reply; max_tokens truncates with finish_reason length", async () => {
    const fixed = await client.chat.completions.create({ model: "fixed-mock", messages: [{ role: "user", content: "x" }] });
    expect(fixed.choices[0]?.message.content).toBe("Fixed answer.");
    const cut = await client.chat.completions.create({ model: "chat-mock", max_tokens: 2, messages: [{ role: "user", content: "x" }] });
    expect(cut.choices[0]?.finish_reason).toBe("length");
    expect(cut.usage?.completion_tokens).toBe(2);
  });

  test("streaming yields incremental chunks and a usage chunk when asked", async () => {
    const stream = await client.chat.completions.create({
      model: "chat-mock",
      stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: "user", content: "stream me" }],
    });
    let text = "";
    let chunks = 0;
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      chunks++;
      text += chunk.choices[0]?.delta.content ?? "";
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe("This is a mock response to: stream me");
    expect(chunks).toBeGreaterThan(5);
    expect(usage?.completion_tokens).toBe(8);
  });

  test("n asks for n choices (indexes 0..n-1, each the reply), their answer tokens counted for each; streamed too; past OpenAI's 128 a 400", async () => {
    const messages = [{ role: "user" as const, content: "ping pong" }];
    const reply = "This is a mock response to: ping pong";
    const one = await client.chat.completions.create({ model: "chat-mock", messages });
    const three = await client.chat.completions.create({ model: "chat-mock", n: 3, messages });
    expect(three.choices.map((c) => [c.index, c.message.content, c.finish_reason])).toEqual([0, 1, 2].map((i) => [i, reply, "stop"]));
    expect(three.usage).toMatchObject({ prompt_tokens: one.usage!.prompt_tokens, completion_tokens: 3 * 8, total_tokens: one.usage!.prompt_tokens + 3 * 8 });

    const stream = await client.chat.completions.create({ model: "chat-mock", n: 2, stream: true, stream_options: { include_usage: true }, messages });
    const texts = ["", ""];
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      for (const c of chunk.choices) texts[c.index] += c.delta.content ?? "";
      if (chunk.usage) usage = chunk.usage;
    }
    expect(texts).toEqual([reply, reply]);
    expect(usage?.completion_tokens).toBe(2 * 8);

    const completions = await client.completions.create({ model: "chat-mock", n: 2, prompt: "ping pong" });
    expect(completions.choices.map((c) => [c.index, c.text])).toEqual([0, 1].map((i) => [i, reply]));
    expect(completions.usage?.completion_tokens).toBe(2 * 8);

    const tooMany = await fetch(`${gw.baseURL}/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify({ model: "chat-mock", n: 129, messages }) });
    expect(tooMany.status).toBe(400);
    expect(((await tooMany.json()) as { error: { message: string } }).error.message).toContain("'n'");
  });

  test("embeddings are deterministic and decoded by the SDK", async () => {
    const a = await client.embeddings.create({ model: "embed-mock", input: ["same", "other"] });
    const b = await client.embeddings.create({ model: "embed-mock", input: "same" });
    expect(a.data).toHaveLength(2);
    expect(a.data[0]?.embedding).toHaveLength(8);
    expect(b.data[0]?.embedding[0]).toBeCloseTo(a.data[0]!.embedding[0]!, 6);
    expect(a.data[1]?.embedding[0]).not.toBeCloseTo(a.data[0]!.embedding[0]!, 6);
  });

  test("token ids embed as OpenAI reads them: number[] is one text, number[][] one per list, each counted by its length", async () => {
    const one = await client.embeddings.create({ model: "embed-mock", input: [1212, 318, 257, 1332] });
    expect(one.data.map((d) => d.index)).toEqual([0]);
    expect(one.usage.prompt_tokens).toBe(4);
    const two = await client.embeddings.create({ model: "embed-mock", input: [[1212, 318], [257]] });
    expect(two.data.map((d) => d.index)).toEqual([0, 1]);
    expect(two.usage.prompt_tokens).toBe(3);
  });

  test("a body that is not UTF-8 is refused with a 400 naming the encoding, not answered with replacement characters", async () => {
    // "café" in Latin-1: the é is the lone byte 0xE9.
    const latin1 = new Uint8Array([...new TextEncoder().encode('{"model":"chat-mock","messages":[{"role":"user","content":"caf'), 0xe9, ...new TextEncoder().encode('"}]}')]);
    for (const path of ["/v1/chat/completions", "/chat/completions", "/utils/token_counter"]) {
      const res = await fetch(gw.url + path, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: latin1 });
      expect(res.status).toBe(400);
      const { error } = (await res.json()) as { error: { message: string; type: string } };
      expect(error.message).toContain("not valid UTF-8");
      expect(error.type).toBe("invalid_request_error");
    }
    const utf8 = await client.chat.completions.create({ model: "chat-mock", messages: [{ role: "user", content: "café" }] });
    expect(utf8.choices[0]?.message.content).toBe("This is a mock response to: café");
  });
});
