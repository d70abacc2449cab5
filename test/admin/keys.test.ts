// Virtual key management over HTTP, on the embedded store and on PostgreSQL: every /key endpoint's
// happy path and errors, who may do what (internal user, team admin on its own and another team,
// team `user` member with and without granted permissions, viewers), the audit trail (before/after,
// `svc-changed-by`, no plaintext anywhere) and the background rotation job.
// Users, teams and memberships are written straight to the store and announced on the change bus
// (as their own endpoints do), so these tests depend on nothing but the key endpoints.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash, randomUUID } from "node:crypto";
import { sql } from "drizzle-orm";
import { rotateDueKeys } from "../../core/identity/rotation.ts";
import type { Db } from "../../core/store/db.ts";
import { teamMembers, teams, users } from "../../core/store/schema.ts";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { sha256 } from "../harness/util.ts";

const CONFIG = {
  model_list: [
    { model_name: "chat-mock", svc_params: { model: "mock/chat" } },
    { model_name: "grouped-mock", svc_params: { model: "mock/grouped" }, model_info: { access_groups: ["beta"] } },
  ],
  general_settings: { master_key: MASTER_KEY },
};

const uid = (p: string) => `${p}-${randomUUID().slice(0, 8)}`;

/** A management response as the tests read it (fields are only read where the endpoint returns them). */
interface R {
  key: string;
  token: string;
  token_id: string;
  key_name: string;
  key_alias: string | null;
  user_id: string | null;
  team_id: string | null;
  models: string[];
  spend: number;
  max_budget: number | null;
  tpm_limit: number | null;
  rpm_limit: number | null;
  metadata: Record<string, unknown>;
  expires: string | null;
  budget_duration: string | null;
  duration: string | null;
  send_invite_email: boolean;
  budget_reset_at: string | null;
  auto_rotate: boolean;
  key_rotation_at: string | null;
  last_rotation_at: string | null;
  rotation_count: number;
  blocked: boolean;
  service_account_id: string | null;
  created_by: string | null;
  updated_by: string | null;
  deleted_at: string | null;
  info: R;
  keys: (string | R)[];
  user: R | null;
  total_count: number;
  current_page: number;
  total_pages: number;
  aliases: string[];
  deleted_keys: string[];
  total_requested: number;
  successful_updates: R[];
  failed_updates: { key_info: Record<string, unknown>; failed_reason: string }[];
  key_hash: string;
  previous_spend: number;
  logging_callbacks: { callbacks: string[]; status: string; details: string };
  audit_logs: { action: string; object_id: string; changed_by: string; before_value: Record<string, unknown> | null; updated_values: Record<string, unknown> | null }[];
  error: { message: string; type: string; param: string | null; code: string };
  router_settings: Record<string, unknown> | null;
}

