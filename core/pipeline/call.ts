/**
 * One attempt at one deployment, framework-free: the adapter builds the upstream call → fetch →
 * map the response or stream back → price and record the call. The router (core/router/route.ts)
 * decides which deployment, and holds the limits and budgets.
 */
import type { CallIntent, CallRecord, GroupCapacity, HttpCall, CallStatus, Denied, Deployment, Endpoint, EndpointAdapter, ErrorInfo, Lease, Logger, Principal, ProviderAdapter, StreamTransform, Usage, WireJson, WireRequest } from "../contract.ts";
import { type PromptSize, promptSize } from "../cost/estimate.ts";
import { knownAudioSeconds } from "../cost/audio-length.ts";
import type { CallCost } from "../cost/pricing.ts";
import { MAX_COUNT, countableUsage } from "../cost/countable-usage.ts";
import { answersBilled, maxOutput, transcriptionBound, worstCaseOf } from "../cost/worst-case.ts";
import { groupCapacity, type ModelReach } from "../limits/capacity.ts";
import { IMAGE_QUALITIES, IMAGE_SIZES, imagesAsked } from "../wire.ts";
import { picoToText } from "../cost/money.ts";
import { ErrorInAnswer, GatewayError, errorInfo } from "../errors.ts";
import { headerText } from "../header-text.ts";
import { countsTokens, openAIUsage } from "../openai-usage.ts";
import { beforeTimeout } from "../timer.ts";
import type { Gate, Snapshot } from "../snapshot.ts";
import { assembleStream } from "../stream/assemble.ts";
import { AnswerTooLarge, answerBytes, answerText } from "./answer-body.ts";
import { refuseInwardApiBase, withClientCredentials } from "./client-credentials.ts";
import { paramsFor, supportedBody } from "./params.ts";
import { cancelAll, dispatchRecord } from "./record.ts";
import { errorWithoutPrompt } from "./prompt-echo.ts";
import { streamResponse } from "./stream.ts";
import { Deadline, errorCode, errorInAnswer, send, timeoutError, upstreamError } from "./upstream.ts";

/**
 * A new call id (`x-svc-call-id`, the spend log's key): UUIDv7, ordered by time, so the log's
 * primary key grows at its right edge instead of touching random pages of a large index.
 */
export const newCallId = (): string => Bun.randomUUIDv7();

export interface CallContext {
  snapshot: Snapshot;
  principal: Principal;
  /** Aborts when the client disconnects. */
  clientSignal: AbortSignal;
  /** From `newCallId`. */
  callId: string;
  log: Logger;
  /** Releases the snapshot pin; called once the response (or stream) has ended. */
  release(): void;
  /** False for calls the gateway makes itself (health probes): no spend, no callbacks. */
  record?: boolean;
  /** The client's body text when the gateway changed nothing in it (see EndpointAdapter.request). */
  rawBody?: string;
  /**
   * Hears every record of the call as it is made (a stream's at its end, before the stream
   * closes): a route that answers in another format reports the usage the call was logged with.
   */
  onRecord?(record: CallRecord): void;
}

export const ZERO: Usage = { promptTokens: 0, completionTokens: 0 };

/** A gate's refusal of a call, as answered. */
export class Refusal extends GatewayError {
  constructor(
    info: ErrorInfo,
    headers: Record<string, string>,
    /** See Denied.groupCapacity. */
    readonly groupCapacity: boolean,
  ) {
    super(info, headers);
  }
}

function denied(result: Denied): Refusal {
  const headers: Record<string, string> = { ...result.headers };
  if (result.retryAfterSeconds !== undefined) headers["retry-after"] = String(result.retryAfterSeconds);
  return new Refusal(result.error, headers, result.groupCapacity === true);
}

/**
 * Asks every gate in turn; the first refusal takes back what the others granted. Stays
 * synchronous while the gates answer synchronously (the common case: no budget applies), so a
 * call pays no extra event-loop turns for gates that have nothing to say.
 */
/**
 * The longest an asynchronous gate may take (a budget's first reading of a stored spend may take
 * seconds). A plugin's gate that never answers would hold the call, and what the gates before it
 * granted (a parallel-request slot), for good. A test shortens it on this object.
 */
