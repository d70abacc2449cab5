/**
 * The spend writer: finished calls are queued in memory and written in batches off the response
 * path (every second, or sooner when a batch fills). While the store is unreachable entries wait;
 * past `memoryLimit` they spill to append-only files in the data folder, replayed once the store
 * is back (and at the next start). While the spill cannot be written either (a full or unwritable
 * disk) entries stay in memory up to `memoryHardLimit` and the spill is retried on each tick; past
 * it new ones are dropped and counted in one error a tick. Stopping flushes, and spills whatever
 * could not be written; what neither takes is counted in one error, never thrown.
 * Rows are idempotent (keyed by call id), so a replay never counts a call twice.
 */
import { appendFileSync, closeSync, fstatSync, ftruncateSync, mkdirSync, openSync, readdirSync, readFileSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "../contract.ts";
import { picoToText } from "../cost/money.ts";
import type { SpendEntry } from "./entry.ts";
import { BatchSums, type PreparedBatch, type SpendStore, writeBatch } from "./flush.ts";
import { copyRow, copyRows } from "./row-text.ts";
import { storeErrorCause, withSqlState } from "../store/sql.ts";

export interface SpendWriterOptions {
  /** Folder for spill files (created when first needed). */
  spillDir: string;
  intervalMs?: number;
  batchSize?: number;
  /** Entries kept in memory before new ones go to disk. */
  memoryLimit?: number;
  /** Entries kept in memory at most while the disk refuses the spill (default twice `memoryLimit`); past it new ones are dropped. */
  memoryHardLimit?: number;
  /** False while `disable_spend_logs` is on: counters and aggregates only (read at every write). */
  logRows?: () => boolean;
}

const MAX_BACKOFF_MS = 5000;

/**
 * Queued calls, in batches filled as they end. Each call pays for its own share of the batch's
 * write as it is queued (its COPY row, its part of the sums), so writing a batch of a thousand
 * does not hold the event loop for milliseconds.
 */
interface PendingBatch {
  entries: SpendEntry[];
  /** The rows in COPY text, when the store bulk-loads; null when some row has none (the log was off when it was queued). */
  text: string | null;
  sums: BatchSums;
}

export class SpendWriter {
  /** Oldest first. Only the last takes new calls; a batch being written has a newer one after it. */
  private batches: PendingBatch[] = [];
  private queued = 0;
  private readonly bulkLoads: boolean;
  private readonly logRows: () => boolean;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private running: Promise<void> | undefined;
  private failures = 0;
  private stopped = false;
  private spillFile: string | undefined;
  private spilledCount = 0;
  /** Whether spill files may exist (checked at start, set when spilling): no folder scan on every flush. */
  private mayHaveSpill = true;
  /** Why the last spill failed, until one succeeds: calls past the bound then wait in memory instead of each trying the disk. */
  private spillError: unknown;
  /** Entries dropped (memory full, spill refused) since the last error saying so. */
  private dropped = { entries: 0, pico: 0n };
  private readonly intervalMs: number;
  private readonly batchSize: number;
  private readonly memoryLimit: number;
  private readonly memoryHardLimit: number;
  /** Rows written since start (tests and the readiness page read it). */
  written = 0;

  constructor(
    private readonly store: SpendStore,
    private readonly log: Logger,
    private readonly opts: SpendWriterOptions,
  ) {
    this.intervalMs = opts.intervalMs ?? 1000;
    this.batchSize = opts.batchSize ?? 1000;
    this.memoryLimit = opts.memoryLimit ?? 50_000;
    this.memoryHardLimit = Math.max(opts.memoryHardLimit ?? 2 * this.memoryLimit, this.memoryLimit);
    this.bulkLoads = store.copyIn !== undefined;
    this.logRows = opts.logRows ?? (() => true);
  }

  /** Replays spill files left by an earlier run (when the store answers), then starts the timer. */
  async start(): Promise<void> {
    try {
      await this.replaySpill();
    } catch (err) {
      this.log.warn("spend spill files could not be replayed yet; retrying in the background", storeErrorCause(err));
    }
    this.schedule(this.intervalMs);
  }

  enqueue(entry: SpendEntry): void {
    if (this.queued >= this.memoryLimit) {
      if (this.spillError === undefined && this.spillOrKeep([entry])) return;
      if (this.queued >= this.memoryHardLimit) {
        this.drop([entry]);
        return;
      }
    }
    let open = this.batches.at(-1);
    if (!open || open.entries.length >= this.batchSize) {
      open = this.newBatch();
    }
    open.entries.push(entry);
    open.sums.add(entry);
    if (open.text !== null) open.text = this.logRows() ? open.text + copyRow(entry) : null;
    this.queued++;
    // A full batch is written at once; the timer writes the rest. Writing only full batches here
    // keeps batches large under load: each write has a fixed cost, whatever its size.
    if (open.entries.length === this.batchSize && !this.running) this.writeFullBatchesSoon();
  }

  /**
   * Writes the full batches at once rather than at the next tick; not while writes fail. Such a
   * write tried nothing when the batch that failed (not full) was at the front, and then passed
   * for a success: "spend writes resumed" was logged with the store still away, and the back-off
   * started over (or its retry was put off for as long as batches kept filling up).
   */
  private writeFullBatchesSoon(): void {
    if (this.stopped || this.failures > 0) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.tick(true), 0);
  }

  /** Opens the batch new calls go to. */
  private newBatch(): PendingBatch {
    const batch: PendingBatch = { entries: [], text: this.bulkLoads ? "" : null, sums: new BatchSums() };
    this.batches.push(batch);
    return batch;
  }

  /** Entries waiting in memory and on disk. */
  get pending(): number {
    return this.queued + this.spilledCount;
  }

  /** Writes everything queued now; rejects when the store fails (the entries stay queued). */
  async flush(): Promise<void> {
    await recordsHandedOver();
    // Only what is queued now: draining until the queue is empty never ended while calls kept
    // ending, and a reset_spend, /global/spend/reset or a budget's first read (on a call's path)
    // waited for as long as traffic flowed.
    await this.write(false, this.batches.at(-1) ?? null);
  }

  /** Writes until the queue is empty: at shutdown, calls still ending are written too, not spilled. */
  private async flushAll(): Promise<void> {
    await recordsHandedOver();
    await this.write(false);
  }

  /** `upTo`: the last batch to write (null: none); undefined: until the queue is empty. */
  private async write(onlyFullBatches: boolean, upTo?: PendingBatch | null): Promise<void> {
    while (this.running) await this.running;
    this.running = this.drain(onlyFullBatches, upTo);
    try {
      await this.running;
    } finally {
      this.running = undefined;
      // Each drain writes the batches there were when it started, so that a flush waiting for it
      // gets its turn under steady traffic; a batch that filled meanwhile is written next.
      if ((this.batches[0]?.entries.length ?? 0) >= this.batchSize) this.writeFullBatchesSoon();
    }
  }

  /**
   * Final flush within `timeoutMs`, retried while time is left (a store that has just dropped its
   * connections, restarted or failed over, answers on a new one); what cannot be written is
   * spilled to disk for the next start.
   */
  async stop(timeoutMs = 5000): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    const until = Date.now() + timeoutMs;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let over = false;
    const timeout = new Promise<"timeout">((resolve) => {
      timer = setTimeout(() => resolve("timeout"), timeoutMs);
    });
    const flushing = async (): Promise<"ok"> => {
      for (let attempt = 0; ; attempt++) {
        try {
          await this.flushAll();
          return "ok";
        } catch (err) {
          const wait = Math.min(100 * 2 ** attempt, 1000);
          if (over || Date.now() + wait >= until) throw err;
          await new Promise((resolve) => setTimeout(resolve, wait));
        }
      }
    };
    try {
      const result = await Promise.race([flushing(), timeout]);
      if (result === "timeout") this.log.warn("spend flush did not finish at shutdown", { pending: this.queued });
    } catch (err) {
      this.log.warn("spend flush failed at shutdown", { ...storeErrorCause(err), pending: this.queued });
    } finally {
      over = true;
      clearTimeout(timer);
    }
    if (this.queued > 0) this.spillAtStop();
    this.reportDropped("spend entries lost at shutdown: neither the store nor the spill folder took them");
  }

  /**
   * Spills what is still queued, a batch at a time: a disk that fills up part way takes the first
   * ones, and only the batches it refused are counted lost (each is in the file whole or not at all).
   */
  private spillAtStop(): void {
    const left = this.batches.splice(0).filter((b) => b.entries.length > 0);
    this.queued = 0;
    let saved = 0;
    for (const batch of left) {
      try {
        this.spill(batch.entries);
        saved += batch.entries.length;
      } catch (err) {
        this.spillError = err;
        this.drop(batch.entries);
      }
    }
    if (saved > 0) this.log.warn("unwritten spend entries saved to disk; they are written at the next start", { dir: this.opts.spillDir, entries: saved });
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.tick(), ms);
  }

  private async tick(onlyFullBatches = false): Promise<void> {
    this.reportDropped("spend entries dropped: the store is away, memory is full and the spill folder refuses them");
    this.retrySpill();
    try {
      await (onlyFullBatches ? this.write(true, this.batches.at(-1) ?? null) : this.flush());
      if (this.failures > 0) this.log.info("spend writes resumed", { after_failures: this.failures });
      this.failures = 0;
    } catch (err) {
      if (this.failures === 0) this.log.warn("spend writes failing; entries are kept and retried", { ...storeErrorCause(err), pending: this.pending });
      this.failures++;
    }
    this.schedule(this.failures === 0 ? this.intervalMs : Math.min(this.intervalMs * 2 ** this.failures, MAX_BACKOFF_MS));
  }

  private async drain(onlyFullBatches: boolean, upTo?: PendingBatch | null): Promise<void> {
    for (;;) {
      const batch = this.batches[0];
      if (!batch || batch.entries.length < (onlyFullBatches ? this.batchSize : 1)) break;
      // `upTo` already written (by the drain this one waited for), or nothing was queued.
      if (upTo === null || (upTo !== undefined && !this.batches.includes(upTo))) break;
      // Calls that end while it is written go to a new batch.
      if (batch === this.batches.at(-1)) this.newBatch();
      const logRows = this.logRows();
      const copyText = this.bulkLoads && logRows ? (batch.text ?? copyRows(batch.entries)) : undefined;
      await this.writeSettingAside(batch.entries, { copyText, logRows, sums: batch.sums });
      // Only the last batch takes new calls, so this one is still at the front.
      this.batches.shift();
      this.queued -= batch.entries.length;
      this.written += batch.entries.length;
      if (batch === upTo) break;
    }
    await this.replaySpill();
  }

  /** Throws when the disk refuses (full, unwritable): the caller keeps the entries or counts them lost. */
  private spill(entries: SpendEntry[]): void {
    if (!this.spillFile) {
      mkdirSync(this.opts.spillDir, { recursive: true });
      this.spillFile = join(this.opts.spillDir, `spend-${Date.now()}-${process.pid}-${Math.random().toString(36).slice(2, 8)}.jsonl`);
    }
    this.mayHaveSpill = true;
    appendWhole(this.spillFile, `${entries.map((e) => JSON.stringify(e)).join("\n")}\n`);
    this.spilledCount += entries.length;
  }

  /** Spills `entries`; false when the disk refuses them (logged once until a spill succeeds again): they stay with the caller. */
  private spillOrKeep(entries: SpendEntry[]): boolean {
    try {
      this.spill(entries);
    } catch (err) {
      if (this.spillError === undefined) {
        this.log.error("spend entries cannot be spilled to disk; they are kept in memory and the spill retried", {
          ...storeErrorCause(err),
          dir: this.opts.spillDir,
          in_memory: this.queued,
          memory_hard_limit: this.memoryHardLimit,
        });
      }
      this.spillError = err;
      return false;
    }
    if (this.spillError !== undefined) this.log.info("spend entries are spilled to disk again", { entries: entries.length });
    this.spillError = undefined;
    return true;
  }

  /**
   * After a spill failed: moves the newest batches past the memory bound to disk, never the
   * oldest (it may be being written). Nothing past the bound: the next call past it tries the disk.
   */
  private retrySpill(): void {
    if (this.spillError === undefined) return;
    let from = this.batches.length;
    for (let kept = this.queued; from > 1 && kept > this.memoryLimit; ) kept -= this.batches[--from]!.entries.length;
    if (from === this.batches.length) {
      this.spillError = undefined;
      return;
    }
    const entries = this.batches.slice(from).flatMap((b) => b.entries);
    if (!this.spillOrKeep(entries)) return;
    this.batches.splice(from);
    this.queued -= entries.length;
    // New calls go to a batch of their own: the one now last may be being written.
    this.newBatch();
  }

  /** Counts entries no one took, for the next `reportDropped`. */
  private drop(entries: SpendEntry[]): void {
    this.dropped.entries += entries.length;
    for (const e of entries) this.dropped.pico += BigInt(e.spendPico);
  }

  /** One error for every entry dropped since the last, with their spend. */
  private reportDropped(msg: string): void {
    const { entries, pico } = this.dropped;
    if (entries === 0) return;
    this.dropped = { entries: 0, pico: 0n };
    const cause = this.spillError === undefined ? {} : storeErrorCause(this.spillError);
    this.log.error(msg, { entries, spend_usd: picoToText(pico), dir: this.opts.spillDir, ...cause });
  }

  private spillFiles(): string[] {
    try {
      return readdirSync(this.opts.spillDir)
        .filter((f) => f.startsWith("spend-") && f.endsWith(".jsonl"))
        .sort()
        .map((f) => join(this.opts.spillDir, f));
    } catch {
      return [];
    }
  }

  /**
   * Writes a batch. One the store refuses for a value in it is written in halves, down to the
   * entries it refuses on their own, which are set aside in a file of their own (and logged)
   * instead of holding every call after them out of the store, retried forever. Rows already
   * written are not written again (they are keyed by call id).
   */
  private async writeSettingAside(entries: SpendEntry[], prepared: PreparedBatch): Promise<void> {
    try {
      await writeBatch(this.store, entries, prepared);
    } catch (err) {
      const refusal = refusedData(err);
      if (!refusal) throw err;
      if (entries.length === 1) {
        this.setAside(entries[0]!, refusal);
        return;
      }
      // The halves' COPY text and sums are their own.
      const half = Math.ceil(entries.length / 2);
      await this.writeSettingAside(entries.slice(0, half), { logRows: prepared.logRows });
      await this.writeSettingAside(entries.slice(half), { logRows: prepared.logRows });
    }
  }

  /**
   * Keeps an entry the store refuses in a file of its own. When the disk refuses that too, the
   * entry is logged as lost with what it cost: the store will never take it, and throwing held
   * every later call's entry behind it, retried for as long as the disk stayed full.
   */
  private setAside(entry: SpendEntry, refusal: object): void {
    const file = join(this.opts.spillDir, `refused-${new Date().toISOString().slice(0, 10)}.jsonl`);
    try {
      mkdirSync(this.opts.spillDir, { recursive: true });
      appendFileSync(file, `${JSON.stringify(entry)}\n`);
    } catch (err) {
      this.log.error("the store refused a spend entry and the disk refused to keep it; it is lost", {
        call: entry.callId,
        api_key: entry.apiKey,
        spend_usd: picoToText(BigInt(entry.spendPico)),
        error: String(refusal),
        disk_error: String(err),
        file,
      });
      return;
    }
    this.log.error("the store refused a spend entry; it is set aside, not written", { call: entry.callId, error: String(refusal), file });
  }

  /** Writes spill files oldest first; each is deleted once all its rows are in the store. */
  private async replaySpill(): Promise<void> {
    if (!this.mayHaveSpill) return;
    for (const file of this.spillFiles()) {
      // The file being appended to is closed first, so nothing lands in it after it is read.
      if (file === this.spillFile) this.spillFile = undefined;
      const lines = readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0);
      const entries: SpendEntry[] = [];
      for (const line of lines) {
        try {
          entries.push(JSON.parse(line) as SpendEntry);
        } catch {
          // A line cut by a crash mid-write: the rest of the file is still good.
          this.log.warn("skipped an unreadable spend spill line", { file });
        }
      }
      for (let i = 0; i < entries.length; i += this.batchSize) {
        await this.writeSettingAside(entries.slice(i, i + this.batchSize), { logRows: this.logRows() });
      }
      try {
        unlinkSync(file);
      } catch {
        // Another instance sharing the folder replayed it too (harmless: rows are idempotent).
      }
      this.written += entries.length;
      this.spilledCount = Math.max(0, this.spilledCount - entries.length);
      this.log.info("spend spill file written to the store", { file, entries: entries.length });
    }
    // Every file found was written; a spill during the awaits above sets the flag again.
    if (!this.spillFile) this.mayHaveSpill = false;
  }
}

