/**
 * Request fields an endpoint adapter does not translate: refused with a 400 naming them, or
 * dropped when `drop_params` is on (the request's own flag, else `svc_settings.drop_params`).
 */
import type { Deployment, Endpoint, WireRequest } from "../contract.ts";
import { GatewayError } from "../errors.ts";
import { GatewayHintFields, GatewayOnlyFields } from "../wire.ts";

/** Every field OpenAI's chat completions accept besides `model` and `messages`: the list for adapters that declare none. */
export const OPENAI_CHAT_PARAMS: readonly string[] = [
  "audio",
  "frequency_penalty",
  "function_call",
  "functions",
  "logit_bias",
  "logprobs",
  "max_completion_tokens",
  "max_tokens",
  "modalities",
  "n",
  "parallel_tool_calls",
  "prediction",
  "presence_penalty",
  "prompt_cache_key",
  "reasoning_effort",
  "response_format",
  "safety_identifier",
  "seed",
  "service_tier",
  "stop",
  "store",
  "stream",
  "stream_options",
  "temperature",
  "tool_choice",
  "tools",
  "top_logprobs",
  "top_p",
  "user",
  "verbosity",
  "web_search_options",
];

/**
 * Fields every adapter takes whatever it declares: the input itself, streaming (`stream_options`
 * only shapes the gateway's own usage chunk), and the gateway's own fields, never sent upstream
 * (a hint an adapter has no use for is ignored).
 */
const ALWAYS_ACCEPTED: ReadonlySet<string> = new Set(["model", "messages", "prompt", "input", "stream", "stream_options", ...GatewayOnlyFields, ...GatewayHintFields]);

/** An adapter's list as a set, built once per list (adapters declare theirs once, at load). */
const supportedSets = new WeakMap<readonly string[], ReadonlySet<string>>();

function setOf(list: readonly string[]): ReadonlySet<string> {
  let set = supportedSets.get(list);
  if (!set) {
    set = new Set(list);
    supportedSets.set(list, set);
  }
  return set;
}

/** The request fields outside `supported`, in the order the client sent them; null values do not count. */
export function unsupportedParams(body: object, supported: readonly string[]): string[] {
  const allowed = setOf(supported);
  const out: string[] = [];
  for (const [k, v] of Object.entries(body)) {
    if (v === null || v === undefined || ALWAYS_ACCEPTED.has(k) || allowed.has(k)) continue;
    // `n: 1` asks for what every provider does anyway (clients such as LangChain always send it).
    if (k === "n" && v === 1) continue;
    out.push(k);
  }
  return out;
}

/** The fields `ep` translates for `d` (undefined: everything OpenAI accepts). */
export function paramsFor(ep: { supportedParams?: readonly string[]; supportedParamsFor?(d: Deployment): readonly string[] | undefined }, d: Deployment): readonly string[] | undefined {
  return ep.supportedParamsFor?.(d) ?? ep.supportedParams;
}

/** Python's list repr (`['seed', 'n']`), as LiteLLM's message shows it: clients match on it. */
function pyList(names: readonly string[]): string {
  return `[${names.map((n) => `'${n}'`).join(", ")}]`;
}

/**
 * The body to send to `d`: unchanged when the adapter translates every field (the same object, so
 * the caller can keep forwarding the client's bytes), a copy without the unsupported fields when
 * dropping, else a 400 naming them.
 */
export function supportedBody<E extends Endpoint>(body: WireRequest[E], supported: readonly string[], d: Deployment, settingsDrop: boolean): WireRequest[E] {
  const extra = unsupportedParams(body, supported);
  if (extra.length === 0) return body;
  const requested = (body as { drop_params?: unknown }).drop_params;
  const drop = typeof requested === "boolean" ? requested : settingsDrop;
  if (!drop) {
    throw GatewayError.of(
      400,
      `${d.provider} does not support parameters: ${pyList(extra)}, for model=${d.upstreamModel}. To drop these, set drop_params=true in the request body, or svc_settings.drop_params: true in config.yaml.`,
      "invalid_request_error",
      extra.join(","),
    );
  }
  const copy = { ...body } as Record<string, unknown>;
  for (const k of extra) delete copy[k];
  return copy as WireRequest[E];
}

/** The embeddings fields OpenAI accepts besides `model` and `input`: the list for adapters that declare none. */
export const OPENAI_EMBEDDING_PARAMS: readonly string[] = ["dimensions", "encoding_format", "user"];
