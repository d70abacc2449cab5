// The rate limiter against an independent model of it, seeded random (LIMITS_DIFF_SEED=<n> runs
// another set; every failure names the seed, the mode, the scenario and the step, with the
// scenario and its last steps). Each scenario is a random set of limits, all inside one 60 s window
// (nothing waits for a window to slide): 2 model groups of 1–3 deployments with random `rpm` / `tpm`
// in `svc_params`, sometimes a fallback from one group to the other; an organization, a budget
// object, teams (some in the org, some on the budget, some with `team_member_rpm_limit` /
// `team_member_tpm_limit`) and users with random `rpm_limit`, `tpm_limit`, `max_parallel_requests`
// and `model_rpm_limit` / `model_tpm_limit` (the budget's per-model ones as such or as its
// `model_max_budget` entries' `rpm_limit` / `tpm_limit`), team members with their own
// `rpm_limit` / `tpm_limit`, and 2–4 virtual keys with random limits (per-model ones too; now and
// then a limit of 0), some in a team, some of a user, some on the budget object. Then random steps:
// a call (JSON or streamed, a random prompt and `max_tokens`, so the token estimates vary); a call
// whose first attempt fails upstream (a 500: counted once with no tokens, then the fallback group);
// new limits for a key (/key/update, mid-window); new limits for the budget object or the
// organization's own budget (/budget/update, mid-window: the org's follow it); a hold (streams kept in flight by the mock's
// slowStream while other calls are made, for `max_parallel_requests`); or a burst (identical calls
// fired at once, held upstream by the mock's delay, when the outcome does not depend on their order).
//
// The model follows the README ("### Rate limits"): a sliding log per counter; a request counts on
// every counter that applies (key, user, team, member, org, and the group's per-model ones; a limit
// a row does not set comes from its budget object, and its refusal names that budget) or on
// none, its own once however many groups it tries; tokens are reserved from the estimate (the
// messages' characters, keys included, / 3, + 4 per message, + 3 for the reply, + max_tokens) and
// replaced by the real usage (the mock's, computed here from its rules and compared with what the
// answer says) when the call ends; a deployment at its `rpm` / `tpm` is skipped, and when every one
// is, 429 "No deployments available" (or the group's fallback). For every call it predicts: allowed,
// or a 429 with the envelope {"error": {"message", "type": "rate_limit_error", "param", "code":
// "429"}} naming one limit that refuses (label, kind, limit, what is used), with `retry-after` in
// whole seconds when that limit has room again (bounded by when the requests it waits for were sent
// and answered; 1 s for parallel limits, 60 s for a request above the whole tpm limit), and the
// refusal's `x-ratelimit-*`; on an allowed call the four `x-ratelimit-*` headers of the tightest
// limit of each kind (deployment included; the upstream's own where no gateway limit covers a kind)
// and the deployment that answered one with room. A refused call consumes nothing: the model does
// not count it, and every later prediction relies on that.
//
// Runs in memory, with Redis (REDIS_URL, else 127.0.0.1:6379; skipped when none answers), and with
// two instances sharing Redis and PostgreSQL. Last, the in-memory windows themselves against the
// same rules with a clock the test moves past the window (see the end of the file).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { RateCounter } from "../../core/contract.ts";
import { LocalWindows } from "../../core/limits/local-windows.ts";
import { freshDatabase, MASTER_KEY, requestJson, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { Random } from "../harness/random.ts";
import { redisReachable, sha256 } from "../harness/util.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

const SEED = Number(process.env.LIMITS_DIFF_SEED ?? 4_220_917);
const REDIS_URL = process.env.REDIS_URL ?? TEST_REDIS_URL;
const WINDOW_MS = 60_000;
/** Held streams: this many chunks, this far apart (long enough for the calls made while they are held). */
const HOLD_CHUNKS = 10;
const HOLD_CHUNK_MS = 70;
/** Calls are made among held streams only this long after the first was sent (the streams end on their own after chunks × delay). */
const HOLD_WINDOW_MS = 350;
/** A burst's calls wait this long upstream, so none ends before all were counted. */
const BURST_DELAY_MS = 250;

const MODES = [
  { mode: "memory", scenarios: 5 },
  { mode: "redis", scenarios: 3 },
  { mode: "two instances", scenarios: 2 },
] as const;
type Mode = (typeof MODES)[number]["mode"];

type Json = Record<string, unknown>;

// ---- scenarios

interface DeploymentSpec {
  id: string;
  group: string;
  rpm?: number;
  tpm?: number;
}

interface Limits {
  rpm_limit?: number;
  tpm_limit?: number;
  max_parallel_requests?: number;
  model_rpm_limit?: Record<string, number>;
  model_tpm_limit?: Record<string, number>;
  /** On the budget object only: per-model limits as its `model_max_budget` entries carry them. */
  model_max_budget?: Record<string, { rpm_limit?: number; tpm_limit?: number }>;
}

interface KeySpec {
  limits: Limits;
  team?: string;
  user?: string;
  /** On the scenario's budget object: its limits (per-model ones too) apply where the key sets none. */
  budget?: boolean;
}

interface TeamSpec {
  id: string;
  inOrg: boolean;
  limits: Limits;
  budget?: boolean;
  /** `team_member_rpm_limit` / `team_member_tpm_limit`: what members get when added. */
  memberDefaults: { team_member_rpm_limit?: number; team_member_tpm_limit?: number };
}

interface Scenario {
  index: number;
  tag: string;
  groups: string[];
  deployments: DeploymentSpec[];
  /** Created without a budget_id: its limits are those of a budget of its own (`budgetId`, known once created). */
  org?: { id: string; limits: Limits; budgetId?: string };
  budget?: { id: string; limits: Limits };
  teams: TeamSpec[];
  users: { id: string; limits: Limits }[];
  /** Team member limits: `${team}/${user}` → limits. */
  members: Map<string, { rpm_limit?: number; tpm_limit?: number }>;
  keys: KeySpec[];
  /** `router_settings.fallbacks`: group → the group tried when it fails. */
  fallbacks: Record<string, string>;
}

function limitsOf(rng: Random, groups: string[], opts: { parallel: boolean; model: boolean; p: number }): Limits {
  const l: Limits = {};
  // Now and then a limit of 0: nothing passes it.
  const zero = () => rng.chance(0.04);
  if (rng.chance(opts.p)) l.rpm_limit = zero() ? 0 : 1 + rng.int(8);
  if (rng.chance(opts.p)) l.tpm_limit = zero() ? 0 : 120 + rng.int(700);
  if (opts.parallel && rng.chance(opts.p * 0.8)) l.max_parallel_requests = zero() ? 0 : 1 + rng.int(3);
  if (opts.model && rng.chance(opts.p)) l.model_rpm_limit = { [rng.pick(groups)]: zero() ? 0 : 1 + rng.int(5) };
  if (opts.model && rng.chance(opts.p * 0.8)) l.model_tpm_limit = { [rng.pick(groups)]: 100 + rng.int(500) };
  return l;
}

/** A budget object's limits: per-model ones as `model_rpm_limit` / `model_tpm_limit`, or as its `model_max_budget` entries' limits. */
function budgetLimitsOf(rng: Random, groups: string[]): Limits {
  const l = limitsOf(rng, groups, { parallel: true, model: true, p: 0.6 });
  if ((l.model_rpm_limit || l.model_tpm_limit) && rng.chance(0.5)) {
    const entries: NonNullable<Limits["model_max_budget"]> = {};
    for (const [f, e] of [
      ["model_rpm_limit", "rpm_limit"],
      ["model_tpm_limit", "tpm_limit"],
    ] as const) {
      for (const [g, n] of Object.entries(l[f] ?? {})) entries[g] = { ...entries[g], [e]: n };
      delete l[f];
    }
    l.model_max_budget = entries;
  }
  return l;
}

function scenario(rng: Random, index: number, runTag: string): Scenario {
  const tag = `ld${runTag}s${index}`;
  const groups = [`${tag}-a`, `${tag}-b`];
  const deployments: DeploymentSpec[] = [];
  for (const group of groups) {
    const n = 1 + rng.int(3);
    for (let i = 0; i < n; i++) {
      const d: DeploymentSpec = { id: `${group}-d${i}`, group };
      if (rng.chance(0.55)) d.rpm = 1 + rng.int(6);
      if (rng.chance(0.35)) d.tpm = 150 + rng.int(600);
      deployments.push(d);
    }
  }
  const org = rng.chance(0.5) ? { id: `${tag}-org`, limits: limitsOf(rng, groups, { parallel: true, model: true, p: 0.4 }) } : undefined;
  const budget = rng.chance(0.4) ? { id: `${tag}-budget`, limits: budgetLimitsOf(rng, groups) } : undefined;
  const teams = Array.from({ length: rng.int(3) }, (_, i) => {
    const team: TeamSpec = { id: `${tag}-team${i}`, inOrg: org !== undefined && rng.chance(0.7), limits: limitsOf(rng, groups, { parallel: true, model: true, p: 0.4 }), memberDefaults: {} };
    if (budget && rng.chance(0.3)) team.budget = true;
    if (rng.chance(0.3)) team.memberDefaults.team_member_rpm_limit = 1 + rng.int(6);
    if (rng.chance(0.2)) team.memberDefaults.team_member_tpm_limit = 150 + rng.int(600);
    // A team's rpm / tpm may not exceed its organization's (a 400 otherwise).
    for (const f of ["rpm_limit", "tpm_limit"] as const) {
      const cap = team.inOrg ? org!.limits[f] : undefined;
      if (cap !== undefined && team.limits[f] !== undefined) team.limits[f] = Math.min(team.limits[f]!, cap);
    }
    return team;
  });
  const users = Array.from({ length: rng.int(3) }, (_, i) => ({ id: `${tag}-user${i}`, limits: limitsOf(rng, groups, { parallel: true, model: true, p: 0.4 }) }));
  const members = new Map<string, { rpm_limit?: number; tpm_limit?: number }>();
  const keys: KeySpec[] = [];
  const nKeys = 2 + rng.int(3);
  for (let i = 0; i < nKeys; i++) {
    const k: KeySpec = { limits: limitsOf(rng, groups, { parallel: true, model: true, p: 0.5 }) };
    if (teams.length > 0 && rng.chance(0.6)) k.team = rng.pick(teams).id;
    if (users.length > 0 && rng.chance(0.5)) k.user = rng.pick(users).id;
    if (budget && rng.chance(0.4)) k.budget = true;
    if (k.team && k.user && !members.has(`${k.team}/${k.user}`)) {
      const m: { rpm_limit?: number; tpm_limit?: number } = {};
      if (rng.chance(0.4)) m.rpm_limit = 1 + rng.int(6);
      if (rng.chance(0.3)) m.tpm_limit = 150 + rng.int(600);
      members.set(`${k.team}/${k.user}`, m);
    }
    keys.push(k);
  }
  const fallbacks: Record<string, string> = {};
  for (const [i, g] of groups.entries()) if (rng.chance(0.35)) fallbacks[g] = groups[1 - i]!;
  return { index, tag, groups, deployments, org, budget, teams, users, members, keys, fallbacks };
}

// ---- the model

/** One request as the model counts it: when it was sent and answered (the gateway started it in between), its tokens. */
interface Entry {
  sent: number;
  answered: number;
  tokens: number;
  inFlight: boolean;
}

interface Counter {
  id: string;
  label: string;
  rpm?: number;
  tpm?: number;
  parallel?: number;
  /** Per kind, the budget object a limit comes from (the row sets none): `Budget=<id>`. */
  sources: Partial<Record<Kind, string>>;
  entries: Entry[];
}

type Kind = "requests" | "tokens" | "parallel_requests";
const KIND_TEXT: Record<Kind, string> = { requests: "requests per minute", tokens: "tokens per minute", parallel_requests: "parallel requests" };

interface Violation {
  counter: Counter;
  kind: Kind;
  limit: number;
  current: number;
  /** The entry that must leave the window before the request fits (undefined: parallel, or never fits). */
  waitFor?: Entry;
  tooLarge?: boolean;
  /** The request's reservation. */
  tokens: number;
}

const used = (c: Counter) => c.entries.reduce((s, e) => s + e.tokens, 0);
const inFlight = (c: Counter) => c.entries.filter((e) => e.inFlight).length;

function violations(c: Counter, tokens: number): Violation[] {
  const sum = used(c);
  // README: a request larger than the whole tpm is refused for that, whatever else is used up.
  if (c.tpm !== undefined && tokens > c.tpm) return [{ counter: c, kind: "tokens", limit: c.tpm, current: sum, tooLarge: true, tokens }];
  const out: Violation[] = [];
  const count = c.entries.length;
  if (c.rpm !== undefined && count + 1 > c.rpm) out.push({ counter: c, kind: "requests", limit: c.rpm, current: count, waitFor: c.rpm === 0 ? undefined : c.entries[count - c.rpm], tokens });
  if (c.tpm !== undefined && sum + tokens > c.tpm) {
    let waitFor: Entry | undefined;
    let freed = 0;
    for (const e of c.entries) {
      freed += e.tokens;
      if (sum - freed + tokens <= c.tpm) {
        waitFor = e;
        break;
      }
    }
    out.push({ counter: c, kind: "tokens", limit: c.tpm, current: sum, waitFor, tokens });
  }
  if (c.parallel !== undefined && inFlight(c) + 1 > c.parallel) out.push({ counter: c, kind: "parallel_requests", limit: c.parallel, current: inFlight(c), tokens });
  return out;
}

class Model {
  readonly counters = new Map<string, Counter>();

  /** A counter with its limits as they are now (a key's may change); its log stays. */
  counter(id: string, label: string, limits: { rpm?: number; tpm?: number; parallel?: number }, sources: Partial<Record<Kind, string>> = {}): Counter {
    let c = this.counters.get(id);
    if (!c) {
      c = { id, label, sources, entries: [] };
      this.counters.set(id, c);
    }
    Object.assign(c, { rpm: limits.rpm, tpm: limits.tpm, parallel: limits.parallel, sources });
    return c;
  }
}

// ---- requests

const WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec"];

interface Req {
  key: number;
  group: string;
  stream: boolean;
  messages: { role: string; content: string }[];
  maxTokens?: number;
}

function randomReq(rng: Random, s: Scenario): Req {
  const text = (n: number) => Array.from({ length: n }, () => rng.pick(WORDS)).join(" ");
  const messages = [{ role: "user", content: text(1 + rng.int(rng.chance(0.3) ? 90 : 25)) }];
  if (rng.chance(0.3)) messages.unshift({ role: "system", content: text(1 + rng.int(20)) });
  return { key: rng.int(s.keys.length), group: rng.pick(s.groups), stream: rng.chance(0.4), messages, maxTokens: rng.chance(0.6) ? 1 + rng.int(60) : undefined };
}

/** The README's estimate: every character of the messages (their keys too) / 3, + 4 per message, + 3 for the reply, + max_tokens. */
function estimate(r: Req): number {
  let chars = 0;
  for (const m of r.messages) chars += "role".length + m.role.length + "content".length + m.content.length;
  return Math.ceil(chars / 3) + 4 * r.messages.length + 3 + (r.maxTokens ?? 0);
}

/** The mock's usage: prompt = characters / 4 + 3 per message; one completion token per word ("Mock reply to:" and up to 12 words of the prompt, or as many words as a slow stream has), cut at max_tokens. */
function mockUsage(r: Req, slowWords?: number): { prompt: number; completion: number } {
  const chars = r.messages.reduce((s, m) => s + m.content.length, 0);
  const userWords = r.messages.at(-1)!.content.split(/\s+/).filter(Boolean).length;
  const words = slowWords ?? 3 + Math.min(12, userWords);
  return { prompt: Math.ceil(chars / 4) + 3 * r.messages.length, completion: r.maxTokens === undefined ? words : Math.min(words, r.maxTokens) };
}

// ---- a run of one scenario

interface Ctx {
  seed: number;
  mode: Mode;
  s: Scenario;
  gws: TestGateway[];
  mock: MockOpenAI;
  keys: { key: string; name: string }[];
  model: Model;
  step: string;
  log: string[];
}

function fail(ctx: Ctx, what: string): never {
  throw new Error(
    `LIMITS_DIFF_SEED=${ctx.seed} mode=${ctx.mode} scenario=${ctx.s.index} step ${ctx.step}: ${what}\n` +
      `scenario: ${JSON.stringify({ fallbacks: ctx.s.fallbacks, deployments: ctx.s.deployments, org: ctx.s.org, budget: ctx.s.budget, teams: ctx.s.teams, users: ctx.s.users, members: [...ctx.s.members], keys: ctx.s.keys })}\n` +
      `steps:\n${ctx.log.slice(-25).join("\n")}`,
  );
}

function check(ctx: Ctx, ok: boolean, what: string): void {
  if (!ok) fail(ctx, what);
}

/** Every counter a request of `key` to `group` counts on (own, then the group's), as the README lists them. */
function countersFor(ctx: Ctx, r: Req): Counter[] {
  return [...ownCounters(ctx, r), ...groupCounters(ctx, r, r.group)];
}

/** The caller's own counters: taken once per request, whatever groups it tries. */
function ownCounters(ctx: Ctx, r: Req): Counter[] {
  return limitCounters(ctx, r, r.group).filter((c) => !c.id.includes("_model:"));
}

/** A group's per-model counters: taken for every group the request tries. */
function groupCounters(ctx: Ctx, r: Req, group: string): Counter[] {
  return limitCounters(ctx, r, group).filter((c) => c.id.includes("_model:"));
}

function limitCounters(ctx: Ctx, req: Req, group: string): Counter[] {
  const { s, model } = ctx;
  const r = { ...req, group };
  const spec = s.keys[r.key]!;
  const label = `Key ${ctx.keys[r.key]!.name}`;
  const out: Counter[] = [];
  /** Each limit: the row's own, else its budget object's (then named as the budget's). */
  const from = (sources: Partial<Record<Kind, string>>, kind: Kind, own: number | undefined, theirs: number | undefined) => {
    if (own !== undefined || theirs === undefined) return own;
    sources[kind] = `Budget=${s.budget!.id}`;
    return theirs;
  };
  /** A row's rpm / tpm / parallel. */
  const own = (id: string, lbl: string, l: Limits, budget?: Limits) => {
    const sources: Partial<Record<Kind, string>> = {};
    const rpm = from(sources, "requests", l.rpm_limit, budget?.rpm_limit);
    const tpm = from(sources, "tokens", l.tpm_limit, budget?.tpm_limit);
    const parallel = from(sources, "parallel_requests", l.max_parallel_requests, budget?.max_parallel_requests);
    if (rpm !== undefined || tpm !== undefined || parallel !== undefined) out.push(model.counter(id, lbl, { rpm, tpm, parallel }, sources));
  };
  /** A row's limits on the group; a budget's are its `model_rpm_limit` / `model_tpm_limit`, else its `model_max_budget` entry's. */
  const perModel = (id: string, lbl: string, l: Limits, budget?: Limits) => {
    const sources: Partial<Record<Kind, string>> = {};
    const g = r.group;
    const rpm = from(sources, "requests", l.model_rpm_limit?.[g], budget?.model_rpm_limit?.[g] ?? budget?.model_max_budget?.[g]?.rpm_limit);
    const tpm = from(sources, "tokens", l.model_tpm_limit?.[g], budget?.model_tpm_limit?.[g] ?? budget?.model_max_budget?.[g]?.tpm_limit);
    if (rpm !== undefined || tpm !== undefined) out.push(model.counter(`${id}:${g}`, `${lbl} for model=${g}`, { rpm, tpm }, sources));
  };
  const team = spec.team ? s.teams.find((t) => t.id === spec.team) : undefined;
  const org = team?.inOrg ? s.org : undefined;
  const user = spec.user ? s.users.find((u) => u.id === spec.user) : undefined;
  own(`key:${r.key}`, label, spec.limits, spec.budget ? s.budget!.limits : undefined);
  if (user) own(`user:${user.id}`, `User=${user.id}`, user.limits);
  if (team) own(`team:${team.id}`, `Team=${team.id}`, team.limits, team.budget ? s.budget!.limits : undefined);
  const member = team && user ? s.members.get(`${team.id}/${user.id}`) : undefined;
  // A member's own limits, else what the team gave its members when this one was added.
  const memberRpm = member?.rpm_limit ?? team?.memberDefaults.team_member_rpm_limit;
  const memberTpm = member?.tpm_limit ?? team?.memberDefaults.team_member_tpm_limit;
  if (member && (memberRpm !== undefined || memberTpm !== undefined)) {
    out.push(model.counter(`member:${team!.id}/${user!.id}`, `User=${user!.id} in Team=${team!.id}`, { rpm: memberRpm, tpm: memberTpm }));
  }
  if (org) own(`org:${org.id}`, `Organization=${org.id}`, org.limits);
  perModel(`key_model:${r.key}`, label, spec.limits, spec.budget ? s.budget!.limits : undefined);
  if (user) perModel(`user_model:${user.id}`, `User=${user.id}`, user.limits);
  if (team) perModel(`team_model:${team.id}`, `Team=${team.id}`, team.limits, team.budget ? s.budget!.limits : undefined);
  if (org) perModel(`org_model:${org.id}`, `Organization=${org.id}`, org.limits);
  return out;
}

function deploymentCounters(ctx: Ctx, group: string): { spec: DeploymentSpec; counter?: Counter }[] {
  return ctx.s.deployments
    .filter((d) => d.group === group)
    .map((spec) => ({ spec, counter: spec.rpm === undefined && spec.tpm === undefined ? undefined : ctx.model.counter(`deployment:${spec.id}`, spec.id, { rpm: spec.rpm, tpm: spec.tpm }) }));
}

type Prediction = (
  | { kind: "ok"; counters: Counter[]; room: { spec: DeploymentSpec; counter?: Counter }[] }
  | { kind: "limit"; refusing: Violation[] }
  /**
   * `caller`: the caller's limits refused too; retry-after is the later of the two. `tooLarge`: the
   * request alone is larger than every deployment's whole tpm (the largest): no retry-after.
   */
  | { kind: "deployments"; group: string; waits: Violation[]; caller?: Violation[]; tooLarge?: number }
) & { /** Decided in the fallback group. */ fellBack?: boolean };

/**
 * README (Deployment rpm/tpm): no deployment of `group` has room. When the request alone is larger
 * than each one's whole tpm, the caller's own refusal stands, else a 429 saying so; otherwise "every
 * deployment is at its rpm/tpm limit", with the later retry-after of theirs and the caller's.
 */
function noRoom(group: string, deps: { counter?: Counter }[], refusing: Violation[], tokens: number, fellBack?: boolean): Prediction {
  const waits = deps.map((d) => violations(d.counter!, tokens)[0]!);
  if (waits.every((v) => v.tooLarge)) {
    return refusing.length > 0 ? { kind: "limit", refusing, fellBack } : { kind: "deployments", group, waits, tooLarge: Math.max(...waits.map((v) => v.limit)), fellBack };
  }
  return { kind: "deployments", group, waits, caller: refusing.length > 0 ? refusing : undefined, fellBack };
}

function predict(ctx: Ctx, r: Req): Prediction {
  const tokens = estimate(r);
  const own = ownCounters(ctx, r);
  const fallback = ctx.s.fallbacks[r.group];
  /** `held`: the request's own counters are counted already (a fallback after the deployments refused). */
  const inGroup = (group: string, held: boolean, fellBack?: boolean): Prediction => {
    const theirs = groupCounters(ctx, r, group);
    const refusing = (held ? theirs : [...own, ...theirs]).flatMap((c) => violations(c, tokens));
    const deps = deploymentCounters(ctx, group);
    const room = deps.filter((d) => !d.counter || violations(d.counter, tokens).length === 0);
    if (room.length > 0) return refusing.length > 0 ? { kind: "limit", refusing, fellBack } : { kind: "ok", counters: [...own, ...theirs], room, fellBack };
    // README: every deployment at its limit answers for the group, the caller's refusal included; then the fallback.
    const failed = noRoom(group, deps, refusing, tokens, fellBack);
    if (failed.kind === "limit" || fellBack || !fallback) return failed;
    if (refusing.length > 0) return inGroup(fallback, false, true);
    // The fallback is tried with its own per-model counters, while the request's own stay counted.
    const entry: Entry = { sent: 0, answered: 0, tokens, inFlight: true };
    for (const c of own) c.entries.push(entry);
    try {
      return inGroup(fallback, true, true);
    } finally {
      for (const c of own) c.entries.pop();
    }
  };
  return inGroup(r.group, false);
}

interface Answer {
  status: number;
  headers: Headers;
  body?: { error?: { message: string; type: string; param: unknown; code: string }; usage?: { prompt_tokens: number; completion_tokens: number } };
  /** A held stream's body, read on release. */
  rest?: Response;
  sent: number;
  answered: number;
}

function bodyOf(ctx: Ctx, r: Req, held: boolean): Json {
  const b: Json = { model: r.group, messages: r.messages };
  if (r.maxTokens !== undefined) b.max_tokens = r.maxTokens;
  if (r.stream || held) b.stream = true;
  void ctx;
  return b;
}

async function send(ctx: Ctx, r: Req, held = false): Promise<Answer> {
  const gw = ctx.gws[ctx.gws.length === 1 ? 0 : Math.floor(Math.random() * ctx.gws.length)]!;
  const sent = Date.now();
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${ctx.keys[r.key]!.key}`, "content-type": "application/json" },
    body: JSON.stringify(bodyOf(ctx, r, held)),
  });
  const answered = Date.now();
  if (held && res.status === 200) return { status: 200, headers: res.headers, rest: res, sent, answered };
  const text = await res.text();
  let body: Answer["body"];
  if (res.headers.get("content-type")?.includes("json")) body = JSON.parse(text);
  else if (res.status === 200 && !text.includes("data: [DONE]")) fail(ctx, `stream without [DONE]: ${text.slice(-200)}`);
  return { status: res.status, headers: res.headers, body, sent, answered };
}

/** Whole seconds until `v` has room, bounded by when the requests involved were sent and answered. */
function retryRange(v: Violation, a: { sent: number; answered: number }): [number, number] {
  const s = (ms: number) => Math.max(1, Math.ceil(ms / 1000));
  if (v.kind === "parallel_requests") return [1, 1];
  if (!v.waitFor) return [60, 60];
  return [s(v.waitFor.sent + WINDOW_MS - a.answered), s(v.waitFor.answered + WINDOW_MS - a.sent)];
}

const inRange = (n: number, [lo, hi]: [number, number]) => n >= lo && n <= hi;

/** Checks a refusal against the prediction; returns nothing (a refusal changes no counter). */
function checkRefusal(ctx: Ctx, p: Exclude<Prediction, { kind: "ok" }>, a: Answer, timing: { sent: number; answered: number } = a): void {
  check(ctx, a.status === 429, `expected 429 (${explain(p)}), got ${a.status} ${JSON.stringify(a.body)?.slice(0, 300)}`);
  const err = a.body?.error;
  check(ctx, err !== undefined && err.type === "rate_limit_error" && err.code === "429" && "param" in err, `error envelope: ${JSON.stringify(a.body)}`);
  if (p.kind === "deployments" && p.tooLarge !== undefined) {
    const want = `No deployments available for model ${p.group}: this request alone may use ${p.waits[0]!.tokens} tokens, more than any of its deployments serves per minute (largest tpm ${p.tooLarge}); lower max_tokens.`;
    check(ctx, err!.message === want && a.headers.get("retry-after") === null, `message "${err!.message}" (retry-after ${a.headers.get("retry-after")}), expected "${want}" without retry-after`);
    return;
  }
  const retry = Number(a.headers.get("retry-after"));
  check(ctx, Number.isInteger(retry) && retry > 0 && retry <= 60, `retry-after ${a.headers.get("retry-after")}`);
  const message = err!.message;
  if (p.kind === "deployments") {
    const group = /No deployments available for model (\S+): every deployment is at its rpm\/tpm limit\. Try again in (\d+) s\.$/.exec(message);
    check(ctx, group !== null && group[1] === p.group, `message "${message}", expected no deployments available for model ${p.group}`);
    const ranges = p.waits.map((v) => retryRange(v, timing));
    // The caller's retry-after is one of its refusing limits', when later.
    const caller = (p.caller ?? []).map((v) => retryRange(v, timing));
    const lo = Math.max(Math.min(...ranges.map((x) => x[0])), ...(caller.length ? [Math.min(...caller.map((x) => x[0]))] : []));
    const hi = Math.max(Math.min(...ranges.map((x) => x[1])), ...(caller.length ? [Math.max(...caller.map((x) => x[1]))] : []));
    check(ctx, inRange(retry, [lo, hi]) && group![2] === String(retry), `retry-after ${retry} (message "${message}"), expected within [${lo}, ${hi}]`);
    return;
  }
  const fromText = (v: Violation) => (v.counter.sources[v.kind] ? ` (from ${v.counter.sources[v.kind]})` : "");
  const match = p.refusing.find((v) => message.startsWith(`Rate limit exceeded for ${v.counter.label}: ${KIND_TEXT[v.kind]} limit ${v.limit}${fromText(v)}, `));
  check(ctx, match !== undefined, `message "${message}", expected one of: ${explain(p)}`);
  const v = match!;
  if (v.kind === "parallel_requests") check(ctx, message.endsWith(`, ${v.current} requests in flight.`), `message "${message}", expected ${v.current} in flight`);
  else if (v.tooLarge) check(ctx, message.endsWith(`, and this request alone may use ${v.tokens} tokens (lower max_tokens).`), `message "${message}", expected the request (${v.tokens} tokens) to be too large`);
  else check(ctx, message.endsWith(`, ${v.current} used in the last 60 s. Try again in ${retry} s.`), `message "${message}", expected ${v.current} used, retry ${retry}`);
  const range = retryRange(v, timing);
  check(ctx, inRange(retry, range), `retry-after ${retry} for "${message}", expected within [${range}]`);
  if (v.kind === "requests") {
    check(ctx, a.headers.get("x-ratelimit-limit-requests") === String(v.limit) && a.headers.get("x-ratelimit-remaining-requests") === "0", `refusal headers ${headerText(a.headers)}`);
  }
  if (v.kind === "tokens") {
    check(ctx, a.headers.get("x-ratelimit-limit-tokens") === String(v.limit) && a.headers.get("x-ratelimit-remaining-tokens") === String(Math.max(0, v.limit - v.current)), `refusal headers ${headerText(a.headers)}, expected tokens ${v.limit}/${v.limit - v.current}`);
  }
}

function explain(p: Prediction): string {
  if (p.kind === "ok") return `allowed${p.fellBack ? " after falling back" : ""} (deployments with room: ${p.room.map((d) => d.spec.id)})`;
  if (p.kind === "deployments") return `no deployment of ${p.group} has room${p.tooLarge !== undefined ? ` (the request is larger than their tpm, ${p.tooLarge} at most)` : ""}${p.fellBack ? " (after falling back)" : ""}`;
  return p.refusing.map((v) => `${v.counter.label} ${v.kind} ${v.current}/${v.limit}${v.counter.sources[v.kind] ? ` (from ${v.counter.sources[v.kind]})` : ""}`).join("; ");
}

function headerText(h: Headers): string {
  return ["limit-requests", "remaining-requests", "limit-tokens", "remaining-tokens"].map((n) => `${n}=${h.get(`x-ratelimit-${n}`)}`).join(" ");
}

/** Counts a granted request on its counters and the deployment that took it; checks that deployment had room and the headers. */
function admit(ctx: Ctx, r: Req, p: Extract<Prediction, { kind: "ok" }>, a: Answer, checkHeaders: boolean): Entry {
  check(ctx, a.status === 200, `expected 200 (${explain(p)}), got ${a.status} ${JSON.stringify(a.body)?.slice(0, 300)}`);
  const id = a.headers.get("x-svc-model-id");
  const dep = p.room.find((d) => d.spec.id === id);
  check(ctx, dep !== undefined, `answered by ${id}, expected one of ${p.room.map((d) => d.spec.id)}`);
  const entry: Entry = { sent: a.sent, answered: a.answered, tokens: estimate(r), inFlight: true };
  const all = dep!.counter ? [...p.counters, dep!.counter] : p.counters;
  for (const c of all) c.entries.push(entry);
  if (!checkHeaders) return entry;
  for (const [kind, field] of [
    ["requests", "rpm"],
    ["tokens", "tpm"],
  ] as const) {
    const figures = all.filter((c) => c[field] !== undefined).map((c) => ({ limit: c[field]!, remaining: c[field]! - (kind === "requests" ? c.entries.length : used(c)) }));
    const limit = a.headers.get(`x-ratelimit-limit-${kind}`);
    const remaining = a.headers.get(`x-ratelimit-remaining-${kind}`);
    if (figures.length === 0) {
      // No gateway limit of this kind: the upstream's own figures (the mock's).
      const mine = kind === "requests" ? ["10000", "9999"] : ["30000000", "29999990"];
      check(ctx, limit === mine[0] && remaining === mine[1], `${kind} headers ${headerText(a.headers)}, expected the upstream's ${mine}`);
      continue;
    }
    const least = Math.min(...figures.map((f) => f.remaining));
    const limits = figures.filter((f) => f.remaining === least).map((f) => String(f.limit));
    check(ctx, remaining === String(least) && limit !== null && limits.includes(limit), `${kind} headers ${headerText(a.headers)}, expected remaining ${least} of ${limits.join(" or ")}`);
  }
  return entry;
}

