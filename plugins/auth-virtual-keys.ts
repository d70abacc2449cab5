/**
 * Virtual keys (`sk-…`): the sha256 of the presented key is looked up in the in-process identity
 * cache; blocked, expired and blocked-team/org keys are refused with 401. The resulting principal
 * (with its access rules) is cached per key until a change touches the key, its team, its org or
 * its user.
 */
import { createHash } from "node:crypto";
import { Type } from "@sinclair/typebox";
import {
  type Denied,
  definePlugin,
  type Hooks,
  type IdentityView,
  type KeyRow,
  type OrgRow,
  type Principal,
  type Role,
  type TeamRow,
} from "../core/contract.ts";
import { accessAliases, keyAccessLevels, keyTypeRoutes } from "../core/access.ts";
import { errorInfo } from "../core/errors.ts";

/**
 * sha256 hex of a presented key, on every request: Bun's one-shot hasher is several times cheaper
 * than building a node:crypto Hash object each time (same digest; node:crypto elsewhere).
 */
const sha256Hex: (text: string) => string =
  typeof Bun !== "undefined" ? (text) => Bun.SHA256.hash(text, "hex") as string : (text) => createHash("sha256").update(text).digest("hex");

const ROLES = new Set<Role>(["proxy_admin", "proxy_admin_viewer", "internal_user", "internal_user_viewer"]);

function deny(message: string, type = "authentication_error"): Denied {
  return { ok: false, error: errorInfo(401, message, type) };
}

/** A cached answer for one key and the records it was built from (what invalidates it). */
interface Cached {
  result: Principal | Denied;
  teamId: string | null;
  orgIds: readonly string[];
  userId: string | null;
}

function cachedFor(identity: IdentityView, key: KeyRow): Cached {
  const team = key.teamId ? identity.teams.get(key.teamId) : undefined;
  const orgIds = [...new Set([key.organizationId, team?.organizationId].filter((id): id is string => !!id))];
  return { result: principalOf(identity, key, team, orgIds), teamId: key.teamId, orgIds, userId: key.userId };
}

function principalOf(identity: IdentityView, key: KeyRow, team: TeamRow | undefined, orgIds: readonly string[]): Principal | Denied {
  if (key.blocked) return deny("Authentication Error: this key is blocked. A proxy admin can unblock it with /key/unblock.");
  if (key.teamId && !team) return deny(`Authentication Error: the key's team ${key.teamId} no longer exists.`);
  if (team?.blocked) return deny(`Authentication Error: team ${team.teamId} is blocked. A proxy admin can unblock it with /team/unblock.`);
  // The key's own org and its team's org both bind it (they normally agree).
  const orgs: OrgRow[] = [];
  for (const id of orgIds) {
    const org = identity.orgs.get(id);
    if (!org) return deny(`Authentication Error: the key's organization ${id} no longer exists.`);
    if (org.blocked) return deny(`Authentication Error: organization ${id} is blocked. A proxy admin can unblock it with /organization/update.`);
    orgs.push(org);
  }
  const user = key.userId ? identity.users.get(key.userId) : undefined;
  const role = user && ROLES.has(user.userRole as Role) ? (user.userRole as Role) : "internal_user";

  // A personal key (no team) is bound by its user's models; a team key by its team's.
  const levels = keyAccessLevels(key, team, user, orgs);
  return {
    keyHash: key.token,
    role,
    keyAlias: key.keyAlias ?? undefined,
    userId: key.userId ?? undefined,
    teamId: key.teamId ?? undefined,
    orgId: orgIds[0],
    metadata: key.metadata,
    access: {
      levels,
      ...accessAliases(key, team, orgs),
      allowedRoutes: key.allowedRoutes,
      keyTypeRoutes: keyTypeRoutes(key.keyType),
      // The key's own; its team's binds it too (authorizePassThrough).
      allowedPassthroughRoutes: key.allowedPassthroughRoutes,
    },
    key,
    team,
    org: orgs[0],
    user,
  };
}

export default definePlugin({
  name: "auth-virtual-keys",
  config: Type.Object({}),
  setup(_cfg, ctx): Hooks {
    const identity = ctx.identity;
    if (!identity) return {};
    const cache = new Map<string, Cached>();
    const drop = (stale: (c: Cached) => boolean) => {
      for (const [token, c] of cache) if (stale(c)) cache.delete(token);
    };
    const unsubscribe = identity.onChange((change) => {
      switch (change.kind) {
        case "key":
          cache.delete(change.token);
          break;
        case "team":
          drop((c) => c.teamId === change.teamId);
          break;
        case "org":
          drop((c) => c.orgIds.includes(change.orgId));
          break;
        case "user":
          drop((c) => c.userId === change.userId);
          break;
        case "all":
          cache.clear();
          break;
        // Memberships, budgets, access groups (resolved at check time), rotated keys and stored
        // models are not part of a principal.
      }
    });
    return {
      auth: {
        resolve({ credential }) {
          if (!credential?.startsWith("sk-")) return null;
          const token = sha256Hex(credential);
          const key = identity.lookupKey(token);
          if (!key) return null;
          if (key.expires && key.expires.getTime() <= Date.now()) {
            return deny(`Authentication Error: expired key. Key expiry time ${key.expires.toISOString()}, current time ${new Date().toISOString()}.`, "expired_key");
          }
          let cached = cache.get(key.token);
          if (!cached) {
            cached = cachedFor(identity, key);
            cache.set(key.token, cached);
          }
          if ("ok" in cached.result) return cached.result;
          identity.touch(key.token);
          return cached.result;
        },
      },
      dispose: unsubscribe,
    };
  },
});
