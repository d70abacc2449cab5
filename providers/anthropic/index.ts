/**
 * The Anthropic provider (`anthropic/<model>`): OpenAI chat requests translated to the Messages API.
 *
 * Reusable by any other host of the Messages API (Claude on Vertex AI: model in the URL, OAuth
 * bearer, `anthropic_version` in the body) — the transforms are pure and take no URL or key:
 *   anthropicMessagesBody(req, model | undefined) → Messages body object (chat-request.ts)
 *   anthropicChatResponse(json) → {body: chat.completion, usage}               (chat-response.ts)
 *   anthropicChatStream — StreamTransform for Anthropic's SSE events            (chat-stream.ts)
 *   anthropicChatEndpoint(buildCall) → EndpointAdapter<"chat"> from the three above
 *   anthropicErrorMessage, anthropicErrorKind — error bodies                    (errors.ts)
 *   anthropicCountTokensBody(req, model | undefined), anthropicCountTokensResponse (count-tokens.ts)
 *   usageFromAnthropic (usage.ts), finishReason (finish-reason.ts)
 *   ANTHROPIC_CHAT_PARAMS, DEFAULT_MAX_TOKENS, JSON_TOOL_NAME, ANTHROPIC_VERSION
 */
import type { ChatRequest, Deployment, EndpointAdapter, HttpCall, ProviderAdapter, WireJson } from "../../core/contract.ts";
import { ANTHROPIC_CHAT_PARAMS, anthropicMessagesBody } from "./chat-request.ts";
import { anthropicChatResponse } from "./chat-response.ts";
import { type AnthropicStreamState, anthropicChatStream } from "./chat-stream.ts";
import { anthropicCountTokensBody, anthropicCountTokensResponse } from "./count-tokens.ts";
import { anthropicErrorKind, anthropicErrorMessage } from "./errors.ts";
import { anthropicRateLimitHeaders } from "./rate-limits.ts";

export { ANTHROPIC_CHAT_PARAMS, DEFAULT_MAX_TOKENS, anthropicMessagesBody } from "./chat-request.ts";
export { JSON_RESPONSE_TOOL as JSON_TOOL_NAME } from "../shared/json-response-tool.ts";
export { anthropicChatResponse } from "./chat-response.ts";
export { type AnthropicStreamState, anthropicChatStream } from "./chat-stream.ts";
export { anthropicCountTokensBody, anthropicCountTokensResponse } from "./count-tokens.ts";
export { anthropicErrorKind, anthropicErrorMessage } from "./errors.ts";
export { finishReason } from "./finish-reason.ts";
export { usageFromAnthropic } from "./usage.ts";

export const ANTHROPIC_API_BASE = "https://api.anthropic.com";
/** The `anthropic-version` header; `svc_params.api_version` overrides it. */
export const ANTHROPIC_VERSION = "2023-06-01";

/** A chat endpoint over the Messages API; `buildCall` decides where the body goes and how it is authenticated. */
export function anthropicChatEndpoint(buildCall: (req: ChatRequest, d: Deployment) => HttpCall): EndpointAdapter<"chat", AnthropicStreamState> {
  return {
    request: (req, d) => buildCall(req, d),
    response: anthropicChatResponse,
    stream: anthropicChatStream,
    supportedParams: ANTHROPIC_CHAT_PARAMS,
  };
}

function anthropicCall(d: Deployment, path: string, body: WireJson): HttpCall {
  const headers: Record<string, string> = {
    "content-type": "application/json",
    "anthropic-version": d.apiVersion ?? ANTHROPIC_VERSION,
  };
  if (d.apiKey) headers["x-api-key"] = d.apiKey;
  // Operator headers last: `anthropic-beta` flags, or a proxy's own auth.
  Object.assign(headers, d.headers);
  return { url: `${d.apiBase}${path}`, method: "POST", headers, body: JSON.stringify(body) };
}

/** `https://api.anthropic.com`, `…/v1` and `…/v1/messages` (LiteLLM's form) all name the same base. */
function normalizeBase(base: string): string {
  return base.replace(/\/+$/, "").replace(/\/v1(\/messages)?$/, "");
}

export const anthropicProvider: ProviderAdapter = {
  ids: ["anthropic"],
  endpoints: {
    chat: anthropicChatEndpoint((req, d) => anthropicCall(d, "/v1/messages", anthropicMessagesBody(req, d.upstreamModel))) as EndpointAdapter<"chat", unknown>,
  },
  resolve: (d) => ({
    ...d,
    apiBase: normalizeBase(d.apiBase ?? ANTHROPIC_API_BASE),
    apiKey: d.apiKey ?? process.env.ANTHROPIC_API_KEY,
  }),
  errorMessage: anthropicErrorMessage,
  errorKind: anthropicErrorKind,
  rateLimitHeaders: anthropicRateLimitHeaders,
  countTokens: {
    request: (req, d) => anthropicCall(d, "/v1/messages/count_tokens", anthropicCountTokensBody(req, d.upstreamModel)),
    response: anthropicCountTokensResponse,
  },
};
