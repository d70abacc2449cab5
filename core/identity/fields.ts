/**
 * Body pieces the user and team management routes share: the budget and rate-limit fields with
 * their wire types, the budget period check, and how an explicit `null` clears a column that
 * cannot hold null.
 */
import { type TSchema, Type as T } from "@sinclair/typebox";
import { badRequest } from "../authz.ts";
import { Duration } from "../config/schema.ts";
import { DURATION_HINT, endsAt, parseDuration } from "./duration.ts";

export const Nullable = <S extends TSchema>(s: S) => T.Union([s, T.Null()]);

/** A timestamp the store can hold as a client wrote it: a valid date in years 1 to 9999 (PostgreSQL has no year 0, which JavaScript parses). */
export function storableTimestamp(at: Date): boolean {
  const year = at.getUTCFullYear();
  return !Number.isNaN(at.getTime()) && year >= 1 && year <= 9999;
}

/**
 * What the columns hold, as bounds of the body (past them the insert failed as a 500): money is
 * numeric(30,12), below 1e18, and a body sets at most 1e15 so spend can still grow past it; rate
 * limits are bigint read as numbers, exact to 2^53 - 1; max_parallel_requests is an integer.
 */
export const Amount = T.Number({ minimum: 0, maximum: 1e15 });
export const Quantity = T.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
export const Parallel = T.Integer({ minimum: 0, maximum: 2_147_483_647 });
const Money = Nullable(Amount);
const Count = Nullable(Quantity);

/**
 * Per-model budgets as a budget object (and an organization, whose row mirrors its budget's) keeps
 * them: `{<model>: {max_budget, budget_duration, tpm_limit, rpm_limit}}`, the spec's Budget shape,
 * or with a key's names `budget_limit` and `time_period`, which the ledger reads alike.
 */
export const ModelMaxBudget = T.Record(
  T.String(),
  T.Object(
    {
      max_budget: T.Optional(Money),
      budget_limit: T.Optional(Money),
      budget_duration: T.Optional(Nullable(Duration)),
      time_period: T.Optional(Nullable(Duration)),
      tpm_limit: T.Optional(Count),
      rpm_limit: T.Optional(Count),
    },
    { additionalProperties: true },
  ),
);

/** Limit fields of users and teams (the spec's virtual key table names them the same way). */
export const LimitFields = {
  max_budget: T.Optional(Money),
  soft_budget: T.Optional(Money),
  budget_duration: T.Optional(Nullable(T.String())),
  // Any value but null is refused, whatever its shape (refuseModelMaxBudget).
  model_max_budget: T.Optional(T.Unknown()),
  tpm_limit: T.Optional(Count),
  rpm_limit: T.Optional(Count),
  max_parallel_requests: T.Optional(Nullable(Parallel)),
  model_tpm_limit: T.Optional(Nullable(T.Record(T.String(), T.Integer({ minimum: 0 })))),
  model_rpm_limit: T.Optional(Nullable(T.Record(T.String(), T.Integer({ minimum: 0 })))),
  metadata: T.Optional(Nullable(T.Record(T.String(), T.Unknown()))),
  models: T.Optional(Nullable(T.Array(T.String()))),
};

/**
 * A team's member defaults, top-level or in `member_settings`, with the wire types of the
 * membership columns they fill. Checked only at the top level, a fractional rpm in
 * `member_settings` was stored and made every later member add a 500 (an integer column), and
 * negative budgets and limits (or strings) were applied to new members.
 */
export const MemberSettingFields = {
  team_member_budget: T.Optional(Money),
  team_member_budget_duration: T.Optional(Nullable(T.String())),
  team_member_rpm_limit: T.Optional(Count),
  team_member_tpm_limit: T.Optional(Count),
  team_member_key_duration: T.Optional(Nullable(T.String())),
};

/**
 * `model_max_budget` on a user or team is a 400 (null, clearing it, is taken): the spec lists
 * per-model budgets for keys, organizations and budget objects only, and no call is checked
 * against a user's or team's, so the value was stored, shown back, and never refused a call.
 */
export function refuseModelMaxBudget(body: { model_max_budget?: unknown }, owner: "user" | "team"): void {
  if (body.model_max_budget == null) return;
  throw badRequest(
    `model_max_budget is not enforced on a ${owner}: per-model budgets are kept on keys and organizations (and budget objects), which the spec lists them for. Set it on the ${owner}'s keys, or on its organization.`,
    "model_max_budget",
  );
}

/** The budget and rate-limit columns keys, users and teams share (their names are the API's). */
export const LIMIT_COLUMNS = [
  "spend",
  "max_budget",
  "soft_budget",
  "budget_duration",
  "model_max_budget",
  "tpm_limit",
  "rpm_limit",
  "max_parallel_requests",
  "model_tpm_limit",
  "model_rpm_limit",
] as const;

/**
 * Most ids (or members) one management call may name. Each goes to the store as a bind parameter
 * of an `IN` list, and PostgreSQL takes at most 65,535 per statement: past that, a list failed as a
 * 500 (on the embedded store, as a "connection lost" 503). A 422 naming the field and this bound.
 */
export const MAX_IDS_PER_CALL = 1000;

/** A list of ids or members a call acts on, at most MAX_IDS_PER_CALL of them. */
export const IdList = <S extends TSchema>(item: S, minItems = 0) => T.Array(item, { minItems, maxItems: MAX_IDS_PER_CALL });

export const MoneyField = Money;
export const CountField = Count;
export const ParallelField = Nullable(Parallel);

/**
 * `budget_reset_at` for a budget period given in a body: a 400 naming the field when the text is
 * not a period, null when the period is cleared (or `-1`).
 */
export function resetAt(period: string | null | undefined, field = "budget_duration", now = Date.now()): Date | null | undefined {
  if (period === undefined) return undefined;
  if (period === null) return null;
  // A period of no length would start again at every call: not a budget period.
  if (parseDuration(period) === 0) throw badRequest(`${field} must be ${DURATION_HINT}, longer than 0; got ${JSON.stringify(period)}.`, field);
  const at = endsAt(period, now);
  if (at === undefined) throw badRequest(`${field} must be ${DURATION_HINT}; got ${JSON.stringify(period)}.`, field);
  return at;
}

/**
 * Row props from `fromApi` with `null` on a column that cannot be null replaced by that column's
 * empty value (a list becomes `[]`, an object `{}`): "clear" means empty for them.
 */
export function clearNulls(props: Record<string, unknown>, empties: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...props };
  for (const [prop, empty] of Object.entries(empties)) if (prop in out && out[prop] === null) out[prop] = empty;
  return out;
}

/** A `LIKE` pattern matching `text` anywhere, with the pattern characters in it taken literally. */
export function containing(text: string): string {
  return `%${text.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
}
