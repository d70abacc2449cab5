import type { MigrationMeta } from "drizzle-orm/migrator";
import type { Db } from "./db.ts";
import { migrations } from "./migrations/index.ts";

export const MIGRATIONS_SCHEMA = "drizzle";
export const MIGRATIONS_TABLE = "__gateway_migrations";

// The public migrate() helpers only add a readdir of a migrations folder, which a compiled binary
// lacks; they then call this same dialect method. It is absent from drizzle's public types,
// hence the one cast. If drizzle changes it, write the embedded files to a temp folder and use
// `migrate()` from drizzle-orm/<driver>/migrator instead.
type DialectMigrator = {
  dialect: {
    migrate(
      m: MigrationMeta[],
      session: unknown,
      cfg: { migrationsTable: string; migrationsSchema: string },
    ): Promise<void>;
  };
  session: unknown;
};

/** Applies pending embedded migrations. Not safe to run concurrently: callers serialize it. */
export async function runMigrations(db: Db): Promise<void> {
  const internal = db as unknown as DialectMigrator;
  await internal.dialect.migrate(migrations, internal.session, {
    migrationsTable: MIGRATIONS_TABLE,
    migrationsSchema: MIGRATIONS_SCHEMA,
  });
}
