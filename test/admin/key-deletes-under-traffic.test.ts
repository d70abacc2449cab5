// /key/delete of several keys while a spend batch charges them, on PostgreSQL. The spend writer
// locks the keys it charges in token order (spend/flush.ts LOCK_ORDER); a deletion that took them
// in the order its scan met them (the table's, for a small table) could hold a key the batch
// waits for while waiting for one the batch holds: PostgreSQL then failed one of them after a
// second (the deletion a 500, or the batch retried with a "spend writes failing" warning). The
// batch is played by hand here, between its two locks, so the overlap is certain.
import { expect, test } from "bun:test";
import postgres from "postgres";
import { hashKey } from "../../core/identity/keys.ts";
import { MASTER_KEY, requestJson, startBackendGateway } from "../harness/gateway.ts";
import { chatStatus } from "../harness/traffic.ts";

test("/key/delete of two keys while a spend batch holds the first of them: it waits, then deletes both", async () => {
  const gw = await startBackendGateway("postgres", { model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" } }], general_settings: { master_key: MASTER_KEY } });
  const side = postgres(gw.databaseUrl!, { max: 1, onnotice: () => {} });
  try {
    // Two keys whose table order is the reverse of their token order.
    let keys: { key: string; token: string }[] = [];
    for (let tries = 0; tries < 50; tries++) {
      keys = [];
      for (let i = 0; i < 2; i++) {
        const key = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: {} })).body.key;
        keys.push({ key, token: hashKey(key) });
      }
      if (keys[0]!.token > keys[1]!.token) break;
    }
    const [later, first] = keys as [{ key: string; token: string }, { key: string; token: string }];
    expect(first.token < later.token).toBe(true);

    let deletion: Promise<{ status: number; text: string }> | undefined;
    const t0 = Date.now();
    await side.begin(async (tx) => {
      // The batch: the first key by token locked and charged…
      await tx`update virtual_keys set spend = spend + 1 where token = ${first.token}`;
      deletion = requestJson(gw, "POST", "/key/delete", { body: { keys: [later.key, first.key] } });
      await Bun.sleep(200);
      // …then the second.
      await tx`update virtual_keys set spend = spend + 1 where token = ${later.token}`;
    });
    const res = await deletion!;
    expect(res.status).toBe(200);
    // It waited for the batch only, not for PostgreSQL's deadlock check (a second).
    expect(Date.now() - t0).toBeLessThan(900);
    for (const k of keys) expect(await chatStatus(gw, k.key)).toBe(401);
    expect(gw.log.lines.filter((l) => l.level !== "info").map((l) => l.msg)).toEqual([]);
  } finally {
    await side.end();
    await gw.stop();
  }
}, 30_000);
