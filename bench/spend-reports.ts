/**
 * Spend reports over a large log: `bun bench/spend-reports.ts [--rows 10000000] [--keep]`.
 *
 * Creates a fresh PostgreSQL database (TEST_DATABASE_URL's server, default the local one), seeds
 * `--rows` spend log rows over 40 days (1,000 keys, 100 teams, 10 orgs, 10 models, 3 providers,
 * 20 tags) and the daily aggregates the spend writer would have kept for them, starts the gateway
 * on it, and times `/global/spend/report` over 30 days (every group_by) and `/team/daily/activity`
 * over 30 days. Writes bench/results/spend-reports.md. Target: each under 200 ms.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import postgres from "postgres";

const { values: flags } = parseArgs({
  args: Bun.argv.slice(2),
  options: {
    rows: { type: "string", default: "10000000" },
    keep: { type: "boolean", default: false },
    runs: { type: "string", default: "20" },
    /** Reuse a database an earlier `--keep` run seeded (seeding 10M rows takes minutes). */
    database: { type: "string" },
  },
});
const ROWS = Number(flags.rows);
const RUNS = Number(flags.runs);
const REPO = resolve(import.meta.dir, "..");
const MASTER_KEY = "sk-bench-spend-master";
const server = process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const DAY = 86_400;
const CHUNK = 1_000_000;
const reuse = flags.database;
const dbName = reuse ?? `gw_bench_spend_${Date.now()}`;

if (!reuse) {
  const admin = postgres(server, { max: 1, onnotice: () => {} });
  await admin.unsafe(`create database "${dbName}"`);
  await admin.end();
}
const url = new URL(server);
url.pathname = `/${dbName}`;
const dbUrl = url.toString();

const dir = mkdtempSync(join(tmpdir(), "bench-spend-"));
/** Without the background prebuild, so that "first ever" is the cold build a request does. */
const coldConfig = join(dir, "cold.yaml");
writeFileSync(coldConfig, `model_list:\n  - model_name: m0\n    svc_params: { model: mock/m0 }\ngeneral_settings: { master_key: ${MASTER_KEY}, spend_report_prebuild_days: 0 }\n`);
/** The default: finished days prebuilt after start. */
const prebuildConfig = join(dir, "prebuild.yaml");
writeFileSync(prebuildConfig, `model_list:\n  - model_name: m0\n    svc_params: { model: mock/m0 }\ngeneral_settings: { master_key: ${MASTER_KEY} }\n`);

interface Gateway {
  url: string;
  proc: ReturnType<typeof Bun.spawn>;
  /** Resolves with the first output line matching `re`. */
  logged: (re: RegExp) => Promise<string>;
}

