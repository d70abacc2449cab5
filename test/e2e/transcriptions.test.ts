// Audio transcription (`POST /v1/audio/transcriptions`, multipart) through the official `openai`
// SDK, against the mock OpenAI upstream (which takes the file as 16 kHz 16-bit PCM: 32,000 bytes a
// second). whisper-1 is priced per second ($0.006 a minute), so the gateway always asks it for
// verbose_json (which reports the duration) and makes json, text, SRT or VTT from it;
// gpt-4o-transcribe is priced by its tokens ($6/M audio, $2.50/M text in, $10/M out). Budgets hold
// the most a file of that size can cost before the upstream is asked; every call is logged.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI, { BadRequestError, toFile } from "openai";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { failure } from "../harness/util.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const UPSTREAM_KEY = "sk-upstream-audio-0123456789";
const TEN_SECONDS = 320_000;
const WHISPER_PER_SECOND = 0.006 / 60;

let mock: MockOpenAI;
let gw: TestGateway;
let client: OpenAI;

const audio = async (bytes: number, name = "speech.wav") => toFile(new Uint8Array(bytes), name, { type: "audio/wav" });

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
  const upstream = (model: string) => ({ model, api_base: mock.url, api_key: UPSTREAM_KEY });
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "whisper", svc_params: upstream("openai/whisper-1") },
      { model_name: "transcribe", svc_params: upstream("openai/gpt-4o-transcribe") },
      { model_name: "mock-whisper", svc_params: { model: "mock/whisper-1" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await gw?.stop();
  await mock?.stop();
});

async function logRow(callId: string): Promise<Record<string, unknown> | undefined> {
  await gw.host!.spendWriter.flush();
  const [row] = await rows<Record<string, unknown>>(gw.host!.store.db, sql`select call_type, model, status, spend::text as spend from spend_logs where call_id = ${callId}`);
  return row;
}

describe("whisper-1 (priced per second)", () => {
  test("json: the file reaches the upstream as a form, the answer is {text, usage}, ten seconds cost $0.001 and are logged", async () => {
    mock.reset();
    const { data, response } = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper", language: "en" }).withResponse();
    expect(data.text).toBe(`Transcript of speech.wav (${TEN_SECONDS} bytes).`);
    expect((data as unknown as { usage: unknown }).usage).toEqual({ type: "duration", seconds: 10 });
    const sent = mock.requests.at(-1)!;
    expect(sent.path).toBe("/v1/audio/transcriptions");
    expect(sent.body).toMatchObject({ model: "whisper-1", language: "en", response_format: "verbose_json", file: { filename: "speech.wav", size: TEN_SECONDS } });
    expect(sent.headers.authorization).toBe(`Bearer ${UPSTREAM_KEY}`);
    expect(Number(response.headers.get("x-svc-response-cost"))).toBeCloseTo(10 * WHISPER_PER_SECOND, 12);
    const row = await logRow(response.headers.get("x-svc-call-id")!);
    expect(row).toMatchObject({ call_type: "transcriptions", model: "whisper", status: "success" });
    expect(Number(row!.spend)).toBeCloseTo(10 * WHISPER_PER_SECOND, 12);
  });

  test("text, srt and vtt are made from the timed answer, and priced the same", async () => {
    const text = `Transcript of speech.wav (${TEN_SECONDS} bytes).`;
    const plain = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper", response_format: "text" }).withResponse();
    expect(plain.data as unknown as string).toBe(`${text}\n`);
    expect(Number(plain.response.headers.get("x-svc-response-cost"))).toBeCloseTo(10 * WHISPER_PER_SECOND, 12);
    const srt = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper", response_format: "srt" });
    expect(srt as unknown as string).toBe(`1\n00:00:00,000 --> 00:00:10,000\n${text}\n\n`);
    const vtt = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper", response_format: "vtt" });
    expect(vtt as unknown as string).toBe(`WEBVTT\n\n00:00:00.000 --> 00:00:10.000\n${text}\n\n`);
    const verbose = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper", response_format: "verbose_json" });
    expect(verbose).toMatchObject({ duration: 10, text, segments: [{ start: 0, end: 10 }] });
  });

  test("a budget holds what a file of that size can cost at most: a file too long for it is refused before the upstream is asked", async () => {
    const key = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { max_budget: 0.01 } });
    const keyed = new OpenAI({ apiKey: key.body.key, baseURL: gw.baseURL, maxRetries: 0 });
    mock.reset();
    const refused = await failure(keyed.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper" }));
    expect(refused).toBeInstanceOf(BadRequestError);
    expect((refused as BadRequestError).type).toBe("budget_exceeded");
    expect(mock.requests).toHaveLength(0);
    const short = await keyed.audio.transcriptions.create({ file: await audio(32_000), model: "whisper" });
    expect(short.text).toContain("32000 bytes");
  });
});

describe("gpt-4o-transcribe (priced by tokens)", () => {
  test("json passes through with its token usage, priced per audio, text and output token", async () => {
    const { data, response } = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "transcribe" }).withResponse();
    const usage = (data as unknown as { usage: { input_tokens: number; output_tokens: number; input_token_details: { audio_tokens: number } } }).usage;
    const audioTokens = usage.input_token_details.audio_tokens;
    expect(audioTokens).toBe(100);
    const expected = audioTokens * 6e-6 + (usage.input_tokens - audioTokens) * 2.5e-6 + usage.output_tokens * 1e-5;
    expect(Number(response.headers.get("x-svc-response-cost"))).toBeCloseTo(expected, 12);
    expect(mock.requests.at(-1)!.body).toMatchObject({ model: "gpt-4o-transcribe", response_format: "json" });
  });

  test("text is asked upstream as json (which carries the usage) and answered as text", async () => {
    const { data, response } = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "transcribe", response_format: "text" }).withResponse();
    expect(data as unknown as string).toBe(`Transcript of speech.wav (${TEN_SECONDS} bytes).\n`);
    expect(Number(response.headers.get("x-svc-response-cost"))).toBeGreaterThan(0);
  });
});

describe("requests", () => {
  test("the built-in mock provider transcribes too", async () => {
    const r = await client.audio.transcriptions.create({ file: await audio(64_000, "note.mp3"), model: "mock-whisper" });
    expect(r.text).toBe("This is a mock transcript of note.mp3.");
  });

  test("bad requests: no file or a bad format is a 422 naming the field; a JSON body a 400 saying to send a form", async () => {
    const post = (body: BodyInit, headers: Record<string, string> = {}) =>
      fetch(`${gw.url}/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, ...headers }, body });
    const noFile = new FormData();
    noFile.append("model", "whisper");
    const r1 = await post(noFile);
    expect(r1.status).toBe(422);
    expect((await r1.json()).error.param).toBe("file");
    const badFormat = new FormData();
    badFormat.append("model", "whisper");
    badFormat.append("response_format", "mp3");
    badFormat.append("file", new Blob([new Uint8Array(10)]), "a.wav");
    const r2 = await post(badFormat);
    expect(r2.status).toBe(422);
    expect((await r2.json()).error.param).toBe("response_format");
    const fileAsText = new FormData();
    fileAsText.append("model", "whisper");
    fileAsText.append("file", "not a file");
    expect((await post(fileAsText)).status).toBe(422);
    const json = await post(JSON.stringify({ model: "whisper" }), { "content-type": "application/json" });
    expect(json.status).toBe(400);
    expect((await json.json()).error.message).toContain("multipart/form-data");
  });
});
