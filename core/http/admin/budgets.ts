/**
 * Budget objects (`/budget/*`): named limit sets that keys, teams, organizations and memberships
 * point at by `budget_id`. All routes are Global Admin Only (reads also for the admin viewer).
 * `budget_reset_at` starts at creation (or at the update that sets a new `budget_duration`) plus
 * the duration, unless the body gives it. Every update reaches the calls of what points at the
 * budget at once (rate limits and budgets read the cached budget row per call); its limit fields
 * are also written to the organizations on it, whose rows mirror their budget. A budget still
 * referenced by a live key, team, org or membership cannot be deleted (400 naming the referrers):
 * deleting it would silently lift limits.
 */
import { randomUUID } from "node:crypto";
import { type Static, Type as T } from "@sinclair/typebox";
import { and, asc, eq, inArray, isNotNull, isNull } from "drizzle-orm";
import { Elysia } from "elysia";
import { badRequest, notFound } from "../../authz.ts";
import { GatewayError } from "../../errors.ts";
import { CountField, IdList, ModelMaxBudget, MoneyField, Nullable, ParallelField, resetAt, storableTimestamp } from "../../identity/fields.ts";
import type { BudgetRow, IdentityChange } from "../../identity/records.ts";
import type { Exec } from "../../identity/members.ts";
import { followedReset, withoutUnchangedDuration } from "../../identity/budget-period.ts";
import { fromApi, toApi } from "../../identity/serialize.ts";
import { budgets, organizations, orgMembers, teamMembers, teams, virtualKeys } from "../../store/schema.ts";
import { isUniqueViolation } from "../../store/sql.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";

const TABLE = "budgets";

/** The spec's budget fields, all optional. */
const BudgetFields = {
  max_budget: T.Optional(MoneyField),
  soft_budget: T.Optional(MoneyField),
  budget_duration: T.Optional(Nullable(T.String())),
  budget_reset_at: T.Optional(Nullable(T.String({ minLength: 1 }))),
  max_parallel_requests: T.Optional(ParallelField),
  tpm_limit: T.Optional(CountField),
  rpm_limit: T.Optional(CountField),
  model_max_budget: T.Optional(Nullable(ModelMaxBudget)),
  model_tpm_limit: T.Optional(Nullable(T.Record(T.String(), T.Integer({ minimum: 0 })))),
  model_rpm_limit: T.Optional(Nullable(T.Record(T.String(), T.Integer({ minimum: 0 })))),
};
const BUDGET_COLUMNS = new Set(Object.keys(BudgetFields));
/**
 * The limit fields an organization keeps on its row as well as in its budget: a budget update
 * writes them to the organizations on that budget, as an organization update writes them to its
 * budget; an organization with a period of its own takes the budget's new one too (those without
 * follow it: see followNewPeriod).
 */
const ORG_MIRRORED = new Set(["max_budget", "soft_budget", "tpm_limit", "rpm_limit", "max_parallel_requests", "model_max_budget"]);

const NewBudgetBody = T.Object({ ...BudgetFields, budget_id: T.Optional(T.String({ minLength: 1 })) }, { additionalProperties: true });
const UpdateBudgetBody = T.Object({ ...BudgetFields, budget_id: T.String({ minLength: 1 }) }, { additionalProperties: true });
const InfoBody = T.Object({ budgets: IdList(T.String({ minLength: 1 })) }, { additionalProperties: true });
const DeleteBody = T.Object({ id: T.String({ minLength: 1 }) }, { additionalProperties: true });
type BudgetBody = Static<typeof NewBudgetBody>;

/** What `/budget/settings` lists: the configurable fields, their wire types and meaning. */
const SETTINGS: { field: keyof BudgetRow; name: string; type: string; description: string }[] = [
  { field: "maxBudget", name: "max_budget", type: "Float", description: "Maximum spend in USD; calls are refused once spend reaches it." },
  { field: "softBudget", name: "soft_budget", type: "Float", description: "Spend in USD at which an alert is sent; calls are not blocked." },
  { field: "budgetDuration", name: "budget_duration", type: "String", description: "Reset period such as 30d, 7d, 24h, 1h; null means the budget never resets." },
  { field: "maxParallelRequests", name: "max_parallel_requests", type: "Integer", description: "Maximum number of calls in flight at once." },
  { field: "tpmLimit", name: "tpm_limit", type: "Integer", description: "Tokens per minute." },
  { field: "rpmLimit", name: "rpm_limit", type: "Integer", description: "Requests per minute." },
  { field: "modelMaxBudget", name: "model_max_budget", type: "Object", description: "Per-model budgets: {<model>: {max_budget, budget_duration, tpm_limit, rpm_limit}}." },
];

/** The row props a body sets; `budget_reset_at` follows a new `budget_duration` unless given. */
function budgetProps(body: BudgetBody): Record<string, unknown> {
  const props = fromApi(budgets, body, BUDGET_COLUMNS);
  const reset = resetAt(body.budget_duration);
  if (body.budget_reset_at !== undefined) {
    const at = body.budget_reset_at === null ? null : new Date(body.budget_reset_at);
    if (at && !storableTimestamp(at)) throw badRequest(`budget_reset_at is not a timestamp in the years 0001 to 9999: ${body.budget_reset_at}.`, "budget_reset_at");
    props.budgetResetAt = at;
  } else if (reset !== undefined) props.budgetResetAt = reset;
  return props;
}

