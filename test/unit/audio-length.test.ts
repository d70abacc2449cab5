// A WAV file's length from its header (core/cost/audio-length.ts): what budgets reserve for a
// transcription. Only headers whose frames have a fixed size are read; anything else is left to
// the generic bound.
import { expect, test } from "bun:test";
import { wavSeconds } from "../../core/cost/audio-length.ts";
import { wav } from "../harness/audio.ts";

const seconds = (file: Uint8Array) => wavSeconds(file.subarray(0, 16_384), file.length);

test("PCM, float and companded files: data bytes over frames of block_align at sample_rate", () => {
  expect(seconds(wav({ dataBytes: 32_000 }))).toBe(1);
  expect(seconds(wav({ rate: 44_100, channels: 2, dataBytes: 44_100 * 4 * 3 }))).toBe(3);
  expect(seconds(wav({ rate: 48_000, bits: 32, format: 3, dataBytes: 48_000 * 4 }))).toBe(1);
  expect(seconds(wav({ rate: 8_000, bits: 8, format: 7, dataBytes: 4_000 }))).toBe(0.5);
  expect(seconds(wav({ rate: 16_000, bits: 24, dataBytes: 48_000 }))).toBe(1);
});

test("metadata chunks before the data (odd lengths padded) are skipped", () => {
  expect(seconds(wav({ dataBytes: 64_000, extra: [["LIST", 27], ["fact", 4]] }))).toBe(2);
});

test("a data length of 0 or 0xFFFFFFFF (a streamed file), or more than the file holds: the data runs to the end", () => {
  expect(seconds(wav({ dataBytes: 16_000, declared: 0 }))).toBe(0.5);
  expect(seconds(wav({ dataBytes: 16_000, declared: 0xffffffff }))).toBe(0.5);
  expect(seconds(wav({ dataBytes: 16_000, declared: 10_000_000 }))).toBe(0.5);
});

test("what this cannot tell is undefined: compressed formats, headers that do not add up, other files", () => {
  expect(seconds(wav({ format: 2, bits: 4, blockAlign: 256, dataBytes: 1000 }))).toBeUndefined();
  expect(seconds(wav({ blockAlign: 1, dataBytes: 1000 }))).toBeUndefined();
  expect(seconds(wav({ rate: 10, dataBytes: 1000 }))).toBeUndefined();
  expect(seconds(wav({ channels: 0, dataBytes: 1000 }))).toBeUndefined();
  expect(seconds(new Uint8Array(5000))).toBeUndefined();
  expect(seconds(new TextEncoder().encode("ID3\u0004 an mp3 file"))).toBeUndefined();
  // The data chunk past the bytes read: not found, not guessed.
  expect(seconds(wav({ dataBytes: 100, extra: [["LIST", 20_000]] }))).toBeUndefined();
  // Cut inside the fmt chunk.
  expect(wavSeconds(wav({ dataBytes: 100 }).subarray(0, 30), 144)).toBeUndefined();
});
