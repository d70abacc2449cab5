// The OpenAI endpoints beyond chat, completions and embeddings, through the official `openai` SDK,
// against the mock OpenAI upstream (its wire format) and the built-in mock provider:
// - images (`/v1/images/generations`): priced per image at the asked size and quality (dall-e-3 hd
//   1024x1024: $7.629e-8 per pixel), `n` images reserved against budgets before the upstream is asked;
// - transcriptions (`/v1/audio/transcriptions`, multipart; the mock takes the file as 16 kHz 16-bit
//   PCM, 32,000 bytes a second): whisper-1 priced per second ($0.006 a minute), so the gateway asks
//   it for verbose_json (which reports the duration) and makes json, text, SRT or VTT from it;
//   gpt-4o-transcribe priced by its tokens ($6/M audio, $2.50/M text in, $10/M out); budgets hold
//   the most a file of that size can cost;
// - speech (`/v1/audio/speech`): the audio byte for byte (the mock answers `ID3` and 10 bytes per
//   input character), priced per input character (tts-1: $15 per million);
// - moderations (`/v1/moderations`): the mock flags texts that say "kill"; a request without a model
//   goes to the configured moderation model, and without one it is a clear 400.
// Every call is logged with its call_type.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI, { BadRequestError, UnprocessableEntityError, toFile } from "openai";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, requestJson, startBackendGateway, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { wav } from "../harness/audio.ts";
import { failure, until, waitFor } from "../harness/util.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const UPSTREAM_KEY = "sk-upstream-endpoints-0123456789";
/** dall-e-3, hd, 1024x1024: OpenAI's $0.08 per image, stated per pixel in the price file. */
const HD_1024_USD = 1024 * 1024 * 7.629e-8;
/** gpt-image-1, high, 1024x1024: OpenAI's $0.167 per image. */
const GPT_IMAGE_HIGH_1024_USD = 1024 * 1024 * 1.59263611e-7;
const TEN_SECONDS = 320_000;
const WHISPER_PER_SECOND = 0.006 / 60;
const TTS1_PER_CHARACTER = 15 / 1_000_000;

let mock: MockOpenAI;
let gw: TestGateway;
let client: OpenAI;

const audio = async (bytes: number, name = "speech.wav") => toFile(new Uint8Array(bytes), name, { type: "audio/wav" });

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
  const upstream = (model: string) => ({ model, api_base: mock.url, api_key: UPSTREAM_KEY });
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "chat", svc_params: { model: "mock/chat" } },
      { model_name: "dalle", svc_params: upstream("openai/dall-e-3") },
      { model_name: "dalle2", svc_params: upstream("openai/dall-e-2") },
      { model_name: "mock-dalle", svc_params: { model: "mock/dall-e-3" } },
      { model_name: "gpt-image", svc_params: upstream("openai/gpt-image-1") },
      { model_name: "claude", svc_params: { model: "anthropic/claude-3-5-sonnet", api_base: "http://127.0.0.1:9", api_key: "sk-ant-x" } },
      { model_name: "whisper", svc_params: upstream("openai/whisper-1") },
      { model_name: "transcribe", svc_params: upstream("openai/gpt-4o-transcribe") },
      { model_name: "mock-whisper", svc_params: { model: "mock/whisper-1" } },
      { model_name: "tts", svc_params: upstream("openai/tts-1") },
      { model_name: "mini-tts", svc_params: upstream("openai/gpt-4o-mini-tts") },
      { model_name: "stt-prod", svc_params: upstream("openai/prod-stt"), model_info: { base_model: "whisper-1" } },
      { model_name: "mock-tts", svc_params: { model: "mock/tts-1" } },
      { model_name: "omni", svc_params: upstream("openai/omni-moderation-latest") },
      { model_name: "mock-moderation", svc_params: { model: "mock/omni-moderation-latest" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await gw?.stop();
  await mock?.stop();
});

