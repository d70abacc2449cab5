/**
 * Virtual key management. Who may act on a key: proxy admins on all; a key's own user on it
 * (read; update, delete and regenerate a personal key; through a key issued in a team, only on keys of that team); a team admin
 * on the team's keys; a team `user` member on the team's keys for the routes
 * `team_member_permissions` grants; viewers read only. A key's caps (ADMIN_SET_FIELDS) only proxy
 * and team admins change. A key outside the caller's reach is a 403 whether or not it exists. The plaintext key is returned by
 * generate/regenerate only and is stored nowhere; every other response names keys by hash.
 */
import { randomUUID } from "node:crypto";
import { Type as T, type TSchema } from "@sinclair/typebox";
import { and, asc, desc, eq, gt, ilike, inArray, isNotNull, isNull, or, type SQL, sql } from "drizzle-orm";
import { Elysia } from "elysia";
import { accessAliases, INHERIT, levelAllows, listedOutside } from "../../access.ts";
import { badRequest, type Caller, forbidden, notFound } from "../../authz.ts";
import type { AccessLevel, Role } from "../../contract.ts";
import { GatewayError } from "../../errors.ts";
import { hashKey, isPlainKey, KEY_PREFIX, keyName, MIN_CUSTOM_KEY_CHARS, newKeyValue, tokenOf } from "../../identity/keys.ts";
import {
  BulkUpdateSchema,
  expiresOf,
  GenerateKeySchema,
  type KeyBody,
  keyFieldsOf,
  periodMs,
  RegenerateKeySchema,
  UpdateKeySchema,
} from "../../identity/key-fields.ts";
import { type IdentityChange, type KeyRow, keyCounterToken, type TeamRow, type UserRow } from "../../identity/records.ts";
import { type Exec, memberUserApi } from "../../identity/members.ts";
import { decimalsOf, toApi } from "../../identity/serialize.ts";
import { writtenNumber } from "../../identity/exact-numbers.ts";
import { columnToPico, exactUsdJson, PICO_DIGITS, type Pico, picoToText, usdToPico } from "../../cost/money.ts";
import { choice, flag, integer } from "../../identity/paging.ts";
import { firstTokenOfNewKey, releaseEarlierToken, rotateKey } from "../../identity/rotation.ts";
import type { Db } from "../../store/db.ts";
import { rotatedKeys, users, virtualKeys } from "../../store/schema.ts";
import { checker } from "../validate.ts";
import { handSetSpend } from "../../spend/flush.ts";
import { counterId } from "../../spend/ledger.ts";
import { isUniqueViolation, storeErrorCause } from "../../store/sql.ts";
import { groupLabels } from "./access-groups.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";
import { auditCreatedUser } from "./user-audit.ts";
import { followedReset, periodFromBudget, withoutUnchangedDuration } from "../../identity/budget-period.ts";
import { IdList, LIMIT_COLUMNS, resetAt } from "../../identity/fields.ts";
import { guaranteedOverflow, isGuaranteed, type PlannedKey } from "../../limits/capacity.ts";
import { MASTER_USER_ID, refuseMasterUserId } from "../../identity/master-user.ts";
import { routesOutsideTeam } from "../../identity/team-routes.ts";
import { budgetGone, holdExistingUser, holdKey, holdMembership, holdUser, holdWrite, orgGone, teamGone } from "../../identity/holds.ts";

const TABLE = "virtual_keys";
const BULK_MAX = 500;

const KeyOnly = T.Object({ key: T.String({ minLength: 1 }) }, { additionalProperties: true });
const DeleteSchema = T.Object(
  { keys: T.Optional(IdList(T.String())), key_aliases: T.Optional(IdList(T.String())), key: T.Optional(T.String()) },
  { additionalProperties: true },
);
const ResetSpendSchema = T.Object({ reset_to: T.Optional(T.Number({ minimum: 0 })) }, { additionalProperties: true });
const AnyObject = T.Object({}, { additionalProperties: true });

const checkers = new WeakMap<TSchema, (v: unknown) => unknown>();
function check<S extends TSchema>(schema: S, value: unknown): S["static"] {
  let c = checkers.get(schema);
  if (!c) {
    c = checker(schema);
    checkers.set(schema, c);
  }
  return c(value) as S["static"];
}

/** Permission names (as in `team_member_permissions`) of the key routes. */
type KeyRoute =
  | "/key/info"
  | "/key/list"
  | "/key/update"
  | "/key/delete"
  | "/key/block"
  | "/key/unblock"
  | "/key/regenerate"
  | "/key/{key_id}/regenerate"
  | "/key/{key_id}/reset_spend";

/**
 * What a key's own user may do with a personal key (one of no team). Regenerate is among them (the
 * spec lists it for admins): an `auto_rotate` key's new value is kept by nobody, so its owner gets a
 * usable key only by regenerating it with the old value during its grace period.
 */
const OWNER_ROUTES = new Set<KeyRoute>(["/key/info", "/key/list", "/key/update", "/key/delete", "/key/regenerate", "/key/{key_id}/regenerate"]);

/**
 * A team key is governed by its team, even for the member it belongs to: a `user` member changes
 * or deletes it only where `team_member_permissions` allow (else the member could lift the limits
 * a team admin set on it). The owner may always read it.
 */
function mayActOn(caller: Caller, row: KeyRow, route: KeyRoute): boolean {
  if (caller.isAdmin) return true;
  const read = route === "/key/info" || route === "/key/list";
  if (read && (caller.canReadAll || caller.keyHash === row.token)) return true;
  if (!read && caller.isViewer) return false;
  const owner = row.userId === caller.userId && caller.actsAsUserIn(row.teamId);
  if (owner && OWNER_ROUTES.has(route) && (read || row.teamId === null)) return true;
  return caller.mayOnTeam(row.teamId, route);
}

const aliasTaken = (alias: string) => badRequest(`Key alias "${alias}" is already used by another key. Aliases are unique; choose another.`, "key_alias");

/**
 * The row of `token` while the key is live. Writes name it too: a key deleted (or rotated) by a
 * concurrent call after this one read it must not be changed, or reported changed, afterwards.
 */
const live = (token: string) => and(eq(virtualKeys.token, token), isNull(virtualKeys.deletedAt));

/** The live key of a token, following an old value to its rotated key while its grace period lasts. */
async function liveKey(db: Db, token: string): Promise<KeyRow | undefined> {
  const [row] = await db.select().from(virtualKeys).where(live(token));
  if (row) return row;
  const [moved] = await db
    .select({ active: rotatedKeys.activeToken })
    .from(rotatedKeys)
    .where(and(eq(rotatedKeys.token, token), gt(rotatedKeys.revokeAt, new Date())));
  return moved ? liveKey(db, moved.active) : undefined;
}

/** The live key a caller names (plain or hashed), if the caller may `route` it; else 403 (404 for those who may see everything). */
async function keyInReach(ctx: AdminCtx, keyOrHash: string, route: KeyRoute | KeyRoute[]): Promise<KeyRow> {
  const routes = Array.isArray(route) ? route : [route];
  const row = await liveKey(ctx.db, tokenOf(keyOrHash));
  if (row && routes.some((r) => mayActOn(ctx.caller, row, r))) return row;
  const seesAll = ctx.caller.isAdmin || (routes[0] === "/key/info" && ctx.caller.canReadAll);
  if (!row && seesAll) throw notFound("Key not found: no live key has this value or hash.", "key");
  throw forbidden(`You may not call ${routes[0]} on this key: ${whyRefused(ctx.caller, row, routes[0]!)}.`);
}

/**
 * Why `mayActOn` refused. Tells only what the caller knows already (its role, its own key, its
 * team's key), so a key it may not see is refused in the same words whether or not it exists.
 */
