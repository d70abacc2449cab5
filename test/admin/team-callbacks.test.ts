// A team's logging callbacks: its admin registers webhooks (header values encrypted at rest and
// hidden on read), every finished call of the team, success or failure, is posted to them with
// billing metadata only, other teams' calls are not, the team's budget alerts (its own and its
// members') go there too, and
// disable_logging stops it all (and keeps the team's prompts and answers out of the spend log and the
// config's logging callbacks). A named logging provider the gateway cannot deliver to is a 400;
// only proxy admins and the team's admins may touch the settings.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { lookup } from "node:dns/promises";
import { hostname, tmpdir } from "node:os";
import { join, relative, resolve } from "node:path";
import { sql } from "drizzle-orm";
import { isPrivateHost } from "../../core/private-host.ts";
import { encrypt, secretKey } from "../../core/secrets.ts";
import { rows } from "../../core/store/sql.ts";
import { sink } from "../fixtures/plugins/echo.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

/** A config logging callback (`echo-all`) that keeps every record it gets here; plugin paths are relative to the config's temp folder. */
const ECHO = relative(join(tmpdir(), "gw-test-anything"), resolve(import.meta.dir, "../fixtures/plugins/echo.ts"));
const logged = sink("team-callbacks-test");
/** A provider `slow/…` whose streams take about a second (20 chunks, 50 ms apart). */
const SLOW = relative(join(tmpdir(), "gw-test-anything"), resolve(import.meta.dir, "../fixtures/plugins/slow-provider.ts"));
const SLOW_REPLY = "an-answer-that-must-not-be-kept";

interface Delivery {
  headers: Record<string, string>;
  body: Record<string, unknown>;
}

/** A name (this host's own) that no literal check catches but that resolves to a loopback or private address here, if any. */
const inwardName = await lookup(hostname(), { all: true }).then(
  (a) => (!isPrivateHost(hostname()) && a.some((x) => isPrivateHost(x.address)) ? hostname() : undefined),
  () => undefined,
);

const HOOK_TOKEN = "Bearer hook-secret-value-42";
const PROMPT = "a prompt that must not leave the gateway";

let gw: TestGateway;
let hookServer: ReturnType<typeof Bun.serve>;
const deliveries: Delivery[] = [];
/** `/hang/…` webhooks hold every request until `hangs` is off (and these are let go). */
let hangs = true;
const hung: (() => void)[] = [];
const keys: Record<"admin" | "member" | "otherAdmin" | "otherTeam", string> = { admin: "", member: "", otherAdmin: "", otherTeam: "" };

async function newKey(body: Record<string, unknown>): Promise<string> {
  const r = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body });
  expect(r.status).toBe(200);
  return r.body.key;
}

async function chat(key: string, model: string): Promise<number> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: PROMPT }] }),
  });
  await res.text();
  return res.status;
}

async function until(check: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!check() && Date.now() < end) await Bun.sleep(20);
}