function settle(ctx: Ctx, r: Req, entry: Entry, a: Answer, slowWords?: number): void {
  const u = mockUsage(r, slowWords);
  if (a.body?.usage) check(ctx, a.body.usage.prompt_tokens === u.prompt && a.body.usage.completion_tokens === u.completion, `usage ${JSON.stringify(a.body.usage)}, the model says ${JSON.stringify(u)}`);
  entry.tokens = u.prompt + u.completion;
  entry.inFlight = false;
}

function reqText(r: Req): string {
  return `key${r.key} ${r.group} ${r.stream ? "stream" : "json"} est=${estimate(r)} max_tokens=${r.maxTokens}`;
}

async function call(ctx: Ctx, r: Req): Promise<void> {
  const p = predict(ctx, r);
  ctx.log.push(`  call ${reqText(r)} → ${explain(p)}`);
  const a = await send(ctx, r);
  if (p.kind !== "ok") return checkRefusal(ctx, p, a);
  const entry = admit(ctx, r, p, a, true);
  settle(ctx, r, entry, a);
}

/**
 * A call whose first attempt fails upstream (a 500, no retries): it went out, so it counts (with no
 * tokens) on the caller's own counters, the group's and the deployment's; then the group's fallback,
 * if any, is tried with its own per-model counters. Only where the model knows which deployment the
 * failed attempt went to (one with room, or none of them with limits of its own); else a plain call.
 */
