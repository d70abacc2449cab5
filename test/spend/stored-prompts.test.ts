// store_prompts_in_spend_logs, on both stores: with it on, a call's log row shows what was asked
// (`messages`) and the answer the client got (`response`), a stream assembled into one
// chat.completion; embeddings keep their input but not the vectors; cache hits keep both; off (the
// default, or after a reload) neither is stored.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

const config = (store: boolean) => ({
  model_list: [
    { model_name: "m", svc_params: { model: "mock/m" } },
    { model_name: "e", svc_params: { model: "mock/text-embedding-3-small" } },
  ],
  general_settings: { master_key: MASTER_KEY, store_prompts_in_spend_logs: store },
});

interface ApiLog {
  request_id: string;
  messages: unknown;
  response: Record<string, unknown>;
  metadata: Record<string, unknown>;
}

for (const backend of BACKENDS) {
  describe(`stored prompts (${backend})`, () => {
    let gw: TestGateway;
    let client: OpenAI;
    beforeAll(async () => {
      gw = await startBackendGateway(backend, config(true), { dbPrefix: "gw_prompts" });
      client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL });
    });
    afterAll(async () => gw?.stop());

    async function logOf(requestId: string): Promise<ApiLog> {
      await gw.host!.spendWriter.flush();
      const r = await requestJson<ApiLog[]>(gw, "GET", `/spend/logs?request_id=${encodeURIComponent(requestId)}&summarize=false`);
      expect(r.status).toBe(200);
      expect(r.body.length).toBe(1);
      return r.body[0]!;
    }

    const messages = [
      { role: "system" as const, content: "Be brief." },
      { role: "user" as const, content: "Say hello to the log." },
    ];

    test("a call's row holds its messages and the answer the client got", async () => {
      const answer = await client.chat.completions.create({ model: "m", messages });
      const row = await logOf(answer.id);
      expect(row.messages).toEqual(messages);
      expect((row.response.choices as { message: { content: string } }[])[0]!.message.content).toBe(answer.choices[0]!.message.content!);
      expect(row.response.id).toBe(answer.id);
      // Lifted out of the metadata, not shown twice.
      expect(row.metadata.messages).toBeUndefined();
    });

    test("a stream's row holds the streamed text as one chat.completion", async () => {
      const stream = await client.chat.completions.create({ model: "m", messages, stream: true });
      let text = "";
      let id = "";
      for await (const chunk of stream) {
        id ||= chunk.id;
        text += chunk.choices[0]?.delta?.content ?? "";
      }
      expect(text.length).toBeGreaterThan(0);
      const row = await logOf(id);
      expect(row.response).toMatchObject({ id, object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content: text }, finish_reason: "stop" }] });
    });

    test("embeddings keep their input, not the vectors", async () => {
      const { response } = await client.embeddings.create({ model: "e", input: ["first text", "second text"] }).withResponse();
      const callId = response.headers.get("x-svc-call-id")!;
      const row = await logOf(callId);
      expect(row.messages).toEqual(["first text", "second text"]);
      expect(row.response).toEqual({});
    });

    test("a cache hit's row holds them too", async () => {
      const ask = () =>
        fetch(`${gw.baseURL}/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          // Its own prompt per backend: the in-memory cache is one per process, shared by its gateways.
          body: JSON.stringify({ model: "m", messages: [{ role: "user", content: `Cache me (${backend}).` }], caching: true }),
        });
      const first = (await (await ask()).json()) as { choices: { message: { content: string } }[] };
      const second = await ask();
      expect(second.headers.get("x-svc-cache-hit")).toBe("true");
      const replayed = (await second.json()) as { id: string };
      // The hit's row is found by its call id (its request_id is the replayed answer's id + _cache_hit<ms>).
      await gw.host!.spendWriter.flush();
      const callId = second.headers.get("x-svc-call-id")!;
      const found = await requestJson<(ApiLog & { cache_hit: boolean; request_id: string; call_id: string })[]>(gw, "GET", "/spend/logs?summarize=false");
      const row = found.body.find((r) => r.call_id === callId)!;
      expect(row.cache_hit).toBe(true);
      expect(row.request_id).toStartWith(`${replayed.id}_cache_hit`);
      expect(row.messages).toEqual([{ role: "user", content: `Cache me (${backend}).` }]);
      expect((row.response.choices as { message: { content: string } }[])[0]!.message.content).toBe(first.choices[0]!.message.content);
    });

    test("after a reload that turns it off, rows hold neither", async () => {
      gw.writeConfig(config(false));
      expect((await gw.live.reload("test")).ok).toBe(true);
      const answer = await client.chat.completions.create({ model: "m", messages });
      const row = await logOf(answer.id);
      expect(row.messages).toEqual({});
      expect(row.response).toEqual({});
    });
  });
}
