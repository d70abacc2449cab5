/** The audit trail, readable by admins: who changed what, when, before and after (secrets redacted). */
import { and, desc, eq, type SQL } from "drizzle-orm";
import { Elysia } from "elysia";
import { pageOf } from "../../identity/paging.ts";
import { toApi } from "../../identity/serialize.ts";
import { auditLog } from "../../store/schema.ts";
import { type AdminDeps, adminRoute } from "./context.ts";

const MAX_PAGE_SIZE = 100;

export function auditRoutes(deps: AdminDeps) {
  return new Elysia().get(
    "/audit/logs",
    adminRoute(deps, async (ctx) => {
      ctx.caller.requireReadAll();
      // Checked like the other lists' (422 naming the parameter): a fraction reached LIMIT as a 500.
      const { page, pageSize, offset } = pageOf(ctx.query, 50, MAX_PAGE_SIZE);
      const filters: SQL[] = [];
      const table = ctx.query("table_name");
      const objectId = ctx.query("object_id");
      const action = ctx.query("action");
      if (table) filters.push(eq(auditLog.tableName, table));
      if (objectId) filters.push(eq(auditLog.objectId, objectId));
      if (action) filters.push(eq(auditLog.action, action));
      const rows = await ctx.db
        .select()
        .from(auditLog)
        .where(filters.length ? and(...filters) : undefined)
        .orderBy(desc(auditLog.at))
        .limit(pageSize)
        .offset(offset);
      return { audit_logs: rows.map((r) => toApi(r)), page, page_size: pageSize };
    }),
  );
}
