/**
 * The client's body as a pass-through target is sent it. Waiting on the client is not waiting on
 * the target: the target's timeout stops while the gateway waits for the client's bytes (`clock`),
 * so an upload slower than the timeout (a file, audio) reaches the target, as a model call's body
 * is read before its upstream's timeout starts. A client that stops sending is cut off by the
 * server's idle timeout, as on every route.
 */
import { bodyTooLarge } from "../errors.ts";

export interface UploadClock {
  /** The gateway waits on the client: the target's timeout stops. */
  waitingOnClient(): void;
  /** The target has all the client sent so far: its timeout runs again, from its start. */
  waitingOnTarget(): void;
}

async function fromClient<T>(clock: UploadClock, read: () => Promise<T>): Promise<T> {
  clock.waitingOnClient();
  try {
    return await read();
  } finally {
    clock.waitingOnTarget();
  }
}

/** A body of declared length, read whole first, so it goes with its length (some targets refuse a chunked upload with 411). */
export function wholeUpload(request: Request, clock: UploadClock): Promise<ArrayBuffer> {
  return fromClient(clock, () => request.arrayBuffer());
}

/**
 * A chunked body passed on as it comes, cut off past `limit` (it has no length to check first):
 * the target's call then fails, and `over.hit` says why.
 */
export function streamedUpload(body: ReadableStream<Uint8Array>, limit: number, over: { hit: boolean }, clock: UploadClock): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let size = 0;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        const part = await fromClient(clock, () => reader.read());
        if (part.done) {
          controller.close();
          return;
        }
        size += part.value.byteLength;
        if (size > limit) {
          over.hit = true;
          controller.error(bodyTooLarge(limit));
          await reader.cancel();
          return;
        }
        controller.enqueue(part.value);
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}
