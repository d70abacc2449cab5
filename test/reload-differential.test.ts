// Hot reload and stored models under concurrent traffic, seeded random (RELOAD_DIFF_SEED=<n> runs
// another sequence, RELOAD_DIFF_STEPS=<n> a longer one; every failure names the seed), against a
// model of what should serve kept here.
//
// Two instances share one PostgreSQL database and one config.yaml: A runs in-process with the file
// watch, B is a real `core/main.ts` process (its own watch, real SIGHUP); stored-model changes reach
// the other instance by LISTEN/NOTIFY. Three OpenAI mocks are the upstreams. A random sequence of
// steps, each one of:
// - a new valid config.yaml (groups of 1–3 deployments over the mocks, `openai/*` and `rd-*`
//   wildcards, explicit or hashed `model_info.id`, prices in `svc_params` and/or `model_info`),
//   written in place or by atomic rename, picked up by the watch or by SIGHUP;
// - an invalid file (bad YAML, schema errors, errors only the registry build finds);
// - SIGHUP alone (an unchanged file, or the invalid one again);
// - a stored model created, replaced, patched or deleted through A's or B's API (sometimes in a
//   config group's name).
// Checked after each step, once both instances show it (polled): /v1/models lists exactly the
// config's groups ∪ the stored models' names and /model/info exactly their deployments (ids, names,
// `db_model`), the same on A and B; an invalid file changes nothing and is logged as rejected by
// both; then a burst of JSON and streaming calls to random names (present, removed, wildcard
// matches, never known) on both instances: a known name answers 200 from a deployment of its group
// (`x-svc-model-id`, and the mock behind that deployment got the call with its upstream model), at
// the exact cost of that deployment's prices (`x-svc-response-cost`, decimal text), a stream ends
// with [DONE]; an unknown name is a 400 in the error envelope; never a 5xx. Calls sent while a step
// is applied may be served by the state before or after it, never anything else. Long streams
// started before a step end after it, on the deployment they started on, with [DONE].
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { configText, freshDatabase, MASTER_KEY, type SpawnedGateway, spawnGateway, startTestGateway, type TestGateway } from "./harness/gateway.ts";
import { Random } from "./harness/random.ts";
import { type MockOpenAI, startMockOpenAI } from "./mock-upstream/openai.ts";

const SEED = Number(process.env.RELOAD_DIFF_SEED ?? 20_261_126);
const STEPS = Number(process.env.RELOAD_DIFF_STEPS ?? 16);
const UPSTREAMS = 3;
const NAMES = ["alpha", "beta", "gamma", "delta"];
const DB_NAMES = ["db-a", "db-b", "db-c"];
const WILD_CALLS = ["openai/q1", "openai/q2", "rd-x", "rd-yy"];
const NEVER = ["nope", "openai", "alpha-2"];
const LONG_CHUNKS = 40;
const LONG_DELAY_MS = 45;
/** Set only by refused files (`environment_variables`); good files send it as a header, which must stay unset. */
const LEAK_ENV = `RD_DIFF_LEAK_${process.pid}`;

type Json = Record<string, unknown>;

/** One deployment as the test knows it; prices are decimal texts (USD per token). */
interface Dep {
  name: string;
  /** Explicit id, else learned from /model/info (a hash of the entry). */
  id?: string;
  explicitId: boolean;
  upstream: number;
  /** `svc_params.model`, unique per deployment (identifies it in /model/info). */
  svcModel: string;
  svcIn?: string;
  svcOut?: string;
  infoIn?: string;
  infoOut?: string;
  db: boolean;
  /** Sends header x-rd-env: os.environ/LEAK_ENV. */
  envHeader?: boolean;
}

interface State {
  config: Dep[];
  db: Map<string, Dep>;
}

const fail = (msg: string): never => {
  throw new Error(`[RELOAD_DIFF_SEED=${SEED}] ${msg}`);
};

// ---- money, computed here from the prices' decimal text

