/**
 * Rows ↔ API objects. The API speaks the spec's snake_case field names, which are the column
 * names; money (exact `numeric` in the store) is a JSON number; times are ISO 8601 strings.
 */
import { type Column, getTableColumns, type Table } from "drizzle-orm";
import { exactColumnJson } from "../cost/money.ts";
import { GatewayError } from "../errors.ts";
import { writtenNumber } from "./exact-numbers.ts";

const MONEY = new Set(["spend", "max_budget", "soft_budget", "temp_budget_increase", "max_budget_in_team", "max_budget_in_organization"]);
/** Columns the store keeps for itself, not part of any API object. */
const INTERNAL = new Set(["rotated_from", "first_token", "spend_set_at"]);

function snake(prop: string): string {
  return prop.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

/** How many decimals a number has, as written or as its shortest text (`1.5e-7`: 8). */
export function decimalsOf(v: number | string): number {
  const [mantissa = "", exponent = "0"] = String(v).toLowerCase().split("e");
  return Math.max(0, (mantissa.split(".")[1]?.replace(/0+$/, "").length ?? 0) - Number(exponent));
}

/** Decimals a numeric column keeps. */
export function scaleOf(column: Column): number {
  return (column as { scale?: number }).scale ?? 0;
}

/**
 * The number `holder[field]` (read as `value`) as the body wrote it, for a column that keeps
 * `scale` decimals: a 400 naming the field when it has more, which the column would round away
 * without a word.
 */
export function exactAmount(holder: object, field: string, value: number, scale: number): string {
  // As the body wrote it: the double it was read as may differ in its last digits.
  const text = writtenNumber(holder, field) || String(value);
  if (decimalsOf(text) > scale) throw GatewayError.of(400, `${field} has more than ${scale} decimals (${text}): amounts are kept to ${scale} decimals.`, "invalid_request_error", field);
  return text;
}

/** A row (camelCase properties) as the API returns it. */
export function toApi(row: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [prop, value] of Object.entries(row)) {
    const name = snake(prop);
    if (INTERNAL.has(name)) continue;
    if (value instanceof Date) out[name] = value.toISOString();
    // Written with its exact decimals: from $8,192 up a double cannot hold every 12-decimal amount.
    else if (MONEY.has(name) && typeof value === "string") out[name] = exactColumnJson(value);
    else out[name] = value;
  }
  return out;
}

/**
 * The table's fields present in an API body, as row properties. `null` is kept (it clears the
 * field); fields the body does not mention are left out, so an update touches only what it names.
 */
export function fromApi(table: Table, body: Record<string, unknown>, fields?: ReadonlySet<string>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [prop, column] of Object.entries(getTableColumns(table))) {
    if (!(column.name in body) || INTERNAL.has(column.name) || (fields && !fields.has(column.name))) continue;
    const value = body[column.name];
    if (value === undefined) continue;
    if (value !== null && column.columnType === "PgNumeric") {
      out[prop] = typeof value === "number" ? exactAmount(body, column.name, value, scaleOf(column)) : String(value);
    } else if (value !== null && column.columnType === "PgTimestamp" && typeof value === "string") out[prop] = new Date(value);
    else out[prop] = value;
  }
  return out;
}
