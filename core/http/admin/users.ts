/**
 * Users: `/user/new`, `/user/info`, `/user/update`, `/user/delete`, `/user/list`.
 *
 * Only proxy admins create and delete users and set roles or limits (LiteLLM let an internal user
 * create a `proxy_admin`, PR #19116); anyone else may read and rename only their own user.
 */
import { randomUUID } from "node:crypto";
import { Type as T } from "@sinclair/typebox";
import { and, asc, count, desc, eq, ilike, inArray, isNull, type SQL } from "drizzle-orm";
import { Elysia } from "elysia";
import { badRequest, forbidden, notFound } from "../../authz.ts";
import { GatewayError } from "../../errors.ts";
import { Amount, clearNulls, containing, IdList, LIMIT_COLUMNS, LimitFields, MoneyField, Nullable, refuseModelMaxBudget, resetAt } from "../../identity/fields.ts";
import { withoutUnchangedDuration } from "../../identity/budget-period.ts";
import { holdReferences, holdTeams, lockEmail, orgGone, teamsGone } from "../../identity/holds.ts";
import { type Exec, findUserByEmail, memberBudgetIn, membersByTeam, membershipApi, newMembership, teamApi, teamIdsOf, userApi } from "../../identity/members.ts";
import { refuseMasterUserId } from "../../identity/master-user.ts";
import { choice, list, pageOf, paged } from "../../identity/paging.ts";
import type { UserRow } from "../../identity/records.ts";
import { fromApi, toApi } from "../../identity/serialize.ts";
import { organizations, orgMembers, teamMembers, teams, users, virtualKeys } from "../../store/schema.ts";
import { isUniqueViolation } from "../../store/sql.ts";
import { handSetSpend } from "../../spend/flush.ts";
import { counterId } from "../../spend/ledger.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";
import { refuseOverbooking } from "./reservations.ts";
import { generateKey } from "./keys.ts";

const USER_ROLES = ["proxy_admin", "proxy_admin_viewer", "internal_user", "internal_user_viewer"] as const;
const UserRole = T.Union(USER_ROLES.map((r) => T.Literal(r)));
const TeamRole = T.Union([T.Literal("admin"), T.Literal("user")]);

const UserFields = {
  user_email: T.Optional(Nullable(T.String())),
  user_alias: T.Optional(Nullable(T.String())),
  user_role: T.Optional(UserRole),
  organization_id: T.Optional(Nullable(T.String())),
  spend: T.Optional(Amount),
  ...LimitFields,
};

const TeamEntry = T.Union([
  T.String({ minLength: 1 }),
  T.Object({ team_id: T.String({ minLength: 1 }), user_role: T.Optional(TeamRole), role: T.Optional(TeamRole), max_budget_in_team: T.Optional(MoneyField) }),
]);

const NewUserBody = T.Object({
  user_id: T.Optional(T.String({ minLength: 1 })),
  ...UserFields,
  teams: T.Optional(Nullable(IdList(TeamEntry))),
  auto_create_key: T.Optional(T.Boolean()),
  // Fields of the key created with the user.
  key_alias: T.Optional(Nullable(T.String())),
  duration: T.Optional(Nullable(T.String())),
  team_id: T.Optional(Nullable(T.String())),
});

const UpdateUserBody = T.Object({ user_id: T.Optional(T.String({ minLength: 1 })), ...UserFields });
const DeleteUsersBody = T.Object({ user_ids: IdList(T.String({ minLength: 1 }), 1) });

/** Columns `/user/new` and `/user/update` write from a body. */
const USER_COLUMNS = new Set([
  "user_email",
  "user_alias",
  "user_role",
  "organization_id",
  ...LIMIT_COLUMNS,
  "metadata",
  "models",
]);
/** What a user may change on itself; everything else (role, limits, models, spend) needs a proxy admin. */
const SELF_COLUMNS = new Set(["user_email", "user_alias"]);
/** Null on these clears to empty rather than to null (the columns hold no null). */
const EMPTY = { models: [], metadata: {} };

const USER_SORT = { user_id: users.userId, user_email: users.userEmail, created_at: users.createdAt, spend: users.spend } as const;

/** `nameOwner`: say who has the address (to proxy admins; anyone else would learn other tenants' user ids by their addresses). */
async function requireUniqueEmail(db: Exec, email: string | null | undefined, nameOwner: boolean, exceptUserId?: string): Promise<void> {
  if (!email) return;
  const other = await findUserByEmail(db, email);
  if (other && other.userId !== exceptUserId) throw badRequest(`A user with user_email ${email} already exists${nameOwner ? ` (user_id ${other.userId})` : ""}.`, "user_email");
}

