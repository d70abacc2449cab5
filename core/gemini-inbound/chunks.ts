/**
 * OpenAI `chat.completion.chunk`s → Gemini stream chunks. Text goes out as it comes; a function
 * call goes out whole once its choice finishes (Gemini never splits one); the finishing chunk is
 * held back until the usage chunk that follows it, so the last Gemini chunk carries both
 * finishReason and usageMetadata, as Google's do. A stream whose upstream reported no usage ends
 * with the usage the gateway estimated and logged.
 */
import { finishReason, parseArgs, reasoningText, usageMetadata } from "./response.ts";
import { type GeminiCandidate, type GeminiPart, type GeminiResponse, type GeminiUsage, isObject, type Json, type RenderOptions } from "./types.ts";

interface OpenCall {
  id?: string;
  name: string;
  args: string;
}

export class GeminiChunks {
  private id: string | undefined;
  private model: string | undefined;
  /** Tool calls being assembled: choice index → tool-call index → call. */
  private readonly calls = new Map<number, Map<number, OpenCall>>();
  private held: GeminiResponse | undefined;
  private usageSent = false;

  constructor(private readonly opts: RenderOptions) {}

  private response(candidates: GeminiCandidate[]): GeminiResponse {
    const r: GeminiResponse = { candidates };
    if (this.model !== undefined) r.modelVersion = this.model;
    if (this.id !== undefined) r.responseId = this.id;
    return r;
  }

  private readCalls(choice: number, deltas: unknown): void {
    if (!Array.isArray(deltas)) return;
    let open = this.calls.get(choice);
    if (!open) {
      open = new Map();
      this.calls.set(choice, open);
    }
    for (const [i, d] of deltas.entries()) {
      if (!isObject(d)) continue;
      const at = typeof d.index === "number" ? d.index : i;
      const call = open.get(at) ?? { name: "", args: "" };
      open.set(at, call);
      if (typeof d.id === "string" && d.id) call.id = d.id;
      const fn = isObject(d.function) ? d.function : {};
      if (typeof fn.name === "string" && fn.name && !call.name) call.name = fn.name;
      if (typeof fn.arguments === "string") call.args += fn.arguments;
    }
  }

  /** The calls of a choice, complete: as functionCall parts, forgotten. */
  private takeCalls(choice: number): GeminiPart[] {
    const open = this.calls.get(choice);
    if (!open) return [];
    this.calls.delete(choice);
    return [...open.entries()]
      .sort(([a], [b]) => a - b)
      .map(([, c]) => ({ functionCall: { ...(c.id ? { id: c.id } : {}), name: c.name, args: parseArgs(c.args) } }));
  }

  private candidate(choice: Json, position: number): GeminiCandidate | undefined {
    const index = typeof choice.index === "number" ? choice.index : position;
    const delta = isObject(choice.delta) ? choice.delta : {};
    const parts: GeminiPart[] = [];
    const thought = reasoningText(delta);
    if (thought && this.opts.includeThoughts) parts.push({ text: thought, thought: true });
    if (typeof delta.content === "string" && delta.content !== "") parts.push({ text: delta.content });
    this.readCalls(index, delta.tool_calls);
    const finish = finishReason(choice.finish_reason);
    if (finish) parts.push(...this.takeCalls(index));
    if (parts.length === 0 && !finish) return undefined;
    return {
      content: { parts: parts.length > 0 ? parts : [{ text: "" }], role: "model" },
      ...(finish ? { finishReason: finish } : {}),
      index,
    };
  }

  /** One OpenAI chunk → the Gemini chunks to send now. */
  push(chunk: Json): GeminiResponse[] {
    if (typeof chunk.id === "string") this.id ??= chunk.id;
    if (typeof chunk.model === "string") this.model ??= chunk.model;
    const out: GeminiResponse[] = [];
    const candidates: GeminiCandidate[] = [];
    for (const [i, choice] of (Array.isArray(chunk.choices) ? chunk.choices : []).entries()) {
      const c = isObject(choice) ? this.candidate(choice, i) : undefined;
      if (c) candidates.push(c);
    }
    if (candidates.length > 0) {
      if (this.held) out.push(this.held);
      const r = this.response(candidates);
      this.held = candidates.some((c) => c.finishReason) ? r : undefined;
      if (!this.held) out.push(r);
    }
    const usage = usageMetadata(chunk.usage);
    if (usage) {
      const last = this.held ?? this.response([]);
      last.usageMetadata = usage;
      out.push(last);
      this.held = undefined;
      this.usageSent = true;
    }
    return out;
  }

  /**
   * What is still held when the stream ends: the finishing chunk, calls never finished; the last
   * chunk carries `recorded` (the usage the call was logged with) when the upstream sent none.
   */
  end(recorded?: GeminiUsage): GeminiResponse[] {
    const out: GeminiResponse[] = [];
    if (this.held) out.push(this.held);
    this.held = undefined;
    const unfinished: GeminiCandidate[] = [];
    for (const index of [...this.calls.keys()].sort((a, b) => a - b)) {
      const parts = this.takeCalls(index);
      if (parts.length > 0) unfinished.push({ content: { parts, role: "model" }, index });
    }
    if (unfinished.length > 0) out.push(this.response(unfinished));
    if (recorded && !this.usageSent) {
      if (out.length === 0) out.push(this.response([]));
      out[out.length - 1]!.usageMetadata = recorded;
      this.usageSent = true;
    }
    return out;
  }
}
