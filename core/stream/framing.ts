/**
 * Upstream stream framing → one string per event's data. SSE per the WHATWG spec (CR, LF or CRLF
 * line ends, multi-line data joined with \n, comments ignored); NDJSON one JSON text per line.
 */

/** Splits decoded text into lines, holding a trailing partial line (and a lone CR) for the next chunk. */
class LineSplitter {
  private rest = "";
  private pendingCR = false;

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

export function sseEvents(): TransformStream<string, string> {
  const lines = new LineSplitter();
  let data: string[] = [];
  const onLine = (c: TransformStreamDefaultController<string>) => (line: string) => {
    if (line === "") {
      if (data.length > 0) c.enqueue(data.join("\n"));
      data = [];
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    if (field !== "data") return;
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    data.push(value);
  };
  return new TransformStream({
    transform(text, c) {
      lines.push(text, onLine(c));
    },
    flush(c) {
      lines.end(onLine(c));
      if (data.length > 0) c.enqueue(data.join("\n"));
    },
  });
}

export function ndjsonEvents(): TransformStream<string, string> {
  const lines = new LineSplitter();
  const onLine = (c: TransformStreamDefaultController<string>) => (line: string) => {
    if (line.trim() !== "") c.enqueue(line);
  };
  return new TransformStream({
    transform(text, c) {
      lines.push(text, onLine(c));
    },
    flush(c) {
      lines.end(onLine(c));
    },
  });
}
