// Clients that leave mid-call, with money and limits on, seeded random (LEAVES_DIFF_SEED=<n> runs
// another set, LEAVES_DIFF_ROUNDS=<n> more or fewer rounds per mode; every failure names the seed
// and the round). Modes: the embedded store, PostgreSQL, and the embedded store with Redis holding
// the windows and the budget ledger (skipped when no Redis answers at REDIS_URL). Each round makes
// a virtual key with a `max_budget`, `max_parallel_requests`, `rpm_limit` and `tpm_limit`,
// sometimes in a team with its own limits (rpm and tpm looser, the same parallel limit or a looser one) and budget, and fires a burst of random chat
// calls at once (JSON and streams, `max_tokens` set, sometimes to a few tokens) through three
// providers' wire mocks (OpenAI-compatible, Anthropic, Gemini), each behind a small proxy here that
// paces a stream's events, injects the faults and sees whether the gateway's upstream request was
// aborted. Some calls run to the end; in others the client leaves: before the answer's headers
// (the upstream hangs), before the model's first event (the upstream answered, its first event is
// slow; a JSON answer stalls half-way), once the gateway's waiting comment sent the headers, after the first chunk, mid-stream,
// right after [DONE], or while the gateway waits to retry an upstream 500; some meet an upstream
// fault (a 500, retried or not, a stream cut mid-way). Some are refused (the parallel limit under
// the burst, the budget). Checked against README ("Spend log", "Budgets", "Rate limits", "Routing",
// "Errors", the stream notes of "How it works"):
// - every call is exactly one spend-log row, and each failed attempt one more (found by the `user`
//   it sent; its `call_id` is the `x-svc-call-id` the client saw, where it saw one, a retry's
//   `<id>-1`) and the key has no other row: a finished call `success` with the usage the client
//   got and the cost of `x-svc-response-cost`; a client that left `cancelled` with no error,
//   charged its prompt alone before the model's first event (as a JSON call before its answer:
//   the upstream had the request), else charged for what it streamed (its tokens at the
//   deployment's prices, its prompt, an answer token at least once it got a chunk, never more
//   than `max_tokens`); a client that left during a retry's backoff: the
//   failed attempt's row, and no retry; a refusal or an upstream fault a `failure` at 0 (a
//   refusal with no deployment);
// - the key's and the team's stored spend equal the exact sum of their rows (decimal text, bigint
//   pico-dollars), and with `max_tokens` set never pass their `max_budget`;
// - the upstream request of every client that left is aborted (the proxy sees it go);
// - no parallel slot is left behind: with the budget raised, `max_parallel_requests` streams run
//   at once again, one more call is a 429 naming the parallel limit, and once those clients leave
//   as many calls run at once again;
// - the rate windows hold exactly what README says: a final call's `x-ratelimit-remaining-requests`
//   counts every call that was not refused (refusals consume nothing), and
//   `x-ratelimit-remaining-tokens` the tokens of every row plus the final call's reservation;
// - no answer is a 500 but the upstream 500's own, and the gateway logs no error.
// On PostgreSQL, also a call refused after its client left (a budget that just appeared waits for
// the row's stored spend, held here by a lock on the key's row): still a row, the refusal's.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import postgres from "postgres";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { Random } from "../harness/random.ts";
import { scaledExact } from "../harness/spend.ts";
import { redisReachable, sha256, until } from "../harness/util.ts";
import { type MockAnthropic, startMockAnthropic } from "../mock-upstream/anthropic.ts";
import { type MockGemini, startMockGemini } from "../mock-upstream/gemini.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";
import { TEST_REDIS_URL } from "../harness/redis.ts";

const SEED = Number(process.env.LEAVES_DIFF_SEED ?? 20_261_127);
const ROUNDS = Number(process.env.LEAVES_DIFF_ROUNDS ?? 3);
const seedNote = `(LEAVES_DIFF_SEED=${SEED})`;
const REDIS_URL = process.env.REDIS_URL ?? TEST_REDIS_URL;
/** Redis outlives a run: names of this run's keys, teams and calls are its own. */
const RUN = `${process.pid.toString(36)}${Date.now().toString(36)}`;
/** Prices in pico-dollars per token (integers, so every cost is known exactly). */
const IN_PICO = 123_457n;
const OUT_PICO = 987_653n;
const PRICES = { input_cost_per_token: Number(IN_PICO) / 1e12, output_cost_per_token: Number(OUT_PICO) / 1e12 };
const MAX_TOKENS = 64;
/** A paced stream's gap between events (the upstream still has more to say when the client leaves). */
const PACE_MS = 40;
/** Slow first token: longer than the gateway's 1 s before its waiting comment sends the headers. */
const SLOW_FIRST_MS = 1400;
const UPSTREAM_KEYS = { openai: "sk-up-openai", anthropic: "sk-ant-up", gemini: "AIza-up" };

