/**
 * OpenAI chat messages → Anthropic's top-level `system` and its strictly user/assistant `messages`.
 * Anthropic has no system, developer or tool roles: instructions move to `system`, tool results
 * become `tool_result` blocks in a user turn, and consecutive turns of one role are merged into one.
 * Odd input is sent as is, so the client gets Anthropic's own 400 with its explanation; but content
 * Anthropic cannot take at all (audio, a file by id, a document other than a PDF) is the client's
 * 400 naming it: sent on, it came back as Anthropic's 400 about an unknown tag or an empty URL.
 */
import type { ChatRequest } from "../../core/contract.ts";
import { GatewayError } from "../../core/errors.ts";
import { imageFormat } from "../shared/image-formats.ts";
import type { AnthropicMessage, CacheControl, ContentBlock, MediaSource, TextBlock, ToolResultBlock, ToolUseBlock } from "./wire.ts";

type ChatMessage = ChatRequest["messages"][number];
type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

function cacheControlOf(v: Json): CacheControl | undefined {
  return isObject(v.cache_control) ? v.cache_control : undefined;
}

function withCache<B extends ContentBlock>(block: B, cache: CacheControl | undefined): B {
  if (cache) (block as { cache_control?: CacheControl }).cache_control = cache;
  return block;
}

const DATA_URL = /^data:([^;,]+)(?:;[^,]*)?;base64,/;

/** A `data:` URL → base64 source; any other URL → url source (Anthropic fetches it). */
export function mediaSource(url: string): MediaSource {
  const m = DATA_URL.exec(url);
  if (m) return { type: "base64", media_type: m[1]!, data: url.slice(m[0].length) };
  return { type: "url", url };
}

function imageBlock(part: Json): ContentBlock {
  const image = part.image_url;
  const url = typeof image === "string" ? image : isObject(image) && typeof image.url === "string" ? image.url : "";
  const source = mediaSource(url);
  if (source.type === "base64") {
    // `image/jpg` (or `IMAGE/PNG`) as Anthropic names it; a type it does not take goes as it is, for its own 400.
    const format = imageFormat(source.media_type);
    if (format) source.media_type = `image/${format}`;
  }
  return withCache({ type: "image", source }, cacheControlOf(part));
}

function refused(message: string): GatewayError {
  return GatewayError.of(400, `anthropic: ${message}`, "invalid_request_error", "messages");
}

/** OpenAI's `file` part (a PDF as a data URL, or a URL) → a document block. */
function documentBlock(part: Json): ContentBlock {
  const file = isObject(part.file) ? part.file : {};
  const data = typeof file.file_data === "string" ? file.file_data : typeof file.url === "string" ? file.url : "";
  if (data === "") throw refused(`a file part by file_id (${JSON.stringify(file.file_id ?? "")}) cannot be sent to Claude; send the file's content as file_data (a base64 data URL of a PDF).`);
  const source = mediaSource(data);
  if (source.type === "base64" && source.media_type !== "application/pdf") throw refused(`Claude takes PDF documents, not ${source.media_type} (a file part).`);
  const block: ContentBlock = { type: "document", source };
  if (typeof file.filename === "string") block.title = file.filename;
  return withCache(block, cacheControlOf(part));
}

/** One OpenAI content part → one Anthropic block; unknown parts (native Anthropic blocks) pass as they are. */
function contentBlock(part: Json): ContentBlock | undefined {
  switch (part.type) {
    case "text": {
      const text = typeof part.text === "string" ? part.text : "";
      // Anthropic refuses empty text blocks; an empty part says nothing anyway.
      return text === "" ? undefined : withCache({ type: "text", text }, cacheControlOf(part));
    }
    case "image_url":
      return imageBlock(part);
    case "file":
      return documentBlock(part);
    case "input_audio":
      throw refused("Claude takes no audio (an input_audio part); send text, images or PDF documents.");
    case "refusal":
      return typeof part.refusal === "string" && part.refusal !== "" ? { type: "text", text: part.refusal } : undefined;
    default:
      return part as ContentBlock;
  }
}

function contentBlocks(content: ChatMessage["content"]): ContentBlock[] {
  if (typeof content === "string") return content === "" ? [] : [{ type: "text", text: content }];
  if (!Array.isArray(content)) return [];
  const blocks: ContentBlock[] = [];
  for (const part of content) {
    const block = contentBlock(part as Json);
    if (block) blocks.push(block);
  }
  return blocks;
}

/** Tool arguments are a JSON string in OpenAI and an object in Anthropic; unreadable ones become `{}`. */
function toolInput(args: unknown): unknown {
  if (isObject(args)) return args;
  if (typeof args !== "string" || args.trim() === "") return {};
  try {
    const parsed: unknown = JSON.parse(args);
    return isObject(parsed) ? parsed : {};
  } catch {
    return {};
  }
}

