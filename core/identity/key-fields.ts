/**
 * The virtual key fields a management call may set (the spec's table), as TypeBox schemas, and
 * the rules that turn them into row values: durations into timestamps, explicit `null` into the
 * column's empty value, fields without a column into `metadata`.
 */
import { Type as T, type TSchema } from "@sinclair/typebox";
import { getTableColumns } from "drizzle-orm";
import { badRequest } from "../authz.ts";
import { Duration as Period, RouterSettingsSchema } from "../config/schema.ts";
import { virtualKeys } from "../store/schema.ts";
import { DURATION_HINT, endsAt, MAX_DURATION, parseDuration } from "./duration.ts";
import { Amount, LIMIT_COLUMNS, Parallel, Quantity, storableTimestamp } from "./fields.ts";
import { fromApi } from "./serialize.ts";
import { MAX_NAME_CHARS, MAX_REQUEST_TAGS } from "../wire.ts";

const Opt = <S extends TSchema>(s: S) => T.Optional(T.Union([s, T.Null()]));
const Strings = T.Array(T.String());
const Obj = T.Record(T.String(), T.Unknown());
const NonNeg = Amount;
const Count = Quantity;
const LimitType = T.Union([T.Literal("best_effort_throughput"), T.Literal("guaranteed_throughput"), T.Literal("dynamic")]);
/** A duration string, or `-1` (never) as a number for clients that send it that way. */
const Duration = T.Union([T.String(), T.Literal(-1)]);

/** Every settable field; `null` clears (on update) or means "not set" (on generate). */
export const KEY_FIELDS = {
  key_alias: Opt(T.String()),
  // As /user/new's: a key of the user "" belonged to a user that can never exist.
  user_id: Opt(T.String({ minLength: 1 })),
  team_id: Opt(T.String()),
  organization_id: Opt(T.String()),
  agent_id: Opt(T.String()),
  budget_id: Opt(T.String()),
  models: Opt(Strings),
  // Each of a key's tags is a row of the daily tag report for every call it makes, as a request's own are.
  tags: Opt(T.Array(T.String({ maxLength: MAX_NAME_CHARS }), { maxItems: MAX_REQUEST_TAGS })),
  prompts: Opt(Strings),
  enforced_params: Opt(Strings),
  spend: Opt(NonNeg),
  max_budget: Opt(NonNeg),
  soft_budget: Opt(NonNeg),
  model_max_budget: Opt(T.Record(T.String(), T.Object({ budget_limit: Amount, time_period: T.Optional(Period), budget_duration: T.Optional(Period) }, { additionalProperties: true }))),
  budget_duration: Opt(T.String()),
  max_parallel_requests: Opt(Parallel),
  metadata: Opt(Obj),
  tpm_limit: Opt(Count),
  rpm_limit: Opt(Count),
  model_rpm_limit: Opt(T.Record(T.String(), Count)),
  model_tpm_limit: Opt(T.Record(T.String(), Count)),
  tpm_limit_type: Opt(LimitType),
  rpm_limit_type: Opt(LimitType),
  allowed_cache_controls: Opt(Strings),
  duration: Opt(Duration),
  permissions: Opt(Obj),
  send_invite_email: Opt(T.Boolean()),
  guardrails: Opt(Strings),
  policies: Opt(Strings),
  disable_global_guardrails: Opt(T.Boolean()),
  blocked: Opt(T.Boolean()),
  aliases: Opt(T.Record(T.String(), T.String())),
  config: Opt(Obj),
  temp_budget_increase: Opt(NonNeg),
  temp_budget_expiry: Opt(T.String()),
  allowed_routes: Opt(Strings),
  allowed_passthrough_routes: Opt(Strings),
  object_permission: Opt(
    T.Object({ vector_stores: T.Optional(Strings), agents: T.Optional(Strings), agent_access_groups: T.Optional(Strings) }, { additionalProperties: true }),
  ),
  auto_rotate: Opt(T.Boolean()),
  rotation_interval: Opt(T.String()),
  allowed_vector_store_indexes: Opt(T.Array(T.Object({ index_name: T.String(), index_permissions: T.Array(T.Union([T.Literal("read"), T.Literal("write")])) }))),
  // Checked as the config's are: a bad value was stored, then ignored at every call.
  router_settings: Opt(RouterSettingsSchema),
  access_group_ids: Opt(Strings),
  key_type: Opt(T.Union([T.Literal("default"), T.Literal("llm_api"), T.Literal("management"), T.Literal("read_only")])),
  /** No column: kept in `metadata.project_id`. */
  project_id: Opt(T.String()),
};

