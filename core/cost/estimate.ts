/**
 * Prompt sizes before the upstream has counted anything, two of them:
 *
 * - the estimate (rate limits' `tpm` reservation, settled to the real count when the call ends):
 *   three characters per token, above what common tokenizers produce for prose and code (about
 *   four for OpenAI's, about 3.5 for Claude's);
 * - the bound (budgets' worst case, which must never be below the real cost, or concurrent calls
 *   could overspend): one token per UTF-8 byte. Byte-level tokenizers (OpenAI's, Llama's) and
 *   SentencePiece with byte fallback (Gemini's) never make a token of less than a byte, while a
 *   prompt of symbols, digits or emoji can take far more than a token per three characters.
 *   Every string may add one token (a leading-space marker).
 *
 * Both add the per-message framing chat formats put around each message.
 */
import type { Endpoint, WireRequest } from "../contract.ts";

const CHARS_PER_TOKEN = 3;
const TOKENS_PER_MESSAGE = 4;
const TOKENS_PER_REPLY = 3;
/** An image in a prompt: the largest tile count OpenAI bills for a high-detail image is about this. */
const TOKENS_PER_IMAGE = 1600;

interface Size {
  chars: number;
  bytes: number;
  strings: number;
  images: number;
}

function add(into: Size, s: Size): void {
  into.chars += s.chars;
  into.bytes += s.bytes;
  into.strings += s.strings;
  into.images += s.images;
}

function text(s: string): Size {
  return { chars: s.length, bytes: Buffer.byteLength(s, "utf8"), strings: 1, images: 0 };
}

function size(v: unknown): Size {
  if (typeof v === "string") return text(v);
  const out: Size = { chars: 0, bytes: 0, strings: 0, images: 0 };
  if (Array.isArray(v)) {
    for (const item of v) add(out, size(item));
    return out;
  }
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    if (o.type === "image_url" || o.type === "input_image") return { ...out, images: 1 };
    // Every other member counts: tool calls, tool schemas and names are tokens too.
    for (const [k, x] of Object.entries(o)) {
      add(out, text(k));
      add(out, size(x));
    }
    return out;
  }
  return typeof v === "number" || typeof v === "boolean" ? text(String(v)) : out;
}

/** A prompt's estimated tokens and their upper bound. */
export interface PromptSize {
  estimate: number;
  bound: number;
}

function tokens(v: unknown, framing: number): PromptSize {
  const s = size(v);
  const images = s.images * TOKENS_PER_IMAGE;
  return { estimate: Math.ceil(s.chars / CHARS_PER_TOKEN) + images + framing, bound: s.bytes + s.strings + images + framing };
}

export function promptSize<E extends Endpoint>(endpoint: E, body: WireRequest[E]): PromptSize {
  switch (endpoint) {
    case "chat": {
      const b = body as WireRequest["chat"];
      const tools = (b as { tools?: unknown }).tools;
      return tokens(tools ? [b.messages, tools] : b.messages, b.messages.length * TOKENS_PER_MESSAGE + TOKENS_PER_REPLY);
    }
    case "completions":
      return tokens((body as WireRequest["completions"]).prompt, TOKENS_PER_REPLY);
    case "images":
      return tokens((body as WireRequest["images"]).prompt, 0);
    case "moderations":
      return tokens((body as WireRequest["moderations"]).input, 0);
    case "speech":
      return tokens((body as WireRequest["speech"]).input, 0);
    case "transcriptions":
      // The audio is priced by its length (see audioBound); only the optional text prompt is text.
      return tokens((body as WireRequest["transcriptions"]).prompt ?? "", 0);
    default:
      return tokens((body as WireRequest["embeddings"]).input, 0);
  }
}

/**
 * The most audio a file of `bytes` can hold, for budgets before the upstream says: seconds at
 * 6 kbit/s (below the lowest bitrate speech codecs are used at), and as many audio tokens as
 * OpenAI's transcription models count at most per second. A WAV file whose header tells its
 * length (`knownSeconds`, cost/audio-length.ts) is bounded by that, with a margin for an upstream
 * that rounds up (2 % and a second).
 */
export function audioBound(bytes: number, knownSeconds?: number): { seconds: number; tokens: number } {
  const seconds = knownSeconds === undefined ? Math.ceil(bytes / 750) : Math.ceil(knownSeconds * 1.02) + 1;
  return { seconds, tokens: seconds * AUDIO_TOKENS_PER_SECOND };
}

/** Generous: OpenAI's audio models count about 10 tokens per second of speech. */
const AUDIO_TOKENS_PER_SECOND = 50;

/** The estimate alone (see above). */
export function estimatePromptTokens<E extends Endpoint>(endpoint: E, body: WireRequest[E]): number {
  return promptSize(endpoint, body).estimate;
}
