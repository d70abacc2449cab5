/**
 * Identity and access: virtual keys, users, teams, organizations, their memberships, budget
 * objects and access groups. One column per first-class spec field (LiteLLM hides many of them in
 * `metadata`; we do not). Money is `numeric` (exact), never float.
 */
import { sql } from "drizzle-orm";
import { bigint, boolean, index, integer, jsonb, numeric, pgTable, primaryKey, text, timestamp, uniqueIndex } from "drizzle-orm/pg-core";

const money = (name: string) => numeric(name, { precision: 30, scale: 12 });
const ts = (name: string) => timestamp(name, { withTimezone: true, mode: "date" });
const textArray = (name: string) => text(name).array().notNull().default(sql`'{}'::text[]`);
const json = (name: string) => jsonb(name).$type<Record<string, unknown>>();

/** Columns every budgeted, rate-limited entity carries. */
const limits = () => ({
  spend: money("spend").notNull().default("0"),
  maxBudget: money("max_budget"),
  softBudget: money("soft_budget"),
  budgetDuration: text("budget_duration"),
  budgetResetAt: ts("budget_reset_at"),
  modelMaxBudget: json("model_max_budget"),
  tpmLimit: bigint("tpm_limit", { mode: "number" }),
  rpmLimit: bigint("rpm_limit", { mode: "number" }),
  maxParallelRequests: integer("max_parallel_requests"),
  modelTpmLimit: jsonb("model_tpm_limit").$type<Record<string, number>>(),
  modelRpmLimit: jsonb("model_rpm_limit").$type<Record<string, number>>(),
});

/**
 * When the row's spend was last set by hand (/key/update, /key/{key}/reset_spend, /team/update,
 * /user/update, /global/spend/reset). The spend writer adds to it only calls that ended after
 * then (spend/flush.ts): another instance's entries of calls that ended before it are already in
 * the hand-set figure, though they are written after it.
 */
const spendSetAt = () => ({ spendSetAt: ts("spend_set_at") });

const audit = () => ({
  createdAt: ts("created_at").notNull().defaultNow(),
  createdBy: text("created_by"),
  updatedAt: ts("updated_at").notNull().defaultNow(),
  updatedBy: text("updated_by"),
});

export const budgets = pgTable("budgets", {
  budgetId: text("budget_id").primaryKey(),
  ...limits(),
  ...audit(),
});

export const organizations = pgTable("organizations", {
  organizationId: text("organization_id").primaryKey(),
  organizationAlias: text("organization_alias"),
  budgetId: text("budget_id"),
  models: textArray("models"),
  ...limits(),
  blocked: boolean("blocked").notNull().default(false),
  metadata: json("metadata").notNull().default({}),
  tags: textArray("tags"),
  modelAliases: json("model_aliases").notNull().default({}),
  objectPermission: json("object_permission"),
  ...audit(),
});

export const users = pgTable(
  "users",
  {
    userId: text("user_id").primaryKey(),
    userEmail: text("user_email"),
    userAlias: text("user_alias"),
    userRole: text("user_role").notNull().default("internal_user"),
    organizationId: text("organization_id"),
    models: textArray("models"),
    ...limits(),
    ...spendSetAt(),
    metadata: json("metadata").notNull().default({}),
    ...audit(),
  },
  (t) => [index("users_email_idx").on(t.userEmail)],
);

export const teams = pgTable(
  "teams",
  {
    teamId: text("team_id").primaryKey(),
    teamAlias: text("team_alias"),
    organizationId: text("organization_id"),
    budgetId: text("budget_id"),
    models: textArray("models"),
    ...limits(),
    ...spendSetAt(),
    blocked: boolean("blocked").notNull().default(false),
    metadata: json("metadata").notNull().default({}),
    tags: textArray("tags"),
    modelAliases: json("model_aliases").notNull().default({}),
    accessGroupIds: textArray("access_group_ids"),
    /** Routes a `user`-role member's key may call on team resources. */
    teamMemberPermissions: textArray("team_member_permissions"),
    objectPermission: json("object_permission"),
    /** Per-team logging callbacks and webhooks. */
    callbackSettings: json("callback_settings"),
    guardrails: textArray("guardrails"),
    policies: textArray("policies"),
    prompts: textArray("prompts"),
    routerSettings: json("router_settings"),
    allowedPassthroughRoutes: textArray("allowed_passthrough_routes"),
    allowedVectorStoreIndexes: jsonb("allowed_vector_store_indexes").$type<unknown[]>(),
    /** Defaults for members: team_member_budget, team_member_rpm_limit, team_member_tpm_limit, team_member_key_duration, … */
    memberSettings: json("member_settings").notNull().default({}),
    deletedAt: ts("deleted_at"),
    deletedBy: text("deleted_by"),
    ...audit(),
  },
  (t) => [index("teams_org_idx").on(t.organizationId)],
);

export const teamMembers = pgTable(
  "team_members",
  {
    teamId: text("team_id").notNull(),
    userId: text("user_id").notNull(),
    role: text("role").notNull().default("user"),
    spend: money("spend").notNull().default("0"),
    ...spendSetAt(),
    maxBudgetInTeam: money("max_budget_in_team"),
    tpmLimit: bigint("tpm_limit", { mode: "number" }),
    rpmLimit: bigint("rpm_limit", { mode: "number" }),
    budgetId: text("budget_id"),
    createdAt: ts("created_at").notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.teamId, t.userId] }), index("team_members_user_idx").on(t.userId)],
);

