// The response cache against an independent model of it, seeded random (CACHE_DIFF_SEED=<n> runs
// another sequence; every failure names the seed and the step), in memory and in Redis.
//
// Each run draws cache settings (svc_settings.cache on or off, cache_params.mode, type, ttl of 1.5 s,
// 2 s or 600 s, a config namespace; prompts stored in the spend log or not; client-side
// credentials allowed or not) and a sequence of chat (JSON and streamed), completions and
// embeddings requests from a small space, so that many repeat: the same request again, or with its
// keys in another order and other whitespace, or with fields the README leaves out of the key
// (`user`, `metadata`, `caching: true`, `num_retries`, a field sent as null), from another key or
// team (the key does not include the caller), or differing in a field that changes the answer
// (model, messages, prompt, input, temperature, tools, max_tokens, encoding_format, an embeddings
// request's own api_base and api_key, stream, stream_options), with random per-request controls
// (`caching: false`, `no-cache`, `no-store`, `ttl`, `s-maxage`, `namespace`; a key with
// allowed_cache_controls gets a 403 for the others; own credentials are a 400, hit or not, unless
// the operator allows them). A few sleeps let short ttls and s-maxage run out. Some requests go
// twice at once. Some misses meet an upstream fault: a 500, or a stream (or JSON body) cut in the
// middle, sometimes retried (num_retries: 1); some streams the client leaves after their first
// piece; a failed or cancelled answer must never be cached.
//
// The model keeps, per (endpoint, model, namespace, fields that matter, stream), the last answer
// written and when (a window: between the writer's send and its last byte). For every request it
// predicts: hit or miss (`x-svc-cache-hit`; a read near an expiry or an s-maxage limit may go
// either way and then tells the model which), the body (a hit is byte for byte the stored answer,
// a stream replayed as the same stream; a stream and a JSON answer are different entries),
// `x-svc-cache-key` (one per model key, different for different ones), `x-svc-response-cost: 0`
// on a hit, how many requests reached the upstream, and after the spend writer flushes the
// spend_logs row: cache_hit, status, spend (0 for a hit and a failure, more for a priced success
// and a stream cut after its answer began),
// tokens (a hit repeats the writer's), stream, end user, key hash, team, request_id (the response
// `id` the client got, else the call id; a hit's response id + `_cache_hit<ms>`), and with store_prompts_in_spend_logs the prompt and the
// answer kept (a hit keeps the answer it gave, as its writer's row did).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, requestOk, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { Random } from "../harness/random.ts";
import { sha256, until } from "../harness/util.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

const SEED = Number(process.env.CACHE_DIFF_SEED || 20_261_126);
const STEPS = 70;
/** Slack for timings measured by the test around what the gateway measures inside (same clock). */
const MARGIN_MS = 40;
/** Sleeps per run, at most (ms): keeps the suite short. */
const SLEEP_BUDGET_MS = 4000;

type Json = Record<string, unknown>;
type EndpointName = "chat" | "completions" | "embeddings";
const PATHS: Record<EndpointName, string> = { chat: "/v1/chat/completions", completions: "/v1/completions", embeddings: "/v1/embeddings" };

const models = (url: string) => [
  { model_name: "gpt", svc_params: { model: "openai/gpt-4o-mini", api_base: url, api_key: "sk-up" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } },
  { model_name: "gpt-b", svc_params: { model: "openai/gpt-4o", api_base: url, api_key: "sk-up" }, model_info: { input_cost_per_token: 0.000003, output_cost_per_token: 0.000004 } },
  { model_name: "inst", svc_params: { model: "openai/gpt-3.5-turbo-instruct", api_base: url, api_key: "sk-up" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } },
  { model_name: "emb", svc_params: { model: "openai/text-embedding-3-small", api_base: url, api_key: "sk-up" }, model_info: { input_cost_per_token: 0.000001 } },
  { model_name: "emb-b", svc_params: { model: "openai/text-embedding-3-small", api_base: url, api_key: "sk-up" }, model_info: { input_cost_per_token: 0.000002 } },
];

const WEATHER_TOOL = { type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } };

