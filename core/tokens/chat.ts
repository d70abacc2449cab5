/**
 * Prompt tokens of a chat request the way OpenAI bills them: each message costs its text plus a
 * fixed overhead (3 tokens, and 1 more for a `name`), the reply is primed with 3 more, images cost
 * by their tiles, and tool definitions by OpenAI's published formula.
 */
import type { Encoding } from "./encoding.ts";
import { imageSize } from "./image-size.ts";

type Json = Record<string, unknown>;

export interface PromptCount {
  total: number;
  /** Of the total, tokens spent on images. */
  image: number;
}

const PER_MESSAGE = 3;
const PER_NAME = 1;
const REPLY_PRIMING = 3;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const str = (v: unknown): string => (typeof v === "string" ? v : "");

/** OpenAI's image cost: 85 for `low`, else 85 + 170 per 512px tile of the image scaled to fit 2048 and then 768 on its short side. */
export function imageTokens(detail: unknown, size: { width: number; height: number } | undefined): number {
  if (detail === "low") return 85;
  // An image whose size cannot be read (a remote URL: the gateway does not fetch it) is taken as 1024×1024.
  let { width, height } = size ?? { width: 1024, height: 1024 };
  if (width > 2048 || height > 2048) {
    const f = 2048 / Math.max(width, height);
    width = Math.floor(width * f);
    height = Math.floor(height * f);
  }
  const short = Math.min(width, height);
  if (short > 768) {
    const f = 768 / short;
    width = Math.floor(width * f);
    height = Math.floor(height * f);
  }
  return 85 + 170 * Math.ceil(width / 512) * Math.ceil(height / 512);
}

function dataUrlBytes(url: string): Uint8Array | undefined {
  const m = /^data:[^;,]*;base64,/.exec(url);
  return m ? Buffer.from(url.slice(m[0].length), "base64") : undefined;
}

async function contentCount(enc: Encoding, content: unknown): Promise<PromptCount> {
  if (typeof content === "string") return { total: await enc.count(content), image: 0 };
  if (!Array.isArray(content)) return { total: 0, image: 0 };
  let total = 0;
  let image = 0;
  for (const part of content) {
    if (!isObject(part)) continue;
    if (typeof part.text === "string") total += await enc.count(part.text);
    else if (part.type === "image_url") {
      const img = isObject(part.image_url) ? part.image_url : { url: part.image_url };
      const bytes = dataUrlBytes(str(img.url));
      const n = imageTokens(img.detail, bytes ? imageSize(bytes) : undefined);
      total += n;
      image += n;
    }
  }
  return { total, image };
}

async function toolCallsCount(enc: Encoding, calls: unknown): Promise<number> {
  if (!Array.isArray(calls)) return 0;
  let n = 0;
  for (const c of calls) {
    const fn = isObject(c) && isObject(c.function) ? c.function : undefined;
    if (fn) n += (await enc.count(str(fn.name))) + (await enc.count(str(fn.arguments)));
  }
  return n;
}

/** The OpenAI cookbook's count for function definitions (gpt-4o family constants; the others differ by a few tokens). */
export async function toolsCount(enc: Encoding, tools: unknown): Promise<number> {
  if (!Array.isArray(tools) || tools.length === 0) return 0;
  const FUNC_INIT = enc.name === "o200k_base" ? 7 : 10;
  const PROP_INIT = 3;
  const PROP_KEY = 3;
  const ENUM_INIT = -3;
  const ENUM_ITEM = 3;
  const FUNC_END = 12;
  let n = 0;
  for (const t of tools) {
    const fn = isObject(t) && isObject(t.function) ? t.function : undefined;
    if (!fn) continue;
    n += FUNC_INIT + (await enc.count(`${str(fn.name)}:${str(fn.description).replace(/\.$/, "")}`));
    const props = isObject(fn.parameters) && isObject(fn.parameters.properties) ? fn.parameters.properties : {};
    const keys = Object.keys(props);
    if (keys.length === 0) continue;
    n += PROP_INIT;
    for (const key of keys) {
      const p = isObject(props[key]) ? (props[key] as Json) : {};
      n += PROP_KEY;
      if (Array.isArray(p.enum)) {
        n += ENUM_INIT;
        for (const item of p.enum) n += ENUM_ITEM + (await enc.count(String(item)));
      }
      n += await enc.count(`${key}:${str(p.type)}:${str(p.description).replace(/\.$/, "")}`);
    }
  }
  return n + FUNC_END;
}

/** Tokens of a chat prompt: messages with their overhead, the reply priming, and tool definitions. */
export async function chatTokens(enc: Encoding, messages: readonly unknown[], tools?: unknown): Promise<PromptCount> {
  let total = REPLY_PRIMING;
  let image = 0;
  for (const m of messages) {
    if (!isObject(m)) continue;
    total += PER_MESSAGE + (await enc.count(str(m.role)));
    const c = await contentCount(enc, m.content);
    total += c.total;
    image += c.image;
    if (typeof m.name === "string") total += (await enc.count(m.name)) + PER_NAME;
    total += await toolCallsCount(enc, m.tool_calls);
    if (isObject(m.function_call)) total += (await enc.count(str(m.function_call.name))) + (await enc.count(str(m.function_call.arguments)));
  }
  return { total: total + (await toolsCount(enc, tools)), image };
}
