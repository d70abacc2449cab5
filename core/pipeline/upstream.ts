/** The one place the gateway reaches an upstream: fetch with timeout and abort, errors mapped to the spec. */
import type { Deployment, ErrorInfo, HttpCall, ProviderAdapter } from "../contract.ts";
import { CredentialsRefused, type ErrorInAnswer, GatewayError, errorInfo } from "../errors.ts";
import { rememberSentCredentials, withoutCredentials } from "../secrets.ts";
import { boundBy } from "../fetch-bound.ts";
import { formBody } from "../http/multipart.ts";
import { pinnedRequest } from "../pinned-fetch.ts";
import { errorBodyText } from "./answer-body.ts";

/**
 * The deadlines armed right now, each knowing its slot, so disarming is a swap with the last and a
 * cleared slot. Not a Set: under load (one deadline per upstream call, thousands a second) a Set
 * of them left thousands of disarmed deadlines, with their AbortControllers and the client's
 * signals, marked live until a full collection, and each young-generation collection of the main
 * thread walked their weak handles: ~0.5 ms more per pause (BUN_JSC_logGC, 1,000 req/s).
 */
class ArmedDeadlines {
  private readonly slots: (Deadline | undefined)[] = [];
  size = 0;

  add(d: Deadline): void {
    if (d.slot >= 0) return;
    d.slot = this.size;
    this.slots[this.size++] = d;
  }

  delete(d: Deadline): void {
    const at = d.slot;
    if (at < 0) return;
    const last = this.slots[--this.size]!;
    this.slots[at] = last;
    last.slot = at;
    this.slots[this.size] = undefined;
    d.slot = -1;
  }

  /** The armed deadlines as of now: what a caller does to one may disarm or arm others. */
  current(): Deadline[] {
    return this.slots.slice(0, this.size) as Deadline[];
  }
}

/**
 * Live deadlines, checked by one coarse ticker instead of a timer per request: arming and clearing
 * are then field writes, which matters at tens of thousands of requests per second. Timeouts are
 * seconds long, so a 25 ms tick is precise enough.
 */
const live = new ArmedDeadlines();
const TICK_MS = 25;
let ticker: ReturnType<typeof setInterval> | undefined;

/** Deadlines armed right now and whether the ticker runs (tests: none is left once the gateway is idle). */
export function deadlineStats(): { armed: number; ticking: boolean } {
  return { armed: live.size, ticking: ticker !== undefined };
}

function tick(): void {
  const now = performance.now();
  for (const d of live.current()) {
    if (d.slot < 0) continue;
    if (d.expiresAt <= now) d.expire();
    else if (d.clientGone) d.clientLeft();
    else if (d.quietAt <= now) d.quiet();
  }
  if (live.size === 0 && ticker) {
    clearInterval(ticker);
    ticker = undefined;
  }
}

/**
 * Why an upstream call was aborted: the client left, or the deadline passed. The client's signal is
 * polled by the ticker rather than listened to: an abort listener per request costs more than the
 * rest of the deadline bookkeeping (measured ~3 µs), and a departed client is noticed within a tick.
 */
export class Deadline {
  readonly controller = new AbortController();
  /** Its place among the armed deadlines, -1 when disarmed. */
  slot = -1;
  timedOut = false;
  expiresAt = 0;
  /** When `onQuiet` is due (see `whenQuiet`). */
  quietAt = Number.POSITIVE_INFINITY;
  private onQuiet: (() => void) | undefined;

  constructor(
    private readonly client: AbortSignal,
    readonly seconds: number,
  ) {
    if (client.aborted) this.clientLeft();
    this.arm();
  }

