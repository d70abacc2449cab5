/**
 * A stream as the client received it (OpenAI SSE text), assembled into the one object a
 * non-stream call would have answered: content and tool-call pieces joined per choice, the last
 * finish reason kept. For the spend log when prompts are stored, so a streamed answer reads like
 * any other.
 */

type Json = Record<string, unknown>;

interface ToolCall {
  id?: string;
  type: string;
  function: { name: string; arguments: string };
}

interface Choice {
  role: string;
  content: string;
  text: string;
  finishReason: unknown;
  toolCalls: Map<number, ToolCall>;
}

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const str = (v: unknown) => (typeof v === "string" ? v : "");

function mergeToolCalls(into: Map<number, ToolCall>, deltas: unknown): void {
  if (!Array.isArray(deltas)) return;
  for (const d of deltas) {
    if (!isObject(d)) continue;
    const i = typeof d.index === "number" ? d.index : into.size;
    let call = into.get(i);
    if (!call) {
      call = { type: "function", function: { name: "", arguments: "" } };
      into.set(i, call);
    }
    if (typeof d.id === "string") call.id = d.id;
    if (typeof d.type === "string") call.type = d.type;
    const f = isObject(d.function) ? d.function : {};
    call.function.name += str(f.name);
    call.function.arguments += str(f.arguments);
  }
}

/** `chat.completion` (or `text_completion`) from the SSE text; events that are not chunks are skipped. */
export function assembleStream(sse: string, endpoint: "chat" | "completions"): Json {
  const choices = new Map<number, Choice>();
  let head: Json = {};
  let usage: unknown;
  for (const line of sse.split("\n")) {
    if (!line.startsWith("data:")) continue;
    const data = line.slice(5).trim();
    if (data === "[DONE]") continue;
    let chunk: unknown;
    try {
      chunk = JSON.parse(data);
    } catch {
      continue;
    }
    if (!isObject(chunk) || !Array.isArray(chunk.choices)) continue;
    if (head.id === undefined) head = { id: chunk.id, created: chunk.created, model: chunk.model };
    if (isObject(chunk.usage)) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (!isObject(c)) continue;
      const i = typeof c.index === "number" ? c.index : 0;
      let acc = choices.get(i);
      if (!acc) {
        acc = { role: "assistant", content: "", text: "", finishReason: null, toolCalls: new Map() };
        choices.set(i, acc);
      }
      const delta = isObject(c.delta) ? c.delta : {};
      if (typeof delta.role === "string") acc.role = delta.role;
      acc.content += str(delta.content);
      acc.text += str(c.text);
      mergeToolCalls(acc.toolCalls, delta.tool_calls);
      if (c.finish_reason !== undefined && c.finish_reason !== null) acc.finishReason = c.finish_reason;
    }
  }
  const ordered = [...choices].sort(([a], [b]) => a - b);
  const out: Json = { ...head, object: endpoint === "chat" ? "chat.completion" : "text_completion" };
  out.choices = ordered.map(([index, c]) => {
    if (endpoint === "completions") return { index, text: c.text, finish_reason: c.finishReason };
    const message: Json = { role: c.role, content: c.content };
    if (c.toolCalls.size > 0) message.tool_calls = [...c.toolCalls].sort(([a], [b]) => a - b).map(([, t]) => t);
    return { index, message, finish_reason: c.finishReason };
  });
  if (usage !== undefined) out.usage = usage;
  return out;
}
