/**
 * Hands finished calls to spend recorders and logging callbacks, off the response path: records
 * are queued and delivered in one batch per event-loop turn (one scheduled task, not one per call).
 */
import type { CallRecord, Lease, Logger, Usage } from "../contract.ts";
import type { Snapshot } from "../snapshot.ts";

const queue: { snapshot: Snapshot; record: CallRecord; log: Logger }[] = [];
let scheduled = false;

function deliver(snapshot: Snapshot, record: CallRecord, log: Logger): void {
  try {
    snapshot.spendLog?.record(record);
  } catch (err) {
    log.error("spend log failed", { error: String(err), call: record.id });
  }
  for (const s of snapshot.spend) {
    try {
      s.record(record);
    } catch (err) {
      log.error("spend recorder failed", { error: String(err), call: record.id });
    }
  }
  const callbacks = record.status === "success" ? snapshot.successCallbacks : snapshot.failureCallbacks;
  for (const cb of callbacks) {
    Promise.resolve()
      .then(() => cb.log(record))
      .catch((err) => log.error("logging callback failed", { error: String(err), call: record.id }));
  }
}

/** Records waiting for their delivery (tests: none once the gateway is idle). */
export function pendingRecords(): number {
  return queue.length;
}

function drain(): void {
  scheduled = false;
  for (const item of queue.splice(0)) deliver(item.snapshot, item.record, item.log);
}

export function dispatchRecord(snapshot: Snapshot, record: CallRecord, log: Logger): void {
  if (!snapshot.spendLog && snapshot.spend.length === 0 && snapshot.successCallbacks.length === 0 && snapshot.failureCallbacks.length === 0) return;
  queue.push({ snapshot, record, log });
  if (!scheduled) {
    scheduled = true;
    setImmediate(drain);
  }
}

export function settleAll(leases: readonly Lease[], usage: Usage, cost: bigint): void {
  for (const l of leases) l.settle(usage, cost);
}

const NOTHING: Usage = { promptTokens: 0, completionTokens: 0 };

/** Takes back every lease of a call refused before it went upstream: it counts for nothing. */
export function cancelAll(leases: readonly Lease[]): void {
  for (const l of leases) {
    if (l.cancel) l.cancel();
    else l.settle(NOTHING, 0n);
  }
}
