// Model names and deployment ids beyond Latin-1 (模型), configured or stored through /model/new:
// served through the openai SDK like any other, listed under their own name, and echoed
// percent-encoded in x-svc-model-group / x-svc-model-id, as a wildcard call's name is. Control
// characters are still refused.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI, { APIError } from "openai";
import { freshDatabase, MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { failure } from "../harness/util.ts";

const NAME = "模型";
const ID = "部署-一";
const DOWN = "坏-模型";

let gw: TestGateway;
let client: OpenAI;
let drop: () => Promise<void>;

beforeAll(async () => {
  const db = await freshDatabase("gw_names");
  drop = db.drop;
  gw = await startTestGateway(
    {
      model_list: [
        { model_name: NAME, svc_params: { model: "mock/chat" }, model_info: { id: ID } },
        // Nothing listens on port 9: every call fails, and the error answer names the deployment too.
        { model_name: DOWN, svc_params: { model: "openai/gpt-x", api_base: "http://127.0.0.1:9/v1", api_key: "sk-up" }, model_info: { id: `${ID}-down` } },
      ],
      router_settings: { num_retries: 0 },
      general_settings: { master_key: MASTER_KEY },
    },
    { store: { databaseUrl: db.url } },
  );
  client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
});
afterAll(async () => {
  await gw.stop();
  await drop();
});

const encoded = (h: Headers) => ({ group: h.get("x-svc-model-group"), id: h.get("x-svc-model-id") });

describe("a configured model_name and model_info.id beyond Latin-1", () => {
  test("a chat call is served, the name and id percent-encoded in the headers", async () => {
    const { data, response } = await client.chat.completions.create({ model: NAME, messages: [{ role: "user", content: "hi" }] }).withResponse();
    expect(data.choices[0]?.message.content).toContain("mock response");
    expect(data.model).toBe("chat");
    expect(encoded(response.headers)).toEqual({ group: encodeURIComponent(NAME), id: encodeURIComponent(ID) });
    expect(decodeURIComponent(response.headers.get("x-svc-model-group") ?? "")).toBe(NAME);
  });

  test("a stream carries the same headers", async () => {
    const { data, response } = await client.chat.completions.create({ model: NAME, stream: true, messages: [{ role: "user", content: "hi" }] }).withResponse();
    let text = "";
    for await (const chunk of data) text += chunk.choices[0]?.delta.content ?? "";
    expect(text).toContain("mock response");
    expect(encoded(response.headers)).toEqual({ group: encodeURIComponent(NAME), id: encodeURIComponent(ID) });
  });

  test("/v1/models lists it under its own name and retrieves it", async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id).sort()).toEqual([DOWN, NAME].sort());
    expect((await client.models.retrieve(NAME)).id).toBe(NAME);
  });

  test("a failed call's error answer carries the encoded id, not a 500 for an invalid header", async () => {
    const err = await failure(client.chat.completions.create({ model: DOWN, messages: [{ role: "user", content: "hi" }] }));
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).status).toBe(503);
    expect((err as APIError).headers?.get("x-svc-model-id")).toBe(encodeURIComponent(`${ID}-down`));
  });
});

describe("/model/new", () => {
  const post = (body: unknown) =>
    fetch(`${gw.url}/model/new`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify(body) });

  test("stores a model named beyond Latin-1, which then serves with its name encoded", async () => {
    const res = await post({ model_name: "存储-模型", svc_params: { model: "mock/chat" }, model_info: { id: "存储-id" } });
    expect(res.status).toBe(200);
    const { response } = await client.chat.completions.create({ model: "存储-模型", messages: [{ role: "user", content: "hi" }] }).withResponse();
    expect(encoded(response.headers)).toEqual({ group: encodeURIComponent("存储-模型"), id: encodeURIComponent("存储-id") });
  });

  test("refuses a name with a control character (422 naming the field)", async () => {
    const res = await post({ model_name: "line\nbreak", svc_params: { model: "mock/chat" } });
    expect(res.status).toBe(422);
    expect(((await res.json()) as { error: { param: string } }).error.param).toBe("model_name");
  });
});
