/**
 * The text a request body gave each of its numbers, where the number read from it says less: a
 * JSON number is read as the nearest double, which keeps about 16 significant digits, so
 * 9000.000000000001 reads as 9000.000000000002. Money columns keep 12 decimals at any size, so
 * the management API stores what was written, not that double.
 */
const texts = new WeakMap<object, Map<string, string>>();

/** `JSON.parse` that remembers, per object, the text of each number whose double does not print as it was written. */
export function parseKeepingNumberText(text: string): unknown {
  return JSON.parse(text, function (this: object, key: string, value: unknown, context?: { source?: string }) {
    if (typeof value === "number" && context?.source !== undefined && context.source !== String(value)) {
      let byKey = texts.get(this);
      if (!byKey) {
        byKey = new Map();
        texts.set(this, byKey);
      }
      byKey.set(key, context.source);
    }
    return value;
  });
}

/** The number `holder[key]` as the body wrote it, when its double prints otherwise. */
export function writtenNumber(holder: object, key: string): string | undefined {
  return texts.get(holder)?.get(key);
}
