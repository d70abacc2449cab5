/**
 * Organizations (`/organization/*`): the top of the identity tree. An org's limits live on its row
 * and in its budget (created from the limit fields when no `budget_id` is given, and kept in step
 * by updates of either: /budget/update writes them to its orgs; LiteLLM keeps them in the budget
 * alone); `blocked` stops every key of the org on the next request (the auth plugin reads the
 * cached org). Writes are proxy-admin only; reads are for admins and viewers, and
 * an `org_admin` member may read its own org. Deleting an org that still has teams or keys is
 * refused (400) rather than orphaning them.
 */
import { randomUUID } from "node:crypto";
import { type Static, type TSchema, Type as T } from "@sinclair/typebox";
import { and, eq, ilike, inArray, isNull, type SQL } from "drizzle-orm";
import { Elysia } from "elysia";
import { badRequest, forbidden, notFound } from "../../authz.ts";
import { GatewayError } from "../../errors.ts";
import { Amount, IdList, ModelMaxBudget, Parallel, Quantity, resetAt } from "../../identity/fields.ts";
import { holdBudget, holdExistingUser, holdOrg, holdWrite, lockEmail } from "../../identity/holds.ts";
import { addressTaken, type Exec, findUserByEmail } from "../../identity/members.ts";
import { refuseMasterUserId } from "../../identity/master-user.ts";
import { teamOutsideOrg } from "../../identity/org-rules.ts";
import type { BudgetRow, KeyRow, OrgMemberRow, OrgRow, UserRow } from "../../identity/records.ts";
import { fromApi, toApi } from "../../identity/serialize.ts";
import { shownCallbackSettings } from "../../identity/team-callbacks.ts";
import { budgets, orgMembers, organizations, teams, users, virtualKeys } from "../../store/schema.ts";
import { isUniqueViolation } from "../../store/sql.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";
import { refuseOverbooking } from "./reservations.ts";
import { auditCreatedUser } from "./user-audit.ts";
import { budgetUsers } from "./budgets.ts";
import { followedReset, periodFromBudget, withoutUnchangedDuration } from "../../identity/budget-period.ts";

const nullable = <S extends TSchema>(s: S) => T.Union([s, T.Null()]);
const Money = nullable(Amount);
const Count = nullable(Quantity);
const Json = T.Record(T.String(), T.Unknown());
const IntMap = nullable(T.Record(T.String(), T.Integer({ minimum: 0 })));

/** Fields an org create or update may set (all optional here). */
const orgFields = {
  organization_alias: T.String({ minLength: 1 }),
  models: nullable(T.Array(T.String())),
  budget_id: nullable(T.String({ minLength: 1 })),
  max_budget: Money,
  soft_budget: Money,
  tpm_limit: Count,
  rpm_limit: Count,
  max_parallel_requests: nullable(Parallel),
  budget_duration: nullable(T.String()),
  // Enforced per model group (plugins/budgets.ts) and mirrored into the org's budget: checked as a budget object's.
  model_max_budget: nullable(ModelMaxBudget),
  model_rpm_limit: IntMap,
  model_tpm_limit: IntMap,
  metadata: nullable(Json),
  tags: nullable(T.Array(T.String())),
  model_aliases: nullable(T.Record(T.String(), T.String())),
  object_permission: nullable(Json),
  blocked: nullable(T.Boolean()),
};
const optionalFields = T.Partial(T.Object(orgFields)).properties;

const NewOrgBody = T.Object({ ...optionalFields, organization_alias: orgFields.organization_alias, organization_id: T.Optional(T.String({ minLength: 1 })) }, { additionalProperties: true });
const UpdateOrgBody = T.Object({ ...optionalFields, organization_id: T.String({ minLength: 1 }) }, { additionalProperties: true });
const DeleteOrgBody = T.Object({ organization_ids: IdList(T.String({ minLength: 1 }), 1) }, { additionalProperties: true });
const InfoBody = T.Object({ organization_id: T.String({ minLength: 1 }) }, { additionalProperties: true });

