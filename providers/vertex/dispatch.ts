/**
 * One `vertex_ai` chat endpoint for two APIs: Gemini models and Claude models share the provider
 * id, and the core picks an endpoint per provider. Requests are routed by the deployment's model;
 * answers and streams by their shape (Claude's carry a `type`, Gemini's never do), since the
 * response transforms are not told which deployment they belong to.
 */
import type { ChatRequest, Deployment, EndpointAdapter, StreamPart, StreamTransform, TokenCountAdapter, Usage } from "../../core/contract.ts";

type ChatEndpoint = EndpointAdapter<"chat", unknown>;

interface Active {
  transform: StreamTransform<"chat", unknown>;
  state: unknown;
}

export interface DispatchState {
  req: ChatRequest;
  active?: Active;
}

const hasType = (data: string): boolean => {
  const parsed: unknown = JSON.parse(data);
  return typeof (parsed as { type?: unknown } | null)?.type === "string";
};

function dispatchStream(gemini: StreamTransform<"chat", unknown>, claude: StreamTransform<"chat", unknown>): StreamTransform<"chat", DispatchState> {
  const active = (s: DispatchState, data?: string): Active => {
    if (!s.active) {
      const transform = data !== undefined && hasType(data) ? claude : gemini;
      s.active = { transform, state: transform.init(s.req) };
    }
    return s.active;
  };
  return {
    framing: "sse",
    init: (req) => ({ req }),
    event(data: string, s: DispatchState): StreamPart[] {
      const a = active(s, data);
      return a.transform.event(data, a.state);
    },
    estimate(s: DispatchState): Usage {
      const a = active(s);
      return a.transform.estimate(a.state);
    },
    responseId: (s) => (s.active ? s.active.transform.responseId?.(s.active.state) : undefined),
    complete(s: DispatchState): boolean {
      const a = active(s);
      return a.transform.complete?.(a.state) ?? true;
    },
  };
}

/** The chat endpoint serving `isClaude` deployments with `claude` and the others with `gemini`. */
export function dispatchChat(isClaude: (d: Deployment) => boolean, isClaudeAnswer: (body: unknown) => boolean, gemini: ChatEndpoint, claude: ChatEndpoint): EndpointAdapter<"chat", DispatchState> {
  const params = [...new Set([...(gemini.supportedParams ?? []), ...(claude.supportedParams ?? [])])];
  return {
    request: (req, d) => (isClaude(d) ? claude.request(req, d) : gemini.request(req, d)),
    response: (body, req) => (isClaudeAnswer(body) ? claude : gemini).response(body, req),
    stream: dispatchStream(gemini.stream!, claude.stream!),
    // Each deployment is held to its own API's list: Claude has no `seed` or `n`, Gemini no `top_k`.
    supportedParams: params,
    supportedParamsFor: (d) => (isClaude(d) ? claude : gemini).supportedParams ?? params,
  };
}

/** Token counting routed the same way; the answers differ in shape (`totalTokens` or `input_tokens`). */
export function dispatchCountTokens(isClaude: (d: Deployment) => boolean, gemini: TokenCountAdapter, claude: TokenCountAdapter): TokenCountAdapter {
  return {
    request: (req, d) => (isClaude(d) ? claude.request(req, d) : gemini.request(req, d)),
    response: (body) => ((body as { input_tokens?: unknown } | null)?.input_tokens !== undefined ? claude.response(body) : gemini.response(body)),
  };
}
