/**
 * Routing strategies: which of a group's available deployments takes the next attempt.
 *
 * - `simple-shuffle`: random, weighted by `weight` (else `rpm`, else `tpm`, else equal): one field
 *   for the whole group, a deployment without it weighing 0;
 * - `least-busy`: fewest calls in flight on this instance;
 * - `latency-based-routing`: lowest moving-average latency (unmeasured deployments first, so each gets measured);
 * - `usage-based-routing(-v2)`: fewest tokens in the last minute;
 * - `cost-based-routing`: cheapest price for 1,000 prompt + 1,000 output tokens (unpriced last).
 * Ties are broken at random, so equal deployments share the load. Whatever the strategy, a drained
 * deployment (Rotation) gets no call.
 */
import type { Deployment } from "../contract.ts";
import type { Pricing } from "../cost/pricing.ts";
import { stateOf } from "./deployment-state.ts";
import type { RoutingStrategy } from "./policy.ts";

/** What simple-shuffle weighs a group by: the first of these some deployment of the group sets. */
const WEIGHT_FIELDS = ["weight", "rpm", "tpm"] as const;

function optionOf(d: Deployment, name: string): number | undefined {
  const v = d.options[name];
  return typeof v === "number" ? v : undefined;
}

/**
 * Each deployment's weight: the first of WEIGHT_FIELDS some deployment of the group sets, as
 * LiteLLM's simple_shuffle chooses one per group. Weighing each by its own field would set one's
 * weight against another's rpm, and make `weight: 0` (draining it) fall through to its rpm. A
 * deployment without that field weighs 0; undefined when all weigh 0 (all weigh the same then).
 */
function weightsOf(group: readonly Deployment[]): number[] | undefined {
  const field = WEIGHT_FIELDS.find((name) => group.some((d) => optionOf(d, name) !== undefined));
  if (field === undefined) return undefined;
  const weights = group.map((d) => Math.max(0, optionOf(d, field) ?? 0));
  return weights.some((w) => w > 0) ? weights : undefined;
}

function weightedPick(list: readonly Deployment[], weights: ReadonlyMap<Deployment, number>): Deployment {
  const of = (d: Deployment) => weights.get(d) ?? 0;
  const total = list.reduce((sum, d) => sum + of(d), 0);
  // Only deployments without the weighing field are offered (the weighted ones cooling down or
  // at their limits): they are in rotation, so they take the call, all alike.
  if (total === 0) return list[Math.floor(Math.random() * list.length)]!;
  let r = Math.random() * total;
  for (const d of list) {
    r -= of(d);
    if (r < 0) return d;
  }
  // Math.random() < 1, so only rounding gets here: the last deployment with a weight.
  return list.findLast((d) => of(d) > 0) ?? list[0]!;
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

/**
 * The deployments of `group` a call may go to (Rotation.deployments): all but those the operator
 * drained with their own `weight: 0`, unless all of them are. One merely without the field that
 * weighs the group (an rpm-weighted group's deployment without rpm, which has no limit at all)
 * weighs 0 in simple-shuffle's draw but is not drained: it takes calls when the weighted ones
 * cannot.
 */
function inRotation(group: readonly Deployment[]): readonly Deployment[] {
  const kept = group.filter((d) => (optionOf(d, "weight") ?? 1) > 0);
  return kept.length > 0 ? kept : group;
}

/** Rotation.of's: by group (a snapshot's array, dropped with it) and strategy. */
const rotations = new WeakMap<readonly Deployment[], Map<RoutingStrategy, Rotation>>();

/**
 * A model group as routing sees it, decided on the whole group (once per group and strategy): the deployments it
 * may go to, and how simple-shuffle weighs them. Decided on the deployments a pick is offered
 * instead (those not cooling down, not yet failed by this call, with room), a drained deployment
 * was "all weigh 0, so all weigh the same" whenever the weighted ones were out: every retry after
 * a failure, every call during a cooldown, went to the deployment the operator took out.
 */
export class Rotation {
  /** The group without its drained deployments: those that say `weight: 0`, unless all do. */
  readonly deployments: readonly Deployment[];
  /** simple-shuffle's weight of each deployment in rotation; undefined: all the same. */
  private readonly weights: ReadonlyMap<Deployment, number> | undefined;

  /**
   * The group's rotation under `strategy`: it depends on nothing else, so it is made once per group
   * of a snapshot (the model table's arrays) and strategy, not at every call.
   */
  static of(strategy: RoutingStrategy, group: readonly Deployment[]): Rotation {
    let byStrategy = rotations.get(group);
    if (!byStrategy) {
      byStrategy = new Map();
      rotations.set(group, byStrategy);
    }
    let rotation = byStrategy.get(strategy);
    if (!rotation) {
      rotation = new Rotation(strategy, group);
      byStrategy.set(strategy, rotation);
    }
    return rotation;
  }

  private constructor(
    private readonly strategy: RoutingStrategy,
    group: readonly Deployment[],
  ) {
    const shuffle = strategy === "simple-shuffle";
    const weights = shuffle && group.length > 1 ? weightsOf(group) : undefined;
    this.weights = weights && new Map(group.map((d, i) => [d, weights[i]!]));
    this.deployments = inRotation(group);
  }

  /** Which of `list` (deployments in rotation) takes the next attempt. */
  pick(list: readonly Deployment[], pricing: Pricing, now: number): Deployment {
    if (list.length === 1) return list[0]!;
    switch (this.strategy) {
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
        return this.weights ? weightedPick(list, this.weights) : list[Math.floor(Math.random() * list.length)]!;
    }
  }
}
