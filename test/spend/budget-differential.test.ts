// Differential check of money and budgets over real model calls, seeded random (BUDGET_DIFF_SEED=<n>
// runs another world; every failure names the seed), on both stores, and with the budget counters
// in Redis. A random world of
// organizations, teams, users, memberships, budget objects and keys (some on a budget object),
// each with or without a budget (none, $0, a pico-dollar, a few calls' worth, $1,000; keys with a
// temp_budget_increase, keys and teams with a soft budget, which never refuses) calls priced
// model groups (rates with up to 12
// significant digits, so every cost has many decimals) through the built-in mock provider, stream
// (with `stream_options.include_usage`) or not, plus a group whose only deployment is unreachable
// (a failure, which must cost nothing). The test keeps its own model: each call's cost computed
// here from the answer's usage and the configured rates (exact, in yocto-dollars, rounded half up
// to pico-dollars once), and per key, team, organization, user and team membership the exact sum
// in BigInt pico-dollars. Checked:
// - `x-svc-response-cost` equals the model's cost of the call, to the digit;
// - calls one at a time: a call is refused (400 `budget_exceeded` in the error envelope) when the
//   model says a budget that applies is reached or cannot hold the call's worst case, and served
//   when the model says every budget can hold a generous bound of it; the refusal names a budget
//   that applies, its limit and its spend exactly (as the model has them), $0 held in flight, and
//   a worst case between the call's least and most possible cost;
// - budgets given, lowered and removed (on any counter, and on budget objects) right after calls,
//   whose spend may not be written yet: the calls one at a time that follow are checked as above,
//   so a budget must start from everything its counter spent;
// - a user's own budget counts the user's whole spend (their team keys' too, as the user's stored
//   spend does), while only their keys without a team are governed by it;
// - bursts of concurrent calls (each with max_tokens): no budget ends above its max_budget (the
//   README's bound), and every refusal names a budget that the burst could have filled;
// - after the spend writer flushes (polled): the stored counters (`spend::text` of keys, teams,
//   orgs, users, team members) equal the model exactly; `/key/info`, `/team/info`, `/user/info`
//   and `/organization/info` answer the nearest double of that (the API's money is a JSON float);
//   `/spend/logs/v2` has exactly one row per call of each key (refusals and failures at 0, a refusal
//   with an empty deployment id) with the model's spend; `/global/spend/report` by api_key and by
//   team equals the log's exact sums;
// - `/key/{key}/reset_spend` and `/global/spend/reset` (keys, teams and team members; not users
//   or organizations) set counters to 0 and keep the log; the model follows, and budgets count
//   again from 0.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { rows } from "../../core/store/sql.ts";
import { closedPort } from "../mock-upstream/openai.ts";
import { BACKENDS, MASTER_KEY, requestJson, requestOk, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { queryString, Random } from "../harness/random.ts";
import { scaledExact } from "../harness/spend.ts";
import { until } from "../harness/util.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

const SEED = Number(process.env.BUDGET_DIFF_SEED ?? 4_120_771);
const at = `(BUDGET_DIFF_SEED=${SEED})`;
const RUN = `${process.pid}-${Date.now().toString(36)}`;
const REDIS_URL = TEST_REDIS_URL;

// ---- exact money

const PICO_DIGITS = 12;
const YOCTO_DIGITS = 24;

const pico = (text: string) => scaledExact(text, PICO_DIGITS);
/** A JSON number the API wrote: money of at most 12 decimals and 15 significant digits, whose shortest text is that decimal. */
const picoOfNumber = (v: unknown) => pico(String(v));

/** Exact decimal text of pico-dollars ("0.000125", "12", "0"). */
function usd(p: bigint): string {
  const int = p / 10n ** 12n;
  const frac = (p % 10n ** 12n).toString().padStart(12, "0").replace(/0+$/, "");
  return frac ? `${int}.${frac}` : `${int}`;
}
/** The double nearest to an exact amount: what an API that answers money as a JSON float must say. */
const nearest = (p: bigint) => Number(usd(p));

/** An answer's JSON with the members named in `money` as their exact decimal text (as written, not the nearest double). */
function parseExact<T>(text: string, money: ReadonlySet<string>): T {
  return JSON.parse(text, (key: string, value: unknown, context?: { source?: string }) =>
    typeof value === "number" && money.has(key) ? usd(pico(context?.source ?? String(value))) : value,
  ) as T;
}

// ---- the models and their prices

interface Priced {
  name: string;
  /** USD per token, as written in the config (a JSON number whose shortest text is this). */
  input: string;
  output: string;
  fails?: boolean;
  reply?: string;
}

const MODELS: readonly Priced[] = [
  { name: "alpha", input: "1.23456789012e-7", output: "0.00000321098765432" },
  { name: "beta", input: "7.77777777777e-9", output: "0.0000123456789", reply: "word ".repeat(40) },
  { name: "gamma", input: "0.000003000000007", output: "0.001234567890123", reply: "Ünïcödé 😀 answer ".repeat(12) },
  { name: "broken", input: "0.000001", output: "0.00001", fails: true },
];
const yocto = (usdText: string) => scaledExact(usdText, YOCTO_DIGITS);
const YOCTO_PER_PICO = 10n ** 12n;
/** Yocto-dollars → pico-dollars, rounded half up (the README: a cost is rounded once, after the sum). */
const roundHalfUp = (y: bigint) => y / YOCTO_PER_PICO + ((y % YOCTO_PER_PICO) * 2n >= YOCTO_PER_PICO ? 1n : 0n);
const ceilPico = (y: bigint) => (y + YOCTO_PER_PICO - 1n) / YOCTO_PER_PICO;
const floorPico = (y: bigint) => y / YOCTO_PER_PICO;

function costOf(m: Priced, promptTokens: number, completionTokens: number): bigint {
  return roundHalfUp(BigInt(promptTokens) * yocto(m.input) + BigInt(completionTokens) * yocto(m.output));
}

async function config() {
  const port = await closedPort();
  return {
    model_list: MODELS.map((m) => ({
      model_name: m.name,
      svc_params: m.fails
        ? { model: `openai/${m.name}`, api_base: `http://127.0.0.1:${port}/v1`, api_key: "sk-unused" }
        : { model: `mock/${m.name}`, ...(m.reply ? { mock_response: m.reply } : {}) },
      model_info: { input_cost_per_token: Number(m.input), output_cost_per_token: Number(m.output) },
    })),
    router_settings: { num_retries: 0 },
    general_settings: { master_key: MASTER_KEY },
  };
}

// ---- the world

/** Budgets (USD, at most 12 decimals): none is most common; $0 refuses everything; the rest hold from none to many calls. */
const BUDGETS = ["0", "0.000000000001", "0.000047123456", "0.000123456789", "0.000987654321", "0.004321098765", "0.031415926535", "0.271828182845", "1000.000000000001"];

type Kind = "key" | "team" | "org" | "user" | "member";

/** A spend counter of the model: its stored spend (reset by the resets) and, when it has one, its budget. */
interface Counter {
  kind: Kind;
  id: string;
  /** How the gateway names it in a refusal. */
  label: string;
  limit: bigint | null;
  spend: bigint;
}

interface Key {
  key: string;
  token: string;
  alias: string;
  team?: string;
  user?: string;
  /** Its budget object, whose max_budget applies when the key has none of its own. */
  budgetId?: string;
  own: bigint | null;
  /** `temp_budget_increase` (expiring long after the test), added to whichever budget applies. */
  temp: bigint;
  counter: Counter;
  /** Every call's id and what its log row must say. */
  calls: Map<string, { spend: bigint; status: "success" | "failure"; refused: boolean }>;
}

interface World {
  counters: Map<string, Counter>;
  keys: Key[];
  teamOrg: Map<string, string | undefined>;
  members: Set<string>;
  /** Budget objects (`budget_id`) and their max_budget. */
  budgets: Map<string, bigint | null>;
}

/** A key's budget: its own max_budget, else its budget object's. */
function keyLimit(w: World, k: Key): bigint | null {
  const base = k.own ?? (k.budgetId ? (w.budgets.get(k.budgetId) ?? null) : null);
  return base === null ? null : base + k.temp;
}

const cid = (kind: Kind, id: string) => `${kind}:${id}`;

function budget(rng: Random, p: number): string | undefined {
  return rng.chance(p) ? rng.pick(BUDGETS) : undefined;
}

async function buildWorld(gw: TestGateway, rng: Random, tag: string): Promise<World> {
  const counters = new Map<string, Counter>();
  const add = (kind: Kind, id: string, label: string, limit: string | undefined) => {
    const c: Counter = { kind, id, label, limit: limit === undefined ? null : pico(limit), spend: 0n };
    counters.set(cid(kind, id), c);
    return c;
  };
  const money = (v: string) => {
    expect(usd(pico(String(Number(v)))), `${v} as a JSON number ${at}`).toBe(v);
    return Number(v);
  };
  const orgs: string[] = [];
  for (let i = 0; i < 2; i++) {
    const limit = budget(rng, 0.7);
    const o = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: `o${i}-${tag}`, ...(limit ? { max_budget: money(limit) } : {}) });
    orgs.push(o.organization_id);
    add("org", o.organization_id, `Organization=${o.organization_id}`, limit);
  }
  const teamOrg = new Map<string, string | undefined>();
  const teams: string[] = [];
  for (let i = 0; i < 4; i++) {
    const org = i < 3 ? orgs[i % 2] : undefined;
    const orgLimit = org ? counters.get(cid("org", org))!.limit : null;
    // A team inside an organization may not have a larger budget than the organization.
    let limit = budget(rng, 0.6);
    if (limit !== undefined && orgLimit !== null && pico(limit) > orgLimit) limit = usd(orgLimit);
    const soft = rng.maybe(0.2, BUDGETS);
    const t = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", {
      team_alias: `t${i}-${tag}`,
      ...(org ? { organization_id: org } : {}),
      ...(limit ? { max_budget: money(limit) } : {}),
      ...(soft ? { soft_budget: money(soft) } : {}),
    });
    teams.push(t.team_id);
    teamOrg.set(t.team_id, org);
    add("team", t.team_id, `Team=${t.team_id}`, limit);
  }
  const users: string[] = [];
  for (let i = 0; i < 4; i++) {
    const limit = budget(rng, 0.6);
    // Unique per run: the Redis ledger's counters outlive a run.
    const userId = `u${i}-${tag}-${SEED}-${RUN}`;
    await requestOk(gw, "POST", "/user/new", { user_id: userId, ...(limit ? { max_budget: money(limit) } : {}) });
    users.push(userId);
    add("user", userId, `User=${userId}`, limit);
  }
  const members = new Set<string>();
  for (const userId of users) {
    for (const teamId of rng.some(teams, 2)) {
      const limit = budget(rng, 0.4);
      await requestOk(gw, "POST", "/team/member_add", { team_id: teamId, member: { role: "user", user_id: userId }, ...(limit ? { max_budget_in_team: money(limit) } : {}) });
      members.add(`${teamId}\t${userId}`);
      add("member", `${teamId}\t${userId}`, `User=${userId} in Team=${teamId}`, limit);
    }
  }
  const budgets = new Map<string, bigint | null>();
  for (let i = 0; i < 2; i++) {
    const limit = budget(rng, 0.8);
    const b = await requestOk<{ budget_id: string }>(gw, "POST", "/budget/new", limit ? { max_budget: money(limit) } : { rpm_limit: 100_000 });
    budgets.set(b.budget_id, limit === undefined ? null : pico(limit));
  }
  const keys: Key[] = [];
  for (let i = 0; i < 12; i++) {
    const team = rng.chance(0.6) ? rng.pick(teams) : undefined;
    const inTeam = team ? users.filter((u) => members.has(`${team}\t${u}`)) : users;
    const user = rng.chance(0.6) && inTeam.length > 0 ? rng.pick(inTeam) : undefined;
    const budgetId = rng.chance(0.3) ? rng.pick([...budgets.keys()]) : undefined;
    const limit = budget(rng, budgetId ? 0.2 : 0.6);
    const temp = rng.maybe(0.2, ["0.000031415926", "0.001000000001"]);
    // A soft budget never refuses; it gives the key a ledger counter without a limit.
    const soft = rng.maybe(0.2, BUDGETS);
    const alias = `k${i}-${tag}`;
    const k = await requestOk<{ key: string; token: string }>(gw, "POST", "/key/generate", {
      key_alias: alias,
      ...(team ? { team_id: team } : {}),
      ...(user ? { user_id: user } : {}),
      ...(budgetId ? { budget_id: budgetId } : {}),
      ...(limit ? { max_budget: money(limit) } : {}),
      ...(temp ? { temp_budget_increase: money(temp), temp_budget_expiry: new Date(Date.now() + 3_600_000).toISOString() } : {}),
      ...(soft ? { soft_budget: money(soft) } : {}),
    });
    const counter = add("key", k.token, `(alias ${alias})`, undefined);
    const key: Key = { key: k.key, token: k.token, alias, team, user, budgetId, own: limit === undefined ? null : pico(limit), temp: temp ? pico(temp) : 0n, counter, calls: new Map() };
    keys.push(key);
    counter.limit = keyLimit({ budgets } as World, key);
  }
  return { counters, keys, teamOrg, members, budgets };
}

