import { Elysia } from "elysia";
import type { AdminDeps } from "./context.ts";

export function modelAdminRoutes(_deps: AdminDeps) {
  return new Elysia();
}
