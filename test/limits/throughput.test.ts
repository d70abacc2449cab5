// Throughput types on a model group whose deployments set rpm: guaranteed keys must fit in the
// group's capacity when written (400 otherwise), and keep their share at run time because other
// keys only share what is left; dynamic keys split what is left among the keys active on the group.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { MASTER_KEY } from "../harness/gateway.ts";

let gw: TestGateway;

async function call(key: string, model: string): Promise<{ status: number; message?: string }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] }),
  });
  const body = (await res.json()) as { error?: { message: string } };
  return { status: res.status, message: body.error?.message };
}

async function successes(key: string, model: string, n: number): Promise<number> {
  let ok = 0;
  for (let i = 0; i < n; i++) if ((await call(key, model)).status === 200) ok++;
  return ok;
}

const MODELS = [
  { model_name: "g", svc_params: { model: "mock/g1", rpm: 5 } },
  { model_name: "g", svc_params: { model: "mock/g2", rpm: 5 } },
  { model_name: "d", svc_params: { model: "mock/d", rpm: 6 } },
  { model_name: "e", svc_params: { model: "mock/e", rpm: 5 } },
  { model_name: "h", svc_params: { model: "mock/h", rpm: 10 } },
  { model_name: "k", svc_params: { model: "mock/k", rpm: 6 } },
  { model_name: "u", svc_params: { model: "mock/u", rpm: 10 } },
  { model_name: "x", svc_params: { model: "mock/x", rpm: 4 } },
  { model_name: "ta", svc_params: { model: "mock/ta", rpm: 10 } },
  { model_name: "tb", svc_params: { model: "mock/tb" } },
  { model_name: "tr", svc_params: { model: "mock/tr", rpm: 20 } },
  { model_name: "tm", svc_params: { model: "mock/tm", rpm: 10 } },
  { model_name: "mk", svc_params: { model: "mock/mk", rpm: 5 } },
  { model_name: "gz", svc_params: { model: "mock/gz", rpm: 10 } },
  { model_name: "rz", svc_params: { model: "mock/rz", rpm: 10 } },
  { model_name: "al", svc_params: { model: "mock/al", rpm: 10 } },
  { model_name: "al2", svc_params: { model: "mock/al2", rpm: 10 } },
  { model_name: "wild/*", svc_params: { model: "mock/*", rpm: 10 } },
  { model_name: "wild/own", svc_params: { model: "mock/own", rpm: 3 } },
];
const config = (models = MODELS) => ({
  model_list: models,
  router_settings: { model_group_alias: { "al-alias": "al", "al2-alias": "al2" } },
  general_settings: { master_key: MASTER_KEY },
});

beforeAll(async () => {
  gw = await startBackendGateway("pglite", config());
});
afterAll(async () => gw?.stop());

