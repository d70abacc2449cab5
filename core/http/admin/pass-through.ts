/**
 * The configured pass-through endpoints, for proxy admins: `GET /config/pass_through_endpoint`
 * (all of them) and `GET /config/pass_through_endpoint/team/{team_id}` (those the team's keys may
 * call: all, or the ones its `allowed_passthrough_routes` name). `endpoint_id` picks one. Header
 * values and credentials in a target URL are never shown.
 */
import { Elysia } from "elysia";
import { routeMatches } from "../../access.ts";
import { notFound } from "../../authz.ts";
import type { PassThroughEndpoint } from "../../pass-through/table.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";

function answer(ctx: AdminCtx, endpoints: readonly PassThroughEndpoint[]) {
  const id = ctx.query("endpoint_id");
  if (id === undefined) return { endpoints: endpoints.map((e) => e.shown) };
  const one = endpoints.find((e) => e.id === id);
  if (!one) throw notFound(`Pass-through endpoint ${id} not found.`, "endpoint_id");
  return { endpoints: [one.shown] };
}

async function allEndpoints(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  return answer(ctx, ctx.snapshot.passThrough.endpoints);
}

async function teamEndpoints(ctx: AdminCtx) {
  ctx.caller.requireReadAll();
  const teamId = decodeURIComponent(ctx.url.pathname.split("/").pop() ?? "");
  const team = ctx.identity.teams.get(teamId);
  if (!team) throw notFound(`Team ${teamId} not found.`, "team_id");
  const allowed = team.allowedPassthroughRoutes;
  const endpoints = ctx.snapshot.passThrough.endpoints.filter((e) => allowed.length === 0 || allowed.some((r) => grants(r, e)));
  return answer(ctx, endpoints);
}

/**
 * Whether a team's grant lets its keys call the endpoint, read as a call reads it (a route group
 * as access.ts authorizePassThrough does): its own path, or, for an endpoint that serves its
 * subpaths, a path below it (`/echo/a/*` for `/echo`: the keys call `/echo/a/…`, and the endpoint
 * was not listed).
 */
function grants(grant: string, e: PassThroughEndpoint): boolean {
  if (e.methods.some((m) => routeMatches(grant, e.route, m, true))) return true;
  const path = grant.endsWith("/*") ? grant.slice(0, -2) : grant;
  return e.includeSubpath && path.startsWith(`${e.route}/`);
}

export function passThroughAdminRoutes(deps: AdminDeps) {
  return new Elysia().get("/config/pass_through_endpoint", adminRoute(deps, allEndpoints)).get("/config/pass_through_endpoint/team/:team_id", adminRoute(deps, teamEndpoints));
}
