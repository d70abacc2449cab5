// Round trips of management objects through the API, seeded random (ROUNDTRIP_SEED=<n> runs another
// set; every failure names the seed), on both stores. Keys, teams, users, organizations and budget
// objects are created with random valid values for every field their routes accept, read back with
// info (and keys with /key/list?return_full_object=true), then updated twice with random subsets of
// fields: info must answer what was sent, an update must change exactly what it names (plus the
// derived fields listed per group) and keep the rest, money must come back exact, the audit_log
// table must hold one row per write with the values before and after, and a key's plaintext must
// appear in /key/generate's (or /user/new's) answer only.
//
// The normalizations the code documents, and that the expectations below apply:
// - `null` clears: a nullable column becomes null, a NOT NULL one its empty value ([] / {} / false /
//   0 / key_type "default") (key-fields.ts `keyFieldsOf`, fields.ts `clearNulls`, organizations.ts
//   `withEmptyDefaults`).
// - Money is numeric(30,12), answered as a JSON number: a value with at most 12 decimals comes back
//   exactly (the generator sends no more); timestamps come back as ISO 8601 in UTC.
// - Durations are kept as sent; `duration: -1` is kept as the text "-1". They derive `expires`,
//   `budget_reset_at` and `key_rotation_at` as now + duration (checked against the call's window).
// - A key's `project_id` has no column: it lives in `metadata.project_id`, over the metadata sent
//   in the same body (else the stored one); `null` removes it.
// - A team's `team_member_*` fields live in `member_settings` (top-level fields win over a
//   `member_settings` object, which is merged over the stored one; `null` drops an entry) and are
//   answered both there and at the top level.
// - An organization's limit fields are mirrored into its budget object (created with it when no
//   budget_id is given). Audit rows are read here through `toApi`, which leaves the API's form as
//   it is (every route's rows are stored in that form; a test below checks orgs and budgets).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { and, asc, eq } from "drizzle-orm";
import { TEAM_MEMBER_PERMISSION_CHOICES } from "../../core/authz.ts";
import { toApi } from "../../core/identity/serialize.ts";
import { auditLog } from "../../core/store/schema.ts";
import { BACKENDS, MASTER_KEY, requestJson, requestOk, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { queryString, Random } from "../harness/random.ts";

const SEED = Number(process.env.ROUNDTRIP_SEED ?? 7_130_221);
const CONFIG = { model_list: [{ model_name: "alpha-model", svc_params: { model: "mock/alpha" } }], general_settings: { master_key: MASTER_KEY } };
/** Objects per kind, and updates per object. */
const OBJECTS = 16;
const UPDATES = 3;

type Json = Record<string, unknown>;
type Db = NonNullable<TestGateway["host"]>["store"]["db"];

// ---- random valid values

const TEXTS = ['q "quoted" \\ back', "it's", "客户-ü-😀", "<b>&amp;</b>", "tab\there", "line\nbreak", "undefined", "null", " spaced ", "Ångström ß", "x".repeat(220), "%_like"];
const MONEY = [0, 0.000001, 12345.678901, 1, 0.1, 0.3, 99.99, 1e15, 123456789.123456, 7.000000000001, 0.000000000001, 42];
const PERIODS = ["30s", "15m", "24h", "7d", "2w", "1mo", "1y", " 3d", "1 h"];
const MODELS = ["alpha-model", "gpt-4o", "claude-ü", "openai/*", 'm "q"'];
const WORDS = ["a", "ü-😀", 'q"', "it's", "x y", "/chat/completions", "pii-mask", "b\\c"];
const COUNTS = [0, 1, 60, 1000, 2_147_483_647, Number.MAX_SAFE_INTEGER];
const PARALLEL = [0, 1, 8, 2_147_483_647];
/** Metadata keys (none secret-looking: audit rows redact those, see core/secrets.ts). */
const META_KEYS = ["team", "ü-ключ", 'q"k', "😀", "nested", "list", "n", "empty", "null"];

let serial = 0;
const uniq = () => `${++serial}`;

function leaf(rng: Random): unknown {
  return rng.pick([rng.pick(TEXTS), rng.pick(MONEY), -rng.pick(MONEY) + 0, true, false, null, rng.int(1000), 1e-7, 0.30000000000000004, ""]);
}

function jsonObject(rng: Random, depth = 0): Json {
  const out: Json = {};
  for (const k of rng.some(META_KEYS, 4)) {
    const r = rng.int(5);
    out[k] = depth < 2 && r === 0 ? jsonObject(rng, depth + 1) : r === 1 ? Array.from({ length: rng.int(4) }, () => leaf(rng)) : r === 2 ? {} : leaf(rng);
  }
  return out;
}

const words = (rng: Random, pool: readonly string[] = WORDS) => (rng.chance(0.15) ? [] : rng.some(pool, 4));
const intMap = (rng: Random) => Object.fromEntries(rng.some(MODELS, 3).map((m) => [m, rng.pick(COUNTS)]));
const isoLater = (rng: Random) => rng.pick(["2031-05-06T07:08:09+02:00", "2030-01-01T00:00:00.000Z", "2029-12-31T23:59:59.999Z", "2032-02-29T12:00:00-05:30"]);

// ---- field groups: what a body may set, what info answers for it, what else it moves

/** A time the call derived from a duration: now + duration, within the call's window. */
interface TimeWindow {
  t0: number;
  t1: number;
}

interface Group {
  name: string;
  /** A body fragment of random valid values. */
  gen(rng: Random, w: World): Json;
  /** What info answers for the fragment (default: the fragment itself); `body` is the whole body, `before` the object before the write. */
  view?(body: Json, before: Json): Json;
  /** Derived fields this write moves (checked by `derived` when it can tell). */
  moves?: readonly string[];
  /** `before`: the object as it was, for an update. */
  derived?(body: Json, after: Json, at: TimeWindow, label: string, before?: Json): void;
}

/** One field: a value from `gen`, or (with chance 0.2) `null`, which info answers as `cleared`. */
function field(name: string, gen: (rng: Random, w: World) => unknown, cleared?: unknown, opts: Partial<Group> = {}): Group {
  return {
    name,
    gen: (rng, w) => ({ [name]: cleared !== undefined && rng.chance(0.2) ? null : gen(rng, w) }),
    view: (body) => ({ [name]: body[name] === null ? (cleared === "null" ? null : cleared) : body[name] }),
    ...opts,
  };
}
/** `cleared` marker for a nullable column (undefined would mean "never sent as null"). */
const NULL = "null";

function periodMs(text: string): number {
  const m = /^(\d+)\s*(s|m|h|d|w|mo|y)$/.exec(text.trim());
  if (!m) throw new Error(`not a period: ${text}`);
  const day = 86_400_000;
  const unit: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: day, w: 7 * day, mo: 30 * day, y: 365 * day };
  return Number(m[1]) * unit[m[2]!]!;
}

