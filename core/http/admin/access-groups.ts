/**
 * Access groups (`/access_group/*`, `/v1/access_group/{id}`): named sets of model groups that keys
 * and teams reference by name (in `models`) or by id (`access_group_ids`). Stored groups live in
 * `access_groups`; groups declared on deployments (`model_info.access_groups`, usually in
 * config.yaml) are listed and readable too, but only changing those deployments changes them. A
 * deployment that declares a stored group's name joins it: the group grants (and shows) the
 * stored models and the declaring deployments' models together; an update or delete here changes
 * the stored part only.
 * The gateway reads groups through the identity cache, so a write takes effect on the next
 * request without rebuilding the registry. Deleting a group leaves the references to it in place:
 * they then grant nothing (access fails closed). A group is never named like a model (lists naming
 * the name would get both): refuseModelName, refuseGroupNameClash. Reads: admins and viewers;
 * writes: proxy admins.
 */
import { randomUUID } from "node:crypto";
import { Type as T } from "@sinclair/typebox";
import { eq } from "drizzle-orm";
import { Elysia } from "elysia";
import { badRequest, notFound } from "../../authz.ts";
import type { ModelEntry } from "../../config/schema.ts";
import { GatewayError } from "../../errors.ts";
import type { AccessGroupRow } from "../../identity/records.ts";
import { declaredAccessGroups, groupModels, modelNamed, type Snapshot } from "../../snapshot.ts";
import { accessGroups } from "../../store/schema.ts";
import { isUniqueViolation, storeErrorCause } from "../../store/sql.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";
import { refuseOverbooking } from "./reservations.ts";

const ModelNames = T.Array(T.String({ minLength: 1 }));
const NewBody = T.Object({ access_group: T.String({ minLength: 1 }), model_names: ModelNames, description: T.Optional(T.String()) }, { additionalProperties: true });
const UpdateBody = T.Object({ model_names: ModelNames, description: T.Optional(T.String()) }, { additionalProperties: true });

/** Groups declared on deployments (`model_info.access_groups`, mostly in config.yaml), name → model names. */
const deploymentGroups = (s: Snapshot) => declaredAccessGroups(s.models);

function deploymentCount(s: Snapshot, names: readonly string[]): number {
  const wanted = new Set(names);
  return s.models.entries.filter((e) => wanted.has(e.entry.model_name)).length;
}

/**
 * A stored group as calls see it: `model_names` are its stored models and those of deployments
 * declaring its name (`declared_by_deployments`, which its update and delete leave as they are).
 */
function groupObject(s: Snapshot, row: AccessGroupRow): Record<string, unknown> {
  const declared = deploymentGroups(s).get(row.accessGroupName) ?? [];
  const models = groupModels(row.modelNames, declared) ?? [];
  return {
    access_group: row.accessGroupName,
    access_group_id: row.accessGroupId,
    model_names: models,
    declared_by_deployments: declared,
    deployment_count: deploymentCount(s, models),
    description: row.description,
    source: "db",
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
    created_by: row.createdBy,
    updated_by: row.updatedBy,
  };
}

function deploymentGroupObject(s: Snapshot, name: string, models: string[]): Record<string, unknown> {
  return { access_group: name, access_group_id: null, model_names: models, declared_by_deployments: models, deployment_count: deploymentCount(s, models), source: "deployments" };
}

/** Every name must be a model group served now (config or stored; wildcard routes by pattern). */
function requireModels(s: Snapshot, names: readonly string[]): void {
  if (names.length === 0) throw badRequest("model_names must list at least one model group.", "model_names");
  const unknown = names.filter((n) => !s.models.groups.has(n) && !s.models.wildcards.some((w) => w.pattern === n));
  if (unknown.length > 0) throw badRequest(`Unknown model group(s): ${unknown.join(", ")}. Call /model/info to list models.`, "model_names");
}

/** Store failures are 500s that say so (the detail goes to the log, not the client). */
async function storeWrite<R>(ctx: AdminCtx, what: string, write: () => Promise<R>, onUnique?: () => GatewayError): Promise<R> {
  try {
    return await write();
  } catch (err) {
    if (onUnique && isUniqueViolation(err)) throw onUnique();
    ctx.log.error("access group write failed", { what, ...storeErrorCause(err) });
    throw GatewayError.of(500, `Database error while trying to ${what}; see the gateway log.`, "internal_server_error");
  }
}

/** Access group ids for a message, each with its name when it has one (`id (name)`). */
export function groupLabels(ctx: AdminCtx, ids: readonly string[]): string {
  return ids
    .map((id) => {
      const name = ctx.identity.accessGroups.get(id)?.accessGroupName;
      return name === undefined ? id : `${id} (${name})`;
    })
    .join(", ");
}

const duplicate = (name: string) => badRequest(`Access group '${name}' already exists.`, "access_group");

