/**
 * File parts sent upstream with the Content-Type their client gave them. Bun's Blob normalises a
 * type (lowercases it; adds `;charset=utf-8` to text/plain and application/json), and FormData
 * copies every file it is given, so a type Bun would change cannot travel in the Blob: it is kept
 * beside the file, then beside the form entry that file became, and the form is written out here.
 */

/** The Content-Type a client gave a file whose Blob type differs from it. */
const declaredTypes = new WeakMap<Blob, string>();
/** Of a form, the Content-Type of each file entry (by its position) whose Blob type differs from it. */
const formTypes = new WeakMap<FormData, Map<number, string>>();

/** `file` as a part that declared `type`: the file itself, with the type kept beside it when Bun made it another. */
export function withDeclaredType(file: Blob, type: string): Blob {
  if (file.type !== type) declaredTypes.set(file, type);
  return file;
}

/** Appends a file to a form that goes upstream, keeping its declared Content-Type. */
export function appendFile(form: FormData, name: string, file: Blob, filename: string): void {
  const type = declaredTypes.get(file);
  if (type !== undefined) {
    const types = formTypes.get(form) ?? new Map<number, string>();
    formTypes.set(form, types);
    types.set([...form.keys()].length, type);
  }
  form.append(name, file, filename);
}

/** A name or filename in a part's Content-Disposition, escaped as browsers and Bun's FormData do (WHATWG). */
const quoted = (text: string): string => `"${text.replaceAll('"', "%22").replaceAll("\r", "%0D").replaceAll("\n", "%0A")}"`;

/**
 * The body of a form that goes upstream: the form itself (fetch writes it) unless a file in it
 * declared a type its Blob does not carry; then the multipart body, written with those types, and
 * its Content-Type.
 */
export function formBody(form: FormData): { body: FormData | Blob; contentType?: string } {
  const types = formTypes.get(form);
  if (!types) return { body: form };
  const boundary = `----SvcFormBoundary${crypto.randomUUID().replaceAll("-", "")}`;
  const parts: (string | Blob)[] = [];
  let i = 0;
  for (const [name, value] of form) {
    if (typeof value === "string") parts.push(`--${boundary}\r\nContent-Disposition: form-data; name=${quoted(name)}\r\n\r\n${value}\r\n`);
    else {
      const type = types.get(i) ?? (value.type || "application/octet-stream");
      parts.push(`--${boundary}\r\nContent-Disposition: form-data; name=${quoted(name)}; filename=${quoted(value.name)}\r\nContent-Type: ${type}\r\n\r\n`, value, "\r\n");
    }
    i++;
  }
  parts.push(`--${boundary}--\r\n`);
  return { body: new Blob(parts), contentType: `multipart/form-data; boundary=${boundary}` };
}
