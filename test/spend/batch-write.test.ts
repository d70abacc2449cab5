// The spend writer's batch path on both stores (the embedded one bulk-loads with COPY, PostgreSQL
// runs one statement): a batch delivered twice, or half again, is counted once; values with
// COPY's special characters come back exactly; NUL and unpaired surrogates, which PostgreSQL
// cannot store, become U+FFFD instead of stopping the spend log; and a client whose `user` field
// holds a NUL does not keep anyone's calls out of the log.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { sql } from "drizzle-orm";
import postgres from "postgres";
import type { PicoJson } from "../../core/cost/money.ts";
import type { SpendEntry } from "../../core/spend/entry.ts";
import { writeBatch } from "../../core/spend/flush.ts";
import { SpendWriter } from "../../core/spend/writer.ts";
import { rows } from "../../core/store/sql.ts";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { BACKENDS, MASTER_KEY, memoryLogger, requestJson, startBackendGateway, type TestGateway, tempDir } from "../harness/gateway.ts";
import { randomLetters } from "../harness/random.ts";

const CONFIG = {
  model_list: [{ model_name: "priced", svc_params: { model: "mock/priced" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } }],
  general_settings: { master_key: MASTER_KEY },
};

function entry(token: string, spendPico: PicoJson, extra: Partial<SpendEntry> = {}): SpendEntry {
  const at = Date.parse("2026-03-04T05:06:07.089Z");
  return {
    callId: randomUUID(),
    requestId: `chatcmpl-${randomUUID()}`,
    callType: "chat",
    apiKey: token,
    keyAlias: null,
    userId: null,
    teamId: null,
    organizationId: null,
    endUser: null,
    model: "priced",
    modelGroup: "priced",
    provider: "mock",
    modelId: "dep-1",
    upstreamModel: "priced",
    spendPico,
    promptTokens: 10,
    completionTokens: 5,
    cacheReadTokens: 0,
    cacheCreationTokens: 0,
    reasoningTokens: 0,
    startTime: at,
    endTime: at + 250,
    completionStartTime: at + 40,
    status: "success",
    stream: false,
    cacheHit: false,
    tags: [],
    metadata: {},
    charges: [{ table: "key", id: token, periodEnd: null }],
    ...extra,
  };
}

