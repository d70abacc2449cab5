/**
 * The tool that stands in for `response_format` json_object / json_schema on providers without a
 * JSON mode (Anthropic, Bedrock Converse), named as LiteLLM names it: its input is the answer.
 */
import type { ChatRequest } from "../../core/contract.ts";

export const JSON_RESPONSE_TOOL = "json_tool_call";

/** Whether the request's response_format asks for JSON (json_object or json_schema), carried by that tool. */
export function wantsJsonResponse(req: Pick<ChatRequest, "response_format">): boolean {
  const format = req.response_format as { type?: unknown } | null | undefined;
  return typeof format === "object" && format !== null && (format.type === "json_object" || format.type === "json_schema");
}
