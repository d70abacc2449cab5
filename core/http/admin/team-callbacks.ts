/**
 * A team's logging callbacks: `POST /team/{team_id}/callback` registers webhooks that get every
 * finished call of the team (and its budget alerts), `GET` shows them (header values hidden),
 * `POST /team/{team_id}/disable_logging` turns them all off, and keeps the team's prompts and
 * answers out of the spend log and the config's logging callbacks until webhooks are registered
 * again. Proxy admins and the team's admins
 * manage them. This gateway delivers team logs to webhooks only: a named logging provider
 * (`langfuse`, `langsmith`, a storage bucket) is refused with a 400 rather than stored and never
 * served. Header values and a webhook's `signing_secret` are encrypted at rest like stored provider
 * credentials, and never shown again.
 */
import { type Static, Type as T } from "@sinclair/typebox";
import { and, eq, isNull } from "drizzle-orm";
import { Elysia } from "elysia";
import { badRequest, forbidden, notFound } from "../../authz.ts";
import { holdWrite } from "../../identity/holds.ts";
import { shownWebhook, type TeamCallbackSettings, type TeamWebhook, teamWebhooks, webhookEndpoint } from "../../identity/team-callbacks.ts";
import type { TeamRow } from "../../identity/records.ts";
import { resolvesPrivate } from "../../private-host.ts";
import { secretProblem } from "../../callbacks/signing.ts";
import { readableWebhook, UNREADABLE_WEBHOOK } from "../../callbacks/team-webhooks.ts";
import { encrypt, secretKey } from "../../secrets.ts";
import { teams } from "../../store/schema.ts";
import { type AdminCtx, type AdminDeps, adminRoute } from "./context.ts";

const Webhook = T.Object(
  {
    callback_type: T.Literal("webhook"),
    // The scheme in any case, as URLs allow (then compared as the same webhook, see checkDistinct).
    url: T.String({ pattern: "^[Hh][Tt][Tt][Pp][Ss]?://", maxLength: 2048 }),
    headers: T.Optional(T.Record(T.String(), T.String())),
    /** Deliveries are signed with it (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature). */
    signing_secret: T.Optional(T.String({ maxLength: 256 })),
  },
  { additionalProperties: false },
);
const CallbackBody = T.Object(
  {
    callbacks: T.Optional(T.Array(Webhook, { minItems: 1, maxItems: 10 })),
    callback_name: T.Optional(T.String()),
    callback_type: T.Optional(T.Union([T.Literal("success"), T.Literal("failure"), T.Literal("success_and_failure")])),
    callback_vars: T.Optional(T.Record(T.String(), T.Unknown())),
  },
  { additionalProperties: false },
);
type CallbackBody = Static<typeof CallbackBody>;

/** The team named in the path, if the caller administers it (proxy admin or team admin; to read, also the admin viewer). */
async function administeredTeam(ctx: AdminCtx, write: boolean): Promise<TeamRow> {
  const teamId = decodeURIComponent(ctx.url.pathname.split("/")[2] ?? "");
  const c = ctx.caller;
  if (write) c.requireWriter();
  if (write ? !c.isTeamAdmin(teamId) : !c.maySeeCallbacks(teamId)) throw forbidden(`Only a proxy admin or an admin of team ${teamId} may manage its logging callbacks.`);
  const [team] = await ctx.db
    .select()
    .from(teams)
    .where(and(eq(teams.teamId, teamId), isNull(teams.deletedAt)));
  if (!team) throw notFound(`Team ${teamId} not found.`, "team_id");
  return team;
}

/** The key webhook headers and secrets are encrypted with (as stored provider credentials are). */
const webhookKey = (ctx: AdminCtx) => secretKey(process.env.SVC_SALT_KEY, ctx.snapshot.settings.masterKey);

/**
 * What GET answers: the callback names per kind and their variables, header values hidden. Given
 * the current key, a webhook it cannot decrypt is shown as broken (it gets no events) rather than
 * as registered like the others.
 */
function view(team: TeamRow, key?: Buffer): Record<string, unknown> {
  const settings = (team.callbackSettings ?? {}) as TeamCallbackSettings;
  const shown = (w: TeamWebhook) => (key === undefined || readableWebhook(w, key) ? shownWebhook(w) : { ...shownWebhook(w), status: "broken", error: UNREADABLE_WEBHOOK });
  return {
    team_id: team.teamId,
    success_callbacks: settings.success_callback ?? [],
    failure_callbacks: settings.failure_callback ?? [],
    callback_vars: {
      webhooks: teamWebhooks(team).map(shown),
    },
  };
}

async function save(ctx: AdminCtx, before: TeamRow, settings: TeamCallbackSettings): Promise<TeamRow> {
  const after = await ctx.db.transaction(async (tx) => {
    // The live team only: a team deleted since it was read is the 404 it is after the deletion (the
    // deletion keeps its row, and this would have written callbacks onto a deleted team).
    const live = and(eq(teams.teamId, before.teamId), isNull(teams.deletedAt));
    const [locked] = await tx.select({ id: teams.teamId }).from(teams).where(live).for("update");
    if (!locked) return undefined;
    // A team admin's right is the store's, under the team's lock (holds.ts), not the cache's.
    await holdWrite(tx, ctx.caller);
    const [after] = await tx
      .update(teams)
      .set({ callbackSettings: settings as Record<string, unknown>, updatedAt: new Date(), updatedBy: ctx.caller.changedBy })
      .where(live)
      .returning();
    return after;
  });
  if (!after) throw notFound(`Team ${before.teamId} not found: it was deleted meanwhile.`, "team_id");
  await ctx.changed({ kind: "team", teamId: before.teamId });
  await ctx.audit({ action: "updated", table: "teams", objectId: before.teamId, before: view(before), after: view(after) });
  return after;
}