describe("guaranteed_throughput", () => {
  let a: string;
  let b: string;
  test("keys whose guaranteed rpm would exceed the model's capacity are refused with 400", async () => {
    const first = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { models: ["g"], rpm_limit: 6, rpm_limit_type: "guaranteed_throughput" } });
    expect(first.status).toBe(200);
    a = first.body.key;
    const over = await requestJson<{ error: { message: string; param: string } }>(gw, "POST", "/key/generate", { body: { models: ["g"], rpm_limit: 5, rpm_limit_type: "guaranteed_throughput" } });
    expect(over.status).toBe(400);
    expect(over.body.error.message).toContain("model g serves 10 rpm");
    expect(over.body.error.message).toContain("at most 4");
    expect(over.body.error.param).toBe("rpm_limit");
    const fits = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["g"], rpm_limit: 3, rpm_limit_type: "guaranteed_throughput" } });
    expect(fits.status).toBe(200);
    b = fits.body.key;
    // Raising a guaranteed key past what is left is refused too.
    const raise = await requestJson(gw, "POST", "/key/update", { body: { key: first.body.token, rpm_limit: 8 } });
    expect(raise.status).toBe(400);
    // A key limited to another model does not draw on g.
    expect((await requestJson(gw, "POST", "/key/generate", { body: { models: ["e"], rpm_limit: 5, rpm_limit_type: "guaranteed_throughput" } })).status).toBe(200);
  });

  test("/key/regenerate with limits that do not fit is refused as /key/update is, and rotates nothing", async () => {
    type Refusal = { error: { message: string; type: string; param: string; code: string } };
    // a (6) and b (3) reserve 9 of g's 10: a raised to 8 does not fit, in either route.
    const update = await requestJson<Refusal>(gw, "POST", "/key/update", { body: { key: a, rpm_limit: 8 } });
    const regenerate = await requestJson<Refusal>(gw, "POST", "/key/regenerate", { body: { key: a, rpm_limit: 8 } });
    expect(update.status).toBe(400);
    expect(regenerate.status).toBe(400);
    expect(regenerate.body.error).toEqual(update.body.error);
    // A best-effort key made guaranteed through the path form: 1 rpm is left, 2 is refused.
    const other = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["g"] } });
    const guaranteed = { rpm_limit: 2, rpm_limit_type: "guaranteed_throughput" };
    const byUpdate = await requestJson<Refusal>(gw, "POST", "/key/update", { body: { key: other.body.key, ...guaranteed } });
    const byPath = await requestJson<Refusal>(gw, "POST", `/key/${other.body.key}/regenerate`, { body: guaranteed });
    expect(byPath.status).toBe(400);
    expect(byPath.body.error.message).toContain("at most 1");
    expect(byPath.body.error).toEqual(byUpdate.body.error);
    // Neither key was rotated or changed: their values still work, with their old limits.
    const info = async (key: string) => requestJson<{ info: { rpm_limit: number | null; rpm_limit_type: string | null } }>(gw, "GET", `/key/info?key=${key}`);
    expect((await info(a)).body.info).toMatchObject({ rpm_limit: 6, rpm_limit_type: "guaranteed_throughput" });
    expect((await info(other.body.key)).body.info).toMatchObject({ rpm_limit: null, rpm_limit_type: null });
  });

  test("at run time other keys share only what the guaranteed keys leave; the guaranteed share stays free", async () => {
    const other = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: {} })).body.key;
    // 10 rpm - 9 reserved = 1 for everyone else.
    expect(await successes(other, "g", 3)).toBe(1);
    const refused = await call(other, "g");
    expect(refused.status).toBe(429);
    expect(refused.message).toContain("capacity left after guaranteed keys");
    expect(await successes(a, "g", 7)).toBe(6);
    expect(await successes(b, "g", 4)).toBe(3);
  });

  test("the master key, a caller without a key row, shares only what the guaranteed keys leave too", async () => {
    const reserved = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { models: ["mk"], rpm_limit: 3, rpm_limit_type: "guaranteed_throughput" } });
    expect(reserved.status).toBe(200);
    // 5 rpm - 3 reserved = 2 for the master key.
    expect(await successes(MASTER_KEY, "mk", 4)).toBe(2);
    const refused = await call(MASTER_KEY, "mk");
    expect(refused.status).toBe(429);
    expect(refused.message).toContain("capacity left after guaranteed keys");
    expect(await successes(reserved.body.key, "mk", 3)).toBe(3);
  });
});