async function logRow(callId: string | null): Promise<Record<string, unknown> | undefined> {
  await gw.host!.spendWriter.flush();
  const [row] = await rows<Record<string, unknown>>(gw.host!.store.db, sql`select call_type, model, status, spend::text as spend from spend_logs where call_id = ${callId}`);
  return row;
}

/** A client with a fresh virtual key holding `max_budget`. */
async function budgeted(maxBudget: number): Promise<OpenAI> {
  const key = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { max_budget: maxBudget } });
  return new OpenAI({ apiKey: key.body.key, baseURL: gw.baseURL, maxRetries: 0 });
}

describe("image generation", () => {
  test("the SDK gets the upstream's images; the upstream got the deployment's model and the prompt; the cost is n images at the asked size and quality", async () => {
    mock.reset();
    const { data: answer, response } = await client.images.generate({ model: "dalle", prompt: "a red fox in snow", n: 2, size: "1024x1024", quality: "hd" }).withResponse();
    expect(answer.data).toHaveLength(2);
    expect(answer.data?.[0]?.url).toMatch(/^https:\/\/images\.mock\.invalid\//);
    const sent = mock.requests.at(-1)!;
    expect(sent.path).toBe("/v1/images/generations");
    expect(sent.body).toMatchObject({ model: "dall-e-3", prompt: "a red fox in snow", n: 2, size: "1024x1024", quality: "hd" });
    expect(sent.headers.authorization).toBe(`Bearer ${UPSTREAM_KEY}`);
    const cost = Number(response.headers.get("x-svc-response-cost"));
    expect(cost).toBeCloseTo(2 * HD_1024_USD, 12);
    const row = await logRow(response.headers.get("x-svc-call-id")!);
    expect(row).toMatchObject({ call_type: "images", model: "dalle", status: "success" });
    expect(Number(row!.spend)).toBeCloseTo(2 * HD_1024_USD, 12);
  });

  test("a size or quality the model has no price for is a 400 naming it, and nothing is asked upstream (it was made and logged at $0)", async () => {
    mock.reset();
    // gpt-image-1's own entry prices any size per pixel: its sizes and qualities are priced one by one all the same.
    for (const model of ["dalle", "gpt-image"]) {
      for (const [extra, param] of [
        [{ size: "13x7" }, "size"],
        [{ size: "1x1", n: 10 }, "size"],
        [{ quality: "ultra" }, "quality"],
      ] as const) {
        const res = await fetch(`${gw.baseURL}/images/generations`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ model, prompt: "a fox", ...extra }),
        });
        expect([model, param, res.status]).toEqual([model, param, 400]);
        expect(((await res.json()) as { error: { param: string } }).error.param).toBe(param);
      }
    }
    expect(mock.requests).toHaveLength(0);
    // `auto` leaves them to the model: priced at the model's defaults, as before.
    const auto = await client.images.generate({ model: "dalle", prompt: "an auto fox", size: "auto", quality: "auto" }).withResponse();
    expect(Number(auto.response.headers.get("x-svc-response-cost"))).toBeGreaterThan(0);
  });

  test("the 400 for a size or quality with no price suggests those the model is priced at, and following it is answered", async () => {
    const generate = (body: Record<string, unknown>) =>
      fetch(`${gw.baseURL}/images/generations`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify({ prompt: "a fox", ...body }) });
    const cases = [
      ["dalle2", { size: "13x7" }, "dalle2 has no price for size 13x7: use a size and quality it makes (sizes 1024x1024, 512x512, 256x256)."],
      ["dalle", { size: "1024x1536" }, "dalle has no price for size 1024x1536: use a size and quality it makes (sizes 1024x1024, 1024x1792, 1792x1024; qualities standard, hd)."],
      ["dalle", { quality: "ultra" }, "dalle has no price for size 1024x1024 and quality ultra: use a size and quality it makes (sizes 1024x1024, 1024x1792, 1792x1024; qualities standard, hd)."],
      ["gpt-image", { quality: "ultra" }, "gpt-image has no price for size 1024x1024 and quality ultra: use a size and quality it makes (sizes 1024x1024, 1024x1536, 1536x1024; qualities low, medium, high)."],
    ] as const;
    for (const [model, extra, message] of cases) {
      const res = await generate({ model, ...extra });
      expect(res.status).toBe(400);
      expect(((await res.json()) as { error: { message: string } }).error.message).toBe(message);
      const [sizes, qualities = ""] = message.slice(message.indexOf("(") + 1, -2).split("; ");
      for (const size of sizes!.slice("sizes ".length).split(", ")) expect([model, size, (await generate({ model, size })).status]).toEqual([model, size, 200]);
      for (const quality of qualities.slice("qualities ".length).split(", ").filter(Boolean)) expect([model, quality, (await generate({ model, quality })).status]).toEqual([model, quality, 200]);
    }
  });

  test("left to their defaults, size and quality are OpenAI's (1024x1024, standard); quality in any case", async () => {
    const plain = await client.images.generate({ model: "dalle", prompt: "a plain fox" }).withResponse();
    expect(Number(plain.response.headers.get("x-svc-response-cost"))).toBeCloseTo(1024 * 1024 * 3.81469e-8, 12);
    const upper = await client.images.generate({ model: "dalle", prompt: "an HD fox", quality: "HD" as never, size: "1024x1024" }).withResponse();
    expect(Number(upper.response.headers.get("x-svc-response-cost"))).toBeCloseTo(HD_1024_USD, 12);
    // A budget that fits the asked image: the reservation is its price, not the dearest.
    const keyed = await budgeted(0.05);
    expect((await keyed.images.generate({ model: "dalle", prompt: "one standard fox", quality: "standard" })).data).toHaveLength(1);
  });

  test("an answer reporting a size or quality with no price is charged at the asked one; a priced one it made, at that", async () => {
    const answered = (extra: Record<string, string>) => ({ kind: "answer" as const, body: { created: 1, data: [{ url: "https://images.mock.invalid/x.png" }], ...extra } });
    for (const [model, asked, made, usd] of [
      ["dalle", { quality: "hd" }, { quality: "medium" }, HD_1024_USD],
      ["dalle", { quality: "hd" }, { size: "13x7", quality: "ultra" }, HD_1024_USD],
      ["gpt-image", { quality: "high" }, { size: "13x7", quality: "ultra" }, GPT_IMAGE_HIGH_1024_USD],
      ["gpt-image", { quality: "auto" }, { size: "1024x1024", quality: "high" }, GPT_IMAGE_HIGH_1024_USD],
    ] as const) {
      mock.reset();
      mock.fault(answered(made));
      const { response } = await client.images.generate({ model, prompt: "a fox", size: "1024x1024", ...asked } as never).withResponse();
      expect([model, made, Number(response.headers.get("x-svc-response-cost"))]).toEqual([model, made, expect.closeTo(usd, 6)]);
      const row = await logRow(response.headers.get("x-svc-call-id"));
      expect(Number(row!.spend)).toBeCloseTo(usd, 6);
    }
  });

  test("the built-in mock provider answers with base64 images when asked", async () => {
    const answer = await client.images.generate({ model: "mock-dalle", prompt: "a lighthouse", response_format: "b64_json" });
    expect(answer.data).toHaveLength(1);
    const png = Buffer.from(answer.data![0]!.b64_json!, "base64");
    expect(png.subarray(1, 4).toString()).toBe("PNG");
  });

  test("a key's budget holds the images' price before the upstream is asked: two hd images over $0.10 are refused, one fits", async () => {
    const keyed = await budgeted(0.1);
    mock.reset();
    const refused = await failure(keyed.images.generate({ model: "dalle", prompt: "two foxes", n: 2, size: "1024x1024", quality: "hd" }));
    expect(refused).toBeInstanceOf(BadRequestError);
    expect((refused as BadRequestError).type).toBe("budget_exceeded");
    expect(mock.requests).toHaveLength(0);
    const one = await keyed.images.generate({ model: "dalle", prompt: "one fox", size: "1024x1024", quality: "hd" });
    expect(one.data).toHaveLength(1);
  });

  test("bad requests: a missing prompt or n out of range is a 422 naming the field; a stream, or a provider without image generation, a 400", async () => {
    const noPrompt = await failure(client.images.generate({ model: "dalle" } as never));
    expect(noPrompt).toBeInstanceOf(UnprocessableEntityError);
    expect((noPrompt as UnprocessableEntityError).param).toBe("prompt");
    const tooMany = await failure(client.images.generate({ model: "dalle", prompt: "x", n: 11 }));
    expect((tooMany as UnprocessableEntityError).param).toBe("n");
    const res = await fetch(`${gw.url}/v1/images/generations`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "dalle", prompt: "x", stream: true }),
    });
    expect(res.status).toBe(400);
    const claude = await failure(client.images.generate({ model: "claude", prompt: "x" }));
    expect(claude).toBeInstanceOf(BadRequestError);
    expect((claude as BadRequestError).message).toContain("does not support images");
  });

  test("without a model, the first image model answers (the spec makes model optional)", async () => {
    const res = await fetch(`${gw.url}/v1/images/generations`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ prompt: "a kite" }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-svc-model-group")).toBe("dalle");
    expect(((await res.json()) as { data: unknown[] }).data).toHaveLength(1);
  });

  test("the path forms: without /v1 and Azure's /openai/deployments/{model}/…", async () => {
    for (const path of ["/images/generations", "/openai/deployments/mock-dalle/images/generations"]) {
      const r = await requestJson<{ data: unknown[] }>(gw, "POST", path, { body: { model: "mock-dalle", prompt: "x", n: 3 } });
      expect(r.status).toBe(200);
      expect(r.body.data).toHaveLength(3);
    }
  });
});

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
    const keyed = await budgeted(0.01);
    mock.reset();
    const refused = await failure(keyed.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper" }));
    expect(refused).toBeInstanceOf(BadRequestError);
    expect((refused as BadRequestError).type).toBe("budget_exceeded");
    expect(mock.requests).toHaveLength(0);
    const short = await keyed.audio.transcriptions.create({ file: await audio(32_000), model: "whisper" });
    expect(short.text).toContain("32000 bytes");
  });
});

