/**
 * Model deployments stored in the database (`/model/new|update|delete`, `PATCH /model/{id}/update`).
 * They are checked like config entries (same schema, provider must exist), their credentials are
 * encrypted before they reach the store and never returned, and a write returns only once the
 * rebuilt registry serves it (other instances rebuild when the change reaches them). Models from
 * config.yaml are read-only here. Proxy admins only.
 */
import { randomUUID } from "node:crypto";
import { Type as T } from "@sinclair/typebox";
import { eq } from "drizzle-orm";
import { Elysia } from "elysia";
import { badRequest, notFound } from "../../authz.ts";
import { type ModelEntry, ModelEntrySchema } from "../../config/schema.ts";
import type { KeyRow } from "../../contract.ts";
import { GatewayError } from "../../errors.ts";
import { keyMayCallGroup } from "../../limits/capacity.ts";
import { ModelTable, toDeployment } from "../../models.ts";
import { decryptSecrets, encryptSecrets, isCredentialParam, secretKey } from "../../secrets.ts";
import { type Snapshot, servedStoredDeployment } from "../../snapshot.ts";
import { proxyModels } from "../../store/schema.ts";
import { checker } from "../validate.ts";
import { refuseGroupNameClash } from "./access-groups.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";
import { refuseOverbooking } from "./reservations.ts";

type ModelRow = typeof proxyModels.$inferSelect;

const DeleteBody = T.Object({ id: T.String({ minLength: 1 }) }, { additionalProperties: true });
const PatchBody = T.Object(
  {
    model_name: T.Optional(T.String({ minLength: 1 })),
    svc_params: T.Optional(T.Record(T.String(), T.Unknown())),
    model_info: T.Optional(T.Record(T.String(), T.Unknown())),
  },
  { additionalProperties: true },
);
const checkEntry = checker(ModelEntrySchema);

/** Fields never returned: credentials, and headers (which often carry them). Prices are shown, though named like tokens. */
function publicParams(params: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(params).filter(([k, v]) => !isCredentialParam(k, v) && k !== "headers"));
}

function modelObject(row: ModelRow): Record<string, unknown> {
  return {
    model_id: row.modelId,
    model_name: row.modelName,
    svc_params: publicParams(row.svcParams as Record<string, unknown>),
    model_info: { ...(row.modelInfo as Record<string, unknown>), id: row.modelId, db_model: true },
    created_at: row.createdAt?.toISOString() ?? null,
    updated_at: row.updatedAt?.toISOString() ?? null,
    created_by: row.createdBy,
    updated_by: row.updatedBy,
  };
}

function cryptoKey(ctx: AdminCtx): Buffer {
  const key = secretKey(process.env.SVC_SALT_KEY, ctx.snapshot.settings.masterKey);
  if (!key) throw GatewayError.of(500, "No key to encrypt model credentials with: set SVC_SALT_KEY or a master key.", "internal_server_error");
  return key;
}

/** The provider must be loaded and accept the deployment, as for a config entry. */
function requireDeployable(snapshot: Snapshot, entry: ModelEntry): void {
  const d = toDeployment(entry);
  const adapter = snapshot.providers.get(d.provider);
  if (!adapter) {
    throw badRequest(`Unknown provider '${d.provider}' in svc_params.model (known: ${[...snapshot.providers.keys()].sort().join(", ")}).`, "svc_params.model");
  }
  const resolved = adapter.resolve ? adapter.resolve(d) : d;
  if (typeof resolved === "string") throw badRequest(`svc_params: ${resolved}`, "svc_params");
}

/** The model table as it is once deployment `id` is replaced by `entry` (removed: no entry). */
function tableAfter(snapshot: Snapshot, id: string, entry: ModelEntry | undefined): ModelTable {
  const before = servedStoredDeployment(snapshot, id);
  const entries = snapshot.models.entries.filter((e) => e.deployment !== before);
  if (entry) entries.push({ entry, deployment: { ...toDeployment(entry), id } });
  return new ModelTable(entries);
}

/**
 * A deployment's creation, update or removal must leave room in its group (old and new) for what
 * guaranteed keys reserve there, as a key write must (the same 400): a guaranteed key always finds
 * its share free.
 */
function checkReservations(ctx: AdminCtx, id: string, entry: ModelEntry | undefined, param: string): void {
  const models = tableAfter(ctx.snapshot, id, entry);
  const reach = { models, accessGroups: ctx.snapshot.accessGroups, groupAliases: ctx.snapshot.groupAliases };
  // A name the write leaves to another group or wildcard route (a group of its own removed) draws on that one.
  const named = [servedStoredDeployment(ctx.snapshot, id)?.modelName, entry?.model_name].filter((g) => g !== undefined);
  const touched = named.flatMap((g) => [g, models.servingName(g) ?? g]);
  const mayCall = (k: KeyRow) => touched.some((g) => keyMayCallGroup(k, ctx.identity, g, reach));
  refuseOverbooking(ctx, { affected: mayCall, models }, param);
}

/** What goes into `model_info`: the id has its own column and `db_model` is derived. */
function storedInfo(info: Record<string, unknown> | undefined): Record<string, unknown> {
  const { id: _id, db_model: _db, ...rest } = info ?? {};
  return rest;
}

