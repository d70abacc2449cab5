/**
 * Call costs against providers' published prices, written here (not read back from the price
 * file). Prices are USD per million tokens, which is exactly pico-dollars per token × 10^-6, so
 * every expected value is exact integer arithmetic.
 */
import { describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Deployment, Usage } from "../../core/contract.ts";
import { columnToPico, picoToText, picoToUsd, usdToPico } from "../../core/cost/money.ts";
import { PriceTable } from "../../core/cost/prices.ts";
import { Pricing } from "../../core/cost/pricing.ts";
import { usageFromAnthropic } from "../../providers/anthropic/usage.ts";
import { usageFromGemini } from "../../providers/gemini/usage.ts";
import { chatCompletionFrom } from "../../providers/gemini/response.ts";
import { geminiStream } from "../../providers/gemini/stream.ts";
import { openAIChat, openAIImages } from "../../providers/openai-compatible/adapter.ts";
import { usageFromOpenAI } from "../../providers/openai-compatible/usage.ts";
import { countsTokens, openAIUsage } from "../../core/openai-usage.ts";
import { speechBound, speechUsage } from "../../core/wire.ts";
import { worstCaseOf } from "../../core/cost/worst-case.ts";
import { joinEmbeddingLists } from "../../providers/shared/embedding-list.ts";

const pricing = new Pricing(new PriceTable());

function deployment(model: string, info: Record<string, unknown> = {}, options: Record<string, unknown> = {}): Deployment {
  const slash = model.indexOf("/");
  return { id: `d-${model}-${JSON.stringify([info, options])}`, modelName: model, provider: model.slice(0, slash), upstreamModel: model.slice(slash + 1), options: { model, ...options }, info };
}

/** USD per million tokens → pico-dollars per token. */
const perM = (usd: string) => usdToPico(usd) / 1_000_000n;

interface Case {
  model: string;
  /** Published prices, USD per million tokens. */
  input: string;
  output: string;
  cacheRead?: string;
  cacheWrite?: string;
  audioIn?: string;
  usage: Usage;
}

function expected(c: Case): bigint {
  const u = c.usage;
  const cached = BigInt(u.cachedPromptTokens ?? 0);
  const written = BigInt(u.cacheCreationTokens ?? 0);
  const audio = BigInt(u.audioPromptTokens ?? 0);
  const plain = BigInt(u.promptTokens) - cached - written - audio;
  return (
    plain * perM(c.input) +
    cached * perM(c.cacheRead ?? c.input) +
    written * perM(c.cacheWrite ?? c.input) +
    audio * perM(c.audioIn ?? c.input) +
    BigInt(u.completionTokens) * perM(c.output)
  );
}

const chat = (p: number, c: number, extra: Partial<Usage> = {}): Usage => ({ promptTokens: p, completionTokens: c, ...extra });

const CASES: Case[] = [
  // OpenAI
  { model: "openai/gpt-4o", input: "2.50", output: "10.00", cacheRead: "1.25", usage: chat(1200, 350, { cachedPromptTokens: 1024 }) },
  { model: "openai/gpt-4o-mini", input: "0.15", output: "0.60", cacheRead: "0.075", usage: chat(5000, 1000, { cachedPromptTokens: 2048 }) },
  // Reasoning tokens are output tokens, billed at the output price.
  { model: "openai/o1", input: "15.00", output: "60.00", usage: chat(800, 4000, { reasoningTokens: 3500 }) },
  { model: "openai/o3-mini", input: "1.10", output: "4.40", usage: chat(1000, 2000, { reasoningTokens: 1500 }) },
  { model: "openai/gpt-4.1", input: "2.00", output: "8.00", usage: chat(123, 45) },
  { model: "openai/text-embedding-3-small", input: "0.02", output: "0", usage: chat(8000, 0) },
  { model: "openai/text-embedding-3-large", input: "0.13", output: "0", usage: chat(777, 0) },
  // Anthropic: cache reads at 10 %, cache writes at 125 % of the input price.
  { model: "anthropic/claude-3-5-sonnet-20240620", input: "3.00", output: "15.00", cacheRead: "0.30", cacheWrite: "3.75", usage: chat(10_000, 500, { cachedPromptTokens: 6000, cacheCreationTokens: 3000 }) },
  { model: "anthropic/claude-3-5-haiku-20241022", input: "0.80", output: "4.00", cacheRead: "0.08", cacheWrite: "1.00", usage: chat(3000, 300, { cachedPromptTokens: 1000, cacheCreationTokens: 1000 }) },
  { model: "anthropic/claude-3-opus-20240229", input: "15.00", output: "75.00", usage: chat(2000, 1000) },
  // Gemini: above 128k prompt tokens the whole call is billed at the higher tier.
  { model: "gemini/gemini-1.5-pro", input: "7.00", output: "21.00", usage: chat(150_000, 2000) },
  { model: "gemini/gemini-1.5-pro", input: "3.50", output: "10.50", usage: chat(100_000, 2000) },
  { model: "gemini/gemini-1.5-flash", input: "0.075", output: "0.30", usage: chat(40_000, 1234) },
  { model: "gemini/gemini-2.0-flash", input: "0.10", output: "0.40", audioIn: "0.70", cacheRead: "0.025", usage: chat(5000, 800, { audioPromptTokens: 2000, cachedPromptTokens: 1000 }) },
  // Mistral
  { model: "mistral/mistral-large-latest", input: "2.00", output: "6.00", usage: chat(900, 300) },
  { model: "mistral/mistral-small-latest", input: "0.10", output: "0.30", usage: chat(12_345, 678) },
  { model: "mistral/mistral-embed", input: "0.10", output: "0", usage: chat(4096, 0) },
  // Groq
  { model: "groq/llama-3.3-70b-versatile", input: "0.59", output: "0.79", usage: chat(2222, 333) },
  { model: "groq/llama-3.1-8b-instant", input: "0.05", output: "0.08", usage: chat(100_000, 20_000) },
  // DeepSeek
  { model: "deepseek/deepseek-chat", input: "0.27", output: "1.10", cacheRead: "0.07", usage: chat(6000, 900, { cachedPromptTokens: 4000 }) },
  { model: "deepseek/deepseek-reasoner", input: "0.55", output: "2.19", usage: chat(1500, 6000, { reasoningTokens: 5000 }) },
  // xAI, Together
  { model: "xai/grok-2", input: "2.00", output: "10.00", usage: chat(321, 123) },
  { model: "together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo", input: "0.88", output: "0.88", usage: chat(4000, 4000) },
];

