/**
 * Who may do what on the management API (the spec's two levels). The master key and
 * `proxy_admin` users act on everything; `proxy_admin_viewer` reads everything; a key whose user
 * is an `admin` member of a team (a Team Management Key) manages that team's objects only; a
 * `user` member only what the team's `team_member_permissions` allow. Ownership is checked on
 * every object; an object outside the caller's reach is a 403 whether or not it exists.
 */
import type { Principal } from "./contract.ts";
import { GatewayError } from "./errors.ts";
import type { IdentityCache } from "./identity/cache.ts";
import type { TeamRole } from "./identity/records.ts";

/** Routes a `user`-role team member may call when the team sets no permissions. */
export const DEFAULT_TEAM_MEMBER_PERMISSIONS = ["/key/info", "/key/health"] as const;

/** Routes a team may grant its `user` members. */
export const TEAM_MEMBER_PERMISSION_CHOICES = [
  "/key/generate",
  "/key/update",
  "/key/delete",
  "/key/info",
  "/key/health",
  "/key/list",
  "/key/regenerate",
  "/key/{key_id}/regenerate",
  "/key/block",
  "/key/unblock",
  "/key/{key_id}/reset_spend",
] as const;

/**
 * What the cache let a caller do on a team by its membership: act as the team's admin, or call
 * these routes (as an admin, or as a `user` member the team lets). A write confirms it against the
 * store in its own transaction (identity/holds.ts holdWrite).
 */
export interface TeamGrant {
  admin: boolean;
  routes: Set<string>;
}

export class Caller {
  /** Team rights granted from the cache during this call, by team id (proxy admins get none: their role is not a membership). */
  readonly teamGrants = new Map<string, TeamGrant>();

  constructor(
    readonly principal: Principal,
    private readonly identity: IdentityCache | undefined,
    /** Who acted, for the audit trail: the `svc-changed-by` header, else the caller's user or key. */
    readonly changedBy: string,
  ) {}

  get isMaster(): boolean {
    return this.principal.key === undefined && this.principal.role === "proxy_admin";
  }
  get isAdmin(): boolean {
    return this.principal.role === "proxy_admin";
  }
  get canReadAll(): boolean {
    return this.isAdmin || this.principal.role === "proxy_admin_viewer";
  }
  get isViewer(): boolean {
    return this.principal.role === "proxy_admin_viewer" || this.principal.role === "internal_user_viewer";
  }
  get userId(): string | undefined {
    return this.principal.userId;
  }
  get keyHash(): string {
    return this.principal.keyHash;
  }

  /**
   * The team a key issued inside a team speaks for. It acts as its user in that team only, even
   * when its user also belongs to others or has keys and rights of its own: a Team Management Key
   * administers its own team and nothing else. Its user's global role (proxy admin, viewer) stays.
   */
  get teamScope(): string | undefined {
    return this.principal.key?.teamId ?? undefined;
  }

  /**
   * Whether the caller acts as its user on an object of team `teamId` (null: the user's own, such
   * as a personal key): only inside its key's team, when it has one. Else a team admin that gave a
   * member a key held that member's rights everywhere (its personal keys, its other teams, its user).
   */
  actsAsUserIn(teamId: string | null): boolean {
    return this.userId !== undefined && (this.teamScope === undefined || this.teamScope === teamId);
  }

  /** The caller's role in a team (see teamScope). */
  teamRole(teamId: string | null | undefined): TeamRole | undefined {
    if (!teamId || !this.userId || !this.actsAsUserIn(teamId)) return undefined;
    return this.identity?.teamMembers.get(teamId)?.get(this.userId);
  }

  /** The caller's role in an organization: none through a key issued in a team (see teamScope). */
  orgRole(orgId: string): string | undefined {
    if (!this.userId || this.teamScope !== undefined) return undefined;
    return this.identity?.orgMembers.get(orgId)?.get(this.userId);
  }

  /** Organizations this caller administers (`org_admin`). */
  adminOrgs(): string[] {
    if (!this.userId) return [];
    return [...(this.identity?.userOrgs.get(this.userId)?.keys() ?? [])].filter((o) => this.orgRole(o) === "org_admin");
  }

  /** Teams this caller administers. */
  adminTeams(): string[] {
    if (!this.userId) return [];
    return [...(this.identity?.userTeams.get(this.userId) ?? [])].filter(([t, r]) => r === "admin" && this.teamRole(t) === "admin").map(([t]) => t);
  }

  /** May read team `teamId`'s logging callbacks whole (their webhook addresses): who may read `GET /team/{id}/callback`. */
  maySeeCallbacks(teamId: string): boolean {
    return this.canReadAll || this.teamRole(teamId) === "admin";
  }

  isTeamAdmin(teamId: string | null | undefined): boolean {
    if (this.isAdmin) return true;
    if (this.teamRole(teamId) !== "admin") return false;
    this.grant(teamId!).admin = true;
    return true;
  }

  /** May call `route` on objects of `teamId`: proxy admin, team admin, or a member the team lets. */
  mayOnTeam(teamId: string | null | undefined, route: string): boolean {
    if (this.isAdmin) return true;
    const role = this.teamRole(teamId);
    if (role === undefined || (role === "user" && (this.isViewer || !memberMay(teamId ? this.identity?.teams.get(teamId) : undefined, route)))) return false;
    this.grant(teamId!).routes.add(route);
    return true;
  }

  private grant(teamId: string): TeamGrant {
    const g = this.teamGrants.get(teamId) ?? { admin: false, routes: new Set<string>() };
    this.teamGrants.set(teamId, g);
    return g;
  }

  requireAdmin(): void {
    if (!this.isAdmin) throw forbidden("Only a proxy admin may call this endpoint.");
  }

  requireReadAll(): void {
    if (!this.canReadAll) throw forbidden("Only a proxy admin (or admin viewer) may call this endpoint.");
  }

  /** Writes: never for viewers. */
  requireWriter(): void {
    if (this.isViewer) throw forbidden("This key has a read-only role.");
  }
}

/** Whether a team's `user` members may call `route` (its `team_member_permissions`, else the defaults). */
export function memberMay(team: { teamMemberPermissions: readonly string[] } | undefined, route: string): boolean {
  const allowed: readonly string[] = team && team.teamMemberPermissions.length > 0 ? team.teamMemberPermissions : DEFAULT_TEAM_MEMBER_PERMISSIONS;
  return allowed.includes(route);
}

export function forbidden(message: string): GatewayError {
  return GatewayError.of(403, message, "permission_error");
}

export function notFound(message: string, param?: string): GatewayError {
  return GatewayError.of(404, message, "not_found_error", param ?? null);
}

export function badRequest(message: string, param?: string): GatewayError {
  return GatewayError.of(400, message, "invalid_request_error", param ?? null);
}

/** A required query parameter left out: a validation failure, 422 like every other (the spec's Conventions). */
export function missingQuery(param: string, hint = ""): GatewayError {
  return GatewayError.of(422, `Invalid request: ${param}: query parameter is required${hint}`, "validation_error", param);
}
