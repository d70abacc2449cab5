/**
 * What translating Anthropic's stream costs: the same streams through the gateway to the mock
 * Anthropic upstream (every event parsed and rewritten into an OpenAI chunk) and to the mock OpenAI
 * upstream (chunks passed through). Both mocks send the same number of content deltas, one event
 * per write, so the difference between the two paths is the translation.
 *
 * First, in this process and free of I/O and scheduling noise: one stream's upstream bytes from
 * each mock, fed event by event through the core's SSE parser and the provider's stream transform,
 * many times over (CPU µs per stream and per chunk): what translation costs the gateway.
 *
 * Then, end to end, three measurements per round, paths interleaved (order alternating by round):
 *   first-token one stream at a time from an unpaced upstream: TTFT with nothing else going on,
 *               the latency the gateway's path itself adds.
 *   latency     the upstream paced like a model (`--delay-ms` before every content delta) and
 *               `--latency-concurrency` streams at a time, so the gateway is far from saturated:
 *               time to first token (TTFT, request sent → first content delta received) p50 / p99,
 *               i.e. the latency the translation adds.
 *   throughput  the upstream as fast as it goes, `--concurrency` streams at a time: streams/s and
 *               chunks/s, and the gateway's CPU per stream (from /proc), which other load on the
 *               machine disturbs less than wall-clock figures.
 * Each runs `--warmup` unrecorded streams, then `--streams` streams. With two or more cores the
 * gateway runs on core 0, the mocks and this load generator on core 1. Before each measurement the
 * script waits (up to `--quiet-wait` s) for other processes to leave the machine idle, and reports
 * the CPU they used during it ("foreign").
 *
 *   bun bench/anthropic-stream.ts [--streams 200] [--chunks 50] [--concurrency 20] [--latency-concurrency 4] [--rounds 3]
 *     [--warmup 40] [--delay-ms 5] [--quiet-wait 30] [--gateway-root DIR] [--out FILE]
 *
 * `--gateway-root` runs core/main.ts from another checkout (a scratch copy with a change). Writes
 * bench/results/anthropic-stream.md. Targets: ≤ 1 ms added TTFT at p99, ≥ 80 % of the
 * pass-through throughput, both judged on the median over rounds of the paired (same round,
 * back to back) differences, which drifting background load disturbs least.
 */
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import type { Subprocess } from "bun";
import type { ChatRequest, StreamTransform } from "../core/contract.ts";
import { SseParser } from "../core/stream/framing.ts";
import { anthropicChatStream } from "../providers/anthropic/index.ts";
import { openAIChat } from "../providers/openai-compatible/adapter.ts";
import { spawnGateway } from "../test/harness/gateway.ts";
import { startMockOpenAI } from "../test/mock-upstream/openai.ts";

const { values: flags } = parseArgs({
  args: Bun.argv.slice(2),
  options: {
    streams: { type: "string", default: "200" },
    chunks: { type: "string", default: "50" },
    concurrency: { type: "string", default: "20" },
    "latency-concurrency": { type: "string", default: "4" },
    rounds: { type: "string", default: "3" },
    warmup: { type: "string", default: "40" },
    "delay-ms": { type: "string", default: "5" },
    "quiet-wait": { type: "string", default: "30" },
    "quiet-threshold": { type: "string", default: "15" },
    "gateway-root": { type: "string" },
    out: { type: "string" },
    // Internal: run the OpenAI mock with every stream stretched to `--chunks` deltas, `--delay-ms` apart.
    "serve-openai": { type: "boolean", default: false },
    faults: { type: "string" },
  },
});

const STREAMS = Number(flags.streams);
const CHUNKS = Number(flags.chunks);
const CONCURRENCY = Number(flags.concurrency);
const LATENCY_CONCURRENCY = Number(flags["latency-concurrency"]);
const ROUNDS = Number(flags.rounds);
const WARMUP = Number(flags.warmup);
const DELAY_MS = Number(flags["delay-ms"]);
const QUIET_WAIT = Number(flags["quiet-wait"]);
const QUIET_THRESHOLD = Number(flags["quiet-threshold"]);
const REPO = resolve(import.meta.dir, "..");
const GATEWAY_ROOT = resolve(flags["gateway-root"] ?? REPO);
const OUT = resolve(flags.out ?? join(REPO, "bench/results/anthropic-stream.md"));
const UPSTREAM_KEY = "sk-bench-upstream";
const MASTER_KEY = "sk-bench-master-key-0123456789";
const PINNED = cpus().length >= 2 && Bun.which("taskset") !== null;

