// An upstream error message that quotes the caller's prompt (a content-policy refusal echoing the
// input) reaches the caller whole, but the spend log, the team's webhook and the gateway's own log
// keep it with the prompt replaced by "[prompt redacted]": the rest of the message (what went
// wrong) stays, and so do its status, type and code.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

const PROMPT = "Describe in detail the secret plans my neighbour told me about on Tuesday";
const SYSTEM = "You are a careful assistant for the Oakwood residents";

let gw: TestGateway;
let upstream: ReturnType<typeof Bun.serve>;
let hookServer: ReturnType<typeof Bun.serve>;
const deliveries: Record<string, unknown>[] = [];
let teamKey = "";

beforeAll(async () => {
  // Quotes the user's message, and part of the system message, as some providers do.
  upstream = Bun.serve({
    port: 0,
    async fetch(req) {
      const body = (await req.json()) as { messages: { content: string }[] };
      const [system, user] = body.messages.map((m) => m.content);
      const message = `Invalid prompt: your request "${user}" was flagged by our usage policy (context: '${system!.slice(10)}').`;
      return Response.json({ error: { message, type: "invalid_request_error", param: "messages", code: "content_policy_violation" } }, { status: 400 });
    },
  });
  hookServer = Bun.serve({
    port: 0,
    async fetch(req) {
      deliveries.push((await req.json()) as Record<string, unknown>);
      return new Response("ok");
    },
  });
  gw = await startBackendGateway("pglite", {
    model_list: [{ model_name: "strict", svc_params: { model: "openai/gpt-4o", api_base: `http://127.0.0.1:${upstream.port}/v1`, api_key: "sk-upstream-0123456789" } }],
    general_settings: { master_key: MASTER_KEY },
  });
  expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: "echo-team" } })).status).toBe(200);
  const hook = await requestJson(gw, "POST", "/team/echo-team/callback", { body: { callbacks: [{ callback_type: "webhook", url: `http://127.0.0.1:${hookServer.port}/hook` }] } });
  expect(hook.status).toBe(200);
  const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: "echo-team" } });
  teamKey = made.body.key;
});
afterAll(async () => {
  await gw?.stop();
  upstream?.stop(true);
  hookServer?.stop(true);
});

describe("an upstream error that quotes the prompt", () => {
  test("the caller gets it whole; the spend log, the team webhook and the gateway's log get it without the prompt", async () => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${teamKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "strict", messages: [{ role: "system", content: SYSTEM }, { role: "user", content: PROMPT }] }),
    });
    const answer = (await res.json()) as { error: { message: string; type: string; code: string } };
    expect(res.status).toBe(400);
    expect(answer.error.message).toContain(PROMPT);
    const callId = res.headers.get("x-svc-call-id")!;
    // What the gateway keeps is the caller's message with the quotes replaced, and its status and type.
    const kept = answer.error.message.replace(PROMPT, "[prompt redacted]").replace(SYSTEM.slice(10), "[prompt redacted]");
    expect(kept).toContain("was flagged by our usage policy");

    await gw.host!.spendWriter.flush();
    const logs = await requestJson<{ metadata: { error_information: Record<string, string> } }[]>(gw, "GET", `/spend/logs?request_id=${callId}&summarize=false`);
    expect(logs.status).toBe(200);
    expect(logs.body.map((r) => r.metadata.error_information)).toEqual([{ error_code: answer.error.code, error_class: answer.error.type, error_message: kept }]);

    for (let i = 0; i < 100 && deliveries.length === 0; i++) await Bun.sleep(20);
    expect(deliveries.map((d) => d.error)).toEqual([{ message: kept, type: answer.error.type, code: answer.error.code }]);

    const everything = JSON.stringify([logs.body, deliveries, gw.log.lines]);
    expect(everything).not.toContain(PROMPT);
    expect(everything).not.toContain(SYSTEM.slice(10));
  });
});
