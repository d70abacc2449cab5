/**
 * The gateway's OpenAI SSE answer → a Gemini stream: SSE (`alt=sse`, what the SDKs ask for) or the
 * JSON array Gemini streams without it. Pull-based: each client pull reads the gateway stream
 * underneath, so backpressure holds, and a client that leaves cancels it (which aborts the
 * upstream call and records what was used).
 */
import type { Usage } from "../contract.ts";
import { SseParser } from "../stream/framing.ts";
import { GeminiChunks } from "./chunks.ts";
import { googleErrorBody } from "./errors.ts";
import { geminiUsage } from "./response.ts";
import { isObject, type RenderOptions } from "./types.ts";

export type GeminiStreamFormat = "sse" | "json";

const encoder = new TextEncoder();

/** Writes Gemini chunks in one of the two stream formats. */
class Framer {
  private first = true;
  constructor(private readonly format: GeminiStreamFormat) {}

  item(json: string): string {
    if (this.format === "sse") return `data: ${json}\r\n\r\n`;
    if (this.first) {
      this.first = false;
      return `[${json}`;
    }
    return `\r\n,${json}`;
  }

  close(): string {
    if (this.format === "sse") return "";
    return this.first ? "[]" : "\n]";
  }
}

/** The gateway's error event `{"error": {"message", "code": "503", …}}` → Google's error object. */
function googleError(error: unknown): string {
  const e = isObject(error) ? error : {};
  const status = Number.parseInt(String(e.code ?? ""), 10);
  return JSON.stringify(googleErrorBody(status >= 400 && status < 600 ? status : 500, typeof e.message === "string" ? e.message : "stream failed"));
}

/** `recorded`: the usage the call was logged with, known once the gateway stream has ended. */
export function geminiStream(inner: Response, format: GeminiStreamFormat, opts: RenderOptions, headers: Record<string, string>, recorded: () => Usage | undefined = () => undefined): Response {
  const reader = inner.body!.getReader();
  const decoder = new TextDecoder();
  // Its input is the gateway's own stream, whose events the upstream's parser already bounded.
  const parser = new SseParser(Number.POSITIVE_INFINITY);
  const chunks = new GeminiChunks(opts);
  const framer = new Framer(format);
  let out = "";
  let failed = false;
  let over = false;

  const emit = (items: readonly object[]) => {
    for (const item of items) out += framer.item(JSON.stringify(item));
  };
  const onEvent = (data: string) => {
    if (failed || data === "[DONE]") return;
    let event: unknown;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    if (!isObject(event)) return;
    if (event.error !== undefined) {
      emit(chunks.end());
      out += framer.item(googleError(event.error));
      failed = true;
      return;
    }
    emit(chunks.push(event));
  };

  const body = new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        while (!over) {
          let next: Awaited<ReturnType<typeof reader.read>>;
          try {
            next = await reader.read();
          } catch {
            next = { done: true, value: undefined };
            if (!failed) {
              emit(chunks.end());
              out += framer.item(JSON.stringify(googleErrorBody(503, "the stream ended unexpectedly")));
              failed = true;
            }
          }
          if (!next.done) parser.push(decoder.decode(next.value, { stream: true }), onEvent);
          if (next.done) {
            parser.end(onEvent);
            if (!failed) {
              const usage = recorded();
              emit(chunks.end(usage && geminiUsage(usage)));
            }
            out += framer.close();
            over = true;
            controller.enqueue(encoder.encode(out));
            controller.close();
            return;
          }
          if (out) {
            controller.enqueue(encoder.encode(out));
            out = "";
            return;
          }
        }
      },
      cancel(reason) {
        if (over) return;
        over = true;
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
  const contentType = format === "sse" ? "text/event-stream" : "application/json; charset=UTF-8";
  return new Response(body, { headers: { ...headers, "content-type": contentType, "cache-control": "no-cache" } });
}
