/** The Elysia app: maps HTTP onto the framework-free pipeline and answers every error in the spec's envelope. */
import { Elysia } from "elysia";
import type { Endpoint, Logger, WireRequest } from "../contract.ts";
import { readAudioLength } from "../cost/audio-length.ts";
import { GatewayError, bodyTooLarge, errorInfo, errorResponse } from "../errors.ts";
import type { Live } from "../live.ts";
import type { HostServices } from "../services.ts";
import { adminRoutes } from "./admin/index.ts";
import { newCallId } from "../pipeline/call.ts";
import { modelCall } from "../router/route.ts";
import { authenticate } from "./auth.ts";
import { healthRoutes, type Probes } from "./routes/health.ts";
import { geminiRoutes } from "./routes/gemini.ts";
import { modelRoutes } from "./routes/models.ts";
import { NO_SUCH_ROUTE, passThroughRoutes } from "./routes/pass-through.ts";
import { utilsRoutes } from "./routes/utils.ts";
import { servedRoutes } from "./served-routes.ts";
import { storeErrorCause } from "../store/sql.ts";
import { invalidPathParam, readBodyWithText, readForm, validate } from "./validate.ts";

export interface AppDeps {
  live: Live;
  log: Logger;
  probes: Probes;
  services: HostServices;
}

/** The path forms the spec lists for each model-call endpoint. */
const CALL_PATHS: Record<Endpoint, string> = {
  chat: "chat/completions",
  completions: "completions",
  embeddings: "embeddings",
  images: "images/generations",
  transcriptions: "audio/transcriptions",
  speech: "audio/speech",
  moderations: "moderations",
};

/** Endpoints whose `model` may be left out (the spec's), and the kind of model that then answers. */
const OPTIONAL_MODEL: Partial<Record<Endpoint, "moderation" | "image_generation">> = { moderations: "moderation", images: "image_generation" };

/** The path of a request URL without building a URL object (this runs on every call). */
function pathOf(url: string): string {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start < 0) return "/";
  const q = url.indexOf("?", start);
  return q < 0 ? url.slice(start) : url.slice(start, q);
}

/** Longest message, and longest stack, an unhandled error's log line keeps. */
const LOGGED_CHARS = 2000;

const bounded = (text: string) => (text.length > LOGGED_CHARS ? `${text.slice(0, LOGGED_CHARS)}… (${text.length} characters)` : text);

/**
 * An unhandled error for the log: its message and its stack's frames, each bounded, and what
 * failed under it (storeErrorCause). A failed statement's message (drizzle's) holds the statement
 * and every parameter: a megabyte per request for a list of 70,000 ids, logged whole.
 */
export function loggedError(error: unknown): Record<string, unknown> {
  if (!(error instanceof Error)) return { error: bounded(String(error)) };
  const frames = (error.stack ?? "").split("\n").filter((line) => /^\s+at /.test(line));
  return { error: bounded(`${error.name}: ${error.message}`), stack: bounded(frames.join("\n")), ...(error.cause === undefined ? {} : { cause: storeErrorCause(error.cause) }) };
}

export function createApp(deps: AppDeps) {
  const { live, log } = deps;

  /** `pathModel`: the model the path names, decoded; null when its percent-encoding is invalid. */
  async function handleCall(endpoint: Endpoint, request: Request, pathModel: string | null | undefined): Promise<Response> {
    const pin = live.pin();
    try {
      const principal = await authenticate(pin.snapshot, request.headers, pathOf(request.url), request.method);
      if (pathModel === null) throw invalidPathParam("model");
      // An uploaded file comes as a multipart form; there are then no client bytes to forward as they are.
      const limit = pin.snapshot.settings.maxRequestBytes;
      const { body, text } = endpoint === "transcriptions" ? { body: await readForm(request, limit), text: undefined } : await readBodyWithText(request, JSON.parse, limit);
      // Budgets reserve for the audio's length where its header tells it (cost/audio-length.ts).
      if (endpoint === "transcriptions" && body.file instanceof Blob) await readAudioLength(body.file);
      let changed = false;
      if (pathModel && body.model !== pathModel) {
        body.model = pathModel;
        changed = true;
      } else if (body.model === undefined && endpoint === "completions") {
        const queryModel = new URL(request.url).searchParams.get("model");
        if (queryModel) {
          body.model = queryModel;
          changed = true;
        }
      }
      const mode = OPTIONAL_MODEL[endpoint];
      if (mode && body.model === undefined) {
        const group = pin.snapshot.models.defaultGroup(mode);
        if (!group) throw GatewayError.of(400, `No model given, and no ${mode} model is configured (a model with model_info.mode: ${mode}).`, "invalid_request_error", "model");
        body.model = group;
        changed = true;
      }
      if (endpoint === "embeddings" && body.input === undefined) {
        body.input = [];
        changed = true;
      }
      const req = validate[endpoint](body) as WireRequest[typeof endpoint];
      return await modelCall(endpoint, req, {
        snapshot: pin.snapshot,
        principal,
        clientSignal: request.signal,
        callId: newCallId(),
        log,
        release: pin.release,
        rawBody: changed ? undefined : text,
      });
    } catch (err) {
      pin.release();
      throw err;
    }
  }

  const app = new Elysia({ precompile: true })
    // An announced body over the limit is refused before it is read, on every route (pass-through too).
    .onRequest(({ request }) => {
      const limit = live.current.settings.maxRequestBytes;
      if (Number(request.headers.get("content-length") ?? 0) > limit) {
        const tooLarge = bodyTooLarge(limit);
        return errorResponse(tooLarge.info, tooLarge.headers);
      }
    })
    .onError(({ code, error }) => {
      if (error instanceof GatewayError) return errorResponse(error.info, error.headers);
      if (code === "NOT_FOUND") return errorResponse(errorInfo(404, NO_SUCH_ROUTE, "not_found_error"));
      if (code === "PARSE") return errorResponse(errorInfo(400, "Request body could not be parsed.", "invalid_request_error"));
      // The client left mid-call (its upstream request was aborted): nobody reads this answer, and nothing went wrong here.
      if (error instanceof DOMException && error.name === "AbortError") return errorResponse(errorInfo(499, "The client closed the request.", "client_closed_request"));
      log.error("unhandled error", loggedError(error));
      return errorResponse(errorInfo(500, "Internal server error. The gateway logged the details.", "internal_server_error"));
    })
    .use(healthRoutes(deps))
    .use(modelRoutes(deps))
    .use(geminiRoutes(deps))
    .use(utilsRoutes(deps))
    .use(adminRoutes(deps));

  for (const endpoint of Object.keys(CALL_PATHS) as Endpoint[]) {
    const suffix = CALL_PATHS[endpoint];
    const handler = ({ request }: { request: Request }) => handleCall(endpoint, request, undefined);
    // The router has decoded `:model` already (decoding again would turn `%2525` into `%` and throw on `%25`); it is null when the encoding is invalid.
    const withModel = ({ request, params }: { request: Request; params: { model: string | null } }) => handleCall(endpoint, request, params.model);
    app
      .post(`/${suffix}`, handler, { parse: "none" })
      .post(`/v1/${suffix}`, handler, { parse: "none" })
      .post(`/openai/deployments/:model/${suffix}`, withModel, { parse: "none" })
      .post(`/engines/:model/${suffix}`, withModel, { parse: "none" });
  }
  // Last: it takes every path the routes above do not serve.
  return app.use(passThroughRoutes(deps, servedRoutes(app.routes)));
}
