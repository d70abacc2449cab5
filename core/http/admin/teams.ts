/**
 * Teams and their members: create, update, delete (soft), info, the lists, block/unblock, member
 * add/delete/update (single and bulk), member permissions, and the team's models.
 *
 * Authorization follows the spec's levels. `Global Admin Only` routes need a proxy admin (reads:
 * or an admin viewer). `Team Admin Allowed` routes also take a Team Management Key (a key whose
 * user is an `admin` member) for its own team; for any other team, existing or not, the answer is
 * the same 403, so a team admin learns nothing about teams it does not run.
 */
import { randomUUID } from "node:crypto";
import { Type as T } from "@sinclair/typebox";
import { and, asc, count, desc, eq, ilike, inArray, isNotNull, isNull, notInArray, type SQL } from "drizzle-orm";
import { Elysia } from "elysia";
import { badRequest, type Caller, DEFAULT_TEAM_MEMBER_PERMISSIONS, forbidden, missingQuery, notFound, TEAM_MEMBER_PERMISSION_CHOICES } from "../../authz.ts";
import { GatewayError } from "../../errors.ts";
import { RouterSettingsSchema } from "../../config/schema.ts";
import { DURATION_HINT, parseDuration } from "../../identity/duration.ts";
import { Amount, clearNulls, CountField, containing, IdList, LIMIT_COLUMNS, LimitFields, MemberSettingFields, MoneyField, Nullable, refuseModelMaxBudget, resetAt } from "../../identity/fields.ts";
import {
  ensureUser,
  type Exec,
  findUser,
  MEMBER_SETTING_FIELDS,
  type MemberRef,
  membersByTeam,
  membership,
  memberBudgetIn,
  membershipApi,
  memberUserApi,
  newMembership,
  teamApi,
  teamIdsOf,
  userApi,
} from "../../identity/members.ts";
import { budgetGone, holdReferences, holdWrite, orgGone, type WriteHolds } from "../../identity/holds.ts";
import { teamOutsideOrg } from "../../identity/org-rules.ts";
import { choice, pageOf, paged } from "../../identity/paging.ts";
import type { IdentityChange, KeyRow, TeamMemberRow, TeamRow, UserRow } from "../../identity/records.ts";
import { exactAmount, fromApi, scaleOf, toApi } from "../../identity/serialize.ts";
import { budgets, organizations, teamMembers, teams, users, virtualKeys } from "../../store/schema.ts";
import { isUniqueViolation } from "../../store/sql.ts";
import { handSetSpend } from "../../spend/flush.ts";
import { counterId } from "../../spend/ledger.ts";
import { groupLabels } from "./access-groups.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";
import { refuseOverbooking } from "./reservations.ts";
import { auditCreatedUser } from "./user-audit.ts";
import { followedReset, periodFromBudget, withoutUnchangedDuration } from "../../identity/budget-period.ts";

const TeamRole = T.Union([T.Literal("admin"), T.Literal("user")]);
type Role = "admin" | "user";

const Member = T.Object({
  role: T.Optional(TeamRole),
  user_id: T.Optional(Nullable(T.String({ minLength: 1 }))),
  user_email: T.Optional(Nullable(T.String({ minLength: 1 }))),
});
type MemberValue = (typeof Member)["static"];

const StringList = T.Optional(Nullable(T.Array(T.String())));
const TeamFields = {
  team_alias: T.Optional(Nullable(T.String())),
  organization_id: T.Optional(Nullable(T.String())),
  budget_id: T.Optional(Nullable(T.String())),
  spend: T.Optional(Amount),
  ...LimitFields,
  blocked: T.Optional(T.Boolean()),
  model_aliases: T.Optional(Nullable(T.Record(T.String(), T.Unknown()))),
  tags: StringList,
  guardrails: StringList,
  policies: StringList,
  prompts: StringList,
  access_group_ids: StringList,
  allowed_passthrough_routes: StringList,
  team_member_permissions: StringList,
  object_permission: T.Optional(Nullable(T.Record(T.String(), T.Unknown()))),
  // Checked as the config's are: a bad value was stored, then ignored at every call.
  router_settings: T.Optional(Nullable(RouterSettingsSchema)),
  allowed_vector_store_indexes: T.Optional(Nullable(T.Array(T.Unknown()))),
  member_settings: T.Optional(Nullable(T.Object(MemberSettingFields, { additionalProperties: true }))),
  ...MemberSettingFields,
};

const NewTeamBody = T.Object({
  team_id: T.Optional(T.String({ minLength: 1 })),
  ...TeamFields,
  members_with_roles: T.Optional(Nullable(IdList(Member))),
});
const UpdateTeamBody = T.Object({ team_id: T.String({ minLength: 1 }), ...TeamFields });
const TeamIdBody = T.Object({ team_id: T.String({ minLength: 1 }) });
const TeamIdsBody = T.Object({ team_ids: IdList(T.String({ minLength: 1 }), 1) });
const MemberAddBody = T.Object({
  team_id: T.String({ minLength: 1 }),
  member: T.Optional(T.Union([Member, IdList(Member, 1)])),
  // The team-key form: one member by e-mail (or id) with a role.
  member_email: T.Optional(T.String({ minLength: 1 })),
  user_id: T.Optional(T.String({ minLength: 1 })),
  user_email: T.Optional(T.String({ minLength: 1 })),
  role: T.Optional(TeamRole),
  max_budget_in_team: T.Optional(MoneyField),
});
const MemberRefBody = {
  team_id: T.String({ minLength: 1 }),
  user_id: T.Optional(T.String({ minLength: 1 })),
  user_email: T.Optional(T.String({ minLength: 1 })),
  member_email: T.Optional(T.String({ minLength: 1 })),
};
const MemberDeleteBody = T.Object(MemberRefBody);
const MemberUpdateBody = T.Object({
  ...MemberRefBody,
  role: T.Optional(TeamRole),
  max_budget_in_team: T.Optional(MoneyField),
  tpm_limit: T.Optional(CountField),
  rpm_limit: T.Optional(CountField),
});
const BulkMemberAddBody = T.Object({
  team_id: T.String({ minLength: 1 }),
  members: T.Optional(IdList(Member)),
  all_users: T.Optional(T.Boolean()),
  max_budget_in_team: T.Optional(MoneyField),
});
const PermissionsBody = T.Object({ team_id: T.String({ minLength: 1 }), team_member_permissions: T.Array(T.String()) });
const ModelsBody = T.Object({ team_id: T.String({ minLength: 1 }), models: T.Array(T.String({ minLength: 1 }), { minItems: 1 }) });