/** A group named like a model would widen every list naming that model: the name would mean both. */
function refuseModelName(s: Snapshot, name: string): void {
  const model = modelNamed(s.models, s.groupAliases, name);
  if (model) throw badRequest(`Access group name '${name}' is already ${model}: every key, team and organization listing '${name}' would get the group's models too. Choose another name.`, "access_group");
}

/** The access groups a stored model's `model_info` declares. */
function declaredBy(info: unknown): readonly string[] {
  const groups = info && typeof info === "object" ? (info as { access_groups?: unknown }).access_groups : undefined;
  return Array.isArray(groups) ? groups.filter((g): g is string => typeof g === "string") : [];
}

/**
 * A model write must not make one name both a model and an access group (lists naming it would get
 * both): its `model_name` is no group's, its `model_info.access_groups` no model's. Only names the
 * write brings are checked (`before`: the stored model it changes), so a clash config.yaml made (a
 * warning at load) does not stop other changes of the model.
 */
export function refuseGroupNameClash(ctx: AdminCtx, entry: ModelEntry, before?: { modelName: string; modelInfo: unknown }): void {
  const s = ctx.snapshot;
  const name = entry.model_name;
  const groups = entry.model_info?.access_groups ?? [];
  if (name !== before?.modelName) {
    const stored = ctx.identity.accessGroupByName(name) !== undefined;
    if (stored || deploymentGroups(s).has(name) || groups.includes(name)) {
      throw badRequest(
        `model_name '${name}' is already the name of ${stored ? "a stored access group" : "an access group declared by deployments"}: every key, team and organization listing the group would get this model too. Choose another model_name.`,
        "model_name",
      );
    }
  }
  const had = declaredBy(before?.modelInfo);
  for (const group of groups.filter((g) => !had.includes(g))) {
    const model = modelNamed(s.models, s.groupAliases, group);
    if (model) {
      throw badRequest(
        `model_info.access_groups names '${group}', which is already ${model}: every key, team and organization listing '${group}' would get the group's models too. Choose another group name.`,
        "model_info.access_groups",
      );
    }
  }
}

async function createGroup(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const body = await ctx.body(NewBody);
  const name = body.access_group;
  requireModels(ctx.snapshot, body.model_names);
  if (deploymentGroups(ctx.snapshot).has(name) || ctx.identity.accessGroupByName(name)) throw duplicate(name);
  refuseModelName(ctx.snapshot, name);
  const who = ctx.caller.changedBy;
  const id = randomUUID();
  const [row] = await storeWrite(
    ctx,
    "create the access group",
    () =>
      ctx.db
        .insert(accessGroups)
        .values({ accessGroupId: id, accessGroupName: name, modelNames: [...new Set(body.model_names)], description: body.description ?? null, createdBy: who, updatedBy: who })
        .returning(),
    () => duplicate(name),
  );
  await ctx.changed({ kind: "access_group", accessGroupId: id });
  await ctx.audit({ action: "created", table: "access_groups", objectId: id, after: row });
  const out = groupObject(ctx.snapshot, row!);
  return { ...out, models_updated: out.deployment_count };
}

function listGroups(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const s = ctx.snapshot;
  const stored = [...ctx.identity.accessGroups.values()].sort((a, b) => a.accessGroupName.localeCompare(b.accessGroupName));
  // A declared name that is a stored group's is listed once, with the stored group (groupObject).
  const declared = [...deploymentGroups(s)].filter(([name]) => !ctx.identity.accessGroupByName(name)).sort(([a], [b]) => a.localeCompare(b));
  return {
    access_groups: [...declared.map(([name, models]) => deploymentGroupObject(s, name, models)), ...stored.map((row) => groupObject(s, row))],
  };
}

type Lookup = { by: "name" | "id"; value: string };

/** The stored group, from the store (the cache may lag another instance's write by milliseconds). */
async function findStored(ctx: AdminCtx, at: Lookup): Promise<AccessGroupRow | undefined> {
  const where = at.by === "name" ? eq(accessGroups.accessGroupName, at.value) : eq(accessGroups.accessGroupId, at.value);
  const [row] = await ctx.db.select().from(accessGroups).where(where);
  return row;
}

function missing(at: Lookup): GatewayError {
  return notFound(`Access group ${at.by === "name" ? `'${at.value}'` : `with id '${at.value}'`} not found.`, at.by === "name" ? "access_group" : "access_group_id");
}

/** A stored group to change; a group declared by deployments is a 400, anything else a 404. */
async function requireWritable(ctx: AdminCtx, at: Lookup): Promise<AccessGroupRow> {
  const row = await findStored(ctx, at);
  if (row) return row;
  if (at.by === "name" && deploymentGroups(ctx.snapshot).has(at.value)) throw badRequest(`Access group '${at.value}' is declared by deployments (model_info.access_groups, e.g. in config.yaml); change those models instead.`, "access_group");
  throw missing(at);
}

