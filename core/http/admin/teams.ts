import { Elysia } from "elysia";
import type { AdminDeps } from "./context.ts";

export function teamRoutes(_deps: AdminDeps) {
  return new Elysia();
}
