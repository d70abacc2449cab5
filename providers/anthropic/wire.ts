/**
 * The Anthropic Messages API shapes the adapter reads and writes (https://docs.anthropic.com/en/api/messages).
 * Only the members the translation touches are typed; everything else passes through as JSON.
 */

export type CacheControl = Record<string, unknown>;

export interface TextBlock {
  type: "text";
  text: string;
  cache_control?: CacheControl;
}

export type MediaSource =
  | { type: "base64"; media_type: string; data: string }
  | { type: "url"; url: string };

export interface ImageBlock {
  type: "image";
  source: MediaSource;
  cache_control?: CacheControl;
}

export interface DocumentBlock {
  type: "document";
  source: MediaSource;
  title?: string;
  cache_control?: CacheControl;
}

export interface ToolUseBlock {
  type: "tool_use";
  id: string;
  name: string;
  input: unknown;
  cache_control?: CacheControl;
}

export interface ToolResultBlock {
  type: "tool_result";
  tool_use_id: string;
  content: string | ContentBlock[];
  is_error?: boolean;
  cache_control?: CacheControl;
}

export interface ThinkingBlock {
  type: "thinking";
  thinking: string;
  signature: string;
}

export interface RedactedThinkingBlock {
  type: "redacted_thinking";
  data: string;
}

/** A block the adapter does not know (a client sending Anthropic-native blocks): forwarded as is. */
export interface OtherBlock {
  type: string;
  [key: string]: unknown;
}

export type ContentBlock =
  | TextBlock
  | ImageBlock
  | DocumentBlock
  | ToolUseBlock
  | ToolResultBlock
  | ThinkingBlock
  | RedactedThinkingBlock
  | OtherBlock;

export interface AnthropicMessage {
  role: "user" | "assistant";
  content: string | ContentBlock[];
}

export interface AnthropicTool {
  name: string;
  description?: string;
  input_schema: unknown;
  cache_control?: CacheControl;
}

export type AnthropicToolChoice =
  | { type: "auto" | "any"; disable_parallel_tool_use?: boolean }
  | { type: "tool"; name: string; disable_parallel_tool_use?: boolean }
  | { type: "none" };

export interface AnthropicUsage {
  input_tokens?: number | null;
  output_tokens?: number | null;
  cache_creation_input_tokens?: number | null;
  cache_read_input_tokens?: number | null;
  /** The cache writes by lifetime (5 minutes, the default, or 1 hour, priced higher). */
  cache_creation?: { ephemeral_5m_input_tokens?: number | null; ephemeral_1h_input_tokens?: number | null } | null;
  /** Server tools the model used (the web search tool, priced per search). */
  server_tool_use?: { web_search_requests?: number | null } | null;
}

/** A non-streamed Messages API answer. */
export interface AnthropicResponse {
  id: string;
  type: "message";
  role: "assistant";
  model: string;
  content: ContentBlock[];
  stop_reason: string | null;
  stop_sequence: string | null;
  usage: AnthropicUsage;
}

/** `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`: HTTP error bodies and stream `error` events. */
export interface AnthropicErrorBody {
  type: "error";
  error: { type: string; message: string };
}