async function requireOrg(db: Exec, orgId: string | null | undefined): Promise<void> {
  if (!orgId) return;
  const [org] = await db.select({ id: organizations.organizationId }).from(organizations).where(eq(organizations.organizationId, orgId));
  if (!org) throw orgGone(orgId);
}

type TeamEntryValue = (typeof TeamEntry)["static"];

function normalizeTeams(entries: readonly TeamEntryValue[] | null | undefined): { teamId: string; role: "admin" | "user"; maxBudgetInTeam: string | null }[] {
  const out = new Map<string, { teamId: string; role: "admin" | "user"; maxBudgetInTeam: string | null }>();
  for (const e of entries ?? []) {
    if (typeof e === "string") out.set(e, { teamId: e, role: "user", maxBudgetInTeam: null });
    else {
      out.set(e.team_id, { teamId: e.team_id, role: e.user_role ?? e.role ?? "user", maxBudgetInTeam: memberBudgetIn(e) ?? null });
    }
  }
  return [...out.values()];
}

async function newUser(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireAdmin();
  const body = await ctx.body(NewUserBody);
  refuseModelMaxBudget(body, "user");
  const raw = body as Record<string, unknown>;
  refuseMasterUserId(body.user_id, "user_id");
  const userId = body.user_id ?? randomUUID();
  const memberships = normalizeTeams(body.teams);
  // The user's key goes to team_id: the user joins that team too, as LiteLLM does.
  if (body.team_id && !memberships.some((m) => m.teamId === body.team_id)) memberships.push({ teamId: body.team_id, role: "user", maxBudgetInTeam: null });
  const by = ctx.caller.changedBy;

  const [existing] = await ctx.db.select({ id: users.userId }).from(users).where(eq(users.userId, userId));
  if (existing) throw badRequest(`User ${userId} already exists.`, "user_id");
  await requireUniqueEmail(ctx.db, body.user_email, true);
  await requireOrg(ctx.db, body.organization_id);
  const budgetResetAt = resetAt(body.budget_duration);
  // A team that does not exist is one 400 whether found here or, deleted meanwhile, in the write's
  // transaction (holdTeams): its param is the field that named it.
  const namedBy = (teamId: string) => (normalizeTeams(body.teams).some((m) => m.teamId === teamId) ? "teams" : "team_id");
  if (memberships.length > 0) {
    const ids = memberships.map((m) => m.teamId);
    const found = await ctx.db
      .select({ id: teams.teamId })
      .from(teams)
      .where(and(inArray(teams.teamId, ids), isNull(teams.deletedAt)));
    const missing = ids.filter((id) => !found.some((f) => f.id === id));
    if (missing.length > 0) throw teamsGone(missing, namedBy);
  }

  const row = {
    ...clearNulls(fromApi(users, raw, USER_COLUMNS), EMPTY),
    userId,
    budgetResetAt: budgetResetAt ?? null,
    createdBy: by,
    updatedBy: by,
  } as typeof users.$inferInsert;
  const { user, memberRows } = await ctx.db
    .transaction(async (tx) => {
      // Its organization and teams held until the user is stored (holds.ts): a concurrent
      // /organization/delete or /team/delete either sees the user (detaches it, ends its
      // memberships) or comes first, and this is the 400 for an organization or team that does not exist.
      const held = await holdTeams(tx, memberships.map((m) => m.teamId), namedBy);
      await holdReferences(tx, { organizationId: body.organization_id });
      // Checked again under the address's lock: a concurrent request may have taken it since. Taken
      // after the teams, as /team/member_add takes a member's address after its team's row.
      if (body.user_email) {
        await lockEmail(tx, body.user_email);
        await requireUniqueEmail(tx, body.user_email, true);
      }
      const [created] = await tx.insert(users).values(row).returning();
      const admitted = memberships.map((m) => newMembership(held.find((t) => t.teamId === m.teamId)!, userId, m.role, m.maxBudgetInTeam));
      const memberRows = admitted.length > 0 ? await tx.insert(teamMembers).values(admitted).returning() : [];
      return { user: created!, memberRows };
    })
    .catch((err) => {
      // Another request created the same user at the same moment (the check above found nothing yet).
      if (isUniqueViolation(err)) throw badRequest(`User ${userId} already exists.`, "user_id");
      throw err;
    });
  await ctx.changed({ kind: "user", userId }, ...memberships.map((m) => ({ kind: "team_members" as const, teamId: m.teamId })));

  let keyFields: Record<string, unknown> = { key: null, token: null, key_name: null, expires: null };
  if (body.auto_create_key !== false) {
    const keyBody: Record<string, unknown> = { user_id: userId };
    for (const f of ["key_alias", "duration", "team_id"] as const) if (body[f] !== undefined) keyBody[f] = body[f];
    try {
      keyFields = await generateKey(ctx, keyBody);
    } catch (err) {
      // No half-created user: without its key the call failed as a whole.
      await ctx.db.transaction(async (tx) => {
        await tx.delete(teamMembers).where(eq(teamMembers.userId, userId));
        await tx.delete(users).where(eq(users.userId, userId));
      });
      await ctx.changed({ kind: "user", userId }, ...memberships.map((m) => ({ kind: "team_members" as const, teamId: m.teamId })));
      throw err;
    }
  }
  const out = userApi(user, memberships.map((m) => m.teamId));
  await ctx.audit({ action: "created", table: "users", objectId: userId, after: { ...out, team_memberships: memberRows.map(membershipApi) } });
  return { ...keyFields, ...out };
}

