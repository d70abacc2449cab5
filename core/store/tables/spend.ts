/**
 * Spend: the append-only log of every call, the daily aggregates reports read, and the record of
 * budget alerts already sent. Money is `numeric(30,12)`: exact, and the scale of the gateway's
 * pico-dollar amounts.
 */
import { sql } from "drizzle-orm";
import { bigint, boolean, date, index, integer, jsonb, numeric, pgTable, primaryKey, text, timestamp } from "drizzle-orm/pg-core";

const money = (name: string) => numeric(name, { precision: 30, scale: 12 });
/** Seconds of audio, at the scale of money (picoseconds): a sum in memory and in SQL agree exactly. */
const seconds = (name: string) => numeric(name, { precision: 30, scale: 12 });
const ts = (name: string) => timestamp(name, { withTimezone: true, mode: "date" });
const count = (name: string) => bigint(name, { mode: "number" }).notNull().default(0);

export const spendLogs = pgTable(
  "spend_logs",
  {
    /** The gateway's own id of the call (`x-svc-call-id`); makes re-delivered rows harmless. */
    callId: text("call_id").primaryKey(),
    /** The response `id` the client saw (`chatcmpl-…`), or the call id when there was none. */
    requestId: text("request_id").notNull(),
    callType: text("call_type").notNull(),
    /** sha256 of the virtual key (never the key). */
    apiKey: text("api_key").notNull(),
    keyAlias: text("key_alias"),
    userId: text("user_id"),
    teamId: text("team_id"),
    organizationId: text("organization_id"),
    endUser: text("end_user"),
    /** The model name the client asked for. */
    model: text("model").notNull(),
    modelGroup: text("model_group").notNull(),
    provider: text("provider").notNull(),
    /** The deployment that answered (`x-svc-model-id`). */
    modelId: text("model_id").notNull(),
    upstreamModel: text("upstream_model").notNull(),
    spend: money("spend").notNull(),
    promptTokens: integer("prompt_tokens").notNull().default(0),
    completionTokens: integer("completion_tokens").notNull().default(0),
    totalTokens: integer("total_tokens").notNull().default(0),
    cacheReadTokens: integer("cache_read_input_tokens").notNull().default(0),
    cacheCreationTokens: integer("cache_creation_input_tokens").notNull().default(0),
    reasoningTokens: integer("reasoning_tokens").notNull().default(0),
    /**
     * Seconds of audio the call was priced with (a transcription's length, a speech answer's);
     * null for a call whose usage has none (chat, a transcription priced by tokens). Migration 0015.
     */
    audioSeconds: seconds("audio_seconds"),
    startTime: ts("start_time").notNull(),
    endTime: ts("end_time").notNull(),
    completionStartTime: ts("completion_start_time"),
    /** `success`, `failure` or `cancelled`. */
    status: text("status").notNull(),
    stream: boolean("stream").notNull().default(false),
    cacheHit: boolean("cache_hit").notNull().default(false),
    requestTags: text("request_tags").array().notNull().default(sql`'{}'::text[]`),
    /** `key_alias`, team alias, error information, where the price came from (or that there was none). */
    metadata: jsonb("metadata").$type<Record<string, unknown>>().notNull().default({}),
  },
  (t) => [
    index("spend_logs_start_idx").on(t.startTime),
    index("spend_logs_key_start_idx").on(t.apiKey, t.startTime),
    // A btree, not a hash index: a hash index slows down with every repeat of one id (an upstream
    // that answers with a constant id), a btree does not.
    index("spend_logs_request_idx").on(t.requestId),
  ],
);

/**
 * One row per (entity, day, key, model, provider): what `/…/daily/activity` and
 * `/global/spend/report` read, so reports never scan the log. `entity_type` is `key`, `team`,
 * `org`, `user`, `end_user`, `tag`, `model` or `provider`; columns that do not apply hold ''.
 */
export const dailySpend = pgTable(
  "daily_spend",
  {
    entityType: text("entity_type").notNull(),
    entityId: text("entity_id").notNull(),
    date: date("date", { mode: "string" }).notNull(),
    apiKey: text("api_key").notNull().default(""),
    model: text("model").notNull().default(""),
    modelGroup: text("model_group").notNull().default(""),
    provider: text("provider").notNull().default(""),
    /**
     * For `key`, `user` and `end_user` rows, the team the calls' key was in ('' none): a key moved
     * to another team during a day has a row for each, so a report filtered by user or end user
     * counts each call under the team it was made in. Rows written before this column carry the
     * team the key spent for last that day (migration 0012).
     */
    teamId: text("team_id").notNull().default(""),
    promptTokens: count("prompt_tokens"),
    completionTokens: count("completion_tokens"),
    cacheReadTokens: count("cache_read_input_tokens"),
    cacheCreationTokens: count("cache_creation_input_tokens"),
    spend: money("spend").notNull().default("0"),
    apiRequests: count("api_requests"),
    successfulRequests: count("successful_requests"),
    failedRequests: count("failed_requests"),
    /**
     * The rows' calls' `spend_logs.audio_seconds` summed; null while none of them had any, which is
     * what tells an audio model's usage in `/global/spend/report` from a model priced by tokens.
     */
    audioSeconds: seconds("audio_seconds"),
    updatedAt: ts("updated_at").notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.entityType, t.entityId, t.date, t.apiKey, t.model, t.modelGroup, t.provider, t.teamId] }),
    index("daily_spend_date_idx").on(t.entityType, t.date),
  ],
);

