/**
 * Assembles the long-lived parts in order: config (validated first, so a bad file fails before
 * anything opens) → store → Redis → identity cache and change bus → live registry. Used by
 * main.ts and by the tests, so both run the same wiring.
 */
import type { Logger } from "./contract.ts";
import { applyConfigEnv, type ConfigEnv, readConfig } from "./config/load.ts";
import { ChangeBus } from "./identity/bus.ts";
import { IdentityCache } from "./identity/cache.ts";
import { loadDbModels } from "./identity/db-models.ts";
import { LastActiveWriter } from "./identity/last-active.ts";
import { KeyRotator } from "./identity/rotation.ts";
import { connectRedis, type RedisHandle } from "./kv/redis.ts";
import { Live, refusalErrors } from "./live.ts";
import { secretKey } from "./secrets.ts";
import type { HostServices } from "./services.ts";
import { SnapshotError } from "./snapshot.ts";
import { secretProblem } from "./callbacks/signing.ts";
import { BudgetAlerts } from "./spend/alerts.ts";
import { WebhookSender, webhookTargets } from "./callbacks/team-webhooks.ts";
import { toSpendEntry } from "./spend/entry.ts";
import { StoreSpendHistory } from "./spend/history.ts";
import { LocalLedger } from "./spend/ledger.ts";
import { RedisLedger } from "./spend/redis-ledger.ts";
import { retentionSettings, SpendLogRetention } from "./spend/retention.ts";
import { LocalWindows } from "./limits/local-windows.ts";
import { RedisCache } from "./cache/store.ts";
import { RedisWindows } from "./limits/redis-windows.ts";
import { CooldownBus } from "./router/cooldown-bus.ts";
import { nativeScriptRunner } from "./kv/scripts.ts";
import { PeriodRoller } from "./spend/roller.ts";
import { ReportPrebuild } from "./http/admin/report-prebuild.ts";
import { SpendWriter } from "./spend/writer.ts";
import { openStore, type Store } from "./store/db.ts";
import { join } from "node:path";
import { within } from "./timer.ts";

/** How long stopping waits for the store's background jobs once spend is flushed (or spilled). */
const STOP_JOBS_MS = 2000;
/** The spend dashboard's usual range: a month. */
const DEFAULT_PREBUILD_DAYS = 30;

export interface HostOptions {
  configPath: string;
  dataDir: string;
  databaseUrl?: string;
  /** openStore's answerTimeoutMs (tests shorten it). */
  databaseAnswerTimeoutMs?: number;
  redisUrl?: string;
  log: Logger;
  /** Spend writer tuning (tests use small bounds to exercise spilling). */
  spend?: { intervalMs?: number; batchSize?: number; memoryLimit?: number };
}

export interface Host {
  live: Live;
  store: Store;
  redis: RedisHandle | undefined;
  services: HostServices;
  spendWriter: SpendWriter;
  reportPrebuild: ReportPrebuild;
  alerts: BudgetAlerts;
  /** Flushes pending writes and closes everything, in reverse order. */
  close(): Promise<void>;
}

