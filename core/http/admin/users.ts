import { Elysia } from "elysia";
import type { AdminDeps } from "./context.ts";

export function userRoutes(_deps: AdminDeps) {
  return new Elysia();
}
