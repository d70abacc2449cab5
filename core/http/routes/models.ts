/** Model discovery: `/models`, `/models/{id}` and `/model/info` (upstream address and credentials never shown). */
import { Elysia } from "elysia";
import type { Deployment } from "../../contract.ts";
import type { ModelEntry } from "../../config/schema.ts";
import { GatewayError } from "../../errors.ts";
import type { Snapshot } from "../../snapshot.ts";
import type { AppDeps } from "../app.ts";
import { authenticate } from "../auth.ts";

/** svc_params fields that could reveal where the upstream is or how to log in to it. */
const HIDDEN_PARAM = /(api_base|base_url|key|secret|token|password|credential|headers|auth)/i;

function publicParams(params: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(params).filter(([k]) => !HIDDEN_PARAM.test(k)));
}

function modelObject(id: string, created: number, d: Deployment) {
  return { id, object: "model", created, owned_by: d.provider };
}

function modelInfo(entry: ModelEntry, d: Deployment) {
  return {
    model_name: entry.model_name,
    svc_params: publicParams(entry.svc_params),
    model_info: { ...entry.model_info, id: d.id, db_model: false },
  };
}

function truthy(v: string | null): boolean {
  return v === "true" || v === "1";
}

function listModels(s: Snapshot, url: URL) {
  const data = [...s.models.groups].map(([name, ds]) => modelObject(name, s.loadedAt, ds[0]!));
  if (truthy(url.searchParams.get("return_wildcard_routes"))) {
    for (const w of s.models.wildcards) data.push(modelObject(w.pattern, s.loadedAt, w.deployments[0]!));
  }
  return { object: "list", data };
}

export function modelRoutes({ live }: AppDeps) {
  const guard = async (request: Request) => {
    const s = live.current;
    await authenticate(s, request.headers, new URL(request.url).pathname);
    return s;
  };
  const list = async ({ request }: { request: Request }) => listModels(await guard(request), new URL(request.url));
  const one = async ({ request, params }: { request: Request; params: Record<string, string> }) => {
    const s = await guard(request);
    const id = decodeURIComponent(params["*"] ?? "");
    const ds = s.models.resolve(id);
    if (!ds?.[0]) throw GatewayError.of(404, `Model '${id}' does not exist or is not available to this key. Call /v1/models to list models.`, "not_found_error", "model");
    return modelObject(id, s.loadedAt, ds[0]);
  };
  const info = async ({ request }: { request: Request }) => {
    const s = await guard(request);
    const id = new URL(request.url).searchParams.get("svc_model_id");
    if (id) {
      const found = s.models.findById(id);
      if (!found) throw GatewayError.of(404, `No model deployment with id '${id}'.`, "not_found_error", "svc_model_id");
      return { data: [modelInfo(found.entry, found.deployment)] };
    }
    return { data: s.models.entries.map((e) => modelInfo(e.entry, e.deployment)) };
  };
  return new Elysia()
    .get("/models", list)
    .get("/v1/models", list)
    .get("/models/*", one)
    .get("/v1/models/*", one)
    .get("/model/info", info)
    .get("/v1/model/info", info);
}
