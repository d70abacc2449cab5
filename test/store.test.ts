// One store suite, run on embedded PGlite and on a real PostgreSQL (a fresh database per run;
// TEST_DATABASE_URL picks the server, default postgres://postgres@127.0.0.1:5432).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { getTableName, isTable, sql } from "drizzle-orm";
import postgres from "postgres";
import { type OpenStoreOptions, openStore, type Store } from "../core/store/db.ts";
import { getMeta, setMeta } from "../core/store/meta.ts";
import { MIGRATIONS_SCHEMA, MIGRATIONS_TABLE } from "../core/store/migrate.ts";
import { migrations } from "../core/store/migrations/index.ts";
import * as schema from "../core/store/schema.ts";
import { rows } from "../core/store/sql.ts";

/** Every table the drizzle schema declares: the migrations must create exactly these. */
const schemaTables = Object.values(schema)
  .filter(isTable)
  .map((t) => getTableName(t))
  .sort();

// PGlite's first boot runs initdb (~5 s, much more on a loaded machine).
const SLOW = 60_000;

type MigrationRow = { id: number; hash: string; created_at: string };

function migrationRows(store: Store): Promise<MigrationRow[]> {
  return rows<MigrationRow>(
    store.db,
    sql`select id, hash, created_at from ${sql.identifier(MIGRATIONS_SCHEMA)}.${sql.identifier(MIGRATIONS_TABLE)} order by id`,
  );
}

/** Tests every backend must pass; `open` opens a new store on the backend's one database. */
function sharedSuite(open: () => Promise<Store>) {
  let store: Store;
  beforeAll(async () => {
    store = await open();
  }, SLOW);
  afterAll(async () => {
    await store?.close();
  });

  test("migrations are applied and recorded once", async () => {
    const applied = await migrationRows(store);
    expect(applied.map((r) => r.hash)).toEqual(migrations.map((m) => m.hash));
    expect(applied.map((r) => Number(r.created_at))).toEqual(migrations.map((m) => m.folderMillis));
    const tables = await rows<{ table_name: string }>(
      store.db,
      sql`select table_name from information_schema.tables where table_schema = 'public' order by table_name`,
    );
    expect(tables.map((t) => t.table_name)).toEqual(schemaTables);
    expect(schemaTables).toContain("virtual_keys");
  });

  test("reopening re-runs migrations as a no-op", async () => {
    const before = await migrationRows(store);
    await store.close();
    store = await open();
    expect(await migrationRows(store)).toEqual(before);
  }, SLOW);

  test("meta roundtrip with upsert overwrite", async () => {
    expect(await getMeta(store.db, "nope")).toBeUndefined();
    await setMeta(store.db, "install", { id: "abc", n: 1, tags: ["x"] });
    expect(await getMeta(store.db, "install")).toEqual({ id: "abc", n: 1, tags: ["x"] });
    await setMeta(store.db, "install", "replaced");
    expect(await getMeta(store.db, "install")).toBe("replaced");
    const [count] = await rows<{ n: number }>(store.db, sql`select count(*)::int as n from gateway_meta where key = 'install'`);
    expect(count?.n).toBe(1);
  });

  test("ping reports the server version", async () => {
    const p = await store.ping();
    expect(p.ok).toBe(true);
    expect(p.detail).toContain("PostgreSQL");
  });

  test("ping after close reports down instead of throwing", async () => {
    await store.close();
    await store.close(); // idempotent
    const p = await store.ping();
    expect(p.ok).toBe(false);
    expect(p.detail.length).toBeGreaterThan(0);
    store = await open();
  }, SLOW);
}