/** Columns a body may set on a team. */
const TEAM_COLUMNS = new Set([
  "team_alias",
  "organization_id",
  "budget_id",
  ...LIMIT_COLUMNS,
  "metadata",
  "models",
  "blocked",
  "model_aliases",
  "tags",
  "guardrails",
  "policies",
  "prompts",
  "access_group_ids",
  "allowed_passthrough_routes",
  "team_member_permissions",
  "object_permission",
  "router_settings",
  "allowed_vector_store_indexes",
]);
/** Null on these clears to empty (the columns hold no null). */
const EMPTY = {
  models: [],
  metadata: {},
  tags: [],
  modelAliases: {},
  guardrails: [],
  policies: [],
  prompts: [],
  accessGroupIds: [],
  allowedPassthroughRoutes: [],
  teamMemberPermissions: [],
};

// ---------------------------------------------------------------------------------------------
// Who may act on which team

type Need = "global" | "team_admin" | "read";

/**
 * The live team `teamId` when the caller may act on it at level `need`; otherwise a 403, the same
 * whether the team exists or not. Only callers who may see every team get a 404 for a missing one.
 */
async function teamFor(ctx: AdminCtx, teamId: string, need: Need): Promise<TeamRow> {
  const c = ctx.caller;
  if (need === "global") c.requireAdmin();
  if (need === "team_admin") {
    c.requireWriter();
    if (!c.isTeamAdmin(teamId)) throw forbidden(`Only a proxy admin or an admin of team ${teamId} may call this endpoint.`);
  }
  if (need === "read" && !c.canReadAll && !c.teamRole(teamId)) throw forbidden(`Only a proxy admin or a member of team ${teamId} may view it.`);
  const team = await liveTeam(ctx.db, teamId);
  if (team) return team;
  if (c.canReadAll) throw notFound(`Team ${teamId} not found.`, "team_id");
  throw forbidden(`Team ${teamId} is not one you may act on.`);
}

async function liveTeam(db: Exec, teamId: string): Promise<TeamRow | undefined> {
  const [row] = await db
    .select()
    .from(teams)
    .where(and(eq(teams.teamId, teamId), isNull(teams.deletedAt)));
  return row;
}

/**
 * Runs `write` on the live team's row as it is now, locked until the transaction ends. Routes that
 * merge into a stored value (the member defaults, the models list) must merge into this one: from
 * the row read at the start of the call, they would write back the value a concurrent call
 * replaced meanwhile, and lose its change. `write` uses `tx` only (on the embedded store a
 * statement outside the transaction would wait for it).
 */
async function lockedTeam<T>(ctx: AdminCtx, teamId: string, write: (tx: Exec, current: TeamRow) => Promise<T>, holds?: WriteHolds): Promise<T> {
  return ctx.db.transaction(async (tx) => {
    const [current] = await tx
      .select()
      .from(teams)
      .where(and(eq(teams.teamId, teamId), isNull(teams.deletedAt)))
      .for("update");
    if (!current) throw notFound(`Team ${teamId} not found: it was deleted meanwhile.`, "team_id");
    // A team admin's right to write is the store's, under the team's lock, not the cache's; and
    // the users `holds` names are held before anything is written (holds.ts).
    await holdWrite(tx, ctx.caller, holds);
    return write(tx, current);
  });
}

/** `caller`: a read's, whose view of the team's callbacks depends on its rights (Caller.maySeeCallbacks); writes' callers may see them. */
async function withMembers(db: Exec, team: TeamRow, caller?: Caller): Promise<Record<string, unknown>> {
  return teamApi(team, (await membersByTeam(db, [team.teamId])).get(team.teamId) ?? [], caller?.maySeeCallbacks(team.teamId) ?? true);
}

async function teamsApi(db: Exec, rows: readonly TeamRow[], caller?: Caller): Promise<Record<string, unknown>[]> {
  const members = await membersByTeam(
    db,
    rows.map((t) => t.teamId),
  );
  return rows.map((t) => teamApi(t, members.get(t.teamId) ?? [], caller?.maySeeCallbacks(t.teamId) ?? true));
}

// ---------------------------------------------------------------------------------------------
// Rules on team fields

/** What checkOrgLimits reads of a team: its list, its aliases and its limits. */
type OrgBound = Pick<TeamRow, "organizationId" | "models" | "accessGroupIds" | "modelAliases" | "maxBudget" | "tpmLimit" | "rpmLimit">;

/**
 * A team inside an organization stays inside its limits: its list names only what a call through
 * the org may use (org-rules.ts, the call path's judgement: access groups and aliases included),
 * budget and rates at most the org's.
 */
