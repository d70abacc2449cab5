/**
 * The gateway's overhead benchmark: one script, one run, one machine, three targets in front of the
 * same fast mock upstream (bench/upstream.ts):
 *
 *   upstream  the mock itself, called directly (a second instance, pinned like the other targets)
 *   bare      bench/bare-proxy.ts, a ~30-line Bun fetch pass-through: the physical limit of a Bun proxy
 *   gateway   core/main.ts with one openai/ deployment pointing at the mock
 *
 * For each round (targets interleaved, order rotated per round), each mode (non-stream, stream) and
 * each target: a wrk warm-up, closed-loop throughput at fixed concurrency (wrk), then open-loop
 * latency at fixed rates (bench/open-loop.ts). Gateway and bare-proxy RSS are read after each round.
 * Writes bench/results/latest.md and bench/results/latest.json. See bench/README.md.
 *
 *   bun bench/run.ts [--rounds 3] [--duration 10] [--rates 500,1000] [--concurrency 64] [--quick]
 */
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { cpus, release, tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import type { Subprocess } from "bun";

// ---------------------------------------------------------------------------------------------
// Options

const { values: flags } = parseArgs({
  args: Bun.argv.slice(2),
  options: {
    rounds: { type: "string" },
    duration: { type: "string" },
    warmup: { type: "string" },
    rates: { type: "string" },
    concurrency: { type: "string" },
    quick: { type: "boolean", default: false },
    targets: { type: "string" },
    modes: { type: "string" },
    "target-core": { type: "string", default: "0" },
    "load-core": { type: "string", default: "1" },
    "gateway-root": { type: "string" },
    "quiet-wait": { type: "string" },
    "quiet-threshold": { type: "string" },
    out: { type: "string" },
    "budget-key": { type: "boolean", default: false },
    "rate-limit-key": { type: "boolean", default: false },
    "plain-key": { type: "boolean", default: false },
    "no-spend-logs": { type: "boolean", default: false },
    "redis-url": { type: "string" },
    "database-url": { type: "string" },
    help: { type: "boolean", short: "h", default: false },
  },
});

const USAGE = `usage: bun bench/run.ts [options]
  --rounds N          repeat the whole matrix N times (default 3; --quick: 1)
  --duration S        seconds per measurement: wrk run and each open-loop rate (default 10; --quick: 3)
  --warmup S          wrk warm-up seconds before each throughput run (default 2; --quick: 1)
  --rates A,B         open-loop rates in req/s (default 500,1000)
  --concurrency C     wrk connections for the throughput run (default 64)
  --quick             smoke run: 1 round, 3 s per measurement
  --targets LIST      subset of upstream,bare,floor,gateway (default upstream,bare,gateway;
                      floor: bench/floor-proxy.ts, the least a proxy that prices calls must do)
  --modes LIST        subset of json,stream (default both)
  --target-core N     core for the targets under test (default 0)
  --load-core N       core for wrk, the open-loop generator and the backend mock (default 1)
  --gateway-root DIR  run core/main.ts from another checkout (e.g. a scratch copy with a change)
  --quiet-wait S      before each measurement, wait up to S seconds for the machine to be idle
                      (default 60; 0 disables): other jobs on the cores make the numbers meaningless
  --quiet-threshold P "idle" = at most P % of one core busy over a 1 s sample (default 15)
  --out DIR           where latest.md / latest.json go (default bench/results)
  --budget-key        call the gateway with a virtual key that has a max_budget (budget
                      reservation on every call) instead of the master key
  --rate-limit-key    call the gateway with a virtual key that has rpm, tpm and parallel limits
                      (every call counted on three windows)
  --plain-key         call the gateway with a virtual key without limits or budget (the baseline
                      for --rate-limit-key and --budget-key)
  --no-spend-logs     run the gateway with general_settings.disable_spend_logs (counters and daily
                      aggregates only, no log row per call)
  --redis-url URL     give the gateway REDIS_URL (limits and budgets counted in Redis)
  --database-url URL  run the gateway on this PostgreSQL database instead of the embedded store
                      (the database server is not pinned: like the upstream, it is outside the target)`;
if (flags.help) {
  console.log(USAGE);
  process.exit(0);
}

const num = (v: string | undefined, d: number) => (v === undefined ? d : Number(v));
const ROUNDS = num(flags.rounds, flags.quick ? 1 : 3);
const DURATION = num(flags.duration, flags.quick ? 3 : 10);
const WARMUP = num(flags.warmup, flags.quick ? 1 : 2);
const RATES = (flags.rates ?? "500,1000").split(",").map(Number);
const CONCURRENCY = num(flags.concurrency, 64);
const TARGET_CORE = flags["target-core"]!;
const LOAD_CORE = flags["load-core"]!;
const QUIET_WAIT = num(flags["quiet-wait"], 60);
const QUIET_THRESHOLD = num(flags["quiet-threshold"], 15);
const BENCH_DIR = import.meta.dir;
const REPO = resolve(BENCH_DIR, "..");
const GATEWAY_ROOT = resolve(flags["gateway-root"] ?? REPO);
const OUT_DIR = resolve(flags.out ?? join(BENCH_DIR, "results"));
const MASTER_KEY = "sk-bench-master-key-0123456789";
const UPSTREAM_KEY = "sk-upstream";

type TargetName = "upstream" | "bare" | "floor" | "gateway";
type Mode = "json" | "stream";
/** `floor` is opt-in (`--targets upstream,bare,floor,gateway`): it is context, not part of the verdict. */
const ALL_TARGETS: TargetName[] = ["upstream", "bare", "floor", "gateway"];
const TARGETS = (flags.targets?.split(",") ?? ["upstream", "bare", "gateway"]) as TargetName[];
const MODES = (flags.modes?.split(",") ?? ["json", "stream"]) as Mode[];
for (const t of TARGETS) if (!ALL_TARGETS.includes(t)) throw new Error(`unknown target ${t}`);
for (const m of MODES) if (m !== "json" && m !== "stream") throw new Error(`unknown mode ${m}`);
for (const v of [ROUNDS, DURATION, WARMUP, CONCURRENCY, ...RATES]) if (!Number.isFinite(v) || v <= 0) throw new Error(`bad numeric option: ${v}`);

const TARGET_LABEL: Record<TargetName, string> = { upstream: "upstream (direct)", bare: "bare proxy", floor: "floor (prices)", gateway: "gateway" };
const MODE_LABEL: Record<Mode, string> = { json: "non-stream", stream: "stream" };

const requestBody = (mode: Mode) =>
  JSON.stringify({
    model: "bench-model",
    messages: [
      { role: "system", content: "You are a helpful assistant." },
      { role: "user", content: "Say something short about benchmarks." },
    ],
    temperature: 0.7,
    max_tokens: 64,
    ...(mode === "stream" ? { stream: true } : {}),
  });

// ---------------------------------------------------------------------------------------------
// Child processes: every one is tracked and killed on exit, error or signal.

const children = new Set<Subprocess>();
let workDir: string | undefined;
let cleaning: Promise<void> | undefined;
let interrupted = false;
/** The backend mock every proxy target calls (its CPU counts as the benchmark's own, not foreign). */
let backendPid = -1;

function track<T extends Subprocess>(p: T): T {
  children.add(p);
  void p.exited.then(() => children.delete(p));
  return p;
}

/** Stops every child and removes the work folder; every caller awaits the same run. */
function cleanup(): Promise<void> {
  cleaning ??= stopAll();
  return cleaning;
}

async function stopAll(): Promise<void> {
  const all = [...children];
  for (const p of all) p.kill("SIGTERM");
  await Promise.race([Promise.all(all.map((p) => p.exited)), Bun.sleep(3000)]);
  for (const p of children) p.kill("SIGKILL");
  if (workDir) rmSync(workDir, { recursive: true, force: true });
}

process.on("exit", () => {
  for (const p of children) p.kill("SIGKILL");
});
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
  process.on(sig, () => {
    interrupted = true;
    console.error(`\n${sig}: stopping every benchmark process`);
    void cleanup().finally(() => process.exit(130));
  });
}

