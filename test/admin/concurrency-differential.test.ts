// Concurrent management requests, as automation sends them (Terraform applying a plan, scripts,
// several admins at once), on both stores, seeded random (CONCURRENCY_SEED=<n> runs another set;
// every failure names the seed and the round). Each scenario fires a burst of requests with
// Promise.all, in a random order with random values, a few rounds each (more where the moment a
// race needs is short), and then checks what a user would notice:
// - no answer is a 5xx, and every refusal is the error envelope ({error: {message, type, param,
//   code}} with code the status);
// - the outcome is one a serial order of the same requests could give: one creation of an id or
//   an alias wins and the others are 400s; an object deleted twice is deleted once (the other call
//   gets what it gets after the first, and the audit trail has one row); an update racing a
//   deletion is a 200 (before it) or a 4xx (after it); updates of different fields of one object
//   are all kept (none lost to another's stale read); guaranteed keys written at once fit the
//   capacity together, as they would one after the other;
// - the state read back agrees: no duplicate members or users with one address, a deleted key
//   answers 401 on a model call, a regenerated key's old value stops working and the new one works
//   (unless a racing delete won), spend and budget are not moved by metadata races, and nothing
//   (member, key, team) is left attached to a deleted user, team or organization.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BACKENDS, type JsonReply, requestJson, requestOk, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { Random } from "../harness/random.ts";

const SEED = Number(process.env.CONCURRENCY_SEED || 20_261_127);
/** Rounds per scenario: each a new burst with new values and order. */
const ROUNDS = 4;
const CONFIG = {
  model_list: [
    { model_name: "chat-mock", svc_params: { model: "mock/chat" } },
    { model_name: "other-mock", svc_params: { model: "mock/other" } },
    // Capacity 100 rpm, for guaranteed_throughput keys.
    { model_name: "capped-mock", svc_params: { model: "mock/capped", rpm: 100 } },
  ],
  general_settings: { master_key: "sk-test-master-key" },
};

type Json = Record<string, unknown>;
type Reply = JsonReply<Json & { error?: { message: string; type: string; param: string | null; code: string } }>;