function expectWithin(value: unknown, period: string, at: TimeWindow, label: string): void {
  expect(typeof value, label).toBe("string");
  const t = Date.parse(value as string);
  const ms = periodMs(period);
  expect(t, label).toBeGreaterThanOrEqual(at.t0 + ms - 1);
  expect(t, label).toBeLessThanOrEqual(at.t1 + ms + 1);
}

/**
 * `budget_duration`: kept as sent; a new period sets `budget_reset_at` to now + period (unless the
 * body gives it); the one already stored, sent again, is no change.
 */
const budgetDuration = field("budget_duration", (rng) => rng.pick([...PERIODS, "-1"]), NULL, {
  moves: ["budget_reset_at"],
  derived(body, after, at, label, before) {
    if (typeof body.budget_duration !== "string" || "budget_reset_at" in body) return;
    if (before && before.budget_duration === body.budget_duration) {
      expect(after.budget_reset_at, `${label} budget_reset_at (the same duration sent again)`).toEqual(before.budget_reset_at);
      return;
    }
    if (body.budget_duration === "-1") expect(after.budget_reset_at, `${label} budget_reset_at`).toBeNull();
    else expectWithin(after.budget_reset_at, body.budget_duration, at, `${label} budget_reset_at`);
  },
});

const money = (name: string, nullable = true) => field(name, (rng) => rng.pick(MONEY), nullable ? NULL : undefined);
const count = (name: string) => field(name, (rng) => rng.pick(COUNTS), NULL);
const list = (name: string, pool?: readonly string[]) => field(name, (rng) => words(rng, pool), []);

/** The limit fields keys, teams, users and orgs share (fields.ts `LimitFields`); `model_max_budget` with `modelBudget` only (a user's or team's is refused). */
function limitGroups(modelBudget?: (rng: Random) => unknown): Group[] {
  return [
    money("max_budget"),
    money("soft_budget"),
    budgetDuration,
    ...(modelBudget ? [field("model_max_budget", (rng) => Object.fromEntries(rng.some(MODELS, 2).map((m) => [m, modelBudget(rng)])), NULL)] : []),
    count("tpm_limit"),
    count("rpm_limit"),
    field("max_parallel_requests", (rng) => rng.pick(PARALLEL), NULL),
    field("model_tpm_limit", intMap, NULL),
    field("model_rpm_limit", intMap, NULL),
  ];
}
const keyModelBudget = (rng: Random) => (rng.chance(0.5) ? { budget_limit: rng.pick(MONEY) } : { budget_limit: rng.pick(MONEY), time_period: rng.pick(PERIODS) });
const metadata = field("metadata", (rng) => jsonObject(rng), {});