const pinned = (core: string, cmd: string[]) => ["taskset", "-c", core, ...cmd];

interface Service {
  name: string;
  proc: Subprocess;
  url: string;
  log: string;
}

/** Starts a long-running service with its output in a log file; resolves once it prints its URL. */
async function startService(name: string, core: string, cmd: string[], pattern: RegExp, env?: Record<string, string>, cwd?: string): Promise<Service> {
  const log = join(workDir!, `${name}.log`);
  const proc = track(
    Bun.spawn(pinned(core, cmd), {
      cwd: cwd ?? REPO,
      env: { ...process.env, ...env },
      stdout: Bun.file(log),
      stderr: Bun.file(`${log}.err`),
      stdin: "ignore",
    }),
  );
  const deadline = Date.now() + 90_000;
  while (Date.now() < deadline) {
    const text = await Bun.file(log)
      .text()
      .catch(() => "");
    const m = text.match(pattern);
    if (m) return { name, proc, url: m[1]!, log };
    if (proc.exitCode !== null || proc.signalCode !== null) break;
    await Bun.sleep(50);
  }
  const out = `${await Bun.file(log).text().catch(() => "")}${await Bun.file(`${log}.err`).text().catch(() => "")}`;
  throw new Error(`${name} did not become ready (exit ${proc.exitCode}); its output:\n${out.slice(-3000)}`);
}

/** Runs a short-lived command (wrk, the open-loop generator); `cpuSeconds` is what it used. */
async function run(cmd: string[]): Promise<{ code: number; stdout: string; stderr: string; cpuSeconds: number }> {
  const p = track(Bun.spawn(cmd, { stdout: "pipe", stderr: "pipe", stdin: "ignore", cwd: REPO }));
  const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  const usage = p.resourceUsage();
  return { code, stdout, stderr, cpuSeconds: usage ? Number(usage.cpuTime.total) / 1e6 : 0 };
}

// ---------------------------------------------------------------------------------------------
// /proc readings

function memOf(pid: number): { rssMiB: number; hwmMiB: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (key: string) => Number(status.match(new RegExp(`^${key}:\\s+(\\d+) kB`, "m"))?.[1] ?? Number.NaN);
  return { rssMiB: round(kb("VmRSS") / 1024, 1), hwmMiB: round(kb("VmHWM") / 1024, 1) };
}

const CLK_TCK = Number(Bun.spawnSync(["getconf", "CLK_TCK"]).stdout.toString().trim()) || 100;

