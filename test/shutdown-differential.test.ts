// Shutdown under load, seeded random (SHUTDOWN_DIFF_SEED=<n> runs another sequence,
// SHUTDOWN_DIFF_ROUNDS=<n> more or fewer rounds; every failure names the seed and the round),
// against a model of the README's promises kept here ("Run interface": SIGTERM drains in-flight
// requests and streams, bounded by SVC_DRAIN_TIMEOUT, flushes pending writes and exits 0; "Cost,
// spend and budgets": every call is a spend-log row, counters always equal the sum of their log
// rows, nothing is lost when the store is away: SIGTERM flushes or spills, the next start writes).
//
// Each round starts `bun core/main.ts` as a process on a fresh store (embedded PGlite in its own
// data folder, or a fresh PostgreSQL database reached through a TCP relay the test can cut),
// sometimes with Redis, in front of an OpenAI mock whose answers are fast, slow (JSON after a
// delay, long streams), hang, or break off; a random world of keys (some with budgets, some in a
// team or of a user, teams with budgets). Random concurrent traffic (JSON and streams, some clients
// leaving mid-way) runs while, at a random moment, the gateway gets SIGTERM: sometimes with the
// store cut just before (entries must spill to disk), sometimes with PostgreSQL's connections
// terminated just before (the pool reconnects), sometimes with a second SIGTERM during the drain
// or a SIGKILL around the drain deadline. Then the gateway starts again on the same store and
// data folder (which writes the spill), each budgeted key makes one call, it stops, and the stored
// rows are read. Checked:
// - the first process prints "draining", refuses new connections from then on, and exits 0 after
//   "stopped" within SVC_DRAIN_TIMEOUT + a few seconds (+ 10 s when the store is away), not before
//   the deadline when a call is still in flight;
// - a call sent after the "draining" line gets no answer and leaves no row; a call in flight at
//   SIGTERM whose upstream answers well before the drain deadline completes (200 with the whole
//   body, a stream up to [DONE]);
// - every call the gateway answered or the upstream saw has exactly one spend-log row (by the
//   client's `user`, with the `x-svc-call-id` it got), none has two, no row belongs to no call:
//   a JSON 200 with the cost the client saw in `x-svc-response-cost` and its usage; a stream
//   `success` when the client got [DONE], `failure` when it got an error event, `cancelled` when
//   the client left or the drain deadline cut it; a budget refusal a `failure` at 0 with no
//   deployment; a call cut by the drain deadline before it answered `cancelled` at 0; a failure's
//   spend is 0 unless it is a stream whose client got part of the answer before the error event,
//   and any other row's is its deployment's price of its tokens, to the pico-dollar;
// - after SIGKILL (not graceful, the README promises nothing), calls that ended more than a batch
//   interval (1 s) plus a write's time (1 s) before the kill (or before the store was cut) are
//   stored; the rest may be lost, never doubled;
// - no spill file is left after the restart (nor after a graceful stop with the store up);
// - key, team and user spend counters equal the sum of their log rows, and the daily aggregates
//   equal the rows summed per entity, day, key, model and provider (computed here);
// - after the restart a key (or team) whose stored spend reached its budget is refused;
// - neither process prints a virtual key, the master key or the upstream credential.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { cpSync, existsSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import postgres from "postgres";
import { openStore } from "../core/store/db.ts";
import { rows } from "../core/store/sql.ts";
import { freshDatabase, initializedPgFolder, MASTER_KEY, requestOk, spawnGateway, tempDir } from "./harness/gateway.ts";
import { Random } from "./harness/random.ts";
import { TcpRelay } from "./harness/relay.ts";
import { scaledExact } from "./harness/spend.ts";
import { accepts, sha256 } from "./harness/util.ts";
import { type MockOpenAI, startMockOpenAI } from "./mock-upstream/openai.ts";
import { TEST_REDIS_URL } from "./harness/redis.ts";