describe("guaranteed_throughput: which keys reserve", () => {
  const guaranteed = (rpm: number, extra: Record<string, unknown>) => requestJson<{ key: string; error?: { message: string } }>(gw, "POST", "/key/generate", { body: { rpm_limit: rpm, rpm_limit_type: "guaranteed_throughput", ...extra } });

  test("a key whose models name the group through an access group, all-proxy-models or a wildcard reserves on it", async () => {
    expect((await requestJson(gw, "POST", "/access_group/new", { body: { access_group: "ag-h", model_names: ["h"] } })).status).toBe(200);
    expect((await guaranteed(8, { models: ["ag-h"] })).status).toBe(200);
    // 8 of h's 10 are reserved: each of these may call h, and does not fit.
    for (const models of [["h"], ["all-proxy-models"], ["*"], ["mock/*", "h*"]]) {
      const over = await guaranteed(3, { models });
      expect([models, over.status]).toEqual([models, 400]);
      // The catch-alls may call g too, whose reservations are checked first.
      expect(over.body.error?.message).toMatch(/model [gh] serves 10 rpm/);
    }
    expect((await guaranteed(2, { models: ["h"] })).status).toBe(200);
  });

  test("a key that reaches the group through an alias (model_group_alias, its own, its team's or its organization's aliases) reserves on it", async () => {
    const first = await guaranteed(6, { models: ["al"] });
    expect(first.status).toBe(200);
    expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: "al-team", models: ["t-al"], model_aliases: { "t-al": "al" } } })).status).toBe(200);
    expect((await requestJson(gw, "POST", "/organization/new", { body: { organization_id: "al-org", organization_alias: "al-org", models: ["o-al"], model_aliases: { "o-al": "al" } } })).status).toBe(200);
    // 6 of al's 10 are reserved: each of these may call al (a model call of theirs reaches it), and 5 does not fit.
    for (const extra of [{ models: ["al-alias"] }, { models: ["mine"], aliases: { mine: "al" } }, { team_id: "al-team" }, { organization_id: "al-org" }]) {
      const over = await guaranteed(5, extra);
      expect([extra, over.status, over.body.error?.message]).toEqual([extra, 400, expect.stringMatching(/^guaranteed_throughput: model al serves 10 rpm .*other keys already reserve 6, .*\(at most 4\)/)]);
    }
    // Through an alias a key claims its share as by the group's name: the 4 left.
    const byAlias = await guaranteed(4, { models: ["al-alias"] });
    expect(byAlias.status).toBe(200);
    // At run time too: al is fully reserved, so nothing is left for anyone else ...
    const refused = await call(MASTER_KEY, "al");
    expect([refused.status, refused.message]).toEqual([429, expect.stringContaining("capacity left after guaranteed keys")]);
    // ... and each guaranteed key finds its share free, the one that calls through the alias too.
    expect(await successes(byAlias.body.key, "al-alias", 4)).toBe(4);
    expect(await successes(first.body.key, "al", 6)).toBe(6);
  });

  test("a team or organization write that gives its keys an alias onto a full group is refused as a key write is", async () => {
    expect((await guaranteed(8, { models: ["al2"] })).status).toBe(200);
    expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: "al2-team", models: ["t-al2"] } })).status).toBe(200);
    expect((await guaranteed(5, { team_id: "al2-team" })).status).toBe(200);
    const team = await requestJson<{ error: { message: string; param: string } }>(gw, "POST", "/team/update", { body: { team_id: "al2-team", model_aliases: { "t-al2": "al2" } } });
    expect([team.status, team.body.error?.param]).toEqual([400, "model_aliases"]);
    expect(team.body.error.message).toContain("model al2 serves 10 rpm");
    expect((await requestJson(gw, "POST", "/organization/new", { body: { organization_id: "al2-org", organization_alias: "al2-org", models: ["o-al2"] } })).status).toBe(200);
    expect((await guaranteed(5, { organization_id: "al2-org" })).status).toBe(200);
    const org = await requestJson<{ error: { message: string; param: string } }>(gw, "PATCH", "/organization/update", { body: { organization_id: "al2-org", model_aliases: { "o-al2": "al2" } } });
    expect([org.status, org.body.error?.param]).toEqual([400, "model_aliases"]);
    expect(org.body.error.message).toContain("model al2 serves 10 rpm");
  });

  test("a key whose organization or user may not call the group neither reserves on it nor is checked against it", async () => {
    expect((await guaranteed(5, { models: ["gz"] })).status).toBe(200);
    expect((await requestJson(gw, "POST", "/organization/new", { body: { organization_id: "org-no-gz", organization_alias: "org-no-gz", models: ["tb"] } })).status).toBe(200);
    expect((await requestJson(gw, "POST", "/user/new", { body: { user_id: "user-no-gz", models: ["tb"], auto_create_key: false } })).status).toBe(200);
    // Neither key may call gz (a model call would be a 401), so neither is refused for gz's capacity ...
    const inOrg = await guaranteed(6, { organization_id: "org-no-gz" });
    expect([inOrg.status, inOrg.body.error?.message]).toEqual([200, undefined]);
    expect((await call(inOrg.body.key, "gz")).status).toBe(401);
    const ofUser = await guaranteed(6, { user_id: "user-no-gz" });
    expect([ofUser.status, ofUser.body.error?.message]).toEqual([200, undefined]);
    // ... nor takes any of it: the other 5 are still free.
    expect((await guaranteed(5, { models: ["gz"] })).status).toBe(200);
    // gz is now booked in full: letting the organization or the user call it would overbook it.
    const widenOrg = await requestJson<{ error: { message: string } }>(gw, "PATCH", "/organization/update", { body: { organization_id: "org-no-gz", models: ["tb", "gz"] } });
    expect(widenOrg.status).toBe(400);
    expect(widenOrg.body.error.message).toContain("model gz serves 10 rpm");
    const widenUser = await requestJson<{ error: { message: string } }>(gw, "POST", "/user/update", { body: { user_id: "user-no-gz", models: ["tb", "gz"] } });
    expect(widenUser.status).toBe(400);
    expect(widenUser.body.error.message).toContain("model gz serves 10 rpm");
  });

  test("an expired key reserves nothing", async () => {
    expect((await guaranteed(5, { models: ["k"], duration: "1s" })).status).toBe(200);
    await Bun.sleep(1_500);
    expect((await guaranteed(5, { models: ["k"] })).status).toBe(200);
  });

  test("at run time too: once a guaranteed key expires, the others get its share back", async () => {
    expect((await guaranteed(3, { models: ["x"], duration: "2s" })).status).toBe(200);
    const other = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: {} })).body.key;
    // 4 rpm - 3 reserved = 1 for everyone else.
    expect(await successes(other, "x", 2)).toBe(1);
    await Bun.sleep(2_500);
    // The reservation is gone with its key: 3 more fit in the minute.
    expect(await successes(other, "x", 4)).toBe(3);
  });

  test("unblocking a guaranteed key claims its share again: refused (400) when another key took it meanwhile", async () => {
    const first = await guaranteed(8, { models: ["u"] });
    expect((await requestJson(gw, "POST", "/key/block", { body: { key: first.body.key } })).status).toBe(200);
    expect((await guaranteed(8, { models: ["u"] })).status).toBe(200);
    const unblock = await requestJson<{ error: { message: string } }>(gw, "POST", "/key/unblock", { body: { key: first.body.key } });
    expect(unblock.status).toBe(400);
    expect(unblock.body.error.message).toContain("model u serves 10 rpm");
    const info = await requestJson<{ info: { blocked: boolean } }>(gw, "GET", `/key/info?key=${first.body.key}`);
    expect(info.body.info.blocked).toBe(true);
  });
});

