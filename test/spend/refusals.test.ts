// Budget refusals where LiteLLM gets them wrong:
// - #22726 / #20615: "Budget has been exceeded" with no budget set, or after spend a mis-priced
//   model ran up. Here spend without a budget (key, user, team) never refuses a call, a budget
//   removed stops refusing at once, and an admin spend reset makes room at once.
// - #35524: no reservation on audio and image routes, whose cost it cannot estimate. Here bursts of
//   transcriptions, speech and images reserve their worst case too: spend never passes the budget,
//   and a refusal says what the call was reserved at (not "set max_tokens", which they do not take).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import { rows } from "../../core/store/sql.ts";
import { wav } from "../harness/audio.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";

let gw: TestGateway;
beforeAll(async () => {
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "m", svc_params: { model: "mock/chat" }, model_info: { input_cost_per_token: 0.001, output_cost_per_token: 0.001 } },
      { model_name: "whisper", svc_params: { model: "mock/whisper-1" }, model_info: { mode: "audio_transcription", input_cost_per_second: 0.001 } },
      { model_name: "tts", svc_params: { model: "mock/tts-1" }, model_info: { mode: "audio_speech", input_cost_per_character: 0.001 } },
      { model_name: "img", svc_params: { model: "mock/dall-e-3" }, model_info: { mode: "image_generation", output_cost_per_image: 0.01 } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
});
afterAll(() => gw?.stop());

async function chat(key: string): Promise<number> {
  const r = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
  });
  await r.text();
  return r.status;
}

test("spend without a budget never refuses; a budget removed or a spend reset makes room at once", async () => {
  expect((await requestJson(gw, "POST", "/user/new", { body: { user_id: "nb-user", spend: 1e6 } })).status).toBe(200);
  expect((await requestJson(gw, "POST", "/team/new", { body: { team_id: "nb-team", members_with_roles: [{ role: "user", user_id: "nb-user" }] } })).status).toBe(200);
  const own = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { user_id: "nb-user", max_budget: null } });
  const team = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: "nb-team", user_id: "nb-user" } });
  expect((await requestJson(gw, "POST", "/key/update", { body: { key: own.body.token, spend: 123456 } })).status).toBe(200);
  for (let i = 0; i < 3; i++) expect([await chat(own.body.key), await chat(team.body.key)]).toEqual([200, 200]);
  // A budget below the spend refuses; removed, it refuses no more.
  expect((await requestJson(gw, "POST", "/key/update", { body: { key: own.body.token, max_budget: 1 } })).status).toBe(200);
  expect(await chat(own.body.key)).toBe(400);
  expect((await requestJson(gw, "POST", "/key/update", { body: { key: own.body.token, max_budget: null } })).status).toBe(200);
  expect(await chat(own.body.key)).toBe(200);
  // Spend a mis-priced model ran up: the admin resets it, and the budget has room again.
  expect((await requestJson(gw, "POST", "/key/update", { body: { key: own.body.token, max_budget: 100000 } })).status).toBe(200);
  expect(await chat(own.body.key)).toBe(400);
  expect((await requestJson(gw, "POST", `/key/${own.body.token}/reset_spend`, { body: { reset_to: 0 } })).status).toBe(200);
  expect(await chat(own.body.key)).toBe(200);
});

async function keySpend(token: string): Promise<number> {
  await gw.host!.spendWriter.flush();
  const [r] = await rows<{ spend: string }>(gw.host!.store.db, sql`select spend::text as spend from virtual_keys where token = ${token}`);
  return Number(r!.spend);
}

const MEDIA: Record<string, (key: string) => Promise<Response>> = {
  transcriptions: (key) => {
    const form = new FormData();
    form.append("model", "whisper");
    form.append("file", new File([new Uint8Array(15_000)], "a.wav", { type: "audio/wav" }));
    return fetch(`${gw.url}/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${key}` }, body: form });
  },
  speech: (key) =>
    fetch(`${gw.url}/v1/audio/speech`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "tts", input: "hello there", voice: "alloy" }),
    }),
  images: (key) =>
    fetch(`${gw.url}/v1/images/generations`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "img", prompt: "a cat" }),
    }),
};

