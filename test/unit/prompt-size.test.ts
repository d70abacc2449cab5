// The prompt bound budgets reserve on is never below the real token count, even for prompts a
// characters-per-token guess gets badly wrong (emoji, digits and symbols, CJK text), on both of
// OpenAI's encodings; the rate-limit estimate stays the cheaper guess.
import { expect, test } from "bun:test";
import { promptSize } from "../../core/cost/estimate.ts";
import { chatTokens } from "../../core/tokens/chat.ts";
import { getEncoding } from "../../core/tokens/encoding.ts";

const PROMPTS: Record<string, string> = {
  emoji: "😀🎉🚀🧪🦄".repeat(40),
  "digits and symbols": "a1!".repeat(200),
  chinese: "我们的网关在每次调用前预留最坏情况的费用，从不超出预算。".repeat(10),
  code: "function f(x) { return x?.y ?? [1, 2, 3].map((n) => n ** 2); }\n".repeat(20),
  prose: "The gateway reserves the worst case before every call. ".repeat(20),
  "rare unicode": "ꙮ𓀀𝔘𝔫𝔦𝔠𝔬𝔡𝔢".repeat(30),
};

for (const encoding of ["o200k_base", "cl100k_base"] as const) {
  test(`the bound holds every prompt's real count (${encoding})`, async () => {
    const enc = await getEncoding(encoding);
    for (const [name, text] of Object.entries(PROMPTS)) {
      const messages = [
        { role: "system", content: "You are terse." },
        { role: "user", content: text },
      ];
      const real = (await chatTokens(enc, messages)).total;
      const size = promptSize("chat", { model: "m", messages } as never);
      expect([name, size.bound >= real]).toEqual([name, true]);
      const completion = await enc.count(text);
      expect([name, promptSize("completions", { model: "m", prompt: text } as never).bound >= completion]).toEqual([name, true]);
      expect([name, promptSize("embeddings", { model: "m", input: [text, text] } as never).bound >= 2 * completion]).toEqual([name, true]);
    }
  });
}

test("the three-characters estimate undercounts such prompts (why budgets do not use it), not prose", async () => {
  const enc = await getEncoding("o200k_base");
  const under = async (text: string) => promptSize("completions", { model: "m", prompt: text } as never).estimate < (await enc.count(text));
  expect(await under(PROMPTS.emoji!)).toBe(true);
  expect(await under(PROMPTS["digits and symbols"]!)).toBe(true);
  expect(await under(PROMPTS.prose!)).toBe(false);
});
