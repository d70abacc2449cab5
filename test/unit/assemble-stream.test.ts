// A stream as the client got it, assembled into one answer for the spend log: content and tool-call
// arguments joined per choice, role and the last finish reason kept, legacy completions' text
// joined, and what is not a chunk (errors, [DONE], cut lines) skipped.
import { expect, test } from "bun:test";
import { assembleStream } from "../../core/stream/assemble.ts";

const sse = (...events: unknown[]) => events.map((e) => `data: ${typeof e === "string" ? e : JSON.stringify(e)}\n\n`).join("");
const head = { id: "chatcmpl-1", object: "chat.completion.chunk", created: 7, model: "gpt-4o" };

test("chat: content and tool-call pieces joined per choice", () => {
  const text = sse(
    { ...head, choices: [{ index: 0, delta: { role: "assistant", content: "" } }, { index: 1, delta: { role: "assistant", content: "B" } }] },
    { ...head, choices: [{ index: 0, delta: { content: "Hel" } }] },
    { ...head, choices: [{ index: 0, delta: { content: "lo" } }] },
    { ...head, choices: [{ index: 1, delta: { tool_calls: [{ index: 0, id: "call_1", type: "function", function: { name: "get_", arguments: '{"ci' } }] } }] },
    { ...head, choices: [{ index: 1, delta: { tool_calls: [{ index: 0, function: { name: "weather", arguments: 'ty":"Oslo"}' } }] } }] },
    { ...head, choices: [{ index: 0, delta: {}, finish_reason: "stop" }, { index: 1, delta: {}, finish_reason: "tool_calls" }] },
    { ...head, choices: [], usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 } },
    "[DONE]",
  );
  expect(assembleStream(text, "chat")).toEqual({
    id: "chatcmpl-1",
    created: 7,
    model: "gpt-4o",
    object: "chat.completion",
    choices: [
      { index: 0, message: { role: "assistant", content: "Hello" }, finish_reason: "stop" },
      {
        index: 1,
        message: { role: "assistant", content: "B", tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } }] },
        finish_reason: "tool_calls",
      },
    ],
    usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 },
  });
});

test("completions: text joined; an error event and a cut line are skipped", () => {
  const c = { id: "cmpl-1", object: "text_completion", created: 1, model: "m" };
  const text = `${sse({ ...c, choices: [{ index: 0, text: "one " }] }, { ...c, choices: [{ index: 0, text: "two", finish_reason: "length" }] }, { error: { message: "cut" } })}data: {"id":"cmpl-1","choi\n\n`;
  expect(assembleStream(text, "completions")).toEqual({ id: "cmpl-1", created: 1, model: "m", object: "text_completion", choices: [{ index: 0, text: "one two", finish_reason: "length" }] });
});