// ---- the kinds

/** Objects other objects point at, made once per backend. */
interface World {
  /** Teams without models: a key may name any model there. */
  freeTeams: string[];
  orgs: string[];
  /** Budget objects keys, teams and users point at (orgs get their own: an org update writes through to its budget). */
  budgets: string[];
  orgBudgets: string[];
  /** Access group ids a key may name (they must exist). */
  accessGroups: string[];
  /** Plaintext keys answered by /key/generate and /user/new. */
  secrets: string[];
  /** Every management answer read, as text, for the secrets check. */
  answers: string[];
}

interface Created {
  id: string;
  /** The create call's answer, as the object info answers (or close to it). */
  reply: Json;
}

interface Kind {
  name: string;
  table: string;
  groups: Group[];
  /** Fields every body of a create carries (besides the random ones). */
  required?(rng: Random): Json;
  create(gw: TestGateway, body: Json, w: World, rng: Random): Promise<Created>;
  info(gw: TestGateway, id: string): Promise<Json>;
  update(gw: TestGateway, id: string, body: Json): Promise<void>;
  /** Fields that may change on any write. */
  always: readonly string[];
  /** Fields of the create reply not compared with info (with why). */
  replyOnly?: readonly string[];
}

const keyKind: Kind = {
  name: "key",
  table: "virtual_keys",
  groups: [
    field("key_alias", (rng) => `${rng.pick(TEXTS)}-${uniq()}`, NULL),
    field("user_id", (rng) => rng.pick(["ku-ann", 'ku "q"', "ku-ü-😀", "ku-null"]), NULL),
    field("team_id", (rng, w) => rng.pick(w.freeTeams), NULL, { moves: [] }),
    field("organization_id", (rng, w) => rng.pick(w.orgs), NULL),
    field("agent_id", (rng) => rng.pick(TEXTS), NULL),
    field("budget_id", (rng, w) => rng.pick(w.budgets), NULL, { moves: ["budget_reset_at"] }),
    list("models", MODELS),
    list("tags"),
    list("prompts"),
    list("enforced_params", ["user", "metadata.generation_name", "temperature"]),
    field("spend", (rng) => rng.pick(MONEY), 0),
    ...limitGroups(keyModelBudget),
    metadata,
    field("tpm_limit_type", (rng) => rng.pick(["best_effort_throughput", "dynamic"]), NULL),
    field("rpm_limit_type", (rng) => rng.pick(["best_effort_throughput", "dynamic"]), NULL),
    list("allowed_cache_controls", ["no-cache", "no-store"]),
    {
      name: "duration",
      gen: (rng) => ({ duration: rng.pick([...PERIODS, -1, "-1", null]) }),
      view: (body) => ({ duration: body.duration === null ? null : String(body.duration) }),
      moves: ["expires"],
      derived(body, after, at, label) {
        const d = body.duration;
        if (d === null || d === -1 || d === "-1") expect(after.expires, `${label} expires`).toBeNull();
        else expectWithin(after.expires, String(d), at, `${label} expires`);
      },
    },
    field("permissions", (rng) => jsonObject(rng), {}),
    field("send_invite_email", (rng) => rng.chance(0.5), false),
    list("guardrails"),
    list("policies"),
    field("disable_global_guardrails", (rng) => rng.chance(0.5), false),
    field("blocked", (rng) => rng.chance(0.5), false),
    field("aliases", (rng) => Object.fromEntries(rng.some(WORDS, 3).map((w) => [w, rng.pick(MODELS)])), {}),
    field("config", (rng) => jsonObject(rng), {}),
    {
      // temp_budget_increase needs temp_budget_expiry: both, or both cleared.
      name: "temp_budget",
      gen: (rng) => (rng.chance(0.2) ? { temp_budget_increase: null, temp_budget_expiry: null } : { temp_budget_increase: rng.pick(MONEY), temp_budget_expiry: isoLater(rng) }),
      view: (body) => ({
        temp_budget_increase: body.temp_budget_increase,
        temp_budget_expiry: body.temp_budget_expiry === null ? null : new Date(body.temp_budget_expiry as string).toISOString(),
      }),
    },
    list("allowed_routes", ["/chat/completions", "/v1/embeddings", "/key/info"]),
    list("allowed_passthrough_routes", ["/anthropic/v1/messages", "/gemini/*"]),
    field("object_permission", (rng) => ({ vector_stores: words(rng), agents: words(rng), ...(rng.chance(0.3) ? { agent_access_groups: words(rng) } : {}) }), NULL),
    {
      // auto_rotate needs rotation_interval (a period either way).
      name: "rotation",
      gen: (rng) => ({ auto_rotate: rng.chance(0.5), rotation_interval: rng.pick(["30d", "90d", "12h", "1mo"]) }),
      moves: ["key_rotation_at"],
      derived(body, after, at, label) {
        if (body.auto_rotate === true) expectWithin(after.key_rotation_at, body.rotation_interval as string, at, `${label} key_rotation_at`);
        else expect(after.key_rotation_at, `${label} key_rotation_at`).toBeNull();
      },
    },
    field(
      "allowed_vector_store_indexes",
      (rng) => rng.some(["idx-a", "idx-ü", 'idx "q"'], 2).map((index_name) => ({ index_name, index_permissions: rng.some(["read", "write"], 2) })),
      NULL,
    ),
    field("router_settings", (rng) => jsonObject(rng), NULL),
    field("access_group_ids", (rng, w) => rng.some(w.accessGroups, 2), []),
    field("key_type", (rng) => rng.pick(["default", "llm_api", "management", "read_only"]), "default"),
    {
      // After metadata: it lands in the metadata sent in the same body, else the stored one.
      name: "project_id",
      gen: (rng) => ({ project_id: rng.chance(0.2) ? null : `proj-${rng.pick(TEXTS)}` }),
      view(body, before) {
        const base = { ...(("metadata" in body ? (body.metadata ?? {}) : (before.metadata ?? {})) as Json) };
        if (body.project_id === null) delete base.project_id;
        else base.project_id = body.project_id;
        return { metadata: base };
      },
    },
  ],
  async create(gw, body, w) {
    const r = await requestOk<Json & { key: string; token: string }>(gw, "POST", "/key/generate", body);
    expect(r.key.startsWith("sk-"), `seed ${SEED}`).toBe(true);
    expect(r.token, `seed ${SEED}`).not.toBe(r.key);
    w.secrets.push(r.key);
    const { key: _plain, token_id: _id, ...reply } = r;
    return { id: r.token, reply };
  },
  async info(gw, id) {
    const r = await requestOk<{ key: string; info: Json }>(gw, "GET", `/key/info?${queryString({ key: id })}`);
    expect(r.key).toBe(id);
    return r.info;
  },
  async update(gw, id, body) {
    await requestOk(gw, "POST", "/key/update", { ...body, key: id });
  },
  always: ["updated_at"],
  // The generate answer echoes `duration` as asked (-1 as a number); info has the stored text.
  replyOnly: ["duration"],
};

