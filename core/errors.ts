import type { BudgetRefusalDetail, ErrorInfo } from "./contract.ts";

/** OpenAI-style `type` for each status the gateway answers with. */
const TYPE_BY_STATUS: Record<number, string> = {
  400: "invalid_request_error",
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  408: "timeout_error",
  413: "invalid_request_error",
  422: "validation_error",
  429: "rate_limit_error",
  500: "internal_server_error",
  503: "api_connection_error",
};

export function errorInfo(status: number, message: string, type?: string, param?: string | null): ErrorInfo {
  return { status, message, type: type ?? TYPE_BY_STATUS[status] ?? "api_error", param: param ?? null };
}

/** Thrown anywhere on the request path; the HTTP layer turns it into the spec's envelope. */
export class GatewayError extends Error {
  readonly info: ErrorInfo;
  readonly headers: Record<string, string>;
  /** The upstream's own status when it answered with an error (`info.status` is the mapped one). */
  readonly upstreamStatus: number | undefined;
  constructor(info: ErrorInfo, headers: Record<string, string> = {}, upstreamStatus?: number) {
    super(info.message);
    this.info = info;
    this.headers = headers;
    this.upstreamStatus = upstreamStatus;
  }
  static of(status: number, message: string, type?: string, param?: string | null): GatewayError {
    return new GatewayError(errorInfo(status, message, type, param));
  }
}

/**
 * Thrown by an adapter's `response` when a successful (2xx) answer is an upstream error all the
 * same (an OpenAI-shaped `{"error": …}` body with no answer in it): the call fails as an HTTP
 * answer of `status` with this `body` would have, so the router retries or falls back, and nothing
 * is charged.
 */
export class ErrorInAnswer extends Error {
  readonly status: number;
  readonly body: string;
  constructor(status: number, body: string) {
    super(`an error answered as a success (status ${status})`);
    this.status = status;
    this.body = body;
  }
}

/**
 * A request body over the gateway's limit. Its connection is closed with the answer: the rest of
 * the body is never read, and a kept-alive connection would otherwise wait for it.
 */
export function bodyTooLarge(limit: number): GatewayError {
  const size = limit % (1024 * 1024) === 0 ? `${limit / 1024 / 1024} MiB` : `${limit} bytes`;
  return new GatewayError(errorInfo(413, `Request body is larger than the gateway takes (${size}).`, "invalid_request_error"), { connection: "close" });
}

/**
 * Thrown by a provider's `authorize` when its token service rejects the configured credentials
 * (a wrong secret, an unknown service account), as opposed to not answering: the call then fails
 * with 401, as when the provider itself refuses the gateway's key.
 */
export class CredentialsRefused extends Error {}

export function errorBody(info: ErrorInfo): { error: { message: string; type: string; param: string | null; code: string; budget?: BudgetRefusalDetail } } {
  const error = { message: info.message, type: info.type, param: info.param ?? null, code: String(info.status) };
  return { error: info.budget ? { ...error, budget: info.budget } : error };
}

export function errorResponse(info: ErrorInfo, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(errorBody(info)), {
    status: info.status,
    headers: { "content-type": "application/json", ...headers },
  });
}