describe("guaranteed_throughput: a wildcard route is one group, whose deployments every name it serves shares", () => {
  const guaranteed = (rpm: number, models: string[]) => requestJson<{ key: string; error?: { message: string } }>(gw, "POST", "/key/generate", { body: { rpm_limit: rpm, rpm_limit_type: "guaranteed_throughput", models } });

  test("a key that may call a name it serves reserves on the route, checked when written as a group is", async () => {
    const first = await guaranteed(6, ["wild/x"]);
    expect(first.status).toBe(200);
    // Whichever names they may call under wild/*, they draw on its deployments' 10 rpm, of which 6 are reserved
    // (the catch-alls may call groups whose reservations are checked first).
    for (const models of [["wild/x"], ["wild/y"], ["wild/*"], ["*"], ["wild/y*"]]) {
      const over = await guaranteed(5, models);
      expect([models, over.status, over.body.error?.message]).toEqual([models, 400, expect.stringMatching(/model (wild\/\*|wild\/own|g|h) serves/)]);
    }
    expect((await guaranteed(5, ["wild/y"])).body.error?.message).toMatch(/^guaranteed_throughput: model wild\/\* serves 10 rpm .*other keys already reserve 6, .*\(at most 4\)/);
    // A name with a group of its own is that group's, not the route's.
    expect((await guaranteed(3, ["wild/own"])).status).toBe(200);
    const second = await guaranteed(4, ["wild/y"]);
    expect(second.status).toBe(200);
    // At run time the route's capacity is taken by its guaranteed keys, whatever name is called ...
    const refused = await call(MASTER_KEY, "wild/z");
    expect([refused.status, refused.message]).toEqual([429, expect.stringContaining("Model wild/* (capacity left after guaranteed keys)")]);
    // ... and each guaranteed key finds its share free.
    expect(await successes(first.body.key, "wild/x", 6)).toBe(6);
    expect(await successes(second.body.key, "wild/y", 4)).toBe(4);
  });
});

