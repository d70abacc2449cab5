/**
 * Rows a write refers to, held (FOR KEY SHARE) until the write's transaction ends. A deletion that
 * refuses an object still in use (an organization with teams or keys, a budget object with keys,
 * teams or organizations on it) locks it first and checks again in its transaction, and a team's
 * deletion (which deletes its keys) writes the team's row first, so a write putting something on
 * it at the same moment is either seen by the deletion or finds the object gone (a 400), as one
 * after the other; never left referring to a deleted one. The teams and organization a user is
 * put in are held (holdTeams, holdOrg): a team's or organization's deletion ends the memberships
 * and detaches the users it sees. A key's user is held too (holdUser), and so is the user a team
 * or organization admits (holdExistingUser), but a user gone meanwhile is created again rather
 * than refused, as a write naming a user who does not exist creates it. A non-admin's team key for
 * a member holds the membership (holdMembership), which /team/member_delete deletes with its keys.
 * Every management write first takes its locks in one order (holdWrite): teams, its organization and
 * budget object, addresses, users by id, memberships, then what it writes (a key: holdKey).
 *
 * A row held only so that it stays (a team, organization, budget object or membership the write
 * depends on) is held FOR KEY SHARE: that waits for a deletion, and for every management write
 * that changes such a row (each locks it FOR UPDATE first), but not for the spend writer adding a
 * call's cost to its counters (an UPDATE of other columns). Held FOR SHARE, a write by a team's
 * admin waited for the team's spend batch, and the two could each hold a row the other waited for
 * (PostgreSQL then failed one of them: a 500).
 */
import { and, eq, inArray, isNull, sql } from "drizzle-orm";
import { badRequest, type Caller, forbidden, memberMay } from "../authz.ts";
import { budgets, organizations, teamMembers, teams, users, virtualKeys } from "../store/schema.ts";
import type { Exec } from "./members.ts";
import type { KeyRow, TeamRow, UserRow } from "./records.ts";

export const teamGone = (teamId: string) => badRequest(`Team ${teamId} does not exist.`, "team_id");
export const orgGone = (orgId: string) => badRequest(`Organization ${orgId} does not exist.`, "organization_id");
export const budgetGone = (budgetId: string) => badRequest(`Budget ${budgetId} does not exist.`, "budget_id");

const named = (id: unknown): id is string => typeof id === "string" && id !== "";

/**
 * The team, organization and budget object a write puts its object in (those named), held until
 * `tx` ends: the 400 naming one that does not exist, or was deleted meanwhile.
 */
export async function holdReferences(tx: Exec, refs: { teamId?: unknown; organizationId?: unknown; budgetId?: unknown }): Promise<void> {
  if (named(refs.teamId) && !(await holdTeam(tx, refs.teamId))) throw teamGone(refs.teamId);
  if (named(refs.organizationId) && !(await holdOrg(tx, refs.organizationId))) throw orgGone(refs.organizationId);
  if (named(refs.budgetId) && !(await holdBudget(tx, refs.budgetId))) throw budgetGone(refs.budgetId);
}

/** Whether organization `orgId` exists, held until `tx` ends. */
export async function holdOrg(tx: Exec, orgId: string): Promise<boolean> {
  const rows = await tx.select({ id: organizations.organizationId }).from(organizations).where(eq(organizations.organizationId, orgId)).for("key share");
  return rows.length > 0;
}

/** Whether team `teamId` is live, held until `tx` ends. */
export async function holdTeam(tx: Exec, teamId: string): Promise<boolean> {
  const rows = await tx
    .select({ id: teams.teamId })
    .from(teams)
    .where(and(eq(teams.teamId, teamId), isNull(teams.deletedAt)))
    .for("key share");
  return rows.length > 0;
}

/**
 * The 400 for teams a write names that do not exist (or were deleted), whether found before the
 * write's transaction or in it: `Team a does not exist.`, `Teams a, b do not exist.`, in id
 * order; `param` is the field that named the first of them.
 */
export function teamsGone(missing: readonly string[], param: (teamId: string) => string = () => "team_id") {
  const ids = [...new Set(missing)].sort();
  const text = ids.length === 1 ? `Team ${ids[0]} does not exist.` : `Teams ${ids.join(", ")} do not exist.`;
  return badRequest(text, param(ids[0]!));
}

/**
 * Teams `teamIds` (a user's memberships), each held until `tx` ends, in one order (a /team/delete
 * of several teams locks them in that order too, so the two cannot deadlock): the 400 naming
 * those that do not exist, or were deleted meanwhile (teamsGone, `param` as there). Returns them
 * with their member defaults as they are now (a /team/update of them waits for this hold).
 */