describe("store on embedded PGlite", () => {
  const dataDir = mkdtempSync(join(tmpdir(), "gw-store-"));
  const lockPath = join(dataDir, "gateway.lock");
  const open = () => openStore({ dataDir });
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }));

  // The shared suite's store is closed before the PGlite-only tests below reuse the folder.
  describe("shared", () => sharedSuite(open));

  test("a second open on the same data folder is refused while the first is open", async () => {
    const first = await open();
    try {
      expect(readFileSync(lockPath, "utf8").trim().split(" ")[0]).toBe(String(process.pid));
      await expect(open()).rejects.toThrow(`data folder ${dataDir} is in use by process ${process.pid}`);
      expect((await first.ping()).ok).toBe(true); // the refused open did not disturb the holder
    } finally {
      await first.close();
    }
    expect(existsSync(lockPath)).toBe(false);
  }, SLOW);

  test("a stale lockfile of a dead process is taken over", async () => {
    let deadPid = 999_999;
    while (isAlive(deadPid)) deadPid++;
    writeFileSync(lockPath, `${deadPid}\n`);
    const store = await open();
    try {
      expect(readFileSync(lockPath, "utf8").trim().split(" ")[0]).toBe(String(process.pid));
    } finally {
      await store.close();
    }
    expect(existsSync(lockPath)).toBe(false);
  }, SLOW);

  test("a lockfile naming this very process, which does not hold it, is a crashed run's (a container's pid 1 at every start): taken over", async () => {
    writeFileSync(lockPath, `${process.pid}\n`);
    const store = await open();
    await store.close();
    expect(existsSync(lockPath)).toBe(false);
  }, SLOW);

  test.skipIf(!existsSync("/proc/self/stat"))("a live pid is the holder only if it is the process that took the lock (its start time): a reused pid's lock is taken over", async () => {
    const parent = process.ppid;
    const stat = readFileSync(`/proc/${parent}/stat`, "utf8");
    const startedAt = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
    writeFileSync(lockPath, `${parent} ${startedAt}\n`);
    await expect(open()).rejects.toThrow(`is in use by process ${parent}`);
    writeFileSync(lockPath, `${parent} 1\n`);
    const store = await open();
    await store.close();
    expect(existsSync(lockPath)).toBe(false);
  }, SLOW);

  test("data persists across close and reopen", async () => {
    const a = await open();
    await setMeta(a.db, "persist", { at: 42 });
    await a.close();
    const b = await open();
    try {
      expect(b.kind).toBe("pglite");
      expect(await getMeta(b.db, "persist")).toEqual({ at: 42 });
    } finally {
      await b.close();
    }
  }, SLOW);
});

describe("store on PostgreSQL", () => {
  const server = new URL(process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres");
  const created: string[] = [];
  const admin = postgres(urlFor("postgres"), { max: 1, onnotice: () => {} });
  const dataDir = mkdtempSync(join(tmpdir(), "gw-store-pg-"));

  function urlFor(db: string): string {
    const u = new URL(server);
    u.pathname = `/${db}`;
    return u.toString();
  }
  async function freshDb(): Promise<string> {
    const name = `gw_store_test_${process.pid}_${Date.now()}_${created.length}`;
    await admin.unsafe(`create database "${name}"`);
    created.push(name);
    return urlFor(name);
  }
  const opts: OpenStoreOptions = { dataDir };

  beforeAll(async () => {
    opts.databaseUrl = await freshDb();
  });
  afterAll(async () => {
    for (const name of created) await admin.unsafe(`drop database if exists "${name}" with (force)`);
    await admin.end();
    rmSync(dataDir, { recursive: true, force: true });
  });

  describe("shared", () => sharedSuite(() => openStore(opts)));

  test("does not touch the data folder", () => {
    expect(existsSync(join(dataDir, "gateway.lock"))).toBe(false);
    expect(existsSync(join(dataDir, "pg"))).toBe(false);
  });

  test("instances starting concurrently migrate exactly once", async () => {
    const databaseUrl = await freshDb();
    const stores = await Promise.all(Array.from({ length: 4 }, () => openStore({ dataDir, databaseUrl })));
    try {
      for (const s of stores) expect(s.kind).toBe("postgres");
      const applied = await migrationRows(stores[0]!);
      expect(applied.map((r) => r.hash)).toEqual(migrations.map((m) => m.hash));
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  }, SLOW);
});

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: exists, owned by someone else.
    return e instanceof Error && "code" in e && e.code === "EPERM";
  }
}
