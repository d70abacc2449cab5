/**
 * Anthropic's error body `{"type":"error","error":{"type":"…","message":"…"}}` → the message shown
 * to the client, and the kind of failure the router acts on. The same body arrives as an `error`
 * event inside a stream that had already started.
 */
import type { ErrorInfo, UpstreamErrorKind } from "../../core/contract.ts";
import { upstreamErrorKind } from "../shared/error-kind.ts";

/** Anthropic error type → the status and type the gateway reports for it mid-stream (HTTP errors use the status). */
const STREAM_ERRORS: Record<string, { status: number; type: string }> = {
  invalid_request_error: { status: 400, type: "invalid_request_error" },
  authentication_error: { status: 401, type: "authentication_error" },
  permission_error: { status: 403, type: "permission_error" },
  not_found_error: { status: 404, type: "not_found_error" },
  request_too_large: { status: 413, type: "invalid_request_error" },
  rate_limit_error: { status: 429, type: "rate_limit_error" },
  api_error: { status: 500, type: "internal_server_error" },
  timeout_error: { status: 408, type: "timeout_error" },
  // Anthropic's 529: the service is overloaded, try again later.
  overloaded_error: { status: 503, type: "service_unavailable" },
};

export function streamErrorInfo(type: string | undefined, message: string | undefined): ErrorInfo {
  const known = (type && STREAM_ERRORS[type]) || { status: 500, type: "api_error" };
  return { status: known.status, type: known.type, message: `anthropic stream error: ${type ?? "error"}: ${message ?? "no message"}` };
}

export function anthropicErrorMessage(_status: number, body: string): string {
  try {
    const parsed = JSON.parse(body) as { error?: { type?: unknown; message?: unknown }; message?: unknown };
    const e = parsed.error;
    if (e && typeof e.message === "string") return typeof e.type === "string" ? `${e.type}: ${e.message}` : e.message;
    if (typeof parsed.message === "string") return parsed.message;
  } catch {
    // not JSON (a proxy's HTML page): the raw text below
  }
  return body.slice(0, 500);
}

/** "prompt is too long: 208310 tokens > 200000 maximum" and friends (see providers/shared/error-kind.ts). */
export function anthropicErrorKind(status: number, body: string): UpstreamErrorKind | undefined {
  return upstreamErrorKind(status, body);
}
