/**
 * Key rotation: one row keeps its spend, limits and configuration and gets a new token. The old
 * hash is revoked at once, or when its grace period ends; its row in `rotated_keys` leads to the
 * new token until then, and for the spend of late calls a day longer.
 *
 * The background job rotates keys with `auto_rotate` whose `key_rotation_at` has passed, every
 * ~10 s on each instance (a key is rotated once: the update is conditional on the old token).
 * Nobody receives the new plaintext of an automatically rotated key: it is generated, hashed and
 * dropped. The old value keeps working for SVC_KEY_ROTATION_GRACE_PERIOD (the grace
 * `/key/regenerate` defaults to; none when unset), during which its owner calls
 * `/key/regenerate` with it to get a usable key. The job logs the alias and the new hash, never
 * a plaintext.
 */
import { randomUUID } from "node:crypto";
import { and, arrayContains, eq, isNull, lte, sql } from "drizzle-orm";
import type { Logger } from "../contract.ts";
import { PeriodicJob } from "../periodic-job.ts";
import type { Db } from "../store/db.ts";
import { auditLog, rotatedKeys, virtualKeys } from "../store/schema.ts";
import type { ChangeBus } from "./bus.ts";
import { parseDuration } from "./duration.ts";
import { holdKey } from "./holds.ts";
import { hashKey, keyName, newKeyValue } from "./keys.ts";
import type { Exec } from "./members.ts";
import type { IdentityChange, KeyRow } from "./records.ts";
import { toApi } from "./serialize.ts";
import { storeErrorCause } from "../store/sql.ts";

/**
 * How many earlier tokens a rotated row keeps for spend batches (spend/flush.ts): a batch's
 * statement that read one of them still finds the row after that many rotations committed while
 * it ran (each rotation names the token the key has then, so they follow one another; a statement
 * lasts well under a second). Older ones stay reachable through `rotated_keys`, which every
 * statement begun after their rotation reads.
 */
const EARLIER_TOKENS_KEPT = 8;

/**
 * A key value that is about to be given to a key (a new key, or a rotation's new value) and may be
 * one that another row had before its rotation (revoked since): that row is no longer found by it,
 * else the new key's calls were charged to it too.
 */
export async function releaseEarlierToken(tx: Exec, token: string): Promise<void> {
  await tx
    .update(virtualKeys)
    .set({ rotatedFrom: sql`array_remove(${virtualKeys.rotatedFrom}, ${token})` })
    .where(arrayContains(virtualKeys.rotatedFrom, [token]));
}

/**
 * The `first_token` of a new key with this token: null (its counters go by its token), unless an
 * earlier key, rotated since, was created with the same value (revoked, it is free again) and its
 * counters still go by it: then an id of the new key's own, else the two shared a budget.
 */
export async function firstTokenOfNewKey(tx: Exec, token: string): Promise<string | null> {
  const [earlier] = await tx.select({ token: virtualKeys.token }).from(virtualKeys).where(eq(virtualKeys.firstToken, token)).limit(1);
  return earlier ? `key-${randomUUID()}` : null;
}

type KeyFields = Partial<typeof virtualKeys.$inferInsert>;

export interface Rotation {
  /** The old row's token. */
  oldToken: string;
  newToken: string;
  newKeyName: string;
  /** 0 revokes the old hash at once. */
  graceMs: number;
  /**
   * Other fields to write with the rotation (`updated_by`), or how to decide them (a regenerate's
   * updates) on the key's row as it is, held: throws to refuse them.
   */
  set?: KeyFields | ((current: KeyRow) => KeyFields);
  /** Run in the rotation's transaction before the key is written: holds what `set` refers to, or throws to refuse it. */
  hold?: (tx: Exec) => Promise<void>;
  now?: number;
}

/**
 * Moves a live key to its new token. Returns the new row and the identity changes to publish
 * (new key first, so the key is never missing from a cache), or undefined when the old token is
 * no longer live (deleted, or rotated meanwhile by someone else).
 */
