// The embedded store is one connection on a thread of the gateway: while a long statement holds
// it, other work waits its turn. Busy is not down: readiness stays ready and a slow management
// call is answered when the store gets to it, not refused as "unreachable" (it was: a call still
// waiting after 5 s probed the store, the probe queued behind the same statement timed out, and
// the caller got a 503 for a write that then went through).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "./harness/gateway.ts";

let gw: TestGateway;

beforeAll(async () => {
  gw = await startTestGateway(
    { model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" } }], general_settings: { master_key: MASTER_KEY } },
    { store: {} },
  );
}, 180_000);
afterAll(async () => gw?.stop());

test("while a long statement holds the embedded store, readiness says connected and a management write is answered 200, not 503", async () => {
  const db = gw.host!.store.db;
  const started = performance.now();
  // Longer than the management call's 5 s patience plus the probe's 2 s.
  // drizzle sends a query when it is awaited or `then`ed: start it now.
  const hold = db.execute(sql`select pg_sleep(8)`).then(() => undefined);
  await Bun.sleep(200);
  const [ready, created] = await Promise.all([
    fetch(`${gw.url}/health/readiness`, { headers: { authorization: `Bearer ${MASTER_KEY}` } }).then(async (r) => ({ status: r.status, body: (await r.json()) as { db: string; db_detail: string } })),
    requestJson<{ key?: string; error?: unknown }>(gw, "POST", "/key/generate", { body: { key_alias: "made-while-busy" } }),
  ]);
  await hold;
  expect(ready.status).toBe(200);
  expect(ready.body.db).toBe("connected");
  expect(ready.body.db_detail).toContain("busy");
  expect(created.status).toBe(200);
  expect(created.body.key).toStartWith("sk-");
  // It waited for the statement rather than answering early.
  expect(performance.now() - started).toBeGreaterThan(7000);
  const info = await requestJson<{ info: { key_alias: string } }>(gw, "GET", `/key/info?key=${created.body.key}`);
  expect(info.body.info.key_alias).toBe("made-while-busy");
}, 60_000);

test("a closed embedded store is reported down", async () => {
  const store = gw.host!.store;
  const before = await store.ping();
  expect(before.ok).toBe(true);
  await store.close();
  const after = await store.ping();
  expect(after.ok).toBe(false);
  expect(after.detail).toContain("closed");
});
