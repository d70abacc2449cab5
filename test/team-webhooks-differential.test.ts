// Team logging callbacks (webhooks) against an independent model of them, seeded random
// (WEBHOOK_DIFF_SEED=<n> runs another sequence; every failure names the seed and the step;
// WEBHOOK_DIFF_STATS=1 prints what a run did).
//
// A world of teams (some in an organization, some with a soft budget, one of them with a period of
// a few seconds, one that never registers a webhook), their keys (aliases, users, tags, model
// aliases; one with max_budget 0, one with rpm_limit 2, one limited to some models) and keys of no
// team. Teams register 1–3 webhooks with random headers that carry secrets (sometimes their own
// Content-Type, sometimes a token in the URL's query) and a random callback_type; along the way
// teams replace their set (some URLs kept with new headers, some dropped, some added), disable
// logging, register again, register headers no request can carry (refused, nothing changes), and
// a team admin tries a private address (refused). The webhooks are raw HTTP servers in the test:
// per webhook a profile (healthy, flaky, broken) and per delivery attempt a behaviour drawn from
// the seed: 2xx, 4xx, 5xx, a redirect (to a trap path that must never be reached), an answer held
// past the delivery timeout (shortened for the test through `webhookTiming`), or the connection
// dropped.
//
// Traffic, one to three calls at once from distinct callers: chat JSON and streams and embeddings
// with scripted usage (so tokens and cost are known), cached repeats (from any caller), upstream
// faults (500, 503, 429, a 400 that quotes the provider key, a hang past the request's timeout, a
// body or stream cut mid-way, a 500 retried with num_retries), clients that leave a stream after
// its first piece or a JSON call before its answer, calls refused by budget or rate limit (calls:
// posted) and by model access or validation (not calls: nothing is posted). Once per run: a slow
// stream while its team's set changes (the event goes to the set the call ended under), a slow
// stream across the end of a budget period (its cost belongs to the period it started in), and a
// burst of 100 calls of one team whose three webhooks hang (300 deliveries: no other webhook may
// lose its events, and a call made then must not wait behind them in Bun's fetch pool).
//
// The model predicts, per webhook, the exact multiset of events (by call id; a call that never
// showed its id by its end user) with every field (id, call_type, status, model and group,
// deployment, provider, response id, tokens, response_cost equal to x-svc-response-cost and to the
// tokens at the configured prices, cache hit, stream, times within what the client saw, key hash
// and alias, team, user, org, end user, tags, the error), the number of attempts (a 2xx ends the
// delivery, anything else is tried once more), the headers (the ones configured for the set the
// call ended under, decrypted; no others), the team's soft-budget alerts (one per budget period,
// to the webhooks of the moment, with the spend of the calls started in it; the stored team spend
// is checked against the same sums), and that no request to any webhook carries a prompt, an
// answer, a plaintext key, the provider's key or a webhook secret, and no log line or audit entry
// a webhook header value. Callback sets change only when no call is in flight (every call made so
// far has its spend-log row), but for the stream that outlives a change.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash, randomBytes } from "node:crypto";
import { createServer, type Server, type Socket } from "node:net";
import { sql } from "drizzle-orm";
import { webhookTiming } from "../core/callbacks/team-webhooks.ts";
import { rows } from "../core/store/sql.ts";
import { MASTER_KEY, requestJson, requestOk, startBackendGateway, type TestGateway } from "./harness/gateway.ts";
import { Random } from "./harness/random.ts";
import { sha256 } from "./harness/util.ts";
import { type Fault, type MockOpenAI, startMockOpenAI } from "./mock-upstream/openai.ts";
import { TEST_REDIS_URL } from "./harness/redis.ts";

const SEED = Number(process.env.WEBHOOK_DIFF_SEED || 20_261_127);
const STEPS = Number(process.env.WEBHOOK_DIFF_STEPS || 120);
const HOOK_TIMEOUT_MS = 300;
const HOOK_RETRY_MS = 100;
/** Slack for times the gateway measures around what the client measured (same clock). */
const MARGIN_MS = 60;
const UPSTREAM_KEY = `sk-upstream-credential-${randomBytes(6).toString("hex")}`;
/** The period of the team whose soft budget starts again every few seconds. */
const PERIOD = "6s";
const PERIOD_MS = 6000;

type Json = Record<string, unknown>;

// ---------------------------------------------------------------------------------------------
// Prices (pico-dollars per token) and deployments, as configured

const PRICE = {
  "gpt-a": { in: 1_500_000n, out: 6_000_000n, usdIn: 0.0000015, usdOut: 0.000006 },
  "gpt-b": { in: 2_500_000n, out: 10_000_000n, usdIn: 0.0000025, usdOut: 0.00001 },
  emb: { in: 20_000n, out: 0n, usdIn: 0.00000002, usdOut: 0 },
} as const;
type Group = keyof typeof PRICE;
const DEPLOYMENT: Record<Group, string> = { "gpt-a": "dep-gpt-a", "gpt-b": "dep-gpt-b", emb: "dep-emb" };
const UPSTREAM_MODEL: Record<Group, string> = { "gpt-a": "gpt-4o-mini", "gpt-b": "gpt-4o", emb: "text-embedding-3-small" };

const costOf = (g: Group, p: number, c: number): bigint => BigInt(p) * PRICE[g].in + BigInt(c) * PRICE[g].out;
/** USD as a JSON number: the exact pico-dollar amount over 10^12 (exact below 2^53 pico-dollars). */
const usd = (pico: bigint): number => Number(pico) / 1e12;

// ---------------------------------------------------------------------------------------------
// Webhook receivers: raw HTTP/1.1 servers, so an attempt can be answered, held or dropped

type Profile = "healthy" | "flaky" | "broken" | "blackhole";
type Behaviour = { kind: "status"; status: number } | { kind: "redirect"; status: number } | { kind: "hang" } | { kind: "drop" };

interface Arrival {
  url: string;
  /** The event's identity: its call id, or `alert:<team>:<budget_reset_at>`. */
  key: string;
  /** Earlier arrivals of the same event at the same URL. */
  n: number;
  behaviour: Behaviour;
  method: string;
  headers: Record<string, string>;
  raw: string;
  body: Json | undefined;
  at: number;
}

/** What a webhook does with an attempt: drawn from the seed, the URL, the event and the attempt, so a replay does the same. */
function behaviourOf(profile: Profile, url: string, key: string, n: number): Behaviour {
  const h = createHash("sha256").update(`${SEED}|${url}|${key}|${n}`).digest();
  const x = h.readUInt32BE(0) / 2 ** 32;
  const k = h.readUInt32BE(4);
  const ok = (): Behaviour => ({ kind: "status", status: [200, 200, 201, 202, 204][k % 5]! });
  const client = (): Behaviour => ({ kind: "status", status: [400, 401, 404, 410, 429][k % 5]! });
  const server = (): Behaviour => ({ kind: "status", status: [500, 502, 503][k % 3]! });
  const redirect = (): Behaviour => ({ kind: "redirect", status: [301, 302, 307, 308][k % 4]! });
  if (profile === "healthy") return ok();
  if (profile === "blackhole") return { kind: "hang" };
  const table: [number, () => Behaviour][] =
    profile === "flaky"
      ? [
          [0.45, ok],
          [0.1, client],
          [0.13, server],
          [0.1, () => ({ kind: "hang" })],
          [0.1, () => ({ kind: "drop" })],
          [0.12, redirect],
        ]
      : [
          [0.25, client],
          [0.25, server],
          [0.2, () => ({ kind: "hang" })],
          [0.15, () => ({ kind: "drop" })],
          [0.15, redirect],
        ];
  let acc = 0;
  for (const [p, b] of table) {
    acc += p;
    if (x < acc) return b();
  }
  return table[table.length - 1]![1]();
}

const isOk = (b: Behaviour) => b.kind === "status" && b.status >= 200 && b.status < 300;

class Receiver {
  readonly arrivals: Arrival[] = [];
  /** Requests that reached a redirect's target: a delivery must never follow a redirect. */
  readonly trapped: string[] = [];
  /** Requests the receiver could not read as one HTTP/1.1 request with a length. */
  readonly unreadable: string[] = [];
  private readonly sockets = new Set<Socket>();
  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(profiles: Map<string, Profile>): Promise<Receiver> {
    let self: Receiver | undefined;
    const server = createServer((sock) => self!.accept(sock, profiles));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const addr = server.address();
    if (!addr || typeof addr === "string") throw new Error("receiver not listening");
    self = new Receiver(server, addr.port);
    return self;
  }