async function loadBudget(ctx: AdminCtx, budgetId: string, param = "budget_id"): Promise<BudgetRow> {
  const [row] = await ctx.db.select().from(budgets).where(eq(budgets.budgetId, budgetId));
  if (!row) throw notFound(`Budget '${budgetId}' not found.`, param);
  return row;
}

async function createBudget(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const body = await ctx.body(NewBudgetBody);
  const budgetId = body.budget_id ?? randomUUID();
  const props = budgetProps(body);
  const duplicate = () => badRequest(`Budget '${budgetId}' already exists.`, "budget_id");
  const [existing] = await ctx.db.select({ id: budgets.budgetId }).from(budgets).where(eq(budgets.budgetId, budgetId));
  if (existing) throw duplicate();
  const who = ctx.caller.changedBy;
  const [row] = await ctx.db
    .insert(budgets)
    .values({ ...props, budgetId, createdBy: who, updatedBy: who })
    .returning()
    .catch((err: unknown) => {
      throw isUniqueViolation(err) ? duplicate() : err;
    });
  await ctx.changed({ kind: "budget", budgetId });
  await ctx.audit({ action: "created", table: TABLE, objectId: budgetId, after: row });
  return toApi(row!);
}

async function updateBudget(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const sent = await ctx.body(UpdateBudgetBody);
  const before = await loadBudget(ctx, sent.budget_id);
  const body = withoutUnchangedDuration(sent, before.budgetDuration);
  const props = budgetProps(body);
  const at = new Date();
  const who = ctx.caller.changedBy;
  const orgPatch = fromApi(organizations, body, ORG_MIRRORED);
  const { after, orgs } = await ctx.db.transaction(async (tx) => {
    const [after] = await tx
      .update(budgets)
      .set({ ...props, updatedAt: at, updatedBy: who })
      .where(eq(budgets.budgetId, body.budget_id))
      .returning();
    // An organization's limits are its budget's (/organization/update writes both): they follow.
    const orgs =
      after && Object.keys(orgPatch).length > 0
        ? await tx
            .update(organizations)
            .set({ ...orgPatch, updatedAt: at, updatedBy: who })
            .where(eq(organizations.budgetId, body.budget_id))
            .returning({ id: organizations.organizationId })
        : [];
    // So is an organization's own period: one that has a duration takes the budget's new one
    // (those without follow it, see followNewPeriod).
    const periodOrgs =
      after && (body.budget_duration !== undefined || body.budget_reset_at !== undefined)
        ? await tx
            .update(organizations)
            .set({ budgetDuration: after.budgetDuration, budgetResetAt: after.budgetResetAt, updatedAt: at, updatedBy: who })
            .where(and(eq(organizations.budgetId, body.budget_id), isNotNull(organizations.budgetDuration)))
            .returning({ id: organizations.organizationId })
        : [];
    return { after, orgs: [...new Set([...orgs, ...periodOrgs].map((o) => o.id))] };
  });
  if (!after) throw notFound(`Budget '${body.budget_id}' not found: it was deleted meanwhile.`, "budget_id");
  await ctx.changed(
    { kind: "budget", budgetId: body.budget_id },
    ...orgs.map((orgId): IdentityChange => ({ kind: "org", orgId })),
    ...(await followNewPeriod(ctx, body, after)),
  );
  await ctx.audit({ action: "updated", table: TABLE, objectId: body.budget_id, before, after });
  return toApi(after);
}

/** A new period on the budget object moves the keys, teams and orgs that follow it (no duration of their own). */
async function followNewPeriod(ctx: AdminCtx, body: BudgetBody, after: BudgetRow): Promise<IdentityChange[]> {
  if (body.budget_duration === undefined && body.budget_reset_at === undefined) return [];
  const budgetResetAt = followedReset(after);
  const followers = <T extends typeof virtualKeys | typeof teams | typeof organizations>(t: T) =>
    and(eq(t.budgetId, after.budgetId), isNull(t.budgetDuration));
  const [keys, teamRows, orgs] = await Promise.all([
    ctx.db.update(virtualKeys).set({ budgetResetAt }).where(followers(virtualKeys)).returning({ id: virtualKeys.token }),
    ctx.db.update(teams).set({ budgetResetAt }).where(followers(teams)).returning({ id: teams.teamId }),
    ctx.db.update(organizations).set({ budgetResetAt }).where(followers(organizations)).returning({ id: organizations.organizationId }),
  ]);
  return [
    ...keys.map((k): IdentityChange => ({ kind: "key", token: k.id })),
    ...teamRows.map((t): IdentityChange => ({ kind: "team", teamId: t.id })),
    ...orgs.map((o): IdentityChange => ({ kind: "org", orgId: o.id })),
  ];
}

