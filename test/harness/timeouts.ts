// Loaded before every test file (bunfig.toml [test] preload): a file run alone gets the same
// 30 s per test and hook as the whole suite (test/run.ts), since gateways on the embedded store
// take seconds to start the first time (initdb for the run's template folder, see gateway.ts).
import { setDefaultTimeout } from "bun:test";

setDefaultTimeout(30_000);
