/**
 * Upstream stream framing → one string per event's data. SSE per the WHATWG spec (CR, LF or CRLF
 * line ends, multi-line data joined with \n, comments ignored); NDJSON one JSON text per line.
 */

/** Splits decoded text into lines, holding a trailing partial line (and a lone CR) for the next chunk. */
class LineSplitter {
  private rest = "";
  private pendingCR = false;

  /** Whether a partial line (or a CR awaiting its LF) is held from an earlier chunk. */
  get pending(): boolean {
    return this.rest !== "" || this.pendingCR;
  }

  push(text: string, onLine: (line: string) => void): void {
    // An empty chunk must not drop a pending CR: its LF may still come in the next one.
    if (text === "") return;
    let buf = this.rest + text;
    this.rest = "";
    if (this.pendingCR) {
      this.pendingCR = false;
      if (buf.startsWith("\n")) buf = buf.slice(1);
    }
    let start = 0;
    for (let i = 0; i < buf.length; i++) {
      const c = buf.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      onLine(buf.slice(start, i));
      if (c === 13) {
        if (i + 1 === buf.length) this.pendingCR = true;
        else if (buf.charCodeAt(i + 1) === 10) i++;
      }
      start = i + 1;
    }
    this.rest = buf.slice(start);
  }

  end(onLine: (line: string) => void): void {
    if (this.rest) onLine(this.rest);
    this.rest = "";
  }
}

/** A synchronous event parser: text in, event data strings out. */
export interface EventParser {
  push(text: string, onEvent: (data: string) => void): void;
  end(onEvent: (data: string) => void): void;
}

export class SseParser implements EventParser {
  private readonly lines = new LineSplitter();
  private data: string[] = [];
  private onEvent: (data: string) => void = () => {};
  private readonly onLine = (line: string) => {
    if (line === "") {
      if (this.data.length > 0) this.onEvent(this.data.join("\n"));
      this.data = [];
      return;
    }
    if (line.charCodeAt(0) === 58 /* ':' comment */) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    if (field !== "data") return;
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.charCodeAt(0) === 32) value = value.slice(1);
    this.data.push(value);
  };

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
  }
}

export class NdjsonParser implements EventParser {
  private readonly lines = new LineSplitter();

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
