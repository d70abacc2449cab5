/**
 * Audio transcription for OpenAI-shaped providers: the client's form goes upstream as a form. A
 * transcription is priced by its audio's length (whisper-style models, per second) or its tokens
 * (gpt-4o-transcribe): whisper-style models report the length only in `verbose_json`, so they are
 * always asked for it and the answer the client asked for (`json`, `text`, `srt`, `vtt`) is made
 * from it; other models are asked for `json` where the client wants `json` or `text`.
 */
import type { Deployment, EndpointAdapter, TextAnswer, TranscriptionRequest, WireJson } from "../../core/contract.ts";
import { appendFile } from "../../core/http/multipart.ts";
import { GatewayOnlyFields } from "../../core/wire.ts";
import { num, usageFromTranscription } from "./usage.ts";

/** Models that report a duration, not tokens (OpenAI's, Groq's, Deepgram's whisper). */
const REPORTS_DURATION = /whisper/i;
const NOT_FORWARDED: ReadonlySet<string> = new Set(["model", "file", "response_format", "stream", ...GatewayOnlyFields]);

type Format = NonNullable<TranscriptionRequest["response_format"]>;

/** By the model's name, or its `model_info.base_model` (an Azure deployment's name says nothing). */
const reportsDuration = (d: Deployment): boolean => REPORTS_DURATION.test(d.upstreamModel) || REPORTS_DURATION.test(String(d.info.base_model ?? ""));

function upstreamFormat(asked: Format, d: Deployment): Format {
  if (reportsDuration(d)) return "verbose_json";
  return asked === "text" ? "json" : asked;
}

function timestamp(seconds: number, decimal: "," | "."): string {
  const ms = Math.round(seconds * 1000);
  const pad = (n: number, w = 2) => String(n).padStart(w, "0");
  return `${pad(Math.floor(ms / 3_600_000))}:${pad(Math.floor(ms / 60_000) % 60)}:${pad(Math.floor(ms / 1000) % 60)}${decimal}${pad(ms % 1000, 3)}`;
}

interface Segment {
  start: number;
  end: number;
  text: string;
}

function segmentsOf(b: WireJson): Segment[] {
  const list = Array.isArray(b.segments) ? (b.segments as WireJson[]) : [];
  const out = list.map((s) => ({ start: num(s.start), end: num(s.end), text: String(s.text ?? "").trim() }));
  return out.length > 0 ? out : [{ start: 0, end: num(b.duration), text: String(b.text ?? "").trim() }];
}

/** A verbose_json answer as the text format the client asked for. */
function rendered(format: "text" | "srt" | "vtt", b: WireJson): TextAnswer {
  if (format === "text") return { body: `${String(b.text ?? "")}\n`, contentType: "text/plain; charset=utf-8" };
  const cues = segmentsOf(b).map((s, i) => {
    const span = `${timestamp(s.start, format === "srt" ? "," : ".")} --> ${timestamp(s.end, format === "srt" ? "," : ".")}`;
    return format === "srt" ? `${i + 1}\n${span}\n${s.text}\n` : `${span}\n${s.text}\n`;
  });
  if (format === "srt") return { body: `${cues.join("\n")}\n`, contentType: "text/plain; charset=utf-8" };
  return { body: `WEBVTT\n\n${cues.join("\n")}\n`, contentType: "text/vtt; charset=utf-8" };
}

/** `text` as a JSON object, if it is one. */
function jsonObject(text: string): WireJson | undefined {
  try {
    const v: unknown = JSON.parse(text);
    return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as WireJson) : undefined;
  } catch {
    return undefined;
  }
}

export function openAITranscriptions(): EndpointAdapter<"transcriptions"> {
  const adapter: EndpointAdapter<"transcriptions"> = {
    request(req, d) {
      const form = new FormData();
      form.append("model", d.upstreamModel);
      form.append("response_format", upstreamFormat(req.response_format ?? "json", d));
      for (const [k, v] of Object.entries(req)) {
        if (NOT_FORWARDED.has(k) || v === undefined || v === null) continue;
        if (Array.isArray(v)) for (const x of v) form.append(`${k}[]`, String(x));
        // Another file the client sent (a field this gateway does not know) goes on as a file, not as "{}".
        else if (v instanceof Blob) appendFile(form, k, v, v instanceof File ? v.name : k);
        else form.append(k, typeof v === "object" ? JSON.stringify(v) : String(v));
      }
      appendFile(form, "file", req.file, req.file instanceof File ? req.file.name : "audio");
      const headers: Record<string, string> = { ...d.headers };
      if (d.apiKey) headers.authorization = `Bearer ${d.apiKey}`;
      return { url: `${d.apiBase}/audio/transcriptions`, method: "POST", headers, form };
    },
    response(body, req) {
      if (body === null || typeof body !== "object" || Array.isArray(body)) throw new Error("expected a JSON object");
      const b = body as WireJson;
      const usage = usageFromTranscription(b);
      const asked = req?.response_format ?? "json";
      if (asked === "verbose_json") return { body: b, usage };
      if (asked === "json") {
        // A verbose_json answer (asked for its duration) is cut down to what json carries.
        if (b.duration === undefined) return { body: b, usage };
        return { body: { text: b.text, usage: { type: "duration", seconds: Math.ceil(num(b.duration)) } }, usage };
      }
      return { body: b, usage, text: rendered(asked, b) };
    },
    // The JSON the gateway asked for (verbose_json, json), whatever content type an upstream labels
    // it with: read for its length and made into the format the client asked for. Else an SRT or
    // VTT answer of a token-priced model: passed on; it reports no usage.
    textResponse(text, contentType, req) {
      const json = jsonObject(text);
      if (!json) return { text: { body: text, contentType }, usage: { promptTokens: 0, completionTokens: 0 } };
      const answer = adapter.response(json, req);
      return { text: answer.text ?? { body: JSON.stringify(answer.body), contentType: "application/json" }, usage: answer.usage };
    },
  };
  return adapter;
}