/** utime + stime of a process (all its threads), in seconds. */
function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
}

/** Busy and total jiffies per core, from /proc/stat. */
function coreTimes(): Map<string, { busy: number; total: number }> {
  const out = new Map<string, { busy: number; total: number }>();
  for (const line of readFileSync("/proc/stat", "utf8").split("\n")) {
    const m = line.match(/^cpu(\d+)\s+(.*)$/);
    if (!m) continue;
    const v = m[2]!.split(/\s+/).map(Number);
    const idle = v[3]! + (v[4] ?? 0);
    const total = v.slice(0, 8).reduce((a, b) => a + b, 0);
    out.set(m[1]!, { busy: total - idle, total });
  }
  return out;
}

/**
 * CPU accounting around one measurement: the target's CPU, each core's busy share, and "foreign"
 * CPU, i.e. busy time on the two cores that none of the benchmark's processes used (other jobs on
 * the machine). Foreign CPU is noise the numbers cannot correct for; the report shows it.
 */
interface CpuReport {
  /** CPU used by the target process during the run, % of one core. */
  targetCpuPct: number;
  /** The same in seconds (for CPU per request). */
  targetCpuSeconds: number;
  targetCoreBusyPct: number;
  loadCoreBusyPct: number;
  /** Busy time on the target and load cores not used by the target, the backend mock or the load generator, % of one core. */
  foreignCpuPct: number;
}

function startCpuMeter(targetPid: number, backendPid: number): (generatorCpuSeconds: number) => CpuReport {
  const t0 = performance.now();
  const cores0 = coreTimes();
  const target0 = cpuSeconds(targetPid);
  const backend0 = targetPid === backendPid ? 0 : cpuSeconds(backendPid);
  return (generatorCpuSeconds) => {
    const elapsed = (performance.now() - t0) / 1000;
    const cores1 = coreTimes();
    const target = cpuSeconds(targetPid) - target0;
    const backend = targetPid === backendPid ? 0 : cpuSeconds(backendPid) - backend0;
    const busy = (core: string) => {
      const a = cores0.get(core);
      const b = cores1.get(core);
      return a && b ? (b.busy - a.busy) / CLK_TCK : Number.NaN;
    };
    const ours = target + backend + generatorCpuSeconds;
    return {
      targetCpuPct: round((100 * target) / elapsed, 0),
      targetCpuSeconds: round(target, 3),
      targetCoreBusyPct: coreBusyPercent(cores0, cores1, TARGET_CORE),
      loadCoreBusyPct: coreBusyPercent(cores0, cores1, LOAD_CORE),
      foreignCpuPct: round(Math.max(0, (100 * (busy(TARGET_CORE) + busy(LOAD_CORE) - ours)) / elapsed), 0),
    };
  };
}

function coreBusyPercent(before: ReturnType<typeof coreTimes>, after: ReturnType<typeof coreTimes>, core: string): number {
  const a = before.get(core);
  const b = after.get(core);
  if (!a || !b || b.total === a.total) return Number.NaN;
  return round((100 * (b.busy - a.busy)) / (b.total - a.total), 0);
}

/** CPU busy on all cores over `ms`, in % of one core. */
async function machineBusyPct(ms: number): Promise<number> {
  const a = coreTimes();
  await Bun.sleep(ms);
  const b = coreTimes();
  let busy = 0;
  let total = 0;
  for (const [core, x] of b) {
    const y = a.get(core);
    if (!y) continue;
    busy += x.busy - y.busy;
    total += x.total - y.total;
  }
  return total === 0 ? 0 : (100 * busy * b.size) / total;
}