function whyRefused(caller: Caller, row: KeyRow | undefined, route: KeyRoute): string {
  if (caller.isViewer && route !== "/key/info" && route !== "/key/list") return "your role may only read";
  const own = row !== undefined && row.userId === caller.userId && caller.actsAsUserIn(row.teamId);
  if (own && row.teamId === null) return "on a personal key only a proxy admin may (its owner may read, update, delete and regenerate it)";
  if (row?.teamId && caller.teamRole(row.teamId) === "user") return `it is a key of team ${row.teamId}, whose members may call only the routes its team_member_permissions grant`;
  return "it is neither yours nor a key of a team you administer";
}

/**
 * What a write on key `row` making it `planned` was let through and held on: its reach (mayActOn:
 * the key's team and user), its holds (holdKeyWrite: the team, organization, budget object and user
 * it names anew) and, for a guaranteed limit, the capacity it reserves (checkGuaranteedStored).
 */
function decidedOn(row: KeyRow, planned: PlannedKey = row): string {
  const capacity = isGuaranteed(planned) ? [planned.models, planned.accessGroupIds, planned.aliases, planned.rpmLimit, planned.tpmLimit, planned.rpmLimitType, planned.tpmLimitType] : [];
  return JSON.stringify([row.teamId, row.userId, row.organizationId, row.budgetId, ...capacity]);
}

/** Thrown in a key write's transaction (rolling it back) when a concurrent write changed what it was decided on: the write starts over. */
class KeyChanged extends Error {}

/** Attempts of a key write that concurrent writes keep changing the key under, before the 409. */
const KEY_WRITE_ATTEMPTS = 5;

/** Key `row` held by the write's transaction (holds.ts holdKey), after what holdWrite holds; undefined when deleted or rotated meanwhile. */
async function heldKey(tx: Exec, row: KeyRow): Promise<KeyRow | undefined> {
  const current = await holdKey(tx, row.token);
  if (current && decidedOn(current) !== decidedOn(row)) throw new KeyChanged();
  return current;
}

/**
 * `write` on the key a caller names, if in reach for `route` (keyInReach); read again and written
 * again when a concurrent write changed the key in what this one was decided on (KeyChanged), so
 * its checks run on the row it writes, as one after the other.
 */
async function writeKeyInReach<R>(ctx: AdminCtx, keyOrHash: string, route: KeyRoute | KeyRoute[], write: (row: KeyRow) => Promise<R>): Promise<R> {
  for (let attempt = 1; ; attempt++) {
    const row = await keyInReach(ctx, keyOrHash, route);
    try {
      return await write(row);
    } catch (err) {
      if (!(err instanceof KeyChanged)) throw err;
      if (attempt === KEY_WRITE_ATTEMPTS) throw GatewayError.of(409, "The key was changed by other requests while this one ran, every time it was tried; nothing was changed. Try again.", "conflict", "key");
    }
  }
}

/** The identifier of a key for responses: hashes and aliases as passed, plaintext replaced by its hash. */
function safeId(keyOrHash: string): string {
  return isPlainKey(keyOrHash) ? tokenOf(keyOrHash) : keyOrHash;
}

async function assertAliasFree(db: Db, alias: string | null | undefined, exceptToken?: string): Promise<void> {
  if (!alias) return;
  const [row] = await db
    .select({ token: virtualKeys.token })
    .from(virtualKeys)
    .where(and(eq(virtualKeys.keyAlias, alias), isNull(virtualKeys.deletedAt)));
  if (row && row.token !== exceptToken) throw aliasTaken(alias);
}

/** A caller-chosen key value: `sk-…`, not the master key, and not used before (live, deleted or rotated). */
async function assertNewKeyValue(ctx: AdminCtx, value: string, field: string): Promise<string> {
  if (!value.startsWith(KEY_PREFIX) || value.length <= KEY_PREFIX.length) throw badRequest(`${field} must start with "${KEY_PREFIX}".`, field);
  if (value.length < KEY_PREFIX.length + MIN_CUSTOM_KEY_CHARS) {
    throw badRequest(`${field} must have at least ${MIN_CUSTOM_KEY_CHARS} characters after "${KEY_PREFIX}": key_name shows its last 4 to everyone who may read the key.`, field);
  }
  // Clients send keys trimmed, so a value with spaces could never authenticate; nor one with other
  // characters than printable ASCII: an HTTP header carries them as Latin-1 or UTF-8 bytes (curl) or
  // not at all (fetch, the openai SDK throw), so no client could send it as it was hashed.
  if (/\s/.test(value)) throw badRequest(`${field} must not contain whitespace.`, field);
  if (!/^[\x21-\x7e]+$/.test(value)) throw badRequest(`${field} may hold only printable ASCII characters (no spaces, control or non-ASCII characters).`, field);
  const token = hashKey(value);
  const [existing] = await ctx.db.select({ token: virtualKeys.token }).from(virtualKeys).where(eq(virtualKeys.token, token));
  // A rotated-away value is taken while it still works (its grace period); revoked, it is free again.
  const [rotated] = await ctx.db
    .select({ token: rotatedKeys.token })
    .from(rotatedKeys)
    .where(and(eq(rotatedKeys.token, token), gt(rotatedKeys.revokeAt, new Date())));
  if (existing || rotated || value === ctx.snapshot.settings.masterKey) {
    throw badRequest(`This ${field} already exists. Choose another value, or omit it to get a random key.`, field);
  }
  return token;
}

/** What of a key decides the calls it may make in its team: its list, its aliases and its org (whose aliases its calls read). */
type KeyList = Pick<KeyRow, "models" | "accessGroupIds" | "aliases" | "organizationId">;

/**
 * The entries of a personal key's `models` that its user's list does not allow, read as the
 * gateway path reads it (levelAllows): names, wildcards, access groups (those declared on
 * deployments as well as stored ones), catch-alls; an empty list allows everything.
 */
function modelsOutside(ctx: AdminCtx, models: readonly string[], level: AccessLevel): string[] {
  return models.filter((m) => !INHERIT.has(m) && !levelAllows(level, m, ctx.snapshot.accessGroups));
}

/**
 * The entries of the key's list its team would never let a call use, judged as calls are
 * (access.ts listedOutside: access-group names, aliases of the key, team and orgs, the config's
 * model_group_alias), so a key lists what its calls through the team may use.
 */
function outsideTeam(ctx: AdminCtx, key: KeyList, team: TeamRow): { models: string[]; accessGroupIds: string[] } {
  const orgIds = [...new Set([key.organizationId, team.organizationId])].filter((id): id is string => !!id);
  const orgs = orgIds.flatMap((id) => ctx.identity.orgs.get(id) ?? []);
  const above = { levels: [{ level: "team" as const, models: team.models, accessGroupIds: team.accessGroupIds }], ...accessAliases(key, team, orgs) };
  return listedOutside(above, key, ctx.snapshot.accessGroups, ctx.snapshot.groupAliases);
}

function teamOrFail(ctx: AdminCtx, teamId: string): TeamRow {
  const team = ctx.identity.teams.get(teamId);
  if (team) return team;
  // Only admins learn that a team does not exist; others were already refused for not administering it.
  if (ctx.caller.isAdmin) throw teamGone(teamId);
  throw forbidden(`You are not an admin of team ${teamId}.`);
}

/** The team, organization and budget object `fields` puts the key in that `row` (an update's key) is not in already: held by the write (holds.ts). */
const namedAnew = (fields: Record<string, unknown>, row?: KeyRow) => ({
  teamId: fields.teamId !== row?.teamId ? fields.teamId : undefined,
  organizationId: fields.organizationId !== row?.organizationId ? fields.organizationId : undefined,
  budgetId: fields.budgetId !== row?.budgetId ? fields.budgetId : undefined,
});

/** Referenced organization, budget and access groups must exist (callers who may name them are told plainly), as for a team. */
function checkReferences(ctx: AdminCtx, fields: Record<string, unknown>): void {
  const org = fields.organizationId;
  if (typeof org === "string" && !ctx.identity.orgs.has(org)) throw orgGone(org);
  const budget = fields.budgetId;
  if (typeof budget === "string" && !ctx.identity.budgets.has(budget)) throw budgetGone(budget);
  const groups = Array.isArray(fields.accessGroupIds) ? (fields.accessGroupIds as unknown[]) : [];
  const unknownGroups = groups.filter((id) => typeof id !== "string" || !ctx.identity.accessGroups.has(id));
  if (unknownGroups.length > 0) throw badRequest(`Access group(s) ${unknownGroups.join(", ")} do not exist.`, "access_group_ids");
}

