// Two gateway instances on one PostgreSQL database and one Redis: identity changes made through
// instance A (store write + change bus, as the management API does) are honoured by instance B
// within a second, and B catches up after losing Redis for a while. B reaches Redis through a
// TCP relay the test can cut, so "Redis unavailable to B" is exact, not a race with reconnects.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { eq } from "drizzle-orm";
import Redis from "ioredis";
import type { IdentityChange } from "../core/identity/records.ts";
import { teams, virtualKeys } from "../core/store/schema.ts";
import { freshDatabase, MASTER_KEY, startTestGateway, type TestGateway } from "./harness/gateway.ts";
import { TcpRelay } from "./harness/relay.ts";
import { redisReachable, sha256 } from "./harness/util.ts";
import { TEST_REDIS_URL, testRedisUrlAt } from "./harness/redis.ts";

const REDIS_URL = TEST_REDIS_URL;
const CONFIG = {
  model_list: [
    { model_name: "gpt-a", svc_params: { model: "mock/gpt-a" } },
    // $1 a call: exactly max_tokens=1000 words at $0.001 per output token (the prompt priced at almost nothing).
    { model_name: "dollar", svc_params: { model: "mock/dollar", mock_response: "word ".repeat(1200) }, model_info: { input_cost_per_token: 1e-12, output_cost_per_token: 0.001 } },
  ],
  general_settings: { master_key: MASTER_KEY },
};
const POLL_MS = 50;
const LIMIT_MS = 1000;

/** A management call that must answer 200. */
async function admin(gw: TestGateway, path: string, body: Record<string, unknown>): Promise<Record<string, unknown>> {
  const res = await fetch(gw.url + path, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`POST ${path} → ${res.status}: ${text}`);
  return JSON.parse(text) as Record<string, unknown>;
}

/**
 * Management calls through B right after calls through A returned, while B applies every change
 * it hears of 150 ms late (its store reads slowed down): each must see what A wrote, as if there
 * were one instance.
 */
async function readsAfterWrites(a: TestGateway, b: TestGateway): Promise<void> {
  const identity = b.host!.services.identity! as unknown as { reload(c: IdentityChange): Promise<void> };
  const reload = identity.reload;
  identity.reload = async function (this: unknown, c: IdentityChange) {
    await Bun.sleep(150);
    return reload.call(this, c);
  };
  try {
    const tag = randomUUID().slice(0, 8);
    const group = await admin(a, "/access_group/new", { access_group: `lag-${tag}`, model_names: ["gpt-a"] });
    // The group A just made exists for B; so do A's team and org.
    const team = await admin(b, "/team/new", { access_group_ids: [group.access_group_id] });
    const org = await admin(a, "/organization/new", { organization_alias: `lag-${tag}` });
    const other = await admin(a, "/team/new", { organization_id: org.organization_id, models: ["gpt-a"] });
    const { key } = (await admin(b, "/key/generate", { team_id: other.team_id, models: ["gpt-a"] })) as { key: string };
    await admin(b, "/key/generate", { organization_id: org.organization_id });
    // A team moved into the org through A binds what B lets the org narrow to.
    await admin(a, "/team/update", { team_id: team.team_id, organization_id: org.organization_id, models: ["gpt-a"] });
    const narrowed = await fetch(`${b.url}/organization/update`, {
      method: "PATCH",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ organization_id: org.organization_id, models: ["gpt-b"] }),
    });
    expect(narrowed.status).toBe(400);
    await narrowed.arrayBuffer();
    expect(await chatStatus(b, key)).toBe(200);
  } finally {
    identity.reload = reload;
  }
}


async function chatStatus(gw: TestGateway, key: string): Promise<number> {
  const res = await fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "gpt-a", messages: [{ role: "user", content: "hi" }], max_tokens: 1 }),
  });
  await res.arrayBuffer();
  return res.status;
}

/** Polls `gw` every 50 ms until the key gets `status`; returns the time it took since `since`. */
async function until(gw: TestGateway, key: string, status: number, since: number, timeoutMs = 5000): Promise<number> {
  for (;;) {
    const got = await chatStatus(gw, key);
    const elapsed = performance.now() - since;
    if (got === status) return elapsed;
    if (elapsed > timeoutMs) throw new Error(`still ${got} (want ${status}) after ${Math.round(elapsed)} ms`);
    await Bun.sleep(POLL_MS);
  }
}

