/**
 * Open-loop load: sends requests at a fixed rate whatever the target's latency, and measures each
 * latency from the request's *scheduled* send time to the last byte of its body (for SSE, the end
 * of the stream), so a stalled target is charged for the requests queued behind the stall
 * (no coordinated omission). Prints one JSON object on stdout.
 *
 *   bun bench/open-loop.ts --url http://127.0.0.1:4000/v1/chat/completions --rate 1000 --duration 10 \
 *     --body '{"model":"bench-model",...}' --header 'authorization: Bearer sk-...' [--warmup 1] [--expect-done]
 */
import { parseArgs } from "node:util";

const { values } = parseArgs({
  args: Bun.argv.slice(2),
  options: {
    url: { type: "string" },
    rate: { type: "string", default: "1000" },
    duration: { type: "string", default: "10" },
    warmup: { type: "string", default: "1" },
    body: { type: "string", default: "{}" },
    header: { type: "string", multiple: true, default: [] },
    timeout: { type: "string", default: "10" },
    "expect-done": { type: "boolean", default: false },
  },
});
if (!values.url) throw new Error("--url is required");
const url = values.url;
const rate = Number(values.rate);
const duration = Number(values.duration);
const warmup = Number(values.warmup);
const timeoutMs = Number(values.timeout) * 1000;
const expectDone = values["expect-done"];
const headers: Record<string, string> = { "content-type": "application/json" };
for (const h of values.header) {
  const i = h.indexOf(":");
  headers[h.slice(0, i).trim().toLowerCase()] = h.slice(i + 1).trim();
}
const body = values.body;

const intervalMs = 1000 / rate;
const warmCount = Math.round(rate * warmup);
const count = warmCount + Math.round(rate * duration);

const latency = new Float64Array(count).fill(Number.NaN);
const lateness = new Float64Array(count).fill(Number.NaN);
let errors = 0;
let measuredErrors = 0;
const errorSamples = new Map<string, number>();
let outstanding = 0;
let maxOutstanding = 0;

function noteError(i: number, what: string) {
  errors++;
  if (i >= warmCount) measuredErrors++;
  errorSamples.set(what, (errorSamples.get(what) ?? 0) + 1);
}

// The clock lives in a Worker (timeOrigin differs per thread, so times travel as epoch ms).
const startAbs = performance.timeOrigin + performance.now() + 200;
const startLocal = startAbs - performance.timeOrigin;
const scheduledAt = (i: number) => startLocal + i * intervalMs;

let resolveAll: () => void = () => {};
const allDone = new Promise<void>((r) => {
  resolveAll = r;
});
let clockDone = false;
const maybeDone = () => {
  if (clockDone && outstanding === 0) resolveAll();
};

async function one(i: number): Promise<void> {
  const sched = scheduledAt(i);
  lateness[i] = performance.now() - sched;
  outstanding++;
  if (outstanding > maxOutstanding) maxOutstanding = outstanding;
  try {
    const res = await fetch(url, { method: "POST", headers, body, signal: AbortSignal.timeout(timeoutMs) });
    const text = await res.text();
    const end = performance.now();
    if (res.status !== 200) noteError(i, `status ${res.status}`);
    else if (expectDone && !text.trimEnd().endsWith("data: [DONE]")) noteError(i, "stream did not end with data: [DONE]");
    else {
      latency[i] = end - sched;
    }
  } catch (err) {
    noteError(i, err instanceof Error ? `${err.name}: ${err.message}` : String(err));
  } finally {
    outstanding--;
    maybeDone();
  }
}

let next = 0;
const clock = new Worker(new URL("./open-loop-clock.ts", import.meta.url).href);
clock.onmessage = (e: MessageEvent<number>) => {
  if (e.data < 0) {
    clockDone = true;
    maybeDone();
    return;
  }
  for (; next <= e.data; next++) void one(next);
};
clock.postMessage({ startAbs, intervalMs, count });
await allDone;
clock.terminate();

function summary(xs: Float64Array) {
  const v = Array.from(xs).filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  const q = (p: number) => (v.length === 0 ? null : v[Math.min(v.length - 1, Math.ceil(p * v.length) - 1)]!);
  const round = (x: number | null) => (x === null ? null : Math.round(x * 1000) / 1000);
  return {
    n: v.length,
    mean: round(v.length ? v.reduce((a, b) => a + b, 0) / v.length : null),
    p50: round(q(0.5)),
    p90: round(q(0.9)),
    p99: round(q(0.99)),
    p999: round(q(0.999)),
    max: round(v.length ? v[v.length - 1]! : null),
  };
}

const measured = (xs: Float64Array) => xs.subarray(warmCount);
const out = {
  url,
  rate,
  durationS: duration,
  warmupS: warmup,
  sent: count - warmCount,
  ok: Array.from(measured(latency)).filter((x) => !Number.isNaN(x)).length,
  errors: measuredErrors,
  warmupErrors: errors - measuredErrors,
  errorSamples: Object.fromEntries(errorSamples),
  maxOutstanding,
  latencyMs: summary(measured(latency)),
  schedulerLatenessMs: summary(measured(lateness)),
};
console.log(JSON.stringify(out));
process.exit(0);