async function failingCall(ctx: Ctx, r: Req): Promise<void> {
  const p = predict(ctx, r);
  if (p.kind !== "ok" || p.fellBack || (p.room.length > 1 && p.room.some((d) => d.counter))) return call(ctx, r);
  const failed = p.room[0]!;
  const fallback = ctx.s.fallbacks[r.group];
  ctx.log.push(`  failing call ${reqText(r)} → fails at ${p.room.length === 1 ? failed.spec.id : "some deployment"}${fallback ? `, falls back to ${fallback}` : ""}`);
  const own = ownCounters(ctx, r);
  const mine = groupCounters(ctx, r, r.group);
  const tokens = estimate(r);
  ctx.mock.fault({ kind: "status", status: 500 });
  const a = await send(ctx, r);
  ctx.mock.clearFaults();
  // The failed attempt: counted with no tokens on the group's and the deployment's counters.
  const attempt: Entry = { sent: a.sent, answered: a.answered, tokens: 0, inFlight: false };
  for (const c of failed.counter ? [...mine, failed.counter] : mine) c.entries.push(attempt);
  const request: Entry = { sent: a.sent, answered: a.answered, tokens, inFlight: true };
  for (const c of own) c.entries.push(request);
  const ended = () => Object.assign(request, { tokens: 0, inFlight: false });
  if (!fallback) {
    check(ctx, a.status === 500, `expected the upstream's 500, got ${a.status} ${JSON.stringify(a.body)?.slice(0, 300)}`);
    ended();
    return;
  }
  const theirs = groupCounters(ctx, r, fallback);
  const refusing = theirs.flatMap((c) => violations(c, tokens));
  const deps = deploymentCounters(ctx, fallback);
  const room = deps.filter((d) => !d.counter || violations(d.counter, tokens).length === 0);
  let then: Prediction;
  if (room.length === 0) then = noRoom(fallback, deps, refusing, tokens, true);
  else if (refusing.length > 0) then = { kind: "limit", refusing, fellBack: true };
  else then = { kind: "ok", counters: [...own, ...theirs], room, fellBack: true };
  ctx.log.push(`    then ${explain(then)}`);
  if (then.kind !== "ok") {
    checkRefusal(ctx, then, a);
    ended();
    return;
  }
  // The request's own counters hold it already (since the first attempt): counted once.
  for (const c of own) c.entries.pop();
  const entry = admit(ctx, { ...r, group: fallback }, then, a, true);
  settle(ctx, r, entry, a);
}

