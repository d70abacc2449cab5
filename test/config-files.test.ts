/**
 * How config.yaml really changes on a VM or in a container, against the gateway process: in-place
 * writes (also in two steps, the first half invalid), atomic renames (vim, `sed -i`, an editor's
 * temp file) again and again, a symlink whose target is replaced or repointed, a Kubernetes
 * ConfigMap's `..data` swap, a deleted file (re-created, or left missing), and a file that becomes
 * unreadable. After each the gateway serves exactly the new valid config, or the old one with the
 * refusal logged; it never exits and keeps watching; and SIGHUP gives the same result as the watch.
 */
import { afterEach, describe, expect, setDefaultTimeout, test } from "bun:test";
import { chmodSync, chownSync, closeSync, cpSync, mkdirSync, openSync, renameSync, rmSync, symlinkSync, unlinkSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { configText, initializedPgFolder, MASTER_KEY, ROOT, type SpawnedGateway, spawnGateway, tempDir } from "./harness/gateway.ts";
import { waitFor } from "./harness/util.ts";

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

    // Truncated, and written only a moment later (`cat slow-source > config.yaml`, a deploy tool):
    // the empty file in between is refused, not served as a config with no models.
    const empty = rejections(gw);
    const fd2 = openSync(gw.configPath, "w");
    await waitFor(() => rejections(gw), (n) => n > empty, "the truncated (empty) file to be refused");
    expect(await modelIds(gw)).toEqual(["beta", "gamma"]);
    // SIGHUP is the operator asking for the file as it is: it takes the empty file (no models).
    expect((await sighup(gw, "reloaded")).models).toBe(0);
    await expectServes(gw, [], "after SIGHUP of the empty file");
    writeSync(fd2, withModels("gamma", "delta"));
    closeSync(fd2);
    await expectServes(gw, ["delta", "gamma"], "after the write following the truncation");

    await sighup(gw, "reloaded");
    await expectServes(gw, ["delta", "gamma"], "after SIGHUP");
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

describe("config.yaml as a symlink", () => {
  test("a plain symlink: its target replaced by rename, written in place, and the link repointed", async () => {
    const gw = await gateway(["alpha"]);
    const real = join(gw.dir, "real");
    mkdirSync(real);
    writeFileSync(join(real, "a.yaml"), withModels("alpha", "link"));
    // The file becomes a symlink (an atomic replace itself).
    symlinkSync("real/a.yaml", `${gw.configPath}.new`);
    renameSync(`${gw.configPath}.new`, gw.configPath);
    await expectServes(gw, ["alpha", "link"], "after config.yaml became a symlink");

    for (let i = 1; i <= 2; i++) {
      writeFileSync(join(real, "a.yaml.tmp"), withModels("alpha", `target${i}`));
      renameSync(join(real, "a.yaml.tmp"), join(real, "a.yaml"));
      await expectServes(gw, ["alpha", `target${i}`], `after the target was replaced by rename (${i})`);
    }
    writeFileSync(join(real, "a.yaml"), withModels("alpha", "inplace"));
    await expectServes(gw, ["alpha", "inplace"], "after the target was written in place");

    for (let i = 1; i <= 2; i++) {
      writeFileSync(join(real, `b${i}.yaml`), withModels(`b${i}`));
      symlinkSync(`real/b${i}.yaml`, `${gw.configPath}.new`); // ln -sfn: a new link renamed onto the old
      renameSync(`${gw.configPath}.new`, gw.configPath);
      await expectServes(gw, [`b${i}`], `after the link was repointed (${i})`);
    }
    await sighup(gw, "reloaded");
    await expectServes(gw, ["b2"], "after SIGHUP");
  });

  test("a Kubernetes ConfigMap volume: config.yaml → ..data/config.yaml, ..data swapped to a new folder", async () => {
    const gw = await gateway(["v0"]);
    const dir = gw.dir;
    const publish = (version: number, text: string) => {
      // What the kubelet's atomic writer does: a new timestamped folder, a ..data_tmp link to it
      // renamed onto ..data, then the old folder removed.
      const folder = `..2026_11_27_10_00_0${version}.${1000 + version}`;
      mkdirSync(join(dir, folder));
      writeFileSync(join(dir, folder, "config.yaml"), text);
      symlinkSync(folder, join(dir, "..data_tmp"));
      renameSync(join(dir, "..data_tmp"), join(dir, "..data"));
      if (version > 1) rmSync(join(dir, `..2026_11_27_10_00_0${version - 1}.${1000 + version - 1}`), { recursive: true });
    };
    publish(1, withModels("v0", "v1"));
    symlinkSync("..data/config.yaml", `${gw.configPath}.new`);
    renameSync(`${gw.configPath}.new`, gw.configPath);
    await expectServes(gw, ["v0", "v1"], "after config.yaml became a ConfigMap link");
    for (let v = 2; v <= 4; v++) {
      publish(v, withModels(`v${v}`));
      await expectServes(gw, [`v${v}`], `after ConfigMap update ${v}`);
    }
    const before = rejections(gw);
    publish(5, "model_list: [oops");
    await waitFor(() => rejections(gw), (r) => r > before, "an invalid ConfigMap update to be refused");
    await sighup(gw, "rejected");
    await expectServes(gw, ["v4"], "after an invalid ConfigMap update");
    publish(6, withModels("v6"));
    await expectServes(gw, ["v6"], "after a ConfigMap update following a refused one");
    await sighup(gw, "reloaded");
    await expectServes(gw, ["v6"], "after SIGHUP");
  });
});

describe("config.yaml deleted", () => {
  test("deleted and created again a moment later; deleted and left missing, then created again", async () => {
    const gw = await gateway(["alpha"]);
    unlinkSync(gw.configPath);
    await Bun.sleep(100);
    writeFileSync(gw.configPath, withModels("alpha", "again"));
    await expectServes(gw, ["alpha", "again"], "after delete and re-create");

    const from = logLines(gw).length;
    unlinkSync(gw.configPath);
    // The gateway says the file is gone and that the last config keeps serving.
    const said = await waitFor(
      () => linesSince(gw, from, (l) => JSON.stringify(l).includes("config file") && JSON.stringify(l).includes(gw.configPath)),
      (l) => l.length > 0,
      "a log line saying config.yaml is missing",
    );
    expect(JSON.stringify(said[0])).toContain("previous config keeps serving");
    await expectServes(gw, ["alpha", "again"], "while config.yaml is missing");
    const hup = await sighup(gw, "rejected");
    expect(JSON.stringify(hup)).toContain("config file not found");
    await expectServes(gw, ["alpha", "again"], "after SIGHUP while config.yaml is missing");

    await Bun.sleep(300);
    writeFileSync(gw.configPath, withModels("back"));
    await expectServes(gw, ["back"], "after config.yaml was created again");
    writeFileSync(gw.configPath, withModels("back", "still-watched"));
    await expectServes(gw, ["back", "still-watched"], "after an in-place edit of the re-created file");
    await sighup(gw, "reloaded");
    await expectServes(gw, ["back", "still-watched"], "after SIGHUP");
  });
});

describe("config.yaml unreadable", () => {
  test("chmod 000 is refused and logged; readable again, its new content is taken", async () => {
    const gw = await gateway(["alpha"], { unprivileged: true });
    const cannotRead = (from: number) =>
      linesSince(gw, from, (l) => l.msg === "config reload rejected; the previous config keeps serving" && l.reason !== "SIGHUP" && JSON.stringify(l).includes("cannot read config file"));
    // Only its mode changes: the watch notices, refuses it and says why.
    let from = logLines(gw).length;
    chmodSync(gw.configPath, 0o000);
    await waitFor(() => cannotRead(from), (l) => l.length > 0, "the watch to refuse the unreadable file");
    const hup = await sighup(gw, "rejected");
    expect(JSON.stringify(hup)).toContain("cannot read config file");
    await expectServes(gw, ["alpha"], "while config.yaml is unreadable");

    // Rewritten while unreadable (root may): still refused, the old config serves.
    from = logLines(gw).length;
    writeFileSync(gw.configPath, withModels("alpha", "hidden"));
    await waitFor(() => cannotRead(from), (l) => l.length > 0, "the watch to refuse the rewritten unreadable file");
    await expectServes(gw, ["alpha"], "while the rewritten config.yaml is unreadable");

    writeFileSync(gw.configPath, withModels("alpha", "visible"));
    chmodSync(gw.configPath, 0o644);
    await expectServes(gw, ["alpha", "visible"], "after the file was readable again");
    await sighup(gw, "reloaded");
    await expectServes(gw, ["alpha", "visible"], "after SIGHUP");
  });
});
