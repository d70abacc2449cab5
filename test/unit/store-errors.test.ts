// How store errors are told apart and logged: a protocol violation (08P01, what the embedded store
// answered a statement of 65,536 or more parameters) is a failed statement, not a lost connection
// (it was answered as a 503 "connection lost"); an unhandled error's log line stays bounded
// however large the failed statement (drizzle's message holds every parameter: ~1 MB a request
// for 70,000 ids).
import { expect, test } from "bun:test";
import { loggedError } from "../../core/http/app.ts";
import { isConnectionLost } from "../../core/store/sql.ts";

const sqlError = (code: string, message = "failed") => Object.assign(new Error(message), { code });

test("08P01 is a failed statement; the rest of class 08 and the drivers' codes are a lost connection", () => {
  const wrapped = (code: string) => new Error("Failed query: select 1", { cause: sqlError(code) });
  expect(isConnectionLost(wrapped("08P01"))).toBe(false);
  for (const code of ["08006", "08003", "57P01", "CONNECTION_CLOSED", "ECONNRESET"]) expect([code, isConnectionLost(wrapped(code))]).toEqual([code, true]);
});

test("an unhandled error's log line is bounded, with the innermost cause and the stack's frames", () => {
  const params = Array.from({ length: 70_000 }, (_, i) => `team-${i}`).join(",");
  const err = new Error(`Failed query: select * from teams where team_id in (...)\nparams: ${params}`, { cause: sqlError("08P01", "bind message has 4464 parameter formats but 0 parameters") });
  const fields = loggedError(err);
  expect(JSON.stringify(fields).length).toBeLessThan(6_000);
  expect(fields.cause).toEqual({ error: "bind message has 4464 parameter formats but 0 parameters", code: "08P01" });
  expect(fields.stack).toContain("store-errors.test.ts");
  expect(String(fields.error)).toStartWith("Error: Failed query: select * from teams");
});