const MEMBER_SETTINGS = ["team_member_budget", "team_member_budget_duration", "team_member_rpm_limit", "team_member_tpm_limit", "team_member_key_duration"] as const;

function memberSetting(rng: Random, f: (typeof MEMBER_SETTINGS)[number]): unknown {
  // A period for members' team budgets is refused (never applied): only clearing it is taken.
  if (rng.chance(0.15) || f === "team_member_budget_duration") return null;
  if (f === "team_member_budget") return rng.pick(MONEY);
  if (f === "team_member_rpm_limit" || f === "team_member_tpm_limit") return rng.pick(COUNTS);
  return rng.pick(PERIODS);
}

const teamKind: Kind = {
  name: "team",
  table: "teams",
  groups: [
    field("team_alias", (rng) => rng.pick(TEXTS), NULL),
    field("organization_id", (rng, w) => rng.pick(w.orgs), NULL),
    field("budget_id", (rng, w) => rng.pick(w.budgets), NULL, { moves: ["budget_reset_at"] }),
    money("spend", false),
    ...limitGroups(),
    metadata,
    list("models", MODELS),
    field("blocked", (rng) => rng.chance(0.5)),
    field("model_aliases", (rng) => Object.fromEntries(rng.some(WORDS, 3).map((w) => [w, rng.chance(0.7) ? rng.pick(MODELS) : { model: rng.pick(MODELS), hidden: true }])), {}),
    list("tags"),
    list("guardrails"),
    list("policies"),
    list("prompts"),
    list("allowed_passthrough_routes", ["/anthropic/v1/messages", "/gemini/*"]),
    list("team_member_permissions", TEAM_MEMBER_PERMISSION_CHOICES),
    field("object_permission", (rng) => ({ vector_stores: words(rng), mcp_servers: words(rng) }), NULL),
    field("router_settings", (rng) => jsonObject(rng), NULL),
    field("allowed_vector_store_indexes", (rng) => [{ index_name: rng.pick(WORDS), index_permissions: ["read"] }], NULL),
    {
      // teams.ts `memberSettings`: the object merges over the stored one, top-level fields win, null drops.
      name: "member_settings",
      gen(rng) {
        const body: Json = {};
        if (rng.chance(0.5)) {
          body.member_settings = rng.chance(0.15) ? null : Object.fromEntries(rng.some(MEMBER_SETTINGS, 3).map((f) => [f, memberSetting(rng, f)]));
        }
        for (const f of rng.some(MEMBER_SETTINGS, 3)) if (!body.member_settings || rng.chance(0.5)) body[f] = memberSetting(rng, f);
        return body;
      },
      view(body, before) {
        const out: Json = { ...((before.member_settings as Json | undefined) ?? {}) };
        if (body.member_settings === null) for (const k of Object.keys(out)) delete out[k];
        else if (body.member_settings) Object.assign(out, body.member_settings);
        for (const f of MEMBER_SETTINGS) if (f in body) out[f] = body[f];
        for (const [k, v] of Object.entries(out)) if (v === null) delete out[k];
        return { member_settings: out, ...Object.fromEntries(MEMBER_SETTINGS.map((f) => [f, out[f] ?? null])) };
      },
    },
  ],
  async create(gw, body) {
    const r = await requestOk<Json & { team_id: string }>(gw, "POST", "/team/new", body);
    return { id: r.team_id, reply: r };
  },
  async info(gw, id) {
    return (await requestOk<{ team_info: Json }>(gw, "GET", `/team/info?${queryString({ team_id: id })}`)).team_info;
  },
  async update(gw, id, body) {
    const r = await requestOk<{ team_id: string; data: Json }>(gw, "POST", "/team/update", { ...body, team_id: id });
    expect(r.team_id).toBe(id);
  },
  always: ["updated_at"],
};