const OrgRole = T.Union([T.Literal("org_admin"), T.Literal("internal_user"), T.Literal("internal_user_viewer")]);
const Member = T.Object({ role: OrgRole, user_id: T.Optional(T.String({ minLength: 1 })), user_email: T.Optional(T.String({ minLength: 1 })) }, { additionalProperties: true });
type MemberInput = Static<typeof Member>;
const MemberAddBody = T.Object(
  // Any value but null is refused, whatever its shape (refuseOrgMemberBudget).
  { organization_id: T.String({ minLength: 1 }), member: T.Union([Member, IdList(Member, 1)]), max_budget_in_organization: T.Optional(T.Unknown()) },
  { additionalProperties: true },
);
const MemberRef = {
  organization_id: T.String({ minLength: 1 }),
  user_id: T.Optional(T.String({ minLength: 1 })),
  user_email: T.Optional(T.String({ minLength: 1 })),
};
const MemberUpdateBody = T.Object({ ...MemberRef, role: T.Optional(OrgRole), max_budget_in_organization: T.Optional(T.Unknown()) }, { additionalProperties: true });
const MemberDeleteBody = T.Object(MemberRef, { additionalProperties: true });

/** Org columns the API may write (spend, reset times and audit columns are the gateway's). */
const ORG_COLUMNS = new Set<string>(Object.keys(orgFields));
/** The limit fields that make up the org's budget. */
const BUDGET_COLUMNS = new Set(["max_budget", "soft_budget", "tpm_limit", "rpm_limit", "max_parallel_requests", "budget_duration", "model_max_budget"]);
/** Columns that cannot be null: an explicit null resets them to their empty value. */
const EMPTY: Record<string, unknown> = { models: [], tags: [], metadata: {}, modelAliases: {}, blocked: false };

function withEmptyDefaults(props: Record<string, unknown>): Record<string, unknown> {
  for (const [k, empty] of Object.entries(EMPTY)) if (k in props && props[k] === null) props[k] = empty;
  return props;
}

/** A `budget_duration` must parse; its reset time starts now. */
function budgetReset(body: { budget_duration?: string | null }): { budgetResetAt?: Date | null } {
  const at = resetAt(body.budget_duration);
  return at === undefined ? {} : { budgetResetAt: at };
}

/** Readers: admins and viewers everywhere, an org's own `org_admin` members for that org (not through a key issued in a team). */
function requireOrgReader(ctx: AdminCtx, orgId: string): void {
  if (ctx.caller.canReadAll || ctx.caller.orgRole(orgId) === "org_admin") return;
  throw forbidden("Only a proxy admin (or the organization's admin) may read this organization.");
}

async function loadOrg(ctx: AdminCtx, orgId: string): Promise<OrgRow> {
  const [org] = await ctx.db.select().from(organizations).where(eq(organizations.organizationId, orgId));
  if (!org) throw notFound(`Organization '${orgId}' not found.`, "organization_id");
  return org;
}

async function loadBudget(ctx: AdminCtx, budgetId: string | null): Promise<BudgetRow | undefined> {
  if (!budgetId) return undefined;
  const [row] = await ctx.db.select().from(budgets).where(eq(budgets.budgetId, budgetId));
  return row;
}

const budgetGone = (budgetId: string) => badRequest(`Budget '${budgetId}' does not exist; create it with /budget/new or leave budget_id out.`, "budget_id");

async function requireBudget(ctx: AdminCtx, budgetId: string): Promise<void> {
  if (!(await loadBudget(ctx, budgetId))) throw budgetGone(budgetId);
}

/** The budget object an org is put on, held until the write's transaction ends (see holds.ts): a 400 when it was deleted meanwhile. */
async function holdOrgBudget(tx: Exec, budgetId: string | undefined | null): Promise<void> {
  if (budgetId && !(await holdBudget(tx, budgetId))) throw budgetGone(budgetId);
}

function orgObject(org: OrgRow, budget: BudgetRow | undefined): Record<string, unknown> {
  return { ...toApi(org), budget: budget ? toApi(budget) : null };
}

