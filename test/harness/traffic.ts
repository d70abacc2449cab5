/** Model-call traffic for tests of management writes made while keys serve calls. */
import { MASTER_KEY } from "./gateway.ts";

/** Per-token prices of the priced mock model (every call the same cost). */
export const PRICES = { input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 };

/** One mock chat model, `chat`, priced (PRICES), and the master key. */
export const PRICED_CHAT = { model_list: [{ model_name: "chat", svc_params: { model: "mock/chat" }, model_info: PRICES }], general_settings: { master_key: MASTER_KEY } };

/** A chat call to the mock model with `key`, its body read to its end (a stream too): its status. */
export async function chatStatus(gw: { baseURL: string }, key: string, opts: { stream?: boolean } = {}): Promise<number> {
  const res = await fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "chat", ...(opts.stream ? { stream: true } : {}), messages: [{ role: "user", content: "hi" }] }),
  });
  await res.arrayBuffer();
  return res.status;
}

/**
 * A mock model whose calls cost exactly $1 with `max_tokens: 1000` (1000 output tokens at $0.001,
 * the prompt free), which is also what such a call reserves: budgets and alerts in whole dollars.
 */
export const DOLLAR_MODEL = {
  model_name: "dollar",
  svc_params: { model: "mock/dollar", mock_response: "word ".repeat(1200) },
  model_info: { input_cost_per_token: 0, output_cost_per_token: 0.001 },
};

/** A $1 call to DOLLAR_MODEL with `key`: its status and body text. */
export async function dollarCall(gw: { baseURL: string }, key: string): Promise<{ status: number; text: string }> {
  const res = await fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: DOLLAR_MODEL.model_name, messages: [{ role: "user", content: "hi" }], max_tokens: 1000 }),
  });
  return { status: res.status, text: await res.text() };
}
