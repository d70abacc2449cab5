/**
 * The audit row of a user a management call creates along the way: a member a team or an
 * organization admits who did not exist, the user a key names. One shape for all of them (the user
 * as the API shows it, with its teams), so no route that creates a user leaves it out of the trail.
 */
import { userApi } from "../../identity/members.ts";
import type { UserRow } from "../../identity/records.ts";
import type { AdminCtx } from "./context.ts";

export async function auditCreatedUser(ctx: AdminCtx, user: UserRow, teamIds: readonly string[] = []): Promise<void> {
  await ctx.audit({ action: "created", table: "users", objectId: user.userId, after: userApi(user, teamIds) });
}
