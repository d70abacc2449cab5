/**
 * `azure/<deployment>`: Azure OpenAI. The wire format is OpenAI's (the OpenAI transforms are reused);
 * Azure differs in the address (`{api_base}/openai/deployments/{deployment}/…?api-version=…`, or
 * `{api_base}/openai/v1/…` with `api_version: v1`), in credentials (`api-key`, or Entra ID tokens)
 * and in its content filter (see stream.ts; refusals are content-policy errors).
 */
import type { Deployment, Endpoint, EndpointAdapter, ProviderAdapter } from "../../core/contract.ts";
import { openAIChat, openAICompletions, openAIEmbeddings, openAIErrorMessage, openAIImages, openAISpeech } from "../openai-compatible/adapter.ts";
import { openAITranscriptions } from "../openai-compatible/transcriptions.ts";
import { upstreamErrorKind } from "../shared/error-kind.ts";
import { answerModelOf, withAnswerModel } from "./answer-model.ts";
import { azureAuth, findAzureAuth, staticAuthHeaders, withAzureAuth } from "./credentials.ts";
import { EntraTokenCache } from "./entra-token.ts";
import { azureStream } from "./stream.ts";

/** The latest generally available data-plane API version (AZURE_API_VERSION or `api_version` override it). */
export const AZURE_DEFAULT_API_VERSION = "2024-10-21";

/** The version-less v1 API (`/openai/v1/…`, the model named in the body). */
const V1 = "v1";

export function azureUrl(d: Deployment, path: string): string {
  if (d.apiVersion === V1) return `${d.apiBase}/openai/v1${path}`;
  return `${d.apiBase}/openai/deployments/${encodeURIComponent(d.upstreamModel)}${path}?api-version=${encodeURIComponent(d.apiVersion ?? AZURE_DEFAULT_API_VERSION)}`;
}

/** The first dated API version that takes `stream_options` (older ones refuse the field). */
const STREAM_OPTIONS_SINCE = "2024-09-01";

/**
 * On an older api-version the usage the gateway asks for cannot be asked for: the field is taken
 * out (the stream's usage is then estimated) rather than have Azure refuse the whole request.
 */
function withoutStreamOptions(body: string | undefined, d: Deployment): string | undefined {
  const v = d.apiVersion ?? AZURE_DEFAULT_API_VERSION;
  if (body === undefined || v === V1 || !/^\d{4}-\d{2}-\d{2}/.test(v) || v >= STREAM_OPTIONS_SINCE || !body.includes('"stream_options"')) return body;
  const parsed = JSON.parse(body) as Record<string, unknown>;
  delete parsed.stream_options;
  return JSON.stringify(parsed);
}

/** An OpenAI endpoint adapter readdressed to Azure, with the deployment's static credentials. */
function onAzure<E extends Endpoint, S>(inner: EndpointAdapter<E, S>, path: string): EndpointAdapter<E, unknown> {
  const adapter: EndpointAdapter<E, unknown> = {
    request(req, d, raw) {
      // A key goes in `api-key` (azureAuth), not as OpenAI's bearer token.
      const call = inner.request(req, d.apiKey === undefined ? d : { ...d, apiKey: undefined }, raw);
      return { ...call, url: azureUrl(d, path), headers: { ...call.headers, ...staticAuthHeaders(azureAuth(d)) }, body: withoutStreamOptions(call.body, d) };
    },
    response(body, req) {
      const answer = inner.response(body, req);
      return { ...answer, usage: withAnswerModel(answer.usage, answerModelOf(body)) };
    },
  };
  if (inner.stream) adapter.stream = azureStream(inner.stream);
  if (inner.textResponse) adapter.textResponse = inner.textResponse;
  if (inner.binaryUsage) adapter.binaryUsage = inner.binaryUsage;
  return adapter;
}

export function azureAdapter(tokens: EntraTokenCache): ProviderAdapter {
  return {
    ids: ["azure"],
    endpoints: {
      chat: onAzure(openAIChat(), "/chat/completions"),
      completions: onAzure(openAICompletions(), "/completions"),
      embeddings: onAzure(openAIEmbeddings(), "/embeddings"),
      images: onAzure(openAIImages(), "/images/generations"),
      transcriptions: onAzure(openAITranscriptions(), "/audio/transcriptions"),
      speech: onAzure(openAISpeech(), "/audio/speech"),
    },
    errorMessage: openAIErrorMessage,
    // Azure's refusals (`code: content_filter`, "content management policy") and `context_length_exceeded`.
    errorKind: upstreamErrorKind,
    resolve(d) {
      const apiBase = (d.apiBase ?? process.env.AZURE_API_BASE)?.replace(/\/+$/, "");
      if (!apiBase) return "azure needs svc_params.api_base (https://<resource>.openai.azure.com) or AZURE_API_BASE";
      const auth = findAzureAuth(d);
      if (!auth) return "azure needs api_key (or AZURE_API_KEY), azure_ad_token, or tenant_id + client_id + client_secret for Entra ID";
      const apiVersion = d.apiVersion ?? process.env.AZURE_API_VERSION ?? AZURE_DEFAULT_API_VERSION;
      return withAzureAuth({ ...d, apiBase, apiVersion }, auth);
    },
    async authorize(call, d) {
      const auth = azureAuth(d);
      if (auth?.kind !== "client-credentials") return call;
      return { ...call, headers: { ...call.headers, authorization: `Bearer ${await tokens.token(auth)}` } };
    },
  };
}

/** Tokens are cached per credential set for the life of the process, across config reloads. */
export const azureProvider = azureAdapter(new EntraTokenCache());
