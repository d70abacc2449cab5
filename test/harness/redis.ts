/**
 * The tests' Redis: one database per test worker process (bun test --parallel sets
 * BUN_TEST_WORKER_ID), so files running side by side share no keys, and no pub/sub channels either
 * (the gateway names its channels by database). TEST_REDIS_URL points the tests elsewhere.
 */
export const TEST_REDIS_DB = Number(process.env.BUN_TEST_WORKER_ID ?? 0);

export const TEST_REDIS_URL = process.env.TEST_REDIS_URL ?? `redis://127.0.0.1:6379/${TEST_REDIS_DB}`;

/** The tests' database through another port on this host (a TCP relay in front of Redis). */
export const testRedisUrlAt = (port: number): string => `redis://127.0.0.1:${port}/${TEST_REDIS_DB}`;
