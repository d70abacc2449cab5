/** Request bodies checked against the wire schemas, compiled once; failures are 422s naming the field. */
import { Kind, type TSchema } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { type ValueError, Value } from "@sinclair/typebox/value";
import { GatewayError } from "../errors.ts";
import { ChatRequestSchema, CompletionRequestSchema, EmbeddingsRequestSchema, ImageRequestSchema } from "../wire.ts";

export function checker<S extends TSchema>(schema: S) {
  const compiled = TypeCompiler.Compile(schema);
  return (value: unknown) => {
    if (compiled.Check(value)) return value;
    const first = explain(compiled.Errors(value).First()!);
    const field = first.path.replace(/^\//, "").replaceAll("/", ".") || "body";
    const bound = typeof first.schema.minimum === "number" && typeof first.schema.maximum === "number" ? ` (allowed range ${first.schema.minimum} to ${first.schema.maximum})` : "";
    throw GatewayError.of(422, `Invalid request: ${field}: ${first.message}${bound}`, "validation_error", field);
  };
}

/** A failed nullable union ("Expected union value") is explained by its non-null branch's error. */
function explain(error: ValueError): ValueError {
  const all = error.schema.anyOf as TSchema[] | undefined;
  if (all?.every((b) => b.const !== undefined)) return { ...error, message: `Expected one of ${all.map((b) => JSON.stringify(b.const)).join(", ")}` };
  const branches = all?.filter((b) => b[Kind] !== "Null");
  if (branches?.length !== 1) return error;
  const inner = Value.Errors(branches[0]!, error.value).First();
  return inner ? { ...inner, path: error.path + inner.path } : error;
}

export const validate = {
  chat: checker(ChatRequestSchema),
  completions: checker(CompletionRequestSchema),
  embeddings: checker(EmbeddingsRequestSchema),
  images: checker(ImageRequestSchema),
};

/** The request body as a JSON object, or a 400 that says what is wrong. */
export async function readBody(request: Request): Promise<Record<string, unknown>> {
  return (await readBodyWithText(request)).body;
}

/** The body as a JSON object and the exact text it was parsed from. */
export async function readBodyWithText(request: Request): Promise<{ body: Record<string, unknown>; text: string }> {
  const text = await request.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch (err) {
    // Checked only on failure: trimming every body would copy large (base64 image) payloads.
    if (/^\s*$/.test(text)) throw GatewayError.of(400, "Request body is empty: send a JSON object.", "invalid_request_error");
    throw GatewayError.of(400, `Request body is not valid JSON: ${err instanceof Error ? err.message : String(err)}`, "invalid_request_error");
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) throw GatewayError.of(400, "Request body must be a JSON object.", "invalid_request_error");
  return { body: body as Record<string, unknown>, text };
}