/** Waits (bounded) until other jobs leave the cores alone; returns the seconds waited and the last busy reading. */
async function waitQuiet(): Promise<{ waitedS: number; busyPct: number }> {
  const t0 = performance.now();
  let busy = 0;
  let announced = false;
  for (;;) {
    busy = await machineBusyPct(1000);
    const waited = (performance.now() - t0) / 1000;
    if (QUIET_WAIT <= 0 || busy <= QUIET_THRESHOLD || waited >= QUIET_WAIT) return { waitedS: round(waited, 0), busyPct: round(busy, 0) };
    if (!announced) {
      process.stdout.write(`  (machine busy: ${round(busy, 0)} % of a core used by other processes; waiting up to ${QUIET_WAIT} s)\n`);
      announced = true;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Measurements

interface Target {
  name: TargetName;
  url: string;
  headers: Record<string, string>;
  pid: number;
}

interface ThroughputResult extends CpuReport {
  /** Machine-wide busy % (of one core) just before the run, after waiting for quiet. */
  busyBeforePct: number;
  rps: number;
  requests: number;
  non2xx: number;
  socketErrors: number;
  avgLatencyMs: number | null;
  /** Target CPU time per completed request, µs: less sensitive to other load than req/s. */
  cpuUsPerRequest: number;
}

interface OpenLoopResult {
  rate: number;
  sent: number;
  ok: number;
  errors: number;
  errorSamples: Record<string, number>;
  maxOutstanding: number;
  latencyMs: { n: number; mean: number | null; p50: number | null; p90: number | null; p99: number | null; p999: number | null; max: number | null };
  schedulerLatenessMs: { p50: number | null; p99: number | null; max: number | null };
  cpu: CpuReport;
}

function wrkScript(target: Target, mode: Mode): string {
  const path = join(workDir!, `wrk-${target.name}-${mode}.lua`);
  const lines = ['wrk.method = "POST"', `wrk.body = [==[${requestBody(mode)}]==]`, 'wrk.headers["Content-Type"] = "application/json"'];
  for (const [k, v] of Object.entries(target.headers)) lines.push(`wrk.headers["${k}"] = "${v}"`);
  writeFileSync(path, `${lines.join("\n")}\n`);
  return path;
}

function wrkCmd(target: Target, script: string, seconds: number): string[] {
  return pinned(LOAD_CORE, ["wrk", "-t1", `-c${CONCURRENCY}`, `-d${seconds}s`, "--timeout", "5s", "-s", script, target.url]);
}

function parseWrk(out: string): Omit<ThroughputResult, keyof CpuReport | "cpuUsPerRequest" | "busyBeforePct"> {
  const rps = Number(out.match(/Requests\/sec:\s+([\d.]+)/)?.[1]);
  if (!Number.isFinite(rps)) throw new Error(`could not parse wrk output:\n${out}`);
  const requests = Number(out.match(/(\d+) requests in/)?.[1] ?? 0);
  const non2xx = Number(out.match(/Non-2xx or 3xx responses:\s+(\d+)/)?.[1] ?? 0);
  const sock = out.match(/Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/);
  const socketErrors = sock ? sock.slice(1).reduce((a, b) => a + Number(b), 0) : 0;
  const lat = out.match(/Latency\s+([\d.]+)(us|ms|s)\b/);
  const avgLatencyMs = lat ? Number(lat[1]) * (lat[2] === "us" ? 0.001 : lat[2] === "s" ? 1000 : 1) : null;
  return { rps, requests, non2xx, socketErrors, avgLatencyMs };
}

async function throughput(target: Target, mode: Mode): Promise<ThroughputResult> {
  const script = wrkScript(target, mode);
  const quiet = await waitQuiet();
  const warm = await run(wrkCmd(target, script, WARMUP));
  if (warm.code !== 0) throw new Error(`wrk warm-up failed: ${warm.stderr || warm.stdout}`);
  const meter = startCpuMeter(target.pid, backendPid);
  const r = await run(wrkCmd(target, script, DURATION));
  const cpu = meter(r.cpuSeconds);
  if (r.code !== 0) throw new Error(`wrk failed: ${r.stderr || r.stdout}`);
  const parsed = parseWrk(r.stdout);
  return { ...parsed, ...cpu, busyBeforePct: quiet.busyPct, cpuUsPerRequest: round((1e6 * cpu.targetCpuSeconds) / Math.max(1, parsed.requests), 1) };
}

async function openLoop(target: Target, mode: Mode, rate: number): Promise<OpenLoopResult> {
  const args = ["bun", join(BENCH_DIR, "open-loop.ts"), "--url", target.url, "--rate", String(rate), "--duration", String(DURATION), "--warmup", "1", "--body", requestBody(mode)];
  for (const [k, v] of Object.entries(target.headers)) args.push("--header", `${k}: ${v}`);
  if (mode === "stream") args.push("--expect-done");
  await waitQuiet();
  const meter = startCpuMeter(target.pid, backendPid);
  const r = await run(pinned(LOAD_CORE, args));
  const cpu = meter(r.cpuSeconds);
  const last = r.stdout.trim().split("\n").at(-1) ?? "";
  if (r.code !== 0 || !last.startsWith("{")) throw new Error(`open-loop generator failed (exit ${r.code}):\n${r.stderr}\n${r.stdout}`);
  return { ...(JSON.parse(last) as Omit<OpenLoopResult, "cpu">), cpu };
}

/** One request per target and mode before measuring: a benchmark of error pages is worthless. */
async function smokeCheck(target: Target, mode: Mode): Promise<void> {
  const res = await fetch(target.url, { method: "POST", headers: { "content-type": "application/json", ...target.headers }, body: requestBody(mode) });
  const text = await res.text();
  const good = res.status === 200 && (mode === "stream" ? text.trimEnd().endsWith("data: [DONE]") && text.includes("chat.completion.chunk") : text.includes('"chat.completion"'));
  if (!good) throw new Error(`${target.name} ${mode}: unexpected answer ${res.status}: ${text.slice(0, 500)}`);
}

// ---------------------------------------------------------------------------------------------
// Statistics and formatting

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

function median(xs: number[]): number {
  const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return Number.NaN;
  const m = Math.floor(v.length / 2);
  return v.length % 2 ? v[m]! : (v[m - 1]! + v[m]!) / 2;
}

const fmt = (x: number | null | undefined, digits = 3) => (x === null || x === undefined || !Number.isFinite(x) ? "–" : x.toFixed(digits));
const fmtInt = (x: number) => (Number.isFinite(x) ? Math.round(x).toLocaleString("en-US") : "–");

interface RunRecord {
  round: number;
  target: TargetName;
  mode: Mode;
  throughput: ThroughputResult;
  openLoop: OpenLoopResult[];
}

interface Summary {
  target: TargetName;
  mode: Mode;
  rpsRounds: number[];
  rpsMedian: number;
  targetCpuPctMedian: number;
  cpuUsPerRequestRounds: number[];
  cpuUsPerRequestMedian: number;
  loadCoreBusyPctMedian: number;
  foreignCpuPctRounds: number[];
  errors: number;
  latency: {
    rate: number;
    p50Rounds: number[];
    p50: number;
    p90: number;
    p99Rounds: number[];
    p99: number;
    max: number;
    errors: number;
    latenessP50: number;
    targetCpuPctMedian: number;
    foreignCpuPctRounds: number[];
  }[];
}

function summarize(records: RunRecord[]): Summary[] {
  const out: Summary[] = [];
  for (const mode of MODES) {
    for (const target of TARGETS) {
      const rs = records.filter((r) => r.target === target && r.mode === mode).sort((a, b) => a.round - b.round);
      if (rs.length === 0) continue;
      out.push({
        target,
        mode,
        rpsRounds: rs.map((r) => r.throughput.rps),
        rpsMedian: median(rs.map((r) => r.throughput.rps)),
        targetCpuPctMedian: median(rs.map((r) => r.throughput.targetCpuPct)),
        cpuUsPerRequestRounds: rs.map((r) => r.throughput.cpuUsPerRequest),
        cpuUsPerRequestMedian: median(rs.map((r) => r.throughput.cpuUsPerRequest)),
        loadCoreBusyPctMedian: median(rs.map((r) => r.throughput.loadCoreBusyPct)),
        foreignCpuPctRounds: rs.map((r) => r.throughput.foreignCpuPct),
        errors: rs.reduce((a, r) => a + r.throughput.non2xx + r.throughput.socketErrors, 0),
        latency: RATES.map((rate) => {
          const ls = rs.map((r) => r.openLoop.find((o) => o.rate === rate)!);
          return {
            rate,
            p50Rounds: ls.map((l) => l.latencyMs.p50 ?? Number.NaN),
            p50: median(ls.map((l) => l.latencyMs.p50 ?? Number.NaN)),
            p90: median(ls.map((l) => l.latencyMs.p90 ?? Number.NaN)),
            p99Rounds: ls.map((l) => l.latencyMs.p99 ?? Number.NaN),
            p99: median(ls.map((l) => l.latencyMs.p99 ?? Number.NaN)),
            max: Math.max(...ls.map((l) => l.latencyMs.max ?? Number.NaN)),
            errors: ls.reduce((a, l) => a + l.errors, 0),
            latenessP50: median(ls.map((l) => l.schedulerLatenessMs.p50 ?? Number.NaN)),
            targetCpuPctMedian: median(ls.map((l) => l.cpu.targetCpuPct)),
            foreignCpuPctRounds: ls.map((l) => l.cpu.foreignCpuPct),
          };
        }),
      });
    }
  }
  return out;
}

interface Verdict {
  check: string;
  value: string;
  goal: string;
  pass: boolean | null;
}

function verdicts(sums: Summary[]): Verdict[] {
  const out: Verdict[] = [];
  const get = (t: TargetName, m: Mode) => sums.find((s) => s.target === t && s.mode === m);
  for (const mode of MODES) {
    const g = get("gateway", mode);
    const b = get("bare", mode);
    if (!g || !b) continue;
    const ratio = g.rpsMedian / b.rpsMedian;
    out.push({ check: `${MODE_LABEL[mode]}: gateway / bare proxy throughput`, value: `${(100 * ratio).toFixed(1)} %`, goal: "≥ 85 %", pass: ratio >= 0.85 });
    const cpuRatio = b.cpuUsPerRequestMedian / g.cpuUsPerRequestMedian;
    out.push({
      check: `${MODE_LABEL[mode]}: bare / gateway CPU per request (throughput if both were CPU-bound)`,
      value: `${(100 * cpuRatio).toFixed(1)} % (${fmt(g.cpuUsPerRequestMedian, 1)} vs ${fmt(b.cpuUsPerRequestMedian, 1)} µs)`,
      goal: "≥ 85 %",
      pass: cpuRatio >= 0.85,
    });
    const rate = RATES.includes(1000) ? 1000 : RATES.at(-1)!;
    const gl = g.latency.find((l) => l.rate === rate)!;
    const bl = b.latency.find((l) => l.rate === rate)!;
    const d50 = gl.p50 - bl.p50;
    const d99 = gl.p99 - bl.p99;
    out.push({ check: `${MODE_LABEL[mode]}: p50 gateway − bare @ ${rate} req/s`, value: `${d50 >= 0 ? "+" : ""}${d50.toFixed(3)} ms`, goal: "≤ 0.2 ms", pass: d50 <= 0.2 });
    out.push({ check: `${MODE_LABEL[mode]}: p99 gateway − bare @ ${rate} req/s`, value: `${d99 >= 0 ? "+" : ""}${d99.toFixed(3)} ms`, goal: "≤ 1 ms", pass: d99 <= 1 });
  }
  return out;
}

interface Machine {
  date: string;
  nproc: number;
  cpuModel: string;
  kernel: string;
  bun: string;
  wrk: string;
  memTotalGiB: number;
}

function machineInfo(wrkVersion: string): Machine {
  const cpuinfo = readFileSync("/proc/cpuinfo", "utf8");
  const meminfo = readFileSync("/proc/meminfo", "utf8");
  return {
    date: new Date().toISOString(),
    nproc: cpus().length,
    cpuModel: cpuinfo.match(/^model name\s*:\s*(.+)$/m)?.[1]?.trim() ?? "unknown",
    kernel: release(),
    bun: Bun.version,
    wrk: wrkVersion,
    memTotalGiB: round(Number(meminfo.match(/MemTotal:\s+(\d+)/)?.[1] ?? 0) / 1024 / 1024, 1),
  };
}

interface Memory {
  when: string;
  gateway?: { rssMiB: number; hwmMiB: number };
  bare?: { rssMiB: number; hwmMiB: number };
}

function markdown(machine: Machine, sums: Summary[], checks: Verdict[], memory: Memory[], notes: string[]): string {
  const L: string[] = [];
  const rounds = Math.max(...sums.map((s) => s.rpsRounds.length));
  L.push("# Gateway overhead benchmark", "");
  L.push(`- date: ${machine.date}`);
  L.push(`- machine: ${machine.nproc} cores (${machine.cpuModel}), ${machine.memTotalGiB} GiB, Linux ${machine.kernel}`);
  L.push(`- bun ${machine.bun}, ${machine.wrk}`);
  L.push(
    `- pinning: targets under test (direct mock instance, bare proxy, gateway) on core ${TARGET_CORE}; wrk, the open-loop generator and the backend mock on core ${LOAD_CORE}`,
  );
  L.push(
    `- settings: ${rounds} round(s), targets interleaved (order rotated per round); throughput = wrk -t1 -c${CONCURRENCY} for ${DURATION} s after a ${WARMUP} s warm-up; latency = open loop at ${RATES.join(" and ")} req/s for ${DURATION} s (after 1 s unrecorded), measured from the scheduled send time to the last body byte`,
  );
  for (const n of notes) L.push(`- ${n}`);
  L.push("");

  if (checks.length > 0) {
    L.push("## Targets", "", "| check | measured (medians) | goal | |", "|---|---:|---|---|");
    for (const c of checks) L.push(`| ${c.check} | ${c.value} | ${c.goal} | ${c.pass === null ? "" : c.pass ? "PASS" : "**MISS**"} |`);
    L.push("");
  }

  L.push(`## Throughput (closed loop, ${CONCURRENCY} connections), req/s`, "");
  const roundCols = Array.from({ length: rounds }, (_, i) => `round ${i + 1}`);
  L.push(`| mode | target | ${roundCols.join(" | ")} | median | vs bare | target CPU % | target CPU µs/req per round | **µs/req** | load core busy % | foreign CPU % per round | errors |`);
  L.push(`|---|---|${roundCols.map(() => "---:").join("|")}|---:|---:|---:|---|---:|---:|---|---:|`);
  for (const s of sums) {
    const bare = sums.find((x) => x.mode === s.mode && x.target === "bare");
    const vs = bare ? `${((100 * s.rpsMedian) / bare.rpsMedian).toFixed(1)} %` : "–";
    L.push(
      `| ${MODE_LABEL[s.mode]} | ${TARGET_LABEL[s.target]} | ${s.rpsRounds.map(fmtInt).join(" | ")} | **${fmtInt(s.rpsMedian)}** | ${vs} | ${fmt(s.targetCpuPctMedian, 0)} | ${s.cpuUsPerRequestRounds.map((x) => fmt(x, 1)).join(" / ")} | **${fmt(s.cpuUsPerRequestMedian, 1)}** | ${fmt(s.loadCoreBusyPctMedian, 0)} | ${s.foreignCpuPctRounds.join(" / ")} | ${s.errors} |`,
    );
  }
  L.push("");

  L.push("## Latency (open loop), ms", "");
  L.push("| mode | rate req/s | target | p50 per round | **p50** | p90 | p99 per round | **p99** | max | Δp50 vs bare | Δp99 vs bare | target CPU % | foreign CPU % per round | errors |");
  L.push("|---|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|");
  for (const mode of MODES) {
    for (const rate of RATES) {
      for (const s of sums.filter((x) => x.mode === mode)) {
        const l = s.latency.find((x) => x.rate === rate)!;
        const b = sums.find((x) => x.mode === mode && x.target === "bare")?.latency.find((x) => x.rate === rate);
        const d = (x: number) => (b && s.target !== "bare" ? `${x >= 0 ? "+" : ""}${x.toFixed(3)}` : "–");
        L.push(
          `| ${MODE_LABEL[mode]} | ${rate} | ${TARGET_LABEL[s.target]} | ${l.p50Rounds.map((x) => fmt(x)).join(" / ")} | **${fmt(l.p50)}** | ${fmt(l.p90)} | ${l.p99Rounds.map((x) => fmt(x)).join(" / ")} | **${fmt(l.p99)}** | ${fmt(l.max)} | ${b ? d(l.p50 - b.p50) : "–"} | ${b ? d(l.p99 - b.p99) : "–"} | ${fmt(l.targetCpuPctMedian, 0)} | ${l.foreignCpuPctRounds.join(" / ")} | ${l.errors} |`,
        );
      }
    }
  }
  const lateness = median(sums.flatMap((s) => s.latency.map((l) => l.latenessP50)));
  L.push("", `The generator's own scheduling lateness (send time − scheduled time) has a median p50 of ${fmt(lateness)} ms; it is included in every latency above, equally for all targets.`, "");

  if (memory.length > 0) {
    L.push("## Memory (VmRSS / VmHWM peak), MiB", "", "| when | gateway RSS | gateway peak | bare proxy RSS | bare proxy peak |", "|---|---:|---:|---:|---:|");
    for (const m of memory) L.push(`| ${m.when} | ${fmt(m.gateway?.rssMiB, 1)} | ${fmt(m.gateway?.hwmMiB, 1)} | ${fmt(m.bare?.rssMiB, 1)} | ${fmt(m.bare?.hwmMiB, 1)} |`);
    L.push("");
  }
  return L.join("\n");
}

// ---------------------------------------------------------------------------------------------
// Main

async function main(): Promise<void> {
  if (cpus().length < 2) console.warn("warning: fewer than 2 cores; target and load generator share a core");
  const wrkV = Bun.spawnSync(["wrk", "-v"]);
  const wrkVersion = `${wrkV.stdout.toString()}${wrkV.stderr.toString()}`.match(/wrk [^\s]+/)?.[0];
  if (!wrkVersion) throw new Error("wrk not found: apt-get install -y wrk");
  const machine = machineInfo(wrkVersion);

  workDir = mkdtempSync(join(tmpdir(), "svc-bench-"));
  console.log(`# ${machine.nproc} cores, ${machine.cpuModel}, bun ${machine.bun}, ${machine.wrk}`);
  console.log(`# pinning: targets on core ${TARGET_CORE}; wrk + open-loop generator + backend mock on core ${LOAD_CORE}`);
  if (machine.nproc <= 2)
    console.log("# note: with 2 cores the load generator and the backend mock share a core; the proxy targets also make an upstream call, so their numbers include contention on that core (see bench/README.md)");
  console.log(`# ${ROUNDS} round(s), ${DURATION} s per measurement, rates ${RATES.join(",")} req/s, concurrency ${CONCURRENCY}`);

  const listening = /listening (?:on )?(http:\/\/[^\s"]+)/;
  const backend = await startService("mock-backend", LOAD_CORE, ["bun", join(BENCH_DIR, "upstream.ts"), "--port", "0"], listening);
  backendPid = backend.proc.pid;
  const services: Partial<Record<TargetName, Service>> = {};
  const targets: Target[] = [];
  if (TARGETS.includes("upstream")) {
    services.upstream = await startService("mock-direct", TARGET_CORE, ["bun", join(BENCH_DIR, "upstream.ts"), "--port", "0"], listening);
  }
  if (TARGETS.includes("bare")) {
    services.bare = await startService("bare-proxy", TARGET_CORE, ["bun", join(BENCH_DIR, "bare-proxy.ts"), "--port", "0", "--upstream", backend.url], listening);
  }
  if (TARGETS.includes("floor")) {
    services.floor = await startService("floor-proxy", TARGET_CORE, ["bun", join(BENCH_DIR, "floor-proxy.ts"), "--port", "0", "--upstream", backend.url], listening);
  }
  if (TARGETS.includes("gateway")) {
    const config = join(workDir, "config.yaml");
    writeFileSync(
      config,
      [
        "model_list:",
        "  - model_name: bench-model",
        `    svc_params: { model: openai/bench-model, api_base: ${backend.url}, api_key: ${UPSTREAM_KEY} }`,
        // Priced like gpt-4o, so every call is costed, logged with its spend and counted against budgets.
        "    model_info: { input_cost_per_token: 0.0000025, output_cost_per_token: 0.00001 }",
        `general_settings: { master_key: os.environ/SVC_MASTER_KEY${flags["no-spend-logs"] ? ", disable_spend_logs: true" : ""} }`,
        "",
      ].join("\n"),
    );
    const dataDir = join(workDir, "data");
    mkdirSync(dataDir);
    services.gateway = await startService(
      "gateway",
      TARGET_CORE,
      ["bun", join(GATEWAY_ROOT, "core/main.ts"), "--config", config, "--port", "0", "--host", "127.0.0.1", "--data-dir", dataDir],
      listening,
      { SVC_MASTER_KEY: MASTER_KEY, SVC_DRAIN_TIMEOUT: "2", ...(flags["database-url"] ? { DATABASE_URL: flags["database-url"] } : {}), ...(flags["redis-url"] ? { REDIS_URL: flags["redis-url"] } : {}) },
      GATEWAY_ROOT,
    );
  }
  const base = (u: string) => u.replace(/\/v1\/?$/, "").replace(/\/+$/, "");
  let gatewayKey = MASTER_KEY;
  if (flags["budget-key"] && services.gateway) {
    const res = await fetch(`${base(services.gateway.url)}/key/generate`, {
      method: "POST",
      headers: { Authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ key_alias: "bench-budget", max_budget: 1_000_000, budget_duration: "30d" }),
    });
    if (!res.ok) throw new Error(`could not create the bench key: ${res.status} ${await res.text()}`);
    gatewayKey = ((await res.json()) as { key: string }).key;
    console.log("# gateway called with a virtual key with max_budget (budget reservation and spend logging on every call)");
  }
  if (flags["plain-key"] && services.gateway) {
    const res = await fetch(`${base(services.gateway.url)}/key/generate`, {
      method: "POST",
      headers: { Authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ key_alias: "bench-plain" }),
    });
    if (!res.ok) throw new Error(`could not create the bench key: ${res.status} ${await res.text()}`);
    gatewayKey = ((await res.json()) as { key: string }).key;
    console.log("# gateway called with a virtual key without limits or budget");
  }
  if (flags["rate-limit-key"] && services.gateway) {
    const res = await fetch(`${base(services.gateway.url)}/key/generate`, {
      method: "POST",
      headers: { Authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ key_alias: "bench-limits", rpm_limit: 1_000_000_000, tpm_limit: 1_000_000_000_000, max_parallel_requests: 100_000 }),
    });
    if (!res.ok) throw new Error(`could not create the bench key: ${res.status} ${await res.text()}`);
    gatewayKey = ((await res.json()) as { key: string }).key;
    console.log(`# gateway called with a virtual key with rpm, tpm and parallel limits (${flags["redis-url"] ? "in Redis" : "in memory"})`);
  }
  for (const name of TARGETS) {
    const s = services[name]!;
    targets.push({
      name,
      url: `${base(s.url)}/v1/chat/completions`,
      headers: name === "gateway" ? { Authorization: `Bearer ${gatewayKey}` } : { Authorization: `Bearer ${UPSTREAM_KEY}` },
      pid: s.proc.pid,
    });
    console.log(`# ${TARGET_LABEL[name]}: ${s.url} (pid ${s.proc.pid})`);
  }
  for (const t of targets) for (const m of MODES) await smokeCheck(t, m);

  const memory: Memory[] = [];
  const readMem = (when: string) => {
    const m: Memory = { when };
    if (services.gateway) m.gateway = memOf(services.gateway.proc.pid);
    if (services.bare) m.bare = memOf(services.bare.proc.pid);
    memory.push(m);
    console.log(`  memory ${when}: gateway ${m.gateway ? `${m.gateway.rssMiB} MiB (peak ${m.gateway.hwmMiB})` : "–"}, bare proxy ${m.bare ? `${m.bare.rssMiB} MiB` : "–"}`);
  };
  readMem("after start-up (idle)");

  const records: RunRecord[] = [];
  const started = performance.now();
  for (let round = 1; round <= ROUNDS; round++) {
    console.log(`\n## round ${round}/${ROUNDS}`);
    const order = targets.map((_, i) => targets[(i + round - 1) % targets.length]!);
    for (const mode of MODES) {
      for (const t of order) {
        const tp = await throughput(t, mode);
        const ol: OpenLoopResult[] = [];
        for (const rate of RATES) ol.push(await openLoop(t, mode, rate));
        records.push({ round, target: t.name, mode, throughput: tp, openLoop: ol });
        const lat = ol
          .map((o) => `@${o.rate}: p50 ${fmt(o.latencyMs.p50)} p99 ${fmt(o.latencyMs.p99)} ms${o.errors ? ` (${o.errors} errors)` : ""} [foreign ${o.cpu.foreignCpuPct} %]`)
          .join(", ");
        console.log(
          `  ${MODE_LABEL[mode].padEnd(10)} ${TARGET_LABEL[t.name].padEnd(17)} ${fmtInt(tp.rps).padStart(7)} req/s (target CPU ${tp.targetCpuPct} %, ${tp.cpuUsPerRequest} µs/req, load core ${tp.loadCoreBusyPct} %, foreign ${tp.foreignCpuPct} %${tp.non2xx + tp.socketErrors ? `, ${tp.non2xx} non-2xx, ${tp.socketErrors} socket errors` : ""})  ${lat}`,
        );
      }
    }
    readMem(`after round ${round}`);
  }

  const sums = summarize(records);
  const checks = verdicts(sums);
  const notes = [`wall time of the matrix: ${Math.round((performance.now() - started) / 1000)} s`];
  if (GATEWAY_ROOT !== REPO) notes.push(`gateway run from ${GATEWAY_ROOT} (not this checkout)`);
  if (flags["no-spend-logs"]) notes.push("gateway run with general_settings.disable_spend_logs: true (spend counters and daily aggregates, no log row per call)");
  const md = markdown(machine, sums, checks, memory, notes);
  mkdirSync(OUT_DIR, { recursive: true });
  writeFileSync(join(OUT_DIR, "latest.md"), `${md}\n`);
  writeFileSync(
    join(OUT_DIR, "latest.json"),
    `${JSON.stringify(
      {
        machine,
        settings: { rounds: ROUNDS, durationS: DURATION, warmupS: WARMUP, rates: RATES, concurrency: CONCURRENCY, targetCore: TARGET_CORE, loadCore: LOAD_CORE, gatewayRoot: GATEWAY_ROOT },
        summary: sums,
        checks,
        memory,
        runs: records,
      },
      null,
      2,
    )}\n`,
  );
  console.log(`\n${md}`);
  console.log(`\nwritten: ${join(OUT_DIR, "latest.md")}, ${join(OUT_DIR, "latest.json")}`);
}

try {
  await main();
} catch (err) {
  // After a signal, the measurement in flight fails because its processes were stopped: not news.
  if (!interrupted) console.error(`bench failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
  process.exitCode = interrupted ? 130 : 1;
} finally {
  await cleanup();
}
process.exit(interrupted ? 130 : (process.exitCode ?? 0));