describe("cost of a call from the bundled price table", () => {
  test("covers at least 20 models of 6 providers", () => {
    expect(new Set(CASES.map((c) => c.model)).size).toBeGreaterThanOrEqual(20);
    expect(new Set(CASES.map((c) => c.model.split("/")[0])).size).toBeGreaterThanOrEqual(6);
  });

  for (const c of CASES) {
    test(`${c.model} ${JSON.stringify(c.usage)}`, () => {
      const got = pricing.costOf(deployment(c.model), c.usage);
      expect(got.priced).toBe(true);
      expect(picoToText(got.cost)).toBe(picoToText(expected(c)));
    });
  }

  test("one concrete figure: gpt-4o, 1,000 in and 500 out = $0.0075", () => {
    expect(picoToText(pricing.costOf(deployment("openai/gpt-4o"), chat(1000, 500)).cost)).toBe("0.0075");
  });

  test("a Bedrock inference profile (cross-region id or ARN) without an entry of its own is priced as its base model; one with an entry keeps it", () => {
    const million = chat(1_000_000, 0);
    // Claude 3.7 Sonnet on Bedrock: $3 per million in; the file has no apac., jp. or global. entry for it.
    for (const id of [
      "apac.anthropic.claude-3-7-sonnet-20250219-v1:0",
      "jp.anthropic.claude-3-7-sonnet-20250219-v1:0",
      "global.anthropic.claude-3-7-sonnet-20250219-v1:0",
      "converse/apac.anthropic.claude-3-7-sonnet-20250219-v1:0",
      "arn:aws:bedrock:ap-northeast-1:123456789012:inference-profile/apac.anthropic.claude-3-7-sonnet-20250219-v1:0",
      "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-7-sonnet-20250219-v1:0",
    ]) {
      expect(pricing.costOf(deployment(`bedrock/${id}`), million)).toEqual({ cost: usdToPico("3"), priced: true, source: "anthropic.claude-3-7-sonnet-20250219-v1:0" });
    }
    // Nova Pro: $0.80 per million, $1.05 through its EU profile, which has its own entry.
    expect(picoToText(pricing.costOf(deployment("bedrock/amazon.nova-pro-v1:0"), million).cost)).toBe("0.8");
    expect(picoToText(pricing.costOf(deployment("bedrock/eu.amazon.nova-pro-v1:0"), million).cost)).toBe("1.05");
    expect(picoToText(pricing.costOf(deployment("bedrock/arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.amazon.nova-pro-v1:0"), million).cost)).toBe("1.05");
    // Other providers' names are not rewritten.
    expect(pricing.costOf(deployment("openai/us.gpt-4o"), million).priced).toBe(false);
  });

  test("image generation: dall-e-3 hd 1024x1792 priced per pixel, per image", () => {
    const usage: Usage = { promptTokens: 0, completionTokens: 0, images: { count: 2, size: "1024x1792", quality: "hd" } };
    const got = pricing.costOf(deployment("openai/dall-e-3"), usage);
    // OpenAI: $0.12 per hd 1024x1792 image, which the price file states as 6.539e-8 per pixel.
    const perPixelPico = 65_390n; // 6.539e-8 USD in pico-dollars
    expect(got.cost).toBe(2n * 1024n * 1792n * perPixelPico);
    expect(Math.abs(Number(picoToText(got.cost)) - 0.24)).toBeLessThan(0.0001);
  });

  test("image generation: standard quality is the default for a sized request", () => {
    const got = pricing.costOf(deployment("openai/dall-e-3"), { promptTokens: 0, completionTokens: 0, images: { count: 1, size: "1024x1024" } });
    expect(Math.abs(Number(picoToText(got.cost)) - 0.04)).toBeLessThan(0.0001);
  });

  test("audio transcription is billed per second ($0.006 per minute)", () => {
    const got = pricing.costOf(deployment("openai/whisper-1"), { promptTokens: 0, completionTokens: 0, audioSeconds: 90 });
    expect(picoToText(got.cost)).toBe("0.009");
  });

  test("a transcription's length is priced as reported, not rounded to the millisecond", () => {
    // whisper-1 at $0.0001 a second: 7.0005 s is $0.00070005 exactly (rounded to 7.001 s it was $0.0007001).
    const at = (audioSeconds: number) => picoToText(pricing.costOf(deployment("openai/whisper-1"), { promptTokens: 0, completionTokens: 0, audioSeconds }).cost);
    expect(at(7.0005)).toBe("0.00070005");
    // A float32 length as whisper writes it: the exact product, rounded once to the pico-dollar.
    expect(at(154.42767333984375)).toBe("0.015442767334");
  });

  test("speech is billed per input character ($15 per million)", () => {
    const got = pricing.costOf(deployment("openai/tts-1"), { promptTokens: 0, completionTokens: 0, characters: 2500 });
    expect(picoToText(got.cost)).toBe("0.0375");
  });

  test("speech characters are code points (Python's len, as LiteLLM counts), not UTF-16 units", () => {
    // "Hi 👋🏽, 日本 👨‍👩‍👧!": 16 code points; JavaScript's length is 21 (each emoji two units).
    const input = "Hi \u{1F44B}\u{1F3FD}, \u65E5\u672C \u{1F468}\u200D\u{1F469}\u200D\u{1F467}!";
    expect(input.length).toBe(21);
    const req = { model: "tts-1", input, voice: "alloy" };
    expect(speechUsage(req).characters).toBe(16);
    expect(speechBound(req).characters).toBe(16);
    expect(picoToText(pricing.costOf(deployment("openai/tts-1"), speechUsage(req)).cost)).toBe("0.00024");
    // A lone surrogate is one code point, as Python reads "\ud83d" from JSON.
    expect(speechUsage({ ...req, input: "a\uD83Db" }).characters).toBe(3);
  });
});