// ---------------------------------------------------------------------------------------------
// Child mode: the OpenAI mock. It stretches a reply to N deltas only through a fault, so it is
// given one per stream the benchmark will send.

if (flags["serve-openai"]) {
  const mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY, record: false });
  for (let i = 0; i < Number(flags.faults ?? 10_000); i++) mock.fault({ kind: "slowStream", chunkDelayMs: DELAY_MS, chunks: CHUNKS });
  console.log(`listening ${mock.url}`);
  await new Promise(() => {});
}

// The load generator shares core 1 with the mocks: re-run this script pinned there.
if (PINNED && process.env.ANTHROPIC_BENCH_PINNED === undefined) {
  const self = Bun.spawn(["taskset", "-c", "1", process.execPath, ...Bun.argv.slice(1)], {
    cwd: REPO,
    env: { ...process.env, ANTHROPIC_BENCH_PINNED: "1" },
    stdio: ["ignore", "inherit", "inherit"],
  });
  process.exit(await self.exited);
}

// ---------------------------------------------------------------------------------------------
// Processes and /proc readings

const children: Subprocess[] = [];
const pinned = (core: number, cmd: string[]) => (PINNED ? ["taskset", "-c", String(core), ...cmd] : cmd);

async function startChild(cmd: string[]): Promise<{ proc: Subprocess; url: string }> {
  const proc = Bun.spawn(cmd, { cwd: REPO, stdout: "pipe", stderr: "inherit", stdin: "ignore" });
  children.push(proc);
  const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`${cmd.join(" ")} exited before listening:\n${text}`);
    text += new TextDecoder().decode(value);
    const m = /listening (http:\/\/\S+)/.exec(text);
    if (m) return { proc, url: m[1]! };
  }
}

const CLK_TCK = Number(Bun.spawnSync(["getconf", "CLK_TCK"]).stdout.toString().trim()) || 100;

/** utime + stime of a process (all its threads), in seconds. */
function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
}

/** Busy seconds of the whole machine (all cores). */
function machineBusySeconds(): number {
  const line = readFileSync("/proc/stat", "utf8").split("\n")[0]!;
  const v = line.trim().split(/\s+/).slice(1).map(Number);
  const idle = v[3]! + (v[4] ?? 0);
  const total = v.slice(0, 8).reduce((a, b) => a + b, 0);
  return (total - idle) / CLK_TCK;
}

/** Waits (bounded) until the machine is idle: other jobs on these two cores make the figures meaningless. */
async function waitQuiet(): Promise<number> {
  const t0 = performance.now();
  for (;;) {
    const b0 = machineBusySeconds();
    await Bun.sleep(1000);
    const busyPct = 100 * (machineBusySeconds() - b0);
    if (busyPct <= QUIET_THRESHOLD || (performance.now() - t0) / 1000 >= QUIET_WAIT) return Math.round(busyPct);
  }
}

// ---------------------------------------------------------------------------------------------
// Load

type Path = "openai" | "anthropic";
type Phase = "first-token" | "latency" | "throughput";
const PATH_LABEL: Record<Path, string> = { openai: "openai (pass-through)", anthropic: "anthropic (translated)" };
/** The deployment for a path and phase: first-token and throughput share the unpaced mocks. */
const model = (path: Path, phase: Phase) => `${path}-${phase === "latency" ? "latency" : "throughput"}`;
const concurrencyOf = (phase: Phase) => (phase === "first-token" ? 1 : phase === "latency" ? LATENCY_CONCURRENCY : CONCURRENCY);

interface StreamSample {
  ttftMs: number;
  chunks: number;
}

const decoder = new TextDecoder();

/** One stream: time to the first content delta, and the chunks received (checked complete). */
async function oneStream(url: string, name: string): Promise<StreamSample> {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: name, stream: true, max_tokens: 1000, messages: [{ role: "user", content: "Tell me a long story about benchmarks." }] }),
  });
  if (res.status !== 200) throw new Error(`${name}: status ${res.status}: ${await res.text()}`);
  const reader = res.body!.getReader();
  let ttft = -1;
  let tail = "";
  let events = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const text = decoder.decode(value, { stream: true });
    if (ttft < 0 && (tail + text).includes('"delta":{"content":"')) ttft = performance.now() - t0;
    for (let i = text.indexOf("data: "); i >= 0; i = text.indexOf("data: ", i + 6)) events++;
    tail = text.slice(-32);
  }
  if (!tail.trimEnd().endsWith("data: [DONE]")) throw new Error(`${name}: stream did not end with [DONE]`);
  return { ttftMs: ttft, chunks: events - 1 };
}