type Json = Record<string, unknown>;
const enc = new TextEncoder();
const PICO = 10n ** 12n;
const usd = (p: bigint) => {
  const frac = (p % PICO).toString().padStart(12, "0").replace(/0+$/, "");
  return frac ? `${p / PICO}.${frac}` : `${p / PICO}`;
};
const pico = (text: string) => scaledExact(text, 12);
const costOf = (prompt: number, completion: number) => IN_PICO * BigInt(prompt) + OUT_PICO * BigInt(completion);

// ---------------------------------------------------------------------------------------------
// The upstream as the gateway sees it: a proxy in front of each mock that paces a stream's events
// as a plan says and notes whether the gateway's request ended early.

interface Plan {
  /** Before the first event. */
  firstMs: number;
  /** Between events. */
  paceMs: number;
  /** `hang`: no answer until the gateway leaves; `500`: the provider's 500; a number: the connection is reset after that many events. */
  fault?: "hang" | "500" | number;
}

/** Each provider's own body for a 500. */
const ERROR_500: Record<string, Json> = {
  openai: { error: { message: "The server had an error while processing your request.", type: "server_error", param: null, code: null } },
  anthropic: { type: "error", error: { type: "api_error", message: "Internal server error" } },
  gemini: { error: { code: 500, message: "An internal error has occurred.", status: "INTERNAL" } },
};

interface Seen {
  /** Requests the gateway sent for the call. */
  requests: number;
  /** The gateway's request closed (or aborted) before the proxy's answer ended. */
  aborted: boolean;
  /** The whole answer went to the gateway. */
  finished: boolean;
}

class PacingProxy {
  readonly seen = new Map<string, Seen>();
  readonly plans = new Map<string, Plan>();
  private server!: ReturnType<typeof Bun.serve>;

  constructor(
    private readonly target: string,
    private readonly provider: string,
  ) {}

  get origin(): string {
    return `http://127.0.0.1:${this.server.port}`;
  }

  start(): void {
    this.server = Bun.serve({ hostname: "127.0.0.1", port: 0, idleTimeout: 0, fetch: (req) => this.handle(req) });
  }

  private async handle(req: Request): Promise<Response> {
    const url = new URL(req.url);
    const body = await req.text();
    const marker = /leave-[a-z0-9-]+/.exec(body)?.[0] ?? "";
    const requests = (this.seen.get(marker)?.requests ?? 0) + 1;
    const seen: Seen = { requests, aborted: false, finished: false };
    if (marker) this.seen.set(marker, seen);
    const planned = this.plans.get(marker) ?? { firstMs: 0, paceMs: 0 };
    // A fault meets the call's first request only (a retry gets the answer).
    const plan = requests === 1 ? planned : { ...planned, fault: undefined };
    req.signal.addEventListener("abort", () => {
      if (!seen.finished) seen.aborted = true;
    });
    if (plan.fault === "hang") {
      await new Promise((resolve) => req.signal.addEventListener("abort", resolve, { once: true }));
      return new Response(null, { status: 499 });
    }
    if (plan.fault === "500") {
      seen.finished = true;
      return Response.json(ERROR_500[this.provider], { status: 500 });
    }
    const cutAfter = typeof plan.fault === "number" ? plan.fault : undefined;
    const headers = new Headers(req.headers);
    headers.delete("host");
    headers.delete("content-length");
    let upstream: Response;
    try {
      upstream = await fetch(`${this.target}${url.pathname}${url.search}`, { method: req.method, headers, body, signal: req.signal });
    } catch {
      seen.aborted = true;
      return new Response(null, { status: 499 });
    }
    const out = new Headers(upstream.headers);
    out.delete("content-length");
    out.delete("content-encoding");
    out.delete("transfer-encoding");
    const streaming = (upstream.headers.get("content-type") ?? "").includes("event-stream");
    const reader = upstream.body!.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    const events: string[] = [];
    let sent = 0;
    let upstreamDone = false;
    let greeted = false;
    // One event per pull: a gateway that stops reading shows up as `cancel`, one whose upstream
    // was cut sees its connection reset.
    const paced = new ReadableStream<Uint8Array>(
      {
        pull: async (controller) => {
          if (cutAfter !== undefined && sent >= cutAfter) {
            // Reset right behind the last write would lose it (Bun corks writes).
            await Bun.sleep(10);
            seen.finished = true;
            controller.error(undefined);
            return;
          }
          while (events.length === 0 && !upstreamDone) {
            let r: Awaited<ReturnType<typeof reader.read>>;
            try {
              r = await reader.read();
            } catch {
              await Bun.sleep(10);
              controller.error(undefined);
              return;
            }
            if (r.done) {
              upstreamDone = true;
              buffered += decoder.decode();
              if (buffered) events.push(buffered);
              buffered = "";
              break;
            }
            buffered += decoder.decode(r.value, { stream: true });
            if (!streaming) continue;
            // Events end in a blank line (Google's in CRLF CRLF).
            const parts = buffered.split(/(?<=\r?\n\r?\n)/);
            buffered = /\r?\n\r?\n$/.test(parts.at(-1)!) ? "" : parts.pop()!;
            events.push(...parts.filter((p) => /\r?\n\r?\n$/.test(p)));
          }
          if (events.length === 0) {
            seen.finished = true;
            controller.close();
            return;
          }
          if (sent === 0 && plan.firstMs > 0 && !greeted) {
            // The status and headers go out with a response's first bytes: an SSE comment sends
            // them, and the model is then slow to its first event; a JSON answer stalls half-way.
            greeted = true;
            const first = events[0]!;
            if (!streaming) events[0] = first.slice(first.length >> 1);
            controller.enqueue(enc.encode(streaming ? ": ok\n\n" : first.slice(0, first.length >> 1)));
            return;
          }
          await Bun.sleep(sent === 0 ? plan.firstMs : plan.paceMs);
          if (seen.aborted) return;
          controller.enqueue(enc.encode(events.shift()!));
          sent++;
        },
        cancel: () => {
          if (!seen.finished) seen.aborted = true;
          void reader.cancel().catch(() => undefined);
        },
      },
      { highWaterMark: 0 },
    );
    return new Response(paced, { status: upstream.status, headers: out });
  }