/** Orgs with their budget, members (with e-mail) and live teams, in two queries per kind. */
async function expandOrgs(ctx: AdminCtx, orgs: OrgRow[]): Promise<Record<string, unknown>[]> {
  if (orgs.length === 0) return [];
  const ids = orgs.map((o) => o.organizationId);
  const budgetIds = orgs.flatMap((o) => (o.budgetId ? [o.budgetId] : []));
  const [budgetRows, memberRows, teamRows] = await Promise.all([
    budgetIds.length ? ctx.db.select().from(budgets).where(inArray(budgets.budgetId, budgetIds)) : Promise.resolve([]),
    ctx.db
      .select({ member: orgMembers, userEmail: users.userEmail })
      .from(orgMembers)
      .leftJoin(users, eq(users.userId, orgMembers.userId))
      .where(inArray(orgMembers.organizationId, ids)),
    ctx.db.select().from(teams).where(and(inArray(teams.organizationId, ids), isNull(teams.deletedAt))),
  ]);
  const budgetById = new Map(budgetRows.map((b) => [b.budgetId, b]));
  return orgs.map((org) => ({
    ...orgObject(org, org.budgetId ? budgetById.get(org.budgetId) : undefined),
    members: memberRows.filter((m) => m.member.organizationId === org.organizationId).map((m) => ({ ...toApi(m.member), user_email: m.userEmail })),
    teams: teamRows.filter((t) => t.organizationId === org.organizationId).map((t) => ({ ...toApi(t), callback_settings: shownCallbackSettings(t, ctx.caller.maySeeCallbacks(t.teamId)) })),
  }));
}

async function createOrg(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const body = await ctx.body(NewOrgBody);
  const orgId = body.organization_id ?? randomUUID();
  const reset = budgetReset(body);
  const [existing] = await ctx.db.select({ id: organizations.organizationId }).from(organizations).where(eq(organizations.organizationId, orgId));
  if (existing) throw badRequest(`Organization '${orgId}' already exists.`, "organization_id");
  if (body.budget_id) await requireBudget(ctx, body.budget_id);
  const who = ctx.caller.changedBy;
  const budgetId = body.budget_id ?? randomUUID();
  const orgProps = withEmptyDefaults(fromApi(organizations, body, ORG_COLUMNS));
  const { org, budget } = await ctx.db
    .transaction(async (tx) => {
      await holdOrgBudget(tx, body.budget_id);
      let budget: BudgetRow | undefined;
      if (!body.budget_id) {
        [budget] = await tx
          .insert(budgets)
          .values({ ...fromApi(budgets, body, BUDGET_COLUMNS), ...reset, budgetId, createdBy: who, updatedBy: who })
          .returning();
      }
      // An org on an existing budget object without a duration of its own follows that budget's period.
      const period = body.budget_id && !body.budget_duration ? { budgetResetAt: followedReset(ctx.identity.budgets.get(body.budget_id)) } : reset;
      const [org] = await tx
        .insert(organizations)
        .values({ ...orgProps, ...period, organizationId: orgId, organizationAlias: body.organization_alias, budgetId, createdBy: who, updatedBy: who })
        .returning();
      return { org: org!, budget };
    })
    .catch((err: unknown) => {
      if (isUniqueViolation(err)) throw badRequest(`Organization '${orgId}' already exists.`, "organization_id");
      throw err;
    });
  if (budget) await ctx.changed({ kind: "budget", budgetId });
  await ctx.changed({ kind: "org", orgId });
  await ctx.audit({ action: "created", table: "organizations", objectId: orgId, after: org });
  return orgObject(org, budget ?? (await loadBudget(ctx, budgetId)));
}

/** Teams of the org whose lists the org, as `org` would make it, would no longer allow (their models, and access_group_ids). */
function teamsOutside(ctx: AdminCtx, orgId: string, org: Pick<OrgRow, "models" | "modelAliases">): string[] {
  const bad: string[] = [];
  for (const team of ctx.identity.teams.values()) {
    if (team.organizationId !== orgId) continue;
    const outside = teamOutsideOrg(org, team, ctx.snapshot.accessGroups, ctx.snapshot.groupAliases);
    const named = [...outside.models, ...outside.accessGroupIds.map((id) => `access_group_ids ${id}`)];
    if (named.length > 0) bad.push(`${team.teamId} (${named.join(", ")})`);
  }
  return bad;
}