function toolUseBlocks(toolCalls: unknown): ToolUseBlock[] {
  if (!Array.isArray(toolCalls)) return [];
  const blocks: ToolUseBlock[] = [];
  for (const call of toolCalls) {
    if (!isObject(call)) continue;
    const fn = isObject(call.function) ? call.function : {};
    blocks.push({ type: "tool_use", id: String(call.id ?? ""), name: String(fn.name ?? ""), input: toolInput(fn.arguments) });
  }
  return blocks;
}

/**
 * Thinking blocks the client echoes back on an assistant turn (as this adapter returned them in
 * `thinking_blocks`): Anthropic requires them, signature intact, before the tool use they led to.
 */
function thinkingBlocks(message: Json): ContentBlock[] {
  const blocks = message.thinking_blocks;
  if (!Array.isArray(blocks)) return [];
  return blocks.filter((b): b is ContentBlock => isObject(b) && (b.type === "thinking" || b.type === "redacted_thinking"));
}

function toolResult(message: ChatMessage, toolUseId: string): ToolResultBlock {
  const { content } = message;
  const block: ToolResultBlock = {
    type: "tool_result",
    tool_use_id: toolUseId,
    content: typeof content === "string" ? content : contentBlocks(content),
  };
  return withCache(block, cacheControlOf(message as Json));
}

/** Adds a turn, merging it into the previous one when the role repeats (Anthropic wants alternation). */
function pushTurn(turns: AnthropicMessage[], role: "user" | "assistant", blocks: ContentBlock[], plain: string | undefined): void {
  if (blocks.length === 0) return;
  const last = turns.at(-1);
  if (last?.role === role) {
    const merged = typeof last.content === "string" ? [{ type: "text", text: last.content } as TextBlock] : last.content;
    merged.push(...blocks);
    last.content = merged;
    return;
  }
  // A turn that is one uncached text block is sent as a plain string, as Anthropic's own examples do.
  turns.push({ role, content: plain !== undefined ? plain : blocks });
}

/** The message-level `cache_control` (an extension some clients send) marks the turn's last block. */
function markLast(blocks: ContentBlock[], message: Json): boolean {
  const cache = cacheControlOf(message);
  const last = blocks.at(-1);
  if (!cache || !last) return false;
  // A copy: the block may be the client's own object, and the request may be retried elsewhere.
  blocks[blocks.length - 1] = { ...last, cache_control: cache } as ContentBlock;
  return true;
}

export interface TranslatedMessages {
  system: string | TextBlock[] | undefined;
  messages: AnthropicMessage[];
}

export function anthropicMessages(input: readonly ChatMessage[]): TranslatedMessages {
  const system: TextBlock[] = [];
  let systemIsPlain = true;
  const turns: AnthropicMessage[] = [];
  for (const message of input) {
    const m = message as Json;
    switch (message.role) {
      case "system":
      case "developer": {
        for (const block of contentBlocks(message.content)) {
          if (block.type !== "text") continue;
          system.push(block as TextBlock);
          if ((block as TextBlock).cache_control) systemIsPlain = false;
        }
        if (markLast(system, m)) systemIsPlain = false;
        break;
      }
      case "user": {
        const blocks = contentBlocks(message.content);
        const cached = markLast(blocks, m);
        const plain = typeof message.content === "string" && !cached ? message.content : undefined;
        pushTurn(turns, "user", blocks, plain);
        break;
      }
      case "assistant": {
        const blocks = [...thinkingBlocks(m), ...contentBlocks(message.content)];
        markLast(blocks, m);
        blocks.push(...toolUseBlocks(message.tool_calls));
        // Plain only when the one block is the content's text (with content "" it is a tool call or thinking).
        const plain = blocks.length === 1 && typeof message.content === "string" && message.content !== "" && !cacheControlOf(m) ? message.content : undefined;
        pushTurn(turns, "assistant", blocks, plain);
        break;
      }
      case "tool":
        pushTurn(turns, "user", [toolResult(message, message.tool_call_id ?? "")], undefined);
        break;
      case "function":
        // The legacy function role names the function instead of a call id.
        pushTurn(turns, "user", [toolResult(message, message.name ?? "")], undefined);
        break;
    }
  }
  let systemOut: TranslatedMessages["system"];
  if (system.length > 0) systemOut = systemIsPlain ? system.map((b) => b.text).join("\n\n") : system;
  // Anthropic needs a turn: a request of instructions alone sends them as the user's turn, as for Gemini.
  if (turns.length === 0 && systemOut !== undefined) return { system: undefined, messages: [{ role: "user", content: systemOut }] };
  return { system: systemOut, messages: turns };
}
