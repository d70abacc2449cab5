// The one drizzle schema shared by embedded PGlite and external PostgreSQL.
// After editing: `bunx drizzle-kit generate --config core/store/drizzle.config.ts --name <x>`
// then `bun core/store/generate-migration-index.ts` (see migrations/index.ts).
import { index, jsonb, pgTable, text, timestamp } from "drizzle-orm/pg-core";

/** Small key/value facts about this gateway installation (ids, versions, flags). */
export const gatewayMeta = pgTable("gateway_meta", {
  key: text("key").primaryKey(),
  value: jsonb("value").notNull(),
  updatedAt: timestamp("updated_at", { withTimezone: true }).defaultNow(),
});

/** Model deployments managed through the admin API rather than config.yaml. */
export const proxyModels = pgTable(
  "proxy_models",
  {
    modelId: text("model_id").primaryKey(),
    modelName: text("model_name").notNull(),
    // Provider parameters; credentials inside are stored encrypted, never in clear.
    svcParams: jsonb("svc_params").notNull(),
    modelInfo: jsonb("model_info").notNull().default({}),
    createdAt: timestamp("created_at", { withTimezone: true }).defaultNow(),
    updatedAt: timestamp("updated_at", { withTimezone: true }).defaultNow(),
    createdBy: text("created_by"),
    updatedBy: text("updated_by"),
  },
  // Routing looks deployments up by the public model name.
  (t) => [index("proxy_models_model_name_idx").on(t.modelName)],
);
export * from "./tables/identity.ts";
export * from "./tables/spend.ts";
