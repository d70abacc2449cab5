/** Request bodies checked against the wire schemas, compiled once; failures are 422s naming the field. */
import { isUtf8 } from "node:buffer";
import { Kind, type TSchema } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { type ValueError, Value } from "@sinclair/typebox/value";
import { FORMAT_ERRORS, MAX_REQUEST_MB } from "../config/schema.ts";
import { GatewayError, bodyTooLarge } from "../errors.ts";
import { parseKeepingNumberText } from "../identity/exact-numbers.ts";
import { booleanParam } from "../identity/paging.ts";
import { withDeclaredType } from "./multipart.ts";
import { ChatRequestSchema, CompletionRequestSchema, EmbeddingsRequestSchema, ImageRequestSchema, MAX_SPEECH_CHARACTERS, ModerationRequestSchema, SpeechRequestSchema, TranscriptionRequestSchema, codePoints } from "../wire.ts";

export function checker<S extends TSchema>(schema: S) {
  const compiled = TypeCompiler.Compile(schema);
  return (value: unknown) => {
    if (compiled.Check(value)) return value;
    const first = explain(compiled.Errors(value).First()!);
    const field = first.path.replace(/^\//, "").replaceAll("/", ".") || "body";
    const bound = typeof first.schema.minimum === "number" && typeof first.schema.maximum === "number" ? ` (allowed range ${first.schema.minimum} to ${first.schema.maximum})` : "";
    // The config's own checks (shared with /model/new) say what they expect, not the format's name.
    const format = typeof first.schema.format === "string" && first.message.endsWith("format") ? FORMAT_ERRORS[first.schema.format] : undefined;
    const message = first.message === "Never" ? "Unexpected property" : (format ?? first.message);
    throw GatewayError.of(422, `Invalid request: ${field}: ${message}${bound}`, "validation_error", field);
  };
}

/** A failed nullable union ("Expected union value") is explained by its non-null branch's error (of one thing or a list, by the branch of the value's shape), down to the field at fault. */
function explain(error: ValueError): ValueError {
  const all = error.schema.anyOf as TSchema[] | undefined;
  if (all?.every((b) => b.const !== undefined)) return { ...error, message: `Expected one of ${all.map((b) => JSON.stringify(b.const)).join(", ")}` };
  const nonNull = all?.filter((b) => b[Kind] !== "Null");
  // One thing or a list of them (a member, or members): the branch of the value's shape explains it.
  const branches = nonNull && nonNull.length > 1 ? nonNull.filter((b) => (b.type === "array") === Array.isArray(error.value)) : nonNull;
  if (branches?.length !== 1) return error;
  const inner = Value.Errors(branches[0]!, error.value).First();
  // The branch may hold nullable unions of its own (metadata.tags): explained the same way.
  return inner ? explain({ ...inner, path: error.path + inner.path }) : error;
}

const transcriptionFields = checker(TranscriptionRequestSchema);
const speechFields = checker(SpeechRequestSchema);

export const validate = {
  chat: checker(ChatRequestSchema),
  completions: checker(CompletionRequestSchema),
  embeddings: checker(EmbeddingsRequestSchema),
  images: checker(ImageRequestSchema),
  speech: (value: unknown) => {
    const fields = speechFields(value);
    if (codePoints(fields.input) > MAX_SPEECH_CHARACTERS) throw GatewayError.of(422, `Invalid request: input: Expected at most ${MAX_SPEECH_CHARACTERS} characters`, "validation_error", "input");
    return fields;
  },
  moderations: checker(ModerationRequestSchema),
  transcriptions: (value: unknown) => {
    const fields = transcriptionFields(value);
    if (!(fields.file instanceof Blob)) throw GatewayError.of(422, "Invalid request: file: Expected an uploaded audio file", "validation_error", "file");
    // No upstream transcribes nothing (OpenAI refuses it as too short): refused here, before any cost.
    if (fields.file.size === 0) throw GatewayError.of(422, "Invalid request: file: The uploaded audio file is empty", "validation_error", "file");
    return fields;
  },
};

/** A boolean query parameter of `url`: `fallback` when absent or empty, else a 422 naming a text that is neither true nor false. */
export function queryFlag(url: URL, name: string, fallback: boolean): boolean {
  return booleanParam(url.searchParams.get(name), name, fallback);
}

/**
 * A path parameter the router left percent-encoded (a `*` tail), decoded; an encoding that does not
 * decode (`%ZZ`, a cut-off UTF-8 sequence) is the client's mistake, answered with a 400 naming it.
 */
export function decodePathParam(raw: string, param: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw invalidPathParam(param, raw);
  }
}

