// Which pass-through endpoint a path reaches, and the URL the target is called at.
import { describe, expect, test } from "bun:test";
import type { PassThroughEndpointConfig } from "../../core/config/schema.ts";
import { targetUrl } from "../../core/pass-through/forward.ts";
import { buildPassThrough } from "../../core/pass-through/table.ts";

function table(list: PassThroughEndpointConfig[]) {
  const errors: string[] = [];
  const t = buildPassThrough(list, errors);
  expect(errors).toEqual([]);
  return t;
}

describe("matching", () => {
  const t = table([
    { path: "/a", target: "http://t/a", include_subpath: true },
    { path: "/a/b/", target: "http://t/ab", include_subpath: true },
    { path: "/exact", target: "http://t/e" },
    { id: "m-get", path: "/m", target: "http://t/m-get", methods: ["GET"] },
    { id: "m-post", path: "/m", target: "http://t/m-post", methods: ["POST"] },
  ]);
  const target = (path: string, method = "GET") => {
    const m = t.match(path, method);
    return m && "endpoint" in m ? `${m.endpoint.target} ${m.subpath}` : m;
  };

  test("the most specific prefix wins; a trailing slash after the endpoint's own path does not matter, one after a subpath is kept", () => {
    expect(target("/a/b/c")).toBe("http://t/ab /c");
    expect(target("/a/x/y")).toBe("http://t/a /x/y");
    expect(target("/a/x/y/")).toBe("http://t/a /x/y/");
    expect(target("/a/x//")).toBe("http://t/a /x//");
    expect(target("/a/b/")).toBe("http://t/ab ");
    expect(target("/ab")).toBeUndefined();
  });

  test("without include_subpath only the path itself", () => {
    expect(target("/exact")).toBe("http://t/e ");
    expect(target("/exact/more")).toBeUndefined();
  });

  test("one path, two endpoints by method; another method lists the allowed ones", () => {
    expect(target("/m", "GET")).toBe("http://t/m-get ");
    expect(target("/m", "POST")).toBe("http://t/m-post ");
    expect(t.match("/m", "DELETE")).toEqual({ allowed: ["GET", "POST"] });
  });

  test("a root endpoint with include_subpath takes every path", () => {
    const root = table([{ path: "/", target: "http://t/", include_subpath: true }]);
    const m = root.match("/x/y", "GET");
    expect(m && "endpoint" in m ? m.subpath : m).toBe("/x/y");
  });
});

test("endpoints sharing a path without ids are told to name them", () => {
  const errors: string[] = [];
  buildPassThrough([{ path: "/m", target: "http://t/1", methods: ["GET"] }, { path: "/m", target: "http://t/2", methods: ["POST"] }], errors);
  expect(errors).toEqual(["/general_settings/pass_through_endpoints/1/id: '/m' is already used by /general_settings/pass_through_endpoints/0 (an endpoint without an id is named by its path: give endpoints that share a path an id each)"]);
});

describe("target URL", () => {
  test("subpath joined without doubled slashes; the client's query after the target's own", () => {
    expect(targetUrl("http://t/base/", "/v1/x", "http://gw/p/v1/x?b=2&c=3")).toBe("http://t/base/v1/x?b=2&c=3");
    expect(targetUrl("http://t/base?key=k", "", "http://gw/p?b=2")).toBe("http://t/base?key=k&b=2");
    expect(targetUrl("http://t", "/x", "http://gw/p/x")).toBe("http://t/x");
  });

  test("every parameter as it was written, in order; the client's for a name the target sets (however encoded) dropped", () => {
    expect(targetUrl("http://t/b?tier=a%20b&api_key=k", "", "http://gw/p?q=a%20b&f&api_key=evil&ap%69_key=evil&q=+~&s=a/b?c")).toBe("http://t/b?tier=a%20b&api_key=k&q=a%20b&f&q=+~&s=a/b?c");
    expect(targetUrl("http://t/b?flag", "", "http://gw/p?&&flag=1")).toBe("http://t/b?flag");
    expect(targetUrl("http://t/b?x=%7E", "", "http://gw/p?")).toBe("http://t/b?x=%7E");
  });
});
