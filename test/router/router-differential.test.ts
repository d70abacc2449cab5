// The router against an independent model of it, seeded random (ROUTER_DIFF_SEED=<n> runs another
// set; every failure names the seed, the scenario and the request, with the scenario's settings and
// scripts). Each scenario is a random config: 2–4 model groups of 1–3 deployments, each deployment
// its own mock OpenAI upstream with a scripted sequence of answers (500, 502, 503, 504, 429 with and
// without `retry-after`, 400, 401, a context-window error, a content-policy refusal, a hang past
// the timeout, success) or an address where nothing listens (connection refused); random
// num_retries / max_retries, retry_policy, model_group_retry_policy, fallbacks,
// context_window_fallbacks, content_policy_fallbacks, default_fallbacks, max_fallbacks,
// allowed_fails, cooldown_time (long, or short with the test waiting cooldowns out before the next
// request), disable_cooldowns, timeouts (router, deployment, request) and routing strategy; a
// virtual key (sometimes in a team) with router_settings of its own (retries, fallback lists,
// max_fallbacks, strategy). Then random requests: JSON or streamed, with the master key or the
// virtual key, some with their own num_retries, fallbacks, context_window_fallback_dict or timeout,
// some through the openai SDK (its own retries off).
//
// The model follows the README's rules (retries per error class and source, fallbacks per kind of
// failure and source, cooldowns, the error mapping) and replays every request. The one thing it
// does not predict is which deployment a strategy picks among the candidates (a shuffle is random):
// it takes each attempt's deployment from the spend log (one row per attempt, `<call id>-<n>`) and
// checks that it was one the router could pick at that point (of the group being tried, not
// drained, not cooling down, one this call has not failed on yet when there is one, a weighted one
// under simple-shuffle when one is offered). Everything else is
// predicted and compared: the answer's status, error type, message and envelope
// ({"error": {"message", "type", "param", "code"}}, code the status as text), `retry-after`,
// `x-svc-model-id`, `x-svc-call-id`, `x-svc-attempted-retries`, `x-svc-attempted-fallbacks`, the
// answer's text, how many requests each mock received, the least time the call takes (timeouts
// and retry-after waits), and spend: failed attempts are failure rows costing 0, the answering
// attempt is the only one charged (what `x-svc-response-cost` says), a call refused before any
// deployment was asked is one failure row without a deployment, and the virtual key's spend is
// the sum of its answered calls.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI, { APIError } from "openai";
import { resetDeploymentStates } from "../../core/router/deployment-state.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { Random, queryString } from "../harness/random.ts";
import { until } from "../harness/util.ts";
import { CONTEXT_ERROR, closedPort, type Fault, type MockOpenAI, POLICY_ERROR, startMockOpenAI } from "../mock-upstream/openai.ts";

const SEED = Number(process.env.ROUTER_DIFF_SEED ?? 5_170_031);
const SCENARIOS = 24;
/** Mocks shared by the scenarios: the most deployments a scenario has (4 groups × 3). */
const POOL = 12;
/** Scenarios with short cooldowns: the test waits this long after the last failure before the next request. */
const SHORT_COOLDOWN_S = 0.6;

type Json = Record<string, unknown>;

// ---- what an upstream answers

type Step = "ok" | "500" | "502" | "503" | "504" | "429" | "429ra" | "400" | "401" | "ctx" | "policy" | "hang";
/** Steps and their weights; hangs and `retry-after` waits cost time, so they are rarer. */
const STEPS: [Step, number][] = [
  ["ok", 6],
  ["500", 3],
  ["502", 2],
  ["503", 2],
  ["504", 2],
  ["429", 2],
  ["429ra", 1],
  ["400", 1],
  ["401", 1],
  ["ctx", 2],
  ["policy", 2],
  ["hang", 1],
];
/** Short-cooldown scenarios keep every request well under the cooldown: no waits. */
const QUICK_STEPS = STEPS.filter(([s]) => s !== "hang" && s !== "429ra");


function faultOf(step: Step): Fault {
  switch (step) {
    case "ok":
      // A fault that answers normally, so that the faults after it keep their place.
      return { kind: "delay", ms: 0 };
    case "hang":
      return { kind: "hang" };
    case "ctx":
      return { kind: "status", status: 400, body: CONTEXT_ERROR };
    case "policy":
      return { kind: "status", status: 400, body: POLICY_ERROR };
    case "429ra":
      return { kind: "status", status: 429, headers: { "retry-after": "0.2" } };
    case "429":
      // The mock sends `retry-after: 1` with a 429 unless told otherwise; an empty value is none.
      return { kind: "status", status: 429, headers: { "retry-after": "" } };
    default:
      return { kind: "status", status: Number(step) };
  }
}