/** The counters a call by `k` charges (whether or not they have a budget), as the README lists them. */
function charged(w: World, k: Key): Counter[] {
  const out = [k.counter];
  if (k.team) out.push(w.counters.get(cid("team", k.team))!);
  if (k.team && k.user) out.push(w.counters.get(cid("member", `${k.team}\t${k.user}`))!);
  const org = k.team ? w.teamOrg.get(k.team) : undefined;
  if (org) out.push(w.counters.get(cid("org", org))!);
  if (k.user) out.push(w.counters.get(cid("user", k.user))!);
  return out;
}

/** The budgets that apply to a call by `k`: a team key is governed by its team, so the user's own budget applies to keys without a team. */
function budgetsOf(w: World, k: Key): Counter[] {
  return charged(w, k).filter((c) => c.limit !== null && !(c.kind === "user" && k.team));
}

// ---- calls

const WORDS = ["hello", "budget", "ü", "😀", "12345", "money", "exact", "pico", "客户", "spend", "q\"uote", "back\\slash"];

interface Ask {
  key: Key;
  model: Priced;
  stream: boolean;
  maxTokens: number;
  content: string;
}

function randomAsk(rng: Random, w: World): Ask {
  const r = rng.next();
  const model = r < 0.35 ? MODELS[0]! : r < 0.65 ? MODELS[1]! : r < 0.87 ? MODELS[2]! : MODELS[3]!;
  const content = Array.from({ length: 1 + rng.int(12) }, () => rng.pick(WORDS)).join(" ");
  return { key: rng.pick(w.keys), model, stream: rng.chance(0.4), maxTokens: 1 + rng.int(24), content };
}