async function budgetInfo(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const { budgets: ids } = await ctx.body(InfoBody);
  if (ids.length === 0) throw badRequest("budgets is empty: list the budget ids to look up.", "budgets");
  const unique = [...new Set(ids)];
  const found = await ctx.db.select().from(budgets).where(inArray(budgets.budgetId, unique));
  const missing = unique.filter((id) => !found.some((b) => b.budgetId === id));
  if (missing.length > 0) throw notFound(`Budget(s) not found: ${missing.join(", ")}.`, "budgets");
  const byId = new Map(found.map((b) => [b.budgetId, b]));
  return unique.map((id) => toApi(byId.get(id)!));
}

async function listBudgets(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const rows = await ctx.db.select().from(budgets).orderBy(asc(budgets.createdAt), asc(budgets.budgetId));
  return rows.map((r) => toApi(r));
}

async function budgetSettings(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const budgetId = ctx.query("budget_id");
  if (!budgetId) throw GatewayError.of(422, "Invalid request: budget_id: query parameter is required", "validation_error", "budget_id");
  const row = await loadBudget(ctx, budgetId);
  const api = toApi(row);
  return SETTINGS.map((s) => ({
    field_name: s.name,
    field_type: s.type,
    field_description: s.description,
    field_value: api[s.name] ?? null,
    field_default_value: null,
    stored_in_db: true,
  }));
}

/** Who points at a budget: live keys, live teams, orgs and memberships. */
export async function budgetUsers(db: Exec, budgetId: string) {
  const [keys, teamRows, orgRows, teamMemberRows, orgMemberRows] = await Promise.all([
    db
      .select({ id: virtualKeys.token, alias: virtualKeys.keyAlias })
      .from(virtualKeys)
      .where(and(eq(virtualKeys.budgetId, budgetId), isNull(virtualKeys.deletedAt))),
    db
      .select({ id: teams.teamId })
      .from(teams)
      .where(and(eq(teams.budgetId, budgetId), isNull(teams.deletedAt))),
    db.select({ id: organizations.organizationId }).from(organizations).where(eq(organizations.budgetId, budgetId)),
    db.select({ team: teamMembers.teamId, user: teamMembers.userId }).from(teamMembers).where(eq(teamMembers.budgetId, budgetId)),
    db.select({ org: orgMembers.organizationId, user: orgMembers.userId }).from(orgMembers).where(eq(orgMembers.budgetId, budgetId)),
  ]);
  return { keys, teamRows, orgRows, teamMemberRows, orgMemberRows };
}

/** Who still points at a budget, for a message. */
async function referrers(db: Exec, budgetId: string): Promise<string[]> {
  const { keys, teamRows, orgRows, teamMemberRows, orgMemberRows } = await budgetUsers(db, budgetId);
  const out: string[] = [];
  if (keys.length) out.push(`keys: ${keys.map((k) => k.alias ?? k.id).join(", ")}`);
  if (teamRows.length) out.push(`teams: ${teamRows.map((t) => t.id).join(", ")}`);
  if (orgRows.length) out.push(`organizations: ${orgRows.map((o) => o.id).join(", ")}`);
  if (teamMemberRows.length) out.push(`team members: ${teamMemberRows.map((m) => `${m.team}/${m.user}`).join(", ")}`);
  if (orgMemberRows.length) out.push(`organization members: ${orgMemberRows.map((m) => `${m.org}/${m.user}`).join(", ")}`);
  return out;
}

async function deleteBudget(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const { id } = await ctx.body(DeleteBody);
  const before = await loadBudget(ctx, id, "id");
  const refuseInUse = async (db: Exec) => {
    const refs = await referrers(db, id);
    if (refs.length > 0) throw badRequest(`Budget '${id}' is still in use (${refs.join("; ")}). Move them to another budget first.`, "id");
  };
  await refuseInUse(ctx.db);
  const [deleted] = await ctx.db.transaction(async (tx) => {
    // Checked again with the budget locked: a key or team put on it meanwhile (it holds the budget,
    // see holds.ts) is seen now, or comes after this deletion and finds no budget.
    await tx.select({ id: budgets.budgetId }).from(budgets).where(eq(budgets.budgetId, id)).for("update");
    await refuseInUse(tx);
    return tx.delete(budgets).where(eq(budgets.budgetId, id)).returning();
  });
  if (!deleted) throw notFound(`Budget '${id}' not found: it was deleted meanwhile.`, "id");
  await ctx.changed({ kind: "budget", budgetId: id });
  await ctx.audit({ action: "deleted", table: TABLE, objectId: id, before });
  return toApi(deleted);
}

export function budgetRoutes(deps: AdminDeps) {
  const route = <R>(h: (ctx: AdminCtx) => Promise<R>) => adminRoute(deps, h);
  const noParse = { parse: "none" } as const;
  return new Elysia()
    .post("/budget/new", route(createBudget), noParse)
    .post("/budget/update", route(updateBudget), noParse)
    .post("/budget/info", route(budgetInfo), noParse)
    .get("/budget/list", route(listBudgets))
    .get("/budget/settings", route(budgetSettings))
    .post("/budget/delete", route(deleteBudget), noParse);
}
