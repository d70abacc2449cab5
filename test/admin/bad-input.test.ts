// Bad input to every management route: a body that is not JSON or not an object, each field the
// route knows with a value of the wrong type or an awkward one (NUL, 100k characters, an invalid
// date, negative, huge, 1e309), odd path parameters and query strings of the wrong types. The rule
// checked: bad input gets a 4xx in the spec's error envelope, never a 5xx, a crash, a hang or
// another body, and the store still works afterwards.
//
// The fields a route knows are found by asking it: a body with a wrong-typed value in every field
// named in the schema sources is answered with a 422 naming the first field the route knows and
// the type it expects; that field is noted and the body sent again without it, until the route
// names no more. Those probes are bad input too and are checked like the rest. Each noted field
// then gets the values of its type on its own, the route's other required fields set to existing
// objects so the value reaches the route's logic, not only the schema check.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { AdminDeps } from "../../core/http/admin/context.ts";
import { adminRoutes } from "../../core/http/admin/index.ts";
import { inParallel, refusalError, setAt, snippet, withBad } from "../harness/bad-input.ts";
import { MASTER_KEY, ROOT, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

const CONFIG = { model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" } }], general_settings: { master_key: MASTER_KEY } };

/** Statuses a refusal of bad input may have. */
const REFUSALS = new Set([400, 401, 403, 404, 405, 409, 413, 422]);
/** A request still unanswered after this is a hang. */
const HANG_MS = 15_000;
/** Requests in flight at once, per route. */
const PARALLEL = 8;

const ROUTES = adminRoutes({} as AdminDeps).routes.map((r) => ({ method: r.method, path: r.path }));

/** Names matched by `pattern` (its first group) in `files`. */
function sourceNames(files: string[], pattern: RegExp): string[] {
  const names = new Set<string>();
  for (const file of files) for (const m of readFileSync(join(ROOT, file), "utf8").matchAll(pattern)) names.add(m[1]!);
  return [...names].sort();
}
const sources = (dir: string) =>
  readdirSync(join(ROOT, dir))
    .filter((f) => f.endsWith(".ts"))
    .map((f) => `${dir}/${f}`);

/**
 * Every body field named in a schema of the management API: a name followed by a TypeBox type or
 * a capitalized constant. Read from the sources so a new field is probed without an edit here; the
 * names it also catches (`ctx: AdminCtx`) are fields no route knows, which cost a probe at most.
 */
const BODY_FIELDS = sourceNames(
  [...sources("core/http/admin"), ...sources("core/identity"), "core/config/schema.ts"],
  /\b([a-z][a-z0-9_]*)\s*:\s*(?=T\.|Opt\(|[Nn]ullable\(|[A-Z])/g,
);
/** Every query parameter a management route reads (`api_key` is `keyParam`'s default). */
const QUERY_NAMES = [...sourceNames([...sources("core/http/admin"), ...sources("core/identity")], /(?:query\(|\(ctx, |query, )"([a-z_]+)"/g), "api_key"];

// ---------------------------------------------------------------------------------------------
// Requests and the rule

interface Reply {
  status: number;
  text: string;
}

let gw: TestGateway;

async function send(method: string, path: string, body?: string | Uint8Array<ArrayBuffer>): Promise<Reply> {
  try {
    const res = await fetch(`${gw.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body,
      signal: AbortSignal.timeout(HANG_MS),
    });
    return { status: res.status, text: await res.text() };
  } catch (err) {
    return { status: 0, text: `no answer: ${err instanceof Error ? err.message : String(err)}` };
  }
}

/**
 * What is wrong with a reply to bad input, if anything. `refuse`: the input is one the route must
 * refuse (a wrong type, not an object); otherwise it may also be accepted (a 2xx), as an empty list
 * or -1 can be, but an error must still be a 4xx refusal in the envelope.
 */
function problem(r: Reply, refuse: boolean): string | undefined {
  if (r.status === 0) return "no answer (crash or hang)";
  if (r.status >= 500) return `answered ${r.status}`;
  if (r.status < 400) return refuse ? `accepted with ${r.status}` : undefined;
  if (!REFUSALS.has(r.status)) return `refused with ${r.status}`;
  const refusal = refusalError(r.status, r.text);
  if ("wrong" in refusal) return refusal.wrong;
  const { error } = refusal;
  if (typeof error.type !== "string" || error.code !== String(r.status)) return `refused with ${r.status} but not in the error envelope`;
  return undefined;
}

/** One route's checks: every reply is judged, the problems collected. */
class Probe {
  readonly problems: string[] = [];
  constructor(
    readonly method: string,
    readonly path: string,
  ) {}

  async call(input: string, refuse: boolean, opts: { path?: string; body?: string | Uint8Array<ArrayBuffer> } = {}): Promise<Reply> {
    const path = opts.path ?? this.path;
    const r = await send(this.method, path, opts.body);
    const wrong = problem(r, refuse);
    if (wrong) this.problems.push(`${this.method} ${path.length > 120 ? `${path.slice(0, 120)}…` : path} ← ${input}: ${wrong}: ${snippet(r.text)}`);
    return r;
  }
}

// ---------------------------------------------------------------------------------------------
// Values

const LONG = "x".repeat(100_000);
/** Deeply nested JSON, as text. */
const DEEP = `${'{"a":'.repeat(3000)}1${"}".repeat(3000)}`;

interface Bad {
  /** JSON text of the value. */
  json: string;
  label: string;
  /** A value of the wrong type: the route must refuse it. */
  refuse: boolean;
}
const wrong = (json: string, label = json): Bad => ({ json, label, refuse: true });
const awkward = (json: string, label = json): Bad => ({ json, label, refuse: false });

const STRING_EDGES = [
  awkward('""'),
  awkward('"a\\u0000b"', "a string with NUL"),
  awkward('"\\ud800"', "a lone surrogate"),
  awkward(JSON.stringify(LONG), "a 100k-character string"),
  awkward('"2024-13-45"'),
  // A duration whose end is no date (a 500 on every duration field once).
  awkward('"100000000d"', "a duration of 100,000,000 days"),
];
const NUMBER_EDGES = [awkward("-1"), awkward("1.5"), awkward("1e20"), awkward("9007199254740993"), awkward("5e-324")];

type Kind = "str" | "num" | "bool" | "obj" | "enum" | "any";

interface Field {
  path: string[];
  kind: Kind;
  /** An array of `kind`. */
  list: boolean;
  choices?: string[];
}

function badValues(f: Field): Bad[] {
  if (f.list) {
    const items: Bad[] = f.kind === "str" ? STRING_EDGES : f.kind === "num" ? NUMBER_EDGES : [];
    return [
      wrong('"x"'),
      wrong("{}"),
      ...(f.kind === "any" ? [] : [wrong(f.kind === "str" || f.kind === "enum" ? "[1]" : '["x"]')]),
      awkward("null"),
      awkward("[]"),
      awkward(`[${Array.from({ length: 5000 }, (_, i) => `"x${i}"`).join(",")}]`, "an array of 5000 strings"),
      ...items.map((b) => awkward(`[${b.json}]`, `[${b.label}]`)),
    ];
  }
  switch (f.kind) {
    case "str":
      return [wrong("12345"), wrong('["x"]'), awkward("null"), ...STRING_EDGES];
    case "num":
      return [wrong('"1"'), wrong("{}"), wrong("1e309"), awkward("null"), ...NUMBER_EDGES];
    case "bool":
      return [wrong('"true"'), wrong("1"), awkward("null")];
    case "obj":
      return [
        wrong("[]"),
        wrong('"x"'),
        awkward("null"),
        awkward("{}"),
        awkward('{"a\\u0000":"b\\u0000"}', "an object with NUL in a key and a value"),
        awkward(`{"k":${JSON.stringify(LONG)}}`, "an object with a 100k-character value"),
        awkward(DEEP, "an object nested 3000 deep"),
        awkward('{"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}', "__proto__ and constructor"),
      ];
    case "enum":
      return [wrong('"not-a-choice"'), wrong("1"), awkward("null")];
    case "any":
      return [awkward("12345"), awkward("{}"), awkward("[]"), awkward("true"), awkward("null"), awkward("-1"), awkward("1e20"), awkward("1e309"), ...STRING_EDGES];
  }
}

/** Bodies that are not a JSON object. */
const NOT_OBJECTS: { body: string | Uint8Array<ArrayBuffer>; label: string; refuse: boolean }[] = [
  { body: "{", label: "{ (not JSON)", refuse: true },
  { body: '{"a":', label: "truncated JSON", refuse: true },
  { body: "[]", label: "a JSON array", refuse: true },
  { body: "[{}]", label: "an array of an object", refuse: true },
  { body: '"x"', label: "a JSON string", refuse: true },
  { body: "null", label: "null", refuse: true },
  { body: "42", label: "a number", refuse: true },
  { body: "1e309", label: "1e309", refuse: true },
  { body: "true", label: "true", refuse: true },
  { body: "\u0000", label: "a NUL byte", refuse: true },
  { body: "\ufeff{}", label: "{} after a byte order mark", refuse: false },
  { body: new Uint8Array([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d]), label: "an object whose key is invalid UTF-8", refuse: true },
  { body: new Uint8Array([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0x63, 0x61, 0x66, 0xe9, 0x22, 0x7d]), label: "a Latin-1 string value", refuse: true },
];

// ---------------------------------------------------------------------------------------------
// Bodies

/** The objects the injected bodies point at, so a bad value in one field reaches past the lookups of the others. */
interface World {
  user: string;
  team: string;
  org: string;
  budget: string;
  modelId: string;
  group: string;
  groupId: string;
}
let world: World;

/** A fresh key per route: a route may rotate or change the one it is given. */
async function freshKey(): Promise<string> {
  const r = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { user_id: world.user } });
  expect(r.status).toBe(200);
  return r.body.key;
}

/** The value a required field gets: an existing object where the name says which, else a plain value of its type. */
function placeholder(route: string, f: Field, key: string | undefined, existing: boolean): unknown {
  const name = f.path.filter((s) => !/^\d+$/.test(s)).at(-1)!;
  const creates = /\/(new|generate)$/.test(route);
  const refs: Record<string, string> = {
    key: key ?? "sk-not-a-key",
    team_id: world.team,
    team_ids: world.team,
    user_id: world.user,
    user_ids: world.user,
    organization_id: world.org,
    organization_ids: world.org,
    budget_id: world.budget,
    budgets: world.budget,
    id: route.startsWith("POST /model/") ? world.modelId : world.budget,
    access_group: world.group,
    model_names: "chat",
    models: "chat",
    model: "mock/chat",
  };
  let value: unknown;
  if (name === "model" || name === "model_names" || name === "models") value = refs[name];
  else if (existing && !creates && refs[name] !== undefined) value = refs[name];
  else if (f.kind === "num") value = 1;
  else if (f.kind === "bool") value = false;
  else if (f.kind === "obj") value = {};
  else if (f.kind === "enum") value = f.choices?.[0] ?? "x";
  else value = `bad-input-${Math.random().toString(36).slice(2, 10)}`;
  return f.list ? [value] : value;
}

/** The body of a route's required fields. */
function baseBody(route: string, required: Field[], key: string | undefined, existing: boolean): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const f of [...required].sort((a, b) => a.path.length - b.path.length)) {
    setAt(body, f.path, placeholder(route, f, key, existing));
  }
  return body;
}

/** The field and type a 422 names, from its `param` and the message after it. */
function fieldOf(param: string, message: string): { field: Field } | { required: string[] } | { unexpected: string[] } | undefined {
  const path = param.split(".");
  const said = message.slice(message.indexOf(`${param}: `) + param.length + 2);
  if (said.startsWith("Expected required property")) return { required: path };
  if (said.startsWith("Unexpected property")) return { unexpected: path };
  const list = /^\d+$/.test(path.at(-1) ?? "");
  const fieldPath = list ? path.slice(0, -1) : path;
  const choices = /^Expected one of (.*)$/.exec(said);
  if (choices) return { field: { path: fieldPath, list, kind: "enum", choices: [...choices[1]!.matchAll(/"([^"]*)"/g)].map((m) => m[1]!) } };
  const kind: Kind | undefined = /^Expected (string)/.test(said)
    ? "str"
    : /^Expected (number|integer)/.test(said)
      ? "num"
      : /^Expected boolean/.test(said)
        ? "bool"
        : /^Expected object/.test(said)
          ? "obj"
          : /^Expected union value|^Expected "/.test(said)
            ? "any"
            : undefined;
  return kind ? { field: { path: fieldPath, list, kind } } : undefined;
}

/** A key no schema names: a field of an object that is a record (any key, typed values) is found under it. */
const ANY_KEY = "bad-input-any-key";

const pathKey = (path: string[]) => path.join(".");

interface Shape {
  fields: Field[];
  /** Paths of the fields that must be present where their parent is. */
  required: Set<string>;
}

/**
 * The fields a route knows, found by sending every candidate field with a wrong-typed value
 * (`[true]`) and noting the one the 422 names, until it names none; a field once named is left
 * out of the next bodies, so a required one is then named as missing. One level down next: an
 * object field is probed under a key no schema names (a record of typed values names it), else
 * with the candidate names.
 */
async function discover(p: Probe, route: string): Promise<Shape> {
  const known = new Map<string, Field>();
  const required = new Set<string>();
  const dropped = new Set<string>();
  const candidates: string[][] = BODY_FIELDS.map((n) => [n]);
  /** Object fields found at this level: their record probe goes out with the next level. */
  let objects: string[][] = [];
  /** Object fields whose record probe was not named: their members are probed by name. */
  let unopened = new Map<string, string[]>();
  for (let round = 0; round < 2000; round++) {
    const open = candidates.filter((c) => !known.has(pathKey(c)) && !dropped.has(pathKey(c)));
    // Every required field known so far, nested ones too: the probes at a level go inside their objects.
    const body = baseBody(
      route,
      [...known.values()].filter((f) => required.has(pathKey(f.path))),
      undefined,
      false,
    );
    for (const c of open) setAt(body, c, [true]);
    let found: ReturnType<typeof fieldOf> | "none" = "none";
    let param = "";
    if (open.length > 0) {
      // Unknown fields may be accepted: a route that allows extra fields answers 2xx once it names no more.
      const r = await p.call(`wrong types in ${open.length} fields (${open.slice(0, 3).map(pathKey).join(", ")}…)`, false, { body: JSON.stringify(body) });
      if (r.status === 422) {
        const error = (JSON.parse(r.text) as { error: { param?: string | null; message: string } }).error;
        param = error.param ?? "";
        found = param ? fieldOf(param, error.message) : "none";
      }
    }
    if (found === "none") {
      // Nothing more named at this level: the next one.
      if (unopened.size > 0) {
        for (const prefix of unopened.values()) candidates.push(...BODY_FIELDS.map((n) => [...prefix, n]));
        unopened = new Map();
        continue;
      }
      if (objects.length === 0) break;
      for (const prefix of objects) {
        unopened.set(pathKey(prefix), prefix);
        candidates.push([...prefix, ANY_KEY]);
      }
      objects = [];
      continue;
    }
    if (!found) {
      // Refused for another reason (a pattern, a bound): not probed further.
      if (!open.some((c) => pathKey(c) === param)) break;
      dropped.add(param);
      continue;
    }
    if ("required" in found) {
      const path = found.required;
      if (required.has(pathKey(path))) break;
      required.add(pathKey(path));
      if (!candidates.some((c) => pathKey(c) === pathKey(path))) candidates.push(path);
      continue;
    }
    if ("unexpected" in found) {
      dropped.add(pathKey(found.unexpected));
      continue;
    }
    const f = found.field;
    if (known.has(pathKey(f.path))) {
      dropped.add(param);
      continue;
    }
    known.set(pathKey(f.path), f);
    const at = f.path.indexOf(ANY_KEY);
    if (at > 0) unopened.delete(pathKey(f.path.slice(0, at)));
    if (f.kind === "obj" && f.path.length < 4) objects.push(f.list ? [...f.path, "0"] : f.path);
  }
  // A required field whose type was never learned (no probe reached it) is a string.
  for (const r of required) if (!known.has(r)) known.set(r, { path: r.split("."), kind: "str", list: false });
  return { fields: [...known.values()], required };
}

/**
 * The required fields that are present in a body with `target` set: those whose every enclosing
 * field is required too, or encloses `target` (a field required in an optional object is needed
 * only when that object is sent).
 */
function requiredBody(route: string, shape: Shape, key: string | undefined, existing: boolean, target: string[] = []): Record<string, unknown> {
  const present = (f: Field) =>
    f.path.every((_, i) => {
      const enclosing = f.path.slice(0, i);
      if (i === 0 || /^\d+$/.test(f.path[i - 1]!)) return true;
      return shape.required.has(pathKey(enclosing)) || pathKey(target).startsWith(`${pathKey(enclosing)}.`);
    });
  return baseBody(
    route,
    shape.fields.filter((f) => shape.required.has(pathKey(f.path)) && present(f)),
    key,
    existing,
  );
}

// ---------------------------------------------------------------------------------------------
// Paths and queries

const ODD_SEGMENTS = ["%00", "a%00b", "x".repeat(5000), "..%2F..%2Fetc%2Fpasswd", "%ZZ", "%E0%A4%A", "%F0%28%8C%28", "%20", "-1", "%2F", "null"];

/** The path with its parameters set to existing objects. */
function realPath(path: string, key: string | undefined): string {
  return path
    .replace(":key", encodeURIComponent(key ?? "sk-none"))
    .replace(":team_id", world.team)
    .replace(":model_id", world.modelId)
    .replace(":access_group_id", world.groupId)
    .replace(":access_group", world.group);
}

// Bun refuses a request head over 16 KB itself (431, no body): the long value stays under that with every parameter set.
const QUERY_VALUES = ["abc", "-5", "0", "1e9", "1.5", "2024-13-45", "%00", "a%00b", "%ZZ", "%F0%9F", "%ED%A0%80", "x".repeat(250), "true", "'%3B--"];

/**
 * Query strings of wrong values: every parameter set to the value at once, and each one the
 * route refuses (it names it) taken out and the rest sent again; where the answer is a 5xx the
 * parameters are sent one by one to name the culprit.
 */
async function queries(p: Probe, path: string): Promise<void> {
  await inParallel(QUERY_VALUES, async (value) => {
    let names = [...QUERY_NAMES];
    for (let round = 0; round < QUERY_NAMES.length + 1 && names.length > 0; round++) {
      const qs = names.map((n) => `${n}=${value}`).join("&");
      const r = await send(p.method, `${path}?${qs}`);
      if (r.status >= 500 || r.status === 0) {
        for (const n of names) await p.call(`query ${n}=${snippet(value, 40)}`, false, { path: `${path}?${n}=${value}` });
        return;
      }
      const wrongReply = problem(r, false);
      if (wrongReply) p.problems.push(`${p.method} ${path}?(${names.length} parameters)=${snippet(value, 40)}: ${wrongReply}: ${snippet(r.text)}`);
      if (r.status < 400 || wrongReply) return;
      const param = (JSON.parse(r.text) as { error: { param?: string | null } }).error.param;
      if (!param || !names.includes(param)) return;
      names = names.filter((n) => n !== param);
    }
  });
}

// ---------------------------------------------------------------------------------------------

beforeAll(async () => {
  gw = await startBackendGateway("pglite", CONFIG);
  const ok = async <T = Record<string, unknown>>(method: string, path: string, body: unknown) => {
    const r = await requestJson<T>(gw, method, path, { body });
    expect(r.status, `${path}: ${r.text}`).toBe(200);
    return r.body;
  };
  await ok("POST", "/user/new", { user_id: "bi-user" });
  const org = await ok<{ organization_id: string }>("POST", "/organization/new", { organization_alias: "bi-org" });
  await ok("POST", "/organization/member_add", { organization_id: org.organization_id, member: { role: "internal_user", user_id: "bi-user" } });
  await ok("POST", "/budget/new", { budget_id: "bi-budget", max_budget: 10 });
  await ok("POST", "/team/new", { team_id: "bi-team", members_with_roles: [{ role: "admin", user_id: "bi-user" }] });
  const model = await ok<{ model_id: string }>("POST", "/model/new", { model_name: "bi-model", svc_params: { model: "mock/bi-model" } });
  const group = await ok<{ access_group_id: string }>("POST", "/access_group/new", { access_group: "bi-group", model_names: ["chat"] });
  world = { user: "bi-user", team: "bi-team", org: org.organization_id, budget: "bi-budget", modelId: model.model_id, group: "bi-group", groupId: group.access_group_id };
}, 60_000);
afterAll(async () => {
  await gw?.stop();
});

describe("bad input to the management API: a 4xx in the error envelope, never a 5xx", () => {
  test("the route list is the one the gateway serves", () => {
    expect(ROUTES.length).toBeGreaterThan(50);
    expect(BODY_FIELDS.length).toBeGreaterThan(100);
    expect(QUERY_NAMES).toEqual(expect.arrayContaining(["page", "page_size", "start_date", "limit", "team_id"]));
  });

  for (const { method, path } of ROUTES) {
    const route = `${method} ${path}`;
    test(route, async () => {
      const key = path.includes(":key") || path.startsWith("/key/") ? await freshKey() : undefined;
      const real = realPath(path, key);
      const p = new Probe(method, real);
      const hasBody = method !== "GET";

      if (hasBody) {
        // A route that reads its body must refuse one that is not an object; one that reads none may ignore it.
        const readsBody = (await send(method, real, "{")).status >= 400;
        await inParallel(NOT_OBJECTS, (b) => p.call(b.label, readsBody && b.refuse, { body: b.body }));
        if (readsBody) {
          const shape = await discover(p, route);
          const cases = shape.fields.flatMap((f) => badValues(f).map((b) => ({ f, b })));
          // A model write waits for the registry to serve it; two accepted at once on one model race (one sees the other's name).
          const parallel = path.startsWith("/model/") ? 1 : PARALLEL;
          await inParallel(
            cases,
            ({ f, b }) => p.call(`${f.path.join(".")} = ${b.label}`, b.refuse, { body: withBad(requiredBody(route, shape, key, true, f.path), f.path, b.json) }),
            parallel,
          );
        }
      } else {
        await queries(p, real);
      }

      // Odd path parameters, with no body and with a body that is not JSON.
      if (path.includes(":")) {
        const odd = ODD_SEGMENTS.map((seg) => path.replace(/:(\w+)/g, seg));
        await inParallel(odd, async (at) => {
          await p.call(`path ${snippet(at, 60)}`, false, { path: at });
          if (hasBody) await p.call(`path ${snippet(at, 60)} with body {`, false, { path: at, body: "{" });
        });
      }

      expect(p.problems).toEqual([]);
    }, 60_000);
  }

  test("afterwards the store still works: a new key makes a call and is found", async () => {
    const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["chat"] } });
    expect(made.status).toBe(200);
    const call = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${made.body.key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "chat", messages: [{ role: "user", content: "hi" }] }),
    });
    expect(call.status).toBe(200);
    expect(((await call.json()) as { choices: unknown[] }).choices.length).toBeGreaterThan(0);
    const info = await requestJson<{ key: string }>(gw, "GET", `/key/info?key=${encodeURIComponent(made.body.key)}`);
    expect(info.status).toBe(200);
    expect(info.body.key).toBe(new Bun.CryptoHasher("sha256").update(made.body.key).digest("hex"));
    // The objects the bad input was aimed at are still there.
    for (const path of [`/team/info?team_id=${world.team}`, `/user/info?user_id=${world.user}`, `/organization/info?organization_id=${world.org}`]) {
      expect((await requestJson(gw, "GET", path)).status).toBe(200);
    }
  });
});
