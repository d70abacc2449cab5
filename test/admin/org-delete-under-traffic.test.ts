// /organization/delete while a spend batch charges its users, on PostgreSQL. The deletion detaches
// the organization's users (users.organization_id); their own keys (outside any team or
// organization) charge them, not the organization, and the spend writer locks the users it
// charges in id order (spend/flush.ts LOCK_ORDER). A deletion that took them in the order its scan
// met them could hold a user the batch waits for while waiting for one the batch holds: PostgreSQL
// then failed one of them after a second. The batch is played by hand here, between its two
// locks, so the overlap is certain.
import { expect, test } from "bun:test";
import postgres from "postgres";
import { MASTER_KEY, requestJson, startBackendGateway } from "../harness/gateway.ts";

test("/organization/delete while a spend batch holds the first of its users: it waits, then detaches both", async () => {
  const gw = await startBackendGateway("postgres", { model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" } }], general_settings: { master_key: MASTER_KEY } });
  const side = postgres(gw.databaseUrl!, { max: 1, onnotice: () => {} });
  try {
    const org = (await requestJson<{ organization_id: string }>(gw, "POST", "/organization/new", { body: { organization_alias: "o" } })).body.organization_id;
    // Created in the reverse of their id order: the table's order is not the ids'.
    for (const user_id of ["u-2", "u-1"]) expect((await requestJson(gw, "POST", "/user/new", { body: { user_id, organization_id: org } })).status).toBe(200);

    let deletion: Promise<{ status: number; text: string }> | undefined;
    const t0 = Date.now();
    await side.begin(async (tx) => {
      // The batch: the first user by id charged…
      await tx`update users set spend = spend + 1 where user_id = 'u-1'`;
      deletion = requestJson(gw, "DELETE", "/organization/delete", { body: { organization_ids: [org] } });
      await Bun.sleep(200);
      // …then the second.
      await tx`update users set spend = spend + 1 where user_id = 'u-2'`;
    });
    const res = await deletion!;
    expect(res.status).toBe(200);
    // It waited for the batch only, not for PostgreSQL's deadlock check (a second).
    expect(Date.now() - t0).toBeLessThan(900);
    const [row] = await side`select count(*)::int as n from users where organization_id is not null`;
    expect(row!.n).toBe(0);
    expect(gw.log.lines.filter((l) => l.level !== "info").map((l) => l.msg)).toEqual([]);
  } finally {
    await side.end();
    await gw.stop();
  }
}, 30_000);
