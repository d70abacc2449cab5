/**
 * The frame of every management route: authenticate, resolve the caller's rights, validate the
 * body (422 naming the field), give access to the store and the identity cache, and write the
 * audit trail. Routes hold only their own rules.
 *
 * Text the store cannot hold is refused here, in the body, the query and the path alike: a NUL
 * (PostgreSQL's text and jsonb refuse it) and a UTF-16 surrogate without its pair (jsonb refuses
 * its escape). Let through, it fails the route's first query or insert as a 500.
 */
import { randomUUID } from "node:crypto";
import type { TSchema } from "@sinclair/typebox";
import { Caller } from "../../authz.ts";
import type { Logger } from "../../contract.ts";
import { GatewayError } from "../../errors.ts";
import type { IdentityCache } from "../../identity/cache.ts";
import type { IdentityChange } from "../../identity/records.ts";
import { toApi } from "../../identity/serialize.ts";
import type { Live } from "../../live.ts";
import { redactSecrets } from "../../secrets.ts";
import { isConnectionLost, storeErrorCause } from "../../store/sql.ts";
import { forgetAlerts } from "../../spend/alerts.ts";
import type { HostServices } from "../../services.ts";
import type { Snapshot } from "../../snapshot.ts";
import type { Db } from "../../store/db.ts";
import { auditLog } from "../../store/schema.ts";
import { authenticate, requireMasterKeyConfigured } from "../auth.ts";
import { checker, readBodyKeepingNumbers } from "../validate.ts";
import { MAX_NAME_CHARS } from "../../wire.ts";

export interface AdminDeps {
  live: Live;
  log: Logger;
  services: HostServices;
}

export interface AuditEntry {
  action: "created" | "updated" | "deleted" | "blocked" | "unblocked" | "rotated" | "spend_reset";
  table: string;
  objectId: string;
  before?: unknown;
  after?: unknown;
}

export interface AdminCtx {
  caller: Caller;
  request: Request;
  url: URL;
  snapshot: Snapshot;
  db: Db;
  identity: IdentityCache;
  log: Logger;
  /** The JSON body, checked against `schema` (422 naming the first bad field). */
  body<S extends TSchema>(schema: S): Promise<S["static"]>;
  query(name: string): string | undefined;
  /** Applies identity changes here and on every other instance. */
  changed(...changes: IdentityChange[]): Promise<void>;
  /** Writes queued spend now, so a hand-set spend is not followed by older spend landing on top of it. */
  flushSpend(): Promise<void>;
  /** Spend was set by hand: these budget counters start again from the stored figure, and their alerts may be sent again. */
  forgetBudgets(counterIds: string[]): Promise<void>;
  audit(entry: AuditEntry): Promise<void>;
}

/** An audited value in the API's form (snake_case names, money as numbers), whichever form a route passes: rows and API objects alike. */
function asApi(value: unknown): unknown {
  return value !== null && typeof value === "object" && !Array.isArray(value) ? toApi(value as Record<string, unknown>) : value;
}

const checkers = new WeakMap<TSchema, (v: unknown) => unknown>();

// biome-ignore lint/suspicious/noControlCharactersInRegex: NUL is what is looked for
const UNSTORABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/**
 * Ids and names the store indexes, wherever they appear in a body (a member's `user_id`, and the
 * `member_email` of /team/member_add's team-key form, too): each
 * is at most MAX_NAME_CHARS, as a call's model and user are. An index entry holds ~2,700 bytes, and
 * ids also make up the daily aggregates' keys (entity, key, model, group): a 2,700-character
 * `team_id` was stored, and then every call of its keys was refused by the spend log, uncharged.
 */
const NAME_FIELDS: ReadonlySet<string> = new Set(["team_id", "user_id", "organization_id", "budget_id", "user_email", "member_email", "key_alias", "access_group", "access_group_id", "model_name"]);
/** The same by their place: a stored model's id and its upstream model. */
const NAME_PATHS: ReadonlySet<string> = new Set(["model_info.id", "svc_params.model"]);