/** The user a non-admin may see or touch: only its own. Checked before existence, so nothing leaks. */
function requireSelfOrReadAll(ctx: AdminCtx, userId: string): void {
  if (ctx.caller.canReadAll || ctx.caller.userId === userId) return;
  throw forbidden("You may only view your own user. Viewing other users needs a proxy admin (or admin viewer) key.");
}

/**
 * `/user/info` of the master key without `user_id`, as LiteLLM answers a proxy admin (its reference:
 * "all info", deprecated there): no user, every live key and team. The master key's identity,
 * default_user_id, names no user, so its own user was a 404 about a user no one created.
 */
async function everyKeyAndTeam(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const [keys, teamRows, members] = await Promise.all([
    ctx.db.select().from(virtualKeys).where(isNull(virtualKeys.deletedAt)).orderBy(virtualKeys.createdAt),
    ctx.db.select().from(teams).where(isNull(teams.deletedAt)).orderBy(teams.createdAt),
    membersByTeam(ctx.db, "all"),
  ]);
  return { user_id: null, user_info: null, keys: keys.map((k) => toApi(k)), teams: teamRows.map((t) => teamApi(t, members.get(t.teamId) ?? [])) };
}

async function userInfo(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const asked = ctx.query("user_id");
  if (asked === "") throw GatewayError.of(422, "Invalid request: user_id is empty: name a user, or leave user_id out to read your own.", "validation_error", "user_id");
  if (asked === undefined && ctx.caller.isMaster) return everyKeyAndTeam(ctx);
  const userId = asked ?? ctx.caller.userId;
  if (!userId) throw badRequest("user_id is required: this key has no user of its own.", "user_id");
  requireSelfOrReadAll(ctx, userId);
  const [user] = await ctx.db.select().from(users).where(eq(users.userId, userId));
  if (!user) throw notFound(`User ${userId} not found.`, "user_id");
  // A key issued in a team sees its user as that team does: its keys and membership there only.
  const scope = ctx.caller.canReadAll ? undefined : ctx.caller.teamScope;
  const keys = await ctx.db
    .select()
    .from(virtualKeys)
    .where(and(eq(virtualKeys.userId, userId), isNull(virtualKeys.deletedAt), scope === undefined ? undefined : eq(virtualKeys.teamId, scope)))
    .orderBy(virtualKeys.createdAt);
  const teamIds = ((await teamIdsOf(ctx.db, [userId])).get(userId) ?? []).filter((t) => scope === undefined || t === scope);
  const teamRows = teamIds.length
    ? await ctx.db
        .select()
        .from(teams)
        .where(and(inArray(teams.teamId, teamIds), isNull(teams.deletedAt)))
    : [];
  const members = await membersByTeam(
    ctx.db,
    teamRows.map((t) => t.teamId),
  );
  return {
    user_id: userId,
    user_info: userApi(user, teamIds),
    keys: keys.map((k) => toApi(k)),
    teams: teamRows.map((t) => teamApi(t, members.get(t.teamId) ?? [], ctx.caller.maySeeCallbacks(t.teamId))),
  };
}

