/**
 * Routing strategies: which of a group's available deployments takes the next attempt.
 *
 * - `simple-shuffle`: random, weighted by `weight` (else `rpm`, else `tpm`, else equal): one field
 *   for the whole list, a deployment without it weighing 0;
 * - `least-busy`: fewest calls in flight on this instance;
 * - `latency-based-routing`: lowest moving-average latency (unmeasured deployments first, so each gets measured);
 * - `usage-based-routing(-v2)`: fewest tokens in the last minute;
 * - `cost-based-routing`: cheapest price for 1,000 prompt + 1,000 output tokens (unpriced last).
 * Ties are broken at random, so equal deployments share the load.
 */
import type { Deployment } from "../contract.ts";
import type { Pricing } from "../cost/pricing.ts";
import { stateOf } from "./deployment-state.ts";
import type { RoutingStrategy } from "./policy.ts";

const WEIGHT_FIELDS = ["weight", "rpm", "tpm"] as const;

function optionOf(d: Deployment, name: string): number | undefined {
  const v = d.options[name];
  return typeof v === "number" ? v : undefined;
}

/**
 * Each deployment's weight: the first of WEIGHT_FIELDS some deployment of the list sets, as
 * LiteLLM's simple_shuffle chooses one per group. Weighing each by its own field would set one's
 * weight against another's rpm, and make `weight: 0` (draining it) fall through to its rpm. A
 * deployment without that field weighs 0; when all weigh 0, all weigh the same.
 */
function weightsOf(list: readonly Deployment[]): number[] {
  const field = WEIGHT_FIELDS.find((name) => list.some((d) => optionOf(d, name) !== undefined));
  const weights = list.map((d) => (field === undefined ? 0 : Math.max(0, optionOf(d, field) ?? 0)));
  return weights.some((w) => w > 0) ? weights : weights.map(() => 1);
}

function weightedPick(list: readonly Deployment[]): Deployment {
  const weights = weightsOf(list);
  let r = Math.random() * weights.reduce((sum, w) => sum + w, 0);
  for (const [i, d] of list.entries()) {
    r -= weights[i]!;
    if (r < 0) return d;
  }
  // Math.random() < 1, so only rounding gets here: the last deployment with a weight.
  return list[weights.findLastIndex((w) => w > 0)]!;
}

/** The deployment with the lowest score; ties at random. */
function lowest(list: readonly Deployment[], score: (d: Deployment) => number): Deployment {
  let best: Deployment[] = [];
  let bestScore = Number.POSITIVE_INFINITY;
  for (const d of list) {
    const s = score(d);
    if (s < bestScore) {
      bestScore = s;
      best = [d];
    } else if (s === bestScore) best.push(d);
  }
  return best[Math.floor(Math.random() * best.length)] ?? list[0]!;
}

const SAMPLE_USAGE = { promptTokens: 1000, completionTokens: 1000 };
/**
 * How long SAMPLE_USAGE's call takes, for deployments priced per second of the call (else they
 * would look free): 1,000 answer tokens at about 100 a second.
 */
const SAMPLE_CALL_MS = 10_000;

/**
 * What SAMPLE_USAGE's call would cost at `d`. A deployment without a price (a fine-tune or
 * self-hosted name the price map lacks) costs something unknown, not nothing: it comes last, as
 * LiteLLM's lowest_cost takes an unknown price to be dear; it wins only when none is priced.
 */
function sampleCost(pricing: Pricing, d: Deployment): number {
  const c = pricing.costOf(d, SAMPLE_USAGE, SAMPLE_CALL_MS);
  return c.priced ? Number(c.cost) : Number.POSITIVE_INFINITY;
}

export function pickDeployment(strategy: RoutingStrategy, list: readonly Deployment[], pricing: Pricing, now: number): Deployment {
  if (list.length === 1) return list[0]!;
  switch (strategy) {
    case "least-busy":
      return lowest(list, (d) => stateOf(d.id).inFlight);
    case "latency-based-routing":
      return lowest(list, (d) => stateOf(d.id).latencyMs ?? -1);
    case "usage-based-routing":
    case "usage-based-routing-v2":
      return lowest(list, (d) => {
        const u = stateOf(d.id).usage;
        u.prune(now);
        return u.tokenSum;
      });
    case "cost-based-routing":
      return lowest(list, (d) => sampleCost(pricing, d));
    default:
      return weightedPick(list);
  }
}
