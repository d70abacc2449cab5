// Leaks: what a call leaves behind once it has ended, seeded random (LEAKS_DIFF_SEED=<n> runs
// another set, LEAKS_DIFF_STORMS=<n> more or fewer storms, LEAKS_DIFF_CALLS=<n> calls per storm,
// LEAKS_DIFF_VERBOSE=1 prints the heap's growth; every failure names the seed, the mode and the
// storm). The gateway runs for weeks as one process, so anything a call leaves behind adds up.
//
// A gateway on the embedded store, with the rate windows and the budget ledger in memory, then
// (when Redis answers) in Redis, in front of the OpenAI wire mock (faults per call, matched by a
// marker in its prompt), the in-process `mock/` provider and a pass-through endpoint to the mock.
// Each storm fires a random burst of concurrent calls that end every way a call can end: JSON and
// stream successes, an upstream 400, a 500 retried and then answered by a fallback group, a
// deployment `timeout` (408, or answered by the retry), a stream cut mid-way, a stream that stalls
// past the timeout, clients that leave while the upstream holds the answer (JSON and stream),
// mid-stream, on a pass-through stream, on a Gemini-style stream and while the router waits out an
// upstream's retry-after, refusals by `max_parallel_requests`, `rpm_limit` and a budget, cache
// hits, pass-through calls, embeddings, bad input (invalid JSON, unknown model, a missing or bad
// field), with config reloads (`live.reload`) served and refused (a master key that cannot read a
// stored model, a file the schema refuses) during the storm. Once the gateway is idle after each
// storm:
// - what a user notices: the key with `max_parallel_requests: 3` runs 3 calls at once again (a
//   4th is refused naming the parallel limit); the budget key's refusal says `$0 held by calls in
//   flight`; a call's `x-ratelimit-remaining-requests` counts exactly the calls made (refusals
//   and cache hits consume nothing);
// - what causes it: no snapshot pinned and none retired but undisposed; no request in flight; no
//   deadline armed and the deadline ticker stopped; no record waiting for delivery; the spend
//   writer's queue empty after a flush; every rate window and every deployment with nothing in
//   flight; the budget ledger with nothing reserved and no read pending (with Redis: no request
//   in flight and no reservation left in Redis); the identity cache's listeners as many as before
//   the storms (a snapshot's plugins unsubscribe when it is disposed or refused);
// - memory: after a full collection, no object type grows by as much as one object per call over
//   every two storms in a row (`heapStats().objectTypeCounts`, from the second storm on: the first
//   warms caches and JIT).
// Then: model names a client makes up under a wildcard route (with a capacity) add nothing once
// the gateway's bounded per-name tables are full; budget alerts are held bounded.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { heapStats } from "bun:jsc";
import { MASTER_KEY, requestOk, startTestGateway, type TestGateway } from "./harness/gateway.ts";
import { Random } from "./harness/random.ts";
import { redisReachable, until } from "./harness/util.ts";
import { sql } from "drizzle-orm";
import { rows } from "../core/store/sql.ts";
import { type MockOpenAI, startMockOpenAI } from "./mock-upstream/openai.ts";
import { deadlineStats } from "../core/pipeline/upstream.ts";
import { pendingRecords } from "../core/pipeline/record.ts";
import { deploymentStateIds, stateOf } from "../core/router/deployment-state.ts";
import type { LocalWindows } from "../core/limits/local-windows.ts";
import { counterId, type LocalLedger } from "../core/spend/ledger.ts";
import { TEST_REDIS_URL } from "./harness/redis.ts";
import { channelName } from "../core/kv/redis.ts";

const SEED = Number(process.env.LEAKS_DIFF_SEED ?? 20_261_127);
const STORMS = Number(process.env.LEAKS_DIFF_STORMS ?? 5);
const CALLS = Number(process.env.LEAKS_DIFF_CALLS ?? 120);
const note = (storm: number) => `(LEAKS_DIFF_SEED=${SEED}, ${mode}, storm ${storm})`;
const UP_KEY = "sk-up-openai";
const PARALLEL = 3;
const RPM = 1_000_000;
const SMALL_RPM = 4;
const DEPLOYMENTS = ["dep-fast-1", "dep-fast-2", "dep-flaky", "dep-slow", "dep-pricey", "dep-local", "dep-whisper", "dep-tts", "dep-dalle", "dep-legacy", "dep-wild"];

type Json = Record<string, unknown>;

let mock: MockOpenAI;
let gw: TestGateway;
let mode: Mode = "memory";
/** The `extra-<n>` group of the config that serves. */
let servingVariant = 0;
let parKey = "";
let parToken = "";
let rpmKey = "";
/** Limits and a budget that admit every call of a storm: each call takes and ends leases on them. */
let wideKey = "";
let budgetKey = "";
let budgetToken = "";
/** Calls each limited key made that its rpm window counts (not refused, not a cache hit). */
const counted = { par: 0, rpm: 0, wide: 0 };

/** Where the rate windows and the budget ledger live. */
type Mode = "memory" | "redis";
const REDIS_URL = process.env.REDIS_URL ?? TEST_REDIS_URL;

