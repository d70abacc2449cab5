/**
 * The pass-through endpoints of one config (`general_settings.pass_through_endpoints`): gateway
 * routes forwarded as they are to another HTTP API, behind the gateway's keys, limits, budgets and
 * spend log. Built once per snapshot, so a reload adds or removes them like models.
 */
import { unsetVariable } from "../config/load.ts";
import { HEADER_VALUE, type PassThroughEndpointConfig } from "../config/schema.ts";
import { usdToPico } from "../cost/money.ts";
import { hiddenHeaderValues } from "../secrets.ts";

export type PassThroughMethod = "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
const EVERY_METHOD: readonly PassThroughMethod[] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

export interface PassThroughEndpoint {
  /** `id` from the config, else the path. */
  id: string;
  /** As configured, without a trailing slash (what the spend log and the listings name). */
  path: string;
  /**
   * The path as requests spell it: non-ASCII letters and other characters a URL cannot hold
   * percent-encoded, dot segments resolved, without a trailing slash. What matching compares.
   */
  route: string;
  target: string;
  /** The target's origin: what errors may name (its path or query may hold a credential). */
  origin: string;
  /** Configured headers with every `os.environ/NAME` resolved. */
  headers: Readonly<Record<string, string>>;
  forwardHeaders: boolean;
  includeSubpath: boolean;
  /** Pico-dollars charged per successful call. */
  costPerRequest: bigint;
  auth: boolean;
  methods: readonly PassThroughMethod[];
  /** Seconds; absent: the gateway's request timeout. */
  timeout?: number;
  /** The entry as written (header values hidden), for `/config/pass_through_endpoint`. */
  shown: Record<string, unknown>;
}

export type PassThroughMatch =
  | { endpoint: PassThroughEndpoint; subpath: string }
  /** The path is served, but not for this method. */
  | { allowed: readonly PassThroughMethod[] };

const ENV_IN_TEXT = /os\.environ\/([A-Za-z_][A-Za-z0-9_]*)/g;

/** A target URL for display: credentials in its user part or query are not shown. */
function shownTarget(target: string): string {
  const u = new URL(target);
  if (!u.username && !u.password && !u.search) return target;
  return `${u.origin}${u.pathname}${u.search ? "?[redacted]" : ""}`;
}

function normalPath(path: string): string {
  return path.length > 1 && path.endsWith("/") ? path.replace(/\/+$/, "") || "/" : path;
}

/** `path` as a request's URL spells it (`/résumé` → `/r%C3%A9sum%C3%A9`). */
function routeOf(path: string): string {
  return normalPath(new URL(`http://x${path}`).pathname);
}

export class PassThroughTable {
  private readonly exact = new Map<string, PassThroughEndpoint[]>();
  /** Paths with `include_subpath` endpoints, as the prefix they serve, longest first (the most specific wins). */
  private readonly prefixed: { prefix: string; endpoints: PassThroughEndpoint[] }[] = [];

  constructor(readonly endpoints: readonly PassThroughEndpoint[]) {
    const byPrefix = new Map<string, PassThroughEndpoint[]>();
    for (const e of endpoints) {
      const list = this.exact.get(e.route) ?? [];
      list.push(e);
      this.exact.set(e.route, list);
      if (!e.includeSubpath) continue;
      const prefix = e.route === "/" ? "/" : `${e.route}/`;
      byPrefix.set(prefix, [...(byPrefix.get(prefix) ?? []), e]);
    }
    for (const [prefix, list] of byPrefix) this.prefixed.push({ prefix, endpoints: list });
    this.prefixed.sort((a, b) => b.prefix.length - a.prefix.length);
  }

  get size(): number {
    return this.endpoints.length;
  }

  byId(id: string): PassThroughEndpoint | undefined {
    return this.endpoints.find((e) => e.id === id);
  }