function weighted<T>(rng: Random, items: readonly [T, number][]): T {
  let r = rng.next() * items.reduce((s, [, w]) => s + w, 0);
  for (const [item, w] of items) {
    r -= w;
    if (r < 0) return item;
  }
  return items[items.length - 1]![0];
}

// ---- scenarios

interface DeploymentSpec {
  id: string;
  group: string;
  /** The pool mock it points at; undefined: an address where nothing listens. */
  mock?: number;
  /** What its upstream answers, in order (then success). */
  script: Step[];
  timeout?: number;
  weight?: number;
}

interface GroupSpec {
  name: string;
  deployments: DeploymentSpec[];
}

interface RequestSpec {
  group: string;
  /** Called with the scenario's virtual key (its and its team's router_settings apply), else the master key. */
  withKey: boolean;
  stream: boolean;
  numRetries?: number;
  fallbacks?: string[];
  contextWindowFallbacks?: Record<string, string>;
  timeout?: number;
  sdk: boolean;
  /** Unique per request: its spend-log rows are found by `end_user`. */
  user: string;
}

interface Scenario {
  index: number;
  /** Short cooldowns, waited out between requests; else cooldowns outlast the scenario. */
  short: boolean;
  groups: GroupSpec[];
  router: Json;
  /** The virtual key's router_settings and its team's (undefined: no team, or none set). */
  key?: Json;
  team?: Json;
  requests: RequestSpec[];
}

const RETRY_CLASSES = [
  "BadRequestErrorRetries",
  "AuthenticationErrorRetries",
  "TimeoutErrorRetries",
  "RateLimitErrorRetries",
  "InternalServerErrorRetries",
  "ContentPolicyViolationErrorRetries",
] as const;
const STRATEGIES = ["simple-shuffle", "simple-shuffle", "simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing-v2", "cost-based-routing"];

function retryPolicy(rng: Random, withMax: boolean): Json {
  const out: Json = {};
  for (const c of rng.some(RETRY_CLASSES, 3)) out[c] = rng.int(3);
  if (withMax && rng.chance(0.4)) out[rng.pick(["max_retries", "num_retries"])] = rng.int(3);
  return out;
}

function scenario(rng: Random, index: number): Scenario {
  const short = rng.chance(0.25);
  const steps = short ? QUICK_STEPS : STEPS;
  const groups: GroupSpec[] = [];
  let mock = 0;
  const groupCount = 2 + rng.int(3);
  for (let g = 0; g < groupCount; g++) {
    const name = `s${index}-g${g}`;
    const deployments: DeploymentSpec[] = [];
    const n = 1 + rng.int(3);
    for (let d = 0; d < n; d++) {
      const dead = rng.chance(0.12);
      const length = rng.int(7);
      deployments.push({
        id: `${name}-d${d}`,
        group: name,
        mock: dead ? undefined : mock++,
        script: dead ? [] : Array.from({ length }, () => weighted(rng, steps)),
        timeout: rng.maybe(0.3, [0.4, 0.5]),
        weight: rng.maybe(0.3, [1, 2, 5]),
      });
    }
    groups.push({ name, deployments });
  }
  const names = groups.map((g) => g.name);
  /** Another group's fallbacks: other groups, now and then itself or a group that does not exist. */
  const targets = (g: string) => {
    const pool = names.filter((n) => n !== g);
    if (rng.chance(0.15)) pool.push(g);
    if (rng.chance(0.15)) pool.push("no-such-group");
    return rng.some(pool, 3);
  };
  const fallbackList = (p: number) => {
    const list: Record<string, string[]>[] = [];
    for (const g of names) if (rng.chance(p)) list.push({ [g]: targets(g) });
    return list.length > 0 ? list : undefined;
  };
  const router: Json = {
    routing_strategy: rng.pick(STRATEGIES),
    retry_initial_delay: 0.01,
    retry_after: rng.maybe(0.3, [0, 0.02]),
    timeout: rng.pick([0.4, 0.5]),
    cooldown_time: short ? SHORT_COOLDOWN_S : rng.pick([30, 60]),
    allowed_fails: rng.maybe(0.8, [0, 1, 2, 3]),
    disable_cooldowns: rng.chance(0.1) ? true : undefined,
    fallbacks: fallbackList(0.5),
    context_window_fallbacks: fallbackList(0.35),
    content_policy_fallbacks: fallbackList(0.35),
    default_fallbacks: rng.chance(0.25) ? rng.some(names, 2) : undefined,
    max_fallbacks: rng.maybe(0.4, [0, 1, 2]),
  };
  const retries = (settings: Json, p: number) => {
    if (rng.chance(p)) settings[rng.pick(["num_retries", "num_retries", "max_retries"])] = rng.int(4);
    if (rng.chance(p / 2)) settings.retry_policy = retryPolicy(rng, false);
    if (rng.chance(p / 2)) settings.model_group_retry_policy = Object.fromEntries(rng.some(names, 2).map((g) => [g, retryPolicy(rng, true)]));
  };
  retries(router, 0.6);
  for (const [k, v] of Object.entries(router)) if (v === undefined) delete router[k];
  /** A key's or team's router_settings: some of the same settings, overriding the config's for its calls. */
  const override = (): Json => {
    const o: Json = {};
    retries(o, 0.4);
    if (rng.chance(0.3)) o.fallbacks = fallbackList(0.6);
    if (rng.chance(0.2)) o.context_window_fallbacks = fallbackList(0.6);
    if (rng.chance(0.2)) o.content_policy_fallbacks = fallbackList(0.6);
    if (rng.chance(0.15)) o.default_fallbacks = rng.some(names, 2);
    if (rng.chance(0.2)) o.max_fallbacks = rng.int(3);
    if (rng.chance(0.2)) o.routing_strategy = rng.pick(STRATEGIES);
    for (const [k, v] of Object.entries(o)) if (v === undefined) delete o[k];
    return o;
  };
  const team = rng.chance(0.4) ? override() : undefined;
  const key = team || rng.chance(0.6) ? override() : undefined;

  const requests: RequestSpec[] = [];
  const count = 6 + rng.int(6);
  for (let r = 0; r < count; r++) {
    const group = rng.pick(names);
    requests.push({
      group,
      withKey: key !== undefined && rng.chance(0.5),
      stream: rng.chance(0.25),
      numRetries: rng.maybe(0.25, [0, 1, 2]),
      fallbacks: rng.chance(0.15) ? targets(group) : undefined,
      contextWindowFallbacks: rng.chance(0.3) ? { [group]: rng.pick(names) } : undefined,
      timeout: rng.maybe(0.1, [0.3]),
      sdk: rng.chance(0.25),
      user: `router-diff-${SEED}-${index}-${r}`,
    });
  }
  return { index, short, groups, router, key, team, requests };
}