beforeAll(async () => {
  hookServer = Bun.serve({
    port: 0,
    async fetch(req) {
      if (new URL(req.url).pathname.startsWith("/hang/") && hangs) return new Promise<Response>((resolve) => hung.push(() => resolve(new Response("ok"))));
      deliveries.push({ headers: Object.fromEntries(req.headers), body: (await req.json()) as Record<string, unknown> });
      return new Response("ok");
    },
  });
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "chat", svc_params: { model: "mock/chat" }, model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } },
      { model_name: "broken", svc_params: { model: "openai/gpt-4o", api_base: "http://127.0.0.1:9/v1", api_key: "sk-upstream-0123456789" } },
      { model_name: "slow", svc_params: { model: "slow/chat" } },
    ],
    plugins: [
      { path: ECHO, config: { sink: "team-callbacks-test" } },
      { path: SLOW, config: { reply: SLOW_REPLY, chunks: 20, delayMs: 50 } },
    ],
    svc_settings: { callbacks: ["echo-all"] },
    general_settings: { master_key: MASTER_KEY, store_prompts_in_spend_logs: true, budget_alert_thresholds: [0.65] },
  });
  for (const user_id of ["cb-admin", "cb-member", "cb-other-admin"]) expect((await requestJson(gw, "POST", "/user/new", { body: { user_id } })).status).toBe(200);
  const team = await requestJson(gw, "POST", "/team/new", {
    body: { team_id: "cb-team", soft_budget: 0.0000001, members_with_roles: [{ role: "admin", user_id: "cb-admin" }, { role: "user", user_id: "cb-member" }] },
  });
  expect(team.status).toBe(200);
  const other = await requestJson(gw, "POST", "/team/new", { body: { team_id: "cb-other", members_with_roles: [{ role: "admin", user_id: "cb-other-admin" }] } });
  expect(other.status).toBe(200);
  keys.admin = await newKey({ team_id: "cb-team", user_id: "cb-admin" });
  keys.member = await newKey({ team_id: "cb-team", user_id: "cb-member" });
  keys.otherAdmin = await newKey({ team_id: "cb-other", user_id: "cb-other-admin" });
  keys.otherTeam = await newKey({ team_id: "cb-other" });
});
afterAll(async () => {
  hangs = false;
  for (const let_go of hung.splice(0)) let_go();
  await gw?.stop();
  hookServer?.stop(true);
});