interface Held {
  r: Req;
  a: Answer;
  entry: Entry;
}

async function hold(ctx: Ctx, r: Req, held: Held[]): Promise<void> {
  const p = predict(ctx, r);
  ctx.log.push(`  hold ${reqText(r)} → ${explain(p)}`);
  if (p.kind === "ok") ctx.mock.fault({ kind: "slowStream", chunkDelayMs: HOLD_CHUNK_MS, chunks: HOLD_CHUNKS });
  const a = await send(ctx, { ...r, stream: true }, true);
  if (p.kind !== "ok") return checkRefusal(ctx, p, a);
  held.push({ r, a, entry: admit(ctx, r, p, a, true) });
}

async function release(ctx: Ctx, held: Held[]): Promise<void> {
  const started = held.length > 0 ? Math.min(...held.map((h) => h.a.sent)) : Date.now();
  // Every held call had to stay in flight until now.
  check(ctx, Date.now() - started < HOLD_CHUNKS * HOLD_CHUNK_MS, `the calls made while streams were held took too long (${Date.now() - started} ms): the model's in-flight counts may be stale`);
  for (const h of held) {
    const text = await h.a.rest!.text();
    check(ctx, text.includes("data: [DONE]"), `held stream ended without [DONE]: ${text.slice(-200)}`);
    settle(ctx, h.r, h.entry, h.a, HOLD_CHUNKS);
  }
  // A stream is settled right after its last bytes are sent.
  await Bun.sleep(20);
  ctx.log.push(`  released ${held.length}`);
}