async function checkOrgLimits(ctx: AdminCtx, team: OrgBound, modelsParam: "models" | "model_aliases" = "models"): Promise<void> {
  // "" is an id like any other (none exists), as on keys: taken for "no org", it was stored as one.
  if (team.organizationId === null) return;
  const [org] = await ctx.db.select().from(organizations).where(eq(organizations.organizationId, team.organizationId));
  if (!org) throw orgGone(team.organizationId);
  const outside = teamOutsideOrg(org, team, ctx.snapshot.accessGroups, ctx.snapshot.groupAliases);
  if (outside.models.length > 0) {
    throw badRequest(`Team models ${JSON.stringify(outside.models)} are not within organization ${org.organizationId}'s models ${JSON.stringify(org.models)}.`, modelsParam);
  }
  if (outside.accessGroupIds.length > 0) {
    throw badRequest(
      `Team access groups ${groupLabels(ctx, outside.accessGroupIds)} hold models outside organization ${org.organizationId}'s models ${JSON.stringify(org.models)}.`,
      "access_group_ids",
    );
  }
  let orgBudget = org.maxBudget;
  let orgTpm = org.tpmLimit;
  let orgRpm = org.rpmLimit;
  if (org.budgetId) {
    const [b] = await ctx.db.select().from(budgets).where(eq(budgets.budgetId, org.budgetId));
    orgBudget ??= b?.maxBudget ?? null;
    orgTpm ??= b?.tpmLimit ?? null;
    orgRpm ??= b?.rpmLimit ?? null;
  }
  if (team.maxBudget !== null && orgBudget !== null && Number(team.maxBudget) > Number(orgBudget)) {
    throw badRequest(`Team max_budget (${Number(team.maxBudget)}) exceeds organization ${org.organizationId}'s max_budget (${Number(orgBudget)}).`, "max_budget");
  }
  if (team.tpmLimit !== null && orgTpm !== null && team.tpmLimit > orgTpm) throw badRequest(`Team tpm_limit (${team.tpmLimit}) exceeds organization's tpm_limit (${orgTpm}).`, "tpm_limit");
  if (team.rpmLimit !== null && orgRpm !== null && team.rpmLimit > orgRpm) throw badRequest(`Team rpm_limit (${team.rpmLimit}) exceeds organization's rpm_limit (${orgRpm}).`, "rpm_limit");
}

/** The team fields that bound what its guaranteed keys reserve: the models they may call (aliases too), and the team's limits. */
const RESERVING_FIELDS = ["models", "access_group_ids", "model_aliases", "rpm_limit", "tpm_limit"] as const;

/** A team write must leave room for what its guaranteed keys reserve, as a key write must (the same 400). */
function checkReservations(ctx: AdminCtx, team: TeamRow, param: string): void {
  refuseOverbooking(ctx, { affected: (k) => k.teamId === team.teamId, owners: { teams: new Map(ctx.identity.teams).set(team.teamId, team) } }, param);
}

function checkPermissions(perms: readonly string[] | null | undefined): void {
  const choices: readonly string[] = TEAM_MEMBER_PERMISSION_CHOICES;
  const bad = (perms ?? []).filter((p) => !choices.includes(p));
  if (bad.length > 0) throw badRequest(`Unknown team member permission(s) ${JSON.stringify(bad)}. Choose from ${JSON.stringify(choices)}.`, "team_member_permissions");
}

async function checkReferences(ctx: AdminCtx, body: { access_group_ids?: string[] | null; budget_id?: string | null }): Promise<void> {
  const unknownGroups = (body.access_group_ids ?? []).filter((id) => !ctx.identity.accessGroups.has(id));
  if (unknownGroups.length > 0) throw badRequest(`Access group(s) ${unknownGroups.join(", ")} do not exist.`, "access_group_ids");
  if (typeof body.budget_id === "string") {
    const [b] = await ctx.db.select({ id: budgets.budgetId }).from(budgets).where(eq(budgets.budgetId, body.budget_id));
    if (!b) throw budgetGone(body.budget_id);
  }
}

/**
 * A member's budget in the team (`team_member_budget`, `max_budget_in_team`) is never reset by a
 * period: the membership's spend has no period (spend/entry.ts charges it with none). LiteLLM
 * resets it every `team_member_budget_duration`; stored and echoed here, the field made the caller
 * believe its members' budgets would start again, while they stayed spent for good. Refused unless
 * cleared.
 */
function refuseMemberBudgetPeriod(body: Record<string, unknown>): void {
  const given = body.member_settings;
  const nested = given && typeof given === "object" ? (given as Record<string, unknown>).team_member_budget_duration : undefined;
  for (const value of [body.team_member_budget_duration, nested]) {
    if (value !== undefined && value !== null) {
      throw badRequest(
        "team_member_budget_duration is not supported: a member's budget in the team (team_member_budget, max_budget_in_team) is never reset by a period. Leave it out (or null); a budget_duration on the members' keys resets their keys' budgets.",
        "team_member_budget_duration",
      );
    }
  }
}