interface BatchResult {
  path: Path;
  phase: Phase;
  round: number;
  ttft: number[];
  wallMs: number;
  chunks: number;
  gatewayCpuMs: number;
  /** CPU used during the batch by processes other than the benchmark's, % of one core. */
  foreignPct: number;
  /** Machine busy % just before the batch (after waiting for quiet). */
  busyBeforePct: number;
}

async function batch(url: string, path: Path, phase: Phase, count: number, pids: number[], round: number, busyBeforePct: number): Promise<BatchResult> {
  const ttft: number[] = [];
  let chunks = 0;
  let next = 0;
  const ours0 = pids.reduce((n, p) => n + cpuSeconds(p), 0) + process.cpuUsage().user / 1e6 + process.cpuUsage().system / 1e6;
  const gw0 = cpuSeconds(pids[0]!);
  const busy0 = machineBusySeconds();
  const t0 = performance.now();
  const worker = async () => {
    while (next < count) {
      next++;
      const s = await oneStream(url, model(path, phase));
      ttft.push(s.ttftMs);
      chunks += s.chunks;
    }
  };
  await Promise.all(Array.from({ length: concurrencyOf(phase) }, worker));
  const wallMs = performance.now() - t0;
  const ours = pids.reduce((n, p) => n + cpuSeconds(p), 0) + process.cpuUsage().user / 1e6 + process.cpuUsage().system / 1e6 - ours0;
  const foreign = Math.max(0, machineBusySeconds() - busy0 - ours);
  return { path, phase, round, ttft, wallMs, chunks, gatewayCpuMs: (cpuSeconds(pids[0]!) - gw0) * 1000, foreignPct: Math.round((100 * foreign * 1000) / wallMs), busyBeforePct };
}

// ---------------------------------------------------------------------------------------------
// In process: framing + transform only

interface InProcess {
  usPerStream: number;
  chunksOut: number;
}

const IN_PROCESS_ITERATIONS = 4000;

/** CPU time to parse and transform one upstream stream, delivered one event per read (as a model paces it). */
function timeTransform<S>(transform: StreamTransform<"chat", S>, upstream: string): InProcess {
  const events = upstream.split(/(?<=\n\n)/);
  const req = { model: "bench", stream: true, messages: [{ role: "user", content: "Tell me a long story about benchmarks." }] } as ChatRequest;
  let chunksOut = 0;
  const once = () => {
    const state = transform.init(req);
    const parser = new SseParser();
    let out = "";
    let n = 0;
    const onEvent = (data: string) => {
      for (const p of transform.event(data, state)) {
        if (p.type === "data") {
          out += `data: ${p.data}\n\n`;
          n++;
        } else if (p.type === "chunk") {
          out += `data: ${JSON.stringify(p.chunk)}\n\n`;
          n++;
        }
      }
    };
    for (const e of events) parser.push(e, onEvent);
    parser.end(onEvent);
    chunksOut = n;
    return out.length;
  };
  for (let i = 0; i < IN_PROCESS_ITERATIONS / 4; i++) once();
  const t0 = process.cpuUsage();
  for (let i = 0; i < IN_PROCESS_ITERATIONS; i++) once();
  const t1 = process.cpuUsage(t0);
  return { usPerStream: (t1.user + t1.system) / IN_PROCESS_ITERATIONS, chunksOut };
}

/** One stream's raw bytes, straight from a mock (the request the gateway would send). */
async function upstreamBytes(path: Path, url: string): Promise<string> {
  const res =
    path === "anthropic"
      ? await fetch(`${url}/v1/messages`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-api-key": UPSTREAM_KEY, "anthropic-version": "2023-06-01" },
          body: JSON.stringify({ model: "claude-3-5-sonnet-20241022", max_tokens: 1000, stream: true, messages: [{ role: "user", content: "Tell me a long story about benchmarks." }] }),
        })
      : await fetch(`${url}/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${UPSTREAM_KEY}` },
          body: JSON.stringify({ model: "gpt-4o-mini", stream: true, stream_options: { include_usage: true }, messages: [{ role: "user", content: "Tell me a long story about benchmarks." }] }),
        });
  return res.text();
}

