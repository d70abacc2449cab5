/**
 * The fields of a `GenerateContentRequest` the gateway reads, checked for their types as Google
 * checks them, so a wrong type is a 400 naming the field (Google's wording: `Invalid value at
 * 'generation_config.temperature' (TYPE_FLOAT), "hot"`) instead of a field silently left out or a
 * request the upstream refuses. Fields the gateway does not read are not looked at (newer SDKs
 * send fields this table does not know).
 */
import { GatewayError } from "../errors.ts";
import { field, isObject, type Json } from "./types.ts";

type Scalar = "string" | "number" | "integer" | "boolean" | "struct" | "any";
/** A field's type: a scalar, a message (its own table), or a list of either. */
type FieldType = Scalar | Message | { list: Scalar | Message };

interface Message {
  name: string;
  fields: Record<string, FieldType>;
  /** Value checks beyond the types (names, ranges): the problem, or undefined. */
  rules?: (m: Json, at: string) => string | undefined;
}

const PROTO_TYPES: Record<Scalar, string> = {
  string: "TYPE_STRING",
  number: "TYPE_FLOAT",
  integer: "TYPE_INT32",
  boolean: "TYPE_BOOL",
  struct: "type.googleapis.com/google.protobuf.Struct",
  any: "",
};

const SCALAR_OK: Record<Scalar, (v: unknown) => boolean> = {
  string: (v) => typeof v === "string",
  number: (v) => typeof v === "number" && Number.isFinite(v),
  // Google's integers are 32-bit: a larger one is refused, not passed on to an upstream that refuses it.
  integer: (v) => Number.isInteger(v) && (v as number) >= -(2 ** 31) && (v as number) < 2 ** 31,
  boolean: (v) => typeof v === "boolean",
  struct: isObject,
  any: () => true,
};

const nonEmpty = (v: unknown) => typeof v === "string" && v !== "";

/** `a.b[0].c`: Google names fields in snake_case in its messages. */
const snake = (s: string) => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

function between(m: Json, name: string, min: number, max: number, at: string): string | undefined {
  const v = field(m, name);
  if (typeof v === "number" && (v < min || v > max)) return `* GenerateContentRequest.${at}.${snake(name)}: must be between ${min} and ${max}, got ${v}.`;
  return undefined;
}

function atLeastOne(m: Json, name: string, at: string): string | undefined {
  const v = field(m, name);
  if (typeof v === "number" && v < 1) return `* GenerateContentRequest.${at}.${snake(name)}: must be positive, got ${v}.`;
  return undefined;
}

const BLOB: Message = {
  name: "Blob",
  fields: { mimeType: "string", data: "string" },
  rules: (m, at) => (nonEmpty(field(m, "mimeType")) && nonEmpty(m.data) ? undefined : `* GenerateContentRequest.${at}: mime_type and data are required.`),
};

const FILE_DATA: Message = {
  name: "FileData",
  fields: { mimeType: "string", fileUri: "string" },
  rules: (m, at) => (nonEmpty(field(m, "fileUri")) ? undefined : `* GenerateContentRequest.${at}.file_uri: file_uri is required.`),
};

const named = (m: Json, at: string) => (nonEmpty(m.name) ? undefined : `* GenerateContentRequest.${at}.name: Name cannot be empty.`);

const PART: Message = {
  name: "Part",
  fields: {
    text: "string",
    thought: "boolean",
    thoughtSignature: "string",
    inlineData: BLOB,
    fileData: FILE_DATA,
    functionCall: { name: "FunctionCall", fields: { id: "string", name: "string", args: "struct" }, rules: named },
    functionResponse: { name: "FunctionResponse", fields: { id: "string", name: "string", response: "struct" }, rules: named },
  },
};

const CONTENT: Message = {
  name: "Content",
  fields: { role: "string", parts: { list: PART } },
  rules: (m, at) => (Array.isArray(m.parts) && m.parts.length > 0 ? undefined : `* GenerateContentRequest.${at}.parts: contents.parts must not be empty.`),
};

const SCHEMA: FieldType = "struct";

/** A proto enum's value (case aside, as the tool mode is read), or Google's message naming the field. */
function enumValue(m: Json, name: string, values: readonly string[], enumType: string, at: string): string | undefined {
  const v = field(m, name);
  if (v === undefined || v === null || values.includes(String(v).toUpperCase())) return undefined;
  return `Invalid value at '${at}.${snake(name)}' (type.googleapis.com/google.ai.generativelanguage.v1beta.${enumType}), ${JSON.stringify(v)}`;
}

