import type { ProviderAdapter, WireJson } from "../../core/contract.ts";
import { openAIChat, openAICompletions, openAIEmbeddings, openAIErrorMessage, openAIImages, openAIModerations, openAISpeech } from "../openai-compatible/adapter.ts";
import { openAITranscriptions } from "../openai-compatible/transcriptions.ts";
import { respond } from "./respond.ts";

const MOCK_BASE = "mock://local";
/** Header carrying the deployment's fixed reply (`svc_params.mock_response`) to the transport. */
const FIXED_REPLY = "x-mock-response";

/** `mock/<anything>`: answers in OpenAI's wire format without leaving the process. */
export const mockProvider: ProviderAdapter = {
  ids: ["mock"],
  endpoints: { chat: openAIChat(), completions: openAICompletions(), embeddings: openAIEmbeddings(), images: openAIImages(), transcriptions: openAITranscriptions(), speech: openAISpeech(), moderations: openAIModerations() },
  errorMessage: openAIErrorMessage,
  resolve(d) {
    const fixed = typeof d.options.mock_response === "string" ? d.options.mock_response : undefined;
    return { ...d, apiBase: MOCK_BASE, headers: fixed === undefined ? d.headers : { ...d.headers, [FIXED_REPLY]: encodeURIComponent(fixed) } };
  },
  async transport(call) {
    const body = call.form ? (Object.fromEntries(call.form) as WireJson) : (JSON.parse(call.body ?? "{}") as WireJson);
    const fixed = call.headers[FIXED_REPLY];
    return respond(call.url.slice(MOCK_BASE.length), body, fixed === undefined ? undefined : decodeURIComponent(fixed));
  },
};