// ---------------------------------------------------------------------------------------------
// Statistics and report

function percentile(xs: number[], p: number): number {
  const v = [...xs].sort((a, b) => a - b);
  return v[Math.min(v.length - 1, Math.max(0, Math.ceil((p / 100) * v.length) - 1))]!;
}
const median = (xs: number[]) => percentile(xs, 50);
const f = (x: number, d = 2) => x.toFixed(d);
const signed = (x: number, d = 3) => `${x >= 0 ? "+" : ""}${x.toFixed(d)}`;
const streamsPerS = (r: BatchResult) => (1000 * r.ttft.length) / r.wallMs;
const chunksPerS = (r: BatchResult) => (1000 * r.chunks) / r.wallMs;
const cpuPerStream = (r: BatchResult) => (1000 * r.gatewayCpuMs) / r.ttft.length;

interface Summary {
  p50: number;
  p99: number;
  /** Medians over rounds. */
  streamsPerS: number;
  chunksPerS: number;
  cpuUsPerStream: number;
}

function summarize(rs: BatchResult[]): Summary {
  const all = rs.flatMap((r) => r.ttft);
  return {
    p50: percentile(all, 50),
    p99: percentile(all, 99),
    streamsPerS: median(rs.map(streamsPerS)),
    chunksPerS: median(rs.map(chunksPerS)),
    cpuUsPerStream: median(rs.map(cpuPerStream)),
  };
}

