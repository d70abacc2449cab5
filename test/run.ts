/**
 * Runs the whole suite with `bun test` and ends with the line CI reads: `N passed, N failed`,
 * counted from the run's JUnit report (bun's own summary format is not what CI parses).
 */
import { existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";

const root = resolve(import.meta.dir, "..");
const reportDir = join(root, ".test-tmp");
const report = join(reportDir, "junit.xml");
mkdirSync(reportDir, { recursive: true });
rmSync(report, { force: true });

// The files run in two worker processes by default (bun test --parallel --no-isolate, which keeps a
// worker's modules and the compiled PGlite across its files, as one process does): most files spend
// much of their time waiting on gateways they started, so on a 2-core machine the suite takes 6.5
// minutes instead of 11.5 in one process (TEST_WORKERS=1), 11 instead of 16 on a slower one
// (9.3 minutes on a fresh 2-core machine on 2026-11-28, 1,116 s of test time).
const workers = Number(process.env.TEST_WORKERS ?? 2);
if (!Number.isInteger(workers) || workers < 1) throw new Error(`TEST_WORKERS must be a whole number of at least 1, not ${process.env.TEST_WORKERS}`);
// Each file's duration from a recent run (test/timings.json): the workers start the slowest files
// first, so a long one (admin/bad-input, about a tenth of the suite) never runs alone at the end.
// `npm test -- --update-timings` rewrites it from the run.
const timings = join(root, "test", "timings.json");
const parallel = workers > 1 ? [`--parallel=${workers}`, "--no-isolate", ...(existsSync(timings) ? [`--timings=${timings}`] : [])] : [];
const proc = Bun.spawn([process.execPath, "test", "--timeout=30000", ...parallel, "--reporter=junit", `--reporter-outfile=${report}`, ...process.argv.slice(2)], {
  cwd: root,
  stdout: "inherit",
  stderr: "inherit",
  env: { ...process.env, FORCE_COLOR: "0" },
});
const code = await proc.exited;

let passed = 0;
let failed = 0;
let skipped = 0;
if (existsSync(report)) {
  const xml = readFileSync(report, "utf8");
  for (const m of xml.matchAll(/<testcase\b[^>]*?(\/>|>([\s\S]*?)<\/testcase>)/g)) {
    const inner = m[2] ?? "";
    if (/<(failure|error)\b/.test(inner)) failed++;
    else if (/<skipped\b/.test(inner)) skipped++;
    else passed++;
  }
}
// A crash before any report (or a non-zero exit with no failing case) must not read as green.
if (code !== 0 && failed === 0) failed = 1;
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`);
process.exit(code === 0 && failed === 0 ? 0 : 1);
