/**
 * The image formats Claude takes, on Anthropic's API and on Bedrock's Converse alike: png, jpeg,
 * gif and webp. A data URL names one by media type, and clients often write `image/jpg` (from a
 * `.jpg` file name), which OpenAI accepts and neither Anthropic nor Converse does.
 */
const FORMAT_BY_MEDIA_TYPE: Record<string, string> = { "image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/gif": "gif", "image/webp": "webp" };

/** A media type (any case) → its format (`image/jpg` → `jpeg`); undefined for a type Claude does not take. */
export function imageFormat(mediaType: string): string | undefined {
  return FORMAT_BY_MEDIA_TYPE[mediaType.toLowerCase()];
}