/** Identical calls at once. Only when their outcome does not depend on their order (see below); else one after another. */
async function burst(ctx: Ctx, r: Req, n: number): Promise<void> {
  // Sequential prediction on a copy of the counters.
  const saved = new Map([...ctx.model.counters].map(([id, c]) => [id, c.entries.slice()]));
  const preds: Prediction[] = [];
  /** The burst's own calls as the sequential prediction counted them: a refusal may wait for one of them. */
  const mine: Entry[] = [];
  for (let i = 0; i < n; i++) {
    const p = predict(ctx, r);
    preds.push(p);
    if (p.kind === "ok") {
      // Any deployment with room: with identical requests the total that fits does not depend on which.
      const e: Entry = { sent: 0, answered: 0, tokens: estimate(r), inFlight: true };
      mine.push(e);
      for (const c of p.counters) c.entries.push(e);
      const d = p.room.find((x) => x.counter) ?? p.room[0]!;
      d.counter?.entries.push(e);
    }
  }
  const restore = () => {
    for (const [id, entries] of saved) ctx.model.counters.get(id)!.entries = entries.slice();
    for (const c of ctx.model.counters.values()) if (!saved.has(c.id)) c.entries = [];
  };
  restore();
  // A call that passes the caller's limits and then finds no deployment holds them for a moment (they
  // are given back once it is refused): if that can refuse another call of the burst, which calls are
  // refused, and by which limit, depends on the order. Counted as if every call held them:
  let transient = false;
  for (let i = 0; i < n && preds.some((p) => p.kind === "deployments"); i++) {
    const counters = countersFor(ctx, r);
    if (counters.some((c) => violations(c, estimate(r)).length > 0)) transient = true;
    const e: Entry = { sent: 0, answered: 0, tokens: estimate(r), inFlight: true };
    for (const c of counters) c.entries.push(e);
  }
  restore();
  const kinds = new Set(preds.map((p) => p.kind));
  const ok = preds.filter((p) => p.kind === "ok").length;
  // Deployment choice for tpm: a deployment's room in calls depends on which ones the router picked.
  const tpmDeployments = ctx.s.deployments.some((d) => d.group === r.group && d.tpm !== undefined);
  // A fallback holds the request's own counters while it is tried: as above.
  if ((kinds.has("deployments") && transient) || tpmDeployments || preds.some((p) => p.fellBack)) {
    for (let i = 0; i < n; i++) await call(ctx, r);
    return;
  }
  ctx.log.push(`  burst ${n}× ${reqText(r)} → ${ok} allowed`);
  ctx.mock.fault(...Array.from({ length: ok }, () => ({ kind: "delay" as const, ms: BURST_DELAY_MS })));
  const sent = Date.now();
  const answers = await Promise.all(Array.from({ length: n }, () => send(ctx, { ...r, stream: false })));
  const answered = Date.now();
  ctx.mock.clearFaults();
  for (const e of mine) Object.assign(e, { sent, answered });
  const statuses = answers.map((a) => a.status).sort();
  check(ctx, statuses.filter((s) => s === 200).length === ok, `burst statuses ${statuses}, expected ${ok} allowed (${preds.map(explain).join(" | ")})`);
  const refusal = preds.find((p) => p.kind !== "ok");
  const admitted: { entry: Entry; a: Answer }[] = [];
  for (const a of answers) {
    a.sent = sent;
    a.answered = answered;
    if (a.status !== 200) {
      checkRefusal(ctx, refusal as Exclude<Prediction, { kind: "ok" }>, a, { sent, answered });
      continue;
    }
    const p = predict(ctx, r);
    if (p.kind !== "ok") fail(ctx, `burst: the model has no room for an allowed call (${explain(p)})`);
    // Their x-ratelimit-* depend on the order they were counted in: not compared.
    admitted.push({ entry: admit(ctx, r, p, a, false), a });
  }
  for (const { entry, a } of admitted) settle(ctx, r, entry, a);
}

