/**
 * Claude on Vertex AI (`vertex_ai/claude-…`): the Anthropic provider's transforms, sent to the
 * `anthropic` publisher's `rawPredict` / `streamRawPredict` methods. The body is a Messages API
 * body with Vertex's `anthropic_version` and without `model` (the URL names it).
 */
import type { ChatRequest, Deployment, HttpCall, TokenCountAdapter } from "../../core/contract.ts";
import { anthropicChatEndpoint, anthropicCountTokensBody, anthropicCountTokensResponse, anthropicMessagesBody } from "../anthropic/index.ts";
import { publisherModelUrl } from "./location.ts";

export const VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16";

export const isClaude = (d: Deployment): boolean => /^claude/i.test(d.upstreamModel);

/** An Anthropic Messages response (Claude answers `{"type": "message", …}`; Gemini never has `type`). */
export const isAnthropicMessage = (body: unknown): boolean => (body as { type?: unknown } | null)?.type === "message";

function call(url: string, d: Deployment, body: unknown): HttpCall {
  return { url, method: "POST", headers: { "content-type": "application/json", ...d.headers }, body: JSON.stringify(body) };
}

export const claudeChat = anthropicChatEndpoint((req: ChatRequest, d: Deployment) =>
  call(publisherModelUrl(d, "anthropic", d.upstreamModel, req.stream ? "streamRawPredict" : "rawPredict"), d, {
    anthropic_version: VERTEX_ANTHROPIC_VERSION,
    ...anthropicMessagesBody(req, undefined),
  }),
);

/** Vertex counts Claude tokens at a pseudo-model, `count-tokens`, with the real model named in the body. */
export const claudeCountTokens: TokenCountAdapter = {
  request: (req, d) => call(publisherModelUrl(d, "anthropic", "count-tokens", "rawPredict"), d, anthropicCountTokensBody(req, d.upstreamModel)),
  response: anthropicCountTokensResponse,
};