export const orgMembers = pgTable(
  "org_members",
  {
    organizationId: text("organization_id").notNull(),
    userId: text("user_id").notNull(),
    userRole: text("user_role").notNull().default("internal_user"),
    spend: money("spend").notNull().default("0"),
    maxBudgetInOrganization: money("max_budget_in_organization"),
    budgetId: text("budget_id"),
    createdAt: ts("created_at").notNull().defaultNow(),
    updatedAt: ts("updated_at").notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.organizationId, t.userId] }), index("org_members_user_idx").on(t.userId)],
);

export const virtualKeys = pgTable(
  "virtual_keys",
  {
    /** sha256 hex of the whole `sk-…` key; the plaintext is never stored. */
    token: text("token").primaryKey(),
    keyName: text("key_name").notNull(),
    keyAlias: text("key_alias"),
    keyType: text("key_type").notNull().default("default"),
    userId: text("user_id"),
    teamId: text("team_id"),
    organizationId: text("organization_id"),
    agentId: text("agent_id"),
    budgetId: text("budget_id"),
    serviceAccountId: text("service_account_id"),
    models: textArray("models"),
    tags: textArray("tags"),
    prompts: textArray("prompts"),
    enforcedParams: textArray("enforced_params"),
    ...limits(),
    ...spendSetAt(),
    tpmLimitType: text("tpm_limit_type"),
    rpmLimitType: text("rpm_limit_type"),
    metadata: json("metadata").notNull().default({}),
    allowedCacheControls: textArray("allowed_cache_controls"),
    expires: ts("expires"),
    /** The validity last asked for (`30d`, `-1`); `expires` is the instant it gave. */
    duration: text("duration"),
    permissions: json("permissions").notNull().default({}),
    /** As asked at creation or update; this gateway sends no e-mail (README). */
    sendInviteEmail: boolean("send_invite_email").notNull().default(false),
    guardrails: textArray("guardrails"),
    policies: textArray("policies"),
    disableGlobalGuardrails: boolean("disable_global_guardrails").notNull().default(false),
    blocked: boolean("blocked").notNull().default(false),
    aliases: json("aliases").notNull().default({}),
    config: json("config").notNull().default({}),
    tempBudgetIncrease: money("temp_budget_increase"),
    tempBudgetExpiry: ts("temp_budget_expiry"),
    allowedRoutes: textArray("allowed_routes"),
    allowedPassthroughRoutes: textArray("allowed_passthrough_routes"),
    objectPermission: json("object_permission"),
    autoRotate: boolean("auto_rotate").notNull().default(false),
    rotationInterval: text("rotation_interval"),
    keyRotationAt: ts("key_rotation_at"),
    lastRotationAt: ts("last_rotation_at"),
    rotationCount: integer("rotation_count").notNull().default(0),
    /**
     * The tokens this row had before its latest rotations, newest first (identity/rotation.ts keeps
     * a few; a value another key takes is removed): a spend batch that read an old token before the
     * rotations committed still finds the row by it (spend/flush.ts), where a match on the token
     * alone found nothing once the row had moved, and a match on the one previous token nothing
     * once it had moved twice.
     */
    rotatedFrom: textArray("rotated_from"),
    /**
     * What the key's budget and rate-limit counters are named by once it has been rotated (the
     * token it had first; a rotation keeps it), so that its calls in flight, its spend and its
     * windows carry over to the new token. Null until the first rotation: the counters go by the
     * token (identity/records.ts keyCounterToken). A random id for a key created with a value that
     * an earlier key's counters still go by (a revoked value given out again).
     */
    firstToken: text("first_token"),
    allowedVectorStoreIndexes: jsonb("allowed_vector_store_indexes").$type<unknown[]>(),
    routerSettings: json("router_settings"),
    accessGroupIds: textArray("access_group_ids"),
    lastActive: ts("last_active"),
    deletedAt: ts("deleted_at"),
    deletedBy: text("deleted_by"),
    ...audit(),
  },
  (t) => [
    // Aliases are unique among live keys; a deleted key's alias may be reused.
    uniqueIndex("virtual_keys_alias_live_idx").on(t.keyAlias).where(sql`${t.deletedAt} is null`),
    index("virtual_keys_team_idx").on(t.teamId),
    index("virtual_keys_user_idx").on(t.userId),
    // The budget-period roller looks for keys whose period has ended.
    index("virtual_keys_reset_idx").on(t.budgetResetAt),
    index("virtual_keys_rotated_from_idx").using("gin", t.rotatedFrom),
    uniqueIndex("virtual_keys_first_token_idx").on(t.firstToken),
  ],
);

/** Old hashes of rotated keys that stay valid until `revoke_at` (rotation grace period). */
export const rotatedKeys = pgTable("rotated_keys", {
  token: text("token").primaryKey(),
  activeToken: text("active_token").notNull(),
  revokeAt: ts("revoke_at").notNull(),
  createdAt: ts("created_at").notNull().defaultNow(),
});

export const accessGroups = pgTable("access_groups", {
  accessGroupId: text("access_group_id").primaryKey(),
  accessGroupName: text("access_group_name").notNull().unique(),
  modelNames: textArray("model_names"),
  description: text("description"),
  ...audit(),
});

/** Who changed what: every mutating management call, secrets redacted. */
export const auditLog = pgTable(
  "audit_log",
  {
    id: text("id").primaryKey(),
    at: ts("at").notNull().defaultNow(),
    changedBy: text("changed_by"),
    /** Hash of the key that made the call (never the plaintext). */
    changedByApiKey: text("changed_by_api_key"),
    action: text("action").notNull(),
    tableName: text("table_name").notNull(),
    objectId: text("object_id").notNull(),
    beforeValue: jsonb("before_value"),
    updatedValues: jsonb("updated_values"),
  },
  (t) => [index("audit_log_at_idx").on(t.at), index("audit_log_object_idx").on(t.tableName, t.objectId)],
);