for (const backend of BACKENDS) {
  describe(`spend batch writes (${backend})`, () => {
    let gw: TestGateway;
    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_batch_write" });
    }, 60_000);
    afterAll(async () => gw?.stop());

    const store = () => gw.host!.store;
    /** The store, counting bulk loads that went through and ones refused (then written by the statement). */
    function tracked() {
      const seen = { loaded: 0, refused: 0 };
      const s = store();
      const copyIn = s.copyIn;
      return {
        seen,
        store: {
          db: s.db,
          copyIn: copyIn && ((load: Parameters<typeof copyIn>[0], then: Parameters<typeof copyIn>[1]) =>
            copyIn(load, then).then(
              () => void seen.loaded++,
              (err: unknown) => {
                seen.refused++;
                throw err;
              },
            )),
        },
      };
    }
    const q = <T>(text: ReturnType<typeof sql>) => rows<T>(store().db, text);

    async function newKey(alias: string): Promise<{ key: string; token: string }> {
      const r = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { key_alias: alias } });
      expect(r.status).toBe(200);
      return r.body;
    }
    async function totals(token: string) {
      const [logs] = await q<{ n: number; sum: string | null }>(sql`select count(*)::int as n, sum(spend)::text as sum from spend_logs where api_key = ${token}`);
      const [key] = await q<{ spend: string }>(sql`select spend::text as spend from virtual_keys where token = ${token}`);
      const [daily] = await q<{ n: number | null; spend: string | null }>(
        sql`select sum(api_requests)::int as n, sum(spend)::text as spend from daily_spend where entity_type = 'key' and entity_id = ${token}`,
      );
      return { rows: logs!.n, logSum: Number(logs!.sum ?? 0), keySpend: Number(key!.spend), dailyRequests: daily!.n ?? 0, dailySpend: Number(daily!.spend ?? 0) };
    }

    test("a batch written twice, then half again with new rows, counts every call once", async () => {
      const { token } = await newKey(`twice-${backend}`);
      const t0 = tracked();
      const first = Array.from({ length: 40 }, (_, i) => entry(token, 1_000_000_000 + i, i === 7 ? { completionStartTime: null } : {}));
      expect(await writeBatch(t0.store, first)).toBe(40);
      expect(await writeBatch(t0.store, first)).toBe(0);
      const fresh = Array.from({ length: 10 }, () => entry(token, 7_000_000_000_001));
      expect(await writeBatch(t0.store, [...first.slice(0, 20), ...fresh])).toBe(10);
      // The embedded store bulk-loads new batches and hands the repeated ones to the statement.
      expect(t0.seen).toEqual(backend === "pglite" ? { loaded: 1, refused: 2 } : { loaded: 0, refused: 0 });

      // 40 × $0.001 + (0+…+39) pico + 10 × $7.000000000001
      const expected = 40 * 0.001 + 780e-12 + 10 * 7.000000000001;
      const t = await totals(token);
      expect(t.rows).toBe(50);
      const [noFirstByte] = await q<{ n: number }>(sql`select count(*)::int as n from spend_logs where api_key = ${token} and completion_start_time is null`);
      expect(noFirstByte!.n).toBe(1);
      expect(t.dailyRequests).toBe(50);
      for (const v of [t.logSum, t.keySpend, t.dailySpend]) expect(v).toBeCloseTo(expected, 10);
      const [exact] = await q<{ sum: string }>(sql`select sum(spend)::text as sum from spend_logs where api_key = ${token}`);
      expect(exact!.sum).toBe("70.040000000790");
    });

    test("with the log off, a batch written twice, then half again with new calls, still counts every call once", async () => {
      const { token } = await newKey(`nolog-${backend}`);
      const t0 = tracked();
      const first = Array.from({ length: 30 }, (_, i) => entry(token, 1_000_000_000 + i, { callId: Bun.randomUUIDv7() }));
      expect(await writeBatch(t0.store, first, { logRows: false })).toBe(30);
      expect(await writeBatch(t0.store, first, { logRows: false })).toBe(0);
      const fresh = Array.from({ length: 5 }, () => entry(token, 2_000_000_000, { callId: Bun.randomUUIDv7() }));
      expect(await writeBatch(t0.store, [...first.slice(0, 10), ...fresh], { logRows: false })).toBe(5);
      expect(t0.seen).toEqual(backend === "pglite" ? { loaded: 1, refused: 2 } : { loaded: 0, refused: 0 });
      const t = await totals(token);
      // No log rows; the counter and the aggregates hold exactly the 35 calls.
      expect(t.rows).toBe(0);
      expect(t.dailyRequests).toBe(35);
      // 30 × $0.001 + (0+…+29) pico-dollars + 5 × $0.002, to the pico-dollar.
      const [key] = await q<{ spend: string }>(sql`select spend::text as spend from virtual_keys where token = ${token}`);
      expect(key!.spend).toBe("0.040000000435");
      const [ids] = await q<{ n: number }>(sql`select count(*)::int as n from spend_calls where call_id in (${sql.join([...first, ...fresh].map((e) => sql`${e.callId}`), sql`, `)})`);
      expect(ids!.n).toBe(35);
    });

    test("tabs, newlines, backslashes, quotes and non-ASCII come back exactly; NUL and lone surrogates become U+FFFD", async () => {
      const { token } = await newKey(`chars-${backend}`);
      const tricky = 'a\tb\nc\\d"e\r,{x} é 漢 👍';
      const e = entry(token, 123_456_789, {
        keyAlias: tricky,
        endUser: "cust\u0000omer\uD800",
        tags: ["plain", 'with "quote"', "back\\slash", "nul\u0000tag", "{brace,comma}"],
        metadata: { note: tricky, broken: "x\u0000y\uDC00", nested: { list: [1, "two", null] } },
        completionStartTime: Date.parse("2026-03-04T05:06:08.003Z"),
      });
      const t0 = tracked();
      expect(await writeBatch(t0.store, [e])).toBe(1);
      expect(t0.seen.loaded).toBe(backend === "pglite" ? 1 : 0);
      // The same values through the statement (no bulk load) are stored identically.
      const viaStatement = { ...e, callId: randomUUID() };
      expect(await writeBatch({ db: store().db }, [viaStatement])).toBe(1);
      const both = await q<Record<string, unknown>>(sql`select * from spend_logs where call_id in (${e.callId}, ${viaStatement.callId})`);
      expect(both.length).toBe(2);
      const { call_id: _a, ...bulk } = both[0]!;
      const { call_id: _b, ...statement } = both[1]!;
      expect(bulk).toEqual(statement);
      const [row] = await q<{
        key_alias: string;
        end_user: string;
        request_tags: string[] | string;
        metadata: unknown;
        spend: string;
        total_tokens: number;
        start_time: string;
        completion_start_time: string | null;
        stream: boolean;
      }>(
        sql`select key_alias, end_user, request_tags, metadata, spend::text as spend, total_tokens,
              to_char(start_time at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS') as start_time,
              to_char(completion_start_time at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS') as completion_start_time, stream
            from spend_logs where call_id = ${e.callId}`,
      );
      expect(row!.key_alias).toBe(tricky);
      expect(row!.end_user).toBe("cust\uFFFDomer\uFFFD");
      const tags = typeof row!.request_tags === "string" ? row!.request_tags : JSON.stringify(row!.request_tags);
      for (const t of ["plain", "quote", "back", "nul\uFFFDtag", "brace,comma"]) expect(tags).toContain(t);
      const meta = (typeof row!.metadata === "string" ? JSON.parse(row!.metadata) : row!.metadata) as Record<string, unknown>;
      expect(meta).toEqual({ note: tricky, broken: "x\uFFFDy\uFFFD", nested: { list: [1, "two", null] } });
      expect(row!.spend).toBe("0.000123456789");
      expect(row!.total_tokens).toBe(15);
      expect(row!.start_time).toBe("2026-03-04T05:06:07.089");
      expect(row!.completion_start_time).toBe("2026-03-04T05:06:08.003");
      expect(row!.stream).toBe(false);
    });

    test("a call of more than 2^63 pico-dollars (about $9.2 million) is written by the bulk load and by the statement, and counted once when replayed", async () => {
      const { token } = await newKey(`huge-${backend}`);
      // $617,283,945.061728: a billion tokens at $0.617283945061728, within the README's $1 a token.
      const huge = () => entry(token, "617283945061728000000");
      const [bulk, viaStatement, fresh] = [huge(), huge(), huge()];
      expect(await writeBatch(tracked().store, [bulk])).toBe(1);
      expect(await writeBatch({ db: store().db }, [viaStatement])).toBe(1);
      // A batch holding a row already stored: the statement derives the sums from the rows it inserted.
      expect(await writeBatch(tracked().store, [bulk, fresh])).toBe(1);
      const [log] = await q<{ n: number; sum: string }>(sql`select count(*)::int as n, sum(spend)::text as sum from spend_logs where api_key = ${token}`);
      const [key] = await q<{ spend: string }>(sql`select spend::text as spend from virtual_keys where token = ${token}`);
      const [daily] = await q<{ spend: string }>(sql`select sum(spend)::text as spend from daily_spend where entity_type = 'key' and entity_id = ${token}`);
      expect([log!.n, log!.sum, key!.spend, daily!.spend]).toEqual([3, "1851851835.185184000000", "1851851835.185184000000", "1851851835.185184000000"]);
    });

    test("a row without metadata is stored as {} through COPY and through the statement alike", async () => {
      const { token } = await newKey(`no-meta-${backend}`);
      const bulk = entry(token, 1, { metadata: {} });
      const viaStatement = entry(token, 1, { metadata: {} });
      expect(await writeBatch(tracked().store, [bulk])).toBe(1);
      expect(await writeBatch({ db: store().db }, [viaStatement])).toBe(1);
      const found = await q<{ kind: string }>(sql`select jsonb_typeof(metadata) as kind from spend_logs where call_id in (${bulk.callId}, ${viaStatement.callId})`);
      expect(found).toEqual([{ kind: "object" }, { kind: "object" }]);
    });

    test("an entry the store refuses is set aside in a file and logged; the calls around it, and after it, are written", async () => {
      const { token } = await newKey(`refused-${backend}`);
      const log = memoryLogger();
      const spillDir = tempDir();
      const writer = new SpendWriter(store(), log, { spillDir, intervalMs: 60_000 });
      // A fractional token count: the log's integer column refuses it (usage is made countable before
      // it gets here; this is what the writer does with anything else the store refuses).
      const refused = entry(token, 3_000_000_000, { promptTokens: 1.5 });
      const around = Array.from({ length: 9 }, (_, i) => entry(token, 1_000_000_000 + i));
      for (const e of [...around.slice(0, 4), refused, ...around.slice(4)]) writer.enqueue(e);
      await writer.flush();
      const after = entry(token, 2_000_000_000);
      writer.enqueue(after);
      await writer.flush();
      const t = await totals(token);
      expect(t.rows).toBe(10);
      expect(t.keySpend).toBeCloseTo(9 * 0.001 + 36e-12 + 0.002, 12);
      expect(t.dailyRequests).toBe(10);
      const files = readdirSync(spillDir).filter((f) => f.startsWith("refused-"));
      expect(files).toHaveLength(1);
      expect(readFileSync(join(spillDir, files[0]!), "utf8").trim().split("\n").map((l) => (JSON.parse(l) as { callId: string }).callId)).toEqual([refused.callId]);
      expect(log.lines.filter((l) => l.level === "error" && l.fields?.call === refused.callId)).toHaveLength(1);
      await writer.stop();
    });

    test("an entry the store refuses while the disk refuses its file too is logged as lost with its spend; the calls after it are written", async () => {
      const { token } = await newKey(`refused-no-disk-${backend}`);
      const log = memoryLogger();
      // A file where the spill folder should be: nothing can be written under it.
      const spillDir = join(tempDir(), "not-a-folder");
      writeFileSync(spillDir, "");
      const writer = new SpendWriter(store(), log, { spillDir, intervalMs: 60_000 });
      const refused = entry(token, 3_000_000_000, { promptTokens: 1.5 });
      const others = Array.from({ length: 3 }, (_, i) => entry(token, 1_000_000_000 + i));
      for (const e of [others[0]!, refused, ...others.slice(1)]) writer.enqueue(e);
      await writer.flush();
      expect((await totals(token)).rows).toBe(3);
      const lost = log.lines.filter((l) => l.level === "error" && l.fields?.call === refused.callId);
      expect(lost).toHaveLength(1);
      expect(lost[0]!.fields).toMatchObject({ spend_usd: "0.003" });
      await writer.stop();
    });

    test("an entry whose key is too long for the aggregates' index (a 10,000-character end user) is set aside; the calls after it are written", async () => {
      const { token } = await newKey(`too-long-${backend}`);
      const log = memoryLogger();
      const spillDir = tempDir();
      const writer = new SpendWriter(store(), log, { spillDir, intervalMs: 60_000 });
      const refused = entry(token, 3_000_000_000, { endUser: randomLetters(10_000) });
      const others = Array.from({ length: 3 }, (_, i) => entry(token, 1_000_000_000 + i));
      for (const e of [others[0]!, refused, ...others.slice(1)]) writer.enqueue(e);
      await writer.flush();
      const t = await totals(token);
      expect(t.rows).toBe(3);
      expect(t.keySpend).toBeCloseTo(3 * 0.001 + 3e-12, 12);
      const files = readdirSync(spillDir).filter((f) => f.startsWith("refused-"));
      expect(files).toHaveLength(1);
      await writer.stop();
    });

    test("a call's `user`, tags and model name longer than 256 characters are a 4xx naming the field, before anything is called or logged", async () => {
      const { key } = await newKey(`long-fields-${backend}`);
      const long = "y".repeat(257);
      const call = (extra: Record<string, unknown>) =>
        fetch(`${gw.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "priced", messages: [{ role: "user", content: "hello" }], ...extra }),
        });
      for (const [extra, field] of [
        [{ user: long }, "user"],
        [{ metadata: { tags: ["fine", long] } }, "metadata"],
        [{ model: long }, "model"],
      ] as const) {
        const res = await call(extra);
        expect([JSON.stringify(extra).slice(0, 30), res.status]).toEqual([JSON.stringify(extra).slice(0, 30), 422]);
        expect(JSON.stringify(await res.json())).toContain(field);
      }
      expect((await call({ user: "y".repeat(256) })).status).toBe(200);
    });

    test("a client sending a NUL in `user` is logged, and so are the calls around it", async () => {
      const { key, token } = await newKey(`nul-user-${backend}`);
      const call = (user: string) =>
        fetch(`${gw.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "priced", user, messages: [{ role: "user", content: "hello" }] }),
        }).then((r) => r.status);
      expect(await Promise.all([call("before"), call("evil\u0000user"), call("after")])).toEqual([200, 200, 200]);
      await gw.host!.spendWriter.flush();
      const found = await q<{ end_user: string }>(sql`select end_user from spend_logs where api_key = ${token} order by end_user`);
      expect(found.map((r) => r.end_user)).toEqual(["after", "before", "evil\uFFFDuser"]);
      const t = await totals(token);
      expect(t.keySpend).toBeCloseTo(t.logSum, 12);
      expect(t.keySpend).toBeGreaterThan(0);
    });
  });
}

