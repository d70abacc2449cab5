/**
 * One pass-through call, after the caller is known: the request's own rate limits and the budgets
 * (reserving `cost_per_request`) → the request forwarded as it is (minus the gateway's own key
 * and headers) → the answer streamed back as it is → settled and logged once it ends, also when
 * the client leaves or the target stalls. No translation: the target's status, headers and bytes
 * reach the client.
 */
import type { CallIntent, CallRecord, CallStatus, Deployment, ErrorInfo, GroupCapacity, Lease, Logger, Principal } from "../contract.ts";
import { GatewayError, bodyTooLarge, errorInfo } from "../errors.ts";
import { boundBy } from "../fetch-bound.ts";
import { NO_MODEL_REACH } from "../limits/capacity.ts";
import { ZERO, acquireLeases } from "../pipeline/call.ts";
import { HeldLeases } from "../pipeline/held-leases.ts";
import { cancelAll, dispatchRecord } from "../pipeline/record.ts";
import { Deadline } from "../pipeline/upstream.ts";
import type { Snapshot } from "../snapshot.ts";
import type { PassThroughEndpoint } from "./table.ts";
import { type UploadClock, streamedUpload, wholeUpload } from "./upload.ts";

export interface PassThroughContext {
  snapshot: Snapshot;
  principal: Principal;
  callId: string;
  log: Logger;
  /** Releases the snapshot pin, once the answer has ended. */
  release(): void;
  /** The request's key headers that carry one of the gateway's own keys: never sent to the target. */
  withheld: ReadonlySet<string>;
}

/** Never forwarded either way: they describe one connection, not the message. */
const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade", "host"]);
/** The hop-by-hop headers of one message: the standard ones, and those its Connection header names (RFC 9110 §7.6.1). */
function hopByHopOf(headers: Headers): ReadonlySet<string> {
  const connection = headers.get("connection");
  if (!connection) return HOP_BY_HOP;
  const named = new Set(HOP_BY_HOP);
  for (const token of connection.split(",")) {
    const name = token.trim().toLowerCase();
    if (name) named.add(name);
  }
  return named;
}
/** The gateway's own request headers (`x-svc-api-key`, `x-svc-…`): not the target's business. */
const GATEWAY_HEADER = /^x-svc-/;
/** Sent on even without `forward_headers`: what the body is and what the client accepts. */
const CONTENT_HEADERS = ["content-type", "accept"];
/**
 * The target's answer is passed on as its bytes, compressed or not, with its content-encoding
 * (`decompress: false`, a documented Bun fetch option its typings lack): decoding it here would
 * change the bytes, and drop the label of an encoding fetch does not decode.
 */
type ProxyFetchInit = RequestInit & { decompress: false };

/** What limits and budgets see: the request's own limits only (no model group), worst case the endpoint's price. */
class PassThroughIntent implements CallIntent {
  readonly endpoint = "pass_through";
  readonly scope = "request";
  readonly estimatedPromptTokens = 0;
  readonly promptTokenBound = 0;
  // No answer-token limit to reserve at (a budget's refusal names the route's price instead).
  readonly maxOutputTokens = undefined;
  readonly answers = 1;
  readonly groupCapacity: GroupCapacity = {};
  readonly modelReach = NO_MODEL_REACH;

  constructor(
    readonly principal: Principal,
    readonly deployment: Deployment,
    readonly startedAt: number,
    readonly worstCaseCost: bigint,
  ) {}

  get modelGroup(): string {
    return this.deployment.modelName;
  }

  get modelNames(): readonly string[] {
    return [this.modelGroup];
  }

  get capacityGroup(): string {
    return this.modelGroup;
  }
}

/** The endpoint as the spend log and the budgets name it: provider `pass_through`, model its path. */
function asDeployment(e: PassThroughEndpoint): Deployment {
  return { id: e.id, modelName: e.path, provider: "pass_through", upstreamModel: "", options: {}, info: {} };
}

/** The name of one `name=value` query parameter, decoded as a form decoder reads it (`ap%69_key` is `api_key`). */
function parameterName(part: string): string {
  return new URLSearchParams(part).keys().next().value ?? "";
}

/**
 * target + the part of the path after the endpoint's own + the client's query. A parameter the
 * target URL sets itself (a key, a tier) is the operator's: the client's values for it are dropped.
 * Every parameter goes as it was written (not decoded and encoded again, which would turn `%20`
 * into `+`, a literal plus to many targets, and break signed queries).
 */