describe("guaranteed_throughput: team and model writes that would overbook are refused as key writes are", () => {
  type Refusal = { error: { message: string; param: string } };
  const guaranteed = async (rpm: number, extra: Record<string, unknown>) => {
    const res = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { rpm_limit: rpm, rpm_limit_type: "guaranteed_throughput", ...extra } });
    expect(res.status).toBe(200);
    return res.body.key;
  };

  test("/team/update and /team/model/add widening a team's models onto a group its guaranteed keys do not fit in", async () => {
    const a = await guaranteed(6, { models: ["ta"] });
    expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: "gt-models", models: ["tb"] } })).status).toBe(200);
    await guaranteed(8, { team_id: "gt-models" });
    for (const [path, body] of [
      ["/team/update", { team_id: "gt-models", models: ["ta"] }],
      ["/team/model/add", { team_id: "gt-models", models: ["ta"] }],
    ] as const) {
      const widen = await requestJson<Refusal>(gw, "POST", path, { body });
      expect([path, widen.status]).toEqual([path, 400]);
      expect(widen.body.error.message).toContain("model ta serves 10 rpm");
      expect(widen.body.error.param).toBe("models");
    }
    // Nothing was written: the guaranteed key of 6 still finds its share free.
    expect(await successes(a, "ta", 6)).toBe(6);
  });

  test("/team/update lowering the team's limit below what its guaranteed keys reserve", async () => {
    expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: "gt-limit", models: ["tr"], rpm_limit: 10 } })).status).toBe(200);
    await guaranteed(6, { team_id: "gt-limit" });
    const lower = await requestJson<Refusal>(gw, "POST", "/team/update", { body: { team_id: "gt-limit", rpm_limit: 3 } });
    expect(lower.status).toBe(400);
    expect(lower.body.error.message).toContain("team gt-limit has rpm_limit 3");
    expect(lower.body.error.param).toBe("rpm_limit");
    expect((await requestJson(gw, "POST", "/team/update", { body: { team_id: "gt-limit", rpm_limit: 6 } })).status).toBe(200);
  });

  test("/model/delete and /model/update shrinking a group below what guaranteed keys reserve on it", async () => {
    const extra = { model_name: "tm", svc_params: { model: "mock/tm2", rpm: 5 }, model_info: { id: "tm-extra" } };
    expect((await requestJson(gw, "POST", "/model/new", { body: extra })).status).toBe(200);
    await guaranteed(8, { models: ["tm"] });
    await guaranteed(7, { models: ["tm"] });
    const removed = await requestJson<Refusal>(gw, "POST", "/model/delete", { body: { id: "tm-extra" } });
    expect(removed.status).toBe(400);
    expect(removed.body.error.message).toContain("model tm serves 10 rpm");
    const shrunk = await requestJson<Refusal>(gw, "POST", "/model/update", { body: { ...extra, svc_params: { model: "mock/tm2", rpm: 4 } } });
    expect(shrunk.status).toBe(400);
    expect(shrunk.body.error.message).toContain("model tm serves 14 rpm");
    const moved = await requestJson<Refusal>(gw, "PATCH", "/model/tm-extra/update", { body: { model_name: "tm-elsewhere" } });
    expect(moved.status).toBe(400);
    // A change that keeps the capacity is fine.
    expect((await requestJson(gw, "PATCH", "/model/tm-extra/update", { body: { model_info: { note: "kept" } } })).status).toBe(200);
  });

  test("an access group given a group its guaranteed keys would overbook is refused (/access_group/{g}/update), naming the key", async () => {
    expect((await requestJson(gw, "POST", "/model/new", { body: { model_name: "agw", svc_params: { model: "mock/agw", rpm: 10 } } })).status).toBe(200);
    expect((await requestJson(gw, "POST", "/model/new", { body: { model_name: "agx", svc_params: { model: "mock/agx", rpm: 10 } } })).status).toBe(200);
    const group = await requestJson<{ access_group_id: string }>(gw, "POST", "/access_group/new", { body: { access_group: "ag-widen", model_names: ["agw"] } });
    expect(group.status).toBe(200);
    await guaranteed(8, { models: ["ag-widen"] });
    await guaranteed(8, { models: ["agx"] });
    // Giving ag-widen agx would promise agx 16 rpm of its 10.
    const widened = await requestJson<{ error: { message: string; param: string } }>(gw, "PUT", `/v1/access_group/${group.body.access_group_id}`, { body: { model_names: ["agw", "agx"] } });
    expect([widened.status, widened.body.error?.param]).toEqual([400, "model_names"]);
    expect(widened.body.error.message).toMatch(/^Key sk-.*: guaranteed_throughput: model agx serves 10 rpm/);
    expect((await requestJson(gw, "GET", `/v1/access_group/${group.body.access_group_id}`)).body).toMatchObject({ model_names: ["agw"] });
    // One that fits is taken.
    expect((await requestJson(gw, "PUT", `/v1/access_group/${group.body.access_group_id}`, { body: { model_names: ["agw"], description: "same" } })).status).toBe(200);
  });

  test("/model/new of a group (or a wildcard route) that guaranteed keys already reserve more of than it serves", async () => {
    const reserved = await guaranteed(8, { models: ["nm", "nw/a"] });
    for (const [model_name, model] of [
      ["nm", "mock/nm"],
      ["nw/*", "mock/*"],
    ] as const) {
      const created = await requestJson<Refusal>(gw, "POST", "/model/new", { body: { model_name, svc_params: { model, rpm: 5 } } });
      expect([model_name, created.status, created.body.error?.param]).toEqual([model_name, 400, "svc_params"]);
      expect(created.body.error.message).toMatch(new RegExp(`^Key sk-.*: guaranteed_throughput: model ${model_name.replace("*", "\\*")} serves 5 rpm .*other keys already reserve 0, so this key's rpm_limit 8 does not fit`));
    }
    // Nothing was created: the names are served by no group, and the other keys are not left a pool of 0.
    expect((await call(MASTER_KEY, "nm")).status).toBe(400);
    // One that holds the reservation is taken, and the guaranteed key finds its share free.
    expect((await requestJson(gw, "POST", "/model/new", { body: { model_name: "nm", svc_params: { model: "mock/nm", rpm: 9 } } })).status).toBe(200);
    expect(await successes(reserved, "nm", 8)).toBe(8);
  });
});