// ---- setup of a scenario through the management API

async function ok(gw: TestGateway, path: string, body: Json): Promise<Json> {
  const r = await requestJson<Json>(gw, "POST", path, { body });
  if (r.status !== 200) throw new Error(`POST ${path} ${JSON.stringify(body)} → ${r.status}: ${r.text}`);
  return r.body;
}

async function create(s: Scenario, gws: TestGateway[]): Promise<{ key: string; name: string }[]> {
  const gw = gws[0]!;
  if (s.org) s.org.budgetId = (await ok(gw, "/organization/new", { organization_id: s.org.id, organization_alias: s.org.id, ...s.org.limits })).budget_id as string;
  if (s.budget) await ok(gw, "/budget/new", { budget_id: s.budget.id, ...s.budget.limits });
  for (const t of s.teams) {
    await ok(gw, "/team/new", { team_id: t.id, ...(t.inOrg ? { organization_id: s.org!.id } : {}), ...(t.budget ? { budget_id: s.budget!.id } : {}), ...t.limits, ...t.memberDefaults });
  }
  for (const u of s.users) await ok(gw, "/user/new", { user_id: u.id, ...u.limits });
  for (const [ref, limits] of s.members) {
    const [team_id, user_id] = ref.split("/");
    await ok(gw, "/team/member_add", { team_id, member: { role: "user", user_id } });
    if (Object.keys(limits).length > 0) await ok(gw, "/team/member_update", { team_id, user_id, ...limits });
  }
  const keys: { key: string; name: string }[] = [];
  for (const k of s.keys) {
    const body = await ok(gw, "/key/generate", { ...k.limits, ...(k.team ? { team_id: k.team } : {}), ...(k.user ? { user_id: k.user } : {}), ...(k.budget ? { budget_id: s.budget!.id } : {}) });
    keys.push({ key: body.key as string, name: `sk-...${(body.key as string).slice(-4)}` });
  }
  // Every instance knows every key before the first call.
  for (const other of gws.slice(1)) {
    for (const k of keys) for (let i = 0; i < 200 && other.host!.services.identity!.lookupKey(sha256(k.key)) === undefined; i++) await Bun.sleep(20);
  }
  return keys;
}

/**
 * New limits for a key, by /key/update (a limit it loses is cleared with null): the calls its
 * counters already hold count for the new limits too.
 */
async function updateKey(ctx: Ctx, rng: Random): Promise<void> {
  const i = rng.int(ctx.s.keys.length);
  const spec = ctx.s.keys[i]!;
  const next = limitsOf(rng, ctx.s.groups, { parallel: true, model: true, p: 0.5 });
  const fields = ["rpm_limit", "tpm_limit", "max_parallel_requests", "model_rpm_limit", "model_tpm_limit"] as const;
  const body: Json = { key: ctx.keys[i]!.key };
  for (const f of fields) body[f] = next[f] ?? null;
  ctx.log.push(`  key${i} limits ${JSON.stringify(spec.limits)} → ${JSON.stringify(next)}`);
  await ok(ctx.gws[0]!, "/key/update", body);
  spec.limits = next;
  // Every instance serves the new limits before the next call.
  const want = JSON.stringify([next.rpm_limit ?? null, next.tpm_limit ?? null, next.max_parallel_requests ?? null, next.model_rpm_limit ?? {}, next.model_tpm_limit ?? {}]);
  for (const gw of ctx.gws) {
    const seen = () => {
      const row = gw.host!.services.identity!.lookupKey(sha256(ctx.keys[i]!.key));
      const num = (v: unknown) => (v === null || v === undefined ? null : Number(v));
      return row && JSON.stringify([num(row.rpmLimit), num(row.tpmLimit), num(row.maxParallelRequests), row.modelRpmLimit ?? {}, row.modelTpmLimit ?? {}]) === want;
    };
    for (let n = 0; n < 200 && !seen(); n++) await Bun.sleep(10);
    check(ctx, seen() === true, `the key's new limits did not reach every instance`);
  }
}

/**
 * New limits for the budget object (its keys and teams take those they do not set themselves), or
 * for the organization's own budget (the org's limits follow it), by /budget/update: the calls the
 * counters already hold count for the new limits too.
 */