test("bursts of transcriptions, speech and images stay within the budget; a refusal says what the call was reserved at", async () => {
  for (const [endpoint, send] of Object.entries(MEDIA)) {
    const { body } = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { max_budget: 0.05 } });
    const answers = await Promise.all(Array.from({ length: 30 }, async () => {
      const res = await send(body.key);
      return { status: res.status, text: await res.text() };
    }));
    expect([endpoint, answers.filter((a) => a.status !== 200 && a.status !== 400).map((a) => a.status)]).toEqual([endpoint, []]);
    expect([endpoint, answers.some((a) => a.status === 200)]).toEqual([endpoint, true]);
    expect([endpoint, (await keySpend(body.token)) <= 0.05]).toEqual([endpoint, true]);
    const refused = answers.find((a) => a.status === 400 && a.text.includes("Budget would be exceeded"));
    if (refused) expect([endpoint, refused.text.includes("max_tokens")]).toEqual([endpoint, false]);
  }
  // A file larger than the budget's room for its longest audio: refused before the call, saying why.
  const { body } = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { max_budget: 0.01 } });
  const form = new FormData();
  form.append("model", "whisper");
  form.append("file", new File([new Uint8Array(64_000)], "b.wav", { type: "audio/wav" }));
  const res = await fetch(`${gw.url}/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${body.key}` }, body: form });
  const text = await res.text();
  expect(res.status).toBe(400);
  expect(text).toContain("the longest audio its file could hold");
  expect(text).not.toContain("max_tokens");
});

// A WAV file's header tells its length: the reservation is that (with a small margin), not the
// longest audio a file of its size could hold at the lowest speech bitrate (about 40 times as
// long for 16 kHz 16-bit PCM), which refused a key with room for a minute a 30-second file.
test("a transcription of a WAV file reserves its length: a key with room for it is served, then refused when the room is spent", async () => {
  const { body } = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { max_budget: 0.05 } });
  const send = () => {
    const form = new FormData();
    form.append("model", "whisper");
    // 30 s of 16 kHz 16-bit mono: $0.03 at $0.001 a second (the generic bound: 1,281 s, $1.28).
    form.append("file", new File([wav({ dataBytes: 30 * 32_000 })], "speech.wav", { type: "audio/wav" }));
    return fetch(`${gw.url}/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${body.key}` }, body: form });
  };
  const first = await send();
  expect(first.status, await first.text()).toBe(200);
  expect(Number(first.headers.get("x-svc-response-cost"))).toBeCloseTo(0.03, 9);
  expect(await keySpend(body.token)).toBeCloseTo(0.03, 9);
  // $0.02 left, the next file reserves 32 s ($0.032): refused before the call.
  const second = await send();
  const text = await second.text();
  expect(second.status).toBe(400);
  expect(text).toContain("budget_exceeded");
  expect(await keySpend(body.token)).toBeCloseTo(0.03, 9);
});

// LiteLLM's refusals name the budget only in their message (#14144, #32597). Here the error also
// carries it in figures: which entity, its limit, spend, what calls in flight hold, what this call
// was reserved at, and when the budget resets; the OpenAI SDK hands it over as `error.budget`.
test("a refusal carries the refusing budget in figures, read through the OpenAI SDK", async () => {
  const { default: OpenAI } = await import("openai");
  const made = (await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { max_budget: 0.01 } })).body;
  const client = new OpenAI({ apiKey: made.key, baseURL: `${gw.url}/v1`, maxRetries: 0 });
  const refused = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 100 }).catch((e: unknown) => e);
  expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
  const error = (refused as InstanceType<typeof OpenAI.BadRequestError>).error as { type: string; budget: Record<string, unknown> };
  expect(error.type).toBe("budget_exceeded");
  expect(error.budget).toMatchObject({ entity: "key", id: made.token, max_budget: 0.01, spend: 0, reserved: 0, budget_reset_at: null });
  expect(error.budget.call_cost as number).toBeGreaterThan(0.01);

  // A team's budget, spent (its limit 0), with a period: no call cost, and when it resets.
  const team = (await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { max_budget: 0, budget_duration: "1d" } })).body.team_id;
  const teamKey = (await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team } })).body.key;
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${teamKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 5 }),
  });
  expect(res.status).toBe(400);
  const body = (await res.json()) as { error: { budget: Record<string, unknown> } };
  expect(body.error.budget).toEqual({ entity: "team", id: team, max_budget: 0, spend: 0, reserved: 0, budget_reset_at: expect.any(String) });
  // A day from the team's creation.
  expect(Date.parse(String(body.error.budget.budget_reset_at)) - Date.now()).toBeWithin(86_400_000 - 60_000, 86_400_000 + 1);
});
