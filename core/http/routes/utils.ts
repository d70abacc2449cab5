/**
 * `/utils/*`: what a call would do, without making it. `token_counter` counts a prompt (locally
 * with OpenAI's tokenizer, or by the provider's own endpoint with `call_endpoint=true`),
 * `supported_openai_params` lists the request fields a model's adapter translates, and
 * `transform_request` shows the upstream request the adapter would build, credentials (and every
 * configured header value) redacted.
 * Any key may call them, for the models it may use.
 */
import { Elysia } from "elysia";
import type { ChatRequest, Deployment, Endpoint, EndpointAdapter, HttpCall, Principal, WireRequest } from "../../contract.ts";
import { missingQuery } from "../../authz.ts";
import { GatewayError } from "../../errors.ts";
import { geminiMessages } from "../../gemini-inbound/request.ts";
import { buildCall, splitCall } from "../../pipeline/call.ts";
import { withPathBeforeBaseQuery } from "../../pipeline/upstream.ts";
import { OPENAI_CHAT_PARAMS, OPENAI_EMBEDDING_PARAMS, paramsFor, supportedBody } from "../../pipeline/params.ts";
import { invalidModel } from "../../router/route.ts";
import { SECRET_QUERY_PARAM, withoutCredentials } from "../../secrets.ts";
import type { Snapshot } from "../../snapshot.ts";
import { canCountUpstream, countLocally, countUpstream, type TokenCount, tokenizerModel } from "../../tokens/count.ts";
import { deploymentFor } from "../../tokens/target.ts";
import type { AppDeps } from "../app.ts";
import { authenticate } from "../auth.ts";
import { queryFlag, readBody, validate } from "../validate.ts";

const badRequest = (message: string, param?: string) => GatewayError.of(400, message, "invalid_request_error", param ?? null);

// ---------------------------------------------------------------------------------------------
// token_counter

interface TokenCountResponse {
  total_tokens: number;
  request_model: string;
  model_used: string;
  tokenizer_type: string;
  original_response?: unknown;
}

async function tokenCounter(s: Snapshot, principal: Principal, body: Record<string, unknown>, callEndpoint: boolean, signal: AbortSignal): Promise<TokenCountResponse> {
  const model = body.model;
  if (typeof model !== "string" || model === "") throw badRequest("model is required: the model whose tokenizer counts the prompt.", "model");
  const { prompt, contents } = body;
  let messages: ChatRequest["messages"] | undefined;
  if (body.messages !== undefined && body.messages !== null) messages = (validate.chat({ model, messages: body.messages }) as ChatRequest).messages;
  else if (Array.isArray(contents)) messages = geminiMessages({ contents }).messages;
  if (!messages && typeof prompt !== "string") throw badRequest("Send the text to count as prompt (a string), messages (OpenAI chat messages) or contents (Gemini contents).");
  const d = deploymentFor(s, principal, model);
  let count: TokenCount;
  if (callEndpoint && d && canCountUpstream(s, d)) {
    const req: ChatRequest = { model, messages: messages ?? [{ role: "user", content: prompt as string }] };
    if (Array.isArray(body.tools)) req.tools = body.tools as ChatRequest["tools"];
    count = await countUpstream(s, d, req, signal);
  } else {
    count = await countLocally(d ? tokenizerModel(d) : model, { messages, prompt: typeof prompt === "string" ? prompt : undefined, tools: body.tools });
  }
  const out: TokenCountResponse = { total_tokens: count.total, request_model: model, model_used: d ? d.upstreamModel : model, tokenizer_type: count.tokenizerType };
  if (count.original !== undefined) out.original_response = count.original;
  return out;
}

// ---------------------------------------------------------------------------------------------
// supported_openai_params

function supportedParams(s: Snapshot, principal: Principal, model: string | null): string[] {
  if (!model) throw missingQuery("model", ": /utils/supported_openai_params?model=<model>.");
  const d = deploymentFor(s, principal, model);
  if (!d) throw invalidModel(model);
  const endpoints = s.providers.get(d.provider)?.endpoints ?? {};
  if (d.info.mode === "embedding") return [...((endpoints.embeddings && paramsFor(endpoints.embeddings, d)) ?? OPENAI_EMBEDDING_PARAMS)];
  const chat = endpoints.chat;
  if (!chat) return [];
  const supported = paramsFor(chat, d);
  if (!supported) return [...OPENAI_CHAT_PARAMS];
  // Streaming is accepted by every adapter that streams, whatever it declares.
  const streaming = chat.stream ? ["stream", "stream_options"] : [];
  return [...new Set([...supported, ...streaming])];
}

// ---------------------------------------------------------------------------------------------
// transform_request