/** A decimal text (`12e-9`, `0`) as yocto-dollars (1e-24) per token. */
function yocto(text: string | undefined): bigint {
  if (text === undefined) return 0n;
  const m = /^(\d+)(?:e-(\d+))?$/.exec(text);
  if (!m) return fail(`bad price text ${text}`);
  const shift = 24 - Number(m[2] ?? 0);
  return BigInt(m[1]!) * 10n ** BigInt(shift);
}

function expectedCost(d: Dep, prompt: number, completion: number): string {
  const y = BigInt(prompt) * yocto(d.infoIn ?? d.svcIn) + BigInt(completion) * yocto(d.infoOut ?? d.svcOut);
  const per = 10n ** 12n;
  const pico = y / per + ((y % per) * 2n >= per ? 1n : 0n);
  const int = pico / 10n ** 12n;
  const frac = (pico % 10n ** 12n).toString().padStart(12, "0").replace(/0+$/, "");
  return frac ? `${int}.${frac}` : `${int}`;
}

// ---- the model's view of routing

const isWild = (d: Dep) => d.name.includes("*");
const all = (s: State) => [...s.config, ...s.db.values()];

/** The deployments serving `name` in `s` (exact group, else the most specific wildcard), with the upstream model each would be asked for. */
function resolve(s: State, name: string): { dep: Dep; upstreamModel: string }[] {
  const exact = all(s).filter((d) => !isWild(d) && d.name === name);
  const bare = (d: Dep) => d.svcModel.slice(d.svcModel.indexOf("/") + 1);
  if (exact.length > 0) return exact.map((dep) => ({ dep, upstreamModel: bare(dep) }));
  const wild = all(s)
    .filter(isWild)
    .filter((d) => {
      const [pre, suf] = d.name.split("*") as [string, string];
      return name.length >= pre.length + suf.length && name.startsWith(pre) && name.endsWith(suf);
    });
  const best = Math.max(-1, ...wild.map((d) => d.name.length));
  return wild
    .filter((d) => d.name.length === best)
    .map((dep) => {
      const [pre, suf] = dep.name.split("*") as [string, string];
      return { dep, upstreamModel: bare(dep).replace("*", name.slice(pre.length, name.length - suf.length)) };
    });
}

/** What /v1/models must list: group names (no wildcards). */
const listed = (s: State) => [...new Set(all(s).filter((d) => !isWild(d)).map((d) => d.name))].sort();

// ---- random states

let serial = 0;

function price(rng: Random): string {
  return rng.chance(0.1) ? "0" : `${1 + rng.int(99_999)}e-${6 + rng.int(9)}`;
}

function pricedDep(rng: Random, d: Omit<Dep, "svcIn" | "svcOut" | "infoIn" | "infoOut">): Dep {
  const out: Dep = { ...d };
  const where = rng.int(4); // svc_params, model_info, both (model_info wins), none
  if (where === 0 || where === 2) Object.assign(out, { svcIn: price(rng), svcOut: price(rng) });
  if (where === 1 || where === 2) Object.assign(out, { infoIn: price(rng), infoOut: rng.chance(0.8) ? price(rng) : undefined });
  return out;
}

function randomConfig(rng: Random): Dep[] {
  const deps: Dep[] = [];
  const ids = new Set<string>();
  const newId = (prefix: string) => {
    let id: string;
    do id = `${prefix}-${rng.int(6)}`;
    while (ids.has(id));
    ids.add(id);
    return id;
  };
  // Sometimes no group at all (only wildcards, or an empty model_list: only the stored models serve).
  for (const name of rng.chance(0.1) ? [] : rng.some(NAMES, 4)) {
    for (let i = 1 + rng.int(3); i > 0; i--) {
      const explicit = rng.chance(0.75);
      deps.push(pricedDep(rng, { name, id: explicit ? newId(name) : undefined, explicitId: explicit, upstream: rng.int(UPSTREAMS), svcModel: `openai/rd${++serial}`, db: false, envHeader: rng.chance(0.3) }));
    }
  }
  for (const [pattern, prefix] of [
    ["openai/*", "rdw"],
    ["rd-*", "rdx"],
  ] as const) {
    if (!rng.chance(0.5)) continue;
    for (let i = 1 + rng.int(2); i > 0; i--) {
      deps.push(pricedDep(rng, { name: pattern, id: newId(`w${prefix}`), explicitId: true, upstream: rng.int(UPSTREAMS), svcModel: `openai/${prefix}${++serial}-*`, db: false }));
    }
  }
  return rng.chance(0.5) ? deps : deps.reverse();
}

