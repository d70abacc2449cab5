/**
 * Assembles the long-lived parts in order: config (validated first, so a bad file fails before
 * anything opens) → store → Redis → identity cache and change bus → live registry. Used by
 * main.ts and by the tests, so both run the same wiring.
 */
import type { Logger } from "./contract.ts";
import { readConfig } from "./config/load.ts";
import { ChangeBus } from "./identity/bus.ts";
import { IdentityCache } from "./identity/cache.ts";
import { loadDbModels } from "./identity/db-models.ts";
import { LastActiveWriter } from "./identity/last-active.ts";
import { KeyRotator } from "./identity/rotation.ts";
import { connectRedis, type RedisHandle } from "./kv/redis.ts";
import { Live } from "./live.ts";
import { secretKey } from "./secrets.ts";
import type { HostServices } from "./services.ts";
import { SnapshotError } from "./snapshot.ts";
import { openStore, type Store } from "./store/db.ts";

export interface HostOptions {
  configPath: string;
  dataDir: string;
  databaseUrl?: string;
  redisUrl?: string;
  log: Logger;
}

export interface Host {
  live: Live;
  store: Store;
  redis: RedisHandle | undefined;
  services: HostServices;
  /** Flushes pending writes and closes everything, in reverse order. */
  close(): Promise<void>;
}

export async function startHost(opts: HostOptions): Promise<Host> {
  const first = await readConfig(opts.configPath);
  if (!first.ok) throw new SnapshotError(first.errors);
  const general = first.config.general_settings ?? {};

  const store = await openStore({
    databaseUrl: opts.databaseUrl ?? general.database_url,
    dataDir: opts.dataDir,
    log: { info: (m) => opts.log.info(m), warn: (m) => opts.log.warn(m) },
  });
  const redisUrl = opts.redisUrl ?? general.redis_url;
  const redis = redisUrl ? connectRedis(redisUrl, opts.log) : undefined;
  try {
    const identity = new IdentityCache(store.db);
    await identity.loadAll();
    const bus = new ChangeBus(identity, opts.log, redis?.client, store.notifications);
    await bus.start();
    const lastActive = new LastActiveWriter(store.db, identity, opts.log);
    lastActive.start();
    const services: HostServices = {
      store,
      identity,
      bus,
      loadDbModels: (s) => loadDbModels(store.db, secretKey(process.env.SVC_SALT_KEY, s.masterKey)),
    };
    const live = await Live.start(opts.configPath, opts.log, services);
    // Started last, so a failed start leaves no timer on a closed store.
    const rotator = new KeyRotator(store.db, bus, opts.log);
    rotator.start();
    return {
      live,
      store,
      redis,
      services,
      async close() {
        await live.close();
        await rotator.stop();
        await lastActive.stop();
        await bus.stop();
        await redis?.close();
        await store.close();
      },
    };
  } catch (err) {
    await redis?.close();
    await store.close();
    throw err;
  }
}
