// PostgreSQL's connections stop answering while staying open (a hung proxy, a NAT that forgot
// them: at a TCP relay, the open connections pass nothing more; new ones work). The spend writer
// kept waiting on its batch for good and the LISTEN connection delivered nothing more, without a
// word; now an unanswered connection is closed after the answer timeout and the work goes on new ones.
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI from "openai";
import postgres from "postgres";
import { freshDatabase, MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "./harness/gateway.ts";
import { TcpRelay } from "./harness/relay.ts";

const CONFIG = {
  model_list: [{ model_name: "gpt-a", svc_params: { model: "mock/gpt-a" } }],
  general_settings: { master_key: MASTER_KEY },
};
const ANSWER_MS = 1000;

let relayed: TcpRelay;
/** Through the relay. */
let a: TestGateway;
/** Straight to the database, no Redis: it tells `a` of its changes by NOTIFY. */
let b: TestGateway;
let direct: postgres.Sql;
let drop: () => Promise<void>;

beforeAll(async () => {
  const db = await freshDatabase("gw_zombie");
  drop = db.drop;
  relayed = await TcpRelay.start({ host: "127.0.0.1", port: 5432 });
  const url = new URL(db.url);
  url.port = String(relayed.port);
  a = await startTestGateway(CONFIG, { store: { databaseUrl: url.toString(), databaseAnswerTimeoutMs: ANSWER_MS } });
  b = await startTestGateway(CONFIG, { store: { databaseUrl: db.url } });
  await Promise.all([a.host!.services.bus!.subscribed(), b.host!.services.bus!.subscribed()]);
  direct = postgres(db.url, { max: 1, onnotice: () => {} });
}, 60_000);

afterAll(async () => {
  await direct?.end();
  await a?.stop();
  await b?.stop();
  await relayed?.close();
  await drop?.();
});

const newKey = async (gw: TestGateway) => (await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: {} })).body;

async function within<T>(ms: number, probe: () => Promise<T | undefined>): Promise<T | undefined> {
  const until = performance.now() + ms;
  for (;;) {
    const got = await probe();
    if (got !== undefined || performance.now() > until) return got;
    await Bun.sleep(100);
  }
}

test("the spend writer's connections stop answering: calls are answered, and their spend is written on new connections", async () => {
  const { key, token } = await newKey(a);
  const client = new OpenAI({ baseURL: a.baseURL, apiKey: key, maxRetries: 0 });
  await client.chat.completions.create({ model: "gpt-a", messages: [{ role: "user", content: "before" }] });
  await a.host!.spendWriter.flush();

  relayed.stallOpen();
  for (let i = 0; i < 5; i++) {
    const reply = await client.chat.completions.create({ model: "gpt-a", messages: [{ role: "user", content: `during ${i}` }] });
    expect(reply.choices[0]?.message.content).toContain(`during ${i}`);
  }
  const logged = await within(8000, async () => {
    const [row] = await direct<{ n: number }[]>`select count(*)::int as n from spend_logs where api_key = ${token}`;
    return row!.n === 6 ? row!.n : undefined;
  });
  expect(logged).toBe(6);
  expect(a.log.lines.some((l) => l.level === "warn" && l.msg.includes("left a request unanswered"))).toBe(true);
}, 30_000);

test("the listening connection stops answering: a key blocked through another instance is refused here within seconds", async () => {
  const { key } = await newKey(b);
  const call = () =>
    fetch(`${a.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "gpt-a", messages: [{ role: "user", content: "hi" }] }),
    }).then(async (r) => {
      await r.arrayBuffer();
      return r.status;
    });
  expect(await within(3000, async () => ((await call()) === 200 ? 200 : undefined))).toBe(200);

  relayed.stallOpen();
  expect((await requestJson(b, "POST", "/key/block", { body: { key } })).status).toBe(200);
  // The listener is asked something once per answer timeout, and closed one timeout later at most.
  expect(await within(4 * ANSWER_MS + 2000, async () => ((await call()) === 401 ? 401 : undefined))).toBe(401);
}, 30_000);
