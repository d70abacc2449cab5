// Audio models in /global/spend/report: the spec's usage entry of an audio model is
// `{cost, seconds, requests}`. A transcription priced per second, called with the official `openai`
// SDK against the mock OpenAI upstream (which takes a file as 16 kHz 16-bit PCM, 32,000 bytes a
// second), is reported with the seconds it was charged for, kept in its spend-log row and in the
// daily aggregates (both of the spend writer's paths); speech with the seconds of audio it made;
// models priced by tokens (chat, gpt-4o-transcribe) keep `{cost, input_tokens, output_tokens,
// requests}`. On both stores, and a store written before those seconds existed (migration 0014)
// migrates forward.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import OpenAI, { toFile } from "openai";
import { spendReportJson } from "../../core/http/admin/spend-report.ts";
import type { SpendEntry } from "../../core/spend/entry.ts";
import { writeBatch } from "../../core/spend/flush.ts";
import { openStore, type Store } from "../../core/store/db.ts";
import { MIGRATIONS_SCHEMA, MIGRATIONS_TABLE } from "../../core/store/migrate.ts";
import { migrations } from "../../core/store/migrations/index.ts";
import { rows } from "../../core/store/sql.ts";
import { wav } from "../harness/audio.ts";
import { BACKENDS, freshDatabase, MASTER_KEY, memoryLogger, requestJson, startBackendGateway, type TestGateway } from "../harness/gateway.ts";
import { spendEntry } from "../harness/spend.ts";
import { type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

const UPSTREAM_KEY = "sk-upstream-audio-seconds-0123456789";
const DAY = 86_400_000;
const dayOf = (ms: number) => new Date(ms).toISOString().slice(0, 10);

/** A WAV file of `seconds` of 16 kHz 16-bit mono silence, as the mock reads a file's length. */
const speechFile = (seconds: number) => toFile(wav({ dataBytes: seconds * 32_000 }), "speech.wav", { type: "audio/wav" });

type Usage = Record<string, Record<string, number>>;
type TeamReport = { "group-by-day": string; teams: { team_id: string | null; keys: { key: string; usage: Usage }[] }[] }[];

/** A key's usage on `day` in a team report. */
function usageOf(report: TeamReport, day: string, token: string): Usage | undefined {
  return report.find((d) => d["group-by-day"] === day)?.teams.flatMap((t) => t.keys).find((k) => k.key === token)?.usage;
}

for (const backend of BACKENDS) {
  describe(`audio seconds in spend reports (${backend})`, () => {
    let mock: MockOpenAI;
    let gw: TestGateway;
    let teamId: string;
    let token: string;
    let client: OpenAI;

    beforeAll(async () => {
      mock = await startMockOpenAI({ apiKey: UPSTREAM_KEY });
      const upstream = (model: string) => ({ model, api_base: mock.url, api_key: UPSTREAM_KEY });
      gw = await startBackendGateway(
        backend,
        {
          model_list: [
            { model_name: "whisper", svc_params: upstream("openai/whisper-1"), model_info: { mode: "audio_transcription", input_cost_per_second: 0.0001 } },
            { model_name: "transcribe", svc_params: upstream("openai/gpt-4o-transcribe") },
            { model_name: "tts", svc_params: upstream("openai/tts-1") },
            { model_name: "chat", svc_params: upstream("openai/gpt-4o-mini"), model_info: { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } },
          ],
          general_settings: { master_key: MASTER_KEY },
        },
        { dbPrefix: "gw_audio_seconds" },
      );
      const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { team_alias: "audio team" } });
      teamId = team.body.team_id;
      await requestJson(gw, "POST", "/user/new", { body: { user_id: "u-audio", auto_create_key: false } });
      const key = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { team_id: teamId, user_id: "u-audio" } });
      expect(key.status).toBe(200);
      token = key.body.token;
      client = new OpenAI({ apiKey: key.body.key, baseURL: gw.baseURL, maxRetries: 0 });
    });
    afterAll(async () => {
      await gw?.stop();
      await mock?.stop();
    });

    test("a transcription priced per second is reported as {cost, seconds, requests}, with the seconds it was charged for kept in its log row and the daily aggregates", async () => {
      const first = await client.audio.transcriptions.create({ file: await speechFile(1.5), model: "whisper" }).withResponse();
      expect(first.response.headers.get("x-svc-response-cost")).toBe("0.00015");
      const second = await client.audio.transcriptions.create({ file: await speechFile(0.75), model: "whisper", response_format: "text" }).withResponse();
      expect(second.response.headers.get("x-svc-response-cost")).toBe("0.000075");
      // Priced by tokens: the usage these models are charged for.
      const transcribed = await client.audio.transcriptions.create({ file: await speechFile(1), model: "transcribe" }).withResponse();
      const tokens = (transcribed.data as unknown as { usage: { input_tokens: number; output_tokens: number } }).usage;
      const chat = await client.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "count these words please" }] }).withResponse();
      // Priced per character; the audio made is 30 characters at 15 a second (an MP3 answer tells no length).
      const spoken = await client.audio.speech.create({ model: "tts", input: "thirty characters of speech!!!", voice: "alloy" }).withResponse();
      await spoken.data.arrayBuffer();
      await gw.host!.spendWriter.flush();

      const expected: Usage = {
        whisper: { cost: 0.000225, seconds: 2.25, requests: 2 },
        tts: { cost: 0.00045, seconds: 2, requests: 1 },
        transcribe: { cost: Number(transcribed.response.headers.get("x-svc-response-cost")), input_tokens: tokens.input_tokens, output_tokens: tokens.output_tokens, requests: 1 },
        chat: { cost: Number(chat.response.headers.get("x-svc-response-cost")), input_tokens: chat.data.usage!.prompt_tokens, output_tokens: chat.data.usage!.completion_tokens, requests: 1 },
      };
      const today = dayOf(Date.now());
      // From the day parts, and from the exact fallback an internal_user_id filter takes.
      for (const query of [`team_id=${teamId}`, "internal_user_id=u-audio"]) {
        const report = await requestJson<TeamReport>(gw, "GET", `/global/spend/report?${query}`);
        expect(report.status).toBe(200);
        expect(usageOf(report.body, today, token)).toEqual(expected);
      }
      const logged = await rows<{ model_group: string; audio_seconds: string | null }>(
        gw.host!.store.db,
        sql`select model_group, audio_seconds::text as audio_seconds from spend_logs where api_key = ${token} order by start_time`,
      );
      expect(logged).toEqual([
        { model_group: "whisper", audio_seconds: "1.500000000000" },
        { model_group: "whisper", audio_seconds: "0.750000000000" },
        { model_group: "transcribe", audio_seconds: null },
        { model_group: "chat", audio_seconds: null },
        { model_group: "tts", audio_seconds: "2.000000000000" },
      ]);
      const aggregated = await rows<{ entity_type: string; audio_seconds: string | null }>(
        gw.host!.store.db,
        sql`select entity_type, audio_seconds::text as audio_seconds from daily_spend where model_group = 'whisper' or entity_type = 'provider' order by entity_type`,
      );
      // The provider's row sums every call's: those without seconds add none.
      expect(aggregated).toEqual([
        ...["key", "model"].map((entity_type) => ({ entity_type, audio_seconds: "2.250000000000" })),
        { entity_type: "provider", audio_seconds: "4.250000000000" },
        ...["team", "user"].map((entity_type) => ({ entity_type, audio_seconds: "2.250000000000" })),
      ]);

      // The log row shows its seconds.
      const logs = await requestJson<{ data: { model_group: string; audio_seconds: number | null }[] }>(gw, "GET", `/spend/logs/v2?api_key=${token}&start_date=${today}&end_date=${today}`);
      expect(logs.body.data.map((r) => [r.model_group, r.audio_seconds]).sort()).toEqual([["chat", null], ["transcribe", null], ["tts", 2], ["whisper", 0.75], ["whisper", 1.5]]);
    });

    test("a transcription charged what budgets reserved logs the seconds it was charged for", async () => {
      const key = await requestJson<{ key: string; token: string }>(gw, "POST", "/key/generate", { body: { team_id: teamId } });
      const reserved = new OpenAI({ apiKey: key.body.key, baseURL: gw.baseURL, maxRetries: 0 });
      // The client leaves a 3 s WAV: charged the reservation, ceil(3 × 1.02) + 1 = 5 s.
      mock.fault({ kind: "hang", path: "/v1/audio/transcriptions" });
      const left = new AbortController();
      const call = reserved.audio.transcriptions.create({ file: await speechFile(3), model: "whisper" }, { signal: left.signal });
      await Bun.sleep(500);
      left.abort();
      await call.catch(() => undefined);
      // A file whose length the gateway cannot read, answered without one: 64,000 bytes at 750 a second, 86 s.
      mock.fault({ kind: "status", status: 200, body: { text: "hi" }, path: "/v1/audio/transcriptions" });
      const mp3 = await reserved.audio.transcriptions.create({ file: await toFile(new Uint8Array(64_000), "speech.mp3", { type: "audio/mpeg" }), model: "whisper" }).withResponse();
      expect(mp3.response.headers.get("x-svc-response-cost")).toBe("0.0086");
      let logged: { spend: string; audio_seconds: string | null }[] = [];
      for (let i = 0; i < 100 && logged.length < 2; i++) {
        await gw.host!.spendWriter.flush();
        logged = await rows(gw.host!.store.db, sql`select spend::text as spend, audio_seconds::text as audio_seconds from spend_logs where api_key = ${key.body.token} order by start_time`);
        if (logged.length < 2) await Bun.sleep(50);
      }
      expect(logged).toEqual([
        { spend: "0.000500000000", audio_seconds: "5.000000000000" },
        { spend: "0.008600000000", audio_seconds: "86.000000000000" },
      ]);
    });

    test("seconds add up on both of the writer's paths (a batch of new rows, and one holding a row written before), and in a finished day's stored part", async () => {
      const at = Date.now() - 2 * DAY;
      const entry = (audioPicoseconds: number | null, spendPico: number): SpendEntry =>
        spendEntry(at, { apiKey: token, teamId, userId: "u-audio", model: "whisper", modelGroup: "whisper", upstreamModel: "whisper-1", provider: "openai", spendPico, audioPicoseconds });
      const known = entry(1_250_000_000_000, 125_000_000);
      expect(await writeBatch(gw.host!.store, [known, entry(null, 0)])).toBe(2);
      // Written again with a new row: the store derives the sums from the rows it inserts.
      expect(await writeBatch(gw.host!.store, [known, entry(500_000_000_000, 50_000_000)])).toBe(1);
      const day = dayOf(at);
      for (let i = 0; i < 2; i++) {
        const report = await requestJson<TeamReport>(gw, "GET", `/global/spend/report?team_id=${teamId}&start_date=${day}&end_date=${day}`);
        expect(usageOf(report.body, day, token)).toEqual({ whisper: { cost: 0.000175, seconds: 1.75, requests: 3 } });
      }
      const stored = await rows<{ body: string }>(gw.host!.store.db, sql`select body from report_parts where day = ${day}::date`);
      expect(stored.some((p) => p.body.includes(`"whisper":{"cost":0.000175,"seconds":1.75,"requests":3}`))).toBe(true);
    });
  });

  describe(`a store from before audio seconds migrates forward (${backend})`, () => {
    const dataDir = mkdtempSync(join(tmpdir(), "gw-audio-migrate-"));
    let db: { url: string; drop(): Promise<void> } | undefined;
    let store: Store | undefined;
    const open = () => openStore({ dataDir, databaseUrl: db?.url });
    afterAll(async () => {
      await store?.close();
      await db?.drop();
      rmSync(dataDir, { recursive: true, force: true });
    });

    test("its rows are kept with no seconds, and audio calls written after it are reported with theirs", async () => {
      if (backend === "postgres") db = await freshDatabase("gw_audio_migrate");
      store = await open();
      const at = Date.now() - DAY;
      const apiKey = `k-${randomUUID()}`;
      const chat = spendEntry(at, { apiKey, teamId: "t-old", spendPico: 3_000_000, promptTokens: 2, completionTokens: 1 });
      await writeBatch(store, [chat]);
      // The store as migration 0014 left it: without the columns, and without the record of 0015.
      const last = migrations.at(-1)!;
      expect(last.sql.join("")).toContain(`ADD COLUMN "audio_seconds"`);
      await store.db.execute(sql`alter table spend_logs drop column audio_seconds`);
      await store.db.execute(sql`alter table daily_spend drop column audio_seconds`);
      await store.db.execute(sql`delete from ${sql.identifier(MIGRATIONS_SCHEMA)}.${sql.identifier(MIGRATIONS_TABLE)} where hash = ${last.hash}`);
      await store.close();

      store = await open();
      const applied = await rows<{ hash: string }>(store.db, sql`select hash from ${sql.identifier(MIGRATIONS_SCHEMA)}.${sql.identifier(MIGRATIONS_TABLE)} order by id`);
      expect(applied.map((r) => r.hash)).toEqual(migrations.map((m) => m.hash));
      const old = await rows<{ audio_seconds: string | null; spend: string }>(store.db, sql`select audio_seconds::text as audio_seconds, spend::text as spend from spend_logs where call_id = ${chat.callId}`);
      expect(old).toEqual([{ audio_seconds: null, spend: "0.000003000000" }]);

      await writeBatch(store, [spendEntry(at, { apiKey, teamId: "t-old", model: "whisper", modelGroup: "whisper", spendPico: 300_000_000, audioPicoseconds: 3_000_000_000_000 })]);
      const day = dayOf(at);
      const body = await spendReportJson(store.db, memoryLogger(), { start: day, end: day }, "team");
      const report = JSON.parse(await body!.text()) as TeamReport;
      expect(usageOf(report, day, apiKey)).toEqual({
        "alpha-model": { cost: 0.000003, input_tokens: 2, output_tokens: 1, requests: 1 },
        whisper: { cost: 0.0003, seconds: 3, requests: 1 },
      });
    }, 60_000);
  });
}
