/** Small helpers the suites share. */
import { createHash } from "node:crypto";
import { connect } from "node:net";
import Redis from "ioredis";

/**
 * sha256 hex, computed here rather than with the gateway's own helper: tests check the stored
 * `token` against the spec's definition (the hash of the whole key), not against the code.
 */
export const sha256 = (s: string): string => createHash("sha256").update(s).digest("hex");

/** The error a request fails with, or undefined when it succeeds. */
export async function failure(request: PromiseLike<unknown>): Promise<unknown> {
  try {
    await request;
    return undefined;
  } catch (e) {
    return e;
  }
}

export async function collect<T>(stream: AsyncIterable<T>): Promise<T[]> {
  const items: T[] = [];
  for await (const item of stream) items.push(item);
  return items;
}

/** Whether `check` comes true within `ms` (polled every 100 ms): for effects that land after an answer. */
export async function until(check: () => Promise<boolean>, ms = 4000): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; await Bun.sleep(100)) if (await check()) return true;
  return check();
}

/** Polls `read` until `check` holds of its value, failing after `ms` with `what` and the last value seen. */
export async function waitFor<T>(read: () => Promise<T> | T, check: (v: T) => boolean, what: string, ms = 8000): Promise<T> {
  const deadline = Date.now() + ms;
  let last: T;
  for (;;) {
    last = await read();
    if (check(last)) return last;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms}ms waiting for ${what}; last value: ${JSON.stringify(last)}`);
    await Bun.sleep(25);
  }
}

/** Whether a Redis server answers at `url` (one connection attempt, no retries). */
export async function redisReachable(url: string): Promise<boolean> {
  const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, enableOfflineQueue: false });
  probe.on("error", () => undefined);
  try {
    await probe.connect();
    return (await probe.ping()) === "PONG";
  } catch {
    return false;
  } finally {
    probe.disconnect();
  }
}

/** Whether a new TCP connection to the port on 127.0.0.1 is accepted. */
export async function accepts(port: number): Promise<boolean> {
  try {
    const socket = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {} } });
    socket.end();
    return true;
  } catch {
    return false;
  }
}

/**
 * The status line, headers and body a raw HTTP/1.1 request gets (the connection is read to its end):
 * for what `fetch` cannot send, such as a Host header of one's own.
 */
export function rawRequest(url: string, head: string): Promise<string> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(head));
    let text = "";
    socket.on("data", (d) => {
      text += d.toString();
    });
    socket.on("end", () => resolve(text));
    socket.on("error", reject);
  });
}

/** A webhook receiver on 127.0.0.1: every JSON body posted to it, in order. */
export function jsonPostReceiver(): { url: string; received: Record<string, unknown>[]; stop(): void } {
  const received: Record<string, unknown>[] = [];
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      received.push((await req.json()) as Record<string, unknown>);
      return new Response("ok");
    },
  });
  return { url: `http://127.0.0.1:${server.port}/hook`, received, stop: () => server.stop(true) };
}