describe("parts of usage priced at their own rates, read from the provider's usage", () => {
  test("OpenAI audio tokens in and out (gpt-4o-audio-preview: $40 and $80 per million, text $2.50 and $10)", () => {
    const usage = usageFromOpenAI({
      prompt_tokens: 1000,
      completion_tokens: 600,
      total_tokens: 1600,
      prompt_tokens_details: { cached_tokens: 0, audio_tokens: 800 },
      completion_tokens_details: { reasoning_tokens: 0, audio_tokens: 500 },
    });
    expect(usage).toMatchObject({ audioPromptTokens: 800, audioCompletionTokens: 500 });
    const got = pricing.costOf(deployment("openai/gpt-4o-audio-preview-2024-12-17"), usage).cost;
    expect(picoToText(got)).toBe(picoToText(200n * perM("2.50") + 800n * perM("40.00") + 100n * perM("10.00") + 500n * perM("80.00")));
  });

  test("OpenAI cached audio priced once, at the cached-audio rate (gpt-4o-realtime-preview-2024-10-01: audio $100, cached audio $20, text $5, cached text $2.50, out $20 and audio out $200)", () => {
    // 10,000 prompt tokens: 2,000 text (1,000 of them cached) and 8,000 audio (6,000 cached).
    // cached_tokens counts cached text and audio (7,000), audio_tokens all audio (8,000).
    const raw = {
      prompt_tokens: 10_000,
      completion_tokens: 500,
      total_tokens: 10_500,
      prompt_tokens_details: { cached_tokens: 7_000, audio_tokens: 8_000, text_tokens: 2_000, cached_tokens_details: { text_tokens: 1_000, audio_tokens: 6_000 } },
      completion_tokens_details: { reasoning_tokens: 0, audio_tokens: 400, text_tokens: 100 },
    };
    const usage = usageFromOpenAI(raw);
    expect(usage).toMatchObject({ promptTokens: 10_000, cachedPromptTokens: 7_000, audioPromptTokens: 8_000, cachedAudioPromptTokens: 6_000 });
    const d = deployment("openai/gpt-4o-realtime-preview-2024-10-01");
    // 1,000 × $5 + 1,000 × $2.50 + 2,000 × $100 + 6,000 × $20 + 100 × $20 + 400 × $200 per million
    // = 0.005 + 0.0025 + 0.2 + 0.12 + 0.002 + 0.08 = $0.4095 (it was $0.8995: the cached audio at
    // $2.50 and again at $100, and 1,000 text tokens dropped).
    expect(picoToText(pricing.costOf(d, usage).cost)).toBe("0.4095");
    // The same usage without cached_tokens_details: cached and audio overlap at least by what they
    // exceed the prompt by (5,000), cached text first; 10,000 tokens priced, none twice:
    // 2,000 × $2.50 + 5,000 × $20 + 3,000 × $100 + 100 × $20 + 400 × $200 = 0.005 + 0.1 + 0.3 + 0.082 = $0.487.
    const bare = usageFromOpenAI({ ...raw, prompt_tokens_details: { cached_tokens: 7_000, audio_tokens: 8_000 } });
    expect(bare.cachedAudioPromptTokens).toBeUndefined();
    expect(picoToText(pricing.costOf(d, bare).cost)).toBe("0.487");
    // The budget worst case stays the dearest rate: every prompt token as uncached audio.
    expect(pricing.worstCase(d, 10_000, 500)).toBe(10_000n * perM("100") + 500n * perM("200"));
    // /spend/calculate-style OpenAI usage, the entry naming cache_read_input_audio_token_cost
    // (gpt-realtime-mini: cached audio $0.30, audio $10, text $0.60, out $2.40, audio out $20):
    // 1,000 × $0.60 + 1,000 × $0.60 (no cached text price: as input) + 2,000 × $10 + 6,000 × $0.30
    // + 100 × $2.40 + 400 × $20 = 0.0006 + 0.0006 + 0.02 + 0.0018 + 0.00024 + 0.008 = $0.03124.
    expect(picoToText(pricing.costOf(deployment("openai/gpt-realtime-mini"), usage).cost)).toBe("0.03124");
  });

  test("Gemini audio prompt tokens (promptTokensDetails AUDIO; gemini-2.0-flash: $0.70 per million, text $0.10, cached $0.025)", () => {
    const usage = usageFromGemini({
      promptTokenCount: 5000,
      candidatesTokenCount: 800,
      totalTokenCount: 5800,
      cachedContentTokenCount: 1000,
      promptTokensDetails: [
        { modality: "TEXT", tokenCount: 3000 },
        { modality: "AUDIO", tokenCount: 2000 },
      ],
      cacheTokensDetails: [{ modality: "TEXT", tokenCount: 1000 }],
    });
    expect(usage).toEqual({ promptTokens: 5000, completionTokens: 800, cachedPromptTokens: 1000, audioPromptTokens: 2000 });
    const got = pricing.costOf(deployment("gemini/gemini-2.0-flash"), usage).cost;
    expect(picoToText(got)).toBe(picoToText(2000n * perM("0.10") + 1000n * perM("0.025") + 2000n * perM("0.70") + 800n * perM("0.40")));
    // The client's usage says what was charged.
    expect(openAIUsage(usage)).toMatchObject({ prompt_tokens: 5000, prompt_tokens_details: { cached_tokens: 1000, audio_tokens: 2000 } });
  });

  test("Anthropic cache writes for an hour (claude-sonnet-4: $6 per million, 5-minute writes $3.75, reads $0.30, input $3)", () => {
    const usage = usageFromAnthropic({
      input_tokens: 100,
      cache_read_input_tokens: 2000,
      cache_creation_input_tokens: 3000,
      cache_creation: { ephemeral_5m_input_tokens: 1000, ephemeral_1h_input_tokens: 2000 },
      output_tokens: 50,
    });
    expect(usage).toEqual({ promptTokens: 5100, completionTokens: 50, cachedPromptTokens: 2000, cacheCreationTokens: 3000, cacheCreation1hTokens: 2000 });
    const got = pricing.costOf(deployment("anthropic/claude-sonnet-4-20250514"), usage).cost;
    expect(picoToText(got)).toBe(picoToText(100n * perM("3.00") + 2000n * perM("0.30") + 1000n * perM("3.75") + 2000n * perM("6.00") + 50n * perM("15.00")));
    // Budgets reserve the prompt at the dearest input rate, the 1-hour write's.
    expect(pricing.worstCase(deployment("anthropic/claude-sonnet-4-20250514"), 100, 10)).toBe(100n * perM("6.00") + 10n * perM("15.00"));
  });

  test("Anthropic 1-hour cache writes above 200k prompt tokens at the long-context rate (claude-sonnet-4: $12 per million, 2× its $6 input there)", () => {
    // The file prices claude-sonnet-4 above 200k tokens: input $6, output $22.50, 5-minute writes
    // $7.50, reads $0.60; 1-hour writes $6 below, and no field above: raised as the input is (2×).
    const usage = usageFromAnthropic({
      input_tokens: 200_000,
      cache_read_input_tokens: 10_000,
      cache_creation_input_tokens: 40_000,
      cache_creation: { ephemeral_5m_input_tokens: 10_000, ephemeral_1h_input_tokens: 30_000 },
      output_tokens: 1_000,
    });
    expect(usage).toMatchObject({ promptTokens: 250_000, cacheCreationTokens: 40_000, cacheCreation1hTokens: 30_000 });
    const d = deployment("anthropic/claude-sonnet-4-20250514");
    // 200,000 × $6 + 10,000 × $0.60 + 10,000 × $7.50 + 30,000 × $12 + 1,000 × $22.50 per million
    // = 1.2 + 0.006 + 0.075 + 0.36 + 0.0225 = $1.6635 (it was $1.4835: the 1-hour writes at $6).
    expect(picoToText(pricing.costOf(d, usage).cost)).toBe("1.6635");
    // Budgets: a 250,000-token prompt at the dearest rate that can apply there, the 1-hour write's
    // $12: 250,000 × $12 + 1,000 × $22.50 = $3.0225 (it was $1.8975, at the 5-minute write's $7.50).
    expect(picoToText(pricing.worstCase(d, 250_000, 1_000))).toBe("3.0225");
    // At or below 200k nothing changes: 1-hour writes at $6.
    expect(picoToText(pricing.costOf(d, chat(200_000, 0, { cacheCreationTokens: 30_000, cacheCreation1hTokens: 30_000 })).cost)).toBe("0.69");
    // An entry's own above-200k 1-hour price (LiteLLM's field name) wins over the doubling.
    const own = deployment("anthropic/claude-sonnet-4-20250514", { cache_creation_input_token_cost_above_1hr_above_200k_tokens: 0.00001 });
    expect(picoToText(pricing.costOf(own, usage).cost)).toBe("1.6035");
  });

  test("Gemini grounding with Google Search: each webSearchQueries entry a search, at an operator's search_context_cost_per_query (the file prices none for Gemini)", () => {
    const answer = {
      candidates: [{ index: 0, content: { role: "model", parts: [{ text: "Spain won." }] }, finishReason: "STOP", groundingMetadata: { webSearchQueries: ["euro 2024 winner", "euro 2024 final score"] } }],
      usageMetadata: { promptTokenCount: 1_000, candidatesTokenCount: 200, totalTokenCount: 1_200 },
    };
    const { usage } = chatCompletionFrom(answer);
    expect(usage).toEqual({ promptTokens: 1_000, completionTokens: 200, webSearchRequests: 2 });
    // gemini-2.0-flash: $0.10 in, $0.40 out per million. The file names no search price: tokens only.
    expect(picoToText(pricing.costOf(deployment("gemini/gemini-2.0-flash"), usage).cost)).toBe("0.00018");
    // An operator's price, $35 per thousand: 1,000 × $0.10 + 200 × $0.40 per million + 2 × $0.035 = $0.07018
    // (it was $0.00018: the searches were not read).
    const priced = deployment("gemini/gemini-2.0-flash", { search_context_cost_per_query: { search_context_size_low: 0.035, search_context_size_medium: 0.035, search_context_size_high: 0.035 } });
    expect(picoToText(pricing.costOf(priced, usage).cost)).toBe("0.07018");
    // A stream: the grounding metadata comes with the candidate's last event, the usage with it.
    const t = geminiStream();
    const state = t.init({ model: "gemini-2.0-flash", messages: [{ role: "user", content: "who won" }] } as never);
    t.event(JSON.stringify({ candidates: [{ index: 0, content: { role: "model", parts: [{ text: "Spain" }] } }], usageMetadata: { promptTokenCount: 1_000 } }), state);
    const last = t.event(JSON.stringify({ ...answer, candidates: [{ ...answer.candidates[0], content: { role: "model", parts: [{ text: " won." }] } }] }), state);
    const reported = last.find((p) => p.type === "usage");
    expect(reported).toEqual({ type: "usage", usage: { promptTokens: 1_000, completionTokens: 200, webSearchRequests: 2 } });
  });

  test("Anthropic web searches ($10 per thousand, search_context_cost_per_query) beside the tokens", () => {
    const usage = usageFromAnthropic({ input_tokens: 1000, output_tokens: 200, server_tool_use: { web_search_requests: 3 } });
    expect(usage).toEqual({ promptTokens: 1000, completionTokens: 200, webSearchRequests: 3 });
    const got = pricing.costOf(deployment("anthropic/claude-sonnet-4-20250514"), usage).cost;
    expect(picoToText(got)).toBe(picoToText(1000n * perM("3.00") + 200n * perM("15.00") + 3n * usdToPico("0.01")));
  });

  test("DeepSeek cache hits (prompt_cache_hit_tokens) at the cache-hit price, also where the entry names it only input_cost_per_token_cache_hit", () => {
    const usage = usageFromOpenAI({ prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100, prompt_cache_hit_tokens: 600, prompt_cache_miss_tokens: 400 });
    expect(usage).toEqual({ promptTokens: 1000, completionTokens: 100, cachedPromptTokens: 600 });
    // deepseek-chat: $0.27 in, $0.07 cache hit, $1.10 out; deepseek-reasoner: $0.55, $0.14, $2.19.
    expect(picoToText(pricing.costOf(deployment("deepseek/deepseek-chat"), usage).cost)).toBe(picoToText(400n * perM("0.27") + 600n * perM("0.07") + 100n * perM("1.10")));
    expect(picoToText(pricing.costOf(deployment("deepseek/deepseek-reasoner"), usage).cost)).toBe(picoToText(400n * perM("0.55") + 600n * perM("0.14") + 100n * perM("2.19")));
  });

  test("an OpenAI search model's answer citing the web is one search, at the context size asked ($30 / $35 / $50 per thousand)", () => {
    const chat = openAIChat();
    const citation = { type: "url_citation", url_citation: { start_index: 0, end_index: 1, title: "t", url: "https://example.com" } };
    const answer = (annotations: unknown[]) => ({ choices: [{ index: 0, message: { role: "assistant", content: "x", annotations }, finish_reason: "stop" }], usage: { prompt_tokens: 100, completion_tokens: 10, total_tokens: 110 } });
    const req = (size?: string) => ({ model: "s", messages: [{ role: "user", content: "q" }], ...(size ? { web_search_options: { search_context_size: size } } : {}) }) as never;
    const d = deployment("openai/gpt-4o-search-preview");
    const tokens = 100n * perM("2.50") + 10n * perM("10.00");
    const cost = (annotations: unknown[], size?: string) => pricing.costOf(d, chat.response(answer(annotations), req(size)).usage).cost;
    expect(cost([citation], "low")).toBe(tokens + usdToPico("0.03"));
    expect(cost([citation])).toBe(tokens + usdToPico("0.035"));
    expect(cost([citation], "high")).toBe(tokens + usdToPico("0.05"));
    expect(cost([], "high")).toBe(tokens);
    // A stream: the citation comes in a delta, the usage chunk after it.
    const stream = chat.stream!;
    const s = stream.init(req("high"));
    const parts = [
      ...stream.event(JSON.stringify({ id: "c", choices: [{ index: 0, delta: { annotations: [citation] }, finish_reason: null }] }), s),
      ...stream.event(JSON.stringify({ id: "c", choices: [], usage: { prompt_tokens: 100, completion_tokens: 10, total_tokens: 110 } }), s),
    ];
    const usage = parts.find((p) => p.type === "usage");
    expect(usage?.type === "usage" && pricing.costOf(d, usage.usage).cost).toBe(tokens + usdToPico("0.05"));
  });

  test("Perplexity's online models: a fee per request ($5 per thousand) besides the tokens, reserved too", () => {
    const d = deployment("perplexity/pplx-7b-online");
    // Input tokens free, 200 output tokens at $0.28 per million, and the $0.005 fee.
    expect(picoToText(pricing.costOf(d, chat(1000, 200)).cost)).toBe(picoToText(200n * perM("0.28") + usdToPico("0.005")));
    // A call that used nothing (refused, or left before its answer) pays no fee.
    expect(pricing.costOf(d, chat(0, 0)).cost).toBe(0n);
    expect(pricing.worstCase(d, 1000, 200)).toBe(200n * perM("0.28") + usdToPico("0.005"));
  });

  test("OpenAI-shaped usage: counts as whole-number text are counts; a count left out beside a total is the total less the other; a total alone is split at the prompt's estimate", () => {
    expect(usageFromOpenAI({ prompt_tokens: "100", completion_tokens: " 10 " })).toEqual({ promptTokens: 100, completionTokens: 10 });
    // Other text is no count.
    expect(usageFromOpenAI({ prompt_tokens: "1e3", completion_tokens: "ten" })).toEqual({ promptTokens: 0, completionTokens: 0 });
    expect(usageFromOpenAI({ prompt_tokens: 100, total_tokens: 110 })).toEqual({ promptTokens: 100, completionTokens: 10 });
    expect(usageFromOpenAI({ completion_tokens: 10, total_tokens: "110" })).toEqual({ promptTokens: 100, completionTokens: 10 });
    expect(usageFromOpenAI({ total_tokens: 110 }, () => 30)).toEqual({ promptTokens: 30, completionTokens: 80 });
    // An estimate above the total: the total is all prompt, no count is negative.
    expect(usageFromOpenAI({ total_tokens: 110 }, () => 500)).toEqual({ promptTokens: 110, completionTokens: 0 });
    expect(usageFromOpenAI({ prompt_tokens: 200, total_tokens: 110 })).toEqual({ promptTokens: 200, completionTokens: 0 });
    // Without an estimate (an embedding's usage), a total alone is the prompt's.
    expect(usageFromOpenAI({ total_tokens: 8 })).toEqual({ promptTokens: 8, completionTokens: 0 });
    expect([{}, { prompt_tokens: null }, { total_tokens: "many" }, null].map(countsTokens)).toEqual([false, false, false, false]);
    expect([{ prompt_tokens: 0 }, { completion_tokens: "3" }, { total_tokens: 8 }].map(countsTokens)).toEqual([true, true, true]);
  });

  test("Perplexity's Sonar: a request fee at the search context size its usage reports; Deep Research: a fee per search query", () => {
    const sonar = usageFromOpenAI({ prompt_tokens: 10, completion_tokens: 100, total_tokens: 110, search_context_size: "high" });
    expect(sonar).toMatchObject({ webSearchRequests: 1, searchContextSize: "high" });
    // sonar-pro: $3 and $15 per million, and the high size's $14 per thousand requests.
    expect(picoToText(pricing.costOf(deployment("perplexity/sonar-pro"), sonar).cost)).toBe(picoToText(10n * perM("3") + 100n * perM("15") + usdToPico("0.014")));
    const deep = usageFromOpenAI({ prompt_tokens: 10, completion_tokens: 100, total_tokens: 110, search_context_size: "low", num_search_queries: 26 });
    expect(deep).toMatchObject({ webSearchRequests: 26, searchContextSize: "low" });
    // sonar-deep-research: $2 and $8 per million, and 26 queries at $5 per thousand.
    expect(picoToText(pricing.costOf(deployment("perplexity/sonar-deep-research"), deep).cost)).toBe(picoToText(10n * perM("2") + 100n * perM("8") + 26n * usdToPico("0.005")));
    // Other providers' usage says nothing of searches.
    expect(usageFromOpenAI({ prompt_tokens: 10, completion_tokens: 100 }).webSearchRequests).toBeUndefined();
    // Deep Research's citation and reasoning tokens, reported beside its prompt and completion: parts of the totals at $2 and $3 per million.
    const full = usageFromOpenAI({ prompt_tokens: 19, completion_tokens: 9289, total_tokens: 9308, citation_tokens: 72398, num_search_queries: 26, reasoning_tokens: 181712 });
    expect(full).toMatchObject({ promptTokens: 19 + 72398, citationTokens: 72398, completionTokens: 9289 + 181712, reasoningTokens: 181712, webSearchRequests: 26 });
    const cost = 19n * perM("2") + 72398n * perM("2") + 9289n * perM("8") + 181712n * perM("3") + 26n * usdToPico("0.005");
    expect(picoToText(pricing.costOf(deployment("perplexity/sonar-deep-research"), full).cost)).toBe(picoToText(cost));
    // Another provider's top-level reasoning count is left as it is.
    expect(usageFromOpenAI({ prompt_tokens: 10, completion_tokens: 100, reasoning_tokens: 50 })).toEqual({ promptTokens: 10, completionTokens: 100 });
  });

  test("gpt-image-1-mini: text and image tokens in ($2, $2.50 per million), image tokens out ($8), not also the size's price per image", () => {
    const usage = openAIImages().response(
      { created: 1, data: [{ b64_json: "x" }, { b64_json: "y" }], size: "1024x1024", quality: "low", usage: { input_tokens: 150, input_tokens_details: { text_tokens: 50, image_tokens: 100 }, output_tokens: 544, total_tokens: 694 } },
      { model: "gpt-image-1-mini", prompt: "two cats", n: 2, size: "1024x1024", quality: "low" },
      new Headers(),
    ).usage;
    expect(usage).toMatchObject({ promptTokens: 150, imagePromptTokens: 100, completionTokens: 544, imageCompletionTokens: 544, images: { count: 2, size: "1024x1024", quality: "low" } });
    const d = deployment("openai/gpt-image-1-mini");
    expect(picoToText(pricing.costOf(d, usage).cost)).toBe(picoToText(50n * perM("2") + 100n * perM("2.50") + 544n * perM("8")));
    // Without tokens in the answer, the size's price per image, as before ($0.005 low at 1024x1024).
    expect(picoToText(pricing.costOf(d, { promptTokens: 0, completionTokens: 0, images: { count: 2, size: "1024x1024", quality: "low" } }).cost)).toBe("0.01");
    // Budgets reserve the most its images can count: 6,240 tokens each at $8 per million (and the prompt at $2.50), beside the dearest size's price per image.
    const reserved = worstCaseOf("images", { model: "gpt-image-1-mini", prompt: "two cats", n: 2, quality: "high" }, d, pricing, 150, undefined, 0);
    expect(reserved).toBeGreaterThanOrEqual(150n * perM("2.50") + 2n * 6_240n * perM("8"));
    // dall-e answers without usage: priced per pixel only.
    expect(openAIImages().response({ created: 1, data: [{ url: "u" }] }, { model: "dall-e-3", prompt: "p" }, new Headers()).usage).toMatchObject({ promptTokens: 0, completionTokens: 0 });
  });

  test("gpt-image-1: the file prices it per pixel by size and quality, not per token; an operator's image-token prices replace that, not add to it", () => {
    const answer = { created: 1, data: [{ b64_json: "x" }], size: "1024x1024", quality: "medium", usage: { input_tokens: 50, input_tokens_details: { text_tokens: 50, image_tokens: 0 }, output_tokens: 4_160, total_tokens: 4_210 } };
    const usage = openAIImages().response(answer, { model: "gpt-image-1", prompt: "a cat", size: "1024x1024", quality: "medium" }, new Headers()).usage;
    expect(usage).toMatchObject({ promptTokens: 50, completionTokens: 4_160, imageCompletionTokens: 4_160, images: { count: 1, size: "1024x1024", quality: "medium" } });
    // No input_cost_per_image_token / output_cost_per_image_token for gpt-image-1 in the file:
    // medium/1024-x-1024/gpt-image-1's 4.0054321e-08 per pixel × 1,048,576 pixels = $0.041999999696896.
    expect(picoToText(pricing.costOf(deployment("openai/gpt-image-1"), usage).cost)).toBe("0.041999999697");
    // OpenAI's token prices set by the operator (text in $5, image out $40 per million):
    // 50 × $5 + 4,160 × $40 per million = $0.16665, and not also the bare entry's per-pixel
    // price (it was $0.208649999697, the $0.042 per image added).
    const own = deployment("openai/gpt-image-1", { input_cost_per_token: 0.000005, input_cost_per_image_token: 0.00001, output_cost_per_image_token: 0.00004 });
    expect(picoToText(pricing.costOf(own, usage).cost)).toBe("0.16665");
  });

  test("Vertex text embeddings are billed per character Google reports ($0.025 per million), not also per token", () => {
    const d = deployment("vertex_ai/text-embedding-005");
    expect(picoToText(pricing.costOf(d, { promptTokens: 100, completionTokens: 0, characters: 400 }).cost)).toBe("0.00001");
    // Parts of a split call: their characters summed.
    const part = (promptTokens: number, characters: number) => ({ body: { data: [] }, usage: { promptTokens, completionTokens: 0, characters } });
    expect(joinEmbeddingLists([part(60, 250), part(40, 150)], "emb").usage).toEqual({ promptTokens: 100, completionTokens: 0, characters: 400 });
    // An operator's price per token prices the tokens (the file's price per character is left out with it).
    const own = deployment("vertex_ai/text-embedding-005", { input_cost_per_token: 0.0000002 });
    expect(picoToText(pricing.costOf(own, { promptTokens: 100, completionTokens: 0, characters: 400 }).cost)).toBe("0.00002");
    // Without characters reported, the tokens at the file's price.
    expect(picoToText(pricing.costOf(d, { promptTokens: 300, completionTokens: 0 }).cost)).toBe("0.00003");
  });

  test("the worst case reserves the web searches a request bounds: web search tools' max_uses, and the one an answer citing the web is charged", () => {
    const claude = deployment("anthropic/claude-sonnet-4-20250514");
    const ask = (tools?: Record<string, unknown>[]) => ({ model: "claude", messages: [{ role: "user" as const, content: "news?" }], max_tokens: 100, ...(tools ? { tools } : {}) });
    // 1,000 prompt tokens at the dearest input rate ($6, 1-hour cache writes), 100 out at $15, and searches at $10 a thousand.
    const tokens = 1000n * perM("6") + 100n * perM("15");
    const worst = (tools?: Record<string, unknown>[]) => worstCaseOf("chat", ask(tools), claude, pricing, 1000, 100, 0);
    expect(worst([{ type: "web_search_20250305", name: "web_search", max_uses: 3 }])).toBe(tokens + 4n * usdToPico("0.01"));
    // Without max_uses the tool's searches are not bounded: charged after the call, not reserved.
    expect(worst([{ type: "web_search_20250305", name: "web_search" }])).toBe(tokens + usdToPico("0.01"));
    expect(worst()).toBe(tokens + usdToPico("0.01"));
    // An OpenAI search model: its one search at the dearest size ($50 a thousand, high).
    const search = worstCaseOf("chat", { ...ask(), model: "s" }, deployment("openai/gpt-4o-search-preview"), pricing, 1000, 100, 0);
    expect(search).toBe(1000n * perM("2.50") + 100n * perM("10") + usdToPico("0.05"));
  });

  test("the worst case of an audio model reserves its audio rates", () => {
    // 100 prompt tokens at $40 per million and 50 output tokens at $80 per million: the dearest rates the call could be charged.
    expect(pricing.worstCase(deployment("openai/gpt-4o-audio-preview-2024-12-17"), 100, 50)).toBe(100n * perM("40.00") + 50n * perM("80.00"));
  });
});

