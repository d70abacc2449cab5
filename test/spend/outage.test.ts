// Nothing is lost when the database goes away: 1,000 calls made while PostgreSQL is cut off are
// queued (past the memory bound, spilled to disk) and written once it is back, and the key's spend
// equals the sum of its 1,000 log rows. At shutdown pending entries are flushed, or saved to disk
// and written by the next start when the database is still away; when the disk refuses them too,
// the shutdown still ends with exit 0 and one error counts what was lost.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import postgres from "postgres";
import { rows } from "../../core/store/sql.ts";
import { freshDatabase, MASTER_KEY, requestJson, spawnGateway, startTestGateway, tempDir, type TestGateway } from "../harness/gateway.ts";
import { TcpRelay } from "../harness/relay.ts";

const CONFIG = {
  model_list: [{ model_name: "priced", svc_params: { model: "mock/priced" }, model_info: { input_cost_per_token: 0.0000011, output_cost_per_token: 0.0000033 } }],
  general_settings: { master_key: MASTER_KEY },
};

let gw: TestGateway;
let relay: TcpRelay;
let db: { url: string; drop(): Promise<void> };

beforeAll(async () => {
  db = await freshDatabase("gw_spend_outage");
  relay = await TcpRelay.start({ host: "127.0.0.1", port: 5432 });
  const url = new URL(db.url);
  url.port = String(relay.port);
  gw = await startTestGateway(CONFIG, { store: { databaseUrl: url.toString(), spend: { intervalMs: 200, memoryLimit: 300, batchSize: 100 } } });
});

afterAll(async () => {
  await gw?.stop();
  await relay?.close();
  await db?.drop();
});

async function chat(key: string, i: number, baseURL = gw.baseURL): Promise<number> {
  const res = await fetch(`${baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "priced", messages: [{ role: "user", content: `call ${i} with a few words` }] }),
  });
  await res.text();
  return res.status;
}

test("1,000 calls during a database outage: all logged after it, counters equal the sum of the logs", async () => {
  const created = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { key_alias: "outage" } });
  expect(created.status).toBe(200);
  const { key, token } = created.body;

  relay.cut();
  const statuses: number[] = [];
  for (let i = 0; i < 1000; i += 50) statuses.push(...(await Promise.all(Array.from({ length: 50 }, (_, j) => chat(key, i + j)))));
  expect(statuses.filter((s) => s !== 200)).toEqual([]);
  const writer = gw.host!.spendWriter;
  await Bun.sleep(300);
  expect(writer.pending).toBe(1000);
  // Past the 300-entry memory bound the rest went to disk.
  const spillDir = join(gw.dir, "data", "spend-spill");
  expect(readdirSync(spillDir).length).toBeGreaterThan(0);

  relay.restore();
  for (let i = 0; i < 200 && writer.pending > 0; i++) await Bun.sleep(100);
  expect(writer.pending).toBe(0);
  expect(readdirSync(spillDir)).toEqual([]);

  const store = gw.host!.store.db;
  const [logs] = await rows<{ n: string; total: string }>(store, sql`select count(*)::text as n, sum(spend)::text as total from spend_logs where api_key = ${token}`);
  expect(logs!.n).toBe("1000");
  const [keyRow] = await rows<{ spend: string }>(store, sql`select spend::text as spend from virtual_keys where token = ${token}`);
  expect(keyRow!.spend).toBe(logs!.total);
  const [daily] = await rows<{ n: string; total: string }>(
    store,
    sql`select sum(api_requests)::text as n, sum(spend)::text as total from daily_spend where entity_type = 'key' and entity_id = ${token}`,
  );
  expect(daily).toEqual({ n: "1000", total: logs!.total });
}, 60_000);

test("SIGTERM with the database away saves pending spend to disk; the next start writes it", async () => {
  const second = await freshDatabase("gw_spend_sigterm");
  const cutter = await TcpRelay.start({ host: "127.0.0.1", port: 5432 });
  const dir = tempDir();
  try {
    const url = new URL(second.url);
    url.port = String(cutter.port);
    const env = { DATABASE_URL: url.toString() };
    const first = await spawnGateway(CONFIG, { env, dir });
    const created = await requestJson<{ key: string; token: string }>(first, "POST", "/key/generate", { body: {} });
    cutter.cut();
    for (let i = 0; i < 25; i++) {
      const res = await fetch(`${first.baseURL}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${created.body.key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "priced", messages: [{ role: "user", content: `call ${i}` }] }),
      });
      expect(res.status).toBe(200);
    }
    expect(await first.stop("SIGTERM")).toBe(0);
    const spillDir = join(dir, "data", "spend-spill");
    expect(existsSync(spillDir) && readdirSync(spillDir).length > 0).toBe(true);

    cutter.restore();
    const again = await spawnGateway(CONFIG, { env, dir });
    const sqlc = postgres(second.url, { max: 1, onnotice: () => {} });
    try {
      const [row] = await sqlc<{ n: string }[]>`select count(*)::text as n from spend_logs where api_key = ${created.body.token}`;
      expect(row!.n).toBe("25");
      expect(readdirSync(spillDir)).toEqual([]);
    } finally {
      await sqlc.end();
      await again.stop();
    }
  } finally {
    await cutter.close();
    await second.drop();
  }
}, 60_000);

test("SIGTERM with the database away and the disk refusing the spill: exit 0, one error counts the entries and spend lost", async () => {
  const cutter = await TcpRelay.start({ host: "127.0.0.1", port: 5432 });
  const dir = tempDir();
  try {
    const url = new URL(db.url);
    url.port = String(cutter.port);
    // The spill folder's place is taken by a regular file: writing it fails as on a full disk.
    mkdirSync(join(dir, "data"), { recursive: true });
    writeFileSync(join(dir, "data", "spend-spill"), "");
    const first = await spawnGateway(CONFIG, { env: { DATABASE_URL: url.toString() }, dir });
    const created = await requestJson<{ key: string }>(first, "POST", "/key/generate", { body: {} });
    cutter.cut();
    for (let i = 0; i < 12; i++) expect(await chat(created.body.key, i, first.baseURL)).toBe(200);
    // Before, the spill threw out of the stop: a crash trace, exit code 1.
    expect(await first.stop("SIGTERM")).toBe(0);
    const errors = first
      .output()
      .split("\n")
      .filter((l) => l.includes('"level":"error"') && l.includes("lost"));
    expect(errors).toHaveLength(1);
    const line = JSON.parse(errors[0]!) as Record<string, unknown>;
    expect(line.entries).toBe(12);
    expect(Number(line.spend_usd)).toBeGreaterThan(0);
  } finally {
    await cutter.close();
  }
}, 60_000);
