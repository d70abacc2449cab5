// postgres.js 3.4.9 throws an uncaught TypeError when a transaction's connection dies under it
// (its ROLLBACK written on a closed socket, porsager/postgres #1208): a management write cut by a
// PostgreSQL restart left an uncaught error and exit code 1 behind. scripts/patch-postgres.mjs
// (run by npm install) settles that write as the connection error it is.
import { expect, test } from "bun:test";
import { join } from "node:path";
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
