/** Liveness and readiness (public, for orchestrators) and `/health` (admin: probes every deployment). */
import { Elysia } from "elysia";
import type { Deployment, Endpoint, WireRequest } from "../../contract.ts";
import { GatewayError } from "../../errors.ts";
import { redact } from "../../log.ts";
import { callDeployment, newCallId } from "../../pipeline/call.ts";
import type { Snapshot } from "../../snapshot.ts";
import type { AppDeps } from "../app.ts";
import { authenticate, credentialOf, requireAdmin } from "../auth.ts";

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

/** Half a second of silence: a 16 kHz 16-bit mono WAV (a header and zeroed samples). */
function silentWav(): Blob {
  const samples = 16_000;
  const bytes = new Uint8Array(44 + samples);
  const view = new DataView(bytes.buffer);
  const text = (at: number, s: string) => bytes.set(new TextEncoder().encode(s), at);
  text(0, "RIFF");
  view.setUint32(4, 36 + samples, true);
  text(8, "WAVEfmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true);
  view.setUint16(22, 1, true);
  view.setUint32(24, 16_000, true);
  view.setUint32(28, 32_000, true);
  view.setUint16(32, 2, true);
  view.setUint16(34, 16, true);
  text(36, "data");
  view.setUint32(40, samples, true);
  return new File([bytes], "health-check.wav", { type: "audio/wav" });
}

/** The smallest call of the deployment's kind (`model_info.mode`, LiteLLM's names); chat when it says none. */
function probeCall(mode: unknown, model: string): { [E in Endpoint]: [E, WireRequest[E]] }[Endpoint] {
  switch (mode) {
    case "embedding":
      return ["embeddings", { model, input: "ping" }];
    case "completion":
      return ["completions", { model, prompt: "ping", max_tokens: 1 }];
    case "image_generation":
      return ["images", { model, prompt: "ping" }];
    case "audio_transcription":
      return ["transcriptions", { model, file: silentWav() }];
    case "audio_speech":
      return ["speech", { model, input: "ping", voice: "alloy" }];
    case "moderation":
      return ["moderations", { model, input: "ping" }];
    default:
      return ["chat", { model, messages: [{ role: "user", content: "ping" }], max_tokens: 1 }];
  }
}

async function probe(s: Snapshot, d: Deployment, log: AppDeps["log"]) {
  const [endpoint, body] = probeCall(s.models.findById(d.id)?.entry.model_info?.mode, d.modelName);
  const principal = { keyHash: "health-check", role: "proxy_admin" as const, metadata: {} };
  const base = { model: d.modelName, model_id: d.id, provider: d.provider };
  try {
    const ctx = { snapshot: s, principal, clientSignal: new AbortController().signal, callId: newCallId(), log, release: () => {}, record: false };
    // At most PROBE_TIMEOUT_S, and never longer than a real call may take: a deployment that answers only after its own timeout fails every call.
    const res = await callDeployment(endpoint, body, { ...d, timeout: Math.min(PROBE_TIMEOUT_S, d.timeout ?? s.settings.requestTimeout) }, ctx);
    await res.arrayBuffer();
    return { healthy: true as const, ...base };
  } catch (err) {
    const message = err instanceof GatewayError ? err.info.message : String(err);
    return { healthy: false as const, ...base, error: redact(message) };
  }
}

/**
 * Whether the caller of a public route is an admin: the store's version and its driver's errors
 * are shown to admins only. Any other caller, a wrong key included, just gets the public answer.
 */
async function isAdmin(s: Snapshot, request: Request): Promise<boolean> {
  if (!credentialOf(request.headers) || !s.settings.masterKey) return false;
  try {
    const { role } = await authenticate(s, request.headers, new URL(request.url).pathname, request.method);
    return role === "proxy_admin" || role === "proxy_admin_viewer";
  } catch {
    return false;
  }
}

export function healthRoutes({ live, probes, log }: AppDeps) {
  // LiteLLM's answer: the JSON string, which a probe that parses JSON reads.
  const alive = () => Response.json("I'm alive!");
  const readiness = async ({ request }: { request: Request }) => {
    const [db, redis, admin] = await Promise.all([probes.store(), probes.redis(), isAdmin(live.current, request)]);
    const healthy = db.ok && (redis === undefined || redis.ok);
    const body = {
      status: healthy ? "healthy" : "unhealthy",
      db: db.ok ? "connected" : "disconnected",
      ...(admin ? { db_detail: db.detail } : {}),
      cache: redis === undefined ? null : "redis",
      redis: redis === undefined ? "not configured" : redis.ok ? "connected" : "disconnected",
      version: probes.version,
      config_version: live.current.version,
    };
    return new Response(JSON.stringify(body), { status: healthy ? 200 : 503, headers: { "content-type": "application/json" } });
  };
  const health = async ({ request }: { request: Request }) => {
    const s = live.current;
    requireAdmin(s, await authenticate(s, request.headers, "/health", request.method));
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
