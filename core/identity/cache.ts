/**
 * The in-process mirror of the identity tables: the request path reads only this (no database
 * round trip). Filled at start; every admin write reloads the rows it touched, here at once and
 * on other instances through the change bus.
 */
import { and, eq, isNull } from "drizzle-orm";
import type { IdentityView } from "../contract.ts";
import type { Db } from "../store/db.ts";
import { accessGroups, budgets, orgMembers, organizations, rotatedKeys, teamMembers, teams, users, virtualKeys } from "../store/schema.ts";
import { type AccessGroupRow, type BudgetRow, type IdentityChange, type KeyRow, keyCounterToken, type OrgRow, type RotatedKeyRow, type TeamMemberRow, type TeamRole, type TeamRow, type UserRow, teamMemberId } from "./records.ts";

export class IdentityCache implements IdentityView {
  readonly keys = new Map<string, KeyRow>();
  /** Live keys by what their counters are named by (keyCounterToken). */
  private readonly keysByCounter = new Map<string, KeyRow>();
  readonly rotated = new Map<string, RotatedKeyRow>();
  readonly teams = new Map<string, TeamRow>();
  readonly orgs = new Map<string, OrgRow>();
  readonly users = new Map<string, UserRow>();
  readonly budgets = new Map<string, BudgetRow>();
  readonly accessGroups = new Map<string, AccessGroupRow>();
  /** accessGroupName → row (the hot path looks groups up by name). */
  private readonly accessGroupNames = new Map<string, AccessGroupRow>();
  /** teamId → userId → role */
  readonly teamMembers = new Map<string, Map<string, TeamRole>>();
  /** teamMemberId → membership row (budget and limits inside the team). */
  private readonly memberRows = new Map<string, TeamMemberRow>();
  /** userId → teamId → role */
  readonly userTeams = new Map<string, Map<string, TeamRole>>();
  /** orgId → userId → role */
  readonly orgMembers = new Map<string, Map<string, string>>();
  /** userId → orgId → role */
  readonly userOrgs = new Map<string, Map<string, string>>();
  /** Keys used since the last `last_active` write (written in batches off the request path). */
  readonly touched = new Set<string>();
  private readonly listeners = new Set<(c: IdentityChange) => void>();
  /**
   * Changes are applied one at a time: two reloads of the same row racing could otherwise land
   * out of order (the older read last), and a full reload could overwrite a newer single-row one.
   */
  private queue: Promise<void> = Promise.resolve();

  constructor(private readonly db: Db) {}

  async loadAll(): Promise<void> {
    const [k, r, t, o, u, b, g, tm, om] = await Promise.all([
      this.db.select().from(virtualKeys).where(isNull(virtualKeys.deletedAt)),
      this.db.select().from(rotatedKeys),
      this.db.select().from(teams).where(isNull(teams.deletedAt)),
      this.db.select().from(organizations),
      this.db.select().from(users),
      this.db.select().from(budgets),
      this.db.select().from(accessGroups),
      this.db.select().from(teamMembers),
      this.db.select().from(orgMembers),
    ]);
    this.clear();
    for (const row of k) this.setKey(row);
    for (const row of r) this.rotated.set(row.token, row);
    for (const row of t) this.teams.set(row.teamId, row);
    for (const row of o) this.orgs.set(row.organizationId, row);
    for (const row of u) this.users.set(row.userId, row);
    for (const row of b) this.budgets.set(row.budgetId, row);
    for (const row of g) this.setAccessGroup(row);
    for (const row of tm) this.setTeamMember(row);
    for (const row of om) this.setOrgMember(row.organizationId, row.userId, row.userRole);
  }

  private clear(): void {
    for (const m of [this.keys, this.keysByCounter, this.rotated, this.teams, this.orgs, this.users, this.budgets, this.accessGroups, this.accessGroupNames, this.teamMembers, this.memberRows, this.userTeams, this.orgMembers, this.userOrgs]) m.clear();
  }

  private setKey(row: KeyRow): void {
    this.keys.set(row.token, row);
    this.keysByCounter.set(keyCounterToken(row), row);
  }

  private deleteKey(token: string): void {
    const old = this.keys.get(token);
    this.keys.delete(token);
    // A rotated key's row is under its new token already (the new token's change comes first): kept.
    if (old && this.keysByCounter.get(keyCounterToken(old)) === old) this.keysByCounter.delete(keyCounterToken(old));
  }

  /** The live key whose budget and rate-limit counters go by this (keyCounterToken), whatever token it has now. */
  keyByCounterToken(counterToken: string): KeyRow | undefined {
    return this.keysByCounter.get(counterToken);
  }

  private setAccessGroup(row: AccessGroupRow): void {
    const old = this.accessGroups.get(row.accessGroupId);
    if (old) this.accessGroupNames.delete(old.accessGroupName);
    this.accessGroups.set(row.accessGroupId, row);
    this.accessGroupNames.set(row.accessGroupName, row);
  }

  private deleteAccessGroup(id: string): void {
    const old = this.accessGroups.get(id);
    if (old) this.accessGroupNames.delete(old.accessGroupName);
    this.accessGroups.delete(id);
  }