const bytes = (s: string) => Buffer.byteLength(s, "utf8");

/**
 * Bounds of the worst case a budget reserves for the call: at least the prompt's text at one token
 * per byte and max_tokens at the output rate; at most twice the whole body's bytes (plus framing) at
 * the input rate and max_tokens at the output rate.
 */
function worstBounds(a: Ask): { low: bigint; high: bigint } {
  const body = JSON.stringify([{ role: "user", content: a.content }]);
  const out = BigInt(a.maxTokens) * yocto(a.model.output);
  return { low: floorPico(BigInt(bytes(a.content)) * yocto(a.model.input) + out), high: ceilPico(BigInt(2 * bytes(body) + 64) * yocto(a.model.input) + out) };
}

interface Outcome {
  ask: Ask;
  status: number;
  callId: string;
  /** Model cost of a served call (0 otherwise). */
  cost: bigint;
  error?: { message: string; type: string; param: unknown; code: unknown; budget?: Record<string, unknown> };
}

async function readStream(res: Response): Promise<{ usage?: { prompt_tokens: number; completion_tokens: number }; text: string }> {
  const text = await res.text();
  let usage: { prompt_tokens: number; completion_tokens: number } | undefined;
  let content = "";
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6)) as { usage?: typeof usage; choices?: { delta?: { content?: string } }[] };
    if (chunk.usage) usage = chunk.usage;
    content += chunk.choices?.[0]?.delta?.content ?? "";
  }
  return { usage, text: content };
}

