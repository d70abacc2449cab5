import { createHash, timingSafeEqual } from "node:crypto";
import { Type } from "@sinclair/typebox";
import { definePlugin, type Hooks } from "../core/contract.ts";
import { MASTER_USER_ID } from "../core/identity/master-user.ts";

/** The master key: full proxy-admin rights. Compared in constant time (only its length can leak). */
export default definePlugin({
  name: "auth-master-key",
  config: Type.Object({}),
  setup(_cfg, ctx): Hooks {
    const master = ctx.settings.masterKey;
    if (!master) return {};
    const masterBytes = Buffer.from(master);
    const masterHash = createHash("sha256").update(master).digest("hex");
    return {
      auth: {
        resolve({ credential }) {
          if (!credential || credential.length !== master.length) return null;
          const given = Buffer.from(credential);
          if (given.length !== masterBytes.length || !timingSafeEqual(given, masterBytes)) return null;
          return { keyHash: masterHash, role: "proxy_admin", userId: MASTER_USER_ID, metadata: {} };
        },
      },
    };
  },
});