// ---- the model

/** An error as the model expects the client to see it. */
interface ExpectedError {
  /** What caused it: the upstream's answer, "refused" or "cooling". */
  cause: string;
  status: number;
  type: string;
  /** Text the message must contain. */
  message: string;
  /** The deployment whose error it is (none for "every deployment is cooling down"). */
  deployment?: string;
  /** `retry-after` as the upstream sent it; "cooldown" for a number of seconds up to the cooldown. */
  retryAfter?: string;
  /** Context-window or content-policy refusal: the fallbacks of that kind apply, never retried. */
  kind?: "context_window" | "content_policy";
}

interface Prediction {
  /** The deployment that answered, or the error. */
  answer: { ok: string } | { error: ExpectedError };
  retries: number;
  fallbacks: number;
  /** The most fallbacks the call may take. */
  maxFallbacks: number;
  /** The least time the call takes: timeouts waited out and the waits before retries (`retry_after`, the upstream's `retry-after`). */
  minMs: number;
  /** Attempts per deployment id. */
  attempts: Map<string, number>;
}

class Mismatch extends Error {}

const RETRYABLE = new Set([408, 429, 500, 502, 503, 504]);
/** README: failures (401, 404, 408, 429, 5xx) count toward a cooldown. */
const COUNTS_FOR_COOLDOWN = (status: number) => [401, 404, 408, 429].includes(status) || status >= 500;

/** README's retry classes: by the status the gateway answers with (an upstream's 504, answered as 503, is a timeout), or the refusal's kind. */
function retryClass(status: number, kind: string | undefined): (typeof RETRY_CLASSES)[number] | undefined {
  if (kind) return kind === "content_policy" ? "ContentPolicyViolationErrorRetries" : undefined;
  if (status === 400 || status === 422) return "BadRequestErrorRetries";
  if (status === 401 || status === 403) return "AuthenticationErrorRetries";
  if (status === 408 || status === 504) return "TimeoutErrorRetries";
  if (status === 429) return "RateLimitErrorRetries";
  if (status >= 500) return "InternalServerErrorRetries";
  return undefined;
}

class Model {
  private readonly pos = new Map<string, number>();
  private readonly failures = new Map<string, number>();
  private readonly cooling = new Set<string>();
  private readonly byName: Map<string, GroupSpec>;

  constructor(private readonly sc: Scenario) {
    this.byName = new Map(sc.groups.map((g) => [g.name, g]));
  }

  get anyCooling(): boolean {
    return this.cooling.size > 0;
  }

  /** Short-cooldown scenarios: the test waited the cooldowns out. */
  cooldownsOver(): void {
    this.cooling.clear();
  }

  private num(v: unknown): number | undefined {
    return typeof v === "number" ? v : undefined;
  }

  /** The router_settings that apply to `req`, most specific first: its key's, its team's, the config's. */
  private settings(req: RequestSpec): Json[] {
    const out: Json[] = [];
    if (req.withKey && this.sc.key) out.push(this.sc.key);
    if (req.withKey && this.sc.team) out.push(this.sc.team);
    out.push(this.sc.router);
    return out;
  }

