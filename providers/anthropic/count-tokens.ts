/**
 * Anthropic's own token counter, `POST /v1/messages/count_tokens`: the prompt part of a Messages
 * body in, `{"input_tokens": N}` out. It refuses generation fields (max_tokens, temperature, …).
 */
import type { ChatRequest, WireJson } from "../../core/contract.ts";
import { anthropicMessagesBody } from "./chat-request.ts";

const COUNTED_FIELDS = ["model", "system", "messages", "tools", "tool_choice", "thinking"] as const;

export function anthropicCountTokensBody(req: ChatRequest, model: string | undefined): WireJson {
  const full = anthropicMessagesBody({ ...req, stream: false }, model);
  const body: WireJson = {};
  for (const k of COUNTED_FIELDS) if (full[k] !== undefined) body[k] = full[k];
  return body;
}

export function anthropicCountTokensResponse(body: unknown): number {
  const n = (body as { input_tokens?: unknown } | null)?.input_tokens;
  if (typeof n !== "number" || !Number.isFinite(n)) throw new Error("expected {input_tokens} from count_tokens");
  return n;
}
