/**
 * Waits that come from settings or upstream answers. setTimeout holds at most 2^31-1 ms (~24.8
 * days): a longer delay fires at once (Bun and Node warn and use 1 ms), so a huge wait would
 * become no wait at all. Longer waits are made of several timers instead.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** Resolves after the event loop has had a turn: long work on the request thread lets requests in between its parts. */
export const nextTurn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** Resolves after `ms` (NaN or negative: at once), or as soon as `signal` aborts. */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
  if (!(ms > 0) || signal?.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const until = performance.now() + ms;
    let timer: ReturnType<typeof setTimeout>;
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const step = () => {
      const left = until - performance.now();
      if (left <= 0) done();
      else timer = setTimeout(step, Math.min(MAX_TIMER_MS, left));
    };
    signal?.addEventListener("abort", done, { once: true });
    step();
  });
}

/** Waits for `p` (its failure too), at most `ms`: true when it ended in time. */
export async function within(ms: number, p: Promise<unknown>): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const settled = p.then(
    () => true,
    () => true,
  );
  const ended = await Promise.race([settled, new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)))]);
  clearTimeout(timer);
  return ended;
}

/**
 * `work`'s outcome, or a rejection with `timedOut()` once `ms` have passed first (the timer is
 * cleared either way). What `work` yields after that goes to `late` (a grant to give back, hooks
 * to dispose), and a late failure is not left unhandled.
 */
export function beforeTimeout<T>(work: Promise<T>, ms: number, timedOut: () => Error, late?: (value: T) => void): Promise<T> {
  let expired = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      expired = true;
      reject(timedOut());
    }, ms);
  });
  work.then(
    (value) => {
      if (expired) late?.(value);
    },
    () => undefined,
  );
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}