export async function holdTeams(tx: Exec, teamIds: readonly string[], param?: (teamId: string) => string): Promise<Pick<TeamRow, "teamId" | "memberSettings">[]> {
  if (teamIds.length === 0) return [];
  const rows = await tx
    .select({ teamId: teams.teamId, memberSettings: teams.memberSettings })
    .from(teams)
    .where(and(inArray(teams.teamId, [...teamIds]), isNull(teams.deletedAt)))
    .orderBy(teams.teamId)
    .for("key share");
  const gone = teamIds.filter((id) => !rows.some((r) => r.teamId === id));
  if (gone.length > 0) throw teamsGone(gone, param);
  return rows;
}

/** Whether budget object `budgetId` exists, held until `tx` ends. */
export async function holdBudget(tx: Exec, budgetId: string): Promise<boolean> {
  const rows = await tx.select({ id: budgets.budgetId }).from(budgets).where(eq(budgets.budgetId, budgetId)).for("key share");
  return rows.length > 0;
}

/**
 * Key `userId`'s user, created (role `internal_user`, nothing else) when missing, and held (FOR
 * UPDATE) until `tx` ends, so a /user/delete at the same moment (which locks its users first)
 * either comes first, and the user is created again here, or comes after and deletes the key with
 * the user. Checked against the cache only, a key written just after the user's deletion lived on
 * with a user that does not exist. Returns the user row when it was created.
 */
export async function holdUser(tx: Exec, userId: string, by: string): Promise<UserRow | undefined> {
  if (await holdExistingUser(tx, userId)) return undefined;
  const [inserted] = await tx.insert(users).values({ userId, userRole: "internal_user", createdBy: by, updatedBy: by }).onConflictDoNothing().returning();
  // Not inserted: a concurrent call created the user meanwhile; hold that one.
  if (!inserted) await holdExistingUser(tx, userId);
  return inserted;
}

/**
 * User `userId` as it is now, held (FOR UPDATE, as holdUser) until `tx` ends, for a write that
 * makes it a member (of a team or an organization); undefined when it is gone, deleted meanwhile
 * included: the write then creates it again, as it does for a member who does not exist.
 */
export async function holdExistingUser(tx: Exec, userId: string): Promise<UserRow | undefined> {
  const [row] = await tx.select().from(users).where(eq(users.userId, userId)).for("update");
  return row;
}

/** Whether user `userId` is a member of team `teamId`, the membership held until `tx` ends (a /team/member_delete deletes it). */
export async function holdMembership(tx: Exec, teamId: string, userId: string): Promise<boolean> {
  const rows = await tx
    .select({ id: teamMembers.userId })
    .from(teamMembers)
    .where(and(eq(teamMembers.teamId, teamId), eq(teamMembers.userId, userId)))
    .for("key share");
  return rows.length > 0;
}

/**
 * Key `token`'s live row, locked (FOR NO KEY UPDATE, as /key/delete and the spend writer lock it)
 * until `tx` ends, after what holdWrite holds: the row a write changing the key checks, as no other
 * write can change it before this one commits. Checked against a copy read before the transaction,
 * two writes at the same moment were each let through against the row the other was changing.
 */
export async function holdKey(tx: Exec, token: string): Promise<KeyRow | undefined> {
  const [row] = await tx
    .select()
    .from(virtualKeys)
    .where(and(eq(virtualKeys.token, token), isNull(virtualKeys.deletedAt)))
    .for("no key update");
  return row;
}

/**
 * Holds an address until the transaction ends, so requests that would each create a user for it
 * at the same moment take turns (the second finds the first's user). Inside a transaction only.
 */
export async function lockEmail(tx: Exec, email: string): Promise<void> {
  await tx.execute(sql`select pg_advisory_xact_lock(hashtextextended(lower(${email}), 0))`);
}

/** What a management write holds besides the caller's team rights (holdWrite). */
export interface WriteHolds {
  /** Users it names (members it admits, a key's user): held FOR UPDATE. */
  userIds?: readonly (string | null | undefined)[];
  /** Addresses it admits members by: their locks (lockEmail), then the users that have them. */
  emails?: readonly (string | null | undefined)[];
  /** A team whose memberships of these users (and the caller's) it changes or ends: held FOR UPDATE. */
  members?: { teamId: string; userIds: readonly string[] };
  /** The team, organization and budget object it puts its object in (holdReferences): the 400 for one that does not exist. */
  refs?: { teamId?: unknown; organizationId?: unknown; budgetId?: unknown };
}