/** What a request asks, as far as the answer goes: the model's key (with the namespace) is built from this alone. */
interface Spec {
  endpoint: EndpointName;
  model: string;
  /** Which prompt / messages / input of the pool. */
  prompt: number;
  temperature?: number;
  tools?: boolean;
  maxTokens?: number;
  encodingFormat?: string;
  /** An embeddings request with its own api_base and api_key (the same mock here, another cache entry). */
  ownCredentials?: boolean;
  stream: boolean;
  includeUsage?: boolean;
}

interface Caller {
  label: string;
  key: string;
  teamId: string | null;
  /** allowed_cache_controls of the key (empty: any). */
  allowed: string[];
}

interface Controls {
  "no-cache"?: boolean;
  "no-store"?: boolean;
  ttl?: number;
  "s-maxage"?: number;
  namespace?: string;
}

interface Entry {
  /** The answer stored (one of these, when two writers raced). */
  bodies: string[];
  /** The writer's call ids, for the tokens a hit repeats. */
  writers: string[];
  storedMin: number;
  storedMax: number;
  ttlMs: number;
  /** Seen to be gone (a miss that only its expiry explains). */
  dead?: boolean;
}

interface RowExpectation {
  step: string;
  callId: string;
  hit: boolean;
  status: "success" | "failure" | "cancelled";
  /** Priced success: spend > 0 (undefined: not checked, a cancelled stream is charged for what it used). */
  paid: boolean | undefined;
  stream: boolean;
  endUser: string | null;
  keyHash: string;
  teamId: string | null;
  /** For a success: the response id the client got, else the call id. */
  requestId?: string;
  /** A hit: the writer call ids whose tokens it repeats (one of). */
  writers?: string[];
  /** What was asked (messages, prompt or input), kept with prompts stored. */
  prompt: unknown;
  /** A JSON success with prompts stored: the answer kept (chat and completions). */
  answer?: unknown;
}

interface CacheConfig {
  enabled: boolean;
  defaultOn: boolean;
  type?: "local" | "redis";
  ttl?: number;
  namespace?: string;
  /** general_settings.store_prompts_in_spend_logs: rows keep the prompt and the answer (a hit: the cached one). */
  storePrompts: boolean;
  /** svc_settings.allow_client_side_credentials (for 127.0.0.1): else an embeddings request with its own api_base is a 400, hit or not. */
  clientCredentials: boolean;
}

function drawConfig(rng: Random, redis: boolean): CacheConfig {
  const enabled = rng.chance(0.75);
  return {
    enabled,
    defaultOn: !rng.chance(0.25),
    type: redis ? rng.pick(["redis", "redis", undefined, "local"] as const) : rng.pick(["local", undefined] as const),
    ttl: rng.pick([1.5, 2, 600, 600, undefined]),
    namespace: rng.maybe(0.3, ["cfg-ns", "other-cfg"]),
    storePrompts: rng.chance(0.5),
    clientCredentials: rng.chance(0.6),
  };
}

function configOf(rng: Random, c: CacheConfig, upstream: string): Json {
  const params: Json = {};
  if (c.type) params.type = c.type;
  if (c.ttl !== undefined) params.ttl = c.ttl;
  if (c.namespace !== undefined) params.namespace = c.namespace;
  if (!c.defaultOn) params.mode = "default_off";
  else if (rng.chance(0.5)) params.mode = "default_on";
  return { model_list: models(upstream), svc_settings: { cache: c.enabled, cache_params: params, allow_client_side_credentials: c.clientCredentials, client_side_api_base_hosts: ["127.0.0.1"] }, general_settings: { master_key: MASTER_KEY, store_prompts_in_spend_logs: c.storePrompts } };
}

/** A JSON text of `v` with its keys shuffled (at every level) and random whitespace. */
function looseJson(rng: Random, v: unknown): string {
  const shuffle = (x: unknown): unknown => {
    if (Array.isArray(x)) return x.map(shuffle);
    if (x && typeof x === "object") {
      const keys = Object.keys(x);
      for (let i = keys.length - 1; i > 0; i--) {
        const j = rng.int(i + 1);
        [keys[i], keys[j]] = [keys[j]!, keys[i]!];
      }
      return Object.fromEntries(keys.map((k) => [k, shuffle((x as Json)[k])]));
    }
    return x;
  };
  const text = JSON.stringify(shuffle(v), null, rng.pick([undefined, 1, 2, "\t"]));
  return `${rng.pick(["", " ", "\n", "\r\n  "])}${text}${rng.pick(["", "\n", "  \n"])}`;
}

