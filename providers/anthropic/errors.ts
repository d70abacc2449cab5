/**
 * Anthropic's error body `{"type":"error","error":{"type":"…","message":"…"}}` → the message shown
 * to the client, and the kind of failure the router acts on. The same body arrives as an `error`
 * event inside a stream that had already started.
 */
import type { ErrorInfo, UpstreamErrorKind } from "../../core/contract.ts";
import { errorInfo } from "../../core/errors.ts";
import { mapUpstreamStatus } from "../../core/pipeline/upstream.ts";
import { upstreamErrorKind } from "../shared/error-kind.ts";

/**
 * Anthropic error type → the HTTP status Anthropic answers it with. An error event is mapped as
 * that HTTP answer would be (status and type), so a stream's overload is the 529's 503.
 */
const HTTP_STATUS: Record<string, number> = {
  invalid_request_error: 400,
  authentication_error: 401,
  permission_error: 403,
  not_found_error: 404,
  request_too_large: 413,
  rate_limit_error: 429,
  api_error: 500,
  timeout_error: 408,
  overloaded_error: 529,
};

export function streamErrorInfo(type: string | undefined, message: string | undefined): ErrorInfo {
  const status = mapUpstreamStatus((type && HTTP_STATUS[type]) || 500);
  return errorInfo(status, `anthropic stream error: ${type ?? "error"}: ${message ?? "no message"}`);
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