describe("team logging callbacks", () => {
  test("only proxy admins and the team's admins manage them; a provider the gateway cannot deliver to is a 400", async () => {
    const body = { callbacks: [{ callback_type: "webhook", url: `http://127.0.0.1:${hookServer.port}/hook` }] };
    for (const key of [keys.member, keys.otherAdmin, keys.otherTeam]) {
      expect((await requestJson(gw, "POST", "/team/cb-team/callback", { key, body })).status).toBe(403);
      expect((await requestJson(gw, "GET", "/team/cb-team/callback", { key })).status).toBe(403);
    }
    expect((await requestJson(gw, "POST", "/team/no-such-team/callback", { body })).status).toBe(404);
    const langfuse = await requestJson<{ error: { message: string; param: string } }>(gw, "POST", "/team/cb-team/callback", {
      body: { callback_name: "langfuse", callback_type: "success", callback_vars: { langfuse_public_key: "pk", langfuse_secret_key: "sk" } },
    });
    expect(langfuse.status).toBe(400);
    expect(langfuse.body.error.message).toContain("webhooks only");
    const badUrl = await requestJson(gw, "POST", "/team/cb-team/callback", { body: { callbacks: [{ callback_type: "webhook", url: "ftp://x" }] } });
    expect(badUrl.status).toBe(422);
    for (const url of ["http://", "https://exa mple.com/x"]) {
      const unreadable = await requestJson(gw, "POST", "/team/cb-team/callback", { key: keys.admin, body: { callbacks: [{ callback_type: "webhook", url }] } });
      expect([url, unreadable.status]).toEqual([url, 400]);
    }
  });

  test("a team admin may not point a webhook at this machine or a private network (SSRF); a proxy admin may", async () => {
    const hook = (url: string) => ({ callbacks: [{ callback_type: "webhook", url }] });
    expect((await requestJson(gw, "POST", "/team/cb-team/callback", { key: keys.admin, body: hook("https://hooks.example.invalid/in") })).status).toBe(200);
    const privateUrls = [`http://127.0.0.1:${hookServer.port}/hook`, "http://169.254.169.254/latest/meta-data", "http://[::1]:8080/", "http://localhost/x", "http://10.1.2.3/", "http://192.168.0.9/", "http://2130706433/", `http://localhost.:${hookServer.port}/hook`, "http://foo.localhost./x"];
    for (const url of privateUrls) {
      const r = await requestJson<{ error: { message: string } }>(gw, "POST", "/team/cb-team/callback", { key: keys.admin, body: hook(url) });
      expect([url, r.status]).toEqual([url, 400]);
      expect(r.body.error.message).toContain("only a proxy admin");
    }
  });

  test("a webhook's header value is encrypted at rest and hidden on read", async () => {
    const url = `http://127.0.0.1:${hookServer.port}/hook`;
    // A test server on this machine: only a proxy admin may register it.
    const added = await requestJson<{ status: string; data: Record<string, unknown> }>(gw, "POST", "/team/cb-team/callback", {
      body: { callbacks: [{ callback_type: "webhook", url, headers: { authorization: HOOK_TOKEN } }] },
    });
    expect(added.status).toBe(200);
    const expected = {
      team_id: "cb-team",
      success_callbacks: ["webhook"],
      failure_callbacks: ["webhook"],
      callback_vars: { webhooks: [{ url, headers: { authorization: "[redacted]" } }] },
    };
    expect(added.body).toEqual({ status: "success", data: expected });
    const read = await requestJson(gw, "GET", "/team/cb-team/callback", { key: keys.admin });
    expect(read.body).toEqual({ status: "success", data: expected });
    expect(JSON.stringify((await requestJson(gw, "GET", "/team/info?team_id=cb-team")).body)).not.toContain("hook-secret-value");
    // The team's admin reads the webhook's address; a `user` member (403 on GET /team/{id}/callback)
    // only its origin, in /team/info and /user/info alike: a path or query may be a token.
    const webhooksSeenBy = async (key: string, path: string) => JSON.stringify((await requestJson(gw, "GET", path, { key })).body);
    expect(await webhooksSeenBy(keys.admin, "/team/info?team_id=cb-team")).toContain(`"url":"${url}"`);
    for (const path of ["/team/info?team_id=cb-team", "/user/info?user_id=cb-member"]) {
      const seen = await webhooksSeenBy(keys.member, path);
      expect(seen, path).not.toContain("/hook");
      expect(seen, path).toContain(`"url":"http://127.0.0.1:${hookServer.port}/[redacted]"`);
    }
    const [stored] = await rows<{ settings: string }>(gw.host!.store.db, sql`select callback_settings::text as settings from teams where team_id = 'cb-team'`);
    expect(stored!.settings).not.toContain("hook-secret-value");
    expect(stored!.settings).toContain("enc:v1:");
  });

  test("each finished call of the team reaches the webhook with its headers and billing metadata only; other teams' calls do not", async () => {
    deliveries.length = 0;
    expect(await chat(keys.member, "chat")).toBe(200);
    expect(await chat(keys.member, "broken")).toBe(503);
    expect(await chat(keys.otherTeam, "chat")).toBe(200);
    await until(() => deliveries.filter((d) => d.body.event === "llm_call").length >= 2);
    await Bun.sleep(200);
    const calls = deliveries.filter((d) => d.body.event === "llm_call");
    expect(calls.map((d) => [d.body.model_group, d.body.status])).toEqual([
      ["chat", "success"],
      ["broken", "failure"],
    ]);
    for (const d of calls) {
      expect(d.headers.authorization).toBe(HOOK_TOKEN);
      expect(d.body.team_id).toBe("cb-team");
      expect(JSON.stringify(d.body)).not.toContain(PROMPT);
    }
    expect(calls[0]!.body.response_cost as number).toBeGreaterThan(0);
    expect(calls[0]!.body.total_tokens as number).toBeGreaterThan(0);
    expect((calls[1]!.body.error as { code: string }).code).toBe("503");
    // The team crossed its soft budget with that first call: the alert went to its webhook too.
    await until(() => deliveries.some((d) => d.body.event === "soft_budget_crossed"));
    expect(deliveries.find((d) => d.body.event === "soft_budget_crossed")?.body).toMatchObject({ team_id: "cb-team", event_group: "team" });
  });

  test("a webhook listed twice, in any spelling of its URL, is a 400 naming it, and the team's set is unchanged", async () => {
    const url = `http://127.0.0.1:${hookServer.port}/hook`;
    const other = `http://127.0.0.1:${hookServer.port}/other`;
    const before = await requestJson(gw, "GET", "/team/cb-team/callback");
    // Each list, and the entry that repeats an earlier one (the first spelling is named too when it differs).
    const lists: [string[], string][] = [
      [[url, url], url],
      [[url, `HTTP://127.0.0.1:${hookServer.port}/hook#again`], `HTTP://127.0.0.1:${hookServer.port}/hook#again`],
      [[url, other, `HTTP://127.0.0.1:${hookServer.port}/hook`], `HTTP://127.0.0.1:${hookServer.port}/hook`],
      [["https://hooks.example.invalid/in", "https://Hooks.Example.Invalid:443/in"], "https://Hooks.Example.Invalid:443/in"],
      [["http://hooks.example.invalid:80", "http://hooks.example.invalid/"], "http://hooks.example.invalid/"],
    ];
    for (const [urls, duplicate] of lists) {
      const twice = await requestJson<{ error: Record<string, unknown> }>(gw, "POST", "/team/cb-team/callback", { body: { callbacks: urls.map((u) => ({ callback_type: "webhook", url: u })) } });
      expect(twice.body).toEqual({ error: { message: expect.stringContaining(`Webhook ${duplicate} is listed twice`), type: "invalid_request_error", param: "callbacks", code: "400" } });
      expect(twice.status).toBe(400);
      if (duplicate !== urls[0]) expect(twice.body.error.message).toContain(`(as ${urls[0]})`);
    }
    expect((await requestJson(gw, "GET", "/team/cb-team/callback")).body).toEqual(before.body);
  });

  test("a webhook stored twice (before registration refused it) gets each call once and is shown once wherever the team's settings are read", async () => {
    const [stored] = await rows<{ settings: string }>(gw.host!.store.db, sql`select callback_settings::text as settings from teams where team_id = 'cb-team'`);
    const before = JSON.parse(stored!.settings) as { webhooks: { url: string; headers: Record<string, string> }[] };
    const [hook] = before.webhooks;
    const settings = { ...before, webhooks: [hook, { ...hook, url: hook!.url.replace("http://", "HTTP://") }, hook] };
    await gw.host!.store.db.execute(sql`update teams set callback_settings = ${JSON.stringify(settings)}::json where team_id = 'cb-team'`);
    await gw.host!.services.identity!.apply({ kind: "team", teamId: "cb-team" });
    const read = await requestJson<{ data: { callback_vars: { webhooks: unknown[] } } }>(gw, "GET", "/team/cb-team/callback");
    expect(read.body.data.callback_vars.webhooks).toEqual([{ url: hook!.url, headers: { authorization: "[redacted]" } }]);
    // The settings as a team's info, the team list and its organization's info show them: that webhook once, its header value hidden.
    const once = { ...before, webhooks: [{ url: hook!.url, headers: { authorization: "[redacted]" } }] };
    const info = await requestJson<{ team_info: { callback_settings: unknown } }>(gw, "GET", "/team/info?team_id=cb-team");
    expect(info.body.team_info.callback_settings).toEqual(once);
    const list = await requestJson<{ team_id: string; callback_settings: unknown }[]>(gw, "GET", "/team/list");
    expect(list.body.find((t) => t.team_id === "cb-team")?.callback_settings).toEqual(once);
    expect((await requestJson(gw, "POST", "/organization/new", { body: { organization_id: "cb-org", organization_alias: "cb-org" } })).status).toBe(200);
    await gw.host!.store.db.execute(sql`update teams set organization_id = 'cb-org' where team_id = 'cb-team'`);
    const org = await requestJson<{ teams: { team_id: string; callback_settings: unknown }[] }>(gw, "GET", "/organization/info?organization_id=cb-org");
    await gw.host!.store.db.execute(sql`update teams set organization_id = null where team_id = 'cb-team'`);
    expect(org.body.teams.map((t) => [t.team_id, t.callback_settings])).toEqual([["cb-team", once]]);
    deliveries.length = 0;
    expect(await chat(keys.member, "chat")).toBe(200);
    await until(() => deliveries.some((d) => d.body.event === "llm_call"));
    await gw.host!.spendWriter.flush();
    await Bun.sleep(300);
    expect(deliveries.filter((d) => d.body.event === "llm_call").length).toBe(1);
  });

  // LiteLLM #24952: SSRF through addresses a caller chooses. A name resolving inward is no way around the check.
  test.skipIf(!inwardName)("a team admin's webhook whose name resolves to this machine is refused, at registration and at every delivery", async () => {
    const url = `http://${inwardName}:${hookServer.port}/hook`;
    const r = await requestJson<{ error: { message: string } }>(gw, "POST", "/team/cb-team/callback", { key: keys.admin, body: { callbacks: [{ callback_type: "webhook", url }] } });
    expect(r.status).toBe(400);
    expect(r.body.error.message).toContain("only a proxy admin");
    // As if the name had resolved outside at registration and its record pointed inward since.
    const [stored] = await rows<{ settings: string }>(gw.host!.store.db, sql`select callback_settings::text as settings from teams where team_id = 'cb-team'`);
    const before = JSON.parse(stored!.settings) as Record<string, unknown>;
    const deliveredWith = async (webhook: Record<string, unknown>): Promise<number> => {
      await gw.host!.store.db.execute(sql`update teams set callback_settings = ${JSON.stringify({ ...before, webhooks: [webhook] })}::json where team_id = 'cb-team'`);
      await gw.host!.services.identity!.apply({ kind: "team", teamId: "cb-team" });
      deliveries.length = 0;
      expect(await chat(keys.member, "chat")).toBe(200);
      await gw.host!.spendWriter.flush();
      await Bun.sleep(300);
      return deliveries.filter((d) => d.body.event === "llm_call").length;
    };
    expect(await deliveredWith({ url, headers: {}, public_only: true })).toBe(0);
    // A proxy admin's webhook (no public_only) may be private.
    expect(await deliveredWith({ url, headers: {} })).toBe(1);
    await gw.host!.store.db.execute(sql`update teams set callback_settings = ${stored!.settings}::json where team_id = 'cb-team'`);
    await gw.host!.services.identity!.apply({ kind: "team", teamId: "cb-team" });
  });

  test("a webhook whose headers the current key cannot decrypt (the master key changed) is logged once, naming the team, and shown as broken; the others still get events", async () => {
    const [stored] = await rows<{ settings: string }>(gw.host!.store.db, sql`select callback_settings::text as settings from teams where team_id = 'cb-team'`);
    // Registered under the master key the gateway had before.
    const oldKey = secretKey(undefined, "sk-master-key-before-rotation")!;
    const base = `http://127.0.0.1:${hookServer.port}`;
    const webhooks = [
      { url: `${base}/with-header`, headers: { authorization: encrypt(HOOK_TOKEN, oldKey) } },
      { url: `${base}/plain`, headers: {} },
    ];
    const settings = { success_callback: ["webhook"], failure_callback: ["webhook"], webhooks };
    await gw.host!.store.db.execute(sql`update teams set callback_settings = ${JSON.stringify(settings)}::json where team_id = 'cb-team'`);
    await gw.host!.services.identity!.apply({ kind: "team", teamId: "cb-team" });
    const warnings = () => gw.log.lines.filter((l) => l.level === "warn" && l.msg.includes("cannot be decrypted") && l.fields?.team_id === "cb-team");
    // Said when the config is (re)loaded, before any call of the team.
    expect((await gw.live.reload("test", true)).ok).toBe(true);
    expect(warnings()).toHaveLength(1);
    expect(warnings()[0]!.fields?.webhook).toBe(base);
    deliveries.length = 0;
    expect(await chat(keys.member, "chat")).toBe(200);
    expect(await chat(keys.member, "chat")).toBe(200);
    await until(() => deliveries.length >= 2);
    await Bun.sleep(200);
    expect(deliveries.map((d) => d.headers.authorization ?? "none")).toEqual(["none", "none"]);
    expect(warnings()).toHaveLength(1);
    const shown = await requestJson<{ data: { callback_vars: { webhooks: Record<string, unknown>[] } } }>(gw, "GET", "/team/cb-team/callback", { key: keys.admin });
    const [broken, plain] = shown.body.data.callback_vars.webhooks;
    expect(broken).toMatchObject({ url: `${base}/with-header`, headers: { authorization: "[redacted]" }, status: "broken" });
    expect(broken!.error).toContain("register");
    expect(plain).toEqual({ url: `${base}/plain`, headers: {} });
    await gw.host!.store.db.execute(sql`update teams set callback_settings = ${stored!.settings}::json where team_id = 'cb-team'`);
    await gw.host!.services.identity!.apply({ kind: "team", teamId: "cb-team" });
  });

  test("disable_logging stops every delivery and leaves no callback", async () => {
    const off = await requestJson<{ status: string; data: Record<string, unknown> }>(gw, "POST", "/team/cb-team/disable_logging", { key: keys.admin });
    expect(off.status).toBe(200);
    expect(off.body.data).toEqual({ team_id: "cb-team", success_callbacks: [], failure_callbacks: [], callback_vars: { webhooks: [] } });
    deliveries.length = 0;
    expect(await chat(keys.member, "chat")).toBe(200);
    await gw.host!.spendWriter.flush();
    await Bun.sleep(300);
    expect(deliveries.filter((d) => d.body.event === "llm_call")).toEqual([]);
  });

  test("after disable_logging, the spend log and the config's logging callbacks get the team's calls without prompt or answer", async () => {
    expect((await requestJson(gw, "POST", "/team/cb-team/disable_logging", { key: keys.admin })).status).toBe(200);
    logged.length = 0;
    expect(await chat(keys.member, "chat")).toBe(200);
    // Another team's call is recorded with its content, as store_prompts_in_spend_logs asks.
    expect(await chat(keys.otherTeam, "chat")).toBe(200);
    await until(() => logged.length === 2);
    const byTeam = (team: string) => logged.find((e) => e.record.principal.teamId === team)!.record;
    expect(byTeam("cb-team")).toMatchObject({ status: "success", modelGroup: "chat" });
    expect(byTeam("cb-team").usage.promptTokens).toBeGreaterThan(0);
    expect(byTeam("cb-team").prompt).toBeUndefined();
    expect(byTeam("cb-team").answer).toBeUndefined();
    expect(JSON.stringify(byTeam("cb-other").prompt)).toContain(PROMPT);
    await gw.host!.spendWriter.flush();
    const rowOf = async (team: string) => {
      const found = await requestJson<{ call_id: string; messages: unknown; response: unknown; spend: number }[]>(gw, "GET", `/spend/logs?team_id=${team}&summarize=false`);
      return found.body.find((r) => r.call_id === byTeam(team).id)!;
    };
    const quiet = await rowOf("cb-team");
    expect(quiet).toMatchObject({ messages: {}, response: {} });
    expect(quiet.spend).toBeGreaterThan(0);
    expect(JSON.stringify((await rowOf("cb-other")).messages)).toContain(PROMPT);
    // Registering webhooks again turns logging back on.
    const on = await requestJson(gw, "POST", "/team/cb-team/callback", { body: { callbacks: [{ callback_type: "webhook", url: `http://127.0.0.1:${hookServer.port}/hook` }] } });
    expect(on.status).toBe(200);
    logged.length = 0;
    expect(await chat(keys.member, "chat")).toBe(200);
    await until(() => logged.length === 1);
    expect(JSON.stringify(logged[0]!.record.prompt)).toContain(PROMPT);
  });

  test("a team member's budget alert names the user, the team and the key, and reaches the team's webhooks", async () => {
    const made = await requestJson(gw, "POST", "/team/new", { body: { team_id: "cb-members", team_member_budget: 0.0001, members_with_roles: [{ role: "user", user_id: "cb-member" }] } });
    expect(made.status).toBe(200);
    const hook = await requestJson(gw, "POST", "/team/cb-members/callback", { body: { callbacks: [{ callback_type: "webhook", url: `http://127.0.0.1:${hookServer.port}/members` }] } });
    expect(hook.status).toBe(200);
    const { key, token } = (await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { team_id: "cb-members", user_id: "cb-member", key_alias: "members-key" } })).body;
    deliveries.length = 0;
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "chat", max_tokens: 14, messages: [{ role: "user", content: PROMPT }] }),
    });
    expect(res.status, await res.text()).toBe(200);
    await gw.host!.spendWriter.flush();
    await until(() => deliveries.some((d) => d.body.event_group === "team_member"));
    expect(deliveries.find((d) => d.body.event_group === "team_member")?.body).toMatchObject({
      event: "threshold_crossed",
      event_message: "Team Member Budget: 65% Threshold Crossed",
      budget: "User=cb-member in Team=cb-members",
      user_id: "cb-member",
      team_id: "cb-members",
      token,
      key_alias: "members-key",
    });
  });

  test("one team's webhooks that hang cost another team's webhook no events", async () => {
    // A team registers ten webhooks (the most it may) that never answer within the 10 s timeout.
    expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: "cb-hang" } })).status).toBe(200);
    const hangKey = await newKey({ team_id: "cb-hang" });
    const base = `http://127.0.0.1:${hookServer.port}`;
    const tenHung = { callbacks: Array.from({ length: 10 }, (_, i) => ({ callback_type: "webhook", url: `${base}/hang/${i}` })) };
    expect((await requestJson(gw, "POST", "/team/cb-hang/callback", { body: tenHung })).status).toBe(200);
    expect((await requestJson(gw, "POST", "/team/cb-other/callback", { body: { callbacks: [{ callback_type: "webhook", url: `${base}/other` }] } })).status).toBe(200);
    deliveries.length = 0;
    const calls = async (key: string, n: number) => {
      for (let i = 0; i < n; i += 4) expect(await Promise.all([0, 1, 2, 3].map(() => chat(key, "chat")))).toEqual([200, 200, 200, 200]);
    };
    // 16 calls of that team: 160 deliveries, more than the 128 under way for every webhook together.
    await calls(hangKey, 16);
    // Another team's webhook answers at once: it gets each of its team's calls within moments.
    await calls(keys.otherTeam, 60);
    const others = () => deliveries.filter((d) => d.body.event === "llm_call" && d.body.team_id === "cb-other").length;
    await until(() => others() >= 60, 3000);
    expect(others()).toBe(60);
    hangs = false;
    for (const let_go of hung.splice(0)) let_go();
  });

  test("a call still running when its team's logging is disabled is recorded without its prompt or answer", async () => {
    expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: "cb-inflight" } })).status).toBe(200);
    const key = await newKey({ team_id: "cb-inflight" });
    logged.length = 0;
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "slow", stream: true, messages: [{ role: "user", content: PROMPT }] }),
    });
    expect(res.status).toBe(200);
    const id = res.headers.get("x-svc-call-id");
    const reader = res.body!.getReader();
    await reader.read();
    const started = Date.now();
    // disable_logging returns while the stream still runs (about a second at the provider).
    expect((await requestJson(gw, "POST", "/team/cb-inflight/disable_logging")).status).toBe(200);
    expect(Date.now() - started).toBeLessThan(700);
    let text = "";
    for (let r = await reader.read(); !r.done; r = await reader.read()) text += new TextDecoder().decode(r.value);
    expect(text).toContain(SLOW_REPLY);
    // Recorded as the team is when the call ends: billing metadata only.
    await until(() => logged.some((e) => e.record.id === id));
    const record = logged.find((e) => e.record.id === id)!.record;
    expect(record).toMatchObject({ status: "success", modelGroup: "slow", stream: true });
    expect(record.prompt).toBeUndefined();
    expect(record.answer).toBeUndefined();
    await gw.host!.spendWriter.flush();
    const found = await requestJson<{ call_id: string; messages: unknown; response: unknown }[]>(gw, "GET", "/spend/logs?team_id=cb-inflight&summarize=false");
    const row = found.body.find((r) => r.call_id === id);
    expect(row).toMatchObject({ messages: {}, response: {} });
    expect(JSON.stringify(row)).not.toContain(PROMPT);
    expect(JSON.stringify(row)).not.toContain(SLOW_REPLY);
  });
});
