// Spend reports agree with the spend log. A data set is made by real calls through the gateway
// (keys in two teams, one of them in an organization, a key without a team, the master key, end
// users, request tags, a failed call) plus rows of earlier days written through the spend writer's
// own batch path; then every report (/spend/logs both ways, /spend/logs/v2, /global/spend/report
// by team, key and customer, the daily activity of teams and orgs, the tag report, provider
// budgets, /spend/keys and /spend/users) is checked against sums computed here straight from
// `spend_logs`, exact to the last digit. Also: a team admin sees its own team only, parameter
// errors are 400/422 envelopes, /spend/calculate, and /global/spend/reset.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { type SQL, sql } from "drizzle-orm";
import { estimatePromptTokens } from "../../core/cost/estimate.ts";
import type { SpendEntry } from "../../core/spend/entry.ts";
import { writeBatch } from "../../core/spend/flush.ts";
import { rows } from "../../core/store/sql.ts";
import { BACKENDS, MASTER_KEY, requestJson, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { spendEntry } from "../harness/spend.ts";
import { sha256, until } from "../harness/util.ts";

const ALPHA = { model_name: "alpha-model", svc_params: { model: "mock/alpha" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } };
const BETA = { model_name: "beta-model", svc_params: { model: "mock/beta" }, model_info: { input_cost_per_token: 0.0000031, output_cost_per_token: 0.0000057 } };
const BROKEN = { model_name: "broken", svc_params: { model: "openai/gpt-4o", api_base: "http://127.0.0.1:9/v1", api_key: "sk-upstream" } };
/** Priced by the file (gpt-4o-realtime-preview-2024-10-01), for /spend/calculate only: never called. */
const REALTIME = { model_name: "realtime-model", svc_params: { model: "openai/gpt-4o-realtime-preview-2024-10-01", api_base: "http://127.0.0.1:9/v1", api_key: "sk-upstream" } };
const CONFIG = {
  model_list: [ALPHA, BETA, BROKEN, REALTIME],
  general_settings: { master_key: MASTER_KEY },
  router_settings: { provider_budget_config: { mock: { budget_limit: 1000, time_period: "1d" } } },
};

const DAY = 86_400_000;
const dayOf = (ms: number) => new Date(ms).toISOString().slice(0, 10);
const TODAY = dayOf(Date.now());
const START = dayOf(Date.now() - 6 * DAY);
type Json = Record<string, unknown>;
type Amounts = Record<string, number>;

interface Seed {
  org: string;
  teamA: string;
  teamB: string;
  keys: Record<"a1" | "a2" | "b1" | "none" | "admin", { key: string; token: string }>;
}

async function must<T = Json>(gw: TestGateway, method: string, path: string, body?: unknown): Promise<T> {
  const r = await requestJson<T>(gw, method, path, { body });
  if (r.status !== 200) throw new Error(`${method} ${path} → ${r.status}: ${r.text}`);
  return r.body;
}

async function chat(gw: TestGateway, key: string, model: string, text: string, extra: Json = {}): Promise<number> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: text }], ...extra }),
  });
  await res.arrayBuffer();
  return res.status;
}

async function seed(gw: TestGateway): Promise<Seed> {
  const { organization_id: org } = await must<{ organization_id: string }>(gw, "POST", "/organization/new", { organization_alias: "acme" });
  const { team_id: teamA } = await must<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: "alpha-team", organization_id: org });
  const { team_id: teamB } = await must<{ team_id: string }>(gw, "POST", "/team/new", { team_alias: "beta-team" });
  for (const u of ["u-ann", "u-bob", "u-adm"]) await must(gw, "POST", "/user/new", { user_id: u, auto_create_key: false });
  await must(gw, "POST", "/team/member_add", { team_id: teamA, member: { role: "admin", user_id: "u-adm" } });
  const spec = { a1: [teamA, "u-ann"], a2: [teamA, "u-bob"], b1: [teamB, "u-bob"], none: [undefined, "u-ann"], admin: [teamA, "u-adm"] } as const;
  const keys = {} as Seed["keys"];
  for (const [name, [team, user]] of Object.entries(spec)) {
    const r = await must<{ key: string; token: string }>(gw, "POST", "/key/generate", { key_alias: `k-${name}`, team_id: team, user_id: user });
    keys[name as keyof Seed["keys"]] = { key: r.key, token: r.token };
  }
  const k = keys;
  const calls: [string, string, Json][] = [
    [k.a1.key, "alpha-model", { metadata: { tags: ["t-red"] }, user: "cust-1" }],
    [k.a1.key, "beta-model", { metadata: { tags: ["t-red", "t-blue"] } }],
    [k.a2.key, "alpha-model", { user: "cust-2" }],
    [k.a2.key, "beta-model", { metadata: { tags: ["t-blue"] }, user: "cust-1" }],
    [k.b1.key, "alpha-model", { metadata: { tags: ["t-green"] }, user: "cust-3" }],
    [k.b1.key, "beta-model", {}],
    [k.none.key, "beta-model", { user: "cust-1", metadata: { tags: ["t-red"] } }],
    [MASTER_KEY, "alpha-model", {}],
    [k.a1.key, "broken", { metadata: { tags: ["t-red"] } }],
  ];
  for (let round = 0; round < 2; round++) {
    for (const [i, [key, model, extra]] of calls.entries()) {
      const status = await chat(gw, key, model, `round ${round} call ${i} ${"word ".repeat(i + round * 3)}`, extra);
      expect(status).toBe(model === "broken" ? 503 : 200);
    }
  }
  // Earlier days, through the writer's own batch path (the gateway only logs calls as they happen).
  const past = (daysAgo: number, who: { token: string; alias: string; team: string | null; user: string }, spendPico: number, extra: Partial<SpendEntry> = {}): SpendEntry =>
    spendEntry(Date.now() - daysAgo * DAY, {
      requestId: `chatcmpl-past-${randomUUID()}`,
      apiKey: who.token,
      keyAlias: who.alias,
      userId: who.user,
      teamId: who.team,
      organizationId: who.team === teamA ? org : null,
      spendPico,
      promptTokens: 120,
      completionTokens: 80,
      metadata: { key_alias: who.alias },
      ...extra,
    });

  const a1 = { token: k.a1.token, alias: "k-a1", team: teamA, user: "u-ann" };
  const b1 = { token: k.b1.token, alias: "k-b1", team: teamB, user: "u-bob" };
  await writeBatch(gw.host!.store, [
    past(3, a1, 123_456_789, { tags: ["t-red"], endUser: "cust-1", cacheReadTokens: 40 }),
    past(3, b1, 500_000_000_000, { modelGroup: "beta-model", model: "beta-model", upstreamModel: "beta" }),
    past(5, a1, 1_000_000_000_001, { status: "failure" }),
  ]);
  await gw.host!.spendWriter.flush();
  return { org, teamA, teamB, keys };
}

