#!/usr/bin/env bash
# Prints the wasm-bindgen version the Worker links: the one in Cargo.lock
# (falling back to the exact pin in Cargo.toml before a lock file exists).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=""
if [[ -f Cargo.lock ]]; then
  version="$(awk '
    $0 == "name = \"wasm-bindgen\"" { found = 1; next }
    found && /^version = / { gsub(/"/, "", $3); print $3; exit }
  ' Cargo.lock)"
fi
if [[ -z "$version" ]]; then
  version="$(sed -n 's/^wasm-bindgen = "=\([0-9.]*\)".*/\1/p' Cargo.toml | head -n1)"
fi
if [[ -z "$version" ]]; then
  echo "wasm-bindgen-version: cannot find the wasm-bindgen version in Cargo.lock or Cargo.toml" >&2
  exit 1
fi
printf '%s\n' "$version"
