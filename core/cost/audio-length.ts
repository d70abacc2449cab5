/**
 * The length of an uploaded WAV file, read from its header: what budgets reserve for a
 * transcription of it. Without it the reservation assumes the lowest bitrate speech is coded at
 * (cost/estimate.ts audioBound), about 40 times the length of 16 kHz 16-bit PCM: a key with room
 * for a minute of audio was refused a 30-second WAV.
 *
 * The length is what a decoder makes of the header (frames of `block_align` bytes at
 * `sample_rate`), the upstream's reading of the same file, never more data than the file holds.
 * Only uncompressed and companded formats, whose frames have a fixed size; any other file, or a
 * header that does not add up, keeps the generic bound.
 */

/** WAVE_FORMAT_PCM, _IEEE_FLOAT, _ALAW, _MULAW and _EXTENSIBLE (whose sub-format is one of those). */
const FRAMED_FORMATS = new Set([1, 3, 6, 7, 0xfffe]);
/** Where the data chunk must start to be found: headers with metadata before it are a few KB. */
export const HEADER_BYTES = 16_384;

/** Seconds of audio in a WAV file of `size` bytes whose first bytes are `head`; undefined when it is not one whose length this can tell. */
export function wavSeconds(head: Uint8Array, size: number): number | undefined {
  if (head.length < 12) return undefined;
  const view = new DataView(head.buffer, head.byteOffset, head.byteLength);
  const tag = (at: number) => String.fromCharCode(head[at]!, head[at + 1]!, head[at + 2]!, head[at + 3]!);
  if (tag(0) !== "RIFF" || tag(8) !== "WAVE") return undefined;
  let frameBytesPerSecond: number | undefined;
  for (let at = 12; at + 8 <= head.length; ) {
    const id = tag(at);
    const length = view.getUint32(at + 4, true);
    const body = at + 8;
    if (id === "fmt ") {
      if (body + 16 > head.length) return undefined;
      const format = view.getUint16(body, true);
      const channels = view.getUint16(body + 2, true);
      const sampleRate = view.getUint32(body + 4, true);
      const blockAlign = view.getUint16(body + 12, true);
      const bits = view.getUint16(body + 14, true);
      const framed = FRAMED_FORMATS.has(format) && channels >= 1 && channels <= 32 && sampleRate >= 1000 && sampleRate <= 768_000;
      if (!framed || bits === 0 || blockAlign !== channels * Math.ceil(bits / 8)) return undefined;
      frameBytesPerSecond = sampleRate * blockAlign;
    } else if (id === "data") {
      if (frameBytesPerSecond === undefined) return undefined;
      // A streamed file's header may give 0 or 0xFFFFFFFF: the data then runs to the end.
      const held = size - body;
      const data = length === 0 || length > held ? held : length;
      return Math.max(0, data) / frameBytesPerSecond;
    }
    // Chunks are padded to an even length.
    at = body + length + (length % 2);
  }
  return undefined;
}

/** Lengths read so far, by the uploaded file (dropped with it). */
const lengths = new WeakMap<Blob, number>();

/** Reads `file`'s header once, before the call is priced (reading a Blob is asynchronous, pricing is not). */
export async function readAudioLength(file: Blob): Promise<void> {
  if (lengths.has(file)) return;
  const head = new Uint8Array(await file.slice(0, HEADER_BYTES).arrayBuffer());
  const seconds = wavSeconds(head, file.size);
  if (seconds !== undefined) lengths.set(file, seconds);
}

/** The length `readAudioLength` found for `file`, if it could tell. */
export function knownAudioSeconds(file: Blob): number | undefined {
  return lengths.get(file);
}
