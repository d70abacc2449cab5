/** Errors on the Gemini-style routes, in Google's shape: `{"error": {"code", "message", "status"}}`. */
import type { ErrorInfo } from "../contract.ts";

/** HTTP status → google.rpc.Code name, as Google's APIs pair them. */
const STATUS_NAMES: Record<number, string> = {
  400: "INVALID_ARGUMENT",
  401: "UNAUTHENTICATED",
  403: "PERMISSION_DENIED",
  404: "NOT_FOUND",
  408: "DEADLINE_EXCEEDED",
  409: "ABORTED",
  413: "INVALID_ARGUMENT",
  422: "INVALID_ARGUMENT",
  429: "RESOURCE_EXHAUSTED",
  499: "CANCELLED",
  500: "INTERNAL",
  501: "UNIMPLEMENTED",
  503: "UNAVAILABLE",
  504: "DEADLINE_EXCEEDED",
};

export function googleStatus(code: number): string {
  return STATUS_NAMES[code] ?? (code >= 500 ? "INTERNAL" : code >= 400 ? "FAILED_PRECONDITION" : "UNKNOWN");
}

/**
 * The HTTP status Google answers with: INVALID_ARGUMENT is always a 400 on Google's APIs, so the
 * gateway's 422 (a request field out of its range or of the wrong type) is one too.
 */
const googleCode = (status: number) => (status === 422 ? 400 : status);

export function googleErrorBody(status: number, message: string): { error: { code: number; message: string; status: string } } {
  return { error: { code: googleCode(status), message, status: googleStatus(status) } };
}

export function googleErrorResponse(info: ErrorInfo, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(googleErrorBody(info.status, info.message)), {
    status: googleCode(info.status),
    headers: { ...headers, "content-type": "application/json; charset=UTF-8" },
  });
}