/** Headers HTTP itself sets (the body's length, where it goes, the connection): not a webhook's to choose. */
const HTTP_HEADERS = new Set(["host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer", "proxy-connection"]);
/** Headers the gateway sets on every delivery (callbacks/signing.ts). */
const DELIVERY_HEADERS = new Set(["webhook-id", "webhook-timestamp", "webhook-signature"]);

/**
 * A webhook's headers must be ones a request can carry: refused here, with the header named,
 * rather than stored and found out at every delivery (which would then fail without a word).
 */
function checkHeaders(url: string, headers: Record<string, string>): void {
  const seen = new Set<string>();
  for (const [name, value] of Object.entries(headers)) {
    const lower = name.toLowerCase();
    const bad = (why: string) => badRequest(`Webhook ${url}: header ${JSON.stringify(name)} ${why}.`, "callbacks");
    if (seen.has(lower)) throw bad("is given twice (header names are case-insensitive)");
    seen.add(lower);
    if (HTTP_HEADERS.has(lower)) throw bad("is set by HTTP itself, not by a webhook");
    if (DELIVERY_HEADERS.has(lower)) throw bad("is set by the gateway on every delivery (give signing_secret to have deliveries signed)");
    try {
      new Headers([[name, value]]);
    } catch {
      throw bad(/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(name) ? "has a value no HTTP request can carry (a line break or NUL)" : "is not a valid HTTP header name");
    }
  }
}

/**
 * Each endpoint once: a webhook listed twice would get every event twice. A POST replaces the set,
 * so only the list itself can repeat one (a webhook registered before is simply listed again).
 */
function checkDistinct(urls: string[]): void {
  const first = new Map<string, string>();
  for (const url of urls) {
    const endpoint = webhookEndpoint(url);
    const earlier = first.get(endpoint);
    if (earlier === undefined) first.set(endpoint, url);
    else {
      const spelled = earlier === url ? "" : ` (as ${earlier})`;
      throw badRequest(`Webhook ${url} is listed twice${spelled}: each webhook gets every event once, list it once.`, "callbacks");
    }
  }
}

async function addCallback(ctx: AdminCtx) {
  const team = await administeredTeam(ctx, true);
  const body: CallbackBody = await ctx.body(CallbackBody);
  if (!body.callbacks) {
    const name = body.callback_name ?? "(none)";
    throw badRequest(
      `callback_name '${name}' is not available: this gateway delivers team logs to webhooks only. Register them as {"callbacks": [{"callback_type": "webhook", "url": "https://…", "headers": {…}}]}.`,
      body.callback_name ? "callback_name" : "callbacks",
    );
  }
  const unreadable = body.callbacks.find((c) => !URL.canParse(c.url));
  if (unreadable) throw badRequest(`Webhook url ${JSON.stringify(unreadable.url)} is not a valid URL.`, "callbacks");
  checkDistinct(body.callbacks.map((c) => c.url));
  for (const c of body.callbacks) {
    checkHeaders(c.url, c.headers ?? {});
    const problem = c.signing_secret === undefined ? undefined : secretProblem(c.signing_secret);
    if (problem) throw badRequest(`Webhook ${c.url}: signing_secret is refused: ${problem}.`, "callbacks");
  }
  // A team admin must not make the gateway post to this machine or its private network (SSRF); a proxy admin may.
  // A name is resolved too: `http://<this host's name>/` or a public-looking name whose record points
  // inward passed the literal check (LiteLLM #24952); deliveries check again (public_only).
  if (!ctx.caller.isAdmin) {
    for (const c of body.callbacks) {
      if (await resolvesPrivate(new URL(c.url).hostname)) {
        throw badRequest(`Webhook ${c.url} points at this machine or a private network; only a proxy admin may register such a webhook.`, "callbacks");
      }
    }
  }
  const key = webhookKey(ctx);
  if (!key) throw badRequest("A master key (or SVC_SALT_KEY) is needed to keep webhook headers encrypted.", "callbacks");
  const webhooks = body.callbacks.map((c) => ({
    url: c.url,
    headers: Object.fromEntries(Object.entries(c.headers ?? {}).map(([h, v]) => [h, encrypt(v, key)])),
    ...(ctx.caller.isAdmin ? {} : { public_only: true }),
    ...(c.signing_secret === undefined ? {} : { signing_secret: encrypt(c.signing_secret, key) }),
  }));
  // LiteLLM's callback_type: which calls the webhooks get (a cancelled call counts with the failures); both when absent.
  const type = body.callback_type ?? "success_and_failure";
  const settings: TeamCallbackSettings = {
    success_callback: type === "failure" ? [] : ["webhook"],
    failure_callback: type === "success" ? [] : ["webhook"],
    webhooks,
  };
  return { status: "success", data: view(await save(ctx, team, settings)) };
}

async function getCallbacks(ctx: AdminCtx) {
  return { status: "success", data: view(await administeredTeam(ctx, false), webhookKey(ctx)) };
}

async function disableLogging(ctx: AdminCtx) {
  const team = await administeredTeam(ctx, true);
  const after = await save(ctx, team, { success_callback: [], failure_callback: [], webhooks: [], logging_disabled: true });
  return { status: "success", message: `Logging disabled for team ${team.teamId}`, data: view(after) };
}

export function teamCallbackRoutes(deps: AdminDeps) {
  return new Elysia()
    .post("/team/:team_id/callback", adminRoute(deps, addCallback))
    .get("/team/:team_id/callback", adminRoute(deps, getCallbacks))
    .post("/team/:team_id/disable_logging", adminRoute(deps, disableLogging));
}
