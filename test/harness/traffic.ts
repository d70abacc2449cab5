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