async function call(gw: TestGateway, a: Ask): Promise<Outcome> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${a.key.key}`, "content-type": "application/json" },
    body: JSON.stringify({
      model: a.model.name,
      messages: [{ role: "user", content: a.content }],
      max_tokens: a.maxTokens,
      ...(a.stream ? { stream: true, stream_options: { include_usage: true } } : {}),
    }),
  });
  const callId = res.headers.get("x-svc-call-id") ?? "";
  const label = `${a.model.name}${a.stream ? " stream" : ""} by ${a.key.alias} ${at}`;
  expect(callId, `call id of ${label}`).not.toBe("");
  if (res.status !== 200) {
    const body = (await res.json()) as { error: Outcome["error"] };
    // A budget refusal also names its budget in figures (`budget`, checked against the model in namedBudget).
    const envelope = body.error?.type === "budget_exceeded" ? ["budget", "code", "message", "param", "type"] : ["code", "message", "param", "type"];
    expect(Object.keys(body.error!).sort(), `error envelope of ${label}`).toEqual(envelope);
    return { ask: a, status: res.status, callId, cost: 0n, error: body.error };
  }
  expect(a.model.fails, `${label} answered`).toBeUndefined();
  let usage: { prompt_tokens: number; completion_tokens: number } | undefined;
  if (a.stream) usage = (await readStream(res)).usage;
  else {
    usage = ((await res.json()) as { usage: typeof usage }).usage;
    expect(res.headers.get("x-svc-response-cost"), `x-svc-response-cost of ${label}`).toBe(usd(costOf(a.model, usage!.prompt_tokens, usage!.completion_tokens)));
  }
  expect(usage, `usage of ${label}`).toBeDefined();
  expect(usage!.completion_tokens, `completion tokens of ${label}`).toBeLessThanOrEqual(a.maxTokens);
  return { ask: a, status: 200, callId, cost: costOf(a.model, usage!.prompt_tokens, usage!.completion_tokens) };
}

/** A refusal's message, taken apart: which budget, and the amounts it states. */
interface Refusal {
  label: string;
  reached: boolean;
  spend: bigint;
  limit: bigint;
  held?: bigint;
  worst?: bigint;
  /** The amounts as the message writes them, as JSON numbers: what the error's `budget` must say. */
  usd: { max_budget: number; spend: number; reserved?: number; call_cost?: number };
  /** The budget object the message says the limit comes from (`(from Budget=b1)`). */
  fromBudget?: string;
}

function parseRefusal(message: string, label: string): Refusal {
  const reached = /^Budget has been exceeded! (.+): spend \$([\d.]+), max budget \$([\d.]+)(?: \(from Budget=([^)]+)\))?\.$/.exec(message);
  if (reached) {
    const usd = { max_budget: Number(reached[3]), spend: Number(reached[2]) };
    return { label: reached[1]!, reached: true, spend: pico(reached[2]!), limit: pico(reached[3]!), usd, fromBudget: reached[4] };
  }
  const would =
    /^Budget would be exceeded: (.+) has \$([\d.]+) left of its max budget \$([\d.]+)(?: \(from Budget=([^)]+)\))? \(spend \$([\d.]+), \$([\d.]+) held by calls in flight\), and this call may cost up to \$([\d.]+) at max_tokens=\d+\.$/.exec(
      message,
    );
  if (!would) throw new Error(`${label}: not a budget refusal's message: ${message}`);
  return {
    label: would[1]!,
    reached: false,
    limit: pico(would[3]!),
    spend: pico(would[5]!),
    held: pico(would[6]!),
    worst: pico(would[7]!),
    usd: { max_budget: Number(would[3]), spend: Number(would[5]), reserved: Number(would[6]), call_cost: Number(would[7]) },
    fromBudget: would[4],
  };
}

