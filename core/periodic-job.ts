/**
 * A background job run every so often: a run is skipped while the previous one is still going,
 * a failed run is reported and the next one tries again, and stopping waits for a run under way.
 */
export class PeriodicJob {
  private timer: ReturnType<typeof setInterval> | undefined;
  private running: Promise<void> | undefined;

  constructor(
    private readonly run: () => Promise<unknown>,
    private readonly failed: (err: unknown) => void,
  ) {}

  start(intervalMs: number): void {
    this.timer = setInterval(() => {
      this.running ??= this.run()
        .then(() => undefined, this.failed)
        .finally(() => {
          this.running = undefined;
        });
    }, intervalMs);
    this.timer.unref?.();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.running;
  }
}
