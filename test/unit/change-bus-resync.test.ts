// After the LISTEN connection comes back, the identity cache reloads everything (changes sent
// meanwhile are lost). A reload that fails then (the store's connections being replaced too) was
// logged and never tried again: the instance kept its stale rows until the next change.
import { expect, test } from "bun:test";
import { ChangeBus } from "../../core/identity/bus.ts";
import type { IdentityCache } from "../../core/identity/cache.ts";
import type { Notifications } from "../../core/store/db.ts";
import { memoryLogger } from "../harness/gateway.ts";

test("a full reload that fails after a re-listen is tried again until it succeeds", async () => {
  let attempts = 0;
  const cache = {
    apply: async () => {
      attempts++;
      if (attempts < 3) throw new Error("connection closed");
    },
    refresh: async () => undefined,
    settled: async () => undefined,
  } as unknown as IdentityCache;
  let relisten: () => void = () => undefined;
  const pg: Notifications = {
    listen: async (_channel, _onMessage, onListen) => {
      relisten = onListen;
      onListen();
    },
    notify: async () => undefined,
  };
  const log = memoryLogger();
  const bus = new ChangeBus(cache, log, undefined, pg);
  await bus.start();
  expect(attempts).toBe(0);
  relisten();
  const until = performance.now() + 5000;
  while (attempts < 3 && performance.now() < until) await Bun.sleep(50);
  expect(attempts).toBe(3);
  expect(log.lines.filter((l) => l.msg.startsWith("identity resync failed")).length).toBe(2);
  await bus.stop();
});