const ENTITY: Record<Kind, string> = { key: "key", team: "team", org: "organization", user: "user", member: "team_member" };

/** The budget a refusal names, among those that apply to the call; the error's `budget` names the same, with the message's figures. */
function namedBudget(w: World, o: Outcome, r: Refusal, label: string): Counter {
  const found = budgetsOf(w, o.ask.key).filter((c) => (c.kind === "key" ? r.label.endsWith(c.label) : r.label === c.label));
  expect(found.length, `${label}: "${r.label}" is not a budget that applies to the call`).toBe(1);
  const c = found[0]!;
  // A key's limit taken from its budget object names that budget, in the message and in figures.
  const k = o.ask.key;
  const fromBudget = c === k.counter && k.own === null ? k.budgetId : undefined;
  expect(r.fromBudget, `${label}: the budget object named`).toBe(fromBudget);
  const { spend, max_budget, reserved, call_cost } = r.usd;
  expect(o.error?.budget, `${label}: the error's budget`).toEqual({
    entity: ENTITY[c.kind],
    id: c.id,
    ...(fromBudget === undefined ? {} : { budget_id: fromBudget }),
    max_budget,
    spend,
    reserved: reserved ?? expect.any(Number),
    ...(call_cost === undefined ? {} : { call_cost }),
    budget_reset_at: null,
  });
  return c;
}

function expectBudgetError(o: Outcome, label: string): void {
  expect(o.status, label).toBe(400);
  expect(o.error, label).toMatchObject({ type: "budget_exceeded", code: "400", param: null });
}

/** Books a finished call into the model: its log row, and its cost on every counter it charges. */
function book(w: World, o: Outcome): void {
  const refused = o.status === 400 && o.error?.type === "budget_exceeded";
  o.ask.key.calls.set(o.callId, { spend: o.cost, status: o.status === 200 ? "success" : "failure", refused });
  for (const c of charged(w, o.ask.key)) c.spend += o.cost;
}

/** One call at a time: the model says whether it must be refused, must be served, or may be either, and the answer must agree. */
async function sequential(gw: TestGateway, w: World, rng: Random, n: number, phase: string): Promise<{ served: number; refused: number }> {
  let served = 0;
  let refused = 0;
  for (let i = 0; i < n; i++) {
    const a = randomAsk(rng, w);
    const label = `${phase} call ${i}: ${a.model.name}${a.stream ? " stream" : ""} by ${a.key.alias} ${at}`;
    const { low, high } = worstBounds(a);
    const budgets = budgetsOf(w, a.key);
    const mustRefuse = budgets.filter((c) => c.spend >= c.limit! || c.spend + low > c.limit!);
    const mayRefuse = budgets.filter((c) => c.spend >= c.limit! || c.spend + high > c.limit!);
    const o = await call(gw, a);
    if (o.status === 400 && o.error?.type === "budget_exceeded") {
      refused++;
      expect(mayRefuse.length, `${label}: refused though every budget holds it: ${o.error.message}`).toBeGreaterThan(0);
      const r = parseRefusal(o.error.message, label);
      const c = namedBudget(w, o, r, label);
      expect(mayRefuse, `${label}: ${o.error.message}`).toContain(c);
      expect(usd(r.limit), `${label}: limit of ${c.label}`).toBe(usd(c.limit!));
      expect(usd(r.spend), `${label}: spend of ${c.label}`).toBe(usd(c.spend));
      expect(r.reached, `${label}: ${o.error.message}`).toBe(c.spend >= c.limit!);
      if (!r.reached) {
        expect(usd(r.held!), `${label}: held in flight`).toBe("0");
        expect(r.worst! >= low && r.worst! <= high, `${label}: worst case $${usd(r.worst!)} outside [$${usd(low)}, $${usd(high)}]`).toBe(true);
        expect(r.spend + r.worst! > r.limit, `${label}: ${o.error.message}`).toBe(true);
      }
    } else {
      expect(mustRefuse.map((c) => c.label), `${label}: not refused (status ${o.status} ${o.error?.message ?? ""})`).toEqual([]);
      if (a.model.fails) expect(o.status, `${label}: ${o.error?.message}`).toBeGreaterThanOrEqual(500);
      else {
        expect(o.status, `${label}: ${o.error?.message}`).toBe(200);
        served++;
      }
    }
    book(w, o);
  }
  return { served, refused };
}

/**
 * Calls fired together. Each holds its worst case while it runs, so no budget may end above its
 * limit, and a refusal must name a budget that the burst's calls could have filled from where it
 * stood before the burst.
 */
