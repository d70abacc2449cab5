/**
 * Prompt token counts: locally with OpenAI's tokenizer, or by the provider's own counting
 * endpoint when its adapter has one (`TokenCountAdapter`), sent through the core's upstream path.
 */
import type { ChatRequest, Deployment } from "../contract.ts";
import { GatewayError } from "../errors.ts";
import { answerText, MAX_ERROR_BODY_BYTES } from "../pipeline/answer-body.ts";
import { Deadline, send, timeoutError, upstreamError } from "../pipeline/upstream.ts";
import type { Snapshot } from "../snapshot.ts";
import { chatTokens } from "./chat.ts";
import { encodingFor, getEncoding } from "./encoding.ts";

export interface TokenCount {
  total: number;
  /** Of the total, tokens spent on images (local counts only). */
  image: number;
  /** `openai_tokenizer` for a local count, `<provider>_api` for the provider's own. */
  tokenizerType: string;
  /** The provider's answer, for upstream counts. */
  original?: unknown;
}

export interface CountInput {
  messages?: readonly unknown[];
  prompt?: string;
  tools?: unknown;
}

/** The model name whose tokenizer fits a deployment: its `model_info.base_model`, else the upstream model. */
export function tokenizerModel(d: Deployment): string {
  const base = d.info.base_model;
  return typeof base === "string" && base ? base : d.upstreamModel;
}

/** Counts with the OpenAI encoding of `model` (cl100k_base for models it does not know). */
export async function countLocally(model: string, input: CountInput): Promise<TokenCount> {
  const enc = await getEncoding(encodingFor(model));
  if (input.messages) {
    const c = await chatTokens(enc, input.messages, input.tools);
    return { total: c.total, image: c.image, tokenizerType: "openai_tokenizer" };
  }
  return { total: await enc.count(input.prompt ?? ""), image: 0, tokenizerType: "openai_tokenizer" };
}

/** Whether the deployment's provider can count tokens itself. */
export function canCountUpstream(snapshot: Snapshot, d: Deployment): boolean {
  return snapshot.providers.get(d.provider)?.countTokens !== undefined;
}

/**
 * Asks the provider's counting endpoint, under the deployment's timeout; upstream failures are
 * answered like those of a model call (mapped status, the provider's message).
 */
export async function countUpstream(snapshot: Snapshot, d: Deployment, req: ChatRequest, clientSignal: AbortSignal): Promise<TokenCount> {
  const adapter = snapshot.providers.get(d.provider);
  const counter = adapter?.countTokens;
  if (!adapter || !counter) throw GatewayError.of(400, `provider ${d.provider} has no token-counting endpoint`, "invalid_request_error", "model");
  const deadline = new Deadline(clientSignal, d.timeout ?? snapshot.settings.requestTimeout);
  try {
    const res = await send(adapter, d, counter.request(req, d), deadline);
    if (!res.ok) throw await upstreamError(adapter, d, res);
    let json: unknown;
    try {
      // A count is a few bytes: an answer past a MiB is not one.
      json = JSON.parse(await answerText(res, MAX_ERROR_BODY_BYTES));
    } catch {
      if (deadline.timedOut) throw timeoutError(d, deadline.seconds);
      throw GatewayError.of(500, `${d.provider} returned invalid JSON from its token-counting endpoint for model ${d.modelName}`);
    }
    let total: number;
    try {
      total = counter.response(json);
    } catch (err) {
      throw GatewayError.of(500, `${d.provider} returned an unexpected token count for model ${d.modelName}: ${err instanceof Error ? err.message : String(err)}`);
    }
    return { total, image: 0, tokenizerType: `${d.provider}_api`, original: json };
  } finally {
    deadline.clear();
  }
}
