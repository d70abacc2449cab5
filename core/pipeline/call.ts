/**
 * One model call, framework-free: resolve the model → limits and budgets → adapter builds the
 * upstream call → fetch → map the response or stream back → record the call.
 */
import type { CallIntent, CallRecord, CallStatus, Deployment, Endpoint, EndpointAdapter, ErrorInfo, Lease, Logger, Principal, StreamTransform, Usage, WireRequest } from "../contract.ts";
import { authorizeModel } from "../access.ts";
import { GatewayError, errorInfo } from "../errors.ts";
import type { Snapshot } from "../snapshot.ts";
import { dispatchRecord, settleAll } from "./record.ts";
import { streamResponse } from "./stream.ts";
import { Deadline, send, timeoutError, upstreamError } from "./upstream.ts";

export interface CallContext {
  snapshot: Snapshot;
  principal: Principal;
  /** Aborts when the client disconnects. */
  clientSignal: AbortSignal;
  callId: string;
  log: Logger;
  /** Releases the snapshot pin; called once the response (or stream) has ended. */
  release(): void;
  /** False for calls the gateway makes itself (health probes): no spend, no callbacks. */
  record?: boolean;
  /** The client's body text when the gateway changed nothing in it (see EndpointAdapter.request). */
  rawBody?: string;
}

const ZERO: Usage = { promptTokens: 0, completionTokens: 0 };

function pick(deployments: readonly Deployment[]): Deployment {
  return deployments[Math.floor(Math.random() * deployments.length)]!;
}

function maxOutput(body: WireRequest[Endpoint]): number | undefined {
  const b = body as { max_tokens?: number | null; max_completion_tokens?: number | null };
  return b.max_completion_tokens ?? b.max_tokens ?? undefined;
}

async function acquireLeases(snapshot: Snapshot, intent: CallIntent): Promise<Lease[]> {
  const granted: Lease[] = [];
  for (const gate of [...snapshot.rateLimiters.map((r) => () => r.acquire(intent)), ...snapshot.budgets.map((b) => () => b.reserve(intent))]) {
    const result = await gate();
    if (!result.ok) {
      settleAll(granted, ZERO);
      const headers: Record<string, string> = {};
      if (result.retryAfterSeconds !== undefined) headers["retry-after"] = String(result.retryAfterSeconds);
      throw new GatewayError(result.error, headers);
    }
    granted.push(result);
  }
  return granted;
}

/** The headers every model-call answer carries, with its content type. */
export function responseHeaders(d: Deployment, callId: string, contentType: string): Record<string, string> {
  return { "content-type": contentType, "x-svc-model-id": d.id, "x-svc-call-id": callId, "x-svc-model-group": d.modelName };
}

export function modelCall<E extends Endpoint>(endpoint: E, body: WireRequest[E], ctx: CallContext): Promise<Response> {
  const group = authorizeModel(ctx.principal, body.model, ctx.snapshot.accessGroups);
  const deployments = ctx.snapshot.models.resolve(group);
  if (!deployments || deployments.length === 0) {
    throw GatewayError.of(400, `Invalid model name passed in model=${body.model}. Call \`/v1/models\` to view available models for your key.`, "invalid_request_error", "model");
  }
  const d = pick(deployments);
  if (ctx.snapshot.rateLimiters.length === 0 && ctx.snapshot.budgets.length === 0) return callDeployment(endpoint, body, d, ctx);
  const intent: CallIntent = { principal: ctx.principal, endpoint, modelGroup: group, estimatedPromptTokens: 0, maxOutputTokens: maxOutput(body) };
  return acquireLeases(ctx.snapshot, intent).then((leases) => callDeployment(endpoint, body, d, ctx, leases));
}

/** Calls one chosen deployment; `leases` are settled with the real usage when the call ends. */
export async function callDeployment<E extends Endpoint>(endpoint: E, body: WireRequest[E], d: Deployment, ctx: CallContext, leases: readonly Lease[] = []): Promise<Response> {
  const { snapshot } = ctx;
  const startedAt = Date.now();
  const adapter = snapshot.providers.get(d.provider)!;
  const ep = adapter.endpoints[endpoint] as EndpointAdapter<E, unknown> | undefined;
  if (!ep) throw GatewayError.of(400, `model ${body.model} (provider ${d.provider}) does not support ${endpoint}`, "invalid_request_error", "model");
  const wantsStream = endpoint !== "embeddings" && (body as { stream?: boolean | null }).stream === true;
  if (wantsStream && !ep.stream) throw GatewayError.of(400, `provider ${d.provider} does not support streaming ${endpoint}`, "invalid_request_error", "stream");

  let finished = false;
  const finish = (status: CallStatus, usage: Usage, error?: ErrorInfo, firstByteAt?: number) => {
    if (finished) return;
    finished = true;
    settleAll(leases, usage);
    const record: CallRecord = {
      id: ctx.callId,
      endpoint,
      principal: ctx.principal,
      modelGroup: d.modelName,
      provider: d.provider,
      deploymentId: d.id,
      upstreamModel: d.upstreamModel,
      stream: wantsStream,
      status,
      usage,
      startedAt,
      firstByteAt,
      endedAt: Date.now(),
      error,
    };
    ctx.release();
    if (ctx.record !== false) dispatchRecord(snapshot, record, ctx.log);
  };

  const timeoutSeconds = (endpoint === "embeddings" ? (body as WireRequest["embeddings"]).timeout : undefined) ?? d.timeout ?? snapshot.settings.requestTimeout;
  const deadline = new Deadline(ctx.clientSignal, timeoutSeconds);
  try {
    const res = await send(adapter, d, ep.request(body, d, ctx.rawBody), deadline);
    if (!res.ok) throw await upstreamError(adapter, d, res);
    if (wantsStream && ep.stream) {
      const transform = ep.stream as StreamTransform<"chat" | "completions", unknown>;
      return streamResponse({ res, deployment: d, transform, request: body as WireRequest["chat" | "completions"], deadline, headers: responseHeaders(d, ctx.callId, "text/event-stream"), finish });
    }
    const { text, json } = await readJson(res, d, deadline);
    deadline.clear();
    let mapped: { body: unknown; usage: Usage };
    try {
      mapped = ep.response(json);
    } catch (err) {
      throw GatewayError.of(500, `${d.provider} returned an unexpected response for model ${d.modelName}: ${err instanceof Error ? err.message : String(err)}`);
    }
    finish("success", mapped.usage, undefined, Date.now());
    // An adapter that hands the upstream body back unchanged lets the original bytes through.
    const out = mapped.body === json ? text : JSON.stringify(mapped.body);
    return new Response(out, {
      headers: responseHeaders(d, ctx.callId, "application/json"),
    });
  } catch (err) {
    deadline.clear();
    const info = err instanceof GatewayError ? err.info : errorInfo(500, err instanceof Error ? err.message : String(err));
    finish(deadline.clientGone ? "cancelled" : "failure", ZERO, info);
    if (err instanceof GatewayError) {
      err.headers["x-svc-model-id"] = d.id;
      err.headers["x-svc-call-id"] = ctx.callId;
    }
    throw err;
  }
}

async function readJson(res: Response, d: Deployment, deadline: Deadline): Promise<{ text: string; json: unknown }> {
  let text: string;
  try {
    text = await res.text();
  } catch (err) {
    if (deadline.timedOut) throw timeoutError(d, deadline.seconds);
    throw err;
  }
  try {
    return { text, json: JSON.parse(text) };
  } catch {
    throw GatewayError.of(500, `${d.provider} returned invalid JSON for model ${d.modelName}`, "internal_server_error");
  }
}