  clientLeft(): void {
    live.delete(this);
    this.controller.abort(new DOMException("client disconnected", "AbortError"));
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** (Re)starts the countdown: whole call for JSON responses, idle gap between chunks for streams. */
  arm(): void {
    this.expiresAt = performance.now() + this.seconds * 1000;
    live.add(this);
    if (!ticker) {
      ticker = setInterval(tick, TICK_MS);
      ticker.unref?.();
    }
  }

  expire(): void {
    live.delete(this);
    this.timedOut = true;
    this.controller.abort(new DOMException("upstream timed out", "TimeoutError"));
  }

  clear(): void {
    live.delete(this);
  }

  /** Calls `then` once if, `ms` from now, the deadline is armed (waiting on the upstream) and `cancelQuiet` was not called. */
  whenQuiet(ms: number, then: () => void): void {
    this.quietAt = performance.now() + ms;
    this.onQuiet = then;
  }

  cancelQuiet(): void {
    this.quietAt = Number.POSITIVE_INFINITY;
    this.onQuiet = undefined;
  }

  quiet(): void {
    const then = this.onQuiet;
    this.cancelQuiet();
    then?.();
  }

  get clientGone(): boolean {
    return this.client.aborted;
  }
}

/** Upstream HTTP status → the status the gateway answers with. */
export function mapUpstreamStatus(status: number): number {
  // 529: Anthropic's "overloaded", a temporary unavailability like 503.
  if (status === 502 || status === 503 || status === 504 || status === 529) return 503;
  if (status >= 500) return 500;
  if ([400, 401, 403, 404, 408, 413, 422, 429].includes(status)) return status;
  return status >= 400 && status < 500 ? 400 : 500;
}

export function timeoutError(d: Deployment, seconds: number): GatewayError {
  return new GatewayError(errorInfo(408, `Request timed out: ${d.provider} did not answer for model ${d.modelName} within ${seconds}s`, "timeout_error"));
}

/** A network error's code (ECONNREFUSED, ECONNRESET, …), else its message. */
export function errorCode(err: unknown): string {
  return err instanceof Error && "code" in err ? String((err as { code: unknown }).code) : err instanceof Error ? err.message : String(err);
}

function connectionError(d: Deployment, err: unknown): GatewayError {
  return new GatewayError(errorInfo(503, `APIConnectionError: could not connect to ${d.provider} for model ${d.modelName} (${errorCode(err)})`, "api_connection_error"));
}

/**
 * `work`, or a rejection once the deadline's signal aborts (timed out, or the client left): a
 * plugin's `authorize` or `transport` that ignores the signal must not hold the call past its
 * timeout, nor its key's slot for good.
 */
function untilDeadline<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
  });
  work.catch(() => undefined);
  return Promise.race([work, aborted]).finally(() => signal.removeEventListener("abort", onAbort!));
}

/**
 * A call to an api_base with a query (`https://host/v1?key=…`, as a gateway in front of a provider
 * may take its key): the adapters append their path to api_base, which put it inside the query
 * (`…/v1?key=…/chat/completions`). The path goes before the query, the base's parameters after
 * the call's own (Azure's `api-version`).
 */
export function withPathBeforeBaseQuery(call: HttpCall, apiBase: string | undefined): HttpCall {
  const q = apiBase?.indexOf("?") ?? -1;
  if (q < 0 || !call.url.startsWith(apiBase!)) return call;
  const rest = call.url.slice(apiBase!.length);
  const restQuery = rest.indexOf("?");
  const path = restQuery < 0 ? rest : rest.slice(0, restQuery);
  const query = [restQuery < 0 ? "" : rest.slice(restQuery + 1), apiBase!.slice(q + 1)].filter((p) => p !== "").join("&");
  return { ...call, url: `${apiBase!.slice(0, q).replace(/\/+$/, "")}${path}${query ? `?${query}` : ""}` };
}