/** `masterKey`: another one cannot read the stored model's credentials, so the reload is refused. */
function config(variant: number, masterKey = MASTER_KEY): Json {
  const openai = (model: string, extra: Json = {}) => ({ model: `openai/${model}`, api_base: mock.url, api_key: UP_KEY, ...extra });
  return {
    model_list: [
      { model_name: "fast", svc_params: openai("gpt-4o"), model_info: { id: "dep-fast-1" } },
      { model_name: "fast", svc_params: openai("gpt-4o"), model_info: { id: "dep-fast-2" } },
      { model_name: "flaky", svc_params: openai("gpt-4o-mini"), model_info: { id: "dep-flaky" } },
      { model_name: "slow", svc_params: openai("gpt-4o-mini", { timeout: 0.4 }), model_info: { id: "dep-slow" } },
      {
        model_name: "pricey",
        svc_params: openai("gpt-4o"),
        model_info: { id: "dep-pricey", input_cost_per_token: 0.000001, output_cost_per_token: 0.001 },
      },
      { model_name: "local", svc_params: { model: "mock/local", mock_response: `cached answer ${variant}` }, model_info: { id: "dep-local" } },
      { model_name: "whisper", svc_params: openai("whisper-1"), model_info: { id: "dep-whisper" } },
      { model_name: "tts", svc_params: openai("tts-1"), model_info: { id: "dep-tts" } },
      { model_name: "dalle", svc_params: openai("dall-e-3"), model_info: { id: "dep-dalle" } },
      { model_name: "legacy", svc_params: openai("gpt-3.5-turbo-instruct"), model_info: { id: "dep-legacy" } },
      // A wildcard route with a capacity: every model name a client sends under it is a model group of its own.
      { model_name: "wild/*", svc_params: { model: "mock/*", rpm: 1_000_000 }, model_info: { id: "dep-wild" } },
      // Changes with every reload, so each one builds and retires a snapshot.
      { model_name: `extra-${variant}`, svc_params: { model: "mock/extra" }, model_info: { id: `dep-extra-${variant}` } },
    ],
    router_settings: { num_retries: 1, retry_initial_delay: 0.01, fallbacks: [{ flaky: ["fast"] }], disable_cooldowns: true },
    svc_settings: { cache: true, cache_params: { mode: "default_off" } },
    general_settings: {
      master_key: masterKey,
      pass_through_endpoints: [{ path: "/pt", target: `${mock.url}/chat/completions`, headers: { Authorization: `Bearer ${UP_KEY}` }, methods: ["POST"] }],
    },
  };
}

const tokenOf = (key: string) => new Bun.CryptoHasher("sha256").update(key).digest("hex");

/** A gateway on the embedded store (with Redis for windows and ledger in "redis" mode), its keys and a stored model. */
async function start(m: Mode): Promise<void> {
  mode = m;
  counted.par = 0;
  counted.rpm = 0;
  counted.wide = 0;
  gw = await startTestGateway(config(0), { store: m === "redis" ? { redisUrl: REDIS_URL } : {} });
  parKey = (await requestOk<{ key: string }>(gw, "POST", "/key/generate", { max_parallel_requests: PARALLEL, rpm_limit: RPM, tpm_limit: 1_000_000_000, max_budget: 1000 })).key;
  rpmKey = (await requestOk<{ key: string }>(gw, "POST", "/key/generate", { rpm_limit: SMALL_RPM })).key;
  wideKey = (await requestOk<{ key: string }>(gw, "POST", "/key/generate", { max_parallel_requests: 1000, rpm_limit: RPM, tpm_limit: 1_000_000_000, max_budget: 1000 })).key;
  budgetKey = (await requestOk<{ key: string }>(gw, "POST", "/key/generate", { max_budget: 1 })).key;
  // A stored model whose credentials are encrypted with the master key: a file with another master key cannot be served.
  await requestOk(gw, "POST", "/model/new", { model_name: "stored", svc_params: { model: "openai/gpt-4o", api_base: mock.url, api_key: UP_KEY }, model_info: { id: "dep-stored" } });
  await gw.live.storedModelsReload;
  parToken = tokenOf(parKey);
  budgetToken = tokenOf(budgetKey);
}

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: UP_KEY });
  console.log(`leaks differential: LEAKS_DIFF_SEED=${SEED}, ${STORMS} storms of ${CALLS} calls per mode`);
});

afterAll(async () => {
  await gw?.stop();
  await mock?.stop();
});

// ---------------------------------------------------------------------------------------------
// Calls

const KINDS = [
  "json",
  "stream",
  "upstream400",
  "retryFallback",
  "timeout",
  "cutStream",
  "leaveJson",
  "leaveBeforeHeaders",
  "leaveMidStream",
  "passThrough",
  "leavePassThrough",
  "cache",
  "badInput",
  "budgetRefused",
  "rpmKey",
  "stallMidStream",
  "leaveDuringBackoff",
  "gemini",
  "leaveGemini",
  "embeddings",
  "media",
  "completions",
  "leaveUpload",
  "reloaded",
] as const;
type Kind = (typeof KINDS)[number];