  match(rawPath: string, method: string): PassThroughMatch | undefined {
    const path = normalPath(rawPath);
    const here = this.exact.get(path);
    if (here) return pick(here, method, "");
    for (const { prefix, endpoints } of this.prefixed) {
      // The rest of the path as the client sent it, trailing slash included (`/items/` and `/items` may differ at the target).
      if (path.startsWith(prefix)) return pick(endpoints, method, rawPath.slice(prefix.length - 1));
    }
    return undefined;
  }
}

function pick(candidates: readonly PassThroughEndpoint[], method: string, subpath: string): PassThroughMatch {
  const endpoint = candidates.find((e) => (e.methods as readonly string[]).includes(method));
  if (endpoint) return { endpoint, subpath };
  return { allowed: [...new Set(candidates.flatMap((e) => e.methods))] };
}

export const NO_PASS_THROUGH = new PassThroughTable([]);

/** The config's list → the table; every problem goes to `errors` with its path. */
export function buildPassThrough(list: readonly PassThroughEndpointConfig[] | undefined, errors: string[]): PassThroughTable {
  if (!list || list.length === 0) return NO_PASS_THROUGH;
  const endpoints: PassThroughEndpoint[] = [];
  /** Each endpoint's index in the file's list (a refused file's check leaves out entries the schema refused). */
  const index = new Map<PassThroughEndpoint, number>();
  const ids = new Map<string, number>();
  for (const [i, entry] of list.entries()) {
    if (entry === undefined) continue;
    const where = `/general_settings/pass_through_endpoints/${i}`;
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(entry.headers ?? {})) {
      const read: string[] = [];
      headers[name] = value.replace(ENV_IN_TEXT, (_, env: string) => {
        const v = process.env[env];
        if (!v) errors.push(`${where}/headers/${name}: ${unsetVariable(env)}`);
        else read.push(env);
        return v ?? "";
      });
      if (read.length > 0 && !HEADER_VALUE.test(headers[name]!)) {
        errors.push(`${where}/headers/${name}: with ${read.join(", ")} read in, the value has a line break inside, a NUL or a character beyond Latin-1, which a header cannot carry`);
      }
    }
    const path = normalPath(entry.path);
    const route = routeOf(path);
    const id = entry.id ?? path;
    const methods = entry.methods ?? EVERY_METHOD;
    const dupId = ids.get(id);
    if (dupId !== undefined) {
      const hint = entry.id === undefined ? " (an endpoint without an id is named by its path: give endpoints that share a path an id each)" : "";
      errors.push(`${where}/id: '${id}' is already used by /general_settings/pass_through_endpoints/${dupId}${hint}`);
    }
    ids.set(id, i);
    for (const other of endpoints) {
      const overlap = other.route === route ? methods.filter((m) => other.methods.includes(m)) : [];
      if (overlap.length > 0) errors.push(`${where}/path: '${path}' (${overlap.join(", ")}) is already served by /general_settings/pass_through_endpoints/${index.get(other)}`);
    }
    const shown: Record<string, unknown> = {
      id,
      path,
      target: shownTarget(entry.target),
      headers: hiddenHeaderValues(headers),
      forward_headers: entry.forward_headers ?? false,
      include_subpath: entry.include_subpath ?? false,
      cost_per_request: entry.cost_per_request ?? 0,
      auth: entry.auth ?? true,
      methods,
    };
    if (entry.timeout !== undefined) shown.timeout = entry.timeout;
    const endpoint: PassThroughEndpoint = {
      id,
      path,
      route,
      target: entry.target,
      origin: new URL(entry.target).origin,
      headers,
      forwardHeaders: entry.forward_headers ?? false,
      includeSubpath: entry.include_subpath ?? false,
      costPerRequest: usdToPico(entry.cost_per_request ?? 0),
      auth: entry.auth ?? true,
      methods,
      timeout: entry.timeout,
      shown,
    };
    endpoints.push(endpoint);
    index.set(endpoint, i);
  }
  return new PassThroughTable(endpoints);
}