const num = (t: string | undefined) => (t === undefined ? undefined : Number(t));

function entryOf(d: Dep, mocks: MockOpenAI[]): Json {
  const svc: Json = { model: d.svcModel, api_base: mocks[d.upstream]!.url, api_key: "sk-upstream" };
  if (d.envHeader) svc.headers = { "x-rd-env": `os.environ/${LEAK_ENV}` };
  if (d.svcIn !== undefined) svc.input_cost_per_token = num(d.svcIn);
  if (d.svcOut !== undefined) svc.output_cost_per_token = num(d.svcOut);
  const info: Json = {};
  if (d.explicitId) info.id = d.id;
  if (d.infoIn !== undefined) info.input_cost_per_token = num(d.infoIn);
  if (d.infoOut !== undefined) info.output_cost_per_token = num(d.infoOut);
  return { model_name: d.name, svc_params: svc, ...(Object.keys(info).length > 0 ? { model_info: info } : {}) };
}

function configOf(deps: Dep[], mocks: MockOpenAI[], rng: Random): Json {
  return {
    model_list: deps.map((d) => entryOf(d, mocks)),
    router_settings: { routing_strategy: rng.pick(["simple-shuffle", "least-busy"]), num_retries: 0 },
    general_settings: { master_key: MASTER_KEY },
  };
}

/** A file the gateway must refuse: bad YAML, or a config with a schema or registry error. */
function invalidConfig(rng: Random, mocks: MockOpenAI[]): { text: string; kind: string } {
  const base = configOf(randomConfig(rng), mocks, rng);
  if (rng.chance(0.5)) base.environment_variables = { [LEAK_ENV]: "from-a-refused-file" };
  const list = base.model_list as Json[];
  const first = (list[0] ?? { model_name: "x", svc_params: { model: "openai/x" } }) as { svc_params: Json; model_info?: Json };
  switch (rng.int(6)) {
    case 0:
      return { kind: "bad YAML", text: "model_list:\n  - model_name: [unclosed\n" };
    case 1:
      first.svc_params.api_base = "ftp://nope";
      return { kind: "api_base not http", text: configText({ ...base, model_list: [first, ...list.slice(1)] }) };
    case 2:
      return { kind: "unknown provider", text: configText({ ...base, model_list: [...list, { model_name: "ghost", svc_params: { model: "nosuch/x" } }] }) };
    case 3:
      return { kind: "duplicate id", text: configText({ ...base, model_list: [...list, { model_name: "dup", svc_params: { model: "openai/dup" }, model_info: { id: "same" } }, { model_name: "dup2", svc_params: { model: "openai/dup2" }, model_info: { id: "same" } }] }) };
    case 4:
      first.svc_params.rpm = 0;
      return { kind: "rpm 0", text: configText({ ...base, model_list: [first, ...list.slice(1)] }) };
    default:
      return { kind: "model_list not a list", text: "model_list: 5\ngeneral_settings:\n  master_key: sk-x\n" };
  }
}

// ---- talking to the instances

interface Instance {
  name: "A" | "B";
  url: string;
  rejections(): number;
}

