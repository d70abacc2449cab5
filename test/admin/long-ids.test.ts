// Ids and names the store indexes are at most 256 characters on every management write (a 422
// naming the field, nothing written): an index entry holds ~2,700 bytes, and ids make up the keys of
// the daily aggregates, so a 2,700-character team_id was stored and then every call of its keys
// was refused by the spend log and went uncharged; at 10,000 characters the write itself was a 500.
// Random letters, as a repeated one compresses to fit. Timestamps PostgreSQL cannot hold (year 0,
// which JavaScript parses) are a 400, not a 500.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BACKENDS, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { randomLetters } from "../harness/random.ts";


for (const backend of BACKENDS) {
  describe(`long ids and names (${backend})`, () => {
    let gw: TestGateway;
    beforeAll(async () => {
      gw = await startBackendGateway(
        backend,
        { model_list: [{ model_name: "m", svc_params: { model: "mock/m" }, model_info: { input_cost_per_token: 0.001, output_cost_per_token: 0.002 } }], general_settings: { master_key: "sk-test-master-key" } },
        { dbPrefix: "gw_long_ids" },
      );
    }, 30_000);
    afterAll(async () => gw?.stop());

    test("every indexed id or name over 256 characters is a 422 naming it, whatever its place in the body", async () => {
      const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: {} })).body.team_id;
      for (const length of [257, 2_700, 10_000]) {
        const long = randomLetters(length);
        const cases: [string, Record<string, unknown>, string][] = [
          ["/team/new", { team_id: long }, "team_id"],
          ["/user/new", { user_id: long }, "user_id"],
          ["/user/new", { user_email: `${long}@example.com` }, "user_email"],
          ["/organization/new", { organization_alias: "o", organization_id: long }, "organization_id"],
          ["/key/generate", { user_id: long }, "user_id"],
          ["/key/generate", { key_alias: long }, "key_alias"],
          ["/budget/new", { budget_id: long, max_budget: 1 }, "budget_id"],
          ["/access_group/new", { access_group: long, model_names: ["m"] }, "access_group"],
          ["/model/new", { model_name: long, svc_params: { model: "mock/x" } }, "model_name"],
          ["/model/new", { model_name: "ok", svc_params: { model: `mock/${long}` } }, "svc_params.model"],
          ["/model/new", { model_name: "ok", svc_params: { model: "mock/x" }, model_info: { id: long } }, "model_info.id"],
          ["/team/member_add", { team_id: team, member: { role: "user", user_id: long } }, "member.user_id"],
          ["/team/member_add", { team_id: team, member: [{ role: "user", user_id: long }] }, "member.0.user_id"],
          ["/team/member_add", { team_id: team, member_email: `${long}@example.com`, role: "user" }, "member_email"],
        ];
        for (const [path, body, field] of cases) {
          const res = await requestJson<{ error: { param: string; message: string } }>(gw, "POST", path, { body });
          expect([path, field, length, res.status]).toEqual([path, field, length, 422]);
          expect(res.body.error.param).toBe(field);
        }
      }
      // Nothing was written: no such team, user or key.
      const users = await requestJson<{ users: unknown[] }>(gw, "GET", "/user/list");
      expect(JSON.stringify(users.body)).not.toMatch(/[a-z]{257}/);
    });

    test("256 characters are fine, and the calls of a key with such ids are charged and logged", async () => {
      const user = randomLetters(256);
      const team = randomLetters(256);
      expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: team } })).status).toBe(200);
      const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { user_id: user, team_id: team } });
      expect(made.status).toBe(200);
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${made.body.key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "m", user: randomLetters(256), metadata: { tags: [randomLetters(256)] }, messages: [{ role: "user", content: "hi" }] }),
      });
      expect(res.status).toBe(200);
      const cost = Number(res.headers.get("x-svc-response-cost"));
      expect(cost).toBeGreaterThan(0);
      await gw.host!.spendWriter.flush();
      const info = await requestJson<{ info: { spend: number } }>(gw, "GET", `/key/info?key=${made.body.key}`);
      expect(info.body.info.spend).toBeCloseTo(cost, 12);
      const teamInfo = await requestJson<{ team_info: { spend: number } }>(gw, "GET", `/team/info?team_id=${team}`);
      expect(teamInfo.body.team_info.spend).toBeCloseTo(cost, 12);
    });

    test("a list of more than 1,000 ids or members is a 422 naming the field and the bound, never a 500 or a false 503; 1,000 are taken", async () => {
      const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: {} })).body.team_id;
      const org = (await requestJson<{ organization_id: string }>(gw, "POST", "/organization/new", { body: { organization_alias: "lists" } })).body.organization_id;
      const ids = (n: number) => Array.from({ length: n }, (_, i) => `id-${i}`);
      const members = (n: number) => ids(n).map((user_id) => ({ role: "user", user_id }));
      const cases: [string, string, (n: number) => Record<string, unknown>, string][] = [
        ["POST", "/budget/info", (n) => ({ budgets: ids(n) }), "budgets"],
        ["POST", "/user/delete", (n) => ({ user_ids: ids(n) }), "user_ids"],
        ["POST", "/team/delete", (n) => ({ team_ids: ids(n) }), "team_ids"],
        ["DELETE", "/organization/delete", (n) => ({ organization_ids: ids(n) }), "organization_ids"],
        ["POST", "/key/delete", (n) => ({ keys: ids(n) }), "keys"],
        ["POST", "/key/delete", (n) => ({ key_aliases: ids(n) }), "key_aliases"],
        ["POST", "/user/new", (n) => ({ teams: ids(n) }), "teams"],
        ["POST", "/team/new", (n) => ({ members_with_roles: members(n) }), "members_with_roles"],
        ["POST", "/team/member_add", (n) => ({ team_id: team, member: members(n) }), "member"],
        ["POST", "/team/bulk_member_add", (n) => ({ team_id: team, members: members(n) }), "members"],
        ["POST", "/organization/member_add", (n) => ({ organization_id: org, member: members(n).map((m) => ({ ...m, role: "internal_user" })) }), "member"],
      ];
      for (const [method, path, body, field] of cases) {
        for (const n of [1_001, 70_000]) {
          const res = await requestJson<{ error: { param: string; message: string } }>(gw, method, path, { body: body(n) });
          expect([path, n, res.status, res.body.error?.param]).toEqual([path, n, 422, field]);
          expect(res.body.error.message).toBe(`Invalid request: ${field}: Expected array length to be less or equal to 1000`);
        }
      }
      // At the bound the lists are read, whatever the answer about their ids.
      for (const [method, path, body] of cases.slice(0, 4)) {
        const res = await requestJson(gw, method, path, { body: body(1_000) });
        expect([path, res.status < 500 && res.status !== 422]).toEqual([path, true]);
      }
    });

    test("a number too large to hold (1e400 parses as Infinity) is a 422 naming it, not stored as null; an empty key_alias is no alias", async () => {
      const big = await fetch(`${gw.url}/key/generate`, {
        method: "POST",
        headers: { authorization: "Bearer sk-test-master-key", "content-type": "application/json" },
        body: '{"metadata": {"a": 1e400}}',
      });
      expect(big.status).toBe(422);
      expect(((await big.json()) as { error: { param: string } }).error.param).toBe("metadata.a");
      const keys = await Promise.all([0, 1].map(() => requestJson<{ key: string; key_alias: string | null }>(gw, "POST", "/key/generate", { body: { key_alias: "" } })));
      for (const k of keys) {
        expect(k.status).toBe(200);
        expect(k.body.key_alias).toBeNull();
      }
    });

    test("a timestamp in year 0 (which PostgreSQL cannot hold) is a 400 naming the field", async () => {
      const key = await requestJson<{ error: { param: string } }>(gw, "POST", "/key/generate", { body: { temp_budget_increase: 5, temp_budget_expiry: "0000-01-01T00:00:00Z" } });
      expect(key.status).toBe(400);
      expect(key.body.error.param).toBe("temp_budget_expiry");
      const budget = await requestJson<{ error: { param: string } }>(gw, "POST", "/budget/new", { body: { max_budget: 1, budget_reset_at: "0000-06-01T00:00:00Z" } });
      expect(budget.status).toBe(400);
      expect(budget.body.error.param).toBe("budget_reset_at");
      expect((await requestJson(gw, "POST", "/key/generate", { body: { temp_budget_increase: 5, temp_budget_expiry: "0001-01-01T00:00:00Z" } })).status).toBe(200);
    });
  });
}