describe("operator prices", () => {
  test("model_info prices win over the table, field by field", () => {
    const d = deployment("openai/gpt-4o", { output_cost_per_token: 0.00002 });
    expect(picoToText(pricing.costOf(d, chat(1000, 1000)).cost)).toBe(picoToText(1000n * perM("2.50") + 1000n * perM("20.00")));
  });

  test("an operator's input price replaces the table's tiers and cache prices derived from it; the rest of the table stays", () => {
    // claude-sonnet-4 in the table: input $3 ($6 above 200k), cache reads $0.30 ($0.60), writes $3.75 ($7.50), 1-hour writes $6, output $15 ($22.50 above 200k).
    const d = deployment("anthropic/claude-sonnet-4-20250514", { input_cost_per_token: 0.000002 });
    const usage = chat(250_000, 1_000, { cachedPromptTokens: 10_000, cacheCreationTokens: 4_000, cacheCreation1hTokens: 1_000 });
    // Every prompt token at the operator's $2 (none at the tier's or the cache's rates); the output, not overridden, at the table's tier.
    expect(picoToText(pricing.costOf(d, usage).cost)).toBe(picoToText(250_000n * perM("2") + 1_000n * perM("22.50")));
    // svc_params too; a derived price the operator sets alongside is theirs.
    const withCache = deployment("anthropic/claude-sonnet-4-20250514", {}, { input_cost_per_token: 0.000002, cache_read_input_token_cost: 0.0000002 });
    expect(picoToText(pricing.costOf(withCache, usage).cost)).toBe(picoToText(240_000n * perM("2") + 10_000n * perM("0.20") + 1_000n * perM("22.50")));
    // An output price alone: the input side keeps the table's tier and cache prices.
    const out = deployment("anthropic/claude-sonnet-4-20250514", { output_cost_per_token: 0.00001 });
    expect(picoToText(pricing.costOf(out, chat(250_000, 1_000, { cachedPromptTokens: 10_000 })).cost)).toBe(picoToText(240_000n * perM("6") + 10_000n * perM("0.60") + 1_000n * perM("10")));
    // The worst case follows: no tier above the operator's price.
    expect(pricing.worstCase(d, 250_000, 1_000)).toBe(250_000n * perM("2") + 1_000n * perM("22.50"));
  });

  test("svc_params prices price a model the table does not know", () => {
    const d = deployment("openai/my-finetune", {}, { input_cost_per_token: 0.000001, output_cost_per_token: 0.000003 });
    const got = pricing.costOf(d, chat(100, 100));
    expect(got).toMatchObject({ priced: true });
    expect(picoToText(got.cost)).toBe("0.0004");
  });

  test("model_info.base_model borrows another entry's prices", () => {
    const d = deployment("openai/ft:gpt-4o-mini:acme", { base_model: "gpt-4o-mini" });
    expect(picoToText(pricing.costOf(d, chat(1_000_000, 0)).cost)).toBe("0.15");
  });

  test("a chat model priced per second (and not per token) is charged for the call's duration", () => {
    const d = deployment("openai/acme-hosted", { input_cost_per_second: 0.00042 });
    // 2.5 s at $0.00042 a second, whatever the tokens.
    expect(picoToText(pricing.costOf(d, chat(1000, 1000), 2500).cost)).toBe("0.00105");
    // Per-token prices win where both are given; audio models are priced for their audio's length, not the call's.
    expect(pricing.costOf(deployment("openai/acme-hosted", { input_cost_per_second: 0.00042, input_cost_per_token: 0.000001 }), chat(1000, 0), 2500).cost).toBe(usdToPico("0.001"));
    expect(pricing.costOf(deployment("openai/whisper-1"), chat(0, 0), 2500).cost).toBe(0n);
  });

  test("worst case of a chat model priced per second: the longest the call is charged for, at that rate", () => {
    const d = deployment("openai/acme-hosted", { input_cost_per_second: 0.00042 });
    // 30 s (its timeout) at $0.00042 a second, whatever the tokens.
    expect(picoToText(pricing.worstCase(d, 1000, 100, 30_000))).toBe("0.0126");
    // Priced per token, the call's time is not charged, nor reserved.
    expect(pricing.worstCase(deployment("openai/gpt-4o"), 1000, 100, 30_000)).toBe(pricing.worstCase(deployment("openai/gpt-4o"), 1000, 100));
  });

  test("a model with no price costs 0 and says so", () => {
    const got = pricing.costOf(deployment("openai/unknown-model-x"), chat(1000, 1000));
    expect(got).toEqual({ cost: 0n, priced: false, source: "no price for openai/unknown-model-x" });
  });

  test("a price file override replaces entries by name", () => {
    const dir = mkdtempSync(join(tmpdir(), "prices-"));
    const file = join(dir, "prices.json");
    writeFileSync(file, JSON.stringify({ "gpt-4o": { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002, litellm_provider: "openai", mode: "chat" } }));
    const custom = new Pricing(new PriceTable(file));
    expect(picoToText(custom.costOf(deployment("openai/gpt-4o"), chat(1000, 1000)).cost)).toBe("0.003");
    // Entries the override does not name keep their bundled prices.
    expect(picoToText(custom.costOf(deployment("openai/gpt-4o-mini"), chat(1_000_000, 0)).cost)).toBe("0.15");
  });

  test("worst case: prompt estimate at input price, max_tokens at output price", () => {
    expect(picoToText(pricing.worstCase(deployment("openai/gpt-4o"), 1000, 100))).toBe("0.0035");
    // Without max_tokens the model's own output limit bounds the call (gpt-4o: 16,384).
    expect(pricing.worstCase(deployment("openai/gpt-4o"), 0, undefined)).toBe(16_384n * perM("10.00"));
  });
});

describe("money conversions", () => {
  test("store text → pico-dollars and back, on the fast path and off it", () => {
    for (const text of ["0.000000000000", "12.345678901234", "1.000000000001", "9007.199254740991", "123456789.000000000001", "-1.500000000000", "0.5", "7"]) {
      expect(columnToPico(text)).toBe(usdToPico(text));
      expect(picoToUsd(columnToPico(text))).toBe(Number(text));
    }
  });
});

describe("picoToText", () => {
  test("matches exact bigint arithmetic on random and edge amounts", () => {
    const slow = (p: bigint) => {
      const int = p / 10n ** 12n;
      const frac = (p % 10n ** 12n).toString().padStart(12, "0").replace(/0+$/, "");
      return frac ? `${int}.${frac}` : String(int);
    };
    const edge = [0n, 1n, 999_999_999_999n, 1_000_000_000_000n, 1_000_000_000_001n, 9_007_199_254_740_991n, 9_007_199_254_740_992n, 123_456_789_000_000_000_001n];
    const random = Array.from({ length: 5000 }, () => BigInt(Math.floor(Math.random() * Number.MAX_SAFE_INTEGER)));
    for (const p of [...edge, ...random]) expect(picoToText(p)).toBe(slow(p));
  });
});
