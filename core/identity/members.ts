/**
 * Users and team memberships as the user and team management routes share them: finding a user
 * by id or e-mail (creating one when a team admits someone new), the members of teams with their
 * roles, and the API shapes of team and user rows.
 */
import { randomUUID } from "node:crypto";
import { Value } from "@sinclair/typebox/value";
import { and, eq, inArray, sql } from "drizzle-orm";
import { badRequest } from "../authz.ts";
import { Amount, Quantity } from "./fields.ts";
import { holdExistingUser, lockEmail } from "./holds.ts";
import { refuseMasterUserId } from "./master-user.ts";
import type { Db } from "../store/db.ts";
import { teamMembers, users } from "../store/schema.ts";
import type { TeamMemberRow, TeamRow, UserRow } from "./records.ts";
import { fromApi, toApi } from "./serialize.ts";
import { shownCallbackSettings } from "./team-callbacks.ts";

/** The database or a transaction on it: every helper here works inside either. */
export type Exec = Db | Parameters<Parameters<Db["transaction"]>[0]>[0];

export interface MemberRef {
  user_id?: string | null;
  user_email?: string | null;
}

export interface MemberWithRole {
  user_id: string;
  user_email: string | null;
  role: string;
}

/** E-mail addresses match whatever their case: `Ann@x.org` and `ann@x.org` are one user. */
export async function findUserByEmail(db: Exec, email: string): Promise<UserRow | undefined> {
  const [row] = await db
    .select()
    .from(users)
    .where(sql`lower(${users.userEmail}) = lower(${email})`)
    .limit(1);
  return row;
}

/** A member named by a new id with an address another user has: one address, one user, so the entry is refused, not given to that user. */
export function addressTaken(email: string, ownerId: string, namedId: string) {
  return badRequest(`user_email ${email} belongs to user ${ownerId}, not ${namedId}.`, "user_email");
}

export async function findUser(db: Exec, ref: MemberRef): Promise<UserRow | undefined> {
  if (ref.user_id) {
    const [row] = await db.select().from(users).where(eq(users.userId, ref.user_id));
    return row;
  }
  return ref.user_email ? findUserByEmail(db, ref.user_email) : undefined;
}


/**
 * The user a member reference names, created (role `internal_user`, nothing else) when missing:
 * admitting someone to a team must never mint a more privileged user.
 */
export async function ensureUser(db: Exec, ref: MemberRef, by: string): Promise<{ user: UserRow; created: boolean }> {
  const param = ref.user_id ? "user_id" : "user_email";
  refuseMasterUserId(ref.user_id, param);
  if (ref.user_email) await lockEmail(db, ref.user_email);
  const found = await findUser(db, ref);
  // A row of that id made before it was reserved, found by its address.
  refuseMasterUserId(found?.userId, param);
  // Held until the membership is stored: a /user/delete at the same moment (which locks its users
  // first) then either ends the membership with the user or came first, and the user is created
  // again below, as for anyone the team admits who does not exist.
  const held = found && (await holdExistingUser(db, found.userId));
  if (held) return { user: held, created: false };
  if (ref.user_id && ref.user_email) {
    // The id is new but the address may already belong to someone else: one address, one user.
    const other = await findUserByEmail(db, ref.user_email);
    if (other) throw addressTaken(ref.user_email, other.userId, ref.user_id);
  }
  const [user] = await db
    .insert(users)
    .values({ userId: ref.user_id ?? randomUUID(), userEmail: ref.user_email ?? null, userRole: "internal_user", createdBy: by, updatedBy: by })
    .onConflictDoNothing()
    .returning();
  if (user) return { user, created: true };
  // Not inserted: a concurrent call (admitting the same member elsewhere) created the user meanwhile; hold that one, as holds.ts holdUser does.
  const created = await findUser(db, ref);
  const again = created && (await holdExistingUser(db, created.userId));
  if (!again) throw badRequest(`User ${ref.user_id ?? ref.user_email} was created and deleted by other requests at the same moment; nothing was changed.`, ref.user_id ? "user_id" : "user_email");
  return { user: again, created: false };
}

/**
 * Members of each team with their role and e-mail, in the order they joined: of the teams named, or
 * of every team (`"all"`, without a parameter per team: a statement takes at most 65,535).
 */
export async function membersByTeam(db: Exec, teamIds: readonly string[] | "all"): Promise<Map<string, MemberWithRole[]>> {
  const every = teamIds === "all";
  const out = new Map<string, MemberWithRole[]>(every ? [] : teamIds.map((id) => [id, []]));
  if (!every && teamIds.length === 0) return out;
  const rows = await db
    .select({ teamId: teamMembers.teamId, userId: teamMembers.userId, role: teamMembers.role, userEmail: users.userEmail })
    .from(teamMembers)
    .leftJoin(users, eq(users.userId, teamMembers.userId))
    .where(every ? undefined : inArray(teamMembers.teamId, [...teamIds]))
    .orderBy(teamMembers.createdAt, teamMembers.userId);
  for (const r of rows) {
    if (every && !out.has(r.teamId)) out.set(r.teamId, []);
    out.get(r.teamId)?.push({ user_id: r.userId, user_email: r.userEmail ?? null, role: r.role });
  }
  return out;
}

