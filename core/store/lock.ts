// PGlite has no postmaster.pid: two processes on one data dir would both write and corrupt it.
// This pid file is the guard. Residual race, accepted: two processes taking over the same
// stale lock in the same few microseconds; the re-read before unlink keeps that window tiny.
import { closeSync, openSync, readFileSync, unlinkSync, writeSync } from "node:fs";

function errCode(e: unknown): string | undefined {
  return e instanceof Error && "code" in e && typeof e.code === "string" ? e.code : undefined;
}

/** The lockfile's holder: its pid, and when that process started (Linux), so a pid reused by another process is told apart. */
interface Holder {
  pid: number;
  startedAt?: string;
}

function readHolder(path: string): Holder | undefined {
  try {
    const [pidText, startedAt] = readFileSync(path, "utf8").trim().split(/\s+/);
    const pid = Number.parseInt(pidText ?? "", 10);
    return Number.isInteger(pid) && pid > 0 ? { pid, ...(startedAt ? { startedAt } : {}) } : undefined;
  } catch (e) {
    if (errCode(e) === "ENOENT") return undefined;
    throw e;
  }
}

/** When process `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat); undefined where there is no /proc. */
function processStart(pid: number | "self"): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}

/** Lockfiles this process holds (a second open of the same folder in one process is refused too). */
const heldHere = new Set<string>();

function isAlive(holder: Holder, path: string): boolean {
  // A lockfile naming this process that it does not hold is a dead run's: in a container the
  // gateway is pid 1 at every start, and its crashed run's lock named pid 1 too.
  if (holder.pid === process.pid) return heldHere.has(path);
  try {
    process.kill(holder.pid, 0);
  } catch (e) {
    // EPERM: it exists but belongs to another user, which still means alive.
    if (errCode(e) !== "EPERM") return false;
  }
  // Alive, unless the pid now belongs to a process started after the lock was taken (pid reuse).
  if (holder.startedAt === undefined) return true;
  const started = processStart(holder.pid);
  return started === undefined || started === holder.startedAt;
}

/** Takes `path` as an exclusive pid lockfile; returns a release function. */
export async function acquireLock(path: string, dataDir: string): Promise<() => void> {
  for (let attempt = 0; attempt < 5; attempt++) {
    try {
      const fd = openSync(path, "wx");
      try {
        const startedAt = processStart("self");
        writeSync(fd, startedAt === undefined ? `${process.pid}\n` : `${process.pid} ${startedAt}\n`);
      } finally {
        closeSync(fd);
      }
      heldHere.add(path);
      return () => {
        heldHere.delete(path);
        // Only remove it if it is still ours (someone may have broken a lock we held too long).
        if (readHolder(path)?.pid === process.pid) unlinkSync(path);
      };
    } catch (e) {
      if (errCode(e) !== "EEXIST") throw e;
    }
    let holder = readHolder(path);
    if (holder === undefined) {
      // The creator writes its pid right after creating the file; give it a moment.
      await Bun.sleep(100);
      holder = readHolder(path);
    }
    if (holder !== undefined && isAlive(holder, path)) {
      throw new Error(
        `data folder ${dataDir} is in use by process ${holder.pid}; one gateway per data folder` +
          ` (if no gateway runs as pid ${holder.pid}, delete ${path})`,
      );
    }
    // Stale: its owner died without cleaning up. Take it over, unless it changed meanwhile.
    const now = readHolder(path);
    if (now?.pid === holder?.pid && now?.startedAt === holder?.startedAt) {
      try {
        unlinkSync(path);
      } catch (e) {
        if (errCode(e) !== "ENOENT") throw e;
      }
    }
  }
  throw new Error(`could not take lock ${path}: it keeps changing`);
}
