// The key's last_active, written every few seconds for the keys used since, while those keys'
// calls are charged, on PostgreSQL: both write many virtual_keys rows in one statement, and must
// take them in one order, or each holds a row the other waits for and PostgreSQL fails one after a
// second (a "last_active write failed" or "spend writes failing" warning, and a second's stall).
import { expect, test } from "bun:test";
import { hashKey } from "../../core/identity/keys.ts";
import type { IdentityCache } from "../../core/identity/cache.ts";
import { LastActiveWriter } from "../../core/identity/last-active.ts";
import { memoryLogger, requestJson, startBackendGateway } from "../harness/gateway.ts";
import { chatStatus, PRICED_CHAT } from "../harness/traffic.ts";

const RUN_MS = 4_000;

test("last_active writes while the keys' calls are charged: neither fails", async () => {
  const gw = await startBackendGateway("postgres", PRICED_CHAT, { spend: { intervalMs: 2, batchSize: 32 } });
  try {
    const keys: string[] = [];
    for (let i = 0; i < 80; i++) keys.push((await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: {} })).body.key);
    const tokens = keys.map(hashKey);
    // The gateway's writer runs every 5 s; this one, on the same store, writes every key each time.
    const touched = new Set<string>();
    const log = memoryLogger();
    const lastActive = new LastActiveWriter(gw.host!.store.db, { touched, keys: new Map() } as unknown as IdentityCache, log);
    const end = Date.now() + RUN_MS;
    let calls = 0;
    const failures: string[] = [];
    const traffic = async () => {
      while (Date.now() < end) {
        const key = keys[Math.floor(Math.random() * keys.length)]!;
        const status = await chatStatus(gw, key);
        if (status === 200) calls++;
        else failures.push(`call ${status}`);
        await Bun.sleep(1);
      }
    };
    const marking = async () => {
      while (Date.now() < end) {
        for (const t of tokens) touched.add(t);
        await lastActive.flush();
        await Bun.sleep(5);
      }
    };
    await Promise.all([...Array.from({ length: 8 }, traffic), marking()]);
    await gw.host!.spendWriter.flush();

    expect(failures.slice(0, 5)).toEqual([]);
    expect(calls).toBeGreaterThan(100);
    expect([...gw.log.lines, ...log.lines].filter((l) => l.level !== "info").map((l) => l.msg)).toEqual([]);
    expect(gw.host!.spendWriter.written).toBe(calls);
  } finally {
    await gw.stop();
  }
}, 60_000);