async function updateBudget(ctx: Ctx, rng: Random): Promise<void> {
  const { s } = ctx;
  const num = (v: unknown) => (v === null || v === undefined ? null : Number(v));
  const orEmpty = (v: unknown) => v ?? {};
  let seen: (gw: TestGateway) => boolean;
  if (s.budget && (!s.org || rng.chance(0.6))) {
    const budget = s.budget;
    const next = budgetLimitsOf(rng, s.groups);
    const body: Json = { budget_id: budget.id };
    for (const f of ["rpm_limit", "tpm_limit", "max_parallel_requests", "model_rpm_limit", "model_tpm_limit", "model_max_budget"] as const) body[f] = next[f] ?? null;
    ctx.log.push(`  budget limits ${JSON.stringify(budget.limits)} → ${JSON.stringify(next)}`);
    await ok(ctx.gws[0]!, "/budget/update", body);
    budget.limits = next;
    const want = [next.rpm_limit ?? null, next.tpm_limit ?? null, next.max_parallel_requests ?? null, next.model_rpm_limit ?? {}, next.model_tpm_limit ?? {}, next.model_max_budget ?? {}];
    seen = (gw) => {
      const row = gw.host!.services.identity!.budgets.get(budget.id);
      return row !== undefined && Bun.deepEquals([num(row.rpmLimit), num(row.tpmLimit), num(row.maxParallelRequests), orEmpty(row.modelRpmLimit), orEmpty(row.modelTpmLimit), orEmpty(row.modelMaxBudget)], want);
    };
  } else if (s.org?.budgetId) {
    const org = s.org;
    const next = limitsOf(rng, s.groups, { parallel: true, model: false, p: 0.4 });
    const body: Json = { budget_id: org.budgetId };
    for (const f of ["rpm_limit", "tpm_limit", "max_parallel_requests"] as const) body[f] = next[f] ?? null;
    ctx.log.push(`  org budget limits ${JSON.stringify(org.limits)} → ${JSON.stringify(next)}`);
    await ok(ctx.gws[0]!, "/budget/update", body);
    // The org's per-model limits are its row's own: they stay.
    org.limits = { ...org.limits, rpm_limit: next.rpm_limit, tpm_limit: next.tpm_limit, max_parallel_requests: next.max_parallel_requests };
    const want = [next.rpm_limit ?? null, next.tpm_limit ?? null, next.max_parallel_requests ?? null];
    seen = (gw) => {
      const row = gw.host!.services.identity!.orgs.get(org.id);
      return row !== undefined && Bun.deepEquals([num(row.rpmLimit), num(row.tpmLimit), num(row.maxParallelRequests)], want);
    };
  } else return updateKey(ctx, rng);
  // Every instance serves the new limits before the next call.
  for (const gw of ctx.gws) {
    for (let n = 0; n < 200 && !seen(gw); n++) await Bun.sleep(10);
    check(ctx, seen(gw), "the budget's new limits did not reach every instance");
  }
}

async function run(seed: number, mode: Mode, s: Scenario, gws: TestGateway[], mock: MockOpenAI): Promise<void> {
  const ctx: Ctx = { seed, mode, s, gws, mock, keys: await create(s, gws), model: new Model(), step: "setup", log: [] };
  const rng = new Random(seed * 1000 + s.index * 7 + MODES.findIndex((m) => m.mode === mode));
  const steps = 14 + rng.int(10);
  for (let i = 0; i < steps; i++) {
    ctx.step = `${i + 1}/${steps}`;
    const roll = rng.next();
    if (roll < 0.12) {
      const held: Held[] = [];
      const n = 1 + rng.int(3);
      ctx.log.push(`${ctx.step} hold ${n}`);
      const key = rng.int(s.keys.length);
      const first = Date.now();
      for (let j = 0; j < n; j++) await hold(ctx, { ...randomReq(rng, s), key: rng.chance(0.7) ? key : rng.int(s.keys.length) }, held);
      const between = rng.int(4);
      for (let j = 0; j < between; j++) {
        const r: Req = { ...randomReq(rng, s), key: rng.chance(0.6) ? key : rng.int(s.keys.length), stream: false };
        if (Date.now() - first < HOLD_WINDOW_MS) await call(ctx, r);
      }
      await release(ctx, held);
    } else if (roll < 0.25) {
      ctx.log.push(`${ctx.step} burst`);
      await burst(ctx, randomReq(rng, s), 2 + rng.int(5));
    } else if (roll < 0.29) {
      ctx.log.push(`${ctx.step} update`);
      await updateKey(ctx, rng);
    } else if (roll < 0.33) {
      ctx.log.push(`${ctx.step} budget update`);
      await updateBudget(ctx, rng);
    } else if (roll < 0.44) {
      ctx.log.push(`${ctx.step} failing call`);
      await failingCall(ctx, { ...randomReq(rng, s), stream: false });
    } else {
      ctx.log.push(`${ctx.step} call`);
      const r = randomReq(rng, s);
      await call(ctx, r);
      if (r.stream) await Bun.sleep(10);
    }
  }
}

// ---- the suites

function configOf(scenarios: Scenario[], mock: MockOpenAI): Json {
  return {
    model_list: scenarios.flatMap((s) =>
      s.deployments.map((d) => ({
        model_name: d.group,
        svc_params: { model: "openai/gpt-4o-mini", api_base: mock.url, api_key: "sk-up", ...(d.rpm !== undefined ? { rpm: d.rpm } : {}), ...(d.tpm !== undefined ? { tpm: d.tpm } : {}) },
        model_info: { id: d.id },
      })),
    ),
    // Cooldowns off: the failed attempts must not take deployments out of the model's sight.
    router_settings: { disable_cooldowns: true, fallbacks: scenarios.flatMap((s) => Object.entries(s.fallbacks).map(([from, to]) => ({ [from]: [to] }))) },
    general_settings: { master_key: MASTER_KEY },
  };
}


const hasRedis = await redisReachable(REDIS_URL);

for (const { mode, scenarios: count } of MODES) {
  describe.skipIf(mode !== "memory" && !hasRedis)(`rate limits against the model (${mode}), LIMITS_DIFF_SEED=${SEED}`, () => {
    const runTag = `${(SEED % 100_000).toString(36)}${Math.random().toString(36).slice(2, 6)}`;
    const rng = new Random(SEED + MODES.findIndex((m) => m.mode === mode));
    const scenarios = Array.from({ length: count }, (_, i) => scenario(rng, i, runTag));
    let mock: MockOpenAI;
    const gws: TestGateway[] = [];
    let drop: (() => Promise<void>) | undefined;

    beforeAll(async () => {
      mock = await startMockOpenAI({ apiKey: "sk-up" });
      const config = configOf(scenarios, mock);
      if (mode === "memory") gws.push(await startBackendGateway("pglite", config));
      else if (mode === "redis") gws.push(await startBackendGateway("pglite", config, { redisUrl: REDIS_URL }));
      else {
        const db = await freshDatabase("gw_limits_diff");
        drop = db.drop;
        for (let i = 0; i < 2; i++) gws.push(await startTestGateway(config, { store: { databaseUrl: db.url, redisUrl: REDIS_URL } }));
        await Promise.all(gws.map((g) => g.host!.services.bus!.subscribed()));
      }
    });
    afterAll(async () => {
      for (const g of gws) await g.stop();
      await drop?.();
      await mock?.stop();
    });

    for (const s of scenarios) {
      test(`scenario ${s.index}`, async () => {
        await run(SEED, mode, s, gws, mock);
        expect(true).toBe(true);
      }, 30_000);
    }
  });
}

// ---- the windows themselves, with a clock the test moves

/**
 * The in-memory windows (core/limits/local-windows.ts, the gateway's without Redis) against the same
 * rules, past the 60 s window: random counters, acquires of random counter lists and token counts,
 * settles and take-backs (whole, or in two parts as the router ends them), and clock steps (0 ms to
 * past the window, so requests leave it, some while still in flight, and the log's expired prefix is
 * compacted). Every answer is predicted exactly: which counter and kind refuses (the first in order,
 * requests before tokens before parallel), what is used, the milliseconds until it fits, and what is
 * left on each counter of a grant.
 */
