/** Gemini's `CountTokensResponse` from a token count of the translated request. */
import type { ChatRequest } from "../contract.ts";
import type { TokenCount } from "../tokens/count.ts";

export interface GeminiCountTokens {
  totalTokens: number;
  totalBillableCharacters: number;
  promptTokensDetails: { modality: string; tokenCount: number }[];
}

/** Characters Google bills for: those of the text, whitespace excluded. */
export function billableCharacters(messages: readonly ChatRequest["messages"][number][]): number {
  let n = 0;
  const add = (text: string) => {
    n += text.replace(/\s+/g, "").length;
  };
  for (const m of messages) {
    if (typeof m.content === "string") add(m.content);
    else if (Array.isArray(m.content)) for (const p of m.content as { text?: unknown }[]) if (typeof p.text === "string") add(p.text);
  }
  return n;
}

export function countTokensResponse(count: TokenCount, messages: readonly ChatRequest["messages"][number][]): GeminiCountTokens {
  const details = [{ modality: "TEXT", tokenCount: count.total - count.image }];
  if (count.image > 0) details.push({ modality: "IMAGE", tokenCount: count.image });
  return { totalTokens: count.total, totalBillableCharacters: billableCharacters(messages), promptTokensDetails: details };
}
