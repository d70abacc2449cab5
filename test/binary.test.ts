// The single binary: built by scripts/build.ts (what `npm run build` runs), copied alone into an
// empty folder under /tmp (no node_modules anywhere above it) next to a config.yaml, and run.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, copyFileSync, existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import OpenAI from "openai";
import { buildBinary } from "../scripts/build.ts";
import { MASTER_KEY, type SpawnedGateway, spawnGateway } from "./harness/gateway.ts";

const BUILD_TIMEOUT = 120_000;
const CLEAN_ENV = { DATABASE_URL: undefined, REDIS_URL: undefined, PORT: undefined, HOST: undefined, SVC_DRAIN_TIMEOUT: undefined };
const CONFIG = {
  model_list: [
    { model_name: "chat-mock", svc_params: { model: "mock/chat" } },
    { model_name: "embed-mock", svc_params: { model: "mock/embed" }, model_info: { mode: "embedding" } },
  ],
  general_settings: { master_key: "os.environ/SVC_MASTER_KEY" },
};

const dirs: string[] = [];
const gateways: SpawnedGateway[] = [];
let binary: string;
let buildDir: string;
let runDir: string;

function tmp(prefix: string): string {
  const dir = mkdtempSync(join("/tmp", prefix));
  dirs.push(dir);
  return dir;
}

async function start(): Promise<{ gw: SpawnedGateway; ms: number }> {
  const started = performance.now();
  const gw = await spawnGateway(CONFIG, { cmd: [binary], dir: runDir, env: CLEAN_ENV, freshStore: true });
  gateways.push(gw);
  return { gw, ms: Math.round(performance.now() - started) };
}

beforeAll(async () => {
  buildDir = tmp("gw-bin-build-");
  const build = await buildBinary(join(buildDir, "gateway"));
  console.log(`binary: ${(build.bytes / 1024 / 1024).toFixed(1)} MB, built in ${build.ms} ms`);
  runDir = tmp("gw-bin-run-");
  binary = join(runDir, "gateway");
  copyFileSync(build.outfile, binary);
  chmodSync(binary, 0o755);
}, BUILD_TIMEOUT);

afterAll(async () => {
  for (const gw of gateways) if (gw.proc.exitCode === null && gw.proc.signalCode === null) gw.proc.kill("SIGKILL");
  await Promise.allSettled(gateways.map((g) => g.exited));
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe("single binary", () => {
  test("the build leaves only the binary in its folder: the source maps are embedded in it", () => {
    expect(readdirSync(buildDir)).toEqual(["gateway"]);
  });

  test("the run folder holds only the binary, with no node_modules above it", () => {
    expect(readdirSync(runDir)).toEqual(["gateway"]);
    for (let d = runDir; ; d = dirname(d)) {
      expect(existsSync(join(d, "node_modules"))).toBe(false);
      if (dirname(d) === d) break;
    }
  });

  test("--help works from the binary", async () => {
    const proc = Bun.spawn([binary, "--help"], { cwd: runDir, stdout: "pipe", stderr: "pipe" });
    const [out, code] = await Promise.all([new Response(proc.stdout).text(), proc.exited]);
    expect(code).toBe(0);
    expect(out).toContain("usage: gateway");
  });

  test(
    "starts from a folder with only config.yaml, serves chat/streaming/embeddings through the SDK, stores in embedded PGlite",
    async () => {
      const cold = await start();
      const { gw } = cold;
      expect(readdirSync(runDir).sort()).toEqual(["config.yaml", "data", "gateway"]);

      const ready = await fetch(`${gw.url}/health/readiness`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
      expect(ready.status).toBe(200);
      const body = (await ready.json()) as { db: string; db_detail: string };
      expect(body.db).toBe("connected");
      expect(body.db_detail).toMatch(/^PostgreSQL \d+.*\(PGlite \d+\.\d+\.\d+\)/);
      expect(existsSync(join(runDir, "data", "gateway.lock"))).toBe(true);

      const client = new OpenAI({ baseURL: gw.baseURL, apiKey: MASTER_KEY, maxRetries: 0 });
      const chat = await client.chat.completions.create({ model: "chat-mock", messages: [{ role: "user", content: "from the binary" }] });
      expect(chat.choices[0]?.message.content).toBe("This is a mock response to: from the binary");
      let streamed = "";
      for await (const chunk of await client.chat.completions.create({
        model: "chat-mock",
        stream: true,
        messages: [{ role: "user", content: "stream" }],
      })) {
        streamed += chunk.choices[0]?.delta.content ?? "";
      }
      expect(streamed).toBe("This is a mock response to: stream");
      const emb = await client.embeddings.create({ model: "embed-mock", input: "x" });
      expect(emb.data[0]?.embedding).toHaveLength(8);

      expect(await gw.stop()).toBe(0);
      expect(existsSync(join(runDir, "data", "gateway.lock"))).toBe(false);

      // Warm start: the data folder exists, so no initdb.
      const warm = await start();
      expect((await fetch(`${warm.gw.url}/health/readiness`)).status).toBe(200);
      expect(await warm.gw.stop()).toBe(0);
      console.log(`binary start to listening: cold ${cold.ms} ms (initdb + migrations), warm ${warm.ms} ms`);
    },
    BUILD_TIMEOUT,
  );
});
