// PGlite has no postmaster.pid: two processes on one data dir would both write and corrupt it.
// This pid file is the guard. Residual race, accepted: two processes taking over the same
// stale lock in the same few microseconds; the re-read before unlink keeps that window tiny.
import { closeSync, openSync, readFileSync, unlinkSync, writeSync } from "node:fs";

function errCode(e: unknown): string | undefined {
  return e instanceof Error && "code" in e && typeof e.code === "string" ? e.code : undefined;
}

function readPid(path: string): number | undefined {
  try {
    const pid = Number.parseInt(readFileSync(path, "utf8").trim(), 10);
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch (e) {
    if (errCode(e) === "ENOENT") return undefined;
    throw e;
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: it exists but belongs to another user, which still means alive.
    return errCode(e) === "EPERM";
  }
}

/** Takes `path` as an exclusive pid lockfile; returns a release function. */
export async function acquireLock(path: string, dataDir: string): Promise<() => void> {
  for (let attempt = 0; attempt < 5; attempt++) {
    try {
      const fd = openSync(path, "wx");
      try {
        writeSync(fd, `${process.pid}\n`);
      } finally {
        closeSync(fd);
      }
      return () => {
        // Only remove it if it is still ours (someone may have broken a lock we held too long).
        if (readPid(path) === process.pid) unlinkSync(path);
      };
    } catch (e) {
      if (errCode(e) !== "EEXIST") throw e;
    }
    let pid = readPid(path);
    if (pid === undefined) {
      // The creator writes its pid right after creating the file; give it a moment.
      await Bun.sleep(100);
      pid = readPid(path);
    }
    if (pid !== undefined && isAlive(pid)) {
      throw new Error(
        `data folder ${dataDir} is in use by process ${pid}; one gateway per data folder` +
          ` (if no gateway runs as pid ${pid}, delete ${path})`,
      );
    }
    // Stale: its owner died without cleaning up. Take it over, unless it changed meanwhile.
    if (readPid(path) === pid) {
      try {
        unlinkSync(path);
      } catch (e) {
        if (errCode(e) !== "ENOENT") throw e;
      }
    }
  }
  throw new Error(`could not take lock ${path}: it keeps changing`);
}
