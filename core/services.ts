/** Long-lived services the host hands to snapshots, plugins and routes (all optional: tests run without a store). */
import type { CacheStore } from "./cache/store.ts";
import type { BudgetLedger, CallRecord, RateWindows, SpendHistory } from "./contract.ts";
import type { StoredModels } from "./identity/db-models.ts";
import type { ChangeBus } from "./identity/bus.ts";
import type { IdentityCache } from "./identity/cache.ts";
import type { CooldownShare } from "./router/cooldown-bus.ts";
import type { Store } from "./store/db.ts";

export interface HostServices {
  store?: Store;
  identity?: IdentityCache;
  bus?: ChangeBus;
  /** Budget counters (local, or in Redis); outlives config reloads. */
  ledger?: BudgetLedger;
  /** Rate-limit windows (Redis when configured); absent means one in-memory set for the process. */
  rateWindows?: RateWindows;
  /** Deployment cooldowns told to the other instances (Redis), when REDIS_URL is set. */
  cooldowns?: CooldownShare;
  /** The response cache in Redis, when REDIS_URL is set. */
  redisCache?: CacheStore;
  spendHistory?: SpendHistory;
  /** The store's spend log: every finished call is queued here. */
  spendLog?: SpendLog;
  /**
   * Model deployments stored through `/model/new`, merged after the config's own. Takes the
   * settings of the config being loaded: the decryption key follows its master key.
   */
  loadDbModels?(settings: { masterKey: string | undefined }): Promise<StoredModels>;
}

export interface SpendLog {
  record(call: CallRecord): void;
  flush(): Promise<void>;
}