const loose = { additionalProperties: true } as const;

export const GenerateKeySchema = T.Object({ ...KEY_FIELDS, key: Opt(T.String()) }, loose);
export const UpdateKeySchema = T.Object({ ...KEY_FIELDS, key: T.String({ minLength: 1 }) }, loose);
export const BulkUpdateSchema = T.Object({ keys: T.Array(UpdateKeySchema) }, loose);
export const RegenerateKeySchema = T.Object(
  { ...KEY_FIELDS, key: Opt(T.String()), new_key: Opt(T.String()), new_master_key: Opt(T.String()), grace_period: Opt(T.String()) },
  loose,
);

export type KeyBody = Record<string, unknown>;

/** Columns a caller may write directly; the rest are derived (token, expires, rotation, audit…). */
const WRITABLE = new Set([
  "key_alias",
  "key_type",
  "user_id",
  "team_id",
  "organization_id",
  "agent_id",
  "budget_id",
  "models",
  "tags",
  "prompts",
  "enforced_params",
  ...LIMIT_COLUMNS,
  "tpm_limit_type",
  "rpm_limit_type",
  "metadata",
  "allowed_cache_controls",
  "duration",
  "permissions",
  "send_invite_email",
  "guardrails",
  "policies",
  "disable_global_guardrails",
  "blocked",
  "aliases",
  "config",
  "temp_budget_increase",
  "temp_budget_expiry",
  "allowed_routes",
  "allowed_passthrough_routes",
  "object_permission",
  "auto_rotate",
  "rotation_interval",
  "allowed_vector_store_indexes",
  "router_settings",
  "access_group_ids",
]);

/** What `null` means for a NOT NULL column: its empty value. */
function emptyOf(columnType: string): unknown {
  switch (columnType) {
    case "PgArray":
      return [];
    case "PgJsonb":
      return {};
    case "PgBoolean":
      return false;
    case "PgNumeric":
      return "0";
    default:
      return "default";
  }
}

const COLUMNS = Object.entries(getTableColumns(virtualKeys));

/**
 * Row properties for the fields the body names. `null` clears a field: nullable columns become
 * null, NOT NULL ones their empty value (`[]`, `{}`, `false`, 0).
 */
export function keyFieldsOf(body: KeyBody): Record<string, unknown> {
  const out = fromApi(virtualKeys, body, WRITABLE);
  // `duration: -1` (never expires) is kept as text, like every other duration.
  if (typeof out.duration === "number") out.duration = String(out.duration);
  // An empty alias is none: two keys "named" "" clashed on the alias index (and were told the key existed).
  if (out.keyAlias === "") out.keyAlias = null;
  for (const [prop, column] of COLUMNS) {
    if (prop in out && out[prop] === null && column.notNull) out[prop] = emptyOf(column.columnType);
  }
  if (out.tempBudgetExpiry instanceof Date && !storableTimestamp(out.tempBudgetExpiry)) {
    throw badRequest("temp_budget_expiry must be an ISO 8601 timestamp in the years 0001 to 9999.", "temp_budget_expiry");
  }
  return out;
}

/** `duration` → `expires` (null = never); undefined when the body does not mention it. */
export function expiresOf(body: KeyBody, now = Date.now()): Date | null | undefined {
  if (!("duration" in body) || body.duration === undefined) return undefined;
  if (body.duration === null || body.duration === -1) return null;
  const at = endsAt(String(body.duration), now);
  if (at === undefined) throw badRequest(`duration must be ${DURATION_HINT}.`, "duration");
  return at;
}

/** A positive period (budget reset, rotation, grace): milliseconds, or a 400 naming the field. */
export function periodMs(value: string, field: string, allowZero = false): number {
  const ms = parseDuration(value);
  if (ms === undefined || ms === null || (ms === 0 && !allowZero)) throw badRequest(`${field} must be a duration such as 30s, 15m, 24h, 7d, 1mo (at most ${MAX_DURATION}).`, field);
  return ms;
}
