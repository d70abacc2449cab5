/**
 * The plugin API catches a misspelled hook name at compile time: `definePlugin` with a setup
 * returning `callbackz` must fail to type-check, naming the key, while the correctly spelled twin
 * passes. Runs the project's own tsc on fixture projects excluded from the main tsconfig.
 */
import { describe, expect, test } from "bun:test";
import { join, resolve } from "node:path";

const ROOT = resolve(import.meta.dir, "..");
const TSC = join(ROOT, "node_modules/.bin/tsc");
const FIXTURES = join(ROOT, "test/fixtures/typecheck-negative");

async function tsc(project: string): Promise<{ code: number; out: string }> {
  const proc = Bun.spawn([TSC, "--noEmit", "--pretty", "false", "-p", project], { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { code, out: out + err };
}

describe("plugin hooks are type-checked", () => {
  test("misspelled hook names (callbackz, provider) are type errors naming them, in that file", async () => {
    const { code, out } = await tsc(FIXTURES);
    expect(code).not.toBe(0);
    const errors = out.split("\n").filter((l) => / error TS\d+:/.test(l));
    expect(errors.length).toBeGreaterThan(0);
    // Every error is about the misspelled hook, reported in the fixture (not a broken setup elsewhere).
    for (const e of errors) expect(e).toStartWith("test/fixtures/typecheck-negative/misspelled-hook.ts(");
    expect(out).toContain("callbackz is not a plugin hook");
    expect(out).toContain("provider is not a plugin hook");
  }, 20_000);

  test("the correctly spelled twin type-checks", async () => {
    const { code, out } = await tsc(join(FIXTURES, "tsconfig.correct.json"));
    expect(out.trim()).toBe("");
    expect(code).toBe(0);
  }, 20_000);
});
