/** Page and sort parameters of the list endpoints, checked like a body (422 naming the parameter). */
import { GatewayError } from "../errors.ts";

export interface Page {
  page: number;
  pageSize: number;
  offset: number;
}

function invalid(param: string, message: string): GatewayError {
  return GatewayError.of(422, `Invalid request: ${param}: ${message}`, "validation_error", param);
}

export function integer(query: (name: string) => string | undefined, name: string, fallback: number, min: number, max: number): number {
  const text = query(name);
  if (text === undefined || text === "") return fallback;
  const n = Number(text);
  if (!Number.isInteger(n) || n < min || n > max) throw invalid(name, `Expected an integer from ${min} to ${max}`);
  return n;
}

export function pageOf(query: (name: string) => string | undefined, defaultSize: number, maxSize: number): Page {
  const page = integer(query, "page", 1, 1, Number.MAX_SAFE_INTEGER);
  const pageSize = integer(query, "page_size", defaultSize, 1, maxSize);
  return { page, pageSize, offset: (page - 1) * pageSize };
}

export function paged<T>(items: T[], total: number, p: Page): { items: T[]; total: number; page: number; page_size: number; total_pages: number } {
  return { items, total, page: p.page, page_size: p.pageSize, total_pages: Math.ceil(total / p.pageSize) };
}

/** A boolean query parameter's texts, in any case, as FastAPI reads them (`True` from Python clients). */
const TRUE_TEXTS: ReadonlySet<string> = new Set(["true", "1", "yes", "on", "t", "y"]);
const FALSE_TEXTS: ReadonlySet<string> = new Set(["false", "0", "no", "off", "f", "n"]);

/** A boolean query parameter: `fallback` when absent or empty, else one of FastAPI's texts, else a 422 naming it. */
export function booleanParam(value: string | null | undefined, name: string, fallback: boolean): boolean {
  const text = value?.toLowerCase();
  if (text === undefined || text === "") return fallback;
  if (TRUE_TEXTS.has(text)) return true;
  if (FALSE_TEXTS.has(text)) return false;
  throw invalid(name, "Expected true or false");
}

/** A boolean parameter, false when absent. */
export function flag(query: (name: string) => string | undefined, name: string): boolean {
  return booleanParam(query(name), name, false);
}

/** One of `choices` (or the default when absent), else a 422. */
export function choice<C extends string>(query: (name: string) => string | undefined, name: string, choices: readonly C[], fallback: C): C {
  const v = query(name);
  if (v === undefined || v === "") return fallback;
  if (!(choices as readonly string[]).includes(v)) throw invalid(name, `Expected one of ${choices.join(", ")}`);
  return v as C;
}

/** A comma-separated list parameter (`a,b,c`), empty entries dropped. */
export function list(query: (name: string) => string | undefined, name: string): string[] | undefined {
  const v = query(name);
  if (v === undefined) return undefined;
  return v
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
}
