/**
 * The methods the app's own routes serve on a path. A request for a served path with another
 * method (`GET /v1/chat/completions`) is a 405 naming them (`Allow`), not a 404 that says the
 * route does not exist.
 */
export interface ServedRoutes {
  /** The methods served on `path`, sorted; none when no route serves it. */
  methodsFor(path: string): string[];
}

const escapeRegExp = (text: string): string => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/** An Elysia route path (`/models/:model_id`, `/v1beta/models/*`) as a pattern of the paths it serves. */
function patternOf(path: string): RegExp {
  const segments = path.split("/").map((s) => (s === "*" ? ".*" : s.startsWith(":") ? "[^/]+" : escapeRegExp(s)));
  return new RegExp(`^${segments.join("/")}/?$`);
}

/** From the app's routes; a route for every method (`ALL`) is left out: a request it matches never falls through. */
export function servedRoutes(routes: readonly { method: string; path: string }[]): ServedRoutes {
  const table = new Map<string, { pattern: RegExp; methods: Set<string> }>();
  for (const r of routes) {
    if (r.method === "ALL") continue;
    let entry = table.get(r.path);
    if (!entry) {
      entry = { pattern: patternOf(r.path), methods: new Set() };
      table.set(r.path, entry);
    }
    entry.methods.add(r.method);
  }
  return {
    methodsFor(path) {
      const methods = new Set<string>();
      for (const e of table.values()) if (e.pattern.test(path)) for (const m of e.methods) methods.add(m);
      return [...methods].sort();
    },
  };
}