async function updateOrg(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const sent = await ctx.body(UpdateOrgBody);
  const orgId = sent.organization_id;
  const before = await loadOrg(ctx, orgId);
  const body = withoutUnchangedDuration(sent, before.budgetDuration);
  const reset = budgetReset(body);
  if (body.budget_id) await requireBudget(ctx, body.budget_id);
  const patch = withEmptyDefaults(fromApi(organizations, body, ORG_COLUMNS));
  // Its aliases as well as its models decide what its teams' names call (org-rules.ts).
  if (Array.isArray(patch.models) || "modelAliases" in patch) {
    const after = { models: (Array.isArray(patch.models) ? patch.models : before.models) as string[], modelAliases: ("modelAliases" in patch ? patch.modelAliases : before.modelAliases) as OrgRow["modelAliases"] };
    const bad = teamsOutside(ctx, orgId, after);
    const param = Array.isArray(patch.models) ? "models" : "model_aliases";
    if (bad.length > 0) throw badRequest(`The organization's ${param} would no longer cover its teams' models: ${bad.join("; ")}. Update those teams first.`, param);
  }
  // Its models and its aliases decide which groups its guaranteed keys reserve on.
  if (Array.isArray(patch.models) || "modelAliases" in patch) {
    const orgs = new Map(ctx.identity.orgs).set(orgId, { ...before, ...patch } as OrgRow);
    const inOrg = (k: KeyRow) => k.organizationId === orgId || (k.teamId !== null && ctx.identity.teams.get(k.teamId)?.organizationId === orgId);
    refuseOverbooking(ctx, { affected: inOrg, owners: { orgs } }, Array.isArray(patch.models) ? "models" : "model_aliases");
  }
  const who = ctx.caller.changedBy;
  const budgetPatch = fromApi(budgets, body, BUDGET_COLUMNS);
  // The org's limits live in its budget too: keep it in step unless this call moves the org to
  // another budget, or others use that budget (a shared budget is changed by /budget/update; the
  // org's own values, on its row, win over it).
  const mirrorBudget = body.budget_id === undefined && before.budgetId !== null && Object.keys(budgetPatch).length > 0 && !(await sharedBudget(ctx, before.budgetId, orgId));
  const after = await ctx.db.transaction(async (tx) => {
    await holdOrgBudget(tx, body.budget_id);
    if (mirrorBudget) {
      await tx
        .update(budgets)
        .set({ ...budgetPatch, ...reset, updatedAt: new Date(), updatedBy: who })
        .where(eq(budgets.budgetId, before.budgetId!));
    }
    const ownDuration = body.budget_duration !== undefined ? body.budget_duration : before.budgetDuration;
    const period = periodFromBudget(body, ownDuration) ? { budgetResetAt: followedReset(ctx.identity.budgets.get(body.budget_id ?? before.budgetId ?? "")) } : reset;
    const [row] = await tx
      .update(organizations)
      .set({ ...patch, ...period, updatedAt: new Date(), updatedBy: who })
      .where(eq(organizations.organizationId, orgId))
      .returning();
    // Deleted by a concurrent /organization/delete since it was read: the answer that call's coming first gives.
    if (!row) throw notFound(`Organization '${orgId}' not found.`, "organization_id");
    return row;
  });
  if (mirrorBudget) await ctx.changed({ kind: "budget", budgetId: before.budgetId! });
  await ctx.changed({ kind: "org", orgId });
  const action = body.blocked === true && !before.blocked ? "blocked" : body.blocked === false && before.blocked ? "unblocked" : "updated";
  await ctx.audit({ action, table: "organizations", objectId: orgId, before, after });
  return orgObject(after, await loadBudget(ctx, after.budgetId));
}

