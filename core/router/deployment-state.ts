/**
 * What the router knows about each deployment on this instance: calls in flight, recent latency,
 * tokens in the last minute, recent failures and cooldown. Kept by deployment id across reloads
 * (a deployment that did not change keeps its history).
 */
import { SlidingWindow } from "../limits/window.ts";
import type { RoutePolicy } from "./policy.ts";

const FAILURE_WINDOW_MS = 60_000;
/**
 * The longest cooldown: an upstream's `retry-after` (or `cooldown_time`) may ask for years, which
 * would take a deployment out of routing until a restart; other instances believe no longer.
 */
export const MAX_COOLDOWN_MS = 24 * 3_600_000;
/** Weight of the newest sample in the latency average. */
const LATENCY_ALPHA = 0.3;

export class DeploymentState {
  inFlight = 0;
  /** Moving average of time to first byte (streams) or to the whole answer, ms; undefined until measured. */
  latencyMs: number | undefined;
  readonly usage = new SlidingWindow();
  private failures: number[] = [];
  cooldownUntil = 0;

  coolingDown(now: number): boolean {
    return this.cooldownUntil > now;
  }

  /** Cools down until `until` (ms), unless already cooling down longer (another instance said so). */
  coolUntil(until: number): void {
    this.cooldownUntil = Math.max(this.cooldownUntil, until);
  }

  /** `trackUsage`: only usage-based routing needs the minute's tokens (a log entry per call). Returns the entry, or -1. */
  started(now: number, trackUsage: boolean): number {
    this.inFlight++;
    if (!trackUsage) return -1;
    this.usage.prune(now);
    return this.usage.add(0, now);
  }

  ended(seq: number, tokens: number): void {
    this.inFlight = Math.max(0, this.inFlight - 1);
    if (seq >= 0) this.usage.settle(seq, tokens);
  }

  succeeded(latencyMs: number): void {
    this.latencyMs = this.latencyMs === undefined ? latencyMs : this.latencyMs + LATENCY_ALPHA * (latencyMs - this.latencyMs);
  }

  /**
   * An attempt that timed out after `afterMs`: the deployment is taken to be at least that slow
   * (LiteLLM's latency router does the same). Only successes moved the figure before, so a
   * deployment that hung kept its old, fast average and won the latency router's pick again each
   * time its cooldown ended.
   */
  timedOut(afterMs: number): void {
    this.latencyMs = Math.max(this.latencyMs ?? 0, afterMs);
  }

  /**
   * Counts a failure that may cool the deployment down: more than `allowed_fails` in a minute, or
   * at once on an upstream 429 (its `retry-after` when longer, up to MAX_COOLDOWN_MS). The caller
   * never asks this for a group's only deployment: with nowhere else to go, cooling it down would
   * only add failures.
   * Returns the cooldown in ms when this failure started one, else 0.
   */
  failed(policy: RoutePolicy, now: number, rateLimited: boolean, upstreamRetryAfterMs: number | undefined): number {
    if (!policy.cooldowns) return 0;
    const cutoff = now - FAILURE_WINDOW_MS;
    this.failures = this.failures.filter((t) => t > cutoff);
    this.failures.push(now);
    if (rateLimited || this.failures.length > policy.allowedFails) {
      const ms = Math.min(MAX_COOLDOWN_MS, Math.max(policy.cooldownMs, upstreamRetryAfterMs ?? 0));
      this.coolUntil(now + ms);
      this.failures = [];
      return ms;
    }
    return 0;
  }
}

const states = new Map<string, DeploymentState>();

export function stateOf(id: string): DeploymentState {
  let s = states.get(id);
  if (!s) {
    s = new DeploymentState();
    states.set(id, s);
  }
  return s;
}

/**
 * Forgets deployments no snapshot serves any more (a reload removed them, or changed one whose id
 * is a hash of its entry; a stored model deleted), once nothing of theirs is under way: their
 * figures would otherwise stay for the life of the process, a usage-based router's last minute of
 * calls included.
 */
export function forgetDeploymentStates(ids: Iterable<string>, now = Date.now()): void {
  for (const id of ids) {
    const s = states.get(id);
    if (!s || s.inFlight > 0 || s.coolingDown(now)) continue;
    states.delete(id);
  }
}

/** The deployments the router keeps figures for (tests). */
export function deploymentStateIds(): string[] {
  return [...states.keys()];
}

/** Forgets everything (tests). */
export function resetDeploymentStates(): void {
  states.clear();
}
