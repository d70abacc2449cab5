/**
 * How config.yaml really changes on a VM or in a container, against the gateway process: in-place
 * writes (also in two steps, the first half invalid), atomic renames (vim, `sed -i`, an editor's
 * temp file) again and again, and a file that becomes unreadable. After each the gateway serves exactly the new valid config, or the old one with the
 * refusal logged; it never exits and keeps watching; and SIGHUP gives the same result as the watch.
 */
import { afterEach, describe, expect, setDefaultTimeout, test } from "bun:test";
import { chmodSync, chownSync, closeSync, cpSync, openSync, renameSync, rmSync, unlinkSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { configText, initializedPgFolder, MASTER_KEY, ROOT, type SpawnedGateway, spawnGateway, tempDir } from "./harness/gateway.ts";

setDefaultTimeout(30_000);

const running: SpawnedGateway[] = [];
afterEach(async () => {
  if (process.env.DEBUG_GW) for (const g of running) console.log(g.output());
  await Promise.allSettled(running.splice(0).map((g) => g.stop()));
});

const mockModel = (name: string) => ({ model_name: name, svc_params: { model: `mock/${name}`, mock_response: `reply from ${name}` } });
const withModels = (...names: string[]) => configText({ model_list: names.map(mockModel), general_settings: { master_key: MASTER_KEY } });

/** Runs as an unprivileged user when the tests run as root (else chmod 000 would not stop its reads). */
async function gateway(names: string[], opts: { unprivileged?: boolean } = {}): Promise<SpawnedGateway> {
  let gw: SpawnedGateway;
  if (opts.unprivileged && process.getuid?.() === 0) {
    const dir = tempDir();
    chmodSync(dir, 0o755);
    cpSync(await initializedPgFolder(), join(dir, "data", "pg"), { recursive: true });
    writeFileSync(join(dir, "config.yaml"), withModels(...names));
    chownTree(dir, 65534, 65534);
    gw = await spawnGateway(withModels(...names), {
      dir,
      env: { HOME: dir, TMPDIR: dir },
      cmd: ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", process.execPath, join(ROOT, "core/main.ts")],
    });
    const stop = gw.stop;
    gw.stop = async (signal) => {
      const code = await stop(signal);
      rmSync(dir, { recursive: true, force: true });
      return code;
    };
  } else gw = await spawnGateway(withModels(...names));
  running.push(gw);
  // The watcher attaches asynchronously; an operator never edits within milliseconds of start.
  await Bun.sleep(150);
  return gw;
}

function chownTree(path: string, uid: number, gid: number): void {
  chownSync(path, uid, gid);
  for (const entry of new Bun.Glob("**/*").scanSync({ cwd: path, dot: true, onlyFiles: false, followSymlinks: false })) chownSync(join(path, entry), uid, gid);
}

/** Polls until `check` returns true, failing with `what` and the last value seen after `ms`. */
async function waitFor<T>(read: () => Promise<T> | T, check: (v: T) => boolean, what: string, ms = 8000): Promise<T> {
  const deadline = Date.now() + ms;
  let last: T;
  for (;;) {
    last = await read();
    if (check(last)) return last;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms}ms waiting for ${what}; last value: ${JSON.stringify(last)}`);
    await Bun.sleep(25);
  }
}

async function modelIds(gw: SpawnedGateway): Promise<string[]> {
  const res = await fetch(`${gw.baseURL}/models`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
  const body = (await res.json()) as { data: { id: string }[] };
  return body.data.map((m) => m.id).sort();
}

async function ask(gw: SpawnedGateway, model: string): Promise<string | undefined> {
  const res = await fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] }),
  });
  const body = (await res.json()) as { choices?: { message: { content: string } }[] };
  return body.choices?.[0]?.message.content;
}

type LogLine = Record<string, unknown> & { msg?: string; reason?: string };
function logLines(gw: SpawnedGateway): LogLine[] {
  return gw
    .output()
    .split("\n")
    .flatMap((line) => {
      try {
        return [JSON.parse(line) as LogLine];
      } catch {
        return [];
      }
    });
}

/** Waits until the gateway serves exactly `names`, each answering; the process must still run. */
async function expectServes(gw: SpawnedGateway, names: string[], what: string): Promise<void> {
  const want = [...names].sort();
  await waitFor(() => modelIds(gw), (ids) => JSON.stringify(ids) === JSON.stringify(want), `${what}: models ${want.join(",")}`);
  for (const n of names) expect(await ask(gw, n)).toBe(`reply from ${n}`);
  expect(gw.proc.exitCode).toBeNull();
}

/** Log lines after `from` (a count of lines seen before) that match. */
function linesSince(gw: SpawnedGateway, from: number, match: (l: LogLine) => boolean): LogLine[] {
  return logLines(gw).slice(from).filter(match);
}

/** Sends SIGHUP and waits for its reload ("config reloaded") or refusal; returns that line. */
async function sighup(gw: SpawnedGateway, expect: "reloaded" | "rejected"): Promise<LogLine> {
  const from = logLines(gw).length;
  gw.proc.kill("SIGHUP");
  const msg = expect === "reloaded" ? "config reloaded" : "config reload rejected; the previous config keeps serving";
  const found = await waitFor(() => linesSince(gw, from, (l) => l.reason === "SIGHUP" && l.msg === msg), (l) => l.length > 0, `a SIGHUP '${msg}' line`);
  return found[0]!;
}

const rejections = (gw: SpawnedGateway) => logLines(gw).filter((l) => l.msg === "config reload rejected; the previous config keeps serving" && l.reason !== "SIGHUP").length;

describe("config.yaml written in place", () => {
  test("truncate then write, and a write landing in two steps with its first half invalid YAML", async () => {
    const gw = await gateway(["alpha"]);
    writeFileSync(gw.configPath, withModels("alpha", "beta"));
    await expectServes(gw, ["alpha", "beta"], "after an in-place write");

    // JSON is YAML: cut in the middle, its brackets are left open.
    const text = JSON.stringify({ model_list: [mockModel("beta"), mockModel("gamma")], general_settings: { master_key: MASTER_KEY } }, null, 2);
    const half = Math.floor(text.length / 2);
    const before = rejections(gw);
    const fd = openSync(gw.configPath, "w");
    writeSync(fd, text.slice(0, half));
    // The half file is refused, logged, and the old config keeps serving meanwhile.
    await waitFor(() => rejections(gw), (n) => n > before, "the half-written file to be refused");
    expect(await modelIds(gw)).toEqual(["alpha", "beta"]);
    writeSync(fd, text.slice(half));
    closeSync(fd);
    await expectServes(gw, ["beta", "gamma"], "after the second step");

    await sighup(gw, "reloaded");
    await expectServes(gw, ["beta", "gamma"], "after SIGHUP");
  });
});

describe("config.yaml replaced by rename", () => {
  test("vim's backup-and-rename, sed -i and an editor's .tmp rename, each twice in a row", async () => {
    const gw = await gateway(["m0"]);
    const dir = gw.dir;
    const ways: Record<string, (text: string) => void | Promise<void>> = {
      vim: (text) => {
        renameSync(gw.configPath, `${gw.configPath}~`);
        writeFileSync(gw.configPath, text);
        unlinkSync(`${gw.configPath}~`);
      },
      "sed -i": async (text) => {
        // sed writes ./sedXXXXXX and renames it onto the file: here it puts the new text in place of every line.
        writeFileSync(join(dir, "sed-source"), text);
        const proc = Bun.spawn(["sed", "-i", "-e", `1r ${join(dir, "sed-source")}`, "-e", "d", gw.configPath]);
        expect(await proc.exited).toBe(0);
      },
      "editor .tmp": (text) => {
        writeFileSync(`${gw.configPath}.tmp`, text);
        renameSync(`${gw.configPath}.tmp`, gw.configPath);
      },
    };
    let n = 0;
    const names = ["m0"];
    for (let round = 0; round < 2; round++) {
      for (const [way, write] of Object.entries(ways)) {
        names.push(`m${++n}`);
        await write(withModels(...names));
        await expectServes(gw, names, `after ${way} (round ${round + 1})`);
      }
    }
    // A refused file arriving by rename keeps the old config, and the next good one is taken.
    const before = rejections(gw);
    await ways["editor .tmp"]!("model_list: [oops");
    await waitFor(() => rejections(gw), (r) => r > before, "a renamed invalid file to be refused");
    await sighup(gw, "rejected");
    await expectServes(gw, names, "after a refused rename");
    await ways.vim!(withModels("final"));
    await expectServes(gw, ["final"], "after a good rename following a refused one");
    await sighup(gw, "reloaded");
    await expectServes(gw, ["final"], "after SIGHUP");
  });
});

describe("config.yaml unreadable", () => {
  test("chmod 000 is refused and logged; readable again, its new content is taken", async () => {
    const gw = await gateway(["alpha"], { unprivileged: true });
    const before = rejections(gw);
    writeFileSync(gw.configPath, withModels("alpha", "hidden"));
    chmodSync(gw.configPath, 0o000);
    // The write or the mode change may be seen first; either way the gateway must not take a file it cannot read.
    const hup = await sighup(gw, "rejected");
    expect(JSON.stringify(hup)).toContain("config.yaml");
    expect(gw.proc.exitCode).toBeNull();
    const now = await modelIds(gw);
    expect(["alpha", "alpha,hidden"]).toContain(now.join(","));
    expect(rejections(gw)).toBeGreaterThanOrEqual(before);

    writeFileSync(gw.configPath, withModels("alpha", "visible"));
    chmodSync(gw.configPath, 0o644);
    await expectServes(gw, ["alpha", "visible"], "after the file was readable again");
    await sighup(gw, "reloaded");
    await expectServes(gw, ["alpha", "visible"], "after SIGHUP");
  });
});