const MEMBER_BUDGET = new Set(["max_budget_in_team"]);

/** A body's `max_budget_in_team` as it wrote it (null: cleared), checked as every amount is: a 400 past the column's decimals. */
export function memberBudgetIn(body: object): string | null | undefined {
  return fromApi(teamMembers, body as Record<string, unknown>, MEMBER_BUDGET).maxBudgetInTeam as string | null | undefined;
}

/**
 * The membership row a team admits `userId` with: the `max_budget_in_team` the call gives, else the
 * team's member defaults (`member_settings`: budget, rpm and tpm). Every route that admits a member
 * builds it here: /user/new built its own without them, so creating a user with `teams` sidestepped
 * the team's per-member caps.
 */
export function newMembership(
  team: Pick<TeamRow, "teamId" | "memberSettings">,
  userId: string,
  role: "admin" | "user",
  maxBudgetInTeam: string | null | undefined,
): typeof teamMembers.$inferInsert {
  const settings = team.memberSettings;
  // A default stored before member_settings was checked (a fraction, a negative, a string) is not
  // applied: written to the membership's columns it failed every admission as a 500.
  const given = (value: unknown, schema: typeof Amount | typeof Quantity) => (Value.Check(schema, value) ? (value as number) : null);
  const budget = given(settings.team_member_budget, Amount);
  return {
    teamId: team.teamId,
    userId,
    role,
    maxBudgetInTeam: maxBudgetInTeam ?? (budget === null ? null : String(budget)),
    tpmLimit: given(settings.team_member_tpm_limit, Quantity),
    rpmLimit: given(settings.team_member_rpm_limit, Quantity),
  };
}

export async function membership(db: Exec, teamId: string, userId: string): Promise<TeamMemberRow | undefined> {
  const [row] = await db
    .select()
    .from(teamMembers)
    .where(and(eq(teamMembers.teamId, teamId), eq(teamMembers.userId, userId)));
  return row;
}

/** The teams each user belongs to, in the order it joined them. */
export async function teamIdsOf(db: Exec, userIds: readonly string[]): Promise<Map<string, string[]>> {
  const out = new Map<string, string[]>(userIds.map((id) => [id, []]));
  if (userIds.length === 0) return out;
  const rows = await db
    .select({ userId: teamMembers.userId, teamId: teamMembers.teamId })
    .from(teamMembers)
    .where(inArray(teamMembers.userId, [...userIds]))
    .orderBy(teamMembers.createdAt, teamMembers.teamId);
  for (const r of rows) out.get(r.userId)?.push(r.teamId);
  return out;
}

/** Member defaults a team keeps in `member_settings`, also shown at the top level as LiteLLM does. */
export const MEMBER_SETTING_FIELDS = [
  "team_member_budget",
  "team_member_budget_duration",
  "team_member_rpm_limit",
  "team_member_tpm_limit",
  "team_member_key_duration",
] as const;

/**
 * A team as the API returns it: the row, its member defaults, its members as `members` and
 * `members_with_roles` (callback secrets redacted; webhook addresses only by their origin unless
 * `wholeCallbacks`).
 */
export function teamApi(row: TeamRow, members: readonly MemberWithRole[], wholeCallbacks = true): Record<string, unknown> {
  const out = toApi(row);
  const settings = row.memberSettings;
  for (const f of MEMBER_SETTING_FIELDS) out[f] = settings[f] ?? null;
  out.callback_settings = shownCallbackSettings(row, wholeCallbacks);
  out.members_with_roles = members;
  // The spec's Team resource names this list `members` (each member with its role); LiteLLM's clients read `members_with_roles`.
  out.members = members;
  return out;
}

export function membershipApi(row: TeamMemberRow): Record<string, unknown> {
  return toApi(row);
}

/** A user as the API returns it, with the ids of the teams it belongs to. */
export function userApi(row: UserRow, teams: readonly string[]): Record<string, unknown> {
  return { ...toApi(row), teams };
}

/**
 * A user as an admin of team `teamId` sees it: its id, its address (the team's members list shows
 * as much) and its membership of that team; nothing of its other teams, its role or its spend.
 * Without a team (another user's personal key the caller created), its id and address alone.
 */
export function memberUserApi(row: UserRow, teamId: string | null): Record<string, unknown> {
  return { user_id: row.userId, user_email: row.userEmail, teams: teamId ? [teamId] : [] };
}