const CALL_TYPES: Record<string, Endpoint> = {
  completion: "chat",
  acompletion: "chat",
  chat_completion: "chat",
  text_completion: "completions",
  atext_completion: "completions",
  embedding: "embeddings",
  aembedding: "embeddings",
  image_generation: "images",
  aimage_generation: "images",
};

const CREDENTIAL_HEADER_NAME = /^(authorization|proxy-authorization|cookie)$/i;
/** Header and query names that carry credentials: those of a query (secrets.ts) and the auth headers. */
const isSecretName = (name: string): boolean => CREDENTIAL_HEADER_NAME.test(name) || SECRET_QUERY_PARAM.test(name);
const REDACTED = "REDACTED";

/**
 * A call's headers as shown: the adapter's own credential headers by name, and by value every
 * header the deployment configures (any may carry a credential, whatever its name: `X-Custom-Auth`,
 * `Helicone-Auth`) and any holding one of its credentials.
 */
export function redactHeaders(headers: Record<string, string>, d: Deployment): Record<string, string> {
  const configured = new Set(Object.keys(d.headers ?? {}).map((h) => h.toLowerCase()));
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers)) {
    out[k] = isSecretName(k) || configured.has(k.toLowerCase()) || withoutCredentials(v, d) !== v ? REDACTED : v;
  }
  return out;
}

export function redactUrl(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return raw;
  }
  if (url.password) url.password = REDACTED;
  for (const name of [...url.searchParams.keys()]) if (isSecretName(name)) url.searchParams.set(name, REDACTED);
  return url.toString();
}

function parsedBody(call: HttpCall): unknown {
  if (call.body === undefined) return null;
  try {
    return JSON.parse(call.body);
  } catch {
    return call.body;
  }
}

/** The upstream call a model call would make (after the unsupported-parameter check), credentials redacted. */
function transformRequest(s: Snapshot, principal: Principal, body: Record<string, unknown>) {
  const callType = typeof body.call_type === "string" ? body.call_type : "completion";
  const endpoint = CALL_TYPES[callType];
  if (!endpoint) throw badRequest(`Unknown call_type '${callType}': use one of ${Object.keys(CALL_TYPES).join(", ")}.`, "call_type");
  const requestBody = body.request_body;
  if (requestBody === null || typeof requestBody !== "object" || Array.isArray(requestBody)) throw badRequest("request_body is required: the body of the call to transform.", "request_body");
  const req = validate[endpoint](requestBody) as WireRequest[typeof endpoint];
  const d = deploymentFor(s, principal, req.model);
  if (!d) throw invalidModel(req.model);
  const ep = s.providers.get(d.provider)?.endpoints[endpoint] as EndpointAdapter<typeof endpoint> | undefined;
  if (!ep) throw badRequest(`model ${req.model} (provider ${d.provider}) does not support ${endpoint}`, "model");
  const supported = paramsFor(ep, d);
  const sent = supported ? supportedBody(req, supported, d, s.settings.dropParams) : req;
  // A request the provider takes in parts (one call per input): the first part's call.
  const call = buildCall(ep, splitCall(ep, sent, d)?.[0] ?? sent, d, undefined);
  const shown = call.body === undefined ? call : { ...call, body: withoutCredentials(call.body, d) };
  return { raw_request_api_base: withoutCredentials(redactUrl(withPathBeforeBaseQuery(call, d.apiBase).url), d), raw_request_body: parsedBody(shown), raw_request_headers: redactHeaders(call.headers, d) };
}

export function utilsRoutes({ live }: AppDeps) {
  const guard = async (request: Request) => {
    const s = live.current;
    const url = new URL(request.url);
    const principal = await authenticate(s, request.headers, url.pathname, request.method);
    return { s, principal, url };
  };
  return new Elysia()
    .post(
      "/utils/token_counter",
      async ({ request }) => {
        const { s, principal, url } = await guard(request);
        const body = await readBody(request, s.settings.maxRequestBytes);
        const callEndpoint = queryFlag(url, "call_endpoint", body.call_endpoint === true);
        return Response.json(await tokenCounter(s, principal, body, callEndpoint, request.signal));
      },
      { parse: "none" },
    )
    .get("/utils/supported_openai_params", async ({ request }) => {
      const { s, principal, url } = await guard(request);
      return Response.json(supportedParams(s, principal, url.searchParams.get("model")));
    })
    .post(
      "/utils/transform_request",
      async ({ request }) => {
        const { s, principal } = await guard(request);
        return Response.json(transformRequest(s, principal, await readBody(request, s.settings.maxRequestBytes)));
      },
      { parse: "none" },
    );
}
