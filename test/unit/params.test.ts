// The unsupported-parameter check: fields an adapter does not translate are refused with LiteLLM's
// message, or dropped with drop_params (the request's flag over the config's); gateway-only fields
// and nulls never count, and a body with nothing to drop comes back as the same object.
import { describe, expect, test } from "bun:test";
import type { ChatRequest, Deployment } from "../../core/contract.ts";
import { GatewayError } from "../../core/errors.ts";
import { supportedBody, unsupportedParams } from "../../core/pipeline/params.ts";

const d: Deployment = { id: "dep-1", modelName: "claude", provider: "anthropic", upstreamModel: "claude-sonnet-4-20250514", options: {}, info: {} };
const SUPPORTED = ["max_tokens", "temperature", "top_p", "stop", "tools", "tool_choice"];

const chat = (extra: Record<string, unknown> = {}): ChatRequest => ({ model: "claude", messages: [{ role: "user", content: "hi" }], ...extra }) as ChatRequest;

function refusal(fn: () => unknown): GatewayError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    return err as GatewayError;
  }
  throw new Error("expected a refusal");
}

describe("unsupportedParams", () => {
  test("names the fields outside the list, in the order the client sent them", () => {
    expect(unsupportedParams(chat({ seed: 1, temperature: 0.2, n: 2, logprobs: true }), SUPPORTED)).toEqual(["seed", "n", "logprobs"]);
    // n: 1 is what every provider does: accepted even where n is not supported.
    expect(unsupportedParams(chat({ n: 1 }), SUPPORTED)).toEqual([]);
  });

  test("null values, the input, streaming and the gateway's own fields never count", () => {
    const body = chat({
      seed: null,
      n: null,
      stream: true,
      stream_options: { include_usage: true },
      metadata: { tags: ["a"] },
      drop_params: false,
      num_retries: 2,
      fallbacks: ["other"],
      mock_response: "hi",
      caching: true,
      guardrails: ["g"],
      timeout: 30,
    });
    expect(unsupportedParams(body, SUPPORTED)).toEqual([]);
  });
});

describe("supportedBody", () => {
  test("a body the adapter fully translates is returned as the same object (its raw bytes may still be forwarded)", () => {
    const body = chat({ temperature: 0.5, max_tokens: 10, seed: null });
    expect(supportedBody(body, SUPPORTED, d, false)).toBe(body);
    expect(supportedBody(body, SUPPORTED, d, true)).toBe(body);
  });

  test("without drop_params: a 400 naming every unsupported field, the provider and the model", () => {
    const err = refusal(() => supportedBody(chat({ seed: 7, n: 2, temperature: 1 }), SUPPORTED, d, false));
    expect(err.info.status).toBe(400);
    expect(err.info.type).toBe("invalid_request_error");
    expect(err.info.message).toBe(
      "anthropic does not support parameters: ['seed', 'n'], for model=claude-sonnet-4-20250514. To drop these, set drop_params=true in the request body, or svc_settings.drop_params: true in config.yaml.",
    );
    expect(err.info.param).toBe("seed,n");
  });

  test("drop_params in the body drops them from a copy; the client's body is untouched", () => {
    const body = chat({ seed: 7, n: 2, temperature: 1, drop_params: true });
    const sent = supportedBody(body, SUPPORTED, d, false);
    expect(sent).not.toBe(body);
    expect(sent).toEqual(chat({ temperature: 1, drop_params: true }));
    expect(body.seed).toBe(7);
    expect(body.n).toBe(2);
  });

  test("svc_settings.drop_params drops when the request says nothing", () => {
    expect(supportedBody(chat({ seed: 7 }), SUPPORTED, d, true)).toEqual(chat());
  });

  test("the request's drop_params: false wins over svc_settings.drop_params: true", () => {
    const err = refusal(() => supportedBody(chat({ seed: 7, drop_params: false }), SUPPORTED, d, true));
    expect(err.info.message).toStartWith("anthropic does not support parameters: ['seed'], for model=claude-sonnet-4-20250514.");
  });

  test("an empty list supports nothing beyond the input: every sampling field is refused", () => {
    const err = refusal(() => supportedBody(chat({ temperature: 1 }), [], d, false));
    expect(err.info.message).toContain("['temperature']");
  });
});