// Two instances' batches share daily rows (a key's on each model when one key is served by both,
// a model's, a provider's). Each batch upserts them in one order (the conflict key's), so two never
// wait for each other in a ring: the side connection here plays another instance's batch, in that
// order, holding the key's row on model m1 while this batch starts and then taking the one on m2.
// Upserted as they were summed (m2's rows first: its call came first), this batch held the key's
// m2 row while it waited for the m1 one: PostgreSQL's deadlock check failed one of the two after a second.
test("postgres: two batches upserting the same daily rows wait for each other, never deadlock", async () => {
  const gw = await startBackendGateway("postgres", CONFIG, { dbPrefix: "gw_batch_order" });
  const side = postgres(gw.databaseUrl!, { max: 2, onnotice: () => {} });
  try {
    const store = gw.host!.store;
    const on = (model: string) => entry("tok-a", 1_000_000, { model, modelGroup: model, upstreamModel: model, charges: [] });
    expect(await writeBatch({ db: store.db }, [on("m1"), on("m2")])).toBe(2);
    const lockWaits = async () => (await side`select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`)[0]!.n as number;
    let written: Promise<number> | undefined;
    const t0 = Date.now();
    await side.begin(async (tx) => {
      await tx`update daily_spend set spend = spend + 1 where entity_type = 'key' and entity_id = 'tok-a' and model = 'm1'`;
      written = writeBatch({ db: store.db }, [on("m2"), on("m1")]);
      for (const end = Date.now() + 5000; Date.now() < end && (await lockWaits()) < 1; ) await Bun.sleep(20);
      await tx`update daily_spend set spend = spend + 1 where entity_type = 'key' and entity_id = 'tok-a' and model = 'm2'`;
    });
    expect(await written!).toBe(2);
    expect(Date.now() - t0).toBeLessThan(900);
    const counts = await side`select model, api_requests::int as n from daily_spend where entity_type = 'key' and entity_id = 'tok-a' order by model`;
    expect(counts.map((r) => [r.model, r.n])).toEqual([["m1", 2], ["m2", 2]]);
  } finally {
    await side.end();
    await gw.stop();
  }
}, 30_000);