const SEED = Number(process.env.SHUTDOWN_DIFF_SEED ?? 20_261_201);
const ROUNDS = Number(process.env.SHUTDOWN_DIFF_ROUNDS ?? 8);
const REDIS_URL = TEST_REDIS_URL;
const PG_SERVER = new URL(process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres");
/** The upstream's credential: not `sk-` shaped, so the log's redaction of keys does not hide it. */
const UPSTREAM_KEY = `upstream-cred-${Math.random().toString(36).slice(2, 12)}`;
const RUN = `${process.pid}${Date.now().toString(36)}`;
/** The spend writer's documented batch interval (README "Nothing lost": every second). */
const BATCH_INTERVAL_MS = 1000;
/** What one batch's write may take on a loaded machine, on top of the interval. */
const WRITE_MS = 1000;
/** Exit after the drain with the store up: flushing, closing (README: a second or two; more on a loaded machine). */
const EXIT_SLACK_MS = 3000;
/** Exit after the drain with the store away (README: at most 10 s: the flush's 5 s bound, then the spill). */
const OUTAGE_EXIT_MS = 10_000;
const MAX_TOKENS = 64;

const CLEAN_ENV = { DATABASE_URL: undefined, REDIS_URL: undefined, PORT: undefined, HOST: undefined, SVC_DRAIN_TIMEOUT: undefined };

// ---- exact money, computed here

const PICO = 10n ** 12n;

const pico = (text: string) => scaledExact(text, 12);
const usd = (p: bigint) => {
  const frac = (p % PICO).toString().padStart(12, "0").replace(/0+$/, "");
  return frac ? `${p / PICO}.${frac}` : `${p / PICO}`;
};

interface Dep {
  id: string;
  group: string;
  /** USD per token, decimal text such as `123e-9`. */
  inPrice: string;
  outPrice: string;
}

/** The cost of `pt` prompt and `ct` completion tokens at `d`'s prices: exact, rounded half up to pico-dollars once. */
function costOf(d: Dep | undefined, pt: number, ct: number): bigint {
  if (!d) return 0n;
  const y = BigInt(pt) * scaledExact(d.inPrice, 24) + BigInt(ct) * scaledExact(d.outPrice, 24);
  return y / PICO + ((y % PICO) * 2n >= PICO ? 1n : 0n);
}

// ---- the world

interface Team {
  id: string;
  budget: bigint | null;
}
interface Key {
  label: string;
  key: string;
  token: string;
  team?: Team;
  user?: string;
  budget: bigint | null;
}

type Behaviour = "fast" | "slow" | "hang" | "cut";

interface Call {
  marker: string;
  phase: "traffic" | "probe";
  key: Key;
  group: string;
  stream: boolean;
  usage: boolean;
  behaviour: Behaviour;
  /** JSON: the upstream's delay; stream: the delay between chunks. */
  delayMs: number;
  chunks: number;
  abandonAfter?: number;
  offset: number;
  // what the client saw
  issuedAt?: number;
  endedAt?: number;
  status?: number;
  callId?: string | null;
  cost?: string | null;
  modelId?: string | null;
  text: string;
  /** The whole body was read. */
  complete: boolean;
  /** The client left (its abort fired before the end). */
  aborted: boolean;
  error?: string;
}

const wordsOf = (c: Call) => `${c.marker} says hello to the gateway`;

/** When the upstream would have finished answering, had nothing cut it. */
function plannedEnd(c: Call): number {
  const start = c.issuedAt ?? 0;
  if (c.behaviour === "fast") return start + 50;
  if (c.behaviour === "slow") return start + (c.stream ? (c.chunks + 4) * c.delayMs : c.delayMs);
  return Number.POSITIVE_INFINITY;
}

function sseFacts(text: string): { done: boolean; errorEvent: boolean; content: boolean; usage?: { prompt_tokens: number; completion_tokens: number } } {
  let usage: { prompt_tokens: number; completion_tokens: number } | undefined;
  let errorEvent = false;
  let content = false;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    try {
      const chunk = JSON.parse(line.slice(6)) as { usage?: typeof usage; error?: unknown; choices?: { delta?: { content?: string | null } }[] };
      if (chunk.usage) usage = chunk.usage;
      if (chunk.error) errorEvent = true;
      content ||= chunk.choices?.some((c) => !!c.delta?.content) === true;
    } catch {
      // a torn last event of a cut stream
    }
  }
  return { done: text.includes("data: [DONE]\n\n"), errorEvent, content, usage };
}

async function runCall(url: string, c: Call): Promise<void> {
  const ac = new AbortController();
  let over = false;
  const timer =
    c.abandonAfter === undefined
      ? undefined
      : setTimeout(() => {
          if (over) return;
          c.aborted = true;
          ac.abort();
        }, c.abandonAfter);
  c.issuedAt = Date.now();
  try {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${c.key.key}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: c.group,
        user: c.marker,
        max_tokens: MAX_TOKENS,
        messages: [{ role: "user", content: wordsOf(c) }],
        ...(c.stream ? { stream: true, ...(c.usage ? { stream_options: { include_usage: true } } : {}) } : {}),
      }),
      signal: ac.signal,
    });
    c.status = res.status;
    c.callId = res.headers.get("x-svc-call-id");
    c.cost = res.headers.get("x-svc-response-cost");
    c.modelId = res.headers.get("x-svc-model-id");
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      c.text += decoder.decode(value, { stream: true });
    }
    c.complete = true;
  } catch (err) {
    c.error = err instanceof Error ? `${(err as { code?: string }).code ?? err.name}: ${err.message}` : String(err);
  } finally {
    over = true;
    clearTimeout(timer);
    c.endedAt = Date.now();
  }
}

// ---- the stored state

interface Row {
  call_id: string;
  api_key: string;
  team_id: string | null;
  user_id: string | null;
  end_user: string | null;
  model: string;
  model_group: string;
  provider: string;
  model_id: string;
  upstream_model: string;
  spend: string;
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  cache_read_input_tokens: number;
  cache_creation_input_tokens: number;
  status: string;
  stream: boolean;
  start_ms: string;
  request_tags: string[];
  organization_id: string | null;
}

interface Daily {
  entity_type: string;
  entity_id: string;
  date: string;
  api_key: string;
  model: string;
  model_group: string;
  provider: string;
  prompt_tokens: string;
  completion_tokens: string;
  cache_read_input_tokens: string;
  cache_creation_input_tokens: string;
  spend: string;
  api_requests: string;
  successful_requests: string;
  failed_requests: string;
}

