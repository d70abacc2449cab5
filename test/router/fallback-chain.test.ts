// A fallback group's own fallbacks are followed, depth first as LiteLLM does: with
// `{a: [b, d]}, {b: [c]}`, a call to a whose a and b fail goes to c before d. Each group is tried
// once per call (fallbacks naming each other end), at most max_fallbacks (5) fallback groups in
// all, and a group that fails for its prompt's length goes on to its own context-window fallbacks.
// One upstream serves every group; the order of the models it was asked for is the order tried.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { resetDeploymentStates } from "../../core/router/deployment-state.ts";
import { MASTER_KEY, startTestGateway, type TestGateway } from "../harness/gateway.ts";
import { CONTEXT_ERROR, type MockOpenAI, startMockOpenAI } from "../mock-upstream/openai.ts";

let up: MockOpenAI;
let gw: TestGateway;

const CHAIN = ["e1", "e2", "e3", "e4", "e5", "e6", "e7"];
const GROUPS = ["a", "b", "c", "d", "x", "y", "big", "bigger", ...CHAIN];

async function call(model: string): Promise<{ status: number; headers: Headers; asked: string[] }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${MASTER_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] }),
  });
  await res.text();
  return { status: res.status, headers: res.headers, asked: up.requests.map((r) => (r.body as { model: string }).model) };
}

const fail = (times: number, status = 500) => up.fault(...Array.from({ length: times }, () => ({ kind: "status" as const, status })));

beforeAll(async () => {
  up = await startMockOpenAI({ apiKey: "sk-up" });
  gw = await startTestGateway({
    model_list: GROUPS.map((g) => ({ model_name: g, svc_params: { model: `openai/${g}`, api_base: up.url, api_key: "sk-up" }, model_info: { id: `${g}-1` } })),
    router_settings: {
      fallbacks: [{ a: ["b", "d"] }, { b: ["c"] }, { x: ["y"] }, { y: ["x", "c"] }, { big: ["c"] }, ...CHAIN.slice(0, -1).map((g, i) => ({ [g]: [CHAIN[i + 1]!] }))],
      context_window_fallbacks: [{ a: ["big"] }, { big: ["bigger"] }],
    },
    general_settings: { master_key: MASTER_KEY },
  });
}, 30_000);
afterAll(async () => {
  await gw?.stop();
  await up?.stop();
}, 30_000);
beforeEach(() => {
  up.reset();
  resetDeploymentStates();
});

describe("fallback chains", () => {
  test("a fallback that fails goes on to its own fallbacks", async () => {
    fail(2);
    const r = await call("a");
    expect(r.status).toBe(200);
    expect(r.asked).toEqual(["a", "b", "c"]);
    expect(r.headers.get("x-svc-model-id")).toBe("c-1");
    expect(r.headers.get("x-svc-attempted-fallbacks")).toBe("2");
  });

  test("depth first: a fallback's own fallbacks come before the next fallback of its parent", async () => {
    fail(3);
    const r = await call("a");
    expect(r.status).toBe(200);
    expect(r.asked).toEqual(["a", "b", "c", "d"]);
    expect(r.headers.get("x-svc-model-id")).toBe("d-1");
    expect(r.headers.get("x-svc-attempted-fallbacks")).toBe("3");
  });

  test("groups that fall back to each other are each tried once: the chain goes on past the loop, and ends", async () => {
    fail(2);
    const served = await call("x");
    expect(served.status).toBe(200);
    expect(served.asked).toEqual(["x", "y", "c"]);
    expect(served.headers.get("x-svc-attempted-fallbacks")).toBe("2");
    up.reset();
    fail(3);
    const failed = await call("x");
    expect(failed.status).toBe(500);
    expect(failed.asked).toEqual(["x", "y", "c"]);
  });

  test("at most max_fallbacks (5) fallback groups are tried along a longer chain", async () => {
    fail(7);
    const r = await call("e1");
    expect(r.status).toBe(500);
    expect(r.asked).toEqual(CHAIN.slice(0, 6));
    expect(r.headers.get("x-svc-attempted-fallbacks")).toBe("5");
  });

  test("a context-window fallback that is too small too goes to its own context-window fallback; another failure to its general ones", async () => {
    up.fault({ kind: "status", status: 400, body: CONTEXT_ERROR }, { kind: "status", status: 400, body: CONTEXT_ERROR });
    const longer = await call("a");
    expect(longer.status).toBe(200);
    expect(longer.asked).toEqual(["a", "big", "bigger"]);
    expect(longer.headers.get("x-svc-attempted-fallbacks")).toBe("2");
    up.reset();
    up.fault({ kind: "status", status: 400, body: CONTEXT_ERROR }, { kind: "status", status: 503 });
    const general = await call("a");
    expect(general.status).toBe(200);
    expect(general.asked).toEqual(["a", "big", "c"]);
  });
});