/** The id of an answer as the client got it (a stream's first chunk), if any. */
function answerId(body: string, stream: boolean): string | undefined {
  try {
    if (!stream) return (JSON.parse(body) as { id?: string }).id;
    const first = body.split("\n\n").find((e) => e.startsWith("data: {"));
    return first ? (JSON.parse(first.slice(6)) as { id?: string }).id : undefined;
  } catch {
    return undefined;
  }
}

interface Run {
  label: string;
  gw: TestGateway;
  config: CacheConfig;
  callers: Caller[];
}

async function startRun(up: MockOpenAI, redis: boolean, rng: Random): Promise<Run> {
  const config = drawConfig(rng, redis);
  const gw = await startBackendGateway(redis ? "postgres" : "pglite", configOf(rng, config, up.url), { redisUrl: redis ? TEST_REDIS_URL : undefined, dbPrefix: "gw_cache_diff" });
  const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: `cache-diff-${SEED}` });
  const plain = await requestOk<{ key: string }>(gw, "POST", "/key/generate", {});
  const teamKey = await requestOk<{ key: string }>(gw, "POST", "/key/generate", { team_id: team.team_id });
  const limited = await requestOk<{ key: string }>(gw, "POST", "/key/generate", { allowed_cache_controls: ["no-cache", "namespace"] });
  return {
    label: redis ? "redis" : "local",
    gw,
    config,
    callers: [
      { label: "master", key: MASTER_KEY, teamId: null, allowed: [] },
      { label: "plain key", key: plain.key, teamId: null, allowed: [] },
      { label: "team key", key: teamKey.key, teamId: team.team_id, allowed: [] },
      { label: "limited key", key: limited.key, teamId: null, allowed: ["no-cache", "namespace"] },
    ],
  };
}