export async function rotateKey(db: Db, r: Rotation): Promise<{ row: KeyRow; changes: IdentityChange[] } | undefined> {
  const now = r.now ?? Date.now();
  return db.transaction(async (tx) => {
    await r.hold?.(tx);
    const current = await holdKey(tx, r.oldToken);
    if (!current) return undefined;
    const set = typeof r.set === "function" ? r.set(current) : r.set;
    const merged = { ...current, ...set };
    const interval = merged.autoRotate && merged.rotationInterval ? parseDuration(merged.rotationInterval) : undefined;
    await releaseEarlierToken(tx, r.newToken);
    const [row] = await tx
      .update(virtualKeys)
      .set({
        ...set,
        token: r.newToken,
        // A spend batch that read the old token before this commits finds the row by it (spend/flush.ts).
        rotatedFrom: sql`(array[${r.oldToken}]::text[] || ${virtualKeys.rotatedFrom})[1:${sql.raw(String(EARLIER_TOKENS_KEPT))}]`,
        // Its budget and rate-limit counters go on under the name they had (records.ts keyCounterToken).
        firstToken: sql`coalesce(${virtualKeys.firstToken}, ${r.oldToken})`,
        keyName: r.newKeyName,
        rotationCount: sql`${virtualKeys.rotationCount} + 1`,
        lastRotationAt: new Date(now),
        keyRotationAt: interval ? new Date(now + interval) : (merged.keyRotationAt ?? null),
        updatedAt: new Date(now),
      })
      .where(and(eq(virtualKeys.token, r.oldToken), isNull(virtualKeys.deletedAt)))
      .returning();
    if (!row) return undefined;
    const changes: IdentityChange[] = [{ kind: "key", token: r.newToken }];
    // Older hashes still in their grace period now lead to the new token, and end no later than
    // the old one: a rotation asking for revocation at once (a leaked key) leaves no earlier value working.
    const moved = await tx
      .update(rotatedKeys)
      .set({ activeToken: r.newToken, revokeAt: sql`least(${rotatedKeys.revokeAt}, ${new Date(now + r.graceMs).toISOString()}::timestamptz)` })
      .where(eq(rotatedKeys.activeToken, r.oldToken))
      .returning({ token: rotatedKeys.token });
    for (const m of moved) changes.push({ kind: "rotated_key", token: m.token });
    // Kept without a grace period too (revoked at once: a lookup follows it only before
    // revoke_at): calls that were under way, or whose spend was still queued, charge the old
    // token, and the spend writer charges its successor (spend/flush.ts). Without it their cost
    // was lost from the key's spend (up to a second of calls, and every stream under way).
    // A value used again once revoked (keys.ts assertNewKeyValue) has its earlier row: replaced.
    const successor = { activeToken: r.newToken, revokeAt: new Date(now + r.graceMs), createdAt: new Date(now) };
    await tx
      .insert(rotatedKeys)
      .values({ token: r.oldToken, ...successor })
      .onConflictDoUpdate({ target: rotatedKeys.token, set: successor });
    changes.push({ kind: "rotated_key", token: r.oldToken });
    changes.push({ kind: "key", token: r.oldToken });
    return { row, changes };
  });
}

const CHECK_INTERVAL_MS = 10_000;
/** How long a revoked hash still leads to its successor, for calls that end (or are written) late. */
const SUCCESSOR_KEPT_MS = 86_400_000;
const SYSTEM_ACTOR = "system:auto-rotate";

/** SVC_KEY_ROTATION_GRACE_PERIOD in ms; 0 when unset or unreadable. */
function defaultGraceMs(): number {
  const text = process.env.SVC_KEY_ROTATION_GRACE_PERIOD;
  const ms = text ? parseDuration(text) : undefined;
  return typeof ms === "number" && ms > 0 ? ms : 0;
}

/** Rotates every due key once and drops rotated hashes whose grace has ended; returns how many keys it rotated. */
export async function rotateDueKeys(db: Db, bus: ChangeBus, log: Logger, now = Date.now(), graceMs = defaultGraceMs()): Promise<number> {
  const due = await db
    .select()
    .from(virtualKeys)
    .where(and(eq(virtualKeys.autoRotate, true), lte(virtualKeys.keyRotationAt, new Date(now)), isNull(virtualKeys.deletedAt)));
  let rotated = 0;
  for (const old of due) {
    const fresh = newKeyValue();
    const newToken = hashKey(fresh);
    const done = await rotateKey(db, { oldToken: old.token, newToken, newKeyName: keyName(fresh), graceMs, set: { updatedBy: SYSTEM_ACTOR }, now });
    if (!done) continue;
    rotated++;
    await db.insert(auditLog).values({
      id: randomUUID(),
      changedBy: SYSTEM_ACTOR,
      action: "rotated",
      tableName: "virtual_keys",
      objectId: newToken,
      beforeValue: toApi(old),
      updatedValues: toApi(done.row),
    });
    await bus.publish(...done.changes);
    log.info("key rotated automatically; its new value was not kept: regenerate it to get a usable key", {
      key_alias: old.keyAlias,
      old_token: old.token,
      new_token: newToken,
      rotation_count: done.row.rotationCount,
      old_value_valid_until: graceMs > 0 ? new Date(now + graceMs).toISOString() : null,
    });
  }
  // Kept a while past revocation, for the spend of calls that named the old token (see rotateKey).
  const expired = await db.delete(rotatedKeys).where(lte(rotatedKeys.revokeAt, new Date(now - SUCCESSOR_KEPT_MS))).returning({ token: rotatedKeys.token });
  if (expired.length > 0) await bus.publish(...expired.map((e): IdentityChange => ({ kind: "rotated_key", token: e.token })));
  return rotated;
}

/** Runs `rotateDueKeys` every ~10 s until stopped. */
export class KeyRotator {
  private readonly job = new PeriodicJob(
    () => rotateDueKeys(this.db, this.bus, this.log),
    (err) => this.log.warn("automatic key rotation failed; will retry", storeErrorCause(err)),
  );

  constructor(
    private readonly db: Db,
    private readonly bus: ChangeBus,
    private readonly log: Logger,
    private readonly intervalMs = CHECK_INTERVAL_MS,
  ) {}

  start(): void {
    this.job.start(this.intervalMs);
  }

  stop(): Promise<void> {
    return this.job.stop();
  }
}