function checkTeamModels(ctx: AdminCtx, key: KeyList, team: TeamRow | undefined): void {
  if (!team) return;
  const outside = outsideTeam(ctx, key, team);
  const teamGroups = team.accessGroupIds.length > 0 ? ` and access groups ${groupLabels(ctx, team.accessGroupIds)}` : "";
  if (outside.models.length > 0) {
    throw badRequest(`Model not in team's models: ${outside.models.join(", ")}. Team ${team.teamId} may only use ${JSON.stringify(team.models)}${teamGroups}.`, "models");
  }
  if (outside.accessGroupIds.length > 0) {
    throw badRequest(`Access group(s) ${groupLabels(ctx, outside.accessGroupIds)} hold models outside team ${team.teamId}'s models ${JSON.stringify(team.models)}${teamGroups}.`, "access_group_ids");
  }
}

function checkTeamRoutes(routes: readonly string[], team: TeamRow | undefined): void {
  const outside = team ? routesOutsideTeam(team, routes) : [];
  if (outside.length > 0) {
    throw badRequest(
      `Pass-through routes not in team's allowed_passthrough_routes: ${outside.join(", ")}. Team ${team!.teamId} may only call ${JSON.stringify(team!.allowedPassthroughRoutes)}.`,
      "allowed_passthrough_routes",
    );
  }
}

/** The period fields' derived timestamps: budget reset, rotation, temporary budget. */
function derivedTimes(ctx: AdminCtx, fields: Record<string, unknown>, merged: Partial<KeyRow>, touched: KeyBody, now: number): void {
  if ("budget_duration" in touched) {
    fields.budgetResetAt = resetAt(touched.budget_duration as string | null, "budget_duration", now) ?? null;
  }
  if (periodFromBudget(touched, merged.budgetDuration)) {
    fields.budgetResetAt = followedReset(merged.budgetId ? ctx.identity.budgets.get(merged.budgetId) : undefined, now);
  }
  if ("auto_rotate" in touched || "rotation_interval" in touched) {
    if (merged.autoRotate) {
      if (!merged.rotationInterval) throw badRequest("auto_rotate needs rotation_interval (such as 30d or 90d).", "rotation_interval");
      fields.keyRotationAt = new Date(now + periodMs(merged.rotationInterval, "rotation_interval"));
    } else {
      if (merged.rotationInterval) periodMs(merged.rotationInterval, "rotation_interval");
      fields.keyRotationAt = null;
    }
  }
  if (merged.tempBudgetIncrease != null && merged.tempBudgetExpiry == null) {
    throw badRequest("temp_budget_increase needs temp_budget_expiry.", "temp_budget_expiry");
  }
}

/**
 * `project_id` has no column: it lives in `metadata.project_id`, over the metadata of the same
 * body, else (`stored`: an update) over the stored metadata as it is when the row is written. Set
 * in the copy read at the start of the call, it would write back that copy over the metadata a
 * concurrent update set meanwhile.
 */
function withProjectId(fields: Record<string, unknown>, body: KeyBody, stored: boolean): void {
  if (!("project_id" in body) || body.project_id === undefined) return;
  if (stored && fields.metadata === undefined) {
    fields.metadata =
      body.project_id === null
        ? sql`${virtualKeys.metadata} - 'project_id'`
        : sql`${virtualKeys.metadata} || jsonb_build_object('project_id', ${body.project_id}::text)`;
    return;
  }
  const metadata = { ...((fields.metadata as Record<string, unknown> | undefined) ?? {}) };
  if (body.project_id === null) delete metadata.project_id;
  else metadata.project_id = body.project_id;
  fields.metadata = metadata;
}

/** Who the new key may belong to: non-admins generate for themselves, or (team admins) for members of their team. */
function authorizeGenerate(ctx: AdminCtx, body: KeyBody, serviceAccount: boolean): { userId: string | null; team: TeamRow | undefined } {
  const caller = ctx.caller;
  caller.requireWriter();
  const teamId = typeof body.team_id === "string" ? body.team_id : undefined;
  if (serviceAccount) {
    caller.requireAdmin();
    if (!teamId) throw badRequest("team_id is required for service account keys: a service account key belongs to a team, not a user.", "team_id");
    return { userId: null, team: teamOrFail(ctx, teamId) };
  }
  const requested = typeof body.user_id === "string" ? body.user_id : undefined;
  if (caller.isAdmin) return { userId: requested ?? null, team: teamId ? teamOrFail(ctx, teamId) : undefined };
  if (!caller.userId) throw forbidden("This key has no user, so it may only generate keys for a team it administers; it administers none.");
  // A key without a team would act as its user everywhere: a key issued in a team makes keys in that team only.
  if (caller.teamScope !== undefined && teamId === undefined) {
    throw forbidden(`This key was issued in team ${caller.teamScope}: it may generate keys in that team only (team_id ${caller.teamScope}), never personal keys.`);
  }
  let team: TeamRow | undefined;
  if (teamId) {
    if (!caller.mayOnTeam(teamId, "/key/generate")) throw forbidden(`You may not generate keys for team ${teamId}: you are not its admin and its members are not allowed to.`);
    team = teamOrFail(ctx, teamId);
  }
  const userId = requested ?? caller.userId;
  if (userId !== caller.userId) {
    const member = team && caller.isTeamAdmin(team.teamId) && ctx.identity.teamMembers.get(team.teamId)?.has(userId);
    if (!member) throw forbidden(`You may only generate keys for yourself (user_id ${caller.userId})${team ? " or members of a team you administer" : ""}.`);
  }
  if (typeof body.organization_id === "string" && body.organization_id !== team?.organizationId) {
    throw forbidden("Only a proxy admin may attach a key to an organization other than its team's.");
  }
  if (!team) checkUserModels(ctx, userId, Array.isArray(body.models) ? (body.models as string[]) : []);
  return { userId, team };
}

/** A non-admin's personal key lists only models its user may use (`models` of the user; none: any). */
function checkUserModels(ctx: AdminCtx, userId: string | null, models: readonly string[]): void {
  const userModels = (userId !== null ? ctx.identity.users.get(userId)?.models : undefined) ?? [];
  const outside = modelsOutside(ctx, models, { level: "user", models: userModels, accessGroupIds: [] });
  if (outside.length > 0) throw badRequest(`Model not in your allowed models: ${outside.join(", ")}.`, "models");
}

/**
 * `/key/generate` (and, with `serviceAccount`, `/key/service-account/generate`): validates the
 * body, checks who may create the key, inserts it, and returns the creation response, the only
 * place the plaintext `key` ever appears.
 */
function throughputOf(fields: Record<string, unknown>): Pick<KeyRow, "rpmLimit" | "tpmLimit" | "rpmLimitType" | "tpmLimitType"> {
  const f = fields as Partial<KeyRow>;
  return { rpmLimit: f.rpmLimit ?? null, tpmLimit: f.tpmLimit ?? null, rpmLimitType: f.rpmLimitType ?? null, tpmLimitType: f.tpmLimitType ?? null };
}

/** A guaranteed limit must fit in what the key's models can serve (and its team's limit), or the write is a 400. */
function checkGuaranteed(ctx: AdminCtx, key: PlannedKey, keys: Iterable<KeyRow> = ctx.identity.keys.values()): void {
  if (!isGuaranteed(key)) return;
  const problem = guaranteedOverflow(key, ctx.snapshot, keys, ctx.identity);
  if (problem) throw badRequest(problem, key.rpmLimitType === "guaranteed_throughput" ? "rpm_limit" : "tpm_limit");
}

/** The advisory lock that guaranteed-throughput writes take in turn (any number no other lock uses). */
const GUARANTEED_LOCK = 7_301_940_221;

