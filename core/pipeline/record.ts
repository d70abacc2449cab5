/** Hands a finished call to spend recorders and logging callbacks, off the response path. */
import type { CallRecord, Lease, Logger, Usage } from "../contract.ts";
import type { Snapshot } from "../snapshot.ts";

export function dispatchRecord(snapshot: Snapshot, record: CallRecord, log: Logger): void {
  setTimeout(() => {
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
  }, 0);
}

export function settleAll(leases: readonly Lease[], usage: Usage): void {
  for (const l of leases) l.settle(usage);
}
