/**
 * Hands finished calls to spend recorders and logging callbacks, off the response path: records
 * are queued and delivered in one batch per event-loop turn (one scheduled task, not one per call).
 */
import type { CallRecord, Lease, Logger, Usage } from "../contract.ts";
import { teamLoggingDisabled } from "../identity/team-callbacks.ts";
import type { Snapshot } from "../snapshot.ts";

const queue: { snapshot: Snapshot; record: CallRecord; log: Logger }[] = [];
let scheduled = false;

/** Hands one record to its snapshot's recorders and callbacks; the callbacks' deliveries, settled or not. */
function deliver(snapshot: Snapshot, record: CallRecord, log: Logger): Promise<unknown>[] {
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
  return callbacks.map((cb) =>
    Promise.resolve()
      .then(() => cb.log(record))
      .catch((err) => log.error("logging callback failed", { error: String(err), call: record.id })),
  );
}

/** Records waiting for their delivery (tests: none once the gateway is idle). */
export function pendingRecords(): number {
  return queue.length;
}

function drain(): Promise<unknown>[] {
  scheduled = false;
  return queue.splice(0).flatMap((item) => deliver(item.snapshot, item.record, item.log));
}

/**
 * Delivers the records still queued now, rather than on the next turn, and resolves once their
 * callbacks' deliveries have settled: a snapshot's plugins are disposed (a reload, a stop) and
 * flushed (a stop) only after the last calls pinned to it were handed to them. Before, a stream
 * that ended the snapshot's last pin was logged to a callback already disposed.
 */
export async function deliverPending(): Promise<void> {
  await Promise.allSettled(drain());
}

/**
 * The record as it may be kept and handed on: without its prompt and answer when the caller's
 * team has logging disabled as the call ends, whatever captured them (only billing metadata is
 * recorded for it). The team is read live, as the team's webhooks read it: the row the principal
 * captured at authentication let a call that outlived `disable_logging` (or, on another instance,
 * any call authenticated before the change arrived) be kept with its content.
 */
function recordable(snapshot: Snapshot, record: CallRecord): CallRecord {
  if (record.prompt === undefined && record.answer === undefined) return record;
  const { teamId, team: captured } = record.principal;
  // A team deleted meanwhile is judged by the row the call started with.
  const team = (teamId === undefined ? undefined : snapshot.teams?.get(teamId)) ?? captured;
  if (!teamLoggingDisabled(team)) return record;
  const { prompt: _prompt, answer: _answer, ...metadata } = record;
  return metadata;
}

export function dispatchRecord(snapshot: Snapshot, record: CallRecord, log: Logger): void {
  if (!snapshot.spendLog && snapshot.spend.length === 0 && snapshot.successCallbacks.length === 0 && snapshot.failureCallbacks.length === 0) return;
  queue.push({ snapshot, record: recordable(snapshot, record), log });
  if (!scheduled) {
    scheduled = true;
    setImmediate(() => void drain());
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
