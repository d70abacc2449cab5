/** Spend-log entries for suites that write calls of past days (or exact amounts) through the spend writer's own batch path (`writeBatch`). */
import { randomUUID } from "node:crypto";
import { sql } from "drizzle-orm";
import type { SpendEntry } from "../../core/spend/entry.ts";
import { rows } from "../../core/store/sql.ts";
import type { TestGateway } from "./gateway.ts";

/** Who a seeded call is made by: a key (its hash), and the team, org and user it spends for. */
export interface Caller {
  label: string;
  token: string;
  /** The plain key (real keys only): `api_key=` accepts it too. */
  key?: string;
  teamId: string | null;
  orgId: string | null;
  userId: string | null;
}

/**
 * A finished chat call that started at `at` (ms): `fields` over plain defaults (no team, user, end
 * user, tags or charges; 0 tokens and 0 spend; success).
 */
export function spendEntry(at: number, fields: Partial<SpendEntry> & Pick<SpendEntry, "apiKey">): SpendEntry {
  const callId = fields.callId ?? randomUUID();
  return {
    callId,
    requestId: `chatcmpl-${callId}`,
    callType: "chat",
    keyAlias: null,
    userId: null,
    teamId: null,
    organizationId: null,
    endUser: null,
    model: "alpha-model",
    modelGroup: "alpha-model",
    provider: "mock",
    modelId: "past",
    upstreamModel: "alpha",
    spendPico: 0,
    promptTokens: 0,
    completionTokens: 0,
    cacheReadTokens: 0,
    cacheCreationTokens: 0,
    reasoningTokens: 0,
    startTime: at,
    endTime: at + 5,
    completionStartTime: null,
    status: "success",
    stream: false,
    cacheHit: false,
    tags: [],
    metadata: {},
    charges: [],
    ...fields,
  };
}

/** A decimal text (exponent form too) as an integer count of 10^-digits; throws when it does not fit exactly. */
export function scaledExact(text: string, digits: number): bigint {
  const m = /^(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(text);
  if (!m) throw new Error(`not a decimal number: ${text}`);
  const shift = Number(m[3] ?? 0) - (m[2]?.length ?? 0) + digits;
  const n = BigInt(`${m[1]}${m[2] ?? ""}`);
  if (shift >= 0) return n * 10n ** BigInt(shift);
  const div = 10n ** BigInt(-shift);
  if (n % div !== 0n) throw new Error(`${text} has more than ${digits} decimals`);
  return n / div;
}

/** The spend-log row of the call answered with `requestId` (the response `id`), once the writer has flushed. */
export async function spendLogRow<T>(gw: TestGateway, requestId: string): Promise<T | undefined> {
  await gw.host!.spendWriter.flush();
  const [row] = await rows<T>(gw.host!.store.db, sql`select * from spend_logs where request_id = ${requestId}`);
  return row;
}