const userKind: Kind = {
  name: "user",
  table: "users",
  groups: [
    field("user_email", (rng) => `${rng.pick(["ann", 'q"u', "ü😀", "o'neil", "%_x"])}+${uniq()}@example.org`, NULL),
    field("user_alias", (rng) => rng.pick(TEXTS), NULL),
    field("user_role", (rng) => rng.pick(["proxy_admin", "proxy_admin_viewer", "internal_user", "internal_user_viewer"])),
    field("organization_id", (rng, w) => rng.pick(w.orgs), NULL),
    money("spend", false),
    ...limitGroups(),
    metadata,
    list("models", MODELS),
  ],
  async create(gw, body, w, rng) {
    const id = `u-${rng.pick(TEXTS)}-${uniq()}`;
    const autoKey = rng.chance(0.5);
    const r = await requestOk<Json & { key: string | null }>(gw, "POST", "/user/new", { ...body, user_id: id, auto_create_key: autoKey });
    if (autoKey) {
      expect(typeof r.key, `seed ${SEED}: /user/new with a key`).toBe("string");
      w.secrets.push(r.key!);
    }
    const { key: _k, token: _t, key_name: _n, expires: _e, token_id: _i, ...reply } = r;
    return { id, reply };
  },
  async info(gw, id) {
    return (await requestOk<{ user_info: Json }>(gw, "GET", `/user/info?${queryString({ user_id: id })}`)).user_info;
  },
  async update(gw, id, body) {
    const r = await requestOk<{ user_id: string }>(gw, "POST", "/user/update", { ...body, user_id: id });
    expect(r.user_id).toBe(id);
  },
  always: ["updated_at"],
};

const orgKind: Kind = {
  name: "organization",
  table: "organizations",
  groups: [
    field("organization_alias", (rng) => `${rng.pick(TEXTS)}`),
    list("models", MODELS),
    // On create, a null budget_id means none given: the org gets a budget of its own (a new id).
    field("budget_id", (rng, w) => rng.pick(w.orgBudgets), NULL, {
      moves: ["budget_reset_at", "budget"],
      view: (body, before) => (body.budget_id === null && !("budget_id" in before) ? {} : { budget_id: body.budget_id }),
    }),
    ...limitGroups((rng) => ({ max_budget: rng.pick(MONEY), budget_duration: rng.pick(PERIODS) })),
    metadata,
    list("tags"),
    field("model_aliases", (rng) => Object.fromEntries(rng.some(WORDS, 3).map((w) => [w, rng.pick(MODELS)])), {}),
    field("object_permission", (rng) => ({ vector_stores: words(rng) }), NULL),
    field("blocked", (rng) => rng.chance(0.5), false),
  ],
  required: (rng) => ({ organization_alias: `org ${rng.pick(TEXTS)}` }),
  async create(gw, body) {
    const r = await requestOk<Json & { organization_id: string }>(gw, "POST", "/organization/new", body);
    return { id: r.organization_id, reply: r };
  },
  async info(gw, id) {
    return requestOk<Json>(gw, "GET", `/organization/info?${queryString({ organization_id: id })}`);
  },
  async update(gw, id, body) {
    await requestOk(gw, "PATCH", "/organization/update", { ...body, organization_id: id });
  },
  // The org's limits are written through to its budget object (checked apart).
  always: ["updated_at", "budget"],
};

