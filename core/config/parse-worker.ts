/**
 * The config reader thread (see parse-thread.ts): parseConfig for the serving thread. Listed as an
 * entrypoint of the single-binary build (scripts/build.ts).
 */
import { parseConfig } from "./load.ts";
import type { ParseReply, ParseRequest } from "./parse-thread.ts";

declare const self: Worker;

/** Makes this thread's process.env the one sent (`os.environ/NAME` reads it, as on the serving thread). */
function takeEnvironment(env: Record<string, string>): void {
  for (const k of Object.keys(process.env)) if (!Object.hasOwn(env, k)) delete process.env[k];
  Object.assign(process.env, env);
}

self.onmessage = (e: MessageEvent<ParseRequest>) => {
  const { id, text, configSet, env } = e.data;
  takeEnvironment(env);
  let reply: ParseReply;
  try {
    reply = { id, result: parseConfig(text, new Map(configSet)) };
  } catch (err) {
    // What would have been thrown on the serving thread is thrown there.
    reply = { id, error: err instanceof Error ? err.message : String(err) };
  }
  self.postMessage(reply);
};