/** Whether anything besides organization `orgId` uses budget `budgetId`. */
async function sharedBudget(ctx: AdminCtx, budgetId: string, orgId: string): Promise<boolean> {
  const u = await budgetUsers(ctx.db, budgetId);
  return u.keys.length + u.teamRows.length + u.teamMemberRows.length + u.orgMemberRows.length > 0 || u.orgRows.some((o) => o.id !== orgId);
}

/** An organization that still has live teams or keys is not deleted: a 400 naming them. */
async function refuseInUse(db: Exec, ids: string[]): Promise<void> {
  const [liveTeams, liveKeys] = await Promise.all([
    db.select({ id: teams.teamId, org: teams.organizationId }).from(teams).where(and(inArray(teams.organizationId, ids), isNull(teams.deletedAt))),
    db.select({ org: virtualKeys.organizationId }).from(virtualKeys).where(and(inArray(virtualKeys.organizationId, ids), isNull(virtualKeys.deletedAt))),
  ]);
  if (liveTeams.length > 0 || liveKeys.length > 0) {
    const teamList = liveTeams.map((t) => `${t.id} (org ${t.org})`).join(", ");
    throw badRequest(
      `Cannot delete an organization that still has teams or keys${teamList ? `; teams: ${teamList}` : ""}${liveKeys.length ? `; ${liveKeys.length} key(s)` : ""}. Delete or move them first.`,
      "organization_ids",
    );
  }
}

async function deleteOrgs(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const { organization_ids: ids } = await ctx.body(DeleteOrgBody);
  const unique = [...new Set(ids)];
  const found = await ctx.db.select().from(organizations).where(inArray(organizations.organizationId, unique));
  const missing = unique.filter((id) => !found.some((o) => o.organizationId === id));
  if (missing.length > 0) throw notFound(`Organization(s) not found: ${missing.join(", ")}.`, "organization_ids");
  await refuseInUse(ctx.db, unique);
  const expanded = await expandOrgs(ctx, found);
  const detachedUsers = await ctx.db.transaction(async (tx) => {
    // Checked again with the orgs locked: a team or key put in one meanwhile (it holds its org, see
    // holds.ts) is seen now, or comes after this deletion and finds no org.
    await tx.select({ id: organizations.organizationId }).from(organizations).where(inArray(organizations.organizationId, unique)).orderBy(organizations.organizationId).for("update");
    await refuseInUse(tx, unique);
    await tx.delete(orgMembers).where(inArray(orgMembers.organizationId, unique));
    // Its users locked in id order first, as the spend writer locks the users it charges (their
    // own keys charge them, not the organization; spend/flush.ts LOCK_ORDER): in the order the
    // update met them, this and a spend batch each held a user the other waited for, and
    // PostgreSQL failed one (a 500 here).
    await tx.select({ id: users.userId }).from(users).where(inArray(users.organizationId, unique)).orderBy(users.userId).for("no key update");
    const detached = await tx
      .update(users)
      .set({ organizationId: null, updatedAt: new Date(), updatedBy: ctx.caller.changedBy })
      .where(inArray(users.organizationId, unique))
      .returning({ userId: users.userId });
    const deleted = await tx.delete(organizations).where(inArray(organizations.organizationId, unique)).returning({ id: organizations.organizationId });
    // Another call deleted one of them since it was read: answered as if it had come first.
    if (deleted.length < unique.length) {
      throw notFound(`Organization(s) not found: ${unique.filter((id) => !deleted.some((d) => d.id === id)).join(", ")} (deleted meanwhile); nothing was deleted.`, "organization_ids");
    }
    return detached;
  });
  for (const orgId of unique) await ctx.changed({ kind: "org", orgId }, { kind: "org_members", orgId });
  for (const u of detachedUsers) await ctx.changed({ kind: "user", userId: u.userId });
  for (const org of found) await ctx.audit({ action: "deleted", table: "organizations", objectId: org.organizationId, before: org });
  return expanded;
}

async function orgInfo(ctx: AdminCtx, orgId: string) {
  requireOrgReader(ctx, orgId);
  const [org] = await expandOrgs(ctx, [await loadOrg(ctx, orgId)]);
  return org!;
}