interface Outcome {
  kind: Kind;
  key: "par" | "wide" | "rpm" | "budget" | "master";
  status: number;
  text: string;
  cacheHit: boolean;
}

function post(path: string, key: string, body: unknown, signal?: AbortSignal): Promise<Response> {
  return fetch(`${gw.url}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
    signal,
  });
}

/** Resolves once the mock has received the request carrying `marker`. */
async function arrived(marker: string, settled: { done: boolean }): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline && !settled.done) {
    if (mock.requests.some((r) => JSON.stringify(r.body ?? "").includes(marker))) return;
    await Bun.sleep(5);
  }
}

const keyText = (k: Outcome["key"]) => ({ par: parKey, wide: wideKey, rpm: rpmKey, budget: budgetKey, master: MASTER_KEY })[k];

/** One call of `kind`; the answer as the client saw it (status 0: the client left). */
async function oneCall(kind: Kind, marker: string, rnd: Random): Promise<Outcome> {
  const key: Outcome["key"] = kind === "budgetRefused" ? "budget" : kind === "rpmKey" ? "rpm" : rnd.pick(["par", "par", "wide", "wide", "wide", "master"] as const);
  const k = keyText(key);
  const messages = [{ role: "user", content: `hello ${marker}` }];
  const out = (status: number, text: string, cacheHit = false): Outcome => ({ kind, key, status, text, cacheHit });
  const finish = async (res: Response) => out(res.status, await res.text(), res.headers.get("x-svc-cache-hit") === "true");
  switch (kind) {
    case "json":
    case "rpmKey":
      return finish(await post("/v1/chat/completions", k, { model: "fast", messages, max_tokens: 20 }));
    case "stream":
      return finish(await post("/v1/chat/completions", k, { model: "fast", messages, stream: true, max_tokens: 20 }));
    case "upstream400":
      mock.fault({ kind: "status", status: 400, match: marker });
      return finish(await post("/v1/chat/completions", k, { model: "flaky", messages }));
    case "retryFallback":
      mock.fault({ kind: "status", status: 500, match: marker }, { kind: "status", status: 503, match: marker });
      return finish(await post("/v1/chat/completions", k, { model: "flaky", messages, stream: rnd.chance(0.5) }));
    case "timeout":
      mock.fault({ kind: "delay", ms: 1200, match: marker });
      return finish(await post("/v1/chat/completions", k, { model: "slow", messages, stream: rnd.chance(0.5) }));
    case "cutStream":
      mock.fault({ kind: "cutStream", afterChunks: 1 + rnd.int(3), match: marker });
      return finish(await post("/v1/chat/completions", k, { model: "fast", messages, stream: rnd.chance(0.7) }));
    case "leaveJson":
    case "leaveBeforeHeaders": {
      // The upstream holds its answer; the client leaves once the upstream has the request (or is refused before).
      mock.fault({ kind: "hang", match: marker });
      const ac = new AbortController();
      const settled = { done: false };
      const answer = post("/v1/chat/completions", k, { model: "fast", messages, stream: kind === "leaveBeforeHeaders" }, ac.signal).then(
        async (res) => {
          settled.done = true;
          return out(res.status, await res.text());
        },
        () => out(0, ""),
      );
      await arrived(marker, settled);
      ac.abort();
      return answer;
    }
    case "leaveMidStream":
    case "leavePassThrough": {
      mock.fault({ kind: "slowStream", chunkDelayMs: 30, chunks: 40, match: marker });
      const ac = new AbortController();
      const body = { model: kind === "leavePassThrough" ? "gpt-4o" : "fast", messages, stream: true };
      let res: Response;
      try {
        res = await post(kind === "leavePassThrough" ? "/pt" : "/v1/chat/completions", k, body, ac.signal);
      } catch {
        return out(0, "");
      }
      if (res.status !== 200) return out(res.status, await res.text());
      const reader = res.body!.getReader();
      const reads = rnd.int(4);
      try {
        for (let i = 0; i < reads; i++) if ((await reader.read()).done) break;
      } catch {}
      ac.abort();
      await reader.cancel().catch(() => undefined);
      return out(0, "");
    }
    case "passThrough":
      return finish(await post("/pt", k, { model: "gpt-4o", messages, stream: rnd.chance(0.5) }));
    case "cache":
      // A few prompts only, so most are hits once one answer is stored.
      return finish(await post("/v1/chat/completions", k, { model: "local", messages: [{ role: "user", content: `cache me ${rnd.int(3)}` }], caching: true, stream: rnd.chance(0.5) }));
    case "badInput": {
      const bad = rnd.pick(["{not json", JSON.stringify({ model: "no-such-model", messages }), JSON.stringify({ model: "fast" }), JSON.stringify({ model: "fast", messages, temperature: 9 })]);
      return finish(await post("/v1/chat/completions", k, bad));
    }
    case "stallMidStream":
      // The stream starts, then the upstream goes quiet for longer than the deployment's timeout: a 408 event ends it.
      mock.fault({ kind: "slowStream", chunkDelayMs: 700, chunks: 3, match: marker });
      return finish(await post("/v1/chat/completions", k, { model: "slow", messages, stream: true }));
    case "leaveDuringBackoff": {
      // An upstream 429 asks for 2 s before the retry (the group's only deployment): the client leaves while the router waits.
      mock.fault({ kind: "status", status: 429, headers: { "retry-after": "2" }, match: marker });
      const ac = new AbortController();
      const settled = { done: false };
      const answer = post("/v1/chat/completions", k, { model: "flaky", messages, stream: rnd.chance(0.5) }, ac.signal).then(
        async (res) => {
          settled.done = true;
          return out(res.status, await res.text());
        },
        () => out(0, ""),
      );
      await arrived(marker, settled);
      await Bun.sleep(100 + rnd.int(200));
      ac.abort();
      return answer;
    }
    case "gemini":
    case "leaveGemini": {
      const stream = kind === "leaveGemini" || rnd.chance(0.5);
      if (kind === "leaveGemini") mock.fault({ kind: "slowStream", chunkDelayMs: 30, chunks: 40, match: marker });
      const ac = new AbortController();
      const url = `${gw.url}/v1beta/models/fast:${stream ? "streamGenerateContent?alt=sse" : "generateContent"}`;
      let res: Response;
      try {
        res = await fetch(url, {
          method: "POST",
          headers: { "x-goog-api-key": k, "content-type": "application/json" },
          body: JSON.stringify({ contents: [{ role: "user", parts: [{ text: `hello ${marker}` }] }] }),
          signal: ac.signal,
        });
      } catch {
        return out(0, "");
      }
      if (kind === "gemini" || res.status !== 200) return finish(res);
      const reader = res.body!.getReader();
      try {
        for (let i = rnd.int(4); i > 0; i--) if ((await reader.read()).done) break;
      } catch {}
      ac.abort();
      await reader.cancel().catch(() => undefined);
      return out(0, "");
    }
    case "embeddings":
      return finish(await post("/v1/embeddings", k, { model: "fast", input: rnd.chance(0.5) ? `embed ${marker}` : [`a ${marker}`, `b ${marker}`] }));
    case "media": {
      const which = rnd.int(3);
      if (which === 0) {
        const form = new FormData();
        form.append("model", "whisper");
        form.append("file", new File([new Uint8Array(2000).fill(7)], `${marker}.wav`, { type: "audio/wav" }));
        const res = await fetch(`${gw.url}/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${k}` }, body: form });
        return finish(res);
      }
      if (which === 1) return finish(await post("/v1/audio/speech", k, { model: "tts", input: `say ${marker}`, voice: "alloy" }));
      return finish(await post("/v1/images/generations", k, { model: "dalle", prompt: `draw ${marker}`, size: "1024x1024" }));
    }
    case "completions":
      return finish(await post("/v1/completions", k, { model: "legacy", prompt: `complete ${marker}`, max_tokens: 10, stream: rnd.chance(0.5) }));
    case "leaveUpload": {
      // The client sends half its body, then leaves before the rest.
      const ac = new AbortController();
      const text = JSON.stringify({ model: "fast", messages });
      const body = new ReadableStream<Uint8Array>({
        start(c) {
          c.enqueue(new TextEncoder().encode(text.slice(0, text.length >> 1)));
        },
      });
      const answer = fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${k}`, "content-type": "application/json" }, body, signal: ac.signal }).then(
        async (res) => out(res.status, await res.text()),
        () => out(0, ""),
      );
      await Bun.sleep(20 + rnd.int(80));
      ac.abort();
      return answer;
    }
    case "reloaded":
      // The group the latest reload added (each reload replaces it): a 400 when a reload has just removed it.
      return finish(await post("/v1/chat/completions", k, { model: `extra-${servingVariant}`, messages }));
    case "budgetRefused":
      // Its worst case ($5 at max_tokens 5000) can never fit the key's $1.
      return finish(await post("/v1/chat/completions", k, { model: "pricey", messages, max_tokens: 5000 }));
  }
}

