/** The model table of one snapshot: model groups by name, and wildcard entries such as `openai/*`. */
import { createHash } from "node:crypto";
import type { Deployment } from "./contract.ts";
import type { ModelEntry } from "./config/schema.ts";

export interface WildcardRoute {
  /** The `model_name` pattern, e.g. `openai/*` or `*`. */
  pattern: string;
  prefix: string;
  suffix: string;
  deployments: Deployment[];
}

/** Stable id of a config entry without `model_info.id`: a hash of its name and parameters. */
export function deploymentId(entry: ModelEntry): string {
  const params = Object.fromEntries(Object.entries(entry.svc_params).sort(([a], [b]) => a.localeCompare(b)));
  return createHash("sha256").update(JSON.stringify([entry.model_name, params])).digest("hex");
}

export function toDeployment(entry: ModelEntry): Deployment {
  const { model, api_base, api_key, api_version, timeout, headers } = entry.svc_params;
  const slash = model.indexOf("/");
  return {
    id: entry.model_info?.id ?? deploymentId(entry),
    modelName: entry.model_name,
    provider: model.slice(0, slash),
    upstreamModel: model.slice(slash + 1),
    apiBase: api_base,
    apiKey: api_key,
    apiVersion: api_version,
    timeout,
    headers,
    options: entry.svc_params,
    info: entry.model_info ?? {},
  };
}

const WILDCARD_CACHE_LIMIT = 1000;

/** Model names that say their kind when `model_info.mode` does not. */
const MODEL_NAMED = { moderation: /moderation/, image_generation: /dall-e|gpt-image|imagen/ } as const;

export class ModelTable {
  readonly groups: ReadonlyMap<string, readonly Deployment[]>;
  readonly wildcards: readonly WildcardRoute[];
  readonly entries: readonly { entry: ModelEntry; deployment: Deployment }[];
  /** Deployments made for wildcard matches, so a hot model name allocates once per snapshot. */
  private readonly wildcardHits = new Map<string, readonly Deployment[]>();
  /** `defaultGroup`'s answers: the table never changes, so each kind is looked up once. */
  private readonly defaults = new Map<keyof typeof MODEL_NAMED, string | undefined>();
  private readonly routes: ReadonlyMap<string, WildcardRoute>;

  constructor(entries: { entry: ModelEntry; deployment: Deployment }[]) {
    this.entries = entries;
    const groups = new Map<string, Deployment[]>();
    const wildcards = new Map<string, WildcardRoute>();
    for (const { deployment: d } of entries) {
      const star = d.modelName.indexOf("*");
      if (star < 0) {
        const list = groups.get(d.modelName) ?? [];
        list.push(d);
        groups.set(d.modelName, list);
        continue;
      }
      const route = wildcards.get(d.modelName) ?? {
        pattern: d.modelName,
        prefix: d.modelName.slice(0, star),
        suffix: d.modelName.slice(star + 1),
        deployments: [],
      };
      route.deployments.push(d);
      wildcards.set(d.modelName, route);
    }
    this.groups = groups;
    this.routes = wildcards;
    // Most specific pattern first: `openai/*` wins over `*`.
    this.wildcards = [...wildcards.values()].sort((a, b) => b.prefix.length + b.suffix.length - (a.prefix.length + a.suffix.length));
  }

  /**
   * The first model group of a kind (`model_info.mode`, or a model named like one): for the
   * requests whose `model` is optional (moderations, image generation). Found once per table.
   */
  defaultGroup(mode: keyof typeof MODEL_NAMED): string | undefined {
    if (!this.defaults.has(mode)) {
      let found: string | undefined;
      for (const [name, list] of this.groups) {
        if (list.some((d) => d.info.mode === mode || MODEL_NAMED[mode].test(d.upstreamModel))) {
          found = name;
          break;
        }
      }
      this.defaults.set(mode, found);
    }
    return this.defaults.get(mode);
  }

  /** The deployments serving a requested model name, or undefined when nothing matches. */
  resolve(name: string): readonly Deployment[] | undefined {
    const group = this.groups.get(name);
    if (group) return group;
    const hit = this.wildcardHits.get(name);
    if (hit) return hit;
    const w = this.wildcardFor(name);
    if (!w) return undefined;
    const matched = name.slice(w.prefix.length, name.length - w.suffix.length);
    const list = w.deployments.map((d) => ({ ...d, modelName: name, upstreamModel: d.upstreamModel.replace("*", matched) }));
    if (this.wildcardHits.size < WILDCARD_CACHE_LIMIT) this.wildcardHits.set(name, list);
    return list;
  }

  /** The most specific wildcard route serving `name` (not looking at the groups). */
  private wildcardFor(name: string): WildcardRoute | undefined {
    // `*` stands for at least one character: `openai/` names no model (it would go upstream as "").
    return this.wildcards.find((w) => name.length > w.prefix.length + w.suffix.length && name.startsWith(w.prefix) && name.endsWith(w.suffix));
  }

  /**
   * The `model_name` whose deployments serve a requested name: the group of that name, else the
   * wildcard route's pattern (`openai/*`), whose deployments every name it serves shares.
   */
  servingName(name: string): string | undefined {
    return this.groups.has(name) ? name : this.wildcardFor(name)?.pattern;
  }

  /** Every group and wildcard route by its `model_name` (a pattern for a route), with its own deployments. */
  *serving(): Iterable<[string, readonly Deployment[]]> {
    yield* this.groups;
    for (const w of this.wildcards) yield [w.pattern, w.deployments];
  }

  /** The deployments of a group or wildcard route, by its `model_name`. */
  servingDeployments(modelName: string): readonly Deployment[] | undefined {
    return this.groups.get(modelName) ?? this.routes.get(modelName)?.deployments;
  }

  findById(id: string): { entry: ModelEntry; deployment: Deployment } | undefined {
    return this.entries.find((e) => e.deployment.id === id);
  }
}