export const gateTiming = { timeoutMs: 30_000 };

/** `result`, or a 503 once it took gateTiming.timeoutMs; a grant that comes after that is given back. */
function withinGateTime(result: Promise<Lease | Denied>): Promise<Lease | Denied> {
  const tooLate = () => GatewayError.of(503, `A rate-limit or budget check did not answer within ${gateTiming.timeoutMs / 1000} s; the call was not made.`, "api_error");
  return beforeTimeout(result, gateTiming.timeoutMs, tooLate, (r) => {
    if (r.ok) cancelAll([r]);
  });
}

export function acquireLeases(gates: readonly Gate[], intent: CallIntent): Lease[] | Promise<Lease[]> {
  const granted: Lease[] = [];
  /** A gate that fails (a plugin's bug, its backend down) takes back what the others granted, as a refusal does. */
  const failed = (err: unknown): never => {
    cancelAll(granted);
    throw err;
  };
  const step = (i: number): Lease[] | Promise<Lease[]> => {
    for (; i < gates.length; i++) {
      let result: ReturnType<Gate>;
      try {
        result = gates[i]!(intent);
      } catch (err) {
        return failed(err);
      }
      if (result instanceof Promise) {
        const next = i + 1;
        return withinGateTime(result).then((r) => {
          if (!r.ok) {
            cancelAll(granted);
            throw denied(r);
          }
          granted.push(r);
          return step(next);
        }, failed);
      }
      if (!result.ok) {
        cancelAll(granted);
        throw denied(result);
      }
      granted.push(result);
    }
    return granted;
  };
  return step(0);
}

/** The intent of a call; the prompt estimate and the worst case are computed only if a gate asks. */
export class Intent implements CallIntent {
  private prompt: PromptSize | undefined;
  private worst: bigint | undefined;
  private capacity: GroupCapacity | undefined;
  private names: string[] | undefined;
  readonly maxOutputTokens: number | undefined;
  readonly answers: number;

  constructor(
    readonly principal: Principal,
    readonly endpoint: Endpoint,
    readonly modelGroup: string,
    readonly deployment: Deployment,
    readonly startedAt: number,
    private readonly body: WireRequest[Endpoint],
    private readonly snapshot: Snapshot,
    readonly scope: "request" | "group" | "both" = "group",
  ) {
    this.maxOutputTokens = maxOutput(body);
    this.answers = answersBilled(endpoint, body);
  }

  get capacityGroup(): string {
    return this.snapshot.models.servingName(this.modelGroup) ?? this.modelGroup;
  }

  get groupCapacity(): GroupCapacity {
    this.capacity ??= groupCapacity(this.snapshot.models.servingDeployments(this.capacityGroup) ?? [this.deployment]);
    return this.capacity;
  }

  get modelReach(): ModelReach {
    return this.snapshot;
  }

  get modelNames(): readonly string[] {
    if (!this.names) {
      this.names = [this.modelGroup];
      for (const [alias, { group }] of this.snapshot.groupAliases) if (group === this.modelGroup) this.names.push(alias);
    }
    return this.names;
  }

  get estimatedPromptTokens(): number {
    this.prompt ??= promptSize(this.endpoint, this.body);
    return this.prompt.estimate;
  }

  get promptTokenBound(): number {
    this.prompt ??= promptSize(this.endpoint, this.body);
    return this.prompt.bound;
  }

  get worstCaseCost(): bigint {
    this.worst ??= worstCaseOf(this.endpoint, this.body, this.deployment, this.snapshot.pricing, this.promptTokenBound, this.maxOutputTokens, chargedCallMs(this.body, this.deployment, this.snapshot));
    return this.worst;
  }
}

/** The headers every model-call answer carries, with its content type. */
export function responseHeaders(d: Deployment, callId: string, contentType: string): Record<string, string> {
  return { "content-type": contentType, "x-svc-model-id": headerText(d.id), "x-svc-call-id": callId, "x-svc-model-group": headerText(d.modelName) };
}

/** OpenAI's own rate-limit headers, passed on where no gateway limit of that kind applies (a gateway limit's headers win). */
const UPSTREAM_LIMIT_HEADERS = ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens"] as const;

