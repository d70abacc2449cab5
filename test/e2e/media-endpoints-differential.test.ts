// Randomized requests to the non-chat model endpoints (transcriptions, speech, image generation,
// moderations) through the official `openai` SDK and raw fetch, against the mock OpenAI and Azure
// upstreams (their wire formats) and the built-in `mock/` provider. For each call it checks what a
// user would notice:
// - the upstream got every multipart part as the client sent it (name, `filename` as written, the
//   part's own Content-Type, every byte of the file: all byte values, non-ASCII and quoted names),
//   the deployment's model, the response_format README's rule asks for (whisper-style models:
//   verbose_json; token-priced models: json for text), JSON bodies as sent with the model mapped,
//   the deployment's credentials and nothing of the client's key;
// - the client got the upstream's answer (audio byte for byte with its content type; text, SRT,
//   VTT, json and verbose_json transcripts as README says they are made), `x-svc-response-cost`;
// - the spend-log row: call_type, model group, status, spend equal to the header, > 0 when priced;
// - bad input (no file, an empty file, a field of the wrong type, a broken or non-multipart body,
//   an unknown model, a route the gateway does not serve) is a 4xx in the error envelope, never
//   reaches an upstream and charges nothing.
// Seed: MEDIA_DIFF_SEED (default in the describe name).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sql } from "drizzle-orm";
import OpenAI, { toFile } from "openai";
import { rows } from "../../core/store/sql.ts";
import { MASTER_KEY, spawnGateway, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { Random } from "../harness/random.ts";
import { type MockAzure, startMockAzure } from "../mock-upstream/azure.ts";
import { type RecordedPart, rawParts } from "../mock-upstream/multipart.ts";
import type { RecordedRequest } from "../mock-upstream/native-kit.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const SEED = Number(process.env.MEDIA_DIFF_SEED ?? 20261127);
const CASES = Number(process.env.MEDIA_DIFF_CASES ?? 40);
const UPSTREAM_KEY = "sk-upstream-media-0123456789";
const AZURE_KEY = "azure-media-key-0123456789";

let openai: MockOpenAI;
let azure: MockAzure;
let gw: TestGateway;
/** What the SDK last put on the wire (its multipart body is built by the runtime, so it is read back here). */
let sent: { contentType: string; bytes: Uint8Array } | undefined;
let client: OpenAI;

type Provider = "openai" | "azure" | "mock";
interface Model {
  group: string;
  provider: Provider;
  /** The model name the upstream must get in the body (Azure's deployments path names it too). */
  upstream: string;
  /** Whisper-style: priced per second, asked for verbose_json. */
  perSecond?: boolean;
}

const WHISPER: Model = { group: "whisper", provider: "openai", upstream: "whisper-1", perSecond: true };
const TRANSCRIBE: Model = { group: "transcribe", provider: "openai", upstream: "gpt-4o-transcribe" };
const AZ_WHISPER: Model = { group: "az-whisper", provider: "azure", upstream: "stt-deploy", perSecond: true };
const MOCK_WHISPER: Model = { group: "mock-whisper", provider: "mock", upstream: "whisper-1", perSecond: true };
const TTS: Model = { group: "tts", provider: "openai", upstream: "tts-1" };
const MINI_TTS: Model = { group: "mini-tts", provider: "openai", upstream: "gpt-4o-mini-tts" };
const AZ_TTS: Model = { group: "az-tts", provider: "azure", upstream: "tts-deploy" };
const MOCK_TTS: Model = { group: "mock-tts", provider: "mock", upstream: "tts-1" };
const DALLE: Model = { group: "dalle", provider: "openai", upstream: "dall-e-3" };
const AZ_DALLE: Model = { group: "az-dalle", provider: "azure", upstream: "img-deploy" };
const MOCK_DALLE: Model = { group: "mock-dalle", provider: "mock", upstream: "dall-e-3" };
const OMNI: Model = { group: "omni", provider: "openai", upstream: "omni-moderation-latest" };
const MOCK_MODERATION: Model = { group: "mock-moderation", provider: "mock", upstream: "omni-moderation-latest" };

beforeAll(async () => {
  openai = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
  azure = await startMockAzure({ apiKey: AZURE_KEY, deployments: { "stt-deploy": "whisper", "tts-deploy": "tts", "img-deploy": "dall-e-3" } });
  const up = (model: string) => ({ model, api_base: openai.url, api_key: UPSTREAM_KEY });
  const az = (deployment: string) => ({ model: `azure/${deployment}`, api_base: azure.url, api_key: AZURE_KEY, api_version: "2024-10-21" });
  gw = await startBackendGateway("pglite", {
    model_list: [
      { model_name: "whisper", svc_params: up("openai/whisper-1") },
      { model_name: "transcribe", svc_params: up("openai/gpt-4o-transcribe") },
      { model_name: "az-whisper", svc_params: az("stt-deploy"), model_info: { base_model: "whisper-1" } },
      { model_name: "mock-whisper", svc_params: { model: "mock/whisper-1" } },
      { model_name: "tts", svc_params: up("openai/tts-1") },
      { model_name: "mini-tts", svc_params: up("openai/gpt-4o-mini-tts") },
      { model_name: "az-tts", svc_params: az("tts-deploy"), model_info: { base_model: "tts-1" } },
      { model_name: "mock-tts", svc_params: { model: "mock/tts-1" } },
      { model_name: "dalle", svc_params: up("openai/dall-e-3") },
      { model_name: "az-dalle", svc_params: az("img-deploy"), model_info: { base_model: "dall-e-3" } },
      { model_name: "mock-dalle", svc_params: { model: "mock/dall-e-3" } },
      { model_name: "omni", svc_params: up("openai/omni-moderation-latest"), model_info: { mode: "moderation" } },
      // README: moderations on OpenAI-shaped providers and mock/, not Azure.
      { model_name: "az-moderation", svc_params: az("mod-deploy") },
      { model_name: "mock-moderation", svc_params: { model: "mock/omni-moderation-latest" } },
    ],
    general_settings: { master_key: MASTER_KEY },
  });
  client = new OpenAI({
    apiKey: MASTER_KEY,
    baseURL: gw.baseURL,
    maxRetries: 0,
    fetch: async (url, init) => {
      const request = new Request(url, init);
      const bytes = await request.bytes();
      sent = { contentType: request.headers.get("content-type") ?? "", bytes };
      return fetch(request.url, { method: request.method, headers: request.headers, body: request.method === "GET" ? undefined : bytes, signal: init?.signal });
    },
  });
}, 30_000);

afterAll(async () => {
  await gw?.stop();
  await openai?.stop();
  await azure?.stop();
});

// ---------------------------------------------------------------------------------------------
// Random inputs

const NAME_PIECES = ["rec", "voice note", "Aufnahme_ä", "запись", "録音", "🎙", 'say "hi"', "it's", "a;b", "x%22y", "a=b", "100%", "tab\tend", "a,b"];
const EXTENSIONS = ["wav", "mp3", "webm", "m4a", "ogg", "flac", "mp4", "bin", ""];
const TYPES = ["audio/wav", "audio/mpeg", "audio/webm;codecs=opus", "audio/ogg", "audio/x-m4a", "audio/flac", "video/mp4", "application/octet-stream", "audio/L16;rate=16000"];
const TEXTS = ["hello there", "Grüße aus Köln", "こんにちは世界", "kill the lights", "🙂 emoji & <tags>", "line one\nline two", '"quoted" text', "a".repeat(300)];

/** Bytes of every value: each byte 0..255 at least once, then random ones. */
function fileBytes(r: Random): Uint8Array<ArrayBuffer> {
  const length = 256 + r.int(r.chance(0.3) ? 80_000 : 4_000);
  const bytes = new Uint8Array(length);
  for (let i = 0; i < length; i++) bytes[i] = i < 256 ? (i * 167 + 13) & 255 : r.int(256);
  return bytes;
}

function fileName(r: Random): string {
  const ext = r.pick(EXTENSIONS);
  const base = r.some(NAME_PIECES, 2).join(" ");
  return ext ? `${base}.${ext}` : base;
}

const text = (r: Random) => r.pick(TEXTS) + (r.chance(0.5) ? ` #${r.int(1000)}` : "");

// ---------------------------------------------------------------------------------------------
// Checks shared by the endpoints

const decoder = new TextDecoder();
const partText = (p: RecordedPart) => decoder.decode(p.bytes);

/** The parts of each name, in order, as `[filename, contentType, bytes as hex]` or the field's text. */
function byName(parts: RecordedPart[]): Record<string, unknown[]> {
  const out: Record<string, unknown[]> = {};
  for (const p of parts) {
    const list = out[p.name] ?? [];
    list.push(p.filename === undefined ? partText(p) : [p.filename, p.contentType, Buffer.from(p.bytes).toString("hex")]);
    out[p.name] = list;
  }
  return out;
}

function lastRequest(m: Model): RecordedRequest | undefined {
  return m.provider === "openai" ? openai.requests.at(-1) : m.provider === "azure" ? azure.requests.at(-1) : undefined;
}

function resetMocks(): void {
  openai.reset();
  azure.reset();
}

/** The path and credentials the deployment's upstream must have been asked with; nothing of the client's key. */
function expectUpstreamCall(m: Model, got: RecordedRequest | undefined, operation: string, clientKey: string): void {
  expect(got).toBeDefined();
  const headers = got!.headers;
  if (m.provider === "openai") {
    expect(got!.path).toBe(`/v1/${operation}`);
    expect(headers.authorization).toBe(`Bearer ${UPSTREAM_KEY}`);
  } else {
    expect(got!.path).toBe(`/openai/deployments/${m.upstream}/${operation}?api-version=2024-10-21`);
    expect(headers["api-key"]).toBe(AZURE_KEY);
    expect(headers.authorization).toBeUndefined();
  }
  expect(JSON.stringify(headers)).not.toContain(clientKey);
  expect(headers["x-svc-api-key"]).toBeUndefined();
}

interface SpendRow {
  call_type: string;
  model: string;
  status: string;
  spend: string;
}

async function spendRow(callId: string | null): Promise<SpendRow | undefined> {
  await gw.host!.spendWriter.flush();
  const [row] = await rows<SpendRow>(gw.host!.store.db, sql`select call_type, model, status, spend::text as spend from spend_logs where call_id = ${callId}`);
  return row;
}

/** The log row says what the client was told: the call type and group, success, the header's cost; money when the call is priced and did something. */
async function expectLogged(headers: Headers, callType: string, m: Model, charged: boolean): Promise<void> {
  // README: every non-stream answer carries its cost (audio and text answers too).
  const header = headers.get("x-svc-response-cost");
  expect(header).not.toBeNull();
  const cost = Number(header);
  expect(Number.isFinite(cost)).toBe(true);
  const row = await spendRow(headers.get("x-svc-call-id"));
  expect(row).toMatchObject({ call_type: callType, model: m.group, status: "success" });
  expect(Number(row!.spend)).toBeCloseTo(cost, 12);
  if (charged) expect(Number(row!.spend)).toBeGreaterThan(0);
  else expect(Number(row!.spend)).toBe(0);
}

// ---------------------------------------------------------------------------------------------
// Transcriptions

type Format = "json" | "text" | "srt" | "vtt" | "verbose_json";

function stamp(seconds: number, decimal: string): string {
  const ms = Math.round(seconds * 1000);
  const two = (n: number) => String(n).padStart(2, "0");
  return `${two(Math.floor(ms / 3_600_000))}:${two(Math.floor(ms / 60_000) % 60)}:${two(Math.floor(ms / 1000) % 60)}${decimal}${String(ms % 1000).padStart(3, "0")}`;
}

/** What the client must get: the upstream's transcript (the mock's text names the file it got) in the asked format. */
function expectedTranscript(m: Model, format: Format, filename: string, size: number): unknown {
  const duration = Math.round((size / 32_000) * 100) / 100;
  const said = m.provider === "mock" ? `This is a mock transcript of ${filename}.` : `${m.provider === "azure" ? "Azure transcript" : "Transcript"} of ${filename} (${size} bytes).`;
  if (format === "text") return `${said}\n`;
  if (!m.perSecond) return { text: said, usage: { type: "tokens", input_tokens: Math.ceil(duration * 10) + 5, input_token_details: { text_tokens: 5, audio_tokens: Math.ceil(duration * 10) }, output_tokens: Math.max(1, Math.ceil(said.length / 4)), total_tokens: 0 } };
  if (format === "json") return { text: said, usage: { type: "duration", seconds: Math.ceil(duration) } };
  if (format === "srt") return `1\n${stamp(0, ",")} --> ${stamp(duration, ",")}\n${said}\n\n`;
  if (format === "vtt") return `WEBVTT\n\n${stamp(0, ".")} --> ${stamp(duration, ".")}\n${said}\n\n`;
  if (m.provider === "mock") return { task: "transcribe", language: "english", duration, text: said, segments: [{ id: 0, seek: 0, start: 0, end: duration, text: said }] };
  return m.provider === "azure"
    ? { duration, language: "english", segments: [{ end: duration, id: 0, seek: 0, start: 0, text: ` ${said}` }], task: "transcribe", text: said }
    : { task: "transcribe", language: "english", duration, text: said, segments: [{ id: 0, seek: 0, start: 0, end: duration, text: ` ${said}` }] };
}

interface TranscriptionCase {
  model: Model;
  name: string;
  type: string;
  bytes: Uint8Array;
  format?: Format;
  language?: string;
  prompt?: string;
  temperature?: number;
  granularities?: ("word" | "segment")[];
}

function transcriptionCase(r: Random): TranscriptionCase {
  const model = r.pick([WHISPER, WHISPER, TRANSCRIBE, AZ_WHISPER, AZ_WHISPER, MOCK_WHISPER]);
  // Token-priced models take json and text (OpenAI refuses the others for them).
  const format = r.maybe(0.8, model.perSecond ? (["json", "text", "srt", "vtt", "verbose_json"] as const) : (["json", "text"] as const));
  return {
    model,
    name: fileName(r),
    type: r.pick(TYPES),
    bytes: fileBytes(r),
    format,
    language: r.maybe(0.4, ["en", "de", "ja", "pt-BR"]),
    prompt: r.chance(0.4) ? text(r) : undefined,
    temperature: r.chance(0.4) ? r.int(101) / 100 : undefined,
    granularities: model.perSecond && format === "verbose_json" && r.chance(0.6) ? r.some(["word", "segment"] as const, 2) : undefined,
  };
}

async function runTranscription(c: TranscriptionCase): Promise<void> {
  resetMocks();
  const { data, response } = await client.audio.transcriptions
    .create({
      model: c.model.group,
      file: await toFile(c.bytes, c.name, { type: c.type }),
      ...(c.format ? { response_format: c.format } : {}),
      ...(c.language ? { language: c.language } : {}),
      ...(c.prompt !== undefined ? { prompt: c.prompt } : {}),
      ...(c.temperature !== undefined ? { temperature: c.temperature } : {}),
      ...(c.granularities ? { timestamp_granularities: c.granularities } : {}),
    } as never)
    .withResponse();
  const clientParts = byName(rawParts(sent!.bytes, sent!.contentType));
  const [clientFile] = clientParts.file as [string, string, string][];
  // The client's own part is what the upstream must get: the SDK does not alter bytes or type.
  // (A media type is case-insensitive, RFC 2045: a Blob's type, the SDK's too, is lower case.)
  expect(clientFile![1]).toBe(c.type.toLowerCase());
  expect(clientFile![2]).toBe(Buffer.from(c.bytes).toString("hex"));
  const format = c.format ?? "json";
  if (c.model.provider !== "mock") {
    const got = lastRequest(c.model);
    expectUpstreamCall(c.model, got, "audio/transcriptions", MASTER_KEY);
    expect(got!.parts).toBeDefined();
    const upstreamFormat = c.model.perSecond ? "verbose_json" : format === "text" ? "json" : format;
    const expected: Record<string, unknown[]> = { ...clientParts, model: [c.model.upstream], response_format: [upstreamFormat] };
    expect(byName(got!.parts!)).toEqual(expected);
  }
  const answer = typeof data === "string" ? data : JSON.parse(JSON.stringify(data));
  expect(answer).toEqual(expectedTranscript(c.model, format, clientFile![0], c.bytes.length));
  const contentType = response.headers.get("content-type") ?? "";
  expect(contentType).toMatch(format === "vtt" ? /^text\/vtt/ : format === "text" || format === "srt" ? /^text\/plain/ : /^application\/json/);
  // Whisper is priced per second: a file shorter than a hundredth of a second costs nothing.
  const charged = !c.model.perSecond || c.bytes.length >= 160;
  await expectLogged(response.headers, "transcriptions", c.model, charged);
}

// ---------------------------------------------------------------------------------------------
// Speech

interface SpeechCase {
  model: Model;
  body: Record<string, unknown>;
}

function speechCase(r: Random): SpeechCase {
  const model = r.pick([TTS, MINI_TTS, AZ_TTS, MOCK_TTS]);
  const body: Record<string, unknown> = { model: model.group, input: text(r), voice: r.pick(["alloy", "nova", "verse", "shimmer"]) };
  const format = r.maybe(0.6, model.provider === "openai" ? ["mp3", "wav", "pcm", "flac"] : ["mp3", "wav"]);
  if (format) body.response_format = format;
  if (r.chance(0.3)) body.speed = r.pick([0.25, 0.5, 1, 1.75, 4]);
  if (r.chance(0.2)) body.instructions = text(r);
  return { model, body };
}

async function runSpeech(c: SpeechCase): Promise<void> {
  resetMocks();
  const answer = await client.audio.speech.create(c.body as never);
  const bytes = new Uint8Array(await answer.arrayBuffer());
  expect(answer.status).toBe(200);
  const input = c.body.input as string;
  if (c.model.provider !== "mock") {
    const got = lastRequest(c.model);
    expectUpstreamCall(c.model, got, "audio/speech", MASTER_KEY);
    expect(got!.body).toEqual({ ...c.body, model: c.model.upstream });
    // The mock's audio, byte for byte, with its content type.
    const pcm = c.body.response_format === "pcm";
    const expected = new Uint8Array(pcm ? input.length * 4_800 : 3 + input.length * 10);
    if (!pcm) expected.set([0x49, 0x44, 0x33]);
    expect(Buffer.from(bytes).equals(Buffer.from(expected))).toBe(true);
    expect(answer.headers.get("content-type")).toBe(pcm ? "audio/pcm" : c.body.response_format === "wav" ? "audio/wav" : "audio/mpeg");
  } else expect(bytes.length).toBeGreaterThan(0);
  await expectLogged(answer.headers, "speech", c.model, true);
}

// ---------------------------------------------------------------------------------------------
// Images and moderations

function imageCase(r: Random): { model: Model; body: Record<string, unknown> } {
  const model = r.pick([DALLE, DALLE, AZ_DALLE, MOCK_DALLE]);
  const body: Record<string, unknown> = { model: model.group, prompt: text(r) };
  if (r.chance(0.6)) body.n = 1 + r.int(3);
  if (r.chance(0.6)) body.size = r.pick(["1024x1024", "1792x1024", "1024x1792"]);
  if (r.chance(0.6)) body.quality = r.pick(["standard", "hd"]);
  if (r.chance(0.3)) body.style = r.pick(["vivid", "natural"]);
  if (r.chance(0.3) && model.provider !== "azure") body.response_format = r.pick(["url", "b64_json"]);
  return { model, body };
}

async function runImage(c: { model: Model; body: Record<string, unknown> }): Promise<void> {
  resetMocks();
  const { data, response } = await client.images.generate(c.body as never).withResponse();
  if (c.model.provider !== "mock") {
    const got = lastRequest(c.model);
    expectUpstreamCall(c.model, got, "images/generations", MASTER_KEY);
    expect(got!.body).toEqual({ ...c.body, model: c.model.upstream });
  }
  expect(data.data).toHaveLength((c.body.n as number | undefined) ?? 1);
  for (const image of data.data ?? []) expect(c.body.response_format === "b64_json" ? image.b64_json : image.url).toBeString();
  await expectLogged(response.headers, "images", c.model, true);
}

/** Text, a list of texts, or (omni models) a list of text and image parts. */
function moderationCase(r: Random): { model: Model; body: Record<string, unknown> } {
  const model = r.pick([OMNI, OMNI, MOCK_MODERATION]);
  const parts = () => Array.from({ length: 1 + r.int(3) }, () => (r.chance(0.5) ? { type: "text", text: text(r) } : { type: "image_url", image_url: { url: `https://example.com/${r.int(1000)}.png` } }));
  const input = r.pick([() => text(r), () => Array.from({ length: 1 + r.int(4) }, () => text(r)), parts])();
  // Without a model the configured moderation group (omni) answers.
  return model === OMNI && r.chance(0.3) ? { model, body: { input } } : { model, body: { model: model.group, input } };
}

async function runModeration(c: { model: Model; body: Record<string, unknown> }): Promise<void> {
  resetMocks();
  const { data, response } = await client.moderations.create(c.body as never).withResponse();
  const input = c.body.input;
  const inputs = typeof input === "string" ? [input] : (input as unknown[]);
  if (c.model.provider !== "mock") {
    const got = lastRequest(c.model);
    expectUpstreamCall(c.model, got, "moderations", MASTER_KEY);
    expect(got!.body).toEqual({ ...c.body, model: c.model.upstream });
    // The mock flags a text that says "kill" (a part object reads as "[object Object]" there).
    expect(data.results.map((x) => x.flagged)).toEqual(inputs.map((t) => typeof t === "string" && /kill/i.test(t)));
  } else expect(data.results.length).toBeGreaterThan(0);
  await expectLogged(response.headers, "moderations", c.model, false);
}

// ---------------------------------------------------------------------------------------------

describe(`media endpoints differential (seed ${SEED}, MEDIA_DIFF_SEED)`, () => {
  test(`${CASES} random calls: upstream parts and bodies as sent, answers as the upstream gave them, logged and priced`, async () => {
    const r = new Random(SEED);
    for (let i = 0; i < CASES; i++) {
      const kind = r.pick(["transcription", "transcription", "speech", "image", "moderation"] as const);
      const c = kind === "transcription" ? transcriptionCase(r) : kind === "speech" ? speechCase(r) : kind === "image" ? imageCase(r) : moderationCase(r);
      try {
        if (kind === "transcription") await runTranscription(c as TranscriptionCase);
        else if (kind === "speech") await runSpeech(c as SpeechCase);
        else if (kind === "image") await runImage(c as { model: Model; body: Record<string, unknown> });
        else await runModeration(c as { model: Model; body: Record<string, unknown> });
      } catch (err) {
        const shown = JSON.stringify(c, (_k, v) => (v instanceof Uint8Array ? `<${v.length} bytes>` : v));
        throw new Error(`seed ${SEED} case ${i} (${kind}): ${shown}\n${err instanceof Error ? err.message : String(err)}`);
      }
    }
  }, 30_000);

  test("a form the SDK cannot make: extra file parts, curl-style names, parts without a type, each forwarded as sent", async () => {
    const r = new Random(SEED + 1);
    for (let i = 0; i < 14; i++) {
      resetMocks();
      const boundary = `----media${r.int(1e9)}`;
      const file = fileBytes(r);
      const extra = fileBytes(r).subarray(0, 300);
      // As written between the quotes: curl escapes a quote in a name with a backslash.
      const name = r.pick(["rec", "back\\slash.ogg", "é and ü.webm", "blob", "tab\there.mp3", 'say \\"hi\\".mp3', 'back\\slash \\"q\\".ogg']);
      const type = r.pick([undefined, ...TYPES]);
      const part = (headers: string, body: Uint8Array<ArrayBuffer> | string) => [`--${boundary}\r\n${headers}\r\n\r\n`, body, "\r\n"];
      const body = new Blob([
        ...part('Content-Disposition: form-data; name="model"', r.pick(["whisper", "az-whisper"])),
        ...part(`Content-Disposition: form-data; name="file"; filename="${name}"${type ? `\r\nContent-Type: ${type}` : ""}`, file),
        ...part('Content-Disposition: form-data; name="chunking_strategy"', '{"type":"server_vad"}'),
        ...part('Content-Disposition: form-data; name="hint_file"; filename="hint.bin"\r\nContent-Type: application/x-hint', extra),
        ...part('Content-Disposition: form-data; name="include[]"', "logprobs"),
        `--${boundary}--\r\n`,
      ]);
      const bytes = await body.bytes();
      const res = await fetch(`${gw.baseURL}/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": `multipart/form-data; boundary=${boundary}` }, body: bytes });
      expect(res.status).toBe(200);
      const clientParts = byName(rawParts(bytes, `boundary=${boundary}`));
      const model = clientParts.model![0] === "whisper" ? WHISPER : AZ_WHISPER;
      const got = lastRequest(model);
      expectUpstreamCall(model, got, "audio/transcriptions", MASTER_KEY);
      const upstream = byName(got!.parts!);
      // Its type as the client wrote it (not lowercased); a part without a type goes on as a file of
      // unknown type (not as a type guessed from its name's extension); its name as the client meant
      // it (an escaped quote unescaped, then written as a browser writes a quote), and its bytes as sent.
      const [fileName, fileType, fileHex] = upstream.file![0] as string[];
      expect(fileName).toBe((clientParts.file![0] as string[])[0]!.replaceAll('\\"', '"').replaceAll('"', "%22"));
      expect(fileHex).toBe(Buffer.from(file).toString("hex"));
      expect(fileType).toBe(type ?? "application/octet-stream");
      expect(upstream.hint_file).toEqual(clientParts.hint_file!);
      expect(upstream.chunking_strategy).toEqual(['{"type":"server_vad"}']);
      expect(upstream["include[]"]).toEqual(["logprobs"]);
      expect(upstream.model).toEqual([model.upstream]);
    }
  });

  test("an upstream's refusal reaches the client as a 4xx in the envelope, logged as a failure at no cost", async () => {
    const r = new Random(SEED + 2);
    const audio = () => toFile(fileBytes(r), "refused.wav", { type: "audio/wav" });
    const calls: [string, Model, () => Promise<unknown>][] = [
      ["/v1/audio/transcriptions", WHISPER, async () => client.audio.transcriptions.create({ model: "whisper", file: await audio(), response_format: r.pick(["json", "text", "srt"] as const) }).withResponse()],
      ["/v1/audio/transcriptions", TRANSCRIBE, async () => client.audio.transcriptions.create({ model: "transcribe", file: await audio() }).withResponse()],
      ["/v1/audio/speech", TTS, () => client.audio.speech.create({ model: "tts", input: text(r), voice: "alloy" }).withResponse()],
      ["/v1/images/generations", DALLE, () => client.images.generate({ model: "dalle", prompt: text(r) }).withResponse()],
      ["/v1/moderations", OMNI, () => client.moderations.create({ model: "omni", input: text(r) }).withResponse()],
    ];
    for (const [path, m, call] of calls) {
      resetMocks();
      const status = r.pick([400, 401, 403, 404, 422]);
      openai.fault({ kind: "status", status, path });
      const err = (await call().then(
        () => undefined,
        (e: unknown) => e,
      )) as (Error & { status?: number; headers?: Headers; error?: { message?: unknown; type?: unknown } }) | undefined;
      expect(err, `${m.group} ${status}`).toBeInstanceOf(OpenAI.APIError);
      expect(err!.status).toBe(status);
      expect(typeof err!.error?.message).toBe("string");
      expect(typeof err!.error?.type).toBe("string");
      const row = await spendRow(err!.headers?.get("x-svc-call-id") ?? null);
      expect(row).toMatchObject({ call_type: m.group === "dalle" ? "images" : path.split("/").at(-1) === "transcriptions" ? "transcriptions" : path.endsWith("speech") ? "speech" : "moderations", model: m.group, status: "failure" });
      expect(Number(row!.spend)).toBe(0);
    }
  });

  test("a file over the gateway's 64 MiB is a 413 in the error envelope, with its length announced or chunked", async () => {
    resetMocks();
    const boundary = "----media-too-large";
    const head = new TextEncoder().encode(`--${boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="long.wav"\r\nContent-Type: audio/wav\r\n\r\n`);
    const tail = new TextEncoder().encode(`\r\n--${boundary}--\r\n`);
    const mib = new Uint8Array(1024 * 1024);
    const chunked = () =>
      new ReadableStream<Uint8Array>({
        start(c) {
          c.enqueue(head);
          for (let i = 0; i < 65; i++) c.enqueue(mib);
          c.enqueue(tail);
          c.close();
        },
      });
    const whole = await new Blob([head, ...Array.from({ length: 65 }, () => mib), tail]).bytes();
    for (const body of [whole, chunked()]) {
      const res = await fetch(`${gw.baseURL}/audio/transcriptions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": `multipart/form-data; boundary=${boundary}` },
        body,
        duplex: "half",
      } as RequestInit);
      expect(res.status).toBe(413);
      expect(((await res.json()) as { error: { message: string; type: string } }).error).toMatchObject({ type: "invalid_request_error", message: expect.stringContaining("larger") });
    }
    expect(openai.requests).toEqual([]);
    // The gateway as it runs (core/main.ts): Bun's own limit must not answer first with a bare 413.
    const proc = await spawnGateway({ model_list: [{ model_name: "whisper", svc_params: { model: "openai/whisper-1", api_base: openai.url, api_key: UPSTREAM_KEY } }] });
    try {
      const res = await fetch(`${proc.baseURL}/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": `multipart/form-data; boundary=${boundary}` }, body: whole });
      expect(res.status).toBe(413);
      expect(await res.text()).toContain('"type":"invalid_request_error"');
    } finally {
      await proc.stop();
    }
    expect(openai.requests).toEqual([]);
  }, 30_000);

  test("bad input is a 4xx in the error envelope, reaches no upstream and charges nothing", async () => {
    await gw.host!.spendWriter.flush();
    const total = async () => (await rows<{ s: string }>(gw.host!.store.db, sql`select coalesce(sum(spend), 0)::text as s from spend_logs`))[0]!.s;
    const before = await total();
    resetMocks();
    const form = (fields: [string, string | Blob, string?][]) => {
      const f = new FormData();
      for (const [k, v, n] of fields) if (typeof v === "string") f.append(k, v);
      else f.append(k, v, n);
      return f;
    };
    const audio = new Blob([new Uint8Array(4000)], { type: "audio/wav" });
    const json = (b: unknown) => ({ body: JSON.stringify(b), headers: { "content-type": "application/json" } });
    const cases: [string, string, RequestInit, string?][] = [
      ["no file", "audio/transcriptions", { body: form([["model", "whisper"]]) }, "file"],
      ["an empty file", "audio/transcriptions", { body: form([["model", "whisper"], ["file", new Blob([], { type: "audio/wav" }), "empty.wav"]]) }, "file"],
      ["an empty file (Azure)", "audio/transcriptions", { body: form([["model", "az-whisper"], ["file", new Blob([]), "empty.wav"]]) }, "file"],
      ["file as text", "audio/transcriptions", { body: form([["model", "whisper"], ["file", "not a file"]]) }, "file"],
      ["model as a file", "audio/transcriptions", { body: form([["model", new Blob(["whisper"]), "m.txt"], ["file", audio, "a.wav"]]) }, "model"],
      ["temperature as words", "audio/transcriptions", { body: form([["model", "whisper"], ["file", audio, "a.wav"], ["temperature", "warm"]]) }, "temperature"],
      ["temperature out of range", "audio/transcriptions", { body: form([["model", "whisper"], ["file", audio, "a.wav"], ["temperature", "3"]]) }, "temperature"],
      ["an unknown format", "audio/transcriptions", { body: form([["model", "whisper"], ["file", audio, "a.wav"], ["response_format", "mp4"]]) }, "response_format"],
      ["an unknown granularity", "audio/transcriptions", { body: form([["model", "whisper"], ["file", audio, "a.wav"], ["timestamp_granularities[]", "char"]]) }],
      ["a cut multipart body", "audio/transcriptions", { body: '--zz\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--zz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF', headers: { "content-type": "multipart/form-data; boundary=zz" } }],
      ["JSON instead of a form", "audio/transcriptions", json({ model: "whisper", file: "AAAA" })],
      ["an unknown model", "audio/transcriptions", { body: form([["model", "no-such-model"], ["file", audio, "a.wav"]]) }],
      ["speech: input a number", "audio/speech", json({ model: "tts", input: 5, voice: "alloy" }), "input"],
      ["speech: no voice", "audio/speech", json({ model: "tts", input: "hi" }), "voice"],
      ["speech: an unknown format", "audio/speech", json({ model: "tts", input: "hi", voice: "alloy", response_format: "mp4" }), "response_format"],
      ["speech: an unknown model", "audio/speech", json({ model: "no-such-tts", input: "hi", voice: "alloy" })],
      ["speech: not JSON", "audio/speech", { body: "{model: tts", headers: { "content-type": "application/json" } }],
      ["images: n as text", "images/generations", json({ model: "dalle", prompt: "a fox", n: "2" }), "n"],
      ["images: a size not WxH", "images/generations", json({ model: "dalle", prompt: "a fox", size: "big" }), "size"],
      ["images: no prompt", "images/generations", json({ model: "dalle" }), "prompt"],
      ["images: an unknown model", "images/generations", json({ model: "no-such-image-model", prompt: "a fox" })],
      ["moderations: input a number", "moderations", json({ model: "omni", input: 5 }), "input"],
      ["moderations: input empty list", "moderations", json({ model: "omni", input: [] }), "input"],
      ["moderations: an unknown model", "moderations", json({ model: "no-such-moderation", input: "hi" })],
      ["moderations on Azure", "moderations", json({ model: "az-moderation", input: "hi" }), "model"],
      // Not served (README's route list): a clear 404, not an upstream call.
      ["translations", "audio/translations", { body: form([["model", "whisper"], ["file", audio, "a.wav"]]) }],
      ["image edits", "images/edits", { body: form([["model", "dalle"], ["prompt", "x"], ["image", new Blob([new Uint8Array(10)], { type: "image/png" }), "a.png"]]) }],
      ["image variations", "images/variations", { body: form([["model", "dalle"], ["image", new Blob([new Uint8Array(10)], { type: "image/png" }), "a.png"]]) }],
    ];
    for (const [label, path, init, param] of cases) {
      const res = await fetch(`${gw.baseURL}/${path}`, { method: "POST", ...init, headers: { authorization: `Bearer ${MASTER_KEY}`, ...(init.headers as Record<string, string> | undefined) } });
      const text = await res.text();
      const where = `${label}: ${res.status} ${text}`;
      expect(res.status, where).toBeGreaterThanOrEqual(400);
      expect(res.status, where).toBeLessThan(500);
      const body = JSON.parse(text) as { error?: { message?: unknown; type?: unknown; param?: unknown } };
      expect(typeof body.error?.message, where).toBe("string");
      expect(typeof body.error?.type, where).toBe("string");
      if (param) expect(body.error?.param, where).toBe(param);
      if (path.startsWith("images/") && path !== "images/generations") expect(res.status, where).toBe(404);
    }
    expect(openai.requests).toEqual([]);
    expect(azure.requests).toEqual([]);
    await gw.host!.spendWriter.flush();
    expect(await total()).toBe(before);
  });
});
