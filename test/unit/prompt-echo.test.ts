// What the gateway keeps of an upstream error message: any run of 16 or more characters of the
// request's own text (messages, content parts, prompt, input, rerank query and documents) becomes
// "[prompt redacted]", whole or in part, however long the prompt; shorter runs, and what the
// request says outside its prompt (the model name), stay as the upstream wrote them.
import { expect, test } from "bun:test";
import { PROMPT_REDACTED as R, RUN, promptTexts, withoutPromptText } from "../../core/pipeline/prompt-echo.ts";

const USER = "Write a limerick about the lighthouse keeper's cat named Biscuit";

test("a quote of the prompt, whole or in part, is replaced; the rest of the message stays", () => {
  const texts = promptTexts({ model: "gpt-4o", messages: [{ role: "user", content: [{ type: "text", text: USER }] }] });
  expect(withoutPromptText(`Flagged: "${USER}" (policy 7)`, texts)).toBe(`Flagged: "${R}" (policy 7)`);
  expect(withoutPromptText(`Input '${USER.slice(8, 40)}…' is invalid`, texts)).toBe(`Input '${R}…' is invalid`);
  // Two separate quotes, each replaced.
  expect(withoutPromptText(`${USER.slice(0, 20)} / ${USER.slice(-20)}`, texts)).toBe(`${R} / ${R}`);
  // A run one character short of RUN is kept.
  const short = USER.slice(0, RUN - 1);
  expect(withoutPromptText(`near "${short}" here`, texts)).toBe(`near "${short}" here`);
});

test("only the prompt's fields count: the model name and other options stay in the message", () => {
  const body = { model: "ft:gpt-4o-mini:acme:custom-model-2024", user: "customer-account-1234567", messages: [{ role: "user", content: "hi" }] };
  const message = "The model ft:gpt-4o-mini:acme:custom-model-2024 does not exist for customer-account-1234567";
  expect(withoutPromptText(message, promptTexts(body))).toBe(message);
  for (const b of [{ prompt: USER }, { input: [USER] }, { query: USER, documents: ["x"] }, { documents: [{ text: USER }] }]) {
    expect(withoutPromptText(`bad: ${USER}`, promptTexts(b))).toBe(`bad: ${R}`);
  }
});

test("a prompt of megabytes is searched in linear time", () => {
  const prompt = `${"lorem ipsum dolor sit amet ".repeat(80_000)}\n${USER}`;
  const started = performance.now();
  expect(withoutPromptText(`echo: ${USER} ${"z".repeat(10_000)}`, [prompt])).toBe(`echo: ${R} ${"z".repeat(10_000)}`);
  expect(performance.now() - started).toBeLessThan(2000);
});
