/**
 * An upstream's answer read whole, within a bound. A provider (or a client's `api_base`) that
 * sends gigabytes was read into memory until the process died, with every other call in flight
 * (`Response.text()` takes what comes); and a compressed answer's `content-length` says nothing of
 * its size once inflated. Streams are not read whole (framing.ts bounds their events).
 */

/** The most of a JSON (or text, or audio) answer the gateway reads: many times the largest image batch in base64. */
export const MAX_ANSWER_BYTES = 256 * 1024 * 1024;
/** The most of an error answer's body read: its message is all that is used. */
export const MAX_ERROR_BODY_BYTES = 1024 * 1024;

export class AnswerTooLarge extends Error {
  constructor(readonly limit: number) {
    super(`the answer is larger than ${limit / 1024 / 1024} MiB`);
  }
}

/** At most `limit` bytes of the body; `complete` is false when it had more (the rest is not read). */
async function readUpTo(res: Response, limit: number): Promise<{ bytes: Uint8Array; complete: boolean }> {
  if (!res.body) return { bytes: new Uint8Array(0), complete: true };
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = res.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return { bytes: Buffer.concat(chunks, size), complete: true };
    if (size + value.byteLength > limit) {
      chunks.push(value.subarray(0, limit - size));
      await reader.cancel().catch(() => undefined);
      return { bytes: Buffer.concat(chunks, limit), complete: false };
    }
    chunks.push(value);
    size += value.byteLength;
  }
}

/** Whether the body's length is announced as it will be read (not compressed): then it can be checked before reading. */
function announcedLength(res: Response): number | undefined {
  const encoding = res.headers.get("content-encoding");
  if (encoding && encoding !== "identity") return undefined;
  const length = Number(res.headers.get("content-length") ?? Number.NaN);
  return Number.isInteger(length) && length >= 0 ? length : undefined;
}

async function tooLarge(res: Response, limit: number): Promise<AnswerTooLarge> {
  await res.body?.cancel().catch(() => undefined);
  return new AnswerTooLarge(limit);
}

/**
 * The body read by `native` when its announced length is within `limit` (the usual JSON answer
 * keeps Bun's own read), else read up to the bound and handed to `fromBytes`; AnswerTooLarge past it.
 */
async function readBounded<T>(res: Response, limit: number, native: (res: Response) => Promise<T>, fromBytes: (bytes: Uint8Array) => T): Promise<T> {
  const announced = announcedLength(res);
  if (announced !== undefined && announced <= limit) return native(res);
  if (announced !== undefined) throw await tooLarge(res, limit);
  const read = await readUpTo(res, limit);
  if (!read.complete) throw new AnswerTooLarge(limit);
  return fromBytes(read.bytes);
}

/** The body as text; AnswerTooLarge past `limit`. */
export function answerText(res: Response, limit = MAX_ANSWER_BYTES): Promise<string> {
  return readBounded(res, limit, (r) => r.text(), utf8);
}

/** The body as bytes; AnswerTooLarge past `limit`. */
export function answerBytes(res: Response, limit = MAX_ANSWER_BYTES): Promise<ArrayBuffer> {
  return readBounded(res, limit, (r) => r.arrayBuffer(), (bytes) => bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) as ArrayBuffer);
}

const utf8 = (bytes: Uint8Array): string => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("utf8");

/** An error answer's body, cut at MAX_ERROR_BODY_BYTES; "" when it cannot be read. */
export async function errorBodyText(res: Response): Promise<string> {
  try {
    return utf8((await readUpTo(res, MAX_ERROR_BODY_BYTES)).bytes);
  } catch {
    return "";
  }
}
