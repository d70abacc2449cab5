// Run by `npm install` (postinstall). Patches postgres.js 3.4.9 (the latest release) where it
// loses connections; each patch is idempotent (its mark), and the install fails if the code it
// patches changed.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "node_modules", "postgres");

const PATCHES = [
  {
    // A reserved connection (every transaction) that writes after its backend went away threw an
    // uncaught TypeError from a setImmediate: a transaction cut by a PostgreSQL restart or failover
    // sends its ROLLBACK on the dead connection (porsager/postgres #1066, #1154, #1208). The write
    // is settled as the connection error it is, as upstream's open fix does (PR #1209), so the
    // caller's promise rejects instead of the process printing an uncaught error and the
    // connection hanging (a later `end()` never returned).
    mark: "svc-gateway: nextWrite after close",
    edits: [
      {
        before: "  function nextWrite(fn) {\n    const x = socket.write(chunk, fn)",
        after: `  function nextWrite(fn) {
    if (!socket) { // svc-gateway: nextWrite after close (porsager/postgres #1208)
      chunk = nextWriteTimer = null
      error(Errors.connection('CONNECTION_CLOSED', options))
      return false
    }
    const x = socket.write(chunk, fn)`,
      },
    ],
  },
  {
    // Small writes wait for a setImmediate that is scheduled only while none is; a socket that
    // closed (or a connection terminated) cancelled it without forgetting it, and kept the bytes.
    // When a connect failed before its start-up message was written (Bun reports a refused
    // connect that early now and then), that connection never wrote again: its next connect sent
    // nothing and waited out connect_timeout, and a query given to it failed CONNECT_TIMEOUT. After
    // a database restart the first management calls were answered 503 "connection lost" while
    // readiness said connected. The bytes were for the closed socket: they are dropped too.
    mark: "svc-gateway: forget the cancelled write",
    edits: [
      {
        before: "    clearImmediate(nextWriteTimer)\n    if (socket) {",
        after: "    clearImmediate(nextWriteTimer)\n    chunk = nextWriteTimer = null // svc-gateway: forget the cancelled write\n    if (socket) {",
      },
      {
        before: "    clearImmediate(nextWriteTimer)\n    socket.removeListener('data', data)",
        after: "    clearImmediate(nextWriteTimer)\n    chunk = nextWriteTimer = null // svc-gateway: forget the cancelled write\n    socket.removeListener('data', data)",
      },
    ],
  },
];

let patched = 0;
for (const dir of ["src", "cjs/src", "cf/src"]) {
  const file = join(root, dir, "connection.js");
  if (!existsSync(file)) continue;
  let text = readFileSync(file, "utf8");
  const original = text;
  for (const { mark, edits } of PATCHES) {
    if (text.includes(mark)) continue;
    for (const { before, after } of edits) {
      if (text.split(before).length !== 2) throw new Error(`${file}: "${mark}" does not find the code it patches; review scripts/patch-postgres.mjs for this postgres version`);
      text = text.replace(before, after);
    }
  }
  if (text !== original) {
    writeFileSync(file, text);
    patched++;
  }
}
if (patched > 0) console.log(`patched postgres.js connection.js in ${patched} file(s)`);
