/**
 * Where a Bedrock deployment is and how it proves who it is: the region's runtime endpoint (or
 * `api_base`), and either a Bedrock API key (a bearer token) or IAM credentials that sign every
 * call with SigV4. Explicit `svc_params` win over the environment, as in AWS's own SDKs.
 */
import { AwsV4Signer } from "aws4fetch";
import type { Deployment, HttpCall } from "../../core/contract.ts";

/** The deployment options `resolve` fills in; `authorize` reads them back. */
export interface AwsCredentials {
  accessKeyId: string;
  secretAccessKey: string;
  sessionToken?: string;
}

const str = (v: unknown): string | undefined => (typeof v === "string" && v !== "" ? v : undefined);

function iamCredentials(options: Record<string, unknown>, env: NodeJS.ProcessEnv): AwsCredentials | undefined {
  const fromParams = str(options.aws_access_key_id);
  if (fromParams) {
    const secret = str(options.aws_secret_access_key);
    return secret ? { accessKeyId: fromParams, secretAccessKey: secret, sessionToken: str(options.aws_session_token) } : undefined;
  }
  const fromEnv = str(env.AWS_ACCESS_KEY_ID);
  const secret = str(env.AWS_SECRET_ACCESS_KEY);
  return fromEnv && secret ? { accessKeyId: fromEnv, secretAccessKey: secret, sessionToken: str(env.AWS_SESSION_TOKEN) } : undefined;
}

/**
 * Fills the endpoint, region and credentials of a `bedrock/…` deployment. Precedence: `api_key`,
 * then `aws_access_key_id`/`aws_secret_access_key`, then `AWS_BEARER_TOKEN_BEDROCK`, then
 * `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`.
 */
export function resolveBedrock(d: Deployment, env: NodeJS.ProcessEnv = process.env): Deployment | string {
  const region = str(d.options.aws_region_name) ?? str(env.AWS_REGION) ?? str(env.AWS_DEFAULT_REGION);
  const endpoint = d.apiBase ?? str(d.options.aws_bedrock_runtime_endpoint);
  if (!region && !endpoint) return "provider bedrock needs svc_params.aws_region_name (or AWS_REGION in the environment)";
  const apiBase = (endpoint ?? `https://bedrock-runtime.${region}.amazonaws.com`).replace(/\/+$/, "");
  const explicitKey = d.apiKey;
  const iam = explicitKey ? undefined : iamCredentials(d.options, env);
  const apiKey = explicitKey ?? (iam ? undefined : str(env.AWS_BEARER_TOKEN_BEDROCK));
  if (!apiKey && !iam) {
    return "provider bedrock needs credentials: svc_params.aws_access_key_id and aws_secret_access_key, an api_key (Bedrock API key), or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment";
  }
  const options: Record<string, unknown> = { ...d.options, aws_region_name: region ?? "us-east-1" };
  if (iam) {
    options.aws_access_key_id = iam.accessKeyId;
    options.aws_secret_access_key = iam.secretAccessKey;
    if (iam.sessionToken) options.aws_session_token = iam.sessionToken;
  }
  return { ...d, apiBase, apiKey, options };
}

/**
 * Derived signing keys, keyed by secret, day, region and service (aws4fetch's own cache format):
 * four HMACs saved per call. Bounded, as days and rotated secrets add entries.
 */
const signingKeys = new Map<string, ArrayBuffer>();
const SIGNING_KEYS_LIMIT = 64;

/** Signs a built call with SigV4 (service `bedrock`); calls with a bearer key pass unchanged. */
export async function authorizeBedrock(call: HttpCall, d: Deployment): Promise<HttpCall> {
  if (d.apiKey) return call;
  const accessKeyId = str(d.options.aws_access_key_id);
  const secretAccessKey = str(d.options.aws_secret_access_key);
  if (!accessKeyId || !secretAccessKey) return call;
  if (signingKeys.size > SIGNING_KEYS_LIMIT) signingKeys.clear();
  const signer = new AwsV4Signer({
    method: call.method ?? "POST",
    url: call.url,
    headers: call.headers,
    body: call.body,
    accessKeyId,
    secretAccessKey,
    sessionToken: str(d.options.aws_session_token),
    service: "bedrock",
    region: str(d.options.aws_region_name) ?? "us-east-1",
    cache: signingKeys,
  });
  const signed = await signer.sign();
  const headers: Record<string, string> = {};
  signed.headers.forEach((value, name) => {
    headers[name] = value;
  });
  return { ...call, headers };
}