for (const backend of BACKENDS) {
  describe(`virtual key management (${backend})`, () => {
    let gw: TestGateway;
    /** Every plaintext key issued by this suite, to check none is stored or echoed. */
    const issued: string[] = [];
    /** Management keys of each kind of caller. */
    const as: Record<"internal" | "other" | "tadmin" | "badmin" | "member" | "pmember" | "viewer" | "iviewer" | "padmin", string> = {
      internal: "",
      other: "",
      tadmin: "",
      badmin: "",
      member: "",
      pmember: "",
      viewer: "",
      iviewer: "",
      padmin: "",
    };

    async function api(path: string, opts: { body?: unknown; key?: string; method?: string; headers?: Record<string, string> } = {}): Promise<{ status: number; body: R }> {
      const res = await fetch(gw.url + path, {
        method: opts.method ?? (opts.body === undefined ? "GET" : "POST"),
        headers: { authorization: `Bearer ${opts.key ?? MASTER_KEY}`, "content-type": "application/json", ...opts.headers },
        body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      });
      return { status: res.status, body: (await res.json()) as R };
    }

    async function generate(body: Record<string, unknown> = {}, key = MASTER_KEY): Promise<R> {
      const res = await api("/key/generate", { body, key });
      if (res.status !== 200) throw new Error(`generate failed: ${res.status} ${JSON.stringify(res.body)}`);
      issued.push(res.body.key);
      return res.body;
    }

    const db = (): Db => gw.host!.store.db;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_keys" });
      await db()
        .insert(users)
        .values([
          { userId: "u-internal" },
          { userId: "u-other" },
          { userId: "u-tadmin" },
          { userId: "u-badmin" },
          { userId: "u-member" },
          { userId: "u-pmember" },
          { userId: "u-viewer", userRole: "proxy_admin_viewer" },
          { userId: "u-iviewer", userRole: "internal_user_viewer" },
          { userId: "u-padmin", userRole: "proxy_admin" },
        ]);
      await db()
        .insert(teams)
        .values([
          { teamId: "team-a", models: ["chat-mock", "openai/*"] },
          { teamId: "team-b" },
          { teamId: "team-p", teamMemberPermissions: ["/key/generate", "/key/update", "/key/info", "/key/list"] },
        ]);
      await db()
        .insert(teamMembers)
        .values([
          { teamId: "team-a", userId: "u-tadmin", role: "admin" },
          { teamId: "team-a", userId: "u-member", role: "user" },
          { teamId: "team-b", userId: "u-badmin", role: "admin" },
          { teamId: "team-p", userId: "u-pmember", role: "user" },
        ]);
      await gw.host!.services.bus!.publish({ kind: "all" });
      for (const [who, userId] of Object.entries({
        internal: "u-internal",
        other: "u-other",
        tadmin: "u-tadmin",
        badmin: "u-badmin",
        member: "u-member",
        pmember: "u-pmember",
        viewer: "u-viewer",
        iviewer: "u-iviewer",
        padmin: "u-padmin",
      })) {
        as[who as keyof typeof as] = (await generate({ user_id: userId, key_alias: `caller-${who}` })).key;
      }
    }, 60_000);

    afterAll(async () => {
      await gw?.stop();
    });

    describe("/key/generate", () => {
      test("a new key: sk- + 192 random bits, token = sha256 of the whole key, every field returned", async () => {
        const before = Date.now();
        const k = await generate({ key_alias: uid("gen"), max_budget: 12.5, budget_duration: "30d", duration: "1h", models: ["chat-mock"], tpm_limit: 1000, metadata: { owner: "x" } });
        expect(k.key).toMatch(/^sk-[A-Za-z0-9_-]{32}$/);
        expect(k.token).toBe(sha256(k.key));
        expect(k.token_id).toBe(k.token);
        expect(k.key_name).toBe(`sk-...${k.key.slice(-4)}`);
        expect(k.spend).toBe(0);
        expect(k.max_budget).toBe(12.5);
        expect(k.models).toEqual(["chat-mock"]);
        expect(k.tpm_limit).toBe(1000);
        expect(k.metadata).toEqual({ owner: "x" });
        const expires = Date.parse(k.expires!);
        expect(expires).toBeGreaterThanOrEqual(before + 3_600_000 - 1000);
        expect(expires).toBeLessThanOrEqual(Date.now() + 3_600_000 + 1000);
        expect(Date.parse(k.budget_reset_at!) - before).toBeGreaterThan(29 * 86_400_000);
        const again = await generate();
        expect(again.key).not.toBe(k.key);
        expect(again.expires).toBeNull();
        const never = await generate({ duration: -1, send_invite_email: true });
        expect(never.expires).toBeNull();
        // duration and send_invite_email are stored and returned like every other field.
        const stored = await api(`/key/info?key=${never.token}`);
        expect([stored.body.info.duration, stored.body.info.send_invite_email]).toEqual(["-1", true]);
        const plain = await api(`/key/info?key=${k.token}`);
        expect([plain.body.info.duration, plain.body.info.send_invite_email]).toEqual(["1h", false]);
      });

      test("a custom key is accepted once; reusing it (live or deleted), a non-sk- value or the master key is a 400", async () => {
        const custom = `sk-custom-${randomUUID()}`;
        const k = await generate({ key: custom });
        expect(k.key).toBe(custom);
        expect(k.token).toBe(sha256(custom));
        const dup = await api("/key/generate", { body: { key: custom } });
        expect(dup.status).toBe(400);
        expect(dup.body.error.param).toBe("key");
        await api("/key/delete", { body: { keys: [k.token] } });
        expect((await api("/key/generate", { body: { key: custom } })).status).toBe(400);
        expect((await api("/key/generate", { body: { key: "custom-no-prefix" } })).status).toBe(400);
        expect((await api("/key/generate", { body: { key: MASTER_KEY } })).status).toBe(400);
      });

      test('user_id "" is refused as /user/new refuses it (no key of a user that can never exist), on generate, update and regenerate', async () => {
        const asUserNew = await api("/user/new", { body: { user_id: "" } });
        expect(asUserNew.status).toBe(422);
        const k = await generate();
        for (const [path, body] of [
          ["/key/generate", { user_id: "" }],
          ["/key/update", { key: k.token, user_id: "" }],
          [`/key/${k.token}/regenerate`, { user_id: "" }],
        ] as const) {
          const res = await api(path, { body });
          expect([path, res.status, res.body.error?.param, res.body.error?.message]).toEqual([path, 422, asUserNew.body.error.param, asUserNew.body.error.message]);
        }
        expect((await api(`/key/info?key=${k.token}`)).body.info.user_id).toBeNull();
      });

      test("new_master_key is for the master key only: beside another key it is ignored; the master key itself is not rotated here", async () => {
        const k = await generate();
        const value = `sk-${randomUUID().replaceAll("-", "")}`;
        const rotated = await api(`/key/${k.token}/regenerate`, { body: { new_key: value, new_master_key: "sk-ignored-000000000000000000000" } });
        expect(rotated.status).toBe(200);
        expect(rotated.body.key).toBe(value);
        for (const named of [MASTER_KEY, createHash("sha256").update(MASTER_KEY).digest("hex")]) {
          const master = await api("/key/regenerate", { body: { key: named, new_master_key: "sk-newmaster-0000000000000000000" } });
          expect([master.status, master.body.error?.param]).toEqual([400, "new_master_key"]);
          expect(master.body.error.message).toContain("set SVC_MASTER_KEY");
        }
      });

      test("a custom key or new_key shorter than 20 characters after sk- is a 400 (key_name would show most of it)", async () => {
        const k = await generate();
        for (const short of ["sk-a", "sk-1151", `sk-${"x".repeat(19)}`]) {
          const made = await api("/key/generate", { body: { key: short } });
          expect([short, made.status, made.body.error?.param]).toEqual([short, 400, "key"]);
          expect(made.body.error.message).toContain("at least 20 characters");
          const rotated = await api(`/key/${k.token}/regenerate`, { body: { new_key: short } });
          expect([short, rotated.status, rotated.body.error?.param]).toEqual([short, 400, "new_key"]);
        }
        const shortest = `sk-${randomUUID().replaceAll("-", "").slice(0, 20)}`;
        const ok = await generate({ key: shortest });
        expect(ok.key_name).toBe(`sk-...${shortest.slice(-4)}`);
      });

      test("a custom key or new_key no HTTP client can send (non-ASCII, control characters) is a 400 naming it", async () => {
        const k = await generate();
        for (const odd of ["sk-emoji\u{1F600}", "sk-caf\u00e9", "sk-ctl\u0001", "sk-del\u007f"]) {
          const value = `${odd}-${randomUUID()}`;
          const made = await api("/key/generate", { body: { key: value } });
          expect([odd, made.status, made.body.error?.param]).toEqual([odd, 400, "key"]);
          expect(made.body.error.message).toContain("printable ASCII");
          const rotated = await api(`/key/${k.token}/regenerate`, { body: { new_key: value } });
          expect([odd, rotated.status, rotated.body.error?.param]).toEqual([odd, 400, "new_key"]);
        }
        // Every printable ASCII character is still accepted.
        const printable = `sk-${randomUUID()}!"#$%&'()*+,-./:;<=>?@[\\]^_\`{|}~`;
        const ok = await generate({ key: printable });
        expect((await api("/key/health", { body: {}, key: ok.key })).status).toBe(200);
      });

      test("duplicate alias 400; a deleted key's alias may be reused", async () => {
        const alias = uid("dup");
        const k = await generate({ key_alias: alias });
        const dup = await api("/key/generate", { body: { key_alias: alias } });
        expect(dup.status).toBe(400);
        expect(dup.body.error.param).toBe("key_alias");
        await api("/key/delete", { body: { key_aliases: [alias] } });
        const reused = await generate({ key_alias: alias });
        expect(reused.token).not.toBe(k.token);
      });

      test("wrong types are 422 naming the field; bad durations and rules are 400", async () => {
        const bad = await api("/key/generate", { body: { max_budget: "ten" } });
        expect(bad.status).toBe(422);
        expect(bad.body.error.param).toBe("max_budget");
        expect((await api("/key/generate", { body: { models: "chat-mock" } })).body.error.param).toBe("models");
        expect((await api("/key/generate", { body: { tpm_limit: 1.5 } })).status).toBe(422);
        // A per-model budget is an amount like max_budget: never below 0 (the key could then never call the model).
        for (const budget_limit of [-5, 1e308]) {
          const perModel = await api("/key/generate", { body: { model_max_budget: { "chat-mock": { budget_limit, time_period: "1d" } } } });
          expect([perModel.status, perModel.body.error?.param]).toEqual([422, "model_max_budget.chat-mock.budget_limit"]);
        }
        expect((await api("/key/generate", { body: { duration: "forever" } })).status).toBe(400);
        expect((await api("/key/generate", { body: { budget_duration: "often" } })).status).toBe(400);
        // As for teams, users and orgs: "-1" is a budget that never resets; a period of no length is refused (keys refused "-1").
        const never = await api("/key/generate", { body: { budget_duration: "-1", max_budget: 5 } });
        expect(never.status).toBe(200);
        expect(never.body.budget_reset_at).toBeNull();
        for (const path of ["/key/generate", "/team/new", "/user/new", "/organization/new", "/budget/new"]) {
          const zero = await api(path, { body: { budget_duration: "0d", ...(path === "/organization/new" ? { organization_alias: "zero" } : {}) } });
          expect(zero.status, path).toBe(400);
          expect(zero.body.error.param, path).toBe("budget_duration");
        }
        const noInterval = await api("/key/generate", { body: { auto_rotate: true } });
        expect(noInterval.status).toBe(400);
        expect(noInterval.body.error.param).toBe("rotation_interval");
        expect((await api("/key/generate", { body: { temp_budget_increase: 5 } })).status).toBe(400);
        expect((await api("/key/generate", { body: { team_id: "no-such-team" } })).status).toBe(400);
        const outside = await api("/key/generate", { body: { team_id: "team-a", models: ["gpt-4"] } });
        expect(outside.status).toBe(400);
        expect(outside.body.error.message).toContain("gpt-4");
        // Within the team's list, wildcards included.
        expect((await generate({ team_id: "team-a", models: ["chat-mock", "openai/gpt-4o"] })).team_id).toBe("team-a");
      });

      test("router_settings is checked as the config's: a bad value is a 422 naming it, on keys and teams alike", async () => {
        const bad: [Record<string, unknown>, string][] = [
          [{ num_retries: "x" }, "router_settings.num_retries"],
          [{ num_retries: -5 }, "router_settings.num_retries"],
          [{ routing_strategy: "nope" }, "router_settings.routing_strategy"],
          [{ fallbacks: "fb" }, "router_settings.fallbacks"],
          [{ retry_policy: { TimeoutErrorRetries: 1.5 } }, "router_settings.retry_policy.TimeoutErrorRetries"],
        ];
        for (const [settings, field] of bad) {
          for (const path of ["/key/generate", "/team/new"]) {
            const res = await api(path, { body: { router_settings: settings } });
            expect([res.status, res.body.error?.param], `${path} ${JSON.stringify(settings)}`).toEqual([422, field]);
          }
        }
        const k = await generate();
        expect((await api("/key/update", { body: { key: k.key, router_settings: { max_fallbacks: "all" } } })).status).toBe(422);
        const good = { num_retries: 2, routing_strategy: "least-busy", fallbacks: [{ "chat-mock": ["chat-mock"] }] };
        expect((await generate({ router_settings: good })).router_settings).toEqual(good);
      });

      test("auto_rotate with rotation_interval schedules the rotation", async () => {
        const k = await generate({ auto_rotate: true, rotation_interval: "30d" });
        expect(k.auto_rotate).toBe(true);
        expect(Date.parse(k.key_rotation_at!) - Date.now()).toBeGreaterThan(29 * 86_400_000);
      });

      test("user_id that has no user row yet creates it (internal_user)", async () => {
        const userId = uid("fresh-user");
        await generate({ user_id: userId });
        const rows = await db().execute(sql`select user_role from users where user_id = ${userId}`);
        expect(JSON.stringify(rows)).toContain("internal_user");
      });

      test("svc-changed-by is recorded as created_by and in the audit row", async () => {
        const res = await api("/key/generate", { body: {}, headers: { "svc-changed-by": "alice@example.com" } });
        issued.push(res.body.key);
        expect(res.body.created_by).toBe("alice@example.com");
        const audit = await api(`/audit/logs?object_id=${res.body.token}`);
        expect(audit.body.audit_logs[0]?.changed_by).toBe("alice@example.com");
        expect(audit.body.audit_logs[0]?.action).toBe("created");
      });
    });

    describe("/key/service-account/generate", () => {
      test("needs an existing team; the key has no user and a service account id", async () => {
        expect((await api("/key/service-account/generate", { body: {} })).status).toBe(400);
        expect((await api("/key/service-account/generate", { body: { team_id: "nope" } })).status).toBe(400);
        const res = await api("/key/service-account/generate", { body: { team_id: "team-b", key_alias: uid("svc"), user_id: "u-internal" } });
        issued.push(res.body.key);
        expect(res.status).toBe(200);
        expect(res.body.team_id).toBe("team-b");
        expect(res.body.user_id).toBeNull();
        expect(res.body.service_account_id).toBe(res.body.key_alias);
        expect(res.body.metadata.service_account_id).toBe(res.body.key_alias);
        expect((await api("/key/service-account/generate", { body: { team_id: "team-a" }, key: as.tadmin })).status).toBe(403);
      });
    });

    describe("/key/info", () => {
      test("by plaintext or hash; defaults to the caller's key; token but never the plaintext", async () => {
        const k = await generate({ key_alias: uid("info"), user_id: "u-internal" });
        const byPlain = await api(`/key/info?key=${k.key}`);
        const byHash = await api(`/key/info?key=${k.token}`);
        expect(byPlain.status).toBe(200);
        expect(byPlain.body).toEqual(byHash.body);
        expect(byPlain.body.key).toBe(k.token);
        expect(byPlain.body.info.token).toBe(k.token);
        expect(byPlain.body.info.key_alias).toBe(k.key_alias);
        expect(JSON.stringify(byPlain.body)).not.toContain(k.key);
        const own = await api("/key/info", { key: k.key });
        expect(own.body.info.token).toBe(k.token);
      });

      test("unknown key: 404 for admins, 403 for others (existence never revealed)", async () => {
        const unknown = await api(`/key/info?key=sk-${randomUUID()}`);
        expect(unknown.status).toBe(404);
        const other = await generate({ user_id: "u-other" });
        const foreign = await api(`/key/info?key=${other.token}`, { key: as.internal });
        const missing = await api(`/key/info?key=${sha256("nothing")}`, { key: as.internal });
        expect(foreign.status).toBe(403);
        expect(missing.status).toBe(403);
        expect(missing.body.error.message).toBe(foreign.body.error.message);
      });
    });

    describe("/key/update", () => {
      test("explicit null clears a field, absent fields stay, duration and budget_duration recompute times", async () => {
        const k = await generate({ key_alias: uid("upd"), max_budget: 10, models: ["chat-mock"], tpm_limit: 5, metadata: { a: 1 } });
        const res = await api("/key/update", { body: { key: k.key, max_budget: null, models: null, duration: "2h", budget_duration: "1d" } });
        expect(res.status).toBe(200);
        expect(res.body.key).toBe(k.token);
        expect(res.body.max_budget).toBeNull();
        expect(res.body.models).toEqual([]);
        expect(res.body.tpm_limit).toBe(5);
        expect(res.body.metadata).toEqual({ a: 1 });
        expect(Math.abs(Date.parse(res.body.expires!) - (Date.now() + 7_200_000))).toBeLessThan(5000);
        expect(Math.abs(Date.parse(res.body.budget_reset_at!) - (Date.now() + 86_400_000))).toBeLessThan(5000);
        const info = await api(`/key/info?key=${k.token}`);
        expect(info.body.info.max_budget).toBeNull();
        expect(info.body.info.duration).toBe("2h");
        const cleared = await api("/key/update", { body: { key: k.token, duration: null, key_alias: null } });
        expect(cleared.body.expires).toBeNull();
        expect(cleared.body.duration).toBeNull();
        expect(cleared.body.key_alias).toBeNull();
      });

      test("duplicate alias 400, unknown key 404, wrong types 422, model outside the team 400", async () => {
        const a = await generate({ key_alias: uid("ua") });
        const b = await generate({ key_alias: uid("ub"), team_id: "team-a" });
        expect((await api("/key/update", { body: { key: b.token, key_alias: a.key_alias } })).status).toBe(400);
        expect((await api("/key/update", { body: { key: b.token, key_alias: b.key_alias } })).status).toBe(200);
        expect((await api("/key/update", { body: { key: sha256("missing") } })).status).toBe(404);
        const typed = await api("/key/update", { body: { key: a.token, tpm_limit: "many" } });
        expect(typed.status).toBe(422);
        expect(typed.body.error.param).toBe("tpm_limit");
        expect((await api("/key/update", { body: { max_budget: 1 } })).status).toBe(422);
        expect((await api("/key/update", { body: { key: b.token, models: ["gpt-4"] } })).status).toBe(400);
        expect((await api("/key/update", { body: { key: a.token, team_id: "team-a", models: ["claude"] } })).status).toBe(400);
      });
    });

    describe("/key/bulk_update", () => {
      test("each item on its own: failures are reported per item and do not stop the others", async () => {
        const a = await generate({ key_alias: uid("bulk") });
        const b = await generate();
        const taken = await generate({ key_alias: uid("taken") });
        const res = await api("/key/bulk_update", {
          body: {
            keys: [
              { key: a.key, max_budget: 7, tags: ["x"] },
              { key: sha256("missing"), max_budget: 1 },
              { key: b.token, key_alias: taken.key_alias },
              { key: b.token, team_id: "team-b" },
            ],
          },
        });
        expect(res.status).toBe(200);
        expect(res.body.total_requested).toBe(4);
        expect(res.body.successful_updates.map((u) => u.token)).toEqual([a.token, b.token]);
        expect(res.body.successful_updates[0]?.max_budget).toBe(7);
        expect(res.body.failed_updates).toHaveLength(2);
        expect(res.body.failed_updates[0]?.failed_reason).toContain("not found");
        expect(res.body.failed_updates[1]?.failed_reason).toContain("alias");
        // The plaintext passed in an item is not echoed.
        expect(JSON.stringify(res.body)).not.toContain(a.key);
        expect((await api(`/key/info?key=${b.token}`)).body.info.team_id).toBe("team-b");
      });

      test("admins only, at most 500 items, at least one", async () => {
        const k = await generate({ user_id: "u-internal" });
        expect((await api("/key/bulk_update", { body: { keys: [{ key: k.token, max_budget: 1 }] }, key: as.internal })).status).toBe(403);
        expect((await api("/key/bulk_update", { body: { keys: Array.from({ length: 501 }, () => ({ key: k.token })) } })).status).toBe(400);
        expect((await api("/key/bulk_update", { body: { keys: [] } })).status).toBe(400);
        expect((await api("/key/bulk_update", { body: { keys: [{ key: k.token, max_budget: "x" }] } })).status).toBe(422);
      });
    });

    describe("/key/list", () => {
      test("filters, paging, sorting, hashes by default, full objects, expand=user, status=deleted", async () => {
        const userId = uid("lister");
        const made: R[] = [];
        for (const spend of [3, 1, 2]) made.push(await generate({ user_id: userId, key_alias: uid("list"), spend }));
        const page1 = await api(`/key/list?user_id=${userId}&size=2&sort_by=spend&sort_order=asc`);
        expect(page1.status).toBe(200);
        expect(page1.body.total_count).toBe(3);
        expect(page1.body.total_pages).toBe(2);
        expect(page1.body.current_page).toBe(1);
        expect(page1.body.keys).toEqual([made[1]!.token, made[2]!.token]);
        const page2 = await api(`/key/list?user_id=${userId}&size=2&page=2&sort_by=spend&sort_order=asc`);
        expect(page2.body.keys).toEqual([made[0]!.token]);
        const desc = await api(`/key/list?user_id=${userId}&sort_by=spend`);
        expect(desc.body.keys).toEqual([made[0]!.token, made[2]!.token, made[1]!.token]);
        const full = await api(`/key/list?key_alias=${made[0]!.key_alias}&return_full_object=true`);
        expect((full.body.keys[0] as R).spend).toBe(3);
        expect(JSON.stringify(full.body)).not.toContain(made[0]!.key);
        expect((await api(`/key/list?key_hash=${made[2]!.key}`)).body.keys).toEqual([made[2]!.token]);
        const expanded = await api(`/key/list?key_hash=${made[2]!.token}&expand=user`);
        expect((expanded.body.keys[0] as R).user?.user_id).toBe(userId);
        const teamKey = await generate({ team_id: "team-b" });
        expect((await api("/key/list?team_id=team-b&size=100")).body.keys).toContain(teamKey.token);
        await api("/key/delete", { body: { keys: [made[0]!.token] } });
        expect((await api(`/key/list?user_id=${userId}`)).body.keys).toHaveLength(2);
        const deleted = await api(`/key/list?user_id=${userId}&status=deleted&return_full_object=true`);
        expect(deleted.body.keys.map((k) => (k as R).token)).toEqual([made[0]!.token]);
        expect((deleted.body.keys[0] as R).deleted_at).not.toBeNull();
      });

      test("bad paging or sorting is refused", async () => {
        expect((await api("/key/list?size=101")).status).toBe(422);
        expect((await api("/key/list?page=0")).status).toBe(422);
        // 422 naming the parameter, as on /v2/team/list and /user/list (it was a 400 here).
        for (const bad of ["sort_by=password", "sort_order=sideways", "status=zombie", "include_team_keys=maybe"]) {
          const r = await api(`/key/list?${bad}`);
          expect(r.status, bad).toBe(422);
          expect(r.body.error.param, bad).toBe(bad.slice(0, bad.indexOf("=")));
        }
        const dflt = await api("/key/list");
        expect(dflt.body.keys.length).toBeLessThanOrEqual(10);
      });
    });

    describe("/key/aliases", () => {
      test("case-insensitive partial search, paging, live keys only, admins only", async () => {
        const stem = `Zeta${randomUUID().slice(0, 6)}`;
        for (const s of ["Alpha", "beta", "GAMMA"]) await generate({ key_alias: `${stem}-${s}` });
        const dead = await generate({ key_alias: `${stem}-dead` });
        await api("/key/delete", { body: { keys: [dead.token] } });
        const all = await api(`/key/aliases?search=${stem.toLowerCase()}`);
        expect(all.status).toBe(200);
        expect(all.body.aliases).toEqual([`${stem}-Alpha`, `${stem}-GAMMA`, `${stem}-beta`].sort());
        expect(all.body.total_count).toBe(3);
        const paged = await api(`/key/aliases?search=${stem}&size=2&page=2`);
        expect(paged.body.aliases).toHaveLength(1);
        expect(paged.body.total_pages).toBe(2);
        expect((await api(`/key/aliases?search=${stem}-BET`)).body.aliases).toEqual([`${stem}-beta`]);
        expect((await api("/key/aliases?search=%25")).body.aliases.every((a) => a.includes("%"))).toBe(true);
        expect((await api("/key/aliases", { key: as.internal })).status).toBe(403);
        expect((await api("/key/aliases", { key: as.viewer })).status).toBe(200);
      });
    });

    describe("/key/regenerate", () => {
      test("the same row gets a new token and keeps spend, limits and configuration", async () => {
        const k = await generate({ key_alias: uid("regen"), max_budget: 50, tpm_limit: 99, models: ["chat-mock"], metadata: { team: "x" }, spend: 4.25 });
        const res = await api("/key/regenerate", { body: { key: k.key } });
        expect(res.status).toBe(200);
        issued.push(res.body.key);
        expect(res.body.key).toMatch(/^sk-/);
        expect(res.body.key).not.toBe(k.key);
        expect(res.body.token).toBe(sha256(res.body.key));
        expect(res.body.key_name).toBe(`sk-...${res.body.key.slice(-4)}`);
        expect(res.body.key_alias).toBe(k.key_alias);
        expect(res.body.spend).toBe(4.25);
        expect(res.body.max_budget).toBe(50);
        expect(res.body.tpm_limit).toBe(99);
        expect(res.body.models).toEqual(["chat-mock"]);
        expect(res.body.metadata).toEqual({ team: "x" });
        expect(res.body.rotation_count).toBe(1);
        expect(res.body.last_rotation_at).not.toBeNull();
        expect((await api(`/key/info?key=${k.token}`)).status).toBe(404);
        expect((await api("/key/health", { body: {}, key: k.key })).status).toBe(401);
        expect((await api("/key/health", { body: {}, key: res.body.key })).status).toBe(200);

        // Path form, by hash, with changes and a custom value.
        const custom = `sk-rotated-${randomUUID()}`;
        const again = await api(`/key/${res.body.token}/regenerate`, { body: { new_key: custom, max_budget: 75 } });
        expect(again.status).toBe(200);
        expect(again.body.key).toBe(custom);
        expect(again.body.max_budget).toBe(75);
        expect(again.body.spend).toBe(4.25);
        expect(again.body.rotation_count).toBe(2);
        expect((await api(`/key/${again.body.token}/regenerate`, { body: { new_key: custom } })).status).toBe(400);
        expect((await api(`/key/${sha256("missing")}/regenerate`, { body: {} })).status).toBe(404);
        expect((await api("/key/regenerate", { body: {} })).status).toBe(400);
        expect((await api("/key/regenerate", { body: { key: again.body.token, grace_period: "soon" } })).status).toBe(400);
      });

      test("grace_period keeps the old key working until it ends, on the same row", async () => {
        const k = await generate();
        const res = await api(`/key/${k.key}/regenerate`, { body: { grace_period: "30m" } });
        issued.push(res.body.key);
        const viaOld = await api("/key/info", { key: k.key });
        expect(viaOld.status).toBe(200);
        expect(viaOld.body.info.token).toBe(res.body.token);
        // The default grace comes from SVC_KEY_ROTATION_GRACE_PERIOD; an explicit 0s still revokes at once.
        process.env.SVC_KEY_ROTATION_GRACE_PERIOD = "30m";
        try {
          const env = await generate();
          const viaEnv = await api("/key/regenerate", { body: { key: env.token } });
          issued.push(viaEnv.body.key);
          expect((await api("/key/info", { key: env.key })).body.info?.token).toBe(viaEnv.body.token);
          const next = await api("/key/regenerate", { body: { key: viaEnv.body.token, grace_period: "1h" } });
          issued.push(next.body.key);
          // Older values still in their grace follow the key to its newest token.
          expect((await api("/key/info", { key: env.key })).body.info?.token).toBe(next.body.token);
          expect((await api("/key/info", { key: viaEnv.body.key })).body.info?.token).toBe(next.body.token);
          // Revoking at once (a leaked key) ends every earlier value, not only the last one:
          // none may call the gateway or regenerate the key again.
          const zero = await api("/key/regenerate", { body: { key: next.body.token, grace_period: "0s" } });
          issued.push(zero.body.key);
          for (const earlier of [env.key, viaEnv.body.key, next.body.key]) {
            expect((await api("/key/info", { key: earlier })).status).toBe(401);
            expect((await api(`/key/${earlier}/regenerate`, { body: {} })).status).toBe(404);
          }
          expect((await api("/key/info", { key: zero.body.key })).status).toBe(200);
        } finally {
          delete process.env.SVC_KEY_ROTATION_GRACE_PERIOD;
        }
        // Deleting the key ends the grace of its old value too.
        await api("/key/delete", { body: { keys: [res.body.token] } });
        expect((await api("/key/info", { key: k.key })).status).toBe(401);
      });
    });

    describe("/key/{key}/reset_spend", () => {
      test("sets spend to reset_to (default 0), within 0..current spend", async () => {
        const k = await generate({ spend: 5, max_budget: 20, budget_duration: "7d" });
        const tooHigh = await api(`/key/${k.token}/reset_spend`, { body: { reset_to: 6 } });
        expect(tooHigh.status).toBe(400);
        expect((await api(`/key/${k.token}/reset_spend`, { body: { reset_to: -1 } })).status).toBe(422);
        const partial = await api(`/key/${k.key}/reset_spend`, { body: { reset_to: 2 } });
        expect(partial.status).toBe(200);
        expect(partial.body as unknown).toEqual({ key_hash: k.token, spend: 2, previous_spend: 5, max_budget: 20, budget_reset_at: k.budget_reset_at });
        const zero = await api(`/key/${k.token}/reset_spend`, { method: "POST" });
        expect(zero.body.spend).toBe(0);
        expect(zero.body.previous_spend).toBe(2);
        expect((await api(`/key/info?key=${k.token}`)).body.info.spend).toBe(0);
        expect((await api(`/key/${sha256("missing")}/reset_spend`, { method: "POST" })).status).toBe(404);
      });

      test("compares and stores amounts exactly: above $8,192 two amounts one pico-dollar apart are one double", async () => {
        // Raw JSON text: in JavaScript 9000.000000000001 and 9000.000000000002 are the same number.
        const raw = async (path: string, body: string) => {
          const res = await fetch(gw.url + path, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body });
          return { status: res.status, text: await res.text() };
        };
        const k = await generate({});
        const token = k.token as string;
        // A spend as calls leave it, to the pico-dollar (a body's number is read as a double).
        await db().execute(sql`update virtual_keys set spend = 9000.000000000001 where token = ${token}`);
        await gw.host!.services.bus!.publish({ kind: "key", token });
        // Higher by a pico-dollar: refused (compared as doubles it was accepted, and spend went up).
        const higher = await raw(`/key/${token}/reset_spend`, '{"reset_to":9000.000000000002}');
        expect(higher.status).toBe(400);
        expect(higher.text).toContain('"param":"reset_to"');
        const finer = await raw(`/key/${token}/reset_spend`, '{"reset_to":0.0000000000001}');
        expect(finer.status).toBe(400);
        expect(finer.text).toContain("decimals");
        // As written, not as the double it reads as (9000.000000000002): stored and answered exactly.
        const lower = await raw(`/key/${token}/reset_spend`, '{"reset_to":9000.000000000001}');
        expect(lower.status).toBe(200);
        expect(lower.text).toContain('"spend":9000.000000000001');
        expect(lower.text).toContain('"previous_spend":9000.000000000001');
        const same = await raw(`/key/${token}/reset_spend`, '{"reset_to":8999.999999999999}');
        expect(same.text).toContain('"spend":8999.999999999999');
      });

      test("money in a body is kept as written, not as the nearest double (9000.000000000001 read as 9000.000000000002)", async () => {
        const res = await fetch(`${gw.url}/key/generate`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: '{"max_budget":9000.000000000001,"soft_budget":1.2345678901234e3}',
        });
        const made = (await res.json()) as { token: string; key: string };
        issued.push(made.key);
        const [row] = await rows<{ max_budget: string; soft_budget: string }>(db(), sql`select max_budget::text as max_budget, soft_budget::text as soft_budget from virtual_keys where token = ${made.token}`);
        expect(row).toEqual({ max_budget: "9000.000000000001", soft_budget: "1234.567890123400" });
        const info = await (await fetch(`${gw.url}/key/info?key=${made.token}`, { headers: { authorization: `Bearer ${MASTER_KEY}` } })).text();
        expect(info).toContain('"max_budget":9000.000000000001');
        // Too many decimals as written is refused, also when the double would hide them.
        const finer = await fetch(`${gw.url}/key/generate`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: '{"max_budget":1.0000000000000001}',
        });
        expect(finer.status).toBe(400);
      });
    });

    describe("/key/block, /key/unblock, /key/delete, /key/health", () => {
      test("block returns the row and stops the key; unblock restores it", async () => {
        const k = await generate();
        const blocked = await api("/key/block", { body: { key: k.key } });
        expect(blocked.status).toBe(200);
        expect(blocked.body.blocked).toBe(true);
        expect(blocked.body.token).toBe(k.token);
        expect((await api("/key/health", { body: {}, key: k.key })).status).toBe(401);
        const unblocked = await api("/key/unblock", { body: { key: k.token } });
        expect(unblocked.body.blocked).toBe(false);
        expect((await api("/key/health", { body: {}, key: k.key })).status).toBe(200);
        expect((await api("/key/block", { body: { key: sha256("missing") } })).status).toBe(404);
      });

      test("delete by keys or aliases answers with hashes (never the plaintext); the key then gets 401", async () => {
        const a = await generate({ key_alias: uid("del") });
        const b = await generate({ key_alias: uid("del") });
        const res = await api("/key/delete", { body: { keys: [a.key], key_aliases: [b.key_alias] } });
        expect(res.status).toBe(200);
        expect(res.body.deleted_keys).toEqual([a.token, b.key_alias!]);
        expect((await api("/key/health", { body: {}, key: a.key })).status).toBe(401);
        expect((await api("/key/health", { body: {}, key: b.key })).status).toBe(401);
        const row = await api(`/key/list?key_hash=${a.token}&status=deleted&return_full_object=true`);
        expect((row.body.keys[0] as R).deleted_at).not.toBeNull();
        expect((await api("/key/delete", { body: { keys: [a.token] } })).status).toBe(404);
        expect((await api("/key/delete", { body: { key_aliases: ["no-such-alias"] } })).status).toBe(404);
        expect((await api("/key/delete", { body: {} })).status).toBe(400);
      });

      test("health: healthy without key-level callbacks; honest about callbacks it cannot serve", async () => {
        const plain = await generate();
        expect((await api("/key/health", { body: {}, key: plain.key })).body as unknown).toEqual({
          key: "healthy",
          logging_callbacks: { callbacks: [], status: "healthy", details: "The key lists no logging callbacks of its own." },
        });
        const logged = await generate({ metadata: { logging: [{ callback_name: "langfuse" }] } });
        const res = await api("/key/health", { method: "POST", key: logged.key });
        expect(res.body.key).toBe("unhealthy");
        expect(res.body.logging_callbacks?.callbacks).toEqual(["langfuse"]);
        expect(res.body.logging_callbacks?.status).toBe("unhealthy");
      });
    });

    describe("who may do what", () => {
      test("internal user: own keys only; another user_id, team or key is a 403", async () => {
        const mine = await api("/key/generate", { body: { key_alias: uid("mine") }, key: as.internal });
        issued.push(mine.body.key);
        expect(mine.status).toBe(200);
        expect(mine.body.user_id).toBe("u-internal");
        expect((await api("/key/generate", { body: { user_id: "u-other" }, key: as.internal })).status).toBe(403);
        expect((await api("/key/generate", { body: { team_id: "team-a" }, key: as.internal })).status).toBe(403);
        const theirs = await generate({ user_id: "u-other" });
        for (const [path, body] of [
          ["/key/update", { key: theirs.token, max_budget: 1 }],
          ["/key/delete", { keys: [theirs.token] }],
          ["/key/block", { key: theirs.token }],
          [`/key/${theirs.token}/regenerate`, {}],
          [`/key/${theirs.token}/reset_spend`, {}],
        ] as const) {
          expect([path, (await api(path, { body, key: as.internal })).status]).toEqual([path, 403]);
        }
        expect((await api(`/key/info?key=${theirs.token}`, { key: as.internal })).status).toBe(403);
        const listed = await api("/key/list?size=100", { key: as.internal });
        expect(listed.body.keys).toContain(mine.body.token);
        expect(listed.body.keys).not.toContain(theirs.token);
        expect((await api("/key/list?user_id=u-other", { key: as.internal })).status).toBe(403);
        expect((await api("/key/list?team_id=team-a", { key: as.internal })).status).toBe(403);
        // Own key: read, update, delete; but not move to another user, change its caps, unblock itself or reset its spend.
        expect((await api("/key/update", { body: { key: mine.body.token, key_alias: uid("renamed") }, key: as.internal })).status).toBe(200);
        expect((await api("/key/update", { body: { key: mine.body.token, max_budget: 3 }, key: as.internal })).status).toBe(403);
        expect((await api("/key/update", { body: { key: mine.body.token, user_id: "u-other" }, key: as.internal })).status).toBe(403);
        expect((await api("/key/update", { body: { key: mine.body.token, team_id: "team-a" }, key: as.internal })).status).toBe(403);
        expect((await api("/key/update", { body: { key: mine.body.token, spend: 5 }, key: as.internal })).status).toBe(403);
        await api("/key/block", { body: { key: mine.body.token } });
        expect((await api("/key/update", { body: { key: mine.body.token, blocked: false }, key: as.internal })).status).toBe(403);
        expect((await api("/key/block", { body: { key: mine.body.token }, key: as.internal })).status).toBe(403);
        expect((await api("/key/delete", { body: { keys: [mine.body.token] }, key: as.internal })).status).toBe(200);
      });

      test("a key's owner (or a member the team lets update keys) may not change the caps an admin set on it, by /key/update or /key/regenerate; team and proxy admins may", async () => {
        const capped = { max_budget: 0.5, rpm_limit: 1, tpm_limit: 1000, max_parallel_requests: 1, model_rpm_limit: { "chat-mock": 1 }, duration: "1h" };
        const own = await generate({ user_id: "u-internal", ...capped });
        const before = (await api(`/key/info?key=${own.token}`)).body.info;
        for (const lift of [
          { max_budget: 1000 },
          { rpm_limit: null },
          { tpm_limit: 1_000_000 },
          { max_parallel_requests: 100 },
          { model_rpm_limit: { "chat-mock": 1000 } },
          { duration: "-1" },
          { budget_duration: "1s" },
          { temp_budget_increase: 1000, temp_budget_expiry: "2099-01-01T00:00:00Z" },
          { soft_budget: 100 },
          { model_max_budget: {} },
          { rpm_limit_type: "guaranteed_throughput" },
          { key_type: "management" },
          { allowed_routes: ["/chat/completions"] },
          { allowed_passthrough_routes: ["/anything/*"] },
          // Tightening is an admin's too: who set a cap is not recorded.
          { max_budget: 0.1 },
        ]) {
          const field = Object.keys(lift)[0]!;
          for (const [path, body] of [
            ["/key/update", { key: own.token, ...lift }],
            [`/key/${own.token}/regenerate`, lift],
          ] as const) {
            const res = await api(path, { body, key: own.key });
            expect([path, field, res.status]).toEqual([path, field, 403]);
            expect(res.body.error.message).toContain(`may change ${field}`);
          }
        }
        const after = (await api(`/key/info?key=${own.token}`, { key: own.key })).body.info;
        expect([after.token, after.max_budget, after.rpm_limit, after.expires, after.budget_duration]).toEqual([before.token, 0.5, 1, before.expires, null]);
        // Sending the caps back as they are, with a change of its own fields, is the owner's right.
        const echoed = await api("/key/update", { body: { ...before, key: own.token, key_alias: uid("own-capped"), duration: undefined }, key: own.key });
        expect(echoed.status).toBe(200);
        expect([echoed.body.max_budget, echoed.body.rpm_limit, echoed.body.expires]).toEqual([0.5, 1, before.expires]);
        expect((await api("/key/update", { body: { key: own.token, rpm_limit: 5 } })).status).toBe(200);

        // A team admin sets the caps of its team's keys; its `user` members, even with /key/update, do not.
        const teamKey = await generate({ team_id: "team-p", user_id: "u-pmember", max_budget: 1, rpm_limit: 1 });
        const lifted = await api("/key/update", { body: { key: teamKey.token, max_budget: 1000 }, key: as.pmember });
        expect(lifted.status).toBe(403);
        expect((await api(`/key/info?key=${teamKey.token}`)).body.info.max_budget).toBe(1);
        const aKey = await generate({ team_id: "team-a", user_id: "u-member", max_budget: 1, rpm_limit: 1 });
        const byAdmin = await api("/key/update", { body: { key: aKey.token, max_budget: 5, rpm_limit: null, duration: "2h", budget_duration: "1d" }, key: as.tadmin });
        expect([byAdmin.status, byAdmin.body.max_budget, byAdmin.body.rpm_limit, byAdmin.body.budget_duration]).toEqual([200, 5, null, "1d"]);
      });

      test("internal user regenerates its own personal key (also an auto-rotated one, with its old value); a 403 says why", async () => {
        const mine = await generate({ user_id: "u-internal", key_alias: uid("regen-mine") });
        const regen = await api("/key/regenerate", { body: { key: mine.key }, key: as.internal });
        expect(regen.status).toBe(200);
        issued.push(regen.body.key);
        const byPath = await api(`/key/${regen.body.token}/regenerate`, { body: {}, key: regen.body.key });
        expect(byPath.status).toBe(200);
        issued.push(byPath.body.key);
        expect((await api("/key/health", { body: {}, key: byPath.body.key })).status).toBe(200);
        // Nobody has an auto-rotated key's new value: its owner regenerates it with the old one during its grace.
        const auto = await generate({ user_id: "u-internal", auto_rotate: true, rotation_interval: "1s" });
        await Bun.sleep(1100);
        expect(await rotateDueKeys(db(), gw.host!.services.bus!, gw.log, Date.now(), 60_000)).toBeGreaterThanOrEqual(1);
        const recovered = await api(`/key/${auto.key}/regenerate`, { body: {}, key: auto.key });
        expect(recovered.status).toBe(200);
        issued.push(recovered.body.key);
        expect((await api("/key/health", { body: {}, key: recovered.body.key })).status).toBe(200);
        // The refusal names the real reason: block is not an owner's right, and another user's key is not theirs.
        const block = await api("/key/block", { body: { key: byPath.body.token }, key: as.internal });
        expect(block.status).toBe(403);
        expect(block.body.error.message).toContain("only a proxy admin");
        expect(block.body.error.message).not.toContain("neither yours");
        const theirs = await generate({ user_id: "u-other" });
        const notMine = await api(`/key/${theirs.token}/regenerate`, { body: {}, key: as.internal });
        expect(notMine.status).toBe(403);
        expect(notMine.body.error.message).toContain("neither yours");
      });

      test("internal user: models outside its own are refused by /key/update and /key/regenerate as by /key/generate", async () => {
        const userId = uid("u-limited");
        await db().insert(users).values({ userId, models: ["chat-mock"] });
        await gw.host!.services.bus!.publish({ kind: "user", userId });
        const own = await generate({ user_id: userId, models: ["chat-mock"] });
        const generated = await api("/key/generate", { body: { models: ["other-model"] }, key: own.key });
        expect(generated.status).toBe(400);
        for (const [path, body] of [
          ["/key/update", { key: own.token, models: ["other-model"] }],
          ["/key/update", { key: own.token, models: ["chat-mock", "other-model"] }],
          [`/key/${own.token}/regenerate`, { models: ["other-model"] }],
        ] as const) {
          const res = await api(path, { body, key: own.key });
          expect([path, res.status, res.body.error?.param]).toEqual([path, 400, "models"]);
          expect(res.body.error.message).toStartWith("Model not in your allowed models: other-model");
        }
        expect((await api(`/key/info?key=${own.token}`)).body.info.models).toEqual(["chat-mock"]);
        expect((await api("/key/update", { body: { key: own.token, models: [] }, key: own.key })).status).toBe(200);
        // A proxy admin may still give the key any model.
        expect((await api("/key/update", { body: { key: own.token, models: ["other-model"] } })).status).toBe(200);
      });

      test("internal user: models its own allow through a wildcard or an access group are its to list on a personal key, as on its calls", async () => {
        for (const allowed of [["chat-*"], ["beta"], ["grouped-*", "beta"]]) {
          const userId = uid("u-wide");
          await db().insert(users).values({ userId, models: allowed });
          await gw.host!.services.bus!.publish({ kind: "user", userId });
          const own = await generate({ user_id: userId });
          const model = allowed[0] === "chat-*" ? "chat-mock" : "grouped-mock";
          const generated = await api("/key/generate", { body: { models: [model] }, key: own.key });
          issued.push(generated.body.key);
          expect([allowed, generated.status, generated.body.models]).toEqual([allowed, 200, [model]]);
          const updated = await api("/key/update", { body: { key: own.token, models: [model] }, key: own.key });
          expect([allowed, updated.status, updated.body.models]).toEqual([allowed, 200, [model]]);
          // What they do not allow stays refused.
          const other = model === "chat-mock" ? "grouped-mock" : "chat-mock";
          const refused = await api("/key/update", { body: { key: own.token, models: [other] }, key: own.key });
          expect([allowed, refused.status, refused.body.error?.message]).toEqual([allowed, 400, `Model not in your allowed models: ${other}.`]);
        }
      });

      test("team admin: manages its team's keys; another team's keys are a 403", async () => {
        const inTeam = await api("/key/generate", { body: { team_id: "team-a", user_id: "u-member", models: ["chat-mock"] }, key: as.tadmin });
        issued.push(inTeam.body.key);
        expect(inTeam.status).toBe(200);
        expect(inTeam.body.user_id).toBe("u-member");
        expect((await api("/key/generate", { body: { team_id: "team-a", user_id: "u-other" }, key: as.tadmin })).status).toBe(403);
        expect((await api("/key/generate", { body: { team_id: "team-b" }, key: as.tadmin })).status).toBe(403);
        const k = inTeam.body.token;
        expect((await api(`/key/info?key=${k}`, { key: as.tadmin })).status).toBe(200);
        expect((await api("/key/update", { body: { key: k, max_budget: 9 }, key: as.tadmin })).status).toBe(200);
        expect((await api("/key/block", { body: { key: k }, key: as.tadmin })).status).toBe(200);
        expect((await api("/key/unblock", { body: { key: k }, key: as.tadmin })).status).toBe(200);
        expect((await api(`/key/${k}/reset_spend`, { body: {}, key: as.tadmin })).status).toBe(200);
        expect((await api("/key/update", { body: { key: k, team_id: "team-b" }, key: as.tadmin })).status).toBe(403);
        const regen = await api(`/key/${k}/regenerate`, { body: {}, key: as.tadmin });
        issued.push(regen.body.key);
        expect(regen.status).toBe(200);
        const teamList = await api("/key/list?include_team_keys=true&size=100", { key: as.tadmin });
        expect(teamList.body.keys).toContain(regen.body.token);
        expect((await api("/key/list?team_id=team-a&size=100", { key: as.tadmin })).body.keys).toContain(regen.body.token);
        expect((await api("/key/list?team_id=team-b", { key: as.tadmin })).status).toBe(403);

        const otherTeam = await generate({ team_id: "team-b" });
        for (const [path, body] of [
          ["/key/update", { key: otherTeam.token, max_budget: 1 }],
          ["/key/delete", { keys: [otherTeam.token] }],
          ["/key/block", { key: otherTeam.token }],
          ["/key/unblock", { key: otherTeam.token }],
          [`/key/${otherTeam.token}/regenerate`, {}],
          [`/key/${otherTeam.token}/reset_spend`, {}],
        ] as const) {
          expect([path, (await api(path, { body, key: as.tadmin })).status]).toEqual([path, 403]);
        }
        expect((await api(`/key/info?key=${otherTeam.token}`, { key: as.tadmin })).status).toBe(403);
        expect((await api(`/key/info?key=${otherTeam.token}`)).status).toBe(200);
        expect((await api("/key/delete", { body: { keys: [regen.body.token] }, key: as.tadmin })).status).toBe(200);
      });

      test("team user member: only what team_member_permissions grant", async () => {
        const teamKey = await generate({ team_id: "team-a", user_id: "u-tadmin" });
        // Defaults: /key/info and /key/health.
        expect((await api(`/key/info?key=${teamKey.token}`, { key: as.member })).status).toBe(200);
        expect((await api("/key/generate", { body: { team_id: "team-a" }, key: as.member })).status).toBe(403);
        expect((await api("/key/update", { body: { key: teamKey.token, max_budget: 1 }, key: as.member })).status).toBe(403);
        expect((await api("/key/delete", { body: { keys: [teamKey.token] }, key: as.member })).status).toBe(403);
        // Its own team key too: the limits a team admin set on it are not the member's to lift.
        const ownTeamKey = await generate({ team_id: "team-a", user_id: "u-member", max_budget: 1, rpm_limit: 1 });
        expect((await api(`/key/info?key=${ownTeamKey.token}`, { key: as.member })).status).toBe(200);
        expect((await api("/key/update", { body: { key: ownTeamKey.token, max_budget: 1000, rpm_limit: 100000 }, key: as.member })).status).toBe(403);
        expect((await api("/key/delete", { body: { keys: [ownTeamKey.token] }, key: as.member })).status).toBe(403);
        const kept = await api(`/key/info?key=${ownTeamKey.token}`);
        expect([kept.body.info.max_budget, kept.body.info.rpm_limit, kept.body.info.deleted_at ?? null]).toEqual([1, 1, null]);
        // team-p grants generate, update, info, list (not block or delete).
        const made = await api("/key/generate", { body: { team_id: "team-p" }, key: as.pmember });
        issued.push(made.body.key);
        expect(made.status).toBe(200);
        // A member's own team key stays in the team: leaving it would shed the team's limits.
        expect((await api("/key/update", { body: { key: made.body.token, team_id: null }, key: as.pmember })).status).toBe(403);
        const pKey = await generate({ team_id: "team-p", user_id: "u-other" });
        expect((await api("/key/update", { body: { key: pKey.token, key_alias: uid("p-renamed") }, key: as.pmember })).status).toBe(200);
        // The permission to update keys is not the team admin's right to change their caps.
        expect((await api("/key/update", { body: { key: pKey.token, max_budget: 2 }, key: as.pmember })).status).toBe(403);
        expect((await api("/key/update", { body: { key: pKey.token, spend: 5 }, key: as.pmember })).status).toBe(403);
        expect((await api("/key/block", { body: { key: pKey.token }, key: as.pmember })).status).toBe(403);
        expect((await api("/key/delete", { body: { keys: [pKey.token] }, key: as.pmember })).status).toBe(403);
        expect((await api("/key/list?team_id=team-p&size=100", { key: as.pmember })).body.keys).toContain(pKey.token);
      });

      test("viewers read but never write", async () => {
        const k = await generate({ user_id: "u-other" });
        expect((await api(`/key/info?key=${k.token}`, { key: as.viewer })).status).toBe(200);
        expect((await api(`/key/info?key=${sha256("missing")}`, { key: as.viewer })).status).toBe(404);
        expect((await api("/key/list?user_id=u-other&size=100", { key: as.viewer })).body.keys).toContain(k.token);
        for (const viewer of [as.viewer, as.iviewer]) {
          expect((await api("/key/generate", { body: {}, key: viewer })).status).toBe(403);
          expect((await api("/key/update", { body: { key: k.token, max_budget: 1 }, key: viewer })).status).toBe(403);
          expect((await api("/key/delete", { body: { keys: [k.token] }, key: viewer })).status).toBe(403);
          expect((await api("/key/block", { body: { key: k.token }, key: viewer })).status).toBe(403);
          expect((await api(`/key/${k.token}/reset_spend`, { body: {}, key: viewer })).status).toBe(403);
        }
        expect((await api(`/key/info?key=${k.token}`, { key: as.iviewer })).status).toBe(403);
      });

      test("a proxy_admin user's key acts like the master key", async () => {
        const k = await generate({ user_id: "u-other" });
        expect((await api("/key/update", { body: { key: k.token, max_budget: 4 }, key: as.padmin })).status).toBe(200);
        expect((await api("/key/bulk_update", { body: { keys: [{ key: k.token, max_budget: 5 }] }, key: as.padmin })).body.successful_updates).toHaveLength(1);
      });
    });

    describe("audit trail", () => {
      test("every write leaves a row with before/after; no plaintext key in the audit log", async () => {
        const k = await generate({ key_alias: uid("audited"), max_budget: 1 });
        await api("/key/update", { body: { key: k.key, max_budget: 2 } });
        await api("/key/block", { body: { key: k.key } });
        await api(`/key/${k.key}/reset_spend`, { body: {} });
        const regen = await api("/key/regenerate", { body: { key: k.key } });
        issued.push(regen.body.key);
        await api("/key/delete", { body: { keys: [regen.body.key] } });
        const first = await api(`/audit/logs?table_name=virtual_keys&object_id=${k.token}`);
        const actions = first.body.audit_logs.map((l) => l.action).sort();
        expect(actions).toEqual(["blocked", "created", "spend_reset", "updated"]);
        const update = first.body.audit_logs.find((l) => l.action === "updated")!;
        expect(update.before_value?.max_budget).toBe(1);
        expect(update.updated_values?.max_budget).toBe(2);
        const second = await api(`/audit/logs?table_name=virtual_keys&object_id=${regen.body.token}`);
        expect(second.body.audit_logs.map((l) => l.action).sort()).toEqual(["deleted", "rotated"]);
        const rotated = second.body.audit_logs.find((l) => l.action === "rotated")!;
        expect(rotated.before_value?.token).toBe(k.token);
        expect(rotated.updated_values?.token).toBe(regen.body.token);
        // The value it replaced is named by its hash, which is no secret.
        expect(rotated.updated_values?.previous_token_hash).toBe(k.token);

        const rows = await db().execute(sql`select * from audit_log`);
        const text = JSON.stringify(rows);
        for (const plain of issued) expect(text).not.toContain(plain);
        expect(text).not.toContain(MASTER_KEY);
      });
    });

    describe("automatic rotation", () => {
      test("a due key gets a new token, the old value stops working, nothing logs a plaintext", async () => {
        const k = await generate({ key_alias: uid("auto"), auto_rotate: true, rotation_interval: "1s", max_budget: 3 });
        expect((await api("/key/health", { body: {}, key: k.key })).status).toBe(200);
        await Bun.sleep(1100);
        const rotated = await rotateDueKeys(db(), gw.host!.services.bus!, gw.log);
        expect(rotated).toBeGreaterThanOrEqual(1);
        expect((await api("/key/health", { body: {}, key: k.key })).status).toBe(401);
        const row = (await api(`/key/list?key_alias=${k.key_alias}&return_full_object=true`)).body.keys[0] as R;
        expect(row.token).not.toBe(k.token);
        expect(row.rotation_count).toBe(1);
        expect(row.max_budget).toBe(3);
        expect(Date.parse(row.key_rotation_at!)).toBeGreaterThan(Date.parse(row.last_rotation_at!));
        const line = gw.log.lines.find((l) => l.fields?.key_alias === k.key_alias);
        expect(line?.fields?.new_token).toBe(row.token);
        const logged = JSON.stringify(gw.log.lines);
        for (const plain of issued) expect(logged).not.toContain(plain);
        expect(logged).not.toMatch(/sk-[A-Za-z0-9_-]{32}/);
      });

      test("with a grace period the old value keeps working, and regenerating with it gives its owner a usable key", async () => {
        const k = await generate({ key_alias: uid("auto-grace"), auto_rotate: true, rotation_interval: "1s" });
        await Bun.sleep(1100);
        expect(await rotateDueKeys(db(), gw.host!.services.bus!, gw.log, Date.now(), 60_000)).toBeGreaterThanOrEqual(1);
        expect((await api("/key/health", { body: {}, key: k.key })).status).toBe(200);
        const regen = await api(`/key/${k.key}/regenerate`, { body: {} });
        expect(regen.status).toBe(200);
        issued.push(regen.body.key);
        expect((await api("/key/health", { body: {}, key: regen.body.key })).status).toBe(200);
        const line = gw.log.lines.find((l) => l.fields?.key_alias === k.key_alias);
        expect(Date.parse(String(line?.fields?.old_value_valid_until))).toBeGreaterThan(Date.now());
      });
    });

    test("no plaintext key is stored in any table", async () => {
      const tables = (await db().execute(sql`select table_name from information_schema.tables where table_schema = 'public'`)) as unknown;
      const names = JSON.stringify(tables).match(/"table_name":"([a-z_0-9]+)"/g)!.map((m) => m.slice(14, -1));
      expect(names).toContain("virtual_keys");
      let dump = "";
      for (const name of names) dump += JSON.stringify(await db().execute(sql.raw(`select * from "${name}"`)));
      expect(dump).toContain(sha256(issued[0]!));
      for (const plain of issued) expect(dump).not.toContain(plain);
    });
  });
}