function report(results: BatchResult[], chunksSeen: Record<Path, number>, inProcess: Record<Path, InProcess>): string {
  const pick = (path: Path, phase: Phase) => summarize(results.filter((r) => r.path === path && r.phase === phase));
  const first = { openai: pick("openai", "first-token"), anthropic: pick("anthropic", "first-token") };
  const lat = { openai: pick("openai", "latency"), anthropic: pick("anthropic", "latency") };
  const thr = { openai: pick("openai", "throughput"), anthropic: pick("anthropic", "throughput") };
  // Paired per round: both paths measured back to back, so slow drifts in background load cancel.
  const paired = (phase: Phase, of: (a: BatchResult, o: BatchResult) => number) =>
    median(
      Array.from({ length: ROUNDS }, (_, i) => {
        const a = results.find((r) => r.round === i + 1 && r.phase === phase && r.path === "anthropic")!;
        const o = results.find((r) => r.round === i + 1 && r.phase === phase && r.path === "openai")!;
        return of(a, o);
      }),
    );
  const addedP50 = paired("latency", (a, o) => median(a.ttft) - median(o.ttft));
  const addedP99 = paired("latency", (a, o) => percentile(a.ttft, 99) - percentile(o.ttft, 99));
  const firstP50 = paired("first-token", (a, o) => median(a.ttft) - median(o.ttft));
  const firstP99 = paired("first-token", (a, o) => percentile(a.ttft, 99) - percentile(o.ttft, 99));
  const ratio = paired("throughput", (a, o) => streamsPerS(a) / streamsPerS(o));
  const cpuRatio = paired("throughput", (a, o) => cpuPerStream(o) / cpuPerStream(a));
  const L: string[] = [];
  L.push("# Anthropic stream translation benchmark", "");
  L.push(`- date: ${new Date().toISOString()}`);
  L.push(`- machine: ${cpus().length} cores (${cpus()[0]?.model ?? "unknown"}), bun ${Bun.version}`);
  L.push(`- gateway: ${GATEWAY_ROOT === REPO ? "this checkout" : GATEWAY_ROOT}; pinning: ${PINNED ? "gateway on core 0, both mocks and the load generator on core 1" : "none"}`);
  L.push(
    `- load: ${ROUNDS} round(s), paths interleaved; per round, phase and path ${WARMUP} warm-up streams, then ${STREAMS} streams (first-token phase one at a time, latency phase at concurrency ${LATENCY_CONCURRENCY}, throughput phase at ${CONCURRENCY}); ${CHUNKS} content deltas per stream (the client receives ${chunksSeen.openai} chunks via OpenAI, ${chunksSeen.anthropic} via Anthropic)`,
  );
  L.push(`- latency phase: upstream paced at ${DELAY_MS} ms before each content delta (gateway not saturated); first-token and throughput phases: upstream unpaced`);
  L.push("- same gateway process and request; only the deployment differs: `openai/gpt-4o-mini` → test/mock-upstream/openai.ts (passed through) vs `anthropic/claude-3-5-sonnet-20241022` → test/mock-upstream/anthropic.ts (translated)");
  L.push("");
  const addedUs = inProcess.anthropic.usPerStream - inProcess.openai.usPerStream;
  L.push("## In process: SSE parsing + stream transform, CPU per stream", "");
  L.push(`Each mock's stream (${CHUNKS} deltas) fed one event per read, ${IN_PROCESS_ITERATIONS} times, in this process (no I/O):`, "");
  L.push("| path | µs/stream | chunks out | µs/chunk |", "|---|---:|---:|---:|");
  for (const path of ["openai", "anthropic"] as const) {
    const x = inProcess[path];
    L.push(`| ${PATH_LABEL[path]} | ${f(x.usPerStream, 1)} | ${x.chunksOut} | ${f(x.usPerStream / x.chunksOut, 3)} |`);
  }
  L.push("", `Translation adds **${signed(addedUs, 1)} µs per stream** (${signed(addedUs / CHUNKS, 3)} µs per chunk) over pass-through.`, "");
  L.push("## Targets (end to end)", "", "| check | measured | goal | |", "|---|---:|---|---|");
  L.push(`| added TTFT p50, one stream at a time, unpaced upstream | ${signed(firstP50)} ms | — | |`);
  L.push(`| added TTFT p99, one stream at a time, unpaced upstream | ${signed(firstP99)} ms | ≤ 1 ms | ${firstP99 <= 1 ? "PASS" : "**MISS**"} |`);
  L.push(`| added TTFT p50, ${LATENCY_CONCURRENCY} paced streams at a time | ${signed(addedP50)} ms | — | |`);
  L.push(`| added TTFT p99, ${LATENCY_CONCURRENCY} paced streams at a time | ${signed(addedP99)} ms | ≤ 1 ms | ${addedP99 <= 1 ? "PASS" : "**MISS**"} |`);
  L.push(`| throughput, translated / pass-through (streams/s) | ${f(100 * ratio, 1)} % | ≥ 80 % | ${ratio >= 0.8 ? "PASS" : "**MISS**"} |`);
  L.push(`| gateway CPU per stream, pass-through / translated (the throughput ratio if the gateway were the only limit) | ${f(100 * cpuRatio, 1)} % (medians ${f(thr.openai.cpuUsPerStream, 0)} vs ${f(thr.anthropic.cpuUsPerStream, 0)} µs) | ≥ 80 % | ${cpuRatio >= 0.8 ? "PASS" : "**MISS**"} |`);
  L.push("", "Each figure is the median over rounds of the difference (or ratio) between the two paths measured back to back in that round.");
  L.push("");
  L.push("## Summary (TTFT percentiles over all rounds' streams; rates and CPU: medians of rounds)", "");
  L.push("| phase | path | TTFT p50 ms | TTFT p99 ms | streams/s | chunks/s | gateway CPU µs/stream |");
  L.push("|---|---|---:|---:|---:|---:|---:|");
  for (const [phase, s] of [
    ["first-token", first],
    ["latency", lat],
    ["throughput", thr],
  ] as const) {
    for (const path of ["openai", "anthropic"] as const) {
      const x = s[path];
      L.push(`| ${phase} | ${PATH_LABEL[path]} | ${f(x.p50, 3)} | ${f(x.p99, 3)} | ${f(x.streamsPerS, 1)} | ${f(x.chunksPerS, 0)} | ${phase === "throughput" ? f(x.cpuUsPerStream, 0) : "–"} |`);
    }
  }
  L.push("", "Gateway CPU is given for the throughput phase only: the other batches last many seconds at low load, so the gateway's background work (timers, the spend writer) would be counted against the streams.");
  L.push("", "## Per round", "");
  L.push("| round | phase | path | TTFT p50 ms | TTFT p99 ms | streams/s | chunks/s | gateway CPU µs/stream | machine busy before % | foreign CPU % |");
  L.push("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|");
  for (const r of results) {
    L.push(
      `| ${r.round} | ${r.phase} | ${PATH_LABEL[r.path]} | ${f(median(r.ttft), 3)} | ${f(percentile(r.ttft, 99), 3)} | ${f(streamsPerS(r), 1)} | ${f(chunksPerS(r), 0)} | ${r.phase === "throughput" ? f(cpuPerStream(r), 0) : "–"} | ${r.busyBeforePct} | ${r.foreignPct} |`,
    );
  }
  L.push("");
  return L.join("\n");
}

