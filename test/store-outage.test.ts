// The database goes away under a running gateway (cut at a TCP relay in front of PostgreSQL):
// model calls keep working from the in-process identity cache, readiness says the store is down,
// management calls fail with a clear 503 instead of a 500, and everything works again once the
// database is back. The public probes tell an orchestrator what it needs, and no more: the
// database's version and its driver's errors are for admins only.
import { expect, test } from "bun:test";
import OpenAI from "openai";
import { MASTER_KEY, requestJson } from "./harness/gateway.ts";
import { readiness as readinessOf, relayedStoreForFile } from "./harness/relayed-store.ts";
import { waitFor } from "./harness/util.ts";

const store = relayedStoreForFile("gw_outage");

const readiness = () => readinessOf(store.gw);

test("with the database gone, keys keep working, readiness is 503 and management calls say why; all recovers", async () => {
  const created = await requestJson<{ key: string }>(store.gw, "POST", "/key/generate", { body: { models: ["gpt-a"] } });
  expect(created.status).toBe(200);
  const client = new OpenAI({ baseURL: store.gw.baseURL, apiKey: created.body.key, maxRetries: 0 });
  expect(await readiness()).toEqual({ status: 200, db: "connected" });

  store.relay.cut();
  const reply = await client.chat.completions.create({ model: "gpt-a", messages: [{ role: "user", content: "still there?" }] });
  expect(reply.choices[0]?.message.content).toContain("still there?");
  expect(await readiness()).toEqual({ status: 503, db: "disconnected" });

  const refused = await requestJson<{ error: { message: string; type: string; code: string } }>(store.gw, "POST", "/key/generate", { body: {} });
  expect(refused.status).toBe(503);
  expect(refused.body.error.code).toBe("503");
  expect(refused.body.error.message).toContain("store is unreachable");

  store.relay.restore();
  let ready = await readiness();
  for (let i = 0; i < 50 && ready.status !== 200; i++) {
    await Bun.sleep(100);
    ready = await readiness();
  }
  expect(ready).toEqual({ status: 200, db: "connected" });
  const again = await requestJson<{ key: string }>(store.gw, "POST", "/key/generate", { body: {} });
  expect(again.status).toBe(200);
  expect(again.body.key).toStartWith("sk-");
}, 30_000);

test("liveness is the JSON string LiteLLM answers; readiness shows the database's version and its driver's errors to admins only", async () => {
  const live = await fetch(`${store.gw.url}/health/liveliness`);
  expect(live.headers.get("content-type")).toStartWith("application/json");
  expect(await live.json()).toBe("I'm alive!");

  const user = (await requestJson<{ key: string }>(store.gw, "POST", "/key/generate", { body: {} })).body.key;
  const ready = async (key?: string) => {
    const res = await fetch(`${store.gw.url}/health/readiness`, { headers: key ? { authorization: `Bearer ${key}` } : {} });
    return { status: res.status, body: (await res.json()) as { db: string; db_detail?: string } };
  };
  for (const key of [undefined, user, "sk-not-a-key"]) {
    const { status, body } = await ready(key);
    expect({ status, db: body.db, detail: body.db_detail }).toEqual({ status: 200, db: "connected", detail: undefined });
  }
  expect((await ready(MASTER_KEY)).body.db_detail).toMatch(/^PostgreSQL \d+/);

  store.relay.cut();
  const down = await ready();
  expect({ status: down.status, db: down.body.db, detail: down.body.db_detail }).toEqual({ status: 503, db: "disconnected", detail: undefined });
  expect((await ready(MASTER_KEY)).body.db_detail?.length).toBeGreaterThan(0);
  store.relay.restore();
  for (let i = 0; i < 50 && (await ready()).status !== 200; i++) await Bun.sleep(100);
  expect((await ready()).status).toBe(200);
}, 30_000);

test("the database refuses connections for a while (restarting, host down): once it listens again, management calls work and the spend of calls made meanwhile is written", async () => {
  const created = await requestJson<{ key: string; token: string }>(store.gw, "POST", "/key/generate", { body: {} });
  const client = new OpenAI({ baseURL: store.gw.baseURL, apiKey: created.body.key, maxRetries: 0 });
  await client.chat.completions.create({ model: "gpt-a", messages: [{ role: "user", content: "before" }] });
  await store.gw.host!.spendWriter.flush();

  await store.relay.refuse();
  // More failed connects than the pool has connections (10): each used to be lost for good.
  const refused = await Promise.all(Array.from({ length: 12 }, () => requestJson(store.gw, "POST", "/key/generate", { body: {} })));
  expect(refused.map((r) => r.status)).toEqual(Array(12).fill(503));
  for (let i = 0; i < 3; i++) {
    const reply = await client.chat.completions.create({ model: "gpt-a", messages: [{ role: "user", content: `during ${i}` }] });
    expect(reply.choices[0]?.message.content).toContain(`during ${i}`);
  }
  expect(await readiness()).toEqual({ status: 503, db: "disconnected" });

  await store.relay.listenAgain();
  // Within 2 s when run alone (reconnects wait at most 2 s); once, in a full parallel run, it took
  // more than 10 s: not reproduced, so the bound is wide. Without the fix it never comes back.
  expect(await waitFor(readiness, (r) => r.status === 200, "readiness once the database listens again", 25_000)).toEqual({ status: 200, db: "connected" });
  const again = await requestJson<{ key: string }>(store.gw, "POST", "/key/generate", { body: {} });
  expect(again.status).toBe(200);
  // The writer retries on its own, backing off up to 5 s.
  const written = async () => (await store.direct<{ n: number }[]>`select count(*)::int as n from spend_logs where api_key = ${created.body.token}`)[0]!.n;
  expect(await waitFor(written, (n) => n === 4, "the spend rows", 10_000)).toBe(4);
}, 60_000);