for (const backend of BACKENDS) {
  describe(`concurrent management requests (${backend}, CONCURRENCY_SEED=${SEED})`, () => {
    let gw: TestGateway;
    const rng = new Random(SEED + (backend === "postgres" ? 1 : 0));
    let serial = 0;
    const uniq = (p: string) => `${p}-${SEED}-${++serial}`;
    const where = (scenario: string, round: number, extra = "") => `CONCURRENCY_SEED=${SEED} ${backend} ${scenario} round ${round}${extra ? `: ${extra}` : ""}`;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_concurrency" });
    });
    afterAll(async () => {
      await gw?.stop();
    });

    const call = (method: string, path: string, body?: unknown, key?: string) => requestJson(gw, method, path, { body, key }) as Promise<Reply>;
    const post = (path: string, body: unknown) => call("POST", path, body);

    /** Every answer of a burst: no 5xx, and each refusal in the error envelope with its status as code. */
    function clean(replies: readonly Reply[], label: string): void {
      for (const r of replies) {
        expect(r.status, `${label}: ${r.text}`).toBeLessThan(500);
        if (r.status === 200) continue;
        expect(r.status, `${label}: ${r.text}`).toBeGreaterThanOrEqual(400);
        expect(r.body?.error?.code, `${label}: ${r.text}`).toBe(String(r.status));
        expect(typeof r.body?.error?.message, `${label}: ${r.text}`).toBe("string");
      }
    }

    /** The burst in a random order, all at once. */
    async function burst(calls: (() => Promise<Reply>)[], label: string): Promise<Reply[]> {
      const order = calls.map((_, i) => i).sort(() => rng.next() - 0.5);
      const replies: Reply[] = new Array(calls.length);
      await Promise.all(order.map(async (i) => (replies[i] = await calls[i]!())));
      clean(replies, label);
      return replies;
    }

    /** One request won (200) and every other was refused with `status`. */
    function oneWins(replies: readonly Reply[], label: string, status = 400): Reply {
      const won = replies.filter((r) => r.status === 200);
      expect(won.length, `${label}: ${replies.map((r) => `${r.status} ${r.text.slice(0, 200)}`).join(" | ")}`).toBe(1);
      for (const r of replies) if (r.status !== 200) expect(r.status, `${label}: ${r.text}`).toBe(status);
      return won[0]!;
    }

    /** A model call with a key: 200 when it is live, 401 when it is not. */
    const modelCall = async (key: string) =>
      (await requestJson(gw, "POST", "/v1/chat/completions", { key, body: { model: "chat-mock", messages: [{ role: "user", content: "hi" }] } })).status;

    const newKey = (body: Json = {}) => requestOk<Json & { key: string; token_id: string }>(gw, "POST", "/key/generate", body);
    const keyInfo = async (key: string) => (await requestOk<{ info: Json }>(gw, "GET", `/key/info?key=${encodeURIComponent(key)}`)).info;

    test("one custom key value, one alias: the first /key/generate wins, the others are 400s", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const n = 2 + rng.int(3);
        // Long enough for a custom key (20 characters after sk-) whatever the seed.
        const value = `sk-${uniq("custom-key-value")}`;
        const label = where("same key", round, `${n} requests`);
        const replies = await burst(
          Array.from({ length: n }, (_, i) => () => post("/key/generate", { key: value, ...(rng.chance(0.5) ? { key_alias: uniq(`a${i}`) } : {}) })),
          label,
        );
        oneWins(replies, label);
        expect(await modelCall(value), label).toBe(200);

        const alias = uniq("alias");
        const aliasLabel = where("same alias", round, `${n} requests`);
        const byAlias = await burst(
          Array.from({ length: n }, () => () => post("/key/generate", { key_alias: alias, max_budget: rng.pick([1, 5, 10]) })),
          aliasLabel,
        );
        const won = oneWins(byAlias, aliasLabel);
        const listed = await requestOk<{ keys: string[]; total_count: number }>(gw, "GET", `/key/list?key_alias=${encodeURIComponent(alias)}`);
        expect(listed.total_count, aliasLabel).toBe(1);
        expect(listed.keys, aliasLabel).toEqual([won.body.token_id as string]);
      }
    });

    test("concurrent /key/update of different fields of one key keeps every change; spend and budget unmoved", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const k = await newKey({ max_budget: 50, metadata: { start: round } });
        await requestOk(gw, "POST", "/key/update", { key: k.key, spend: 1.25 });
        // Each request sets one field (metadata and project_id both live in metadata: at most one of them per burst).
        const updates: Json[] = rng.some(
          [
            { rpm_limit: 10 + rng.int(100) },
            { tpm_limit: 1000 + rng.int(1000) },
            { models: rng.some(["chat-mock", "other-mock"], 2) },
            { key_alias: uniq("upd") },
            rng.pick<Json>([{ metadata: { team: `t${rng.int(9)}`, n: rng.int(99) } }, { project_id: uniq("proj") }]),
            { tags: [uniq("tag")] },
            { max_parallel_requests: 1 + rng.int(20) },
            { blocked: rng.chance(0.5) },
          ],
          8,
        );
        const label = where("key update", round, JSON.stringify(updates));
        const replies = await burst(
          updates.map((u) => () => post("/key/update", { key: k.key, ...u })),
          label,
        );
        for (const r of replies) expect(r.status, `${label}: ${r.text}`).toBe(200);
        const info = await keyInfo(k.key);
        for (const u of updates) {
          for (const [f, v] of Object.entries(u)) {
            if (f === "project_id") expect((info.metadata as Json).project_id, label).toBe(v);
            else expect(info[f], `${label}: ${f}`).toEqual(v);
          }
        }
        expect(info.spend, label).toBe(1.25);
        expect(info.max_budget, label).toBe(50);
      }
    });

    test("/key/update of metadata racing /key/update of project_id (kept in metadata): the result of one serial order", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const k = await newKey({ metadata: { start: round } });
        const metadata = { set: uniq("meta") };
        const project = uniq("proj");
        const label = where("metadata vs project_id", round);
        const replies = await burst([() => post("/key/update", { key: k.key, metadata }), () => post("/key/update", { key: k.key, project_id: project })], label);
        for (const r of replies) expect(r.status, `${label}: ${r.text}`).toBe(200);
        // metadata last: it replaces the whole object; project_id last: it is set over the new metadata.
        expect([metadata, { ...metadata, project_id: project }] as unknown[], label).toContainEqual((await keyInfo(k.key)).metadata);
      }
    });

    test("/key/update moving a key into a team racing /key/update, /key/bulk_update or /key/regenerate setting models the team forbids: one is refused, as in any serial order", async () => {
      for (let round = 0; round < (backend === "postgres" ? 10 : 6); round++) {
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("narrow"), models: ["chat-mock"] });
        const k = await newKey({ models: ["chat-mock"] });
        const how = rng.pick(["update", "bulk_update", "regenerate"] as const);
        const label = where("team move vs models", round, how);
        const setModels = () =>
          how === "update"
            ? post("/key/update", { key: k.key, models: ["other-mock"] })
            : how === "bulk_update"
              ? post("/key/bulk_update", { keys: [{ key: k.key, models: ["other-mock"] }] })
              : post("/key/regenerate", { key: k.key, models: ["other-mock"] });
        const [moved, modelsSet] = await burst([() => post("/key/update", { key: k.key, team_id: team.team_id }), setModels], label);
        const modelsWon = modelsSet!.status === 200 && (how !== "bulk_update" || (modelsSet!.body.successful_updates as unknown[]).length === 1);
        // Moved first, the models are refused (400); models first, the move is refused (400), or
        // finds the old value regenerated away (404).
        expect(moved!.status === 200 && modelsWon, `${label}: both succeeded: ${moved!.text} / ${modelsSet!.text}`).toBe(false);
        const inTeam = await requestOk<{ keys: { models: string[] }[] }>(gw, "GET", `/key/list?team_id=${team.team_id}&return_full_object=true`);
        for (const key of inTeam.keys) expect(key.models, `${label}: a key of the team has models it forbids`).toEqual(["chat-mock"]);
      }
    });

    test("concurrent /key/{key}/reset_spend to 0 and to 1.5 of a key that spent 2: each checked against the spend the other left, as in a serial order", async () => {
      for (let round = 0; round < (backend === "postgres" ? 10 : 6); round++) {
        const k = await newKey({ spend: 2 });
        const label = where("reset_spend race", round);
        const [toZero, toPart] = await burst([() => post(`/key/${k.key}/reset_spend`, { reset_to: 0 }), () => post(`/key/${k.key}/reset_spend`, { reset_to: 1.5 })], label);
        expect(toZero!.status, `${label}: ${toZero!.text}`).toBe(200);
        // To 0 first: to 1.5 is above the spend left (400). To 1.5 first: to 0 resets from 1.5.
        if (toPart!.status === 200) {
          expect(toPart!.body.previous_spend, `${label}: ${toPart!.text}`).toBe(2);
          expect(toZero!.body.previous_spend, `${label}: ${toZero!.text}`).toBe(1.5);
        } else {
          expect(toPart!.status, `${label}: ${toPart!.text}`).toBe(400);
          expect(toZero!.body.previous_spend, `${label}: ${toZero!.text}`).toBe(2);
        }
        expect((await keyInfo(k.key)).spend, label).toBe(0);
      }
    });

    test("a second concurrent delete of a team, user, organization, stored model, access group or membership is refused, not a second deletion", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const n = 2 + rng.int(2);
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("gone") });
        const tl = where("double team delete", round, `${n} requests`);
        oneWins(await burst(Array.from({ length: n }, () => () => post("/team/delete", { team_ids: [team.team_id] })), tl), tl, 404);
        const user = uniq("gone-user");
        await requestOk(gw, "POST", "/user/new", { user_id: user, auto_create_key: false });
        const ul = where("double user delete", round, `${n} requests`);
        oneWins(await burst(Array.from({ length: n }, () => () => post("/user/delete", { user_ids: [user] })), ul), ul, 404);
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("gone-org") });
        const ol = where("double organization delete", round, `${n} requests`);
        oneWins(await burst(Array.from({ length: n }, () => () => call("DELETE", "/organization/delete", { organization_ids: [org.organization_id] })), ol), ol, 404);
        const id = uniq("gone-model");
        await requestOk(gw, "POST", "/model/new", { model_name: uniq("gm"), svc_params: { model: "mock/gone" }, model_info: { id } });
        const ml = where("double model delete", round, `${n} requests`);
        oneWins(await burst(Array.from({ length: n }, () => () => post("/model/delete", { id })), ml), ml, 404);
        const group = await requestOk<{ access_group_id: string; access_group: string }>(gw, "POST", "/access_group/new", { access_group: uniq("gone-group"), model_names: ["chat-mock"] });
        const gl = where("double access group delete", round, `${n} requests`);
        oneWins(await burst(Array.from({ length: n }, () => () => call("DELETE", `/access_group/${group.access_group}/delete`)), gl), gl, 404);
        // Memberships: a second removal is what a removal of a non-member is (400 for a team, 404 for an organization).
        const teamUser = uniq("m-gone-user");
        const mteam = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("m-gone"), members_with_roles: [{ role: "user", user_id: teamUser }] });
        const tml = where("double team member_delete", round, `${n} requests`);
        oneWins(await burst(Array.from({ length: n }, () => () => post("/team/member_delete", { team_id: mteam.team_id, user_id: teamUser })), tml), tml, 400);
        const morg = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("m-gone-org") });
        const orgUser = uniq("m-gone-org-user");
        await requestOk(gw, "POST", "/organization/member_add", { organization_id: morg.organization_id, member: { role: "internal_user", user_id: orgUser } });
        const oml = where("double organization member_delete", round, `${n} requests`);
        oneWins(
          await burst(Array.from({ length: n }, () => () => call("DELETE", "/organization/member_delete", { organization_id: morg.organization_id, user_id: orgUser })), oml),
          oml,
          404,
        );
        for (const [table, objectId, label] of [
          ["teams", team.team_id, tl],
          ["users", user, ul],
          ["organizations", org.organization_id, ol],
          ["proxy_models", id, ml],
          ["access_groups", group.access_group_id, gl],
          ["team_members", `${mteam.team_id}:${teamUser}`, tml],
          ["org_members", `${morg.organization_id}:${orgUser}`, oml],
        ] as const) {
          const audit = await requestOk<{ audit_logs: unknown[] }>(gw, "GET", `/audit/logs?table_name=${table}&action=deleted&object_id=${objectId}`);
          expect(audit.audit_logs.length, `${label}: audit rows`).toBe(1);
        }
      }
    });

    test("an update racing the deletion of its object: a 200 that happened before it, or a 404, never a 5xx", async () => {
      // More rounds than the others: the moment an update can land in (after the deletion read the object, before it wrote) is short.
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("ud") });
        const member = uniq("ud-member");
        await requestOk(gw, "POST", "/team/member_add", { team_id: team.team_id, member: { role: "user", user_id: member } });
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("ud-org") });
        const orgMember = uniq("ud-org-member");
        await requestOk(gw, "POST", "/organization/member_add", { organization_id: org.organization_id, member: { role: "internal_user", user_id: orgMember } });
        const user = uniq("ud-user");
        await requestOk(gw, "POST", "/user/new", { user_id: user, auto_create_key: false });
        const budget = uniq("ud-budget");
        await requestOk(gw, "POST", "/budget/new", { budget_id: budget, max_budget: 5 });
        const pairs: [string, () => Promise<Reply>, () => Promise<Reply>][] = [
          [
            "team member_update vs member_delete",
            () => post("/team/member_update", { team_id: team.team_id, user_id: member, role: "admin", max_budget_in_team: rng.pick([1, 2]) }),
            () => post("/team/member_delete", { team_id: team.team_id, user_id: member }),
          ],
          [
            "organization member_update vs member_delete",
            () => call("PATCH", "/organization/member_update", { organization_id: org.organization_id, user_id: orgMember, role: "org_admin" }),
            () => call("DELETE", "/organization/member_delete", { organization_id: org.organization_id, user_id: orgMember }),
          ],
          ["user update vs delete", () => post("/user/update", { user_id: user, user_alias: uniq("alias") }), () => post("/user/delete", { user_ids: [user] })],
          [
            "organization update vs delete",
            () => call("PATCH", "/organization/update", { organization_id: org.organization_id, organization_alias: uniq("renamed") }),
            () => call("DELETE", "/organization/delete", { organization_ids: [org.organization_id] }),
          ],
          [
            "team update vs delete",
            () => post(rng.pick(["/team/update", "/team/block", "/team/permissions_update"]), { team_id: team.team_id, team_alias: uniq("late"), team_member_permissions: ["/key/info"] }),
            () => post("/team/delete", { team_ids: [team.team_id] }),
          ],
          ["budget update vs delete", () => post("/budget/update", { budget_id: budget, max_budget: 9 }), () => post("/budget/delete", { id: budget })],
        ];
        for (const [name, update, remove] of pairs) {
          const label = where("update vs delete", round, name);
          // Several updates: more of them land in the moment between the deletion's read and its write.
          const [removed, ...updates] = await burst([remove, update, update, update, update], label);
          expect(removed!.status, `${label}: ${removed!.text}`).toBe(200);
          for (const u of updates) {
            expect([200, 400, 404], `${label}: ${u.text}`).toContain(u.status);
            // A 200 came before the deletion: it shows the object as it was then, not deleted.
            const shown = (u.body?.data ?? u.body) as Json | null;
            if (u.status === 200 && shown && "deleted_at" in shown) expect(shown.deleted_at, `${label}: ${u.text}`).toBeNull();
          }
        }
      }
    });

    test("/key/generate for a user racing /user/delete of that user: no live key of a deleted user", async () => {
      // More rounds than the others: the moment a key can land in (after the deletion deleted the user's keys, before it deleted the user) is short.
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const user = uniq("doomed-user");
        await requestOk(gw, "POST", "/user/new", { user_id: user, auto_create_key: false, models: ["chat-mock"] });
        const label = where("key generate vs user delete", round);
        const [deleted, ...generated] = await burst(
          [() => post("/user/delete", { user_ids: [user] }), ...Array.from({ length: 4 }, () => () => post("/key/generate", { user_id: user }))],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        const exists = (await call("GET", `/user/info?user_id=${user}`)).status === 200;
        for (const g of generated) {
          expect(g.status, `${label}: ${g.text}`).toBe(200);
          // Generated before the deletion: deleted with the user. After it: the user is created again (as /key/generate does for a new user_id).
          if (await modelCall(g.body.key as string) === 200) expect(exists, `${label}: a live key of user ${user}, who does not exist`).toBe(true);
        }
      }
    });

    test("/key/update or /key/regenerate giving keys to a user racing /user/delete of that user: no live key of a deleted user", async () => {
      // More rounds than the others: the moment a key can land in (after the deletion's read of the user's keys, before it deleted the user) is short.
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const user = uniq("receiving-user");
        await requestOk(gw, "POST", "/user/new", { user_id: user, auto_create_key: false });
        const keys = await Promise.all(Array.from({ length: 6 }, () => newKey()));
        const regenerated = keys.map(() => rng.chance(0.5));
        const label = where("key update/regenerate vs user delete", round, regenerated.map((r) => (r ? "regenerate" : "update")).join(","));
        const [deleted, ...moved] = await burst(
          [
            () => post("/user/delete", { user_ids: [user] }),
            // Spread over the first milliseconds: on the embedded store, whose statements take turns, a key lands after the deletion's first statements.
            ...keys.map((k, i) => async () => {
              await Bun.sleep(i);
              return regenerated[i] ? post(`/key/${k.key}/regenerate`, { user_id: user }) : post("/key/update", { key: k.key, user_id: user });
            }),
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        const exists = (await call("GET", `/user/info?user_id=${user}`)).status === 200;
        for (const [i, m] of moved.entries()) {
          expect(m.status, `${label}: ${m.text}`).toBe(200);
          // Given before the deletion: deleted with the user. After it: the user is created again (as for any new user_id).
          const value = regenerated[i] ? (m.body.key as string) : keys[i]!.key;
          if ((await modelCall(value)) === 200) expect(exists, `${label}: a live key of user ${user}, who does not exist`).toBe(true);
        }
        const listed = await requestOk<{ total_count: number }>(gw, "GET", `/key/list?user_id=${user}`);
        if (!exists) expect(listed.total_count, `${label}: live keys listed for the deleted user ${user}`).toBe(0);
      }
    });

    test("/team/new or /key/generate in an organization racing /organization/delete: no team or key is left in a deleted organization", async () => {
      for (let round = 0; round < 2 * ROUNDS; round++) {
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("shrinking") });
        const label = where("team new vs organization delete", round);
        const [deleted, ...created] = await burst(
          [
            () => call("DELETE", "/organization/delete", { organization_ids: [org.organization_id] }),
            ...Array.from({ length: 3 }, (_, i) => () =>
              i === 0 ? post("/key/generate", { organization_id: org.organization_id }) : post("/team/new", { team_alias: uniq("late"), organization_id: org.organization_id }),
            ),
          ],
          label,
        );
        const live = created.filter((r) => r.status === 200);
        for (const r of created) if (r.status !== 200) expect(r.status, `${label}: ${r.text}`).toBe(400);
        // The organization is deleted only when it has no team or key: then none was created in it afterwards.
        if (deleted!.status === 200) expect(live.map((r) => r.body.team_id ?? r.body.token_id), `${label}: teams and keys of the deleted organization`).toEqual([]);
        else expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(400);
      }
    });

    test("/key/generate for members of an organization and /user/update into it racing /organization/delete: no deadlock (a 5xx), no key in the deleted organization", async () => {
      // A few dozen rounds on PostgreSQL: the deletion detaches the users a key write holds.
      for (let round = 0; round < (backend === "postgres" ? 30 : 4); round++) {
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("detaching") });
        const ids = [uniq("org-user"), uniq("org-user")];
        for (const user_id of ids) await requestOk(gw, "POST", "/user/new", { user_id, organization_id: org.organization_id, auto_create_key: false });
        const label = where("keys of organization members vs organization delete", round);
        const [deleted, ...written] = await burst(
          [
            () => call("DELETE", "/organization/delete", { organization_ids: [org.organization_id] }),
            ...ids.map((user_id, i) => async () => {
              await Bun.sleep(i);
              return post("/key/generate", { user_id, organization_id: org.organization_id });
            }),
            () => post("/user/update", { user_id: ids[0], organization_id: org.organization_id }),
          ],
          label,
        );
        for (const w of written) expect([200, 400], `${label}: ${w.text}`).toContain(w.status);
        // Refused while it has keys; deleted: every key came after it, and was refused.
        expect([200, 400], `${label}: ${deleted!.text}`).toContain(deleted!.status);
        if (deleted!.status === 200) for (const k of written.slice(0, 2)) expect(k.status, `${label}: a key in the deleted organization: ${k.text}`).toBe(400);
      }
    });

    test("/key/generate, /team/new or /organization/new on a budget object racing /budget/delete: nothing is left on a deleted budget", async () => {
      for (let round = 0; round < 2 * ROUNDS; round++) {
        const budget = uniq("shared-budget");
        await requestOk(gw, "POST", "/budget/new", { budget_id: budget, max_budget: 3 });
        const label = where("key/team vs budget delete", round);
        const [deleted, ...created] = await burst(
          [
            () => post("/budget/delete", { id: budget }),
            () => post("/team/new", { team_alias: uniq("b"), budget_id: budget }),
            () => post("/organization/new", { organization_alias: uniq("b"), budget_id: budget }),
            () => post("/key/generate", { budget_id: budget }),
            () => post("/key/generate", { budget_id: budget }),
          ],
          label,
        );
        for (const r of created) if (r.status !== 200) expect(r.status, `${label}: ${r.text}`).toBe(400);
        const live = created.filter((r) => r.status === 200);
        // The budget is deleted only when nothing uses it: then nothing was put on it afterwards.
        if (deleted!.status === 200) expect(live.map((r) => r.body.team_id ?? r.body.organization_id ?? r.body.token_id), `${label}: keys, teams and orgs on the deleted budget`).toEqual([]);
        else expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(400);
      }
    });

    test("/key/update or /key/regenerate putting keys on a budget object racing /budget/delete: no key is left on a deleted budget", async () => {
      for (let round = 0; round < 2 * ROUNDS; round++) {
        const budget = uniq("moving-budget");
        await requestOk(gw, "POST", "/budget/new", { budget_id: budget, max_budget: 3 });
        const keys = await Promise.all(Array.from({ length: 4 }, () => newKey()));
        const regenerated = keys.map(() => rng.chance(0.5));
        const label = where("key update/regenerate vs budget delete", round, regenerated.map((r) => (r ? "regenerate" : "update")).join(","));
        const [deleted, ...moved] = await burst(
          [
            () => post("/budget/delete", { id: budget }),
            // Spread over the first milliseconds, as for a user's deletion above.
            ...keys.map((k, i) => async () => {
              await Bun.sleep(i);
              return regenerated[i] ? post(`/key/${k.key}/regenerate`, { budget_id: budget }) : post("/key/update", { key: k.key, budget_id: budget });
            }),
          ],
          label,
        );
        for (const m of moved) expect([200, 400], `${label}: ${m.text}`).toContain(m.status);
        if (deleted!.status !== 200) {
          // Refused: a key was put on the budget first.
          expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(400);
          expect(moved.some((m) => m.status === 200), `${label}: ${deleted!.text}`).toBe(true);
          continue;
        }
        // Deleted: nothing was on it, so every key put on it came after and found it gone.
        for (const [i, m] of moved.entries()) {
          expect(m.status, `${label}: a key put on the deleted budget ${budget}: ${m.text}`).toBe(400);
          expect(m.body.error?.message, label).toBe(`Budget ${budget} does not exist.`);
          expect((await keyInfo(keys[i]!.key)).budget_id ?? null, label).toBeNull();
        }
      }
    });

    test("/team/member_add or /key/generate racing /team/delete: nothing of the team lives on", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("doomed") });
        const member = uniq("late-member");
        const label = where("team delete race", round);
        const [added, generated, deleted] = await burst(
          [
            () => post("/team/member_add", { team_id: team.team_id, member: { role: rng.pick(["user", "admin"]), user_id: member } }),
            () => post("/key/generate", { team_id: team.team_id }),
            () => post("/team/delete", { team_ids: [team.team_id] }),
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        for (const r of [added!, generated!]) expect([200, 400, 404], `${label}: ${r.text}`).toContain(r.status);
        const user = await requestOk<{ user_info: { teams: string[] } }>(gw, "GET", `/user/info?user_id=${member}`).catch(() => undefined);
        expect(user?.user_info.teams ?? [], `${label}: the member's teams`).not.toContain(team.team_id);
        if (generated!.status === 200) expect(await modelCall(generated!.body.key as string), `${label}: the team's key`).toBe(401);
        const keys = await requestOk<{ total_count: number }>(gw, "GET", `/key/list?team_id=${team.team_id}`);
        expect(keys.total_count, `${label}: live keys of the deleted team`).toBe(0);
      }
    });

    test("concurrent guaranteed_throughput keys on one model group: together they never reserve more than its capacity", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const n = 3 + rng.int(3);
        const rpm = rng.pick([30, 40, 60]);
        const guaranteed = { models: ["capped-mock"], rpm_limit: rpm, rpm_limit_type: "guaranteed_throughput" };
        // Some of them new keys, the others existing best-effort keys updated to guaranteed.
        const existing = await Promise.all(Array.from({ length: rng.int(n) }, () => newKey({ models: ["capped-mock"] })));
        const label = where("guaranteed capacity", round, `${n} keys (${existing.length} updated) of ${rpm} rpm on 100`);
        const replies = await burst(
          Array.from({ length: n }, (_, i) => () => (existing[i] ? post("/key/update", { key: existing[i]!.key, ...guaranteed }) : post("/key/generate", guaranteed))),
          label,
        );
        const won = replies.filter((r) => r.status === 200);
        for (const r of replies) if (r.status !== 200) expect(r.status, `${label}: ${r.text}`).toBe(400);
        // As one after the other: as many as fit, and the rest refused.
        expect(won.length, label).toBe(Math.min(n, Math.floor(100 / rpm)));
        await requestOk(gw, "POST", "/key/delete", { keys: [...existing.map((k) => k.token_id), ...replies.filter((r, i) => r.status === 200 && !existing[i]).map((r) => r.body.token_id)] });
      }
    });

    test("concurrent /key/regenerate making keys guaranteed_throughput on one model group: together they never reserve more than its capacity", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const n = 3 + rng.int(3);
        const rpm = rng.pick([30, 40, 60]);
        const guaranteed = { rpm_limit: rpm, rpm_limit_type: "guaranteed_throughput" };
        const keys = await Promise.all(Array.from({ length: n }, () => newKey({ models: ["capped-mock"] })));
        const label = where("guaranteed capacity by regenerate", round, `${n} keys of ${rpm} rpm on 100`);
        const replies = await burst(
          keys.map((k) => () => (rng.chance(0.5) ? post(`/key/${k.key}/regenerate`, guaranteed) : post("/key/regenerate", { key: k.key, ...guaranteed }))),
          label,
        );
        const won = replies.filter((r) => r.status === 200);
        for (const r of replies) if (r.status !== 200) expect(r.status, `${label}: ${r.text}`).toBe(400);
        // As one after the other: as many as fit, and the rest refused (and not rotated: their old values still work).
        expect(won.length, label).toBe(Math.min(n, Math.floor(100 / rpm)));
        for (const [i, r] of replies.entries()) if (r.status !== 200) expect((await keyInfo(keys[i]!.key)).rpm_limit_type ?? null, label).toBeNull();
        await requestOk(gw, "POST", "/key/delete", { keys: replies.map((r, i) => (r.status === 200 ? (r.body.token_id as string) : keys[i]!.token_id)) });
      }
    });

    test("/key/delete of one key, concurrently: deleted once (one 200, the others 404) and it answers 401", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const k = await newKey({ key_alias: uniq("del") });
        const n = 2 + rng.int(3);
        const label = where("double delete", round, `${n} requests`);
        const replies = await burst(
          Array.from({ length: n }, () => () => post("/key/delete", rng.chance(0.5) ? { keys: [rng.chance(0.5) ? k.key : k.token_id] } : { key_aliases: [k.key_alias] })),
          label,
        );
        oneWins(replies, label, 404);
        expect(await modelCall(k.key), label).toBe(401);
        const audit = await requestOk<{ audit_logs: unknown[] }>(gw, "GET", `/audit/logs?table_name=virtual_keys&action=deleted&object_id=${k.token_id}`);
        expect(audit.audit_logs.length, label).toBe(1);
      }
    });

    test("/key/update or /key/block racing /key/delete: the key ends deleted, and a 200 is an update before the deletion", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const k = await newKey();
        const change = rng.pick([
          { path: "/key/update", body: { key: k.key, rpm_limit: 7 } },
          { path: "/key/update", body: { key: k.key, metadata: { late: true } } },
          { path: "/key/block", body: { key: k.key } },
          { path: "/key/unblock", body: { key: k.key } },
        ]);
        const label = where("update vs delete", round, change.path);
        const [changed, deleted] = await burst([() => post(change.path, change.body), () => post("/key/delete", { keys: [k.key] })], label);
        expect(deleted!.status, label).toBe(200);
        expect([200, 404], `${label}: ${changed!.text}`).toContain(changed!.status);
        // A change that succeeded was applied to the live key (serially, before the deletion).
        if (changed!.status === 200) expect(changed!.body.deleted_at ?? null, `${label}: ${changed!.text}`).toBeNull();
        expect(await modelCall(k.key), label).toBe(401);
        const listed = await requestOk<{ keys: string[] }>(gw, "GET", `/key/list?status=deleted&key_hash=${k.token_id}`);
        expect(listed.keys, label).toEqual([k.token_id]);
      }
    });

    test("/key/regenerate racing /key/delete, /key/update, /key/block and itself: old value dead, new value as answered", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const k = await newKey({ max_budget: 20 });
        const others = rng.some(["delete", "update", "block", "regenerate"] as const, 3);
        const calls: (() => Promise<Reply>)[] = [() => post(`/key/${k.key}/regenerate`, {})];
        for (const o of others) {
          if (o === "delete") calls.push(() => post("/key/delete", { keys: [k.key] }));
          if (o === "update") calls.push(() => post("/key/update", { key: k.key, tpm_limit: 4321 }));
          if (o === "block") calls.push(() => post("/key/block", { key: k.key }));
          if (o === "regenerate") calls.push(() => post("/key/regenerate", { key: k.key }));
        }
        const label = where("regenerate race", round, others.join(", "));
        const replies = await burst(calls, label);
        const status = Object.fromEntries(others.map((o, i) => [o, replies[i + 1]!]));
        const regenerated = [replies[0]!, ...(status.regenerate ? [status.regenerate] : [])].filter((r) => r.status === 200);
        for (const r of replies) expect([200, 404], `${label}: ${r.text}`).toContain(r.status);
        expect(await modelCall(k.key), `${label}: the old value`).toBe(401);
        // One rotation at most: two would each hand out a value, and one of them could not work.
        expect(regenerated.length, label).toBeLessThanOrEqual(1);
        const deletedOk = status.delete?.status === 200;
        // Deleted (the key is gone whatever else happened) or regenerated: one of them, never neither.
        expect(deletedOk || regenerated.length === 1, `${label}: ${replies.map((r) => r.status).join(",")}`).toBe(true);
        const fresh = regenerated[0]?.body.key as string | undefined;
        if (fresh) {
          if (deletedOk) expect(await modelCall(fresh), `${label}: deleted after its rotation`).toBe(401);
          else {
            const blocked = status.block?.status === 200;
            expect(await modelCall(fresh), `${label}: the new value`).toBe(blocked ? 401 : 200);
            const info = await keyInfo(fresh);
            expect(info.max_budget, label).toBe(20);
            if (status.update?.status === 200) expect(info.tpm_limit, label).toBe(4321);
            expect(info.blocked, label).toBe(blocked);
          }
        }
      }
    });

    test("concurrent /team/member_add of one user: added once, no duplicate member", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("team") });
        const n = 2 + rng.int(3);
        const byEmail = rng.chance(0.5);
        const user = byEmail ? { user_email: `${uniq("m")}@example.com` } : { user_id: uniq("member") };
        if (rng.chance(0.5)) await requestOk(gw, "POST", "/user/new", { ...(byEmail ? user : user), auto_create_key: false });
        const label = where("member_add", round, `${n} requests, ${JSON.stringify(user)}`);
        const replies = await burst(
          Array.from({ length: n }, () => () => post("/team/member_add", { team_id: team.team_id, member: { role: rng.pick(["user", "admin"]), ...user } })),
          label,
        );
        oneWins(replies, label);
        const info = await requestOk<{ team_info: { members_with_roles: { user_id: string }[] } }>(gw, "GET", `/team/info?team_id=${team.team_id}`);
        expect(info.team_info.members_with_roles.length, label).toBe(1);
      }
    });

    test("concurrent /team/update of different fields and /team/model/add of different models keep every change", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("t"), models: ["chat-mock"], team_member_budget: 3 });
        const updates: Json[] = rng.some(
          [
            { team_alias: uniq("alias") },
            { max_budget: 100 + rng.int(100) },
            { rpm_limit: 10 + rng.int(10) },
            { team_member_rpm_limit: 1 + rng.int(9) },
            { team_member_tpm_limit: 100 + rng.int(900) },
            { team_member_key_duration: rng.pick(["1d", "7d", "30d"]) },
            { metadata: { n: rng.int(100) } },
            { tags: [uniq("tag")] },
          ],
          8,
        );
        const added = rng.some(["other-mock", "gpt-x", "claude-y", "openai/*"], 4);
        const label = where("team update", round, `${JSON.stringify(updates)} + models ${added.join(",")}`);
        const replies = await burst(
          [
            ...updates.map((u) => () => post("/team/update", { team_id: team.team_id, ...u })),
            ...added.map((m) => () => post("/team/model/add", { team_id: team.team_id, models: [m] })),
          ],
          label,
        );
        for (const r of replies) expect(r.status, `${label}: ${r.text}`).toBe(200);
        const info = (await requestOk<{ team_info: Json }>(gw, "GET", `/team/info?team_id=${team.team_id}`)).team_info;
        for (const u of updates) for (const [f, v] of Object.entries(u)) expect(info[f], `${label}: ${f}`).toEqual(v);
        expect(info.team_member_budget, `${label}: the setting nobody touched`).toBe(3);
        expect([...(info.models as string[])].sort(), label).toEqual(["chat-mock", ...added].sort());
      }
    });

    test("/user/new with one user_id or one e-mail, /user/update to one e-mail: one user per id and per address", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const n = 2 + rng.int(3);
        const id = uniq("user");
        const idLabel = where("user/new same id", round, `${n} requests`);
        oneWins(await burst(Array.from({ length: n }, () => () => post("/user/new", { user_id: id, auto_create_key: rng.chance(0.5) })), idLabel), idLabel);

        const email = `${uniq("same")}@example.com`;
        const emailLabel = where("user/new same e-mail", round, `${n} requests`);
        oneWins(
          await burst(
            Array.from({ length: n }, () => () => post("/user/new", { user_id: uniq("u"), user_email: rng.chance(0.5) ? email : email.toUpperCase(), auto_create_key: false })),
            emailLabel,
          ),
          emailLabel,
        );

        // Other users taking one new address at once (by /user/update, or one of them by /user/new).
        const target = `${uniq("moved")}@example.com`;
        const ids = [uniq("u"), uniq("u")];
        for (const u of ids) await requestOk(gw, "POST", "/user/new", { user_id: u, auto_create_key: false });
        const moveLabel = where("user/update same e-mail", round);
        const calls = ids.map((u) => () => post("/user/update", { user_id: u, user_email: target }));
        if (rng.chance(0.5)) calls.push(() => post("/user/new", { user_id: uniq("u"), user_email: target, auto_create_key: false }));
        oneWins(await burst(calls, moveLabel), moveLabel);
        const listed = await requestOk<{ users: { user_email: string }[] }>(gw, "GET", `/user/list?user_email=${encodeURIComponent(target)}`);
        expect(listed.users.length, moveLabel).toBe(1);
      }
    });

    test("/budget/new, /organization/new and /model/new with one id: one wins, the others are 400s", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const n = 2 + rng.int(3);
        const budgetId = uniq("budget");
        const bl = where("budget/new", round, `${n} requests`);
        oneWins(await burst(Array.from({ length: n }, () => () => post("/budget/new", { budget_id: budgetId, max_budget: rng.pick([1, 2, 3]) })), bl), bl);

        const orgId = uniq("org");
        const ol = where("organization/new", round, `${n} requests`);
        oneWins(await burst(Array.from({ length: n }, () => () => post("/organization/new", { organization_id: orgId, organization_alias: uniq("o"), max_budget: 10 })), ol), ol);
        const orgs = await requestOk<unknown[]>(gw, "GET", `/organization/list?org_id=${orgId}`);
        expect(orgs.length, ol).toBe(1);

        const modelId = uniq("model");
        const ml = where("model/new", round, `${n} requests`);
        oneWins(
          await burst(Array.from({ length: n }, () => () => post("/model/new", { model_name: uniq("stored"), svc_params: { model: "mock/stored" }, model_info: { id: modelId } })), ml),
          ml,
        );
      }
    });

    test("concurrent /organization/member_add of one user: added once, the others are 400s", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("org") });
        const n = 2 + rng.int(3);
        const byEmail = rng.chance(0.5);
        const member = byEmail ? { user_email: `${uniq("om")}@example.com` } : { user_id: uniq("orgmember") };
        if (rng.chance(0.5)) await requestOk(gw, "POST", "/user/new", { ...member, auto_create_key: false });
        const label = where("organization/member_add", round, `${n} requests, ${JSON.stringify(member)}`);
        const replies = await burst(
          Array.from({ length: n }, () => () => post("/organization/member_add", { organization_id: org.organization_id, member: { role: "internal_user", ...member } })),
          label,
        );
        oneWins(replies, label);
        const [info] = await requestOk<{ members: { user_id: string }[] }[]>(gw, "GET", `/organization/list?org_id=${org.organization_id}`);
        expect(info!.members.length, label).toBe(1);
        if (byEmail) {
          const users = await requestOk<{ users: unknown[] }>(gw, "GET", `/user/list?user_email=${encodeURIComponent(member.user_email!)}`);
          expect(users.users.length, `${label}: users with the address`).toBe(1);
        }
      }
    });

    test("concurrent PATCH /model/{id}/update of different fields keeps every change", async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const id = uniq("patched");
        await requestOk(gw, "POST", "/model/new", { model_name: uniq("pm"), svc_params: { model: "mock/patched" }, model_info: { id } });
        const patches: Json[] = rng.some(
          [
            { svc_params: { rpm: 10 + rng.int(90) } },
            { svc_params: { tpm: 1000 + rng.int(9000) } },
            { model_info: { tier: rng.pick(["a", "b"]) } },
            { model_info: { team: uniq("mt") } },
          ],
          4,
        );
        const label = where("model patch", round, JSON.stringify(patches));
        const replies = await burst(
          patches.map((p) => () => call("PATCH", `/model/${id}/update`, p)),
          label,
        );
        for (const r of replies) expect(r.status, `${label}: ${r.text}`).toBe(200);
        const info = await requestOk<{ data: { model_info: Json; svc_params: Json }[] }>(gw, "GET", `/model/info?svc_model_id=${id}`);
        const model = info.data.find((m) => m.model_info.id === id);
        expect(model, label).toBeDefined();
        for (const p of patches) {
          if (p.svc_params) for (const [f, v] of Object.entries(p.svc_params as Json)) expect(model!.svc_params[f], `${label}: ${f}`).toEqual(v);
          if (p.model_info) for (const [f, v] of Object.entries(p.model_info as Json)) expect(model!.model_info[f], `${label}: ${f}`).toEqual(v);
        }
      }
    });

    /** The user's teams and organization as /user/info shows them; undefined when the user does not exist. */
    const userInfo = async (userId: string) => {
      const r = await call("GET", `/user/info?user_id=${encodeURIComponent(userId)}`);
      if (r.status === 404) return undefined;
      expect(r.status, r.text).toBe(200);
      return (r.body as { user_info: { teams: string[]; organization_id: string | null } }).user_info;
    };

    test("/user/new joining a team racing /team/delete: no user is left a member of the deleted team", async () => {
      // More rounds than the others: the moment a user can land in (after the deletion ended the team's memberships, before it wrote) is short.
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("joined") });
        const other = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("kept") });
        const ids = Array.from({ length: 4 }, () => uniq("joining"));
        // Sometimes both teams, in an order other than their ids'.
        const doomed = rng.chance(0.5) ? [other.team_id, team.team_id] : [team.team_id];
        const label = where("user new vs team delete", round, `${doomed.length} deleted`);
        const [deleted, ...created] = await burst(
          [
            () => post("/team/delete", { team_ids: doomed }),
            // Spread over the first milliseconds, as for a user's deletion above; by teams (with another team) or by the key's team_id.
            ...ids.map((user_id, i) => async () => {
              await Bun.sleep(i);
              return i % 2 === 0
                ? post("/user/new", { user_id, teams: rng.chance(0.5) ? [team.team_id, other.team_id] : [{ team_id: team.team_id, user_role: "admin" }], auto_create_key: false })
                : post("/user/new", { user_id, team_id: team.team_id, auto_create_key: rng.chance(0.5) });
            }),
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        for (const [i, c] of created.entries()) {
          // Refused: it came after the deletion and found no team; nothing of it was kept.
          if (c.status !== 200) {
            expect(c.status, `${label}: ${c.text}`).toBe(400);
            expect(await userInfo(ids[i]!), `${label}: a refused /user/new left its user`).toBeUndefined();
            continue;
          }
          // Created before the deletion: the deletion ended its memberships.
          const teams = (await userInfo(ids[i]!))?.teams;
          for (const t of doomed) expect(teams, `${label}: user ${ids[i]} of the deleted team ${t}`).not.toContain(t);
        }
        for (const t of doomed) {
          const members = await requestOk<{ total: number }>(gw, "GET", `/user/list?team_id=${t}`);
          expect(members.total, `${label}: users listed in the deleted team ${t}`).toBe(0);
        }
      }
    });

    test("/user/new or /user/update into an organization racing /organization/delete: no user is left in the deleted organization", async () => {
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("leaving") });
        const existing = [uniq("moving"), uniq("moving")];
        for (const user_id of existing) await requestOk(gw, "POST", "/user/new", { user_id, auto_create_key: false });
        const fresh = [uniq("arriving"), uniq("arriving")];
        const ids = rng.chance(0.5) ? [...existing, ...fresh] : [...fresh, ...existing];
        const label = where("user new/update vs organization delete", round, ids.map((id) => (existing.includes(id) ? "update" : "new")).join(","));
        const [deleted, ...written] = await burst(
          [
            () => call("DELETE", "/organization/delete", { organization_ids: [org.organization_id] }),
            ...ids.map((user_id, i) => async () => {
              await Bun.sleep(i);
              return existing.includes(user_id)
                ? post("/user/update", { user_id, organization_id: org.organization_id })
                : post("/user/new", { user_id, organization_id: org.organization_id, auto_create_key: false });
            }),
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        for (const [i, w] of written.entries()) {
          expect([200, 400], `${label}: ${w.text}`).toContain(w.status);
          if (w.status === 400) expect(w.body.error?.message, label).toBe(`Organization ${org.organization_id} does not exist.`);
          // Written before the deletion: it detached the user. After it: refused. Never in the deleted organization.
          const info = await userInfo(ids[i]!);
          expect(info === undefined, `${label}: ${ids[i]}`).toBe(w.status !== 200 && fresh.includes(ids[i]!));
          if (info) expect(info.organization_id ?? null, `${label}: user ${ids[i]} in the deleted organization`).toBeNull();
        }
      }
    });

    test("/team/member_add, /team/bulk_member_add or /team/new with a member racing /user/delete of that user: no member that does not exist", async () => {
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const user = uniq("leaving-member");
        await requestOk(gw, "POST", "/user/new", { user_id: user, auto_create_key: false });
        const teams = await Promise.all(Array.from({ length: 2 }, () => requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("admitting") })));
        const label = where("member add vs user delete", round);
        const [deleted, added, bulk, created] = await burst(
          [
            () => post("/user/delete", { user_ids: [user] }),
            () => post("/team/member_add", { team_id: teams[0]!.team_id, member: { role: rng.pick(["user", "admin"]), user_id: user } }),
            async () => {
              await Bun.sleep(1);
              return post("/team/bulk_member_add", { team_id: teams[1]!.team_id, members: [{ role: "admin", user_id: user }] });
            },
            async () => {
              await Bun.sleep(2);
              return post("/team/new", { team_alias: uniq("with-member"), members_with_roles: [{ role: "admin", user_id: user }] });
            },
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        for (const r of [added!, bulk!, created!]) expect(r.status, `${label}: ${r.text}`).toBe(200);
        expect((bulk!.body as { successful_additions: number }).successful_additions, `${label}: ${bulk!.text}`).toBe(1);
        // Added before the deletion: it ended the membership with the user. After it: the user is created again (as for anyone a team admits who does not exist).
        const info = await userInfo(user);
        for (const teamId of [teams[0]!.team_id, teams[1]!.team_id, created!.body.team_id as string]) {
          const t = await requestOk<{ team_info: { members_with_roles: { user_id: string }[] } }>(gw, "GET", `/team/info?team_id=${teamId}`);
          const member = t.team_info.members_with_roles.some((m) => m.user_id === user);
          if (member) expect(info, `${label}: team ${teamId} has member ${user}, who does not exist`).toBeDefined();
          if (info) expect(info.teams.includes(teamId), `${label}: team ${teamId}`).toBe(member);
        }
      }
    });

    test("/team/member_add or /organization/member_add of several users racing /user/delete of them: no deadlock (a 5xx), no member that does not exist", async () => {
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const ids = Array.from({ length: 3 }, () => uniq("several"));
        for (const user_id of ids) await requestOk(gw, "POST", "/user/new", { user_id, auto_create_key: false });
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("several") });
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("several") });
        // In an order other than the deletion's.
        const order = [...ids].reverse();
        const label = where("several members vs user delete", round);
        const [deleted, ...added] = await burst(
          [
            () => post("/user/delete", { user_ids: ids }),
            () => post("/team/member_add", { team_id: team.team_id, member: order.map((user_id) => ({ role: "user", user_id })) }),
            () => post("/organization/member_add", { organization_id: org.organization_id, member: order.map((user_id) => ({ role: "internal_user", user_id })) }),
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        for (const a of added) expect(a.status, `${label}: ${a.text}`).toBe(200);
        const t = await requestOk<{ team_info: { members_with_roles: { user_id: string }[] } }>(gw, "GET", `/team/info?team_id=${team.team_id}`);
        const [o] = await requestOk<{ members: { user_id: string }[] }[]>(gw, "GET", `/organization/list?org_id=${org.organization_id}`);
        for (const m of [...t.team_info.members_with_roles, ...o!.members]) expect(await userInfo(m.user_id), `${label}: member ${m.user_id} does not exist`).toBeDefined();
      }
    });

    test("/team/member_add, /team/bulk_member_add, /organization/member_add and /user/new by e-mail racing /user/delete of those users: no deadlock (a 5xx), one user per address, no member that does not exist", async () => {
      // A few dozen rounds on PostgreSQL: a deadlock needs two calls to each hold a user the other waits for.
      for (let round = 0; round < (backend === "postgres" ? 30 : 6); round++) {
        const ids = Array.from({ length: 4 }, () => uniq("mailed")).sort();
        const mail = (id: string) => `${id}@Example.com`;
        for (const user_id of ids) await requestOk(gw, "POST", "/user/new", { user_id, user_email: mail(user_id), auto_create_key: false });
        const fresh = [uniq("fresh"), uniq("fresh")].map((p) => `${p}@example.com`);
        const teams = await Promise.all(Array.from({ length: 3 }, () => requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("mailing") })));
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("mailing") });
        // The addresses in an order other than the users' ids (the deletion's), and each call in another.
        const down = [...ids].reverse().map(mail);
        const up = ids.map(mail);
        const members = (emails: string[]) => emails.map((user_email) => ({ role: "user", user_email }));
        const label = where("members by e-mail vs user delete", round);
        const [deleted, ...added] = await burst(
          [
            () => post("/user/delete", { user_ids: ids }),
            () => post("/team/member_add", { team_id: teams[0]!.team_id, member: members([...down, ...fresh]) }),
            () => post("/team/member_add", { team_id: teams[1]!.team_id, member: members([...fresh].reverse().concat(up)) }),
            () => post("/team/bulk_member_add", { team_id: teams[2]!.team_id, members: members([fresh[1]!, ...up]) }),
            () => post("/organization/member_add", { organization_id: org.organization_id, member: [...down, fresh[0]!].map((user_email) => ({ role: "internal_user", user_email })) }),
            () => post("/user/new", { user_email: fresh[0]!.toUpperCase(), teams: [teams[0]!.team_id], auto_create_key: false }),
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        // A 400 only where another call created the address's user first.
        for (const a of added) expect([200, 400], `${label}: ${a.text}`).toContain(a.status);
        const userNew = added[4]!;
        if (userNew.status === 400) expect(userNew.body.error?.message, label).toContain("already exists");
        // One user per address, and every member's user exists.
        const emails = [...up, ...fresh].map((e) => e.toLowerCase());
        const listed = await requestOk<{ users: { user_id: string; user_email: string | null }[] }>(gw, "GET", "/user/list?page_size=100&sort_by=created_at&sort_order=desc");
        for (const e of emails) expect(listed.users.filter((u) => u.user_email?.toLowerCase() === e).length, `${label}: users with ${e}`).toBeLessThanOrEqual(1);
        for (const t of teams) {
          const info = await requestOk<{ team_info: { members_with_roles: { user_id: string }[] } }>(gw, "GET", `/team/info?team_id=${t.team_id}`);
          for (const m of info.team_info.members_with_roles) expect(await userInfo(m.user_id), `${label}: member ${m.user_id} of ${t.team_id} does not exist`).toBeDefined();
        }
        const [o] = await requestOk<{ members: { user_id: string }[] }[]>(gw, "GET", `/organization/list?org_id=${org.organization_id}`);
        for (const m of o!.members) expect(await userInfo(m.user_id), `${label}: member ${m.user_id} of the organization does not exist`).toBeDefined();
      }
    });

    test("/organization/member_add racing /organization/delete: no membership of a deleted organization", async () => {
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const orgId = uniq("closing-org");
        await requestOk(gw, "POST", "/organization/new", { organization_id: orgId, organization_alias: uniq("closing") });
        const existing = uniq("org-joiner");
        await requestOk(gw, "POST", "/user/new", { user_id: existing, auto_create_key: false });
        const fresh = [uniq("org-newcomer"), uniq("org-newcomer")];
        const label = where("organization member_add vs delete", round);
        const [deleted, ...added] = await burst(
          [
            () => call("DELETE", "/organization/delete", { organization_ids: [orgId] }),
            ...[existing, ...fresh].map((user_id, i) => async () => {
              await Bun.sleep(i);
              return post("/organization/member_add", { organization_id: orgId, member: { role: rng.pick(["org_admin", "internal_user"]), user_id } });
            }),
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        for (const a of added) {
          expect([200, 404], `${label}: ${a.text}`).toContain(a.status);
          if (a.status === 404) expect(a.body.error?.message, label).toBe(`Organization '${orgId}' not found.`);
        }
        // A new user it created is not left in the deleted organization.
        for (const id of fresh) expect((await userInfo(id))?.organization_id ?? null, `${label}: user ${id} in the deleted organization`).toBeNull();
        // An organization created again with the id starts with no members (none left over from the deleted one).
        await requestOk(gw, "POST", "/organization/new", { organization_id: orgId, organization_alias: uniq("reopened") });
        const [again] = await requestOk<{ members: { user_id: string }[] }[]>(gw, "GET", `/organization/list?org_id=${orgId}`);
        expect(again!.members.map((m) => m.user_id), `${label}: members of the deleted organization`).toEqual([]);
      }
    });

    test("/organization/member_add racing /user/delete of the member: no member that does not exist", async () => {
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const org = await requestOk<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: uniq("keeping") });
        const user = uniq("org-leaver");
        const email = `${user}@example.com`;
        await requestOk(gw, "POST", "/user/new", { user_id: user, user_email: email, auto_create_key: false });
        const byEmail = rng.chance(0.5);
        const label = where("organization member_add vs user delete", round, byEmail ? "by e-mail" : "by id");
        const [deleted, added] = await burst(
          [
            () => post("/user/delete", { user_ids: [user] }),
            async () => {
              await Bun.sleep(rng.int(3));
              return post("/organization/member_add", { organization_id: org.organization_id, member: { role: "internal_user", ...(byEmail ? { user_email: email } : { user_id: user }) } });
            },
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        expect(added!.status, `${label}: ${added!.text}`).toBe(200);
        // Added before the deletion: it ended the membership. After it: the member's user is created again (as for a member who does not exist).
        const [info] = await requestOk<{ members: { user_id: string }[] }[]>(gw, "GET", `/organization/list?org_id=${org.organization_id}`);
        for (const m of info!.members) expect(await userInfo(m.user_id), `${label}: member ${m.user_id} does not exist`).toBeDefined();
      }
    });

    test("a team admin's /key/generate or /key/update for a member racing /team/member_delete of that member: no live team key of a non-member", async () => {
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const admin = uniq("team-admin");
        const member = uniq("removed-member");
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", {
          team_alias: uniq("managed"),
          members_with_roles: [
            { role: "admin", user_id: admin },
            { role: "user", user_id: member },
          ],
        });
        // A Team Management Key: the team admin's key in the team.
        const adminKey = (await newKey({ team_id: team.team_id, user_id: admin })).key;
        const own = await Promise.all(Array.from({ length: 2 }, () => newKey({ team_id: team.team_id, user_id: admin })));
        const label = where("team admin key for member vs member_delete", round);
        const [removed, ...written] = await burst(
          [
            () => post("/team/member_delete", { team_id: team.team_id, user_id: member }),
            ...[0, 1, 2, 3].map((i) => async () => {
              await Bun.sleep(i);
              return i < 2
                ? call("POST", "/key/generate", { team_id: team.team_id, user_id: member }, adminKey)
                : call("POST", "/key/update", { key: own[i - 2]!.key, user_id: member }, adminKey);
            }),
          ],
          label,
        );
        expect(removed!.status, `${label}: ${removed!.text}`).toBe(200);
        for (const w of written) expect([200, 403], `${label}: ${w.text}`).toContain(w.status);
        // Written before the removal: deleted with the membership. After it: refused.
        const listed = await requestOk<{ keys: string[] }>(gw, "GET", `/key/list?team_id=${team.team_id}&user_id=${member}`);
        expect(listed.keys, `${label}: live keys in team ${team.team_id} of ${member}, no longer a member`).toEqual([]);
        for (const g of written.slice(0, 2)) if (g.status === 200) expect(await modelCall(g.body.key as string), `${label}: a key made for the removed member`).toBe(401);
      }
    });

    test("team admins removing each other while a proxy admin demotes one and both keep writing: no deadlock (a 5xx), each write a 200 or refused, one removal wins", async () => {
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const [a, b, member] = [uniq("admin-a"), uniq("admin-b"), uniq("member")];
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", {
          team_alias: uniq("quarrel"),
          models: ["chat-mock"],
          members_with_roles: [
            { role: "admin", user_id: a },
            { role: "admin", user_id: b },
            { role: "user", user_id: member },
          ],
        });
        const keyOf = { [a]: (await newKey({ team_id: team.team_id, user_id: a })).key, [b]: (await newKey({ team_id: team.team_id, user_id: b })).key };
        const writes = (self: string) => [
          () => call("POST", "/key/generate", { team_id: team.team_id, user_id: member }, keyOf[self]),
          () => call("POST", "/team/model/add", { team_id: team.team_id, models: [uniq("m")] }, keyOf[self]),
          () => call("POST", "/team/member_add", { team_id: team.team_id, member: { role: "user", user_id: uniq("joiner") } }, keyOf[self]),
          () => call("POST", "/team/member_update", { team_id: team.team_id, user_id: member, max_budget_in_team: 5 }, keyOf[self]),
        ];
        const label = where("team admins removing each other", round);
        const [aRemovesB, bRemovesA, demoted, ...written] = await burst(
          [
            () => call("POST", "/team/member_delete", { team_id: team.team_id, user_id: b }, keyOf[a]),
            () => call("POST", "/team/member_delete", { team_id: team.team_id, user_id: a }, keyOf[b]),
            () => post("/team/member_update", { team_id: team.team_id, user_id: a, role: "user" }),
            ...[...writes(a), ...writes(b)].map((w, i) => async () => {
              await Bun.sleep(i % 4);
              return w();
            }),
          ],
          label,
        );
        // One removal came first. The removed admin's key in the team went with the membership,
        // so what it sent after that is refused as a key that no longer exists (401), the rest 403.
        const winner = aRemovesB!.status === 200 ? a : b;
        const loserRemoval = winner === a ? bRemovesA! : aRemovesB!;
        expect(aRemovesB!.status === 200 || bRemovesA!.status === 200, `${label}: ${aRemovesB!.text} / ${bRemovesA!.text}`).toBe(true);
        expect([401, 403], `${label}: ${loserRemoval.text}`).toContain(loserRemoval.status);
        written.forEach((r, i) => {
          const by = i < 4 ? a : b;
          expect(by === winner ? [200, 403] : [200, 401, 403], `${label}: ${r.text}`).toContain(r.status);
        });
        // Demoting a that b removed first: not a member any more.
        expect([200, 400], `${label}: ${demoted!.text}`).toContain(demoted!.status);
        const info = await requestOk<{ team_info: { members_with_roles: { user_id: string; role: string }[] } }>(gw, "GET", `/team/info?team_id=${team.team_id}`);
        const admins = info.team_info.members_with_roles.filter((m) => m.role === "admin").map((m) => m.user_id);
        expect(admins.length, `${label}: ${JSON.stringify(admins)}`).toBeLessThanOrEqual(1);
      }
    });

    test("a team admin's writes for a member racing /user/delete of the member and of the admin, and /team/member_delete of the member: no deadlock (a 5xx), no live key or membership of a deleted user", async () => {
      for (let round = 0; round < (backend === "postgres" ? 30 : 6); round++) {
        const [admin, member] = [uniq("doomed-admin"), uniq("doomed-member")];
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", {
          team_alias: uniq("doomed"),
          members_with_roles: [
            { role: "admin", user_id: admin },
            { role: "user", user_id: member },
          ],
        });
        const adminKey = (await newKey({ team_id: team.team_id, user_id: admin })).key;
        const own = await newKey({ team_id: team.team_id, user_id: admin });
        const deleteAdmin = rng.chance(0.5);
        const label = where("team admin writes vs user delete", round, deleteAdmin ? "admin and member deleted" : "member deleted");
        const [deleted, removed, ...written] = await burst(
          [
            () => post("/user/delete", { user_ids: deleteAdmin ? [admin, member] : [member] }),
            () => post("/team/member_delete", { team_id: team.team_id, user_id: member }),
            ...[0, 1, 2, 3, 4].map((i) => async () => {
              await Bun.sleep(i % 3);
              if (i === 0) return call("POST", "/key/generate", { team_id: team.team_id, user_id: member }, adminKey);
              if (i === 1) return call("POST", "/key/generate", { team_id: team.team_id }, adminKey);
              if (i === 2) return call("POST", "/key/update", { key: own.key, user_id: member }, adminKey);
              if (i === 3) return call("POST", "/team/member_update", { team_id: team.team_id, user_id: member, max_budget_in_team: 3 }, adminKey);
              return call("POST", "/team/member_add", { team_id: team.team_id, member: { role: "user", user_id: uniq("late") } }, adminKey);
            }),
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        expect([200, 400], `${label}: ${removed!.text}`).toContain(removed!.status);
        // Refused: the member (or the admin) was gone; a 401 when the admin's own key went with it first.
        for (const w of written) expect([200, 400, 401, 403, 404], `${label}: ${w.text}`).toContain(w.status);
        const listed = await requestOk<{ keys: string[] }>(gw, "GET", `/key/list?team_id=${team.team_id}&user_id=${member}`);
        expect(listed.keys, `${label}: live keys of the deleted member`).toEqual([]);
        const info = await requestOk<{ team_info: { members_with_roles: { user_id: string }[] } }>(gw, "GET", `/team/info?team_id=${team.team_id}`);
        for (const m of info.team_info.members_with_roles) expect(await userInfo(m.user_id), `${label}: member ${m.user_id} does not exist`).toBeDefined();
      }
    });

    test("POST /team/{id}/callback or disable_logging racing /team/delete: a 200 came before the deletion, nothing is written to the deleted team", async () => {
      for (let round = 0; round < 3 * ROUNDS; round++) {
        const team = await requestOk<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: uniq("logging") });
        const label = where("team callback vs delete", round);
        const [deleted, ...written] = await burst(
          [
            () => post("/team/delete", { team_ids: [team.team_id] }),
            ...Array.from({ length: 4 }, (_, i) => async () => {
              await Bun.sleep(i);
              return rng.chance(0.25)
                ? post(`/team/${team.team_id}/disable_logging`, {})
                : post(`/team/${team.team_id}/callback`, { callbacks: [{ callback_type: "webhook", url: `https://hooks.example.com/${uniq("in")}` }] });
            }),
          ],
          label,
        );
        expect(deleted!.status, `${label}: ${deleted!.text}`).toBe(200);
        for (const w of written) expect([200, 404], `${label}: ${w.text}`).toContain(w.status);
        const gone = await requestOk<{ teams: { updated_at: string; deleted_at: string }[] }>(gw, "GET", `/v2/team/list?status=deleted&team_id=${team.team_id}`);
        // The deletion was the deleted team's last write.
        expect(gone.teams.map((t) => t.updated_at), `${label}: the deleted team was written after its deletion`).toEqual(gone.teams.map((t) => t.deleted_at));
      }
    });
  });
}