/** Whether the key's rpm window counts this call: it reached the limits and was neither refused nor answered from the cache. */
function countsInWindow(o: Outcome): boolean {
  if (o.kind === "badInput" || o.kind === "budgetRefused" || o.kind === "leaveUpload") return false;
  if (o.status === 400 && o.text.includes("Invalid model name")) return false;
  if (o.cacheHit) return false;
  if (o.status === 429 && /Rate limit exceeded|No deployments available/.test(o.text)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Idle state

interface Internals {
  inFlight: number;
  pins: number;
  retired: number;
  deadlines: { armed: number; ticking: boolean };
  records: number;
  spendPending: number;
  windowsInFlight: [string, number][];
  deploymentsInFlight: [string, number][];
  reserved: [string, string][];
  loading: number;
  redis: [string, string][];
  /** Upstream requests still open at the mock: every call that ended closed its own. */
  upstreamOpen: number;
  listeners: number;
}

/** The in-process windows and ledger (with Redis: their local stand-ins, used while Redis is away). */
function localParts(): { windows: Map<string, { inFlight: number }>; ledger: { entries: Map<string, { reserved: bigint }>; loading: Map<string, unknown> } } {
  const services = gw.host!.services as unknown as { rateWindows: { local?: unknown }; ledger: { local?: unknown } };
  const windows = (services.rateWindows.local ?? services.rateWindows) as { windows: Map<string, { inFlight: number }> };
  const ledger = (services.ledger.local ?? services.ledger) as { entries: Map<string, { reserved: bigint }>; loading: Map<string, unknown> };
  return { windows: windows.windows, ledger };
}

/** With Redis: the keys' requests in flight (`svc:rl:{key:…}:p`) and their budget reservations (`svc:budget:key:…` field r). */
async function redisHeld(): Promise<[string, string][]> {
  if (mode !== "redis") return [];
  const redis = gw.host!.redis!.client;
  const held: [string, string][] = [];
  for (const token of [parToken, budgetToken, tokenOf(rpmKey), tokenOf(wideKey)]) {
    const inFlight = await redis.zcard(`svc:rl:{key:${token}}:p`);
    if (inFlight !== 0) held.push([`in flight key:${token.slice(0, 8)}`, String(inFlight)]);
    const reserved = (await redis.hget(`svc:budget:key:${token}`, "r")) ?? "0";
    if (reserved !== "0") held.push([`reserved key:${token.slice(0, 8)}`, reserved]);
  }
  return held;
}

async function internals(): Promise<Internals> {
  const live = gw.live as unknown as { inFlight: number; pins: Map<unknown, number>; retired: Set<unknown> };
  const { windows, ledger } = localParts();
  const identity = gw.host!.services.identity as unknown as { listeners: Set<unknown> };
  return {
    inFlight: live.inFlight,
    pins: live.pins.size,
    retired: live.retired.size,
    deadlines: deadlineStats(),
    records: pendingRecords(),
    spendPending: gw.host!.spendWriter.pending,
    windowsInFlight: [...windows].filter(([, w]) => w.inFlight !== 0).map(([id, w]) => [id, w.inFlight]),
    deploymentsInFlight: DEPLOYMENTS.map((id): [string, number] => [id, stateOf(id).inFlight]).filter(([, n]) => n !== 0),
    reserved: [...ledger.entries].filter(([, e]) => e.reserved !== 0n).map(([id, e]): [string, string] => [id, String(e.reserved)]),
    loading: ledger.loading.size,
    redis: await redisHeld(),
    upstreamOpen: mock.pendingRequests,
    listeners: identity.listeners.size,
  };
}

const IDLE: Omit<Internals, "listeners"> = {
  inFlight: 0,
  pins: 0,
  retired: 0,
  deadlines: { armed: 0, ticking: false },
  records: 0,
  spendPending: 0,
  windowsInFlight: [],
  deploymentsInFlight: [],
  reserved: [],
  loading: 0,
  redis: [],
  upstreamOpen: 0,
};

async function waitIdle(storm: number): Promise<void> {
  let last: Internals | undefined;
  const end = Date.now() + 10_000;
  for (;;) {
    await gw.host!.spendWriter.flush();
    last = await internals();
    const { listeners: _, ...rest } = last;
    if (Bun.deepEquals(rest, IDLE)) return;
    if (Date.now() > end) break;
    await Bun.sleep(50);
  }
  const { listeners: _, ...rest } = last;
  expect(rest, `the gateway is not idle after the storm ${note(storm)}`).toEqual(IDLE);
}

/** What a user notices: the parallel limit, the budget's reservations and the rpm window as they were. */
async function userChecks(storm: number): Promise<void> {
  // max_parallel_requests: PARALLEL calls at once again, one more refused.
  const hold = Array.from({ length: PARALLEL }, (_, i) => `hold-${storm}-${i}`);
  const acs = hold.map(() => new AbortController());
  for (const m of hold) mock.fault({ kind: "hang", match: m });
  const held = hold.map((m, i) =>
    post("/v1/chat/completions", parKey, { model: "fast", messages: [{ role: "user", content: m }] }, acs[i]!.signal).then(
      async (r) => ({ status: r.status, text: await r.text() }),
      () => ({ status: 0, text: "" }),
    ),
  );
  for (const m of hold) await arrived(m, { done: false });
  const arrivedAll = hold.every((m) => mock.requests.some((r) => JSON.stringify(r.body ?? "").includes(m)));
  const extra = await post("/v1/chat/completions", parKey, { model: "local", messages: [{ role: "user", content: "one too many" }] });
  const extraText = await extra.text();
  for (const ac of acs) ac.abort();
  const heldAnswers = await Promise.all(held);
  expect(arrivedAll, `a key with max_parallel_requests ${PARALLEL} could not run ${PARALLEL} calls at once: ${JSON.stringify(heldAnswers)} ${note(storm)}`).toBe(true);
  expect(extra.status, `one call more than max_parallel_requests ${note(storm)}: ${extraText}`).toBe(429);
  expect(extraText).toContain(`parallel requests limit ${PARALLEL}, ${PARALLEL} requests in flight`);
  counted.par += PARALLEL;
  await waitIdle(storm);

  // The budget: nothing held by calls in flight (its worst case is refused, naming what is held).
  const refused = await post("/v1/chat/completions", budgetKey, { model: "pricey", messages: [{ role: "user", content: "how much is held?" }], max_tokens: 5000 });
  const refusedText = await refused.text();
  expect(refused.status, `${refusedText} ${note(storm)}`).toBe(400);
  expect(refusedText, `the budget key's reservations after the storm ${note(storm)}`).toContain("$0 held by calls in flight");
  const ledger = localParts().ledger as unknown as LocalLedger;
  expect(ledger.peek(counterId("key", budgetToken))?.reserved ?? 0n).toBe(0n);
  expect(ledger.peek(counterId("key", parToken))?.reserved ?? 0n).toBe(0n);

  // The rpm window: exactly the calls made (refusals and cache hits consume nothing).
  const probe = await post("/v1/chat/completions", parKey, { model: "local", messages: [{ role: "user", content: `count ${storm}` }] });
  await probe.text();
  counted.par += 1;
  expect(probe.headers.get("x-ratelimit-remaining-requests"), `calls counted in the rpm window of the parallel key ${note(storm)}`).toBe(String(RPM - counted.par));
  const wideProbe = await post("/v1/chat/completions", wideKey, { model: "local", messages: [{ role: "user", content: `count ${storm}` }] });
  await wideProbe.text();
  counted.wide += 1;
  expect(wideProbe.headers.get("x-ratelimit-remaining-requests"), `calls counted in the rpm window of the wide key ${note(storm)}`).toBe(String(RPM - counted.wide));
  const rpmProbe = await post("/v1/chat/completions", rpmKey, { model: "local", messages: [{ role: "user", content: `count ${storm}` }] });
  const rpmText = await rpmProbe.text();
  if (counted.rpm < SMALL_RPM) {
    counted.rpm++;
    expect(rpmProbe.headers.get("x-ratelimit-remaining-requests"), `calls counted in the rpm window of the rpm key ${note(storm)}`).toBe(String(SMALL_RPM - counted.rpm));
  } else expect(rpmText, `the rpm key after ${counted.rpm} calls ${note(storm)}`).toContain(`requests per minute limit ${SMALL_RPM}, ${SMALL_RPM} used in the last 60 s`);
  if (mode === "memory") {
    const windows = gw.host!.services.rateWindows as LocalWindows;
    expect(windows.usage(`key:${tokenOf(rpmKey)}`), `the rpm key's window ${note(storm)}`).toEqual({ requests: Math.min(SMALL_RPM, counted.rpm), tokens: expect.any(Number), inFlight: 0 });
  }
  await waitIdle(storm);
}

// ---------------------------------------------------------------------------------------------
// Storms

function heapCounts(): Record<string, number> {
  Bun.gc(true);
  Bun.gc(true);
  return { ...heapStats().objectTypeCounts };
}

async function storms(m: Mode): Promise<void> {
  await gw?.stop();
  await start(m);
  servingVariant = 0;
  // The router's figures: kept only for deployments a snapshot serves (ids seen before this gateway are another's).
  const statesBefore = new Set(deploymentStateIds());
  const rnd = new Random(SEED);
  const counts: Record<string, number>[] = [];
  // As many as the serving snapshot's plugins and the host hold: a snapshot's plugins unsubscribe when it is disposed or refused.
  const listeners = (await internals()).listeners;
  let variant = 0;
  let updates = 0;
  for (let storm = 1; storm <= STORMS; storm++) {
    const plan = Array.from({ length: CALLS }, () => rnd.pick(KINDS));
    const seeds = plan.map(() => rnd.int(2 ** 31));
    const reloads = [rnd.int(CALLS), rnd.int(CALLS)];
    const refusedReloads = [rnd.int(CALLS), rnd.int(CALLS)];
    const keyUpdates = [rnd.int(CALLS), rnd.int(CALLS), rnd.int(CALLS)];
    const calls: Promise<Outcome>[] = [];
    const reloading: Promise<boolean>[] = [];
    let reloadChain: Promise<boolean> = Promise.resolve(true);
    /** Queues a reload step behind the others; its result says whether it went as planned. */
    const queueReload = (step: () => Promise<boolean>) => {
      reloadChain = reloadChain.then(step);
      reloading.push(reloadChain);
    };
    for (let i = 0; i < CALLS; i++) {
      // Reloads run one after another (each writes the file it reloads), while the calls go on.
      if (reloads.includes(i)) {
        const v = ++variant;
        queueReload(async () => {
          gw.writeConfig(config(v));
          const ok = (await gw.live.reload("leaks differential", true)).ok;
          if (ok) servingVariant = v;
          return ok;
        });
      }
      if (refusedReloads.includes(i)) {
        // Refused: a master key that cannot decrypt the stored model, or a file the schema refuses. The previous config keeps serving.
        const anotherKey = rnd.chance(0.5);
        queueReload(async () => {
          const file = await Bun.file(gw.configPath).text();
          gw.writeConfig(anotherKey ? config(variant, "sk-another-master-key") : { model_list: "not a list" });
          const r = await gw.live.reload("leaks differential (refused)", true);
          gw.writeConfig(file);
          return !r.ok;
        });
      }
      // A key's limits and budget change while its calls run (an admin's update): what they hold must still come back.
      if (keyUpdates.includes(i)) {
        const n = ++updates;
        reloading.push(
          requestOk(gw, "POST", "/key/update", { key: wideKey, max_budget: 1000 + (n % 2), max_parallel_requests: 1000 - (n % 2), rpm_limit: RPM }).then(
            () => true,
            () => false,
          ),
        );
      }
      calls.push(oneCall(plan[i]!, `m${storm}x${i}x`, new Random(seeds[i]!)));
      // Bursts of a few calls at once, then a short breath, so the parallel limit both refuses and admits.
      if (i % 8 === 7) await Bun.sleep(rnd.int(30));
    }
    const outcomes = await Promise.all(calls);
    for (const asPlanned of await Promise.all(reloading)) expect(asPlanned, `a reload served or refused as planned ${note(storm)}`).toBe(true);
    for (const o of outcomes) {
      // Never a 5xx of the gateway's own (an upstream 5xx after retries and fallback is not planned: the fallback answers).
      if (o.status >= 500) throw new Error(`a ${o.kind} call answered ${o.status}: ${o.text} ${note(storm)}`);
      if (o.key === "par" && countsInWindow(o)) counted.par++;
      if (o.key === "rpm" && countsInWindow(o)) counted.rpm++;
      if (o.key === "wide" && countsInWindow(o)) counted.wide++;
    }
    const tally: Record<string, number> = {};
    for (const o of outcomes) tally[`${o.kind}:${o.status}`] = (tally[`${o.kind}:${o.status}`] ?? 0) + 1;
    await waitIdle(storm);
    const serving = new Set(gw.live.current.models.entries.map((e) => e.deployment.id));
    // (Only the groups the reloads replace: with Redis, another process's cooldowns on the same channel add ids of its own.)
    const stale = deploymentStateIds().filter((id) => id.startsWith("dep-extra-") && !statesBefore.has(id) && !serving.has(id));
    expect(stale, `the router keeps figures of deployments no config serves any more ${note(storm)}`).toEqual([]);
    await userChecks(storm);
    mock.reset();
    expect((await internals()).listeners, `identity listeners (plugins of snapshots built and retired or refused) after storm ${storm} ${note(storm)}`).toBe(listeners);
    counts.push(heapCounts());
    console.log(`storm ${storm}: ${JSON.stringify(tally)}; heap objects ${heapStats().objectCount}`);
  }
  if (mode === "redis") {
    // Cooldowns other instances announce for deployments this one does not serve (another config,
    // a fleet mid-deploy) leave no figures here.
    const foreign = Array.from({ length: 50 }, (_, i) => `dep-foreign-${process.pid}-${i}`);
    const client = gw.host!.redis!.client;
    const channel = channelName(client, "svc:deployment-cooldowns");
    for (const id of foreign) await client.publish(channel, JSON.stringify({ from: "another-instance", id, ms: 60_000 }));
    // A served one is still heard (a marker that the messages before it arrived).
    await client.publish(channel, JSON.stringify({ from: "another-instance", id: "dep-pricey", ms: 1 }));
    const heard = await until(async () => deploymentStateIds().includes("dep-pricey") && stateOf("dep-pricey").cooldownUntil > 0, 5000);
    expect(heard, `a cooldown another instance announced for a served deployment ${note(STORMS)}`).toBe(true);
    expect(deploymentStateIds().filter((id) => foreign.includes(id)), `figures kept for deployments this instance does not serve ${note(STORMS)}`).toEqual([]);
  }
  // From the second storm on, no object type grows by as much as one object per call: over every
  // two storms in a row (a leak grows in each), so one snapshot the conservative collector took
  // with an old batch still reachable (a stale word on a stack) cannot fail it on its own.
  if (counts.length >= 4) {
    const calls = CALLS * 2;
    const windows = counts.slice(1, -2).map((first, i) => {
      const last = counts[i + 3]!;
      return new Map(Object.keys(last).map((type) => [type, (last[type] ?? 0) - (first[type] ?? 0)] as const));
    });
    if (process.env.LEAKS_DIFF_VERBOSE) console.log(windows.map((w) => [...w].sort((a, b) => b[1] - a[1]).slice(0, 8)));
    const grown = [...windows[0]!]
      .filter(([type]) => windows.every((w) => (w.get(type) ?? 0) >= calls))
      .map(([type]) => [type, windows.map((w) => w.get(type))] as const);
    expect(grown, `object types that grew by ${calls} or more over each two storms of ${CALLS} calls ${note(STORMS)}`).toEqual([]);
  }
}

test("calls that end every way leave nothing behind (windows and ledger in memory)", () => storms("memory"), 120_000);

/** The gateway with its windows and ledger in memory (a storm in Redis may have run last). */
async function inMemory(): Promise<void> {
  if (gw && mode === "memory") return;
  await gw?.stop();
  await start("memory");
}

/**
 * The object types that grew by half an object per call or more over 2,400 calls, each with a value
 * never sent before (`call(i)`: the i-th), once 1,500 such calls have filled the gateway's bounded
 * tables. A type that grew that much is measured over 2,400 more calls and counts only if it grew
 * as much again: a leak grows with every call, while the collector (conservative: it keeps what a
 * stale word on a stack points to) can leave one snapshot with an old batch still reachable.
 */
async function grownByNewValues(call: (i: number) => Promise<void>): Promise<(readonly [string, number])[]> {
  const run = async (from: number, n: number) => {
    for (let i = from; i < from + n; i += 10) await Promise.all(Array.from({ length: Math.min(10, from + n - i) }, (_, j) => call(i + j)));
    await waitIdle(0);
    // The mock upstream keeps every request it got.
    mock.reset();
    return heapCounts();
  };
  const grownBetween = (before: Record<string, number>, after: Record<string, number>) =>
    Object.keys(after).map((type) => [type, (after[type] ?? 0) - (before[type] ?? 0)] as const);
  await run(0, 1200);
  const before = await run(1200, 300);
  const after = await run(1500, 2400);
  const grown = grownBetween(before, after);
  if (process.env.LEAKS_DIFF_VERBOSE) console.log(grown.toSorted((x, y) => y[1] - x[1]).slice(0, 8));
  const suspects = grown.filter(([, d]) => d >= 1200);
  if (suspects.length === 0) return [];
  const again = new Map(grownBetween(after, await run(3900, 2400)));
  console.log(`grown over 2,400 calls: ${JSON.stringify(suspects)}; over the next 2,400: ${JSON.stringify(suspects.map(([t]) => [t, again.get(t) ?? 0]))}`);
  return suspects.filter(([type]) => (again.get(type) ?? 0) >= 1200);
}

/** A call that must answer 200. */
const answered = async (what: string, res: Promise<Response>): Promise<void> => {
  const r = await res;
  const text = await r.text();
  if (r.status !== 200) throw new Error(`${what}: ${r.status} ${text}`);
};

// Model names a client makes up under a wildcard route: the gateway keeps at most so many per-name
// entries (its table of wildcard matches holds 1,000), so once those are full, more names add nothing.
test("model names a client makes up leave nothing behind", async () => {
  await inMemory();
  const grown = await grownByNewValues((i) => answered(`wild/name-${i}`, post("/v1/chat/completions", wideKey, { model: `wild/name-${i}`, messages: [{ role: "user", content: "hi" }] })));
  expect(grown, `object types that grew by 1,200 or more over 2,400 calls with new model names (LEAKS_DIFF_SEED=${SEED})`).toEqual([]);
}, 60_000);

// Image sizes a client makes up: each size and quality is its own price lookup, cached until the
// next reload, at most 1,000 of them. A size the model has no price for is refused (400) after
// that lookup, so the refusals must leave nothing behind either.
test("image sizes a client makes up leave nothing behind", async () => {
  await inMemory();
  const refusedOrAnswered = async (what: string, res: Promise<Response>): Promise<void> => {
    const r = await res;
    const text = await r.text();
    // 1024x1024 (and any other size dall-e-3 is priced for) is answered.
    if (r.status !== 400 && r.status !== 200) throw new Error(`${what}: ${r.status} ${text}`);
  };
  const grown = await grownByNewValues((i) => refusedOrAnswered(`size ${1000 + i}x1024`, post("/v1/images/generations", wideKey, { model: "dalle", prompt: "draw", size: `${1000 + i}x1024` })));
  expect(grown, `object types that grew by 1,200 or more over 2,400 image calls with new sizes (LEAKS_DIFF_SEED=${SEED})`).toEqual([]);
}, 60_000);

// Budget alerts: one per budget and period, for the life of the process (keys on daily soft
// budgets send one each a day). The gateway keeps only the latest hundred of those it sent.
test("budget alerts leave nothing behind", async () => {
  await inMemory();
  const KEYS = 150;
  const keys: string[] = [];
  for (let i = 0; i < KEYS; i += 10) {
    const batch = Array.from({ length: 10 }, () => requestOk<{ key: string }>(gw, "POST", "/key/generate", { soft_budget: 0.000000001 }).then((r) => r.key));
    keys.push(...(await Promise.all(batch)));
  }
  for (let i = 0; i < KEYS; i += 10) {
    await Promise.all(
      keys.slice(i, i + 10).map(async (k) => {
        const r = await post("/v1/chat/completions", k, { model: "fast", messages: [{ role: "user", content: "cross my soft budget" }], max_tokens: 5 });
        expect(r.status, await r.text()).toBe(200);
      }),
    );
  }
  await waitIdle(0);
  const tokens = keys.map((k) => `key:${tokenOf(k)}`);
  const stored = async () => {
    const [row] = await rows<{ n: number }>(gw.host!.store.db, sql`select count(*)::int as n from budget_alerts where event = 'soft_budget_crossed' and counter_id in ${tokens}`);
    return row?.n ?? 0;
  };
  expect(await until(async () => (await stored()) === KEYS, 10_000), `every key's soft budget alert was sent (LEAKS_DIFF_SEED=${SEED})`).toBe(true);
  expect(gw.host!.alerts.sent.length, `budget alerts this instance holds after sending ${KEYS} (LEAKS_DIFF_SEED=${SEED})`).toBeLessThanOrEqual(100);
}, 60_000);

test.skipIf(!(await redisReachable(REDIS_URL)))("calls that end every way leave nothing behind (windows and ledger in Redis)", () => storms("redis"), 120_000);
