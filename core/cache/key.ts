/**
 * The cache key of a request: its endpoint, the model group it resolved to, and every field that
 * can change the answer, in a canonical order. Gateway-only fields (retries, fallbacks, metadata,
 * cache controls) and the end-user id do not change the answer, so they are left out; an
 * embeddings request's own api_base / api_key / api_version do, so they are kept.
 */
import { createHash } from "node:crypto";
import type { Endpoint } from "../contract.ts";
import { GatewayOnlyFields } from "../wire.ts";

const IGNORED = new Set<string>([...GatewayOnlyFields, "model", "user"]);
/**
 * An embeddings request's own credentials (when the operator allows them) choose the server that
 * answers, and whose account: answers for one are not answers for another (a client's own
 * api_base must not fill the cache for every caller of the model).
 */
const CLIENT_CREDENTIALS = ["api_base", "api_key", "api_version"] as const;

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
  if (endpoint === "embeddings") for (const k of CLIENT_CREDENTIALS) if (body[k] !== null && body[k] !== undefined) fields[`client ${k}`] = body[k];
  // A stream and a JSON answer are different bytes: they are cached apart.
  fields.stream = body.stream === true;
  return createHash("sha256")
    .update(JSON.stringify([endpoint, group, namespace ?? "", canonical(fields)]))
    .digest("hex");
}
