// A key acts with its user's global role. A team admin may add any existing user to its team,
// proxy admins included; if it could then give that user a key (or move one to them), it would
// hold a proxy admin's key and could, for instance, make itself a proxy admin. Each way of doing
// so is refused, and nothing is written; keys for the team's ordinary members still work.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BACKENDS, requestJson, startBackendGateway } from "../harness/gateway.ts";
import { PRICED_CHAT } from "../harness/traffic.ts";

for (const backend of BACKENDS) {
  describe(`keys for users with a proxy-wide role (${backend})`, () => {
    let gw: Awaited<ReturnType<typeof startBackendGateway>>;
    let teamAdminKey: string;
    let ownKey: string;
    const team = `t-elev-${backend}`;
    const must = async (path: string, body: unknown, key?: string) => {
      const r = await requestJson<Record<string, unknown>>(gw, "POST", path, { body, key });
      if (r.status !== 200) throw new Error(`${path}: ${r.status} ${JSON.stringify(r.body)}`);
      return r.body;
    };

    beforeAll(async () => {
      gw = await startBackendGateway(backend, PRICED_CHAT);
      for (const [id, role] of [["boss", "proxy_admin"], ["auditor", "proxy_admin_viewer"], ["lead", "internal_user"], ["dev", "internal_user"]] as const) {
        await must("/user/new", { user_id: id, user_role: role, auto_create_key: false });
      }
      await must("/team/new", { team_id: team, team_alias: team });
      await must("/team/member_add", { team_id: team, member: { role: "admin", user_id: "lead" } });
      teamAdminKey = String((await must("/key/generate", { team_id: team, user_id: "lead" })).key);
      // The team's admin adds a proxy admin and a proxy-admin viewer to its team: allowed.
      await must("/team/member_add", { team_id: team, member: [{ role: "user", user_id: "boss" }, { role: "user", user_id: "auditor" }, { role: "user", user_id: "dev" }] }, teamAdminKey);
      ownKey = String((await must("/key/generate", { team_id: team, user_id: "dev" }, teamAdminKey)).key);
    }, 60_000);
    afterAll(() => gw?.stop());

    const keysOf = async (userId: string) =>
      (await requestJson<{ keys: unknown[] }>(gw, "GET", `/key/list?user_id=${userId}&include_team_keys=true`)).body.keys.length;

    for (const target of ["boss", "auditor"]) {
      test(`a team admin may not generate a key for ${target}, a member of its team`, async () => {
        const before = await keysOf(target);
        const r = await requestJson<{ error: { message: string; type: string } }>(gw, "POST", "/key/generate", { key: teamAdminKey, body: { team_id: team, user_id: target } });
        expect(r.status).toBe(403);
        expect(r.body.error.message).toContain(`user ${target}`);
        expect(await keysOf(target)).toBe(before);
      });

      test(`a team admin may not move its team's key to ${target}, by update or by regenerate`, async () => {
        const updated = await requestJson(gw, "POST", "/key/update", { key: teamAdminKey, body: { key: ownKey, user_id: target } });
        expect(updated.status).toBe(403);
        const regenerated = await requestJson(gw, "POST", "/key/regenerate", { key: teamAdminKey, body: { key: ownKey, user_id: target } });
        expect(regenerated.status).toBe(403);
        const info = await requestJson<{ info: { user_id: string } }>(gw, "GET", `/key/info?key=${ownKey}`);
        expect(info.body.info.user_id).toBe("dev");
        // The key was not rotated by the refused regenerate: it still answers.
        expect(info.status).toBe(200);
      });
    }

    for (const target of ["boss", "auditor"]) {
      test(`a team admin may not regenerate ${target}'s key in its team (the new plaintext would act as ${target})`, async () => {
        const theirs = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { team_id: team, user_id: target } });
        expect(theirs.status).toBe(200);
        for (const [path, body] of [
          [`/key/${theirs.body.token}/regenerate`, {}],
          ["/key/regenerate", { key: theirs.body.token }],
        ] as const) {
          const r = await requestJson<{ key?: string; error?: { message: string } }>(gw, "POST", path, { key: teamAdminKey, body });
          expect(r.status).toBe(403);
          expect(r.body.error!.message).toContain(`regenerate a key of user ${target}`);
          expect(r.body.key).toBeUndefined();
        }
        // Not rotated: the key still answers as it was.
        expect((await requestJson(gw, "GET", `/key/info?key=${theirs.body.key}`)).status).toBe(200);
        // A proxy admin may.
        expect((await requestJson(gw, "POST", `/key/${theirs.body.token}/regenerate`, { body: {} })).status).toBe(200);
      });
    }

    test("a team admin still regenerates its ordinary members' keys", async () => {
      const devKey = await requestJson<{ token: string }>(gw, "POST", "/key/generate", { key: teamAdminKey, body: { team_id: team, user_id: "dev" } });
      expect((await requestJson(gw, "POST", `/key/${devKey.body.token}/regenerate`, { key: teamAdminKey, body: {} })).status).toBe(200);
    });

    test("a team admin still gives keys to its ordinary members; a proxy admin gives one to anyone", async () => {
      expect((await requestJson(gw, "POST", "/key/generate", { key: teamAdminKey, body: { team_id: team, user_id: "dev" } })).status).toBe(200);
      const forBoss = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team, user_id: "boss" } });
      expect(forBoss.status).toBe(200);
      // That key acts as its user's role: it may create a team.
      expect((await requestJson(gw, "POST", "/team/new", { key: forBoss.body.key, body: { team_alias: `by-boss-${backend}` } })).status).toBe(200);
    });
  });
}