async function burst(gw: TestGateway, w: World, rng: Random, n: number, phase: string): Promise<void> {
  const asks = Array.from({ length: n }, () => randomAsk(rng, w));
  const before = new Map([...w.counters].map(([id, c]) => [id, c.spend]));
  const outcomes = await Promise.all(asks.map((a) => call(gw, a)));
  for (const o of outcomes) book(w, o);
  for (const [i, o] of outcomes.entries()) {
    const label = `${phase} call ${i}: ${o.ask.model.name} by ${o.ask.key.alias} ${at}`;
    if (o.status === 200) continue;
    if (o.error?.type !== "budget_exceeded") {
      expect(o.ask.model.fails, `${label}: ${o.status} ${o.error?.message}`).toBe(true);
      expect(o.status, label).toBeGreaterThanOrEqual(500);
      continue;
    }
    expectBudgetError(o, label);
    const r = parseRefusal(o.error.message, label);
    const c = namedBudget(w, o, r, label);
    const start = before.get(cid(c.kind, c.id))!;
    const couldFill = asks.filter((a) => charged(w, a.key).includes(c)).reduce((s, a) => s + worstBounds(a).high, 0n);
    expect(start >= c.limit! || start + couldFill > c.limit!, `${label}: ${c.label} could not have been filled by this burst: ${o.error.message}`).toBe(true);
    expect(usd(r.limit), `${label}: limit`).toBe(usd(c.limit!));
    expect(r.spend >= start && r.spend <= c.spend, `${label}: spend $${usd(r.spend)} outside [$${usd(start)}, $${usd(c.spend)}]`).toBe(true);
  }
  for (const c of w.counters.values()) {
    if (c.limit === null || c.kind === "user") continue;
    expect(c.spend <= c.limit || before.get(cid(c.kind, c.id))! >= c.limit, `${phase}: ${c.label} spent $${usd(c.spend)} of $${usd(c.limit)} ${at}`).toBe(true);
  }
}

/**
 * New budgets for some counters, right after calls (their spend may not be written yet): none
 * becomes one just above or below what was spent, one is removed, one is lowered. The gateway must
 * count from the spend it has, written or not. An update the gateway refuses (a team's budget
 * above its organization's) leaves the model as it was.
 */
async function rebudget(gw: TestGateway, w: World, rng: Random): Promise<number> {
  let changed = 0;
  // A budget object: every key on it without a budget of its own follows.
  for (const [budgetId, old] of w.budgets) {
    if (!rng.chance(0.5)) continue;
    // Around what its keys spent (bigints: no Math.max).
    let spent = 0n;
    for (const k of w.keys) if (k.budgetId === budgetId && k.counter.spend > spent) spent = k.counter.spend;
    const limit = rng.chance(0.2) ? null : spent + BigInt(rng.int(rng.chance(0.5) ? 100_000_000 : 20_000_000_000));
    const res = await requestJson(gw, "POST", "/budget/update", { body: { budget_id: budgetId, max_budget: limit === null ? null : Number(usd(limit)) } });
    expect(res.status, `/budget/update ${budgetId} (was ${old}): ${res.text} ${at}`).toBe(200);
    w.budgets.set(budgetId, limit);
    for (const k of w.keys) k.counter.limit = keyLimit(w, k);
    changed++;
  }
  for (const c of rng.some([...w.counters.values()], 8)) {
    const r = rng.next();
    let limit: bigint | null;
    if (r < 0.15) limit = null;
    else if (r < 0.3) limit = c.spend > 0n ? BigInt(rng.int(Number(c.spend))) : 0n;
    else limit = c.spend + BigInt(rng.int(r < 0.6 ? 100_000_000 : 20_000_000_000));
    const value = limit === null ? null : Number(usd(limit));
    if (value !== null) expect(usd(pico(String(value))), at).toBe(usd(limit!));
    const [method, path, body] =
      c.kind === "key"
        ? ["POST", "/key/update", { key: c.id, max_budget: value }]
        : c.kind === "team"
          ? ["POST", "/team/update", { team_id: c.id, max_budget: value }]
          : c.kind === "user"
            ? ["POST", "/user/update", { user_id: c.id, max_budget: value }]
            : c.kind === "org"
              ? ["PATCH", "/organization/update", { organization_id: c.id, max_budget: value }]
              : ["POST", "/team/member_update", { team_id: c.id.split("\t")[0], user_id: c.id.split("\t")[1], max_budget_in_team: value }];
    const res = await requestJson(gw, method, path, { body });
    if (res.status === 400 && /exceeds|organization/i.test(res.text)) continue;
    expect(res.status, `${method} ${path} ${JSON.stringify(body)}: ${res.text} ${at}`).toBe(200);
    c.limit = limit;
    const k = c.kind === "key" ? w.keys.find((x) => x.counter === c)! : undefined;
    if (k) {
      k.own = limit;
      k.counter.limit = keyLimit(w, k);
    }
    changed++;
  }
  return changed;
}

// ---- what the gateway says after the flush

type Db = NonNullable<TestGateway["host"]>["store"]["db"];

