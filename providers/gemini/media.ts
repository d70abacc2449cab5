/**
 * OpenAI content parts that carry media (images, audio, files) → Gemini parts: `data:` URLs are
 * sent inline (`inlineData`), anything else by reference (`fileData`: `https://`, `gs://`, or a
 * Files API name such as `files/abc123`).
 */
import type { GeminiPart } from "./wire.ts";

const DATA_URL = /^data:([^;,]*)((?:;[^;,]*)*),(.*)$/s;

/** Media types Gemini accepts, by file extension, for references that do not say. */
const MIME_BY_EXTENSION: Record<string, string> = {
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  webp: "image/webp",
  gif: "image/gif",
  heic: "image/heic",
  heif: "image/heif",
  pdf: "application/pdf",
  txt: "text/plain",
  mp3: "audio/mp3",
  wav: "audio/wav",
  flac: "audio/flac",
  ogg: "audio/ogg",
  aac: "audio/aac",
  mp4: "video/mp4",
  mov: "video/mov",
  webm: "video/webm",
};

function mimeFromPath(url: string): string | undefined {
  const path = url.split(/[?#]/, 1)[0] ?? "";
  const ext = /\.([A-Za-z0-9]+)$/.exec(path)?.[1]?.toLowerCase();
  return ext ? MIME_BY_EXTENSION[ext] : undefined;
}

/** The text of a data URL without `;base64`; the adapter's caller makes the thrown message a 400 (a bare "URI error" names nothing). */
function percentDecoded(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    throw new Error("a data: URL's text is not valid percent-encoding (send it with ;base64, or encode it)");
  }
}

/** A URL (data or remote) → a Gemini part; `mimeType` overrides what the URL says. */
export function mediaPart(url: string, mimeType?: string): GeminiPart {
  const m = DATA_URL.exec(url);
  if (m) {
    const base64 = m[2]!.split(";").includes("base64");
    const data = base64 ? m[3]! : Buffer.from(percentDecoded(m[3]!), "utf8").toString("base64");
    return { inlineData: { mimeType: mimeType ?? (m[1] || "application/octet-stream"), data } };
  }
  const type = mimeType ?? mimeFromPath(url);
  return { fileData: type ? { mimeType: type, fileUri: url } : { fileUri: url } };
}

/** OpenAI `input_audio` formats → media types. */
export function audioMime(format: unknown): string {
  return format === "mp3" ? "audio/mp3" : typeof format === "string" && format ? `audio/${format}` : "audio/wav";
}