export async function send(adapter: ProviderAdapter, d: Deployment, made: HttpCall, deadline: Deadline): Promise<Response> {
  try {
    const built = withPathBeforeBaseQuery(made, d.apiBase);
    const call = adapter.authorize ? await untilDeadline(Promise.resolve(adapter.authorize(built, d)), deadline.signal) : built;
    if (call !== built) rememberSentCredentials(d, built.headers, call.headers);
    if (adapter.transport) return await untilDeadline(adapter.transport(call, deadline.signal), deadline.signal);
    // A client-chosen host: connected to at the address checked, and a redirect is not followed (it
    // would send the call, with the client's key, to an address nobody checked). An adapter that
    // does not call api_base (its provider's own endpoint) is not pinned.
    const form = call.form && formBody(call.form);
    const headers = form?.contentType ? { ...call.headers, "content-type": form.contentType } : call.headers;
    const init = { method: call.method ?? "POST", body: form ? form.body : call.body, ...boundBy(deadline.signal) };
    if (d.connectTo && new URL(call.url).hostname === d.connectTo.host) {
      const to = pinnedRequest(call.url, headers, d.connectTo.address);
      return await fetch(to.url, { ...init, headers: to.headers, redirect: "manual", ...(to.tls ? { tls: to.tls } : {}) });
    }
    return await fetch(call.url, { ...init, headers });
  } catch (err) {
    if (deadline.timedOut) throw timeoutError(d, deadline.seconds);
    if (deadline.clientGone) throw err;
    if (err instanceof CredentialsRefused) {
      throw new GatewayError(errorInfo(401, `AuthenticationError: ${d.provider} refused the gateway's credentials for model ${d.modelName}: ${err.message}`));
    }
    throw connectionError(d, err);
  }
}

/** A non-2xx upstream answer → the spec's error, keeping the provider's message and retry-after. */
export async function upstreamError(adapter: ProviderAdapter, d: Deployment, res: Response): Promise<GatewayError> {
  const text = await errorBodyText(res);
  return upstreamErrorOf(adapter, d, { status: res.status, body: text, headers: res.headers, said: `returned ${res.status}` });
}

/** An error the upstream put in a 2xx answer (see ErrorInAnswer) → the error an HTTP answer of its status would be. */
export function errorInAnswer(adapter: ProviderAdapter, d: Deployment, err: ErrorInAnswer, headers: Headers): GatewayError {
  return upstreamErrorOf(adapter, d, { status: err.status, body: err.body, headers, said: `returned an error (${err.status}) in a successful answer` });
}

interface UpstreamFailure {
  /** The HTTP status the failure stands for. */
  status: number;
  body: string;
  headers: Headers;
  /** What the upstream did, for the message ("returned 429"). */
  said: string;
}

/**
 * An error the upstream sent inside its stream, as the adapter mapped it → the error an HTTP answer
 * saying the same would be: the provider's context-window and content-policy failures (Bedrock's
 * validationException "Input is too long…", Anthropic's `error` event "prompt is too long…") are a
 * 400 of that type, which the router's fallbacks act on, however the provider chose to send them.
 */
export function streamErrorOf(adapter: ProviderAdapter, error: ErrorInfo): ErrorInfo {
  const kind = adapter.errorKind?.(error.status, error.message);
  return kind ? { ...error, status: 400, type: kind } : error;
}

function upstreamErrorOf(adapter: ProviderAdapter, d: Deployment, f: UpstreamFailure): GatewayError {
  const status = mapUpstreamStatus(f.status);
  const detail = withoutCredentials(adapter.errorMessage ? adapter.errorMessage(f.status, f.body) : f.body.slice(0, 500), d);
  const headers: Record<string, string> = {};
  const retryAfter = f.headers.get("retry-after");
  if (retryAfter) headers["retry-after"] = retryAfter;
  const kind = adapter.errorKind?.(f.status, f.body);
  // A context-window or content-policy refusal is the client's request, whatever status the provider used.
  const info = errorInfo(kind ? 400 : status, `${d.provider} ${f.said} for model ${d.modelName}: ${detail}`, kind);
  return new GatewayError(info, headers, f.status);
}