/**
 * What a management write holds first, in the one order every write takes, so that no two of them
 * (nor /user/delete, /team/delete, /team/member_delete) each hold a row the other waits for (a
 * deadlock, which PostgreSQL breaks by failing one: a 500): teams (FOR KEY SHARE, by id, as
 * /team/delete locks them), the organization and budget object it names (FOR KEY SHARE, as
 * holdReferences), then the addresses' locks (sorted), then users (FOR UPDATE, by id, as
 * /user/delete locks them: those named and those with the addresses), then memberships, and only
 * then the rows the write changes (keys, members).
 *
 * And the caller's team rights the identity cache granted during this call (Caller.teamGrants: a
 * team admin's, or a `user` member's routes) are confirmed against the store, the caller's
 * membership held (FOR KEY SHARE) until `tx` ends: a /team/member_update or /team/member_delete
 * demoting or removing the caller at the same moment waits for this write, or came first and this
 * write is refused (403). The cache is updated only after the demotion commits (on other instances
 * a moment later), so checked against it alone, a write racing the demotion was let through.
 */
export async function holdWrite(tx: Exec, caller: Caller, holds: WriteHolds = {}): Promise<void> {
  const self = caller.userId;
  const byMembership = !caller.isAdmin && caller.teamGrants.size > 0 && self !== undefined;
  const refs = holds.refs ?? {};
  const teamIds = [
    ...new Set([...(byMembership ? caller.teamGrants.keys() : []), ...(holds.members ? [holds.members.teamId] : []), ...(named(refs.teamId) ? [refs.teamId] : [])]),
  ].sort();
  const held =
    teamIds.length === 0
      ? []
      : await tx
          .select({ id: teams.teamId, teamMemberPermissions: teams.teamMemberPermissions })
          .from(teams)
          .where(and(inArray(teams.teamId, teamIds), isNull(teams.deletedAt)))
          .orderBy(teams.teamId)
          .for("key share");
  const orgLive = named(refs.organizationId) ? await holdOrg(tx, refs.organizationId) : true;
  const budgetLive = named(refs.budgetId) ? await holdBudget(tx, refs.budgetId) : true;
  const emails = [...new Set((holds.emails ?? []).filter(named).map((e) => e.toLowerCase()))].sort();
  for (const email of emails) await lockEmail(tx, email);
  const withEmails = emails.length > 0 ? await tx.select({ id: users.userId }).from(users).where(inArray(sql`lower(${users.userEmail})`, emails)) : [];
  // Not the caller's own user: its memberships (below) are what a removal or a /user/delete takes
  // from it, and its user row is one the spend writer updates with every call of its keys.
  const userIds = [...new Set([...(holds.userIds ?? []).filter(named), ...withEmails.map((u) => u.id)])];
  if (userIds.length > 0) await tx.select({ id: users.userId }).from(users).where(inArray(users.userId, userIds)).orderBy(users.userId).for("update");
  if (holds.members) {
    const memberIds = [...new Set([...holds.members.userIds, ...(self === undefined ? [] : [self])])];
    await tx
      .select({ id: teamMembers.userId })
      .from(teamMembers)
      .where(and(eq(teamMembers.teamId, holds.members.teamId), inArray(teamMembers.userId, memberIds)))
      .orderBy(teamMembers.userId)
      .for("update");
  }
  if (byMembership) await confirmRights(tx, caller, self, held);
  if (named(refs.teamId) && !held.some((t) => t.id === refs.teamId)) throw teamGone(refs.teamId);
  if (named(refs.organizationId) && !orgLive) throw orgGone(refs.organizationId);
  if (named(refs.budgetId) && !budgetLive) throw budgetGone(refs.budgetId);
}

/**
 * The caller's team rights (Caller.teamGrants) as the store has them, its memberships held (FOR KEY
 * SHARE: a /team/member_update or /team/member_delete locks them FOR UPDATE, so it waits; the spend
 * writer's counter updates do not): the 403 when one changed.
 */
async function confirmRights(tx: Exec, caller: Caller, self: string, held: readonly { id: string; teamMemberPermissions: string[] }[]): Promise<void> {
  const grantedIds = [...caller.teamGrants.keys()].sort();
  const roles = await tx
    .select({ teamId: teamMembers.teamId, role: teamMembers.role })
    .from(teamMembers)
    .where(and(inArray(teamMembers.teamId, grantedIds), eq(teamMembers.userId, self)))
    .orderBy(teamMembers.teamId)
    .for("key share");
  for (const id of grantedIds) {
    const grant = caller.teamGrants.get(id)!;
    const team = held.find((t) => t.id === id);
    const role = roles.find((r) => r.teamId === id)?.role;
    if (team && role === "admin") continue;
    if (team && role === "user" && !grant.admin && !caller.isViewer && [...grant.routes].every((r) => memberMay(team, r))) continue;
    throw forbidden(
      grant.admin
        ? `Only a proxy admin or an admin of team ${id} may do this: your role in the team changed meanwhile, and nothing was changed.`
        : `Your role in team ${id} no longer allows this: it changed meanwhile, and nothing was changed.`,
    );
  }
}
