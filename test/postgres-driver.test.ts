// postgres.js 3.4.9 throws an uncaught TypeError when a transaction's connection dies under it
// (its ROLLBACK written on a closed socket, porsager/postgres #1208): a management write cut by a
// PostgreSQL restart left an uncaught error and exit code 1 behind. scripts/patch-postgres.mjs
// (run by npm install) settles that write as the connection error it is.
import { expect, test } from "bun:test";
import { Socket } from "node:net";
import { join } from "node:path";
import postgres from "postgres";
import { AnswerWatch, type PgSocketTarget } from "../core/store/pg-answer-watch.ts";
import { freshDatabase } from "./harness/gateway.ts";

test("a transaction whose backend is terminated rejects with CONNECTION_CLOSED and leaves nothing uncaught", async () => {
  const db = await freshDatabase("gw_pg_driver");
  try {
    const proc = Bun.spawn(["bun", join(import.meta.dir, "fixtures/pg-reserved-cut.ts"), db.url], { stdout: "pipe", stderr: "pipe", cwd: join(import.meta.dir, "..") });
    const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
    expect(out).toContain("transaction: CONNECTION_CLOSED");
    expect(out).toContain("after: 1");
    expect(err).not.toContain("TypeError");
    expect(code).toBe(0);
  } finally {
    await db.drop();
  }
}, 30_000);

// postgres.js 3.4.9 defers a small write to a setImmediate and cancels it when the socket closes,
// without forgetting it: a connection whose connect failed before its start-up was written (a
// refused connect reported early) never wrote anything again, and its next connect waited out
// connect_timeout. After a database restart, the first management call on it was answered 503
// "connection lost" while readiness said connected. scripts/patch-postgres.mjs forgets the write.
test("a pool connection whose connect failed before it wrote its start-up connects at the next query", async () => {
  const db = await freshDatabase("gw_pg_driver");
  const watch = new AnswerWatch(30_000, () => {});
  let connects = 0;
  const socket = (target: PgSocketTarget) => {
    if (connects++ > 0) return watch.connect(target);
    // The first connect is refused, its error and close reported before postgres.js's deferred
    // write of the start-up runs (this immediate is queued before that write's), as Bun reports a
    // refused connect now and then.
    const refused = new Socket();
    setImmediate(() => {
      refused.emit("error", Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }));
      refused.emit("close", true);
    });
    return refused;
  };
  const sql = postgres(db.url, { max: 1, onnotice: () => {}, connect_timeout: 2, backoff: () => 0, ...({ socket } as object) });
  try {
    expect(await sql`select 1`.then(() => "connected", (e: { code?: string }) => e.code)).toBe("ECONNREFUSED");
    const started = performance.now();
    const [row] = await sql<{ one: number }[]>`select 1 as one`;
    expect(row?.one).toBe(1);
    expect(performance.now() - started).toBeLessThan(1000);
    expect(connects).toBe(2);
  } finally {
    await sql.end({ timeout: 1 });
    await db.drop();
  }
}, 30_000);
