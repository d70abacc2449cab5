import { Elysia } from "elysia";
import type { AdminDeps } from "./context.ts";

export function organizationRoutes(_deps: AdminDeps) {
  return new Elysia();
}
