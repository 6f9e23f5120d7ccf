#!/usr/bin/env bash
# Sets up a fresh machine to build and test callfence, and does nothing on a
# machine that is already set up (idempotent; safe to run before every build).
#
# - the Rust wasm target,
# - worker-build (pinned, --locked) and the wasm-bindgen CLI (equal to the
#   wasm-bindgen in Cargo.lock; installed without --locked, see
#   docs/TOOLCHAIN or shared notes: its lock names a crate the registry lacks),
# - Debian's chromium (apt-get, only when missing) for the browser tests,
# - Debian's prometheus (apt-get, only when missing: /usr/bin/prometheus and
#   promtool) for the alerting rules' tests, the end-to-end scrape and
#   `make observe`,
# - the npm devDependencies (wrangler, miniflare, binaryen, puppeteer-core) from
#   package-lock.json, with `npm ci`, only when node_modules is missing or
#   older than the lock file.
#
# Downloads only packages (crates.io, the npm registry, Debian's archive);
# nothing from GitHub, and no browser build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

WORKER_BUILD_VERSION=0.8.7
# The wasm-bindgen CLI must equal the library version the Worker links.
WASM_BINDGEN_VERSION="$(scripts/wasm-bindgen-version.sh)"

say() { printf 'setup: %s\n' "$*" >&2; }

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  say "adding the wasm32-unknown-unknown target"
  rustup target add wasm32-unknown-unknown
fi

installed_version() {
  # Prints the last whitespace-separated word of `$1 --version`, or nothing.
  command -v "$1" >/dev/null 2>&1 || return 0
  "$1" --version 2>/dev/null | awk 'NR == 1 { print $NF }'
}

if [[ "$(installed_version worker-build)" != "$WORKER_BUILD_VERSION" ]]; then
  say "installing worker-build $WORKER_BUILD_VERSION (a few minutes)"
  cargo install worker-build --version "$WORKER_BUILD_VERSION" --locked
fi

if [[ "$(installed_version wasm-bindgen)" != "$WASM_BINDGEN_VERSION" ]]; then
  say "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION (a few minutes)"
  # No default features: they are the TLS stacks (rustls and ring) of the
  # test runner's browser-driver downloads, which this project never uses.
  # The CLI's output is byte-identical, and its compile takes 260 CPU
  # seconds instead of 435 (docs/testing.md, "A fresh machine").
  cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --force --no-default-features
fi

# Debian's chromium for the panel's browser tests (tests/browser):
# puppeteer-core drives it and never downloads a browser of its own.
if ! command -v chromium >/dev/null 2>&1; then
  say "installing Debian's chromium (the browser tests)"
  sudo=""
  [[ "$(id -u)" -eq 0 ]] || sudo="sudo"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y chromium
fi

# Debian's prometheus for ops/prometheus (promtool check and test rules),
# tests/e2e/prometheus.test.mjs and `make observe`. Only the binaries are
# used: the package's own service is never started by the project.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  say "installing Debian's prometheus (the alerting rules' tests, make observe)"
  sudo=""
  [[ "$(id -u)" -eq 0 ]] || sudo="sudo"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y prometheus
fi

# npm ci when node_modules is missing or was installed from another lock file.
# Nothing may download a browser (puppeteer-core does not; this says so twice).
export PUPPETEER_SKIP_DOWNLOAD=1
stamp=node_modules/.callfence-lock.sha256
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  say "installing npm packages (npm ci)"
  npm ci --no-audit --no-fund
  printf '%s\n' "$want" >"$stamp"
fi
