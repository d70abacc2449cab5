// The embedded store's worker thread ending under the gateway: callers get an error, never a wait forever.
import { afterEach, expect, test } from "bun:test";
import { cpSync, rmSync } from "node:fs";
import { join } from "node:path";
import { PgliteBridge } from "../../core/store/pglite-bridge.ts";
import { initializedPgFolder, tempDir } from "../harness/gateway.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

async function openedBridge(): Promise<PgliteBridge> {
  const dir = tempDir("bridge-");
  dirs.push(dir);
  cpSync(await initializedPgFolder(), join(dir, "pg"), { recursive: true });
  const bridge = new PgliteBridge();
  await bridge.open(join(dir, "pg"));
  return bridge;
}

/** Ends the worker thread as a crash or the OOM killer of a thread would: no error event, no reply. */
function endThread(bridge: PgliteBridge): void {
  (bridge as unknown as { worker: Worker }).worker.terminate();
}

test("a statement waiting on a worker thread that ends fails with the reason, and so does every later one", async () => {
  const bridge = await openedBridge();
  expect((await bridge.query("select 1 as one")).rows).toEqual([{ one: 1 }]);
  const sleeping = bridge.query("select pg_sleep(5)");
  const settled = sleeping.then(
    () => "answered",
    (err: Error) => err.message,
  );
  endThread(bridge);
  const outcome = await Promise.race([settled, Bun.sleep(3000).then(() => "still waiting after 3 s")]);
  expect(outcome).toBe("the PGlite worker thread ended");
  expect(bridge.failed).toBe("the PGlite worker thread ended");
  await expect(bridge.query("select 1")).rejects.toThrow("the PGlite worker thread ended");
  await expect(bridge.transaction(async () => 1)).rejects.toThrow("the PGlite worker thread ended");
  // Closing a store whose thread is gone finishes instead of waiting for an answer.
  const closed = await Promise.race([bridge.close().then(() => "closed"), Bun.sleep(3000).then(() => "close still waiting after 3 s")]);
  expect(closed).toBe("closed");
}, 30_000);

test("after close, a statement fails at once saying the store is closed", async () => {
  const bridge = await openedBridge();
  await bridge.close();
  await expect(bridge.query("select 1")).rejects.toThrow("the embedded store is closed");
  const again = await Promise.race([bridge.close().then(() => "closed"), Bun.sleep(3000).then(() => "second close still waiting after 3 s")]);
  expect(again).toBe("closed");
}, 30_000);
