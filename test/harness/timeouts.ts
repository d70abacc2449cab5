// Loaded before the test files (bunfig.toml [test] preload): `bun test <file>` gets the same 30 s
// per test as the whole suite (test/run.ts passes --timeout), since gateways on the embedded store
// take seconds to start the first time (initdb for the run's template folder, see gateway.ts).
// Bun applies this default to the hooks of the first file only: with several files and no
// --timeout, a hook that starts a gateway names its own timeout.
import { setDefaultTimeout } from "bun:test";

setDefaultTimeout(30_000);