export function invalidPathParam(param: string, raw?: string): GatewayError {
  const shown = raw === undefined ? "" : ` (${JSON.stringify(raw.slice(0, 100))})`;
  return GatewayError.of(400, `The ${param} in the path${shown} is not valid percent-encoding.`, "invalid_request_error", param);
}

/** The most any request body may be (the configured limit is at most this). */
export const MAX_REQUEST_BYTES = MAX_REQUEST_MB * 1024 * 1024;

/**
 * The body's bytes, refused with a 413 past `limit`: an announced length is checked before
 * anything is read, a chunked body as it comes (it has no length to check first).
 */
async function requestBytes(request: Request, limit: number): Promise<Uint8Array<ArrayBuffer>> {
  const announced = request.headers.get("content-length");
  if (announced !== null) {
    if (Number(announced) > limit) throw bodyTooLarge(limit);
    return request.bytes();
  }
  if (!request.body) return new Uint8Array(0);
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of request.body) {
    size += chunk.byteLength;
    if (size > limit) throw bodyTooLarge(limit);
    chunks.push(chunk);
  }
  return new Uint8Array(Buffer.concat(chunks, size));
}

/** Form fields that are numbers or booleans on the wire of a JSON request. */
const NUMERIC_FIELDS = ["temperature"];

/**
 * A multipart form as a request object: files stay Blobs, `name[]` fields become lists, numbers
 * and booleans are parsed (so the schema checks them as in a JSON body).
 */
export async function readForm(request: Request, limit = MAX_REQUEST_BYTES): Promise<Record<string, unknown>> {
  const contentType = request.headers.get("content-type") ?? "";
  // A media type is case-insensitive (RFC 9110 §8.3.1): `Multipart/Form-Data` is one too.
  if (!contentType.toLowerCase().startsWith("multipart/form-data")) {
    throw GatewayError.of(400, "This endpoint takes multipart/form-data: the audio as `file`, and `model`.", "invalid_request_error");
  }
  const bytes = await requestBytes(request, limit);
  let form: FormData;
  try {
    form = await new Response(bytes, { headers: { "content-type": contentType } }).formData();
  } catch (err) {
    throw GatewayError.of(400, `The multipart body could not be read: ${err instanceof Error ? err.message : String(err)}`, "invalid_request_error");
  }
  const entries = [...form];
  const declared = declaredParts(bytes, contentType);
  const out: Record<string, unknown> = {};
  for (const [i, [name, parsed]] of entries.entries()) {
    const value = typeof parsed === "string" || declared.length !== entries.length ? parsed : asDeclared(parsed, declared[i]!);
    if (name.endsWith("[]")) {
      const key = name.slice(0, -2);
      const list = Array.isArray(out[key]) ? (out[key] as unknown[]) : [];
      list.push(value);
      out[key] = list;
    } else {
      // A second file under one name would go upstream unpriced, or be dropped unseen.
      if (Object.hasOwn(out, name) && (value instanceof Blob || out[name] instanceof Blob)) {
        throw GatewayError.of(400, `The form has more than one \`${name}\` part: send one file per request.`, "invalid_request_error", name);
      }
      out[name] = value;
    }
  }
  for (const k of NUMERIC_FIELDS) {
    const v = out[k];
    if (typeof v === "string" && v.trim() !== "" && Number.isFinite(Number(v))) out[k] = Number(v);
  }
  if (out.stream === "true" || out.stream === "false") out.stream = out.stream === "true";
  return out;
}

/** What a multipart part's headers say of it (undefined: not said). */
interface DeclaredPart {
  type?: string;
  /** The `filename` parameter with its escaped quotes (`\"`) unescaped. */
  filename?: string;
}

