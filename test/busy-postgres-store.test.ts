// A busy PostgreSQL store is not a lost one, and a management write is never answered with a
// failure while it may still be applied. The probe went through the gateway's pool: with every
// connection held (16 parallel megabyte team lists), it timed out, readiness said disconnected,
// and a write still waiting after 5 s was answered 503 "store is unreachable", then applied once
// its turn came (a key stored whose plaintext nobody got). Through a TCP relay the test can stall
// or cut.
import { expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { requestJson } from "./harness/gateway.ts";
import { readiness as readinessOf, relayedStoreForFile } from "./harness/relayed-store.ts";

const store = relayedStoreForFile("gw_busy");

const readiness = () => readinessOf(store.gw);

const keysWithAlias = async (alias: string) => (await store.direct<{ n: number }[]>`select count(*)::int as n from virtual_keys where key_alias = ${alias}`)[0]!.n;

test("every pool connection busy: readiness says connected and a write waiting its turn is answered 200", async () => {
  // The pool's 10 connections held for longer than a management call's 5 s plus the probe's 2 s.
  // drizzle sends a query when it is awaited or `then`ed: start them now.
  const db = store.gw.host!.store.db;
  const hold = Promise.all(Array.from({ length: 10 }, () => db.execute(sql`select pg_sleep(9)`).then(() => undefined)));
  await Bun.sleep(300);
  const started = performance.now();
  const [ready, created] = await Promise.all([
    readiness(),
    requestJson<{ key?: string; error?: unknown }>(store.gw, "POST", "/key/generate", { body: { key_alias: "made-while-busy" } }),
  ]);
  await hold;
  expect(ready).toEqual({ status: 200, db: "connected" });
  expect(created.status).toBe(200);
  expect(created.body.key).toStartWith("sk-");
  // It waited for its turn rather than answering early.
  expect(performance.now() - started).toBeGreaterThan(7000);
  expect(await keysWithAlias("made-while-busy")).toBe(1);
}, 30_000);

test("the event loop held for longer than the probe's patience: the store still answers the probe", async () => {
  // Other calls parsing and serializing megabytes hold the gateway's one thread for seconds; the
  // probe's answer arrives meanwhile and is read once the thread is free.
  const probe = store.gw.host!.store.ping();
  const until = performance.now() + 3000;
  while (performance.now() < until) {
    // The thread held, as by a large JSON.stringify.
  }
  expect(await probe).toMatchObject({ ok: true });
});

test("nothing passes to or from the database for a while: a read is answered 503, a write with its outcome once it comes", async () => {
  // Longer than the 5 s after which a management read checks the store, then all of it passes.
  store.relay.stall();
  try {
    const started = performance.now();
    const write = requestJson<{ key?: string }>(store.gw, "POST", "/key/generate", { body: { key_alias: "made-while-stalled" } });
    const read = await requestJson<{ error: { message: string } }>(store.gw, "GET", "/key/list");
    expect(read.status).toBe(503);
    expect(read.body.error.message).toContain("store is unreachable");
    expect(performance.now() - started).toBeLessThan(9000);
    await Bun.sleep(Math.max(0, 9000 - (performance.now() - started)));
    store.relay.resume();
    const created = await write;
    expect(created.status).toBe(200);
    expect(created.body.key).toStartWith("sk-");
    expect(await keysWithAlias("made-while-stalled")).toBe(1);
  } finally {
    store.relay.resume();
  }
}, 30_000);

test("connections accepted and closed at once (a proxy whose database is down): a write is answered 503 at once, and is not applied once the database is back", async () => {
  // postgres.js took a session closed before it was ready for a retry, and retried for good,
  // holding the write: it was answered 503 after 7 s, then applied once the database was back.
  store.relay.cut();
  const started = performance.now();
  const refused = await requestJson<{ error: { message: string } }>(store.gw, "POST", "/key/generate", { body: { key_alias: "made-while-cut" } });
  expect(refused.status).toBe(503);
  expect(refused.body.error.message).toContain("store is unreachable");
  expect(performance.now() - started).toBeLessThan(4000);
  store.relay.restore();
  for (let i = 0; i < 50 && (await readiness()).status !== 200; i++) await Bun.sleep(100);
  expect(await readiness()).toEqual({ status: 200, db: "connected" });
  await Bun.sleep(1000);
  expect(await keysWithAlias("made-while-cut")).toBe(0);
  const again = await requestJson<{ key: string }>(store.gw, "POST", "/key/generate", { body: { key_alias: "made-after-cut" } });
  expect(again.status).toBe(200);
}, 30_000);
