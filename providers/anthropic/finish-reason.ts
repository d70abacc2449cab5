/** Anthropic `stop_reason` → OpenAI `finish_reason`. */
const FINISH_REASON: Record<string, string> = {
  end_turn: "stop",
  stop_sequence: "stop",
  pause_turn: "stop",
  max_tokens: "length",
  model_context_window_exceeded: "length",
  tool_use: "tool_calls",
  refusal: "content_filter",
};

/** `onlyJsonTool`: the only tool called was the `response_format` one, whose input is the answer itself. */
export function finishReason(stopReason: string | null | undefined, onlyJsonTool: boolean): string {
  if (stopReason === "tool_use" && onlyJsonTool) return "stop";
  return (stopReason && FINISH_REASON[stopReason]) || "stop";
}
