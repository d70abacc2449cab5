// Run by `npm install` (postinstall). postgres.js 3.4.9 (the latest release) throws an uncaught
// TypeError from a setImmediate when a reserved connection (every transaction) writes after its
// backend went away: a transaction cut by a PostgreSQL restart or failover sends its ROLLBACK on
// the dead connection (porsager/postgres #1066, #1154, #1208). The write is then settled as the
// connection error it is, as upstream's open fix does (porsager/postgres PR #1209), so the caller's
// promise rejects instead of the process printing an uncaught error and the connection hanging
// (a later `end()` never returned). Idempotent; fails the install if the code it patches changed.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "node_modules", "postgres");
const MARK = "svc-gateway: nextWrite after close";
const BEFORE = "  function nextWrite(fn) {\n    const x = socket.write(chunk, fn)";
const AFTER = `  function nextWrite(fn) {
    if (!socket) { // ${MARK} (porsager/postgres #1208)
      chunk = nextWriteTimer = null
      error(Errors.connection('CONNECTION_CLOSED', options))
      return false
    }
    const x = socket.write(chunk, fn)`;

let patched = 0;
for (const dir of ["src", "cjs/src", "cf/src"]) {
  const file = join(root, dir, "connection.js");
  if (!existsSync(file)) continue;
  const text = readFileSync(file, "utf8");
  if (text.includes(MARK)) continue;
  if (!text.includes(BEFORE)) throw new Error(`${file}: nextWrite is not as expected; review scripts/patch-postgres.mjs for this postgres version`);
  writeFileSync(file, text.replace(BEFORE, AFTER));
  patched++;
}
if (patched > 0) console.log(`patched postgres.js nextWrite in ${patched} file(s)`);
