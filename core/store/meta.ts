import { eq, sql } from "drizzle-orm";
import type { Db } from "./db.ts";
import { gatewayMeta } from "./schema.ts";

/** The stored JSON value, or undefined when the key is absent. */
export async function getMeta(db: Db, key: string): Promise<unknown> {
  const found = await db
    .select({ value: gatewayMeta.value })
    .from(gatewayMeta)
    .where(eq(gatewayMeta.key, key))
    .limit(1);
  return found[0]?.value;
}

/** Inserts or overwrites `key`. */
export async function setMeta(db: Db, key: string, value: unknown): Promise<void> {
  await db
    .insert(gatewayMeta)
    .values({ key, value })
    .onConflictDoUpdate({ target: gatewayMeta.key, set: { value, updatedAt: sql`now()` } });
}
