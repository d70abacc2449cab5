/**
 * Builds the single binary: `bun scripts/build.ts [--outfile PATH]` (default dist/gateway).
 *
 * It is `bun build --compile --minify --sourcemap core/main.ts core/store/pglite-worker.ts
 * core/config/parse-worker.ts`: the Bun runtime, every module, the PGlite worker with PGlite's wasm
 * and data files (imported as files in core/store/pglite-worker.ts), the config reader's worker and
 * the migrations
 * (core/store/migrations/index.ts) end up in one executable that runs from an empty folder.
 * The source maps are embedded in the binary, so the sidecar `.map` files the bundler also writes
 * beside it (the binary's and the workers') are removed.
 */
import { rmSync, statSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { parseArgs } from "node:util";

export const ROOT = resolve(import.meta.dir, "..");
export const DEFAULT_OUTFILE = resolve(ROOT, "dist/gateway");
const WORKER_ENTRYPOINTS = ["core/store/pglite-worker.ts", "core/config/parse-worker.ts"];

export interface BuildResult {
  outfile: string;
  bytes: number;
  ms: number;
}

/** Compiles core/main.ts into `outfile`; throws with the bundler's output when it fails. */
export async function buildBinary(outfile: string = DEFAULT_OUTFILE): Promise<BuildResult> {
  const out = resolve(outfile);
  const started = performance.now();
  // The workers are entrypoints too: Bun embeds a Worker's module only when it is listed. Inside
  // the binary they are `./store/pglite-worker.ts` and `./config/parse-worker.ts` (relative to core/,
  // the entrypoints' common folder); core/store/pglite-bridge.ts and core/config/parse-thread.ts rely
  // on that layout.
  const entrypoints = ["core/main.ts", ...WORKER_ENTRYPOINTS];
  const proc = Bun.spawn([process.execPath, "build", "--compile", "--minify", "--sourcemap", ...entrypoints, "--outfile", out], {
    cwd: ROOT,
    stdout: "pipe",
    stderr: "pipe",
  });
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  if (code !== 0) throw new Error(`bun build --compile failed (exit ${code}):\n${stdout}${stderr}`);
  rmSync(`${out}.map`, { force: true });
  for (const worker of WORKER_ENTRYPOINTS) rmSync(join(dirname(out), `${basename(worker, ".ts")}.js.map`), { force: true });
  return { outfile: out, bytes: statSync(out).size, ms: Math.round(performance.now() - started) };
}

if (import.meta.main) {
  try {
    const { values } = parseArgs({ args: process.argv.slice(2), options: { outfile: { type: "string" } }, strict: true });
    const r = await buildBinary(values.outfile);
    console.log(`built ${r.outfile} (${(r.bytes / 1024 / 1024).toFixed(1)} MB) in ${r.ms} ms`);
  } catch (err) {
    console.error(err instanceof Error ? err.message : String(err));
    process.exit(1);
  }
}
