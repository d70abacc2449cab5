// When the spend writer sends batches, seen from a store that records them: a full batch goes at
// once, the rest within the interval (a call's spend is in the store within about a second), and
// under a steady stream of calls batches stay full instead of shrinking to whatever arrived
// during the last write (each write has a fixed cost in the store). With the store away and the
// disk refusing the spill (full, unwritable), entries wait in memory up to a hard cap instead of
// failing one by one, and a stop never throws; the warning while the store fails names the cause
// in a short line.
import { afterEach, expect, test } from "bun:test";
import { existsSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import type { SpendEntry } from "../../core/spend/entry.ts";
import type { SpendStore } from "../../core/spend/flush.ts";
import { SpendWriter } from "../../core/spend/writer.ts";
import type { Db } from "../../core/store/db.ts";
import { memoryLogger, tempDir } from "../harness/gateway.ts";
import { spendEntry } from "../harness/spend.ts";

function entry(i: number): SpendEntry {
  return spendEntry(Date.now(), { callId: `call-${i}`, requestId: `req-${i}`, apiKey: "k", spendPico: 1, promptTokens: 1, completionTokens: 1 });
}

/** A store whose bulk load records each batch's size and takes `writeMs` to answer. */
function recordingStore(writeMs: number) {
  const batches: { rows: number; at: number }[] = [];
  const store: SpendStore = {
    db: undefined as unknown as Db,
    copyIn: async (load) => {
      await Bun.sleep(writeMs);
      batches.push({ rows: load.text.split("\n").length - 1, at: performance.now() });
    },
  };
  return { store, batches };
}

let writer: SpendWriter | undefined;
afterEach(async () => {
  await writer?.stop(1000);
  writer = undefined;
});

async function until(check: () => boolean, ms = 5000): Promise<void> {
  const end = performance.now() + ms;
  while (!check() && performance.now() < end) await Bun.sleep(5);
}

test("a full batch is written at once; the remainder within the interval", async () => {
  const { store, batches } = recordingStore(5);
  writer = new SpendWriter(store, memoryLogger(), { spillDir: tempDir("spill-"), intervalMs: 1000, batchSize: 10 });
  await writer.start();
  const t0 = performance.now();
  for (let i = 0; i < 25; i++) writer.enqueue(entry(i));
  await until(() => batches.length >= 2);
  expect(batches.map((b) => b.rows)).toEqual([10, 10]);
  // Well before the interval: full batches do not wait for the timer.
  expect(batches[1]!.at - t0).toBeLessThan(700);
  await until(() => batches.length >= 3);
  expect(batches.map((b) => b.rows)).toEqual([10, 10, 5]);
  expect(batches[2]!.at - t0).toBeLessThan(2500);
  expect(writer.written).toBe(25);
});

test("a steady stream of calls during slow writes is written in full batches", async () => {
  const { store, batches } = recordingStore(20);
  writer = new SpendWriter(store, memoryLogger(), { spillDir: tempDir("spill-"), intervalMs: 1000, batchSize: 50 });
  await writer.start();
  // 500 calls over ~250 ms: about 10 arrive during each 20 ms write.
  for (let i = 0; i < 500; i++) {
    writer.enqueue(entry(i));
    if (i % 10 === 9) await Bun.sleep(5);
  }
  await writer.flush();
  expect(batches.reduce((n, b) => n + b.rows, 0)).toBe(500);
  // Every batch but the final flush's is full.
  expect(batches.slice(0, -1).every((b) => b.rows === 50)).toBe(true);
});

test("a batch whose write fails is written again whole; calls that end meanwhile follow it, each once", async () => {
  const texts: string[] = [];
  let failNext = true;
  const store: SpendStore = {
    db: undefined as unknown as Db,
    copyIn: async (load) => {
      await Bun.sleep(10);
      if (failNext) {
        failNext = false;
        throw new Error("store unreachable");
      }
      texts.push(load.text);
    },
  };
  writer = new SpendWriter(store, memoryLogger(), { spillDir: tempDir("spill-"), intervalMs: 50, batchSize: 10 });
  await writer.start();
  for (let i = 0; i < 10; i++) writer.enqueue(entry(i));
  // The first write of the full batch is under way (and will fail) while these arrive.
  await Bun.sleep(2);
  for (let i = 10; i < 15; i++) writer.enqueue(entry(i));
  await until(() => writer!.written === 15);
  const ids = texts.join("").trimEnd().split("\n").map((row) => row.split("\t")[0]);
  expect(ids).toEqual(Array.from({ length: 15 }, (_, i) => `call-${i}`));
  expect(texts.map((t) => t.trimEnd().split("\n").length)).toEqual([10, 5]);
});

test("calls queued while the log was off are written as log rows once it is on", async () => {
  const { store } = recordingStore(0);
  const loads: { table: string; text: string }[] = [];
  const copyIn = store.copyIn!;
  store.copyIn = async (load, then) => {
    loads.push({ table: load.table, text: load.text });
    await copyIn(load, then);
  };
  let logOn = false;
  writer = new SpendWriter(store, memoryLogger(), { spillDir: tempDir("spill-"), intervalMs: 60_000, batchSize: 100, logRows: () => logOn });
  await writer.start();
  for (let i = 0; i < 3; i++) writer.enqueue(entry(i));
  logOn = true;
  for (let i = 3; i < 5; i++) writer.enqueue(entry(i));
  await writer.flush();
  expect(loads.map((l) => l.table)).toEqual(["spend_logs"]);
  expect(loads[0]!.text.trimEnd().split("\n").map((row) => row.split("\t")[0])).toEqual(["call-0", "call-1", "call-2", "call-3", "call-4"]);
});

test("a flush writes the calls queued when it was asked, not every call that ends while it writes", async () => {
  const { store, batches } = recordingStore(5);
  writer = new SpendWriter(store, memoryLogger(), { spillDir: tempDir("spill-"), intervalMs: 60_000, batchSize: 1000 });
  await writer.start();
  // A call ends every millisecond for 1.5 s: some arrive during every 5 ms write.
  let n = 0;
  const end = performance.now() + 1500;
  const traffic = (async () => {
    while (performance.now() < end) {
      writer!.enqueue(entry(n++));
      await Bun.sleep(1);
    }
  })();
  await Bun.sleep(100);
  const asked = n;
  const t0 = performance.now();
  await writer.flush();
  const took = performance.now() - t0;
  const wrote = batches.reduce((sum, b) => sum + b.rows, 0);
  await traffic;
  // Before, it returned only once the calls stopped (after ~1.4 s): a reset_spend or a budget's
  // first read (on a call's path) waited as long as traffic flowed.
  expect(took).toBeLessThan(500);
  expect(wrote).toBeGreaterThanOrEqual(asked);
  await writer.flush();
  expect(batches.reduce((sum, b) => sum + b.rows, 0)).toBe(n);
});

test("a flush gets its turn while full batches keep coming", async () => {
  // A full batch of calls ends during every write, for 1.5 s: the writer of full batches is never idle.
  let n = 0;
  let traffic = true;
  const store: SpendStore = {
    db: undefined as unknown as Db,
    copyIn: async () => {
      if (traffic) for (let i = 0; i < 10; i++) writer!.enqueue(entry(n++));
      await Bun.sleep(5);
    },
  };
  writer = new SpendWriter(store, memoryLogger(), { spillDir: tempDir("spill-"), intervalMs: 60_000, batchSize: 10 });
  await writer.start();
  setTimeout(() => {
    traffic = false;
  }, 1500);
  for (let i = 0; i < 10; i++) writer.enqueue(entry(n++));
  await Bun.sleep(100);
  const t0 = performance.now();
  await writer.flush();
  const took = performance.now() - t0;
  // Before, it waited behind the writer of full batches until the calls stopped (~1.4 s).
  expect(took).toBeLessThan(500);
  await until(() => !traffic);
  await writer.flush();
  expect(writer.written).toBe(n);
});

/** A store that fails every write while `down.now` is true; `down.attempts` counts the writes tried. */
function storeThatCanBeDown() {
  const down = { now: true, attempts: 0 };
  const store: SpendStore = {
    db: undefined as unknown as Db,
    copyIn: async () => {
      down.attempts++;
      if (down.now) throw new Error("store unreachable");
    },
  };
  return { store, down };
}

/** A spill folder that cannot be created (its parent is a regular file) until `unblock()`, as a full or unwritable disk. */
function blockedSpillDir() {
  const blocker = join(tempDir("spill-"), "blocker");
  writeFileSync(blocker, "");
  return { dir: join(blocker, "spend-spill"), unblock: () => rmSync(blocker) };
}

test("store away and the spill refused: entries wait in memory up to the hard cap, the rest dropped with one counted error; all kept ones written later", async () => {
  const { store, down } = storeThatCanBeDown();
  const spill = blockedSpillDir();
  const log = memoryLogger();
  writer = new SpendWriter(store, log, { spillDir: spill.dir, intervalMs: 50, batchSize: 10, memoryLimit: 20, memoryHardLimit: 50 });
  await writer.start();
  // Before, each call past the 20-entry bound threw (and was dropped by the caller, one log line each).
  for (let i = 0; i < 60; i++) writer.enqueue(entry(i));
  expect(writer.pending).toBe(50);
  await until(() => log.lines.some((l) => l.level === "error" && l.msg.includes("dropped")));
  const dropped = log.lines.filter((l) => l.level === "error" && l.msg.includes("dropped"));
  expect(dropped.map((l) => [l.fields?.entries, l.fields?.spend_usd])).toEqual([[10, "0.00000000001"]]);

  // The disk takes the spill again: what is past the bound moves there, nothing is lost.
  spill.unblock();
  await until(() => existsSync(spill.dir) && readdirSync(spill.dir).length > 0);
  expect(readdirSync(spill.dir)).toHaveLength(1);
  expect(writer.pending).toBe(50);
  down.now = false;
  await until(() => writer!.written === 50);
  expect(writer.written).toBe(50);
  expect(writer.pending).toBe(0);
  expect(readdirSync(spill.dir)).toEqual([]);
  expect(log.lines.filter((l) => l.level === "error").length).toBe(2);
});

test("stop with the store away and the spill refused does not throw; one error names the entries and spend lost", async () => {
  const { store } = storeThatCanBeDown();
  const log = memoryLogger();
  writer = new SpendWriter(store, log, { spillDir: blockedSpillDir().dir, intervalMs: 60_000, batchSize: 10, memoryLimit: 20 });
  await writer.start();
  for (let i = 0; i < 15; i++) writer.enqueue(entry(i));
  await writer.stop(300);
  const lost = log.lines.filter((l) => l.level === "error");
  expect(lost.map((l) => [l.fields?.entries, l.fields?.spend_usd])).toEqual([[15, "0.000000000015"]]);
  expect(String(lost[0]!.fields?.error)).toContain("ENOTDIR");
  writer = undefined;
});

test("while writes fail, batches filling up neither log that writes resumed nor cut the retry back-off short", async () => {
  const { store, down } = storeThatCanBeDown();
  const log = memoryLogger();
  writer = new SpendWriter(store, log, { spillDir: tempDir("spill-"), intervalMs: 50, batchSize: 10 });
  await writer.start();
  for (let i = 0; i < 5; i++) writer.enqueue(entry(i));
  await until(() => log.lines.some((l) => l.msg.startsWith("spend writes failing")));
  const tried = down.attempts;
  // A batch fills every 50 ms behind the one that failed: retries still wait 100, 200, 400 ms.
  for (let n = 5; n < 65; n += 10) {
    for (let i = n; i < n + 10; i++) writer.enqueue(entry(i));
    await Bun.sleep(50);
  }
  expect(log.lines.filter((l) => l.msg.startsWith("spend writes resumed"))).toEqual([]);
  expect(down.attempts - tried).toBeLessThanOrEqual(3);

  down.now = false;
  await until(() => writer!.written === 65);
  expect(writer.written).toBe(65);
  expect(log.lines.filter((l) => l.msg.startsWith("spend writes resumed"))).toHaveLength(1);
});

test("stop with the disk filling up mid-spill: the error counts exactly the entries the spill file did not take", async () => {
  const spillDir = tempDir("spill-");
  // Files of 8 KiB at most: a batch of 10 entries fits (about 5 KiB), not two, nor the 200 entries.
  const proc = Bun.spawn(["bash", "-c", 'trap "" XFSZ; ulimit -f 8; exec bun "$@"', "bash", join(import.meta.dir, "../fixtures/spill-at-shutdown.ts"), spillDir, "200"], {
    stdout: "pipe",
    stderr: "pipe",
    cwd: join(import.meta.dir, "../.."),
  });
  const [out, err] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text()]);
  expect(await proc.exited, err).toBe(0);
  const { lost, spilled, lines } = JSON.parse(out) as { lost: number; spilled: number; lines: number };
  expect(spilled).toBeGreaterThan(0);
  expect(lost).toBeGreaterThan(0);
  // Before, every entry of the cut-short append was counted lost, though its first lines were in the file.
  expect(lost + spilled).toBe(200);
  expect(lines).toBe(spilled);
});