  private accept(sock: Socket, profiles: Map<string, Profile>): void {
    this.sockets.add(sock);
    sock.on("close", () => this.sockets.delete(sock));
    sock.on("error", () => undefined);
    let buf = Buffer.alloc(0);
    let done = false;
    sock.on("data", (chunk: Buffer) => {
      if (done) return;
      buf = Buffer.concat([buf, chunk]);
      const end = buf.indexOf("\r\n\r\n");
      if (end < 0) return;
      const head = buf.subarray(0, end).toString("latin1");
      const [requestLine = "", ...lines] = head.split("\r\n");
      const headers: Record<string, string> = {};
      for (const l of lines) {
        const i = l.indexOf(":");
        const name = l.slice(0, i).trim().toLowerCase();
        const value = l.slice(i + 1).trim();
        headers[name] = name in headers ? `${headers[name]}, ${value}` : value;
      }
      if (headers["content-length"] === undefined) {
        done = true;
        this.unreadable.push(`${requestLine} ${JSON.stringify(headers)}`);
        sock.destroy();
        return;
      }
      const length = Number(headers["content-length"]);
      if (buf.length < end + 4 + length) return;
      done = true;
      const raw = buf.subarray(end + 4, end + 4 + length).toString("utf8");
      const [method = "", target = ""] = requestLine.split(" ");
      if (target.startsWith("/trap/")) {
        this.trapped.push(`${method} ${target}`);
        this.answer(sock, { kind: "status", status: 200 });
        return;
      }
      const url = `http://127.0.0.1:${this.port}${target}`;
      let body: Json | undefined;
      try {
        body = JSON.parse(raw) as Json;
      } catch {
        body = undefined;
      }
      const key = body?.event === "llm_call" ? String(body.id) : body ? `alert:${body.team_id}:${body.budget_reset_at}` : "(unreadable body)";
      const n = this.arrivals.filter((a) => a.url === url && a.key === key).length;
      const behaviour = behaviourOf(profiles.get(url) ?? "healthy", url, key, n);
      this.arrivals.push({ url, key, n, behaviour, method, headers, raw, body, at: Date.now() });
      this.answer(sock, behaviour, target);
    });
  }

  private answer(sock: Socket, b: Behaviour, target = ""): void {
    if (b.kind === "hang") return; // held until the gateway gives up (or the receiver stops)
    if (b.kind === "drop") {
      sock.destroy();
      return;
    }
    const head = (status: number, extra: string, body: string) =>
      `HTTP/1.1 ${status} X\r\n${extra}content-type: text/plain\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`;
    if (b.kind === "redirect") sock.end(head(b.status, `location: http://127.0.0.1:${this.port}/trap${target}\r\n`, ""));
    else sock.end(head(b.status, "", b.status === 204 ? "" : "ok"));
  }

