/**
 * Where a Vertex AI deployment's models live: project, location, and the host serving them
 * (`{location}-aiplatform.googleapis.com`, or `aiplatform.googleapis.com` for `global`;
 * `api_base` replaces the host).
 */
import type { Deployment } from "../../core/contract.ts";

export const DEFAULT_LOCATION = "us-central1";
const DEFAULT_VERSION = "v1";

export function vertexHost(location: string): string {
  return location === "global" ? "https://aiplatform.googleapis.com" : `https://${location}-aiplatform.googleapis.com`;
}

/** The URL of a method of a publisher's model (`google` for Gemini, `anthropic` for Claude). */
export function publisherModelUrl(d: Deployment, publisher: string, model: string, method: string): string {
  const { vertex_project: project, vertex_location: location } = d.options;
  return `${d.apiBase}/${d.apiVersion ?? DEFAULT_VERSION}/projects/${project}/locations/${location}/publishers/${publisher}/models/${model}:${method}`;
}
