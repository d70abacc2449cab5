/**
 * A gateway on a fresh PostgreSQL database reached through a TcpRelay, so a test can take the
 * database away from the gateway (cut, stall, refuse) while it still reads the database directly.
 */
import { afterAll, beforeAll } from "bun:test";
import postgres from "postgres";
import { type ConfigInput, freshDatabase, MASTER_KEY, startTestGateway, type TestGateway } from "./gateway.ts";
import { TcpRelay } from "./relay.ts";

export interface RelayedStore {
  gw: TestGateway;
  relay: TcpRelay;
  /** Straight to the database, past the relay. */
  direct: postgres.Sql;
  stop: () => Promise<void>;
}

export async function gatewayBehindRelay(database: string, config: ConfigInput): Promise<RelayedStore> {
  const db = await freshDatabase(database);
  const direct = postgres(db.url, { max: 1, onnotice: () => {} });
  const relay = await TcpRelay.start({ host: "127.0.0.1", port: 5432 });
  const url = new URL(db.url);
  url.port = String(relay.port);
  const gw = await startTestGateway(config, { store: { databaseUrl: url.toString() } });
  const stop = async () => {
    await direct.end();
    await gw.stop();
    await relay.close();
    await db.drop();
  };
  return { gw, relay, direct, stop };
}

/** The gateway's readiness answer: its status and what it says of the store. */
export async function readiness(gw: TestGateway): Promise<{ status: number; db: string }> {
  const res = await fetch(`${gw.url}/health/readiness`);
  return { status: res.status, db: ((await res.json()) as { db: string }).db };
}

/** One mock model and the master key: what the store-outage tests need of a gateway. */
const MOCK_CONFIG: ConfigInput = {
  model_list: [{ model_name: "gpt-a", svc_params: { model: "mock/gpt-a" } }],
  general_settings: { master_key: MASTER_KEY },
};

/**
 * A test file's gateway behind a relay, started before its tests and stopped after them: the
 * fields are set once `beforeAll` has run, so tests read them from the object it returns.
 */
export function relayedStoreForFile(database: string, config: ConfigInput = MOCK_CONFIG): Omit<RelayedStore, "stop"> {
  const store = {} as RelayedStore;
  beforeAll(async () => {
    Object.assign(store, await gatewayBehindRelay(database, config));
  });
  afterAll(async () => {
    await store.stop?.();
  });
  return store;
}