const COUNTER_SQL: Record<Kind, (id: string) => ReturnType<typeof sql>> = {
  key: (id) => sql`select spend::text as spend from virtual_keys where token = ${id}`,
  team: (id) => sql`select spend::text as spend from teams where team_id = ${id}`,
  org: (id) => sql`select spend::text as spend from organizations where organization_id = ${id}`,
  user: (id) => sql`select spend::text as spend from users where user_id = ${id}`,
  member: (id) => sql`select spend::text as spend from team_members where team_id = ${id.split("\t")[0]} and user_id = ${id.split("\t")[1]}`,
};

async function storedSpend(db: Db, c: Counter): Promise<string> {
  const [row] = await rows<{ spend: string }>(db, COUNTER_SQL[c.kind](c.id));
  return usd(pico(row!.spend));
}

/** Every stored counter equals the model (exact text), and the log has a row per call; polled until the spend writer has flushed. */
async function flushed(gw: TestGateway, w: World, phase: string): Promise<void> {
  const db = gw.host!.store.db;
  const differences = async () => {
    const out: string[] = [];
    for (const c of w.counters.values()) {
      const stored = await storedSpend(db, c);
      if (stored !== usd(c.spend)) out.push(`${c.kind} ${c.label}: stored ${stored}, model ${usd(c.spend)}`);
    }
    // Calls that cost nothing (refusals, failures) move no counter: the log must have them all too.
    const [logged] = await rows<{ n: number }>(db, sql`select count(*)::int as n from spend_logs`);
    const calls = w.keys.reduce((n, k) => n + k.calls.size, 0);
    if (logged!.n !== calls) out.push(`spend_logs: ${logged!.n} rows, model ${calls} calls`);
    return out;
  };
  await until(async () => (await differences()).length === 0, 8000);
  expect(await differences(), `${phase}: stored counters ${at}`).toEqual([]);
}

