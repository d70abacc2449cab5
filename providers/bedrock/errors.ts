/**
 * Bedrock's error answers: `{"message": "…"}` (some services spell it `Message`), the exception
 * name in the `x-amzn-ErrorType` header, which the adapter does not see; the message says enough.
 */
export function bedrockErrorMessage(_status: number, body: string): string {
  try {
    const parsed = JSON.parse(body) as { message?: unknown; Message?: unknown };
    if (typeof parsed.message === "string") return parsed.message;
    if (typeof parsed.Message === "string") return parsed.Message;
  } catch {
    // not JSON: the raw text below
  }
  return body.slice(0, 500);
}
