// `/health` probes each deployment with the smallest call of its kind (`model_info.mode`): an image
// model is asked for an image, a transcription model gets half a second of silence as a WAV, and so
// on. Probing every model with a chat call would mark all of those unhealthy.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const UPSTREAM_KEY = "sk-upstream-health-0123456789";
let mock: MockOpenAI;
let gw: TestGateway;

const MODES: [string, string, string][] = [
  ["chat", "gpt-4o-mini", "/v1/chat/completions"],
  ["embedding", "text-embedding-3-small", "/v1/embeddings"],
  ["completion", "gpt-3.5-turbo-instruct", "/v1/completions"],
  ["image_generation", "dall-e-3", "/v1/images/generations"],
  ["audio_transcription", "whisper-1", "/v1/audio/transcriptions"],
  ["audio_speech", "tts-1", "/v1/audio/speech"],
  ["moderation", "omni-moderation-latest", "/v1/moderations"],
];

beforeAll(async () => {
  mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
  gw = await startTestGateway({
    model_list: MODES.map(([mode, model]) => ({
      model_name: `m-${mode}`,
      svc_params: { model: `openai/${model}`, api_base: mock.url, api_key: UPSTREAM_KEY },
      model_info: { id: `dep-${mode}`, mode },
    })),
    general_settings: { master_key: MASTER_KEY },
  });
});

afterAll(async () => {
  await gw?.stop();
  await mock?.stop();
});

test("every kind of deployment is probed at its own endpoint and found healthy", async () => {
  mock.reset();
  const r = await requestJson<{ healthy_endpoints: { model_id: string }[]; unhealthy_endpoints: { model_id: string; error: string }[] }>(gw, "GET", "/health");
  expect(r.status).toBe(200);
  expect(r.body.unhealthy_endpoints).toEqual([]);
  expect(r.body.healthy_endpoints.map((e) => e.model_id).sort()).toEqual(MODES.map(([mode]) => `dep-${mode}`).sort());
  expect(mock.requests.map((q) => q.path).sort()).toEqual(MODES.map(([, , path]) => path).sort());
  const wav = mock.requests.find((q) => q.path === "/v1/audio/transcriptions")!.body as { file: { size: number; type: string } };
  expect(wav.file.size).toBe(16_044);
  expect(wav.file.type).toMatch(/wav/);
});
