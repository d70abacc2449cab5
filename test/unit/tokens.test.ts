// Local token counting: the encoding chosen per model, OpenAI's chat overhead (3 per message, 1 per
// name, 3 to prime the reply), image tiles, the tool-definition formula, and image sizes read from
// header bytes. Counts from the real tokenizer are written literally (common English words are one
// token each in both encodings).
import { describe, expect, test } from "bun:test";
import { chatTokens, imageTokens, toolsCount } from "../../core/tokens/chat.ts";
import { countLocally } from "../../core/tokens/count.ts";
import { type Encoding, encodingFor, getEncoding } from "../../core/tokens/encoding.ts";
import { imageSize } from "../../core/tokens/image-size.ts";
import { Random } from "../harness/random.ts";

/** One token per whitespace-separated word: makes the overhead arithmetic visible. */
const words: Encoding = { name: "o200k_base", count: async (t) => t.split(/\s+/).filter(Boolean).length };

describe("encoding per model", () => {
  test("o200k_base for GPT-4o, 4.1, 4.5, 5, o-series and gpt-oss; cl100k_base for GPT-4, 3.5, embeddings and unknown models", () => {
    for (const m of ["gpt-4o", "gpt-4o-mini-2024-07-18", "openai/gpt-4.1-nano", "azure/gpt-5", "o1", "o3-mini", "o4-mini", "gpt-4.5-preview", "gpt-oss-20b", "chatgpt-4o-latest"]) {
      expect(`${m} ${encodingFor(m)}`).toBe(`${m} o200k_base`);
    }
    for (const m of ["gpt-4", "gpt-4-turbo", "gpt-3.5-turbo", "text-embedding-3-small", "claude-sonnet-4-20250514", "llama3", "gpt-40-fake"]) {
      expect(`${m} ${encodingFor(m)}`).toBe(`${m} cl100k_base`);
    }
  });

  test("the real tokenizers: 'hello world' is 2 tokens, a pangram of common words 9, special markers are plain text", async () => {
    for (const name of ["o200k_base", "cl100k_base"] as const) {
      const enc = await getEncoding(name);
      expect(await enc.count("hello world")).toBe(2);
      expect(await enc.count("The quick brown fox jumps over the lazy dog")).toBe(9);
      expect(await enc.count("")).toBe(0);
      // Counted as characters, not refused as a special token.
      expect(await enc.count("<|endoftext|>")).toBeGreaterThan(1);
    }
  });
});

describe("text without a break", () => {
  test("a run of 200,000 letters or symbols is counted in well under a second (the BPE is quadratic in a run: whole, it took a minute), close to the whole run's count", async () => {
    for (const name of ["o200k_base", "cl100k_base"] as const) {
      const enc = await getEncoding(name);
      for (const [run, exact] of [
        ["x", (await enc.count("x".repeat(2000))) / 2000],
        ["!", (await enc.count("!".repeat(2000))) / 2000],
        ["é", (await enc.count("é".repeat(2000))) / 2000],
      ] as const) {
        const started = performance.now();
        const n = await enc.count(`hello ${run.repeat(200_000)} world`);
        expect(performance.now() - started).toBeLessThan(1000);
        // A cut every 500 characters changes the count by a token at most.
        expect(Math.abs(n - 2 - exact * 200_000)).toBeLessThanOrEqual(200_000 / 500 + 2);
      }
      // A cut never splits a surrogate pair: each emoji counts as it does alone.
      expect(await enc.count("😀".repeat(100_000))).toBe((await enc.count("😀".repeat(250))) * 400);
    }
  });
});

describe("large texts, counted in parts", () => {
  test("prose and code are counted exactly: the parts are cut where no token spans the cut", async () => {
    const rng = new Random(11);
    const vocabulary = ["the", "gateway", "counts", "tokens,", "Écoute", "naïve", "42", "3.14", "(x)", "=>", "don't", "\n", "\n\n", "  ", "東京", "🚀", "ÜBER", "a", "I"];
    const prose = Array.from({ length: 60_000 }, () => vocabulary[rng.int(vocabulary.length)]).join(" ");
    const code = (await Bun.file(new URL("../../core/router/route.ts", import.meta.url)).text()).repeat(5);
    for (const name of ["o200k_base", "cl100k_base"] as const) {
      const enc = await getEncoding(name);
      const whole = name === "o200k_base" ? await import("gpt-tokenizer/encoding/o200k_base") : await import("gpt-tokenizer/encoding/cl100k_base");
      for (const text of [prose, code]) {
        expect(text.length).toBeGreaterThan(100_000);
        expect(await enc.count(text)).toBe(whole.countTokens(text, { disallowedSpecial: new Set(), allowedSpecial: new Set() }));
      }
    }
  });
});

