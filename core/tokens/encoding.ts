/**
 * OpenAI's BPE encodings (gpt-tokenizer), chosen by model name and loaded on first use: each
 * table is megabytes of JavaScript that takes a noticeable moment to load, and most gateways
 * never count tokens.
 */
import { nextTurn } from "../timer.ts";

export type EncodingName = "o200k_base" | "cl100k_base";

export interface Encoding {
  name: EncodingName;
  /**
   * Tokens in `text`; special-token markers such as `<|endoftext|>` count as plain text. Counted
   * in parts with turns of the event loop between them (TURN_CHARS), so a large text holds no
   * other request for long.
   */
  count(text: string): Promise<number>;
}

/** Models on o200k_base: GPT-4o, GPT-4.1, GPT-4.5, GPT-5, the o-series, gpt-oss, omni-moderation. */
const O200K = /^(chatgpt-4o|gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|gpt-realtime|gpt-audio|gpt-image|o1|o3|o4|omni-moderation|codex-)/;

/** The model name without a provider prefix (`openai/gpt-4o`, `azure/gpt-4o` → `gpt-4o`). */
function bareModel(model: string): string {
  const slash = model.lastIndexOf("/");
  return (slash < 0 ? model : model.slice(slash + 1)).toLowerCase();
}

/** o200k_base for the models that use it, cl100k_base for GPT-4, GPT-3.5 and everything else. */
export function encodingFor(model: string): EncodingName {
  return O200K.test(bareModel(model)) ? "o200k_base" : "cl100k_base";
}

/** Treat every special-token marker in user text as ordinary characters, as the API does. */
const PLAIN = { disallowedSpecial: new Set<string>(), allowedSpecial: new Set<string>() };

const loaded = new Map<EncodingName, Promise<Encoding>>();

/**
 * Text without a break (letters, symbols or spaces in one run) is one piece to the BPE, and merging
 * a piece takes time quadratic in its length: 100,000 letters took 15 s, the event loop blocked for
 * every other request. Runs that long are counted in slices of this many characters: each cut
 * changes the count by a token at most, and no word is this long.
 */
const MAX_RUN = 500;
const LONG_RUN = new RegExp(`\\S{${MAX_RUN},}|\\s{${MAX_RUN},}`, "g");

function countInSlices(text: string, count: (slice: string) => number): number {
  if (text.length < MAX_RUN) return count(text);
  let total = 0;
  let from = 0;
  for (const m of text.matchAll(LONG_RUN)) {
    const end = m.index + m[0].length;
    for (let at = m.index + MAX_RUN; at < end; at += MAX_RUN) {
      // Not between the halves of a surrogate pair.
      const code = text.charCodeAt(at);
      if (code >= 0xdc00 && code <= 0xdfff) at++;
      total += count(text.slice(from, at));
      from = at;
    }
  }
  return total + count(text.slice(from));
}

/**
 * Characters counted, by every count under way together, before the event loop gets a turn: a few
 * milliseconds of the slowest text (random letters; prose is faster). Without turns, counting 3 MB
 * held every other request, liveness probes included, for its whole time.
 */
const TURN_CHARS = 8192;
let sinceTurn = 0;

/**
 * A place to cut text without changing its count: before a space that follows a non-space and
 * comes before a letter. Both encodings' pre-tokenizers end a piece there and start the next with
 * that space, and the BPE merges only within pieces.
 */
const EXACT_CUT = /(?<=\S) (?=\p{L})/u;

/** Where the part of `text` from `from` ends: at an exact cut past TURN_CHARS, else (text without one) at TURN_CHARS. */
function partEnd(text: string, from: number): number {
  const soonest = from + TURN_CHARS;
  if (text.length - from <= TURN_CHARS * 2) return text.length;
  const m = EXACT_CUT.exec(text.slice(soonest, soonest + TURN_CHARS));
  if (m) return soonest + m.index;
  // Not between the halves of a surrogate pair.
  const code = text.charCodeAt(soonest);
  return code >= 0xdc00 && code <= 0xdfff ? soonest + 1 : soonest;
}

async function countInParts(text: string, count: (slice: string) => number): Promise<number> {
  let total = 0;
  for (let from = 0; from < text.length; ) {
    const end = partEnd(text, from);
    if (sinceTurn >= TURN_CHARS) {
      sinceTurn = 0;
      await nextTurn();
    }
    total += countInSlices(from === 0 && end === text.length ? text : text.slice(from, end), count);
    sinceTurn += end - from;
    from = end;
  }
  return total;
}

/**
 * gpt-tokenizer's merge cache (the tokens of pieces the vocabulary lacks) evicts its least recently
 * used entry once full, and on Bun each eviction grows slower as the cache churns: 1 MB of random
 * letters took 1.6 s of CPU, the next two MB 5.6 and 9.0 s, the first again 19 s. Emptied before it
 * can fill (each piece is at least a character), it never evicts (1.1 to 1.9 s each), and it keeps
 * its hits: prose counts about twice as fast as with no cache.
 */
const MERGE_CACHE_PIECES = 100_000;

async function load(name: EncodingName): Promise<Encoding> {
  const mod = name === "o200k_base" ? await import("gpt-tokenizer/encoding/o200k_base") : await import("gpt-tokenizer/encoding/cl100k_base");
  mod.setMergeCacheSize(MERGE_CACHE_PIECES);
  let charsSinceClear = 0;
  const count = (slice: string) => {
    if (slice === "") return 0;
    charsSinceClear += slice.length;
    if (charsSinceClear > MERGE_CACHE_PIECES) {
      mod.clearMergeCache();
      charsSinceClear = slice.length;
    }
    return mod.countTokens(slice, PLAIN);
  };
  return { name, count: (text) => countInParts(text, count) };
}

export function getEncoding(name: EncodingName): Promise<Encoding> {
  let p = loaded.get(name);
  if (!p) {
    p = load(name);
    loaded.set(name, p);
    // A failed load is retried next time rather than cached.
    p.catch(() => loaded.delete(name));
  }
  return p;
}