async function startGateway(configPath = coldConfig): Promise<Gateway> {
  const proc = Bun.spawn([process.execPath, join(REPO, "core/main.ts"), "--config", configPath, "--port", "0", "--host", "127.0.0.1", "--data-dir", join(dir, "data")], {
    env: { ...process.env, DATABASE_URL: dbUrl, SVC_MASTER_KEY: MASTER_KEY },
    stdout: "pipe",
    stderr: "pipe",
  });
  let out = "";
  const decoder = new TextDecoder();
  const waiting: { re: RegExp; found: (line: string) => void }[] = [];
  // Read the output to the end (a closed pipe would fail the gateway's later log writes).
  const listening = new Promise<string>((resolveUrl, reject) => {
    void (async () => {
      for await (const chunk of proc.stdout as ReadableStream<Uint8Array>) {
        out += decoder.decode(chunk);
        const m = /listening on (http:\/\/[^"\s]+)/.exec(out);
        if (m) resolveUrl(m[1]!);
        for (const w of waiting) {
          const line = out.split("\n").find((l) => w.re.test(l));
          if (line) w.found(line);
        }
      }
      reject(new Error(`gateway did not start:\n${out}`));
    })();
  });
  void new Response(proc.stderr as ReadableStream<Uint8Array>).text();
  const logged = (re: RegExp) => new Promise<string>((found) => waiting.push({ re, found }));
  return { url: await listening, proc, logged };
}

async function seed(): Promise<void> {
  const t0 = performance.now();
  // Migrations run at the gateway's first start; seeding needs the tables.
  const first = await startGateway();
  first.proc.kill();
  await first.proc.exited;

  const sql = postgres(dbUrl, { max: 1, onnotice: () => {} });
  console.log(`# seeding ${ROWS.toLocaleString()} spend log rows into ${dbName}`);
  for (let from = 1; from <= ROWS; from += CHUNK) {
    const to = Math.min(ROWS, from + CHUNK - 1);
    const started = performance.now();
    await sql.unsafe(`
      insert into spend_logs (call_id, request_id, call_type, api_key, key_alias, user_id, team_id, organization_id, end_user,
        model, model_group, provider, model_id, upstream_model, spend, prompt_tokens, completion_tokens, total_tokens,
        start_time, end_time, status, request_tags, metadata)
      select 'c' || g, 'chatcmpl-' || g, 'chat', 'key' || (g % 1000), 'alias' || (g % 1000), 'user' || (g % 300),
        'team' || (g % 1000 % 100), 'org' || (g % 1000 % 100 % 10), 'customer' || (g % 5000),
        'model' || (g % 10), 'model' || (g % 10), 'provider' || (g % 10 % 3), 'dep' || (g % 10), 'upstream' || (g % 10),
        ((g % 997) * 0.000001234)::numeric(30,12), 100 + g % 50, 20 + g % 30, 120 + g % 50 + g % 30,
        now() - make_interval(secs => (g::bigint * 7919) % ${40 * DAY}), now() - make_interval(secs => (g::bigint * 7919) % ${40 * DAY}) + interval '1 second',
        case when g % 50 = 0 then 'failure' else 'success' end, array['tag' || (g % 20)], '{}'::jsonb
      from generate_series(${from}, ${to}) g`);
    console.log(`  rows ${to.toLocaleString()} (${Math.round(performance.now() - started)} ms)`);
  }
  console.log("# building the daily aggregates");
  const day = "(start_time at time zone 'UTC')::date";
  const metrics = `sum(prompt_tokens), sum(completion_tokens), sum(spend), count(*),
    count(*) filter (where status = 'success'), count(*) filter (where status = 'failure')`;
  const cols = "entity_type, entity_id, date, api_key, model, model_group, provider, prompt_tokens, completion_tokens, spend, api_requests, successful_requests, failed_requests";
  for (const [type, id, key] of [
    ["key", "api_key", "api_key"],
    ["team", "team_id", "api_key"],
    ["org", "organization_id", "api_key"],
    ["user", "user_id", "api_key"],
    ["end_user", "end_user", "api_key"],
    ["model", "model_group", "''"],
  ] as const) {
    const started = performance.now();
    await sql.unsafe(
      `insert into daily_spend (${cols}) select '${type}', ${id}, ${day}, ${key}, upstream_model, model_group, provider, ${metrics}
       from spend_logs group by ${id}, ${day}, ${key === "''" ? "" : `${key}, `}upstream_model, model_group, provider`,
    );
    console.log(`  ${type} (${Math.round(performance.now() - started)} ms)`);
  }
  await sql.unsafe(`insert into daily_spend (${cols}) select 'provider', provider, ${day}, '', '', '', provider, ${metrics} from spend_logs group by provider, ${day}`);
  await sql.unsafe(
    `insert into daily_spend (${cols}) select 'tag', t, ${day}, api_key, upstream_model, model_group, provider, ${metrics}
     from spend_logs, unnest(request_tags) t group by t, ${day}, api_key, upstream_model, model_group, provider`,
  );
  await sql.unsafe(`insert into teams (team_id, team_alias) select 'team' || i, 'Team ' || i from generate_series(0, 99) i`);
  await sql.unsafe("analyze");
  const [counts] = await sql<{ logs: string; daily: string }[]>`select (select count(*) from spend_logs)::text as logs, (select count(*) from daily_spend)::text as daily`;
  console.log(`# ${counts!.logs} log rows, ${counts!.daily} daily rows; seeded in ${Math.round((performance.now() - t0) / 1000)} s`);
  await sql.end();
}

if (!reuse) await seed();
const counter = postgres(dbUrl, { max: 1, onnotice: () => {} });
const [{ n: logRows } = { n: "0" }] = await counter<{ n: string }[]>`select count(*)::text as n from spend_logs`;
// An open connection would keep this script alive after its report (with --keep, for good).
await counter.end();
// A reused database may hold report parts an earlier run stored: the first pass starts without them.
const cleaner = postgres(dbUrl, { max: 1, onnotice: () => {} });
await cleaner.unsafe("delete from report_parts").catch(() => undefined); // absent before the gateway's first start migrates
await cleaner.end();
let gw = await startGateway();
const today = new Date();
const ymd = (d: Date) => d.toISOString().slice(0, 10);
const start = ymd(new Date(today.getTime() - 29 * DAY * 1000));
const end = ymd(today);
const probes: { name: string; path: string }[] = [
  { name: "/global/spend/report group_by=team, 30 days", path: `/global/spend/report?start_date=${start}&end_date=${end}&group_by=team` },
  { name: "/global/spend/report group_by=api_key, 30 days", path: `/global/spend/report?start_date=${start}&end_date=${end}&group_by=api_key` },
  { name: "/global/spend/report group_by=customer, 30 days", path: `/global/spend/report?start_date=${start}&end_date=${end}&group_by=customer` },
  { name: "/team/daily/activity, 30 days, all teams", path: `/team/daily/activity?start_date=${start}&end_date=${end}` },
  { name: "/team/daily/activity, 30 days, one team", path: `/team/daily/activity?start_date=${start}&end_date=${end}&team_ids=team7` },
];
/** Asks `/health/liveliness` one request after another until `until` settles; the slowest answer, ms. */
async function longestWait(until: Promise<unknown>): Promise<number> {
  let done = false;
  void until.finally(() => {
    done = true;
  });
  let longest = 0;
  while (!done) {
    const s = performance.now();
    await (await fetch(`${gw.url}/health/liveliness`)).arrayBuffer();
    longest = Math.max(longest, performance.now() - s);
  }
  return longest;
}

const lines: string[] = [];
for (const p of probes) {
  const times: number[] = [];
  let cold = 0;
  let bytes = 0;
  let status = 0;
  let stall = 0;
  for (let i = 0; i < RUNS + 2; i++) {
    const s = performance.now();
    const asked = fetch(gw.url + p.path, { headers: { authorization: `Bearer ${MASTER_KEY}` } }).then((res) => res.arrayBuffer().then((body) => ({ res, body })));
    // While the first (cold) report is built, other requests keep coming: the longest any of them waits.
    if (i === 0) stall = await longestWait(asked);
    const { res, body } = await asked;
    const ms = performance.now() - s;
    status = res.status;
    bytes = body.byteLength;
    if (i === 0) cold = ms;
    if (i >= 2) times.push(ms); // the first two warm the caches
  }
  times.sort((a, b) => a - b);
  const q = (f: number) => times[Math.min(times.length - 1, Math.floor(f * times.length))]!.toFixed(1);
  lines.push(`| ${p.name} | ${status} | ${(bytes / 1024).toFixed(0)} KiB | ${cold.toFixed(1)} | ${stall.toFixed(1)} | %PREBUILT% | %RESTART% | ${q(0.5)} | ${q(0.95)} | ${times[times.length - 1]!.toFixed(1)} |`);
}
gw.proc.kill();
await gw.proc.exited;
// A restart: the finished days' parts the first pass stored are read back instead of rebuilt.
await Bun.sleep(1000); // the parts are stored after the answers
gw = await startGateway();
for (const [i, p] of probes.entries()) {
  const s = performance.now();
  const res = await fetch(gw.url + p.path, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
  await res.arrayBuffer();
  const ms = performance.now() - s;
  lines[i] = lines[i]!.replace("%RESTART%", ms.toFixed(1));
}
gw.proc.kill();
await gw.proc.exited;

// The default: no stored parts, the gateway prebuilds the finished days after start; each report
// is asked once when that is done (it then builds only today's part).
const cleaner2 = postgres(dbUrl, { max: 1, onnotice: () => {} });
await cleaner2.unsafe("delete from report_parts");
await cleaner2.end();
gw = await startGateway(prebuildConfig);
const prebuilt = gw.logged(/spend reports prebuilt/);
const prebuildStall = await longestWait(prebuilt);
const prebuildMs = Number(/"ms":(\d+)/.exec(await prebuilt)?.[1] ?? Number.NaN);
for (const [i, p] of probes.entries()) {
  const s = performance.now();
  const res = await fetch(gw.url + p.path, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
  await res.arrayBuffer();
  lines[i] = lines[i]!.replace("%PREBUILT%", (performance.now() - s).toFixed(1));
  console.log(lines[i]);
}
gw.proc.kill();
await gw.proc.exited;

const report = [
  "# Spend reports over a large log",
  "",
  `${new Date().toISOString()}: ${Number(logRows).toLocaleString()} spend log rows over 40 days in PostgreSQL (1,000 keys, 100 teams, 10 orgs, 10 models, 5,000 customers, 20 tags), daily aggregates as the spend writer keeps them; the gateway freshly started on it, no report parts stored. "First ever" is the cold answer (every day read from the aggregates and built), "longest wait" the slowest of the liveness requests sent one after another while it was built (how long the gateway kept other requests waiting); then ${RUNS} timed requests after 2 warm-ups, when finished days are reused from memory (today's part is rebuilt whenever it changes). "First after a restart": the gateway restarted, each report asked once, its finished days read back from the parts the first pass stored. From request to last byte, gateway and PostgreSQL on the same 2-core machine.`,
  "",
  "| request | status | body | first ever ms | longest wait of another request meanwhile ms | first after the prebuild ms | first after a restart ms | repeated p50 ms | p95 ms | max ms |",
  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ...lines,
  "",
  `The background prebuild (the default; \`general_settings.spend_report_prebuild_days\`, 30): the gateway restarted with no stored parts took ${prebuildMs} ms to build the finished days of the last 30 days of all five unfiltered reports (its own timing), while the longest liveness request sent meanwhile waited ${prebuildStall.toFixed(1)} ms. "First after the prebuild" is each report asked once after it: only today's part is built. "First ever" and "first after a restart" were measured with the prebuild off, as a request finds them when it comes before the prebuild is done (or with \`spend_report_prebuild_days: 0\`).`,
  "",
].join("\n");
writeFileSync(join(import.meta.dir, "results", "spend-reports.md"), report);
console.log(`\nwrote bench/results/spend-reports.md`);
if (!flags.keep && !reuse) {
  const a = postgres(server, { max: 1, onnotice: () => {} });
  await a.unsafe(`drop database if exists "${dbName}" with (force)`);
  await a.end();
}
rmSync(dir, { recursive: true, force: true });
