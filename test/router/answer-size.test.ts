// An upstream answer is read whole within a bound: one that sends hundreds of megabytes (a broken
// provider, a client's api_base) was read into memory until the process died, failing every
// other call with it. Past 256 MiB the call fails with a 502 naming the bound; an error answer's
// body is read only as far as its message needs.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const MIB = 1024 * 1024;
let mock: MockOpenAI;
let gw: TestGateway;

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: "sk-up" });
  gw = await startTestGateway({
    model_list: [{ model_name: "gpt", svc_params: { model: "openai/gpt-4o-mini", api_base: mock.url, api_key: "sk-up" } }],
    router_settings: { num_retries: 0, allowed_fails: 100 },
    general_settings: { master_key: MASTER_KEY },
  });
});
afterAll(async () => {
  await gw?.stop();
  await mock?.stop();
});

async function call(): Promise<{ status: number; body: { error?: { message: string; code: string }; choices?: unknown[] } }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "gpt", messages: [{ role: "user", content: "hi" }] }),
  });
  return { status: res.status, body: (await res.json()) as never };
}

test("a 300 MiB answer sent chunked is a 502 naming the bound; the next call is answered", async () => {
  mock.fault({ kind: "huge", bytes: 300 * MIB });
  const r = await call();
  expect(r.status).toBe(502);
  expect(r.body.error?.message).toContain("larger than 256 MiB");
  expect((await call()).body.choices).toHaveLength(1);
}, 60_000);

test("a 300 MiB answer whose length is announced is refused before it is read", async () => {
  mock.reset();
  mock.fault({ kind: "huge", bytes: 300 * MIB, announce: true });
  const r = await call();
  expect(r.status).toBe(502);
  expect(r.body.error?.message).toContain("larger than 256 MiB");
  await Bun.sleep(100);
  expect(mock.streamsCancelled).toBe(1);
}, 60_000);

test("a 500 with a 300 MiB body is answered as the upstream's error, from its first MiB", async () => {
  mock.reset();
  mock.fault({ kind: "huge", bytes: 300 * MIB, status: 500 });
  const r = await call();
  expect(r.status).toBe(500);
  expect(r.body.error?.message).toContain("huge");
  await Bun.sleep(100);
  expect(mock.streamsCancelled).toBe(1);
}, 60_000);