async function updateUser(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireWriter();
  const body = await ctx.body(UpdateUserBody);
  const raw = body as Record<string, unknown>;
  const caller = ctx.caller;
  if (!caller.isAdmin && caller.teamScope !== undefined) {
    throw forbidden(`This key was issued in team ${caller.teamScope}: it acts for its user in that team only, and may not change the user. Use a personal key.`);
  }
  let target: UserRow | undefined;
  // Without user_id, user_email names the user; with it, user_email is a new address.
  const byEmail = !body.user_id;
  if (byEmail) {
    if (!body.user_email) throw badRequest("Name the user with user_id or user_email.", "user_id");
    target = await findUserByEmail(ctx.db, body.user_email);
    if (!caller.isAdmin && target?.userId !== caller.userId) throw forbidden("You may only update your own user.");
  } else {
    if (!caller.isAdmin && body.user_id !== caller.userId) throw forbidden("You may only update your own user.");
    [target] = await ctx.db.select().from(users).where(eq(users.userId, body.user_id!));
  }
  if (!target) throw notFound(`User ${body.user_id ?? body.user_email} not found.`, "user_id");

  const fields = new Set(USER_COLUMNS);
  if (byEmail) fields.delete("user_email");
  const props = clearNulls(fromApi(users, raw, fields), EMPTY);
  if (!caller.isAdmin) {
    const privileged = Object.keys(raw).filter((f) => fields.has(f) && !SELF_COLUMNS.has(f));
    if (privileged.length > 0) throw forbidden(`Only a proxy admin may change ${privileged.join(", ")}.`);
  }
  refuseModelMaxBudget(body, "user");
  if (!byEmail && "user_email" in raw) await requireUniqueEmail(ctx.db, body.user_email, caller.isAdmin, target.userId);
  if ("organization_id" in raw) await requireOrg(ctx.db, body.organization_id);
  const reset = resetAt(withoutUnchangedDuration(body, target.budgetDuration).budget_duration);
  if (reset !== undefined) props.budgetResetAt = reset;

  if ("models" in props) {
    const users = new Map(ctx.identity.users).set(target.userId, { ...target, models: props.models as string[] });
    refuseOverbooking(ctx, { affected: (k) => k.userId === target.userId, owners: { users } }, "models");
  }
  const newEmail = !byEmail && body.user_email ? body.user_email : undefined;
  if ("spend" in props) await ctx.flushSpend();
  const [updated] = await ctx.db.transaction(async (tx) => {
    // The organization it is put in, held until the write ends (holds.ts), as /user/new holds it:
    // before the address, the order every write takes them in (holds.ts holdWrite).
    await holdReferences(tx, { organizationId: props.organizationId });
    // Checked again under the address's lock, as /user/new does: calls giving one address to
    // different users at the same moment would each have found it free above.
    if (newEmail) {
      await lockEmail(tx, newEmail);
      await requireUniqueEmail(tx, newEmail, caller.isAdmin, target.userId);
    }
    return tx
      .update(users)
      .set({ ...props, ...handSetSpend(props), updatedAt: new Date(), updatedBy: caller.changedBy })
      .where(eq(users.userId, target.userId))
      .returning();
  });
  // Deleted by a concurrent /user/delete since it was read: the answer that call's coming first gives.
  if (!updated) throw notFound(`User ${target.userId} not found.`, "user_id");
  await ctx.changed({ kind: "user", userId: target.userId });
  if ("spend" in props) await ctx.forgetBudgets([counterId("user", target.userId)]);
  const teamIds = (await teamIdsOf(ctx.db, [target.userId])).get(target.userId) ?? [];
  const out = userApi(updated, teamIds);
  await ctx.audit({ action: "updated", table: "users", objectId: target.userId, before: userApi(target, teamIds), after: out });
  return { user_id: target.userId, data: out };
}