interface Stored {
  logs: Row[];
  keys: Map<string, bigint>;
  teams: Map<string, bigint>;
  users: Map<string, bigint>;
  daily: Daily[];
}

async function readStore(opts: { databaseUrl?: string; dataDir: string }): Promise<Stored> {
  const store = await openStore(opts);
  try {
    const logs = await rows<Row>(
      store.db,
      sql`select call_id, api_key, team_id, user_id, end_user, model, model_group, provider, model_id, upstream_model, spend::text as spend,
            prompt_tokens, completion_tokens, total_tokens, cache_read_input_tokens, cache_creation_input_tokens, status, stream,
            (extract(epoch from start_time) * 1000)::bigint::text as start_ms, request_tags, organization_id
          from spend_logs`,
    );
    const counters = async (q: ReturnType<typeof sql>) => new Map((await rows<{ id: string; spend: string }>(store.db, q)).map((r) => [r.id, pico(r.spend)]));
    const daily = await rows<Daily>(
      store.db,
      sql`select entity_type, entity_id, date::text as date, api_key, model, model_group, provider, prompt_tokens::text as prompt_tokens,
            completion_tokens::text as completion_tokens, cache_read_input_tokens::text as cache_read_input_tokens,
            cache_creation_input_tokens::text as cache_creation_input_tokens, spend::text as spend, api_requests::text as api_requests,
            successful_requests::text as successful_requests, failed_requests::text as failed_requests
          from daily_spend`,
    );
    return {
      logs,
      keys: await counters(sql`select token as id, spend::text as spend from virtual_keys`),
      teams: await counters(sql`select team_id as id, spend::text as spend from teams`),
      users: await counters(sql`select user_id as id, spend::text as spend from users`),
      daily,
    };
  } finally {
    await store.close();
  }
}

/** The daily aggregates the README describes, summed here from the log rows. */
function dailyFromRows(logs: Row[]): Map<string, string> {
  const out = new Map<string, { pt: bigint; ct: bigint; cr: bigint; cc: bigint; spend: bigint; n: bigint; ok: bigint; failed: bigint }>();
  const add = (r: Row, type: string, id: string | null, key: string, model: string, grp: string) => {
    if (id === null) return;
    const day = new Date(Number(r.start_ms)).toISOString().slice(0, 10);
    const k = JSON.stringify([type, id, day, key, model, grp, r.provider]);
    const a = out.get(k) ?? { pt: 0n, ct: 0n, cr: 0n, cc: 0n, spend: 0n, n: 0n, ok: 0n, failed: 0n };
    a.pt += BigInt(r.prompt_tokens);
    a.ct += BigInt(r.completion_tokens);
    a.cr += BigInt(r.cache_read_input_tokens);
    a.cc += BigInt(r.cache_creation_input_tokens);
    a.spend += pico(r.spend);
    a.n++;
    // A cancelled call counts as failed: every call is one or the other.
    if (r.status === "success") a.ok++;
    else a.failed++;
    out.set(k, a);
  };
  for (const r of logs) {
    add(r, "key", r.api_key, r.api_key, r.upstream_model, r.model_group);
    add(r, "team", r.team_id, r.api_key, r.upstream_model, r.model_group);
    add(r, "org", r.organization_id, r.api_key, r.upstream_model, r.model_group);
    add(r, "user", r.user_id, r.api_key, r.upstream_model, r.model_group);
    add(r, "end_user", r.end_user, r.api_key, r.upstream_model, r.model_group);
    for (const tag of new Set(r.request_tags)) add(r, "tag", tag, r.api_key, r.upstream_model, r.model_group);
    add(r, "model", r.model_group, "", r.upstream_model, r.model_group);
    add(r, "provider", r.provider, "", "", "");
  }
  return new Map([...out].map(([k, a]) => [k, JSON.stringify([a.pt, a.ct, a.cr, a.cc, usd(a.spend), a.n, a.ok, a.failed].map(String))]));
}

// ---- helpers


function spillFiles(dataDir: string): string[] {
  const dir = join(dataDir, "spend-spill");
  return existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith(".jsonl")) : [];
}

// ---- the run

/** A round's store, what happens to it just before SIGTERM, and what follows the signal. */
interface Scenario {
  backend: "pglite" | "postgres";
  /** `cut`: the relay to PostgreSQL drops every connection and refuses new ones; `terminate`: PostgreSQL ends the gateway's sessions. */
  outage: "none" | "cut" | "terminate";
  /** `twice`: a second SIGTERM during the drain; `kill`: SIGKILL around the drain deadline. */
  ending: "sigterm" | "twice" | "kill";
}