test("the warning while the store fails names the cause in a short line, not the batch's statement and parameters", async () => {
  // A port nothing listens on: every write fails as with PostgreSQL down.
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const port = (probe.address() as { port: number }).port;
  await new Promise((resolve) => probe.close(resolve));
  const client = postgres(`postgres://gw@127.0.0.1:${port}/none`, { max: 1, connect_timeout: 2, onnotice: () => {} });
  const log = memoryLogger();
  writer = new SpendWriter({ db: drizzle({ client }) as unknown as Db }, log, { spillDir: tempDir("spill-"), intervalMs: 50, batchSize: 200 });
  try {
    await writer.start();
    for (let i = 0; i < 200; i++) writer.enqueue({ ...entry(i), apiKey: "hash-of-a-key", endUser: "customer-42" });
    await until(() => log.lines.some((l) => l.level === "warn"));
    const warning = log.lines.find((l) => l.level === "warn")!;
    expect(warning.msg).toContain("spend writes failing");
    const text = JSON.stringify(warning.fields);
    // Before, the whole statement with the parameters of all 200 rows (360-590 KB at 1,000 rows).
    expect(text.length).toBeLessThan(500);
    for (const secret of ["hash-of-a-key", "customer-42", "insert"]) expect(text).not.toContain(secret);
    expect(warning.fields?.code).toBe("ECONNREFUSED");
  } finally {
    await writer.stop(100);
    writer = undefined;
    await client.end({ timeout: 1 });
  }
});