async function checkApi(gw: TestGateway, w: World, phase: string): Promise<void> {
  const label = (what: string) => `${phase}: ${what} ${at}`;
  // The management API answers money as a JSON float: the double nearest to the exact amount.
  for (const c of w.counters.values()) {
    if (c.kind === "key") {
      const info = await requestOk<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${c.id}`);
      expect(info.info.spend, label(`/key/info spend of ${c.label}`)).toBe(nearest(c.spend));
    } else if (c.kind === "team") {
      const info = await requestOk<{ team_info: { spend: number }; team_memberships: { user_id: string; spend: number }[] }>(gw, "GET", `/team/info?team_id=${c.id}`);
      expect(info.team_info.spend, label(`/team/info spend of ${c.label}`)).toBe(nearest(c.spend));
      for (const m of info.team_memberships) {
        const member = w.counters.get(cid("member", `${c.id}\t${m.user_id}`))!;
        expect(m.spend, label(`/team/info membership spend of ${member.label}`)).toBe(nearest(member.spend));
      }
    } else if (c.kind === "org") {
      const info = await requestOk<{ spend: number }>(gw, "GET", `/organization/info?organization_id=${c.id}`);
      expect(info.spend, label(`/organization/info spend of ${c.label}`)).toBe(nearest(c.spend));
    } else if (c.kind === "user") {
      const info = await requestOk<{ user_info: { spend: number } }>(gw, "GET", `/user/info?user_id=${encodeURIComponent(c.id)}`);
      expect(info.user_info.spend, label(`/user/info spend of ${c.label}`)).toBe(nearest(c.spend));
    }
  }
  // The log: one row per call of each key, with the model's spend and status.
  const day = (ms: number) => new Date(ms).toISOString().slice(0, 10);
  const dates = { start_date: day(Date.now() - 86_400_000), end_date: day(Date.now() + 86_400_000) };
  for (const k of w.keys) {
    type Row = { call_id: string; spend: number; status: string; model_id: string };
    const logs: Row[] = [];
    for (let page = 1; ; page++) {
      const p = await requestOk<{ data: Row[]; total_pages: number }>(gw, "GET", `/spend/logs/v2?${queryString({ ...dates, api_key: k.token, page, page_size: 100 })}`);
      logs.push(...p.data);
      if (page >= p.total_pages) break;
    }
    const got = Object.fromEntries(logs.map((r) => [r.call_id, { spend: usd(picoOfNumber(r.spend)), status: r.status, refused: r.model_id === "" }]));
    const want = Object.fromEntries([...k.calls].map(([id, c]) => [id, { spend: usd(c.spend), status: c.status, refused: c.refused }]));
    expect(got, label(`/spend/logs of ${k.alias}`)).toEqual(want);
  }
  // The spend report (exact decimals), by key and by team, summed over the days the calls span.
  const range = queryString(dates);
  const MONEY = new Set(["total_cost", "spend", "cost"]);
  const byKey = parseExact<{ api_keys: { api_key: string; total_cost: string; total_requests: number }[] }[]>(
    (await requestJson(gw, "GET", `/global/spend/report?${range}&group_by=api_key`)).text,
    MONEY,
  );
  const reported = new Map<string, { cost: bigint; requests: number }>();
  for (const d of byKey) {
    for (const e of d.api_keys) {
      const r = reported.get(e.api_key) ?? { cost: 0n, requests: 0 };
      reported.set(e.api_key, { cost: r.cost + pico(e.total_cost), requests: r.requests + e.total_requests });
    }
  }
  const logSum = (k: Key) => [...k.calls.values()].reduce((s, c) => s + c.spend, 0n);
  for (const k of w.keys) {
    const r = reported.get(k.token) ?? { cost: 0n, requests: 0 };
    expect({ cost: usd(r.cost), requests: r.requests }, label(`/global/spend/report api_key ${k.alias}`)).toEqual({ cost: usd(logSum(k)), requests: k.calls.size });
  }
  const byTeam = parseExact<{ teams: { team_id: string | null; spend: string }[] }[]>((await requestJson(gw, "GET", `/global/spend/report?${range}&group_by=team`)).text, MONEY);
  const teamSums = new Map<string | null, bigint>();
  for (const d of byTeam) for (const t of d.teams) teamSums.set(t.team_id, (teamSums.get(t.team_id) ?? 0n) + pico(t.spend));
  const wantTeams = new Map<string | null, bigint>();
  for (const k of w.keys) if (k.calls.size > 0) wantTeams.set(k.team ?? null, (wantTeams.get(k.team ?? null) ?? 0n) + logSum(k));
  const text = (m: Map<string | null, bigint>) => Object.fromEntries([...m].map(([t, v]) => [t ?? "(no team)", usd(v)]));
  expect(text(teamSums), label("/global/spend/report by team")).toEqual(text(wantTeams));
}

// ---- the run

/** Both stores with the in-process ledger, and PostgreSQL with the budget counters in Redis (one Lua script). */
const SETUPS = [...BACKENDS.map((backend) => ({ backend, redis: false })), { backend: "postgres" as const, redis: true }];

for (const [n, { backend, redis }] of SETUPS.entries()) {
  const name = redis ? `${backend}+redis` : backend;
  describe(`money and budgets against a model (${name}) ${at}`, () => {
    let gw: TestGateway;
    let w: World;
    const rng = new Random(SEED ^ Math.imul(n, 0x5bd1e995));
    beforeAll(async () => {
      gw = await startBackendGateway(backend, await config(), { dbPrefix: "gw_budget_diff", redisUrl: redis ? REDIS_URL : undefined });
      w = await buildWorld(gw, rng, name);
    });
    afterAll(async () => gw?.stop());

    test("calls one at a time: refused exactly when the model says a budget cannot hold them; every counter and report exact", async () => {
      const r = await sequential(gw, w, rng, 70, "sequential");
      expect(r.served, `some calls served ${at}`).toBeGreaterThan(0);
      await flushed(gw, w, "sequential");
      await checkApi(gw, w, "sequential");
    }, 30_000);

    test("a key's spend reset: its counter returns to 0, its log stays, and its budget counts from 0", async () => {
      const spent = w.keys.filter((k) => k.counter.spend > 0n);
      const k = spent.length > 0 ? rng.pick(spent) : rng.pick(w.keys);
      const reset = await requestOk<{ spend: number }>(gw, "POST", `/key/${k.token}/reset_spend`, {});
      expect(reset.spend, at).toBe(0);
      k.counter.spend = 0n;
      await flushed(gw, w, "after a key reset");
      await sequential(gw, w, rng, 15, "after a key reset");
      await flushed(gw, w, "after a key reset");
      await checkApi(gw, w, "after a key reset");
    }, 30_000);

    test("budgets given, lowered and removed while the last calls are still being written: counted from all the spend", async () => {
      for (let i = 0; i < 3; i++) {
        await sequential(gw, w, rng, 8, `before new budgets ${i}`);
        await rebudget(gw, w, rng);
        await sequential(gw, w, rng, 12, `after new budgets ${i}`);
      }
      await flushed(gw, w, "new budgets");
      await checkApi(gw, w, "new budgets");
    }, 30_000);

    test("bursts of concurrent calls: no budget ends above its limit, refusals name a budget the burst could fill", async () => {
      for (let i = 0; i < 3; i++) await burst(gw, w, rng, 25, `burst ${i}`);
      await flushed(gw, w, "bursts");
      await checkApi(gw, w, "bursts");
    }, 30_000);

    test("a global spend reset: every key's, team's and team member's counter 0 (users' and orgs' kept), the log and the reports unchanged, budgets count from 0", async () => {
      await requestOk(gw, "POST", "/global/spend/reset", {});
      for (const c of w.counters.values()) if (c.kind === "key" || c.kind === "team" || c.kind === "member") c.spend = 0n;
      await flushed(gw, w, "after the global reset");
      await sequential(gw, w, rng, 20, "after the global reset");
      await flushed(gw, w, "after the global reset");
      await checkApi(gw, w, "after the global reset");
    }, 30_000);
  });
}
