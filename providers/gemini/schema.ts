/**
 * JSON Schema (as OpenAI clients write it for tools and `response_format`) → Gemini's `Schema`, an
 * OpenAPI 3.0 subset. Gemini rejects the whole request on a keyword it does not know
 * (`additionalProperties`, `$schema`, `$ref`, unsupported `format`s), so the schema is rewritten:
 * references are inlined, `["string", "null"]` and `anyOf [..., {type: "null"}]` become `nullable`,
 * `const` becomes a one-value `enum`, and everything else Gemini lacks is dropped.
 */

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** Keywords copied as they are (after their values are converted where they hold schemas). */
const COPIED = ["title", "description", "nullable", "minItems", "maxItems", "minProperties", "maxProperties", "minLength", "maxLength", "pattern", "minimum", "maximum", "default", "example", "propertyOrdering"];

/** The `format`s Gemini accepts, by type; any other makes the request fail. */
const FORMATS: Record<string, readonly string[]> = {
  STRING: ["enum", "date-time"],
  INTEGER: ["int32", "int64"],
  NUMBER: ["float", "double"],
};

/** Recursive `$ref`s are cut at this depth (Gemini has no references; the schema must be finite). */
const MAX_REF_DEPTH = 8;

interface Context {
  defs: Json;
  depth: number;
}

function resolveRef(ref: string, ctx: Context): Json | undefined {
  const m = /^#\/(?:\$defs|definitions)\/(.+)$/.exec(ref);
  const target = m ? ctx.defs[decodeURIComponent(m[1]!.replaceAll("~1", "/").replaceAll("~0", "~"))] : undefined;
  return isObject(target) ? target : undefined;
}

function convert(schema: unknown, ctx: Context): Json {
  if (!isObject(schema)) return {};
  if (typeof schema.$ref === "string") {
    const target = resolveRef(schema.$ref, ctx);
    if (!target || ctx.depth >= MAX_REF_DEPTH) return { type: "OBJECT" };
    const { $ref: _ref, ...siblings } = schema;
    return convert({ ...target, ...siblings }, { ...ctx, depth: ctx.depth + 1 });
  }
  const out: Json = {};
  const union = (Array.isArray(schema.anyOf) ? schema.anyOf : Array.isArray(schema.oneOf) ? schema.oneOf : undefined) as unknown[] | undefined;
  if (union) return convertUnion(union, schema, ctx);

  let types = Array.isArray(schema.type) ? (schema.type as unknown[]).filter((t): t is string => typeof t === "string") : typeof schema.type === "string" ? [schema.type] : [];
  if (types.includes("null")) {
    out.nullable = true;
    types = types.filter((t) => t !== "null");
  }
  if (types.length > 1) {
    return { anyOf: types.map((t) => convert({ ...schema, type: t }, ctx)), ...(out.nullable ? { nullable: true } : {}) };
  }
  let type = types[0]?.toUpperCase();
  if (!type && isObject(schema.properties)) type = "OBJECT";
  if (!type && schema.items !== undefined) type = "ARRAY";
  if (type) out.type = type;

  for (const k of COPIED) if (schema[k] !== undefined && out[k] === undefined) out[k] = schema[k];
  if (typeof schema.format === "string" && type && FORMATS[type]?.includes(schema.format)) out.format = schema.format;

  const values = schema.const !== undefined ? [schema.const] : Array.isArray(schema.enum) ? (schema.enum as unknown[]) : undefined;
  if (values) {
    // Gemini enums are strings; a null member means the field may be null.
    if (values.includes(null)) out.nullable = true;
    const strings = values.filter((v) => v !== null).map((v) => (typeof v === "string" ? v : JSON.stringify(v)));
    if (strings.length > 0) {
      out.type = "STRING";
      out.enum = strings;
      delete out.format;
    }
  }
  if (isObject(schema.properties)) {
    const props: Json = {};
    for (const [name, sub] of Object.entries(schema.properties)) props[name] = convert(sub, ctx);
    out.properties = props;
    if (Array.isArray(schema.required)) out.required = schema.required.filter((r): r is string => typeof r === "string" && r in props);
  }
  if (schema.items !== undefined) out.items = convert(Array.isArray(schema.items) ? schema.items[0] : schema.items, ctx);
  return out;
}

function convertUnion(members: unknown[], schema: Json, ctx: Context): Json {
  const nonNull = members.filter((m) => !(isObject(m) && m.type === "null"));
  const nullable = nonNull.length < members.length;
  const { anyOf: _a, oneOf: _o, ...rest } = schema;
  const out: Json = nonNull.length === 1 ? convert({ ...rest, ...(nonNull[0] as Json) }, ctx) : { ...convert(rest, ctx), anyOf: nonNull.map((m) => convert(m, ctx)) };
  if (nullable) out.nullable = true;
  return out;
}

/** A JSON Schema → the equivalent Gemini `Schema`. */
export function geminiSchema(schema: unknown): Json {
  const root = isObject(schema) ? schema : {};
  const defs = { ...(isObject(root.definitions) ? root.definitions : {}), ...(isObject(root.$defs) ? root.$defs : {}) };
  return convert(root, { defs, depth: 0 });
}

/** Whether a function's parameters declare nothing (Gemini refuses an OBJECT with no properties). */
export function isEmptyParameters(schema: unknown): boolean {
  if (!isObject(schema)) return true;
  const props = schema.properties;
  return (schema.type === undefined || schema.type === "object") && (!isObject(props) || Object.keys(props).length === 0) && schema.$ref === undefined && schema.anyOf === undefined;
}