  async stop(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

// ---------------------------------------------------------------------------------------------
// The world

interface Hook {
  url: string;
  /** Configured header names and values (as registered). */
  headers: Record<string, string>;
  profile: Profile;
}

interface Team {
  id: string;
  orgId: string | null;
  /** Soft budget in pico-dollars. */
  soft?: bigint;
  /** The first period's end (budget_reset_at at creation), for a team with a period. */
  resetAt?: number;
  hooks: Hook[];
  /** Which calls the set gets (callback_type at registration; cancelled calls count with failures). Budget alerts go to every webhook. */
  logs: "success" | "failure" | "both";
  adminKey: string;
  /** Never registers a webhook. */
  silent: boolean;
  /** Spend per budget period (period end, or "flat"), and whether its alert is expected already. */
  periods: Map<string, { spend: bigint; alerted: boolean }>;
}

type CallerKind = "normal" | "broke" | "rpm" | "restricted";

interface Caller {
  label: string;
  key: string;
  hash: string;
  team: Team | null;
  alias: string | null;
  userId: string | null;
  tags: string[];
  /** Model aliases of the key: name → group. */
  aliases: Record<string, Group>;
  kind: CallerKind;
  /** Start times of the calls that took an rpm slot. */
  slots: number[];
}

/** What the model says a webhook must receive for one call. */
interface Expected {
  step: string;
  /** The call id, when the client saw it. */
  id?: string;
  /** Else the event is found by its end user (always set for such calls). */
  endUser: string | null;
  team: Team;
  hooks: Hook[];
  caller: Caller;
  endpoint: "chat" | "embeddings";
  status: "success" | "failure" | "cancelled";
  model: string;
  group: Group;
  deployment: string;
  responseId: string | null | "any";
  /** Tokens, or "any" (an estimate: a cancelled or cut stream); the cost then follows from them. */
  tokens: { p: number; c: number } | "any";
  /** Charged at the prices (success, cancelled) or not (failure, cache hit). */
  charged: boolean;
  cacheHit: boolean;
  stream: boolean;
  tags: string[];
  /** A failure's error: the status the client got (as a string), its type where the README names it, a provider key quoted redacted. */
  error?: { code: string; type?: string; redacted?: boolean };
  t0: number;
  t1: number;
  /** The cost header the client saw (non-stream answers), as a number. */
  costHeader?: number;
  /** The id of an event that ended before this one started (a retry after it). */
  after?: string;
}

/** A team call the budget model counts (its cost, known now or read from the spend log later). */
interface Spent {
  team: Team;
  batch: number;
  period: string;
  id?: string;
  endUser: string | null;
  cost: bigint | undefined;
  step: string;
}

interface AlertExpect {
  step: string;
  team: Team;
  period: string;
  hooks: Hook[];
  /** The batch whose calls crossed the soft budget, and how many of its calls count in that period. */
  batch: number;
  calls: number;
  /** The team's spend in the period before that batch, and after it. */
  before: bigint;
  after: bigint;
}

/** A cached answer, as the model keeps it: who wrote it and what a hit repeats. */
interface CacheEntry {
  group: Group;
  tokens: { p: number; c: number };
  responseId: string | null;
}

/** A request that may be sent again (the same body but `user` and `metadata`): a cache hit when its entry is there. */
interface Cacheable {
  endpoint: "chat" | "embeddings";
  model: string;
  group: Group;
  stream: boolean;
  includeUsage: boolean;
  marker: string;
  body: Json;
}

const HEADER_NAMES = ["Authorization", "X-Webhook-Secret", "x-api-key", "X-Team-Token", "X-Signature", "x-custom-id"];
/** Headers a registration must refuse (400, nothing changes): not valid HTTP, given twice, or set by HTTP itself. */
const BAD_HEADERS: Record<string, string>[] = [
  { "X Bad Name": "v" },
  { "x-ok": "line\r\nx-injected: 1" },
  { "x-nul": "a\u0000b" },
  { "X-Dup": "a", "x-dup": "b" },
  { Host: "elsewhere.example" },
  { "Content-Length": "5" },
  { "Transfer-Encoding": "chunked" },
  { Connection: "close" },
  { "": "empty name" },
];

describe(`team webhooks against a model (WEBHOOK_DIFF_SEED=${SEED})`, () => {
  let up: MockOpenAI;
  let gw: TestGateway;
  const receivers: Receiver[] = [];
  const profiles = new Map<string, Profile>();
  const saved = { ...webhookTiming };

  beforeAll(async () => {
    webhookTiming.timeoutMs = HOOK_TIMEOUT_MS;
    webhookTiming.retryAfterMs = HOOK_RETRY_MS;
    up = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
    for (let i = 0; i < 2; i++) receivers.push(await Receiver.start(profiles));
  });
  afterAll(async () => {
    Object.assign(webhookTiming, saved);
    await gw?.stop();
    await up?.stop();
    for (const r of receivers) await r.stop();
  });

  test("every team call reaches the team's webhooks of the moment, billing metadata only", async () => {
    const started = Date.now();
    const rng = new Random(SEED);
    const redis = rng.chance(0.5);
    const cacheOn = rng.chance(0.8);
    const runTag = `${SEED}-${randomBytes(3).toString("hex")}`;
    const where = (step: number | string, extra = "") => `WEBHOOK_DIFF_SEED=${SEED} step ${step} (${redis ? "postgres + redis" : "embedded store"}, cache ${cacheOn ? "on" : "off"})${extra ? `: ${extra}` : ""}`;
    const model = (name: Group) => ({
      model_name: name,
      svc_params: { model: `openai/${UPSTREAM_MODEL[name]}`, api_base: up.url, api_key: UPSTREAM_KEY },
      model_info: { id: DEPLOYMENT[name], input_cost_per_token: PRICE[name].usdIn, output_cost_per_token: PRICE[name].usdOut },
    });
    gw = await startBackendGateway(
      redis ? "postgres" : "pglite",
      {
        model_list: [model("gpt-a"), model("gpt-b"), model("emb")],
        router_settings: { retry_initial_delay: 0.01 },
        svc_settings: { cache: cacheOn, cache_params: { mode: "default_off", type: redis ? "redis" : "local" } },
        general_settings: { master_key: MASTER_KEY },
      },
      { redisUrl: redis ? TEST_REDIS_URL : undefined, dbPrefix: "gw_webhook_diff" },
    );

    // --- teams, users, keys
    const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: `wh-org-${runTag}` });
    const teams: Team[] = [];
    const callers: Caller[] = [];
    const teamCount = 3 + rng.int(3);
    const silentTeam = rng.int(teamCount);
    const kinds: CallerKind[] = ["broke", "rpm", "restricted"];
    let keyNo = 0;
    const newKey = async (team: Team | null, kind: CallerKind, userId: string | null): Promise<Caller> => {
      const alias = rng.chance(0.7) ? `alias-${runTag}-${keyNo}` : null;
      const tags = rng.chance(0.5) ? rng.some(["key-tag-a", "key-tag-b", "prod"], 2) : [];
      const aliases: Record<string, Group> = kind !== "restricted" && rng.chance(0.4) ? { fast: rng.pick(["gpt-a", "gpt-b"] as const) } : {};
      const body: Json = { team_id: team?.id, user_id: userId ?? undefined, key_alias: alias ?? undefined, tags: tags.length ? tags : undefined, aliases: Object.keys(aliases).length ? aliases : undefined };
      if (kind === "broke") body.max_budget = 0;
      if (kind === "rpm") body.rpm_limit = 2;
      if (kind === "restricted") body.models = ["gpt-a", "emb"];
      const made = await requestOk<{ key: string }>(gw, "POST", "/key/generate", body);
      const c: Caller = { label: `key ${keyNo++} (${kind}${team ? ` of ${team.id}` : ", no team"})`, key: made.key, hash: sha256(made.key), team, alias, userId, tags, aliases, kind, slots: [] };
      callers.push(c);
      return c;
    };
    for (let i = 0; i < teamCount; i++) {
      const id = `wh-${runTag}-t${i}`;
      const inOrg = rng.chance(0.5);
      const soft = i === 0 ? 10_000_000_000n : i === 1 ? 6_000_000_000n : rng.chance(0.3) ? 8_000_000_000n : undefined;
      const adminUser = `wh-${runTag}-admin${i}`;
      await requestOk(gw, "POST", "/user/new", { user_id: adminUser });
      const body: Json = { team_id: id, members_with_roles: [{ role: "admin", user_id: adminUser }] };
      if (inOrg) body.organization_id = org.organization_id;
      if (soft !== undefined) body.soft_budget = usd(soft);
      if (i === 1) body.budget_duration = PERIOD;
      await requestOk(gw, "POST", "/team/new", body);
      const team: Team = { id, orgId: inOrg ? org.organization_id : null, soft, hooks: [], logs: "both", adminKey: "", silent: i === silentTeam, periods: new Map() };
      if (i === 1) {
        const info = await requestOk<{ team_info: { budget_reset_at: string } }>(gw, "GET", `/team/info?team_id=${id}`);
        team.resetAt = Date.parse(info.team_info.budget_reset_at);
        expect(Number.isFinite(team.resetAt), where("setup", `budget_reset_at of the team with a period: ${JSON.stringify(info.team_info)}`)).toBe(true);
      }
      teams.push(team);
      const admin = await newKey(team, "normal", adminUser);
      team.adminKey = admin.key;
      const more = 1 + rng.int(2);
      for (let j = 0; j < more; j++) {
        const userId = rng.chance(0.5) ? `wh-${runTag}-u${i}-${j}` : null;
        if (userId) await requestOk(gw, "POST", "/user/new", { user_id: userId });
        await newKey(team, kinds.shift() ?? "normal", userId);
      }
    }
    // Special keys not yet placed go to random teams.
    for (const kind of kinds) await newKey(rng.pick(teams), kind, null);
    const plain = await newKey(null, "normal", null);
    callers.push({ ...plain, label: "master key", key: MASTER_KEY, hash: sha256(MASTER_KEY), alias: null, tags: [], aliases: {}, slots: [] });

    // --- the model's state
    const expected: Expected[] = [];
    const spent: Spent[] = [];
    const alerts: AlertExpect[] = [];
    /** Call ids and end users of every call that must have ended before the next barrier passes. */
    const pendingIds = new Set<string>();
    const pendingUsers = new Set<string>();
    const cache = new Map<string, CacheEntry>();
    const cacheables: Cacheable[] = [];
    const secrets = new Set<string>([MASTER_KEY, UPSTREAM_KEY, ...callers.map((c) => c.key)]);
    const stats = { calls: 0, events: 0, hits: 0, refused: 0, silent: 0, faults: 0, retried: 0, leftStream: 0, leftJson: 0, acrossChange: 0, acrossPeriod: 0, burst: 0, callbackWrites: 0, disabled: 0, alerts: 0, batches: 0 };
    let hookNo = 0;
    let batchNo = 0;
    let markerNo = 0;

    const newHook = (team: Team): Hook => {
      const r = rng.pick(receivers);
      const token = `qs-${randomBytes(6).toString("hex")}`;
      const query = rng.chance(0.3) ? `?token=${token}&n=${hookNo}` : "";
      if (query) secrets.add(token);
      const url = `http://127.0.0.1:${r.port}/hooks/${team.id}/${hookNo++}${query}`;
      const profile: Profile = rng.pick(["healthy", "healthy", "flaky", "flaky", "broken"] as const);
      profiles.set(url, profile);
      return { url, headers: newHeaders(), profile };
    };
    const newHeaders = (): Record<string, string> => {
      const out: Record<string, string> = {};
      for (const name of rng.some(HEADER_NAMES, 3).slice(0, rng.int(4))) {
        const secret = `whsec-${randomBytes(8).toString("hex")}`;
        secrets.add(secret);
        out[name] = name === "Authorization" ? `Bearer ${secret}` : secret;
      }
      // A content type of the team's own replaces the gateway's (the body is JSON either way).
      if (rng.chance(0.12)) out["Content-Type"] = rng.pick(["application/json", "application/cloudevents+json", "application/json; charset=utf-8"]);
      return out;
    };

    /** Every call made so far has ended (its spend-log row is written); costs read back; alerts due are sent. */
    const barrier = async (step: string) => {
      const host = gw.host!;
      type Row = { call_id: string; end_user: string | null; spend: string };
      let found: Row[] = [];
      const deadline = Date.now() + 15_000;
      for (;;) {
        await host.spendWriter.flush();
        const ids = [...pendingIds];
        const users = [...pendingUsers];
        if (ids.length === 0 && users.length === 0) break;
        const list = (xs: string[]) => sql.raw(`(${xs.length ? xs.map((x) => `'${x.replaceAll("'", "''")}'`).join(",") : "''"})`);
        found = await rows<Row>(host.store.db, sql`select call_id, end_user, spend::text as spend from spend_logs where call_id in ${list(ids)} or end_user in ${list(users)}`);
        for (const r of found) {
          pendingIds.delete(r.call_id);
          if (r.end_user) pendingUsers.delete(r.end_user);
          for (const s of spent) {
            if (s.cost === undefined && ((s.id && s.id === r.call_id) || (!s.id && s.endUser && s.endUser === r.end_user))) s.cost = BigInt(Math.round(Number(r.spend) * 1e12));
          }
        }
        if (pendingIds.size === 0 && pendingUsers.size === 0) break;
        if (Date.now() > deadline) throw new Error(where(step, `calls that never ended (no spend-log row): ${JSON.stringify([...pendingIds, ...pendingUsers])}`));
        await Bun.sleep(50);
      }
      // Soft budgets: per team and period, the spend of the calls started in it; the first batch that reaches the soft budget sends one alert.
      for (const s of spent.splice(0)) {
        const t = s.team;
        if (t.soft === undefined) continue;
        if (s.cost === undefined) throw new Error(where(step, `no cost known for ${s.step}`));
        const p = t.periods.get(s.period) ?? { spend: 0n, alerted: false };
        t.periods.set(s.period, p);
        const before = p.spend;
        p.spend += s.cost;
        if (!p.alerted && p.spend >= t.soft) {
          p.alerted = true;
          // Calls of one batch end in any order: the spend the alert reports is between the soft budget and the batch's total.
          // The spend it reports is exact when one call crossed it alone, else between the soft budget and the batch's total.
          alerts.push({ step: s.step, team: t, period: s.period, hooks: [...t.hooks], batch: s.batch, calls: 1, before, after: p.spend });
        } else if (p.alerted) {
          const a = alerts.find((x) => x.team === t && x.period === s.period);
          if (a && a.batch === s.batch) {
            a.calls++;
            a.after = p.spend;
          }
        }
      }
      // A team's stored spend is that of the calls started in its current period (the row's budget_reset_at; the roller may be a moment behind).
      for (const t of teams) {
        if (t.soft === undefined) continue;
        const [row] = await rows<{ spend: string; reset: Date | string | null }>(host.store.db, sql`select spend::text as spend, budget_reset_at as reset from teams where team_id = ${t.id}`);
        const period = row?.reset == null ? "flat" : String(new Date(row.reset).getTime());
        const stored = BigInt(Math.round(Number(row?.spend ?? 0) * 1e12));
        const model = t.periods.get(period)?.spend ?? 0n;
        if (stored !== model) throw new Error(where(step, `team ${t.id}: stored spend ${usd(stored)} for the period ${period === "flat" ? "(none)" : `ending ${new Date(Number(period)).toISOString()}`}, the model says ${usd(model)} (the calls started in it)`));
      }
      // The alerts the model expects were sent (the store row decides; then they are posted to the team's webhooks of the moment).
      const sentDeadline = Date.now() + 5000;
      while (host.alerts.sent.filter((a) => a.event === "soft_budget_crossed").length < alerts.length && Date.now() < sentDeadline) await Bun.sleep(20);
    };

    const periodOf = (team: Team, at: number): string => {
      if (team.soft === undefined) return "none";
      if (team.resetAt === undefined) return "flat";
      if (at < team.resetAt) return String(team.resetAt);
      return String(team.resetAt + (Math.floor((at - team.resetAt) / PERIOD_MS) + 1) * PERIOD_MS);
    };

    // --- callback writes
    const viewOf = (team: Team) => ({
      team_id: team.id,
      success_callbacks: team.hooks.length && team.logs !== "failure" ? ["webhook"] : [],
      failure_callbacks: team.hooks.length && team.logs !== "success" ? ["webhook"] : [],
      callback_vars: { webhooks: team.hooks.map((h) => ({ url: h.url, headers: Object.fromEntries(Object.keys(h.headers).map((k) => [k, "[redacted]"])) })) },
    });
    const checkView = (step: string, team: Team, data: Json) => {
      expect(data, where(step, `the callback settings of ${team.id} as answered`)).toEqual(viewOf(team));
      const text = JSON.stringify(data);
      // The URL (a token in its query too) is shown to the team's admins; header values never are.
      for (const s of secrets) if (!s.startsWith("qs-") && text.includes(s)) throw new Error(where(step, `a secret in the callback settings answer: ${text}`));
    };
    const register = async (step: string, team: Team, hooks: Hook[], key = MASTER_KEY) => {
      // callback_type: which calls the webhooks get (LiteLLM's names); absent, both.
      const type = rng.pick([undefined, undefined, "success_and_failure", "success", "failure"] as const);
      const r = await requestJson<{ status: string; data: Json }>(gw, "POST", `/team/${team.id}/callback`, {
        key,
        body: { ...(type ? { callback_type: type } : {}), callbacks: hooks.map((h) => ({ callback_type: "webhook", url: h.url, headers: h.headers })) },
      });
      expect(r.status, where(step, `register ${type ?? ""} ${JSON.stringify(hooks)}: ${r.text}`)).toBe(200);
      team.hooks = hooks;
      team.logs = type === "success" ? "success" : type === "failure" ? "failure" : "both";
      stats.callbackWrites++;
      checkView(step, team, r.body.data);
    };
    /** The next set of a team: a new one, or (rotate) some URLs kept (with new headers, or the same), some dropped, some added. */
    const nextSet = (team: Team, rotate: boolean): Hook[] => {
      const next: Hook[] = [];
      if (rotate) for (const h of team.hooks) if (rng.chance(0.7)) next.push(rng.chance(0.5) ? { ...h, headers: newHeaders() } : h);
      while (next.length === 0 || (next.length < 3 && rng.chance(0.35))) next.push(newHook(team));
      return next;
    };
    for (const [i, team] of teams.entries()) {
      if (!team.silent && rng.chance(0.8)) await register(`setup ${i}`, team, Array.from({ length: 1 + rng.int(3) }, () => newHook(team)));
    }

    const callbackStep = async (step: string) => {
      const team = rng.pick(teams.filter((t) => !t.silent));
      const op = rng.pick(["replace", "replace", "rotate", "disable", "admin-private", "read", "bad-headers", "during-stream", "during-stream"] as const);
      if (op === "read") {
        const key = rng.chance(0.5) ? team.adminKey : MASTER_KEY;
        const r = await requestJson<{ data: Json }>(gw, "GET", `/team/${team.id}/callback`, { key });
        expect(r.status, where(step, r.text)).toBe(200);
        checkView(step, team, r.body.data);
        return;
      }
      if (op === "admin-private") {
        // A team admin may not point a webhook at this machine: refused, nothing changes.
        const r = await requestJson<{ error: { message: string } }>(gw, "POST", `/team/${team.id}/callback`, {
          key: team.adminKey,
          body: { callbacks: [{ callback_type: "webhook", url: `http://127.0.0.1:${receivers[0]!.port}/hooks/private`, headers: { "x-api-key": "whsec-never-registered" } }] },
        });
        expect([r.status, r.body.error?.message?.includes("only a proxy admin")], where(step, `a team admin registering a private address: ${r.text}`)).toEqual([400, true]);
        return;
      }
      if (op === "bad-headers") {
        // A header no request could carry (or one HTTP sets itself) is refused when registered, not found out at every delivery.
        const bad = rng.pick(BAD_HEADERS);
        const hooks = [...nextSet(team, true)];
        const r = await requestJson<{ error: { param: string } }>(gw, "POST", `/team/${team.id}/callback`, {
          body: { callbacks: hooks.map((h, i) => ({ callback_type: "webhook", url: h.url, headers: i === 0 ? { ...h.headers, ...bad } : h.headers })) },
        });
        // A NUL is refused as the store cannot hold it (422, naming the header, as any field); the others with a 400.
        const nul = Object.values(bad).some((v) => v.includes("\u0000"));
        expect([r.status, r.body.error?.param], where(step, `webhook headers ${JSON.stringify(bad)}: ${r.text}`)).toEqual(nul ? [422, `callbacks.0.headers.${Object.keys(bad)[0]}`] : [400, "callbacks"]);
        const read = await requestJson<{ data: Json }>(gw, "GET", `/team/${team.id}/callback`);
        checkView(`${step} (after a refused registration)`, team, read.body.data);
        return;
      }
      await barrier(step);
      if (op === "during-stream") {
        // The set changes while a call of the team streams: its event goes to the set it ended under.
        const caller = callers.find((c) => c.team === team && (c.kind === "normal" || c.kind === "restricted"));
        if (caller) {
          await slowStreamCall(step, caller, team, "callbacks");
          return;
        }
      }
      if (op === "disable") {
        await disable(step, team);
        return;
      }
      await register(step, team, nextSet(team, op === "rotate"));
    };
    const disable = async (step: string, team: Team) => {
      const r = await requestJson<{ data: Json }>(gw, "POST", `/team/${team.id}/disable_logging`, { key: rng.chance(0.5) ? team.adminKey : MASTER_KEY });
      expect(r.status, where(step, r.text)).toBe(200);
      team.hooks = [];
      team.logs = "both";
      stats.disabled++;
      checkView(step, team, r.body.data);
    };

    // --- calls
    interface Plan {
      caller: Caller;
      run: () => Promise<void>;
    }

    const marker = () => `m${runTag}x${markerNo++}`;
    const randomUsage = (embeddings: boolean) => {
      const p = 5 + rng.int(2500);
      const c = embeddings ? 0 : 1 + rng.int(600);
      return { p, c };
    };
    const userField = (): string | undefined => (rng.chance(0.7) ? `end-user-${runTag}-${markerNo}-${rng.int(1e6)}` : undefined);
    const bodyTags = (): string[] => (rng.chance(0.4) ? rng.some(["req-a", "req-b", "prod"], 2) : []);
    const expectedTags = (caller: Caller, fromBody: string[]) => [...new Set([...fromBody, ...caller.tags])].sort();

    /** The model name a caller sends for a group: the group itself, or a key alias of it. */
    const modelName = (caller: Caller, group: Group): string => {
      const alias = Object.entries(caller.aliases).find(([, g]) => g === group);
      return alias && rng.chance(0.5) ? alias[0] : group;
    };
    /** Whether the caller may use the group (a model-access refusal is not a call: nothing is logged or posted). */
    const mayUse = (caller: Caller, group: Group) => caller.kind !== "restricted" || group === "gpt-a" || group === "emb";

    /** The first chunk id of a stream the client read (the response id), if any. */
    const streamId = (text: string): string | null => {
      for (const e of text.split("\n\n")) {
        if (!e.startsWith("data: {")) continue;
        try {
          const id = (JSON.parse(e.slice(6)) as { id?: unknown }).id;
          if (typeof id === "string") return id;
        } catch {
          // a torn piece
        }
      }
      return null;
    };
    const streamUsage = (text: string): { p: number; c: number } | undefined => {
      for (const e of text.split("\n\n")) {
        if (!e.startsWith("data: {")) continue;
        const u = (JSON.parse(e.slice(6)) as { usage?: { prompt_tokens: number; completion_tokens: number } | null }).usage;
        if (u) return { p: u.prompt_tokens, c: u.completion_tokens };
      }
      return undefined;
    };

    const post = (caller: Caller, path: string, body: Json, signal?: AbortSignal) =>
      fetch(`${gw.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${caller.key}`, "content-type": "application/json" }, body: JSON.stringify(body), signal });

    /** Rate limit: whether a call of the caller now takes a slot (else a 429); undefined when a 60 s window edge makes it either way. */
    const rpmVerdict = (caller: Caller, t0: number): boolean | undefined => {
      if (caller.kind !== "rpm") return true;
      const live = caller.slots.filter((s) => s > t0 - 60_000 + MARGIN_MS);
      const edge = caller.slots.filter((s) => s <= t0 - 60_000 + MARGIN_MS && s > t0 - 60_000 - MARGIN_MS);
      if (edge.length > 0) return undefined;
      return live.length < 2;
    };

    const teamExpect = (e: Omit<Expected, "team" | "hooks">) => {
      const t = e.caller.team;
      if (!t) return;
      const logs = t.logs === "both" || (t.logs === "success") === (e.status === "success");
      expected.push({ ...e, team: t, hooks: logs ? [...t.hooks] : [] });
    };
    const spend = (caller: Caller, step: string, t0: number, cost: bigint | undefined, id: string | undefined, endUser: string | null) => {
      if (caller.team) spent.push({ team: caller.team, batch: batchNo, period: periodOf(caller.team, t0), id, endUser, cost, step });
    };

    /** One call of a random kind from `caller`. */
    const planCall = (caller: Caller, step: string, usedBodies: Set<string>): Plan => {
      const kindRoll = rng.next();
      const tags = bodyTags();
      const user = userField();
      const extra: Json = {};
      if (user) extra.user = user;
      if (tags.length || rng.chance(0.1)) extra.metadata = { tags };
      const common = { caller, endUser: user ?? null, tags: expectedTags(caller, tags) };

      // A cached repeat of an earlier request (same body; user and metadata may differ).
      const repeatable = cacheables.filter((c) => !usedBodies.has(c.marker) && mayUse(caller, c.group));
      if (cacheOn && repeatable.length > 0 && kindRoll < 0.14) {
        const c = rng.pick(repeatable.slice(-10));
        usedBodies.add(c.marker);
        return { caller, run: () => cachedCall(step, caller, c, extra, common) };
      }
      if (kindRoll < 0.2) return { caller, run: () => silentCall(step, caller, extra) };
      const endpoint = rng.chance(0.2) ? "embeddings" : "chat";
      const group: Group = endpoint === "embeddings" ? "emb" : rng.pick(["gpt-a", "gpt-b"] as const);
      if (!mayUse(caller, group)) return { caller, run: () => silentCall(step, caller, extra, group) };
      const name = endpoint === "embeddings" ? "emb" : modelName(caller, group);
      const m = marker();
      usedBodies.add(m);
      const stream = endpoint === "chat" && rng.chance(0.4);
      const includeUsage = stream && rng.chance(0.5);
      const body: Json =
        endpoint === "chat"
          ? { model: name, messages: [{ role: "user", content: `confidential-prompt ${m} please answer` }], ...(stream ? { stream: true } : {}), ...(includeUsage ? { stream_options: { include_usage: true } } : {}) }
          : { model: name, input: `confidential-prompt ${m} embed me` };
      const fate = rng.next();
      if (caller.kind === "broke" || caller.kind === "rpm" || fate < 0.62) {
        const caching = cacheOn && rng.chance(0.35);
        if (caching) body.caching = true;
        return { caller, run: () => successCall(step, caller, { endpoint, model: name, group, stream, includeUsage, marker: m, body }, extra, common, caching) };
      }
      if (endpoint === "chat" && fate < 0.72) return { caller, run: () => faultCall(step, caller, name, group, stream, m, body, extra, common) };
      if (endpoint === "chat" && fate < 0.8) return { caller, run: () => retriedCall(step, caller, name, group, stream, m, body, extra, common) };
      if (endpoint === "chat" && stream && fate < 0.9) return { caller, run: () => leftStream(step, caller, name, group, m, body, extra, common) };
      if (endpoint === "chat" && !stream && fate < 0.9) return { caller, run: () => leftJson(step, caller, name, group, m, body, extra, common) };
      return { caller, run: () => successCall(step, caller, { endpoint, model: name, group, stream, includeUsage, marker: m, body }, extra, common, false) };
    };

    type Common = { caller: Caller; endUser: string | null; tags: string[] };

    /** A refusal the model predicts for the caller before any deployment is asked (budget, rate limit), or undefined. */
    const refusalOf = (caller: Caller, t0: number): { status: number; type: string } | "either" | undefined => {
      if (caller.kind === "broke") return { status: 400, type: "budget_exceeded" };
      const slot = rpmVerdict(caller, t0);
      if (slot === undefined) return "either";
      return slot ? undefined : { status: 429, type: "rate_limit_error" };
    };

    /** Checks a refusal the client got and expects its event. */
    const refused = (step: string, res: Response, text: string, r: { status: number; type: string }, c: { endpoint: "chat" | "embeddings"; model: string; group: Group; stream: boolean }, common: Common, t0: number, t1: number) => {
      stats.refused++;
      expect([res.status, (JSON.parse(text) as { error?: { type?: string } }).error?.type], where(step, `refused: ${text}`)).toEqual([r.status, r.type]);
      const id = res.headers.get("x-svc-call-id");
      expect(id, where(step, "a refused call says its id")).toBeTruthy();
      pendingIds.add(id!);
      teamExpect({ step, id: id!, ...common, endpoint: c.endpoint, status: "failure", model: c.model, group: c.group, deployment: "", responseId: null, tokens: { p: 0, c: 0 }, charged: false, cacheHit: false, stream: c.stream, error: { code: String(r.status), type: r.type }, t0, t1 });
      spend(common.caller, step, t0, 0n, id!, common.endUser);
    };

    /** A call of the rpm-limited key that the limiter let through takes a slot (a window edge: as the answer says). */
    const takeSlot = (caller: Caller, t0: number, status: number) => {
      if (caller.kind !== "rpm") return;
      const verdict = rpmVerdict(caller, t0);
      if (verdict === true || (verdict === undefined && status !== 429)) caller.slots.push(t0);
    };

    const successCall = async (step: string, caller: Caller, c: Cacheable, extra: Json, common: Common, caching: boolean) => {
      stats.calls++;
      // Every draw before the first await: calls run at once, and the seed must replay the same sequence.
      const usage = randomUsage(c.endpoint === "embeddings");
      const resend = rng.chance(0.3);
      const content = `confidential-answer ${c.marker} here`;
      const t0 = Date.now();
      const refusal = refusalOf(caller, t0);
      if (refusal === undefined || refusal === "either") up.fault(scripted(c, usage, content));
      const res = await post(caller, c.endpoint === "chat" ? "/v1/chat/completions" : "/v1/embeddings", { ...c.body, ...extra });
      const text = await res.text();
      const t1 = Date.now();
      const label = `${step} ${caller.label} ${c.endpoint} ${c.model}${c.stream ? " stream" : ""}${caching ? " caching" : ""}`;
      takeSlot(caller, t0, res.status);
      if (refusal !== undefined && (refusal !== "either" || res.status === 429)) {
        refused(label, res, text, refusal === "either" ? { status: 429, type: "rate_limit_error" } : refusal, c, common, t0, t1);
        return;
      }
      expect(res.status, where(label, text)).toBe(200);
      expect(res.headers.get("x-svc-cache-hit"), where(label, "a new request is a miss")).toBeNull();
      const id = res.headers.get("x-svc-call-id")!;
      pendingIds.add(id);
      let responseId: string | null;
      let costHeader: number | undefined;
      if (c.stream) {
        expect(text.endsWith("data: [DONE]\n\n"), where(label, text)).toBe(true);
        responseId = streamId(text);
        if (c.includeUsage) expect(streamUsage(text), where(label, "the usage the client saw")).toEqual(usage);
      } else {
        const json = JSON.parse(text) as { id?: string; usage: { prompt_tokens: number; completion_tokens?: number } };
        responseId = json.id ?? null;
        expect({ p: json.usage.prompt_tokens, c: json.usage.completion_tokens ?? 0 }, where(label, "the usage the client saw")).toEqual(usage);
        costHeader = Number(res.headers.get("x-svc-response-cost"));
        expect(costHeader, where(label, "x-svc-response-cost")).toBe(usd(costOf(c.group, usage.p, usage.c)));
      }
      teamExpect({ step: label, id, ...common, endpoint: c.endpoint, status: "success", model: c.model, group: c.group, deployment: DEPLOYMENT[c.group], responseId, tokens: usage, charged: true, cacheHit: false, stream: c.stream, t0, t1, costHeader });
      spend(caller, label, t0, costOf(c.group, usage.p, usage.c), id, common.endUser);
      // Sent again later (by any caller: the model name must be the group's own, not a key's alias).
      const known = cacheables.some((x) => x.marker === c.marker);
      if (caching) {
        cache.set(c.marker, { group: c.group, tokens: usage, responseId });
        if (!known && c.model === c.group) cacheables.push(c);
      } else if (cacheOn && !known && c.model === c.group && resend) {
        // Sent again with caching later: a miss then (nothing was stored), which then stores it.
        cacheables.push({ ...c, body: { ...c.body, caching: true } });
      }
    };

    const scripted = (c: { endpoint: "chat" | "embeddings"; marker: string }, usage: { p: number; c: number }, content: string): Fault =>
      c.endpoint === "chat"
        ? { kind: "scripted", match: c.marker, answer: { choices: [{ content, finishReason: "stop" }], usage: { prompt_tokens: usage.p, completion_tokens: usage.c, total_tokens: usage.p + usage.c } } }
        : { kind: "answer", match: c.marker, body: { object: "list", data: [{ object: "embedding", index: 0, embedding: [0.25, -0.5, 0.125] }], model: UPSTREAM_MODEL.emb, usage: { prompt_tokens: usage.p, total_tokens: usage.p } } };

    /** A repeat of a cacheable request: a hit when the model holds its entry, else a miss that stores it. */
    const cachedCall = async (step: string, caller: Caller, c: Cacheable, extra: Json, common: Common) => {
      const entry = cache.get(c.marker);
      const body = { ...c.body, caching: true };
      if (!entry) {
        await successCall(step, caller, { ...c, body }, extra, common, true);
        return;
      }
      stats.calls++;
      const label = `${step} ${caller.label} repeat of ${c.marker} (${c.endpoint} ${c.model}${c.stream ? " stream" : ""}, cached)`;
      const t0 = Date.now();
      const res = await post(caller, c.endpoint === "chat" ? "/v1/chat/completions" : "/v1/embeddings", { ...body, ...extra });
      const text = await res.text();
      const t1 = Date.now();
      // A caller over its budget gets the refusal a miss gets; a hit takes no rate-limit slot.
      if (caller.kind === "broke") {
        refused(label, res, text, { status: 400, type: "budget_exceeded" }, c, common, t0, t1);
        return;
      }
      stats.hits++;
      expect([res.status, res.headers.get("x-svc-cache-hit")], where(label, text)).toEqual([200, "true"]);
      expect(res.headers.get("x-svc-response-cost"), where(label)).toBe("0");
      const id = res.headers.get("x-svc-call-id")!;
      pendingIds.add(id);
      teamExpect({ step: label, id, ...common, endpoint: c.endpoint, status: "success", model: c.model, group: c.group, deployment: DEPLOYMENT[entry.group], responseId: entry.responseId, tokens: entry.tokens, charged: false, cacheHit: true, stream: c.stream, t0, t1, costHeader: c.stream ? undefined : 0 });
      spend(caller, label, t0, 0n, id, common.endUser);
    };

    /** Not a call: a model the key may not use, or a body that fails validation; nothing is posted anywhere. */
    const silentCall = async (step: string, caller: Caller, extra: Json, group?: Group) => {
      stats.silent++;
      const invalid = group === undefined;
      const body: Json = invalid ? { model: "gpt-a", messages: [{ role: "user", content: `confidential-prompt ${marker()}` }], temperature: 7 } : { model: group, messages: [{ role: "user", content: `confidential-prompt ${marker()}` }] };
      const res = await post(caller, "/v1/chat/completions", { ...body, ...extra });
      const text = await res.text();
      expect(res.status, where(`${step} ${caller.label} ${invalid ? "invalid body" : `model ${group} not allowed`}`, text)).toBe(invalid ? 422 : 401);
    };

    /** An upstream fault: the error the client gets is the call's error. */
    const faultCall = async (step: string, caller: Caller, name: string, group: Group, stream: boolean, m: string, body: Json, extra: Json, common: Common) => {
      stats.calls++;
      stats.faults++;
      const kind = rng.pick(["500", "503", "429", "400-credential", "timeout", "cut"] as const);
      const label = `${step} ${caller.label} chat ${name}${stream ? " stream" : ""} upstream ${kind}`;
      const fault: Fault =
        kind === "500" || kind === "503" || kind === "429"
          ? { kind: "status", status: Number(kind), match: m, headers: { "retry-after": "0" } }
          : kind === "400-credential"
            ? { kind: "status", status: 400, match: m, body: { error: { message: `Invalid request with api key ${UPSTREAM_KEY}`, type: "invalid_request_error", param: null, code: null } } }
            : kind === "timeout"
              ? { kind: "hang", match: m }
              : { kind: "cutStream", afterChunks: 1 + rng.int(2), match: m };
      up.fault(fault);
      const sent = { ...body, ...extra, ...(kind === "timeout" ? { timeout: 0.3 } : {}) };
      const t0 = Date.now();
      const res = await post(caller, "/v1/chat/completions", sent);
      const text = await res.text();
      const t1 = Date.now();
      const id = res.headers.get("x-svc-call-id");
      expect(id, where(label, `${res.status} ${text}`)).toBeTruthy();
      pendingIds.add(id!);
      const status = kind === "400-credential" ? 400 : kind === "timeout" ? 408 : kind === "cut" ? 503 : Number(kind);
      if (kind === "cut" && stream) {
        expect([res.status, text.includes('data: {"error"'), text.includes("[DONE]")], where(label, text)).toEqual([200, true, false]);
      } else {
        expect(res.status, where(label, text)).toBe(status);
      }
      if (kind === "400-credential") expect(text.includes(UPSTREAM_KEY), where(label, `the provider key reached the client: ${text}`)).toBe(false);
      teamExpect({
        step: label,
        id: id!,
        ...common,
        endpoint: "chat",
        status: "failure",
        model: name,
        group,
        deployment: DEPLOYMENT[group],
        responseId: kind === "cut" && stream ? streamId(text) : null,
        tokens: kind === "cut" && stream ? "any" : { p: 0, c: 0 },
        charged: false,
        cacheHit: false,
        stream,
        error: { code: String(status), redacted: kind === "400-credential" ? true : undefined },
        t0,
        t1,
      });
      spend(caller, label, t0, 0n, id!, common.endUser);
    };

    /** A 500 (or 503) retried once on the same deployment: the failed attempt is its own event, the answer the retry's (`<id>-1`). */
    const retriedCall = async (step: string, caller: Caller, name: string, group: Group, stream: boolean, m: string, body: Json, extra: Json, common: Common) => {
      stats.calls++;
      stats.retried++;
      const first = rng.pick([500, 503]);
      const usage = randomUsage(false);
      up.fault({ kind: "status", status: first, match: m, headers: { "retry-after": "0" } }, scripted({ endpoint: "chat", marker: m }, usage, `confidential-answer ${m} retried`));
      const label = `${step} ${caller.label} chat ${name}${stream ? " stream" : ""} upstream ${first} then retried`;
      const t0 = Date.now();
      const res = await post(caller, "/v1/chat/completions", { ...body, ...extra, num_retries: 1 });
      const text = await res.text();
      const t1 = Date.now();
      expect(res.status, where(label, text)).toBe(200);
      const id = res.headers.get("x-svc-call-id")!;
      expect(id.endsWith("-1"), where(label, `the answer is the retry's: ${id}`)).toBe(true);
      const base = id.slice(0, -2);
      pendingIds.add(id);
      pendingIds.add(base);
      const costHeader = stream ? undefined : Number(res.headers.get("x-svc-response-cost"));
      teamExpect({ step: `${label} (first attempt)`, id: base, ...common, endpoint: "chat", status: "failure", model: name, group, deployment: DEPLOYMENT[group], responseId: null, tokens: { p: 0, c: 0 }, charged: false, cacheHit: false, stream, error: { code: String(first) }, t0, t1 });
      teamExpect({ step: `${label} (retry)`, id, ...common, endpoint: "chat", status: "success", model: name, group, deployment: DEPLOYMENT[group], responseId: stream ? streamId(text) : (JSON.parse(text) as { id: string }).id, tokens: usage, charged: true, cacheHit: false, stream, t0, t1, costHeader, after: base });
      if (costHeader !== undefined) expect(costHeader, where(label, "x-svc-response-cost")).toBe(usd(costOf(group, usage.p, usage.c)));
      spend(caller, label, t0, 0n, base, null);
      spend(caller, label, t0, costOf(group, usage.p, usage.c), id, common.endUser);
    };

    /** A client that leaves a stream after its first piece: a cancelled call, charged for what it used (an estimate). */
    const leftStream = async (step: string, caller: Caller, name: string, group: Group, m: string, body: Json, extra: Json, common: Common) => {
      stats.calls++;
      stats.leftStream++;
      up.fault({ kind: "slowStream", chunkDelayMs: 40, chunks: 40, match: m });
      const label = `${step} ${caller.label} chat ${name} stream left after the first piece`;
      const abort = new AbortController();
      const t0 = Date.now();
      const res = await post(caller, "/v1/chat/completions", { ...body, ...extra }, abort.signal);
      expect(res.status, where(label)).toBe(200);
      const id = res.headers.get("x-svc-call-id")!;
      const reader = res.body!.getReader();
      const first = await reader.read();
      abort.abort();
      await reader.cancel().catch(() => undefined);
      pendingIds.add(id);
      const seen = first.value ? new TextDecoder().decode(first.value) : "";
      // It ends when the gateway notices the client left: no bound on its end time.
      teamExpect({ step: label, id, ...common, endpoint: "chat", status: "cancelled", model: name, group, deployment: DEPLOYMENT[group], responseId: streamId(seen) ?? "any", tokens: "any", charged: true, cacheHit: false, stream: true, t0, t1: Number.POSITIVE_INFINITY });
      spend(caller, label, t0, undefined, id, common.endUser);
    };

    /** A client that leaves a JSON call before the answer: cancelled, charged its prompt, its id never seen (found by its end user). */
    const leftJson = async (step: string, caller: Caller, name: string, group: Group, m: string, body: Json, extra: Json, common: Common) => {
      stats.calls++;
      stats.leftJson++;
      const endUser = `left-${runTag}-${m}`;
      up.fault({ kind: "hang", match: m });
      const label = `${step} ${caller.label} chat ${name} left before the answer`;
      const abort = new AbortController();
      const t0 = Date.now();
      const sending = post(caller, "/v1/chat/completions", { ...body, ...extra, user: endUser }, abort.signal).catch(() => undefined);
      // Left once the upstream has the request.
      const before = up.requests.length;
      for (let i = 0; i < 100 && !up.requests.slice(before).some((r) => JSON.stringify(r.body).includes(m)); i++) await Bun.sleep(10);
      await Bun.sleep(20);
      abort.abort();
      await sending;
      pendingUsers.add(endUser);
      // Charged its prompt (an estimate): the upstream had the request.
      teamExpect({ step: label, ...common, endUser, endpoint: "chat", status: "cancelled", model: name, group, deployment: DEPLOYMENT[group], responseId: null, tokens: "any", charged: true, cacheHit: false, stream: false, t0, t1: Number.POSITIVE_INFINITY });
      spend(caller, label, t0, undefined, undefined, endUser);
    };

    /**
     * A slow stream (1.6 s at the upstream) of a team: while it runs the team's callback set changes
     * (or goes), or a budget period of the team ends. Its event goes to the set it ended under; its
     * cost belongs to the period it started in.
     */
    const slowStreamCall = async (step: string, caller: Caller, team: Team, change: "callbacks" | "period") => {
      stats.calls++;
      if (change === "callbacks") stats.acrossChange++;
      else stats.acrossPeriod++;
      const m = marker();
      const extra: Json = {};
      const user = userField();
      if (user) extra.user = user;
      const tags = bodyTags();
      if (tags.length) extra.metadata = { tags };
      const common = { caller, endUser: user ?? null, tags: expectedTags(caller, tags) };
      const disabling = change === "callbacks" && rng.chance(0.3);
      const rotate = rng.chance(0.5);
      const label = `${step} ${caller.label} chat gpt-a stream while ${change === "period" ? "a budget period of the team ends" : `the team's webhooks ${disabling ? "are disabled" : "change"}`}`;
      up.fault({ kind: "slowStream", chunkDelayMs: 40, chunks: 40, match: m });
      const t0 = Date.now();
      const res = await post(caller, "/v1/chat/completions", { model: "gpt-a", messages: [{ role: "user", content: `confidential-prompt ${m} stream on` }], stream: true, ...extra });
      expect(res.status, where(label)).toBe(200);
      const id = res.headers.get("x-svc-call-id")!;
      const reader = res.body!.getReader();
      const decoder = new TextDecoder();
      let text = decoder.decode((await reader.read()).value, { stream: true });
      if (change === "callbacks") {
        if (disabling) await disable(label, team);
        else await register(label, team, nextSet(team, rotate));
      }
      const changedAt = Date.now();
      for (let r = await reader.read(); !r.done; r = await reader.read()) text += decoder.decode(r.value, { stream: true });
      const t1 = Date.now();
      up.clearFaults();
      // The stream lasts 1.6 s at the upstream: the change must have been made well before it ended.
      if (changedAt - t0 > 1200) throw new Error(where(label, `the callback change returned ${changedAt - t0} ms into a 1.6 s stream: too slow a machine for this step`));
      expect(text.endsWith("data: [DONE]\n\n"), where(label, text)).toBe(true);
      pendingIds.add(id);
      teamExpect({ step: label, id, ...common, endpoint: "chat", status: "success", model: "gpt-a", group: "gpt-a", deployment: DEPLOYMENT["gpt-a"], responseId: streamId(text), tokens: "any", charged: true, cacheHit: false, stream: true, t0, t1 });
      spend(caller, label, t0, undefined, id, common.endUser);
    };

    /** A stream of the team with a period that starts 300 ms before the period ends, and ends well after. */
    const acrossPeriod = async (step: string) => {
      const team = teams.find((t) => t.resetAt !== undefined)!;
      const caller = callers.find((c) => c.team === team && (c.kind === "normal" || c.kind === "restricted"));
      if (!caller) return;
      await barrier(step);
      const now = Date.now();
      let end = Number(periodOf(team, now));
      if (end - now < 350) end += PERIOD_MS;
      await Bun.sleep(end - now - 300);
      await slowStreamCall(step, caller, team, "period");
    };

    /**
     * Many calls of one team at once while its three webhooks hold every attempt (a longer timeout
     * for the while): more deliveries waiting than Bun's fetch makes at once (256). They must cost
     * no other team its events, and the gateway's calls must not wait for them (Bun queues every
     * fetch past 256, upstream calls included): a call made right then answers at once.
     */
    const burst = async (step: string) => {
      const team = rng.pick(teams.filter((t) => !t.silent && callers.some((c) => c.team === t && c.kind === "normal")));
      const mine = callers.filter((c) => c.team === team && c.kind === "normal");
      await barrier(step);
      const hooks = [newHook(team), newHook(team), newHook(team)].map((h) => ({ ...h, profile: "blackhole" as const }));
      for (const h of hooks) profiles.set(h.url, "blackhole");
      const r = await requestJson(gw, "POST", `/team/${team.id}/callback`, { body: { callbacks: hooks.map((h) => ({ callback_type: "webhook", url: h.url, headers: h.headers })) } });
      expect(r.status, where(step, r.text)).toBe(200);
      team.hooks = hooks;
      team.logs = "both";
      webhookTiming.timeoutMs = 3000;
      for (let wave = 0; wave < 2; wave++) {
        const runs = Array.from({ length: 50 }, (_, i) => {
          const caller = rng.pick(mine);
          const m = marker();
          const body: Json = { model: "gpt-a", messages: [{ role: "user", content: `confidential-prompt ${m} burst` }] };
          return successCall(`${step} burst ${wave}.${i}`, caller, { endpoint: "chat", model: "gpt-a", group: "gpt-a", stream: false, includeUsage: false, marker: m, body }, {}, { caller, endUser: null, tags: expectedTags(caller, []) }, false);
        });
        await Promise.all(runs);
      }
      const probe = rng.pick(callers.filter((c) => c.team !== team && c.kind === "normal"));
      const pm = marker();
      const t0 = Date.now();
      await successCall(`${step} burst probe`, probe, { endpoint: "chat", model: "gpt-a", group: "gpt-a", stream: false, includeUsage: false, marker: pm, body: { model: "gpt-a", messages: [{ role: "user", content: `confidential-prompt ${pm} probe` }] } }, {}, { caller: probe, endUser: null, tags: expectedTags(probe, []) }, false);
      const took = Date.now() - t0;
      if (took > 1500) throw new Error(where(step, `a call made while 300 webhook deliveries hang took ${took} ms (the webhooks' timeout is 3 s): it waited for them`));
      up.clearFaults();
      webhookTiming.timeoutMs = HOOK_TIMEOUT_MS;
      stats.burst = 100;
    };

    // --- the run
    const burstAt = Math.floor(STEPS * (0.2 + 0.5 * rng.next()));
    const acrossPeriodAt = Math.floor(STEPS * (0.1 + 0.6 * rng.next()));
    for (let step = 0; step < STEPS; step++) {
      if (step === burstAt) {
        await burst(String(step));
        continue;
      }
      if (step === acrossPeriodAt) {
        await acrossPeriod(String(step));
        continue;
      }
      if (rng.chance(0.09)) {
        await callbackStep(String(step));
        continue;
      }
      batchNo++;
      stats.batches++;
      const size = rng.chance(0.6) ? 1 : rng.chance(0.6) ? 2 : 3;
      const pool = [...callers];
      const chosen: Caller[] = [];
      for (let i = 0; i < size; i++) chosen.push(pool.splice(rng.int(pool.length), 1)[0]!);
      // A team with a period: no call starts right at its edge (the model could not say which period it is in).
      const periodic = chosen.map((c) => c.team).find((t) => t?.resetAt !== undefined);
      if (periodic) {
        const now = Date.now();
        const next = Number(periodOf(periodic, now));
        if (next - now < 300) await Bun.sleep(next - now + 40);
        else if (now - (next - PERIOD_MS) < 40) await Bun.sleep(40);
      }
      const used = new Set<string>();
      const plans = chosen.map((c) => planCall(c, `${step} batch ${batchNo}`, used));
      await Promise.all(plans.map((p) => p.run()));
      up.clearFaults();
    }
    await barrier("end");

    // --- what each webhook must receive
    interface Delivery {
      step: string;
      key: string;
      hook: Hook;
      check: (a: Arrival) => void;
      expectation: unknown;
    }
    const byEndUser = new Map<string, string>();
    const idOf = (e: Expected): string | undefined => e.id ?? (e.endUser ? byEndUser.get(e.endUser) : undefined);

    const projected = (e: Expected, body: Json): { actual: unknown; wanted: unknown } => {
      const p = body.prompt_tokens as number;
      const c = body.completion_tokens as number;
      const tokens = e.tokens === "any" ? { p, c } : e.tokens;
      const cost = e.charged ? usd(costOf(e.group, tokens.p, tokens.c)) : 0;
      const start = Date.parse(String(body.start_time));
      const end = Date.parse(String(body.end_time));
      const times = Number.isNaN(start) || Number.isNaN(end) ? "unreadable" : start < e.t0 ? `start ${start} before the client sent at ${e.t0}` : end < start ? "ends before it starts" : end > e.t1 + MARGIN_MS ? `end ${end} after the client was done at ${e.t1}` : "ordered";
      const err = body.error as { message?: unknown; type?: unknown; code?: unknown } | null;
      // A success and a cancelled call (the client left: nothing failed) carry no error; a failure its status, and a message.
      const error = e.error === undefined ? null : { code: e.error.code, type: e.error.type ?? "(not checked)", message: e.error.redacted ? "quotes the provider key as [redacted]" : "a message" };
      const actualError =
        e.error === undefined || err === null
          ? err
          : {
              code: err.code,
              type: e.error.type === undefined ? "(not checked)" : err.type,
              message: typeof err.message !== "string" || err.message === "" ? err.message : e.error.redacted ? (err.message.includes("[redacted]") ? "quotes the provider key as [redacted]" : err.message) : "a message",
            };
      const wanted = {
        event: "llm_call",
        id: idOf(e),
        call_type: e.endpoint,
        status: e.status,
        model: e.model,
        model_group: e.group,
        model_id: e.deployment,
        provider: "openai",
        response_id: e.responseId === "any" ? body.response_id : e.responseId,
        response_cost: cost,
        prompt_tokens: tokens.p,
        completion_tokens: tokens.c,
        total_tokens: tokens.p + tokens.c,
        cache_hit: e.cacheHit,
        stream: e.stream,
        times: "ordered",
        api_key: e.caller.hash,
        key_alias: e.caller.alias,
        team_id: e.team.id,
        user_id: e.caller.userId,
        organization_id: e.team.orgId,
        end_user: e.endUser,
        request_tags: e.tags,
        error,
        ...(e.costHeader !== undefined ? { "x-svc-response-cost seen by the client": e.costHeader } : {}),
      };
      const { start_time: _s, end_time: _e, ...rest } = body;
      const actual = {
        ...rest,
        times,
        request_tags: Array.isArray(body.request_tags) ? [...(body.request_tags as string[])].sort() : body.request_tags,
        error: actualError,
        ...(e.costHeader !== undefined ? { "x-svc-response-cost seen by the client": body.response_cost } : {}),
      };
      return { actual, wanted };
    };

    /** Every delivery the model expects (an event found by its end user is named by what arrived so far). */
    const build = (): Delivery[] => {
      const deliveries: Delivery[] = [];
      // Events found by end user: any arrival whose end_user is theirs names the call id.
      byEndUser.clear();
      for (const r of receivers) for (const a of r.arrivals) if (typeof a.body?.end_user === "string" && a.body.event === "llm_call") byEndUser.set(a.body.end_user, String(a.body.id));
      for (const e of expected) {
        for (const hook of e.hooks) {
          const key = idOf(e) ?? `(the call of end user ${e.endUser}: no event names it)`;
          deliveries.push({
            step: e.step,
            key,
            hook,
            expectation: e,
            check: (a) => {
              const { actual, wanted } = projected(e, a.body ?? {});
              expect(actual, where(e.step, `the event ${key} at ${hook.url}\nreceived: ${a.raw}`)).toEqual(wanted);
            },
          });
        }
      }
      for (const al of alerts) {
        const resetAt = al.period === "flat" ? null : new Date(Number(al.period)).toISOString();
        for (const hook of al.hooks) {
          deliveries.push({
            step: al.step,
            key: `alert:${al.team.id}:${resetAt}`,
            hook,
            expectation: { alert: al.team.id, period: al.period },
            check: (a) => {
              const b = a.body ?? {};
              const spendPico = BigInt(Math.round(Number(b.spend) * 1e12));
              const min = al.calls === 1 ? al.after : al.team.soft!;
              const actual = { event: b.event, event_group: b.event_group, team_id: b.team_id, soft_budget: b.soft_budget, max_budget: b.max_budget, budget_reset_at: b.budget_reset_at, spend: spendPico >= min && spendPico <= al.after ? "as the model says" : String(b.spend) };
              const wanted = { event: "soft_budget_crossed", event_group: "team", team_id: al.team.id, soft_budget: usd(al.team.soft!), max_budget: null, budget_reset_at: resetAt, spend: "as the model says" };
              expect(actual, where(al.step, `the soft-budget alert at ${hook.url} (spend ${al.calls === 1 ? usd(al.after) : `between ${usd(min)} and ${usd(al.after)}`}; before the batch ${usd(al.before)})\nreceived: ${a.raw}`)).toEqual(wanted);
            },
          });
        }
      }
      return deliveries;
    };

    // Attempts: a 2xx ends the delivery; anything else (4xx, 5xx, a redirect, no answer in time, a dropped connection) is tried once more.
    const attemptsOf = (d: Delivery) => (isOk(behaviourOf(d.hook.profile, d.hook.url, d.key, 0)) ? 1 : 2);
    const arrivals = () => receivers.flatMap((r) => r.arrivals);
    const pollEnd = Date.now() + 20_000;
    while (arrivals().length < build().reduce((n, d) => n + attemptsOf(d), 0) && Date.now() < pollEnd) await Bun.sleep(50);
    // Nothing more may come: wait out one more attempt's time.
    await Bun.sleep(HOOK_TIMEOUT_MS + HOOK_RETRY_MS + 200);
    const deliveries = build();
    stats.events = deliveries.length;
    stats.alerts = alerts.length;

    const all = arrivals();
    const wantedBy = new Map<string, Delivery>();
    const problems: string[] = [];
    for (const d of deliveries) {
      const k = `${d.hook.url} ${d.key}`;
      if (wantedBy.has(k)) problems.push(`the model expects ${d.key} twice at ${d.hook.url} (${d.step})`);
      wantedBy.set(k, d);
    }
    const got = new Map<string, Arrival[]>();
    for (const a of all) {
      const k = `${a.url} ${a.key}`;
      got.set(k, [...(got.get(k) ?? []), a]);
    }
    for (const [k, d] of wantedBy) {
      const as = got.get(k) ?? [];
      const n = attemptsOf(d);
      if (as.length !== n) {
        problems.push(`${where(d.step)}: ${d.key} at ${d.hook.url} arrived ${as.length} times, expected ${n} (behaviours ${JSON.stringify(as.map((a) => a.behaviour))}; first would be ${JSON.stringify(behaviourOf(d.hook.profile, d.hook.url, d.key, 0))})\nexpected: ${JSON.stringify(d.expectation, (_k, v) => (typeof v === "bigint" ? String(v) : _k === "hooks" || _k === "team" || _k === "caller" ? undefined : v))}`);
      }
    }
    for (const [k, as] of got) {
      if (!wantedBy.has(k)) problems.push(`${where("end")}: unexpected ${as.length} request(s) ${k}: ${as[0]!.raw}`);
    }
    expect(problems, where("end", "deliveries per webhook and event")).toEqual([]);

    // Each attempt: a POST with the set's headers (no others but the delivery's id and timestamp:
    // one id for every attempt of an event, the call's own for a call), the same body every time,
    // and no secret in it.
    const standard = new Set(["host", "content-length", "content-type", "user-agent", "accept", "accept-encoding", "connection"]);
    const delivery = new Set(["webhook-id", "webhook-timestamp"]);
    for (const [k, d] of wantedBy) {
      const as = got.get(k)!;
      const ids = new Set(as.map((a) => a.headers["webhook-id"]));
      expect(ids.size, where(d.step, `webhook-id of every attempt of ${k}`)).toBe(1);
      for (const a of as) {
        expect(a.method, where(d.step, `${k}`)).toBe("POST");
        const posted = JSON.parse(a.raw) as { id?: unknown };
        if (typeof posted.id === "string") expect(a.headers["webhook-id"], where(d.step, `webhook-id of ${k}`)).toBe(posted.id);
        else expect(a.headers["webhook-id"], where(d.step, `webhook-id of ${k}`)).toStartWith("msg_");
        expect(a.headers["webhook-timestamp"], where(d.step, `webhook-timestamp of ${k}`)).toMatch(/^\d+$/);
        const custom = Object.fromEntries(Object.entries(a.headers).filter(([h]) => !standard.has(h) && !delivery.has(h)));
        const configured = Object.fromEntries(Object.entries(d.hook.headers).map(([h, v]) => [h.toLowerCase(), v]));
        const contentType = configured["content-type"] ?? "application/json";
        delete configured["content-type"];
        expect({ headers: custom, "content-type": a.headers["content-type"] }, where(d.step, `the headers of ${k}`)).toEqual({ headers: configured, "content-type": contentType });
        for (const s of secrets) if (a.raw.includes(s)) throw new Error(where(d.step, `a secret (${s.slice(0, 12)}…) in the event posted to ${d.hook.url}: ${a.raw}`));
        for (const word of ["confidential-prompt", "confidential-answer"]) if (a.raw.includes(word)) throw new Error(where(d.step, `a prompt or an answer in the event posted to ${d.hook.url}: ${a.raw}`));
        expect(a.raw, where(d.step, `attempt ${a.n + 1} of ${k} repeats the first`)).toBe(as[0]!.raw);
      }
      d.check(as[0]!);
    }
    const trapped = receivers.flatMap((r) => r.trapped);
    expect(trapped, where("end", "a delivery followed a redirect")).toEqual([]);
    expect(receivers.flatMap((r) => r.unreadable), where("end", "requests without a length")).toEqual([]);
    // An event for a call that ended: times of a retry come after its failed attempt.
    for (const e of expected) {
      if (!e.after || e.hooks.length === 0) continue;
      const a = all.find((x) => x.key === e.id);
      const b = all.find((x) => x.key === e.after);
      if (a && b) expect(Date.parse(String(a.body?.start_time)) >= Date.parse(String(b.body?.end_time)), where(e.step, "the retry starts after the failed attempt ended")).toBe(true);
    }
    // Webhook secrets (header values, a token in a URL's query) are in no log line; header values in no audit entry.
    const logText = JSON.stringify(gw.log.lines);
    const audit = JSON.stringify(await rows(gw.host!.store.db, sql`select * from audit_log`));
    for (const secret of secrets) {
      if (!secret.startsWith("whsec-") && !secret.startsWith("qs-")) continue;
      if (logText.includes(secret)) throw new Error(where("end", `a webhook secret (${secret.slice(0, 10)}…) in the gateway's log`));
      if (secret.startsWith("whsec-") && audit.includes(secret)) throw new Error(where("end", `a webhook secret (${secret.slice(0, 10)}…) in the audit trail`));
    }
    if (process.env.WEBHOOK_DIFF_STATS) console.log(where("end", JSON.stringify({ ...stats, steps: STEPS, arrivals: all.length, ms: Date.now() - started })));
  }, 120_000);
});