type BodyProblem = { at: string; kind: "unstorable" | "too long" | "not finite" };

/** Where in a parsed body (a field path as the 422s name it) the first text the store cannot hold, or an overlong id or name, is. */
function problemAt(body: Record<string, unknown>): BodyProblem | undefined {
  // Iterative: a body may nest deeper than the call stack.
  const stack: [unknown, string, string][] = [[body, "", ""]];
  for (let item = stack.pop(); item; item = stack.pop()) {
    const [value, path, name] = item;
    if (typeof value === "string") {
      if (UNSTORABLE.test(value)) return { at: path, kind: "unstorable" };
      if (value.length > MAX_NAME_CHARS && (NAME_FIELDS.has(name) || NAME_PATHS.has(path))) return { at: path, kind: "too long" };
    } else if (typeof value === "number") {
      // 1e400 parses as Infinity, which JSON (and so the store) would keep as null: the value changed silently.
      if (!Number.isFinite(value)) return { at: path, kind: "not finite" };
    } else if (value && typeof value === "object") {
      for (const [k, v] of Object.entries(value)) {
        const at = path ? `${path}.${k}` : k;
        if (UNSTORABLE.test(k)) return { at, kind: "unstorable" };
        stack.push([v, at, k]);
      }
    }
  }
  return undefined;
}

const unstorable = (where: string) =>
  GatewayError.of(422, `Invalid request: ${where}: contains a NUL character or an unpaired surrogate, which cannot be stored`, "validation_error", where);

const notFinite = (where: string) => GatewayError.of(422, `Invalid request: ${where}: a number too large to hold (beyond ±1.8e308)`, "validation_error", where);

const tooLong = (where: string) => GatewayError.of(422, `Invalid request: ${where}: at most ${MAX_NAME_CHARS} characters (an id or name the store indexes)`, "validation_error", where);

/** The path's segments and the query must be valid percent-encoding of storable text. */
function checkUrl(url: URL): void {
  for (const segment of url.pathname.split("/")) {
    let text: string;
    try {
      text = decodeURIComponent(segment);
    } catch {
      throw GatewayError.of(400, `The path segment ${JSON.stringify(segment.slice(0, 100))} is not valid percent-encoding.`, "invalid_request_error", "path");
    }
    if (UNSTORABLE.test(text)) throw GatewayError.of(400, "The path contains a NUL character or an unpaired surrogate.", "invalid_request_error", "path");
  }
  for (const [name, value] of url.searchParams) if (UNSTORABLE.test(name) || UNSTORABLE.test(value)) throw unstorable(name);
}

/** How long a management read may run before the store is checked for an outage. */
const SLOW_CALL_MS = 5000;

/** A call that changes nothing: answering it before it ends loses nothing. */
const isRead = (request: Request) => request.method === "GET" || request.method === "HEAD";