async function groupInfo(ctx: AdminCtx, at: Lookup) {
  ctx.caller.requireReadAll();
  const row = await findStored(ctx, at);
  if (row) return groupObject(ctx.snapshot, row);
  const models = at.by === "name" ? deploymentGroups(ctx.snapshot).get(at.value) : undefined;
  if (models) return deploymentGroupObject(ctx.snapshot, at.value, models);
  throw missing(at);
}

/**
 * Keys that name the group (by name in `models`, or by id) reach what it grants: a guaranteed key
 * among them must still fit every group it would reach, as after a key or model write (the 400
 * names the key). The deployments that declare the group keep granting; its stored models change.
 */
function refuseWidening(ctx: AdminCtx, id: string, name: string, stored: readonly string[]): void {
  const granted = groupModels(stored, declaredAccessGroups(ctx.snapshot.models).get(name));
  const groups = ctx.snapshot.accessGroups;
  const lookup = {
    byName: (n: string) => (n === name ? granted : groups.byName(n)),
    byId: (i: string) => (i === id ? granted : groups.byId(i)),
  };
  refuseOverbooking(ctx, { affected: () => true, accessGroups: lookup }, "model_names");
}

async function updateGroup(ctx: AdminCtx, at: Lookup) {
  ctx.caller.requireAdmin();
  const body = await ctx.body(UpdateBody);
  const before = await requireWritable(ctx, at);
  requireModels(ctx.snapshot, body.model_names);
  refuseWidening(ctx, before.accessGroupId, before.accessGroupName, body.model_names);
  const patch = { modelNames: [...new Set(body.model_names)], updatedAt: new Date(), updatedBy: ctx.caller.changedBy, ...(body.description === undefined ? {} : { description: body.description }) };
  const [row] = await storeWrite(ctx, "update the access group", () => ctx.db.update(accessGroups).set(patch).where(eq(accessGroups.accessGroupId, before.accessGroupId)).returning());
  if (!row) throw missing(at);
  await ctx.changed({ kind: "access_group", accessGroupId: row.accessGroupId });
  await ctx.audit({ action: "updated", table: "access_groups", objectId: row.accessGroupId, before, after: row });
  const out = groupObject(ctx.snapshot, row);
  return { ...out, models_updated: out.deployment_count };
}

async function deleteGroup(ctx: AdminCtx, at: Lookup) {
  ctx.caller.requireAdmin();
  const before = await requireWritable(ctx, at);
  const deleted = await storeWrite(ctx, "delete the access group", () =>
    ctx.db.delete(accessGroups).where(eq(accessGroups.accessGroupId, before.accessGroupId)).returning({ id: accessGroups.accessGroupId }),
  );
  // Deleted by a concurrent call since it was read: the answer that call's coming first gives.
  if (deleted.length === 0) throw missing(at);
  await ctx.changed({ kind: "access_group", accessGroupId: before.accessGroupId });
  await ctx.audit({ action: "deleted", table: "access_groups", objectId: before.accessGroupId, before });
  const declared = deploymentGroups(ctx.snapshot).get(before.accessGroupName);
  // The name still grants what deployments declare under it, to lists naming it (not to ids).
  const kept = declared ? `; the deployments that declare it in model_info.access_groups keep it by name: ${declared.join(", ")}` : "";
  return {
    access_group: before.accessGroupName,
    access_group_id: before.accessGroupId,
    models_updated: deploymentCount(ctx.snapshot, before.modelNames),
    message: `Access group '${before.accessGroupName}' deleted successfully${kept}`,
  };
}

type Params = { params: Record<string, string>; request: Request };

export function accessGroupRoutes(deps: AdminDeps) {
  const noParse = { parse: "none" } as const;
  const byName = (p: Params): Lookup => ({ by: "name", value: p.params.access_group ?? "" });
  const byId = (p: Params): Lookup => ({ by: "id", value: p.params.access_group_id ?? "" });
  const with_ = (at: (p: Params) => Lookup, h: (ctx: AdminCtx, at: Lookup) => Promise<unknown>) => (p: Params) =>
    adminRoute(deps, (ctx) => h(ctx, at(p)))({ request: p.request });
  return new Elysia()
    .post("/access_group/new", adminRoute(deps, createGroup), noParse)
    .get("/access_group/list", adminRoute(deps, async (ctx) => listGroups(ctx)))
    .get("/access_group/:access_group/info", with_(byName, groupInfo))
    .put("/access_group/:access_group/update", with_(byName, updateGroup), noParse)
    .delete("/access_group/:access_group/delete", with_(byName, deleteGroup), noParse)
    .get("/v1/access_group/:access_group_id", with_(byId, groupInfo))
    .put("/v1/access_group/:access_group_id", with_(byId, updateGroup), noParse)
    .delete("/v1/access_group/:access_group_id", with_(byId, deleteGroup), noParse);
}
