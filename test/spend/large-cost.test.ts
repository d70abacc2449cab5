// A single call costing more than 2^53 pico-dollars (about $9,007): its cost is exact to the
// pico-dollar everywhere a user reads it (the cost header, its spend-log row, /spend/logs and its
// daily summary, the key's spend, the budget that refuses the next call), not the nearest double,
// and its budget alerts are sent, with the ledger in memory or in Redis; one of more than 2^63
// pico-dollars (a bigint) is logged and charged too.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI, { type APIError } from "openai";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { failure } from "../harness/util.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

const UPSTREAM_KEY = "sk-upstream-large-cost";
const PROMPT_TOKENS = 199_999;
// Within the README's bound of $1 a token; 199,999 of them cost $123,456.171728400538272, rounded to
// $123,456.171728400538: an amount of pico-dollars a double cannot hold (it is read as …400544).
const PRICE = "0.617283945061728";
const ONE_CALL = "123456.171728400538";
const TWO_CALLS = "246912.343456801076";
// A billion of them: $617,283,945.061728, more pico-dollars than a bigint holds (2^63, about $9.2 million).
const HUGE_PROMPT_TOKENS = 1_000_000_000;
const HUGE_CALL = "617283945.061728";

/** The amounts `field` takes in a JSON text, as written (JSON.parse would round them to doubles). */
const amounts = (text: string, field: string) => [...text.matchAll(new RegExp(`"${field}":(-?[0-9.eE+-]+)`, "g"))].map((m) => m[1]);

const REDIS_URL = TEST_REDIS_URL;
// The embedded store writes rows with COPY, PostgreSQL with one statement; the budget ledger is in
// memory, or in Redis (which counts in its own Lua).
const VARIANTS = [...BACKENDS.map((backend) => ({ backend, redis: false })), { backend: "postgres" as const, redis: true }];

for (const { backend, redis } of VARIANTS) describe(`a call that costs more than $9,007 (${backend}${redis ? ", Redis ledger" : ""})`, () => {
  let mock: MockOpenAI;
  let gw: TestGateway;
  let client: OpenAI;
  let token: string;

  beforeAll(async () => {
    mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
    gw = await startBackendGateway(
      backend,
      `model_list:
  - model_name: pricey
    svc_params: { model: openai/gpt-pricey, api_base: "${mock.url}", api_key: ${UPSTREAM_KEY} }
    model_info: { input_cost_per_token: ${PRICE}, output_cost_per_token: 0 }
general_settings: { master_key: ${MASTER_KEY} }
`,
      { dbPrefix: "gw_largecost", redisUrl: redis ? REDIS_URL : undefined },
    );
    // Raw JSON: the max budget is two calls' cost to the pico-dollar, more digits than a double holds.
    const res = await fetch(`${gw.url}/key/generate`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: `{"key_alias": "big-spender", "soft_budget": 1000, "max_budget": ${TWO_CALLS}}`,
    });
    const created = { status: res.status, body: (await res.json()) as { key: string; token: string } };
    expect(created.status).toBe(200);
    token = created.body.token;
    client = new OpenAI({ baseURL: gw.baseURL, apiKey: created.body.key, maxRetries: 0 });
    // The embedded store's first start in a run makes its template folder (tens of seconds on a busy machine).
  }, 120_000);
  afterAll(async () => {
    await gw?.stop();
    await mock?.stop();
  });

  const call = (promptTokens = PROMPT_TOKENS, caller = client) => {
    mock.fault({ kind: "scripted", answer: { choices: [{ content: "ok", finishReason: "stop" }], usage: { prompt_tokens: promptTokens, completion_tokens: 1, total_tokens: promptTokens + 1 } } });
    return caller.chat.completions.create({ model: "pricey", messages: [{ role: "user", content: "hi" }] }).withResponse();
  };

  test("the cost header, the spend log, /spend/logs and the key's spend are exact to the pico-dollar", async () => {
    const first = await call();
    const second = await call();
    expect([first.response.headers.get("x-svc-response-cost"), second.response.headers.get("x-svc-response-cost")]).toEqual([ONE_CALL, ONE_CALL]);
    await gw.host!.spendWriter.flush();

    for (const { data } of [first, second]) {
      const log = await requestJson(gw, "GET", `/spend/logs?request_id=${data.id}&summarize=false`);
      expect(amounts(log.text, "spend")).toEqual([ONE_CALL]);
    }
    const day = new Date().toISOString().slice(0, 10);
    const v2 = await requestJson(gw, "GET", `/spend/logs/v2?api_key=${token}&start_date=${day}&end_date=${day}`);
    expect(amounts(v2.text, "spend")).toEqual([ONE_CALL, ONE_CALL]);

    const summary = await requestJson(gw, "GET", `/spend/logs?start_date=${day}&end_date=${day}`);
    expect(amounts(summary.text, "spend")).toEqual([TWO_CALLS]);
    expect(summary.text).toContain(`"${token}":${TWO_CALLS}`);

    const info = await requestJson(gw, "GET", `/key/info?key=${token}`);
    expect(amounts(info.text, "spend")).toEqual([TWO_CALLS]);
    expect(amounts(info.text, "max_budget")).toEqual([TWO_CALLS]);

    // Spent to the last pico-dollar of its budget: the next call is refused, with that spend.
    const refused = await failure(call());
    expect((refused as APIError).status).toBe(400);
    expect((refused as APIError).message).toContain(`spend $${TWO_CALLS}, max budget $${TWO_CALLS}.`);

    // The first call crossed the soft budget ($1,000), the second reached the budget: one alert each.
    for (let i = 0; i < 100 && gw.host!.alerts.sent.length < 2; i++) await Bun.sleep(20);
    const sent = gw.host!.alerts.sent.map((a) => ({ event: a.event, token: a.token, spend: a.spend }));
    expect(sent.sort((a, b) => String(a.event).localeCompare(String(b.event)))).toEqual([
      { event: "budget_crossed", token, spend: Number(TWO_CALLS) },
      { event: "soft_budget_crossed", token, spend: Number(ONE_CALL) },
    ]);
    expect(gw.log.lines.filter((l) => l.level === "error")).toEqual([]);
  });

  test("a call of more than $9.2 million (2^63 pico-dollars) is logged and charged to the last digit, not set aside", async () => {
    // The refused call above left its scripted answer queued.
    mock.clearFaults();
    const created = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { key_alias: "bigger-spender" } });
    const { data, response } = await call(HUGE_PROMPT_TOKENS, new OpenAI({ baseURL: gw.baseURL, apiKey: created.body.key, maxRetries: 0 }));
    expect(response.headers.get("x-svc-response-cost")).toBe(HUGE_CALL);
    await gw.host!.spendWriter.flush();
    const log = await requestJson(gw, "GET", `/spend/logs?request_id=${data.id}&summarize=false`);
    expect(amounts(log.text, "spend")).toEqual([HUGE_CALL]);
    const info = await requestJson(gw, "GET", `/key/info?key=${created.body.token}`);
    expect(amounts(info.text, "spend")).toEqual([HUGE_CALL]);
    expect(gw.log.lines.filter((l) => l.level === "error")).toEqual([]);
  });
});