const redisUp = await redisReachable(REDIS_URL);

describe.skipIf(!redisUp)("two instances, one PostgreSQL, one Redis", () => {
  let a: TestGateway;
  let b: TestGateway;
  let relay: TcpRelay;
  let drop: () => Promise<void>;
  const timings: Record<string, number> = {};

  beforeAll(async () => {
    const db = await freshDatabase("gw_multi");
    drop = db.drop;
    relay = await TcpRelay.start({ host: "127.0.0.1", port: 6379 });
    a = await startTestGateway(CONFIG, { store: { databaseUrl: db.url, redisUrl: REDIS_URL } });
    b = await startTestGateway(CONFIG, { store: { databaseUrl: db.url, redisUrl: testRedisUrlAt(relay.port) } });
    await Promise.all([a.host!.services.bus!.subscribed(), b.host!.services.bus!.subscribed()]);
  });

  afterAll(async () => {
    await a?.stop();
    await b?.stop();
    await relay?.close();
    await drop?.();
    console.log(`propagation A → B (ms): ${JSON.stringify(timings)}`);
  });

  const dbOf = () => a.host!.store.db;
  const publishA = (...c: IdentityChange[]) => a.host!.services.bus!.publish(...c);

  async function newKey(fields: Partial<typeof virtualKeys.$inferInsert> = {}): Promise<string> {
    const plain = `sk-${randomUUID().replaceAll("-", "")}`;
    await dbOf()
      .insert(virtualKeys)
      .values({ token: sha256(plain), keyName: "sk-...test", ...fields });
    return plain;
  }

  test("a key created through A works on B within a second", async () => {
    const key = await newKey();
    // B has no reason to look at the database for an unknown key: it only knows what it is told.
    expect(await chatStatus(b, key)).toBe(401);
    const t0 = performance.now();
    await publishA({ kind: "key", token: sha256(key) });
    expect(await chatStatus(a, key)).toBe(200);
    timings.created = await until(b, key, 200, t0);
    expect(timings.created).toBeLessThan(LIMIT_MS);
  });

  test("a key blocked, unblocked, then deleted through A is refused / accepted by B within a second", async () => {
    const key = await newKey();
    await publishA({ kind: "key", token: sha256(key) });
    await until(b, key, 200, performance.now());

    await dbOf().update(virtualKeys).set({ blocked: true }).where(eq(virtualKeys.token, sha256(key)));
    let t0 = performance.now();
    await publishA({ kind: "key", token: sha256(key) });
    expect(await chatStatus(a, key)).toBe(401);
    timings.blocked = await until(b, key, 401, t0);
    expect(timings.blocked).toBeLessThan(LIMIT_MS);

    await dbOf().update(virtualKeys).set({ blocked: false }).where(eq(virtualKeys.token, sha256(key)));
    t0 = performance.now();
    await publishA({ kind: "key", token: sha256(key) });
    timings.unblocked = await until(b, key, 200, t0);
    expect(timings.unblocked).toBeLessThan(LIMIT_MS);

    await dbOf().update(virtualKeys).set({ deletedAt: new Date() }).where(eq(virtualKeys.token, sha256(key)));
    t0 = performance.now();
    await publishA({ kind: "key", token: sha256(key) });
    timings.deleted = await until(b, key, 401, t0);
    expect(timings.deleted).toBeLessThan(LIMIT_MS);
  });

  test("a team blocked through A stops its keys on B within a second", async () => {
    const teamId = `team-${randomUUID().slice(0, 8)}`;
    await dbOf().insert(teams).values({ teamId });
    await publishA({ kind: "team", teamId });
    const key = await newKey({ teamId });
    await publishA({ kind: "key", token: sha256(key) });
    await until(b, key, 200, performance.now());

    await dbOf().update(teams).set({ blocked: true }).where(eq(teams.teamId, teamId));
    const t0 = performance.now();
    await publishA({ kind: "team", teamId });
    timings.teamBlocked = await until(b, key, 401, t0);
    expect(timings.teamBlocked).toBeLessThan(LIMIT_MS);
  });

  test("through A's management API: generate, block, unblock, team block, delete are honoured by B within a second", async () => {
    const admin = async (path: string, body: Record<string, unknown>) => {
      const res = await fetch(`${a.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify(body) });
      expect(res.status).toBe(200);
      return (await res.json()) as Record<string, unknown>;
    };
    const team = await admin("/team/new", { team_alias: `multi-${randomUUID().slice(0, 6)}` });
    const teamId = team.team_id as string;
    let t0 = performance.now();
    const key = (await admin("/key/generate", { team_id: teamId })).key as string;
    timings.apiGenerated = await until(b, key, 200, t0);
    expect(timings.apiGenerated).toBeLessThan(LIMIT_MS);

    const steps: [string, string, Record<string, unknown>, number][] = [
      ["apiBlocked", "/key/block", { key }, 401],
      ["apiUnblocked", "/key/unblock", { key }, 200],
      ["apiTeamBlocked", "/team/block", { team_id: teamId }, 401],
      ["apiTeamUnblocked", "/team/unblock", { team_id: teamId }, 200],
      ["apiDeleted", "/key/delete", { keys: [key] }, 401],
    ];
    for (const [name, path, body, status] of steps) {
      t0 = performance.now();
      await admin(path, body);
      timings[name] = await until(b, key, status, t0);
      expect(timings[name]).toBeLessThan(LIMIT_MS);
    }
  });

  test("a management call through B sees what a call through A wrote just before, even while B's cache lags", async () => {
    await readsAfterWrites(a, b);
  });

  test("B resynchronises after losing Redis: a change made while it was cut off is honoured after reconnect", async () => {
    const key = await newKey();
    await publishA({ kind: "key", token: sha256(key) });
    await until(b, key, 200, performance.now());

    relay.cut();
    await dbOf().update(virtualKeys).set({ blocked: true }).where(eq(virtualKeys.token, sha256(key)));
    await publishA({ kind: "key", token: sha256(key) });
    expect(await chatStatus(a, key)).toBe(401);
    // The message is lost for B: it keeps serving what it knew while cut off.
    await Bun.sleep(300);
    expect(await chatStatus(b, key)).toBe(200);

    const t0 = performance.now();
    relay.restore();
    // Reconnect back-off is at most 2 s; then B resubscribes and reloads everything.
    timings.afterReconnect = await until(b, key, 401, t0, 6000);
    expect(timings.afterReconnect).toBeLessThan(4000);
  });

  test("after Redis drops every subscriber (CLIENT KILL TYPE pubsub), changes still reach B", async () => {
    const key = await newKey();
    await publishA({ kind: "key", token: sha256(key) });
    await until(b, key, 200, performance.now());
    const admin = new Redis(REDIS_URL);
    try {
      expect(Number(await admin.call("CLIENT", "KILL", "TYPE", "pubsub"))).toBeGreaterThanOrEqual(2);
    } finally {
      admin.disconnect();
    }
    // Made at once, while the subscribers are reconnecting: the message or the resync carries it.
    await dbOf().update(virtualKeys).set({ blocked: true }).where(eq(virtualKeys.token, sha256(key)));
    const t0 = performance.now();
    await publishA({ kind: "key", token: sha256(key) });
    timings.afterClientKill = await until(b, key, 401, t0, 6000);
    expect(timings.afterClientKill).toBeLessThan(3000);
  });

  test("a change made through B while its Redis is down reaches A once Redis is back", async () => {
    const key = await newKey();
    await publishA({ kind: "key", token: sha256(key) });
    await until(b, key, 200, performance.now());
    await until(a, key, 200, performance.now());

    relay.cut();
    await Bun.sleep(100);
    await dbOf().update(virtualKeys).set({ blocked: true }).where(eq(virtualKeys.token, sha256(key)));
    await b.host!.services.bus!.publish({ kind: "key", token: sha256(key) });
    expect(await chatStatus(b, key)).toBe(401);
    // A was never disconnected, so only B's late publish can tell it.
    expect(await chatStatus(a, key)).toBe(200);

    const t0 = performance.now();
    relay.restore();
    timings.lateDelivery = await until(a, key, 401, t0, 6000);
    expect(timings.lateDelivery).toBeLessThan(4000);
  });
});

describe("two instances, one PostgreSQL, no Redis (LISTEN/NOTIFY)", () => {
  let a: TestGateway;
  let b: TestGateway;
  let drop: () => Promise<void>;

  beforeAll(async () => {
    const db = await freshDatabase("gw_notify");
    drop = db.drop;
    a = await startTestGateway(CONFIG, { store: { databaseUrl: db.url } });
    b = await startTestGateway(CONFIG, { store: { databaseUrl: db.url } });
    await Promise.all([a.host!.services.bus!.subscribed(), b.host!.services.bus!.subscribed()]);
  });

  afterAll(async () => {
    await a?.stop();
    await b?.stop();
    await drop?.();
  });

  const admin = async (gw: TestGateway, path: string, body: Record<string, unknown>) => {
    const res = await fetch(gw.url + path, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    return (await res.json()) as Record<string, unknown>;
  };

  test("a key generated, then blocked through A's API is honoured by B within a second", async () => {
    let t0 = performance.now();
    const { key } = (await admin(a, "/key/generate", {})) as { key: string };
    expect(await until(b, key, 200, t0)).toBeLessThan(LIMIT_MS);
    t0 = performance.now();
    await admin(a, "/key/block", { key });
    expect(await until(b, key, 401, t0)).toBeLessThan(LIMIT_MS);
  });

  test("a management call through B sees what a call through A wrote just before, even while B's cache lags", async () => {
    await readsAfterWrites(a, b);
  });

  test("a spend reset through B (key reset_spend, key/update, team/update, user/update, global reset) lets A serve the key again within a second", async () => {
    const dollarCall = async (gw: TestGateway, key: string) => {
      const res = await fetch(`${gw.baseURL}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "dollar", messages: [{ role: "user", content: "hi" }], max_tokens: 1000 }),
      });
      await res.arrayBuffer();
      return res.status;
    };
    // Room for two calls of $1.
    const budget = 2.0000001;
    /** Spends the key's budget through A (A's own counter says it is spent), resets through B, then calls through A. */
    const resetThroughB = async (key: string, reset: () => Promise<unknown>) => {
      for (let n = 0; (await dollarCall(a, key)) === 200; n++) expect(n).toBeLessThan(3);
      await a.host!.services.spendLog?.flush();
      const t0 = performance.now();
      await reset();
      for (;;) {
        const status = await dollarCall(a, key);
        if (status === 200) break;
        expect(performance.now() - t0, `A still answers ${status}`).toBeLessThan(LIMIT_MS);
        await Bun.sleep(POLL_MS);
      }
    };
    const own = (await admin(a, "/key/generate", { max_budget: budget })) as { key: string };
    await resetThroughB(own.key, () => admin(b, `/key/${own.key}/reset_spend`, {}));
    await resetThroughB(own.key, () => admin(b, "/key/update", { key: own.key, spend: 0 }));
    await resetThroughB(own.key, () => admin(b, "/global/spend/reset", {}));
    const team = (await admin(a, "/team/new", { max_budget: budget })) as { team_id: string };
    const teamKey = (await admin(a, "/key/generate", { team_id: team.team_id })) as { key: string };
    await resetThroughB(teamKey.key, () => admin(b, "/team/update", { team_id: team.team_id, spend: 0 }));
    const user = (await admin(a, "/user/new", { max_budget: budget, auto_create_key: false })) as { user_id: string };
    const userKey = (await admin(a, "/key/generate", { user_id: user.user_id })) as { key: string };
    await resetThroughB(userKey.key, () => admin(b, "/user/update", { user_id: user.user_id, spend: 0 }));
  });

  test("a model stored through A is served by B within a second", async () => {
    const t0 = performance.now();
    await admin(a, "/model/new", { model_name: "stored-on-a", svc_params: { model: "mock/stored" } });
    for (;;) {
      const res = await fetch(`${b.baseURL}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "stored-on-a", messages: [{ role: "user", content: "hi" }] }),
      });
      await res.arrayBuffer();
      if (res.status === 200) break;
      expect(performance.now() - t0).toBeLessThan(LIMIT_MS);
      await Bun.sleep(POLL_MS);
    }
  });
});
