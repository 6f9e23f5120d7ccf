#!/usr/bin/env bash
# Builds the Worker into build/ (build/index.js, build/index_bg.wasm) with
# worker-build --release, offline: every tool worker-build would otherwise
# download from GitHub is pointed at an installed one. Run scripts/setup.sh
# first on a fresh machine (`make build` does). Also wrangler's [build] command.
#
# `--testing` builds the same Worker with the cargo feature `testing` (the
# test and bench scaffolding: CALLFENCE_TEST_* switches, the `profile` and
# `writes_only` messages; docs/testing.md) into build-testing/ instead: the
# build the end-to-end tests, drills, browser tests and `make bench` run.
# build/ never has it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail() { printf 'build: %s\n' "$*" >&2; exit 1; }

out=build
features=()
case "${1:-}" in
  "") ;;
  --testing) out=build-testing features=(--features testing) ;;
  *) fail "unknown argument ${1@Q} (want --testing or nothing)" ;;
esac

bin="$PWD/node_modules/.bin"
[[ -x "$bin/wasm-opt" && -x "$bin/esbuild" ]] \
  || fail "node_modules is missing wasm-opt or esbuild: run scripts/setup.sh"
command -v worker-build >/dev/null || fail "worker-build is not installed: run scripts/setup.sh"
command -v wasm-bindgen >/dev/null || fail "wasm-bindgen is not installed: run scripts/setup.sh"

# worker-build runs the wasm-bindgen CLI on the library's output; the two must
# be the same version or the generated glue does not match.
want="$(scripts/wasm-bindgen-version.sh)"
have="$(wasm-bindgen --version | awk 'NR == 1 { print $NF }')"
[[ "$have" == "$want" ]] \
  || fail "wasm-bindgen CLI is $have but Cargo.lock has $want: run scripts/setup.sh"

export WASM_BINDGEN_BIN
WASM_BINDGEN_BIN="$(command -v wasm-bindgen)"
export WASM_OPT_BIN="$bin/wasm-opt"
export ESBUILD_BIN="$bin/esbuild"

worker-build --release --out-dir "$out" "${features[@]}"

wasm="$out/index_bg.wasm"
[[ -f "$out/index.js" && -f "$wasm" ]] || fail "worker-build did not produce $out/index.js and $wasm"

# worker-build runs wasm-opt with `--debuginfo`, which keeps the name
# section: about 200 KB raw and 50 KB gzipped of the file. The shipped wasm
# goes without it, every other byte as wasm-opt wrote it; the named copy
# stays in target/ for `node scripts/wasm-size.mjs` and to put names on a
# `wasm-function[N]` of a production stack trace (the same N in the copy).
named=target/wasm-size/index_bg.named.wasm
[[ "$out" == build ]] || named="target/wasm-size/$out/index_bg.named.wasm"
mkdir -p "$(dirname "$named")"
cp "$wasm" "$named"
node scripts/wasm-strip-names.mjs "$named" "$wasm"
raw=$(wc -c <"$wasm")
gz=$(gzip -9 -c "$wasm" | wc -c)
printf 'build: %s is %d bytes raw, %d bytes gzipped\n' "$wasm" "$raw" "$gz"
