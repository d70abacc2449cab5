import { Elysia } from "elysia";
import type { AdminDeps } from "./context.ts";

export function keyRoutes(_deps: AdminDeps) {
  return new Elysia();
}