/**
 * `checkGuaranteed` again inside the transaction that writes the key, against the guaranteed keys
 * stored, under a lock every such write takes: each of two keys written at the same moment fits
 * beside the keys the cache knows, and together they would reserve more than the capacity (the
 * cache learns of the other only after it is written).
 */
async function checkGuaranteedStored(tx: Exec, ctx: AdminCtx, key: PlannedKey): Promise<void> {
  if (!isGuaranteed(key)) return;
  await tx.execute(sql`select pg_advisory_xact_lock(${GUARANTEED_LOCK})`);
  const guaranteed = or(eq(virtualKeys.rpmLimitType, "guaranteed_throughput"), eq(virtualKeys.tpmLimitType, "guaranteed_throughput"));
  checkGuaranteed(ctx, key, await tx.select().from(virtualKeys).where(and(isNull(virtualKeys.deletedAt), guaranteed)));
}

/**
 * What a key write holds in its transaction (holds.ts), as generate, update and regenerate all
 * must: the user, team, organization and budget object `fields` newly names (`row`: the key as it
 * is, for an update), and, for guaranteed limits, the model capacity (checked again under its
 * lock). Returns the key's user when this write created it.
 */
async function holdKeyWrite(tx: Exec, ctx: AdminCtx, fields: Record<string, unknown>, planned: PlannedKey, row?: KeyRow): Promise<UserRow | undefined> {
  const userId = fields.userId !== row?.userId ? fields.userId : undefined;
  if (typeof userId === "string") refuseMasterUserId(userId, "user_id");
  // The caller's team rights (a team admin's, a member's routes) are the store's, not the cache's;
  // the user it names held first, in the order every write takes them (holds.ts holdWrite).
  await holdWrite(tx, ctx.caller, { userIds: [typeof userId === "string" ? userId : undefined], refs: namedAnew(fields, row) });
  // A non-admin's new key in a team, or a key it gives to another user, is for a member of the team
  // (authorizeGenerate, updateFields: checked against the cache). That membership is held, so a
  // /team/member_delete at the same moment deletes the key with it, or came first and this is the
  // 403 it gives after: no live team key of someone who is not a member, from a non-admin.
  const teamId = ("teamId" in fields ? fields.teamId : row?.teamId) as string | null | undefined;
  const member = (row === undefined ? fields.userId : userId) as string | null | undefined;
  if (!ctx.caller.isAdmin && typeof teamId === "string" && typeof member === "string" && !(await holdMembership(tx, teamId, member))) {
    throw forbidden(`User ${member} is not a member of team ${teamId} (removed meanwhile): only a proxy admin may put a key of someone else in it.`);
  }
  const createdUser = typeof userId === "string" ? await holdUser(tx, userId, ctx.caller.changedBy) : undefined;
  if (!ctx.caller.isAdmin && typeof userId === "string" && !createdUser) await refuseElevatedUser(tx, userId);
  await checkGuaranteedStored(tx, ctx, planned);
  return createdUser;
}

/** Global roles a key takes from its user that a team's admin (or any non-admin) does not have. */
const ELEVATED_ROLES: ReadonlySet<string> = new Set<Role>(["proxy_admin", "proxy_admin_viewer"]);

/**
 * A key acts with its user's global role, so a non-admin that gave a key to a proxy admin (a user
 * it had added to its team, say) would hold a proxy admin's key: 403. The user is held by now, so
 * a role given at the same moment comes before this read or after the key.
 */
async function refuseElevatedUser(tx: Exec, userId: string, what = "give a key to"): Promise<void> {
  const role = (await holdExistingUser(tx, userId))?.userRole;
  if (role && ELEVATED_ROLES.has(role)) throw forbidden(`Only a proxy admin may ${what} user ${userId}: the key would act with its role ${role}.`);
}

/** After a key write naming `userId`: the user created (audited), and the user change to publish when the cache lacks it. */
async function userWritten(ctx: AdminCtx, userId: unknown, created: UserRow | undefined): Promise<IdentityChange[]> {
  if (created) await auditCreatedUser(ctx, created);
  return typeof userId === "string" && (created || !ctx.identity.users.has(userId)) ? [{ kind: "user", userId }] : [];
}

export async function generateKey(ctx: AdminCtx, body: Record<string, unknown>, opts: { serviceAccount?: boolean } = {}): Promise<Record<string, unknown>> {
  const asked = check(GenerateKeySchema, body) as KeyBody;
  const serviceAccount = opts.serviceAccount === true;
  const { userId, team } = authorizeGenerate(ctx, asked, serviceAccount);
  // A member's key in a team with `team_member_key_duration` lasts that long unless the body says otherwise.
  // An explicit null is "not set", as for every field on generate (clients that send every field).
  const memberDuration = team && !serviceAccount && asked.duration == null ? team.memberSettings.team_member_key_duration : undefined;
  const input: KeyBody = typeof memberDuration === "string" ? { ...asked, duration: memberDuration } : asked;
  const now = Date.now();
  const fields = keyFieldsOf(input);
  const models = (fields.models as string[] | null | undefined) ?? [];
  checkTeamModels(ctx, { models, accessGroupIds: [], aliases: {}, organizationId: null, ...fields }, team);
  checkTeamRoutes((fields.allowedPassthroughRoutes as string[] | null | undefined) ?? [], team);
  checkReferences(ctx, fields);
  const plaintext = typeof input.key === "string" ? input.key : newKeyValue();
  const token = typeof input.key === "string" ? await assertNewKeyValue(ctx, input.key, "key") : hashKey(plaintext);
  const alias = typeof input.key_alias === "string" ? input.key_alias : undefined;
  await assertAliasFree(ctx.db, alias);

  const accessGroupIds = (fields.accessGroupIds as string[] | null | undefined) ?? [];
  const organizationId = (fields.organizationId as string | null | undefined) ?? null;
  const aliases = (fields.aliases as KeyRow["aliases"] | null | undefined) ?? {};
  const planned: PlannedKey = { token, models, accessGroupIds, aliases, teamId: team?.teamId ?? null, userId, organizationId, ...throughputOf(fields) };
  checkGuaranteed(ctx, planned);
  const merged = { autoRotate: false, rotationInterval: null, ...fields } as Partial<KeyRow>;
  derivedTimes(ctx, fields, merged, input, now);
  withProjectId(fields, input, false);
  let serviceAccountId: string | null = null;
  if (serviceAccount) {
    serviceAccountId = alias ?? `sa-${randomUUID()}`;
    fields.metadata = { ...((fields.metadata as Record<string, unknown> | undefined) ?? {}), service_account_id: serviceAccountId };
  }
  const expires = expiresOf(input, now) ?? null;

  let row: KeyRow | undefined;
  let createdUser: UserRow | undefined;
  try {
    [row, createdUser] = await ctx.db.transaction(async (tx) => {
      const createdUser = await holdKeyWrite(tx, ctx, { ...fields, userId, teamId: team?.teamId }, planned);
      await releaseEarlierToken(tx, token);
      const [row] = await tx
        .insert(virtualKeys)
        .values({
          ...fields,
          token,
          firstToken: await firstTokenOfNewKey(tx, token),
          keyName: keyName(plaintext),
          userId,
          teamId: team?.teamId ?? null,
          serviceAccountId,
          expires,
          createdBy: ctx.caller.changedBy,
          updatedBy: ctx.caller.changedBy,
        } as typeof virtualKeys.$inferInsert)
        .returning();
      return [row, createdUser] as const;
    });
  } catch (err) {
    if (isUniqueViolation(err)) throw alias ? aliasTaken(alias) : badRequest("This key already exists.", "key");
    throw err;
  }
  if (!row) throw GatewayError.of(500, "The key was not stored.", "internal_server_error");
  await ctx.changed(...(await userWritten(ctx, userId, createdUser)), { kind: "key", token });
  const created = toApi(row);
  await ctx.audit({ action: "created", table: TABLE, objectId: token, after: created });
  return { ...created, key: plaintext, token_id: token, duration: input.duration ?? null };
}

