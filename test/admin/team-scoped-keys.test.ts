// A key issued inside a team speaks for its user in that team only. A team admin may add any
// existing user to its team and give it a key there; that key used to act as its user everywhere
// ownership was checked, so the team admin held the user: it minted a personal key of the user
// (/key/generate {}), which then ran the user's other teams and read its organization, and the team
// key itself read, changed and deleted the user's other keys and changed the user. Each step is
// refused now; what a user's own personal key may do is unchanged.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BACKENDS, requestJson, startBackendGateway } from "../harness/gateway.ts";
import { PRICED_CHAT } from "../harness/traffic.ts";

interface KeyReply {
  key: string;
  token: string;
  team_id: string | null;
  user_id: string | null;
}

for (const backend of BACKENDS) {
  describe(`keys issued in a team act for their user in that team only (${backend})`, () => {
    let gw: Awaited<ReturnType<typeof startBackendGateway>>;
    const att = `att-${backend}`;
    const vict = `vict-${backend}`;
    const org = `o-${backend}`;
    const attacker = `attacker-${backend}`;
    const victim = `victim-${backend}`;
    let attackerKey: string;
    let victimsPersonal: KeyReply;
    let victimsOwnTeamKey: KeyReply;
    let plantedKey: KeyReply;
    const call = <T = Record<string, unknown>>(method: string, path: string, key: string, body?: unknown) => requestJson<T>(gw, method, path, { key, body });
    const must = async (path: string, body: unknown, key?: string) => {
      const r = await requestJson<KeyReply & Record<string, unknown>>(gw, "POST", path, { body, key });
      if (r.status !== 200) throw new Error(`${path}: ${r.status} ${JSON.stringify(r.body)}`);
      return r.body;
    };
    const keysOfVictim = async () =>
      (await requestJson<{ keys: KeyReply[] }>(gw, "GET", `/key/list?user_id=${victim}&return_full_object=true&size=100`)).body.keys.map((k) => `${k.team_id}:${k.token}`).sort();

    beforeAll(async () => {
      gw = await startBackendGateway(backend, PRICED_CHAT);
      await must("/organization/new", { organization_id: org, organization_alias: org });
      await must("/team/new", { team_id: att, members_with_roles: [{ role: "admin", user_id: attacker }] });
      await must("/team/new", { team_id: vict, organization_id: org, members_with_roles: [{ role: "admin", user_id: victim }] });
      await must("/organization/member_add", { organization_id: org, member: { role: "org_admin", user_id: victim } });
      attackerKey = (await must("/key/generate", { team_id: att, user_id: attacker })).key;
      victimsPersonal = await must("/key/generate", { user_id: victim });
      victimsOwnTeamKey = await must("/key/generate", { team_id: vict, user_id: victim });
      // The hunt's first two steps, which stay allowed: the team admin adds the victim to its team
      // and gives it a key there.
      await must("/team/member_add", { team_id: att, member: { role: "user", user_id: victim } }, attackerKey);
      plantedKey = await must("/key/generate", { team_id: att, user_id: victim }, attackerKey);
    }, 60_000);
    afterAll(() => gw?.stop());

    test("a key issued in a team generates no personal key, so nothing outside the team is reached through one", async () => {
      const before = await keysOfVictim();
      for (const key of [plantedKey.key, attackerKey]) {
        const personal = await call<{ error: { message: string } }>("POST", "/key/generate", key, {});
        expect(personal.status).toBe(403);
        expect(personal.body.error.message).toContain(`team ${att}`);
        expect((await call("POST", "/key/generate", key, { user_id: victim })).status).toBe(403);
      }
      expect(await keysOfVictim()).toEqual(before);
      // What the personal key was used for: the victim's other team and its organization.
      expect((await call("GET", `/team/info?team_id=${vict}`, plantedKey.key)).status).toBe(403);
      expect((await call("POST", "/key/generate", plantedKey.key, { team_id: vict })).status).toBe(403);
      expect((await call("POST", "/team/member_add", plantedKey.key, { team_id: vict, member: { role: "admin", user_id: attacker } })).status).toBe(403);
      // In its own team a team admin's key still generates keys.
      expect((await call("POST", "/key/generate", attackerKey, { team_id: att })).status).toBe(200);
    });

    test("it has no owner rights on its user's keys outside the team", async () => {
      for (const other of [victimsPersonal, victimsOwnTeamKey]) {
        expect((await call("GET", `/key/info?key=${other.token}`, plantedKey.key)).status).toBe(403);
        expect((await call("POST", "/key/update", plantedKey.key, { key: other.token, max_budget: 0.000001 })).status).toBe(403);
        expect((await call("POST", `/key/${other.token}/regenerate`, plantedKey.key, {})).status).toBe(403);
        expect((await call("POST", "/key/delete", plantedKey.key, { keys: [other.token] })).status).toBe(403);
      }
      const info = await requestJson<{ info: { max_budget: number | null; deleted_at?: string | null } }>(gw, "GET", `/key/info?key=${victimsPersonal.token}`);
      expect([info.status, info.body.info.max_budget]).toEqual([200, null]);
      for (const query of ["", "&include_created_by_keys=true", `&user_id=${victim}`]) {
        const listed = await call<{ keys: KeyReply[] }>("GET", `/key/list?return_full_object=true&size=100${query}`, plantedKey.key);
        expect(listed.status).toBe(200);
        expect(listed.body.keys.map((k) => k.token)).toEqual([plantedKey.token]);
      }
      // Its own key it still reads.
      expect((await call("GET", "/key/info", plantedKey.key)).status).toBe(200);
    });

    test("it sees its user as the team does, and may not change the user", async () => {
      const info = await call<{ user_info: { teams: string[] }; keys: KeyReply[]; teams: { team_id: string }[] }>("GET", "/user/info", plantedKey.key);
      expect(info.status).toBe(200);
      expect(info.body.keys.map((k) => k.token)).toEqual([plantedKey.token]);
      expect(info.body.teams.map((t) => t.team_id)).toEqual([att]);
      expect(info.body.user_info.teams).toEqual([att]);
      expect(info.text).not.toContain(vict);
      const update = await call("POST", "/user/update", plantedKey.key, { user_id: victim, user_email: `attacker-${backend}@evil.example` });
      expect(update.status).toBe(403);
      const alias = await call("POST", "/user/update", plantedKey.key, { user_id: victim, user_alias: "owned" });
      expect(alias.status).toBe(403);
      const stored = await requestJson<{ user_info: { user_email: string | null; user_alias: string | null } }>(gw, "GET", `/user/info?user_id=${victim}`);
      expect(stored.body.user_info).toMatchObject({ user_email: null, user_alias: null });
    });

    test("it has no organization rights, even where its user is an org_admin", async () => {
      expect((await call("GET", `/organization/info?organization_id=${org}`, plantedKey.key)).status).toBe(403);
      expect((await call("GET", "/organization/list", plantedKey.key)).status).toBe(403);
      // The victim's key in its org's team is a team key too: no org rights through it either.
      expect((await call("GET", `/organization/info?organization_id=${org}`, victimsOwnTeamKey.key)).status).toBe(403);
    });

    test("a team admin may not take a member's key out of the team: it would be the member's personal key", async () => {
      const update = await call("POST", "/key/update", attackerKey, { key: plantedKey.token, team_id: null });
      expect(update.status).toBe(403);
      const regenerated = await call("POST", "/key/regenerate", attackerKey, { key: plantedKey.token, team_id: null });
      expect(regenerated.status).toBe(403);
      // Nor through its personal key, nor its own key through a key issued in the team.
      const attackersPersonal = await must("/key/generate", { user_id: attacker });
      expect((await call("POST", "/key/update", attackersPersonal.key, { key: plantedKey.token, team_id: null })).status).toBe(403);
      expect((await call("POST", "/key/update", plantedKey.key, { key: plantedKey.token, team_id: null })).status).toBe(403);
      const info = await requestJson<{ info: { team_id: string | null } }>(gw, "GET", `/key/info?key=${plantedKey.token}`);
      expect([info.status, info.body.info.team_id]).toEqual([200, att]);
    });

    test("a user's own personal key keeps every right it had", async () => {
      const mine = victimsPersonal.key;
      const fresh = await call<KeyReply>("POST", "/key/generate", mine, {});
      expect([fresh.status, fresh.body.team_id, fresh.body.user_id]).toEqual([200, null, victim]);
      expect((await call("GET", `/team/info?team_id=${vict}`, mine)).status).toBe(200);
      expect((await call("GET", `/organization/info?organization_id=${org}`, mine)).status).toBe(200);
      expect((await call("POST", "/user/update", mine, { user_id: victim, user_alias: "me" })).status).toBe(200);
      const info = await call<{ keys: KeyReply[] }>("GET", "/user/info", mine);
      expect(info.body.keys.map((k) => k.token)).toContain(victimsOwnTeamKey.token);
      expect((await call("GET", `/key/info?key=${victimsOwnTeamKey.token}`, mine)).status).toBe(200);
      expect((await call("POST", "/key/update", mine, { key: fresh.body.token, key_alias: `renamed-${victim}` })).status).toBe(200);
      // As its team's admin, it lets its own team key go.
      const released = await call<KeyReply>("POST", "/key/update", mine, { key: victimsOwnTeamKey.token, team_id: null });
      expect([released.status, released.body.team_id]).toEqual([200, null]);
    });
  });
}
