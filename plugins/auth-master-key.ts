import { createHash, timingSafeEqual } from "node:crypto";
import { Type } from "@sinclair/typebox";
import { definePlugin, type Hooks } from "../core/contract.ts";

const digest = (s: string) => createHash("sha256").update(s).digest();

/** The master key: full proxy-admin rights. Compared in constant time. */
export default definePlugin({
  name: "auth-master-key",
  config: Type.Object({}),
  setup(_cfg, ctx): Hooks {
    const master = ctx.settings.masterKey;
    if (!master) return {};
    const masterDigest = digest(master);
    const masterHash = masterDigest.toString("hex");
    return {
      auth: {
        resolve({ credential }) {
          if (!credential || !timingSafeEqual(digest(credential), masterDigest)) return null;
          return { keyHash: masterHash, role: "proxy_admin", userId: "default_user_id", metadata: {} };
        },
      },
    };
  },
});
