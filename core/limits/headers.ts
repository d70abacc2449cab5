/** The `x-ratelimit-*` headers a rate-limit grant puts on the answer (OpenAI's names). */
import type { RateCounter, RateGrant } from "../contract.ts";

/** The `x-ratelimit-*` headers for the tightest request and token limits of a grant. */
export function rateHeaders(counters: readonly RateCounter[], remaining: RateGrant["remaining"]): Record<string, string> | undefined {
  let req: [number, number] | undefined;
  let tok: [number, number] | undefined;
  for (const [i, c] of counters.entries()) {
    const r = remaining[i]!;
    if (c.rpm !== undefined && r.requests !== undefined && (!req || r.requests < req[1])) req = [c.rpm, r.requests];
    if (c.tpm !== undefined && r.tokens !== undefined && (!tok || r.tokens < tok[1])) tok = [c.tpm, r.tokens];
  }
  if (!req && !tok) return undefined;
  const h: Record<string, string> = {};
  if (req) {
    h["x-ratelimit-limit-requests"] = String(req[0]);
    h["x-ratelimit-remaining-requests"] = String(Math.max(0, req[1]));
  }
  if (tok) {
    h["x-ratelimit-limit-tokens"] = String(tok[0]);
    h["x-ratelimit-remaining-tokens"] = String(Math.max(0, tok[1]));
  }
  return h;
}