/** Runs one seeded sequence against `run`, checking every answer; returns the rows to expect. */
async function sequence(up: MockOpenAI, run: Run, rng: Random): Promise<void> {
  const tag = `${SEED}-${run.label}-${Math.random().toString(36).slice(2, 8)}`;
  const where = (step: number | string, extra = "") => `CACHE_DIFF_SEED=${SEED} ${run.label} step ${step} (config ${JSON.stringify(run.config)})${extra ? `: ${extra}` : ""}`;
  const model = new Map<string, Entry>();
  const headerKeys = new Map<string, string>();
  const keysByHeader = new Map<string, string>();
  const rowsExpected: RowExpectation[] = [];
  let sleptMs = 0;
  const specs: Spec[] = [];
  const stats = { refused: 0, pairs: 0, faults: 0, retried: 0, cancelled: 0, eitherWay: 0, noRead: 0 };

  const prompts = {
    chat: (i: number): Json[] =>
      [
        [{ role: "user", content: `alpha ${tag} tell me` }],
        [
          { role: "system", content: "be brief" },
          { role: "user", content: `alpha ${tag} tell me` },
        ],
        [{ role: "user", content: `the weather ${tag} in Paris` }],
        [
          { role: "user", content: `beta ${tag}` },
          { role: "assistant", content: "yes?" },
          { role: "user", content: `gamma ${tag} now` },
        ],
      ][i]!,
    completions: (i: number): string => [`once ${tag} upon`, `twice ${tag} upon`, `thrice ${tag}`][i]!,
    embeddings: (i: number): unknown => [`embed ${tag}`, [`embed ${tag}`], `other ${tag} text`][i]!,
  };

  const drawSpec = (): Spec => {
    if (specs.length > 0 && rng.chance(0.6)) {
      const base = rng.pick(specs.slice(-8));
      // The same request, or one field that matters changed.
      if (rng.chance(0.7)) return base;
      const s: Spec = { ...base };
      const field = rng.int(4);
      if (field === 0) s.stream = s.endpoint !== "embeddings" && !s.stream;
      else if (field === 1) s.model = s.endpoint === "chat" ? (s.model === "gpt" ? "gpt-b" : "gpt") : s.endpoint === "embeddings" ? (s.model === "emb" ? "emb-b" : "emb") : s.model;
      else if (field === 2) s.prompt = (s.prompt + 1) % (s.endpoint === "chat" ? 4 : 3);
      else if (s.endpoint === "embeddings" && rng.chance(0.5)) s.encodingFormat = s.encodingFormat ? undefined : "float";
      else if (s.endpoint === "embeddings") s.ownCredentials = s.ownCredentials ? undefined : true;
      else s.temperature = s.temperature === undefined ? 0.5 : undefined;
      if (!s.stream) delete s.includeUsage;
      return s;
    }
    const endpoint = rng.pick(["chat", "chat", "chat", "completions", "embeddings"] as const);
    if (endpoint === "embeddings") return { endpoint, model: rng.pick(["emb", "emb-b"]), prompt: rng.int(3), encodingFormat: rng.maybe(0.3, ["float"]), ownCredentials: rng.chance(0.2) ? true : undefined, stream: false };
    const stream = rng.chance(0.45);
    return {
      endpoint,
      model: endpoint === "chat" ? rng.pick(["gpt", "gpt", "gpt-b"]) : "inst",
      prompt: rng.int(endpoint === "chat" ? 4 : 3),
      temperature: rng.maybe(0.3, [0, 0.7]),
      tools: endpoint === "chat" && rng.chance(0.25) ? true : undefined,
      maxTokens: rng.maybe(0.2, [3, 50]),
      stream,
      includeUsage: stream && rng.chance(0.4) ? true : undefined,
    };
  };

  const bodyOf = (s: Spec, extra: Json): Json => {
    const b: Json = { model: s.model };
    if (s.endpoint === "chat") b.messages = prompts.chat(s.prompt);
    else if (s.endpoint === "completions") b.prompt = prompts.completions(s.prompt);
    else b.input = prompts.embeddings(s.prompt);
    if (s.temperature !== undefined) b.temperature = s.temperature;
    // A field sent as null is the field not sent.
    else if (s.endpoint !== "embeddings" && rng.chance(0.1)) b.temperature = null;
    if (s.tools) b.tools = [WEATHER_TOOL];
    if (s.maxTokens !== undefined) b.max_tokens = s.maxTokens;
    if (s.encodingFormat !== undefined) b.encoding_format = s.encodingFormat;
    if (s.ownCredentials) Object.assign(b, { api_base: up.url, api_key: "sk-up" });
    if (s.stream) b.stream = true;
    else if (s.endpoint !== "embeddings" && rng.chance(0.2)) b.stream = false;
    if (s.includeUsage) b.stream_options = { include_usage: true };
    return { ...b, ...extra };
  };

  /** Whether the entry answers a read in [t0, t1]: true, false, or undefined (either may happen). */
  const answers = (e: Entry | undefined, maxAgeMs: number | undefined, t0: number, t1: number): { fresh: boolean | undefined; age: boolean | undefined } => {
    if (!e) return { fresh: false, age: false };
    let fresh: boolean | undefined;
    if (e.dead || t0 - MARGIN_MS > e.storedMax + e.ttlMs) fresh = false;
    else if (t1 + MARGIN_MS < e.storedMin + e.ttlMs) fresh = true;
    let age: boolean | undefined = true;
    if (maxAgeMs !== undefined) {
      if (t0 - e.storedMax > maxAgeMs + MARGIN_MS) age = false;
      else if (t1 - e.storedMin + MARGIN_MS < maxAgeMs) age = true;
      else age = undefined;
    }
    return { fresh, age };
  };

  for (let step = 0; step < STEPS; step++) {
    if (sleptMs < SLEEP_BUDGET_MS && rng.chance(0.07)) {
      const ms = rng.pick([700, 1200]);
      sleptMs += ms;
      await Bun.sleep(ms);
    }
    const spec = drawSpec();
    specs.push(spec);
    const caller = rng.pick(run.callers);
    const extra: Json = {};
    if (rng.chance(0.3)) extra.user = rng.pick(["end-user-1", "end-user-2", `u-${tag}`]);
    if (rng.chance(0.25)) extra.metadata = { tags: [rng.pick(["t1", "t2"])], note: rng.pick(["a", "b"]) };
    const needsOptIn = !run.config.enabled || !run.config.defaultOn;
    const caching = rng.chance(0.07) ? false : rng.chance(needsOptIn ? 0.8 : 0.2) ? true : undefined;
    if (caching !== undefined) extra.caching = caching;
    if (rng.chance(0.1)) extra.num_retries = 0;
    const controls: Controls = {};
    if (rng.chance(0.12)) controls["no-cache"] = true;
    if (rng.chance(0.12)) controls["no-store"] = true;
    if (rng.chance(0.15)) controls.ttl = rng.pick([0, 1, 2, 600]);
    if (rng.chance(0.12)) controls["s-maxage"] = rng.pick([0, 0.5, 1, 60]);
    if (rng.chance(0.2)) controls.namespace = rng.pick(["ns-a", "ns-b", ""]);
    if (Object.keys(controls).length > 0 || rng.chance(0.05)) extra.cache = controls;

    // Controls are checked whether or not the request uses the cache (as their format is).
    const cached = caching !== false && (caching === true || (run.config.enabled && run.config.defaultOn));
    const refused = caller.allowed.length > 0 && Object.keys(controls).some((c) => !caller.allowed.includes(c));
    const use = cached && !refused;
    const read = use && controls["no-cache"] !== true;
    const write = use && controls["no-store"] !== true;
    const ns = controls.namespace ?? run.config.namespace ?? "";
    const key = JSON.stringify([spec.endpoint, spec.model, ns, spec.prompt, spec.temperature, spec.tools, spec.maxTokens, spec.encodingFormat, spec.ownCredentials, spec.stream, spec.includeUsage]);
    const entry = model.get(key);
    const before = up.requests.length;

    // A fault only where the upstream is surely asked (the fault waits for the next request that reaches it).
    // Own credentials the operator does not allow: a 400 (after the cache controls' 403), hit or not.
    const credentialsRefused = !refused && spec.ownCredentials === true && !run.config.clientCredentials;
    const surelyMiss = !refused && !credentialsRefused && (!read || !entry || entry.dead === true);
    let fault: "500" | "cut" | undefined;
    /** Chunks sent before a cut: after the first alone (OpenAI's opening one: the role) the stream has not begun. */
    let cutAfter = 0;
    /** The fault is followed by a retry (a 500, or a JSON body cut: a stream cut once started is not retried). */
    let retried = false;
    if (surelyMiss && rng.chance(0.12)) {
      fault = rng.chance(0.5) ? "500" : "cut";
      stats.faults++;
      cutAfter = 1 + rng.int(2);
      up.fault(fault === "500" ? { kind: "status", status: 500 } : { kind: "cutStream", afterChunks: cutAfter });
      if ((fault === "500" || !spec.stream) && rng.chance(0.3)) {
        retried = true;
        stats.retried++;
        extra.num_retries = 1;
      }
    }
    const body = bodyOf(spec, extra);
    const text = looseJson(rng, body);
    const label = where(step, `${caller.label} ${text.replace(/\s+/g, " ").trim()}`);
    const post = () => fetch(`${run.gw.url}${PATHS[spec.endpoint]}`, { method: "POST", headers: { authorization: `Bearer ${caller.key}`, "content-type": "application/json" }, body: text });
    /** The log row a successful call of this step leaves (what depends on its answer is added where it is known). */
    const successRow = (rowStep: string, callId: string, hit: boolean): RowExpectation => ({
      step: rowStep,
      callId,
      hit,
      status: "success",
      paid: !hit,
      stream: spec.stream,
      endUser: typeof extra.user === "string" ? extra.user : null,
      keyHash: sha256(caller.key),
      teamId: caller.teamId,
      prompt: body.messages ?? body.prompt ?? body.input,
    });

    // Sometimes a client leaves a stream after its first piece: a cancelled call, never cached.
    if (surelyMiss && !fault && spec.stream && rng.chance(0.15)) {
      stats.cancelled++;
      up.fault({ kind: "slowStream", chunkDelayMs: 40, chunks: 30 });
      const abort = new AbortController();
      const res = await fetch(`${run.gw.url}${PATHS[spec.endpoint]}`, { method: "POST", headers: { authorization: `Bearer ${caller.key}`, "content-type": "application/json" }, body: text, signal: abort.signal });
      expect(res.status, label).toBe(200);
      expect(res.headers.get("x-svc-cache-hit"), label).toBeNull();
      const reader = res.body!.getReader();
      await reader.read();
      abort.abort();
      await reader.cancel().catch(() => undefined);
      up.clearFaults();
      expect(up.requests.length - before, label).toBe(1);
      rowsExpected.push({
        step: `${label} (left after the first piece)`,
        callId: res.headers.get("x-svc-call-id")!,
        hit: false,
        status: "cancelled",
        paid: undefined,
        stream: true,
        endUser: typeof extra.user === "string" ? extra.user : null,
        keyHash: sha256(caller.key),
        teamId: caller.teamId,
        prompt: body.messages ?? body.prompt,
      });
      continue;
    }

    // Sometimes the same request twice at once (no fault): each a hit or a miss, the entry the last writer's.
    if (!refused && !credentialsRefused && !fault && rng.chance(0.07)) {
      stats.pairs++;
      const t0 = Date.now();
      const pair = await Promise.all([0, 1].map(async () => {
        const res = await post();
        return { res, got: await res.text() };
      }));
      const t1 = Date.now();
      const misses = pair.filter((p) => p.res.headers.get("x-svc-cache-hit") !== "true");
      expect(up.requests.length - before, `${label} (twice at once)`).toBe(misses.length);
      if (!read) expect(misses.length, `${label} (twice at once, no read)`).toBe(2);
      const { fresh, age } = answers(entry, controls["s-maxage"] === undefined ? undefined : controls["s-maxage"] * 1000, t0, t1);
      if (read && fresh === true && age === true) expect(misses.length, `${label} (twice at once, a live entry)`).toBe(0);
      const missBodies = misses.map((p) => p.got);
      const missIds = misses.map((p) => p.res.headers.get("x-svc-call-id")!);
      for (const p of pair) {
        const hit = p.res.headers.get("x-svc-cache-hit") === "true";
        expect(p.res.status, `${label} (twice at once): ${p.got}`).toBe(200);
        const callId = p.res.headers.get("x-svc-call-id")!;
        const writers = [...(entry?.writers ?? []), ...missIds];
        if (hit) expect([...(entry?.bodies ?? []), ...missBodies], `${label} (twice at once): a hit answers a stored answer`).toContain(p.got);
        rowsExpected.push({
          ...successRow(`${label} (twice at once)`, callId, hit),
          requestId: answerId(p.got, spec.stream) ?? callId,
          writers: hit ? writers : undefined,
          answer: spec.stream || spec.endpoint === "embeddings" ? undefined : JSON.parse(p.got),
        });
      }
      if (write && misses.length > 0) model.set(key, { bodies: missBodies, writers: missIds, storedMin: t0, storedMax: t1, ttlMs: (controls.ttl ?? run.config.ttl ?? 600) * 1000 });
      else if (entry && misses.length > 0 && fresh === undefined && age === true) entry.dead = true;
      continue;
    }

    const t0 = Date.now();
    const res = await post();
    const got = await res.text();
    const t1 = Date.now();
    up.clearFaults();
    const hitHeader = res.headers.get("x-svc-cache-hit");
    const upstreamCalls = up.requests.length - before;

    if (refused) {
      stats.refused++;
      expect(res.status, label).toBe(403);
      expect(JSON.parse(got).error.message, label).toContain("allowed_cache_controls");
      expect(upstreamCalls, label).toBe(0);
      continue;
    }
    if (credentialsRefused) {
      stats.refused++;
      expect(res.status, `${label}: ${got}`).toBe(400);
      expect(JSON.parse(got).error.param, label).toBe("api_base");
      expect(upstreamCalls, label).toBe(0);
      const callId = res.headers.get("x-svc-call-id");
      expect(callId, label).toBeTruthy();
      rowsExpected.push({
        step: label,
        callId: callId!,
        hit: false,
        status: "failure",
        paid: false,
        stream: false,
        endUser: typeof extra.user === "string" ? extra.user : null,
        keyHash: sha256(caller.key),
        teamId: caller.teamId,
        prompt: body.input,
      });
      continue;
    }

    const { fresh, age } = read ? answers(entry, controls["s-maxage"] === undefined ? undefined : controls["s-maxage"] * 1000, t0, t1) : { fresh: false, age: false };
    const expectHit = fresh === false || age === false ? false : fresh === true && age === true ? true : undefined;
    const hit = hitHeader === "true";
    if (expectHit === undefined) stats.eitherWay++;
    if (!read) stats.noRead++;
    if (expectHit !== undefined) expect(hit, `${label} (hit expected ${expectHit}; entry ${JSON.stringify(entry && { ...entry, bodies: entry.bodies.length })}, read at ${t0}..${t1})`).toBe(expectHit);
    else expect(hitHeader === null || hitHeader === "true", label).toBe(true);
    const callId = res.headers.get("x-svc-call-id");
    expect(callId, `${label}: ${res.status} ${got}`).toBeTruthy();
    const expectation = successRow(label, callId!, hit);

    if (hit) {
      expect(res.status, label).toBe(200);
      expect(upstreamCalls, label).toBe(0);
      expect(entry!.bodies, `${label}: a hit answers the stored answer byte for byte`).toContain(got);
      entry!.bodies = [got];
      expect(res.headers.get("x-svc-response-cost"), label).toBe("0");
      expect(res.headers.get("content-type"), label).toContain(spec.stream ? "text/event-stream" : "application/json");
      const header = res.headers.get("x-svc-cache-key");
      expect(header, label).toMatch(/^[0-9a-f]{64}$/);
      if (headerKeys.has(key)) expect(header, `${label}: one cache key per request`).toBe(headerKeys.get(key)!);
      if (keysByHeader.has(header!)) expect(keysByHeader.get(header!), `${label}: two different requests share a cache key`).toBe(key);
      headerKeys.set(key, header!);
      keysByHeader.set(header!, key);
      expectation.requestId = answerId(got, spec.stream) ?? callId!;
      expectation.writers = entry!.writers;
      if (!spec.stream && spec.endpoint !== "embeddings") expectation.answer = JSON.parse(got);
      rowsExpected.push(expectation);
      continue;
    }

    // A miss: the upstream was asked once.
    expect(hitHeader, label).toBeNull();
    expect(res.headers.get("x-svc-cache-key"), label).toBeNull();
    expect(upstreamCalls, label).toBe(retried ? 2 : 1);
    if (retried) {
      // The failed first attempt is its own row (the call id); the answer is the retry's (`<id>-1`).
      expect(res.status, `${label} (retried after a ${fault}): ${got}`).toBe(200);
      expect(callId, label).toEndWith("-1");
      rowsExpected.push({ ...expectation, callId: callId!.slice(0, -2), status: "failure", paid: false, step: `${label} (first attempt)` });
      fault = undefined;
    }
    if (entry && expectHit === undefined) {
      // The read could have gone either way; it missed: an expiry, or s-maxage, explains it.
      if (fresh === undefined && age === true) entry.dead = true;
    }
    let ok = res.status === 200;
    /** A stream cut after its answer began: a failure charged what it streamed (README: Spend log). */
    let cutMidAnswer = false;
    if (fault === "500") expect(res.status, label).toBe(500);
    else if (fault === "cut" && (!spec.stream || cutAfter === 1)) expect(res.status, label).toBeGreaterThanOrEqual(500);
    else if (fault === "cut") {
      expect(res.status, label).toBe(200);
      expect(got, label).toContain('data: {"error"');
      expect(got, label).not.toContain("data: [DONE]");
      ok = false;
      cutMidAnswer = true;
    } else {
      expect(res.status, `${label}: ${got}`).toBe(200);
      if (spec.stream) expect(got.endsWith("data: [DONE]\n\n"), label).toBe(true);
      if (entry && spec.endpoint !== "embeddings") expect(entry.bodies, `${label}: a miss is a new answer`).not.toContain(got);
    }
    expectation.status = ok ? "success" : "failure";
    expectation.paid = ok || cutMidAnswer;
    if (ok) expectation.requestId = answerId(got, spec.stream) ?? callId!;
    if (ok && !spec.stream && spec.endpoint !== "embeddings") expectation.answer = JSON.parse(got);
    rowsExpected.push(expectation);
    if (ok && write) model.set(key, { bodies: [got], writers: [callId!], storedMin: t0, storedMax: t1, ttlMs: (controls.ttl ?? run.config.ttl ?? 600) * 1000 });
  }

  // The spend log: one row per call, as the model says.
  const host = run.gw.host!;
  const ids = rowsExpected.map((r) => r.callId);
  type Row = {
    call_id: string;
    request_id: string;
    cache_hit: boolean;
    status: string;
    spend: string;
    stream: boolean;
    end_user: string | null;
    api_key: string;
    team_id: string | null;
    prompt_tokens: number;
    completion_tokens: number;
    metadata: { messages?: unknown; response?: unknown };
  };
  let logged: Row[] = [];
  const complete = await until(async () => {
    await host.spendWriter.flush();
    logged = await rows<Row>(
      host.store.db,
      sql`select call_id, request_id, cache_hit, status, spend::text as spend, stream, end_user, api_key, team_id, prompt_tokens, completion_tokens, metadata from spend_logs where call_id in ${sql.raw(`(${ids.map((i) => `'${i}'`).join(",")})`)}`,
    );
    return logged.length >= ids.length;
  }, 8000);
  expect(complete, where("spend log", `${logged.length} of ${ids.length} rows`)).toBe(true);
  const byId = new Map(logged.map((r) => [r.call_id, r]));
  for (const e of rowsExpected) {
    const r = byId.get(e.callId)!;
    const actual = { hit: r.cache_hit, status: r.status, paid: e.paid === undefined ? undefined : Number(r.spend) > 0, stream: r.stream, endUser: r.end_user, keyHash: r.api_key, teamId: r.team_id };
    expect(actual, e.step).toEqual({ hit: e.hit, status: e.status, paid: e.paid, stream: e.stream, endUser: e.endUser, keyHash: e.keyHash, teamId: e.teamId });
    if (e.hit) expect(Number(r.spend), e.step).toBe(0);
    // A hit whose answer has no id (embeddings) is logged by its own call id, already its own.
    if (e.requestId && e.hit && e.requestId !== e.callId) expect(r.request_id, `${e.step}: a hit's request_id is the response id the client got, _cache_hit<ms>`).toMatch(new RegExp(`^${e.requestId}_cache_hit\\d+$`));
    else if (e.requestId) expect(r.request_id, `${e.step}: request_id is the response id the client got`).toBe(e.requestId);
    if (e.writers) {
      const writers = e.writers.map((w) => byId.get(w)!).map((w) => [w.prompt_tokens, w.completion_tokens]);
      expect(writers, `${e.step}: a hit logs the tokens of the answer it repeats`).toContainEqual([r.prompt_tokens, r.completion_tokens]);
      // With prompts stored, a hit keeps the answer it gave: the writer's (a stream assembled the same way).
      if (run.config.storePrompts) expect(e.writers.map((w) => byId.get(w)!.metadata.response), `${e.step}: a hit keeps the cached answer`).toContainEqual(r.metadata.response);
    }
    if (run.config.storePrompts) {
      expect(r.metadata.messages, `${e.step}: the prompt kept`).toEqual(e.prompt);
      if (e.answer !== undefined) expect(r.metadata.response, `${e.step}: the answer kept`).toEqual(e.answer);
    } else expect(r.metadata.messages, `${e.step}: no prompt kept`).toBeUndefined();
  }
  const hits = rowsExpected.filter((r) => r.hit).length;
  // A sequence that never hits checks little: the generator must make repeats.
  expect(hits, where("end", "no hits at all")).toBeGreaterThan(0);
  if (process.env.CACHE_DIFF_STATS) console.log(where("end", JSON.stringify({ ...stats, hits, rows: rowsExpected.length, sleptMs })));
}

let up: MockOpenAI;
beforeAll(async () => {
  up = await startMockOpenAI({ apiKey: "sk-up" });
});
afterAll(async () => {
  await up?.stop();
});

describe(`response cache against a model (CACHE_DIFF_SEED=${SEED})`, () => {
  for (const redis of [false, true]) {
    test(
      redis ? "in Redis" : "in memory",
      async () => {
        const rng = new Random(SEED * 2 + (redis ? 1 : 0));
        const run = await startRun(up, redis, rng);
        try {
          up.reset();
          await sequence(up, run, rng);
        } finally {
          await run.gw.stop();
        }
      },
      30_000,
    );
  }
});
