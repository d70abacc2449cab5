/**
 * fetch's options for a call the gateway bounds itself (an upstream call's Deadline, a webhook's
 * timeout): `signal` ends it, and Bun's own socket idle timer is off. That timer
 * (BUN_CONFIG_HTTP_IDLE_TIMEOUT, 5 minutes unless set) ended any quieter wait first, as a connection
 * error: a `timeout` (600 s by default) or `stream_timeout` over 5 minutes was never reached, and a
 * slow upstream was answered with a 503 "could not connect" instead of its 408.
 */
export function boundBy(signal: AbortSignal): { signal: AbortSignal; timeout: false } {
  return { signal, timeout: false };
}
