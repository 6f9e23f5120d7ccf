#!/usr/bin/env bash
# `make bench`: the benchmarks, with the conditions they were taken under.
#
# 1. the core's native engine bench (`cargo bench -p callfence-core --bench
#    engine`): medians of the hot paths in-process, rusqlite in memory;
# 2. scripts/bench.mjs: the Worker end to end on local workerd (Miniflare on
#    the prebuilt build-testing/, for its `profile`): latency against a bare pass-through Worker,
#    assignments per second through one Dispatcher, the Worker's own time per
#    webhook, and the wasm's size;
# 3. examples/wasm_crypto.rs built for wasm32 under the release profile: the
#    Telnyx check, envelope parse and assertion mint alone, in Node's V8.
#
# Sets itself up first and builds build/ and build-testing/ only if missing
# (it never rebuilds a present one: run `make build build-testing` after
# changing src/ or core/). The size it reports is build/'s, the deployed one.
# About 1-2 minutes once compiled. BENCH_DOCS=1 also writes the figures
# into docs/performance.md; see scripts/bench.mjs for the knobs.
# Not part of `make test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Offline wrangler/Miniflare (TOOLCHAIN.md).
export WRANGLER_SEND_METRICS=false WRANGLER_HIDE_BANNER=true CLOUDFLARE_CF_FETCH_ENABLED=false CI=true

bash scripts/setup.sh
if [[ ! -f build/index.js || ! -f build/index_bg.wasm ]]; then
  bash scripts/build.sh
fi
if [[ ! -f build-testing/index.js || ! -f build-testing/index_bg.wasm ]]; then
  bash scripts/build.sh --testing
fi

printf 'bench: %s, %s cores, %s, node %s\n' "$(uname -srm)" "$(nproc)" "$(rustc --version)" "$(node --version)"
printf '\n== bench: core engine, native (cargo bench -p callfence-core --bench engine)\n'
core_out="$(mktemp)"
trap 'rm -f "$core_out"' EXIT
cargo bench -p callfence-core --bench engine 2>&1 | tee "$core_out"

printf '\n== bench: the per-webhook cryptography in wasm (cargo build --example wasm_crypto)\n'
cargo build --example wasm_crypto --release --target wasm32-unknown-unknown
BENCH_WASM_CRYPTO=target/wasm32-unknown-unknown/release/examples/wasm_crypto.wasm \
  BENCH_CORE_OUTPUT="$core_out" node scripts/bench.mjs
