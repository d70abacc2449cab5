/**
 * Team webhooks (`POST /team/{team_id}/callback`): every finished call of a team that registered
 * webhooks is posted to them, off the response path (core/callbacks/team-webhooks.ts).
 */
import { Type } from "@sinclair/typebox";
import { callPayload, WebhookSender, type WebhookTarget, webhookTargets } from "../core/callbacks/team-webhooks.ts";
import { definePlugin, type Hooks, type TeamRow } from "../core/contract.ts";
import { teamLogs } from "../core/identity/team-callbacks.ts";
import { secretKey } from "../core/secrets.ts";

export default definePlugin({
  name: "team-webhooks",
  config: Type.Object({}),
  setup(_config, ctx): Hooks {
    const identity = ctx.identity;
    if (!identity) return {};
    const key = secretKey(process.env.SVC_SALT_KEY, ctx.settings.masterKey);
    const sender = new WebhookSender(ctx.log);
    // Decrypted once per team row (a change to the team replaces the row).
    const decrypted = new WeakMap<TeamRow, WebhookTarget[]>();
    const targetsOf = (team: TeamRow) => {
      let t = decrypted.get(team);
      if (!t) {
        t = webhookTargets(team, key, ctx.log);
        decrypted.set(team, t);
      }
      return t;
    };
    // Said at start (and at a reload that changes the key), not only at a team's next call: a
    // quiet team's webhooks would otherwise be found broken only when its events were needed.
    for (const team of identity.teams.values()) targetsOf(team);
    return {
      spend: {
        record(call) {
          const teamId = call.principal.teamId;
          if (!teamId) return;
          const team = identity.teams.get(teamId);
          if (!team || !teamLogs(team, call.status === "success")) return;
          const targets = targetsOf(team);
          if (targets.length === 0) return;
          const payload = callPayload(call);
          for (const t of targets) sender.post(t, payload);
        },
        flush: () => sender.idle(),
      },
    };
  },
});
