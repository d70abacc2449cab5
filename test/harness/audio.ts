/** WAV files for tests: a header as a recorder writes it, and silence. */

/** A WAV header (and `dataBytes` of silence unless `declared` says otherwise), with `extra` chunks before the data. */
export function wav(o: { rate?: number; channels?: number; bits?: number; format?: number; blockAlign?: number; dataBytes: number; declared?: number; extra?: [string, number][] }): Uint8Array<ArrayBuffer> {
  const { rate = 16_000, channels = 1, bits = 16, format = 1, dataBytes } = o;
  const blockAlign = o.blockAlign ?? channels * Math.ceil(bits / 8);
  const extras = (o.extra ?? []).map(([id, n]) => ({ id, n, padded: n + (n % 2) }));
  const size = 12 + 24 + extras.reduce((s, e) => s + 8 + e.padded, 0) + 8 + dataBytes;
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  const put = (at: number, text: string) => out.set(new TextEncoder().encode(text), at);
  put(0, "RIFF");
  view.setUint32(4, size - 8, true);
  put(8, "WAVE");
  put(12, "fmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, format, true);
  view.setUint16(22, channels, true);
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * blockAlign, true);
  view.setUint16(32, blockAlign, true);
  view.setUint16(34, bits, true);
  let at = 36;
  for (const e of extras) {
    put(at, e.id);
    view.setUint32(at + 4, e.n, true);
    at += 8 + e.padded;
  }
  put(at, "data");
  view.setUint32(at + 4, o.declared ?? dataBytes, true);
  return out;
}