  /** Retries for a failure with `status` in `group`: README's most specific source (request, key, team, config), then within it group policy, retry_policy, num_retries. */
  private retries(req: RequestSpec, group: string, status: number, kind: string | undefined): { max: number; forced: boolean } {
    const sources: Json[] = [...(req.numRetries !== undefined ? [{ num_retries: req.numRetries }] : []), ...this.settings(req)];
    const cls = retryClass(status, kind);
    for (const s of sources) {
      const forGroup = (s.model_group_retry_policy as Record<string, Json> | undefined)?.[group];
      if (forGroup) {
        const n = cls ? this.num(forGroup[cls]) : undefined;
        if (n !== undefined) return { max: n, forced: true };
        const max = this.num(forGroup.max_retries) ?? this.num(forGroup.num_retries);
        if (max !== undefined) return { max, forced: false };
      }
      const policy = s.retry_policy as Json | undefined;
      const n = policy && cls ? this.num(policy[cls]) : undefined;
      if (n !== undefined) return { max: n, forced: true };
      const plain = this.num(s.num_retries) ?? this.num(s.max_retries);
      if (plain !== undefined) return { max: plain, forced: false };
    }
    return { max: 0, forced: false };
  }

  private timeoutOf(req: RequestSpec, d: DeploymentSpec): number {
    return req.timeout ?? d.timeout ?? (this.sc.router.timeout as number);
  }

  /** What one attempt at `d` answers: undefined for success. */
  private answer(req: RequestSpec, d: DeploymentSpec): ExpectedError | undefined {
    if (d.mock === undefined) return { cause: "refused", status: 503, type: "api_connection_error", message: `could not connect to openai for model ${d.group}`, deployment: d.id };
    const i = this.pos.get(d.id) ?? 0;
    this.pos.set(d.id, i + 1);
    const step = d.script[i] ?? "ok";
    const said = (status: number) => `openai returned ${status} for model ${d.group}`;
    switch (step) {
      case "ok":
        return undefined;
      case "500":
        return { cause: step, status: 500, type: "internal_server_error", message: said(500), deployment: d.id };
      case "502":
      case "503":
      case "504":
        return { cause: step, status: 503, type: "api_connection_error", message: said(Number(step)), deployment: d.id };
      case "429":
        return { cause: step, status: 429, type: "rate_limit_error", message: said(429), deployment: d.id };
      case "429ra":
        return { cause: step, status: 429, type: "rate_limit_error", message: said(429), deployment: d.id, retryAfter: "0.2" };
      case "400":
        return { cause: step, status: 400, type: "invalid_request_error", message: said(400), deployment: d.id };
      case "401":
        return { cause: step, status: 401, type: "authentication_error", message: said(401), deployment: d.id };
      case "ctx":
        return { cause: step, status: 400, type: "context_window_exceeded", message: "maximum context length", deployment: d.id, kind: "context_window" };
      case "policy":
        return { cause: step, status: 400, type: "content_policy_violation", message: "safety system", deployment: d.id, kind: "content_policy" };
      case "hang":
        return { cause: step, status: 408, type: "timeout_error", message: `did not answer for model ${d.group} within ${this.timeoutOf(req, d)}s`, deployment: d.id };
    }
  }

  /** README: a deployment that says `weight: 0` is drained (no call goes to it), unless all do. */
  private inRotation(_req: RequestSpec, g: GroupSpec): DeploymentSpec[] {
    const kept = g.deployments.filter((d) => d.weight !== 0);
    return kept.length > 0 ? kept : g.deployments;
  }

  /**
   * README: simple-shuffle draws by `weight` (the only field the scenarios set), one without it
   * weighing 0: such a one takes a call only when no weighted one is offered.
   */
  private pickable(req: RequestSpec, list: readonly DeploymentSpec[]): readonly DeploymentSpec[] {
    const strategy = this.settings(req).map((s) => s.routing_strategy).find((v) => v !== undefined) ?? "simple-shuffle";
    const weighted = list.filter((d) => (d.weight ?? 0) > 0);
    return strategy === "simple-shuffle" && weighted.length > 0 ? weighted : list;
  }

  /** README: more than allowed_fails failures, or one upstream 429, cool a deployment down; never a group's only one (drained ones do not count). */
  private failed(serving: readonly DeploymentSpec[], d: DeploymentSpec, e: ExpectedError): void {
    if (e.kind || !COUNTS_FOR_COOLDOWN(e.status) || serving.length === 1 || this.sc.router.disable_cooldowns === true) return;
    const n = (this.failures.get(d.id) ?? 0) + 1;
    const allowed = this.num(this.sc.router.allowed_fails) ?? 3;
    if (e.status === 429 || n > allowed) {
      this.cooling.add(d.id);
      this.failures.set(d.id, 0);
    } else this.failures.set(d.id, n);
  }