describe(`in-memory windows against the model, with a clock the test moves, LIMITS_DIFF_SEED=${SEED}`, () => {
  interface WEntry {
    t: number;
    tokens: number;
  }
  interface WCounter {
    spec: RateCounter;
    entries: WEntry[];
    inFlight: number;
  }
  interface WLease {
    counters: WCounter[];
    entry: WEntry;
    end: (how: "settle" | "cancel", actual: number, from: number, to: number) => void;
    ended: boolean[];
  }

  for (let round = 0; round < 12; round++) {
    test(`round ${round}`, () => {
      const rng = new Random(SEED * 31 + round);
      let now = 1_700_000_000_000;
      const w = new LocalWindows(() => now);
      const tag = `${round}-${Math.random()}`;
      const counters: WCounter[] = Array.from({ length: 1 + rng.int(4) }, (_, i) => {
        const spec: RateCounter = { id: `w${tag}:${i}`, label: `C${i}` };
        if (rng.chance(0.7)) spec.rpm = rng.chance(0.05) ? 0 : 1 + rng.int(rng.chance(0.5) ? 600 : 12);
        if (rng.chance(0.6)) spec.tpm = rng.chance(0.05) ? 0 : 50 + rng.int(rng.chance(0.5) ? 50_000 : 1500);
        if (rng.chance(0.4)) spec.parallel = rng.chance(0.05) ? 0 : 1 + rng.int(rng.chance(0.5) ? 300 : 4);
        return { spec, entries: [], inFlight: 0 };
      });
      const live: WLease[] = [];
      const log: string[] = [];
      const fail: (what: string) => never = (what) => {
        throw new Error(`LIMITS_DIFF_SEED=${SEED} windows round ${round}: ${what}\ncounters: ${JSON.stringify(counters.map((c) => c.spec))}\n${log.slice(-15).join("\n")}`);
      };
      const prune = (c: WCounter) => {
        c.entries = c.entries.filter((e) => e.t > now - WINDOW_MS);
      };
      const ops = 600 + rng.int(1200);
      for (let op = 0; op < ops; op++) {
        const roll = rng.next();
        if (roll < 0.12) {
          const step = rng.pick([0, 1, 7, 250, 999, 5000, 20_000, 59_999, 60_000, 61_000]);
          now += step;
          log.push(`+${step} ms`);
        } else if (roll < 0.3 && live.length > 0) {
          const lease = live.splice(rng.int(live.length), 1)[0]!;
          const how = rng.chance(0.2) ? "cancel" : "settle";
          const actual = rng.int(400);
          // Whole, or in two parts at different times (the router ends the request's part and the group's apart).
          const cut = rng.int(lease.counters.length + 1);
          const parts: [number, number][] = rng.chance(0.5) ? [[0, lease.counters.length]] : [[0, cut], [cut, lease.counters.length]];
          for (const [from, to] of parts) {
            log.push(`${how} ${actual} on ${lease.counters.slice(from, to).map((c) => c.spec.label)}`);
            lease.end(how, actual, from, to);
            for (const c of lease.counters.slice(from, to)) {
              prune(c);
              const i = c.entries.indexOf(lease.entry);
              if (how === "cancel" && i !== -1) c.entries.splice(i, 1);
              c.inFlight--;
            }
            if (how === "settle") lease.entry.tokens = actual;
          }
        } else {
          const asked = counters.filter(() => rng.chance(0.6));
          if (asked.length === 0) continue;
          const tokens = rng.chance(0.1) ? 0 : rng.int(rng.chance(0.2) ? 3000 : 300);
          const got = w.acquire(
            asked.map((c) => c.spec),
            tokens,
          );
          if (got instanceof Promise) fail("the in-memory windows answered asynchronously");
          const r = got as Exclude<typeof got, Promise<unknown>>;
          // The model: the first counter, in order, whose limit the request breaks.
          let refusal: { c: WCounter; kind: string; limit: number; current: number; retry: number } | undefined;
          for (const c of asked) {
            prune(c);
            const { rpm, tpm, parallel } = c.spec;
            const count = c.entries.length;
            const sum = c.entries.reduce((x, e) => x + e.tokens, 0);
            if (tpm !== undefined && tokens > tpm) {
              // Larger than the whole tpm: refused for that before any other limit (no wait makes it fit).
              refusal = { c, kind: "tokens", limit: tpm, current: sum, retry: WINDOW_MS };
            } else if (rpm !== undefined && count + 1 > rpm) {
              refusal = { c, kind: "requests", limit: rpm, current: count, retry: rpm === 0 ? WINDOW_MS : c.entries[count - rpm]!.t + WINDOW_MS - now };
            } else if (tpm !== undefined && sum + tokens > tpm) {
              let retry = WINDOW_MS;
              let freed = 0;
              for (const e of c.entries) {
                freed += e.tokens;
                if (sum - freed + tokens <= tpm) {
                  retry = e.t + WINDOW_MS - now;
                  break;
                }
              }
              refusal = { c, kind: "tokens", limit: tpm, current: sum, retry };
            } else if (parallel !== undefined && c.inFlight + 1 > parallel) {
              refusal = { c, kind: "parallel_requests", limit: parallel, current: c.inFlight, retry: 0 };
            }
            if (refusal) break;
          }
          log.push(`acquire ${tokens} on ${asked.map((c) => c.spec.label)} → ${refusal ? `${refusal.c.spec.label} ${refusal.kind} ${refusal.current}/${refusal.limit} retry ${refusal.retry}` : "granted"}`);
          if (refusal) {
            if (r.ok) fail(`granted, the model refuses: ${refusal.c.spec.label} ${refusal.kind} ${refusal.current}/${refusal.limit}`);
            const got = { label: r.counter.label, kind: r.kind, limit: r.limit, current: r.current, retry: r.retryAfterMs };
            const want = { label: refusal.c.spec.label, kind: refusal.kind, limit: refusal.limit, current: refusal.current, retry: refusal.retry };
            if (JSON.stringify(got) !== JSON.stringify(want)) fail(`refusal ${JSON.stringify(got)}, the model says ${JSON.stringify(want)}`);
            continue;
          }
          if (!r.ok) fail(`refused (${r.counter.label} ${r.kind} ${r.current}/${r.limit}), the model grants`);
          const grant = r as Extract<typeof r, { ok: true }>;
          const entry: WEntry = { t: now, tokens };
          for (const c of asked) {
            c.entries.push(entry);
            c.inFlight++;
          }
          const want = asked.map((c) => ({
            requests: c.spec.rpm === undefined ? undefined : c.spec.rpm - c.entries.length,
            tokens: c.spec.tpm === undefined ? undefined : c.spec.tpm - c.entries.reduce((x, e) => x + e.tokens, 0),
          }));
          if (JSON.stringify(grant.remaining) !== JSON.stringify(want)) fail(`remaining ${JSON.stringify(grant.remaining)}, the model says ${JSON.stringify(want)}`);
          live.push({
            counters: asked,
            entry,
            ended: [],
            end: (how, actual, from, to) => {
              const part = from === 0 && to === asked.length ? grant : grant.part(from, to);
              if (how === "settle") part.settle(actual);
              else part.cancel();
            },
          });
        }
      }
      // What is left: every counter as the model has it.
      for (const c of counters) {
        prune(c);
        const u = w.usage(c.spec.id);
        const want = { requests: c.entries.length, tokens: c.entries.reduce((x, e) => x + e.tokens, 0), inFlight: c.inFlight };
        if (JSON.stringify(u) !== JSON.stringify(want)) fail(`${c.spec.label} holds ${JSON.stringify(u)}, the model says ${JSON.stringify(want)}`);
      }
      expect(true).toBe(true);
    });
  }
});
