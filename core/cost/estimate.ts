/**
 * A prompt-size bound for reservations, before the upstream has counted anything. It errs high on
 * purpose: a budget reservation below the real cost could let concurrent calls overspend. Three
 * characters per token is above what common tokenizers produce for prose and code (about four
 * for OpenAI's, about 3.5 for Claude's), plus the per-message framing chat formats add.
 */
import type { Endpoint, WireRequest } from "../contract.ts";

const CHARS_PER_TOKEN = 3;
const TOKENS_PER_MESSAGE = 4;
const TOKENS_PER_REPLY = 3;
/** An image in a prompt: the largest tile count OpenAI bills for a high-detail image is about this. */
const TOKENS_PER_IMAGE = 1600;

function size(v: unknown): { chars: number; images: number } {
  if (typeof v === "string") return { chars: v.length, images: 0 };
  if (Array.isArray(v)) {
    let chars = 0;
    let images = 0;
    for (const item of v) {
      const s = size(item);
      chars += s.chars;
      images += s.images;
    }
    return { chars, images };
  }
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    if (o.type === "image_url" || o.type === "input_image") return { chars: 0, images: 1 };
    // Every other member counts: tool calls, tool schemas and names are tokens too.
    let chars = 0;
    let images = 0;
    for (const [k, x] of Object.entries(o)) {
      const s = size(x);
      chars += s.chars + k.length;
      images += s.images;
    }
    return { chars, images };
  }
  return { chars: typeof v === "number" || typeof v === "boolean" ? String(v).length : 0, images: 0 };
}

function tokens(v: unknown): number {
  const s = size(v);
  return Math.ceil(s.chars / CHARS_PER_TOKEN) + s.images * TOKENS_PER_IMAGE;
}

export function estimatePromptTokens<E extends Endpoint>(endpoint: E, body: WireRequest[E]): number {
  switch (endpoint) {
    case "chat": {
      const b = body as WireRequest["chat"];
      const tools = (b as { tools?: unknown }).tools;
      return tokens(b.messages) + b.messages.length * TOKENS_PER_MESSAGE + TOKENS_PER_REPLY + (tools ? tokens(tools) : 0);
    }
    case "completions":
      return tokens((body as WireRequest["completions"]).prompt) + TOKENS_PER_REPLY;
    default:
      return tokens((body as WireRequest["embeddings"]).input);
  }
}