/**
 * Key fields that cap what a key may spend, how fast, how long it lives and which routes it may
 * call, with its spend and blocked state: an admin's to set. A key's owner (or a team `user` member
 * the team lets update keys) changing them lifts what a proxy or team admin set: a blocked key
 * unblocked, a `budget_duration` of 1s that gives spend back every second, a `temp_budget_increase`
 * that doubles as a new budget (LiteLLM PR #23781 for max_budget, issue #37052 and PR #39993 for
 * the rest). A change that tightens one is refused too: who set a cap is not recorded.
 */
const ADMIN_SET_FIELDS = [
  ...LIMIT_COLUMNS,
  "blocked",
  "temp_budget_increase",
  "temp_budget_expiry",
  "budget_id",
  "tpm_limit_type",
  "rpm_limit_type",
  "duration",
  "key_type",
  "allowed_routes",
  "allowed_passthrough_routes",
] as const;

/** Money columns of a key, compared as amounts: the store gives back `1.000000000000` for a body's 1. */
const KEY_MONEY = new Set(["spend", "maxBudget", "softBudget", "tempBudgetIncrease"]);

const rowProp = (field: string) => field.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

/**
 * The ADMIN_SET_FIELDS an update (`fields`: its row values; `expires`: what its `duration` gives)
 * changes on key `row`. A value equal to the stored one changes nothing, so a client that sends the
 * key back as it read it is not refused; a `duration` always changes the expiry (it counts from now).
 */
function adminSetChanges(row: KeyRow, fields: Record<string, unknown>, expires: Date | null | undefined): string[] {
  const stored = row as Record<string, unknown>;
  return ADMIN_SET_FIELDS.filter((field) => {
    if (field === "duration") return expires !== undefined && expires?.getTime() !== row.expires?.getTime();
    const prop = rowProp(field);
    if (!(prop in fields)) return false;
    const [asked, was] = [fields[prop], stored[prop]];
    if (KEY_MONEY.has(prop) && asked != null && was != null) return usdToPico(String(asked)) !== columnToPico(was as string);
    return !Bun.deepEquals(asked, was);
  });
}

/**
 * The row values an update sets, after the ownership rules: only proxy admins reassign users or
 * organizations; a team admin may move a key between teams they administer and give it to a
 * member; the key's caps (ADMIN_SET_FIELDS) belong to proxy admins and the admins of its team.
 */
async function updateFields(ctx: AdminCtx, row: KeyRow, body: KeyBody): Promise<Record<string, unknown>> {
  const fields = fieldsToUpdate(ctx, row, body);
  if ("keyAlias" in fields) await assertAliasFree(ctx.db, fields.keyAlias as string | null, row.token);
  return fields;
}

/**
 * The fields an update (`body`, whose fields on key `row` were `fields`) sets, checked again on the
 * key as it is now, held (`current`): another write may have changed what the checks read.
 * KeyChanged when it changed what the update was let through and held on.
 */
function fieldsAgain(ctx: AdminCtx, row: KeyRow, fields: Record<string, unknown>, current: KeyRow, body: KeyBody): Record<string, unknown> {
  const again = fieldsToUpdate(ctx, current, body);
  if (decidedOn(current, { ...current, ...(again as Partial<KeyRow>) }) !== decidedOn(row, { ...row, ...(fields as Partial<KeyRow>) })) throw new KeyChanged();
  return again;
}

/**
 * updateFields but the alias check (a read outside the write's transaction; the unique index
 * refuses an alias taken meanwhile): run again in the transaction, on the key row it holds.
 */
function fieldsToUpdate(ctx: AdminCtx, row: KeyRow, body: KeyBody): Record<string, unknown> {
  const caller = ctx.caller;
  const now = Date.now();
  const fields = keyFieldsOf(body);
  const teamChanged = "teamId" in fields && fields.teamId !== row.teamId;
  const userChanged = "userId" in fields && fields.userId !== row.userId;
  const teamId = teamChanged ? (fields.teamId as string | null) : row.teamId;
  if (!caller.isAdmin) {
    // Leaving a team would shed the team's model and budget limits: only its admin may let a key go.
    if (teamChanged && row.teamId !== null && !caller.isTeamAdmin(row.teamId)) throw forbidden(`Only an admin of team ${row.teamId} may move a key out of it.`);
    // A key of no team acts as its user everywhere: only the key's own user makes one, through a key of no team itself.
    if (teamChanged && teamId === null && !(row.userId === caller.userId && caller.actsAsUserIn(null))) {
      throw forbidden("Only a proxy admin may take another user's key out of its team: it would be that user's personal key (a key issued in a team cannot make one).");
    }
    if (teamChanged && teamId && !caller.isTeamAdmin(teamId)) throw forbidden(`You may not move a key to team ${teamId}: you are not its admin.`);
    if (userChanged) {
      const to = fields.userId as string | null;
      const teamAdmin = teamId !== null && caller.isTeamAdmin(teamId) && (row.teamId === null || caller.isTeamAdmin(row.teamId));
      if (!teamAdmin || (to !== null && !ctx.identity.teamMembers.get(teamId)?.has(to))) {
        throw forbidden("Only a proxy admin may give a key to another user (a team admin: to a member of the key's team).");
      }
    }
    if ("organizationId" in fields && fields.organizationId !== row.organizationId) throw forbidden("Only a proxy admin may change a key's organization.");
    const capsChanged = adminSetChanges(row, fields, expiresOf(body, now));
    if (capsChanged.length > 0 && !caller.isTeamAdmin(row.teamId)) {
      throw forbidden(
        `Only a proxy admin or an admin of the key's team may change ${capsChanged.join(", ")}: these cap what the key may spend, how fast, for how long and where (its owner may change its other fields).`,
      );
    }
  }
  const team = teamId ? (teamChanged ? teamOrFail(ctx, teamId) : ctx.identity.teams.get(teamId)) : undefined;
  if (teamChanged || "models" in fields || "accessGroupIds" in fields) checkTeamModels(ctx, { ...row, ...fields }, team);
  // As /key/generate refuses them (authorizeGenerate): a personal key's models are its user's.
  if (!caller.isAdmin && teamId === null && (teamChanged || "models" in fields)) checkUserModels(ctx, row.userId, (fields.models as string[] | undefined) ?? row.models);
  if (teamChanged || "allowedPassthroughRoutes" in fields) checkTeamRoutes((fields.allowedPassthroughRoutes as string[] | null | undefined) ?? row.allowedPassthroughRoutes, team);
  checkReferences(ctx, {
    organizationId: fields.organizationId !== row.organizationId ? fields.organizationId : undefined,
    budgetId: fields.budgetId !== row.budgetId ? fields.budgetId : undefined,
    // Ids the key already had may name groups deleted since (they grant nothing): only new ones must exist.
    accessGroupIds: Array.isArray(fields.accessGroupIds) ? (fields.accessGroupIds as string[]).filter((id) => !row.accessGroupIds.includes(id)) : undefined,
  });
  derivedTimes(ctx, fields, { ...row, ...fields } as Partial<KeyRow>, withoutUnchangedDuration(body, row.budgetDuration), now);
  withProjectId(fields, body, true);
  const expires = expiresOf(body, now);
  if (expires !== undefined) fields.expires = expires;
  Object.assign(fields, handSetSpend(fields));
  fields.updatedBy = caller.changedBy;
  fields.updatedAt = new Date(now);
  // A user it names anew is held, or created, by the write itself (holdKeyWrite).
  return fields;
}

