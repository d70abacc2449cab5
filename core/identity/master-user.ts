/**
 * The master key's user id. LiteLLM names the master key's user `default_user_id`, and so does the
 * gateway: keys the master key creates record it as `created_by`, its calls are logged with it.
 * No user may have it, or whoever held a key of that user would speak as the master key (its key
 * list's `include_created_by_keys` named every key the master key had created, in every team).
 */
import { badRequest } from "../authz.ts";

export const MASTER_USER_ID = "default_user_id";

/** A 400 naming `param` when `userId` is the master key's: no user, member or key owner may be it. */
export function refuseMasterUserId(userId: string | null | undefined, param: string): void {
  if (userId === MASTER_USER_ID) throw badRequest(`user_id ${MASTER_USER_ID} is reserved: it is the master key's identity, and no user may have it.`, param);
}