describe("chat overhead", () => {
  test("3 per message + the role + the content, 1 more for a name, 3 to prime the reply", async () => {
    expect((await chatTokens(words, [{ role: "user", content: "hello world" }])).total).toBe(3 + 1 + 2 + 3);
    expect((await chatTokens(words, [{ role: "system", content: "be brief" }, { role: "user", name: "ana", content: "hi" }])).total).toBe(3 + 1 + 2 + (3 + 1 + 1 + 1 + 1) + 3);
  });

  test("tool calls count their name and arguments; array content counts its text parts", async () => {
    const messages = [
      { role: "user", content: [{ type: "text", text: "one two" }, { type: "text", text: "three" }] },
      { role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "lookup", arguments: "{ x }" } }] },
      { role: "tool", tool_call_id: "c", content: "result" },
    ];
    expect((await chatTokens(words, messages)).total).toBe(3 + 1 + 3 + (3 + 1 + 1 + 3) + (3 + 1 + 1) + 3);
  });

  test("with the real o200k tokenizer: one user message 'hello world' is 9 prompt tokens", async () => {
    expect((await countLocally("gpt-4o", { messages: [{ role: "user", content: "hello world" }] })).total).toBe(9);
    expect((await countLocally("gpt-4o", { prompt: "hello world" })).total).toBe(2);
  });
});

describe("tool definitions (the OpenAI cookbook's formula)", () => {
  test("function init, name:description, properties with their type, description and enum items, end", async () => {
    const tools = [
      {
        type: "function",
        function: {
          name: "weather",
          description: "current weather.",
          parameters: { type: "object", properties: { city: { type: "string", description: "the city" }, unit: { type: "string", enum: ["c", "f"] } } },
        },
      },
    ];
    // "weather:current weather" = 2 words; "city:string:the city" = 2; "unit:string:" = 1; enum: -3 + (3+1) + (3+1).
    expect(await toolsCount(words, tools)).toBe(7 + 2 + 3 + (3 + 2) + (3 - 3 + 4 + 4 + 1) + 12);
    expect(await toolsCount(words, [])).toBe(0);
    expect(await toolsCount({ ...words, name: "cl100k_base" }, tools)).toBe((await toolsCount(words, tools)) + 3);
  });
});

/** A PNG of the given size: only the signature and IHDR matter to the reader. */
function pngHeader(width: number, height: number): Uint8Array {
  const b = new Uint8Array(33);
  b.set([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52]);
  new DataView(b.buffer).setUint32(16, width);
  new DataView(b.buffer).setUint32(20, height);
  return b;
}

describe("images", () => {
  test("sizes from PNG, GIF, JPEG (after an APP0 segment) and WebP headers", () => {
    expect(imageSize(pngHeader(640, 480))).toEqual({ width: 640, height: 480 });
    expect(imageSize(new Uint8Array([0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x20, 0x03, 0x58, 0x02]))).toEqual({ width: 800, height: 600 });
    const jpeg = new Uint8Array([0xff, 0xd8, 0xff, 0xe0, 0x00, 0x04, 0x4a, 0x46, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x01, 0x2c, 0x01, 0x90, 0x03, 0, 0, 0, 0]);
    expect(imageSize(jpeg)).toEqual({ width: 400, height: 300 });
    const webp = new Uint8Array(30);
    webp.set([...new TextEncoder().encode("RIFF"), 0, 0, 0, 0, ...new TextEncoder().encode("WEBPVP8X")]);
    webp.set([0xff, 0x03, 0x00, 0x7f, 0x02, 0x00], 24); // 1024 × 640, stored minus one
    expect(imageSize(webp)).toEqual({ width: 1024, height: 640 });
    expect(imageSize(new Uint8Array([1, 2, 3]))).toBeUndefined();
  });

  test("tiles: low is 85; a small image one tile; 2048×1024 is scaled to 1536×768 (6 tiles); unknown size as 1024×1024", () => {
    expect(imageTokens("low", { width: 4000, height: 4000 })).toBe(85);
    expect(imageTokens("high", { width: 1, height: 1 })).toBe(85 + 170);
    expect(imageTokens("auto", { width: 2048, height: 1024 })).toBe(85 + 170 * 6);
    expect(imageTokens(undefined, { width: 4096, height: 8192 })).toBe(85 + 170 * 6);
    expect(imageTokens(undefined, undefined)).toBe(765);
  });

  test("a data-URL image in a message is counted by its size", async () => {
    const url = `data:image/png;base64,${Buffer.from(pngHeader(2048, 1024)).toString("base64")}`;
    const c = await chatTokens(words, [{ role: "user", content: [{ type: "text", text: "look" }, { type: "image_url", image_url: { url } }] }]);
    expect(c).toEqual({ total: 3 + 1 + 1 + 1105 + 3, image: 1105 });
  });
});
