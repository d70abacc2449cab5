// Speech synthesis (`POST /v1/audio/speech`) through the official `openai` SDK: the audio comes back
// byte for byte as the upstream sent it (the mock upstream answers `ID3` and 10 bytes per input
// character), priced per input character (tts-1: $15 per million), reserved against budgets before
// the upstream is asked, and logged.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI, { BadRequestError, UnprocessableEntityError } from "openai";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { failure } from "../harness/util.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const UPSTREAM_KEY = "sk-upstream-speech-0123456789";
const TTS1_PER_CHARACTER = 15 / 1_000_000;

let mock: MockOpenAI;
let gw: TestGateway;
let client: OpenAI;

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "tts", svc_params: { model: "openai/tts-1", api_base: mock.url, api_key: UPSTREAM_KEY } },
      { model_name: "mock-tts", svc_params: { model: "mock/tts-1" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await gw?.stop();
  await mock?.stop();
});

describe("speech", () => {
  test("the upstream's audio reaches the SDK unchanged; the input's characters are priced and logged", async () => {
    mock.reset();
    const input = "Hello from the gateway.";
    const res = await client.audio.speech.create({ model: "tts", input, voice: "alloy" });
    expect(res.headers.get("content-type")).toBe("audio/mpeg");
    const audio = new Uint8Array(await res.arrayBuffer());
    expect(audio.length).toBe(3 + input.length * 10);
    expect(Buffer.from(audio.subarray(0, 3)).toString()).toBe("ID3");
    expect(mock.requests.at(-1)!.body).toEqual({ model: "tts-1", input, voice: "alloy" });
    const cost = Number(res.headers.get("x-svc-response-cost"));
    expect(cost).toBeCloseTo(input.length * TTS1_PER_CHARACTER, 12);
    await gw.host!.spendWriter.flush();
    const [row] = await rows<{ call_type: string; spend: string }>(gw.host!.store.db, sql`select call_type, spend::text as spend from spend_logs where call_id = ${res.headers.get("x-svc-call-id")}`);
    expect(row!.call_type).toBe("speech");
    expect(Number(row!.spend)).toBeCloseTo(input.length * TTS1_PER_CHARACTER, 12);
  });

  test("the built-in mock provider speaks in the asked format", async () => {
    const res = await client.audio.speech.create({ model: "mock-tts", input: "abc", voice: "alloy", response_format: "wav" });
    expect(res.headers.get("content-type")).toBe("audio/wav");
    expect(Buffer.from(new Uint8Array(await res.arrayBuffer()).subarray(0, 4)).toString()).toBe("RIFF");
  });

  test("a key's budget holds the input's price before the upstream is asked", async () => {
    const key = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { max_budget: 0.0001 } });
    const keyed = new OpenAI({ apiKey: key.body.key, baseURL: gw.baseURL, maxRetries: 0 });
    mock.reset();
    // 10 characters: $0.00015, over the $0.0001 budget.
    const refused = await failure(keyed.audio.speech.create({ model: "tts", input: "0123456789", voice: "alloy" }));
    expect(refused).toBeInstanceOf(BadRequestError);
    expect((refused as BadRequestError).type).toBe("budget_exceeded");
    expect(mock.requests).toHaveLength(0);
    const fits = await keyed.audio.speech.create({ model: "tts", input: "hi", voice: "alloy" });
    expect(fits.status).toBe(200);
  });

  test("bad requests name the field: no voice, an input over 4,096 characters, a speed out of range", async () => {
    for (const [body, field] of [
      [{ model: "tts", input: "x" }, "voice"],
      [{ model: "tts", input: "x".repeat(4097), voice: "alloy" }, "input"],
      [{ model: "tts", input: "x", voice: "alloy", speed: 5 }, "speed"],
    ] as const) {
      const err = await failure(client.audio.speech.create(body as never));
      expect(err).toBeInstanceOf(UnprocessableEntityError);
      expect((err as UnprocessableEntityError).param).toBe(field);
    }
  });
});