/** Member defaults from the body (top-level `team_member_*` fields win over `member_settings`), merged over `current`. */
function memberSettings(body: Record<string, unknown>, current: Record<string, unknown>): Record<string, unknown> {
  refuseMemberBudgetPeriod(body);
  const out: Record<string, unknown> = { ...current };
  const given = body.member_settings;
  // A new member's max_budget_in_team: as exact as one given to member_add.
  for (const holder of [body, given]) {
    const amount = holder && typeof holder === "object" ? (holder as Record<string, unknown>).team_member_budget : undefined;
    if (typeof amount === "number") exactAmount(holder as object, "team_member_budget", amount, scaleOf(teamMembers.maxBudgetInTeam));
  }
  if (given === null) for (const k of Object.keys(out)) delete out[k];
  else if (given && typeof given === "object") Object.assign(out, given);
  for (const f of MEMBER_SETTING_FIELDS) if (f in body) out[f] = body[f];
  for (const [k, v] of Object.entries(out)) if (v === null || v === undefined) delete out[k];
  for (const f of ["team_member_budget_duration", "team_member_key_duration"] as const) {
    const v = out[f];
    if (v !== undefined && (typeof v !== "string" || parseDuration(v) === undefined)) throw badRequest(`${f} must be ${DURATION_HINT}.`, f);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Admitting members

interface Admitted {
  user: UserRow;
  createdUser: boolean;
  membership: TeamMemberRow;
}

function refOf(m: MemberValue): MemberRef {
  if (!m.user_id && !m.user_email) throw badRequest("Each member needs a user_id or a user_email.", "member");
  return { user_id: m.user_id ?? null, user_email: m.user_email ?? null };
}

function alreadyMember(teamId: string, user: UserRow): GatewayError {
  return GatewayError.of(400, `User ${user.userId}${user.userEmail ? ` (${user.userEmail})` : ""} is already a member of team ${teamId}.`, "team_member_already_in_team", "member");
}

/** What admitting `members` holds (holds.ts holdWrite): their addresses and users, before any is admitted. */
const admitting = (members: readonly MemberValue[]): WriteHolds => ({ userIds: members.map((m) => m.user_id), emails: members.map((m) => m.user_email) });

/** Adds one member (creating its user when missing); an existing member is a 400. */
async function admit(db: Exec, team: TeamRow, m: MemberValue, maxBudgetInTeam: string | null | undefined, by: string): Promise<Admitted> {
  const { user, created } = await ensureUser(db, refOf(m), by);
  if (await membership(db, team.teamId, user.userId)) throw alreadyMember(team.teamId, user);
  const [row] = await db
    .insert(teamMembers)
    .values(newMembership(team, user.userId, (m.role ?? "user") satisfies Role, maxBudgetInTeam))
    .returning();
  return { user, createdUser: created, membership: row! };
}

/**
 * A unique violation while admitting members: another request added the same member, or created
 * the same user, at the same moment (each request's own checks found nothing yet). Nothing of this
 * request was kept.
 */
function concurrentMember(err: unknown): never {
  if (isUniqueViolation(err)) {
    throw GatewayError.of(400, "A member in this request was added, or its user created, by another request at the same moment; nothing was changed. Retry to see where things stand.", "team_member_already_in_team", "member");
  }
  throw err;
}

async function auditAdmitted(ctx: AdminCtx, admitted: readonly Admitted[]): Promise<void> {
  for (const a of admitted) {
    if (a.createdUser) await auditCreatedUser(ctx, a.user, [a.membership.teamId]);
    await ctx.audit({ action: "created", table: "team_members", objectId: `${a.membership.teamId}:${a.user.userId}`, after: membershipApi(a.membership) });
  }
}

function changesFor(teamId: string, admitted: readonly Admitted[]): IdentityChange[] {
  return [{ kind: "team_members", teamId }, ...admitted.filter((a) => a.createdUser).map((a) => ({ kind: "user" as const, userId: a.user.userId }))];
}

/** The member a body names by user_id, user_email or member_email; a 400 when there is no such user. */
async function namedMember(ctx: AdminCtx, body: { user_id?: string; user_email?: string; member_email?: string }): Promise<UserRow> {
  const ref: MemberRef = { user_id: body.user_id ?? null, user_email: body.user_email ?? body.member_email ?? null };
  if (!ref.user_id && !ref.user_email) throw badRequest("Name the member with user_id, user_email or member_email.", "user_id");
  const user = await findUser(ctx.db, ref);
  if (!user) throw badRequest(`User ${ref.user_id ?? ref.user_email} does not exist.`, ref.user_id ? "user_id" : "user_email");
  return user;
}

async function softDeleteKeys(db: Exec, where: SQL, by: string): Promise<KeyRow[]> {
  const now = new Date();
  return db
    .update(virtualKeys)
    .set({ deletedAt: now, deletedBy: by, updatedAt: now, updatedBy: by })
    .where(and(where, isNull(virtualKeys.deletedAt)))
    .returning();
}

async function auditDeletedKeys(ctx: AdminCtx, keys: readonly KeyRow[]): Promise<void> {
  for (const k of keys) await ctx.audit({ action: "deleted", table: "virtual_keys", objectId: k.token, before: toApi({ ...k, deletedAt: null, deletedBy: null }) });
}

// ---------------------------------------------------------------------------------------------
// Routes

async function newTeam(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireAdmin();
  const body = await ctx.body(NewTeamBody);
  refuseModelMaxBudget(body, "team");
  const raw = body as Record<string, unknown>;
  const teamId = body.team_id ?? randomUUID();
  const by = ctx.caller.changedBy;
  const [taken] = await ctx.db.select({ id: teams.teamId }).from(teams).where(eq(teams.teamId, teamId));
  if (taken) throw badRequest(`Team id = ${teamId} already exists. Please use a different team id.`, "team_id");
  checkPermissions(body.team_member_permissions);
  await checkReferences(ctx, body);
  const props = clearNulls(fromApi(teams, raw, TEAM_COLUMNS), EMPTY);
  const row = {
    ...props,
    teamId,
    // A period of its own (`-1`: never resets) is the team's; without one it follows its budget object's.
    budgetResetAt: typeof body.budget_duration === "string" ? resetAt(body.budget_duration) : followedReset(body.budget_id ? ctx.identity.budgets.get(body.budget_id) : undefined),
    memberSettings: memberSettings(raw, {}),
    createdBy: by,
    updatedBy: by,
  } as typeof teams.$inferInsert;
  await checkOrgLimits(ctx, {
    organizationId: row.organizationId ?? null,
    models: row.models ?? [],
    accessGroupIds: row.accessGroupIds ?? [],
    modelAliases: row.modelAliases ?? {},
    maxBudget: row.maxBudget ?? null,
    tpmLimit: row.tpmLimit ?? null,
    rpmLimit: row.rpmLimit ?? null,
  });
  const { team, admitted } = await ctx.db
    .transaction(async (tx) => {
      await holdWrite(tx, ctx.caller, { ...admitting(body.members_with_roles ?? []), refs: { organizationId: row.organizationId, budgetId: row.budgetId } });
      const [team] = await tx.insert(teams).values(row).returning();
      const admitted: Admitted[] = [];
      // A user named twice is a 400 (team_member_already_in_team) and nothing is created.
      for (const m of body.members_with_roles ?? []) admitted.push(await admit(tx, team!, m, undefined, by));
      return { team: team!, admitted };
    })
    .catch(async (err) => {
      // Another request created the same team at the same moment (its check above found nothing yet).
      if (isUniqueViolation(err) && (await ctx.db.select({ id: teams.teamId }).from(teams).where(eq(teams.teamId, teamId))).length > 0) {
        throw badRequest(`Team id = ${teamId} already exists. Please use a different team id.`, "team_id");
      }
      return concurrentMember(err);
    });
  await ctx.changed({ kind: "team", teamId }, ...changesFor(teamId, admitted));
  const out = await withMembers(ctx.db, team);
  await ctx.audit({ action: "created", table: "teams", objectId: teamId, after: out });
  await auditAdmitted(ctx, admitted);
  return out;
}

async function updateTeam(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const sent = await ctx.body(UpdateTeamBody);
  const before = await teamFor(ctx, sent.team_id, "global");
  const body = withoutUnchangedDuration(sent, before.budgetDuration);
  const raw = body as Record<string, unknown>;
  refuseModelMaxBudget(body, "team");
  if ("team_member_permissions" in raw) checkPermissions(body.team_member_permissions);
  await checkReferences(ctx, body);
  const props = clearNulls(fromApi(teams, raw, TEAM_COLUMNS), EMPTY) as Partial<typeof teams.$inferInsert>;
  const reset = resetAt(body.budget_duration);
  if (reset !== undefined) props.budgetResetAt = reset;
  // Checked here (a 400 before anything is written), merged into the locked row below.
  const settingsTouched = "member_settings" in raw || MEMBER_SETTING_FIELDS.some((f) => f in raw);
  if (settingsTouched) memberSettings(raw, before.memberSettings);
  const merged = { ...before, ...props };
  if (periodFromBudget(raw, merged.budgetDuration)) {
    props.budgetResetAt = merged.budgetResetAt = followedReset(merged.budgetId ? ctx.identity.budgets.get(merged.budgetId) : undefined);
  }
  // model_aliases too: what a team's names call is judged through its aliases (org-rules.ts), so
  // aliases alone could take a team outside its organization, which /team/new refuses.
  if (["organization_id", "models", "access_group_ids", "model_aliases", "max_budget", "tpm_limit", "rpm_limit"].some((f) => f in raw)) {
    await checkOrgLimits(ctx, {
      organizationId: merged.organizationId ?? null,
      models: merged.models ?? [],
      accessGroupIds: merged.accessGroupIds ?? [],
      modelAliases: merged.modelAliases ?? {},
      maxBudget: merged.maxBudget ?? null,
      tpmLimit: merged.tpmLimit ?? null,
      rpmLimit: merged.rpmLimit ?? null,
    }, "model_aliases" in raw && !("models" in raw) ? "model_aliases" : "models");
  }
  const reserving = RESERVING_FIELDS.find((f) => f in raw);
  if (reserving) checkReservations(ctx, merged as TeamRow, reserving);
  if ("spend" in props) await ctx.flushSpend();
  const [team] = await lockedTeam(ctx, before.teamId, async (tx, current) => {
    await holdReferences(tx, { organizationId: props.organizationId, budgetId: props.budgetId });
    if (settingsTouched) props.memberSettings = memberSettings(raw, current.memberSettings);
    return tx
      .update(teams)
      .set({ ...props, ...handSetSpend(props), updatedAt: new Date(), updatedBy: ctx.caller.changedBy })
      .where(eq(teams.teamId, before.teamId))
      .returning();
  });
  await ctx.changed({ kind: "team", teamId: before.teamId });
  if ("spend" in props) await ctx.forgetBudgets([counterId("team", before.teamId)]);
  const out = await withMembers(ctx.db, team!);
  await ctx.audit({ action: "updated", table: "teams", objectId: before.teamId, before: await withMembers(ctx.db, before), after: out });
  return { team_id: before.teamId, data: out };
}

async function deleteTeams(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireAdmin();
  const ids = [...new Set((await ctx.body(TeamIdsBody)).team_ids)];
  const found = await ctx.db
    .select()
    .from(teams)
    .where(and(inArray(teams.teamId, ids), isNull(teams.deletedAt)));
  const missing = ids.filter((id) => !found.some((t) => t.teamId === id));
  if (missing.length > 0) throw notFound(`Team(s) ${missing.join(", ")} not found; nothing was deleted.`, "team_ids");
  const before = await teamsApi(ctx.db, found);
  const by = ctx.caller.changedBy;
  const keys = await ctx.db.transaction(async (tx) => {
    // Locked in one order first: a /user/new holding several of them (holds.ts holdTeams) takes them in that order too.
    await tx.select({ id: teams.teamId }).from(teams).where(inArray(teams.teamId, ids)).orderBy(teams.teamId).for("update");
    const now = new Date();
    const deleted = await tx
      .update(teams)
      .set({ deletedAt: now, deletedBy: by, updatedAt: now, updatedBy: by })
      .where(and(inArray(teams.teamId, ids), isNull(teams.deletedAt)))
      .returning({ id: teams.teamId });
    // Another call deleted one of them since it was read: answered as if it had come first.
    if (deleted.length < ids.length) throw notFound(`Team(s) ${ids.filter((id) => !deleted.some((d) => d.id === id)).join(", ")} not found: deleted meanwhile; nothing was deleted.`, "team_ids");
    const keys = await softDeleteKeys(tx, inArray(virtualKeys.teamId, ids), by);
    // Membership ends with the team: no admin rights linger on a deleted team.
    await tx.delete(teamMembers).where(inArray(teamMembers.teamId, ids));
    return keys;
  });
  await ctx.changed(
    ...ids.map((teamId) => ({ kind: "team" as const, teamId })),
    ...ids.map((teamId) => ({ kind: "team_members" as const, teamId })),
    ...keys.map((k) => ({ kind: "key" as const, token: k.token })),
  );
  for (const t of before) await ctx.audit({ action: "deleted", table: "teams", objectId: String(t.team_id), before: t });
  await auditDeletedKeys(ctx, keys);
  return { deleted_teams: ids, deleted_keys: keys.map((k) => k.token) };
}

async function teamInfo(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const teamId = ctx.query("team_id") ?? ctx.caller.principal.teamId;
  if (!teamId) throw missingQuery("team_id");
  const team = await teamFor(ctx, teamId, "read");
  // Plain members see their own keys and membership; admins of the team see all of them.
  const seesAll = ctx.caller.canReadAll || ctx.caller.isTeamAdmin(teamId);
  const self = ctx.caller.userId ?? "";
  const keys = await ctx.db
    .select()
    .from(virtualKeys)
    .where(and(eq(virtualKeys.teamId, teamId), isNull(virtualKeys.deletedAt), seesAll ? undefined : eq(virtualKeys.userId, self)))
    .orderBy(virtualKeys.createdAt);
  const memberships = await ctx.db
    .select()
    .from(teamMembers)
    .where(and(eq(teamMembers.teamId, teamId), seesAll ? undefined : eq(teamMembers.userId, self)))
    .orderBy(teamMembers.createdAt);
  return {
    team_id: teamId,
    team_info: await withMembers(ctx.db, team, ctx.caller),
    keys: keys.map((k) => toApi(k)),
    team_memberships: memberships.map(membershipApi),
  };
}

function orgFilter(orgId: string | undefined): SQL | undefined {
  if (!orgId) return undefined;
  return orgId === "default_organization" ? isNull(teams.organizationId) : eq(teams.organizationId, orgId);
}

function memberFilter(ctx: AdminCtx, userId: string | undefined): SQL | undefined {
  if (!userId) return undefined;
  return inArray(teams.teamId, ctx.db.select({ id: teamMembers.teamId }).from(teamMembers).where(eq(teamMembers.userId, userId)));
}

async function listTeams(ctx: AdminCtx): Promise<Record<string, unknown>[]> {
  ctx.caller.requireReadAll();
  const rows = await ctx.db
    .select()
    .from(teams)
    .where(and(isNull(teams.deletedAt), orgFilter(ctx.query("organization_id")), memberFilter(ctx, ctx.query("user_id"))))
    .orderBy(teams.createdAt, teams.teamId);
  const ids = rows.map((t) => t.teamId);
  const [out, keys, memberships] = await Promise.all([
    teamsApi(ctx.db, rows, ctx.caller),
    ids.length
      ? ctx.db
          .select()
          .from(virtualKeys)
          .where(and(inArray(virtualKeys.teamId, ids), isNull(virtualKeys.deletedAt)))
      : [],
    ids.length ? ctx.db.select().from(teamMembers).where(inArray(teamMembers.teamId, ids)) : [],
  ]);
  return out.map((t) => ({
    ...t,
    keys: keys.filter((k) => k.teamId === t.team_id).map((k) => toApi(k)),
    team_memberships: memberships.filter((m) => m.teamId === t.team_id).map(membershipApi),
  }));
}

const TEAM_SORT = { team_id: teams.teamId, team_alias: teams.teamAlias, created_at: teams.createdAt, spend: teams.spend } as const;

async function listTeamsV2(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireReadAll();
  const p = pageOf(ctx.query, 10, 100);
  const sortBy = choice(ctx.query, "sort_by", Object.keys(TEAM_SORT) as (keyof typeof TEAM_SORT)[], "created_at");
  const order = choice(ctx.query, "sort_order", ["asc", "desc"] as const, "asc");
  const status = choice(ctx.query, "status", ["active", "deleted"] as const, "active");
  const teamId = ctx.query("team_id");
  const alias = ctx.query("team_alias");
  const where = and(
    status === "deleted" ? isNotNull(teams.deletedAt) : isNull(teams.deletedAt),
    teamId ? eq(teams.teamId, teamId) : undefined,
    alias ? ilike(teams.teamAlias, containing(alias)) : undefined,
    orgFilter(ctx.query("organization_id")),
    memberFilter(ctx, ctx.query("user_id")),
  );
  const dir = order === "desc" ? desc : asc;
  const [rows, [total]] = await Promise.all([
    ctx.db
      .select()
      .from(teams)
      .where(where)
      .orderBy(dir(TEAM_SORT[sortBy]), asc(teams.teamId))
      .limit(p.pageSize)
      .offset(p.offset),
    ctx.db.select({ n: count() }).from(teams).where(where),
  ]);
  const { items, ...rest } = paged(await teamsApi(ctx.db, rows, ctx.caller), Number(total?.n ?? 0), p);
  return { teams: items, ...rest };
}

async function availableTeams(ctx: AdminCtx): Promise<Record<string, unknown>[]> {
  ctx.caller.requireReadAll();
  const rows = await ctx.db.select().from(teams).where(isNull(teams.deletedAt)).orderBy(teams.createdAt, teams.teamId);
  return teamsApi(ctx.db, rows);
}

function setBlocked(blocked: boolean) {
  return async (ctx: AdminCtx): Promise<Record<string, unknown>> => {
    const { team_id } = await ctx.body(TeamIdBody);
    const before = await teamFor(ctx, team_id, "global");
    // On the live row only: a team deleted meanwhile is the 404 it would be after the deletion.
    const [team] = await lockedTeam(ctx, team_id, (tx) =>
      tx.update(teams).set({ blocked, updatedAt: new Date(), updatedBy: ctx.caller.changedBy }).where(eq(teams.teamId, team_id)).returning(),
    );
    // Every key of the team is checked against the cached team: this stops (or restarts) them all at once.
    await ctx.changed({ kind: "team", teamId: team_id });
    const out = await withMembers(ctx.db, team!);
    await ctx.audit({ action: blocked ? "blocked" : "unblocked", table: "teams", objectId: team_id, before: { blocked: before.blocked }, after: { blocked } });
    return out;
  };
}

async function memberAdd(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const body = await ctx.body(MemberAddBody);
  const team = await teamFor(ctx, body.team_id, "team_admin");
  let members: MemberValue[];
  if (body.member !== undefined) members = Array.isArray(body.member) ? body.member : [body.member];
  else if (body.member_email || body.user_id || body.user_email) {
    members = [{ role: body.role ?? "user", user_id: body.user_id ?? null, user_email: body.member_email ?? body.user_email ?? null }];
  } else throw badRequest("Send the member to add: member {role, user_id | user_email} (or a list of them), or member_email with role.", "member");
  const by = ctx.caller.changedBy;
  const budget = memberBudgetIn(body);
  // Under the team's lock: a /team/delete at the same moment removes its members, and would miss one added after it read them.
  const admitted = await lockedTeam(
    ctx,
    team.teamId,
    async (tx, current) => {
      const out: Admitted[] = [];
      for (const m of members) out.push(await admit(tx, current, m, budget, by));
      return out;
    },
    admitting(members),
  ).catch(concurrentMember);
  await ctx.changed(...changesFor(team.teamId, admitted));
  await auditAdmitted(ctx, admitted);
  return {
    ...(await withMembers(ctx.db, team)),
    updated_users: await updatedUsers(ctx, team.teamId, admitted),
    updated_team_memberships: admitted.map((a) => membershipApi(a.membership)),
  };
}

/** The users `/team/member_add` admitted: whole to a proxy admin; to a team admin, as its team sees them (an existing user's other teams, role and spend are not its to see). */
async function updatedUsers(ctx: AdminCtx, teamId: string, admitted: readonly Admitted[]): Promise<Record<string, unknown>[]> {
  if (!ctx.caller.isAdmin) return admitted.map((a) => memberUserApi(a.user, teamId));
  const teamIds = await teamIdsOf(ctx.db, admitted.map((a) => a.user.userId));
  return admitted.map((a) => userApi(a.user, teamIds.get(a.user.userId) ?? []));
}

async function memberDelete(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const body = await ctx.body(MemberDeleteBody);
  const team = await teamFor(ctx, body.team_id, "team_admin");
  const user = await namedMember(ctx, body);
  const current = await membership(ctx.db, team.teamId, user.userId);
  if (!current) throw badRequest(`User ${user.userId} is not a member of team ${team.teamId}.`, "user_id");
  const by = ctx.caller.changedBy;
  const keys = await ctx.db.transaction(async (tx) => {
    // The caller's and the member's memberships locked in one order: two admins removing each other at once take turns.
    await holdWrite(tx, ctx.caller, { userIds: [user.userId], members: { teamId: team.teamId, userIds: [user.userId] } });
    const removed = await tx
      .delete(teamMembers)
      .where(and(eq(teamMembers.teamId, team.teamId), eq(teamMembers.userId, user.userId)))
      .returning({ userId: teamMembers.userId });
    // Removed by a concurrent call since it was read: the answer that call's coming first gives.
    if (removed.length === 0) throw badRequest(`User ${user.userId} is not a member of team ${team.teamId}.`, "user_id");
    // A removed member's keys in the team go with it: they would otherwise keep spending the team's budget.
    return softDeleteKeys(tx, and(eq(virtualKeys.teamId, team.teamId), eq(virtualKeys.userId, user.userId))!, by);
  });
  await ctx.changed({ kind: "team_members", teamId: team.teamId }, ...keys.map((k) => ({ kind: "key" as const, token: k.token })));
  await ctx.audit({ action: "deleted", table: "team_members", objectId: `${team.teamId}:${user.userId}`, before: membershipApi(current) });
  await auditDeletedKeys(ctx, keys);
  return { ...(await withMembers(ctx.db, team)), deleted_keys: keys.map((k) => k.token) };
}

async function memberUpdate(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const body = await ctx.body(MemberUpdateBody);
  const raw = body as Record<string, unknown>;
  const team = await teamFor(ctx, body.team_id, "team_admin");
  const user = await namedMember(ctx, body);
  const current = await membership(ctx.db, team.teamId, user.userId);
  if (!current) throw badRequest(`User ${user.userId} is not a member of team ${team.teamId}.`, "user_id");
  const set: Partial<typeof teamMembers.$inferInsert> = {};
  if (body.role !== undefined) set.role = body.role;
  if ("max_budget_in_team" in raw) set.maxBudgetInTeam = memberBudgetIn(body) ?? null;
  if ("tpm_limit" in raw) set.tpmLimit = body.tpm_limit ?? null;
  if ("rpm_limit" in raw) set.rpmLimit = body.rpm_limit ?? null;
  let updated = current;
  if (Object.keys(set).length > 0) {
    const [row] = await ctx.db.transaction(async (tx) => {
      await holdWrite(tx, ctx.caller, { userIds: [user.userId], members: { teamId: team.teamId, userIds: [user.userId] } });
      return tx
        .update(teamMembers)
        .set(set)
        .where(and(eq(teamMembers.teamId, team.teamId), eq(teamMembers.userId, user.userId)))
        .returning();
    });
    // Removed by a concurrent /team/member_delete since it was read: the answer that call's coming first gives.
    if (!row) throw badRequest(`User ${user.userId} is not a member of team ${team.teamId}.`, "user_id");
    updated = row;
    await ctx.changed({ kind: "team_members", teamId: team.teamId });
    await ctx.audit({ action: "updated", table: "team_members", objectId: `${team.teamId}:${user.userId}`, before: membershipApi(current), after: membershipApi(updated) });
  }
  return {
    team_id: team.teamId,
    user_id: user.userId,
    user_email: user.userEmail,
    role: updated.role,
    max_budget_in_team: updated.maxBudgetInTeam === null ? null : Number(updated.maxBudgetInTeam),
    tpm_limit: updated.tpmLimit,
    rpm_limit: updated.rpmLimit,
  };
}

async function bulkMemberAdd(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const body = await ctx.body(BulkMemberAddBody);
  const team = await teamFor(ctx, body.team_id, "global");
  let members: MemberValue[] = body.members ?? [];
  if (body.all_users) {
    const current = ctx.db.select({ id: teamMembers.userId }).from(teamMembers).where(eq(teamMembers.teamId, team.teamId));
    const others = await ctx.db.select({ userId: users.userId }).from(users).where(notInArray(users.userId, current)).orderBy(users.createdAt);
    members = [...members, ...others.map((u) => ({ role: "user" as const, user_id: u.userId }))];
  }
  if (members.length === 0) throw badRequest("Send members (a list of {role, user_id | user_email}) or all_users: true.", "members");
  const budget = memberBudgetIn(body);
  const outcomes: (Admitted | { member: MemberValue; error: string })[] = [];
  const admitted: Admitted[] = [];
  // Each member on its own: one that cannot be added does not stop the others.
  for (const m of members) {
    try {
      const a = await lockedTeam(ctx, team.teamId, (tx, current) => admit(tx, current, m, budget, ctx.caller.changedBy), admitting([m])).catch(concurrentMember);
      admitted.push(a);
      outcomes.push(a);
    } catch (err) {
      if (!(err instanceof GatewayError)) throw err;
      outcomes.push({ member: m, error: err.message });
    }
  }
  if (admitted.length > 0) await ctx.changed(...changesFor(team.teamId, admitted));
  await auditAdmitted(ctx, admitted);
  // The users as they now are, with their teams, as /team/member_add shows them (an empty list said the user was in no team, not even this one).
  const shown = await updatedUsers(ctx, team.teamId, admitted);
  const results = outcomes.map((o) =>
    "membership" in o
      ? { user_id: o.user.userId, user_email: o.user.userEmail, success: true, error: null, updated_user: shown[admitted.indexOf(o)], updated_team_membership: membershipApi(o.membership) }
      : { user_id: o.member.user_id ?? null, user_email: o.member.user_email ?? null, success: false, error: o.error, updated_user: null, updated_team_membership: null },
  );
  return {
    team_id: team.teamId,
    results,
    total_requested: members.length,
    successful_additions: admitted.length,
    failed_additions: members.length - admitted.length,
    updated_team: await withMembers(ctx.db, team),
  };
}

async function permissionsList(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireReadAll();
  const teamId = ctx.query("team_id");
  if (!teamId) throw missingQuery("team_id");
  const team = await teamFor(ctx, teamId, "read");
  return {
    team_id: teamId,
    team_member_permissions: team.teamMemberPermissions.length > 0 ? team.teamMemberPermissions : [...DEFAULT_TEAM_MEMBER_PERMISSIONS],
    all_available_permissions: [...TEAM_MEMBER_PERMISSION_CHOICES],
  };
}

async function permissionsUpdate(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const body = await ctx.body(PermissionsBody);
  const before = await teamFor(ctx, body.team_id, "global");
  checkPermissions(body.team_member_permissions);
  const perms = [...new Set(body.team_member_permissions)];
  const [team] = await lockedTeam(ctx, before.teamId, (tx) =>
    tx.update(teams).set({ teamMemberPermissions: perms, updatedAt: new Date(), updatedBy: ctx.caller.changedBy }).where(eq(teams.teamId, before.teamId)).returning(),
  );
  await ctx.changed({ kind: "team", teamId: before.teamId });
  await ctx.audit({ action: "updated", table: "teams", objectId: before.teamId, before: { team_member_permissions: before.teamMemberPermissions }, after: { team_member_permissions: perms } });
  return withMembers(ctx.db, team!);
}

function changeModels(adding: boolean) {
  return async (ctx: AdminCtx): Promise<Record<string, unknown>> => {
    const body = await ctx.body(ModelsBody);
    const read = await teamFor(ctx, body.team_id, "team_admin");
    // The models added are within the organization's (the models already there were checked when they came).
    if (adding) {
      const widened = { ...read, models: [...new Set([...read.models, ...body.models])] };
      await checkOrgLimits(ctx, widened);
      checkReservations(ctx, widened, "models");
    }
    const { before, models, team } = await lockedTeam(ctx, read.teamId, async (tx, before) => {
      let models: string[];
      if (adding) models = [...new Set([...before.models, ...body.models])];
      else {
        const present = body.models.filter((m) => before.models.includes(m));
        if (present.length === 0) throw badRequest(`None of ${JSON.stringify(body.models)} is in team ${before.teamId}'s models ${JSON.stringify(before.models)}.`, "models");
        models = before.models.filter((m) => !body.models.includes(m));
        // An empty list means "every model" unless access_group_ids restrict the team: removing the
        // last name must not widen the team's access, but leaves a team with groups held to them.
        if (models.length === 0 && before.accessGroupIds.length === 0) {
          throw badRequest(
            "Removing every model would give the team access to all models (a team without models or access_group_ids has no restriction). Keep at least one, or have a proxy admin set models: [] with /team/update.",
            "models",
          );
        }
      }
      const [team] = await tx.update(teams).set({ models, updatedAt: new Date(), updatedBy: ctx.caller.changedBy }).where(eq(teams.teamId, before.teamId)).returning();
      return { before, models, team };
    });
    await ctx.changed({ kind: "team", teamId: before.teamId });
    await ctx.audit({ action: "updated", table: "teams", objectId: before.teamId, before: { models: before.models }, after: { models } });
    return withMembers(ctx.db, team!);
  };
}

export function teamRoutes(deps: AdminDeps) {
  return new Elysia()
    .post("/team/new", adminRoute(deps, newTeam))
    .post("/team/update", adminRoute(deps, updateTeam))
    .post("/team/delete", adminRoute(deps, deleteTeams))
    .get("/team/info", adminRoute(deps, teamInfo))
    .get("/team/list", adminRoute(deps, listTeams))
    .get("/v2/team/list", adminRoute(deps, listTeamsV2))
    .get("/team/available", adminRoute(deps, availableTeams))
    .post("/team/block", adminRoute(deps, setBlocked(true)))
    .post("/team/unblock", adminRoute(deps, setBlocked(false)))
    .post("/team/member_add", adminRoute(deps, memberAdd))
    .post("/team/member_delete", adminRoute(deps, memberDelete))
    .post("/team/member_update", adminRoute(deps, memberUpdate))
    .post("/team/bulk_member_add", adminRoute(deps, bulkMemberAdd))
    .get("/team/permissions_list", adminRoute(deps, permissionsList))
    .post("/team/permissions_update", adminRoute(deps, permissionsUpdate))
    .post("/team/model/add", adminRoute(deps, changeModels(true)))
    .post("/team/model/delete", adminRoute(deps, changeModels(false)));
}
