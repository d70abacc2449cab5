/**
 * Gemini's `Schema` (an OpenAPI 3.0 subset: upper-case `type`, `nullable`, int64 bounds as strings,
 * `propertyOrdering`) → the JSON Schema that OpenAI-style tools and `response_format` take.
 */
import { type Json, isObject } from "./types.ts";

/** Bounds proto JSON writes as strings (int64). */
const INTEGER_FIELDS = new Set(["minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"]);
/** Gemini-only annotations with no JSON Schema meaning. */
const DROPPED = new Set(["propertyOrdering", "property_ordering", "nullable"]);

const SNAKE: Record<string, string> = {
  any_of: "anyOf",
  min_items: "minItems",
  max_items: "maxItems",
  min_length: "minLength",
  max_length: "maxLength",
  min_properties: "minProperties",
  max_properties: "maxProperties",
};

export function toJsonSchema(schema: unknown): Json {
  if (!isObject(schema)) return {};
  const out: Json = {};
  for (const [rawKey, value] of Object.entries(schema)) {
    const key = SNAKE[rawKey] ?? rawKey;
    if (DROPPED.has(key)) continue;
    if (key === "type") {
      if (typeof value === "string" && value !== "TYPE_UNSPECIFIED") out.type = value.toLowerCase();
    } else if (key === "properties" && isObject(value)) {
      out.properties = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, toJsonSchema(v)]));
    } else if (key === "items") {
      out.items = toJsonSchema(value);
    } else if (key === "anyOf" && Array.isArray(value)) {
      out.anyOf = value.map(toJsonSchema);
    } else if (INTEGER_FIELDS.has(key) && typeof value === "string" && /^\d+$/.test(value)) {
      out[key] = Number(value);
    } else {
      out[key] = value;
    }
  }
  if (schema.nullable === true) {
    if (typeof out.type === "string") out.type = [out.type, "null"];
    else if (Array.isArray(out.anyOf)) out.anyOf = [...out.anyOf, { type: "null" }];
  }
  return out;
}