async function updateKey(ctx: AdminCtx, row: KeyRow, body: KeyBody): Promise<KeyRow> {
  if ("spend" in body) await ctx.flushSpend();
  const fields = await updateFields(ctx, row, body);
  const planned = { ...row, ...(fields as Partial<KeyRow>) };
  checkGuaranteed(ctx, planned);
  let before = row;
  let updated: KeyRow | undefined;
  let createdUser: UserRow | undefined;
  try {
    [before, updated, createdUser] = await ctx.db.transaction(async (tx) => {
      const createdUser = await holdKeyWrite(tx, ctx, fields, planned, row);
      const current = await holdKey(tx, row.token);
      if (!current) return [row, undefined, createdUser] as const;
      const [updated] = await tx.update(virtualKeys).set(fieldsAgain(ctx, row, fields, current, body)).where(live(row.token)).returning();
      return [current, updated, createdUser] as const;
    });
  } catch (err) {
    if (isUniqueViolation(err)) throw aliasTaken(String(fields.keyAlias));
    throw err;
  }
  if (!updated) throw notFound("Key not found: it was deleted meanwhile.", "key");
  await ctx.changed(...(await userWritten(ctx, updated.userId !== row.userId ? updated.userId : undefined, createdUser)), { kind: "key", token: row.token });
  if ("spend" in fields) await ctx.forgetBudgets([counterId("key", keyCounterToken(row))]);
  await ctx.audit({ action: "updated", table: TABLE, objectId: row.token, before: toApi(before), after: toApi(updated) });
  return updated;
}

/** A JSON body that may be absent (path-form routes): absent means `{}`. */
async function optionalBody<S extends TSchema>(ctx: AdminCtx, schema: S): Promise<S["static"]> {
  const text = await ctx.request.clone().text();
  if (text.trim() === "") return check(schema, {});
  return ctx.body(schema);
}

/** The `{key}` segment of `/key/{key}/<action>`. */
function pathKey(ctx: AdminCtx): string {
  const parts = ctx.url.pathname.split("/");
  return decodeURIComponent(parts[2] ?? "");
}

async function blockKey(ctx: AdminCtx, blocked: boolean): Promise<Record<string, unknown>> {
  const { key } = await ctx.body(KeyOnly);
  ctx.caller.requireWriter();
  const row = await keyInReach(ctx, key, blocked ? "/key/block" : "/key/unblock");
  // A blocked key reserves nothing: unblocking a guaranteed key claims its share again, which must still fit.
  if (!blocked) checkGuaranteed(ctx, row);
  const [updated] = await ctx.db.transaction(async (tx) => {
    await holdWrite(tx, ctx.caller);
    if (!blocked) await checkGuaranteedStored(tx, ctx, row);
    return tx.update(virtualKeys).set({ blocked, updatedBy: ctx.caller.changedBy, updatedAt: new Date() }).where(live(row.token)).returning();
  });
  if (!updated) throw notFound("Key not found: it was deleted meanwhile.", "key");
  await ctx.changed({ kind: "key", token: row.token });
  await ctx.audit({ action: blocked ? "blocked" : "unblocked", table: TABLE, objectId: row.token, before: toApi(row), after: toApi(updated) });
  return toApi(updated);
}

function graceMs(input: string | null | undefined): number {
  const text = input ?? process.env.SVC_KEY_ROTATION_GRACE_PERIOD;
  if (!text) return 0;
  return periodMs(text, input ? "grace_period" : "SVC_KEY_ROTATION_GRACE_PERIOD", true);
}

/** `/key/regenerate` and `/key/{key}/regenerate`: same row, new token; the response carries the new plaintext once. */
async function regenerateKey(ctx: AdminCtx, keyFromPath: string | undefined): Promise<Record<string, unknown>> {
  const input = (await optionalBody(ctx, RegenerateKeySchema)) as KeyBody;
  ctx.caller.requireWriter();
  const named = keyFromPath ?? (typeof input.key === "string" ? input.key : undefined);
  if (!named) throw badRequest("key is required: the key to regenerate, plain or hashed.", "key");
  // The master key lives in the environment or config.yaml, where only its operator can change it
  // (stored credentials are encrypted with a key derived from it). new_master_key is for the
  // master key only: beside any other key it is ignored, as the spec scopes it.
  const master = ctx.snapshot.settings.masterKey;
  if (master && tokenOf(named) === hashKey(master)) {
    throw badRequest("The master key is not rotated through this endpoint: set SVC_MASTER_KEY to the new value and restart or reload.", typeof input.new_master_key === "string" ? "new_master_key" : "key");
  }
  delete input.new_master_key;
  return writeKeyInReach(ctx, named, ["/key/regenerate", "/key/{key_id}/regenerate"], (row) => regenerate(ctx, row, input));
}

async function regenerate(ctx: AdminCtx, row: KeyRow, input: KeyBody): Promise<Record<string, unknown>> {
  const { key: _k, new_key: _n, new_master_key: _m, grace_period: _g, ...changesOnly } = input;
  if ("spend" in changesOnly) await ctx.flushSpend();
  const fields = await updateFields(ctx, row, changesOnly);
  // The changes it carries are an update's: checked, and held in the write, as /key/update does.
  const planned = { ...row, ...(fields as Partial<KeyRow>) };
  checkGuaranteed(ctx, planned);
  const plaintext = typeof input.new_key === "string" ? input.new_key : newKeyValue();
  const newToken = typeof input.new_key === "string" ? await assertNewKeyValue(ctx, input.new_key, "new_key") : hashKey(plaintext);
  const grace = graceMs(input.grace_period as string | null | undefined);
  let done: Awaited<ReturnType<typeof rotateKey>>;
  let createdUser: UserRow | undefined;
  const hold = async (tx: Exec) => {
    createdUser = await holdKeyWrite(tx, ctx, fields, planned, row);
    // The new plaintext acts with its user's role, as a new key would: a team admin rotating a
    // proxy admin's team key would hold a proxy admin's key (a new owner is checked above).
    if (!ctx.caller.isAdmin && typeof row.userId === "string" && planned.userId === row.userId) await refuseElevatedUser(tx, row.userId, "regenerate a key of");
  };
  try {
    const set = (current: KeyRow) => fieldsAgain(ctx, row, fields, current, changesOnly);
    done = await rotateKey(ctx.db, { oldToken: row.token, newToken, newKeyName: keyName(plaintext), graceMs: grace, set, hold });
  } catch (err) {
    if (isUniqueViolation(err)) throw badRequest("The key alias or new key value is already in use.", "new_key");
    throw err;
  }
  if (!done) throw notFound("Key not found: it was deleted or rotated meanwhile.", "key");
  await ctx.changed(...(await userWritten(ctx, done.row.userId !== row.userId ? done.row.userId : undefined, createdUser)), ...done.changes);
  // The rotated key's counters go on (records.ts keyCounterToken): a spend set with it restarts them.
  if ("spend" in fields) await ctx.forgetBudgets([counterId("key", keyCounterToken(done.row))]);
  const after = toApi(done.row);
  // `_hash`: a field named `…_token` is redacted from the audit trail as a secret, which a key's hash is not.
  await ctx.audit({ action: "rotated", table: TABLE, objectId: newToken, before: toApi(row), after: { ...after, previous_token_hash: row.token, grace_period_ms: grace } });
  return { ...after, key: plaintext, token_id: newToken };
}

