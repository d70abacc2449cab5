/** A plugin's config with the `default`s its TypeBox schema declares filled in. */
import { KindGuard, type TSchema } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";

const isMapping = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

/**
 * Value.Default, plus the two places it leaves out that a plugin author expects defaults in: a
 * required object the file leaves out whose fields all have defaults (Value.Default builds only
 * objects that carry a `default` themselves), and the values of a Record (it fills only a value
 * schema that has its own `default`, never the fields inside one); both wherever they sit, in the
 * items of a list too.
 */
export function withDefaults(schema: TSchema, raw: unknown): unknown {
  return fill(schema, Value.Clone(raw));
}

/** Value.Default writes into the value it is given (the caller's copy). */
function fill(schema: TSchema, raw: unknown): unknown {
  const value = Value.Default(schema, raw);
  if (KindGuard.IsArray(schema) && Array.isArray(value)) return value.map((item) => fill(schema.items, item));
  if (!isMapping(value)) return value;
  if (KindGuard.IsObject(schema)) {
    const required = new Set(schema.required ?? []);
    for (const [key, field] of Object.entries(schema.properties)) {
      if (value[key] !== undefined) value[key] = fill(field, value[key]);
      else if (required.has(key) && KindGuard.IsObject(field)) {
        const built = fill(field, {});
        // Left out still when some field has no default: the error then names the object the file lacks.
        if (Value.Check(field, built)) value[key] = built;
      }
    }
  } else if (KindGuard.IsRecord(schema)) {
    const field = Object.values(schema.patternProperties)[0];
    if (field) for (const key of Object.keys(value)) value[key] = fill(field, value[key]);
  }
  return value;
}