export async function startHost(opts: HostOptions): Promise<Host> {
  const first = await readConfig(opts.configPath);
  if (!first.ok) throw new SnapshotError(await refusalErrors(first, opts.configPath, opts.log));
  const general = first.config.general_settings ?? {};
  // The file's environment_variables are set before anything opens: a DATABASE_URL or REDIS_URL
  // (or DATABASE_ANSWER_TIMEOUT_MS) given there chooses the store and Redis as the environment's own would.
  const configEnv: ConfigEnv = new Map();
  applyConfigEnv(first.env, configEnv);
  const fromFile = (name: string) => configEnv.get(name) || undefined;

  const store = await openStore({
    databaseUrl: opts.databaseUrl ?? fromFile("DATABASE_URL") ?? general.database_url,
    answerTimeoutMs: opts.databaseAnswerTimeoutMs,
    dataDir: opts.dataDir,
    log: { info: (m) => opts.log.info(m), warn: (m) => opts.log.warn(m) },
  });
  const redisUrl = opts.redisUrl ?? fromFile("REDIS_URL") ?? general.redis_url;
  const redis = redisUrl ? connectRedis(redisUrl, opts.log) : undefined;
  const scripts = redisUrl ? nativeScriptRunner(redisUrl) : undefined;
  // The first calls should count in Redis, not alone: wait for the connection (bounded by its timeout).
  await scripts?.ready();
  // Set once the registry is up; until then, every announced cooldown is kept.
  let serving: ((id: string) => boolean) | undefined;
  const cooldowns = redis ? new CooldownBus(redis.client, opts.log, (id) => serving?.(id) ?? true) : undefined;
  try {
    const identity = new IdentityCache(store.db);
    await identity.loadAll();
    const bus = new ChangeBus(identity, opts.log, redis?.client, store.notifications);
    await bus.start();
    const lastActive = new LastActiveWriter(store.db, identity, opts.log);
    lastActive.start();
    let live: Live | undefined;
    const general = () => live?.current.config.general_settings;
    const webhook = () => {
      const g = general();
      const url = g?.alert_webhook_url ?? (process.env.WEBHOOK_URL || undefined);
      const secret = g?.alert_webhook_secret ?? (process.env.WEBHOOK_SECRET || undefined);
      return url === undefined ? undefined : { url, secret };
    };
    const envSecretProblem = process.env.WEBHOOK_SECRET ? secretProblem(process.env.WEBHOOK_SECRET) : undefined;
    // Config values are refused by the schema; the variable is read here, so it is told here (alerts then go unsigned).
    if (envSecretProblem) opts.log.error(`WEBHOOK_SECRET is not used: ${envSecretProblem}; budget alerts are sent unsigned`);
    const teamSender = new WebhookSender(opts.log);
    // A team's own budget alerts also go to the webhooks the team registered.
    const teamAlerts = (teamId: string, payload: Record<string, unknown>) => {
      const key = secretKey(process.env.SVC_SALT_KEY, live?.current.settings.masterKey);
      for (const t of webhookTargets(identity.teams.get(teamId), key, opts.log)) teamSender.post(t, payload);
    };
    const thresholds = () => general()?.budget_alert_thresholds;
    const alerts = new BudgetAlerts(store.db, opts.log, webhook, teamAlerts, thresholds);
    const ledger = redis ? new RedisLedger(redis.client, opts.log, alerts) : new LocalLedger(alerts);
    cooldowns?.start();
    const spendWriter = new SpendWriter(store, opts.log, {
      spillDir: join(opts.dataDir, "spend-spill"),
      logRows: () => general()?.disable_spend_logs !== true,
      ...opts.spend,
    });
    // Entries a previous run could not write are written before the first call is served.
    await spendWriter.start();
    const services: HostServices = {
      store,
      identity,
      bus,
      ledger,
      rateWindows: scripts ? new RedisWindows(scripts, opts.log) : new LocalWindows(),
      cooldowns,
      redisCache: redis ? new RedisCache(redis.client) : undefined,
      spendHistory: new StoreSpendHistory(store.db, () => spendWriter.flush()),
      spendLog: {
        record: (call) => {
          // `disable_error_logs` drops failures that cost nothing; one that cost money is always logged.
          if (call.status === "failure" && call.cost === 0n && general()?.disable_error_logs === true) return;
          spendWriter.enqueue(toSpendEntry(call, identity, live?.current.config.router_settings?.provider_budget_config));
        },
        flush: () => spendWriter.flush(),
      },
      loadDbModels: (s) => loadDbModels(store.db, secretKey(process.env.SVC_SALT_KEY, s.masterKey)),
    };
    live = await Live.start(opts.configPath, opts.log, services, configEnv);
    // Started last, so a failed start leaves no timer on a closed store.
    const rotator = new KeyRotator(store.db, bus, opts.log);
    rotator.start();
    const roller = new PeriodRoller(store.db, bus, opts.log);
    roller.start();
    const retention = new SpendLogRetention(store.db, opts.log, () => retentionSettings(general()));
    retention.start();
    alerts.delivery.start();
    const reportPrebuild = new ReportPrebuild(store.db, opts.log, () => general()?.spend_report_prebuild_days ?? DEFAULT_PREBUILD_DAYS);
    reportPrebuild.start();
    const started = live;
    serving = (id) => started.current.models.findById(id) !== undefined;
    return {
      live: started,
      store,
      redis,
      services,
      spendWriter,
      reportPrebuild,
      alerts,
      async close() {
        await started.close();
        // Calls that just ended hand their records over on the next turn of the event loop.
        await new Promise((r) => setImmediate(r));
        await spendWriter.stop();
        await teamSender.idle(1000);
        // Best effort from here (last_active marks, a budget-period roll, a clean-up or a key
        // rotation under way): with the store away every query waits out the driver's reconnect
        // back-off (up to 20 s each), which must not hold the exit. Together they get 2 s.
        await within(STOP_JOBS_MS, Promise.allSettled([roller.stop(), retention.stop(), alerts.delivery.stop(), rotator.stop(), lastActive.stop(), reportPrebuild.stop()]));
        await bus.stop();
        cooldowns?.stop();
        await redis?.close();
        scripts?.close();
        await store.close();
      },
    };
  } catch (err) {
    cooldowns?.stop();
    await redis?.close();
    scripts?.close();
    await store.close();
    throw err;
  }
}
