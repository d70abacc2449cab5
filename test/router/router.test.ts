// The router against mock upstreams with injected faults: 500s are retried, then the group falls
// back; a context-window error goes to the context-window fallback and a content-policy refusal to
// the content-policy one; a dead deployment cools down and traffic moves to the others (never the
// group's only deployment); a hanging upstream times out with 408; every deployment in cooldown or
// at its own rpm is a 429 with when to retry; weighted shuffle splits traffic by weight; the answer
// says which deployment answered and how many retries and fallbacks it took.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { resetDeploymentStates } from "../../core/router/deployment-state.ts";
import { MASTER_KEY, requestJson, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { CONTEXT_ERROR, type MockOpenAI, POLICY_ERROR, startMockOpenAI } from "../mock-upstream/openai.ts";

const DEAD = "http://127.0.0.1:1/v1";
let a: MockOpenAI;
let b: MockOpenAI;
let c: MockOpenAI;
let gw: TestGateway;

async function post(body: Record<string, unknown>, headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; body: Record<string, unknown> & { error?: { message: string; type: string } } }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json", ...headers },
    body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], ...body }),
  });
  return { status: res.status, headers: res.headers, body: (await res.json()) as never };
}


beforeAll(async () => {
  [a, b, c] = await Promise.all([startMockOpenAI({ apiKey: "sk-up" }), startMockOpenAI({ apiKey: "sk-up" }), startMockOpenAI({ apiKey: "sk-up" })]);
  const at = (m: MockOpenAI) => m.url;
  gw = await startTestGateway({
    model_list: [
      { model_name: "primary", svc_params: { model: "openai/gpt-4o-mini", api_base: at(a), api_key: "sk-up" }, model_info: { id: "primary-a" } },
      { model_name: "backup", svc_params: { model: "openai/gpt-4o-mini", api_base: at(b), api_key: "sk-up" }, model_info: { id: "backup-b" } },
      { model_name: "big", svc_params: { model: "openai/gpt-4o-mini", api_base: at(c), api_key: "sk-up" }, model_info: { id: "big-c" } },
      { model_name: "pair", svc_params: { model: "openai/gpt-4o-mini", api_base: DEAD, api_key: "sk-up" }, model_info: { id: "pair-dead" } },
      { model_name: "pair", svc_params: { model: "openai/gpt-4o-mini", api_base: at(b), api_key: "sk-up" }, model_info: { id: "pair-live" } },
      { model_name: "lonely", svc_params: { model: "openai/gpt-4o-mini", api_base: DEAD, api_key: "sk-up" }, model_info: { id: "lonely-dead" } },
      { model_name: "slow", svc_params: { model: "openai/gpt-4o-mini", api_base: at(c), api_key: "sk-up", timeout: 0.4 }, model_info: { id: "slow-c" } },
      { model_name: "weighted", svc_params: { model: "mock/w1", weight: 1 }, model_info: { id: "w1" } },
      { model_name: "weighted", svc_params: { model: "mock/w3", weight: 3 }, model_info: { id: "w3" } },
      { model_name: "capped", svc_params: { model: "mock/c1", rpm: 2 }, model_info: { id: "cap-1" } },
      { model_name: "capped", svc_params: { model: "mock/c2", rpm: 1 }, model_info: { id: "cap-2" } },
    ],
    router_settings: {
      retry_initial_delay: 0.01,
      allowed_fails: 1,
      cooldown_time: 30,
      fallbacks: [{ primary: ["backup"] }],
      context_window_fallbacks: [{ primary: ["big"] }],
      content_policy_fallbacks: [{ primary: ["big"] }],
    },
    general_settings: { master_key: MASTER_KEY },
  // With a store: the retry-policy tests call with virtual keys.
  }, { store: {} });
  // Its own timeout: bun applies the preload's default (test/harness/timeouts.ts) to the hooks of
  // the first file only, and this gateway may be the run's first on the embedded store (initdb).
}, 30_000);
afterAll(async () => {
  await gw?.stop();
  await Promise.all([a, b, c].map((m) => m?.stop()));
}, 30_000);
beforeEach(() => {
  for (const m of [a, b, c]) m.reset();
  resetDeploymentStates();
});