  stop(): void {
    this.server.stop(true);
  }
}

// ---------------------------------------------------------------------------------------------
// Calls

const PROVIDERS = ["openai", "anthropic", "gemini"] as const;
type Provider = (typeof PROVIDERS)[number];

/** Where the client leaves (stream only, but for `before-headers`). */
type Leave = "none" | "before-headers" | "before-first" | "slow-first" | "after-first" | "mid" | "after-last" | "in-backoff";
type Fault = "none" | "status-500" | "retried-500" | "cut";

interface CallPlan {
  marker: string;
  provider: Provider;
  stream: boolean;
  leave: Leave;
  fault: Fault;
  /** `mid`: leave after this many content chunks. */
  chunks: number;
  /** `before-headers`: leave after this many ms. */
  afterMs: number;
  /** Sometimes a few tokens only: the mocks stop there (a word a token). */
  maxTokens?: number;
  words: string[];
}

interface Outcome {
  plan: CallPlan;
  /** Undefined when the client left before the answer's headers. */
  status?: number;
  callId?: string;
  /** JSON: `x-svc-response-cost`. */
  costHeader?: string;
  /** The usage the client got (JSON body, the stream's usage chunk). */
  usage?: { prompt: number; completion: number };
  errorType?: string;
  errorMessage?: string;
  /** Stream: content chunks the client got, whether it saw an error event, [DONE]. */
  contentChunks: number;
  streamError?: Json;
  done: boolean;
  left: boolean;
  /** What the client sent (the final call's token reservation is computed from it). */
  body: Json;
}

const WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"];

function planCall(rng: Random, marker: string): CallPlan {
  const provider = rng.pick(PROVIDERS);
  const stream = rng.chance(0.7);
  let leave: Leave = "none";
  let fault: Fault = "none";
  const r = rng.next();
  if (r < 0.15) leave = "before-headers";
  else if (r < 0.22) leave = "in-backoff";
  // JSON: an answer the upstream started and stalls on.
  else if (r < 0.55) leave = stream ? rng.pick(["before-first", "slow-first", "after-first", "mid", "after-last"] as const) : "before-first";
  else if (r < 0.75) fault = rng.pick(stream ? (["status-500", "retried-500", "cut"] as const) : (["status-500", "retried-500"] as const));
  // A client that leaves a short answer: the gateway has read little more than the client got.
  const maxTokens = leave === "after-first" || leave === "mid" ? rng.maybe(0.6, [1, 2]) : rng.maybe(0.3, [1, 2, 3, 5]);
  return { marker, provider, stream, leave, fault, chunks: 1 + rng.int(3), afterMs: 100 + rng.int(200), words: Array.from({ length: 4 + rng.int(6) }, () => rng.pick(WORDS)), maxTokens };
}

function callBody(p: CallPlan): Json {
  return {
    model: p.provider,
    messages: [{ role: "user", content: `${p.marker} ${p.words.join(" ")}` }],
    max_tokens: p.maxTokens ?? MAX_TOKENS,
    user: p.marker,
    // A first attempt's 500 is retried (after a backoff of at least 375 ms).
    ...(p.fault === "retried-500" || p.leave === "in-backoff" ? { num_retries: 1 } : {}),
    ...(p.stream ? { stream: true, stream_options: { include_usage: true } } : {}),
  };
}

/** SSE events of a text so far: the whole ones, and what is left. */
function sseEvents(text: string): { events: string[]; rest: string } {
  const parts = text.split("\n\n");
  const rest = parts.pop()!;
  return { events: parts.filter((p) => p.startsWith("data: ")).map((p) => p.slice(6)), rest };
}