describe("a whisper deployment named otherwise (model_info.base_model: whisper-1)", () => {
  test("is asked for verbose_json too, so an SRT answer is priced per second", async () => {
    mock.reset();
    const { response } = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "stt-prod", response_format: "srt" }).withResponse();
    expect(mock.requests.at(-1)!.body).toMatchObject({ model: "prod-stt", response_format: "verbose_json" });
    expect(Number(response.headers.get("x-svc-response-cost"))).toBeCloseTo(10 * WHISPER_PER_SECOND, 12);
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

describe("a transcription answer that tells no length or usage", () => {
  const tenSecondWav = () => toFile(wav({ dataBytes: TEN_SECONDS }), "ten.wav", { type: "audio/wav" });

  test("verbose_json the gateway asked for, labelled text/plain, is still read: its length priced, the client's format made from it", async () => {
    const verbose = { task: "transcribe", duration: 120, text: "hi there", segments: [{ start: 0, end: 120, text: " hi there" }] };
    const labelledText = () => mock.fault({ kind: "status", status: 200, body: JSON.stringify(verbose), headers: { "content-type": "text/plain; charset=utf-8" } });
    labelledText();
    const json = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper" }).withResponse();
    expect(json.response.headers.get("content-type")).toContain("application/json");
    expect(json.data as unknown).toEqual({ text: "hi there", usage: { type: "duration", seconds: 120 } });
    expect(Number(json.response.headers.get("x-svc-response-cost"))).toBeCloseTo(120 * WHISPER_PER_SECOND, 12);
    labelledText();
    const srt = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper", response_format: "srt" });
    expect(srt as unknown as string).toBe("1\n00:00:00,000 --> 00:02:00,000\nhi there\n\n");
  });

  test("is charged for the length the gateway read from the WAV header, else what was reserved, not $0", async () => {
    const bare = () => mock.fault({ kind: "answer", body: { text: "no length" } });
    bare();
    const measured = await client.audio.transcriptions.create({ file: await tenSecondWav(), model: "whisper" }).withResponse();
    expect(Number(measured.response.headers.get("x-svc-response-cost"))).toBeCloseTo(10 * WHISPER_PER_SECOND, 12);
    const row = await logRow(measured.response.headers.get("x-svc-call-id"));
    expect(Number(row!.spend)).toBeCloseTo(10 * WHISPER_PER_SECOND, 12);
    // No header: the most a file of its size can hold (6 kbit/s), as budgets reserved.
    bare();
    const unknown = await client.audio.transcriptions.create({ file: await audio(TEN_SECONDS), model: "whisper" }).withResponse();
    expect(Number(unknown.response.headers.get("x-svc-response-cost"))).toBeCloseTo(Math.ceil(TEN_SECONDS / 750) * WHISPER_PER_SECOND, 12);
    // A token-priced model without usage: its reservation, 12 s of the WAV at 50 audio tokens a
    // second, in and out, and the (empty) text prompt's bound of a token.
    bare();
    const tokens = await client.audio.transcriptions.create({ file: await tenSecondWav(), model: "transcribe" }).withResponse();
    expect(Number(tokens.response.headers.get("x-svc-response-cost"))).toBeCloseTo(600 * 6e-6 + 600 * 1e-5 + 2.5e-6, 12);
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

  test("a form is one whatever the case of its media type; two file parts are a 400 naming file, not one dropped unseen", async () => {
    const post = (body: string, contentType: string) =>
      fetch(`${gw.url}/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": contentType }, body });
    const part = (name: string, size: number) => `--XyZ\r\nContent-Disposition: form-data; name="file"; filename="${name}"\r\nContent-Type: audio/mpeg\r\n\r\n${"A".repeat(size)}\r\n`;
    const model = '--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n';
    mock.reset();
    const capitalised = await post(`${model}${part("a.mp3", 10)}--XyZ--\r\n`, "Multipart/Form-Data; boundary=XyZ");
    expect(capitalised.status).toBe(200);
    expect(((await capitalised.json()) as { text: string }).text).toBe("Transcript of a.mp3 (10 bytes).");
    const twice = await post(`${model}${part("a.mp3", 6400)}${part("b.mp3", 10)}--XyZ--\r\n`, "multipart/form-data; boundary=XyZ");
    expect(twice.status).toBe(400);
    expect(((await twice.json()) as { error: { param: string } }).error.param).toBe("file");
    expect(mock.requests).toHaveLength(1);
  });

  test("a file part goes upstream with the Content-Type the client gave it, byte for byte (none given: application/octet-stream)", async () => {
    const form = (type: string | undefined) =>
      `--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a \\"b\\".wav"\r\n${type === undefined ? "" : `Content-Type: ${type}\r\n`}\r\nRIFF-bytes\r\n--XyZ--\r\n`;
    const cases = [["text/plain", "text/plain"], ["application/json", "application/json"], ["Audio/WAV", "Audio/WAV"], ["audio/wav; codecs=1", "audio/wav; codecs=1"], ["audio/mpeg", "audio/mpeg"], [undefined, "application/octet-stream"]] as const;
    for (const [type, upstream] of cases) {
      mock.reset();
      const res = await fetch(`${gw.url}/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "multipart/form-data; boundary=XyZ" }, body: form(type) });
      expect(res.status).toBe(200);
      const parts = mock.requests[0]!.parts!;
      expect(parts.map((p) => [p.name, p.filename, p.contentType])).toEqual([
        ["model", undefined, undefined],
        ["response_format", undefined, undefined],
        ["file", "a %22b%22.wav", upstream],
      ]);
      expect(Buffer.from(parts[2]!.bytes).toString()).toBe("RIFF-bytes");
    }
  });
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
    const row = await logRow(res.headers.get("x-svc-call-id"));
    expect(row).toMatchObject({ call_type: "speech", model: "tts", status: "success" });
    expect(Number(row!.spend)).toBeCloseTo(input.length * TTS1_PER_CHARACTER, 12);
  });

  test("the built-in mock provider speaks in the asked format", async () => {
    const res = await client.audio.speech.create({ model: "mock-tts", input: "abc", voice: "alloy", response_format: "wav" });
    expect(res.headers.get("content-type")).toBe("audio/wav");
    expect(Buffer.from(new Uint8Array(await res.arrayBuffer()).subarray(0, 4)).toString()).toBe("RIFF");
  });

  test("gpt-4o-mini-tts is priced per text token and second of audio: seconds measured from a PCM answer, estimated from the text otherwise", async () => {
    const input = "x".repeat(100);
    const pcm = await client.audio.speech.create({ model: "mini-tts", input, voice: "alloy", response_format: "pcm" });
    await pcm.arrayBuffer();
    // 25 text tokens at $2.50/M and the answer's 10 s at $0.015 a minute.
    expect(Number(pcm.headers.get("x-svc-response-cost"))).toBeCloseTo(25 * 2.5e-6 + 10 * 0.00025, 12);
    const mp3 = await client.audio.speech.create({ model: "mini-tts", input, voice: "alloy" });
    await mp3.arrayBuffer();
    // The estimate (100 characters at 15 a second), priced to the millisecond.
    expect(Number(mp3.headers.get("x-svc-response-cost"))).toBeCloseTo(25 * 2.5e-6 + (Math.round((100 / 15) * 1000) / 1000) * 0.00025, 12);
    // Reserved at the slowest speech (5 characters a second): 20 s, over a $0.003 budget.
    const keyed = await budgeted(0.003);
    const refused = await failure(keyed.audio.speech.create({ model: "mini-tts", input, voice: "alloy" }));
    expect((refused as BadRequestError).type).toBe("budget_exceeded");
  });

  test("a key's budget holds the input's price before the upstream is asked", async () => {
    const keyed = await budgeted(0.0001);
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
    // Characters as OpenAI counts them (and the gateway prices them): 4,096 emoji are 8,192 UTF-16 units.
    mock.reset();
    const emoji = await client.audio.speech.create({ model: "tts", input: "🎉".repeat(4096), voice: "alloy" });
    expect(emoji.status).toBe(200);
    expect(Number(emoji.headers.get("x-svc-response-cost"))).toBeCloseTo(4096 * TTS1_PER_CHARACTER, 12);
    const over = await failure(client.audio.speech.create({ model: "tts", input: "🎉".repeat(4097), voice: "alloy" }));
    expect((over as UnprocessableEntityError).param).toBe("input");
    expect(mock.requests).toHaveLength(1);
  });
});

describe("a client that leaves once the request is with the upstream", () => {
  /** Sends `body` to `path`, leaves as soon as the upstream has it, and returns the call's log row (found by its `user`). */
  async function leftAfterSending(path: string, body: BodyInit, user: string, headers: Record<string, string> = {}): Promise<Record<string, unknown>> {
    mock.reset();
    mock.fault({ kind: "delay", ms: 2000 });
    const ac = new AbortController();
    const sent = fetch(`${gw.baseURL}${path}`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, ...headers }, body, signal: ac.signal }).catch(() => undefined);
    expect(await until(async () => mock.requests.length === 1)).toBe(true);
    ac.abort();
    await sent;
    const row = await waitFor(
      async () => {
        await gw.host!.spendWriter.flush();
        const [row] = await rows<Record<string, unknown>>(gw.host!.store.db, sql`select call_type, status, spend::text as spend from spend_logs where end_user = ${user}`);
        return row;
      },
      (row) => row !== undefined,
      `the log row of ${user}`,
    );
    return row!;
  }
  const json = { "content-type": "application/json" };

  test("is charged what the call was reserved at (the upstream bills speech, images and audio answered or not), not $0", async () => {
    const speech = await leftAfterSending("/audio/speech", JSON.stringify({ model: "tts", input: "x".repeat(4000), voice: "alloy", user: "left-speech" }), "left-speech", json);
    expect(speech).toMatchObject({ call_type: "speech", status: "cancelled" });
    expect(Number(speech.spend)).toBeCloseTo(4000 * TTS1_PER_CHARACTER, 12);

    const images = await leftAfterSending("/images/generations", JSON.stringify({ model: "dalle", prompt: "a fox", n: 2, size: "1024x1024", quality: "hd", user: "left-images" }), "left-images", json);
    expect(images).toMatchObject({ call_type: "images", status: "cancelled" });
    expect(Number(images.spend)).toBeGreaterThanOrEqual(2 * HD_1024_USD);
    expect(Number(images.spend)).toBeCloseTo(2 * HD_1024_USD, 6);

    const form = new FormData();
    form.append("model", "whisper");
    form.append("user", "left-transcription");
    form.append("file", new File([wav({ dataBytes: TEN_SECONDS })], "ten.wav", { type: "audio/wav" }));
    const transcription = await leftAfterSending("/audio/transcriptions", form, "left-transcription");
    expect(transcription).toMatchObject({ call_type: "transcriptions", status: "cancelled" });
    // What budgets reserve for a WAV whose header says 10 s: 2 % and a second more (cost/estimate.ts audioBound).
    expect(Number(transcription.spend)).toBeCloseTo(12 * WHISPER_PER_SECOND, 12);
  });
});

describe("moderations", () => {
  test("the upstream's verdict reaches the SDK; the upstream got the deployment's model; the call is logged, free", async () => {
    mock.reset();
    const { data, response } = await client.moderations.create({ model: "omni", input: "I will kill the process" }).withResponse();
    expect(data.results[0]!.flagged).toBe(true);
    expect(data.results[0]!.categories.violence).toBe(true);
    expect(mock.requests.at(-1)!.body).toEqual({ model: "omni-moderation-latest", input: "I will kill the process" });
    expect(await logRow(response.headers.get("x-svc-call-id"))).toEqual({ call_type: "moderations", model: "omni", status: "success", spend: "0.000000000000" });
  });

  test("without a model the configured moderation model answers, one result per input", async () => {
    mock.reset();
    const r = await client.moderations.create({ input: ["good morning", "kill it"] });
    expect(r.results.map((x) => x.flagged)).toEqual([false, true]);
    expect(mock.requests).toHaveLength(1);
  });

  test("the mock provider moderates too", async () => {
    const r = await client.moderations.create({ model: "mock-moderation", input: "they attack at dawn" });
    expect(r.results[0]!.flagged).toBe(true);
  });

  test("a missing input is a 422 naming it; no model and no moderation model configured is a 400 naming model", async () => {
    const noInput = await failure(client.moderations.create({ model: "omni" } as never));
    expect(noInput).toBeInstanceOf(UnprocessableEntityError);
    expect((noInput as UnprocessableEntityError).param).toBe("input");
    const bare = await startTestGateway({ model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" } }], general_settings: { master_key: MASTER_KEY } });
    try {
      const other = new OpenAI({ apiKey: MASTER_KEY, baseURL: bare.baseURL, maxRetries: 0 });
      const err = await failure(other.moderations.create({ input: "x" }));
      expect(err).toBeInstanceOf(BadRequestError);
      expect((err as BadRequestError).param).toBe("model");
    } finally {
      await bare.stop();
    }
  });
});
