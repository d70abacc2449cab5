// A management write whose database connection is lost while it runs (a PostgreSQL restart or
// failover, the backend terminated): the caller is told to retry with a 503 that says the write
// may not have been applied, not a 500, and the gateway goes on serving and writing.
import { expect, test } from "bun:test";
import postgres from "postgres";
import { requestJson, startBackendGateway } from "../harness/gateway.ts";
import { PRICED_CHAT, chatStatus } from "../harness/traffic.ts";

test("postgres: a /key/update whose connection is terminated mid-write answers 503 saying so; the next one is applied", async () => {
  const gw = await startBackendGateway("postgres", PRICED_CHAT);
  const side = postgres(gw.databaseUrl!, { max: 2, onnotice: () => {} });
  try {
    const { key, token } = (await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: {} })).body;
    let answer: Promise<{ status: number; body: { error?: { message: string; type: string } } }> | undefined;
    await side
      .begin(async (tx) => {
        // The key's row held, so the update waits inside its transaction; then its backend is terminated.
        await tx`select 1 from virtual_keys where token = ${token} for update`;
        const [{ holder }] = (await tx`select pg_backend_pid() as holder`) as unknown as [{ holder: number }];
        answer = requestJson(gw, "POST", "/key/update", { body: { key, key_alias: "cut-mid-write" } });
        let pid: number | undefined;
        for (const end = Date.now() + 5000; pid === undefined && Date.now() < end; await Bun.sleep(20)) {
          // The backend waiting on the held row (not found by its query text: pg_stat_activity keeps its first 1 KiB only).
          const [w] = await side`select pid from pg_stat_activity where ${holder} = any(pg_blocking_pids(pid))`;
          pid = w?.pid as number | undefined;
        }
        expect(pid).toBeDefined();
        await side`select pg_terminate_backend(${pid!})`;
        throw new Error("release the row");
      })
      .catch((err: Error) => expect(err.message).toBe("release the row"));
    const cut = await answer!;
    expect(cut.status).toBe(503);
    expect(cut.body.error?.type).toBe("api_connection_error");
    expect(cut.body.error?.message).toContain("may not have been applied");
    // Served and written as before.
    expect(await chatStatus(gw, key)).toBe(200);
    const again = await requestJson<{ key_alias: string }>(gw, "POST", "/key/update", { body: { key, key_alias: "after-the-cut" } });
    expect(again.status).toBe(200);
    const info = await requestJson<{ info: { key_alias: string } }>(gw, "GET", `/key/info?key=${key}`);
    expect(info.body.info.key_alias).toBe("after-the-cut");
    expect(gw.log.lines.filter((l) => l.level === "error").map((l) => l.msg)).toEqual([]);
  } finally {
    await side.end();
    await gw.stop();
  }
}, 30_000);
