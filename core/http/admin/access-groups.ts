import { Elysia } from "elysia";
import type { AdminDeps } from "./context.ts";

export function accessGroupRoutes(_deps: AdminDeps) {
  return new Elysia();
}