async function getJson(gw: Instance, path: string): Promise<Json> {
  const res = await fetch(gw.url + path, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
  const text = await res.text();
  if (res.status !== 200) fail(`${gw.name} GET ${path} → ${res.status}: ${text}`);
  return JSON.parse(text) as Json;
}

interface Seen {
  models: string[];
  info: { name: string; svcModel: string; id: string; db: boolean }[];
}

async function seen(gw: Instance): Promise<Seen> {
  const models = ((await getJson(gw, "/v1/models")).data as { id: string }[]).map((m) => m.id).sort();
  const info = ((await getJson(gw, "/model/info")).data as { model_name: string; svc_params: Json; model_info: Json }[])
    .map((e) => ({ name: e.model_name, svcModel: String(e.svc_params.model), id: String(e.model_info.id), db: e.model_info.db_model === true }))
    .sort((a, b) => a.svcModel.localeCompare(b.svcModel));
  return { models, info };
}

/** Whether `got` is exactly the state (hashed ids may be anything, and are learned). */
function matches(s: State, got: Seen): string | undefined {
  const want = listed(s);
  if (JSON.stringify(got.models) !== JSON.stringify(want)) return `/v1/models ${JSON.stringify(got.models)} ≠ ${JSON.stringify(want)}`;
  const deps = all(s).sort((a, b) => a.svcModel.localeCompare(b.svcModel));
  if (got.info.length !== deps.length) return `/model/info has ${got.info.length} deployments, want ${deps.length}: ${JSON.stringify(got.info)}`;
  for (const [i, d] of deps.entries()) {
    const g = got.info[i]!;
    if (g.svcModel !== d.svcModel || g.name !== d.name || g.db !== d.db || (d.explicitId && g.id !== d.id)) {
      return `/model/info entry ${JSON.stringify(g)} ≠ ${JSON.stringify({ name: d.name, svcModel: d.svcModel, id: d.id, db: d.db })}`;
    }
  }
  return undefined;
}

interface CallResult {
  gw: string;
  model: string;
  stream: boolean;
  marker: string;
  status: number;
  modelId: string | null;
  cost: string | null;
  text: string;
  ended: number;
}

let markers = 0;

async function chat(gw: Instance, model: string, stream: boolean, marker = `m${++markers}x`): Promise<CallResult> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model, stream, messages: [{ role: "user", content: `${marker} tell me something` }] }),
  });
  const text = await res.text();
  return { gw: gw.name, model, stream, marker, status: res.status, modelId: res.headers.get("x-svc-model-id"), cost: res.headers.get("x-svc-response-cost"), text, ended: Date.now() };
}

/**
 * Checks one answer against the states that may have served it (one when nothing changed while it
 * ran; before and after when it raced a step); returns a problem, or undefined.
 */
function check(r: CallResult, states: State[], mocks: MockOpenAI[]): string | undefined {
  const what = `${r.gw} ${r.stream ? "stream" : "JSON"} call to '${r.model}' (${r.marker}) → ${r.status} ${r.text.slice(0, 300)}`;
  if (r.status >= 500) return `5xx: ${what}`;
  const routes = states.map((s) => resolve(s, r.model));
  if (r.status === 400) {
    if (routes.every((x) => x.length > 0)) return `400 for a model every possible state serves: ${what}`;
    let env: { error?: Json };
    try {
      env = JSON.parse(r.text) as { error?: Json };
    } catch {
      return `400 not JSON: ${what}`;
    }
    const e = env.error;
    if (!e || typeof e.message !== "string" || typeof e.type !== "string" || e.code !== "400" || !("param" in e)) return `400 outside the error envelope: ${what}`;
    return undefined;
  }
  if (r.status !== 200) return `unexpected status: ${what}`;
  const candidates = routes.flat().filter((c) => (c.dep.id ?? "?") === r.modelId);
  if (candidates.length === 0) return `x-svc-model-id ${r.modelId} is no deployment of '${r.model}' (${JSON.stringify(routes.map((x) => x.map((c) => c.dep.id)))}): ${what}`;
  const hit = (u: number) => mocks[u]!.requests.find((q) => JSON.stringify(q.body).includes(r.marker));
  const served = candidates.filter((c) => (hit(c.dep.upstream)?.body as Json | undefined)?.model === c.upstreamModel);
  const leaked = served.find((c) => c.dep.envHeader && hit(c.dep.upstream)?.headers["x-rd-env"] !== undefined);
  if (leaked) return `the upstream got x-rd-env ${hit(leaked.dep.upstream)?.headers["x-rd-env"]}: a refused file's environment_variables were applied: ${what}`;
  if (served.length === 0) {
    const where = mocks.map((_m, i) => (hit(i) ? `mock ${i} as ${JSON.stringify((hit(i)!.body as Json).model)}` : "")).filter(Boolean);
    return `deployment ${r.modelId} did not send the call to its upstream with its model (${JSON.stringify(candidates.map((c) => [c.dep.upstream, c.upstreamModel]))}; seen at ${where.join(", ") || "no mock"}): ${what}`;
  }
  if (r.stream) {
    if (!r.text.endsWith("data: [DONE]\n\n") || r.text.includes('data: {"error"')) return `stream did not end with [DONE]: ${what} … ${r.text.slice(-200)}`;
    return undefined;
  }
  const usage = (JSON.parse(r.text) as { usage?: { prompt_tokens: number; completion_tokens: number } }).usage;
  if (!usage) return `no usage: ${what}`;
  const costs = served.map((c) => expectedCost(c.dep, usage.prompt_tokens, usage.completion_tokens));
  if (!costs.includes(r.cost ?? "")) return `x-svc-response-cost ${r.cost}, expected ${costs.join(" or ")} (usage ${JSON.stringify(usage)}): ${what}`;
  return undefined;
}