export function adminRoute<R>(deps: AdminDeps, handler: (ctx: AdminCtx) => Promise<R>) {
  return async ({ request }: { request: Request }): Promise<R> => {
    const { store, identity, bus } = deps.services;
    // What other instances wrote before this call first (identity rows, and stored models with the
    // registry they rebuild), so it is authorized and checked against them, not a cache a few
    // milliseconds behind.
    await bus?.caughtUp();
    await deps.live.storedModelsReload?.catch(() => undefined);
    const snapshot = deps.live.current;
    const url = new URL(request.url);
    requireMasterKeyConfigured(snapshot);
    const principal = await authenticate(snapshot, request.headers, url.pathname, request.method);
    if (!store || !identity || !bus) throw GatewayError.of(503, "The management API needs the store, which is not open.", "api_connection_error");
    checkUrl(url);
    // An empty header names no one (LiteLLM: `if litellm_changed_by:`): taken as given, anyone could record "" as who acted.
    const changedBy = request.headers.get("svc-changed-by") || (principal.userId ?? (principal.key ? `key:${principal.keyHash.slice(0, 12)}` : "proxy_admin"));
    const caller = new Caller(principal, identity, changedBy);
    let parsed: Record<string, unknown> | undefined;
    const ctx: AdminCtx = {
      caller,
      request,
      url,
      snapshot,
      db: store.db,
      identity,
      log: deps.log,
      async body(schema) {
        if (!parsed) {
          parsed = await readBodyKeepingNumbers(request, snapshot.settings.maxRequestBytes);
          const problem = problemAt(parsed);
          if (problem) throw problem.kind === "unstorable" ? unstorable(problem.at) : problem.kind === "too long" ? tooLong(problem.at) : notFinite(problem.at);
        }
        let check = checkers.get(schema);
        if (!check) {
          check = checker(schema);
          checkers.set(schema, check);
        }
        return check(parsed) as never;
      },
      query: (name) => url.searchParams.get(name) ?? undefined,
      changed: (...changes) => bus.publish(...changes),
      flushSpend: async () => deps.services.spendLog?.flush(),
      forgetBudgets: async (ids) => {
        await deps.services.ledger?.forget(ids);
        await forgetAlerts(store.db, ids);
        // Without Redis each instance holds its own counters: the others drop theirs too.
        await bus.announce({ kind: "spend_reset", counters: ids });
      },
      async audit(e) {
        // Written after the change has committed: a failure here must not answer a 500 for a
        // change that was made (a created key's plaintext would be lost with it). It is logged.
        try {
          await store.db.insert(auditLog).values({
            id: randomUUID(),
            changedBy: caller.changedBy,
            changedByApiKey: principal.keyHash,
            action: e.action,
            tableName: e.table,
            objectId: e.objectId,
            beforeValue: e.before === undefined ? null : redactSecrets(asApi(e.before)),
            updatedValues: e.after === undefined ? null : redactSecrets(asApi(e.after)),
          });
        } catch (err) {
          deps.log.error("audit log entry not written; the change itself was made", { table: e.table, action: e.action, ...storeErrorCause(err) });
        }
      },
    };
    const storeDown = async (err?: unknown): Promise<GatewayError | undefined> => {
      const reachable = await store.ping();
      if (!reachable.ok) {
        deps.log.warn("management call failed: store unreachable", { path: url.pathname, error: reachable.detail });
        return GatewayError.of(
          503,
          "The store is unreachable, so this management call failed (it may not have been applied). Retry when the database is back.",
          "api_connection_error",
        );
      }
      // The connection lost under the call (the database restarted, failed over): the store is
      // back already, but this call's write may or may not have been applied.
      if (isConnectionLost(err)) {
        deps.log.warn("management call failed: store connection lost", { path: url.pathname, ...storeErrorCause(err) });
        return GatewayError.of(503, "The connection to the store was lost during this management call, so it may not have been applied. Check, then retry.", "api_connection_error");
      }
      return undefined;
    };
    const work = handler(ctx);
    try {
      // A write is answered with its outcome, however long the store takes to give it: answered
      // 503 while it still ran, it was applied afterwards (a key stored whose plaintext nobody
      // got). Its queries fail on their own while the store is gone: a refused connect at once,
      // an unanswered one after 5 s, a connection that stopped answering after
      // DATABASE_ANSWER_TIMEOUT_MS (store/pg-answer-watch.ts).
      if (!isRead(request)) return await work;
      // A read need not wait that long: after a while, check the store and answer 503.
      let timer: ReturnType<typeof setTimeout> | undefined;
      const slow = new Promise<"slow">((resolve) => {
        timer = setTimeout(() => resolve("slow"), SLOW_CALL_MS);
      });
      const first = await Promise.race([work, slow]).finally(() => clearTimeout(timer));
      if (first !== "slow") return first;
      const down = await storeDown();
      if (down) {
        work.catch(() => undefined);
        throw down;
      }
      return await work;
    } catch (err) {
      if (err instanceof GatewayError) throw err;
      // A failure because the store is unreachable is the client's to retry, not a bug.
      throw (await storeDown(err)) ?? err;
    }
  };
}
