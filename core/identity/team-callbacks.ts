/** A team's logging callbacks as stored in `teams.callback_settings`. */
import type { TeamRow } from "./records.ts";

export interface TeamWebhook {
  url: string;
  /** Header values encrypted at rest (secrets.ts). */
  headers: Record<string, string>;
}

export interface TeamCallbackSettings {
  /** Callback names for successful calls (`webhook`); empty when logging is disabled. */
  success_callback?: string[];
  failure_callback?: string[];
  webhooks?: TeamWebhook[];
}

/** The team's registered webhooks (none when it has no settings, or malformed ones). */
export function teamWebhooks(team: TeamRow | undefined): TeamWebhook[] {
  const hooks = (team?.callbackSettings as TeamCallbackSettings | null | undefined)?.webhooks;
  if (!Array.isArray(hooks)) return [];
  return hooks.filter((w): w is TeamWebhook => typeof w?.url === "string" && w.headers !== null && typeof w.headers === "object");
}

/** Whether the team logs calls that ended with `status` (`success`, or anything else as a failure). */
export function teamLogs(team: TeamRow | undefined, success: boolean): boolean {
  const s = team?.callbackSettings as TeamCallbackSettings | null | undefined;
  const names = success ? s?.success_callback : s?.failure_callback;
  return Array.isArray(names) && names.includes("webhook");
}