describe("dynamic", () => {
  test("a model's capacity is split among the keys active on it", async () => {
    const gen = async () => (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { rpm_limit_type: "dynamic" } })).body.key;
    const [d1, d2] = [await gen(), await gen()];
    // Alone, d1 may use the whole capacity (6); it uses 1.
    expect((await call(d1, "d")).status).toBe(200);
    // d2 arrives: each now gets 6 / 2 = 3.
    expect(await successes(d2, "d", 4)).toBe(3);
    expect(await successes(d1, "d", 4)).toBe(2);
    const refused = await call(d1, "d");
    expect(refused.status).toBe(429);
    expect(refused.message).toContain("dynamic share of model=d");
  });
});

describe("a config reload", () => {
  test("that leaves a group serving less than its guaranteed keys reserve is taken, and says so", async () => {
    expect((await requestJson(gw, "POST", "/key/generate", { body: { key_alias: "rz-guaranteed", models: ["rz"], rpm_limit: 8, rpm_limit_type: "guaranteed_throughput" } })).status).toBe(200);
    const warned = () => gw.log.lines.filter((l) => l.msg.startsWith("config reloaded with guaranteed_throughput keys reserving more"));
    gw.writeConfig(config(MODELS.map((m) => (m.model_name === "rz" ? { model_name: "rz", svc_params: { model: "mock/rz", rpm: 4 } } : m))));
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect(warned().map((l) => String(l.fields?.problem))).toEqual([expect.stringContaining("Key rz-guaranteed: guaranteed_throughput: model rz serves 4 rpm")]);
    // Back to a capacity that holds it: taken without a word.
    gw.writeConfig(config());
    expect((await gw.live.reload("test")).ok).toBe(true);
    expect(warned().length).toBe(1);
  });
});
