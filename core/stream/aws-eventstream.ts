/**
 * AWS's binary event stream (`application/vnd.amazon.eventstream`, Bedrock's ConverseStream) →
 * one JSON text per message, in the shape `AwsStreamEvent` describes. A message is a 12-byte
 * prelude (total length, headers length, prelude CRC32), typed headers, the payload and a message
 * CRC32. Frames arrive split across reads or several to a read; this class finds the boundaries
 * and lets Smithy's codec check both CRCs and decode the headers.
 */
import { EventStreamCodec, type MessageHeaders } from "@smithy/eventstream-codec";

/** Enough for any real event (Bedrock's are a few KB), small enough to refuse a corrupt length before buffering it. */
const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;
const PRELUDE_BYTES = 12;
/** Prelude plus the trailing message CRC. */
const MIN_MESSAGE_BYTES = PRELUDE_BYTES + 4;

const textDecoder = new TextDecoder();
const textEncoder = new TextEncoder();
const codec = new EventStreamCodec(
  (bytes) => textDecoder.decode(bytes),
  (text) => textEncoder.encode(text),
);

function header(headers: MessageHeaders, name: string): string | undefined {
  const h = headers[name];
  return h?.type === "string" ? h.value : undefined;
}

/**
 * The `AwsStreamEvent` JSON text of one message; the payload's own JSON is spliced in, not parsed
 * and re-serialized. An `error` message carries its text in headers, not in the payload.
 */
function eventText(headers: MessageHeaders, body: Uint8Array): string {
  const messageType = header(headers, ":message-type") ?? "event";
  if (messageType === "error") {
    const message = JSON.stringify({ message: header(headers, ":error-message") ?? "" });
    return `{"messageType":"error","type":${JSON.stringify(header(headers, ":error-code") ?? "error")},"payload":${message}}`;
  }
  const type = header(headers, messageType === "exception" ? ":exception-type" : ":event-type") ?? "";
  const text = textDecoder.decode(body);
  const contentType = header(headers, ":content-type");
  const payload = text === "" ? "null" : contentType === undefined || contentType.includes("json") ? text : JSON.stringify(text);
  return `{"messageType":${JSON.stringify(messageType)},"type":${JSON.stringify(type)},"payload":${payload}}`;
}

/** Bytes in, one `AwsStreamEvent` (core/contract.ts) JSON text per complete message out. Throws on a corrupt frame. */
export class AwsEventStreamParser {
  /** Reads of a message not complete yet, joined once it is: a 16 MiB message in 16 KiB reads was copied at every read (GBs). */
  private held: Uint8Array[] = [];
  private heldBytes = 0;
  /** The held message's length, once its first 4 bytes are in (0 until then). */
  private needed = 0;
  /** Bytes copied to join reads, over the parser's life (tests check it stays linear). */
  copied = 0;

  push(chunk: Uint8Array, onEvent: (data: string) => void): void {
    let buf = chunk;
    if (this.heldBytes > 0) {
      this.held.push(chunk);
      this.heldBytes += chunk.length;
      if (this.needed === 0 && this.heldBytes >= 4) this.needed = messageLength(this.join());
      if (this.needed === 0 || this.heldBytes < this.needed) return;
      buf = this.join();
      this.held = [];
      this.heldBytes = 0;
      this.needed = 0;
    }
    const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    let at = 0;
    while (buf.length - at >= 4) {
      const total = messageLength(buf, at, view);
      if (buf.length - at < total) break;
      const { headers, body } = codec.decode(buf.subarray(at, at + total));
      at += total;
      onEvent(eventText(headers, body));
    }
    if (at === buf.length) return;
    // Copied, so a large read is not kept alive by its last few bytes.
    const rest = buf.slice(at);
    this.copied += rest.length;
    this.held = [rest];
    this.heldBytes = rest.length;
    this.needed = rest.length >= 4 ? messageLength(rest) : 0;
  }

  end(_onEvent: (data: string) => void): void {
    const left = this.heldBytes;
    this.held = [];
    this.heldBytes = 0;
    this.needed = 0;
    if (left > 0) throw new Error(`event stream ended inside a message (${left} bytes left over)`);
  }

  /** The held reads as one buffer (kept as that one piece). */
  private join(): Uint8Array {
    if (this.held.length === 1) return this.held[0]!;
    const out = new Uint8Array(this.heldBytes);
    let at = 0;
    for (const piece of this.held) {
      out.set(piece, at);
      at += piece.length;
    }
    this.copied += out.length;
    this.held = [out];
    return out;
  }
}

/** The total length a message's prelude gives (its first 4 bytes at `at`), checked against the bounds. */
function messageLength(buf: Uint8Array, at = 0, view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength)): number {
  const total = view.getUint32(at, false);
  if (total < MIN_MESSAGE_BYTES || total > MAX_MESSAGE_BYTES) throw new Error(`event stream message length ${total} is out of range`);
  return total;
}

