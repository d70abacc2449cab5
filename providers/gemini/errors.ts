/** Google's error answers (AI Studio and Vertex AI alike) → the client's message and the router's error kinds. */
import type { UpstreamErrorKind } from "../../core/contract.ts";
import { upstreamErrorKind } from "../shared/error-kind.ts";
import type { GoogleErrorBody } from "./wire.ts";

/** `{"error": {"code", "message", "status"}}` (Vertex sometimes wraps it in an array) → its message. */
export function googleErrorMessage(_status: number, body: string): string {
  try {
    const parsed: unknown = JSON.parse(body);
    const e = (Array.isArray(parsed) ? parsed[0] : parsed) as GoogleErrorBody | null;
    const message = e?.error?.message;
    if (typeof message === "string" && message !== "") return message;
  } catch {
    // not JSON (a proxy's HTML page): fall through to the raw text
  }
  return body.slice(0, 500);
}

/**
 * Google states a prompt over the context window as "The input token count (N) exceeds the
 * maximum number of tokens allowed (M)" and a refused prompt in its safety wording; both are
 * among the shared patterns, read from the message only (not the JSON around it).
 */
export function googleErrorKind(status: number, body: string): UpstreamErrorKind | undefined {
  return upstreamErrorKind(status, googleErrorMessage(status, body));
}