const budgetKind: Kind = {
  name: "budget",
  table: "budgets",
  groups: [
    ...limitGroups((rng) => ({ max_budget: rng.pick(MONEY), budget_duration: rng.pick(PERIODS), tpm_limit: rng.pick(COUNTS), rpm_limit: rng.pick(COUNTS) })),
    field("budget_reset_at", isoLater, NULL, { view: (body) => ({ budget_reset_at: body.budget_reset_at === null ? null : new Date(body.budget_reset_at as string).toISOString() }) }),
  ],
  async create(gw, body, _w, rng) {
    const id = `b-${rng.pick(TEXTS)}-${uniq()}`;
    const r = await requestOk<Json & { budget_id: string }>(gw, "POST", "/budget/new", { ...body, budget_id: id });
    expect(r.budget_id).toBe(id);
    return { id, reply: r };
  },
  async info(gw, id) {
    const r = await requestOk<Json[]>(gw, "POST", "/budget/info", { budgets: [id] });
    expect(r.length).toBe(1);
    return r[0]!;
  },
  async update(gw, id, body) {
    await requestOk(gw, "POST", "/budget/update", { ...body, budget_id: id });
  },
  always: ["updated_at"],
};

const KINDS = [keyKind, teamKind, userKind, orgKind, budgetKind];

// ---- the round trip

interface Audit {
  action: string;
  before: Json | null;
  after: Json | null;
}

/** The audit rows of an object, oldest first, in the API's field mapping. */
async function auditOf(db: Db, table: string, objectId: string): Promise<Audit[]> {
  const rows = await db
    .select()
    .from(auditLog)
    .where(and(eq(auditLog.tableName, table), eq(auditLog.objectId, objectId)))
    .orderBy(asc(auditLog.at));
  const view = (v: unknown) => (v && typeof v === "object" ? toApi(v as Json) : null);
  return rows.map((r) => ({ action: r.action, before: view(r.beforeValue), after: view(r.updatedValues) }));
}

/** A body of random groups (each with chance `p`, at least one), and each group's fragment. */
function bodyOf(kind: Kind, rng: Random, w: World, p: number): { body: Json; parts: [Group, Json][] } {
  let groups = kind.groups.filter(() => rng.chance(p));
  if (groups.length === 0) groups = [rng.pick(kind.groups)];
  const parts = groups.map((g): [Group, Json] => [g, g.gen(rng, w)]);
  return { body: Object.assign({}, ...parts.map(([, f]) => f)), parts };
}

/** What info must answer for the body's groups, given the object `before` the write ({} on create). */
function expectedOf(parts: readonly [Group, Json][], body: Json, before: Json): Json {
  return Object.assign({}, ...parts.map(([g, fragment]) => (g.view ? g.view(body, before) : fragment)));
}

/** Checks `info` holds `expected`; returns the differences as text (empty when none). */
function differences(info: Json, expected: Json): string[] {
  const out: string[] = [];
  for (const [f, v] of Object.entries(expected)) {
    if (!Bun.deepEquals(info[f], v, true)) out.push(`${f}: sent ${JSON.stringify(v)}, got ${JSON.stringify(info[f])}`);
  }
  return out;
}