  /** Replays one request whose attempts went to `observed` (deployment ids, in order). */
  run(req: RequestSpec, observed: readonly string[]): Prediction {
    const sources = this.settings(req);
    const maxFallbacks = sources.map((s) => this.num(s.max_fallbacks)).find((v) => v !== undefined) ?? 5;
    const retryAfterMs = (sources.map((s) => this.num(s.retry_after)).find((v) => v !== undefined) ?? 0) * 1000;
    const out: Prediction = { answer: { ok: "" }, retries: 0, fallbacks: 0, maxFallbacks, minMs: 0, attempts: new Map() };
    let next = 0;
    const coolingDown = (g: GroupSpec): ExpectedError => ({
      cause: "cooling",
      status: 429,
      type: "rate_limit_error",
      message: `No deployments available for model ${g.name}: all ${this.inRotation(req, g).length} are cooling down`,
      retryAfter: "cooldown",
    });
    type GroupResult = { ok: string } | { final: ExpectedError } | { failed: ExpectedError };
    const callGroup = (g: GroupSpec): GroupResult => {
      const failedHere = new Set<string>();
      let retriesHere = 0;
      const serving = this.inRotation(req, g);
      const candidates = (): DeploymentSpec[] => {
        if (serving.length === 1) return serving;
        const live = serving.filter((d) => !this.cooling.has(d.id));
        const fresh = live.filter((d) => !failedHere.has(d.id));
        return fresh.length > 0 ? fresh : live;
      };
      let list = candidates();
      if (list.length === 0) return { failed: coolingDown(g) };
      for (;;) {
        const id = observed[next];
        const allowed = this.pickable(req, list).map((d) => d.id).join(", ");
        if (id === undefined) throw new Mismatch(`attempt ${next}: the model expects another attempt in ${g.name} (at one of ${allowed}); the spend log has no more`);
        const d = this.pickable(req, list).find((x) => x.id === id);
        if (!d) throw new Mismatch(`attempt ${next} went to ${id}; the router could pick only ${allowed} (group ${g.name}, cooling down: ${[...this.cooling].join(", ") || "none"})`);
        next++;
        out.attempts.set(d.id, (out.attempts.get(d.id) ?? 0) + 1);
        const e = this.answer(req, d);
        if (!e) return { ok: d.id };
        if (e.status === 408) out.minMs += this.timeoutOf(req, d) * 1000;
        this.failed(serving, d, e);
        failedHere.add(d.id);
        const policy = this.retries(req, g.name, e.cause === "504" ? 504 : e.status, e.kind);
        const retryable = e.kind ? policy.forced : RETRYABLE.has(e.status) || policy.forced;
        list = candidates();
        // README: a deployment this call has not failed on is asked after retry_after only; the upstream's retry-after binds a retry going back to the deployment that said it (else at most 8 s); a retry that must wait longer than the timeout is not made.
        const upstreamWait = e.retryAfter ? Number(e.retryAfter) * 1000 : 0;
        const sameAgain = list.length > 0 && list.every((x) => x.id === d.id);
        const untried = list.length > 0 && list.every((x) => !failedHere.has(x.id));
        const required = untried ? retryAfterMs : Math.max(retryAfterMs, sameAgain ? upstreamWait : Math.min(8000, upstreamWait));
        if (!retryable || retriesHere >= policy.max || required > this.timeoutOf(req, d) * 1000) {
          // README: a 400 or 422 from the upstream (not context window or content policy) goes back as is.
          if (!e.kind && (e.status === 400 || e.status === 422)) return { final: e };
          return { failed: e };
        }
        out.minMs += required;
        // A retry left without a deployment is not made, nor counted.
        if (list.length === 0) return { failed: coolingDown(g) };
        retriesHere++;
        out.retries++;
      }
    };

    const asked = this.byName.get(req.group)!;
    /** A group's list in the most specific settings that have one. */
    const configured = (setting: string, group: string): string[] => {
      for (const s of sources) for (const item of (s[setting] as Record<string, string[]>[] | undefined) ?? []) if (item[group]?.length) return item[group]!;
      return [];
    };
    const defaults = (): string[] => (sources.map((s) => s.default_fallbacks).find((v) => Array.isArray(v)) as string[] | undefined) ?? [];
    const queueOf = (group: string, failure: ExpectedError): string[] => {
      const general = () => (req.fallbacks?.length ? req.fallbacks : configured("fallbacks", group).length > 0 ? configured("fallbacks", group) : defaults());
      if (failure.kind === "context_window") {
        const fromRequest = req.contextWindowFallbacks?.[group];
        return fromRequest ? [fromRequest] : configured("context_window_fallbacks", group).length > 0 ? configured("context_window_fallbacks", group) : general();
      }
      if (failure.kind === "content_policy") return configured("content_policy_fallbacks", group).length > 0 ? configured("content_policy_fallbacks", group) : general();
      return general();
    };
    const tried = new Set([asked.name]);
    // README: depth first, each group once per call, at most max_fallbacks fallback groups.
    const fallBack = (group: string, failure: ExpectedError): GroupResult => {
      let last: GroupResult = { failed: failure };
      for (const name of queueOf(group, failure)) {
        if (out.fallbacks >= maxFallbacks) break;
        if (tried.has(name)) continue;
        tried.add(name);
        const g = this.byName.get(name);
        if (!g) continue;
        out.fallbacks++;
        const res = callGroup(g);
        if (!("failed" in res)) return res;
        last = fallBack(name, res.failed);
        if (!("failed" in last)) return last;
      }
      return last;
    };
    const first = callGroup(asked);
    const result = "failed" in first ? fallBack(asked.name, first.failed) : first;
    out.answer = "ok" in result ? { ok: result.ok } : { error: "final" in result ? result.final : result.failed };
    if (next !== observed.length) throw new Mismatch(`the model expects ${next} attempts; the spend log has ${observed.length} (${observed.join(", ")})`);
    return out;
  }
}