function withUpstreamLimits(headers: Record<string, string>, upstream: Headers, adapter: ProviderAdapter): void {
  if (adapter.rateLimitHeaders) {
    Object.assign(headers, adapter.rateLimitHeaders(upstream));
    return;
  }
  for (const h of UPSTREAM_LIMIT_HEADERS) {
    const v = upstream.get(h);
    if (v !== null) headers[h] = v;
  }
}

/** Deployments already warned about: a server that always reports fractions warns once, not per call. */
const warnedUncountable = new Set<string>();

function warnUncountable(d: Deployment, reported: Usage, log: Logger): void {
  if (warnedUncountable.has(d.id)) return;
  warnedUncountable.add(d.id);
  log.warn(`usage that cannot be counted as reported (a fraction, a negative, more than ${MAX_COUNT}, a part larger than its total) was rounded and bounded before pricing`, {
    deployment: d.id,
    provider: d.provider,
    usage: JSON.stringify(reported),
  });
}

/** What the router attaches to one attempt at a deployment. */
export interface Attempt {
  /** Extra headers for the answer (rate limits, retries, fallbacks). */
  headers?: Record<string, string>;
  /** When the call started, if earlier than this attempt (budgets charge the period a call started in). */
  startedAt?: number;
  /** Receives the answer's bytes as sent (the JSON body, or each piece of a stream), before `ended`. */
  capture?(text: string): void;
  /** Told once when the call ends (for streams: when the stream ends), after its cost is known. */
  ended?(record: CallRecord): void;
}

/**
 * Seconds an attempt at `d` may take: the request's own `timeout` (on every endpoint), for a
 * stream the deployment's `stream_timeout` (LiteLLM's; it was accepted and never applied), the
 * deployment's `timeout`, the gateway's.
 */
export function attemptTimeout(body: WireRequest[Endpoint], d: Deployment, snapshot: Snapshot): number {
  const t = (body as { timeout?: unknown }).timeout;
  if (typeof t === "number" && t > 0) return t;
  return deploymentTimeout(body, d, snapshot);
}

/** An attempt's timeout but for the request's own `timeout`: the deployment's (its stream_timeout for a stream), else the gateway's. */
export function deploymentTimeout(body: WireRequest[Endpoint], d: Deployment, snapshot: Snapshot): number {
  const streamTimeout = d.options.stream_timeout;
  if ((body as { stream?: unknown }).stream === true && typeof streamTimeout === "number" && streamTimeout > 0) return streamTimeout;
  return d.timeout ?? snapshot.settings.requestTimeout;
}

/**
 * The longest a call at `d` is charged for, when its model is priced per second of the call: its
 * attempt's timeout, which is what budgets reserve for it. A JSON answer cannot take longer; a
 * stream (whose timeout is the longest wait between its parts) that runs longer is charged this.
 */
export function chargedCallMs(body: WireRequest[Endpoint], d: Deployment, snapshot: Snapshot): number {
  return attemptTimeout(body, d, snapshot) * 1000;
}

function requestTags(body: WireRequest[Endpoint], principal: Principal): string[] {
  const fromBody = (body as { metadata?: { tags?: unknown } | null }).metadata?.tags;
  const tags = Array.isArray(fromBody) ? fromBody.filter((t): t is string => typeof t === "string") : [];
  for (const t of principal.key?.tags ?? []) if (!tags.includes(t)) tags.push(t);
  return tags;
}

/** Whether the client asked for a stream (embeddings never stream). */
export function wantsStream(endpoint: Endpoint, body: WireRequest[Endpoint]): boolean {
  return endpoint !== "embeddings" && (body as { stream?: boolean | null }).stream === true;
}

/** What a call record says beyond who called what. */
type RecordFields = Pick<CallRecord, "stream" | "status" | "usage" | "cost" | "priced" | "costSource" | "responseId" | "cacheHit" | "startedAt" | "firstByteAt" | "error" | "prompt" | "answer"> &
  Partial<Pick<CallRecord, "endedAt">>;

/** What a request asked, for the spend log when prompts are stored: never the rest of the body (it may carry credentials). */
export function promptOf(body: WireRequest[Endpoint]): unknown {
  const b = body as { messages?: unknown; prompt?: unknown; input?: unknown };
  return b.messages ?? b.prompt ?? b.input;
}

