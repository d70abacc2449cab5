/** The management API: one module per resource, each owning its routes and rules. */
import { Elysia } from "elysia";
import { accessGroupRoutes } from "./access-groups.ts";
import { auditRoutes } from "./audit.ts";
import { budgetRoutes } from "./budgets.ts";
import type { AdminDeps } from "./context.ts";
import { keyRoutes } from "./keys.ts";
import { modelAdminRoutes } from "./models.ts";
import { organizationRoutes } from "./organizations.ts";
import { passThroughAdminRoutes } from "./pass-through.ts";
import { spendRoutes } from "./spend.ts";
import { teamCallbackRoutes } from "./team-callbacks.ts";
import { teamRoutes } from "./teams.ts";
import { userRoutes } from "./users.ts";

export function adminRoutes(deps: AdminDeps) {
  return new Elysia()
    .use(keyRoutes(deps))
    .use(userRoutes(deps))
    .use(teamRoutes(deps))
    .use(teamCallbackRoutes(deps))
    .use(organizationRoutes(deps))
    .use(modelAdminRoutes(deps))
    .use(accessGroupRoutes(deps))
    .use(budgetRoutes(deps))
    .use(spendRoutes(deps))
    .use(auditRoutes(deps))
    .use(passThroughAdminRoutes(deps));
}
