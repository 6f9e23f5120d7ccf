#!/usr/bin/env bash
# `make test`: sets itself up and runs every test, failing on the first
# failure: the docs' links, the shipped alerting rules (promtool), formatting, lints, unit and integration tests, the docs (rustdoc
# with warnings as errors: broken intra-doc links, bad markup), the core's wasm
# build (it must import nothing from "env"), the simulation, the Worker build,
# wrangler's offline dry-run deploy, the end-to-end tests in Miniflare, the
# drills' checkers and short forms, and the panel's browser tests in
# headless Chromium.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n== test: %s\n' "$*" >&2; }

# Offline wrangler/Miniflare (TOOLCHAIN.md).
export WRANGLER_SEND_METRICS=false WRANGLER_HIDE_BANNER=true CLOUDFLARE_CF_FETCH_ENABLED=false CI=true

step "setup"
scripts/setup.sh

step "docs: every relative link in README.md and docs/ resolves"
node --test tests/docs/

step "ops: promtool checks the shipped Prometheus config and rules, and runs the rules' unit tests"
promtool check config --syntax-only ops/prometheus/prometheus.yml
promtool check rules ops/prometheus/rules.yml
promtool test rules ops/prometheus/rules.test.yml

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test --workspace (the simulation's debug build runs a short form; the release run below runs it in full)"
CALLFENCE_SIM_SCHEDULES=60 cargo test --workspace

step "cargo doc (no deps, -D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

step "core builds for wasm32 and imports nothing from \"env\""
cargo build -p callfence-core --target wasm32-unknown-unknown --release
# core is an rlib, so link it as a cdylib to see what it would import. Rust
# exports nothing from a cdylib but #[no_mangle] items, and optimised builds
# drop the rest, so the check builds unoptimised (dev profile), keeps dead
# code and exports every symbol: a call into native-only code (libc, a C
# library) is then an undefined symbol, which wasm-ld turns into an import
# from "env".
cargo rustc -p callfence-core --lib --target wasm32-unknown-unknown --crate-type cdylib \
  -- -C link-dead-code -C link-arg=--export-all
target_dir="$(cargo metadata --format-version 1 --no-deps \
  | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).target_directory))')"
node scripts/wasm-imports.mjs --forbid env "$target_dir/wasm32-unknown-unknown/debug/callfence_core.wasm"

step "simulation (release, ${CALLFENCE_SIM_SCHEDULES:-2000} schedules)"
CALLFENCE_SIM_SCHEDULES="${CALLFENCE_SIM_SCHEDULES:-2000}" \
  cargo test --release -p callfence-core --test sim -- --nocapture

step "model check (release, short bounds) and its planted bugs (ignored in debug builds, run here)"
CALLFENCE_MODEL="${CALLFENCE_MODEL:-short}" \
  cargo test --release -p callfence-core --test model -- --nocapture

step "make build (the deployed Worker) and make build-testing (with its test scaffolding, for the suites below)"
make build
make build-testing

step "wrangler deploy --dry-run"
node_modules/.bin/wrangler deploy --dry-run --outdir dist

step "end-to-end tests (Miniflare)"
node --test tests/e2e/

# The e2e matrix (SPEC §16): every file on the call path again, with a map
# of four call shards in force (tests/e2e/harness.mjs, E2E_SHARDS).
step "end-to-end tests on the call path, at four call shards"
CALLFENCE_E2E_SHARDS=4 node --test \
  tests/e2e/{ingress,ownership,eligibility,answer-deadline,atomicity,attacks-claims,attacks-edge}.test.mjs \
  tests/e2e/{key-removal,sweep,worker-forwards,dispatcher-fault,paged-views,metrics}.test.mjs \
  tests/e2e/agents-{answer,routing,node,clock-skew}.test.mjs

step "drills: the checkers against planted violations, then each drill's short form"
node --test tests/drills/

step "browser tests (the panel in headless Chromium; screenshots in .screenshots/)"
PUPPETEER_SKIP_DOWNLOAD=1 node --test tests/browser/