const THINKING_LEVELS = ["THINKING_LEVEL_UNSPECIFIED", "MINIMAL", "LOW", "MEDIUM", "HIGH"];

const GENERATION_CONFIG: Message = {
  name: "GenerationConfig",
  fields: {
    stopSequences: { list: "string" },
    responseMimeType: "string",
    responseSchema: SCHEMA,
    responseJsonSchema: "any",
    candidateCount: "integer",
    maxOutputTokens: "integer",
    temperature: "number",
    topP: "number",
    topK: "integer",
    seed: "integer",
    presencePenalty: "number",
    frequencyPenalty: "number",
    thinkingConfig: {
      name: "ThinkingConfig",
      fields: { includeThoughts: "boolean", thinkingBudget: "integer", thinkingLevel: "string" },
      rules: (m, at) => enumValue(m, "thinkingLevel", THINKING_LEVELS, "ThinkingConfig.ThinkingLevel", at),
    },
    responseModalities: { list: "string" },
  },
  rules: (m, at) =>
    between(m, "temperature", 0, 2, at) ?? between(m, "topP", 0, 1, at) ?? atLeastOne(m, "candidateCount", at) ?? atLeastOne(m, "maxOutputTokens", at),
};

const TOOL: Message = {
  name: "Tool",
  fields: {
    functionDeclarations: { list: { name: "FunctionDeclaration", fields: { name: "string", description: "string", parameters: SCHEMA, parametersJsonSchema: "any" }, rules: named } },
  },
};

const MODES = ["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"];

const TOOL_CONFIG: Message = {
  name: "ToolConfig",
  fields: {
    functionCallingConfig: {
      name: "FunctionCallingConfig",
      fields: { mode: "string", allowedFunctionNames: { list: "string" } },
      rules: (m, at) => enumValue(m, "mode", MODES, "FunctionCallingConfig.Mode", at),
    },
  },
};

const REQUEST: Message = {
  name: "GenerateContentRequest",
  fields: {
    contents: { list: CONTENT },
    // A plain string is taken as the instruction's text too.
    systemInstruction: "any",
    tools: { list: TOOL },
    toolConfig: TOOL_CONFIG,
    generationConfig: GENERATION_CONFIG,
    safetySettings: { list: { name: "SafetySetting", fields: { category: "string", threshold: "string" } } },
    cachedContent: "string",
  },
  rules: (m) => {
    const system = field(m, "systemInstruction");
    if (system === undefined || system === null || typeof system === "string") return undefined;
    return checkValue(system, CONTENT, "system_instruction");
  },
};

function typeName(t: Scalar | Message): string {
  return typeof t === "string" ? PROTO_TYPES[t] : `type.googleapis.com/google.ai.generativelanguage.v1beta.${t.name}`;
}

const invalidValue = (at: string, t: Scalar | Message, v: unknown) => `Invalid value at '${at}' (${typeName(t)}), ${JSON.stringify(v) ?? String(v)}`;

function checkValue(v: unknown, t: FieldType, at: string): string | undefined {
  if (typeof t === "object" && "list" in t) {
    if (!Array.isArray(v)) return invalidValue(at, t.list, v);
    for (const [i, item] of v.entries()) {
      const e = checkValue(item, t.list, `${at}[${i}]`);
      if (e) return e;
    }
    return undefined;
  }
  if (typeof t === "string") return SCALAR_OK[t](v) ? undefined : invalidValue(at, t, v);
  if (!isObject(v)) return invalidValue(at, t, v);
  for (const [name, ft] of Object.entries(t.fields)) {
    const fv = field(v, name);
    // null is proto JSON's "not set".
    if (fv === undefined || fv === null) continue;
    const e = checkValue(fv, ft, at === "" ? snake(name) : `${at}.${snake(name)}`);
    if (e) return e;
  }
  return t.rules?.(v, at);
}

/** Throws a 400 naming the first field of a wrong type or value. */
export function checkGenerateContentRequest(body: Json): void {
  const problem = checkValue(body, REQUEST, "");
  if (problem) throw GatewayError.of(400, problem, "invalid_request_error", snake(problem.match(/'([a-z_]+)/)?.[1] ?? "contents"));
}