// ---- the test

/** What the client saw. */
interface Seen {
  status: number;
  headers: Headers;
  /** The error body, or the answer. */
  body: Json;
}

interface LogRow {
  call_id: string;
  model_id: string;
  model_group: string;
  status: string;
  spend: number;
  end_user: string;
}

const DAY = 86_400_000;
const day = (ms: number) => new Date(ms).toISOString().slice(0, 10);

describe(`the router against its model (seed ${SEED})`, () => {
  let gw: TestGateway;
  let client: OpenAI;
  /** The scenario's virtual key, when it has one. */
  let keyClient: OpenAI | undefined;
  let key: string | undefined;
  const mocks: MockOpenAI[] = [];
  let deadBase = "";

  beforeAll(async () => {
    mocks.push(...(await Promise.all(Array.from({ length: POOL }, () => startMockOpenAI()))));
    deadBase = `http://127.0.0.1:${await closedPort()}/v1`;
    gw = await startBackendGateway("postgres", { model_list: [], general_settings: { master_key: MASTER_KEY } }, { dbPrefix: "gw_router_diff", spend: { intervalMs: 50 } });
    client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL, maxRetries: 0 });
    // Hooks name their timeout: bun gives the preload's default to the first file's hooks only.
  }, 30_000);
  afterAll(async () => {
    await gw?.stop();
    await Promise.all(mocks.map((m) => m.stop()));
  }, 30_000);

  async function load(sc: Scenario): Promise<void> {
    const model_list = sc.groups.flatMap((g) =>
      g.deployments.map((d) => ({
        model_name: g.name,
        svc_params: {
          model: "openai/gpt-4o-mini",
          api_base: d.mock === undefined ? deadBase : mocks[d.mock]!.url,
          api_key: "sk-up",
          ...(d.timeout === undefined ? {} : { timeout: d.timeout }),
          ...(d.weight === undefined ? {} : { weight: d.weight }),
        },
        model_info: { id: d.id },
      })),
    );
    gw.writeConfig({ model_list, router_settings: sc.router, general_settings: { master_key: MASTER_KEY } });
    const reloaded = await gw.live.reload("router differential scenario", true);
    expect(reloaded.ok, `seed ${SEED}, scenario ${sc.index}: config reload ${JSON.stringify(reloaded)}`).toBe(true);
    resetDeploymentStates();
    for (const m of mocks) m.reset();
    for (const g of sc.groups) for (const d of g.deployments) if (d.mock !== undefined) mocks[d.mock]!.fault(...d.script.map(faultOf));
    key = undefined;
    keyClient = undefined;
    if (sc.key) {
      let teamId: string | undefined;
      if (sc.team) {
        const made = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: `router-diff-${SEED}-${sc.index}`, router_settings: sc.team } });
        expect(made.status, `seed ${SEED}, scenario ${sc.index}: /team/new ${made.text}`).toBe(200);
        teamId = made.body.team_id;
      }
      const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: teamId, router_settings: sc.key } });
      expect(made.status, `seed ${SEED}, scenario ${sc.index}: /key/generate ${made.text}`).toBe(200);
      key = made.body.key;
      keyClient = new OpenAI({ apiKey: key, baseURL: gw.baseURL, maxRetries: 0 });
    }
  }

  function bodyOf(req: RequestSpec, i: number): Json {
    const body: Json = { model: req.group, messages: [{ role: "user", content: `hello number ${i}` }], user: req.user };
    if (req.numRetries !== undefined) body.num_retries = req.numRetries;
    if (req.fallbacks) body.fallbacks = req.fallbacks;
    if (req.contextWindowFallbacks) body.context_window_fallback_dict = req.contextWindowFallbacks;
    if (req.timeout !== undefined) body.timeout = req.timeout;
    if (req.stream) body.stream = true;
    return body;
  }

  /** The answer's text: the message, or a stream's deltas joined. */
  async function send(req: RequestSpec, i: number): Promise<Seen & { content?: string }> {
    const body = bodyOf(req, i);
    if (req.sdk) {
      const sdk = req.withKey ? keyClient! : client;
      try {
        if (req.stream) {
          const { data, response } = await sdk.chat.completions.create({ ...(body as unknown as OpenAI.ChatCompletionCreateParamsStreaming), stream: true }).withResponse();
          let content = "";
          for await (const chunk of data) content += chunk.choices[0]?.delta?.content ?? "";
          return { status: response.status, headers: response.headers, body: {}, content };
        }
        const { data, response } = await sdk.chat.completions.create(body as never).withResponse();
        return { status: response.status, headers: response.headers, body: data as unknown as Json, content: data.choices[0]?.message.content ?? undefined };
      } catch (err) {
        if (!(err instanceof APIError) || err.status === undefined) throw err;
        return { status: err.status, headers: err.headers as Headers, body: { error: err.error } };
      }
    }
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${req.withKey ? key! : MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status === 200 && req.stream) {
      let content = "";
      for (const line of text.split("\n")) {
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6)) as { choices?: { delta?: { content?: string } }[] };
        content += chunk.choices?.[0]?.delta?.content ?? "";
      }
      return { status: res.status, headers: res.headers, body: {}, content };
    }
    const parsed = JSON.parse(text) as Json;
    const choices = parsed.choices as { message?: { content?: string } }[] | undefined;
    return { status: res.status, headers: res.headers, body: parsed, content: choices?.[0]?.message?.content };
  }

  async function logRows(user: string): Promise<LogRow[]> {
    await gw.host!.spendWriter.flush();
    const path = `/spend/logs/v2?${queryString({ start_date: day(Date.now() - DAY), end_date: day(Date.now() + DAY), end_user: user, page_size: 100 })}`;
    let rows: LogRow[] = [];
    await until(async () => {
      const r = await requestJson<{ data: LogRow[] }>(gw, "GET", path);
      expect(r.status).toBe(200);
      rows = r.body.data;
      return rows.length > 0;
    });
    const n = (id: string) => Number(/^[0-9a-f-]{36}-(\d+)$/.exec(id)?.[1] ?? 0);
    return rows.sort((a, b) => n(a.call_id) - n(b.call_id));
  }

  const rng = new Random(SEED);
  const scenarios = Array.from({ length: SCENARIOS }, (_, i) => scenario(rng, i));
  const totals = { requests: 0, answered: 0, errors: new Map<string, number>(), fellBack: 0, retried: 0, refused: 0, sdk: 0 };

  for (const sc of scenarios) {
    test(`scenario ${sc.index}: ${sc.groups.map((g) => `${g.name}×${g.deployments.length}`).join(" ")}${sc.short ? ", short cooldowns" : ""}`, async () => {
      await load(sc);
      const model = new Model(sc);
      /** What the key's calls were charged, by the spend log. */
      let keySpend = 0;
      for (const [i, req] of sc.requests.entries()) {
        if (sc.short && model.anyCooling) {
          await Bun.sleep(SHORT_COOLDOWN_S * 1000 + 150);
          model.cooldownsOver();
        }
        const where = `seed ${SEED}, scenario ${sc.index}, request ${i} (${JSON.stringify(req)}; router_settings ${JSON.stringify(sc.router)}; key ${JSON.stringify(sc.key)}, team ${JSON.stringify(sc.team)}; scripts ${JSON.stringify(sc.groups.flatMap((g) => g.deployments.map((d) => [d.id, d.mock === undefined ? "refused" : d.script])))})`;
        const before = mocks.map((m) => m.requests.length);
        const t0 = performance.now();
        const seen = await send(req, i);
        const elapsed = performance.now() - t0;
        const rows = await logRows(req.user);
        const attemptRows = rows.filter((r) => r.model_id !== "");
        let p: Prediction;
        try {
          p = model.run(req, attemptRows.map((r) => r.model_id));
        } catch (err) {
          if (!(err instanceof Mismatch)) throw err;
          throw new Error(`${where}: ${err.message}; the client saw ${seen.status} ${JSON.stringify(seen.body).slice(0, 300)}`);
        }

        // Every attempt is logged against a deployment of the group it belongs to.
        for (const r of attemptRows) expect(r.model_group, where).toBe(r.model_id.replace(/-d\d+$/, ""));
        // Each mock received exactly the attempts the model made at its deployment.
        const received: Record<string, number> = {};
        const predicted: Record<string, number> = {};
        for (const g of sc.groups)
          for (const d of g.deployments) {
            if (d.mock === undefined) continue;
            received[d.id] = mocks[d.mock]!.requests.length - before[d.mock]!;
            predicted[d.id] = p.attempts.get(d.id) ?? 0;
          }
        expect(received, where).toEqual(predicted);
        expect(p.fallbacks, where).toBeLessThanOrEqual(p.maxFallbacks);
        // Timeouts are waited out, and retries wait at least retry_after and the upstream's retry-after.
        expect(elapsed, where).toBeGreaterThanOrEqual(p.minMs - 5);

        const answer = p.answer;
        const seenModel = seen.headers.get("x-svc-model-id");
        expect({ retries: seen.headers.get("x-svc-attempted-retries"), fallbacks: seen.headers.get("x-svc-attempted-fallbacks") }, where).toEqual({
          retries: String(p.retries),
          fallbacks: String(p.fallbacks),
        });
        totals.requests++;
        if (req.sdk) totals.sdk++;
        if (p.fallbacks > 0) totals.fellBack++;
        if (p.retries > 0) totals.retried++;
        const callId = seen.headers.get("x-svc-call-id");
        if ("ok" in answer) {
          totals.answered++;
          expect({ status: seen.status, model: seenModel, group: seen.headers.get("x-svc-model-group") }, where).toEqual({
            status: 200,
            model: answer.ok,
            group: answer.ok.replace(/-d\d+$/, ""),
          });
          expect(seen.content, where).toBe(`Mock reply to: hello number ${i}`);
          // Only the answering attempt is charged (a JSON answer says what it cost).
          const last = rows[rows.length - 1]!;
          expect({ call: last.call_id, model: last.model_id, status: last.status }, where).toEqual({ call: callId!, model: answer.ok, status: "success" });
          expect(last.spend, where).toBeGreaterThan(0);
          if (!req.stream) expect(last.spend, where).toBeCloseTo(Number(seen.headers.get("x-svc-response-cost")), 12);
          if (req.withKey) keySpend += last.spend;
          for (const r of rows.slice(0, -1)) expect({ status: r.status, spend: r.spend }, where).toEqual({ status: "failure", spend: 0 });
        } else {
          const e = answer.error;
          totals.errors.set(e.cause, (totals.errors.get(e.cause) ?? 0) + 1);
          // The spec's envelope, exactly.
          const error = seen.body.error as Json;
          expect(Object.keys(seen.body), where).toEqual(["error"]);
          expect(Object.keys(error).sort(), where).toEqual(["code", "message", "param", "type"]);
          expect({ status: seen.status, type: error.type, code: error.code, model: seenModel }, where).toEqual({
            status: e.status,
            type: e.type,
            code: String(e.status),
            model: e.deployment ?? null,
          });
          expect(String(error.message), where).toContain(e.message);
          const retryAfter = seen.headers.get("retry-after");
          if (e.retryAfter === "cooldown") {
            const cooldown = sc.router.cooldown_time as number;
            expect(Number(retryAfter), where).toBeGreaterThanOrEqual(1);
            expect(Number(retryAfter), where).toBeLessThanOrEqual(Math.ceil(cooldown));
          } else expect(retryAfter, where).toBe(e.retryAfter ?? null);
          // Failed attempts cost nothing; a call refused before any deployment was asked is one failure row without one.
          for (const r of rows) expect({ status: r.status, spend: r.spend }, where).toEqual({ status: "failure", spend: 0 });
          if (attemptRows.length === 0) {
            totals.refused++;
            expect(rows.length, where).toBe(1);
            expect(callId, where).toBe(rows[0]!.call_id);
          } else if (e.deployment) {
            // The error is the last attempt's: its call id.
            expect(callId, where).toBe(rows[rows.length - 1]!.call_id);
          }
        }
      }
      if (key) {
        // The key is charged for its answered calls only.
        await gw.host!.spendWriter.flush();
        const info = await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${key}`);
        expect(info.body.info.spend, `seed ${SEED}, scenario ${sc.index}: the key's spend`).toBeCloseTo(keySpend, 12);
      }
    }, 60_000);
  }

  test("the seed covered the cases", () => {
    // A seed that exercised little would pass without checking much.
    expect(totals.requests, `seed ${SEED}`).toBeGreaterThan(50);
    expect(totals.answered, `seed ${SEED}`).toBeGreaterThan(5);
    expect(totals.errors.size, `seed ${SEED}: the errors' causes ${JSON.stringify([...totals.errors])}`).toBeGreaterThanOrEqual(6);
    expect(totals.fellBack, `seed ${SEED}`).toBeGreaterThan(0);
    expect(totals.retried, `seed ${SEED}`).toBeGreaterThan(0);
    expect(totals.sdk, `seed ${SEED}`).toBeGreaterThan(0);
  });
});