export function targetUrl(target: string, subpath: string, requestUrl: string): string {
  const url = new URL(target);
  if (subpath) url.pathname = url.pathname.replace(/\/+$/, "") + subpath;
  url.hash = "";
  const q = requestUrl.indexOf("?");
  const theirs = q < 0 ? [] : requestUrl.slice(q + 1).split("&").filter((part) => part !== "");
  if (theirs.length === 0) return url.toString();
  const own = url.search.slice(1).split("&").filter((part) => part !== "");
  const taken = new Set(own.map(parameterName));
  const query = [...own, ...theirs.filter((part) => !taken.has(parameterName(part)))].join("&");
  url.search = "";
  return query ? `${url.toString()}?${query}` : url.toString();
}

function upstreamHeaders(e: PassThroughEndpoint, incoming: Headers, withheld: ReadonlySet<string>): Headers {
  const out = new Headers();
  if (e.forwardHeaders) {
    const hop = hopByHopOf(incoming);
    for (const [name, value] of incoming) {
      // fetch frames the body it sends itself (the length of the bytes it holds, else chunks).
      if (hop.has(name) || name === "content-length" || GATEWAY_HEADER.test(name) || withheld.has(name)) continue;
      out.set(name, value);
    }
  } else {
    for (const name of CONTENT_HEADERS) {
      const value = incoming.get(name);
      if (value !== null) out.set(name, value);
    }
    // The client's accept-encoding is not sent, so it gets the answer uncompressed (an encoded one is still passed on as it is).
    out.set("accept-encoding", "identity");
  }
  for (const [name, value] of Object.entries(e.headers)) out.set(name, value);
  return out;
}

/**
 * The target's headers as the client gets them. Its Content-Length still counts the bytes passed
 * on, which are the target's own (`decompress: false`; a decoding fetch keeps the encoded length),
 * unless Transfer-Encoding framed the answer, which a length sent beside it does not describe
 * (RFC 9112 §6.3). Bun's server frames a streamed body itself (chunked, whatever length it is
 * given: oven-sh/bun#10507), so the length reaches the client on an answer without a body.
 */
function clientHeaders(upstream: Headers, extra: Record<string, string>): Headers {
  const out = new Headers();
  const hop = hopByHopOf(upstream);
  const chunked = upstream.has("transfer-encoding");
  for (const [name, value] of upstream) {
    if (hop.has(name) || (chunked && name === "content-length")) continue;
    out.append(name, value);
  }
  for (const [name, value] of Object.entries(extra)) out.set(name, value);
  return out;
}

async function acquire(snapshot: Snapshot, intent: PassThroughIntent): Promise<HeldLeases> {
  const limits: Lease[] = snapshot.limitGates.length === 0 ? [] : await acquireLeases(snapshot.limitGates, intent);
  if (snapshot.budgetGates.length === 0) return new HeldLeases(limits);
  try {
    return new HeldLeases([...limits, ...(await acquireLeases(snapshot.budgetGates, intent))]);
  } catch (err) {
    cancelAll(limits);
    throw err;
  }
}