/** `%` and `_` in a search are literal characters, not patterns. */
function likeEscape(text: string): string {
  return text.replace(/[\\%_]/g, (c) => `\\${c}`);
}

async function listOrgs(ctx: AdminCtx) {
  const filters: SQL[] = [];
  if (!ctx.caller.canReadAll) {
    const own = ctx.caller.adminOrgs();
    if (own.length === 0) throw forbidden("Only a proxy admin (or an organization admin) may list organizations.");
    filters.push(inArray(organizations.organizationId, own));
  }
  const orgId = ctx.query("org_id");
  const alias = ctx.query("org_alias");
  if (orgId) filters.push(eq(organizations.organizationId, orgId));
  if (alias) filters.push(ilike(organizations.organizationAlias, `%${likeEscape(alias)}%`));
  const rows = await ctx.db
    .select()
    .from(organizations)
    .where(filters.length ? and(...filters) : undefined)
    .orderBy(organizations.createdAt, organizations.organizationId);
  return expandOrgs(ctx, rows);
}

/** The user a member entry names: by id (created when missing) or by e-mail (created when unknown). */
interface MemberUser {
  user: UserRow | undefined;
  isNew: boolean;
  userId: string;
  /** The address the entry names, if any (the new user's). */
  email?: string;
  /** The id the entry names, if any (the new user's; else a new one). */
  namedId?: string;
}

async function resolveMemberUser(ctx: AdminCtx, m: { user_id?: string; user_email?: string }, create: boolean): Promise<MemberUser> {
  if (!m.user_id && !m.user_email) throw badRequest("A member needs user_id or user_email.", "member");
  // By address, as everywhere: whatever its case.
  const [user] = m.user_id ? await ctx.db.select().from(users).where(eq(users.userId, m.user_id)) : [await findUserByEmail(ctx.db, m.user_email!)];
  if (user) return { user, isNew: false, userId: user.userId, email: m.user_email, namedId: m.user_id };
  if (!create) throw notFound(`User '${m.user_id ?? m.user_email}' not found.`, m.user_id ? "user_id" : "user_email");
  if (m.user_id && m.user_email) {
    const owner = await findUserByEmail(ctx.db, m.user_email);
    if (owner) throw addressTaken(m.user_email, owner.userId, m.user_id);
  }
  return { user: undefined, isNew: true, userId: m.user_id ?? randomUUID(), email: m.user_email, namedId: m.user_id };
}