async function makeCall(gw: TestGateway, key: string, p: CallPlan): Promise<Outcome> {
  const body = callBody(p);
  const out: Outcome = { plan: p, contentChunks: 0, done: false, left: false, body };
  const ac = new AbortController();
  const timer = p.leave === "before-headers" || p.leave === "before-first" || p.leave === "in-backoff" ? setTimeout(() => ac.abort(), p.afterMs) : undefined;
  let res: Response;
  try {
    res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: ac.signal,
    });
  } catch (err) {
    if (!ac.signal.aborted) throw err;
    out.left = true;
    return out;
  }
  clearTimeout(timer);
  out.status = res.status;
  out.callId = res.headers.get("x-svc-call-id") ?? undefined;
  out.costHeader = res.headers.get("x-svc-response-cost") ?? undefined;
  const streamed = res.headers.get("content-type")?.includes("event-stream") === true;
  if (!streamed) {
    const json = (await res.json()) as Json;
    const err = json.error as Json | undefined;
    if (err) {
      out.errorType = String(err.type);
      out.errorMessage = String(err.message);
    }
    const u = json.usage as Json | undefined;
    if (u) out.usage = { prompt: Number(u.prompt_tokens), completion: Number(u.completion_tokens) };
    return out;
  }
  const leaveNow = () => {
    out.left = true;
    ac.abort();
  };
  if (p.leave === "slow-first") {
    await res.body!.cancel().catch(() => undefined);
    leaveNow();
    return out;
  }
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let text = "";
  try {
    for (;;) {
      const r = await reader.read();
      if (r.done) break;
      text += dec.decode(r.value, { stream: true });
      const { events, rest } = sseEvents(text);
      text = rest;
      for (const e of events) {
        if (e === "[DONE]") {
          out.done = true;
          continue;
        }
        const chunk = JSON.parse(e) as Json;
        if (chunk.error) {
          out.streamError = chunk.error as Json;
          continue;
        }
        const u = chunk.usage as Json | undefined | null;
        if (u) out.usage = { prompt: Number(u.prompt_tokens), completion: Number(u.completion_tokens) };
        const delta = ((chunk.choices as Json[] | undefined)?.[0]?.delta ?? {}) as Json;
        if (typeof delta.content === "string" && delta.content !== "") out.contentChunks++;
      }
      if (p.leave === "after-first" && out.contentChunks >= 1) break;
      if (p.leave === "mid" && out.contentChunks >= p.chunks) break;
      if (p.leave === "after-last" && out.done) break;
    }
  } catch (err) {
    if (!ac.signal.aborted) throw err;
  }
  if (p.leave !== "none") leaveNow();
  return out;
}

// ---------------------------------------------------------------------------------------------

interface Row {
  call_id: string;
  end_user: string | null;
  status: string;
  spend: string;
  prompt_tokens: number;
  completion_tokens: number;
  model_id: string;
  team_id: string | null;
  metadata: Json;
}

async function keyRows(gw: TestGateway, token: string): Promise<Row[]> {
  await gw.host!.spendWriter.flush();
  return rows<Row>(gw.host!.store.db, sql`select call_id, end_user, status, spend::text as spend, prompt_tokens, completion_tokens, model_id, team_id, metadata from spend_logs where api_key = ${token}`);
}

async function storedSpend(gw: TestGateway, table: "virtual_keys" | "teams", id: string): Promise<bigint> {
  const column = table === "virtual_keys" ? sql`token` : sql`team_id`;
  const [r] = await rows<{ spend: string }>(gw.host!.store.db, sql`select spend::text as spend from ${sql.raw(table)} where ${column} = ${id}`);
  return pico(r!.spend);
}

/** README's token estimate of a request: every character of the messages (keys too) / 3, + 4 per message, + 3, + max_tokens. */
function reservation(body: Json): number {
  const messages = body.messages as { role: string; content: string }[];
  let chars = 0;
  for (const m of messages) chars += "role".length + m.role.length + "content".length + m.content.length;
  return Math.ceil(chars / 3) + 4 * messages.length + 3 + Number(body.max_tokens ?? 0);
}

async function ok(gw: TestGateway, path: string, body: Json): Promise<Json> {
  const r = await requestJson(gw, "POST", path, { body });
  if (r.status !== 200) throw new Error(`${path} → ${r.status}: ${r.text}`);
  return r.body;
}

/** Both stores, and the embedded one with Redis holding the rate windows and the budget ledger (skipped when no Redis answers). */
const MODES = [...BACKENDS.map((backend) => ({ backend, name: backend, redis: false })), { backend: "pglite" as const, name: "pglite+redis", redis: true }];
const redisUp = await redisReachable(REDIS_URL);

