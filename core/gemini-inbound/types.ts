/**
 * The Gemini API's wire shapes (generativelanguage v1beta), as far as the gateway reads or writes
 * them. Requests may spell fields in lowerCamelCase or snake_case (both are valid proto JSON):
 * read them through `field`.
 */

export type Json = Record<string, unknown>;

export const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** `mimeType` or `mime_type`: proto JSON accepts either spelling of a field. */
export function field(o: Json, camel: string): unknown {
  const v = o[camel];
  if (v !== undefined) return v;
  return o[camel.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)];
}

export interface GeminiFunctionCall {
  id?: string;
  name: string;
  args: Json;
}

export interface GeminiPart {
  text?: string;
  thought?: boolean;
  functionCall?: GeminiFunctionCall;
}

export interface GeminiCandidate {
  content: { parts: GeminiPart[]; role: "model" };
  finishReason?: string;
  index: number;
}

export interface GeminiUsage {
  promptTokenCount: number;
  candidatesTokenCount: number;
  totalTokenCount: number;
  cachedContentTokenCount?: number;
  thoughtsTokenCount?: number;
}

export interface GeminiResponse {
  candidates: GeminiCandidate[];
  usageMetadata?: GeminiUsage;
  modelVersion?: string;
  responseId?: string;
}

/** How the answer is rendered back: thought parts only when the request's thinkingConfig asked for them. */
export interface RenderOptions {
  includeThoughts: boolean;
}