describe("retries and fallbacks", () => {
  test("500s are retried num_retries times, then the general fallback answers", async () => {
    a.fault({ kind: "status", status: 500 }, { kind: "status", status: 500 }, { kind: "status", status: 500 });
    const r = await post({ model: "primary", num_retries: 2 });
    expect(r.status).toBe(200);
    expect(a.requests.length).toBe(3);
    expect(b.requests.length).toBe(1);
    expect(r.headers.get("x-svc-model-id")).toBe("backup-b");
    expect(r.headers.get("x-svc-attempted-retries")).toBe("2");
    expect(r.headers.get("x-svc-attempted-fallbacks")).toBe("1");
  });

  test("a request's fallbacks are group names or the config's {group: [fallbacks]} form; anything else is a 422 naming the entry, nothing sent", async () => {
    for (const fallbacks of [[1], [{ model: "backup" }], [null], [{ primary: "backup" }]]) {
      const r = await post({ model: "primary", fallbacks });
      expect([JSON.stringify(fallbacks), r.status, (r.body.error as { param?: string } | undefined)?.param]).toEqual([JSON.stringify(fallbacks), 422, "fallbacks.0"]);
    }
    expect(a.requests.length).toBe(0);
    a.fault({ kind: "status", status: 500 });
    const named = await post({ model: "primary", num_retries: 0, fallbacks: [{ primary: ["backup"] }] });
    expect([named.status, named.headers.get("x-svc-model-id")]).toEqual([200, "backup-b"]);
  });

  test("a retry that succeeds needs no fallback", async () => {
    a.fault({ kind: "status", status: 503 });
    const r = await post({ model: "primary", num_retries: 1 });
    expect(r.status).toBe(200);
    expect(r.headers.get("x-svc-model-id")).toBe("primary-a");
    expect(r.headers.get("x-svc-attempted-retries")).toBe("1");
    expect(r.headers.get("x-svc-attempted-fallbacks")).toBe("0");
    expect(b.requests.length).toBe(0);
  });

  test("a context-window error is not retried and goes to the context-window fallback", async () => {
    a.fault({ kind: "status", status: 400, body: CONTEXT_ERROR });
    const r = await post({ model: "primary", num_retries: 3 });
    expect(r.status).toBe(200);
    expect(a.requests.length).toBe(1);
    expect(c.requests.length).toBe(1);
    expect(b.requests.length).toBe(0);
    expect(r.headers.get("x-svc-model-id")).toBe("big-c");
  });

  test("the request's context_window_fallback_dict wins over the router setting", async () => {
    a.fault({ kind: "status", status: 400, body: CONTEXT_ERROR });
    const r = await post({ model: "primary", context_window_fallback_dict: { primary: "backup" } });
    expect(r.status).toBe(200);
    expect(r.headers.get("x-svc-model-id")).toBe("backup-b");
  });

  test("a content-policy refusal goes to the content-policy fallback", async () => {
    a.fault({ kind: "status", status: 400, body: POLICY_ERROR });
    const r = await post({ model: "primary" });
    expect(r.status).toBe(200);
    expect(r.headers.get("x-svc-model-id")).toBe("big-c");
  });

  test("without fallbacks the context-window error reaches the client as a 400 of that type", async () => {
    c.fault({ kind: "status", status: 400, body: CONTEXT_ERROR });
    const r = await post({ model: "big" });
    expect(r.status).toBe(400);
    expect(r.body.error!.type).toBe("context_window_exceeded");
    expect(r.body.error!.message).toContain("maximum context length");
  });

  test("an ordinary 400 from the upstream is neither retried nor sent to a fallback", async () => {
    a.fault({ kind: "status", status: 400 });
    const r = await post({ model: "primary", num_retries: 3 });
    expect(r.status).toBe(400);
    expect(a.requests.length).toBe(1);
    expect(b.requests.length).toBe(0);
  });

  test("a 400 that ends the call after a retry or a fallback still says how many it took", async () => {
    a.fault({ kind: "status", status: 500 }, { kind: "status", status: 400 });
    const retried = await post({ model: "primary", num_retries: 1 });
    expect(retried.status).toBe(400);
    expect(retried.headers.get("x-svc-model-id")).toBe("primary-a");
    expect([retried.headers.get("x-svc-attempted-retries"), retried.headers.get("x-svc-attempted-fallbacks")]).toEqual(["1", "0"]);
    a.fault({ kind: "status", status: 500 });
    b.fault({ kind: "status", status: 400 });
    const fellBack = await post({ model: "primary" });
    expect(fellBack.status).toBe(400);
    expect(fellBack.headers.get("x-svc-model-id")).toBe("backup-b");
    expect([fellBack.headers.get("x-svc-attempted-retries"), fellBack.headers.get("x-svc-attempted-fallbacks")]).toEqual(["0", "1"]);
  });

  test("when every fallback fails too, the last error is answered with the attempt counts", async () => {
    a.fault({ kind: "status", status: 500 });
    b.fault({ kind: "status", status: 502 });
    const r = await post({ model: "primary" });
    expect(r.status).toBe(503);
    expect(r.headers.get("x-svc-attempted-fallbacks")).toBe("1");
  });

  test("a stream whose upstream ends before its first content (an empty body, only the opening chunk, an error answered with a 200) falls back; without a fallback the client gets the error's status and the upstream's message", async () => {
    /** The mock's stream, ended cleanly after its first `events` events. */
    const endsAfter = (events: number) => ({
      kind: "wire" as const,
      shape: (bytes: Uint8Array) => {
        const text = new TextDecoder().decode(bytes);
        let at = 0;
        for (let i = 0; i < events; i++) at = text.indexOf("\n\n", at) + 2;
        return { cuts: [], end: { at, how: "close" as const } };
      },
    });
    const overloaded = { kind: "answer" as const, body: { error: { message: "The server is overloaded", type: "server_error", code: 503 } } };
    for (const fault of [endsAfter(0), endsAfter(1), overloaded]) {
      a.fault(fault);
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "primary", stream: true, num_retries: 0, messages: [{ role: "user", content: "hi" }] }),
      });
      expect(res.status, fault.kind).toBe(200);
      expect(res.headers.get("x-svc-model-id"), fault.kind).toBe("backup-b");
      expect(res.headers.get("x-svc-attempted-fallbacks"), fault.kind).toBe("1");
      expect(await res.text(), fault.kind).toEndWith("data: [DONE]\n\n");
    }
    b.fault(overloaded);
    const r = await post({ model: "backup", stream: true, num_retries: 0 });
    expect(r.status).toBe(503);
    expect(r.body.error!.message).toContain("The server is overloaded");
  });

  test("the openai SDK sees one answer; its own retries are not needed", async () => {
    a.fault({ kind: "status", status: 500 });
    const client = new OpenAI({ apiKey: MASTER_KEY, baseURL: gw.baseURL, maxRetries: 0 });
    const res = await client.chat.completions.create({ model: "primary", messages: [{ role: "user", content: "hello" }], num_retries: 1 } as never);
    expect(res.choices[0]!.message.content).toContain("Mock reply");
  });
});