// ---------------------------------------------------------------------------------------------
// Main

async function main(): Promise<void> {
  // The unpaced OpenAI mock serves the first-token and the throughput phases.
  const perMock = 2 * ROUNDS * (STREAMS + WARMUP) + 10;
  const self = join(REPO, "bench/anthropic-stream.ts");
  const anthropicMock = join(REPO, "test/mock-upstream/anthropic.ts");
  const openaiChild = (delay: number) => startChild(pinned(1, [process.execPath, self, "--serve-openai", "--chunks", String(CHUNKS), "--delay-ms", String(delay), "--faults", String(perMock)]));
  const anthropicChild = (delay: number) =>
    startChild(pinned(1, [process.execPath, anthropicMock, "--api-key", UPSTREAM_KEY, "--reply-words", String(CHUNKS), "--delta-delay-ms", String(delay)]));
  const mocks = {
    "openai-latency": await openaiChild(DELAY_MS),
    "openai-throughput": await openaiChild(0),
    "anthropic-latency": await anthropicChild(DELAY_MS),
    "anthropic-throughput": await anthropicChild(0),
  };
  const upstream: Record<Path, string> = { openai: "openai/gpt-4o-mini", anthropic: "anthropic/claude-3-5-sonnet-20241022" };
  const gw = await spawnGateway(
    {
      model_list: Object.entries(mocks).map(([name, m]) => ({
        model_name: name,
        svc_params: { model: upstream[name.split("-")[0] as Path], api_base: m.url, api_key: UPSTREAM_KEY },
      })),
      general_settings: { master_key: MASTER_KEY },
    },
    { cmd: pinned(0, [process.execPath, join(GATEWAY_ROOT, "core/main.ts")]), env: { SVC_MASTER_KEY: MASTER_KEY } },
  );
  try {
    const pids = [gw.proc.pid, ...Object.values(mocks).map((m) => m.proc.pid)];
    // Same chunk count on both paths, or the comparison means nothing.
    const chunksSeen = { openai: (await oneStream(gw.url, model("openai", "throughput"))).chunks, anthropic: (await oneStream(gw.url, model("anthropic", "throughput"))).chunks };
    console.log(`smoke: ${chunksSeen.openai} chunks per stream via openai, ${chunksSeen.anthropic} via anthropic`);
    const inProcess: Record<Path, InProcess> = {
      openai: timeTransform(openAIChat().stream!, await upstreamBytes("openai", mocks["openai-throughput"].url)),
      anthropic: timeTransform(anthropicChatStream, await upstreamBytes("anthropic", mocks["anthropic-throughput"].url)),
    };
    console.log(`in process: openai ${f(inProcess.openai.usPerStream, 1)} µs/stream, anthropic ${f(inProcess.anthropic.usPerStream, 1)} µs/stream`);
    const results: BatchResult[] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      const order: Path[] = round % 2 === 1 ? ["openai", "anthropic"] : ["anthropic", "openai"];
      for (const phase of ["first-token", "latency", "throughput"] as const) {
        for (const path of order) {
          await batch(gw.url, path, phase, WARMUP, pids, round, 0);
          const busy = await waitQuiet();
          const r = await batch(gw.url, path, phase, STREAMS, pids, round, busy);
          results.push(r);
          console.log(
            `round ${round} ${phase} ${PATH_LABEL[path]}: TTFT p50 ${f(median(r.ttft), 3)} ms p99 ${f(percentile(r.ttft, 99), 3)} ms, ${f(streamsPerS(r), 1)} streams/s, gateway ${f(cpuPerStream(r), 0)} µs/stream, foreign CPU ${r.foreignPct} %`,
          );
        }
      }
    }
    const text = report(results, chunksSeen, inProcess);
    mkdirSync(resolve(OUT, ".."), { recursive: true });
    writeFileSync(OUT, `${text}\n`);
    console.log(`\n${text}\nwritten to ${OUT}`);
  } finally {
    await gw.stop();
    for (const c of children) c.kill();
  }
}

try {
  await main();
} catch (err) {
  for (const c of children) c.kill();
  throw err;
}
