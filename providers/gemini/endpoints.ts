/**
 * The Gemini endpoint adapters, for any host that serves Google's model methods: AI Studio and
 * Vertex AI differ only in the URL of a model's method and in how a call is authenticated.
 */
import type { Deployment, EndpointAdapter, HttpCall, TokenCountAdapter, WireJson } from "../../core/contract.ts";
import { generateContentBody, GEMINI_CHAT_PARAMS } from "./request.ts";
import { chatCompletionFrom } from "./response.ts";
import { type GeminiStreamState, geminiStream } from "./stream.ts";
import type { GenerateContentRequest } from "./wire.ts";

export interface GoogleModelApi {
  /** The URL of one of the deployment's model methods (`generateContent`, `streamGenerateContent?alt=sse`, …). */
  url(d: Deployment, method: string): string;
  /** Credentials sent with every call (AI Studio's API key); Vertex adds its token in `authorize`. */
  auth(d: Deployment): Record<string, string>;
}

export function googleCall(api: GoogleModelApi, d: Deployment, method: string, body: unknown): HttpCall {
  return {
    url: api.url(d, method),
    method: "POST",
    headers: { "content-type": "application/json", ...d.headers, ...api.auth(d) },
    body: JSON.stringify(body),
  };
}

export function geminiChat(api: GoogleModelApi): EndpointAdapter<"chat", GeminiStreamState> {
  return {
    request: (req, d) => googleCall(api, d, req.stream ? "streamGenerateContent?alt=sse" : "generateContent", generateContentBody(req, d)),
    response: (body, req) => chatCompletionFrom(body, req?.model),
    stream: geminiStream(),
    supportedParams: GEMINI_CHAT_PARAMS,
  };
}

/**
 * `countTokens` for a chat request. The two APIs take the prompt differently: AI Studio only
 * counts a system instruction and tools inside a whole `generateContentRequest`, Vertex takes
 * them at the top level; `shape` builds the body from the translated request.
 */
export function geminiCountTokens(api: GoogleModelApi, shape: (body: GenerateContentRequest, d: Deployment) => WireJson): TokenCountAdapter {
  return {
    request: (req, d) => googleCall(api, d, "countTokens", shape(generateContentBody(req, d), d)),
    response(body) {
      const total = (body as { totalTokens?: unknown } | null)?.totalTokens;
      // Google omits zero-valued fields: an empty prompt comes back as `{}`.
      if (total === undefined && body !== null && typeof body === "object") return 0;
      if (typeof total !== "number") throw new Error("expected totalTokens in the countTokens response");
      return total;
    },
  };
}
