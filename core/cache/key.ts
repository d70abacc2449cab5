/**
 * The cache key of a request: its endpoint, the model group it resolved to, and every field that
 * can change the answer, in a canonical order. Gateway-only fields (retries, fallbacks, metadata,
 * cache controls) and the end-user id do not change the answer, so they are left out.
 */
import { createHash } from "node:crypto";
import type { Endpoint } from "../contract.ts";
import { GatewayOnlyFields } from "../wire.ts";

const IGNORED = new Set<string>([...GatewayOnlyFields, "model", "user"]);

function canonical(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(canonical);
  if (v && typeof v === "object") {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) out[k] = canonical((v as Record<string, unknown>)[k]);
    return out;
  }
  return v;
}

export function cacheKey(endpoint: Endpoint, group: string, body: Record<string, unknown>, namespace: string | undefined): string {
  const fields: Record<string, unknown> = {};
  for (const k of Object.keys(body)) if (!IGNORED.has(k) && body[k] !== null && body[k] !== undefined) fields[k] = body[k];
  // A stream and a JSON answer are different bytes: they are cached apart.
  fields.stream = body.stream === true;
  return createHash("sha256")
    .update(JSON.stringify([endpoint, group, namespace ?? "", canonical(fields)]))
    .digest("hex");
}
