// Team webhooks that hang hold at most 128 deliveries under way in the whole process, however
// many senders there are: a reload makes a new sender while the retired one still delivers, and
// each counted its own 128, so two of them held every one of Bun's 256 fetch slots and model calls
// queued behind them. Per webhook, at most 16 are under way, also across senders.
// Within those 128, webhooks that hang cannot starve another one: each webhook has 4 of its own
// unless 16 others hold theirs, and a freed slot goes to the waiting webhook with the fewest under
// way. Before, one team's 8 hanging webhooks held all 128 and won every freed slot back (first in
// the map), so another team's healthy webhook got nothing for 21 s and then lost events.
// Drops are logged per incident: before, a sender logged its 1st, 1001st, … drop, so a second
// incident in the same process logged nothing.
import { afterAll, afterEach, expect, test } from "bun:test";
import type { Server } from "bun";
import { WebhookSender, webhookTiming } from "../../core/callbacks/team-webhooks.ts";
import { memoryLogger } from "../harness/gateway.ts";

let open = 0;
let most = 0;
const byPath = new Map<string, number>();
let mostOnOnePath = 0;
const release: (() => void)[] = [];
/** Events that reached each `/ok/…` webhook (answered at once). */
const received = new Map<string, string[]>();
/** Off at the end of each test: every request is answered at once, so the senders drain before the next test. */
let hang = true;
const server: Server<undefined> = Bun.serve({
  hostname: "127.0.0.1",
  port: 0,
  idleTimeout: 0,
  async fetch(req) {
    const path = new URL(req.url).pathname;
    if (path.startsWith("/ok/")) {
      const { id } = (await req.json()) as { id: string };
      received.set(path, [...(received.get(path) ?? []), id]);
      return new Response("ok");
    }
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
const hook = (path: string) => ({ url: `http://127.0.0.1:${server.port}${path}`, headers: {}, publicOnly: false });
const saved = { ...webhookTiming };
const senders: WebhookSender[] = [];
function sender() {
  const log = memoryLogger();
  const s = new WebhookSender(log);
  senders.push(s);
  return { s, log };
}
afterEach(async () => {
  hang = false;
  for (const r of release.splice(0)) r();
  await Promise.all(senders.splice(0).map((s) => s.idle(20_000)));
  expect(open).toBe(0);
  Object.assign(webhookTiming, saved);
  most = 0;
  mostOnOnePath = 0;
  byPath.clear();
  received.clear();
  hang = true;
});
afterAll(() => server.stop(true));

const settle = async (until: () => boolean) => {
  for (let i = 0; i < 60 && !until(); i++) await Bun.sleep(50);
  await Bun.sleep(300);
};

test("two senders (before and after a reload) together keep at most 128 deliveries under way, 16 per webhook", async () => {
  webhookTiming.timeoutMs = 60_000;
  const [a, b] = [sender().s, sender().s];
  // One webhook alone may have 16 under way.
  for (let i = 0; i < 20; i++) a.post(hook("/solo"), { id: `solo-${i}` });
  await settle(() => open >= 16);
  expect(open).toBe(16);
  for (const s of [a, b]) {
    for (let h = 0; h < 30; h++) {
      for (let i = 0; i < 20; i++) s.post(hook(`/hook${h}`), { id: `e-${h}-${i}-${Math.random()}` });
    }
  }
  await settle(() => open >= 128);
  expect(open).toBe(128);
  expect(most).toBe(128);
  expect(mostOnOnePath).toBe(16);
  // Letting some finish lets as many waiting ones start, never more.
  for (const r of release.splice(0, 40)) r();
  await Bun.sleep(300);
  expect(open).toBe(128);
  expect(most).toBe(128);
});

test("one team's ten hanging webhooks cost another webhook no events: it gets its own slots at once", async () => {
  webhookTiming.timeoutMs = 60_000;
  const hung = sender();
  const good = sender();
  // A team's ten webhooks (the most it may register), each with more waiting than it may have under way.
  for (let i = 0; i < 20; i++) for (let h = 1; h <= 10; h++) hung.s.post(hook(`/hang/${h}`), { id: `hang-${h}-${i}` });
  await settle(() => open >= 104);
  // They hold 4 each and the 64 shared: never all 128.
  expect(open).toBe(104);
  // Another team's webhook then gets 300 events as calls end, a few at a time.
  const sent: string[] = [];
  for (let batch = 0; batch < 30; batch++) {
    for (let i = 0; i < 10; i++) {
      const id = `good-${batch}-${i}`;
      sent.push(id);
      good.s.post(hook("/ok/good"), { id });
    }
    await Bun.sleep(5);
  }
  await good.s.idle(3000);
  expect(received.get("/ok/good")?.length ?? 0).toBe(300);
  // Started in order; a few at a time, so they may arrive a little out of it.
  expect(received.get("/ok/good")!.toSorted()).toEqual(sent.toSorted());
  expect(good.log.lines.filter((l) => l.msg.includes("dropped"))).toEqual([]);
  // The hanging webhooks still hang: nothing was freed for the healthy one.
  expect(open).toBe(104);
});

test("a freed slot goes to the waiting webhook with the fewest under way, not back to the hung webhook that freed it", async () => {
  webhookTiming.timeoutMs = 60_000;
  const { s } = sender();
  // 32 webhooks hold 4 each (their events come in turn, as calls end): all 128 under way, none shared.
  for (let i = 0; i < 8; i++) for (let h = 0; h < 32; h++) s.post(hook(`/hang/${h}`), { id: `hang-${h}-${i}` });
  await settle(() => open >= 128);
  expect(open).toBe(128);
  const { s: other } = sender();
  for (let i = 0; i < 5; i++) other.post(hook("/ok/late"), { id: `late-${i}` });
  await Bun.sleep(200);
  expect(received.get("/ok/late")).toBeUndefined();
  // One hung delivery ends: its webhook has more waiting, but the late one has none under way.
  release.shift()!();
  await settle(() => (received.get("/ok/late")?.length ?? 0) >= 5);
  expect(received.get("/ok/late")).toEqual(["late-0", "late-1", "late-2", "late-3", "late-4"]);
});

test("drops are logged per incident: at once, then at most once per period with the count, and again for a new incident", async () => {
  webhookTiming.timeoutMs = 60_000;
  webhookTiming.dropLogEveryMs = 300;
  const { s, log } = sender();
  const drops = () => log.lines.filter((l) => l.msg === "team webhook deliveries dropped: too many waiting").map((l) => l.fields?.dropped);
  // 256 under way or waiting: the next ones are dropped.
  for (let i = 0; i < 256; i++) s.post(hook("/hang/full"), { id: `full-${i}` });
  expect(drops()).toEqual([]);
  for (let i = 0; i < 5; i++) s.post(hook("/hang/full"), { id: `over-${i}` });
  expect(drops()).toEqual([1]);
  await Bun.sleep(400);
  expect(drops()).toEqual([1, 4]);
  // A quiet period ends the incident.
  await Bun.sleep(400);
  expect(drops()).toEqual([1, 4]);
  // The next incident is logged at once.
  s.post(hook("/hang/full"), { id: "again" });
  expect(drops()).toEqual([1, 4, 1]);
  expect(log.lines.find((l) => l.fields?.dropped === 1)?.fields?.webhook).toBe(`http://127.0.0.1:${server.port}`);
});