async function findRow(ctx: AdminCtx, id: string): Promise<ModelRow | undefined> {
  const [row] = await ctx.db.select().from(proxyModels).where(eq(proxyModels.modelId, id));
  return row;
}

/** The config.yaml model whose deployment id is `id`, named for messages (`'name' (/model_list/2)`). */
function configModel(snapshot: Snapshot, id: string): string | undefined {
  const found = snapshot.models.findById(id);
  const at = found ? snapshot.config.model_list.indexOf(found.entry) : -1;
  return at < 0 ? undefined : `'${found!.entry.model_name}' (/model_list/${at})`;
}

/**
 * The stored row for `id`; a config model is a 400 (edit the file), anything else a 404. A stored
 * model that a config.yaml model of the same id shadows (the file gained it later) may be deleted,
 * but a change to it would not serve: that is a 400 saying so.
 */
async function requireStored(ctx: AdminCtx, id: string, forChange = true): Promise<ModelRow> {
  const row = await findRow(ctx, id);
  const config = configModel(ctx.snapshot, id);
  if (row && config && forChange) {
    throw badRequest(
      `Model '${id}' is stored, but config.yaml's model ${config} has the same id and serves instead (config.yaml wins): a change to the stored one would not take effect. Delete it with /model/delete, or give the config model another model_info.id.`,
      "id",
    );
  }
  if (row) return row;
  if (config) throw badRequest(`Model '${id}' is defined in config.yaml; edit the file to change it.`, "id");
  throw notFound(`Model '${id}' not found.`, "id");
}

/** What a model write expects: the registry serving it, and the stored row still being its own. */
interface Expected {
  serves(s: Snapshot): boolean;
  stored(row: ModelRow | undefined): boolean;
}

/** The stored model the registry serves as `id` (not a config.yaml model of that id). */
function servedStored(s: Snapshot, id: string): ModelEntry | undefined {
  return servedStoredDeployment(s, id) && s.models.findById(id)?.entry;
}

const servesAs = (id: string, name: string): Expected => ({
  serves: (s) => servedStored(s, id)?.model_name === name,
  stored: (row) => row?.modelName === name,
});

const gone = (id: string): Expected => ({ serves: (s) => !servedStored(s, id), stored: (row) => row === undefined });

/**
 * Publishes the change and waits until this instance's registry reflects it. A write that another
 * write of the same model overtook (the store no longer holds it) has done its part: the registry
 * serves the later one.
 */
async function applied(ctx: AdminCtx, deps: AdminDeps, id: string, expected: Expected): Promise<void> {
  await ctx.changed({ kind: "models" });
  // Wait out every rebuild started meanwhile: a later one may be the one that carries this change.
  for (let reload = deps.live.storedModelsReload; ; ) {
    const result = await reload;
    if (result && !result.ok) {
      throw GatewayError.of(500, `The model change was saved, but the registry could not be rebuilt: ${result.errors.join("; ")}`, "internal_server_error");
    }
    if (deps.live.storedModelsReload === reload) break;
    reload = deps.live.storedModelsReload;
  }
  if (expected.serves(deps.live.current) || !expected.stored(await findRow(ctx, id))) return;
  throw GatewayError.of(500, "The model change was saved, but the registry did not take it up; see the gateway log.", "internal_server_error");
}

/** Encrypts credentials and writes the row (insert or full replace). */
function rowValues(ctx: AdminCtx, entry: ModelEntry) {
  const key = cryptoKey(ctx);
  return {
    modelName: entry.model_name,
    svcParams: encryptSecrets(entry.svc_params, key),
    modelInfo: storedInfo(entry.model_info),
    updatedAt: new Date(),
    updatedBy: ctx.caller.changedBy,
  };
}

async function createModel(ctx: AdminCtx, deps: AdminDeps) {
  ctx.caller.requireAdmin();
  const entry = await ctx.body(ModelEntrySchema);
  requireDeployable(ctx.snapshot, entry);
  refuseGroupNameClash(ctx, entry);
  const id = entry.model_info?.id ?? randomUUID();
  const config = configModel(ctx.snapshot, id);
  // Stored under a config model's id, it would never serve: config.yaml's wins when they are merged.
  if (config) throw badRequest(`A model with id '${id}' already exists in config.yaml: ${config}. Give this model another model_info.id.`, "model_info.id");
  if (ctx.snapshot.models.findById(id) || (await findRow(ctx, id))) throw badRequest(`A model with id '${id}' already exists.`, "model_info.id");
  // A new group (or a name it takes from another, from a wildcard route) may be one guaranteed keys already reserve more of than it serves.
  checkReservations(ctx, id, entry, "svc_params");
  const [row] = await ctx.db
    .insert(proxyModels)
    .values({ ...rowValues(ctx, entry), modelId: id, createdBy: ctx.caller.changedBy })
    .onConflictDoNothing()
    .returning();
  if (!row) throw badRequest(`A model with id '${id}' already exists.`, "model_info.id");
  await ctx.audit({ action: "created", table: "proxy_models", objectId: id, after: modelObject(row) });
  await applied(ctx, deps, id, servesAs(id, row.modelName));
  return modelObject(row);
}

