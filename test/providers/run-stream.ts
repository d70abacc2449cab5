/**
 * Golden-test helpers: upstream stream text, cut into the pieces it arrives in, through the core's
 * own framing parser and an adapter's stream transform; and the chunks reassembled the way an
 * OpenAI client does.
 */
import type { ChatRequest, StreamPart, StreamTransform, Usage, WireJson } from "../../core/contract.ts";
import { NdjsonParser, SseParser } from "../../core/stream/framing.ts";

export interface StreamRun<S> {
  parts: StreamPart[];
  state: S;
}

export function runStream<S>(transform: StreamTransform<"chat", S>, req: ChatRequest, pieces: readonly string[]): StreamRun<S> {
  const parser = transform.framing === "sse" ? new SseParser() : new NdjsonParser();
  const state = transform.init(req);
  const parts: StreamPart[] = [];
  const onEvent = (data: string) => parts.push(...transform.event(data, state));
  for (const piece of pieces) parser.push(piece, onEvent);
  parser.end(onEvent);
  return { parts, state };
}

/** `text` cut every `size` characters: pieces end mid-line and mid-JSON. */
export function cutEvery(text: string, size: number): string[] {
  const out: string[] = [];
  for (let i = 0; i < text.length; i += size) out.push(text.slice(i, i + size));
  return out;
}

/** `text` cut right after every `\r` (so each `\r\n` is split across two pieces). */
export function cutAtCR(text: string): string[] {
  return text.split(/(?<=\r)/);
}

/** The chunks a client receives (data parts parsed). */
export function chunks(parts: readonly StreamPart[]): WireJson[] {
  const out: WireJson[] = [];
  for (const p of parts) {
    if (p.type === "chunk") out.push(p.chunk);
    else if (p.type === "data") out.push(JSON.parse(p.data) as WireJson);
  }
  return out;
}

export function usageOf(parts: readonly StreamPart[]): Usage | undefined {
  let usage: Usage | undefined;
  for (const p of parts) if (p.type === "usage") usage = p.usage;
  return usage;
}

export interface Assembled {
  role?: string;
  content: string;
  reasoning: string;
  toolCalls: { id: string; name: string; arguments: string }[];
  finish?: string;
  /** The usage chunk's `usage`, when one was sent. */
  usage?: WireJson;
}

/** Accumulates chunk deltas as an OpenAI SDK does (tool calls by index, arguments concatenated). */
export function assemble(list: readonly WireJson[]): Assembled {
  const out: Assembled = { content: "", reasoning: "", toolCalls: [] };
  for (const c of list) {
    if (c.usage) out.usage = c.usage as WireJson;
    for (const choice of (c.choices as WireJson[]) ?? []) {
      const delta = (choice.delta ?? {}) as WireJson;
      if (typeof delta.role === "string") out.role ??= delta.role;
      if (typeof delta.content === "string") out.content += delta.content;
      if (typeof delta.reasoning_content === "string") out.reasoning += delta.reasoning_content;
      for (const t of (delta.tool_calls as WireJson[] | undefined) ?? []) {
        const i = t.index as number;
        const fn = (t.function ?? {}) as WireJson;
        out.toolCalls[i] ??= { id: "", name: "", arguments: "" };
        const call = out.toolCalls[i]!;
        if (typeof t.id === "string") call.id = t.id;
        if (typeof fn.name === "string") call.name = fn.name;
        if (typeof fn.arguments === "string") call.arguments += fn.arguments;
      }
      if (typeof choice.finish_reason === "string") out.finish = choice.finish_reason;
    }
  }
  return out;
}
