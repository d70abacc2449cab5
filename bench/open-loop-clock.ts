/**
 * The open-loop generator's clock (a Worker): sleeps in Atomics.wait (a futex with a sub-millisecond
 * timeout, no spinning) until each scheduled send time, then tells the main thread which request
 * index is due. setTimeout has a 1 ms granularity in Bun, too coarse for 1,000 req/s.
 */
// Inside a Worker, `self` is the worker's global scope: onmessage receives, postMessage sends.
const scope = self as unknown as Worker;

interface Plan {
  /** Absolute start time, ms since the epoch (performance.timeOrigin + performance.now()). */
  startAbs: number;
  intervalMs: number;
  count: number;
}

const cell = new Int32Array(new SharedArrayBuffer(4));
const nowAbs = () => performance.timeOrigin + performance.now();

scope.onmessage = (e: MessageEvent<Plan>) => {
  const { startAbs, intervalMs, count } = e.data;
  let i = 0;
  while (i < count) {
    const remaining = startAbs + i * intervalMs - nowAbs();
    if (remaining > 0.02) {
      Atomics.wait(cell, 0, 0, remaining - 0.02);
      continue;
    }
    // Everything due by now goes in one message; the main thread sends each with its own schedule.
    let last = i;
    const now = nowAbs();
    while (last + 1 < count && startAbs + (last + 1) * intervalMs <= now) last++;
    scope.postMessage(last);
    i = last + 1;
  }
  scope.postMessage(-1);
};
