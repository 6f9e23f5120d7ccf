// Preload (`node --require scripts/v8-flags.cjs`) that gives the workerd
// processes Miniflare starts the V8 flags in CALLFENCE_V8_FLAGS (space
// separated), for profiling only: `make bench` with BENCH_PERF sets
// `--perf-basic-prof`, so that V8 writes /tmp/perf-<pid>.map and `perf`
// can name the JIT code (each wasm function as `wasm-function[N]`).
//
// workerd takes V8 flags only from its config (`Config.v8Flags`), which
// Miniflare builds and does not expose; this adds the field where Miniflare
// returns the assembled config. The anchor is exact text of the pinned
// Miniflare: if it is missing (another version), loading fails loudly
// rather than profiling without names. Never used by the tests.
"use strict";
const Module = require("node:module");

const flags = (process.env.CALLFENCE_V8_FLAGS ?? "").split(" ").filter(Boolean);
const ANCHOR = "      structuredLogging: this.#structuredWorkerdLogs\n    };";
const TARGET = /[\\/]miniflare[\\/]dist[\\/]src[\\/]index\.js$/;

if (flags.length > 0) {
  const load = Module._extensions[".js"];
  Module._extensions[".js"] = function (module, filename) {
    if (!TARGET.test(filename)) return load(module, filename);
    const source = require("node:fs").readFileSync(filename, "utf8");
    if (!source.includes(ANCHOR)) {
      throw new Error(`scripts/v8-flags.cjs: ${filename} does not have the expected config assembly; update the anchor`);
    }
    const patched = source.replace(
      ANCHOR,
      `      structuredLogging: this.#structuredWorkerdLogs,\n      v8Flags: ${JSON.stringify(flags)}\n    };`,
    );
    module._compile(patched, filename);
  };
}
