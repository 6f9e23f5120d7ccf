#!/usr/bin/env bash
# `make dev`: sets itself up, builds what is missing or stale, then runs
# scripts/dev.mjs: the dispatcher in local workerd, the example documents
# from policy/, a fake Telnyx API and the demo nodes M1, M2, M3 (real
# callfence-agent processes in front of callfence-demo-app), and prints
# where everything is. State lives in the dev directory the banner names
# (.dev/, or outside a checkout on /tmp: see scripts/dev.mjs). Ctrl-C stops
# it all. Works from a checkout in any directory.
#
# CALLFENCE_DEV_NO_BUILD=1 uses build/ as it is (no Worker rebuild);
# CALLFENCE_AGENT_BIN_DIR=<dir> uses the agent binaries there (no cargo
# build of the agent). Both let a second checkout reuse another's builds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

# The Worker: rebuilt when build/ is missing or older than its sources.
wasm=build/index_bg.wasm
if [[ "${CALLFENCE_DEV_NO_BUILD:-}" != 1 ]]; then
  if [[ ! -f build/index.js || ! -f "$wasm" ]] \
    || [[ -n "$(find src core/src migrations Cargo.toml Cargo.lock core/Cargo.toml -newer "$wasm" -type f -print -quit)" ]]; then
    printf 'dev: building the Worker (build/ is missing or older than src/ or core/)\n'
    bash scripts/build.sh
  fi
fi

# The agent and the demo app (cargo only rebuilds what changed).
if [[ -z "${CALLFENCE_AGENT_BIN_DIR:-}" ]]; then
  cargo build -p callfence-agent --bins
  target_dir="${CARGO_TARGET_DIR:-target}"
  [[ "$target_dir" == /* ]] || target_dir="$PWD/$target_dir"
  export CALLFENCE_AGENT_BIN_DIR="$target_dir/debug"
fi

export WRANGLER_SEND_METRICS=false WRANGLER_HIDE_BANNER=true CLOUDFLARE_CF_FETCH_ENABLED=false
exec node scripts/dev.mjs