async function deleteUsers(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireAdmin();
  const { user_ids } = await ctx.body(DeleteUsersBody);
  const ids = [...new Set(user_ids)];
  const found = await ctx.db.select().from(users).where(inArray(users.userId, ids));
  const missing = ids.filter((id) => !found.some((u) => u.userId === id));
  if (missing.length > 0) throw notFound(`User(s) ${missing.join(", ")} not found; nothing was deleted.`, "user_ids");
  const teamIds = await teamIdsOf(ctx.db, ids);
  const now = new Date();
  const by = ctx.caller.changedBy;
  const { keys, teamsTouched, orgsTouched } = await ctx.db.transaction(async (tx) => {
    // The users first (in one order, so two deletions cannot deadlock): a key write naming one of
    // them (/key/generate, /key/update, /key/regenerate) holds its user until the key is stored
    // (holds.ts), so its key is either stored now, and deleted below, or after this deletion,
    // with the user created again.
    await tx.select({ id: users.userId }).from(users).where(inArray(users.userId, ids)).orderBy(users.userId).for("update");
    // Then their memberships, then their keys: the order every write takes them in (holds.ts holdWrite).
    const tm = await tx.delete(teamMembers).where(inArray(teamMembers.userId, ids)).returning({ teamId: teamMembers.teamId });
    const om = await tx.delete(orgMembers).where(inArray(orgMembers.userId, ids)).returning({ orgId: orgMembers.organizationId });
    const keys = await tx
      .update(virtualKeys)
      .set({ deletedAt: now, deletedBy: by, updatedAt: now, updatedBy: by })
      .where(and(inArray(virtualKeys.userId, ids), isNull(virtualKeys.deletedAt)))
      .returning();
    const deleted = await tx.delete(users).where(inArray(users.userId, ids)).returning({ id: users.userId });
    // Another call deleted one of them since it was read: answered as if it had come first.
    if (deleted.length < ids.length) throw notFound(`User(s) ${ids.filter((id) => !deleted.some((d) => d.id === id)).join(", ")} not found: deleted meanwhile; nothing was deleted.`, "user_ids");
    return { keys, teamsTouched: new Set(tm.map((r) => r.teamId)), orgsTouched: new Set(om.map((r) => r.orgId)) };
  });
  await ctx.changed(
    ...keys.map((k) => ({ kind: "key" as const, token: k.token })),
    ...ids.map((userId) => ({ kind: "user" as const, userId })),
    ...[...teamsTouched].map((teamId) => ({ kind: "team_members" as const, teamId })),
    ...[...orgsTouched].map((orgId) => ({ kind: "org_members" as const, orgId })),
  );
  for (const k of keys) await ctx.audit({ action: "deleted", table: "virtual_keys", objectId: k.token, before: toApi({ ...k, deletedAt: null, deletedBy: null }) });
  for (const u of found) await ctx.audit({ action: "deleted", table: "users", objectId: u.userId, before: userApi(u, teamIds.get(u.userId) ?? []) });
  return { deleted_users: ids, deleted_keys: keys.map((k) => k.token) };
}

async function listUsers(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireReadAll();
  const p = pageOf(ctx.query, 25, 100);
  const sortBy = choice(ctx.query, "sort_by", Object.keys(USER_SORT) as (keyof typeof USER_SORT)[], "created_at");
  const order = choice(ctx.query, "sort_order", ["asc", "desc"] as const, "asc");
  const filters: SQL[] = [];
  const ids = list(ctx.query, "user_ids");
  if (ids?.length) filters.push(inArray(users.userId, ids));
  const role = ctx.query("role") ?? ctx.query("user_role");
  if (role) filters.push(eq(users.userRole, role));
  const email = ctx.query("user_email");
  if (email) filters.push(ilike(users.userEmail, containing(email)));
  const team = ctx.query("team") ?? ctx.query("team_id");
  if (team) filters.push(inArray(users.userId, ctx.db.select({ id: teamMembers.userId }).from(teamMembers).where(eq(teamMembers.teamId, team))));
  const where = filters.length ? and(...filters) : undefined;
  const dir = order === "desc" ? desc : asc;
  const [rows, [total]] = await Promise.all([
    ctx.db
      .select()
      .from(users)
      .where(where)
      .orderBy(dir(USER_SORT[sortBy]), asc(users.userId))
      .limit(p.pageSize)
      .offset(p.offset),
    ctx.db.select({ n: count() }).from(users).where(where),
  ]);
  const teamIds = await teamIdsOf(
    ctx.db,
    rows.map((u) => u.userId),
  );
  const { items, ...rest } = paged(
    rows.map((u) => userApi(u, teamIds.get(u.userId) ?? [])),
    Number(total?.n ?? 0),
    p,
  );
  return { users: items, ...rest };
}

export function userRoutes(deps: AdminDeps) {
  return new Elysia()
    .post("/user/new", adminRoute(deps, newUser))
    .get("/user/info", adminRoute(deps, userInfo))
    .post("/user/update", adminRoute(deps, updateUser))
    .post("/user/delete", adminRoute(deps, deleteUsers))
    .get("/user/list", adminRoute(deps, listUsers));
}