async function replaceModel(ctx: AdminCtx, deps: AdminDeps) {
  ctx.caller.requireAdmin();
  const entry = await ctx.body(ModelEntrySchema);
  const id = entry.model_info?.id;
  if (!id) throw GatewayError.of(422, "Invalid request: model_info.id: required to name the model to update", "validation_error", "model_info.id");
  const before = await requireStored(ctx, id);
  requireDeployable(ctx.snapshot, entry);
  refuseGroupNameClash(ctx, entry, before);
  checkReservations(ctx, id, entry, "svc_params");
  return writeUpdate(ctx, deps, before, entry);
}

async function writeUpdate(ctx: AdminCtx, deps: AdminDeps, before: ModelRow, entry: ModelEntry) {
  const id = before.modelId;
  const [row] = await ctx.db.update(proxyModels).set(rowValues(ctx, entry)).where(eq(proxyModels.modelId, id)).returning();
  if (!row) throw notFound(`Model '${id}' not found.`, "id");
  return updated(ctx, deps, before, row);
}

async function updated(ctx: AdminCtx, deps: AdminDeps, before: ModelRow, row: ModelRow) {
  const id = row.modelId;
  await ctx.audit({ action: "updated", table: "proxy_models", objectId: id, before: modelObject(before), after: modelObject(row) });
  await applied(ctx, deps, id, servesAs(id, row.modelName));
  return modelObject(row);
}

/** `patch` merged over `base`; a null value removes the field. */
function merge(base: Record<string, unknown>, patch: Record<string, unknown> | undefined): Record<string, unknown> {
  const out = { ...base };
  for (const [k, v] of Object.entries(patch ?? {})) {
    if (v === null) delete out[k];
    else out[k] = v;
  }
  return out;
}

async function patchModel(ctx: AdminCtx, deps: AdminDeps, id: string) {
  ctx.caller.requireAdmin();
  const body = await ctx.body(PatchBody);
  await requireStored(ctx, id);
  if (body.model_info?.id !== undefined && body.model_info.id !== id) throw badRequest("model_info.id cannot change; it is the model's identity.", "model_info.id");
  const key = cryptoKey(ctx);
  // Merged into the row as it is now, locked until written: merged into the row read above, a
  // concurrent PATCH's change to another field would be written back over and lost.
  const { before, row } = await ctx.db.transaction(async (tx) => {
    const [before] = await tx.select().from(proxyModels).where(eq(proxyModels.modelId, id)).for("update");
    if (!before) throw notFound(`Model '${id}' not found: it was deleted meanwhile.`, "id");
    let stored: Record<string, unknown>;
    try {
      stored = decryptSecrets(before.svcParams as Record<string, unknown>, key);
    } catch {
      throw GatewayError.of(409, "The stored credentials of this model cannot be decrypted (was SVC_SALT_KEY or the master key changed?). Replace them with /model/update.", "conflict");
    }
    const merged = checkEntry({
      model_name: body.model_name ?? before.modelName,
      svc_params: merge(stored, body.svc_params),
      model_info: storedInfo(merge(before.modelInfo as Record<string, unknown>, body.model_info)),
    }) as ModelEntry;
    requireDeployable(ctx.snapshot, merged);
    refuseGroupNameClash(ctx, merged, before);
    checkReservations(ctx, id, merged, "svc_params");
    const [row] = await tx.update(proxyModels).set(rowValues(ctx, merged)).where(eq(proxyModels.modelId, id)).returning();
    return { before, row: row! };
  });
  return updated(ctx, deps, before, row);
}

async function deleteModel(ctx: AdminCtx, deps: AdminDeps) {
  ctx.caller.requireAdmin();
  const { id } = await ctx.body(DeleteBody);
  const before = await requireStored(ctx, id, false);
  checkReservations(ctx, id, undefined, "id");
  const [deleted] = await ctx.db.delete(proxyModels).where(eq(proxyModels.modelId, id)).returning({ id: proxyModels.modelId });
  // Another call deleted it since it was read: answered as if it had come first.
  if (!deleted) throw notFound(`Model '${id}' not found: it was deleted meanwhile.`, "id");
  await ctx.audit({ action: "deleted", table: "proxy_models", objectId: id, before: modelObject(before) });
  await applied(ctx, deps, id, gone(id));
  return { message: `Model: ${id} deleted successfully` };
}

export function modelAdminRoutes(deps: AdminDeps) {
  const noParse = { parse: "none" } as const;
  return new Elysia()
    .post("/model/new", adminRoute(deps, (ctx) => createModel(ctx, deps)), noParse)
    .post("/model/update", adminRoute(deps, (ctx) => replaceModel(ctx, deps)), noParse)
    .post("/model/delete", adminRoute(deps, (ctx) => deleteModel(ctx, deps)), noParse)
    .patch("/model/:model_id/update", ({ request, params }) => adminRoute(deps, (ctx) => patchModel(ctx, deps, params.model_id))({ request }), noParse);
}