async function deleteKeys(ctx: AdminCtx): Promise<{ deleted_keys: string[] }> {
  const input = await ctx.body(DeleteSchema);
  ctx.caller.requireWriter();
  const named = [...(input.keys ?? []), ...(typeof input.key === "string" ? [input.key] : [])];
  const aliases = input.key_aliases ?? [];
  if (named.length === 0 && aliases.length === 0) throw badRequest("Name the keys to delete in keys (plain or hashed) or key_aliases.", "keys");
  // Every key is checked before any is deleted: one refusal deletes nothing.
  const rows = new Map<string, KeyRow>();
  for (const k of named) {
    const row = await keyInReach(ctx, k, "/key/delete");
    rows.set(row.token, row);
  }
  for (const alias of aliases) {
    const [row] = await ctx.db
      .select()
      .from(virtualKeys)
      .where(and(eq(virtualKeys.keyAlias, alias), isNull(virtualKeys.deletedAt)));
    if (row && mayActOn(ctx.caller, row, "/key/delete")) rows.set(row.token, row);
    else if (!row && ctx.caller.isAdmin) throw notFound(`No live key has the alias "${alias}".`, "key_aliases");
    else throw forbidden(`You may not delete the key with alias "${alias}": it is neither yours nor a key of a team you administer.`);
  }
  const tokens = [...rows.keys()];
  const now = new Date();
  const changes: IdentityChange[] = tokens.map((token) => ({ kind: "key", token }));
  await ctx.db.transaction(async (tx) => {
    await holdWrite(tx, ctx.caller);
    // Locked in token order first, as the spend writer locks the keys it charges (spend/flush.ts
    // LOCK_ORDER): in the order the update met them, a deletion of several keys and a spend batch
    // charging them each held a key the other waited for, and PostgreSQL failed one (a 500 here).
    await tx.select({ token: virtualKeys.token }).from(virtualKeys).where(inArray(virtualKeys.token, tokens)).orderBy(virtualKeys.token).for("no key update");
    const deleted = await tx
      .update(virtualKeys)
      .set({ deletedAt: now, deletedBy: ctx.caller.changedBy, updatedAt: now, updatedBy: ctx.caller.changedBy })
      .where(and(inArray(virtualKeys.token, tokens), isNull(virtualKeys.deletedAt)))
      .returning({ token: virtualKeys.token });
    // A key another call deleted, or rotated to a new token, since it was read: answered as if
    // that call had come first (a 404, nothing deleted), not a 200 that deleted nothing.
    if (deleted.length < tokens.length) throw notFound("Key not found: it was deleted or rotated meanwhile; nothing was deleted.", "keys");
    // Old hashes of a rotated key still in their grace period die with it.
    const dropped = await tx.delete(rotatedKeys).where(inArray(rotatedKeys.activeToken, tokens)).returning({ token: rotatedKeys.token });
    for (const d of dropped) changes.push({ kind: "rotated_key", token: d.token });
  });
  await ctx.changed(...changes);
  for (const row of rows.values()) {
    await ctx.audit({ action: "deleted", table: TABLE, objectId: row.token, before: toApi(row), after: { deleted_at: now.toISOString(), deleted_by: ctx.caller.changedBy } });
  }
  return { deleted_keys: [...named.map(safeId), ...aliases] };
}

async function resetSpend(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const input = await optionalBody(ctx, ResetSpendSchema);
  ctx.caller.requireWriter();
  await ctx.flushSpend();
  const asked = writtenNumber(input, "reset_to") ?? input.reset_to ?? 0;
  if (decimalsOf(asked) > PICO_DIGITS) throw badRequest(`reset_to has more than ${PICO_DIGITS} decimals (${asked}): amounts are kept to ${PICO_DIGITS} decimals.`, "reset_to");
  const to = usdToPico(asked);
  return writeKeyInReach(ctx, pathKey(ctx), "/key/{key_id}/reset_spend", (row) => resetKeySpend(ctx, row, to));
}

/** Key `row`'s spend set to `to`, which must not exceed the spend it has when the write holds it. */
async function resetKeySpend(ctx: AdminCtx, row: KeyRow, to: Pico): Promise<Record<string, unknown>> {
  const [previous, updated] = await ctx.db.transaction(async (tx) => {
    await holdWrite(tx, ctx.caller);
    const current = await heldKey(tx, row);
    if (!current) return [0n, undefined] as const;
    // The spend as it is now, held: read before the transaction, two resets at once were each
    // checked against the spend the other was resetting. Compared exactly: as doubles, amounts
    // from $8,192 up that differ in their last decimals compare equal.
    const previous = columnToPico(current.spend);
    if (to > previous) throw badRequest(`reset_to (${picoToText(to)}) must be between 0 and the current spend (${picoToText(previous)}).`, "reset_to");
    const spend = { spend: picoToText(to) };
    const [updated] = await tx.update(virtualKeys).set({ ...spend, ...handSetSpend(spend), updatedBy: ctx.caller.changedBy, updatedAt: new Date() }).where(live(row.token)).returning();
    return [previous, updated] as const;
  });
  if (!updated) throw notFound("Key not found: it was deleted meanwhile.", "key");
  await ctx.changed({ kind: "key", token: row.token });
  await ctx.forgetBudgets([counterId("key", keyCounterToken(row))]);
  await ctx.audit({ action: "spend_reset", table: TABLE, objectId: row.token, before: { spend: exactUsdJson(previous) }, after: { spend: exactUsdJson(to) } });
  const out = toApi(updated);
  return { key_hash: row.token, spend: out.spend, previous_spend: exactUsdJson(previous), max_budget: out.max_budget ?? null, budget_reset_at: out.budget_reset_at ?? null };
}

async function bulkUpdate(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireAdmin();
  const { keys } = await ctx.body(BulkUpdateSchema);
  if (keys.length === 0) throw badRequest("keys is empty: list at least one {key, …} to update.", "keys");
  if (keys.length > BULK_MAX) throw badRequest(`At most ${BULK_MAX} keys per bulk update; got ${keys.length}.`, "keys");
  const successful: Record<string, unknown>[] = [];
  const failed: { key_info: Record<string, unknown>; failed_reason: string }[] = [];
  for (const item of keys) {
    try {
      successful.push(toApi(await writeKeyInReach(ctx, item.key, "/key/update", (row) => updateKey(ctx, row, item as KeyBody))));
    } catch (err) {
      const reason = err instanceof GatewayError ? err.message : "internal error (logged)";
      if (!(err instanceof GatewayError)) ctx.log.error("bulk key update item failed", storeErrorCause(err));
      failed.push({ key_info: { ...item, key: safeId(item.key) }, failed_reason: reason });
    }
  }
  return { total_requested: keys.length, successful_updates: successful, failed_updates: failed };
}

const SORTABLE = {
  created_at: virtualKeys.createdAt,
  updated_at: virtualKeys.updatedAt,
  spend: virtualKeys.spend,
  max_budget: virtualKeys.maxBudget,
  user_id: virtualKeys.userId,
  team_id: virtualKeys.teamId,
  organization_id: virtualKeys.organizationId,
  key_alias: virtualKeys.keyAlias,
  key_name: virtualKeys.keyName,
  expires: virtualKeys.expires,
  last_active: virtualKeys.lastActive,
  rotation_count: virtualKeys.rotationCount,
  token: virtualKeys.token,
} as const;

function sortOf(ctx: AdminCtx): SQL[] {
  const column = SORTABLE[choice(ctx.query, "sort_by", Object.keys(SORTABLE) as (keyof typeof SORTABLE)[], "created_at")];
  const order = choice((name) => ctx.query(name)?.toLowerCase(), "sort_order", ["asc", "desc"] as const, "desc");
  return [(order === "asc" ? asc : desc)(column), asc(virtualKeys.token)];
}

/**
 * Which keys a caller who cannot read everything may list: their own (or, for a key without a
 * user, itself); with `include_team_keys` also those of teams they may list keys of; with
 * `include_created_by_keys` those they created. Asking for another user's or team's keys outside
 * that reach is a 403.
 */
function visibility(ctx: AdminCtx, teamFilter: string | undefined, userFilter: string | undefined, include: { teamKeys: boolean; createdKeys: boolean }): SQL {
  const caller = ctx.caller;
  const listTeams = [...(caller.userId ? (ctx.identity.userTeams.get(caller.userId)?.keys() ?? []) : [])].filter((t) => caller.mayOnTeam(t, "/key/list"));
  if (teamFilter && !listTeams.includes(teamFilter)) throw forbidden(`You may not list the keys of team ${teamFilter}: you are not its admin.`);
  const teams = teamFilter ? [teamFilter] : include.teamKeys ? listTeams : [];
  if (userFilter && userFilter !== caller.userId && teams.length === 0) throw forbidden("You may only list your own keys (and, as a team admin, your teams' keys).");
  // A key issued in a team speaks for its user in that team only.
  const scoped = (mine: SQL) => (caller.teamScope === undefined ? mine : and(mine, eq(virtualKeys.teamId, caller.teamScope))!);
  const own = caller.userId ? scoped(eq(virtualKeys.userId, caller.userId)) : eq(virtualKeys.token, caller.keyHash);
  const reach: SQL[] = [own];
  if (teams.length > 0) reach.push(inArray(virtualKeys.teamId, teams));
  // The master key's keys are not a user's to list, whoever holds a key named after its user (made before that id was reserved).
  if (include.createdKeys && caller.userId && caller.userId !== MASTER_USER_ID) reach.push(scoped(eq(virtualKeys.createdBy, caller.userId)));
  return or(...reach)!;
}