for (const backend of BACKENDS) {
  describe(`spend reports (${backend})`, () => {
    let gw: TestGateway;
    let s: Seed;

    beforeAll(async () => {
      gw = await startBackendGateway(backend, CONFIG, { dbPrefix: "gw_reports" });
      s = await seed(gw);
    }, 60_000);
    afterAll(async () => gw?.stop());

    const get = <T = Json>(path: string, key = MASTER_KEY) => requestJson<T>(gw, "GET", path, { key });
    const q = (sqlText: SQL) => rows<Record<string, string | number | null>>(gw.host!.store.db, sqlText);
    const utcDay = sql`(start_time at time zone 'UTC')::date::text`;

    /** Sums of spend_logs grouped by `by` (a SQL expression), as numbers, keyed by the group's value. */
    async function sums(by: SQL, where: SQL = sql`true`, value: SQL = sql`sum(spend)::text`): Promise<Amounts> {
      const found = await q(sql`select ${by} as k, ${value} as v from spend_logs where ${where} group by 1`);
      return Object.fromEntries(found.map((r) => [String(r.k), Number(r.v)]));
    }
    /** The same, per UTC day: {day: {group: amount}}. */
    async function sumsByDay(by: SQL, where: SQL = sql`true`): Promise<Record<string, Amounts>> {
      const found = await q(sql`select ${utcDay} as d, ${by} as k, sum(spend)::text as v from spend_logs where ${where} group by 1, 2`);
      const out: Record<string, Amounts> = {};
      for (const r of found) {
        const day = out[String(r.d)] ?? {};
        day[String(r.k)] = Number(r.v);
        out[String(r.d)] = day;
      }
      return out;
    }

    test("the data set spans several days, teams, keys, customers, tags and a failure", async () => {
      const [c] = await q(sql`select count(*)::int as n, count(distinct ${utcDay})::int as days, count(*) filter (where status = 'failure')::int as failed from spend_logs`);
      expect(c).toEqual({ n: 21, days: 3, failed: 3 });
    });

    test("/spend/logs?summarize=false returns the log rows, newest first, with the spec's fields", async () => {
      const r = await get<Json[]>("/spend/logs?summarize=false&limit=100");
      expect(r.status).toBe(200);
      const expected = await q(sql`select request_id, spend::text as spend, total_tokens, model from spend_logs order by start_time desc, call_id desc`);
      expect(r.body.map((x) => x.request_id)).toEqual(expected.map((e) => e.request_id));
      expect(r.body.map((x) => x.spend)).toEqual(expected.map((e) => Number(e.spend)));
      const one = r.body.find((x) => x.api_key === s.keys.a2.token)!;
      expect(one).toMatchObject({
        model: expect.any(String),
        total_tokens: expect.any(Number),
        metadata: { key_alias: "k-a2" },
        team_id: s.teamA,
        user_id: "u-bob",
        cache_read_input_tokens: 0,
        start_time: expect.stringMatching(/^\d{4}-\d{2}-\d{2}T/),
      });
      // Default limit 50, max 100.
      expect((await get<Json[]>("/spend/logs?summarize=false&limit=3")).body).toHaveLength(3);
      const over = await get<{ error: Json }>("/spend/logs?limit=101");
      expect(over.status).toBe(422);
      expect(over.body.error).toMatchObject({ param: "limit", code: "422" });
      const byKey = await get<Json[]>(`/spend/logs?api_key=${s.keys.b1.key}`);
      expect(byKey.body.length).toBe(5);
      expect(byKey.body.every((x) => x.api_key === s.keys.b1.token)).toBe(true);
      const [first] = expected;
      expect((await get<Json[]>(`/spend/logs?request_id=${first!.request_id}`)).body.map((x) => x.request_id)).toEqual([first!.request_id]);
    });

    test("/spend/logs with dates sums spend per day, per user, model and key, zero-filled", async () => {
      for (const team of [undefined, s.teamA]) {
        const where = team ? sql`team_id = ${team}` : sql`true`;
        const r = await get<{ startTime: string; spend: number; users: Amounts; models: Amounts; api_keys: Amounts }[]>(
          `/spend/logs?start_date=${START}&end_date=${TODAY}${team ? `&team_id=${team}` : ""}`,
        );
        expect(r.status).toBe(200);
        expect(r.body.map((d) => d.startTime)).toEqual(Array.from({ length: 7 }, (_, i) => dayOf(Date.parse(START) + i * DAY)));
        const total = await sumsByDay(sql`'all'`, where);
        const users = await sumsByDay(sql`user_id`, sql`${where} and user_id is not null`);
        const models = await sumsByDay(sql`model_group`, where);
        const keys = await sumsByDay(sql`api_key`, where);
        for (const day of r.body) {
          expect(day.spend).toBe(total[day.startTime]?.all ?? 0);
          expect(day.users).toEqual(users[day.startTime] ?? {});
          expect(day.models).toEqual(models[day.startTime] ?? {});
          expect(day.api_keys).toEqual(keys[day.startTime] ?? {});
        }
      }
      const bad = await get<{ error: Json }>("/spend/logs?start_date=2024-13-01&end_date=2024-12-01");
      expect(bad.status).toBe(422);
      expect(bad.body.error.param).toBe("start_date");
    });

    test("/spend/logs/v2 pages the log newest first, with filters; dates are required", async () => {
      const range = `start_date=${START}&end_date=${TODAY}`;
      const all = await q(sql`select request_id from spend_logs order by start_time desc, call_id desc`);
      const p1 = await get<{ data: Json[]; total: number; page: number; page_size: number; total_pages: number }>(`/spend/logs/v2?${range}&page_size=5`);
      expect(p1.status).toBe(200);
      expect({ ...p1.body, data: p1.body.data.map((d) => d.request_id) }).toEqual({ data: all.slice(0, 5).map((a) => a.request_id), total: 21, page: 1, page_size: 5, total_pages: 5 });
      const p2 = await get<{ data: Json[] }>(`/spend/logs/v2?start_date=${START}%2000:00:00&end_date=${TODAY}%2023:59:59&page_size=5&page=2`);
      expect(p2.body.data.map((d) => d.request_id)).toEqual(all.slice(5, 10).map((a) => a.request_id));
      const failed = await get<{ data: Json[]; total: number }>(`/spend/logs/v2?${range}&status_filter=failure`);
      expect(failed.body.total).toBe(3);
      expect(failed.body.data.every((d) => d.status === "failure")).toBe(true);
      const teamB = await get<{ total: number }>(`/spend/logs/v2?${range}&team_id=${s.teamB}&model=beta-model`);
      const [n] = await q(sql`select count(*)::int as n from spend_logs where team_id = ${s.teamB} and model_group = 'beta-model'`);
      expect(teamB.body.total).toBe(n!.n as number);
      const big = await get<{ data: Json[] }>(`/spend/logs/v2?${range}&min_spend=0.4`);
      expect(big.body.data.map((d) => d.spend).sort()).toEqual([0.5, 1.000000000001]);
      const byAlias = await get<{ total: number }>(`/spend/logs/v2?${range}&key_alias=k-a1`);
      const [m] = await q(sql`select count(*)::int as n from spend_logs where key_alias = 'k-a1'`);
      expect(byAlias.body.total).toBe(m!.n as number);
      expect((await get("/spend/logs/v2")).status).toBe(400);
      expect((await get(`/spend/logs/v2?${range}&page_size=101`)).status).toBe(422);
      expect((await get(`/spend/logs/v2?${range}&page=-1`)).status).toBe(422);
      expect((await get(`/spend/logs/v2?${range}&status_filter=maybe`)).status).toBe(422);
      expect((await get(`/spend/logs/v2?start_date=yesterday&end_date=${TODAY}`)).status).toBe(422);
    });

    test("/global/spend/report by team: per day, team and key, usage per model, unassigned calls apart", async () => {
      const r = await get<{ group_by_day: string; teams: { team_name: string; spend: number; keys: { key: string; usage: Record<string, Json> }[] }[] }[]>(
        `/global/spend/report?start_date=${START}&end_date=${TODAY}`,
      );
      expect(r.status).toBe(200);
      const names: Record<string, string> = { [s.teamA]: "alpha-team", [s.teamB]: "beta-team" };
      const teamName = sql`coalesce(team_id, '')`;
      const byTeam = await sumsByDay(teamName);
      expect(r.body.map((d) => d.group_by_day)).toEqual(Object.keys(byTeam).sort());
      const usage = await q(sql`select ${utcDay} as d, ${teamName} as t, api_key, model_group, sum(spend)::text as cost, sum(prompt_tokens)::int as input_tokens,
        sum(completion_tokens)::int as output_tokens, count(*)::int as requests from spend_logs group by 1, 2, 3, 4`);
      for (const day of r.body) {
        const expectedTeams = Object.fromEntries(Object.entries(byTeam[day.group_by_day]!).map(([t, v]) => [t === "" ? "Unassigned Team" : names[t], v]));
        expect(Object.fromEntries(day.teams.map((t) => [t.team_name, t.spend]))).toEqual(expectedTeams);
        for (const team of day.teams) {
          const teamId = Object.entries(names).find(([, n]) => n === team.team_name)?.[0] ?? "";
          const expected: Record<string, Record<string, Json>> = {};
          for (const u of usage.filter((x) => x.d === day.group_by_day && x.t === teamId)) {
            const forKey = expected[String(u.api_key)] ?? {};
            forKey[String(u.model_group)] = { cost: Number(u.cost), input_tokens: u.input_tokens, output_tokens: u.output_tokens, requests: u.requests };
            expected[String(u.api_key)] = forKey;
          }
          expect(Object.fromEntries(team.keys.map((k) => [k.key, k.usage]))).toEqual(expected);
        }
      }
      const unassigned = r.body.find((d) => d.group_by_day === TODAY)!.teams.find((t) => t.team_name === "Unassigned Team")!;
      expect(unassigned.keys.map((k) => k.key).sort()).toEqual([s.keys.none.token, sha256(MASTER_KEY)].sort());
      // Filters: one team; one user's keys.
      const onlyB = await get<{ teams: { team_name: string }[] }[]>(`/global/spend/report?start_date=${START}&end_date=${TODAY}&team_id=${s.teamB}`);
      expect(new Set(onlyB.body.flatMap((d) => d.teams.map((t) => t.team_name)))).toEqual(new Set(["beta-team"]));
      const bob = await get<{ group_by_day: string; teams: { team_name: string; spend: number }[] }[]>(
        `/global/spend/report?start_date=${TODAY}&end_date=${TODAY}&internal_user_id=u-bob`,
      );
      const bobTeams = (await sumsByDay(teamName, sql`user_id = 'u-bob'`))[TODAY]!;
      expect(Object.fromEntries(bob.body[0]!.teams.map((t) => [t.team_name, t.spend]))).toEqual(Object.fromEntries(Object.entries(bobTeams).map(([t, v]) => [names[t], v])));
      // The spec names each day `group-by-day`; LiteLLM's clients read `group_by_day`: both are there, from day parts and from the rows alike.
      for (const day of [...(r.body as Json[]), ...(bob.body as Json[])]) expect(day["group-by-day"]).toBe(day.group_by_day);
      expect(r.body.length).toBeGreaterThan(0);
      expect(bob.body.length).toBeGreaterThan(0);
      // Both dates are optional (the spec; LiteLLM requires them): no end is today, no start 30 days
      // before the end.
      const text = async (path: string) => {
        const res = await get(path);
        expect(res.status, path).toBe(200);
        return res.text;
      };
      const MONTH = dayOf(Date.now() - 29 * DAY);
      expect(await text(`/global/spend/report?start_date=${START}`)).toBe(await text(`/global/spend/report?start_date=${START}&end_date=${TODAY}`));
      expect(await text("/global/spend/report")).toBe(await text(`/global/spend/report?start_date=${MONTH}&end_date=${TODAY}`));
      expect(await text(`/global/spend/report?end_date=${START}&group_by=api_key`)).toBe(await text(`/global/spend/report?start_date=${dayOf(Date.now() - 35 * DAY)}&end_date=${START}&group_by=api_key`));
      expect(JSON.parse(await text("/global/spend/report")).length).toBe(r.body.length);
      expect((await get(`/global/spend/report?start_date=${TODAY}&end_date=${START}`)).status).toBe(400);
      expect((await get(`/global/spend/report?start_date=${START}&end_date=${TODAY}&group_by=model`)).status).toBe(422);
    });

    test("/global/spend/report by api_key and by customer", async () => {
      const byKey = await get<{ group_by_day: string; api_keys: { api_key: string; total_cost: number; total_input_tokens: number; model_details: Json[] }[] }[]>(
        `/global/spend/report?start_date=${START}&end_date=${TODAY}&group_by=api_key`,
      );
      const keySums = await sumsByDay(sql`api_key`);
      for (const day of byKey.body) expect(Object.fromEntries(day.api_keys.map((k) => [k.api_key, k.total_cost]))).toEqual(keySums[day.group_by_day]!);
      for (const day of [...(byKey.body as Json[])]) expect(day["group-by-day"]).toBe(day.group_by_day);
      const tokens = await sums(sql`api_key`, sql`${utcDay} = ${TODAY}`, sql`sum(prompt_tokens)`);
      const today = byKey.body.find((d) => d.group_by_day === TODAY)!;
      expect(Object.fromEntries(today.api_keys.map((k) => [k.api_key, k.total_input_tokens]))).toEqual(tokens);

      const byCustomer = await get<{ group_by_day: string; customers: { customer: string; total_cost: number; model_details: { model: string; total_cost: number }[] }[] }[]>(
        `/global/spend/report?start_date=${START}&end_date=${TODAY}&group_by=customer`,
      );
      const custSums = await sumsByDay(sql`end_user`, sql`end_user is not null`);
      expect(byCustomer.body.map((d) => d.group_by_day)).toEqual(Object.keys(custSums).sort());
      for (const day of byCustomer.body) expect(Object.fromEntries(day.customers.map((c) => [c.customer, c.total_cost]))).toEqual(custSums[day.group_by_day]!);
      const oneCustomer = await get<{ customers: { customer: string }[] }[]>(`/global/spend/report?start_date=${START}&end_date=${TODAY}&group_by=customer&customer_id=cust-1&team_id=${s.teamA}`);
      const cust1A = await sums(sql`end_user`, sql`end_user = 'cust-1' and team_id = ${s.teamA}`);
      const got = oneCustomer.body.flatMap((d) => d.customers);
      expect(new Set(got.map((c) => c.customer))).toEqual(new Set(Object.keys(cust1A)));
    });

    test("a report asked again after more calls shows them (reused days are only the unchanged ones)", async () => {
      const path = `/global/spend/report?start_date=${START}&end_date=${TODAY}&group_by=api_key`;
      const total = (body: { api_keys: { total_requests: number }[] }[]) => body.flatMap((d) => d.api_keys).reduce((n, k) => n + k.total_requests, 0);
      const before = await get<{ api_keys: { total_requests: number }[] }[]>(path);
      const again = await get<{ api_keys: { total_requests: number }[] }[]>(path);
      expect(again.text).toBe(before.text);
      expect(await chat(gw, s.keys.none.key, "alpha-model", "one more call")).toBe(200);
      await gw.host!.spendWriter.flush();
      const after = await get<{ api_keys: { total_requests: number }[] }[]>(path);
      expect(total(after.body)).toBe(total(before.body) + 1);
      const [logged] = await q(sql`select count(*)::int as n from spend_logs`);
      expect(total(after.body)).toBe(Number(logged!.n));
    });

    test("a change to a past day (a late write) is seen by the next report, though that day's part was reused before", async () => {
      const path = `/global/spend/report?start_date=${START}&end_date=${TODAY}&group_by=api_key`;
      type Report = { group_by_day: string; api_keys: { total_requests: number }[] }[];
      const requestsOn = (body: Report, day: string) => body.find((d) => d.group_by_day === day)?.api_keys.reduce((n, k) => n + k.total_requests, 0) ?? 0;
      const before = await get<Report>(path);
      const past = before.body.map((d) => d.group_by_day).find((d) => d !== TODAY)!;
      expect((await get<Report>(path)).text).toBe(before.text);
      const [row] = await q(sql`select entity_id, api_key, model, model_group, provider from daily_spend where entity_type = 'key' and date = ${past}::date limit 1`);
      const thatRow = sql`entity_type = 'key' and date = ${past}::date and entity_id = ${row!.entity_id} and api_key = ${row!.api_key} and model = ${row!.model} and model_group = ${row!.model_group} and provider = ${row!.provider}`;
      await q(sql`update daily_spend set api_requests = api_requests + 5 where ${thatRow}`);
      const after = await get<Report>(path);
      expect(requestsOn(after.body, past)).toBe(requestsOn(before.body, past) + 5);
      await q(sql`update daily_spend set api_requests = api_requests - 5 where ${thatRow}`);
      expect((await get<Report>(path)).text).toBe(before.text);
    });

    test("a team renamed to a name of the same length is shown under its new name on past days too", async () => {
      const path = `/global/spend/report?start_date=${START}&end_date=${TODAY}`;
      type Report = { group_by_day: string; teams: { team_id: string | null; team_name: string }[] }[];
      const namesOf = (body: Report) => new Set(body.flatMap((d) => d.teams.filter((t) => t.team_id === s.teamB).map((t) => `${d.group_by_day} ${t.team_name}`)));
      const before = await get<Report>(path);
      const pastDays = before.body.filter((d) => d.group_by_day !== TODAY && d.teams.some((t) => t.team_id === s.teamB));
      expect(pastDays.length).toBeGreaterThan(0);
      await must(gw, "POST", "/team/update", { team_id: s.teamB, team_alias: "gamma-tmx" });
      try {
        const after = await get<Report>(path);
        expect(namesOf(after.body)).toEqual(new Set([...namesOf(before.body)].map((n) => n.replace("beta-team", "gamma-tmx"))));
      } finally {
        await must(gw, "POST", "/team/update", { team_id: s.teamB, team_alias: "beta-team" });
      }
      expect((await get<Report>(path)).text).toBe(before.text);
    });

    test("finished days' parts are stored; another instance serves them while they are current and sees renames made on the first", async () => {
      const path = `/global/spend/report?start_date=${START}&end_date=${TODAY}`;
      type Report = { group_by_day: string; teams: { team_id: string | null; team_name: string }[] }[];
      const first = await get<Report>(path);
      const pastDays = first.body.map((d) => d.group_by_day).filter((d) => d !== TODAY);
      expect(pastDays.length).toBeGreaterThan(0);
      const storedDays = async () => new Set((await q(sql`select day::text as day from report_parts where body like '{"group_by_day":%,"teams":%'`)).map((r) => String(r.day)));
      const allStored = async () => {
        const days = await storedDays();
        return days.size === pastDays.length && pastDays.every((d) => days.has(d));
      };
      expect(await until(allStored)).toBe(true);
      expect((await storedDays()).has(TODAY)).toBe(false); // today still changes: not stored
      if (backend !== "postgres") return; // the embedded store has one instance

      const day = pastDays[0]!;
      const marker = `{"group_by_day":"${day}","teams":[{"team_name":"from the store","team_id":null,"spend":0,"keys":[]}]}`;
      await q(sql`update report_parts set body = ${marker} where day = ${day}::date and body like '{"group_by_day":%,"teams":%'`);
      const other = await startTestGateway(CONFIG, { store: { databaseUrl: (gw as TestGateway & { databaseUrl: string }).databaseUrl } });
      try {
        const otherGet = <T>(p: string) => requestJson<T>(other, "GET", p, { key: MASTER_KEY });
        // The other instance reads the stored part (the altered one shows); the first keeps its own.
        const served = await otherGet<Report>(path);
        expect(served.body.find((d) => d.group_by_day === day)!.teams.map((t) => t.team_name)).toEqual(["from the store"]);
        expect(served.body.filter((d) => d.group_by_day !== day)).toEqual(first.body.filter((d) => d.group_by_day !== day));
        expect((await get<Report>(path)).text).toBe(first.text);
        // A write to that day makes the stored part stale: it is rebuilt, and stored again.
        await q(sql`update daily_spend set api_requests = api_requests where entity_type = 'team' and date = ${day}::date`);
        expect((await otherGet<Report>(path)).text).toBe(first.text);
        expect(await until(async () => (await q(sql`select 1 from report_parts where day = ${day}::date and body = ${marker}`)).length === 0)).toBe(true);
        // A team renamed on the first instance is renamed in the other's answer, on past days too.
        await must(gw, "POST", "/team/update", { team_id: s.teamB, team_alias: "renamed-beta" });
        try {
          const renamed = await otherGet<Report>(path);
          const namesOfB = renamed.body.flatMap((d) => d.teams.filter((t) => t.team_id === s.teamB).map((t) => t.team_name));
          expect(namesOfB.length).toBeGreaterThan(1);
          expect(new Set(namesOfB)).toEqual(new Set(["renamed-beta"]));
        } finally {
          await must(gw, "POST", "/team/update", { team_id: s.teamB, team_alias: "beta-team" });
        }
        // Daily activity: the same parts on both instances; a key alias changed on the first shows on the other.
        const activity = `/team/daily/activity?start_date=${START}&end_date=${TODAY}`;
        expect((await otherGet<Json>(activity)).text).toBe((await get<Json>(activity)).text);
        await must(gw, "POST", "/key/update", { key: s.keys.a1.token, key_alias: "k-a1-renamed" });
        try {
          expect((await otherGet<Json>(activity)).text).toContain('"key_alias":"k-a1-renamed"');
        } finally {
          await must(gw, "POST", "/key/update", { key: s.keys.a1.token, key_alias: "k-a1" });
        }
      } finally {
        await other.stop();
      }
    });

    test("daily activity asked again after more calls shows them", async () => {
      const path = `/team/daily/activity?start_date=${START}&end_date=${TODAY}&team_ids=${s.teamA}`;
      const requests = (body: { metadata: { total_api_requests: number }; results: { total_requests: number }[] }) => [
        body.metadata.total_api_requests,
        body.results.reduce((n, r) => n + r.total_requests, 0),
      ];
      type Activity = { metadata: { total_api_requests: number }; results: { total_requests: number }[] };
      const before = await get<Activity>(path);
      expect((await get<Activity>(path)).text).toBe(before.text);
      expect(await chat(gw, s.keys.a1.key, "alpha-model", "and one more")).toBe(200);
      await gw.host!.spendWriter.flush();
      const after = await get<Activity>(path);
      const [b0, b1] = requests(before.body);
      expect(requests(after.body)).toEqual([b0! + 1, b1! + 1]);
    });

    test("/team/daily/activity and /organization/daily/activity agree with the log, per day and per breakdown", async () => {
      type Activity = {
        results: { date: string; total_spend: number; total_requests: number; metrics: Json; breakdown: Record<string, Record<string, { metrics: Json }>> }[];
        metadata: Json;
      };
      const cases = [
        { path: `/team/daily/activity?start_date=${START}&end_date=${TODAY}`, where: sql`team_id is not null`, entity: sql`team_id` },
        { path: `/team/daily/activity?team_ids=${s.teamA}`, where: sql`team_id = ${s.teamA}`, entity: sql`team_id` },
        { path: `/team/daily/activity?exclude_team_ids=${s.teamA}`, where: sql`team_id = ${s.teamB}`, entity: sql`team_id` },
        { path: `/organization/daily/activity?organization_ids=${s.org}`, where: sql`organization_id = ${s.org}`, entity: sql`organization_id` },
      ];
      for (const c of cases) {
        const r = await get<Activity>(c.path);
        expect(r.status).toBe(200);
        const perDay = await q(sql`select ${utcDay} as d, sum(spend)::text as spend, sum(prompt_tokens)::int as prompt_tokens, sum(completion_tokens)::int as completion_tokens,
          sum(cache_read_input_tokens)::int as cache_read, count(*)::int as api_requests, count(*) filter (where status = 'success')::int as ok,
          count(*) filter (where status <> 'success')::int as failed from spend_logs where ${c.where} group by 1 order by 1 desc`);
        expect(r.body.results.map((d) => d.date)).toEqual(perDay.map((d) => String(d.d)));
        for (const [i, day] of r.body.results.entries()) {
          const e = perDay[i]!;
          expect(day.metrics).toEqual({
            spend: Number(e.spend),
            prompt_tokens: e.prompt_tokens,
            completion_tokens: e.completion_tokens,
            cache_read_input_tokens: e.cache_read,
            cache_creation_input_tokens: 0,
            total_tokens: (e.prompt_tokens as number) + (e.completion_tokens as number),
            successful_requests: e.ok,
            failed_requests: e.failed,
            api_requests: e.api_requests,
          });
          expect(day.total_spend).toBe(Number(e.spend));
          expect(day.total_requests).toBe(e.api_requests as number);
          const dayWhere = sql`${c.where} and ${utcDay} = ${day.date}`;
          const spendOf = (b: Record<string, { metrics: Json }>) => Object.fromEntries(Object.entries(b).map(([k, v]) => [k, v.metrics.spend]));
          expect(spendOf(day.breakdown.entities!)).toEqual(await sums(c.entity, dayWhere));
          expect(spendOf(day.breakdown.model_groups!)).toEqual(await sums(sql`model_group`, dayWhere));
          expect(spendOf(day.breakdown.providers!)).toEqual(await sums(sql`provider`, dayWhere));
          expect(spendOf(day.breakdown.api_keys!)).toEqual(await sums(sql`api_key`, dayWhere));
        }
        const [t] = await q(sql`select sum(spend)::text as spend, count(*)::int as n, sum(total_tokens)::int as tokens from spend_logs where ${c.where}`);
        expect(r.body.metadata).toMatchObject({ total_spend: Number(t!.spend), total_api_requests: t!.n, total_tokens: t!.tokens, page: 1, total_pages: 1, has_more: false });
      }
      const paged = await get<Activity>(`/team/daily/activity?page_size=1&page=2`);
      expect(paged.body.results).toHaveLength(1);
      expect(paged.body.metadata).toMatchObject({ page: 2, total_pages: 3, has_more: true });
      expect(paged.body.results[0]!.breakdown.api_keys![s.keys.a1.token]).toMatchObject({ metadata: { key_alias: "k-a1", team_id: s.teamA } });
      expect((await get("/team/daily/activity?page_size=1001")).status).toBe(422);
      expect((await get("/organization/daily/activity?start_date=2024-02-30")).status).toBe(422);
    });

    test("/spend/tags and /global/spend/tags count calls and spend per request tag", async () => {
      const found = await q(sql`select tag, count(*)::int as n, sum(spend)::text as spend from (select distinct unnest(request_tags) as tag, call_id, spend from spend_logs) t group by tag`);
      const expected = Object.fromEntries(found.map((f) => [f.tag, { log_count: f.n, total_spend: Number(f.spend) }]));
      for (const path of ["/spend/tags", `/global/spend/tags?start_date=${START}&end_date=${TODAY}`]) {
        const r = await get<{ individual_request_tag: string; log_count: number; total_spend: number }[]>(path);
        expect(r.status).toBe(200);
        expect(Object.fromEntries(r.body.map((t) => [t.individual_request_tag, { log_count: t.log_count, total_spend: t.total_spend }]))).toEqual(expected);
        expect(r.body.map((t) => t.total_spend)).toEqual([...r.body.map((t) => t.total_spend)].sort((a, b) => b - a));
      }
      const some = await get<{ individual_request_tag: string }[]>("/spend/tags?tags=t-blue,t-green");
      expect(some.body.map((t) => t.individual_request_tag).sort()).toEqual(["t-blue", "t-green"]);
    });

    test("/provider/budgets: the configured budget with this period's spend", async () => {
      const r = await get<{ providers: Record<string, Json> }>("/provider/budgets");
      expect(r.status).toBe(200);
      const midnight = Date.parse(`${TODAY}T00:00:00Z`);
      const [today] = await q(sql`select sum(spend)::text as spend from spend_logs where provider = 'mock' and start_time >= ${new Date(midnight).toISOString()}::timestamptz`);
      expect(r.body.providers).toEqual({ mock: { budget_limit: 1000, time_period: "1d", spend: Number(today!.spend), budget_reset_at: new Date(midnight + DAY).toISOString() } });
    });

    test("/spend/keys and /spend/users list spend, highest first", async () => {
      const keys = await get<{ token: string; spend: number; key_alias: string | null }[]>("/spend/keys");
      expect(keys.status).toBe(200);
      const stored = await q(sql`select token, spend::text as spend from virtual_keys where deleted_at is null`);
      expect(Object.fromEntries(keys.body.map((k) => [k.token, k.spend]))).toEqual(Object.fromEntries(stored.map((k) => [k.token, Number(k.spend)])));
      expect(keys.body.map((k) => k.spend)).toEqual([...keys.body.map((k) => k.spend)].sort((a, b) => b - a));
      expect(JSON.stringify(keys.body)).not.toContain(s.keys.a1.key);
      expect((await get<unknown[]>("/spend/keys?limit=2")).body).toHaveLength(2);
      const people = await get<{ user_id: string; spend: number }[]>("/spend/users");
      expect(people.body.map((u) => u.spend)).toEqual([...people.body.map((u) => u.spend)].sort((a, b) => b - a));
      const [ann] = await q(sql`select spend::text as spend from users where user_id = 'u-ann'`);
      expect(people.body.find((u) => u.user_id === "u-ann")!.spend).toBe(Number(ann!.spend));
      expect((await get("/spend/keys?limit=0")).status).toBe(422);
    });

    test("a team admin reads its own team's spend only; other callers are refused", async () => {
      const adm = s.keys.admin.key;
      const logs = await get<Json[]>(`/spend/logs?team_id=${s.teamA}&summarize=false&limit=100`, adm);
      expect(logs.status).toBe(200);
      expect(logs.body.length).toBeGreaterThan(0);
      expect(logs.body.every((l) => l.team_id === s.teamA)).toBe(true);
      const v2 = await get<{ data: Json[]; total: number }>(`/spend/logs/v2?team_id=${s.teamA}&start_date=${START}&end_date=${TODAY}`, adm);
      const [n] = await q(sql`select count(*)::int as n from spend_logs where team_id = ${s.teamA}`);
      expect(v2.body.total).toBe(n!.n as number);
      // Team-key use (team_id): an array of the daily activity records, the same records as the
      // paginated answer's (which a proxy admin gets with team_ids), every day of the range.
      const activity = await get<{ date: string; breakdown: { entities: Json } }[]>(`/team/daily/activity?team_id=${s.teamA}`, adm);
      expect(activity.status).toBe(200);
      expect(Array.isArray(activity.body)).toBe(true);
      expect(activity.body.length).toBeGreaterThan(0);
      expect(new Set(activity.body.flatMap((r) => Object.keys(r.breakdown.entities)))).toEqual(new Set([s.teamA]));
      const paginated = await get<{ results: Json[] }>(`/team/daily/activity?team_ids=${s.teamA}&page_size=1000`);
      expect(activity.body).toEqual(paginated.body.results as never);
      const onePage = await get<Json[]>(`/team/daily/activity?team_id=${s.teamA}&page_size=1`, adm);
      expect(onePage.body).toEqual(activity.body.slice(0, 1) as never);
      for (const path of [`/spend/logs?team_id=${s.teamB}`, `/spend/logs/v2?team_id=${s.teamB}&start_date=${START}&end_date=${TODAY}`, `/team/daily/activity?team_id=${s.teamB}`, "/team/daily/activity?team_id=no-such-team"]) {
        const r = await get<{ error: Json }>(path, adm);
        expect(r.status, path).toBe(403);
        expect(r.body.error.code).toBe("403");
      }
      // team_id is required in team-key use: leaving it out is a validation failure (422), as the spec's Conventions say.
      for (const path of ["/spend/logs", "/team/daily/activity"]) {
        const r = await get<{ error: Json }>(path, adm);
        expect(r.status, path).toBe(422);
        expect(r.body.error).toMatchObject({ type: "validation_error", param: "team_id", code: "422" });
      }
      for (const path of ["/global/spend/report?start_date=2024-01-01&end_date=2024-01-02", "/spend/tags", "/spend/keys", "/provider/budgets", "/organization/daily/activity"]) {
        expect((await get(path, adm)).status, path).toBe(403);
      }
      // A key without admin rights in any team.
      expect((await get(`/spend/logs?team_id=${s.teamA}`, s.keys.a1.key)).status).toBe(403);
    });

    test("/spend/calculate prices an estimate or a finished response at the model's prices", async () => {
      const calc = (body: unknown) => requestJson<{ cost: number }>(gw, "POST", "/spend/calculate", { body });
      const messages = [{ role: "user", content: "How much would this cost?" }];
      const estimate = await calc({ model: "alpha-model", messages });
      expect(estimate.status).toBe(200);
      expect(estimate.body.cost).toBeCloseTo(estimatePromptTokens("chat", { model: "alpha-model", messages } as never) * 0.000001, 15);
      const finished = await calc({ completion_response: { model: "beta-model", usage: { prompt_tokens: 1000, completion_tokens: 500 } } });
      expect(finished.body).toEqual({ cost: 0.00595 });
      // The upstream model name a response carries resolves too.
      expect((await calc({ completion_response: { model: "mock/beta", usage: { prompt_tokens: 1000, completion_tokens: 500 } } })).body).toEqual({ cost: 0.00595 });
      // Cached audio, in cached_tokens and audio_tokens both, priced once: 1,000 text at $5, 1,000 cached text at
      // $2.50, 2,000 audio at $100, 6,000 cached audio at $20, 500 text out at $20 per million = $0.3375 (not $0.8275).
      const realtime = {
        prompt_tokens: 10_000,
        completion_tokens: 500,
        prompt_tokens_details: { cached_tokens: 7_000, audio_tokens: 8_000, cached_tokens_details: { text_tokens: 1_000, audio_tokens: 6_000 } },
      };
      expect((await calc({ completion_response: { model: "realtime-model", usage: realtime } })).body).toEqual({ cost: 0.3375 });
      // A cached part larger than its prompt is bounded by it, as a call's usage is: 10 cached of 10, not 50 tokens.
      const overCached = await calc({ completion_response: { model: "beta-model", usage: { prompt_tokens: 10, completion_tokens: 0, prompt_tokens_details: { cached_tokens: 50 } } } });
      const allCached = await calc({ completion_response: { model: "beta-model", usage: { prompt_tokens: 10, completion_tokens: 0, prompt_tokens_details: { cached_tokens: 10 } } } });
      expect(overCached.body).toEqual(allCached.body);
      expect((await calc({ model: "no-such-model", messages })).body).toEqual({ cost: 0 });
      expect((await calc({ model: "alpha-model" })).status).toBe(400);
      expect((await calc({ completion_response: { model: "beta-model", usage: { prompt_tokens: -1 } } })).status).toBe(422);
    });

    test("/global/spend/reset sets every key's and team's spend to 0 (not users' or organizations'), keeps the log, and budgets count from 0 again", async () => {
      const limited = await must<{ key: string; token: string }>(gw, "POST", "/key/generate", { key_alias: "k-limited", max_budget: 0.0001 });
      let status = 200;
      for (let i = 0; i < 20 && status === 200; i++) status = await chat(gw, limited.key, "alpha-model", "spend it", { max_tokens: 5 });
      expect(status).toBe(400);
      await gw.host!.spendWriter.flush();
      const before = await q(sql`select (select count(*) from spend_logs)::int as logs, (select sum(spend)::text from daily_spend) as daily`);
      const [charged] = await q(sql`select (select count(*) from virtual_keys where spend <> 0)::int as keys, (select count(*) from teams where spend <> 0)::int as teams,
        (select count(*) from team_members where spend <> 0)::int as team_members`);
      const [others] = await q(sql`select (select sum(spend)::text from organizations) as orgs, (select sum(spend)::text from users) as users`);
      expect(charged!.keys).toBeGreaterThan(0);
      expect(charged!.teams).toBeGreaterThan(0);
      expect(Number(others!.orgs)).toBeGreaterThan(0);
      expect(Number(others!.users)).toBeGreaterThan(0);
      const r = await requestJson(gw, "POST", "/global/spend/reset", {});
      expect(r.status).toBe(200);
      expect(r.body).toEqual({ message: "Spend for all API Keys and Teams reset successfully", status: "success" });
      const [counters] = await q(sql`select (select count(*) from virtual_keys where spend <> 0)::int as keys, (select count(*) from teams where spend <> 0)::int as teams,
        (select count(*) from team_members where spend <> 0)::int as team_members`);
      expect(counters).toEqual({ keys: 0, teams: 0, team_members: 0 });
      // The spec's reset is of keys and teams: users' and organizations' spend (and budgets) stay.
      expect((await q(sql`select (select sum(spend)::text from organizations) as orgs, (select sum(spend)::text from users) as users`))[0]).toEqual(others!);
      expect(await q(sql`select (select count(*) from spend_logs)::int as logs, (select sum(spend)::text from daily_spend) as daily`)).toEqual(before);
      expect(await chat(gw, limited.key, "alpha-model", "again", { max_tokens: 5 })).toBe(200);
      const audits = await rows<{ updated_values: unknown }>(gw.host!.store.db, sql`select updated_values from audit_log where action = 'spend_reset' and object_id = 'all'`);
      // The audit row says how many of each were reset.
      expect(audits).toHaveLength(1);
      expect(audits[0]!.updated_values).toEqual({ rows_reset: charged });
      expect((await requestJson(gw, "POST", "/global/spend/reset", { key: s.keys.admin.key })).status).toBe(403);
    });

    test("report amounts are exact decimals: 16 significant digits too, not the nearest double's text", async () => {
      const at = Date.now() - 2 * DAY;
      const entry = (spendPico: number): SpendEntry =>
        spendEntry(at, { apiKey: s.keys.b1.token, keyAlias: "k-b1", userId: "u-bob", teamId: s.teamB, endUser: "cust-exact", model: "beta-model", modelGroup: "beta-model", upstreamModel: "beta", spendPico });
      // $8,847.415857622158 + $0.000000000001: 16 digits, whose nearest double prints as 8847.41585762216.
      await writeBatch(gw.host!.store, [entry(8_847_415_857_622_158), entry(1)]);
      const day = dayOf(at);
      const byKey = await get(`/global/spend/report?start_date=${day}&end_date=${day}&group_by=api_key`);
      expect(byKey.text).toContain(`{"api_key":"${s.keys.b1.token}","total_cost":8847.415857622159,`);
      const byCustomer = await get(`/global/spend/report?start_date=${day}&end_date=${day}&group_by=customer`);
      expect(byCustomer.text).toContain(`{"customer":"cust-exact","total_cost":8847.415857622159,`);
    });

    test("daily activity names a rotated key (key_alias, team_id) for the spend made before each rotation too, under the hashes it had then", async () => {
      const first = await must<{ key: string; token: string }>(gw, "POST", "/key/generate", { key_alias: "k-rotated", team_id: s.teamA });
      const tokens = [first.token];
      let key = first.key;
      for (let rotation = 0; rotation < 2; rotation++) {
        expect(await chat(gw, key, "alpha-model", `before rotation ${rotation}`)).toBe(200);
        const next = await must<{ key: string; token: string }>(gw, "POST", "/key/regenerate", { key });
        key = next.key;
        tokens.push(next.token);
      }
      expect(await chat(gw, key, "alpha-model", "after the rotations")).toBe(200);
      await gw.host!.spendWriter.flush();
      type Activity = { results: { breakdown: { api_keys: Record<string, { metadata: Json }> } }[] };
      const activity = await get<Activity>(`/team/daily/activity?start_date=${TODAY}&end_date=${TODAY}&team_ids=${s.teamA}`);
      const keys = activity.body.results.find((r) => tokens.every((t) => t in r.breakdown.api_keys))?.breakdown.api_keys;
      expect(tokens.map((t) => [t, keys?.[t]?.metadata])).toEqual(tokens.map((t) => [t, { key_alias: "k-rotated", team_id: s.teamA }]));
    });
  });
}
