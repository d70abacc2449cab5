/** Multipart uploads as the mocks received them, part by part (what a test compares with what the client sent). */

export interface RecordedPart {
  name: string;
  /** The `filename` parameter as written between its quotes (no unescaping); undefined for a plain field. */
  filename?: string;
  /** The part's Content-Type header, as written. */
  contentType?: string;
  bytes: Uint8Array;
}

/** The parts of a multipart body as sent (Bun's own parser retypes files by their name's extension). */
export function rawParts(bytes: Uint8Array, contentType: string): RecordedPart[] {
  const boundary = /boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(contentType)?.slice(1).find((b) => b !== undefined);
  if (!boundary) return [];
  const body = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const parts: RecordedPart[] = [];
  let at = body.indexOf(`--${boundary}`);
  while (at >= 0) {
    const afterDelimiter = at + boundary.length + 2;
    if (body.toString("latin1", afterDelimiter, afterDelimiter + 2) === "--") break;
    const headersEnd = body.indexOf("\r\n\r\n", afterDelimiter);
    const next = body.indexOf(`\r\n--${boundary}`, headersEnd);
    if (headersEnd < 0 || next < 0) break;
    const headers = body.toString("utf8", afterDelimiter + 2, headersEnd);
    const disposition = /^content-disposition:(.*)$/im.exec(headers)?.[1] ?? "";
    parts.push({
      name: /[; ]name="([^"]*)"/.exec(disposition)?.[1] ?? "",
      filename: /[; ]filename="((?:[^"\\]|\\.)*)"/.exec(disposition)?.[1],
      contentType: /^content-type:[ \t]*(.*?)[ \t]*$/im.exec(headers)?.[1],
      bytes: new Uint8Array(body.subarray(headersEnd + 4, next)),
    });
    at = next + 2;
  }
  return parts;
}
