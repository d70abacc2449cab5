import type { Logger } from "./contract.ts";

/** Virtual keys and bearer secrets never reach a log line, whatever a caller passes in. */
const SECRET = /\b(sk-[A-Za-z0-9_-]{4})[A-Za-z0-9_-]+/g;

export function redact(text: string): string {
  return text.replace(SECRET, "$1…");
}

function write(level: string, msg: string, fields?: Record<string, unknown>): void {
  const line = JSON.stringify({ time: new Date().toISOString(), level, msg, ...fields });
  (level === "error" || level === "warn" ? process.stderr : process.stdout).write(`${redact(line)}\n`);
}

export function createLogger(scope?: string): Logger {
  const base = scope ? { scope } : undefined;
  return {
    info: (msg, fields) => write("info", msg, { ...base, ...fields }),
    warn: (msg, fields) => write("warn", msg, { ...base, ...fields }),
    error: (msg, fields) => write("error", msg, { ...base, ...fields }),
  };
}
