// The master key's user is `default_user_id` (LiteLLM's name): keys it creates record it as
// created_by. A team admin that added a member of that id and gave it a key held the master key's
// identity: its `/key/list?include_created_by_keys=true` listed every key the master key had made,
// in every team. No user, member or key owner may have that id now; a user row of it made before
// (kept) does not list the master key's keys either.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { BACKENDS, requestJson, startBackendGateway } from "../harness/gateway.ts";
import { PRICED_CHAT } from "../harness/traffic.ts";

const MASTER_USER = "default_user_id";

interface ErrorBody {
  error: { message: string; type: string; param: string | null };
}

for (const backend of BACKENDS) {
  describe(`the master key's user id (${backend})`, () => {
    let gw: Awaited<ReturnType<typeof startBackendGateway>>;
    let teamAdminKey: string;
    let othersToken: string;
    const team = `t-master-id-${backend}`;
    const must = async (path: string, body: unknown, key?: string) => {
      const r = await requestJson<Record<string, unknown>>(gw, "POST", path, { body, key });
      if (r.status !== 200) throw new Error(`${path}: ${r.status} ${JSON.stringify(r.body)}`);
      return r.body;
    };
    const refused = async (path: string, body: unknown, param: string, key?: string) => {
      const r = await requestJson<ErrorBody>(gw, "POST", path, { body, key });
      expect(r.status).toBe(400);
      expect(r.body.error).toMatchObject({ type: "invalid_request_error", param, message: expect.stringContaining(`${MASTER_USER} is reserved`) });
    };
    const noSuchUser = async () => expect((await requestJson(gw, "GET", `/user/info?user_id=${MASTER_USER}`)).status).toBe(404);

    beforeAll(async () => {
      gw = await startBackendGateway(backend, PRICED_CHAT);
      await must("/team/new", { team_id: team, members_with_roles: [{ role: "admin", user_id: `lead-${backend}` }] });
      await must("/team/new", { team_id: `other-${backend}` });
      othersToken = String((await must("/key/generate", { team_id: `other-${backend}`, key_alias: `other-tenant-${backend}`, metadata: { customer: "ACME" } })).token);
      teamAdminKey = String((await must("/key/generate", { team_id: team, user_id: `lead-${backend}` })).key);
    }, 60_000);
    afterAll(() => gw?.stop());

    test("a team admin may not add default_user_id to its team, nor give it a key", async () => {
      await refused("/team/member_add", { team_id: team, member: { role: "user", user_id: MASTER_USER } }, "user_id", teamAdminKey);
      await refused("/team/member_add", { team_id: team, user_id: MASTER_USER, role: "user" }, "user_id", teamAdminKey);
      const key = await requestJson(gw, "POST", "/key/generate", { key: teamAdminKey, body: { team_id: team, user_id: MASTER_USER } });
      expect(key.status).toBe(403);
      await noSuchUser();
    });

    test("no caller, the master key included, makes a user, member or key owner of that id", async () => {
      await refused("/user/new", { user_id: MASTER_USER }, "user_id");
      await refused("/team/new", { team_alias: `with-master-${backend}`, members_with_roles: [{ role: "user", user_id: MASTER_USER }] }, "user_id");
      const bulk = await requestJson<{ results: { success: boolean; error: string }[] }>(gw, "POST", "/team/bulk_member_add", { body: { team_id: team, members: [{ role: "user", user_id: MASTER_USER }] } });
      expect(bulk.body.results[0]).toMatchObject({ success: false, error: expect.stringContaining("reserved") });
      const org = String((await must("/organization/new", { organization_alias: `o-master-id-${backend}` })).organization_id);
      await refused("/organization/member_add", { organization_id: org, member: { role: "internal_user", user_id: MASTER_USER } }, "member");
      await refused("/key/generate", { user_id: MASTER_USER }, "user_id");
      await refused("/key/generate", { team_id: team, user_id: MASTER_USER }, "user_id");
      await refused("/key/update", { key: othersToken, user_id: MASTER_USER }, "user_id");
      await refused("/key/regenerate", { key: othersToken, user_id: MASTER_USER }, "user_id");
      await noSuchUser();
      // The key was neither given away nor rotated.
      const info = await requestJson<{ info: { user_id: string | null } }>(gw, "GET", `/key/info?key=${othersToken}`);
      expect(info.body.info.user_id).toBeNull();
    });

    test("the master key's keys still record it as their creator, as in LiteLLM", async () => {
      const info = await requestJson<{ info: { created_by: string } }>(gw, "GET", `/key/info?key=${othersToken}`);
      expect(info.body.info.created_by).toBe(MASTER_USER);
    });

    test("a user of that id made before it was reserved lists its own keys, never the master key's", async () => {
      // As a team admin could make it before: a member of its team, with a key of its own.
      const planted = await must("/key/generate", { team_id: team, user_id: `lead-${backend}` });
      const db = gw.host!.store.db;
      await db.execute(sql`insert into users (user_id, user_role) values (${MASTER_USER}, 'internal_user')`);
      await db.execute(sql`insert into team_members (team_id, user_id, role) values (${team}, ${MASTER_USER}, 'user')`);
      await db.execute(sql`update virtual_keys set user_id = ${MASTER_USER} where token = ${String(planted.token)}`);
      await gw.host!.services.bus!.publish({ kind: "all" });
      const list = await requestJson<{ keys: { token: string; created_by: string }[] }>(gw, "GET", "/key/list?include_created_by_keys=true&return_full_object=true&size=100", {
        key: String(planted.key),
      });
      expect(list.status).toBe(200);
      expect(list.body.keys.map((k) => k.token)).toEqual([String(planted.token)]);
      expect(list.text).not.toContain(othersToken);
      expect(list.text).not.toContain("ACME");
      // It can be removed like any user.
      expect((await requestJson(gw, "POST", "/user/delete", { body: { user_ids: [MASTER_USER] } })).status).toBe(200);
    });
  });
}