  private setTeamMember(row: TeamMemberRow): void {
    const { teamId, userId } = row;
    const role = row.role as TeamRole;
    this.memberRows.set(teamMemberId(teamId, userId), row);
    if (!this.teamMembers.has(teamId)) this.teamMembers.set(teamId, new Map());
    if (!this.userTeams.has(userId)) this.userTeams.set(userId, new Map());
    this.teamMembers.get(teamId)!.set(userId, role);
    this.userTeams.get(userId)!.set(teamId, role);
  }

  private setOrgMember(orgId: string, userId: string, role: string): void {
    if (!this.orgMembers.has(orgId)) this.orgMembers.set(orgId, new Map());
    if (!this.userOrgs.has(userId)) this.userOrgs.set(userId, new Map());
    this.orgMembers.get(orgId)!.set(userId, role);
    this.userOrgs.get(userId)!.set(orgId, role);
  }

  teamMember(teamId: string, userId: string): TeamMemberRow | undefined {
    return this.memberRows.get(teamMemberId(teamId, userId));
  }

  touch(token: string): void {
    this.touched.add(token);
  }

  onChange(listener: (c: IdentityChange) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Reloads what a change touched from the store (queued behind earlier changes). */
  apply(change: IdentityChange): Promise<void> {
    const run = this.queue.then(() => this.reload(change));
    this.queue = run.catch(() => undefined);
    return run;
  }

  /** Resolves once every change queued so far has been applied. */
  settled(): Promise<void> {
    return this.queue;
  }

  /** Reloads every identity row (queued like `apply`), without notifying listeners. */
  refresh(): Promise<void> {
    const run = this.queue.then(() => this.loadAll());
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async reload(change: IdentityChange): Promise<void> {
    const db = this.db;
    switch (change.kind) {
      case "all":
        await this.loadAll();
        break;
      case "key": {
        const [row] = await db.select().from(virtualKeys).where(and(eq(virtualKeys.token, change.token), isNull(virtualKeys.deletedAt)));
        if (row) this.setKey(row);
        else this.deleteKey(change.token);
        break;
      }
      case "rotated_key": {
        const [row] = await db.select().from(rotatedKeys).where(eq(rotatedKeys.token, change.token));
        if (row) this.rotated.set(row.token, row);
        else this.rotated.delete(change.token);
        break;
      }
      case "team": {
        const [row] = await db.select().from(teams).where(and(eq(teams.teamId, change.teamId), isNull(teams.deletedAt)));
        if (row) this.teams.set(row.teamId, row);
        else this.teams.delete(change.teamId);
        break;
      }
      case "org": {
        const [row] = await db.select().from(organizations).where(eq(organizations.organizationId, change.orgId));
        if (row) this.orgs.set(row.organizationId, row);
        else this.orgs.delete(change.orgId);
        break;
      }
      case "user": {
        const [row] = await db.select().from(users).where(eq(users.userId, change.userId));
        if (row) this.users.set(row.userId, row);
        else this.users.delete(change.userId);
        break;
      }
      case "budget": {
        const [row] = await db.select().from(budgets).where(eq(budgets.budgetId, change.budgetId));
        if (row) this.budgets.set(row.budgetId, row);
        else this.budgets.delete(change.budgetId);
        break;
      }
      case "access_group": {
        const [row] = await db.select().from(accessGroups).where(eq(accessGroups.accessGroupId, change.accessGroupId));
        if (row) this.setAccessGroup(row);
        else this.deleteAccessGroup(change.accessGroupId);
        break;
      }
      case "team_members": {
        const rows = await db.select().from(teamMembers).where(eq(teamMembers.teamId, change.teamId));
        for (const userId of this.teamMembers.get(change.teamId)?.keys() ?? []) {
          this.userTeams.get(userId)?.delete(change.teamId);
          this.memberRows.delete(teamMemberId(change.teamId, userId));
        }
        this.teamMembers.delete(change.teamId);
        for (const row of rows) this.setTeamMember(row);
        break;
      }
      case "org_members": {
        const rows = await db.select().from(orgMembers).where(eq(orgMembers.organizationId, change.orgId));
        for (const userId of this.orgMembers.get(change.orgId)?.keys() ?? []) this.userOrgs.get(userId)?.delete(change.orgId);
        this.orgMembers.delete(change.orgId);
        for (const row of rows) this.setOrgMember(row.organizationId, row.userId, row.userRole);
        break;
      }
      case "models":
      case "spend_reset":
        break;
    }
    for (const l of this.listeners) l(change);
  }

  /** The live key row for a token, following a rotated key to its successor while its grace lasts. */
  lookupKey(token: string, now = Date.now()): KeyRow | undefined {
    const key = this.keys.get(token);
    if (key) return key;
    const old = this.rotated.get(token);
    if (old && old.revokeAt.getTime() > now) return this.keys.get(old.activeToken);
    return undefined;
  }

  accessGroupByName(name: string): AccessGroupRow | undefined {
    return this.accessGroupNames.get(name);
  }
}
