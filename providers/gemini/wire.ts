/**
 * The parts of Google's Generative Language / Vertex AI wire format the gateway reads and writes
 * (`GenerateContentRequest`, `GenerateContentResponse`, embeddings, token counts). Both APIs use the
 * same JSON (camelCase) field names.
 */

export interface GeminiPart {
  text?: string;
  /** Marks a text part as the model's thinking (a thought summary), not its answer. */
  thought?: boolean;
  /** Opaque signature of the model's thinking, to be sent back with the part it came with. */
  thoughtSignature?: string;
  inlineData?: { mimeType: string; data: string };
  fileData?: { mimeType?: string; fileUri: string };
  functionCall?: { name: string; args?: Record<string, unknown>; id?: string };
  functionResponse?: { name: string; response: Record<string, unknown>; id?: string };
}

export interface GeminiContent {
  role?: "user" | "model";
  parts: GeminiPart[];
}

export interface GeminiFunctionDeclaration {
  name: string;
  description?: string;
  parameters?: Record<string, unknown>;
}

/** A tool: function declarations, or a built-in tool object (`googleSearch`, `codeExecution`, …) passed as given. */
export type GeminiTool = { functionDeclarations: GeminiFunctionDeclaration[] } | Record<string, unknown>;

export interface GeminiToolConfig {
  functionCallingConfig: { mode: "AUTO" | "ANY" | "NONE"; allowedFunctionNames?: string[] };
}

export interface GeminiGenerationConfig {
  temperature?: number;
  topP?: number;
  topK?: number;
  maxOutputTokens?: number;
  stopSequences?: string[];
  candidateCount?: number;
  seed?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  responseMimeType?: string;
  responseSchema?: Record<string, unknown>;
  thinkingConfig?: { includeThoughts?: boolean; thinkingBudget?: number };
}

export interface GenerateContentRequest {
  contents: GeminiContent[];
  systemInstruction?: GeminiContent;
  tools?: GeminiTool[];
  toolConfig?: GeminiToolConfig;
  generationConfig?: GeminiGenerationConfig;
  safetySettings?: unknown[];
}

export interface GeminiCandidate {
  content?: { role?: string; parts?: GeminiPart[] };
  finishReason?: string;
  index?: number;
  /** Grounding with Google Search: the queries the model searched. */
  groundingMetadata?: { webSearchQueries?: unknown[] };
}

export interface GeminiUsageMetadata {
  promptTokenCount?: number;
  candidatesTokenCount?: number;
  totalTokenCount?: number;
  cachedContentTokenCount?: number;
  thoughtsTokenCount?: number;
  toolUsePromptTokenCount?: number;
  /** The prompt's tokens by modality (TEXT, AUDIO, IMAGE, VIDEO), cached ones included. */
  promptTokensDetails?: GeminiModalityCount[];
  /** The cached tokens by modality. */
  cacheTokensDetails?: GeminiModalityCount[];
}

export interface GeminiModalityCount {
  modality?: string;
  tokenCount?: number;
}

export interface GenerateContentResponse {
  candidates?: GeminiCandidate[];
  promptFeedback?: { blockReason?: string; blockReasonMessage?: string };
  usageMetadata?: GeminiUsageMetadata;
  modelVersion?: string;
  responseId?: string;
}

/** Google's error body, on both APIs (Vertex sometimes wraps it in a one-element array). */
export interface GoogleErrorBody {
  error?: { code?: number; message?: string; status?: string };
}