/**
 * A file as its part declared it. Bun types a file by its name's extension, not by its part's
 * Content-Type: the client's type (audio/webm for `rec.webm`, audio/ogg for a `blob`) is put back,
 * and a part that declares none goes on as a file of unknown type (application/octet-stream, as
 * RFC 7578 reads it), not as Bun's guess. Bun also keeps the backslash of a quote escaped in the
 * `filename` (curl writes `a\"b.mp3`); the name goes on as the client meant it. A type Bun would
 * change (`Audio/WAV`, `text/plain`) is kept beside the file (http/multipart.ts).
 */
function asDeclared(parsed: Blob, declared: DeclaredPart): Blob {
  const type = declared.type ?? "";
  const name = parsed instanceof File ? (declared.filename ?? parsed.name) : undefined;
  if (type === parsed.type && (name === undefined || name === (parsed as File).name)) return parsed;
  return withDeclaredType(name === undefined ? new Blob([parsed], { type }) : new File([parsed], name, { type }), type);
}

/** What each part of a multipart body declares, in order; empty when the body's boundary cannot be found. */
function declaredParts(bytes: Uint8Array, contentType: string): DeclaredPart[] {
  const boundary = /boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(contentType);
  if (!boundary) return [];
  const body = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const delimiter = `\r\n--${boundary[1] ?? boundary[2]}`;
  const parts: DeclaredPart[] = [];
  // The first delimiter may open the body without the CRLF in front of it; `--` after one closes the body.
  let at = body.indexOf(delimiter.slice(2));
  while (at >= 0 && body.toString("latin1", at + delimiter.length - 2, at + delimiter.length) !== "--") {
    const headersStart = body.indexOf("\r\n", at);
    const headersEnd = body.indexOf("\r\n\r\n", headersStart);
    if (headersStart < 0 || headersEnd < 0) break;
    const headers = body.toString("utf8", headersStart, headersEnd + 2);
    const filename = /\r\ncontent-disposition:[^\r]*;[ \t]*filename="((?:[^"\\\r]|\\[^\r])*)"/i.exec(headers)?.[1];
    parts.push({ type: /\r\ncontent-type:[ \t]*([^\r]*?)[ \t]*\r\n/i.exec(headers)?.[1], filename: filename?.replaceAll('\\"', '"') });
    at = body.indexOf(delimiter, headersEnd);
    if (at >= 0) at += 2;
  }
  return parts;
}

/** The request body as a JSON object, or a 400 that says what is wrong. */
export async function readBody(request: Request, limit = MAX_REQUEST_BYTES): Promise<Record<string, unknown>> {
  return (await readBodyWithText(request, JSON.parse, limit)).body;
}

/** `readBody` that keeps the text of numbers a double cannot hold (exact-numbers.ts): for bodies that carry money. */
export async function readBodyKeepingNumbers(request: Request, limit = MAX_REQUEST_BYTES): Promise<Record<string, unknown>> {
  return (await readBodyWithText(request, parseKeepingNumberText, limit)).body;
}

const utf8 = new TextDecoder();

/** The body as a JSON object and the exact text it was parsed from. */
export async function readBodyWithText(
  request: Request,
  parse: (text: string) => unknown = JSON.parse,
  limit = MAX_REQUEST_BYTES,
): Promise<{ body: Record<string, unknown>; text: string }> {
  const bytes = await requestBytes(request, limit);
  // Bytes that are not UTF-8 would be decoded with replacement characters: the prompt the caller
  // sent would not be the one priced, forwarded and logged.
  if (!isUtf8(bytes)) throw GatewayError.of(400, "Request body is not valid UTF-8: send JSON encoded as UTF-8.", "invalid_request_error");
  const text = utf8.decode(bytes);
  let body: unknown;
  try {
    body = parse(text);
  } catch (err) {
    // Checked only on failure: trimming every body would copy large (base64 image) payloads.
    if (/^\s*$/.test(text)) throw GatewayError.of(400, "Request body is empty: send a JSON object.", "invalid_request_error");
    throw GatewayError.of(400, `Request body is not valid JSON: ${err instanceof Error ? err.message : String(err)}`, "invalid_request_error");
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) throw GatewayError.of(400, "Request body must be a JSON object.", "invalid_request_error");
  return { body: body as Record<string, unknown>, text };
}
