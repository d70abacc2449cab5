/** One chat call through a gateway with a key, answered as the rate-limit tests read it. */
export interface LimitReply {
  status: number;
  headers: Headers;
  body: { error?: { message: string; type: string; code: string } };
}

export async function chatCall(gw: { url: string }, key: string, model: string, extra: Record<string, unknown> = {}): Promise<LimitReply> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hello there" }], ...extra }),
  });
  return { status: res.status, headers: res.headers, body: (await res.json()) as LimitReply["body"] };
}