async function addMembers(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const body = await ctx.body(MemberAddBody);
  refuseOrgMemberBudget(body);
  const orgId = body.organization_id;
  await loadOrg(ctx, orgId);
  const list: MemberInput[] = Array.isArray(body.member) ? body.member : [body.member];
  const resolved: (MemberUser & { role: MemberInput["role"] })[] = [];
  for (const m of list) {
    const r = await resolveMemberUser(ctx, m, true);
    refuseMasterUserId(r.userId, "member");
    if (resolved.some((x) => x.userId === r.userId)) throw badRequest(`User '${r.userId}' is listed twice.`, "member");
    resolved.push({ ...r, role: m.role });
  }
  const already = await ctx.db
    .select({ userId: orgMembers.userId })
    .from(orgMembers)
    .where(and(eq(orgMembers.organizationId, orgId), inArray(orgMembers.userId, resolved.map((r) => r.userId))));
  if (already.length > 0) throw badRequest(`Already a member of organization '${orgId}': ${already.map((a) => a.userId).join(", ")}; use /organization/member_update.`, "member");
  const who = ctx.caller.changedBy;
  const { newUsers, memberships } = await ctx.db
    .transaction(async (tx) => {
      const newUsers: UserRow[] = [];
      const memberships: OrgMemberRow[] = [];
      // The organization and the members' users held until the memberships are stored (holds.ts):
      // a concurrent /organization/delete (which ends its memberships) or /user/delete either sees
      // them or came first; then this is the 404 of an organization that does not exist, or the user
      // is created again, as for a member who does not exist.
      if (!(await holdOrg(tx, orgId))) throw notFound(`Organization '${orgId}' not found.`, "organization_id");
      // Every address's lock first (a member found now may be deleted meanwhile and created again
      // under its address below), then the users by id: the order every write takes them in.
      await holdWrite(tx, ctx.caller, { userIds: resolved.filter((r) => !r.isNew).map((r) => r.userId), emails: resolved.map((r) => r.email) });
      for (const r of resolved) {
        if (!r.isNew && !(await holdExistingUser(tx, r.userId))) Object.assign(r, { user: undefined, isNew: true, userId: r.namedId ?? randomUUID() });
        if (r.isNew && r.email) {
          // Calls admitting one new address at the same moment take turns: the later one finds the
          // first one's user instead of creating a second user with that address.
          await lockEmail(tx, r.email);
          const created = await findUserByEmail(tx, r.email);
          // The address's owner is this member only when the entry named no other id.
          if (created && r.namedId && created.userId !== r.namedId) throw addressTaken(r.email, created.userId, r.namedId);
          if (created) {
            refuseMasterUserId(created.userId, "member");
            Object.assign(r, { user: created, isNew: false, userId: created.userId });
          }
        }
        if (r.isNew) {
          const userRole = r.role === "internal_user_viewer" ? "internal_user_viewer" : "internal_user";
          const [u] = await tx
            .insert(users)
            .values({ userId: r.userId, userEmail: r.email, userRole, organizationId: orgId, createdBy: who, updatedBy: who })
            .onConflictDoNothing()
            .returning();
          if (u) newUsers.push(u);
          else {
            // Not inserted: a concurrent call (admitting the same member elsewhere) created the user meanwhile; hold that one, as a team's admission does.
            const other = await holdExistingUser(tx, r.userId);
            if (!other) throw badRequest(`User '${r.userId}'${r.email ? ` or its address ${r.email}` : ""} was taken by another request at the same moment; nothing was changed.`, "member");
            Object.assign(r, { user: other, isNew: false });
          }
        }
        const [row] = await tx
          .insert(orgMembers)
          .values({ organizationId: orgId, userId: r.userId, userRole: r.role })
          .returning();
        memberships.push(row!);
      }
      return { newUsers, memberships };
    })
    .catch((err: unknown) => {
      // Another request added the same member, or created the same user, at the same moment (the checks above found nothing yet).
      if (isUniqueViolation(err)) {
        throw badRequest(`A member in this request was added to organization '${orgId}', or its user created, by another request at the same moment; nothing was changed.`, "member");
      }
      throw err;
    });
  for (const u of newUsers) await ctx.changed({ kind: "user", userId: u.userId });
  await ctx.changed({ kind: "org_members", orgId });
  for (const u of newUsers) await auditCreatedUser(ctx, u);
  for (const m of memberships) await ctx.audit({ action: "created", table: "org_members", objectId: `${orgId}:${m.userId}`, after: m });
  const updatedUsers = [...newUsers, ...resolved.flatMap((r) => (r.user ? [r.user] : []))];
  return {
    organization_id: orgId,
    updated_users: updatedUsers.map((u) => toApi(u)),
    updated_organization_memberships: memberships.map((m) => toApi(m)),
  };
}

/**
 * `max_budget_in_organization` is a 400 (null, clearing it, is taken): no call is counted against a
 * member's budget in an organization (the spend writer keeps no spend per org membership, and no
 * budget check reads it), so the value was stored, shown back, and never refused a call: a member
 * with a budget of 0 kept calling.
 */
function refuseOrgMemberBudget(body: { max_budget_in_organization?: unknown }): void {
  if (body.max_budget_in_organization == null) return;
  throw badRequest(
    "max_budget_in_organization is not enforced: no call is counted against a member's budget in an organization. Set max_budget on the member's keys or user, or on the organization (or its teams).",
    "max_budget_in_organization",
  );
}

