/** A team's logging callbacks as stored in `teams.callback_settings`. */
import { hiddenHeaderValues, redactSecrets } from "../secrets.ts";
import type { TeamRow } from "./records.ts";

export interface TeamWebhook {
  url: string;
  /** Header values encrypted at rest (secrets.ts). */
  headers: Record<string, string>;
  /**
   * Registered by a team admin, who may not make the gateway post inside this machine or its
   * network: its host is resolved before every delivery, which is refused when it lands there
   * (the name may have pointed elsewhere at registration). A proxy admin's webhooks may be private.
   */
  public_only?: boolean;
  /** The secret deliveries are signed with (callbacks/signing.ts), encrypted at rest like the headers. */
  signing_secret?: string;
}

export interface TeamCallbackSettings {
  /** Callback names for successful calls (`webhook`); empty when logging is disabled. */
  success_callback?: string[];
  failure_callback?: string[];
  webhooks?: TeamWebhook[];
  /**
   * Set by `POST /team/{id}/disable_logging`, cleared by the next registration: the team's calls
   * reach the spend log and the config's logging callbacks with billing metadata only, no prompt
   * or answer (the spec's "only billing metadata is recorded").
   */
  logging_disabled?: boolean;
}

/**
 * Which endpoint a webhook URL names, so two spellings of one give the same: the scheme and host
 * in any case, the default port written out or not, an empty path or `/`, and a fragment (never
 * sent) make no difference.
 */
export function webhookEndpoint(url: string): string {
  if (!URL.canParse(url)) return url;
  const u = new URL(url);
  u.hash = "";
  return u.href;
}

/**
 * The team's registered webhooks (none when it has no settings, or malformed ones), each endpoint
 * once: a team whose settings list one twice (stored before registration refused that) would
 * otherwise get every event twice.
 */
export function teamWebhooks(team: TeamRow | undefined): TeamWebhook[] {
  const hooks = (team?.callbackSettings as TeamCallbackSettings | null | undefined)?.webhooks;
  if (!Array.isArray(hooks)) return [];
  const seen = new Set<string>();
  return hooks.filter((w): w is TeamWebhook => {
    if (typeof w?.url !== "string" || w.headers === null || typeof w.headers !== "object") return false;
    const endpoint = webhookEndpoint(w.url);
    if (seen.has(endpoint)) return false;
    seen.add(endpoint);
    return true;
  });
}

/**
 * The team's callback settings as every response (and the audit trail) shows them: as stored, but
 * with its webhooks as they are delivered to (teamWebhooks: each endpoint once), their header
 * values hidden and other secrets redacted; null when the team has none.
 */
export function shownCallbackSettings(team: TeamRow, whole = true): unknown {
  const s = team.callbackSettings as TeamCallbackSettings | null;
  if (!s) return null;
  // Header values (a receiver's token, encrypted at rest) are shown as GET /team/{id}/callback shows them: hidden.
  // To who may not read that route (a team's `user` members), the address only by its origin: its
  // path or query may hold a token (a Slack-style webhook URL is its own credential).
  const webhooks = teamWebhooks(team).map((w) => (whole ? shownWebhook(w) : { ...shownWebhook(w), url: originOf(w.url) }));
  return redactSecrets(Array.isArray(s.webhooks) ? { ...s, webhooks } : s);
}

function originOf(url: string): string {
  try {
    return `${new URL(url).origin}/[redacted]`;
  } catch {
    return "[redacted]";
  }
}

/** A webhook as responses show it: its header values and signing secret hidden (the secret's presence shown). */
export function shownWebhook(w: TeamWebhook): Record<string, unknown> {
  return { url: w.url, headers: hiddenHeaderValues(w.headers), ...(typeof w.signing_secret === "string" ? { signing_secret: "[redacted]" } : {}) };
}

/** Whether the team logs calls that ended with `status` (`success`, or anything else as a failure). */
export function teamLogs(team: TeamRow | undefined, success: boolean): boolean {
  const s = team?.callbackSettings as TeamCallbackSettings | null | undefined;
  const names = success ? s?.success_callback : s?.failure_callback;
  return Array.isArray(names) && names.includes("webhook");
}

/** Whether the team turned its logging off (`disable_logging`): its calls are recorded without their content. */
export function teamLoggingDisabled(team: TeamRow | undefined): boolean {
  return (team?.callbackSettings as TeamCallbackSettings | null | undefined)?.logging_disabled === true;
}
