/** Liveness and readiness (public, for orchestrators) and `/health` (admin: probes every deployment). */
import { Elysia } from "elysia";
import type { Deployment } from "../../contract.ts";
import { GatewayError } from "../../errors.ts";
import { redact } from "../../log.ts";
import { callDeployment, newCallId } from "../../pipeline/call.ts";
import type { Snapshot } from "../../snapshot.ts";
import type { AppDeps } from "../app.ts";
import { authenticate, requireAdmin } from "../auth.ts";

export interface ProbeResult {
  ok: boolean;
  detail: string;
}

export interface Probes {
  store(): Promise<ProbeResult>;
  /** Undefined when no Redis is configured. */
  redis(): Promise<ProbeResult | undefined>;
  version: string;
}

const PROBE_TIMEOUT_S = 10;

async function probe(s: Snapshot, d: Deployment, log: AppDeps["log"]) {
  const endpoint = s.models.findById(d.id)?.entry.model_info?.mode === "embedding" ? "embeddings" : "chat";
  const body =
    endpoint === "chat"
      ? { model: d.modelName, messages: [{ role: "user" as const, content: "ping" }], max_tokens: 1 }
      : { model: d.modelName, input: "ping" };
  const principal = { keyHash: "health-check", role: "proxy_admin" as const, metadata: {} };
  const base = { model: d.modelName, model_id: d.id, provider: d.provider };
  try {
    const ctx = { snapshot: s, principal, clientSignal: new AbortController().signal, callId: newCallId(), log, release: () => {}, record: false };
    const res = await callDeployment(endpoint, body, { ...d, timeout: PROBE_TIMEOUT_S }, ctx);
    await res.arrayBuffer();
    return { healthy: true as const, ...base };
  } catch (err) {
    const message = err instanceof GatewayError ? err.info.message : String(err);
    return { healthy: false as const, ...base, error: redact(message) };
  }
}

export function healthRoutes({ live, probes, log }: AppDeps) {
  const alive = () => "I'm alive!";
  const readiness = async () => {
    const [db, redis] = await Promise.all([probes.store(), probes.redis()]);
    const healthy = db.ok && (redis === undefined || redis.ok);
    const body = {
      status: healthy ? "healthy" : "unhealthy",
      db: db.ok ? "connected" : "disconnected",
      db_detail: db.detail,
      cache: redis === undefined ? null : "redis",
      redis: redis === undefined ? "not configured" : redis.ok ? "connected" : "disconnected",
      version: probes.version,
      config_version: live.current.version,
    };
    return new Response(JSON.stringify(body), { status: healthy ? 200 : 503, headers: { "content-type": "application/json" } });
  };
  const health = async ({ request }: { request: Request }) => {
    const s = live.current;
    requireAdmin(s, await authenticate(s, request.headers, "/health"));
    const only = new URL(request.url).searchParams.get("model");
    const targets = s.models.entries.map((e) => e.deployment).filter((d) => !d.modelName.includes("*") && (!only || d.modelName === only));
    const results = await Promise.all(targets.map((d) => probe(s, d, log)));
    const healthy = results.filter((r) => r.healthy);
    const unhealthy = results.filter((r) => !r.healthy);
    return { healthy_endpoints: healthy, unhealthy_endpoints: unhealthy, healthy_count: healthy.length, unhealthy_count: unhealthy.length };
  };
  return new Elysia()
    .get("/health/liveliness", alive)
    .get("/health/liveness", alive)
    .get("/health/readiness", readiness)
    .get("/health", health);
}
