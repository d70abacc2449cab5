/** The run interface: flags and environment variables (documented in the README). */
import { parseArgs } from "node:util";

export interface RunOptions {
  configPath: string;
  port: number;
  host: string;
  dataDir: string;
  databaseUrl: string | undefined;
  redisUrl: string | undefined;
  /** Seconds SIGTERM waits for in-flight requests before closing connections. */
  drainSeconds: number;
}

export const USAGE = `usage: gateway [--config PATH] [--port N] [--host H] [--data-dir DIR]

  --config PATH    config file (default ./config.yaml)
  --port N         listen port (default 4000, env PORT)
  --host H         listen address (default 0.0.0.0, env HOST)
  --data-dir DIR   embedded store folder when DATABASE_URL is unset (default ./.data)

environment: DATABASE_URL, REDIS_URL, SVC_MASTER_KEY, PORT, HOST, SVC_DRAIN_TIMEOUT`;

export function parseRunOptions(argv: string[], env: NodeJS.ProcessEnv): RunOptions {
  const { values } = parseArgs({
    args: argv,
    options: {
      config: { type: "string" },
      port: { type: "string" },
      host: { type: "string" },
      "data-dir": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  // An empty variable counts as unset. Digits only: Number() would also take "", "1e3" or "0x10".
  const rawPort = values.port ?? (env.PORT || "4000");
  const port = Number(rawPort);
  if (!/^\d{1,5}$/.test(rawPort) || port > 65535) throw new Error(`invalid port "${rawPort}": expected an integer from 0 to 65535`);
  // Seconds, whole or decimal. Anything else ("5s", "-1") is refused, not replaced by the default:
  // a drain longer than the grace period the operator fitted it to is cut by SIGKILL.
  const rawDrain = env.SVC_DRAIN_TIMEOUT || "30";
  if (!/^\d+(\.\d+)?$/.test(rawDrain)) throw new Error(`invalid SVC_DRAIN_TIMEOUT "${rawDrain}": expected a number of seconds, 0 or more (e.g. 30 or 2.5)`);
  return {
    configPath: values.config ?? "./config.yaml",
    port,
    host: values.host || env.HOST || "0.0.0.0",
    dataDir: values["data-dir"] ?? "./.data",
    databaseUrl: env.DATABASE_URL || undefined,
    redisUrl: env.REDIS_URL || undefined,
    drainSeconds: Number(rawDrain),
  };
}