// ---- the run

const copyState = (s: State): State => ({ config: s.config.map((d) => ({ ...d })), db: new Map([...s.db].map(([k, d]) => [k, { ...d }])) });

describe(`reload differential (RELOAD_DIFF_SEED=${SEED})`, () => {
  const rng = new Random(SEED);
  let mocks: MockOpenAI[] = [];
  let a: TestGateway;
  let b: SpawnedGateway;
  let drop: () => Promise<void>;
  let A: Instance;
  let B: Instance;
  const stats = { calls: 0, during: 0, long: 0, longAcross: 0, steps: {} as Record<string, number> };

  beforeAll(async () => {
    mocks = await Promise.all(Array.from({ length: UPSTREAMS }, () => startMockOpenAI()));
    const db = await freshDatabase("gw_reload_diff");
    drop = db.drop;
    a = await startTestGateway({ model_list: [], general_settings: { master_key: MASTER_KEY } }, { watch: true, store: { databaseUrl: db.url } });
    b = await spawnGateway({ model_list: [], general_settings: { master_key: MASTER_KEY } }, { dir: a.dir, env: { DATABASE_URL: db.url, REDIS_URL: undefined, SVC_DRAIN_TIMEOUT: "2" } });
    await a.host!.services.bus!.subscribed();
    const rejectedLines = (lines: { msg?: unknown }[]) => lines.filter((l) => typeof l.msg === "string" && l.msg.startsWith("config reload rejected")).length;
    A = { name: "A", url: a.url, rejections: () => rejectedLines(a.log.lines) };
    B = {
      name: "B",
      url: b.url,
      rejections: () =>
        rejectedLines(
          b
            .output()
            .split("\n")
            .flatMap((l) => {
              try {
                return [JSON.parse(l) as Json];
              } catch {
                return [];
              }
            }),
        ),
    };
  }, 60_000);

  afterAll(async () => {
    await b?.stop();
    await a?.stop();
    await Promise.all(mocks.map((m) => m.stop()));
    await drop?.();
    console.log(`reload differential seed ${SEED}: ${JSON.stringify(stats)}`);
  });

  test("every step serves exactly the model's state; nothing answers 5xx", async () => {
    const instances = () => [A, B];
    const state: State = { config: [], db: new Map() };
    let fileValid = true;

    /** Polls both instances until they show `s`; learns hashed ids; B must agree with A. */
    async function observe(s: State, what: string, ms = 10_000): Promise<void> {
      for (const gw of instances()) {
        const deadline = Date.now() + ms;
        for (;;) {
          const got = await seen(gw);
          const problem = matches(s, got);
          if (!problem) {
            for (const d of all(s)) if (!d.explicitId) d.id = got.info.find((g) => g.svcModel === d.svcModel)!.id;
            break;
          }
          if (Date.now() > deadline) fail(`${gw.name} did not show the state after ${what} within ${ms} ms: ${problem}`);
          await Bun.sleep(40);
        }
      }
    }

    const callNames = (s: State) => [...NAMES, ...DB_NAMES, ...WILD_CALLS, ...NEVER, ...listed(s)];
    const randomCall = (s: State) => chat(rng.pick(instances()), rng.pick(callNames(s)), rng.chance(0.4));

    const knownIds = new Set<string>();

    async function burst(s: State, n: number): Promise<void> {
      const results = await Promise.all(Array.from({ length: n }, () => randomCall(s)));
      stats.calls += n;
      for (const r of results) {
        const problem = check(r, [s], mocks);
        if (problem) fail(problem);
      }
      // One model by name, one deployment by id: present now, or not (404).
      const gw = rng.pick(instances());
      const name = rng.pick(callNames(s));
      const one = await fetch(`${gw.url}/v1/models/${encodeURIComponent(name)}`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
      const want = resolve(s, name).length > 0 ? 200 : 404;
      if (one.status !== want) fail(`${gw.name} GET /v1/models/${name} → ${one.status} ${await one.text()}, want ${want}`);
      await one.arrayBuffer().catch(() => undefined);
      for (const d of all(s)) if (d.id) knownIds.add(d.id);
      const id = rng.pick([...knownIds]);
      const info = await fetch(`${gw.url}/model/info?svc_model_id=${encodeURIComponent(id)}`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
      const present = all(s).find((d) => d.id === id);
      const text = await info.text();
      if (info.status !== (present ? 200 : 404)) fail(`${gw.name} GET /model/info?svc_model_id=${id} → ${info.status} ${text}, want ${present ? 200 : 404}`);
      if (present) {
        const e = (JSON.parse(text) as { data: { model_name: string; svc_params: Json }[] }).data[0];
        if (e?.model_name !== present.name || e.svc_params.model !== present.svcModel) fail(`${gw.name} /model/info?svc_model_id=${id} → ${text}, want ${present.name} / ${present.svcModel}`);
      }
    }

    async function writeFile(text: string): Promise<void> {
      if (rng.chance(0.3)) {
        const tmp = join(a.dir, `.config.yaml.tmp-${++serial}`);
        writeFileSync(tmp, text);
        renameSync(tmp, a.configPath);
      } else writeFileSync(a.configPath, text);
    }

    async function sighup(): Promise<void> {
      b.proc.kill("SIGHUP");
      await a.live.reload("SIGHUP", true);
    }

    // A first stored model, so B's change subscription is known to work before the steps race it.
    const first = pricedDep(rng, { name: "db-a", id: `db-${++serial}`, explicitId: true, upstream: 0, svcModel: `openai/rddb${serial}`, db: true });
    await storeModel(A, "/model/new", "POST", first);
    state.db.set(first.id!, first);
    const initial = randomConfig(rng);
    writeFileSync(a.configPath, configText(configOf(initial, mocks, rng)));
    await sighup();
    state.config = initial;
    await observe(state, "the first config", 20_000);
    await burst(state, 12);

    async function storeModel(gw: Instance, path: string, method: string, d: Dep | undefined, body?: Json): Promise<void> {
      const payload = body ?? { ...entryOf(d!, mocks), model_info: { ...((entryOf(d!, mocks).model_info as Json | undefined) ?? {}), id: d!.id } };
      const res = await fetch(gw.url + path, { method, headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify(payload) });
      const text = await res.text();
      if (res.status !== 200) fail(`${gw.name} ${method} ${path} ${JSON.stringify(payload)} → ${res.status}: ${text}`);
    }

    for (let step = 0; step < STEPS; step++) {
      const before = copyState(state);
      // Long streams, started on the state before the step.
      const longs: { headers: Promise<number>; done: Promise<{ r: CallResult; headersAt: number }> }[] = [];
      if (rng.chance(0.5)) {
        const names = [...listed(before), ...WILD_CALLS.filter((n) => resolve(before, n).length > 0)];
        for (let i = 1 + rng.int(2); i > 0 && names.length > 0; i--) {
          const marker = `long${++markers}x`;
          for (const m of mocks) m.fault({ kind: "slowStream", chunkDelayMs: LONG_DELAY_MS, chunks: LONG_CHUNKS, match: marker });
          const gw = rng.pick(instances());
          const model = rng.pick(names);
          // A long JSON call waits as long at the upstream, then answers at once.
          const stream = rng.chance(0.7);
          const res = fetch(`${gw.url}/v1/chat/completions`, {
            method: "POST",
            headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
            body: JSON.stringify({ model, stream, messages: [{ role: "user", content: `${marker} a long answer please` }] }),
          });
          const arrived = until(() => mocks.some((m) => m.requests.some((q) => JSON.stringify(q.body).includes(marker))), 10_000).then(() => Date.now());
          const done = res.then(async (r) => {
            const text = await r.text();
            const result: CallResult = { gw: gw.name, model, stream, marker, status: r.status, modelId: r.headers.get("x-svc-model-id"), cost: r.headers.get("x-svc-response-cost"), text, ended: Date.now() };
            return { r: result, headersAt: await arrived };
          });
          longs.push({ headers: arrived, done });
        }
        // Every long call has reached its upstream (it is on its deployment) before the step starts.
        await Promise.all(longs.map((l) => l.headers));
      }

      // The step, with calls racing it.
      const kind = rng.pick(["config", "config", "config", "config-twice", "config+db", "invalid", "invalid+db", "sighup", "db", "db", "db"]);
      const racing = Array.from({ length: 4 + rng.int(5) }, () => Bun.sleep(rng.int(120)).then(() => randomCall(before)));
      const rejectedBefore = instances().map((gw) => gw.rejections());
      let expectRejection = false;
      let label: string = kind;
      /** States a racing call may have met, besides the ones before and after the step. */
      const between: State[] = [];

      /** A random stored-model write, applied to `state` (the model) once the API answered 200. */
      function dbOp(): { what: string; run: Promise<void> } {
        const dbIds = [...state.db.keys()];
        const op = dbIds.length === 0 ? "new" : rng.pick(["new", "new", "update", "patch", "delete"]);
        const gw = rng.pick(instances());
        const what = `db-${op} via ${gw.name}`;
        if (op === "new") {
          // Sometimes a wildcard, merged into the config's route of the same pattern when there is one.
          const wild = rng.chance(0.15);
          const d = pricedDep(rng, {
            name: wild ? "rd-*" : rng.chance(0.3) ? rng.pick(NAMES) : rng.pick(DB_NAMES),
            id: `db-${++serial}`,
            explicitId: true,
            upstream: rng.int(UPSTREAMS),
            svcModel: `openai/rddb${serial}${wild ? "-*" : ""}`,
            db: true,
          });
          return { what, run: storeModel(gw, "/model/new", "POST", d).then(() => void state.db.set(d.id!, d)) };
        }
        const id = rng.pick(dbIds);
        if (op === "update") {
          const d = pricedDep(rng, { name: rng.chance(0.3) ? rng.pick(NAMES) : rng.pick(DB_NAMES), id, explicitId: true, upstream: rng.int(UPSTREAMS), svcModel: `openai/rddb${++serial}`, db: true });
          return { what, run: storeModel(gw, "/model/update", "POST", d).then(() => void state.db.set(id, d)) };
        }
        if (op === "patch") {
          const d: Dep = { ...state.db.get(id)!, svcIn: price(rng), svcOut: price(rng), upstream: rng.int(UPSTREAMS) };
          const body = { svc_params: { input_cost_per_token: num(d.svcIn), output_cost_per_token: num(d.svcOut), api_base: mocks[d.upstream]!.url } };
          return { what, run: storeModel(gw, `/model/${id}/update`, "PATCH", undefined, body).then(() => void state.db.set(id, d)) };
        }
        return { what, run: storeModel(gw, "/model/delete", "POST", undefined, { id }).then(() => void state.db.delete(id)) };
      }

      if (kind === "config" || kind === "config+db") {
        const next = randomConfig(rng);
        const db = kind === "config+db" ? dbOp() : undefined;
        await writeFile(configText(configOf(next, mocks, rng)));
        if (rng.chance(0.4)) {
          label += "+SIGHUP";
          await sighup();
        }
        if (db) {
          label += ` (${db.what})`;
          await db.run;
          between.push({ config: before.config, db: state.db }, { config: next, db: before.db });
        }
        state.config = next;
        fileValid = true;
      } else if (kind === "config-twice") {
        const mid = randomConfig(rng);
        const next = randomConfig(rng);
        await writeFile(configText(configOf(mid, mocks, rng)));
        await Bun.sleep(rng.int(80));
        await writeFile(configText(configOf(next, mocks, rng)));
        if (rng.chance(0.4)) {
          label += "+SIGHUP";
          await sighup();
        }
        between.push({ config: mid, db: state.db });
        state.config = next;
        fileValid = true;
      } else if (kind === "invalid" || kind === "invalid+db") {
        const bad = invalidConfig(rng, mocks);
        label = `invalid (${bad.kind})`;
        await writeFile(bad.text);
        if (rng.chance(0.4)) await sighup();
        if (kind === "invalid+db") {
          const db = dbOp();
          label += ` + ${db.what}`;
          await db.run;
        }
        fileValid = false;
        expectRejection = true;
      } else if (kind === "sighup") {
        await sighup();
        expectRejection = !fileValid;
      } else {
        const db = dbOp();
        label = db.what;
        await db.run;
      }
      stats.steps[label.replace(/ via [AB]/g, "")] = (stats.steps[label.replace(/ via [AB]/g, "")] ?? 0) + 1;
      const where = `step ${step} (${label})`;

      if (expectRejection) {
        for (const [i, gw] of instances().entries()) {
          const ok = await until(async () => gw.rejections() > rejectedBefore[i]!, 10_000);
          if (!ok) fail(`${gw.name} did not log the rejection of the file at ${where}`);
        }
      }
      await observe(state, where);
      const observedAt = Date.now();

      // Racing calls: the state before or after the step.
      for (const r of await Promise.all(racing)) {
        stats.during++;
        const problem = check(r, [before, ...between, state], mocks);
        if (problem) fail(`${where}, racing: ${problem}`);
      }
      await burst(state, 10 + rng.int(8));

      for (const { r, headersAt } of await Promise.all(longs.map((l) => l.done))) {
        stats.long++;
        if (r.status !== 200) fail(`${where}, long stream ${r.marker} to '${r.model}' answered ${r.status}: ${r.text.slice(0, 300)}`);
        if (r.ended > observedAt && headersAt < observedAt) stats.longAcross++;
        const problem = check(r, [before], mocks);
        if (problem) fail(`${where}, long stream: ${problem}`);
        const deltas = r.stream ? (r.text.match(/"content":"[^"]+"/g)?.length ?? 0) : (JSON.parse(r.text) as { usage: { completion_tokens: number } }).usage.completion_tokens;
        if (deltas !== LONG_CHUNKS) fail(`${where}, long stream ${r.marker} has ${deltas} content deltas (or completion tokens), want ${LONG_CHUNKS}: ${r.text.slice(0, 600)}`);
      }
      for (const m of mocks) m.clearFaults();
    }
    expect(stats.calls).toBeGreaterThan(0);
  }, 90_000);
});

async function until(check: () => boolean | Promise<boolean>, ms: number): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; await Bun.sleep(25)) if (await check()) return true;
  return check();
}
