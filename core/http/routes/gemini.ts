/**
 * Gemini-style routes: `POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent` and
 * `:countTokens` (also without `/v1beta`, and under `/v1`). The Gemini body is translated into the
 * gateway's OpenAI chat request and called like /chat/completions, so access, limits, budgets and
 * spend apply unchanged to any model the gateway serves; the answer is translated back. Errors
 * are in Google's shape. The key may also come as `x-goog-api-key` or `?key=`, as Google's SDKs send it.
 */
import { Elysia } from "elysia";
import type { ChatRequest, Usage } from "../../contract.ts";
import { GatewayError, errorInfo } from "../../errors.ts";
import { countTokensResponse } from "../../gemini-inbound/count.ts";
import { googleErrorResponse } from "../../gemini-inbound/errors.ts";
import { geminiMessages, geminiToChat, renderOptions } from "../../gemini-inbound/request.ts";
import { chatToGemini } from "../../gemini-inbound/response.ts";
import { geminiStream } from "../../gemini-inbound/stream.ts";
import { isObject } from "../../gemini-inbound/types.ts";
import type { Pin } from "../../live.ts";
import { newCallId } from "../../pipeline/call.ts";
import { invalidModel, modelCall } from "../../router/route.ts";
import { canCountUpstream, countLocally, countUpstream, tokenizerModel } from "../../tokens/count.ts";
import { deploymentFor } from "../../tokens/target.ts";
import type { AppDeps } from "../app.ts";
import { authenticate, credentialOf } from "../auth.ts";
import { decodePathParam, queryFlag, readBody, validate } from "../validate.ts";

type Action = "generateContent" | "streamGenerateContent" | "countTokens";
const ACTIONS: ReadonlySet<string> = new Set<Action>(["generateContent", "streamGenerateContent", "countTokens"]);

/** The request's headers, with Google's `?key=` as the bearer credential when no header carries one. */
function withGoogleKey(request: Request, url: URL): Headers {
  if (credentialOf(request.headers)) return request.headers;
  const key = url.searchParams.get("key");
  if (!key) return request.headers;
  const headers = new Headers(request.headers);
  headers.set("authorization", `Bearer ${key}`);
  return headers;
}

/** `gpt-4o:generateContent` (or `openai/gpt-4o:generateContent`) → model and action. */
function target(tail: string): { model: string; action: Action } {
  const colon = tail.lastIndexOf(":");
  const action = colon < 0 ? "" : tail.slice(colon + 1);
  const model = colon < 0 ? tail : tail.slice(0, colon);
  if (!ACTIONS.has(action) || !model) {
    throw GatewayError.of(404, `Method not found: use models/{model}:generateContent, :streamGenerateContent or :countTokens (got '${tail}').`, "not_found_error");
  }
  return { model, action: action as Action };
}

/** The gateway's headers on a call's answer (model id, call id, cost), without the body's own. */
function passHeaders(res: Response): Record<string, string> {
  const out: Record<string, string> = {};
  res.headers.forEach((v, k) => {
    if (k !== "content-type" && k !== "content-length") out[k] = v;
  });
  return out;
}

export function geminiRoutes({ live, log }: AppDeps) {
  async function generate(request: Request, url: URL, pin: Pin, model: string, stream: boolean): Promise<Response> {
    const principal = await authenticate(pin.snapshot, withGoogleKey(request, url), url.pathname, request.method);
    const body = await readBody(request, pin.snapshot.settings.maxRequestBytes);
    const req = validate.chat(geminiToChat(body, model, stream)) as ChatRequest;
    // The last record is the answering attempt's: its usage is what was logged and priced.
    let recorded: Usage | undefined;
    const res = await modelCall("chat", req, {
      snapshot: pin.snapshot,
      principal,
      clientSignal: request.signal,
      callId: newCallId(),
      log,
      release: pin.release,
      onRecord: (record) => {
        recorded = record.usage;
      },
    });
    const opts = renderOptions(body);
    if (stream) return geminiStream(res, url.searchParams.get("alt") === "sse" ? "sse" : "json", opts, passHeaders(res), () => recorded);
    const out = chatToGemini(await res.json(), opts, recorded);
    return new Response(JSON.stringify(out), { headers: { ...passHeaders(res), "content-type": "application/json; charset=UTF-8" } });
  }

  /** Counted by the provider when its adapter can (unless `?call_endpoint` is false: `false`, `0`, `no`, `off`), else locally. */
  async function countTokens(request: Request, url: URL, pin: Pin, model: string): Promise<Response> {
    const { snapshot } = pin;
    const principal = await authenticate(snapshot, withGoogleKey(request, url), url.pathname, request.method);
    const body = await readBody(request, pin.snapshot.settings.maxRequestBytes);
    const inner = isObject(body.generateContentRequest) ? body.generateContentRequest : body;
    const { messages, tools } = geminiMessages(inner);
    const d = deploymentFor(snapshot, principal, model);
    if (!d) throw invalidModel(model);
    const count =
      messages.length === 0
        ? { total: 0, image: 0, tokenizerType: "none" }
        : queryFlag(url, "call_endpoint", true) && canCountUpstream(snapshot, d)
          ? await countUpstream(snapshot, d, { model, messages, ...(tools ? { tools } : {}) }, request.signal)
          : await countLocally(tokenizerModel(d), { messages, tools });
    return Response.json(countTokensResponse(count, messages));
  }

  const handle = async ({ request, params }: { request: Request; params: Record<string, string> }) => {
    const pin = live.pin();
    try {
      const url = new URL(request.url);
      const { model, action } = target(decodePathParam(params["*"] ?? "", "model"));
      if (action === "countTokens") {
        try {
          return await countTokens(request, url, pin, model);
        } finally {
          pin.release();
        }
      }
      // The call releases the pin once its answer (or stream) has ended.
      return await generate(request, url, pin, model, action === "streamGenerateContent");
    } catch (err) {
      pin.release();
      if (err instanceof GatewayError) return googleErrorResponse(err.info, err.headers);
      log.error("unhandled error on a Gemini route", { error: err instanceof Error ? (err.stack ?? err.message) : String(err) });
      return googleErrorResponse(errorInfo(500, "Internal server error. The gateway logged the details."));
    }
  };

  return new Elysia().post("/v1beta/models/*", handle, { parse: "none" }).post("/models/*", handle, { parse: "none" }).post("/v1/models/*", handle, { parse: "none" });
}