async function listKeys(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const page = integer(ctx.query, "page", 1, 1, Number.MAX_SAFE_INTEGER);
  const size = integer(ctx.query, "size", 10, 1, 100);
  const status = choice(ctx.query, "status", ["active", "deleted"] as const, "active");
  // Read for every caller, so a bad value is refused whoever sends it (only callers who cannot read everything use them).
  const withTeamKeys = flag(ctx.query, "include_team_keys");
  const withCreatedKeys = flag(ctx.query, "include_created_by_keys");
  const where: SQL[] = [status === "deleted" ? isNotNull(virtualKeys.deletedAt) : isNull(virtualKeys.deletedAt)];
  const exact = { user_id: virtualKeys.userId, team_id: virtualKeys.teamId, organization_id: virtualKeys.organizationId, key_alias: virtualKeys.keyAlias };
  for (const [name, column] of Object.entries(exact)) {
    const v = ctx.query(name);
    if (v) where.push(eq(column, v));
  }
  const keyHash = ctx.query("key_hash");
  if (keyHash) where.push(eq(virtualKeys.token, tokenOf(keyHash)));
  const project = ctx.query("project_id");
  if (project) where.push(sql`${virtualKeys.metadata}->>'project_id' = ${project}`);
  const group = ctx.query("access_group_id");
  if (group) where.push(sql`${group} = any(${virtualKeys.accessGroupIds})`);
  if (!ctx.caller.canReadAll) where.push(visibility(ctx, ctx.query("team_id"), ctx.query("user_id"), { teamKeys: withTeamKeys, createdKeys: withCreatedKeys }));
  const order = sortOf(ctx);
  const expandUser = (ctx.query("expand") ?? "").split(",").includes("user");
  const full = flag(ctx.query, "return_full_object") || expandUser;

  const filter = and(...where);
  const [{ count } = { count: 0 }] = await ctx.db.select({ count: sql<number>`count(*)::int` }).from(virtualKeys).where(filter);
  const rows = await ctx.db
    .select()
    .from(virtualKeys)
    .where(filter)
    .orderBy(...order)
    .limit(size)
    .offset((page - 1) * size);
  let keys: unknown[] = rows.map((r) => (full ? toApi(r) : r.token));
  if (expandUser) {
    const ids = [...new Set(rows.map((r) => r.userId).filter((u): u is string => u !== null))];
    const found = ids.length > 0 ? await ctx.db.select().from(users).where(inArray(users.userId, ids)) : [];
    const byId = new Map(found.map((u) => [u.userId, u]));
    keys = rows.map((r) => {
      const user = r.userId ? byId.get(r.userId) : undefined;
      return { ...toApi(r), user: user ? expandedUser(ctx.caller, user, r.teamId) : null };
    });
  }
  return { keys, total_count: Number(count), current_page: page, total_pages: Math.ceil(Number(count) / size) };
}

/**
 * A key's user in `/key/list?expand=user`: whole to callers who read everything and to the user
 * itself; to a team admin listing its team's keys, as the team sees its members (the user's other
 * teams, role, spend and metadata are not the team's to see, as /user/info of them is a 403).
 */
function expandedUser(caller: Caller, user: UserRow, keyTeamId: string | null): Record<string, unknown> {
  return caller.canReadAll || user.userId === caller.userId ? toApi(user) : memberUserApi(user, keyTeamId);
}

/** LIKE metacharacters in a search term match themselves. */
function likeEscape(s: string): string {
  return s.replace(/[\\%_]/g, (c) => `\\${c}`);
}

async function listAliases(ctx: AdminCtx): Promise<Record<string, unknown>> {
  ctx.caller.requireReadAll();
  const page = integer(ctx.query, "page", 1, 1, Number.MAX_SAFE_INTEGER);
  const size = integer(ctx.query, "size", 50, 1, 100);
  const search = ctx.query("search");
  const where = and(isNull(virtualKeys.deletedAt), isNotNull(virtualKeys.keyAlias), search ? ilike(virtualKeys.keyAlias, `%${likeEscape(search)}%`) : undefined);
  const [{ count } = { count: 0 }] = await ctx.db
    .select({ count: sql<number>`count(distinct ${virtualKeys.keyAlias})::int` })
    .from(virtualKeys)
    .where(where);
  const rows = await ctx.db
    .selectDistinct({ alias: virtualKeys.keyAlias })
    .from(virtualKeys)
    .where(where)
    .orderBy(asc(virtualKeys.keyAlias))
    .limit(size)
    .offset((page - 1) * size);
  return { aliases: rows.map((r) => r.alias), total_count: Number(count), current_page: page, total_pages: Math.ceil(Number(count) / size) };
}

async function keyInfo(ctx: AdminCtx): Promise<Record<string, unknown>> {
  const named = ctx.query("key") ?? (ctx.caller.principal.key ? ctx.caller.keyHash : undefined);
  if (!named) throw badRequest("key is required: the master key is not a stored key, so name the key to inspect (plain or hashed).", "key");
  const row = await keyInReach(ctx, named, "/key/info");
  return { key: row.token, info: toApi(row) };
}

/**
 * Key-level logging: this gateway sends no logs to callbacks a key lists in `metadata.logging`,
 * so a key that lists some is reported unhealthy, with the reason, rather than pretending.
 */
function keyHealth(ctx: AdminCtx): Record<string, unknown> {
  const logging = ctx.caller.principal.key?.metadata?.logging;
  const entries = Array.isArray(logging) ? logging : logging ? [logging] : [];
  if (entries.length === 0) return { key: "healthy", logging_callbacks: { callbacks: [], status: "healthy", details: "The key lists no logging callbacks of its own." } };
  const names = entries.map((e) => (e && typeof e === "object" && "callback_name" in e ? String(e.callback_name) : String(e)));
  return {
    key: "unhealthy",
    logging_callbacks: {
      callbacks: names,
      status: "unhealthy",
      details: "This gateway does not deliver logs to key-level callbacks (metadata.logging); no test log was sent and these callbacks receive nothing. A team can register webhooks instead (POST /team/{team_id}/callback).",
    },
  };
}

export function keyRoutes(deps: AdminDeps) {
  const route = <R>(handler: (ctx: AdminCtx) => Promise<R>) => adminRoute(deps, handler);
  const raw = { parse: "none" } as const;
  return new Elysia()
    .post("/key/generate", route(async (ctx) => generateKey(ctx, await ctx.body(AnyObject))), raw)
    .post("/key/service-account/generate", route(async (ctx) => generateKey(ctx, await ctx.body(AnyObject), { serviceAccount: true })), raw)
    .get("/key/info", route(keyInfo))
    .get("/key/list", route(listKeys))
    .get("/key/aliases", route(listAliases))
    .post(
      "/key/update",
      route(async (ctx) => {
        const body = (await ctx.body(UpdateKeySchema)) as KeyBody & { key: string };
        ctx.caller.requireWriter();
        const updated = await writeKeyInReach(ctx, body.key, "/key/update", (row) => updateKey(ctx, row, body));
        return { ...toApi(updated), key: updated.token };
      }),
      raw,
    )
    .post("/key/bulk_update", route(bulkUpdate), raw)
    .post("/key/delete", route(deleteKeys), raw)
    .post("/key/block", route((ctx) => blockKey(ctx, true)), raw)
    .post("/key/unblock", route((ctx) => blockKey(ctx, false)), raw)
    .post("/key/regenerate", route((ctx) => regenerateKey(ctx, undefined)), raw)
    .post("/key/:key/regenerate", route((ctx) => regenerateKey(ctx, pathKey(ctx))), raw)
    .post("/key/:key/reset_spend", route(resetSpend), raw)
    .post("/key/health", route(async (ctx) => keyHealth(ctx)), raw);
}
