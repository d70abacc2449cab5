/**
 * A stream's bytes sent the way a test says, for one request (every mock takes it as a `wire`
 * fault): the mock renders its whole answer first, then the test's shaper sees those bytes and
 * says where to cut them into separate writes (mid-character, mid-line, between CR and LF,
 * inside a frame's prelude), what to send instead (an error event in the middle, say) and how the
 * stream ends: cleanly (at its end, or early), by a connection reset, or by a stall that sends
 * nothing more until the client leaves. Without a `wire` fault the mocks send what they always did.
 */

export interface WireShape {
  /** The bytes to send instead of the rendered answer (default: the answer as rendered). */
  bytes?: Uint8Array;
  /** Offsets into the bytes where one write ends and the next begins (any order; out of range ignored). */
  cuts: number[];
  /**
   * The end after `at` bytes: `reset` drops the connection, `close` ends the body cleanly (an
   * upstream, or a proxy in front of it, that stops mid-answer as if it were done), `stall` sends
   * nothing more until the client leaves. Default: everything, then a clean end.
   */
  end?: { at: number; how: "reset" | "close" | "stall" };
  /** Pause before every write but the first (default 1 ms): without one, writes made together can reach the client as one read. */
  gapMs?: number;
  /** Called once if the client leaves before the stream ended. */
  onCancel?(): void;
}

/** Sees the rendered answer, says how it travels. */
export type WireShaper = (rendered: Uint8Array) => WireShape;

/** Long enough for the client to read what was sent before a reset (a reset drops unread data). */
const RESET_FLUSH_MS = 10;

/** The rendered answer as a response body shaped by `shaper`. */
export function shapedStream(rendered: Uint8Array, shaper: WireShaper): ReadableStream<Uint8Array> {
  const shape = shaper(rendered);
  const bytes = shape.bytes ?? rendered;
  const stopAt = shape.end ? Math.max(0, Math.min(shape.end.at, bytes.length)) : bytes.length;
  const bounds = [...new Set(shape.cuts)].filter((c) => c > 0 && c < stopAt).sort((a, b) => a - b);
  const pieces: Uint8Array[] = [];
  let prev = 0;
  for (const at of [...bounds, stopAt]) {
    if (at > prev) pieces.push(bytes.slice(prev, at));
    prev = at;
  }
  const gap = shape.gapMs ?? 1;
  let sent = 0;
  let over = false;
  let wake: (() => void) | undefined;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (sent > 0 && gap > 0) await Bun.sleep(gap);
        if (over) return;
        if (sent < pieces.length) {
          controller.enqueue(pieces[sent++]!);
          return;
        }
        if (!shape.end || shape.end.how === "close") {
          over = true;
          controller.close();
          return;
        }
        if (shape.end.how === "reset") {
          over = true;
          await Bun.sleep(RESET_FLUSH_MS);
          // Erroring with undefined makes Bun reset the socket: no final chunk, like a dropped upstream.
          controller.error(undefined);
          return;
        }
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
      },
      cancel() {
        if (over) return;
        over = true;
        wake?.();
        shape.onCancel?.();
      },
    },
    { highWaterMark: 0 },
  );
}

const encoder = new TextEncoder();

/** Text parts (SSE events, NDJSON lines) as one byte string. */
export const renderedText = (parts: readonly string[]): Uint8Array => encoder.encode(parts.join(""));

/** Binary parts (event-stream frames) as one byte string. */
export function renderedBytes(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