export async function forwardPassThrough(e: PassThroughEndpoint, subpath: string, request: Request, ctx: PassThroughContext): Promise<Response> {
  const startedAt = Date.now();
  const { snapshot } = ctx;
  const intent = new PassThroughIntent(ctx.principal, asDeployment(e), startedAt, e.costPerRequest);
  let firstByteAt: number | undefined;
  let stream = false;
  let finished = false;
  const record = (status: CallStatus, cost: bigint, error?: ErrorInfo): void => {
    const call: CallRecord = {
      id: ctx.callId,
      endpoint: "pass_through",
      principal: ctx.principal,
      modelGroup: e.path,
      provider: "pass_through",
      deploymentId: e.id,
      upstreamModel: "",
      requestedModel: e.path,
      stream,
      status,
      usage: ZERO,
      cost,
      priced: true,
      costSource: `cost_per_request of pass-through endpoint ${e.id}`,
      tags: ctx.principal.key?.tags ?? [],
      cacheHit: false,
      startedAt,
      firstByteAt,
      endedAt: Date.now(),
      error,
    };
    dispatchRecord(snapshot, call, ctx.log);
  };

  let leases: HeldLeases;
  try {
    leases = await acquire(snapshot, intent);
  } catch (err) {
    if (err instanceof GatewayError) {
      record("failure", 0n, err.info);
      err.headers["x-svc-call-id"] = ctx.callId;
    }
    ctx.release();
    throw err;
  }

  const deadline = new Deadline(request.signal, e.timeout ?? snapshot.settings.requestTimeout);
  /** Ends the call once: a target that answered 2xx is charged its price, even if the client left before the end. */
  const finish = (status: CallStatus, charged: boolean, error?: ErrorInfo): void => {
    if (finished) return;
    finished = true;
    deadline.clear();
    const cost = charged ? e.costPerRequest : 0n;
    leases.settle(ZERO, cost);
    // Queued before the snapshot is released: its callbacks get the call before a reload disposes them.
    record(status, cost, error);
    ctx.release();
  };
  const { origin } = e;

  const tooLarge = { hit: false };
  let answered = false;
  // Once the target answers, the answer's reads time it: an upload still under way no longer does.
  const clock: UploadClock = {
    waitingOnClient() {
      if (!answered) deadline.clear();
    },
    waitingOnTarget() {
      if (!answered) deadline.arm();
    },
  };
  let upstream: Response;
  try {
    const hasBody = request.method !== "GET" && request.body !== null;
    const limit = snapshot.settings.maxRequestBytes;
    const body = !hasBody ? undefined : request.headers.has("content-length") ? await wholeUpload(request, clock) : streamedUpload(request.body!, limit, tooLarge, clock);
    const init: ProxyFetchInit = {
      method: request.method,
      headers: upstreamHeaders(e, request.headers, ctx.withheld),
      body,
      ...boundBy(deadline.signal),
      redirect: "manual",
      decompress: false,
    };
    upstream = await fetch(targetUrl(e.target, subpath, request.url), init);
    answered = true;
  } catch (err) {
    let error: GatewayError;
    if (tooLarge.hit) error = bodyTooLarge(snapshot.settings.maxRequestBytes);
    else if (deadline.timedOut) error = GatewayError.of(408, `Request timed out: the pass-through target of ${e.path} (${origin}) did not answer within ${deadline.seconds}s`, "timeout_error");
    else if (deadline.clientGone) {
      finish("cancelled", false);
      throw GatewayError.of(499, "The client closed the request.", "client_closed_request");
    } else {
      const code = err instanceof Error && "code" in err ? String((err as { code: unknown }).code) : "connection failed";
      error = GatewayError.of(503, `APIConnectionError: could not connect to the pass-through target of ${e.path} (${origin}): ${code}`, "api_connection_error");
    }
    error.headers["x-svc-call-id"] = ctx.callId;
    finish("failure", false, error.info);
    throw error;
  }

  const accepted = upstream.status < 400;
  const charged = upstream.status >= 200 && upstream.status < 300;
  const refusal = accepted ? undefined : errorInfo(upstream.status, `The pass-through target of ${e.path} answered ${upstream.status}`, "upstream_error");
  stream = (upstream.headers.get("content-type") ?? "").startsWith("text/event-stream");
  const headers = clientHeaders(upstream.headers, { ...leases.headers, "x-svc-call-id": ctx.callId });
  const reader = upstream.body?.getReader();
  if (!reader) {
    finish(accepted ? "success" : "failure", charged, refusal);
    return new Response(null, { status: upstream.status, statusText: upstream.statusText, headers });
  }
  // The timeout runs only while the answer's next part is awaited from the target: with
  // highWaterMark 0 the next pull waits for the client to take the last part, and a client slow to
  // take it (a download over a slow link) is no stalled target.
  deadline.clear();
  const body = new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        try {
          deadline.arm();
          const { done, value } = await reader.read();
          deadline.clear();
          if (done) {
            controller.close();
            finish(accepted ? "success" : "failure", charged, refusal);
            return;
          }
          firstByteAt ??= Date.now();
          controller.enqueue(value);
        } catch {
          if (deadline.clientGone) finish("cancelled", charged);
          else {
            const why = deadline.timedOut ? `stalled for ${deadline.seconds}s` : "broke off";
            finish("failure", charged, errorInfo(deadline.timedOut ? 408 : 502, `The pass-through target of ${e.path} ${why} mid-answer`, "upstream_error"));
            ctx.log.warn("pass-through answer cut short", { call: ctx.callId, endpoint: e.id, origin, reason: `the target ${why} mid-answer` });
          }
          // Cuts the client's connection, so it sees the answer is incomplete. Without a reason: Bun
          // prints a stream's error as it is, and fetch's names the target's whole URL, whose path or
          // query may hold a credential.
          controller.error();
        }
      },
      cancel(reason) {
        finish("cancelled", charged);
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
  return new Response(body, { status: upstream.status, statusText: upstream.statusText, headers });
}
