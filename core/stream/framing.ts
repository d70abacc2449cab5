/**
 * Upstream stream framing → one string per event's data. SSE per the WHATWG spec (CR, LF or CRLF
 * line ends, multi-line data joined with \n, comments ignored); NDJSON one JSON text per line.
 */

/**
 * The most one event may buffer (one unfinished line, or an SSE event's data lines): 64 Mi
 * characters, 64 MiB of ASCII, far beyond any real event (a large tool call or image is a few MB).
 * An upstream past it, or one whose line never ends, fails the stream instead of holding memory
 * without limit.
 */
export const MAX_EVENT_CHARS = 64 * 1024 * 1024;

/** What a parser throws for an event past its bound; the pipeline ends the stream with it. */
export class OversizedEvent extends Error {
  constructor(max: number) {
    super(`a stream event is over ${max} characters`);
  }
}

/**
 * Splits decoded text into lines, holding a trailing partial line (and a lone CR) for the next
 * chunk. Each chunk's text is read once: an event arriving in many reads costs time linear in its
 * size (re-reading the held text at every chunk made it quadratic).
 */
class LineSplitter {
  /** The unfinished line's pieces, one per chunk it spans: joined once, when the line ends. */
  private held: string[] = [];
  private heldChars = 0;
  private pendingCR = false;
  /** Characters read for line ends, over the splitter's life (tests check it stays linear). */
  scanned = 0;

  constructor(private readonly maxLineChars: number) {}

  /** Whether a partial line (or a CR awaiting its LF) is held from an earlier chunk. */
  get pending(): boolean {
    return this.heldChars !== 0 || this.pendingCR;
  }

  push(text: string, onLine: (line: string) => void): void {
    // An empty chunk must not drop a pending CR: its LF may still come in the next one.
    if (text === "") return;
    let start = 0;
    if (this.pendingCR) {
      this.pendingCR = false;
      if (text.charCodeAt(0) === 10) start = 1;
    }
    this.scanned += text.length - start;
    for (let i = start; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      onLine(this.heldChars === 0 ? text.slice(start, i) : this.release(text.slice(start, i)));
      if (c === 13) {
        if (i + 1 === text.length) this.pendingCR = true;
        else if (text.charCodeAt(i + 1) === 10) i++;
      }
      start = i + 1;
    }
    if (start < text.length) this.hold(start === 0 ? text : text.slice(start));
  }

  end(onLine: (line: string) => void): void {
    if (this.heldChars !== 0) onLine(this.release(""));
  }

  private hold(piece: string): void {
    this.heldChars += piece.length;
    if (this.heldChars > this.maxLineChars) {
      this.held.length = 0;
      this.heldChars = 0;
      throw new OversizedEvent(this.maxLineChars);
    }
    this.held.push(piece);
  }

  /** The held line ended by `last`; the splitter holds nothing after. */
  private release(last: string): string {
    this.held.push(last);
    const line = this.held.join("");
    this.held.length = 0;
    this.heldChars = 0;
    return line;
  }
}

/** A synchronous event parser: text in, event data strings out. */
export interface EventParser {
  push(text: string, onEvent: (data: string) => void): void;
  end(onEvent: (data: string) => void): void;
}

export class SseParser implements EventParser {
  private readonly lines: LineSplitter;
  private data: string[] = [];
  private dataChars = 0;
  private onEvent: (data: string) => void = () => {};
  private readonly onLine = (line: string) => {
    if (line === "") {
      if (this.data.length > 0) this.onEvent(this.data.join("\n"));
      this.data = [];
      this.dataChars = 0;
      return;
    }
    if (line.charCodeAt(0) === 58 /* ':' comment */) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    if (field !== "data") return;
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.charCodeAt(0) === 32) value = value.slice(1);
    // Each line is bounded by the splitter; an event of endless short data lines is bounded here.
    this.dataChars += value.length + 1;
    if (this.dataChars > this.maxEventChars) {
      this.data = [];
      this.dataChars = 0;
      throw new OversizedEvent(this.maxEventChars);
    }
    this.data.push(value);
  };

  /** `maxEventChars`: the most one event may buffer before the parser throws `OversizedEvent`. */
  constructor(private readonly maxEventChars = MAX_EVENT_CHARS) {
    this.lines = new LineSplitter(maxEventChars);
  }

  /** Characters the line splitter has read (linear in the input). */
  get scanned(): number {
    return this.lines.scanned;
  }

  push(text: string, onEvent: (data: string) => void): void {
    this.onEvent = onEvent;
    if (this.data.length > 0 || this.lines.pending || text.indexOf("\r") >= 0) {
      this.lines.push(text, this.onLine);
      return;
    }
    // Fast path for the common shape (`data: …\n\n` events, LF only, optionally after an `event: …`
    // line, which Anthropic puts on every event and the parser ignores): native indexOf instead of
    // a character loop. Anything else (other fields, multi-line data) goes through the full parser.
    let start = 0;
    for (;;) {
      const end = text.indexOf("\n\n", start);
      if (end < 0) break;
      const data = text.startsWith("event: ", start) ? text.indexOf("\n", start) + 1 : start;
      if (text.startsWith("data: ", data) && text.indexOf("\n", data) === end) onEvent(text.slice(data + 6, end));
      else this.lines.push(text.slice(start, end + 2), this.onLine);
      start = end + 2;
    }
    if (start < text.length) this.lines.push(start === 0 ? text : text.slice(start), this.onLine);
  }

  end(onEvent: (data: string) => void): void {
    this.onEvent = onEvent;
    this.lines.end(this.onLine);
    if (this.data.length > 0) onEvent(this.data.join("\n"));
    this.data = [];
    this.dataChars = 0;
  }
}

export class NdjsonParser implements EventParser {
  private readonly lines: LineSplitter;

  /** `maxLineChars`: the most one line may buffer before the parser throws `OversizedEvent`. */
  constructor(maxLineChars = MAX_EVENT_CHARS) {
    this.lines = new LineSplitter(maxLineChars);
  }

  /** Characters the line splitter has read (linear in the input). */
  get scanned(): number {
    return this.lines.scanned;
  }

  push(text: string, onEvent: (data: string) => void): void {
    this.lines.push(text, (line) => {
      if (line.trim() !== "") onEvent(line);
    });
  }

  end(onEvent: (data: string) => void): void {
    this.lines.end((line) => {
      if (line.trim() !== "") onEvent(line);
    });
  }
}
