/** Ids and timestamps of the OpenAI-style answers the gateway makes up when an upstream gives none. */

/** A response id in OpenAI's style, for providers that give none. */
export function chatCompletionId(): string {
  return `chatcmpl-${crypto.randomUUID().replaceAll("-", "")}`;
}

/** The id of a legacy `text_completion`. */
export function textCompletionId(): string {
  return `cmpl-${crypto.randomUUID().replaceAll("-", "")}`;
}

export function toolCallId(): string {
  return `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
}

export const nowSeconds = (): number => Math.floor(Date.now() / 1000);