describe(`shutdown differential (SHUTDOWN_DIFF_SEED=${SEED})`, () => {
  const rng = new Random(SEED);
  let mock: MockOpenAI;
  let relay: TcpRelay;
  let admin: ReturnType<typeof postgres>;
  const cleanup: (() => Promise<void> | void)[] = [];
  const stats = { rounds: [] as string[], exitMsAfterDeadline: [] as number[], calls: 0, rows: 0, spilled: 0, killed: 0, cut: 0, drainCut: 0, inFlightCompleted: 0, refusedAfter: 0, probesRefused: 0 };

  beforeAll(async () => {
    mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
    relay = await TcpRelay.start({ host: PG_SERVER.hostname, port: Number(PG_SERVER.port || 5432) });
    admin = postgres(PG_SERVER.toString(), { max: 1, onnotice: () => {} });
    await initializedPgFolder();
  }, 90_000);

  afterAll(async () => {
    for (const f of cleanup.reverse()) await Promise.resolve(f()).catch(() => undefined);
    await relay?.close();
    await admin?.end();
    await mock?.stop();
    console.log(`shutdown differential seed ${SEED}: ${JSON.stringify(stats)}`);
  });

  test("SIGTERM (and SIGKILL) under load loses no call, logs none twice; counters equal their logs", async () => {
    // Every run covers these (in a random order); rounds past them pick at random.
    const covered: Scenario[] = [
      { backend: "pglite", outage: "none", ending: "sigterm" },
      { backend: "pglite", outage: "none", ending: "kill" },
      { backend: "pglite", outage: "none", ending: "twice" },
      { backend: "postgres", outage: "none", ending: rng.pick(["sigterm", "twice"] as const) },
      { backend: "postgres", outage: "cut", ending: "sigterm" },
      { backend: "postgres", outage: "cut", ending: rng.pick(["twice", "kill"] as const) },
      { backend: "postgres", outage: "terminate", ending: "sigterm" },
      { backend: "postgres", outage: "terminate", ending: "kill" },
    ];
    const scenarios: Scenario[] = [];
    while (covered.length > 0) scenarios.push(covered.splice(rng.int(covered.length), 1)[0]!);
    while (scenarios.length < ROUNDS) {
      const backend = rng.pick(["pglite", "postgres"] as const);
      scenarios.push({ backend, outage: backend === "postgres" ? rng.pick(["none", "cut", "terminate"] as const) : "none", ending: rng.pick(["sigterm", "twice", "kill"] as const) });
    }
    for (let round = 0; round < ROUNDS; round++) {
      const at = `[SHUTDOWN_DIFF_SEED=${SEED} round ${round}]`;
      const fail = (msg: string): never => {
        throw new Error(`${at} ${msg}`);
      };
      const { backend, outage, ending } = scenarios[round]!;
      const redis = rng.chance(0.35);
      const drainS = rng.pick([1, 2, 3]);
      const label = `${backend}${redis ? "+redis" : ""} drain ${drainS}s outage ${outage} ending ${ending}`;
      stats.rounds.push(label);
      mock.reset();

      // Store, folder, config.
      const dir = tempDir("gw-shutdown-diff-");
      cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
      const dataDir = join(dir, "data");
      let db: { url: string; drop(): Promise<void> } | undefined;
      let relayedUrl: string | undefined;
      if (backend === "postgres") {
        db = await freshDatabase("gw_shutdown_diff");
        cleanup.push(() => db!.drop());
        const u = new URL(db.url);
        u.port = String(relay.port);
        relayedUrl = u.toString();
      } else cpSync(await initializedPgFolder(), join(dataDir, "pg"), { recursive: true });
      const price = () => `${1 + rng.int(9_999)}e-${7 + rng.int(6)}`;
      const deps: Dep[] = [
        { id: `sd-a-${round}`, group: "chat", inPrice: price(), outPrice: price() },
        { id: `sd-b-${round}`, group: "chat", inPrice: price(), outPrice: price() },
        { id: `sd-c-${round}`, group: "solo", inPrice: price(), outPrice: price() },
      ];
      const config = {
        model_list: deps.map((d) => ({
          model_name: d.group,
          svc_params: { model: `openai/${d.id}-up`, api_base: mock.url, api_key: UPSTREAM_KEY },
          model_info: { id: d.id, input_cost_per_token: Number(d.inPrice), output_cost_per_token: Number(d.outPrice) },
        })),
        router_settings: { num_retries: 0 },
      };
      const env = { ...CLEAN_ENV, DATABASE_URL: relayedUrl, REDIS_URL: redis ? REDIS_URL : undefined, SVC_DRAIN_TIMEOUT: String(drainS) };

      const gw = await spawnGateway(config, { dir, env });
      cleanup.push(() => {
        if (gw.proc.exitCode === null && gw.proc.signalCode === null) gw.proc.kill("SIGKILL");
      });

      // The world: teams, users, keys (budgets a few calls' worst case, none, $0 or plenty).
      const dearest = (price: (d: Dep) => string) => deps.map((d) => scaledExact(price(d), 24)).sort((a, b) => (a < b ? 1 : a > b ? -1 : 0))[0]!;
      const worstPico = (BigInt(MAX_TOKENS) * dearest((d) => d.outPrice) + 200n * dearest((d) => d.inPrice)) / PICO + 1n;
      const someCalls = (n: number) => {
        const p = worstPico * BigInt(n);
        const digits = p.toString().length;
        // Three significant digits: a JSON number that reads back as exactly this decimal.
        const unit = digits > 3 ? 10n ** BigInt(digits - 3) : 1n;
        return ((p + unit - 1n) / unit) * unit;
      };
      const budgetJson = (b: bigint | null) => (b === null ? {} : { max_budget: Number(usd(b)) });
      const teams: Team[] = [];
      for (let i = 0, n = 1 + rng.int(2); i < n; i++) {
        const budget = rng.pick([null, null, someCalls(3 + rng.int(6)), 1000n * PICO]);
        const t = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: `sd-t${i}-${RUN}`, ...budgetJson(budget) });
        teams.push({ id: t.team_id, budget });
      }
      const users: string[] = [];
      for (let i = 0, n = 1 + rng.int(2); i < n; i++) {
        const userId = `sd-u${i}-${round}-${RUN}`;
        await requestOk(gw, "POST", "/user/new", { user_id: userId });
        users.push(userId);
      }
      const secrets = [MASTER_KEY, UPSTREAM_KEY];
      const keys: Key[] = [];
      for (let i = 0, n = 3 + rng.int(3); i < n; i++) {
        const team = rng.chance(0.5) ? rng.pick(teams) : undefined;
        const user = !team && rng.chance(0.5) ? rng.pick(users) : undefined;
        const budget = rng.pick([null, null, 0n, someCalls(1 + rng.int(4)), someCalls(2 + rng.int(8)), 1000n * PICO]);
        const k = await requestOk<{ key: string; token: string }>(gw, "POST", "/key/generate", {
          key_alias: `sd-k${i}-${RUN}`,
          ...(team ? { team_id: team.id } : {}),
          ...(user ? { user_id: user } : {}),
          ...budgetJson(budget),
        });
        if (k.token !== sha256(k.key)) fail(`key token ${k.token} is not the sha256 of the key`);
        keys.push({ label: `k${i}`, key: k.key, token: k.token, team, user, budget });
        secrets.push(k.key);
      }

      // The traffic, and when SIGTERM comes.
      const span = 1500 + rng.int(1500);
      const sigAt = Math.floor(span * (0.35 + 0.5 * rng.next()));
      const calls: Call[] = [];
      for (let i = 0, n = 22 + rng.int(20); i < n; i++) {
        const stream = rng.chance(0.5);
        const behaviour = rng.pick(["fast", "fast", "slow", "slow", "slow", "hang", "cut"] as const) as Behaviour;
        const c: Call = {
          marker: `sd${round}x${i}x${RUN}`,
          phase: "traffic",
          key: rng.pick(keys),
          group: rng.chance(0.75) ? "chat" : "solo",
          stream,
          usage: stream && rng.chance(0.6),
          behaviour,
          delayMs: stream ? 20 + rng.int(60) : 100 + rng.int(3200),
          chunks: 5 + rng.int(40),
          abandonAfter: rng.chance(0.15) ? 50 + rng.int(1500) : undefined,
          offset: rng.int(span),
          text: "",
          complete: false,
          aborted: false,
        };
        if (behaviour === "slow") mock.fault(stream ? { kind: "slowStream", chunkDelayMs: c.delayMs, chunks: c.chunks, match: c.marker } : { kind: "delay", ms: c.delayMs, match: c.marker });
        if (behaviour === "hang") mock.fault({ kind: "hang", match: c.marker });
        if (behaviour === "cut") mock.fault({ kind: "cutStream", afterChunks: 1 + rng.int(4), match: c.marker });
        calls.push(c);
      }
      stats.calls += calls.length;
      const port = Number(new URL(gw.url).port);
      const t0 = Date.now();
      const running = calls.map((c) => Bun.sleep(c.offset).then(() => runCall(gw.url, c)));

      await Bun.sleep(Math.max(0, t0 + sigAt - Date.now()));
      let cutAt = Number.POSITIVE_INFINITY;
      if (outage === "cut") {
        relay.cut();
        cutAt = Date.now();
        stats.cut++;
        await Bun.sleep(rng.int(150));
      } else if (outage === "terminate") {
        const name = new URL(db!.url).pathname.slice(1);
        await admin.unsafe(`select pg_terminate_backend(pid) from pg_stat_activity where datname = '${name}' and pid <> pg_backend_pid()`);
      }
      const tSigterm = Date.now();
      const deadline = tSigterm + drainS * 1000;
      gw.proc.kill("SIGTERM");
      let exitedAt = 0;
      const exited = gw.exited.then((code) => {
        exitedAt = Date.now();
        return code;
      });
      while (!gw.output().includes("draining in-flight requests") && Date.now() < tSigterm + 5000 && exitedAt === 0) await Bun.sleep(5);
      const drainSeen = Date.now();
      if (!gw.output().includes("draining in-flight requests")) fail(`no "draining in-flight requests" line after SIGTERM (${label}):\n${gw.output().slice(-3000)}`);
      if (await accepts(port)) fail(`a new connection was accepted after the "draining" line (${label}):\n${gw.output().slice(-3000)}`);
      let killedAt = Number.POSITIVE_INFINITY;
      if (ending === "twice") {
        await Bun.sleep(rng.int(drainS * 1000));
        if (exitedAt === 0) gw.proc.kill("SIGTERM");
      } else if (ending === "kill") {
        // As a supervisor whose grace period is the drain timeout: around the deadline.
        await Bun.sleep(Math.max(0, deadline - 100 + rng.int(300) - Date.now()));
        if (exitedAt === 0) {
          killedAt = Date.now();
          gw.proc.kill("SIGKILL");
        }
      }
      const code = await exited;
      const killed = gw.proc.signalCode === "SIGKILL";
      if (killed) stats.killed++;
      else killedAt = Number.POSITIVE_INFINITY;
      const out1 = gw.output();
      await Promise.all(running);

      if (!killed) {
        stats.exitMsAfterDeadline.push(exitedAt - deadline);
        if (code !== 0) fail(`SIGTERM: exit code ${code}, want 0 (${label}):\n${out1.slice(-3000)}`);
        if (!out1.includes('"msg":"stopped"')) fail(`SIGTERM: no "stopped" line (${label}):\n${out1.slice(-3000)}`);
        const bound = drainS * 1000 + (outage === "cut" ? OUTAGE_EXIT_MS : EXIT_SLACK_MS);
        if (exitedAt - tSigterm > bound) fail(`SIGTERM: exited ${exitedAt - tSigterm} ms after the signal, bound ${bound} ms (${label}):\n${out1.slice(-3000)}`);
        // A call still waiting on its upstream at the deadline keeps the gateway draining until then.
        const waiting = calls.filter((c) => !c.aborted && (c.issuedAt ?? Infinity) < tSigterm - 250 && plannedEnd(c) > deadline + 500 && (c.endedAt ?? 0) > deadline);
        if (waiting.length > 0 && exitedAt < deadline - 100) fail(`SIGTERM: exited ${deadline - exitedAt} ms before the drain deadline while ${waiting[0]!.marker} was in flight (${label})`);
        if (outage !== "cut" && spillFiles(dataDir).length > 0) fail(`SIGTERM with the store up left spill files ${spillFiles(dataDir).join(", ")} (${label}):\n${out1.slice(-3000)}`);
      }
      if (spillFiles(dataDir).length > 0) stats.spilled++;

      // Start again on the same store and folder: the spill is written before the first call is served.
      if (outage === "cut") relay.restore();
      const gw2 = await spawnGateway(config, { dir, env: { ...env, SVC_DRAIN_TIMEOUT: "2" } });
      cleanup.push(() => {
        if (gw2.proc.exitCode === null && gw2.proc.signalCode === null) gw2.proc.kill("SIGKILL");
      });
      if (spillFiles(dataDir).length > 0) fail(`spill files left after the restart: ${spillFiles(dataDir).join(", ")} (${label}):\n${gw2.output().slice(-3000)}`);
      // One call per budgeted key, one after another: a budget its stored spend reached refuses it.
      const probes: Call[] = [];
      for (const key of keys.filter((k) => k.budget !== null || k.team?.budget != null)) {
        const c: Call = { marker: `sd${round}p${probes.length}x${RUN}`, phase: "probe", key, group: "chat", stream: false, usage: false, behaviour: "fast", delayMs: 0, chunks: 0, offset: 0, text: "", complete: false, aborted: false };
        await runCall(gw2.url, c);
        probes.push(c);
      }
      calls.push(...probes);
      const code2 = await gw2.stop();
      const out2 = gw2.output();
      if (code2 !== 0) fail(`restarted gateway: SIGTERM exit code ${code2} (${label}):\n${out2.slice(-3000)}`);
      if (spillFiles(dataDir).length > 0) fail(`restarted gateway left spill files (${label})`);
      for (const [name, out] of [
        ["first", out1],
        ["restarted", out2],
      ] as const) {
        for (const s of secrets) if (out.includes(s)) fail(`the ${name} gateway printed a secret (${s.slice(0, 14)}…) (${label})`);
      }

      // ---- the stored state against the model
      const stored = await readStore(db ? { databaseUrl: db.url, dataDir } : { dataDir });
      stats.rows += stored.logs.length;
      const byMarker = new Map<string, Row[]>();
      for (const r of stored.logs) {
        const m = r.end_user ?? "";
        byMarker.set(m, [...(byMarker.get(m) ?? []), r]);
      }
      const markers = new Set(calls.map((c) => c.marker));
      for (const [m, rs] of byMarker) if (!markers.has(m)) fail(`spend-log rows of no call: end_user ${JSON.stringify(m)}: ${JSON.stringify(rs)}`);
      const depById = new Map(deps.map((d) => [d.id, d]));
      /** When the stored state must hold a call that ended at `t` after a SIGKILL: a batch interval and a write before the kill, or before the store was cut. */
      const persistedBy = Math.min(killedAt, cutAt) - BATCH_INTERVAL_MS - WRITE_MS;

      for (const c of calls) {
        const rs = byMarker.get(c.marker) ?? [];
        const seen = mock.requests.some((q) => JSON.stringify(q.body).includes(c.marker));
        const facts = c.stream && c.status === 200 ? sseFacts(c.text) : undefined;
        const what = () =>
          `${c.phase} ${c.stream ? "stream" : "JSON"} call ${c.marker} by ${c.key.label} to ${c.group} (${c.behaviour}${c.behaviour === "slow" ? ` ${c.stream ? `${c.chunks}×${c.delayMs}` : c.delayMs} ms` : ""}${c.abandonAfter !== undefined ? `, leaves after ${c.abandonAfter} ms` : ""}) issued at ${(c.issuedAt ?? 0) - tSigterm} ms from SIGTERM, ended at ${(c.endedAt ?? 0) - tSigterm} ms → ${c.status ?? c.error} ${c.text.slice(0, 200)}; deadline at ${drainS * 1000} ms${killed ? `, killed at ${killedAt - tSigterm} ms` : ""}${outage === "cut" ? `, store cut at ${cutAt - tSigterm} ms` : ""} (${label}); rows: ${JSON.stringify(rs)}`;
        if (rs.length > 1) fail(`${rs.length} spend-log rows for one call: ${what()}`);
        const graceful = !killed || c.phase === "probe";
        const ended = c.endedAt ?? Number.POSITIVE_INFINITY;
        const answered = c.status !== undefined;
        // Sent after the "draining" line: refused, never served, never logged.
        if (c.phase === "traffic" && (c.issuedAt ?? 0) > drainSeen) {
          stats.refusedAfter++;
          if (answered || seen || rs.length > 0) fail(`a call sent after SIGTERM's "draining" line was accepted: ${what()}`);
          continue;
        }
        // Answers the client may be given.
        if (answered) {
          const okStatus = c.status === 200 || c.status === 400 || (c.status === 503 && c.behaviour === "cut");
          if (!okStatus) fail(`unexpected status: ${what()}`);
          if (c.status === 400 && !c.text.includes('"budget_exceeded"')) fail(`a 400 that is not a budget refusal: ${what()}`);
        }
        // In flight at SIGTERM, answered upstream well before the drain deadline: complete.
        if (
          c.phase === "traffic" &&
          !c.aborted &&
          (c.behaviour === "fast" || c.behaviour === "slow") &&
          (c.issuedAt ?? Infinity) < tSigterm - 250 &&
          plannedEnd(c) < deadline - 800 &&
          ended > tSigterm
        ) {
          const whole = c.complete && (c.status === 400 || (c.status === 200 && (c.stream ? facts?.done === true : c.text.includes('"usage"'))));
          if (!whole) fail(`an in-flight call whose upstream answered before the drain deadline did not complete: ${what()}`);
          stats.inFlightCompleted++;
        }
        // How many rows.
        const mustLog = (answered || seen) && (graceful || ended < persistedBy);
        if (mustLog && rs.length === 0) fail(`no spend-log row for a call the gateway ${answered ? "answered" : "sent upstream"}: ${what()}`);
        const r = rs[0];
        if (!r) continue;
        // The row's fields, whatever its outcome.
        if (r.api_key !== c.key.token || r.team_id !== (c.key.team?.id ?? null) || r.user_id !== (c.key.user ?? null)) fail(`row's key/team/user: ${what()}`);
        if (r.stream !== c.stream || r.model_group !== c.group || r.model !== c.group) fail(`row's stream flag or model: ${what()}`);
        if (r.total_tokens !== r.prompt_tokens + r.completion_tokens) fail(`row's total_tokens: ${what()}`);
        const dep = depById.get(r.model_id);
        if (r.model_id !== "" && (!dep || dep.group !== c.group)) fail(`row's model_id is no deployment of ${c.group}: ${what()}`);
        // README: a failure is logged at cost 0, but a stream that failed after its answer began; a success, or a cancelled stream, is charged for what it used.
        const free = r.status === "failure" && facts?.content !== true;
        const price = free ? 0n : costOf(dep, r.prompt_tokens, r.completion_tokens);
        if (pico(r.spend) !== price) fail(`row's spend ${r.spend} is not ${free ? "0 (a failure)" : "its deployment's price of its tokens"} (${usd(price)}): ${what()}`);
        if (answered && c.callId && r.call_id !== c.callId) fail(`row's call_id ${r.call_id} ≠ x-svc-call-id ${c.callId}: ${what()}`);
        const expectStatus = (allowed: string[], why: string) => {
          if (!allowed.includes(r.status)) fail(`row's status ${r.status}, want ${allowed.join(" or ")} (${why}): ${what()}`);
        };
        const nearDeadline = Math.abs(plannedEnd(c) - deadline) < 1000;
        if (c.status === 200 && !c.stream) {
          if (!graceful && !c.complete) continue;
          expectStatus(["success"], "a JSON 200");
          if (c.cost === null || c.cost === undefined || pico(c.cost) !== pico(r.spend)) fail(`row's spend ${r.spend} ≠ x-svc-response-cost ${c.cost}: ${what()}`);
          if (r.model_id !== c.modelId) fail(`row's model_id ≠ x-svc-model-id ${c.modelId}: ${what()}`);
          const usage = (JSON.parse(c.text) as { usage: { prompt_tokens: number; completion_tokens: number } }).usage;
          if (usage.prompt_tokens !== r.prompt_tokens || usage.completion_tokens !== r.completion_tokens) fail(`row's tokens ≠ the answer's usage ${JSON.stringify(usage)}: ${what()}`);
        } else if (c.status === 200 && facts) {
          if (r.model_id !== c.modelId) fail(`row's model_id ≠ x-svc-model-id ${c.modelId}: ${what()}`);
          if (facts.errorEvent) expectStatus(["failure"], "the stream ended with an error event");
          else if (facts.done && !c.aborted) {
            expectStatus(["success"], "the client got [DONE]");
            if (facts.usage && (facts.usage.prompt_tokens !== r.prompt_tokens || facts.usage.completion_tokens !== r.completion_tokens)) fail(`row's tokens ≠ the stream's usage ${JSON.stringify(facts.usage)}: ${what()}`);
          } else if (c.aborted) expectStatus(["cancelled", "success"], "the client left");
          else if (graceful) {
            stats.drainCut++;
            expectStatus(nearDeadline ? ["cancelled", "success"] : ["cancelled"], "the drain deadline cut the stream");
          }
        } else if (c.status === 400) {
          expectStatus(["failure"], "a budget refusal");
          if (r.model_id !== "" || pico(r.spend) !== 0n) fail(`a refusal's row has a deployment or a cost: ${what()}`);
        } else if (c.status === 503) {
          expectStatus(["failure"], "the upstream broke off");
        } else if (!answered) {
          if (c.aborted) expectStatus(["cancelled", "success"], "the client left before the answer");
          else if (graceful) {
            stats.drainCut++;
            expectStatus(nearDeadline ? ["cancelled", "success"] : ["cancelled"], "the drain deadline cut the call before it answered");
            // The upstream had the request: its prompt alone is charged (README: Spend log).
            if (r.status === "cancelled" && (r.prompt_tokens === 0 || r.completion_tokens !== 0)) fail(`a call cut before it answered is not charged its prompt alone: ${what()}`);
          }
        }
      }

      // Counters equal the sum of their log rows, to the pico-dollar.
      const sums = (pick: (r: Row) => string | null) => {
        const m = new Map<string, bigint>();
        for (const r of stored.logs) {
          const id = pick(r);
          if (id !== null) m.set(id, (m.get(id) ?? 0n) + pico(r.spend));
        }
        return m;
      };
      const keySums = sums((r) => r.api_key);
      const teamSums = sums((r) => r.team_id);
      const userSums = sums((r) => r.user_id);
      for (const k of keys) if ((stored.keys.get(k.token) ?? -1n) !== (keySums.get(k.token) ?? 0n)) fail(`key ${k.label}'s spend ${usd(stored.keys.get(k.token) ?? 0n)} ≠ the sum of its rows ${usd(keySums.get(k.token) ?? 0n)} (${label})`);
      for (const t of teams) if ((stored.teams.get(t.id) ?? -1n) !== (teamSums.get(t.id) ?? 0n)) fail(`team ${t.id}'s spend ${usd(stored.teams.get(t.id) ?? 0n)} ≠ the sum of its rows ${usd(teamSums.get(t.id) ?? 0n)} (${label})`);
      for (const u of users) if ((stored.users.get(u) ?? -1n) !== (userSums.get(u) ?? 0n)) fail(`user ${u}'s spend ${usd(stored.users.get(u) ?? 0n)} ≠ the sum of its rows ${usd(userSums.get(u) ?? 0n)} (${label})`);

      // Daily aggregates: the rows summed per entity, day, key, model and provider.
      const wantDaily = dailyFromRows(stored.logs);
      const gotDaily = new Map(
        stored.daily
          // Calls without a team also get a team row with id '' (an internal detail the README does not promise).
          .filter((d) => !(d.entity_type === "team" && d.entity_id === ""))
          .map((d) => [
            JSON.stringify([d.entity_type, d.entity_id, d.date, d.api_key, d.model, d.model_group, d.provider]),
            JSON.stringify([d.prompt_tokens, d.completion_tokens, d.cache_read_input_tokens, d.cache_creation_input_tokens, usd(pico(d.spend)), d.api_requests, d.successful_requests, d.failed_requests]),
          ]),
      );
      for (const [k, v] of wantDaily) if (gotDaily.get(k) !== v) fail(`daily aggregate ${k}: stored ${gotDaily.get(k)}, the rows sum to ${v} (${label})`);
      for (const [k, v] of gotDaily) if (!wantDaily.has(k)) fail(`daily aggregate ${k} = ${v} has no rows (${label})`);

      // After the restart, a budget the stored spend had reached refuses its key's call.
      const after = { keys: new Map(keySums), teams: new Map(teamSums) };
      for (const p of [...probes].reverse()) {
        const r = byMarker.get(p.marker)?.[0];
        const spent = r ? pico(r.spend) : 0n;
        after.keys.set(p.key.token, (after.keys.get(p.key.token) ?? 0n) - spent);
        if (p.key.team) after.teams.set(p.key.team.id, (after.teams.get(p.key.team.id) ?? 0n) - spent);
        const keyReached = p.key.budget !== null && (after.keys.get(p.key.token) ?? 0n) >= p.key.budget;
        const team = p.key.team;
        const teamReached = team !== undefined && team.budget !== null && (after.teams.get(team.id) ?? 0n) >= team.budget;
        if ((keyReached || teamReached) && p.status !== 400) {
          fail(`after the restart, key ${p.key.label} (stored spend ${usd(after.keys.get(p.key.token) ?? 0n)} of ${p.key.budget === null ? "no budget" : usd(p.key.budget)}${team ? `, team ${usd(after.teams.get(team.id) ?? 0n)} of ${team.budget === null ? "no budget" : usd(team.budget)}` : ""}) was not refused: ${p.status} ${p.text.slice(0, 200)}`);
        }
        if (p.status === 400) stats.probesRefused++;
      }
      // This round's folder and database (afterAll removes those of a round that failed).
      for (const f of cleanup.splice(0).reverse()) await Promise.resolve(f()).catch(() => undefined);
    }
    expect(stats.rows).toBeGreaterThan(0);
  }, 240_000);
});