async function membership(ctx: AdminCtx, orgId: string, userId: string): Promise<OrgMemberRow> {
  const [row] = await ctx.db
    .select()
    .from(orgMembers)
    .where(and(eq(orgMembers.organizationId, orgId), eq(orgMembers.userId, userId)));
  if (!row) throw notFound(`User '${userId}' is not a member of organization '${orgId}'.`, "user_id");
  return row;
}

async function updateMember(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const body = await ctx.body(MemberUpdateBody);
  refuseOrgMemberBudget(body);
  const orgId = body.organization_id;
  await loadOrg(ctx, orgId);
  const { userId } = await resolveMemberUser(ctx, body, false);
  const before = await membership(ctx, orgId, userId);
  const patch: Partial<OrgMemberRow> = { updatedAt: new Date() };
  if (body.role !== undefined) patch.userRole = body.role;
  // Only null gets here: it clears a value stored before the field was refused.
  if (body.max_budget_in_organization === null) patch.maxBudgetInOrganization = null;
  const [after] = await ctx.db
    .update(orgMembers)
    .set(patch)
    .where(and(eq(orgMembers.organizationId, orgId), eq(orgMembers.userId, userId)))
    .returning();
  // Removed by a concurrent /organization/member_delete since it was read: the answer that call's coming first gives.
  if (!after) throw notFound(`User '${userId}' is not a member of organization '${orgId}'.`, "user_id");
  await ctx.changed({ kind: "org_members", orgId });
  await ctx.audit({ action: "updated", table: "org_members", objectId: `${orgId}:${userId}`, before, after });
  return toApi(after);
}

async function deleteMember(ctx: AdminCtx) {
  ctx.caller.requireAdmin();
  const body = await ctx.body(MemberDeleteBody);
  const orgId = body.organization_id;
  await loadOrg(ctx, orgId);
  const { userId } = await resolveMemberUser(ctx, body, false);
  const before = await membership(ctx, orgId, userId);
  const detached = await ctx.db.transaction(async (tx) => {
    const removed = await tx
      .delete(orgMembers)
      .where(and(eq(orgMembers.organizationId, orgId), eq(orgMembers.userId, userId)))
      .returning({ userId: orgMembers.userId });
    // Removed by a concurrent call since it was read: the answer that call's coming first gives.
    if (removed.length === 0) throw notFound(`User '${userId}' is not a member of organization '${orgId}'.`, "user_id");
    // The user no longer belongs to the org it names (as /organization/delete detaches its users); another org it names stays.
    const left = await tx
      .update(users)
      .set({ organizationId: null, updatedAt: new Date(), updatedBy: ctx.caller.changedBy })
      .where(and(eq(users.userId, userId), eq(users.organizationId, orgId)))
      .returning({ userId: users.userId });
    return left.length > 0;
  });
  await ctx.changed({ kind: "org_members", orgId });
  if (detached) await ctx.changed({ kind: "user", userId });
  await ctx.audit({ action: "deleted", table: "org_members", objectId: `${orgId}:${userId}`, before });
  return { organization_id: orgId, user_id: userId, deleted: toApi(before) };
}

export function organizationRoutes(deps: AdminDeps) {
  const route = <R>(h: (ctx: AdminCtx) => Promise<R>) => adminRoute(deps, h);
  const noParse = { parse: "none" } as const;
  return new Elysia()
    .post("/organization/new", route(createOrg), noParse)
    .patch("/organization/update", route(updateOrg), noParse)
    .delete("/organization/delete", route(deleteOrgs), noParse)
    .get(
      "/organization/info",
      route(async (ctx) => {
        const orgId = ctx.query("organization_id");
        if (!orgId) throw GatewayError.of(422, "Invalid request: organization_id: query parameter is required", "validation_error", "organization_id");
        return orgInfo(ctx, orgId);
      }),
    )
    .post(
      "/organization/info",
      route(async (ctx) => orgInfo(ctx, (await ctx.body(InfoBody)).organization_id)),
      noParse,
    )
    .get("/organization/list", route(listOrgs))
    .post("/organization/member_add", route(addMembers), noParse)
    .patch("/organization/member_update", route(updateMember), noParse)
    .delete("/organization/member_delete", route(deleteMember), noParse);
}