async function roundTrip(gw: TestGateway, db: Db, kind: Kind, rng: Random, w: World, n: number): Promise<string[]> {
  const failures: string[] = [];
  const { body, parts } = bodyOf(kind, rng, w, 0.6);
  Object.assign(body, kind.required?.(rng) ?? {});
  const label = `seed ${SEED}: ${kind.name} #${n}`;
  const t0 = Date.now();
  const created = await kind.create(gw, body, w, rng);
  const at = { t0, t1: Date.now() };
  let info = await kind.info(gw, created.id);
  w.answers.push(JSON.stringify(created.reply), JSON.stringify(info));
  const expected = expectedOf(parts, body, {});
  for (const d of differences(info, expected)) failures.push(`${label} create ${JSON.stringify(body)}: info ${d}`);
  for (const d of differences(created.reply, Object.fromEntries(Object.entries(info).filter(([f]) => f in expected && !kind.replyOnly?.includes(f))))) {
    failures.push(`${label} create: the answer differs from info: ${d}`);
  }
  for (const [g] of parts) g.derived?.(body, info, at, `${label} create`);
  let audit = await auditOf(db, kind.table, created.id);
  const createdRow = audit.filter((a) => a.action === "created");
  if (createdRow.length !== 1) failures.push(`${label}: ${createdRow.length} "created" audit rows`);
  else for (const d of differences(createdRow[0]!.after ?? {}, Object.fromEntries(Object.keys(expected).map((f) => [f, info[f]])))) failures.push(`${label} created audit row: ${d}`);

  for (let u = 0; u < UPDATES; u++) {
    const { body: patch, parts: touched } = bodyOf(kind, rng, w, 0.25);
    const ulabel = `${label} update ${u} ${JSON.stringify(patch)}`;
    const t0u = Date.now();
    await kind.update(gw, created.id, patch);
    const atu = { t0: t0u, t1: Date.now() };
    const after = await kind.info(gw, created.id);
    w.answers.push(JSON.stringify(after));
    const want = expectedOf(touched, patch, info);
    for (const d of differences(after, want)) failures.push(`${ulabel}: ${d}`);
    for (const [g] of touched) g.derived?.(patch, after, atu, ulabel, info);
    // Everything else stays as it was.
    const free = new Set([...Object.keys(want), ...kind.always, ...touched.flatMap(([g]) => g.moves ?? [])]);
    const kept = Object.fromEntries(Object.entries(info).filter(([f]) => !free.has(f)));
    for (const d of differences(after, kept)) failures.push(`${ulabel}: changed a field it does not name: ${d.replace("sent", "was")}`);
    const appeared = Object.keys(after).filter((f) => !(f in info));
    if (appeared.length > 0) failures.push(`${ulabel}: fields appeared: ${appeared.join(", ")}`);
    // One audit row more, with the values before and after.
    const now = await auditOf(db, kind.table, created.id);
    if (now.length !== audit.length + 1) failures.push(`${ulabel}: ${now.length - audit.length} audit rows written (want 1)`);
    const row = now.at(-1);
    if (!row || !["updated", "blocked", "unblocked"].includes(row.action)) failures.push(`${ulabel}: last audit row is ${row?.action}`);
    else {
      const names = Object.keys(want);
      for (const d of differences(row.before ?? {}, Object.fromEntries(names.map((f) => [f, info[f]])))) failures.push(`${ulabel}: audit before_value ${d}`);
      for (const d of differences(row.after ?? {}, Object.fromEntries(names.map((f) => [f, after[f]])))) failures.push(`${ulabel}: audit updated_values ${d}`);
    }
    audit = now;
    info = after;
  }
  return failures;
}

async function seedWorld(gw: TestGateway): Promise<World> {
  const w: World = { freeTeams: [], orgs: [], budgets: [], orgBudgets: [], accessGroups: [], secrets: [], answers: [] };
  for (const name of ["ag-1", "ag-ü"]) w.accessGroups.push((await requestOk<{ access_group_id: string }>(gw, "POST", "/access_group/new", { access_group: name, model_names: ["alpha-model"] })).access_group_id);
  for (const id of ['rb "q"', "rb-ü-😀"]) w.budgets.push((await requestOk<{ budget_id: string }>(gw, "POST", "/budget/new", { budget_id: id, budget_duration: "30d", max_budget: 10 })).budget_id);
  for (const id of ["ob-1", "ob-ü"]) w.orgBudgets.push((await requestOk<{ budget_id: string }>(gw, "POST", "/budget/new", { budget_id: id })).budget_id);
  for (const alias of ['ref org "q"', "ref-org-ü"]) w.orgs.push((await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: alias })).organization_id);
  for (const id of ["free-team", "free-team-ü"]) w.freeTeams.push((await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_id: id })).team_id);
  return w;
}