/** Embedding vectors and generated images are not kept with a stored prompt: the input says what was asked, they are bulk in a log. */
const keepsAnswer = (endpoint: Endpoint): boolean => endpoint !== "embeddings" && endpoint !== "images";

/** The answer to keep with a stored prompt, from the text the client got (see keepsAnswer). */
export function storedAnswer(endpoint: Endpoint, stream: boolean, text: string): unknown {
  if (!keepsAnswer(endpoint)) return undefined;
  if (stream) return assembleStream(text, endpoint as "chat" | "completions");
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** The record of a finished call (an upstream attempt, or an answer from the cache). */
export function callRecord(ctx: CallContext, endpoint: Endpoint, body: WireRequest[Endpoint], d: Deployment, f: RecordFields): CallRecord {
  return {
    id: ctx.callId,
    endpoint,
    principal: ctx.principal,
    modelGroup: d.modelName,
    provider: d.provider,
    deploymentId: d.id,
    upstreamModel: d.upstreamModel,
    requestedModel: body.model,
    endUser: typeof (body as { user?: unknown }).user === "string" ? (body as { user: string }).user : undefined,
    tags: requestTags(body, ctx.principal),
    endedAt: Date.now(),
    ...f,
    // Kept in the spend log and sent to webhooks and callbacks: never with the prompt an upstream quoted.
    error: f.error && errorWithoutPrompt(f.error, body),
  };
}

/**
 * An image model priced per size and quality (dall-e-3, gpt-image-1) asked for a size or quality
 * it has no price for ("13x7", "ultra") is refused: OpenAI refuses them, and a compatible server
 * that made such images would have them logged and budgeted at $0.
 */
function refuseUnpricedImageVariant(snapshot: Snapshot, d: Deployment, req: WireRequest["images"]): void {
  const asked = imagesAsked(req);
  if (asked.size === undefined && asked.quality === undefined) return;
  const { pricing } = snapshot;
  // A model priced per size and quality has a price for its default one.
  if (!pricing.hasVariantPrice(d, {}) || pricing.hasVariantPrice(d, asked)) return;
  const what = [asked.size === undefined ? "" : `size ${asked.size}`, asked.quality === undefined ? "" : `quality ${asked.quality}`].filter(Boolean).join(" and ");
  const made = pricing.imageVariants(d, IMAGE_SIZES, IMAGE_QUALITIES);
  const suggested = [`sizes ${made.sizes.join(", ")}`, made.qualities.length > 0 ? `qualities ${made.qualities.join(", ")}` : ""].filter(Boolean).join("; ");
  throw GatewayError.of(400, `${req.model} has no price for ${what}: use a size and quality it makes (${suggested}).`, "invalid_request_error", asked.size !== undefined && !pricing.hasVariantPrice(d, { size: asked.size }) ? "size" : "quality");
}

/** The usage an answer is charged for, where what it reports says too little. */
function answeredUsage<E extends Endpoint>(snapshot: Snapshot, d: Deployment, endpoint: E, reported: Usage, body: WireRequest[E]): Usage {
  if (endpoint === "images") return pricedImages(snapshot, d, reported, body as WireRequest["images"]);
  if (endpoint === "transcriptions") return withAudioLength(reported, body as WireRequest["transcriptions"]);
  return reported;
}

/**
 * A transcription answer telling neither its audio's length nor its tokens (a bare `{text}`, a
 * text format) is charged for the length the gateway read from the file (a WAV header), as
 * budgets reserved for it; one whose length it could not read, what was reserved (in `finish`).
 */
function withAudioLength(usage: Usage, req: WireRequest["transcriptions"]): Usage {
  if ((usage.audioSeconds ?? 0) > 0 || usage.promptTokens > 0 || usage.completionTokens > 0) return usage;
  const seconds = knownAudioSeconds(req.file);
  return seconds === undefined ? usage : { ...usage, audioSeconds: seconds };
}

/**
 * The images an answer is charged for: at the size and quality it says it made (gpt-image-1's
 * choice for `auto`) when the model has a price for them, else at those asked, which were checked
 * before the call: a compatible server reporting one with no price ("13x7", "ultra") does not
 * make the images free.
 */
function pricedImages(snapshot: Snapshot, d: Deployment, usage: Usage, req: WireRequest["images"]): Usage {
  const made = usage.images;
  const { pricing } = snapshot;
  if (!made || !pricing.hasVariantPrice(d, {}) || pricing.hasVariantPrice(d, made)) return usage;
  const { size, quality } = imagesAsked(req);
  return { ...usage, images: { count: made.count, size, quality } };
}

/** Calls one chosen deployment once; the attempt hears how it ended. */
export async function callDeployment<E extends Endpoint>(endpoint: E, body: WireRequest[E], configured: Deployment, ctx: CallContext, attempt: Attempt = {}): Promise<Response> {
  const startedAt = attempt.startedAt ?? Date.now();
  const { snapshot } = ctx;
  const credentialed = withClientCredentials(endpoint, body, configured, snapshot.settings);
  const inward = refuseInwardApiBase(endpoint, body, snapshot.settings);
  const connectTo = inward ? await inward : undefined;
  const d = connectTo ? { ...credentialed, connectTo } : credentialed;
  const adapter = snapshot.providers.get(d.provider)!;
  const ep = adapter.endpoints[endpoint] as EndpointAdapter<E, unknown> | undefined;
  if (!ep) throw GatewayError.of(400, `model ${body.model} (provider ${d.provider}) does not support ${endpoint}`, "invalid_request_error", "model");
  const streams = wantsStream(endpoint, body);
  if (streams && !ep.stream) throw GatewayError.of(400, `provider ${d.provider} does not support streaming ${endpoint}`, "invalid_request_error", "stream");
  if (endpoint === "images") refuseUnpricedImageVariant(snapshot, d, body as WireRequest["images"]);

  // With prompts stored: the answer as the client got it (a stream's text is assembled at its end).
  const keepPrompt = snapshot.settings.storePrompts && ctx.record !== false;
  const streamed: string[] | undefined = keepPrompt && streams ? [] : undefined;
  let answer: unknown;
  let finished = false;
  const maxCallMs = chargedCallMs(body, d, snapshot);
  /**
   * Ends the call once: prices it, tells the attempt, then hands the record on. Returns the cost.
   * `billed`: a failure that used something the upstream bills (parts of a split call answered
   * before one failed) is charged that usage; any other failure is not charged.
   */
  const finish = (status: CallStatus, reported: Usage, error?: ErrorInfo, firstByteAt?: number, responseId?: string, billed = status !== "failure", charge?: Reserved): bigint => {
    if (finished) return 0n;
    finished = true;
    const { usage, corrected } = countableUsage(answeredUsage(snapshot, d, endpoint, reported, body));
    if (corrected) warnUncountable(d, reported, ctx.log);
    // A cancelled stream is charged for what it used (a model priced per second of the call, for
    // the time from its start to this end, as its log row shows it, at most what budgets reserved
    // for it: see chargedCallMs).
    const endedAt = Date.now();
    const callMs = Math.min(endedAt - startedAt, maxCallMs);
    let priced: Reserved = charge ?? (billed ? snapshot.pricing.costOf(d, usage, callMs) : { cost: 0n, priced: true, source: "failed call" });
    // A transcript whose answer told nothing it is priced by, nor the file its length, is no freer.
    if (endpoint === "transcriptions" && status === "success" && priced.cost === 0n) priced = reservedCharge(endpoint, body, d, snapshot, maxCallMs) ?? priced;
    const record = callRecord(ctx, endpoint, body, d, {
      endedAt,
      stream: streams,
      status,
      // Charged what was reserved: the log's audio_seconds is the length that charge was priced with.
      usage: priced.audioSeconds === undefined ? usage : { ...usage, audioSeconds: priced.audioSeconds },
      cost: priced.cost,
      priced: priced.priced,
      costSource: priced.source,
      responseId,
      cacheHit: false,
      startedAt,
      firstByteAt,
      error,
      prompt: keepPrompt ? promptOf(body) : undefined,
      answer: streamed ? storedAnswer(endpoint, true, streamed.join("")) : answer,
    });
    // Queued before the snapshot is released (here, or by the router in `ended`): its callbacks get
    // the call before a reload or a stop disposes them.
    ctx.onRecord?.(record);
    if (ctx.record !== false) dispatchRecord(snapshot, record, ctx.log);
    attempt.ended?.(record);
    ctx.release();
    return priced.cost;
  };

  const deadline = new Deadline(ctx.clientSignal, attemptTimeout(body, d, snapshot));
  /** A call sent in parts: the answers of the parts that succeeded, which the upstream bills should a later part fail. */
  const partsAnswered: { body: WireJson; usage: Usage }[] = [];
  /** The request is with the upstream, which bills its prompt even if the client leaves before the answer. */
  let withUpstream = false;
  try {
    // Fields the adapter does not translate: refused, or dropped (then the client's bytes no longer match).
    const supported = paramsFor(ep, d);
    const sent = supported ? supportedBody(body, supported, d, snapshot.settings.dropParams) : body;
    /** Sends a finished answer: priced, recorded, with the call's headers. */
    const reply = (out: string | ArrayBuffer, contentType: string, usage: Usage, id: unknown, upstream: Headers): Response => {
      if (typeof out === "string") attempt.capture?.(out);
      const cost = finish("success", usage, undefined, Date.now(), typeof id === "string" ? id : undefined);
      const headers = responseHeaders(d, ctx.callId, contentType);
      withUpstreamLimits(headers, upstream, adapter);
      if (attempt.headers) Object.assign(headers, attempt.headers);
      headers["x-svc-response-cost"] = picoToText(cost);
      return new Response(out, { headers });
    };
    // An upstream that takes fewer inputs per call than were sent: one call per part, in order.
    const parts = streams || !ep.join ? undefined : splitCall(ep, sent, d);
    if (parts && ep.join) {
      const answers = partsAnswered;
      let last = new Headers();
      for (const part of parts) {
        const call = buildCall(ep, part, d, undefined);
        withUpstream = true;
        const res = await send(adapter, d, call, deadline);
        withUpstream = res.ok;
        if (!res.ok) throw await upstreamError(adapter, d, res);
        answers.push(mapAnswer(adapter, ep, (await readJson(res, d, deadline)).json, part, res.headers, d));
        last = res.headers;
      }
      deadline.clear();
      const joined = ep.join(answers, body);
      if (keepPrompt && keepsAnswer(endpoint)) answer = joined.body;
      return reply(JSON.stringify(joined.body), "application/json", joined.usage, joined.body.id, last);
    }
    const call = buildCall(ep, sent, d, sent === body ? ctx.rawBody : undefined);
    withUpstream = true;
    const res = await send(adapter, d, call, deadline);
    // A refusal is not billed.
    withUpstream = res.ok;
    if (!res.ok) throw await upstreamError(adapter, d, res);
    if (streams && ep.stream) {
      const transform = ep.stream as StreamTransform<"chat" | "completions", unknown>;
      const headers = responseHeaders(d, ctx.callId, "text/event-stream");
      withUpstreamLimits(headers, res.headers, adapter);
      if (attempt.headers) Object.assign(headers, attempt.headers);
      const capture = attempt.capture;
      const tap = streamed
        ? (text: string) => {
            capture?.(text);
            streamed.push(text);
          }
        : capture;
      // Awaited here: a stream that fails before its first event fails this attempt (caught below).
      return await streamResponse({ res, adapter, deployment: d, transform, endpoint: endpoint as "chat" | "completions", request: body as WireRequest["chat" | "completions"], deadline, headers, finish, tap });
    }
    const upstreamType = res.headers.get("content-type") ?? "";
    if (ep.binaryUsage) {
      const audio = await readWithin(answerBytes(res), d, deadline);
      deadline.clear();
      const contentType = upstreamType || "application/octet-stream";
      return reply(audio, contentType, ep.binaryUsage(body, { bytes: audio.byteLength, contentType }), undefined, res.headers);
    }
    if (ep.textResponse && !upstreamType.includes("json")) {
      const t = ep.textResponse(await readWithin(answerText(res), d, deadline), upstreamType, body);
      deadline.clear();
      if (keepPrompt) answer = t.text.body;
      return reply(t.text.body, t.text.contentType, t.usage, undefined, res.headers);
    }
    const { text, json } = await readJson(res, d, deadline);
    deadline.clear();
    const mapped = mapAnswer(adapter, ep, json, body, res.headers, d);
    const out = withChargedUsage(endpoint, mapped.body, mapped.usage);
    if (keepPrompt && keepsAnswer(endpoint)) answer = mapped.text ? mapped.text.body : out;
    if (mapped.text) return reply(mapped.text.body, mapped.text.contentType, mapped.usage, undefined, res.headers);
    // An adapter that hands the upstream body back unchanged lets the original bytes through.
    return reply(out === json ? text : JSON.stringify(out), "application/json", mapped.usage, (out as { id?: unknown }).id, res.headers);
  } catch (err) {
    deadline.clear();
    const info = err instanceof GatewayError ? err.info : errorInfo(500, err instanceof Error ? err.message : String(err));
    // A client that left ends the call as cancelled, with no error (as a cancelled stream): nothing
    // failed. It is charged its prompt once the request was with the upstream (estimated, as
    // budgets reserved it: no usage came back), as the upstream bills it. Either way the parts of
    // a split call answered before it ended are charged.
    const abandoned = deadline.clientGone && withUpstream;
    const used =
      partsAnswered.length > 0 && ep.join
        ? ep.join(partsAnswered, body).usage
        : abandoned
          ? { promptTokens: promptSize(endpoint, body).estimate, completionTokens: 0 }
          : undefined;
    const charge = abandoned && BILLED_AS_ASKED.has(endpoint) ? reservedCharge(endpoint, body, d, snapshot, maxCallMs) : undefined;
    finish(deadline.clientGone ? "cancelled" : "failure", used ?? ZERO, deadline.clientGone ? undefined : info, undefined, undefined, used !== undefined || deadline.clientGone, charge);
    if (err instanceof GatewayError) {
      // The call was counted against the caller's limits: a failure says what is left, as a success does.
      if (attempt.headers) Object.assign(err.headers, attempt.headers);
      err.headers["x-svc-model-id"] = headerText(d.id);
      err.headers["x-svc-call-id"] = ctx.callId;
      err.headers["x-svc-model-group"] = headerText(d.modelName);
    }
    throw err;
  }
}

/**
 * Endpoints whose upstream bills what the request asks for, answered or not: the speech's text,
 * the images, the audio sent. No token estimate prices those.
 */
const BILLED_AS_ASKED: ReadonlySet<Endpoint> = new Set(["speech", "images", "transcriptions"]);

/** A call's charge; `audioSeconds`: the audio length it was priced with, when that is not what the answer's usage says. */
type Reserved = CallCost & { audioSeconds?: number };

/**
 * What a call on such an endpoint is charged when its client left once the request was with the
 * upstream: what budgets reserved for it, its worst case for what it asked (no answer says what
 * was made), so that leaving early makes no call free. A model without a price is charged as usual.
 */
function reservedCharge<E extends Endpoint>(endpoint: E, body: WireRequest[E], d: Deployment, snapshot: Snapshot, maxCallMs: number): Reserved | undefined {
  const promptTokens = promptSize(endpoint, body).bound;
  const { cost, audioSeconds } =
    endpoint === "transcriptions"
      ? transcriptionBound(snapshot.pricing, d, promptTokens, body as WireRequest["transcriptions"], maxCallMs)
      : { cost: worstCaseOf(endpoint, body, d, snapshot.pricing, promptTokens, maxOutput(body), maxCallMs), audioSeconds: undefined };
  return cost > 0n ? { cost, priced: true, source: "what was reserved: the client left before the answer", audioSeconds } : undefined;
}

/** Endpoints whose OpenAI answer carries the call's token counts as `usage`. */
const ANSWERS_WITH_USAGE: ReadonlySet<Endpoint> = new Set(["chat", "completions", "embeddings"]);

/**
 * An answer that came without `usage` (some self-hosted OpenAI-compatible servers send none, or
 * null), with the counts it is charged, estimated, as a stream's usage chunk and the Gemini-style
 * routes give them: the client reads there what it is billed (the SDKs' types declare it). The
 * body itself when it has a usage.
 */
function withChargedUsage(endpoint: Endpoint, body: WireJson, usage: Usage): WireJson {
  // A usage that counts nothing (`{}`) was charged as an estimate too: the answer says which.
  if (!ANSWERS_WITH_USAGE.has(endpoint) || countsTokens(body.usage)) return body;
  // OpenAI's embeddings usage has no completion tokens.
  return { ...body, usage: endpoint === "embeddings" ? { prompt_tokens: usage.promptTokens, total_tokens: usage.promptTokens } : openAIUsage(usage) };
}

/**
 * The adapter's mapping of an upstream JSON answer; one it cannot read is a 500 (a refusal it
 * recognises inside a 200, a 400; an error, the error of its status).
 */
function mapAnswer<E extends Endpoint>(
  adapter: ProviderAdapter,
  ep: EndpointAdapter<E, unknown>,
  json: unknown,
  req: WireRequest[E],
  headers: Headers,
  d: Deployment,
): ReturnType<EndpointAdapter<E, unknown>["response"]> {
  try {
    return ep.response(json, req, headers);
  } catch (err) {
    if (err instanceof ErrorInAnswer) throw errorInAnswer(adapter, d, err, headers);
    const message = err instanceof Error ? err.message : String(err);
    // An adapter may recognise a refusal inside a 200 answer (a prompt blocked by the provider's filter).
    const kind = (err as { kind?: unknown }).kind;
    if (kind === "content_policy_violation" || kind === "context_window_exceeded") throw GatewayError.of(400, `${d.provider} refused the request for model ${d.modelName}: ${message}`, kind);
    throw GatewayError.of(500, `${d.provider} returned an unexpected response for model ${d.modelName}: ${message}`);
  }
}

/** The parts the adapter sends a request in (undefined: one call); an input it cannot split is refused as `buildCall` refuses it. */
export function splitCall<E extends Endpoint>(ep: EndpointAdapter<E, unknown>, body: WireRequest[E], d: Deployment): WireRequest[E][] | undefined {
  try {
    return ep.split?.(body, d);
  } catch (err) {
    if (err instanceof GatewayError) throw err;
    throw GatewayError.of(400, `${d.provider} cannot take this request for model ${d.modelName}: ${err instanceof Error ? err.message : String(err)}`, "invalid_request_error");
  }
}

/** The adapter's request transform; a transform that cannot translate the input refuses it: a 400, not a 500. */
export function buildCall<E extends Endpoint>(ep: EndpointAdapter<E, unknown>, body: WireRequest[E], d: Deployment, raw: string | undefined): HttpCall {
  try {
    return ep.request(body, d, raw);
  } catch (err) {
    if (err instanceof GatewayError) throw err;
    throw GatewayError.of(400, `${d.provider} cannot take this request for model ${d.modelName}: ${err instanceof Error ? err.message : String(err)}`, "invalid_request_error");
  }
}

/**
 * An upstream body being read; cut off by the deadline, it is the call's 408; cut by the upstream
 * (the connection closed mid-way through the body), a 503 as a stream that ends early is.
 */
async function readWithin<T>(reading: Promise<T>, d: Deployment, deadline: Deadline): Promise<T> {
  try {
    return await reading;
  } catch (err) {
    if (deadline.timedOut) throw timeoutError(d, deadline.seconds);
    if (deadline.clientGone) throw err;
    if (err instanceof AnswerTooLarge) throw GatewayError.of(502, `answer from ${d.provider} for model ${d.modelName} not read: ${err.message}`, "api_error");
    throw GatewayError.of(503, `answer from ${d.provider} for model ${d.modelName} ended unexpectedly (${errorCode(err)})`, "api_connection_error");
  }
}

async function readJson(res: Response, d: Deployment, deadline: Deadline): Promise<{ text: string; json: unknown }> {
  const text = await readWithin(answerText(res), d, deadline);
  try {
    return { text, json: JSON.parse(text) };
  } catch {
    throw GatewayError.of(500, `${d.provider} returned invalid JSON for model ${d.modelName}`, "internal_server_error");
  }
}