/**
 * A version per entity type and day of `daily_spend`, bumped by a trigger on every write to it
 * (migration 0005): a report reuses a day's part while that day's version is unchanged, without
 * scanning the day's rows to find out.
 */
export const dailySpendDays = pgTable(
  "daily_spend_days",
  {
    entityType: text("entity_type").notNull(),
    date: date("date", { mode: "string" }).notNull(),
    version: bigint("version", { mode: "number" }).notNull().default(1),
  },
  (t) => [primaryKey({ columns: [t.entityType, t.date] })],
);

/**
 * Finished days' parts of spend reports, as JSON text, so that a restarted gateway (or another
 * instance on the same database) answers a report over many days without rebuilding it from the
 * aggregates. `report` is a hash of the report's kind, filters and part format; a part is served
 * only while its `stamp` (the day's version in `daily_spend_days`, and for parts that hold names,
 * `report_names.version`) is current. Pruned by the retention job some weeks after `stored_at`.
 */
export const reportParts = pgTable(
  "report_parts",
  {
    report: text("report").notNull(),
    day: date("day", { mode: "string" }).notNull(),
    stamp: text("stamp").notNull(),
    body: text("body").notNull(),
    storedAt: ts("stored_at").notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.report, t.day] })],
);

/**
 * One row: a version bumped by triggers (migration 0006) whenever a name that report parts hold
 * changes (key aliases and teams, team and organization aliases), on any instance.
 */
export const reportNames = pgTable("report_names", {
  id: integer("id").primaryKey(),
  version: bigint("version", { mode: "number" }).notNull().default(1),
});

/** Budget alerts already sent: one per (budget, event, period) across every instance. */
export const budgetAlerts = pgTable(
  "budget_alerts",
  {
    counterId: text("counter_id").notNull(),
    event: text("event").notNull(),
    /** End of the budget period the alert belongs to ('flat' for budgets that never reset). */
    period: text("period").notNull(),
    sentAt: ts("sent_at").notNull().defaultNow(),
    payload: jsonb("payload").$type<Record<string, unknown>>().notNull(),
    /** The deliveries' `webhook-id`: the same on every attempt, by any instance, after a restart too. */
    deliveryId: text("delivery_id"),
    /** When the alert webhook took it (a 2xx); null while owed, or when none was set. */
    deliveredAt: ts("delivered_at"),
    /** Attempts made to deliver it. */
    attempts: integer("attempts").notNull().default(0),
    /** When the next attempt is due; null when none is owed (delivered, no webhook set, given up). */
    nextAttemptAt: ts("next_attempt_at"),
    /** Why the last attempt failed (a status or a network error), for an operator. */
    lastError: text("last_error"),
  },
  (t) => [
    primaryKey({ columns: [t.counterId, t.event, t.period] }),
    index("budget_alerts_due_idx").on(t.nextAttemptAt).where(sql`${t.nextAttemptAt} is not null`),
  ],
);

/**
 * The ids of calls counted while `disable_spend_logs` is on: no log row is written then, and this
 * narrow key is what keeps a batch that is written twice (a retry after a lost answer, a replayed
 * spill file) from being counted twice. Ids are time-ordered (UUIDv7), so the index grows at its
 * right edge and old ids are pruned by range.
 */
export const spendCalls = pgTable("spend_calls", {
  callId: text("call_id").primaryKey(),
});

/**
 * Spend per budget period of the counters that have no row of their own (a key's per-model
 * budget `key_model:<token>:<group>`, a provider's budget `provider:<name>`), for periods on a grid
 * (spend/period.ts gridPeriod), and for good (period_end infinity) for a budget that never resets.
 * Their spend was summed from the log, which holds nothing with `disable_spend_logs` or past
 * retention (a period shorter than a day then started again at 0 on every restart), and holds a
 * key's calls under the token each had (a key rotated more often than it keeps earlier tokens
 * lost the rest). Written by the spend writer with the other counters; old periods are pruned.
 */
export const budgetPeriodSpend = pgTable(
  "budget_period_spend",
  {
    counter: text("counter").notNull(),
    periodEnd: ts("period_end").notNull(),
    spend: money("spend").notNull().default("0"),
  },
  (t) => [primaryKey({ columns: [t.counter, t.periodEnd] }), index("budget_period_spend_end_idx").on(t.periodEnd)],
);