for (const backend of BACKENDS) {
  describe(`management objects round-trip through the API, randomized (${backend}, seed ${SEED})`, () => {
    let gw: TestGateway;
    let db: Db;
    let w: World;
    const rng = new Random(SEED);

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_roundtrip" });
      db = gw.host!.store.db;
      w = await seedWorld(gw);
    }, 30_000);
    afterAll(async () => gw?.stop());

    for (const kind of KINDS) {
      test(`${kind.name}s: info answers what was sent, updates change exactly what they name, audit rows record it`, async () => {
        const failures: string[] = [];
        for (let n = 0; n < OBJECTS; n++) {
          const before = failures.length;
          failures.push(...(await roundTrip(gw, db, kind, rng, w, n)));
          if (failures.length > before + 20) break;
        }
        expect(failures, `seed ${SEED}`).toEqual([]);
      });
    }

    test("organizations created without budget_id keep their limits in step with their own budget", async () => {
      const failures: string[] = [];
      const limits = ["max_budget", "soft_budget", "tpm_limit", "rpm_limit", "max_parallel_requests", "budget_duration", "model_max_budget"];
      for (let n = 0; n < 4; n++) {
        const { body } = bodyOf(orgKind, rng, w, 0.6);
        delete body.budget_id;
        body.organization_alias = `mirror ${n}`;
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", body);
        for (let u = 0; u <= UPDATES; u++) {
          const info = await orgKind.info(gw, org.organization_id);
          const budget = (info.budget ?? {}) as Json;
          for (const f of limits) if (!Bun.deepEquals(info[f], budget[f], true)) failures.push(`seed ${SEED}: org ${n} after ${u} updates: ${f} ${JSON.stringify(info[f])}, its budget ${JSON.stringify(budget[f])}`);
          const { body: patch } = bodyOf(orgKind, rng, w, 0.3);
          delete patch.budget_id;
          await orgKind.update(gw, org.organization_id, patch);
        }
      }
      expect(failures).toEqual([]);
    });

    test("/key/list?return_full_object=true answers each key as /key/info does", async () => {
      const failures: string[] = [];
      const listed = await requestOk<{ keys: Json[]; total_count: number }>(gw, "GET", `/key/list?${queryString({ return_full_object: "true", size: 100 })}`);
      w.answers.push(JSON.stringify(listed));
      expect(listed.keys.length, `seed ${SEED}`).toBeGreaterThanOrEqual(OBJECTS);
      expect(listed.keys.length).toBe(listed.total_count);
      for (const k of listed.keys) {
        const info = await keyKind.info(gw, k.token as string);
        const one = await requestOk<{ keys: Json[] }>(gw, "GET", `/key/list?${queryString({ return_full_object: "true", key_hash: k.token as string })}`);
        w.answers.push(JSON.stringify(one));
        if (!Bun.deepEquals(k, info, true)) failures.push(`${k.token}: list ${JSON.stringify(k)} != info ${JSON.stringify(info)}`);
        if (one.keys.length !== 1 || !Bun.deepEquals(one.keys[0], info, true)) failures.push(`${k.token}: key_hash list ${JSON.stringify(one.keys)}`);
      }
      expect(failures, `seed ${SEED}`).toEqual([]);
    });

    test("a key's plaintext is answered by /key/generate or /user/new only: never by info, lists or audit rows", async () => {
      expect(w.secrets.length, `seed ${SEED}`).toBeGreaterThanOrEqual(OBJECTS);
      for (const path of ["/user/list?page_size=100", "/team/list", "/organization/list", "/budget/list", "/audit/logs?page_size=100"]) {
        w.answers.push(JSON.stringify(await requestOk(gw, "GET", path)));
      }
      const stored = JSON.stringify(await db.select().from(auditLog));
      const leaks = w.secrets.filter((s) => stored.includes(s) || w.answers.some((a) => a.includes(s)));
      expect(leaks, `seed ${SEED}`).toEqual([]);
    });

    test("money with more than 12 decimals is refused with a 400 naming the field (it was silently rounded)", async () => {
      // Amount (core/identity/fields.ts) takes any number up to 1e15; the column keeps 12 decimals.
      const sent = { max_budget: 0.1234567890123, soft_budget: 1e-13 };
      const r = await requestJson<Json>(gw, "POST", "/key/generate", { body: sent });
      if (r.status === 200) w.secrets.push(r.body.key as string);
      expect(r.status, `seed ${SEED}`).toBe(400);
      expect(r.text).toContain("max_budget has more than 12 decimals");
    });

    test("organization and budget audit rows are in the API's form, as keys', teams' and users' are (they were raw rows)", async () => {
      const [org] = await db.select().from(auditLog).where(and(eq(auditLog.tableName, "organizations"), eq(auditLog.action, "created"))).limit(1);
      const [budget] = await db.select().from(auditLog).where(and(eq(auditLog.tableName, "budgets"), eq(auditLog.action, "created"))).limit(1);
      const [team] = await db.select().from(auditLog).where(and(eq(auditLog.tableName, "teams"), eq(auditLog.action, "created"))).limit(1);
      expect(Object.keys(team!.updatedValues as Json)).toContain("team_id");
      expect(Object.keys(org!.updatedValues as Json)).toContain("organization_id");
      expect(Object.keys(budget!.updatedValues as Json)).toContain("budget_id");
    });
  });
}
