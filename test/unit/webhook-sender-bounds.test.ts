// Team webhooks that hang hold at most 128 deliveries under way in the whole process, however
// many senders there are: a reload makes a new sender while the retired one still delivers, and
// each counted its own 128, so two of them held every one of Bun's 256 fetch slots and model calls
// queued behind them. Per webhook, at most 16 are under way, also across senders.
import { afterAll, expect, test } from "bun:test";
import type { Server } from "bun";
import { WebhookSender, webhookTiming } from "../../core/callbacks/team-webhooks.ts";
import { memoryLogger } from "../harness/gateway.ts";

let open = 0;
let most = 0;
const byPath = new Map<string, number>();
let mostOnOnePath = 0;
const release: (() => void)[] = [];
/** Off at the end: every request is answered at once, so the senders drain before the next file runs in this process. */
let hang = true;
const server: Server<undefined> = Bun.serve({
  hostname: "127.0.0.1",
  port: 0,
  idleTimeout: 0,
  fetch(req) {
    const path = new URL(req.url).pathname;
    if (!hang) return new Response("ok");
    open++;
    most = Math.max(most, open);
    byPath.set(path, (byPath.get(path) ?? 0) + 1);
    mostOnOnePath = Math.max(mostOnOnePath, byPath.get(path)!);
    // Hangs until the test lets go (or the client gives up).
    return new Promise<Response>((resolve) => {
      const done = () => {
        open--;
        byPath.set(path, byPath.get(path)! - 1);
        resolve(new Response("ok"));
      };
      release.push(done);
      req.signal.addEventListener("abort", done, { once: true });
    });
  },
});
const saved = { ...webhookTiming };
afterAll(() => {
  Object.assign(webhookTiming, saved);
  for (const r of release.splice(0)) r();
  server.stop(true);
});

test("two senders (before and after a reload) together keep at most 128 deliveries under way, 16 per webhook", async () => {
  webhookTiming.timeoutMs = 60_000;
  const senders = [new WebhookSender(memoryLogger()), new WebhookSender(memoryLogger())];
  for (const sender of senders) {
    for (let hook = 0; hook < 10; hook++) {
      for (let i = 0; i < 20; i++) sender.post({ url: `http://127.0.0.1:${server.port}/hook${hook}`, headers: {}, publicOnly: false }, { id: `e-${hook}-${i}-${Math.random()}` });
    }
  }
  // Let the deliveries start.
  for (let i = 0; i < 40 && open < 128; i++) await Bun.sleep(50);
  await Bun.sleep(300);
  expect(open).toBe(128);
  expect(most).toBe(128);
  expect(mostOnOnePath).toBe(16);
  // Letting some finish lets as many waiting ones start, never more.
  for (const r of release.splice(0, 40)) r();
  await Bun.sleep(300);
  expect(open).toBe(128);
  expect(most).toBe(128);
  hang = false;
  for (const r of release.splice(0)) r();
  await Promise.all(senders.map((s) => s.idle(20_000)));
  expect(open).toBe(0);
});