for (const { backend, name, redis } of MODES) {
  describe.skipIf(redis && !redisUp)(`clients that leave mid-call, with budgets and limits, on ${name}, LEAVES_DIFF_SEED=${SEED}`, () => {
    let gw: TestGateway & { databaseUrl?: string };
    let openai: MockOpenAI;
    let anthropic: MockAnthropic;
    let gemini: MockGemini;
    const proxies = {} as Record<Provider, PacingProxy>;

    beforeAll(async () => {
      openai = await startMockOpenAI({ apiKey: UPSTREAM_KEYS.openai });
      anthropic = await startMockAnthropic({ apiKey: UPSTREAM_KEYS.anthropic });
      gemini = await startMockGemini({ apiKey: UPSTREAM_KEYS.gemini });
      proxies.openai = new PacingProxy(`http://127.0.0.1:${openai.port}`, "openai");
      proxies.anthropic = new PacingProxy(anthropic.url, "anthropic");
      proxies.gemini = new PacingProxy(gemini.url, "gemini");
      for (const p of Object.values(proxies)) p.start();
      const deployment = (name: Provider, svc: Json) => ({ model_name: name, svc_params: svc, model_info: { id: `dep-${name}`, ...PRICES } });
      gw = await startBackendGateway(
        backend,
        {
          model_list: [
            deployment("openai", { model: "openai/gpt-4o", api_base: `${proxies.openai.origin}/v1`, api_key: UPSTREAM_KEYS.openai }),
            deployment("anthropic", { model: "anthropic/claude-3-5-sonnet-20241022", api_base: proxies.anthropic.origin, api_key: UPSTREAM_KEYS.anthropic }),
            deployment("gemini", { model: "gemini/gemini-2.5-flash", api_base: proxies.gemini.origin, api_key: UPSTREAM_KEYS.gemini }),
          ],
          general_settings: { master_key: MASTER_KEY },
        },
        { dbPrefix: "gw_leaves", redisUrl: redis ? REDIS_URL : undefined },
      );
    });

    afterAll(async () => {
      await gw?.stop();
      for (const p of Object.values(proxies)) p.stop();
      await Promise.all([openai?.stop(), anthropic?.stop(), gemini?.stop()]);
    });

    test("every call is one row, spend adds up, the upstream hears the client leave, no lease is left behind", async () => {
      const rng = new Random(SEED);
      let serial = 0;
      for (let round = 0; round < ROUNDS; round++) {
        const where = `round ${round} ${seedNote}`;
        const outcomes: Outcome[] = [];
        const marker = () => `leave-${name.replace("+", "-")}-${RUN}-${round}-${serial++}`;
        const faultFor = (p: CallPlan) => {
          const plan: Plan = { firstMs: 0, paceMs: 0 };
          if (p.leave === "before-headers") plan.fault = "hang";
          else if (p.fault === "status-500" || p.fault === "retried-500" || p.leave === "in-backoff") plan.fault = "500";
          else if (p.fault === "cut") plan.fault = 1 + rng.int(3);
          if (p.leave === "slow-first" || p.leave === "before-first") Object.assign(plan, { firstMs: SLOW_FIRST_MS, paceMs: PACE_MS });
          else if (p.leave === "after-first" || p.leave === "mid") plan.paceMs = PACE_MS;
          proxies[p.provider].plans.set(p.marker, plan);
        };

        // The world: a key, sometimes in a team; the key's limits are the tightest.
        const parallel = 2 + rng.int(3);
        // Now and then more calls than the parallel limit lets through at once.
        const burst = parallel + rng.int(4);
        const rpm = burst + 2 * parallel + 6 + rng.int(4);
        const tpm = 20_000 + rng.int(20_000);
        const worst = IN_PICO * 120n + OUT_PICO * BigInt(MAX_TOKENS);
        const keyBudget = worst * BigInt(5 + rng.int(12));
        const teamId = rng.chance(0.5) ? `team-leaves-${name}-${RUN}-${round}` : undefined;
        const teamBudget = worst * BigInt(4 + rng.int(12));
        if (teamId) await ok(gw, "/team/new", { team_id: teamId, max_budget: Number(usd(teamBudget)), rpm_limit: rpm + 20, tpm_limit: tpm + 50_000, max_parallel_requests: parallel + rng.pick([0, 3]) });
        const created = await ok(gw, "/key/generate", { max_budget: Number(usd(keyBudget)), max_parallel_requests: parallel, rpm_limit: rpm, tpm_limit: tpm, ...(teamId ? { team_id: teamId } : {}) });
        const key = String(created.key);
        const token = sha256(key);
        const what = `${where} (parallel ${parallel}, rpm ${rpm}, tpm ${tpm}, key budget ${usd(keyBudget)}${teamId ? `, team budget ${usd(teamBudget)}` : ""})`;

        // A first call that runs to the end (it also meets the budget counters' first read).
        const first: CallPlan = { marker: marker(), provider: rng.pick(PROVIDERS), stream: false, leave: "none", fault: "none", chunks: 0, afterMs: 0, words: ["warm", "up"] };
        outcomes.push(await makeCall(gw, key, first));

        // The burst: all at once, a few ms apart.
        const plans = Array.from({ length: burst }, () => planCall(rng, marker()));
        for (const p of plans) faultFor(p);
        const results = await Promise.all(plans.map(async (p, i) => {
          await Bun.sleep(i * 3);
          return makeCall(gw, key, p);
        }));
        outcomes.push(...results);
        const planText = plans.map((p) => `${p.marker}: ${p.provider} ${p.stream ? "stream" : "json"} leave=${p.leave} fault=${p.fault}`).join("\n");

        // The upstream of every client that left hears it (the proxy's answer is cancelled); a
        // client that left while the gateway waited to retry is not retried for.
        if (results.some((o) => o.plan.leave === "in-backoff")) await Bun.sleep(800);
        for (const o of results) {
          if (o.plan.leave === "in-backoff" && o.status === undefined) {
            expect(proxies[o.plan.provider].seen.get(o.plan.marker)?.requests, `${what}: ${o.plan.marker}: no retry once the client left\n${planText}`).toBe(1);
            continue;
          }
          if (!o.left || o.done) continue;
          if (o.status !== undefined && o.status !== 200) continue;
          const seen = () => proxies[o.plan.provider].seen.get(o.plan.marker);
          if (!(await until(async () => seen()?.aborted === true, 3000))) { console.log("NOT ABORTED", o.plan, seen(), o, (await keyRows(gw, token)).filter((r) => r.end_user === o.plan.marker)); continue; }
          expect(await until(async () => seen()?.aborted === true, 3000), `${what}: ${o.plan.marker} (leave ${o.plan.leave}): the upstream request is aborted when the client leaves\n${planText}`).toBe(true);
        }

        // No parallel slot is left behind: raise the budgets, hold `parallel` streams, one more is refused.
        await ok(gw, "/key/update", { key, max_budget: 1000 });
        if (teamId) await ok(gw, "/team/update", { team_id: teamId, max_budget: 1000 });
        const held = Array.from({ length: parallel }, () => ({ marker: marker(), provider: "openai" as Provider, stream: true, leave: "mid" as Leave, fault: "none" as Fault, chunks: 2, afterMs: 0, words: ["hold", "this", "stream", "open", "for", "a", "while"] }));
        for (const h of held) proxies.openai.plans.set(h.marker, { firstMs: 0, paceMs: 400 });
        const holding = held.map((h) => makeCall(gw, key, h));
        // Every held stream has its first chunk (and so its slot) before the extra call.
        expect(await until(async () => held.every((h) => proxies.openai.seen.has(h.marker)), 3000), `${what}: the held streams reach the upstream`).toBe(true);
        await Bun.sleep(150);
        const extra = await makeCall(gw, key, { marker: marker(), provider: "gemini", stream: false, leave: "none", fault: "none", chunks: 0, afterMs: 0, words: ["one", "more"] });
        expect(extra.status, `${what}: ${parallel} calls in flight, one more is refused: ${extra.errorMessage}\n${planText}`).toBe(429);
        expect(extra.errorMessage, what).toContain("parallel");
        outcomes.push(extra, ...(await Promise.all(holding)));
        for (const h of held) expect(await until(async () => proxies.openai.seen.get(h.marker)?.aborted === true, 3000), `${what}: a held stream's upstream is aborted when its client leaves`).toBe(true);
        // Their slots are free again.
        const again = await Promise.all(Array.from({ length: parallel }, () => makeCall(gw, key, { marker: marker(), provider: rng.pick(PROVIDERS), stream: false, leave: "none", fault: "none", chunks: 0, afterMs: 0, words: ["again"] })));
        for (const a of again) expect(a.status, `${what}: ${parallel} calls at once after the others left: ${a.errorMessage}\n${planText}`).toBe(200);
        outcomes.push(...again);

        // A short answer (max_tokens 1 or 2) left after its first chunk, on every provider: the
        // gateway has read little more than that, its counts not among it.
        for (const provider of PROVIDERS) {
          const p: CallPlan = { marker: marker(), provider, stream: true, leave: "after-first", fault: "none", chunks: 1, afterMs: 0, words: ["short", "answer", "left", "early"], maxTokens: 1 + rng.int(2) };
          proxies[provider].plans.set(p.marker, { firstMs: 0, paceMs: PACE_MS });
          outcomes.push(await makeCall(gw, key, p));
        }

        // The rate windows: every call not refused counts once, with the tokens its row says.
        // A call the client left ends on the gateway's side a moment later: once each has its row.
        const logged = async () => new Set((await keyRows(gw, token)).map((r) => r.end_user)).size === outcomes.length;
        expect(await until(logged, 3000), `${what}: every call so far is logged`).toBe(true);
        const before = await keyRows(gw, token);
        const probePlan: CallPlan = { marker: marker(), provider: "openai", stream: false, leave: "none", fault: "none", chunks: 0, afterMs: 0, words: ["probe"] };
        const probe = await fetch(`${gw.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify(callBody(probePlan)),
        });
        const probeBody = (await probe.json()) as Json;
        expect(probe.status, `${what}: the probe: ${JSON.stringify(probeBody)}`).toBe(200);
        // Once per call, however many attempts it took.
        const counted = new Set(before.filter((r) => r.model_id !== "").map((r) => r.end_user)).size + 1;
        const tokensUsed = before.reduce((n, r) => n + r.prompt_tokens + r.completion_tokens, 0);
        const seenText = outcomes.map((o) => `${o.plan.marker}: ${o.status ?? "left"}${o.left ? " left" : ""} ${o.errorMessage ?? ""}`).join("\n");
        expect(probe.headers.get("x-ratelimit-remaining-requests"), `${what}: requests counted in the window (${counted} not refused)\n${seenText}`).toBe(String(rpm - counted));
        expect(probe.headers.get("x-ratelimit-remaining-tokens"), `${what}: tokens counted in the window\n${planText}`).toBe(String(tpm - tokensUsed - reservation(callBody(probePlan))));
        const probeUsage = probeBody.usage as Json;
        outcomes.push({ plan: probePlan, status: 200, callId: probe.headers.get("x-svc-call-id") ?? undefined, costHeader: probe.headers.get("x-svc-response-cost") ?? undefined, usage: { prompt: Number(probeUsage.prompt_tokens), completion: Number(probeUsage.completion_tokens) }, contentChunks: 0, done: true, left: false, body: callBody(probePlan) });

        // Rows: exactly one per call, as README describes it; none other.
        const all = await keyRows(gw, token);
        // README: every failed attempt has its own row (`<call id>-<n>` after the first).
        const retried = outcomes.filter((o) => o.plan.fault === "retried-500" && o.status === 200);
        expect(all.length, `${what}: one row per call (${outcomes.length}) and per failed attempt (${retried.length})\n${planText}`).toBe(outcomes.length + retried.length);
        for (const o of outcomes) {
          const p = o.plan;
          let mine = all.filter((r) => r.end_user === p.marker);
          const label = `${what}: ${p.marker} (${p.provider} ${p.stream ? "stream" : "json"} leave=${p.leave} fault=${p.fault}, client saw ${o.status ?? "no answer"} ${o.errorMessage ?? ""})`;
          if (retried.includes(o)) {
            expect(mine.length, `${label}: the failed attempt's row and the answer's`).toBe(2);
            const failed = mine.find((r) => r.call_id !== o.callId)!;
            expect(o.callId, `${label}: the answer's call id is the retry's`).toBe(`${failed.call_id}-1`);
            expect([failed.status, pico(failed.spend), failed.model_id], `${label}: the failed attempt`).toEqual(["failure", 0n, `dep-${p.provider}`]);
            mine = mine.filter((r) => r !== failed);
          }
          expect(mine.length, `${label}: exactly one row`).toBe(1);
          const row = mine[0]!;
          if (o.callId) expect(row.call_id, `${label}: the row is the call the client saw`).toBe(o.callId);
          const spend = pico(row.spend);
          expect(o.status === 500 ? p.fault : "ok", `${label}: no 500 but the upstream's own`).toBe(o.status === 500 ? "status-500" : "ok");
          if (o.status !== undefined && o.status !== 200) {
            // A refusal (no deployment asked) or an upstream failure: a failure at 0.
            expect(row.status, `${label}: status`).toBe("failure");
            expect(spend, `${label}: a failure costs nothing`).toBe(0n);
            if (o.status === 429 || o.status === 400) expect(row.model_id, `${label}: a refusal names no deployment`).toBe("");
            else expect(row.model_id, label).toBe(`dep-${p.provider}`);
            continue;
          }
          expect(row.model_id, label).toBe(`dep-${p.provider}`);
          // Whatever it streamed, an answer has at most max_tokens tokens (and budgets reserve no more).
          expect(row.completion_tokens, `${label}: at most max_tokens (${p.maxTokens ?? MAX_TOKENS}) answer tokens`).toBeLessThanOrEqual(p.maxTokens ?? MAX_TOKENS);
          if (o.status === undefined && p.leave === "in-backoff") {
            // Left while the gateway waited to retry: the failed attempt is the call's row.
            expect([row.status, spend], `${label}: the failed attempt`).toEqual(["failure", 0n]);
            continue;
          }
          if (o.status === undefined || (p.stream && p.leave === "slow-first")) {
            // Left before any answer, or before the model's first event, once the request was with
            // the upstream (which bills the prompt): cancelled, charged its prompt and no answer.
            expect(row.status, `${label}: status`).toBe("cancelled");
            expect(row.prompt_tokens, `${label}: charged its prompt`).toBeGreaterThan(0);
            expect(row.completion_tokens, `${label}: and no answer`).toBe(0);
            expect(spend, `${label}: at the deployment's price`).toBe(costOf(row.prompt_tokens, 0));
            continue;
          }
          if (o.streamError) {
            expect(row.status, `${label}: a stream that failed: ${JSON.stringify(o.streamError)}`).toBe("failure");
            // Failed after its answer began: charged what it streamed (the upstream bills it); before: nothing.
            if (o.contentChunks > 0) {
              expect(row.completion_tokens, `${label}: charged the ${o.contentChunks} chunks the client got`).toBeGreaterThan(0);
              expect(spend, `${label}: at the deployment's price`).toBe(costOf(row.prompt_tokens, row.completion_tokens));
            } else expect(spend, `${label}: failed before its answer began`).toBe(0n);
            continue;
          }
          expect(spend, `${label}: spend is the deployment's price of the row's tokens`).toBe(costOf(row.prompt_tokens, row.completion_tokens));
          if (o.done || !p.stream) {
            expect(row.status, `${label}: a finished call`).toBe("success");
            expect(o.usage, `${label}: the client got the usage`).toBeDefined();
            expect([row.prompt_tokens, row.completion_tokens], `${label}: the usage the client got`).toEqual([o.usage!.prompt, o.usage!.completion]);
            if (!p.stream) expect(o.costHeader !== undefined && pico(o.costHeader), `${label}: the cost header is the row's`).toBe(spend);
            continue;
          }
          expect(o.left, `${label}: a stream that neither ended nor failed was left`).toBe(true);
          expect(row.status, `${label}: a client that left`).toBe("cancelled");
          expect(row.metadata.error_information, `${label}: a cancelled call has no error`).toBeUndefined();
          expect(row.prompt_tokens, `${label}: a cancelled stream is charged for its prompt`).toBeGreaterThan(0);
          if (o.contentChunks > 0) expect(row.completion_tokens, `${label}: and for the ${o.contentChunks} chunks the client got`).toBeGreaterThan(0);
        }

        // Money: the counters are the exact sum of their rows, and never past the budget (max_tokens set).
        const keySum = all.reduce((s, r) => s + pico(r.spend), 0n);
        expect(usd(await storedSpend(gw, "virtual_keys", token)), `${what}: the key's spend is the sum of its rows`).toBe(usd(keySum));
        // Before the budgets were raised: the first call and the burst.
        const burstMarkers = new Set([first.marker, ...plans.map((p) => p.marker)]);
        const burstSpend = all.filter((r) => burstMarkers.has(r.end_user ?? "")).reduce((s, r) => s + pico(r.spend), 0n);
        expect(burstSpend <= keyBudget, `${what}: spend ${usd(burstSpend)} within the key's budget ${usd(keyBudget)}`).toBe(true);
        if (teamId) {
          expect(all.every((r) => r.team_id === teamId), what).toBe(true);
          expect(usd(await storedSpend(gw, "teams", teamId)), `${what}: the team's spend is the sum of its rows`).toBe(usd(keySum));
          expect(burstSpend <= teamBudget, `${what}: within the team's budget`).toBe(true);
        }
      }
      const errors = gw.log.lines.filter((l) => l.level === "error");
      expect(errors, `no error logged ${seedNote}`).toEqual([]);
    }, 60_000);

    // A refusal can come after the client left: a budget that just appeared on a row waits up to
    // 2 s for the row's stored spend (README, How it works), here held by a lock on the key's row
    // that keeps the spend writer from writing. The call is still a call: its refusal is a row.
    test.skipIf(backend !== "postgres" || redis)("a call refused after its client left is still logged", async () => {
      const budgetId = `b-leaves-${RUN}`;
      await ok(gw, "/budget/new", { budget_id: budgetId });
      const key = String((await ok(gw, "/key/generate", { budget_id: budgetId })).key);
      const token = sha256(key);
      const db = postgres(gw.databaseUrl!, { max: 1, onnotice: () => {} });
      let unlock = () => {};
      const unlocked = new Promise<void>((resolve) => {
        unlock = resolve;
      });
      let locked = () => {};
      const held = new Promise<void>((resolve) => {
        locked = resolve;
      });
      const lock = db.begin(async (t) => {
        await t`select 1 from virtual_keys where token = ${token} for update`;
        locked();
        await unlocked;
      });
      try {
        await held;
        const spent: CallPlan = { marker: `leave-refused-${RUN}-0`, provider: "openai", stream: false, leave: "none", fault: "none", chunks: 0, afterMs: 0, words: ["spend", "some"] };
        expect((await makeCall(gw, key, spent)).status, "a call before the budget").toBe(200);
        await ok(gw, "/budget/update", { budget_id: budgetId, max_budget: 0 });
        const left: CallPlan = { marker: `leave-refused-${RUN}-1`, provider: "openai", stream: true, leave: "before-headers", fault: "none", chunks: 0, afterMs: 300, words: ["refused", "later"] };
        const o = await makeCall(gw, key, left);
        expect(o.left, "the client left before the answer").toBe(true);
        await Bun.sleep(2500);
      } finally {
        unlock();
        await lock;
        await db.end();
      }
      const logged = await keyRows(gw, token);
      expect(logged.map((r) => r.end_user).sort(), "both calls are logged").toEqual([`leave-refused-${RUN}-0`, `leave-refused-${RUN}-1`]);
      const refused = logged.find((r) => r.end_user === `leave-refused-${RUN}-1`)!;
      expect([refused.status, pico(refused.spend), refused.model_id], "a refusal: a failure at 0 with no deployment").toEqual(["failure", 0n, ""]);
      expect(proxies.openai.seen.has(`leave-refused-${RUN}-1`), "the refused call never went upstream").toBe(false);
    }, 30_000);
  });
}
