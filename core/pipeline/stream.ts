/**
 * Proxies an upstream stream to the client as OpenAI SSE through a pull-based chain: the client's
 * pace drives upstream reads (backpressure), a client that leaves aborts the upstream call, and
 * usage is known at the end (or estimated on cancel) before the call is recorded.
 */
import type { CallStatus, Deployment, ErrorInfo, StreamTransform, Usage, WireRequest } from "../contract.ts";
import { errorBody, errorInfo } from "../errors.ts";
import { ndjsonEvents, sseEvents } from "../stream/framing.ts";
import type { Deadline } from "./upstream.ts";

const encoder = new TextEncoder();
const DONE = encoder.encode("data: [DONE]\n\n");

export interface StreamArgs {
  res: Response;
  deployment: Deployment;
  transform: StreamTransform<"chat" | "completions", unknown>;
  request: WireRequest["chat" | "completions"];
  deadline: Deadline;
  headers: Record<string, string>;
  finish(status: CallStatus, usage: Usage, error?: ErrorInfo, firstByteAt?: number): void;
}

export function streamResponse(a: StreamArgs): Response {
  const { transform, deadline, deployment: d } = a;
  const state = transform.init(a.request as never);
  const events = a.res.body!.pipeThrough(new TextDecoderStream()).pipeThrough(transform.framing === "sse" ? sseEvents() : ndjsonEvents());
  const reader = events.getReader();
  let usage: Usage | undefined;
  let firstByteAt: number | undefined;
  const end = (status: CallStatus, error?: ErrorInfo) => {
    deadline.clear();
    a.finish(status, usage ?? transform.estimate(state), error, firstByteAt);
  };
  const fail = (c: ReadableStreamDefaultController<Uint8Array>, error: ErrorInfo) => {
    c.enqueue(encoder.encode(`data: ${JSON.stringify(errorBody(error))}\n\n`));
    c.close();
    void reader.cancel().catch(() => undefined);
    end("failure", error);
  };
  deadline.arm();

  const out = new ReadableStream<Uint8Array>(
    {
      async pull(c) {
        // Read until something can be sent, so every pull makes progress for the client.
        for (;;) {
          let next: Awaited<ReturnType<typeof reader.read>>;
          try {
            next = await reader.read();
          } catch {
            if (deadline.clientGone) return;
            const msg = deadline.timedOut
              ? `stream from ${d.provider} for model ${d.modelName} stalled for more than ${deadline.seconds}s`
              : `stream from ${d.provider} for model ${d.modelName} ended unexpectedly`;
            return fail(c, errorInfo(deadline.timedOut ? 408 : 503, msg));
          }
          if (next.done) {
            c.enqueue(DONE);
            c.close();
            return end("success");
          }
          deadline.arm();
          firstByteAt ??= Date.now();
          let parts: ReturnType<typeof transform.event>;
          try {
            parts = transform.event(next.value, state);
          } catch {
            return fail(c, errorInfo(500, `${d.provider} sent an unreadable stream event for model ${d.modelName}`));
          }
          let sent = false;
          for (const part of parts) {
            if (part.type === "usage") usage = part.usage;
            else if (part.type === "error") return fail(c, part.error);
            else {
              c.enqueue(encoder.encode(`data: ${JSON.stringify(part.chunk)}\n\n`));
              sent = true;
            }
          }
          if (sent) return;
        }
      },
      cancel(reason) {
        deadline.controller.abort(reason);
        void reader.cancel(reason).catch(() => undefined);
        end("cancelled");
      },
    },
    { highWaterMark: 0 },
  );
  return new Response(out, {
    headers: { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive", ...a.headers },
  });
}