describe("cooldowns, timeouts and capacity", () => {
  test("a dead deployment cools down and traffic moves to the live one", async () => {
    const served: string[] = [];
    for (let i = 0; i < 20; i++) {
      const r = await post({ model: "pair", num_retries: 1 });
      expect(r.status).toBe(200);
      served.push(r.headers.get("x-svc-model-id")!);
    }
    expect(served.every((id) => id === "pair-live")).toBe(true);
    // After its second failure (allowed_fails: 1) the dead one is skipped: at most two calls retried.
    const retried = b.requests.length;
    expect(retried).toBe(20);
    const log = gw.log.lines.filter((l) => l.msg === "deployment cooling down");
    expect(log.length).toBe(1);
    expect(log[0]!.fields).toMatchObject({ deployment: "pair-dead" });
  });

  test("a call whose retries leave every deployment cooling down answers 429 with its call id", async () => {
    // The dead one cools down first (its second failure, allowed_fails: 1); calls retry onto the live one.
    const cooled = () => gw.log.lines.filter((l) => l.msg === "deployment cooling down").length;
    const before = cooled();
    for (let i = 0; i < 20 && cooled() === before; i++) expect((await post({ model: "pair", num_retries: 1 })).status).toBe(200);
    expect(cooled()).toBe(before + 1);
    // Then the live one fails twice within one call: no deployment is left for its next retry.
    b.fault({ kind: "status", status: 500 }, { kind: "status", status: 500 });
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "pair", num_retries: 3, messages: [{ role: "user", content: "hi" }] }),
    });
    expect(res.status).toBe(429);
    expect(((await res.json()) as { error: { message: string } }).error.message).toContain("cooling down");
    expect(res.headers.get("x-svc-attempted-retries")).toBe("1");
    // The id of its first attempt: the others' are it with -1, -2, … (the spend log's call_id).
    expect(res.headers.get("x-svc-call-id")).toMatch(/^[0-9a-f-]{36}$/);
  });

  test("the only deployment of a group never cools down", async () => {
    for (let i = 0; i < 4; i++) {
      const r = await post({ model: "lonely" });
      expect(r.status).toBe(503);
      expect(r.body.error!.message).toContain("could not connect");
    }
  });

  test("every deployment in cooldown: 429 with when to retry", async () => {
    // Cool the live one down too: it fails twice (allowed_fails: 1) while the dead one fails on its own.
    b.fault({ kind: "status", status: 500 }, { kind: "status", status: 500 });
    const statuses: number[] = [];
    let last: Awaited<ReturnType<typeof post>> | undefined;
    for (let i = 0; i < 10 && last?.status !== 429; i++) {
      last = await post({ model: "pair" });
      statuses.push(last.status);
    }
    expect(last!.status).toBe(429);
    expect(statuses.slice(0, -1).every((s) => s === 500 || s === 503)).toBe(true);
    expect(last!.body.error!.message).toContain("all 2 are cooling down");
    const retry = Number(last!.headers.get("retry-after"));
    expect(retry).toBeGreaterThan(25);
    expect(retry).toBeLessThanOrEqual(30);
    // No request reaches either while they cool down.
    const before = b.requests.length;
    expect((await post({ model: "pair" })).status).toBe(429);
    expect(b.requests.length).toBe(before);
  });

  test("a hanging upstream times out with 408 after the deployment's timeout; the request's own timeout is shorter still", async () => {
    c.fault({ kind: "hang" });
    const t0 = Date.now();
    const r = await post({ model: "slow" });
    expect(r.status).toBe(408);
    expect(r.body.error!.type).toBe("timeout_error");
    expect(Date.now() - t0).toBeLessThan(2000);
    c.fault({ kind: "delay", ms: 300 });
    const shorter = await post({ model: "slow", timeout: 0.1 });
    expect(shorter.status).toBe(408);
  });

  test("a deployment's stream_timeout bounds its streams (the wait between parts); its timeout its JSON calls", async () => {
    const g = await startTestGateway({
      model_list: [{ model_name: "st", svc_params: { model: "openai/gpt-4o-mini", api_base: c.url, api_key: "sk-up", timeout: 5, stream_timeout: 0.2 }, model_info: { id: "st-c" } }],
      general_settings: { master_key: MASTER_KEY },
    });
    try {
      const call = async (stream: boolean) => {
        c.fault({ kind: "slowStream", chunkDelayMs: 500, chunks: 2 });
        const res = await fetch(`${g.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "st", stream, messages: [{ role: "user", content: "hi" }] }),
        });
        await res.text();
        return res.status;
      };
      const t0 = Date.now();
      expect(await call(true)).toBe(408);
      expect(Date.now() - t0).toBeLessThan(450);
      expect(await call(false)).toBe(200);
    } finally {
      c.clearFaults();
      await g.stop();
    }
  });

  test("a caller's own short timeout, or its own credentials refused, cools no deployment down for the others", async () => {
    const [x, y] = await Promise.all([startMockOpenAI({ apiKey: "sk-up" }), startMockOpenAI({ apiKey: "sk-up" })]);
    const g = await startTestGateway({
      model_list: ["x", "y"].flatMap((id, i) => {
        const api_base = [x, y][i]!.url;
        return [
          { model_name: "shared", svc_params: { model: "openai/gpt-4o-mini", api_base, api_key: "sk-up" }, model_info: { id: `shared-${id}` } },
          { model_name: "emb", svc_params: { model: "openai/text-embedding-3-small", api_base, api_key: "sk-up" }, model_info: { id: `emb-${id}` } },
        ];
      }),
      router_settings: { retry_initial_delay: 0.01, allowed_fails: 1, cooldown_time: 30 },
      svc_settings: { allow_client_side_credentials: true },
      general_settings: { master_key: MASTER_KEY },
    });
    const call = async (path: string, body: Record<string, unknown>) => {
      const res = await fetch(`${g.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" }, body: JSON.stringify(body) });
      await res.text();
      return res.status;
    };
    const chat = (extra: Record<string, unknown> = {}) => call("/v1/chat/completions", { model: "shared", messages: [{ role: "user", content: "hi" }], ...extra });
    const embed = (extra: Record<string, unknown> = {}) => call("/v1/embeddings", { model: "emb", input: "hello", ...extra });
    try {
      // Each upstream answers in 300 ms; this caller will wait 50.
      for (const m of [x, y]) m.fault(...Array.from({ length: 20 }, () => ({ kind: "delay" as const, ms: 300 })));
      for (let i = 0; i < 6; i++) expect(await chat({ timeout: 0.05 })).toBe(408);
      for (const m of [x, y]) m.clearFaults();
      for (let i = 0; i < 6; i++) expect(await embed({ api_key: "sk-the-callers-own" })).toBe(401);
      expect(g.log.lines.filter((l) => l.msg === "deployment cooling down")).toEqual([]);
      expect(await chat()).toBe(200);
      expect(await embed()).toBe(200);
    } finally {
      await g.stop();
      await Promise.all([x.stop(), y.stop()]);
    }
  });

  test("deployments at their own rpm are skipped; when all are, 429 with retry-after", async () => {
    const ids: string[] = [];
    const left: Record<string, string[]> = { "cap-1": [], "cap-2": [] };
    for (let i = 0; i < 3; i++) {
      const r = await post({ model: "capped" });
      expect(r.status).toBe(200);
      ids.push(r.headers.get("x-svc-model-id")!);
      // The deployment's own rpm is the limit the answer's headers count down.
      expect(r.headers.get("x-ratelimit-limit-requests")).toBe(r.headers.get("x-svc-model-id") === "cap-1" ? "2" : "1");
      left[r.headers.get("x-svc-model-id")!]!.push(r.headers.get("x-ratelimit-remaining-requests")!);
    }
    expect(left).toEqual({ "cap-1": ["1", "0"], "cap-2": ["0"] });
    expect(ids.filter((i) => i === "cap-1").length).toBe(2);
    expect(ids.filter((i) => i === "cap-2").length).toBe(1);
    const r = await post({ model: "capped" });
    expect(r.status).toBe(429);
    expect(r.body.error!.message).toContain("rpm/tpm limit");
    expect(Number(r.headers.get("retry-after"))).toBeGreaterThan(55);
  });
});

describe("drained deployments (weight 0)", () => {
  // Their own gateway: c, drained in both groups, must never be asked.
  let g: TestGateway;
  const upstream = (m: MockOpenAI, weight: number) => ({ model: "openai/gpt-4o-mini", api_base: m.url, api_key: "sk-up", weight });
  beforeAll(async () => {
    g = await startTestGateway({
      model_list: [
        { model_name: "drain1", svc_params: upstream(a, 1), model_info: { id: "drain1-a" } },
        { model_name: "drain1", svc_params: upstream(c, 0), model_info: { id: "drain1-c" } },
        { model_name: "drain2", svc_params: upstream(a, 1), model_info: { id: "drain2-a" } },
        { model_name: "drain2", svc_params: upstream(b, 1), model_info: { id: "drain2-b" } },
        { model_name: "drain2", svc_params: upstream(c, 0), model_info: { id: "drain2-c" } },
      ],
      router_settings: { retry_initial_delay: 0.01, allowed_fails: 1, cooldown_time: 30 },
      general_settings: { master_key: MASTER_KEY },
    });
  });
  afterAll(async () => {
    await g?.stop();
  });
  const call = async (body: Record<string, unknown>) => {
    const res = await fetch(`${g.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], ...body }),
    });
    return { status: res.status, headers: res.headers, body: (await res.json()) as { error?: { message: string } } };
  };

  test("a retry after the weighted deployment failed goes back to it, not to the drained one", async () => {
    a.fault({ kind: "status", status: 500 });
    const r = await call({ model: "drain1", num_retries: 1 });
    expect(r.status).toBe(200);
    expect(r.headers.get("x-svc-model-id")).toBe("drain1-a");
    expect(r.headers.get("x-svc-attempted-retries")).toBe("1");
    expect(a.requests.length).toBe(2);
    expect(c.requests.length).toBe(0);
  });

  test("the one deployment in rotation is as a group's only one: its 429 answers the call, and the next calls still go to it", async () => {
    a.fault({ kind: "status", status: 429, headers: { "retry-after": "10" } });
    const limited = await call({ model: "drain1", num_retries: 0 });
    expect(limited.status).toBe(429);
    expect(limited.headers.get("retry-after")).toBe("10");
    for (let i = 0; i < 5; i++) {
      const r = await call({ model: "drain1" });
      expect(r.status).toBe(200);
      expect(r.headers.get("x-svc-model-id")).toBe("drain1-a");
    }
    expect(c.requests.length).toBe(0);
  });

  test("when every weighted deployment is cooling down the answer is the 429 that says so, not the drained one", async () => {
    a.fault({ kind: "status", status: 429 });
    b.fault({ kind: "status", status: 429 });
    // Each cools down on its 429; the retry goes to the other weighted one.
    const first = await call({ model: "drain2", num_retries: 1 });
    expect(first.status).toBe(429);
    expect([a.requests.length, b.requests.length]).toEqual([1, 1]);
    const next = await call({ model: "drain2" });
    expect(next.status).toBe(429);
    expect(next.body.error!.message).toContain("all 2 are cooling down");
    expect(Number(next.headers.get("retry-after"))).toBeGreaterThan(25);
    expect(c.requests.length).toBe(0);
  });
});

describe("strategies", () => {
  test("simple-shuffle splits 2,000 calls within 5% of the weights (1:3)", async () => {
    const counts: Record<string, number> = { w1: 0, w3: 0 };
    for (let batch = 0; batch < 20; batch++) {
      const replies = await Promise.all(Array.from({ length: 100 }, () => post({ model: "weighted" })));
      for (const r of replies) counts[r.headers.get("x-svc-model-id")!]!++;
    }
    expect(counts.w1! + counts.w3!).toBe(2000);
    expect(Math.abs(counts.w3! / 2000 - 0.75)).toBeLessThan(0.05);
  });
});

describe("strategies by config", () => {
  const start = (strategy: string, list: Record<string, unknown>[]) =>
    startTestGateway({ model_list: list, router_settings: { routing_strategy: strategy }, general_settings: { master_key: MASTER_KEY } });
  const ask = async (g: TestGateway, n: number) => {
    const ids: string[] = [];
    for (let i = 0; i < n; i++) {
      const res = await fetch(`${g.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
      });
      await res.text();
      ids.push(res.headers.get("x-svc-model-id")!);
    }
    return ids;
  };

  test("simple-shuffle weighs a whole group by one field: weight 0 drains a deployment, its rpm notwithstanding", async () => {
    for (const rpm of [undefined, 1000]) {
      const g = await start("simple-shuffle", [
        { model_name: "m", svc_params: { model: "mock/drained", weight: 0, rpm }, model_info: { id: "drained" } },
        { model_name: "m", svc_params: { model: "mock/serving", weight: 1, rpm }, model_info: { id: "serving" } },
        // No weight of its own: 0 in a group weighed by weight, though its rpm is set.
        { model_name: "m", svc_params: { model: "mock/unweighted", rpm: 1000 }, model_info: { id: "unweighted" } },
      ]);
      try {
        expect(new Set(await ask(g, 40)), `rpm ${rpm}`).toEqual(new Set(["serving"]));
      } finally {
        await g.stop();
      }
    }
  });

  test("weight 0 drains a deployment under every strategy, though it would win there; rpm is only a limit there", async () => {
    for (const strategy of ["least-busy", "latency-based-routing", "usage-based-routing-v2", "cost-based-routing"]) {
      const g = await start(strategy, [
        // The cheaper one, never measured, without usage: what each of them would pick first.
        { model_name: "m", svc_params: { model: "mock/drained", weight: 0 }, model_info: { id: "drained", input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } },
        // No weight, an rpm: in rotation all the same.
        { model_name: "m", svc_params: { model: "mock/serving", rpm: 1000 }, model_info: { id: "serving", input_cost_per_token: 0.00001, output_cost_per_token: 0.00003 } },
        { model_name: "m", svc_params: { model: "mock/serving-too" }, model_info: { id: "serving-too", input_cost_per_token: 0.00001, output_cost_per_token: 0.00003 } },
      ]);
      try {
        for (const id of await ask(g, 20)) expect(["serving", "serving-too"], strategy).toContain(id);
      } finally {
        await g.stop();
      }
    }
  });

  test("cost-based-routing always picks the cheaper deployment", async () => {
    const g = await start("cost-based-routing", [
      { model_name: "m", svc_params: { model: "mock/dear" }, model_info: { id: "dear", input_cost_per_token: 0.00001, output_cost_per_token: 0.00003 } },
      { model_name: "m", svc_params: { model: "mock/cheap" }, model_info: { id: "cheap", input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 } },
    ]);
    try {
      expect(new Set(await ask(g, 20))).toEqual(new Set(["cheap"]));
    } finally {
      await g.stop();
    }
  });

  test("cost-based-routing takes a deployment without a price for dear, not free", async () => {
    const g = await start("cost-based-routing", [
      { model_name: "m", svc_params: { model: "mock/a-fine-tune-no-price-map-knows" }, model_info: { id: "unpriced" } },
      { model_name: "m", svc_params: { model: "mock/dear" }, model_info: { id: "dear", input_cost_per_token: 0.001, output_cost_per_token: 0.003 } },
    ]);
    try {
      expect(new Set(await ask(g, 20))).toEqual(new Set(["dear"]));
    } finally {
      await g.stop();
    }
  });

  test("cost-based-routing sees the price of a deployment priced per second of the call", async () => {
    // $0.01 a second: a 1,000-in, 1,000-out call of ~10 s costs $0.10, against $0.002 per token-priced call.
    const g = await start("cost-based-routing", [
      { model_name: "m", svc_params: { model: "mock/by-the-second" }, model_info: { id: "by-the-second", input_cost_per_second: 0.01 } },
      { model_name: "m", svc_params: { model: "mock/by-the-token" }, model_info: { id: "by-the-token", input_cost_per_token: 0.000001, output_cost_per_token: 0.000001 } },
    ]);
    try {
      expect(new Set(await ask(g, 20))).toEqual(new Set(["by-the-token"]));
    } finally {
      await g.stop();
    }
  });

  test("usage-based-routing sends calls to the deployment with the fewest tokens in the last minute", async () => {
    const g = await start("usage-based-routing-v2", [
      { model_name: "m", svc_params: { model: "mock/wordy", mock_response: "word ".repeat(300) }, model_info: { id: "wordy" } },
      { model_name: "m", svc_params: { model: "mock/terse", mock_response: "ok" }, model_info: { id: "terse" } },
    ]);
    try {
      const ids = await ask(g, 14);
      // Within two calls each has been tried; after wordy's ~300 tokens, terse takes every call until it catches up.
      const firstWordy = ids.indexOf("wordy");
      expect(firstWordy).toBeGreaterThanOrEqual(0);
      expect(firstWordy).toBeLessThanOrEqual(1);
      expect(ids.slice(firstWordy + 1, firstWordy + 11)).toEqual(Array(10).fill("terse"));
    } finally {
      await g.stop();
    }
  });

  test("latency-based-routing measures each deployment, then prefers the faster one", async () => {
    a.reset();
    b.reset();
    for (let i = 0; i < 40; i++) a.fault({ kind: "delay", ms: 60 });
    const g = await start("latency-based-routing", [
      { model_name: "m", svc_params: { model: "openai/gpt-4o-mini", api_base: a.url, api_key: "sk-up" }, model_info: { id: "lat-slow" } },
      { model_name: "m", svc_params: { model: "openai/gpt-4o-mini", api_base: b.url, api_key: "sk-up" }, model_info: { id: "lat-fast" } },
    ]);
    try {
      const ids = await ask(g, 12);
      // The first two calls measure both; afterwards the fast one takes everything.
      expect(ids.slice(2).every((id) => id === "lat-fast")).toBe(true);
      expect(ids.slice(0, 2).sort()).toEqual(["lat-fast", "lat-slow"]);
    } finally {
      a.clearFaults();
      await g.stop();
    }
  });

  test("latency-based-routing: a deployment that timed out counts as that slow, and traffic leaves it", async () => {
    a.reset();
    b.reset();
    for (let i = 0; i < 40; i++) a.fault({ kind: "delay", ms: 60 });
    const g = await start("latency-based-routing", [
      { model_name: "m", svc_params: { model: "openai/gpt-4o-mini", api_base: a.url, api_key: "sk-up", timeout: 0.3 }, model_info: { id: "lat-slow" } },
      { model_name: "m", svc_params: { model: "openai/gpt-4o-mini", api_base: b.url, api_key: "sk-up", timeout: 0.3 }, model_info: { id: "lat-fast" } },
    ]);
    try {
      expect((await ask(g, 6)).slice(2).every((id) => id === "lat-fast")).toBe(true);
      b.fault({ kind: "hang" });
      expect(await ask(g, 1)).toEqual(["lat-fast"]);
      // It hung for its 0.3 s timeout: slower than the other's 60 ms. Only successes moved the
      // figure before, so it kept its fast average and took the next calls again.
      expect(await ask(g, 4)).toEqual(["lat-slow", "lat-slow", "lat-slow", "lat-slow"]);
    } finally {
      a.clearFaults();
      b.clearFaults();
      await g.stop();
    }
  });

  test("least-busy sends a call to the deployment with fewer calls in flight", async () => {
    a.reset();
    b.reset();
    a.fault({ kind: "delay", ms: 1500 });
    b.fault({ kind: "delay", ms: 1500 });
    const g = await start("least-busy", [
      { model_name: "m", svc_params: { model: "openai/gpt-4o-mini", api_base: a.url, api_key: "sk-up" }, model_info: { id: "busy-a" } },
      { model_name: "m", svc_params: { model: "openai/gpt-4o-mini", api_base: b.url, api_key: "sk-up" }, model_info: { id: "busy-b" } },
    ]);
    try {
      // Hold one call on whichever deployment it lands; then every new call goes to the other one.
      const held = fetch(`${g.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
      });
      await Bun.sleep(100);
      const heldOnA = a.requests.length === 1;
      (heldOnA ? b : a).clearFaults();
      const ids = await ask(g, 3);
      expect(ids).toEqual(Array(3).fill(heldOnA ? "busy-b" : "busy-a"));
      await (await held).text();
    } finally {
      await g.stop();
    }
  });
});

describe("retries per group", () => {
  test("a fallback group gets its own num_retries", async () => {
    for (const m of [a, b, c]) m.reset();
    resetDeploymentStates();
    a.fault({ kind: "status", status: 500 }, { kind: "status", status: 500 });
    b.fault({ kind: "status", status: 500 });
    const r = await post({ model: "primary", num_retries: 1 });
    expect(r.status).toBe(200);
    // primary: 1 try + 1 retry; backup: 1 try + 1 retry that succeeds.
    expect(a.requests.length).toBe(2);
    expect(b.requests.length).toBe(2);
    expect(r.headers.get("x-svc-attempted-retries")).toBe("2");
    expect(r.headers.get("x-svc-attempted-fallbacks")).toBe("1");
  });
});

describe("retry policies from a key's router_settings", () => {
  async function keyWith(routerSettings: Record<string, unknown>): Promise<string> {
    const r = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { router_settings: routerSettings } });
    expect(r.status).toBe(200);
    return r.body.key;
  }
  const as = (key: string) => ({ authorization: `Bearer ${key}` });

  test("max_retries (the spec's name) retries like num_retries", async () => {
    const key = await keyWith({ max_retries: 2 });
    a.fault({ kind: "status", status: 500 }, { kind: "status", status: 500 });
    const r = await post({ model: "primary" }, as(key));
    expect(r.status).toBe(200);
    expect(r.headers.get("x-svc-model-id")).toBe("primary-a");
    expect(a.requests.length).toBe(3);
    expect(r.headers.get("x-svc-attempted-retries")).toBe("2");
  });

  test("retry_policy sets retries per error class: none for 500s (straight to the fallback), two for 429s", async () => {
    const key = await keyWith({ num_retries: 5, retry_policy: { InternalServerErrorRetries: 0, RateLimitErrorRetries: 2 } });
    a.fault({ kind: "status", status: 500 });
    const fellBack = await post({ model: "primary" }, as(key));
    expect(fellBack.headers.get("x-svc-model-id")).toBe("backup-b");
    expect([a.requests.length, b.requests.length]).toEqual([1, 1]);
    a.reset();
    a.fault({ kind: "status", status: 429 }, { kind: "status", status: 429 });
    const retried = await post({ model: "primary" }, as(key));
    expect(retried.headers.get("x-svc-model-id")).toBe("primary-a");
    expect(a.requests.length).toBe(3);
  });

  test("a key's (then its team's) fallbacks, context-window fallbacks and max_fallbacks override the config's", async () => {
    const key = await keyWith({ fallbacks: [{ primary: ["big"] }], context_window_fallbacks: [{ primary: ["backup"] }] });
    a.fault({ kind: "status", status: 500 });
    const general = await post({ model: "primary" }, as(key));
    expect(general.headers.get("x-svc-model-id")).toBe("big-c");
    a.fault({ kind: "status", status: 400, body: CONTEXT_ERROR });
    const context = await post({ model: "primary" }, as(key));
    expect(context.headers.get("x-svc-model-id")).toBe("backup-b");
    expect(b.requests.length).toBe(1);
    // /v1/models shows the fallbacks the key's calls would take.
    const listed = await fetch(`${gw.url}/v1/models?include_metadata=true`, { headers: as(key) });
    const primary = ((await listed.json()) as { data: { id: string; metadata: { fallbacks: string[] } }[] }).data.find((m) => m.id === "primary");
    expect(primary?.metadata.fallbacks).toEqual(["big"]);

    const team = await requestJson<{ team_id: string }>(gw, "POST", "/team/new", { body: { router_settings: { max_fallbacks: 0, fallbacks: [{ primary: ["big"] }] } } });
    const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { team_id: team.body.team_id, router_settings: { num_retries: 0 } } });
    a.fault({ kind: "status", status: 500 });
    const none = await post({ model: "primary" }, as(made.body.key));
    expect(none.status).toBe(500);
    expect(none.headers.get("x-svc-attempted-fallbacks")).toBe("0");
    expect([a.requests.length, b.requests.length, c.requests.length]).toEqual([3, 1, 1]);
  });

  test("model_group_retry_policy applies to its group only, and may retry a class not retried by default (400)", async () => {
    const key = await keyWith({ model_group_retry_policy: { primary: { BadRequestErrorRetries: 1 } } });
    a.fault({ kind: "status", status: 400 });
    const r = await post({ model: "primary" }, as(key));
    expect(r.status).toBe(200);
    expect(r.headers.get("x-svc-attempted-retries")).toBe("1");
    expect(a.requests.length).toBe(2);
    // Another group keeps the default: an ordinary 400 goes back to the client.
    b.fault({ kind: "status", status: 400 });
    expect((await post({ model: "backup" }, as(key))).status).toBe(400);
    expect(b.requests.length).toBe(1);
  });
});

describe("content-policy refusals and retry policies", () => {
  const as = (key: string) => ({ authorization: `Bearer ${key}` });

  test("ContentPolicyViolationErrorRetries retries a content-policy refusal before its fallback (it was accepted and ignored); without it, straight to the fallback", async () => {
    const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { router_settings: { retry_policy: { ContentPolicyViolationErrorRetries: 1, BadRequestErrorRetries: 3 } } } });
    a.fault({ kind: "status", status: 400, body: POLICY_ERROR }, { kind: "status", status: 400, body: POLICY_ERROR });
    const retried = await post({ model: "primary" }, as(made.body.key));
    expect(retried.headers.get("x-svc-model-id")).toBe("big-c");
    expect(retried.headers.get("x-svc-attempted-retries")).toBe("1");
    expect([a.requests.length, c.requests.length]).toEqual([2, 1]);
    a.reset();
    c.reset();
    a.fault({ kind: "status", status: 400, body: POLICY_ERROR });
    const plain = await post({ model: "primary" });
    expect(plain.headers.get("x-svc-model-id")).toBe("big-c");
    expect([a.requests.length, c.requests.length]).toEqual([1, 1]);
  });

  test("an upstream 504 is retried by TimeoutErrorRetries (it is answered as a 503, and was retried as a server error)", async () => {
    const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", {
      body: { router_settings: { retry_policy: { TimeoutErrorRetries: 2, InternalServerErrorRetries: 0 }, fallbacks: [] } },
    });
    a.fault({ kind: "status", status: 504 }, { kind: "status", status: 504 });
    const r = await post({ model: "primary" }, as(made.body.key));
    expect(r.status).toBe(200);
    expect(r.headers.get("x-svc-model-id")).toBe("primary-a");
    expect(r.headers.get("x-svc-attempted-retries")).toBe("2");
    expect(a.requests.length).toBe(3);
  });

  test("a request's retry fields other than num_retries go upstream, not into its retry policy", async () => {
    a.fault({ kind: "status", status: 400 });
    const r = await post({ model: "primary", num_retries: 0, retry_policy: { BadRequestErrorRetries: 2 } });
    expect(r.status).toBe(400);
    expect(a.requests.length).toBe(1);
  });
});

describe("/health", () => {
  test("probes each deployment: live ones healthy, a dead one unhealthy saying why; no upstream key or address shown", async () => {
    const res = await fetch(`${gw.url}/health?model=pair`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
    expect(res.status).toBe(200);
    const text = await res.text();
    const body = JSON.parse(text) as { healthy_endpoints: { model_id: string }[]; unhealthy_endpoints: { model_id: string; error: string }[]; healthy_count: number };
    expect(body.healthy_endpoints.map((e) => e.model_id)).toEqual(["pair-live"]);
    expect(body.unhealthy_endpoints.map((e) => e.model_id)).toEqual(["pair-dead"]);
    expect(body.unhealthy_endpoints[0]!.error).toContain("could not connect");
    // The probe really reached the live upstream.
    expect(b.requests.length).toBe(1);
    for (const secret of ["sk-up", b.url, `127.0.0.1:${new URL(b.url).port}`, DEAD, "127.0.0.1:1"]) expect([secret, text.includes(secret)]).toEqual([secret, false]);

    const all = (await (await fetch(`${gw.url}/health`, { headers: { authorization: `Bearer ${MASTER_KEY}` } })).json()) as { healthy_count: number; unhealthy_count: number };
    expect(all.healthy_count + all.unhealthy_count).toBe(11);
  });

  test("a deployment slower than its own timeout is unhealthy: the probe waits no longer than a call would", async () => {
    // Every call to "slow" (timeout 0.4 s) is a 408 while its upstream takes 1.5 s; the probe used to wait up to 10 s and call it healthy.
    c.fault({ kind: "delay", ms: 1500 });
    expect((await post({ model: "slow" })).status).toBe(408);
    c.fault({ kind: "delay", ms: 1500 });
    const t0 = Date.now();
    const res = await fetch(`${gw.url}/health?model=slow`, { headers: { authorization: `Bearer ${MASTER_KEY}` } });
    const body = (await res.json()) as { healthy_endpoints: { model_id: string }[]; unhealthy_endpoints: { model_id: string; error: string }[] };
    expect(Date.now() - t0).toBeLessThan(1400);
    expect(body.healthy_endpoints).toEqual([]);
    expect(body.unhealthy_endpoints.map((e) => e.model_id)).toEqual(["slow-c"]);
    expect(body.unhealthy_endpoints[0]!.error).toContain("timed out");
  });
});

describe("limits across fallbacks", () => {
  test("a request that falls back counts once against its key's rpm, while each group's per-model limit counts the group it tried", async () => {
    const made = await requestJson<{ key: string }>(gw, "POST", "/key/generate", { body: { rpm_limit: 2, model_rpm_limit: { backup: 1 } } });
    const key = made.body.key;
    a.fault({ kind: "status", status: 500 });
    const first = await post({ model: "primary" }, { authorization: `Bearer ${key}` });
    expect(first.status).toBe(200);
    expect(first.headers.get("x-svc-model-id")).toBe("backup-b");
    expect(first.headers.get("x-ratelimit-remaining-requests")).toBe("0");
    // One of the key's two requests is left, though the first tried two groups.
    const second = await post({ model: "primary" }, { authorization: `Bearer ${key}` });
    expect(second.status).toBe(200);
    expect(second.headers.get("x-svc-model-id")).toBe("primary-a");
    // backup's own limit (1) was used by the fallback; the key's two requests are used.
    const third = await post({ model: "primary" }, { authorization: `Bearer ${key}` });
    expect(third.status).toBe(429);
    expect(third.body.error!.message).toContain("requests per minute limit 2");
  });
});