/**
 * The store's refusal of what it was given (SQLSTATE class 22, data exception: a value out of
 * range, text that is not a number; class 54, program limit exceeded: a key too long for its
 * index), which writing it again cannot change, as opposed to failing to answer (connection lost,
 * store restarting), which a later write can get past; undefined when `err` is not one.
 */
const refusedData = (err: unknown): object | undefined => withSqlState(err, (code) => code.startsWith("22") || code.startsWith("54"));

/**
 * Appends `text` to `file` whole or not at all: a write cut short (a disk that filled up) is cut
 * back off before the error is thrown, so what the caller counts as not spilled is not in the file.
 * Before, its first lines stayed and were replayed, while a stop counted them lost.
 */
function appendWhole(file: string, text: string): void {
  const fd = openSync(file, "a");
  try {
    const size = fstatSync(fd).size;
    try {
      writeFileSync(fd, text);
    } catch (err) {
      ftruncateSync(fd, size);
      throw err;
    }
  } finally {
    closeSync(fd);
  }
}

/**
 * Calls that already ended hand their records over in a setImmediate batch (pipeline/record.ts):
 * waiting one turn first means a flush includes every call answered before it was asked.
 */
const recordsHandedOver = (): Promise<unknown> => new Promise((resolve) => setImmediate(resolve));
